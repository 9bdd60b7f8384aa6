"""Developer probe (GPU): where the host time of one fastgnn.torch op call
goes, on a small graph (where a call costs what Python and the launches
cost). Autograd multithreading off (the backward on the calling thread).

Prints host microseconds per call (perf_counter over blocks of 50
back-to-back calls, a synchronisation between blocks so that the launch queue
never fills and GPU time does not leak into host time) of, from the outside
in: the torch op forward (no grad, with grad) and forward+backward on the
launch plan path, the same through the DLPack bridge (plans off); the array
op on CuPy arrays; the bare launch of the forward's cached plan
(LaunchPlan.run: its kernels, addresses written into the packed parameter
blocks); and the pieces around them (device scope, DLPack both ways, a CuPy
allocation from torch's allocator, torch.empty). Then cProfile's top
functions by own time for a forward+backward.

    python benchmarks/dev/probe_op_host.py [graph spec] [reduce] [calls]
    python benchmarks/dev/probe_op_host.py file:.data/soc-brightkite.txt max 2000
"""
import cProfile
import pstats
import sys
import time

import cupy as cp
import torch

import fastgnn
import fastgnn.torch as ft
from fastgnn.backends.cuda import segment as cuda_segment
from fastgnn.bench import graphs
from fastgnn.torch import _autograd

F = 128


def us_per_call(step, calls, block=50):
    """Host time per call over `calls` calls, timed in blocks of `block` with
    a synchronisation between blocks (untimed), so the launch queue never
    fills and the host never waits for the GPU inside a timed block."""
    step()
    total = 0.0
    for _ in range(max(1, calls // block)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(block):
            step()
        total += time.perf_counter() - t0
    torch.cuda.synchronize()
    return total / (max(1, calls // block) * block) * 1e6


def main(spec="file:.data/soc-brightkite.txt", reduce="max", calls=2000):
    torch.autograd.set_multithreading_enabled(False)
    g = graphs.make(spec, torch, torch.device("cuda"))
    ei, n = g.edge_index, g.num_nodes
    x = torch.randn(n, F, device="cuda", requires_grad=True)
    graph = ft.to_graph(ei, n)
    cot = torch.randn(n, F, device="cuda")
    print(f"graph {g.name}: {n} nodes, {ei.shape[1]} edges; segment_reduce {reduce}, F={F}; "
          f"host us per call (mt off)")
    rows = []

    def row(name, step):
        rows.append((name, us_per_call(step, calls)))
        print(f"  {name:48s} {rows[-1][1]:8.1f}", flush=True)

    with torch.no_grad():
        row("torch op fwd, no grad", lambda: ft.segment_reduce(graph, x, reduce))
    row("torch op fwd, grad", lambda: ft.segment_reduce(graph, x, reduce))
    y = ft.segment_reduce(graph, x, reduce)
    row("torch op fwd + autograd.grad", lambda: torch.autograd.grad(
        ft.segment_reduce(graph, x, reduce), [x], cot))
    _autograd.PLANS = False
    try:
        with torch.no_grad():
            row("DLPack bridge: torch op fwd, no grad", lambda: ft.segment_reduce(graph, x, reduce))
        row("DLPack bridge: torch op fwd + autograd.grad", lambda: torch.autograd.grad(
            ft.segment_reduce(graph, x, reduce), [x], cot))
    finally:
        _autograd.PLANS = True

    xa = cp.from_dlpack(x.detach())
    with _autograd.device_scope(x.device):
        row("array op fwd, no residuals", lambda: fastgnn.segment_reduce_fwd(
            graph, xa, reduce, needs_x_grad=False))
        row("array op fwd (fastgnn.segment_reduce_fwd)", lambda: fastgnn.segment_reduce_fwd(
            graph, xa, reduce))
        out, res = fastgnn.segment_reduce_fwd(graph, xa, reduce)
        ga = cp.from_dlpack(cot)
        row("array op bwd (fastgnn.segment_reduce_bwd)", lambda: fastgnn.segment_reduce_bwd(
            graph, res, ga))
        codes = (reduce,)
        out_t = torch.empty((n, F), device="cuda")
        vec = cuda_segment.vec_for("float32", F, (x.data_ptr(), 4), (out_t.data_ptr(), 4))
        plan = cuda_segment.fwd_plan(graph, codes, F, "float32", True, vec)
        buffer = torch.empty(max(1, plan.residual_bytes), dtype=torch.uint8, device="cuda")
        ws = torch.empty(max(1, plan.workspace_bytes), dtype=torch.uint8, device="cuda")
        ptrs = (x.data_ptr(), out_t.data_ptr(),
                *cuda_segment.carve(buffer.data_ptr(), plan.residual_offsets), ws.data_ptr())
        stream = torch.cuda.current_stream().cuda_stream
        row(f"bare plan launch of the fwd ({len(plan.launches)} kernels)",
            lambda: plan.run(stream, ptrs))

        row("cp.empty((n, F)) from torch's allocator", lambda: cp.empty((n, F), cp.float32))

    def scope():
        with _autograd.device_scope(x.device):
            pass
    row("device_scope enter + exit", scope)
    shared = _autograd._shared_device(x.device)
    row("torch -> cupy (DLPack, shared stream)", lambda: _autograd._to_array(x, shared))
    row("cupy -> torch (DLPack, shared stream)", lambda: _autograd._to_tensor(xa, False, shared))
    row("torch.empty((n, F))", lambda: torch.empty((n, F), device="cuda"))
    del y

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls // 4):
        torch.autograd.grad(ft.segment_reduce(graph, x, reduce), [x], cot)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(*a[:2], *(int(v) for v in a[2:3]))
