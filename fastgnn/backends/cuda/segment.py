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

Each direction's launches for one (graph, request) are a launch plan
(FwdPlan, BwdPlan; plan.py: kernels, grids, task arrays, scalars, buffer
layouts) cached on the graph; segment_fwd / segment_bwd allocate CuPy
buffers and run one, and fastgnn.torch (adapters/torch/plans.py) runs the
same plans on torch-allocated buffers.
"""
from __future__ import annotations

import contextlib
import functools

import cupy as cp
import numpy as np

from . import decisions
from .loader import (C_INDEX, C_POSITION, C_VALUE, NARROW_POSITIONS, SEGMENT_MAX_VEC,
                     SEGMENT_STATS, SEGMENT_TERMS, STAT_NOARG, VALUE_BYTES, WIDE_UNROLL,
                     WIDE_WALK_TERMS, get_function, segment_bwd_kernel, segment_position_type,
                     segment_widest_vec)
from .plan import Launch, LaunchPlan, Slot, address, current_stream, launch_now, layout
from .spmm import (_ITYPE, BLOCK, BURST, DEFAULT_CHUNK, _acc_dtype, _arg, _grid, from_acc,
                   lane_group, median_ms, sliced_grid, spmm_vec, task_plan, to_acc)

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


# ------------------------------------------------------------ launch plans
# Everything a launch needs that depends only on the graph and the request
# (kernels, grids, the task arrays, scalar arguments, the byte layout of the
# per-call buffers) is a LaunchPlan (plan.py) built once per (graph,
# request) and cached on the graph; a call then allocates its buffers and
# runs the plan on their addresses. The launchers below run the plans on
# CuPy arrays; fastgnn.torch runs the same plans on torch tensors.
def carve(base: int, offsets):
    """Addresses of the buffers at `offsets` in the allocation at `base`
    (0 where absent)."""
    return [0 if o is None or not base else base + o for o in offsets]


def _in(index, offset):
    """A pointer parameter at `offset` bytes into call buffer `index`, or
    null where the offset is None (a buffer the plan does not use)."""
    return None if offset is None else Slot(index, offset)


def vec_for(vtype, F, *spans):
    """VEC of the segment kernels: the widest vector (<= loader.SEGMENT_MAX_VEC
    values, <= 16 bytes) dividing F at which every (address, itemsize) in
    `spans` is aligned for VEC of its own elements."""
    return spmm_vec(vtype, F, *spans, max_values=SEGMENT_MAX_VEC)


def _spans(*arrays):
    return [(a.data.ptr, a.itemsize) for a in arrays if a is not None]


def _ptr(a) -> int:
    return 0 if a is None else a.data.ptr


@functools.lru_cache(maxsize=None)
def reads_x(codes: tuple) -> bool:
    """Whether the backward of `codes` (a tuple) reads x: var, std and mul do."""
    return any(c in ("var", "std", "mul") for c in codes)


@functools.lru_cache(maxsize=None)
def arg_terms(codes: tuple) -> tuple:
    """The reductions of `codes` (a tuple) with an arg term in the backward
    ("max", "min", in that order: the walk's and BwdPlan's order)."""
    return tuple(c for c in ("max", "min") if c in codes)


def _launch(types, name, grid, args, family="segment"):
    """A Launch of kernel `name` of `family`'s (value type, index type) module."""
    return Launch(get_function(family, *types, name), grid, args, name=name)


# the call buffers of a FwdPlan, in `run`'s order
FWD_X, FWD_OUT, FWD_RESIDUALS, FWD_WORKSPACE = 0, 1, 2, 8


class FwdPlan(LaunchPlan):
    """The forward's launches for one (graph, codes, F, value type,
    residuals, VEC, chunk): segment_fwd over the task list, then
    segment_combine over split rows when there are any.

    run(stream, (x, out, argmax, argmin, mean, std, mul's product, mul's
    one-zero product, workspace)): x [num_src, F]; out [num_dst, R*F] (x's
    dtype); the six residuals [num_dst, F] of `residual_dtypes` (None:
    absent, address 0), which `residual_offsets` lays out in one allocation
    of `residual_bytes` (how fastgnn.torch allocates them); a workspace of
    `workspace_bytes` for the split rows' partial states."""

    def __init__(self, graph, codes, F, vtype, residuals, vec, chunk):
        itype = _ITYPE[np.dtype(graph.index_dtype)]
        acc = np.dtype(_acc_dtype(vtype))
        R, n = len(codes), graph.num_dst
        stats = _stats(codes)
        has_args = bool(stats & (STAT_MAX | STAT_MIN))     # the kernel's, maybe more than asked
        # inference (no residuals) wants no positions: the kernel tracks none and
        # split rows' partial positions are only a uint16 "has a value" mark
        if has_args and not residuals:
            stats, pos = stats | STAT_NOARG, np.dtype(np.uint16)
        else:
            pos = graph.position_dtype if has_args else np.dtype(graph.index_dtype)
        var = residuals and ("var" in codes or "std" in codes)
        mul = residuals and "mul" in codes
        self.residual_dtypes = (pos if residuals and "max" in codes else None,
                                pos if residuals and "min" in codes else None,
                                acc if var else None, acc if var and "std" in codes else None,
                                acc if mul else None, acc if mul else None)
        # the six in one buffer (fastgnn.torch allocates them so)
        self.residual_offsets, self.residual_bytes = layout(
            [0 if d is None else n * F * d.itemsize for d in self.residual_dtypes])
        tasks = task_plan(graph, chunk)
        S = tasks.num_slots
        # partial states of split rows: only those of the statistics computed
        # (sum, sum of squares, max, min, product, zero count; positions of max, min)
        offsets, self.workspace_bytes = layout(
            [S * F * acc.itemsize if stats & bit else 0
             for bit in (STAT_SUM, STAT_SQ, STAT_MAX, STAT_MIN, STAT_PROD, STAT_PROD)]
            + [S * F * pos.itemsize if stats & bit else 0 for bit in (STAT_MAX, STAT_MIN)])
        group = lane_group(-(-F // vec))
        T, I = C_VALUE[vtype], C_INDEX[itype]
        P = segment_position_type(itype, pos.name, has_args)
        types = vtype, itype
        parts = [_in(FWD_WORKSPACE, o) for o in offsets]
        resid = [Slot(FWD_RESIDUALS + k) for k in range(6)]
        launches = []
        if F and n:
            num_tasks = int(tasks.task_row.shape[0])
            packed = np.int32(_packed(codes))
            grid, fslice = sliced_grid(num_tasks, F, vec, group)
            launches.append(_launch(
                types, f"segment_fwd<{T}, {I}, {vec}, {stats}, {P}>", grid,
                (tasks.task_row, tasks.task_begin, tasks.task_slot, graph.indptr, graph.indices,
                 Slot(FWD_X), Slot(FWD_OUT), *resid, *parts,
                 np.int64(num_tasks), np.int32(F), np.int32(chunk), np.int32(group),
                 np.int32(R), packed, np.int32(fslice))))
            num_split = int(tasks.split_row.shape[0])
            if num_split:
                # the forward's lane mapping (its VEC fits out; the rest is freshly allocated)
                launches.append(_launch(
                    types, f"segment_combine<{T}, {I}, {vec}, {P}>", _grid(num_split, group),
                    (tasks.split_row, tasks.slot_ptr, graph.indptr, *parts, Slot(FWD_OUT),
                     *resid, np.int64(num_split), np.int32(F), np.int32(group),
                     np.int32(stats), np.int32(R), packed)))
        super().__init__(launches, device=graph_device(graph))


def graph_device(graph):
    """CUDA device index of the graph's arrays, None for a CPU graph (cached)."""
    return graph.cached("cuda_device_index", lambda: (
        int(graph.indices.device.id) if isinstance(graph.indices, cp.ndarray) else None))


def _cached_plan(graph, key, build, context):
    """graph.cached(key, build), building inside `context()` (a callable
    returning a context manager, e.g. fastgnn.torch's device scope: the
    graph's caches a plan builds then come from that allocator and stream)."""
    plan = graph.cache.get(key)
    if plan is None:
        with context():
            plan = graph.cached(key, build)
    return plan


def fwd_plan(graph, codes, F, vtype, residuals, vec, chunk=DEFAULT_CHUNK,
             context=contextlib.nullcontext) -> FwdPlan:
    """The cached FwdPlan of this request (codes: a tuple); `context` as in
    `_cached_plan`."""
    key = ("cuda_segment_fwd", codes, F, vtype, bool(residuals), vec, chunk)
    return _cached_plan(graph, key,
                        lambda: FwdPlan(graph, codes, F, vtype, residuals, vec, chunk), context)


def segment_fwd(graph, x, codes, vtype, residuals=True, chunk=DEFAULT_CHUNK):
    """(out [num_dst, R*F], argmax, argmin, mean, std, mul): see the CPU backend."""
    codes = tuple(codes)
    F, n = x.shape[1], graph.num_dst
    out = cp.empty((n, len(codes) * F), dtype=x.dtype)
    plan = fwd_plan(graph, codes, F, vtype, residuals, vec_for(vtype, F, *_spans(x, out)), chunk)
    resid = [None if d is None else cp.empty((n, F), dtype=d) for d in plan.residual_dtypes]
    ws = cp.empty(plan.workspace_bytes, dtype=np.uint8) if plan.workspace_bytes else None
    plan.run(current_stream(), (x.data.ptr, out.data.ptr, *(_ptr(r) for r in resid), _ptr(ws)))
    argmax, argmin, mean, std, mul_out, mul_zero = resid
    return out, argmax, argmin, mean, std, None if mul_out is None else (mul_out, mul_zero)


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
    vec = vec_for(vtype, F, *_spans(acc, *(a for pair in args for a in pair)))
    kern = get_function("segment", vtype, itype, f"segment_arg_scatter<{T}, {I}, {vec}, {P}>")
    launch_now(kern, _grid(n * (F // vec), 1),
               (graph.indptr, graph.indices, _arg(pairs[0][0]), _arg(pairs[0][1]),
                _arg(pairs[1][0]), _arg(pairs[1][1]), acc, np.int64(n), np.int32(F),
                np.int64(ldg)))


# the call buffers of a BwdPlan, in `run`'s order
(BWD_X, BWD_G, BWD_MEAN, BWD_STD, BWD_MUL_OUT, BWD_MUL_ZERO, BWD_ARG0, BWD_ARG1, BWD_ADDEND,
 BWD_GRAD, BWD_WORKSPACE) = range(11)


class BwdPlan(LaunchPlan):
    """The deterministic backward's launches for one (graph, codes, F, value
    type, walk_args, VEC, chunk): segment_coef (when there are linear terms),
    the transpose walk segment_bwd, spmm_combine over split source rows.
    walk_args: the arg terms ("max", "min", in that order) the walk adds
    (none when the atomic path adds them).

    run(stream, (x, g, mean, std, mul's product, mul's one-zero product,
    arg0, arg1, addend, grad, workspace)): x (read with var/std/mul:
    `needs_x`), the cotangent g [num_dst, R*F], the forward's residuals, the
    walk_args' position arrays, an optional acc_t addend [num_src, F], grad
    [num_src, F] and a workspace of `workspace_bytes` for the coefficient
    rows and the split rows' partial sums."""

    def __init__(self, graph, codes, F, vtype, walk_args, vec, chunk, unroll=1):
        itype = _ITYPE[np.dtype(graph.index_dtype)]
        acc = np.dtype(_acc_dtype(vtype))
        R, n = len(codes), graph.num_dst
        has_a = any(c not in ("max", "min", "mul") for c in codes)
        has_b = any(c in ("var", "std") for c in codes)
        has_c = "mul" in codes
        self.needs_x = reads_x(codes)
        t = graph.transpose()
        tasks = task_plan(t, chunk)
        row = n * F * acc.itemsize
        # coef_a, coef_b, coef_c, coef_d, the walk's partial sums
        offsets, self.workspace_bytes = layout(
            [row if has_a else 0, row if has_b else 0, row if has_c else 0, row if has_c else 0,
             tasks.num_slots * F * acc.itemsize])
        coef_a, coef_b, coef_c, coef_d, partial = (_in(BWD_WORKSPACE, o) for o in offsets)
        pos = graph.position_dtype if walk_args else np.dtype(graph.index_dtype)
        lin, narg = _terms(3 if has_c else 2 if has_b else int(has_a), len(walk_args))
        P = segment_position_type(itype, pos.name, narg > 0)
        # the walk also exists with WIDE_UNROLL edges in flight (`bwd_plan` times the two)
        self.has_wide = ((lin, narg) in WIDE_WALK_TERMS and pos.name in NARROW_POSITIONS
                         and vec == segment_widest_vec(vtype))
        self.unroll = unroll if self.has_wide else 1
        T, I = C_VALUE[vtype], C_INDEX[itype]
        group = lane_group(-(-F // vec))
        types = vtype, itype
        # each arg term: its positions and its cotangent block (a byte offset into g)
        terms = [(Slot(BWD_ARG0 + k), Slot(BWD_G, codes.index(c) * F * VALUE_BYTES[vtype]))
                 for k, c in enumerate(walk_args)]
        terms += [(None, None)] * (2 - len(terms))
        launches = []
        if F and graph.num_src:
            if (has_a or has_c) and n:
                launches.append(_launch(
                    types, f"segment_coef<{T}, {I}>", _grid(n * F, 1),
                    (graph.indptr, Slot(BWD_G), Slot(BWD_MEAN), Slot(BWD_STD),
                     Slot(BWD_MUL_OUT), Slot(BWD_MUL_ZERO), coef_a, coef_b, coef_c, coef_d,
                     np.int64(n), np.int32(F), np.int32(R), np.int32(_packed(codes)))))
            num_tasks = int(tasks.task_row.shape[0])
            launches.append(_launch(
                types, segment_bwd_kernel(T, I, vec, lin, narg, P, self.unroll),
                _grid(num_tasks, group),
                (tasks.task_row, tasks.task_begin, tasks.task_slot, t.indptr, t.indices,
                 graph.transpose_positions if walk_args else None,
                 Slot(BWD_X) if self.needs_x else None, coef_a, coef_b, coef_c, coef_d,
                 *terms[0], *terms[1], Slot(BWD_ADDEND), Slot(BWD_GRAD), partial,
                 np.int64(num_tasks), np.int32(F), np.int64(R * F), np.int32(chunk),
                 np.int32(group))))
            num_split = int(tasks.split_row.shape[0])
            if num_split:
                launches.append(_launch(
                    types, f"spmm_combine<{T}, {I}, {vec}>", _grid(num_split, group),
                    (tasks.split_row, tasks.slot_ptr, partial, None, None, Slot(BWD_GRAD),
                     np.int64(num_split), np.int32(F), np.int32(group)), family="spmm"))
        super().__init__(launches, device=graph_device(graph))


def _timed_bwd_plan(graph, codes, F, vtype, walk_args, vec, chunk, stream, buffers):
    """The BwdPlan of this request with the faster walk: the one its size
    class took (`decisions`) or, on the first graph of a class, where the
    walk exists with WIDE_UNROLL edges in flight (`BwdPlan.has_wide`), both
    timed on this call's buffers (`buffers(plan)`: the addresses, in
    BwdPlan.run's order, and what keeps them allocated; with a scratch
    gradient, since the call's may be its own addend) by their kernels
    (spmm.median_ms over BURST launches) and the faster kept. One edge at a time is faster on graphs whose rows
    stream from DRAM (rmat20: the note at the top of kernels_cuda/segment.cu);
    several can be on graphs whose rows stay in L2, where the walk waits on
    latency."""
    key = ("segment_bwd_walk", codes, F, vtype, walk_args, vec, chunk)
    device = graph_device(graph)
    known = decisions.decided(key, graph, device)
    if known:                           # the class's wide walk won
        return BwdPlan(graph, codes, F, vtype, walk_args, vec, chunk, unroll=WIDE_UNROLL)
    plan = BwdPlan(graph, codes, F, vtype, walk_args, vec, chunk)
    if (known is not None or not plan.has_wide or not plan.launches or buffers is None
            or _capturing(stream)):     # (timing synchronises: never inside a capture)
        return plan
    wide = BwdPlan(graph, codes, F, vtype, walk_args, vec, chunk, unroll=WIDE_UNROLL)
    scratch = _scratch(graph.num_src, F, vtype)
    ptrs, keep = buffers(plan)          # (keep: the workspace, alive while timed)
    timed = list(ptrs)
    timed[BWD_GRAD] = address(scratch)
    times = [median_ms(lambda p=p: p.run(stream, timed), burst=BURST) for p in (plan, wide)]
    del keep, scratch
    return wide if decisions.decide(key, graph, device, times[1] < times[0]) else plan


def _capturing(stream) -> bool:
    """Whether `stream` (a cudaStream_t as int) is being captured into a CUDA graph."""
    from cupy_backends.cuda.api import runtime
    return bool(runtime.streamIsCapturing(stream))


def _scratch(rows, F, vtype):
    """Uninitialised bytes for [rows, F] values of the value type."""
    return cp.empty(rows * F * VALUE_BYTES[vtype], dtype=np.uint8)


def bwd_plan(graph, codes, F, vtype, walk_args, vec, chunk=DEFAULT_CHUNK,
             context=contextlib.nullcontext, stream=0, buffers=None) -> BwdPlan:
    """The cached BwdPlan of this request (codes, walk_args: tuples);
    `context` as in `_cached_plan`. Built on the first call, which passes
    its `stream` and `buffers` (plan -> (the call's buffer addresses, its
    workspace allocated; what holds them)) so that the walk's two forms can be timed
    (`_timed_bwd_plan`); so a plan must be built before a CUDA graph
    capture (fastgnn.torch.warm_up does)."""
    key = ("cuda_segment_bwd", codes, F, vtype, walk_args, vec, chunk)
    return _cached_plan(graph, key, lambda: _timed_bwd_plan(
        graph, codes, F, vtype, walk_args, vec, chunk, stream, buffers), context)


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
    itype = _ITYPE[np.dtype(graph.index_dtype)]
    acc = _acc_dtype(vtype)
    same_acc = np.dtype(acc) == dtype
    # the caller's addend as the kernels' acc_t rows (never written: a 16-bit
    # one is a fresh fp32 copy, which the atomic path may accumulate into)
    user = None if addend is None else to_acc(addend, vtype, acc)
    has_lin = any(c not in ("max", "min") for c in codes)    # terms the walk must add
    # max/min terms: the arg arrays (positions within the forward row, in the
    # graph's position dtype) and the cotangent's blocks (row stride R*F)
    named = [(c, (argmax if c == "max" else argmin).astype(graph.position_dtype, copy=False))
             for c in arg_terms(codes)]
    addend = user
    if named and not deterministic:
        # float atomics over the targets instead of reading arg rows per transpose edge:
        # into grad_x itself for float/double (after the walk's linear terms),
        # else into fp32 sums rounded once (cast, or added by the walk)
        args = [(a, g[:, codes.index(c) * F:]) for c, a in named]
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
        atomic, named = args, []
    else:
        atomic = []
    grad = cp.empty((ns, F), dtype=dtype) if out is None else out
    walk_args = tuple(c for c, _ in named)
    needs_x = reads_x(codes)
    vec = vec_for(vtype, F, *_spans(x if needs_x else None, addend, grad, *(a for _, a in named)))
    args = [a for _, a in named] + [None] * (2 - len(named))
    mul_out, mul_zero = (None, None) if mul is None else mul

    def buffers(plan):
        ws = cp.empty(plan.workspace_bytes, dtype=np.uint8) if plan.workspace_bytes else None
        return (_ptr(x) if plan.needs_x else 0, g.data.ptr, _ptr(mean), _ptr(std),
                _ptr(mul_out), _ptr(mul_zero), _ptr(args[0]), _ptr(args[1]), _ptr(addend),
                grad.data.ptr, _ptr(ws)), ws
    stream = current_stream()
    plan = bwd_plan(graph, codes, F, vtype, walk_args, vec, chunk, stream=stream,
                    buffers=buffers)
    ptrs, ws = buffers(plan)
    plan.run(stream, ptrs)
    if atomic and same_acc:            # float/double: the max/min atomics go in last
        _arg_scatter(graph, atomic, grad, vtype, itype, R * F)
    return grad
