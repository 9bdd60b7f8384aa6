"""The layers' large dense products in the faster of two cuBLAS formulations,
chosen by timing both once per (device, dtype, shape).

torch sends F.linear(x, W) and g.mm(W) to cuBLAS's GEMM, and F.linear(x, W, b)
to cuBLASLt's GEMM with a bias epilogue; with b = 0 that is the same product
by another kernel. Which one is faster depends on the shape (H200, fp32, TF32
off, benchmarks/dev/probe_gemm.py):

    product      N     K = M   cuBLAS    cuBLASLt (+ 0)
    x W^T      2^20     128    0.912 ms  0.830 ms
    g W        2^20     128    0.911     0.849 (as F.linear(g, W^T contiguous, 0))
    x W^T      2^20     256    2.956     2.954
    x W^T      2^17     128    0.114     0.118

so products whose [N, K] operand has at least MIN_NUMEL elements time both
(CUDA events, 3 calls each after a warm-up, one synchronisation, the first
time a shape is seen; not while a CUDA graph is being captured) and keep the
faster. Smaller products, CPU tensors and other layouts call torch directly.
Results are those of a GEMM either way (no TF32 unless torch allows it).
"""
from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

from .custom_ops import compiling

# Smallest [N, K] operand (elements) whose product is timed and dispatched;
# below it a product costs too little for the choice to pay for its timing.
MIN_NUMEL = 1 << 25
_TIMING_CALLS = 3

# (device index, dtype, N, K, M, product) -> True when the cuBLASLt form won
_lt_wins: dict = {}


def tf32_allowed() -> bool:
    """torch lets fp32 CUDA matmuls run in TF32: matmul.fp32_precision ==
    "tf32" where torch has that setting (its legacy allow_tf32 flag raises
    once the new API was used), else allow_tf32."""
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)
    if precision is not None:
        return precision == "tf32"
    return bool(matmul.allow_tf32)


def _eligible(a: torch.Tensor, w: torch.Tensor) -> bool:
    # inside a compiled program Inductor picks its own GEMMs (and the timing
    # below could not run there)
    return (not compiling() and a.is_cuda and a.dim() == 2
            and a.numel() >= MIN_NUMEL and a.dtype == w.dtype and a.is_contiguous()
            and not torch.cuda.is_current_stream_capturing())


def _median_ms(fn) -> float:
    fn()                                             # warm-up: cuBLAS heuristics, workspace
    start = [torch.cuda.Event(enable_timing=True) for _ in range(_TIMING_CALLS)]
    stop = [torch.cuda.Event(enable_timing=True) for _ in range(_TIMING_CALLS)]
    for s, e in zip(start, stop):
        s.record()
        fn()
        e.record()
    stop[-1].synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(start, stop))


def _pick(key, blas, lt) -> torch.Tensor:
    """blas() or lt(), whichever was faster the first time `key` came (lt
    makes its zero bias and W^T copy only when it runs: weight-sized)."""
    wins = _lt_wins.get(key)
    if wins is None:
        with torch.no_grad():
            wins = _median_ms(lt) < _median_ms(blas)
        _lt_wins[key] = wins
    return lt() if wins else blas()


def x_wt(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [N, K] times w [M, K] transposed -> [N, M] (F.linear(x, w))."""
    if not _eligible(x, w):
        return F.linear(x, w)
    n, k = x.shape
    m = w.shape[0]
    return _pick((x.device.index, x.dtype, n, k, m, "x_wt"), lambda: F.linear(x, w),
                 lambda: F.linear(x, w, x.new_zeros(m)))


def g_w(g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """g [N, M] times w [M, K] -> [N, K] (a linear's input gradient, g.mm(w))."""
    if not _eligible(g, w):
        return g.mm(w)
    n, m = g.shape
    k = w.shape[1]
    return _pick((g.device.index, g.dtype, n, m, k, "g_w"), lambda: g.mm(w),
                 lambda: F.linear(g, w.t().contiguous(), g.new_zeros(k)))
