"""Developer probe (GPU): host microseconds per call of the pieces a fused
SAGEConv(aggr="max") node is made of, on the calling thread and inside an
autograd backward (autograd's CUDA device thread, where fastgnn's backward
runs), at the sizes of a small suite graph (N = 2^17 rows, F = 128, fp32).

Each piece runs in synced blocks of 50 back-to-back calls (perf_counter
around the block, synchronize outside it): the launch queue never fills, so
this is host time, not GPU time. In the backward, the block runs inside a
custom Function's backward and is stamped there.

Pieces: torch's GEMM calls as the node makes them (F.linear with bias,
addmm_ beta = 1, g^T a, g W, the GEMV bias gradient), the same products by
cuBLAS through CuPy's bindings (cublasSgemm / Sgemv on PyTorch's stream),
torch.empty, a CuPy kernel launch with the walk's 23 arguments (arrays vs
raw pointers), and the whole layer's forward and forward+backward.

    python benchmarks/probe_host_pieces.py [N]
"""
import statistics
import sys
import time

import cupy as cp
import numpy as np
import torch
import torch.nn.functional as F
from cupy_backends.cuda.libs import cublas

import fastgnn.torch as ft

BLOCK, ROUNDS = 50, 7
DEV = torch.device("cuda")


def block_us(fn):
    """Median over ROUNDS of the host us per call of BLOCK back-to-back calls."""
    for _ in range(5):
        fn()
    out = []
    for _ in range(ROUNDS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(BLOCK):
            fn()
        out.append((time.perf_counter() - t0) / BLOCK * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)


class _InBackward(torch.autograd.Function):
    """Runs STAMP['fn'] BLOCK times inside backward and stamps it."""
    STAMP: dict = {}

    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    def backward(ctx, g):
        fn = _InBackward.STAMP["fn"]
        t0 = time.perf_counter()
        for _ in range(BLOCK):
            fn()
        _InBackward.STAMP["us"].append((time.perf_counter() - t0) / BLOCK * 1e6)
        return g


def backward_us(fn):
    leaf = torch.zeros(4, device=DEV, requires_grad=True)
    _InBackward.STAMP = {"fn": fn, "us": []}
    for _ in range(2 + ROUNDS):
        torch.cuda.synchronize()
        torch.autograd.grad(_InBackward.apply(leaf).sum(), leaf)
    torch.cuda.synchronize()
    return statistics.median(_InBackward.STAMP["us"][2:])


def main(n=1 << 17):
    f = 128
    agg, x, g = (torch.randn(n, f, device=DEV) for _ in range(3))
    w, wr = torch.randn(f, f, device=DEV), torch.randn(f, f, device=DEV)
    b = torch.randn(f, device=DEV)
    out = torch.empty(n, f, device=DEV)
    ones = torch.ones(n, device=DEV)
    stream = torch.cuda.current_stream().cuda_stream
    handle = cp.cuda.device.get_cublas_handle()
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    p1, p0 = one.ctypes.data, zero.ctypes.data
    T, N = cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N

    def cublas_xwt(dst, a, wt, beta):
        # row-major dst [n, f] (+)= a [n, f] wt^T: column-major dst^T = wt a^T
        cublas.setStream(handle, stream)
        cublas.sgemm(handle, T, N, f, n, f, p1, wt.data_ptr(), f, a.data_ptr(), f, beta,
                     dst.data_ptr(), f)

    def cublas_gta(dst, gg, a):
        # row-major dst [f, f] = gg^T a: column-major dst^T = a^T gg
        cublas.setStream(handle, stream)
        cublas.sgemm(handle, N, T, f, f, n, p1, a.data_ptr(), f, gg.data_ptr(), f, p0,
                     dst.data_ptr(), f)

    def cublas_gemv(dst, gg):
        cublas.setStream(handle, stream)
        cublas.sgemv(handle, N, f, n, p1, gg.data_ptr(), f, ones.data_ptr(), 1, p0,
                     dst.data_ptr(), 1)

    wgrad = torch.empty(f, f, device=DEV)
    bgrad = torch.empty(f, device=DEV)
    pieces = {
        "torch.empty([N, F])": lambda: torch.empty(n, f, device=DEV),
        "torch F.linear(a, W, b)": lambda: F.linear(agg, w, b),
        "torch out.addmm_(x, W_r^T)": lambda: out.addmm_(x, wr.t()),
        "torch g^T.mm(a)": lambda: g.t().mm(agg),
        "torch g.mm(W)": lambda: g.mm(w),
        "torch mv(g^T, 1)": lambda: torch.mv(g.t(), ones),
        "cublas sgemm x W^T (into out)": lambda: cublas_xwt(out, x, wr, p0),
        "cublas sgemm beta=1 (root)": lambda: cublas_xwt(out, x, wr, p1),
        "cublas sgemm g^T a": lambda: cublas_gta(wgrad, g, agg),
        "cublas sgemv g^T 1": lambda: cublas_gemv(bgrad, g),
        "empty + cublas sgemm g W": lambda: cublas_xwt(torch.empty(n, f, device=DEV), g, w, p0),
    }
    # a no-op kernel with the walk's 23 arguments, as CuPy arrays and as raw pointers
    src = ("extern \"C\" __global__ void k23(" + ", ".join(f"const float* a{i}" for i in range(18))
           + ", long long n, int f, long long ld, int c, int gr) {}")
    kern = cp.RawKernel(src, "k23")
    arrs = [cp.empty(16, dtype=cp.float32) for _ in range(18)]
    ptrs = [a.data.ptr for a in arrs]
    tail = (np.int64(5), np.int32(128), np.int64(128), np.int32(128), np.int32(32))
    cs = cp.cuda.ExternalStream(stream)
    pieces["cupy launch, 23 args (arrays)"] = lambda: kern((64,), (256,), (*arrs, *tail), stream=cs)
    pieces["cupy launch, 23 args (ints)"] = lambda: kern((64,), (256,), (*ptrs, *tail), stream=cs)
    pieces["cupy launch, 23 args (ints, py tail)"] = lambda: kern(
        (64,), (256,), (*ptrs, 5, 128, 128, 128, 32), stream=cs)

    print(f"N = {n}, F = {f}, fp32; host us per call (median of {ROUNDS} blocks of {BLOCK})")
    print(f"{'piece':40s} {'caller':>10s} {'backward':>10s}")
    for name, fn in pieces.items():
        try:
            print(f"{name:40s} {block_us(fn):10.1f} {backward_us(fn):10.1f}", flush=True)
        except Exception as exc:  # noqa: BLE001 - a probe: report and go on
            print(f"{name:40s} failed: {type(exc).__name__}: {exc}", flush=True)

    # the layer as a whole (host per call in synced blocks)
    from fastgnn.bench import graphs
    gr = graphs.make(f"uniform{n.bit_length() - 1}", torch, DEV)
    mod = ft.SAGEConv(f, f, aggr="max").to(DEV)
    xx = torch.randn(gr.num_nodes, f, device=DEV, requires_grad=True)
    cot = torch.randn(gr.num_nodes, f, device=DEV)
    params = [xx, *mod.parameters()]

    def fwd():
        with torch.no_grad():
            mod(xx, gr.edge_index)

    def fwd_bwd():
        torch.autograd.grad(mod(xx, gr.edge_index), params, cot)
    print(f"layer fwd (no grad)     {block_us(fwd):8.1f} us")
    print(f"layer fwd+bwd           {block_us(fwd_bwd):8.1f} us")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 17)
