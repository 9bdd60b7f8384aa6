"""CUDA launchers of the reduction family (kernels_cuda/segment.cu).

Forward: one pass per row task (the task list of the SpMM family: hub rows
split, partial states merged in slot order) computing the union of the
statistics the requested reductions need and writing each reduction's block.
Backward: one pass over the cached transpose, summing the linear terms
(sum/mean/var/std) and the arg-selected max/min terms; no atomics.
Interface as the CPU backend (fastgnn/backends/cpu/segment.py).
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from .loader import C_INDEX, C_VALUE, get_function
from .spmm import _ITYPE, BLOCK, NULL, DEFAULT_CHUNK, _acc_dtype, _arg, _grid, _launch_shape, task_plan

CODES = {"sum": 0, "mean": 1, "max": 2, "min": 3, "var": 4, "std": 5}
STAT_SUM, STAT_SQ, STAT_MAX, STAT_MIN = 1, 2, 4, 8


def _stats(codes):
    stats = STAT_SUM
    if any(c in ("var", "std") for c in codes):
        stats |= STAT_SQ
    if "max" in codes:
        stats |= STAT_MAX
    if "min" in codes:
        stats |= STAT_MIN
    return stats


def segment_fwd(graph, x, codes, vtype, chunk=DEFAULT_CHUNK):
    """(out [num_dst, R*F], argmax [num_dst, F] or None, argmin or None)."""
    F, R = x.shape[1], len(codes)
    idx = graph.index_dtype
    itype = _ITYPE[np.dtype(idx)]
    stats = _stats(codes)
    out = cp.empty((graph.num_dst, R * F), dtype=x.dtype)
    argmax = cp.empty((graph.num_dst, F), dtype=idx) if stats & STAT_MAX else None
    argmin = cp.empty((graph.num_dst, F), dtype=idx) if stats & STAT_MIN else None
    if F == 0 or graph.num_dst == 0:
        return out, argmax, argmin
    packed = 0
    for r, c in enumerate(codes):
        packed |= CODES[c] << (3 * r)
    plan = task_plan(graph, chunk)
    acc = _acc_dtype(vtype)
    S = plan.num_slots
    p = [cp.empty((S, F), dtype=acc) if S else NULL for _ in range(4)]
    pa = [cp.empty((S, F), dtype=idx) if S else NULL for _ in range(2)]
    vec, group = _launch_shape(vtype, F, x)
    T, I = C_VALUE[vtype], C_INDEX[itype]
    fwd = get_function("segment", vtype, itype, f"segment_fwd<{T}, {I}, {vec}>")
    num_tasks = int(plan.task_row.shape[0])
    fwd(_grid(num_tasks, group), (BLOCK,),
        (plan.task_row, plan.task_begin, plan.task_slot, graph.indptr, graph.indices, x, out,
         _arg(argmax), _arg(argmin),
         *p, *pa, np.int64(num_tasks), np.int32(F), np.int32(chunk), np.int32(group),
         np.int32(stats), np.int32(R), np.int32(packed)))
    num_split = int(plan.split_row.shape[0])
    if num_split:
        _, group1 = _launch_shape(vtype, F)
        comb = get_function("segment", vtype, itype, f"segment_combine<{T}, {I}>")
        comb(_grid(num_split, group1), (BLOCK,),
             (plan.split_row, plan.slot_ptr, graph.indptr, *p, *pa, out,
              _arg(argmax), _arg(argmin),
              np.int64(num_split), np.int32(F), np.int32(group1), np.int32(stats),
              np.int32(R), np.int32(packed)))
    return out, argmax, argmin


def segment_bwd(graph, x, coef_a, coef_b, argmax, gmax, argmin, gmin, vtype,
                chunk=DEFAULT_CHUNK):
    """grad_x [num_src, F] (see kernels_cuda/segment.cu, segment_bwd)."""
    t = graph.transpose()
    F = next(a.shape[1] for a in (coef_a, coef_b, gmax, gmin) if a is not None)
    dtype = x.dtype if x is not None else _value_dtype(vtype)
    grad = cp.empty((graph.num_src, F), dtype=dtype)
    if F == 0 or graph.num_src == 0:
        return grad
    idx = graph.index_dtype
    itype = _ITYPE[np.dtype(idx)]
    acc = _acc_dtype(vtype)
    terms = ((coef_a is not None) | (coef_b is not None) << 1
             | (argmax is not None) << 2 | (argmin is not None) << 3)
    plan = task_plan(t, chunk)
    partial = cp.empty((plan.num_slots, F), dtype=acc) if plan.num_slots else NULL
    arrays = [a for a in (x, coef_a, coef_b, gmax, gmin, grad) if a is not None]
    vec, group = _launch_shape(vtype, F, *arrays)
    T, I = C_VALUE[vtype], C_INDEX[itype]
    kern = get_function("segment", vtype, itype, f"segment_bwd<{T}, {I}, {vec}>")
    num_tasks = int(plan.task_row.shape[0])
    kern(_grid(num_tasks, group), (BLOCK,),
         (plan.task_row, plan.task_begin, plan.task_slot, t.indptr, t.indices, t.edge_ids,
          _arg(x), _arg(coef_a, acc), _arg(coef_b, acc), _arg(argmax), _arg(gmax, acc),
          _arg(argmin), _arg(gmin, acc), grad, partial, np.int64(num_tasks), np.int32(F), np.int32(chunk),
          np.int32(group), np.int32(terms)))
    num_split = int(plan.split_row.shape[0])
    if num_split:
        combine = get_function("spmm", vtype, itype, f"spmm_combine<{T}, {I}, {vec}>")
        combine(_grid(num_split, group), (BLOCK,),
                (plan.split_row, plan.slot_ptr, partial, NULL, grad, np.int64(num_split),
                 np.int32(F), np.int32(group)))
    return grad


def _value_dtype(vtype):
    return np.uint16 if vtype == "bfloat16" else np.dtype(vtype)
