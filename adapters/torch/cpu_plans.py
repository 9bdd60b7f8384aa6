"""The CPU plan path of fastgnn.torch ops (`Op.cpu`): inference calls on CPU
tensors run the Numba kernel directly, with what does not depend on the call
prepared once per (graph, op, dtype, request) and kept on the graph.

The protocol is the CUDA plan path's (adapters/torch/plans.py):
`forward(graph, static, tensors, needs)` returns None (this call takes the
bridge) or (outputs tuple, single, residuals). A plan serves only calls that
need no gradient, on contiguous float32/float64 CPU tensors whose shapes
match the graph, with a request it covers; anything else (training calls,
bad input, other dtypes, per-call weights or scales) goes to the bridge,
whose core validates and raises as usual. The kernels and their prepared
arguments are the core's (`spmm_runner`, `segment_fwd_runner`), so the
outputs are bitwise the bridge's. Outputs are fresh NumPy arrays handed to
torch by `torch.from_numpy` (never an input's memory; cheaper per call than
`torch.empty(...).numpy()`); inputs are only read.
"""
from __future__ import annotations

import numpy as np
import torch

from fastgnn.backends.cpu.segment import segment_fwd_runner
from fastgnn.backends.cpu.spmm import spmm_runner
from fastgnn.ops.segment import parse_reduce
from fastgnn.ops.spmm import PATHS, _inv_in_degree, _validate_csr_weights

__all__ = ["SPMM", "SEGMENT_REDUCE"]

_KEY = ("fastgnn.torch", "cpu_plans")
_DTYPES = (torch.float32, torch.float64)
_NP = {torch.float32: np.float32, torch.float64: np.float64}


def _plans(graph) -> dict:
    """The graph's plan table (None: not a CPU graph)."""
    cache = getattr(graph, "cache", None)
    plans = None if cache is None else cache.get(_KEY)
    if plans is None:
        if cache is None or not isinstance(graph.indptr, np.ndarray):
            return None
        plans = cache[_KEY] = {}
    return plans


def _array(t: torch.Tensor):
    """A dense contiguous CPU tensor as a NumPy array on its memory (None: not one)."""
    if not t.is_cpu or t.layout != torch.strided or not t.is_contiguous():
        return None
    return (t.detach() if t.requires_grad else t).numpy()


class _Spmm:
    """spmm, sum or mean, without a per-call edge_weight or scales; a bias
    in x's dtype and constant csr_weights are served."""

    def forward(self, graph, static, tensors, needs):
        x, w, b = tensors
        if w is not None or x.dtype not in _DTYPES or x.dim() != 2 or any(needs.values()):
            return None
        cw = static.get("csr_weights")
        if len(static) != 2 + (cw is not None) or static.get("path") not in PATHS:
            return None                         # row_scale / col_scale, or a bad path
        reduce = static.get("reduce")
        plans = _plans(graph)
        if plans is None or reduce not in ("sum", "mean") or x.shape[0] != graph.num_src:
            return None
        key = ("spmm", x.dtype, reduce, None if cw is None else id(cw))
        plan = plans.get(key)
        if plan is None or plan[0] is not cw:
            wdt = _NP[x.dtype]
            w_csr = None if cw is None else _validate_csr_weights(graph, cw, wdt)[0]
            r = _inv_in_degree(graph, wdt) if reduce == "mean" else None
            plan = plans[key] = (cw, spmm_runner(graph, wdt, w_csr, r))
        xa = _array(x)
        if xa is None:
            return None
        ba = None
        if b is not None:
            if b.dtype != x.dtype or b.dim() != 1 or b.shape[0] != x.shape[1]:
                return None
            ba = _array(b)
            if ba is None:
                return None
        out = np.empty((graph.num_dst, x.shape[1]), dtype=xa.dtype)
        plan[1](xa, out, ba)
        return (torch.from_numpy(out),), True, None


class _SegmentReduce:
    """segment_reduce's inference forward, any reduction or list of them."""

    def forward(self, graph, static, tensors, needs):
        x, = tensors
        if x.dtype not in _DTYPES or x.dim() != 2 or needs["x"]:
            return None
        if type(static.get("deterministic", True)) is not bool or len(static) > 2:
            return None
        reduce = static.get("reduce", "sum")
        if not isinstance(reduce, str) and not (isinstance(reduce, (list, tuple)) and all(
                isinstance(r, str) for r in reduce)):
            return None
        plans = _plans(graph)
        if plans is None or x.shape[0] != graph.num_src:
            return None
        key = ("segment", x.dtype, reduce if isinstance(reduce, str) else tuple(reduce))
        plan = plans.get(key)
        if plan is None:
            try:
                codes, _ = parse_reduce(reduce)
            except (TypeError, ValueError):
                return None                     # the bridge raises the core's error
            plan = plans[key] = (len(codes), segment_fwd_runner(graph, _NP[x.dtype], codes))
        xa = _array(x)
        if xa is None:
            return None
        out = np.empty((graph.num_dst, plan[0] * x.shape[1]), dtype=xa.dtype)
        plan[1](xa, out)
        return (torch.from_numpy(out),), True, None


SPMM = _Spmm()
SEGMENT_REDUCE = _SegmentReduce()
