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

Each direction's launches for one (graph, request) are a plan (FwdPlan,
BwdPlan: kernel names, grids, task arrays, scalars, buffer layouts) cached on
the graph; segment_fwd / segment_bwd allocate CuPy buffers and run one, and
fastgnn.torch's fast path (adapters/torch/segment_cuda.py) runs the same
plans on torch-allocated buffers.
"""
from __future__ import annotations

import contextlib
import functools

import cupy as cp
import numpy as np

from .loader import (C_INDEX, C_POSITION, C_VALUE, SEGMENT_MAX_VEC, SEGMENT_STATS, SEGMENT_TERMS,
                     STAT_NOARG, VALUE_BYTES, get_function, segment_bwd_kernel,
                     segment_position_type, vec_widths)
from .spmm import (_ITYPE, BLOCK, DEFAULT_CHUNK, _acc_dtype, _arg, _grid, from_acc, lane_group,
                   task_plan, to_acc)

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
# (kernel names, grids, the task arrays, scalar arguments, the byte layout of
# the per-call buffers) is built once per (graph, request) and cached on the
# graph; a call then allocates its buffers and launches. The launchers below
# hand the plans CuPy arrays; fastgnn.torch's fast path hands them raw
# addresses of torch-allocated buffers (`_address` takes either).
_ALIGN = 256          # byte alignment of each buffer carved out of a workspace


def _address(a) -> int:
    """Device address of a kernel pointer argument: a CuPy array, an int
    address, or None (0: absent)."""
    if a is None:
        return 0
    if isinstance(a, int):
        return a
    return a.data.ptr


def _layout(sizes):
    """(byte offsets or None, total bytes) of buffers of `sizes` bytes (0:
    absent) laid out in one workspace, each _ALIGN-aligned."""
    offsets, total = [], 0
    for size in sizes:
        if not size:
            offsets.append(None)
            continue
        offsets.append(total)
        total += -(-size // _ALIGN) * _ALIGN
    return tuple(offsets), total


def carve(workspace, offsets):
    """Addresses of the buffers at `offsets` in `workspace` (0 where absent)."""
    ws = _address(workspace)
    return [0 if o is None else ws + o for o in offsets]


def vec_for(vtype, F, *spans):
    """VEC of the segment kernels: the widest vector (<= loader.SEGMENT_MAX_VEC
    values, <= 16 bytes) dividing F at which every (address, itemsize) in
    `spans` is aligned for VEC of its own elements."""
    vec = 1
    for v in vec_widths(vtype):
        if v <= SEGMENT_MAX_VEC and F % v == 0 and all(a % (v * s) == 0 for a, s in spans):
            vec = v
    return vec


def _spans(*arrays):
    return [(a.data.ptr, a.itemsize) for a in arrays if a is not None]


def arg_terms(codes) -> tuple:
    """The reductions of `codes` with an arg term in the backward ("max",
    "min", in that order: the walk's and BwdPlan's order)."""
    return tuple(c for c in ("max", "min") if c in codes)


def _run(spec, types, args, stream):
    """One launch of a plan: spec = (family, kernel name, grid, leading
    arguments, trailing arguments), fixed per plan; `args` go between the two
    (the call's buffers); types = (value type, index type)."""
    family, name, grid, head, tail = spec
    get_function(family, *types, name)(grid, (BLOCK,), (*head, *args, *tail), stream=stream)


class FwdPlan:
    """The forward's launches for one (graph, codes, F, value type,
    residuals, VEC, chunk): segment_fwd over the task list, then
    segment_combine over split rows when there are any.

    Buffers of a call: out [num_dst, R*F] (x's dtype); `residual_dtypes`:
    argmax, argmin, mean, std, mul's product, mul's one-zero product, each
    [num_dst, F] of that dtype or absent (None); a workspace of
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
        # the six in one buffer (fastgnn.torch's fast path allocates them so)
        self.residual_offsets, self.residual_bytes = _layout(
            [0 if d is None else n * F * d.itemsize for d in self.residual_dtypes])
        tasks = task_plan(graph, chunk)
        S = tasks.num_slots
        # partial states of split rows: only those of the statistics computed
        # (sum, sum of squares, max, min, product, zero count; positions of max, min)
        self.offsets, self.workspace_bytes = _layout(
            [S * F * acc.itemsize if stats & bit else 0
             for bit in (STAT_SUM, STAT_SQ, STAT_MAX, STAT_MIN, STAT_PROD, STAT_PROD)]
            + [S * F * pos.itemsize if stats & bit else 0 for bit in (STAT_MAX, STAT_MIN)])
        group = lane_group(-(-F // vec))
        T, I = C_VALUE[vtype], C_INDEX[itype]
        P = segment_position_type(itype, pos.name, has_args)
        self.types = vtype, itype
        self.empty = F == 0 or n == 0
        num_tasks = int(tasks.task_row.shape[0])
        packed = _packed(codes)
        self.fwd = ("segment", f"segment_fwd<{T}, {I}, {vec}, {stats}, {P}>",
                    _grid(num_tasks, group),
                    (tasks.task_row, tasks.task_begin, tasks.task_slot, graph.indptr,
                     graph.indices),
                    (np.int64(num_tasks), np.int32(F), np.int32(chunk), np.int32(group),
                     np.int32(R), np.int32(packed)))
        num_split = int(tasks.split_row.shape[0])
        # the forward's lane mapping (its VEC fits out; the rest is freshly allocated)
        self.combine = None if not num_split else (
            "segment", f"segment_combine<{T}, {I}, {vec}, {P}>", _grid(num_split, group),
            (tasks.split_row, tasks.slot_ptr, graph.indptr),
            (np.int64(num_split), np.int32(F), np.int32(group), np.int32(stats), np.int32(R),
             np.int32(packed)))

    def launch(self, x, out, residuals, workspace, stream=None):
        """Run the forward: x [num_src, F], out [num_dst, R*F], the six
        residual buffers (None where the plan has none) and the workspace, as
        CuPy arrays or int addresses, on `stream` (None: CuPy's current one)."""
        if self.empty:
            return
        parts = carve(workspace, self.offsets)
        resid = [_address(r) for r in residuals]
        _run(self.fwd, self.types, (_address(x), _address(out), *resid, *parts), stream)
        if self.combine is not None:
            _run(self.combine, self.types, (*parts, _address(out), *resid), stream)


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
    plan.launch(x, out, resid, ws)
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
    kern(_grid(n * (F // vec), 1), (BLOCK,),
         (graph.indptr, graph.indices, _arg(pairs[0][0]), _arg(pairs[0][1]),
          _arg(pairs[1][0]), _arg(pairs[1][1]), acc, np.int64(n), np.int32(F), np.int64(ldg)))


class BwdPlan:
    """The deterministic backward's launches for one (graph, codes, F, value
    type, walk_args, VEC, chunk): segment_coef (when there are linear terms),
    the transpose walk segment_bwd, spmm_combine over split source rows.
    walk_args: the arg terms ("max", "min", in that order) the walk adds
    (none when the atomic path adds them).

    Buffers of a call: x (read with var/std/mul: `needs_x`), the cotangent g
    [num_dst, R*F], the forward's residuals, an optional acc_t addend
    [num_src, F], grad [num_src, F] and a workspace of `workspace_bytes` for
    the coefficient rows and the split rows' partial sums."""

    def __init__(self, graph, codes, F, vtype, walk_args, vec, chunk):
        itype = _ITYPE[np.dtype(graph.index_dtype)]
        acc = np.dtype(_acc_dtype(vtype))
        R, n = len(codes), graph.num_dst
        has_a = any(c not in ("max", "min", "mul") for c in codes)
        has_b = any(c in ("var", "std") for c in codes)
        has_c = "mul" in codes
        self.needs_x = has_b or has_c
        t = graph.transpose()
        tasks = task_plan(t, chunk)
        row = n * F * acc.itemsize
        # coef_a, coef_b, coef_c, coef_d, the walk's partial sums
        self.offsets, self.workspace_bytes = _layout(
            [row if has_a else 0, row if has_b else 0, row if has_c else 0, row if has_c else 0,
             tasks.num_slots * F * acc.itemsize])
        pos = graph.position_dtype if walk_args else np.dtype(graph.index_dtype)
        lin, narg = _terms(3 if has_c else 2 if has_b else int(has_a), len(walk_args))
        P = segment_position_type(itype, pos.name, narg > 0)
        T, I = C_VALUE[vtype], C_INDEX[itype]
        group = lane_group(-(-F // vec))
        self.types = vtype, itype
        self.empty = F == 0 or graph.num_src == 0
        # the cotangent block of each arg term, as a byte offset into g
        self.arg_blocks = [codes.index(c) * F * VALUE_BYTES[vtype] for c in walk_args]
        self.coef = None if not (has_a or has_c) or not n else (
            "segment", f"segment_coef<{T}, {I}>", _grid(n * F, 1), (graph.indptr,),
            (np.int64(n), np.int32(F), np.int32(R), np.int32(_packed(codes))))
        num_tasks = int(tasks.task_row.shape[0])
        self.walk = ("segment",
                     f"{segment_bwd_kernel(lin, narg)}<{T}, {I}, {vec}, {lin}, {narg}, {P}>",
                     _grid(num_tasks, group),
                     (tasks.task_row, tasks.task_begin, tasks.task_slot, t.indptr, t.indices,
                      _arg(graph.transpose_positions if walk_args else None)),
                     (np.int64(num_tasks), np.int32(F), np.int64(R * F), np.int32(chunk),
                      np.int32(group)))
        num_split = int(tasks.split_row.shape[0])
        self.combine = None if not num_split else (
            "spmm", f"spmm_combine<{T}, {I}, {vec}>", _grid(num_split, group),
            (tasks.split_row, tasks.slot_ptr),
            (np.int64(num_split), np.int32(F), np.int32(group)))

    def launch(self, x, g, mean, std, mul, args, addend, grad, workspace, stream=None):
        """Run the backward: args are the walk_args' position arrays; mul is
        (product, one-zero product) or None; the rest as in __init__'s
        docstring, as CuPy arrays or int addresses (None: absent), on `stream`
        (None: CuPy's current one)."""
        if self.empty:
            return
        coef_a, coef_b, coef_c, coef_d, partial = carve(workspace, self.offsets)
        g_at = _address(g)
        mul_out, mul_zero = (None, None) if mul is None else mul
        if self.coef is not None:
            _run(self.coef, self.types, (g_at, _address(mean), _address(std), _address(mul_out),
                                         _address(mul_zero), coef_a, coef_b, coef_c, coef_d),
                 stream)
        terms = [(_address(a), g_at + off) for a, off in zip(args, self.arg_blocks)]
        terms += [(0, 0)] * (2 - len(terms))
        grad_at = _address(grad)
        _run(self.walk, self.types, (_address(x) if self.needs_x else 0, coef_a, coef_b, coef_c,
                                     coef_d, *terms[0], *terms[1], _address(addend), grad_at,
                                     partial), stream)
        if self.combine is not None:
            _run(self.combine, self.types, (partial, 0, 0, grad_at), stream)


def bwd_plan(graph, codes, F, vtype, walk_args, vec, chunk=DEFAULT_CHUNK,
             context=contextlib.nullcontext) -> BwdPlan:
    """The cached BwdPlan of this request (codes, walk_args: tuples);
    `context` as in `_cached_plan`."""
    key = ("cuda_segment_bwd", codes, F, vtype, walk_args, vec, chunk)
    return _cached_plan(graph, key,
                        lambda: BwdPlan(graph, codes, F, vtype, walk_args, vec, chunk), context)


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
    needs_x = any(c in ("var", "std", "mul") for c in codes)
    vec = vec_for(vtype, F, *_spans(x if needs_x else None, addend, grad, *(a for _, a in named)))
    plan = bwd_plan(graph, codes, F, vtype, walk_args, vec, chunk)
    ws = cp.empty(plan.workspace_bytes, dtype=np.uint8) if plan.workspace_bytes else None
    plan.launch(x, g, mean, std, mul, [a for _, a in named], addend, grad, ws)
    if atomic and same_acc:            # float/double: the max/min atomics go in last
        _arg_scatter(graph, atomic, grad, vtype, itype, R * F)
    return grad
