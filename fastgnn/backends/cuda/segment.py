"""CUDA launchers of the reduction family (kernels_cuda/segment.cu).

Forward: one pass per row task (the task list of the SpMM family: hub rows
split, partial states merged in slot order) computing the statistics the
requested reductions need (the smallest instantiated superset) and writing
each reduction's block, plus, when training, the argmax/argmin positions
(within the row, in Graph.position_dtype: uint8 below 256 in-edges, uint16
below 65536) and the mean/std residuals of the backward; an inference
forward (no positions asked for) runs the instantiation that tracks none
(STAT_NOARG).
Backward: one fused pass building coef_a/coef_b (and mul's coef_c/coef_d)
from the cotangent (segment_coef), then one pass over the cached transpose
summing the linear terms, mul's term and the arg-selected max/min terms
(read straight from the cotangent's blocks; each transpose edge's position
in its forward row is cached on the graph, Graph.transpose_positions); no
atomics. Opt-in deterministic=False:
the max/min terms are added by float atomics over the targets
(segment_arg_scatter: grad_x[source of the winning edge] += g per (row,
feature)); a pure max/min then needs no transpose at all, a multi-reduction's
walk keeps only the linear terms (no arg rows read). Interface as the CPU
backend (fastgnn/backends/cpu/segment.py).
"""
from __future__ import annotations

import functools

import cupy as cp
import numpy as np

from .loader import (C_INDEX, C_POSITION, C_VALUE, SEGMENT_MAX_VEC, SEGMENT_STATS, SEGMENT_TERMS,
                     STAT_NOARG, get_function, segment_bwd_kernel, segment_position_type)
from .spmm import (_ITYPE, BLOCK, NULL, DEFAULT_CHUNK, _acc_dtype, _arg, _grid, _launch_shape,
                   from_acc, lane_group, task_plan, to_acc)

CODES = {"sum": 0, "mean": 1, "max": 2, "min": 3, "var": 4, "std": 5, "mul": 6}
STAT_SUM, STAT_SQ, STAT_MAX, STAT_MIN, STAT_PROD = 1, 2, 4, 8, 32


@functools.lru_cache(maxsize=None)
def _stats(codes: tuple):
    """The smallest instantiated statistic set covering `codes` (memoised:
    a handful of reduction tuples, asked on every call)."""
    need = 0
    if any(c in ("sum", "mean", "var", "std") for c in codes):
        need |= STAT_SUM
    if any(c in ("var", "std") for c in codes):
        need |= STAT_SQ
    if "max" in codes:
        need |= STAT_MAX
    if "min" in codes:
        need |= STAT_MIN
    if "mul" in codes:
        need |= STAT_PROD
    return min((s for s in SEGMENT_STATS if s & need == need), key=lambda s: (bin(s).count("1"), s))


@functools.lru_cache(maxsize=None)
def _packed(codes: tuple):
    packed = 0
    for r, c in enumerate(codes):
        packed |= CODES[c] << (3 * r)
    return packed


def segment_fwd(graph, x, codes, vtype, residuals=True, chunk=DEFAULT_CHUNK):
    """(out [num_dst, R*F], argmax, argmin, mean, std, mul): see the CPU backend."""
    F, R = x.shape[1], len(codes)
    idx = graph.index_dtype
    itype = _ITYPE[np.dtype(idx)]
    acc = _acc_dtype(vtype)
    codes = tuple(codes)
    stats = _stats(codes)
    n = graph.num_dst
    out = cp.empty((n, R * F), dtype=x.dtype)
    has_args = bool(stats & (STAT_MAX | STAT_MIN))      # the kernel's, maybe more than asked
    # inference (no residuals) wants no positions: the kernel tracks none and
    # split rows' partial positions are only a uint16 "has a value" mark
    # (STAT_NOARG = 0: benchmarks/sweep_segment.py's args-always variant)
    if has_args and not residuals and STAT_NOARG:
        stats, pos = stats | STAT_NOARG, np.dtype(np.uint16)
    else:
        pos = graph.position_dtype if has_args else np.dtype(idx)
    argmax = cp.empty((n, F), dtype=pos) if residuals and "max" in codes else None
    argmin = cp.empty((n, F), dtype=pos) if residuals and "min" in codes else None
    var = residuals and ("var" in codes or "std" in codes)
    mean = cp.empty((n, F), dtype=acc) if var else None
    std = cp.empty((n, F), dtype=acc) if var and "std" in codes else None
    mul = ((cp.empty((n, F), dtype=acc), cp.empty((n, F), dtype=acc))
           if residuals and "mul" in codes else None)
    if F == 0 or n == 0:
        return out, argmax, argmin, mean, std, mul
    packed = _packed(codes)
    plan = task_plan(graph, chunk)
    S = plan.num_slots
    # partial states of split rows: only those of the statistics computed
    p = [cp.empty((S, F), dtype=acc) if S and stats & bit else NULL
         for bit in (STAT_SUM, STAT_SQ, STAT_MAX, STAT_MIN, STAT_PROD, STAT_PROD)]
    pa = [cp.empty((S, F), dtype=pos) if S and stats & bit else NULL for bit in (STAT_MAX, STAT_MIN)]
    resid = (_arg(argmax), _arg(argmin), _arg(mean), _arg(std),
             *(_arg(a) for a in (mul or (None, None))))
    vec, group = _shape(vtype, F, x, out)
    T, I = C_VALUE[vtype], C_INDEX[itype]
    P = segment_position_type(itype, pos.name, has_args)
    fwd = get_function("segment", vtype, itype, f"segment_fwd<{T}, {I}, {vec}, {stats}, {P}>")
    num_tasks = int(plan.task_row.shape[0])
    fwd(_grid(num_tasks, group), (BLOCK,),
        (plan.task_row, plan.task_begin, plan.task_slot, graph.indptr, graph.indices, x, out,
         *resid, *p, *pa, np.int64(num_tasks), np.int32(F), np.int32(chunk), np.int32(group),
         np.int32(R), np.int32(packed)))
    num_split = int(plan.split_row.shape[0])
    if num_split:
        # the forward's lane mapping (its VEC fits out; the rest is freshly allocated)
        comb = get_function("segment", vtype, itype, f"segment_combine<{T}, {I}, {vec}, {P}>")
        comb(_grid(num_split, group), (BLOCK,),
             (plan.split_row, plan.slot_ptr, graph.indptr, *p, *pa, out, *resid,
              np.int64(num_split), np.int32(F), np.int32(group), np.int32(stats),
              np.int32(R), np.int32(packed)))
    return out, argmax, argmin, mean, std, mul


def _shape(vtype, F, *arrays):
    """(VEC, group) of the segment kernels: spmm's _launch_shape with VEC
    capped at loader.SEGMENT_MAX_VEC (see there)."""
    vec, _ = _launch_shape(vtype, F, *arrays)
    vec = min(vec, SEGMENT_MAX_VEC)
    return vec, lane_group(-(-F // vec))


def _terms(lin, narg):
    """The first instantiated (LIN, NARG) bound covering the request."""
    return next(t for t in SEGMENT_TERMS if t[0] >= lin and t[1] >= narg)


def _arg_scatter(graph, args, acc, vtype, itype, ldg):
    """acc[source of each (row, feature)'s winning edge] += its cotangent, with
    float atomics (kernels_cuda/segment.cu, segment_arg_scatter). args: one or
    two (positions [num_dst, F] in Graph.position_dtype, cotangent block with
    row stride ldg); acc: [num_src, F] float32/float64, zeroed or holding the
    linear terms."""
    F = acc.shape[1]
    n = graph.num_dst
    pairs = args + [(None, None)] * (2 - len(args))
    T, I = C_VALUE[vtype], C_INDEX[itype]
    P = C_POSITION[args[0][0].dtype.name]
    vec, _ = _shape(vtype, F, acc, *(a for pair in args for a in pair))
    kern = get_function("segment", vtype, itype, f"segment_arg_scatter<{T}, {I}, {vec}, {P}>")
    kern(_grid(n * (F // vec), 1), (BLOCK,),
         (graph.indptr, graph.indices, _arg(pairs[0][0]), _arg(pairs[0][1]),
          _arg(pairs[1][0]), _arg(pairs[1][1]), acc, np.int64(n), np.int32(F), np.int64(ldg)))


def segment_bwd(graph, x, g, codes, mean, std, argmax, argmin, vtype, mul=None,
                chunk=DEFAULT_CHUNK, deterministic=True, addend=None, out=None):
    """grad_x [num_src, F] (see kernels_cuda/segment.cu: segment_coef and
    segment_bwd; with deterministic=False and max/min requested,
    segment_arg_scatter adds the max/min terms with float atomics and the
    transpose walk keeps only the linear terms, or does not run at all).
    addend: optional [num_src, F] in the value type, added before the single
    rounding (float/double: read by the walk as is; 16-bit: as an fp32 copy).
    out: optional contiguous [num_src, F] destination (returned); it may be
    addend itself (read by the walk before it stores there)."""
    codes = tuple(codes)
    R = len(codes)
    F = g.shape[1] // R
    dtype = g.dtype
    ns = graph.num_src
    if F == 0 or ns == 0:
        return cp.empty((ns, F), dtype=dtype) if out is None else out
    idx = graph.index_dtype
    itype = _ITYPE[np.dtype(idx)]
    acc = _acc_dtype(vtype)
    T, I = C_VALUE[vtype], C_INDEX[itype]
    same_acc = np.dtype(acc) == dtype
    # the caller's addend as the kernels' acc_t rows (never written: a 16-bit
    # one is a fresh fp32 copy, which the atomic path may accumulate into)
    user = None if addend is None else to_acc(addend, vtype, acc)
    n = graph.num_dst
    has_a = any(c not in ("max", "min", "mul") for c in codes)
    has_b = any(c in ("var", "std") for c in codes)
    has_c = "mul" in codes
    has_lin = has_a or has_c            # terms the transpose walk must add
    # max/min terms: the arg arrays (positions within the forward row, in the
    # graph's position dtype) and the cotangent's blocks (row stride R*F)
    args = [(a, g[:, codes.index(c) * F:]) for c, a in (("max", argmax), ("min", argmin))
            if a is not None]
    pos = graph.position_dtype if args else np.dtype(idx)
    args = [(a.astype(pos, copy=False), gb) for a, gb in args]
    addend = user
    if args and not deterministic:
        # float atomics over the targets instead of reading arg rows per transpose edge:
        # into grad_x itself for float/double (after the walk's linear terms),
        # else into fp32 sums rounded once (cast, or added by the walk)
        if same_acc:
            if not has_lin:
                grad = cp.empty((ns, F), dtype=dtype) if out is None else out
                if user is None:
                    grad.fill(0)
                elif user.data.ptr != grad.data.ptr:
                    cp.copyto(grad, user)
                _arg_scatter(graph, args, grad, vtype, itype, R * F)
                return grad
        else:
            addend = cp.zeros((ns, F), dtype=acc) if user is None else user
            _arg_scatter(graph, args, addend, vtype, itype, R * F)
            if not has_lin:
                return from_acc(addend, dtype, "segment", vtype, itype, out=out)
        atomic, args = args, []
    else:
        atomic = []
    t = graph.transpose()
    grad = cp.empty((ns, F), dtype=dtype) if out is None else out
    coef_a = cp.empty((n, F), dtype=acc) if has_a else None
    coef_b = cp.empty((n, F), dtype=acc) if has_b else None
    coef_c, coef_d = ((cp.empty((n, F), dtype=acc), cp.empty((n, F), dtype=acc)) if has_c
                      else (None, None))
    mul_out, mul_zero = mul if has_c else (None, None)
    if has_lin and n:
        coef = get_function("segment", vtype, itype, f"segment_coef<{T}, {I}>")
        coef(_grid(n * F, 1), (BLOCK,),
             (graph.indptr, g, _arg(mean, acc), _arg(std, acc), _arg(mul_out, acc),
              _arg(mul_zero, acc), _arg(coef_a), _arg(coef_b), _arg(coef_c), _arg(coef_d),
              np.int64(n), np.int32(F), np.int32(R), np.int32(_packed(codes))))
    t_pos = graph.transpose_positions if args else None
    lin, narg = _terms(3 if has_c else 2 if has_b else int(has_a), len(args))
    P = segment_position_type(itype, pos.name, narg > 0)
    args += [(None, None)] * (2 - len(args))
    plan = task_plan(t, chunk)
    partial = cp.empty((plan.num_slots, F), dtype=acc) if plan.num_slots else NULL
    keep_x = x if has_b or has_c else None
    arrays = [a for a in (keep_x, coef_a, coef_b, coef_c, coef_d, args[0][0], args[1][0], addend,
                          grad) if a is not None]
    vec, group = _shape(vtype, F, *arrays)
    kern = get_function("segment", vtype, itype,
                        f"{segment_bwd_kernel(lin, narg)}<{T}, {I}, {vec}, {lin}, {narg}, {P}>")
    num_tasks = int(plan.task_row.shape[0])
    kern(_grid(num_tasks, group), (BLOCK,),
         (plan.task_row, plan.task_begin, plan.task_slot, t.indptr, t.indices, _arg(t_pos),
          _arg(keep_x), _arg(coef_a), _arg(coef_b), _arg(coef_c), _arg(coef_d),
          _arg(args[0][0]), _arg(args[0][1]), _arg(args[1][0]), _arg(args[1][1]),
          _arg(addend), grad, partial, np.int64(num_tasks), np.int32(F), np.int64(R * F),
          np.int32(chunk), np.int32(group)))
    num_split = int(plan.split_row.shape[0])
    if num_split:
        combine = get_function("spmm", vtype, itype, f"spmm_combine<{T}, {I}, {vec}>")
        combine(_grid(num_split, group), (BLOCK,),
                (plan.split_row, plan.slot_ptr, partial, NULL, NULL, grad, np.int64(num_split),
                 np.int32(F), np.int32(group)))
    if atomic and same_acc:            # float/double: the max/min atomics go in last
        _arg_scatter(graph, atomic, grad, vtype, itype, R * F)
    return grad
