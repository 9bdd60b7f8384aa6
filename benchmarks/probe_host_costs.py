"""Developer probe (GPU): what the pieces of a fastgnn.torch call cost on the
host, in microseconds per call (perf_counter over back-to-back calls; the GPU
work is tiny, so this is what small graphs pay). One line per piece:
allocations (torch, CuPy through PyTorch's allocator), a kernel launch by
argument count, DLPack both ways, the device scope, the cached lookups, the
autograd bridge on an op that does nothing, and the real ops on a tiny graph.

    python benchmarks/probe_host_costs.py [calls]
"""
import sys
import time

import cupy as cp
import numpy as np
import torch

import fastgnn
import fastgnn.torch as ft
from fastgnn.torch import _autograd


def per_call_us(fn, calls):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt / calls * 1e6


def main(calls=2000):
    import importlib
    loader = importlib.import_module("fastgnn.backends.cuda.loader")
    spmm = importlib.import_module("fastgnn.backends.cuda.spmm")
    from fastgnn.testing import rmat_edge_index
    dev = torch.device("cuda")
    ei_np, n = rmat_edge_index(8)
    ei = torch.from_numpy(ei_np).to(dev)
    g = ft.to_graph(ei, n)
    x = torch.randn(n, 64, device=dev, requires_grad=True)
    xs = x.detach()
    scope = _autograd.device_scope(dev)
    noop = cp.RawKernel(r'''extern "C" __global__ void noop1(const float* a) {}''', "noop1")
    src20 = ("extern \"C\" __global__ void noop20(" + ", ".join(
        [f"const float* a{i}" for i in range(12)] + [f"long long s{i}" for i in range(4)]
        + [f"int t{i}" for i in range(4)]) + ") {}")
    noop20 = cp.RawKernel(src20, "noop20")
    with scope:
        a = cp.empty(16, dtype=cp.float32)
        args20 = tuple([a] * 12 + [np.int64(1)] * 4 + [np.int32(1)] * 4)
        cases = {
            "torch.empty(64 floats)": lambda: torch.empty(64, device=dev),
            "cp.empty(64 floats), torch allocator": lambda: cp.empty(64, dtype=cp.float32),
            "launch, 1 arg": lambda: noop((1,), (32,), (a,)),
            "launch, 20 args (12 arrays)": lambda: noop20((1,), (32,), args20),
            "np.int32 + np.int64 scalars (x8)": lambda: [np.int32(1) for _ in range(4)]
            + [np.int64(1) for _ in range(4)],
            "cupy.from_dlpack(torch) (to_array)": lambda: _autograd.to_array(xs),
            "torch.from_dlpack(cupy) (to_tensor)": lambda: _autograd.to_tensor(a),
            "get_function (cached)": lambda: loader.get_function(
                "spmm", "float32", "int32", "spmm_combine<float, int, 4>"),
            "task_plan (cached)": lambda: spmm.task_plan(g, spmm.DEFAULT_CHUNK),
            "graph.transpose() (cached)": lambda: g.transpose(),
        }
        for name, fn in cases.items():
            print(f"{per_call_us(fn, calls):8.1f} us  {name}", flush=True)
    print(f"{per_call_us(lambda: scope.__enter__() or scope.__exit__(None, None, None), calls):8.1f}"
          " us  device_scope enter+exit (outermost)")
    print(f"{per_call_us(lambda: ft.to_graph(ei, n), calls):8.1f} us  to_graph (cache hit)")
    xa = _autograd.to_array(xs)
    gc = g
    with scope:
        out, res = fastgnn.segment_reduce_fwd(gc, xa, "max")
        gout = cp.ones_like(out)
        for name, fn in {
            "fastgnn.segment_reduce_fwd max (CuPy)": lambda: fastgnn.segment_reduce_fwd(gc, xa, "max"),
            "fastgnn.segment_reduce_bwd max (CuPy)": lambda: fastgnn.segment_reduce_bwd(gc, res, gout),
            "fastgnn.spmm (CuPy)": lambda: fastgnn.spmm(gc, xa),
        }.items():
            print(f"{per_call_us(fn, calls):8.1f} us  {name}", flush=True)
    cot = torch.ones(n, 64, device=dev)
    for name, fn in {
        "torch x * 2 fwd+bwd (autograd baseline)": lambda: torch.autograd.grad(x * 2, [x], cot),
        "ft.segment_reduce max fwd (no grad)": lambda: ft.segment_reduce(g, xs, "max"),
        "ft.segment_reduce max fwd+bwd": lambda: torch.autograd.grad(
            ft.segment_reduce(g, x, "max"), [x], cot),
        "ft.spmm fwd+bwd": lambda: torch.autograd.grad(ft.spmm(g, x), [x], cot),
    }.items():
        print(f"{per_call_us(fn, calls // 4):8.1f} us  {name}", flush=True)




def autograd_breakdown(calls=500):
    """Where a fastgnn.torch fwd+bwd's host time goes: an op that does
    nothing through the same bridge, the forward with grad alone, the
    backward alone (retain_graph), the backward on the calling thread
    (autograd multithreading off), and cProfile of the backward."""
    import cProfile
    import pstats
    from fastgnn.testing import rmat_edge_index
    dev = torch.device("cuda")
    ei_np, n = rmat_edge_index(8)
    g = ft.to_graph(torch.from_numpy(ei_np).to(dev), n)
    x = torch.randn(n, 64, device=dev, requires_grad=True)
    cot = torch.ones(n, 64, device=dev)
    ident = _autograd.Op("identity", lambda graph, a: (a.copy(), 0),
                         lambda graph, res, gr: (gr,), inputs=("x",), features=("x",),
                         vtype_arg=None)
    ops = {"identity op": lambda: _autograd.apply(ident, g, x),
           "segment max": lambda: ft.segment_reduce(g, x, "max"),
           "spmm": lambda: ft.spmm(g, x)}
    for name, f in ops.items():
        out = f()
        rows = {
            "fwd with grad": lambda: f(),
            "bwd only (retain_graph)": lambda: torch.autograd.grad(out, [x], cot, retain_graph=True),
            "fwd+bwd": lambda: torch.autograd.grad(f(), [x], cot),
        }
        for row, fn in rows.items():
            print(f"{per_call_us(fn, calls):8.1f} us  {name}: {row}", flush=True)
        with torch.autograd.set_multithreading_enabled(False):
            print(f"{per_call_us(rows['bwd only (retain_graph)'], calls):8.1f} us  {name}: "
                  "bwd only, autograd multithreading off", flush=True)
            print(f"{per_call_us(rows['fwd+bwd'], calls):8.1f} us  {name}: "
                  "fwd+bwd, autograd multithreading off", flush=True)
        if name == "segment max":
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(calls):
                rows["fwd+bwd"]()
            prof.disable()
            torch.cuda.synchronize()
            pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
    autograd_breakdown()
