"""Developer probe (CPU, no GPU; CuPy must import): the host cost of
fastgnn.torch's CUDA plan path, measured on CPU tensors with the kernel
launches recorded instead of made (`fastgnn.testing.fake_cuda`). What it
times is the Python between the torch call and cuLaunchKernel -- the
autograd node, the plan lookup, the buffer allocations (CPU ones here), the
parameter blocks -- so a change to that path can be measured without a GPU
before the GPU run confirms it (benchmarks/dev/probe_op_host.py).

Prints microseconds per call (best of 5 blocks of back-to-back calls,
autograd multithreading off) of segment_reduce forward without and with
grad and forward + torch.autograd.grad, beside a minimal Python
autograd.Function (an empty forward and backward: the floor of any op
built so); with `profile`, cProfile's top functions of the forward+backward.

    python benchmarks/dev/probe_plan_host_fake.py [reduce] [profile]
"""
import cProfile
import pstats
import sys
import time

import pytest
import torch

import fastgnn.torch as ft
from fastgnn import testing

CALLS, BLOCKS = 3000, 5


def us_per_call(fn, launches):
    for _ in range(50):
        fn()
    best = float("inf")
    for _ in range(BLOCKS):
        launches.clear()
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        best = min(best, (time.perf_counter() - t0) / CALLS * 1e6)
    launches.clear()
    return best


class _Empty(torch.autograd.Function):
    """An op that does nothing: new outputs, no kernels."""

    @staticmethod
    def forward(ctx, x):
        return x.new_empty(x.shape)

    @staticmethod
    def backward(ctx, g):
        return g.new_empty(g.shape)


def main(reduce="max", do_profile=False):
    torch.autograd.set_multithreading_enabled(False)
    mp = pytest.MonkeyPatch()
    launches = testing.fake_cuda(mp)
    try:
        # small buffers (< 128 KiB): larger CPU allocations are mmapped per call,
        # a cost the CUDA caching allocator does not have
        n = 400
        ei = torch.from_numpy(testing.awkward_edge_index(n, 8000, hub_degree=300, seed=1))
        g = ft.to_graph(ei, n)
        x = torch.randn(n, 32, requires_grad=True)
        cot = torch.randn(n, 32)

        def step():
            torch.autograd.grad(ft.segment_reduce(g, x, reduce), [x], cot)

        with torch.no_grad():
            fwd_ng = us_per_call(lambda: ft.segment_reduce(g, x, reduce), launches)
        rows = [("segment_reduce fwd, no grad", fwd_ng),
                ("segment_reduce fwd, grad", us_per_call(
                    lambda: ft.segment_reduce(g, x, reduce), launches)),
                ("segment_reduce fwd + autograd.grad", us_per_call(step, launches)),
                ("empty autograd.Function fwd + autograd.grad", us_per_call(
                    lambda: torch.autograd.grad(_Empty.apply(x), [x], cot), launches))]
        print(f"fake CUDA plan path, {n} nodes, {ei.shape[1]} edges, F = 32, reduce={reduce!r}")
        for name, us in rows:
            print(f"  {name:46s} {us:7.1f} us")
        if do_profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(CALLS):
                step()
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    finally:
        mp.undo()


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0] if a and a[0] != "profile" else "max", "profile" in a)
