"""CUDA launchers of the SpMM family: two paths and a dispatcher.

* "custom": kernels_cuda/spmm.cu. Rows are cut into tasks of at most `chunk`
  edges (cached per graph), a lane group per task, vectorised loads; any
  value type (fp32/fp64/fp16/bf16, fp32 accumulation), int32 or int64.
* "cusparse": cuSPARSE generic SpMM (row-major dense operands, CSR) through
  CuPy's low-level bindings; descriptors, the chosen algorithm and the
  workspace are cached per (graph, width, dtype). fp32/fp64 only.

"auto" times every candidate (each cuSPARSE algorithm, the custom kernel at
a few chunk sizes) once per (size class, width, value type, weighted) with
CUDA events (`decisions`: the first graph of a class is timed, every later
graph of the class takes its answer untimed), keeps the fastest and records
the choice in `graph.cache` under ("spmm_plan", F, vtype, weighted,
deterministic) -> SpmmChoice (see `chosen_paths`). A bias (added in the custom kernel's store) restricts the
choice to the custom kernel's chunk sizes (key's last item "bias"); its
gradient is a fixed-order column sum (`column_sums`).

All launches go to CuPy's current stream; all buffers come from CuPy's
current allocator (PyTorch's when called through fastgnn.torch).
"""
from __future__ import annotations

import dataclasses
import functools

import cupy as cp
import numpy as np

from . import decisions
from .graph_build import task_lists
from .loader import C_INDEX, C_VALUE, VALUE_BYTES, get_function, vec_widths
from .plan import BLOCK, Launch, LaunchPlan, Slot, current_stream, launch_now, layout

CHUNKS = (64, 256, 1024)     # custom-kernel task sizes tried by "auto"
DEFAULT_CHUNK = 256
_ITYPE = {np.dtype(np.int32): "int32", np.dtype(np.int64): "int64"}


def _acc_dtype(vtype):
    return np.float64 if vtype == "float64" else np.float32


def from_acc(a, dtype, family, vtype, itype, out=None):
    """The fp32/fp64 sums `a` (contiguous) in `dtype`, the storage of vtype: `a`
    itself when that is its dtype (copied into `out` when one is given), else
    cast by `family`'s cast_from_acc instantiation (kernels_cuda/common.cuh;
    the atomic backwards of 16-bit types) into `out` or a new array."""
    if a.dtype == dtype:
        if out is None:
            return a
        cp.copyto(out, a)
        return out
    out = cp.empty(a.shape, dtype=dtype) if out is None else out
    fn = get_function(family, vtype, itype, f"cast_from_acc<{C_VALUE[vtype]}>")
    launch_now(fn, (max(1, -(-a.size // BLOCK)),), (a, out, np.int64(a.size)))
    return out


def to_acc(a, vtype, dtype):
    """The value-type array `a` as `dtype` (fp32/fp64 sums; bf16 travels as
    16-bit integers whose bits are the high half of an fp32): `a` itself when
    it already has that dtype, else a new array."""
    if vtype == "bfloat16":
        return (a.view(cp.uint16).astype(cp.uint32) << 16).view(cp.float32).astype(dtype, copy=False)
    return a.astype(dtype, copy=False)


# Rows per thread in the first level of `column_sum` over a [rows, cols]
# gradient: 64 gives rmat20's 1M x 128 two million threads (enough loads in
# flight to stream grad_out), and levels of 64x fewer rows after it.
COLUMN_SUM_ROWS = 64


def column_sum(a, family, vtype, itype, rows_per_block=COLUMN_SUM_ROWS):
    """[cols] sum over the rows of a [rows, cols] (contiguous; the value type
    of vtype or its acc type) in the acc type (fp32, fp64 for float64), in a
    fixed order: `family`'s column_sum instantiations (common.cuh) sum blocks
    of rows_per_block rows, level after level (no atomics: bitwise repeatable
    for one shape; `ColumnSumPlan`). A new array, never a view of `a`."""
    rows, cols = a.shape
    acc = _acc_dtype(vtype)
    if rows == 0 or cols == 0:
        return cp.zeros(cols, dtype=acc)
    plan = column_sum_plan(family, vtype, itype, rows, cols, a.dtype != acc, False,
                           rows_per_block)
    out = cp.empty(cols, dtype=acc)
    ws = cp.empty(plan.workspace_bytes, dtype=np.uint8) if plan.workspace_bytes else None
    plan.run(current_stream(), (a.data.ptr, out.data.ptr, _ptr(ws)))
    return out


def _ptr(a) -> int:
    return 0 if a is None else a.data.ptr


class ColumnSumPlan(LaunchPlan):
    """The levels of a fixed-order column sum of a [rows, cols] input
    (rows, cols > 0; `column_sum`), each level a column_sum launch summing
    blocks of rows_per_block rows into the next level's rows, and with
    `cast` the final cast_from_acc into the value type.

    run(stream, (input, output [cols], workspace)): the input in the value
    type (`from_value`) or the acc type; the output in the acc type, or the
    value type with `cast`; a workspace of `workspace_bytes` for the levels
    between (their rows, in the acc type)."""

    def __init__(self, family, vtype, itype, rows, cols, from_value, cast, rows_per_block):
        acc = np.dtype(_acc_dtype(vtype))
        A = "double" if acc == np.float64 else "float"
        launches, level_rows = [], []
        r = rows
        while True:             # the levels: rows -> ceil(rows / R) ... -> 1
            r = -(-r // rows_per_block)
            level_rows.append(r)
            if r == 1:
                break
        # every level's rows in the workspace, but the last one's when it is the output
        sizes = [n * cols * acc.itemsize for n in (level_rows if cast else level_rows[:-1])]
        offsets, self.workspace_bytes = layout(sizes)
        src, r = Slot(0), rows
        for k, n in enumerate(level_rows):
            S = C_VALUE[vtype] if (k == 0 and from_value) else A
            dst = Slot(2, offsets[k]) if k < len(offsets) else Slot(1)
            name = f"column_sum<{S}>"
            launches.append(Launch(get_function(family, vtype, itype, name),
                                   (max(1, -(-n * cols // BLOCK)),),
                                   (src, dst, np.int64(r), np.int32(cols),
                                    np.int32(rows_per_block)), name=name))
            src, r = dst, n
        if cast:
            name = f"cast_from_acc<{C_VALUE[vtype]}>"
            launches.append(Launch(get_function(family, vtype, itype, name),
                                   (max(1, -(-cols // BLOCK)),), (src, Slot(1), np.int64(cols)),
                                   name=name))
        super().__init__(launches)


_column_sum_plans: dict = {}


def column_sum_plan(family, vtype, itype, rows, cols, from_value, cast,
                    rows_per_block=COLUMN_SUM_ROWS) -> ColumnSumPlan:
    """The cached ColumnSumPlan of this shape on the current device."""
    key = (family, vtype, itype, rows, cols, bool(from_value), bool(cast), rows_per_block,
           cp.cuda.runtime.getDevice())
    plan = _column_sum_plans.get(key)
    if plan is None:
        if len(_column_sum_plans) > 256:          # shapes come and go; keep this small
            _column_sum_plans.clear()
        plan = _column_sum_plans[key] = ColumnSumPlan(family, vtype, itype, rows, cols,
                                                      from_value, cast, rows_per_block)
    return plan


# ------------------------------------------------------------------ tasks
@dataclasses.dataclass
class TaskPlan:
    """Rows cut into tasks of <= chunk edges (see kernels_cuda/spmm.cu)."""
    chunk: int
    task_row: cp.ndarray     # [T]
    task_begin: cp.ndarray   # [T]
    task_slot: cp.ndarray    # [T] partial slot or -1
    split_row: cp.ndarray    # [S] rows with more than one task
    slot_ptr: cp.ndarray     # [S + 1]
    num_slots: int


def task_plan(graph, chunk: int = DEFAULT_CHUNK, visit: bool = True) -> TaskPlan:
    """Tasks in the order the rows are visited: the graph's `visit_rows()`
    (a visit order, `Graph.reorder(..., relabel=False)`) when `visit`, else
    row 0, 1, ...; a row's tasks are consecutive, the slots of split rows
    numbered in task order. The fused attention asks for visit=False: a
    visit order slowed it down (H200, scale-20 suite, docs/reordering.md)."""
    use = visit and graph.visit_order is not None

    def build():
        idx = graph.index_dtype
        order = graph.visit_rows() if use else None       # [num_dst] or None
        if graph.max_in_degree <= chunk:
            # a task per row, in the order visited (max_in_degree is a count
            # the graph keeps: no synchronisation here)
            row = (cp.arange(graph.num_dst, dtype=idx) if order is None
                   else order.astype(idx, copy=False))
            return TaskPlan(chunk, row, graph.indptr[row] if order is not None
                            else graph.indptr[:-1], cp.full(graph.num_dst, -1, dtype=idx),
                            cp.zeros(0, dtype=idx), cp.zeros(1, dtype=idx), 0)
        return TaskPlan(chunk, *task_lists(
            graph.indptr, None if order is None else order.astype(idx, copy=False), chunk))
    return graph.cached(("spmm_tasks", chunk, use), build)


def _launch_shape(vtype, F, *arrays):
    """(VEC, group): `spmm_vec` for these arrays, and the power-of-two lane
    count (<= 32) covering F."""
    vec = spmm_vec(vtype, F, *((a.data.ptr, a.itemsize) for a in arrays))
    return vec, lane_group(-(-F // vec))


def lane_group(width):
    """Lanes per group for `width` lane-sized units: the power of two covering
    it, at most 32 (every family's kernels map groups this way)."""
    group = 1
    while group < min(width, 32):
        group *= 2
    return group


def _grid(num_units, group):
    return (max(1, -(-num_units * group // BLOCK)),)


# Threads a task-parallel launch wants in flight (about eight waves of the
# H200's 132 SMs x 2048 threads): fewer tasks than that cut each row's
# features into slices along grid y (`sliced_grid`). 2^21 is the fastest
# target measured on Cora and CiteSeer's raw features (docs/design.md).
SLICE_TARGET_THREADS = 1 << 21


def sliced_grid(num_tasks, F, vec, group):
    """(grid, fslice) of a kernel walking F features per task in lane groups
    (spmm_fwd, segment_fwd): grid x over tasks; grid y over feature slices of
    fslice features (a multiple of group * vec), as many as it takes to put
    about SLICE_TARGET_THREADS threads in flight, at most one pass of the
    group per slice. Wide features on few rows (a first layer on Cora's 2708
    x 1433) would otherwise leave each group 45 passes in a row and most of
    the GPU idle."""
    step = group * vec
    passes = max(1, -(-F // step))
    want = -(-SLICE_TARGET_THREADS // max(1, num_tasks * group))
    slices = max(1, min(passes, want, 65535))
    fslice = -(-passes // slices) * step
    return (_grid(num_tasks, group)[0], max(1, -(-F // fslice))), fslice


NULL = np.uint64(0)   # a null device pointer as a kernel argument


def _arg(a, dtype=None):
    """A kernel pointer argument: the array (as dtype, copied only if it is
    not already), or NULL for an absent one. Kernels read a pointer only
    when its flag (HAS_W, stats, terms, ...) says it is there."""
    if a is None:
        return NULL
    return a if dtype is None else a.astype(dtype, copy=False)


# the call buffers of an SpmmPlan, in `run`'s order
(SPMM_X, SPMM_WEIGHTS, SPMM_ROW_SCALE, SPMM_COL_SCALE, SPMM_BIAS, SPMM_OUT,
 SPMM_WORKSPACE) = range(7)


class SpmmPlan(LaunchPlan):
    """The custom kernel's launches for one (graph, F, value type, weighted,
    chunk, VEC): spmm_fwd over the task list (a lane group per task of <=
    chunk edges), then spmm_combine over split rows (their partial sums
    merged in slot order).

    run(stream, (x, weights, row_scale, col_scale, bias, out, workspace)):
    x [num_src, F]; weights [E] CSR order (given iff `weighted`), row_scale
    [num_dst] and col_scale [num_src] in the acc type, bias [F] in x's
    dtype, each optional (0); out [num_dst, F]; a workspace of
    `workspace_bytes` for the split rows' partial sums (the acc type)."""

    def __init__(self, graph, F, vtype, weighted, chunk, vec):
        itype = _ITYPE[np.dtype(graph.index_dtype)]
        acc = np.dtype(_acc_dtype(vtype))
        tasks = task_plan(graph, chunk)
        self.workspace_bytes = tasks.num_slots * F * acc.itemsize
        group = lane_group(-(-F // vec))
        T, I = C_VALUE[vtype], C_INDEX[itype]
        partial = Slot(SPMM_WORKSPACE) if self.workspace_bytes else None
        launches = []
        if F and graph.num_dst:
            num_tasks = int(tasks.task_row.shape[0])
            name = f"spmm_fwd<{T}, {I}, {vec}, {'true' if weighted else 'false'}>"
            grid, fslice = sliced_grid(num_tasks, F, vec, group)
            launches.append(Launch(
                get_function("spmm", vtype, itype, name), grid,
                (tasks.task_row, tasks.task_begin, tasks.task_slot, graph.indptr, graph.indices,
                 Slot(SPMM_WEIGHTS), Slot(SPMM_ROW_SCALE), Slot(SPMM_COL_SCALE),
                 Slot(SPMM_BIAS), Slot(SPMM_X), Slot(SPMM_OUT), partial, np.int64(num_tasks),
                 np.int32(F), np.int32(chunk), np.int32(group), np.int32(fslice)), name=name))
            num_split = int(tasks.split_row.shape[0])
            if num_split:
                name = f"spmm_combine<{T}, {I}, {vec}>"
                launches.append(Launch(
                    get_function("spmm", vtype, itype, name), _grid(num_split, group),
                    (tasks.split_row, tasks.slot_ptr, partial, Slot(SPMM_ROW_SCALE),
                     Slot(SPMM_BIAS), Slot(SPMM_OUT), np.int64(num_split), np.int32(F),
                     np.int32(group)), name=name))
        super().__init__(launches)


@functools.lru_cache(maxsize=None)
def _widest_vec(vtype, F, max_values):
    """The widest vector width (<= 16 bytes, <= max_values values) dividing F."""
    return max(v for v in vec_widths(vtype) if v <= max_values and F % v == 0)


def spmm_vec(vtype, F, *spans, max_values=8):
    """VEC of the SpMM kernels: the widest vector (<= 16 bytes of the value
    type, <= max_values values) dividing F at which every (address,
    itemsize) in `spans` is aligned for VEC of its own elements. (Asked on
    every call: 16-byte aligned arrays of the value type, the allocators'
    rule, take a memoised answer.)"""
    size = VALUE_BYTES[vtype]
    for a, s in spans:
        if a & 15 or s != size:
            break
    else:
        return _widest_vec(vtype, F, max_values)
    vec = 1
    for v in vec_widths(vtype):
        if v <= max_values and F % v == 0 and all(a % (v * s) == 0 for a, s in spans):
            vec = v
    return vec


def spmm_plan(graph, F, vtype, weighted, chunk, vec) -> SpmmPlan:
    """The cached SpmmPlan of this request."""
    return graph.cached(("cuda_spmm", F, vtype, bool(weighted), chunk, vec),
                        lambda: SpmmPlan(graph, F, vtype, weighted, chunk, vec))


def spmm_custom(graph, x, weight_csr, vtype, chunk=DEFAULT_CHUNK, out=None, row_scale=None,
                col_scale=None, bias=None):
    """[num_dst, F]: out[i] = r_i sum_e w_e c_j x[j] (+ bias) by spmm_fwd (+
    spmm_combine for rows split into several tasks; `SpmmPlan`). x
    [num_src, F], weight_csr [E] CSR order, row_scale [num_dst], col_scale
    [num_src] (acc type or castable), bias [F] in x's dtype; any of them None."""
    F = x.shape[1]
    out = cp.empty((graph.num_dst, F), dtype=x.dtype) if out is None else out
    if F == 0 or graph.num_dst == 0:
        return out
    acc = _acc_dtype(vtype)
    w, r, c = (None if a is None else a.astype(acc, copy=False)
               for a in (weight_csr, row_scale, col_scale))
    vec = spmm_vec(vtype, F, *((a.data.ptr, a.itemsize) for a in (x, out, bias) if a is not None))
    plan = spmm_plan(graph, F, vtype, w is not None, chunk, vec)
    ws = cp.empty(plan.workspace_bytes, dtype=np.uint8) if plan.workspace_bytes else None
    plan.run(current_stream(),
             (x.data.ptr, _ptr(w), _ptr(r), _ptr(c), _ptr(bias), out.data.ptr, _ptr(ws)))
    return out


def sddmm(graph, a, b, vtype):
    """[E] CSR order: <a[row_e], b[src_e]>, fp32 (fp64 for float64)."""
    F = a.shape[1]
    itype = _ITYPE[np.dtype(graph.index_dtype)]
    acc = _acc_dtype(vtype)
    out = cp.empty(graph.num_edges, dtype=acc)
    if graph.num_edges == 0:
        return out
    if F == 0:
        out.fill(0)
        return out
    plan = task_plan(graph, DEFAULT_CHUNK)
    vec, group = _launch_shape(vtype, F, a, b)
    kern = get_function("spmm", vtype, itype, f"sddmm<{C_VALUE[vtype]}, {C_INDEX[itype]}, {vec}>")
    num_tasks = int(plan.task_row.shape[0])
    launch_now(kern, _grid(num_tasks, group),
               (plan.task_row, plan.task_begin, graph.indptr, graph.indices, a, b, out,
                np.int64(num_tasks), np.int32(F), np.int32(DEFAULT_CHUNK), np.int32(group)))
    return out


# --------------------------------------------------------------- cuSPARSE
_CUDA_R = {"float32": 0, "float64": 1}          # cudaDataType_t values (library_types.h)
CUSPARSE_ALGS = {"default": 0, "csr_alg1": 4, "csr_alg2": 6, "csr_alg3": 12}
# cuSPARSE algorithms whose results are bitwise repeatable. None is: on the
# H200 (CUDA 13.0), two identical calls of every algorithm above differed in
# the last bits on rmat20 (benchmarks/dev/probe_spmm.py), so deterministic mode
# (the default) keeps to the custom kernel and cuSPARSE is a candidate only
# with deterministic=False or path="cusparse".
DETERMINISTIC_ALGS = ()


class CusparsePlan:
    """Descriptors + workspace for one (graph, F, vtype, alg); pointers are
    re-bound on every call (csrSetPointers / dnMatSetValues)."""

    def __init__(self, graph, F, vtype, alg):
        from cupy_backends.cuda.libs import cusparse as cs
        self.cs = cs
        self.alg = CUSPARSE_ALGS[alg]
        self.dtype = _CUDA_R[vtype]
        self.F = F
        itype = cs.CUSPARSE_INDEX_32I if graph.index_dtype == np.int32 else cs.CUSPARSE_INDEX_64I
        dt = np.float64 if vtype == "float64" else np.float32
        self.ones = cp.ones(max(graph.num_edges, 1), dtype=dt)
        x0 = cp.empty((max(graph.num_src, 1), F), dtype=dt)
        y0 = cp.empty((max(graph.num_dst, 1), F), dtype=dt)
        self.mat = cs.createCsr(graph.num_dst, graph.num_src, graph.num_edges,
                                graph.indptr.data.ptr, graph.indices.data.ptr, self.ones.data.ptr,
                                itype, itype, cs.CUSPARSE_INDEX_BASE_ZERO, self.dtype)
        self.dx = cs.createDnMat(graph.num_src, F, F, x0.data.ptr, self.dtype, cs.CUSPARSE_ORDER_ROW)
        self.dy = cs.createDnMat(graph.num_dst, F, F, y0.data.ptr, self.dtype, cs.CUSPARSE_ORDER_ROW)
        self.alpha = np.ones(1, dtype=dt)
        self.beta = np.zeros(1, dtype=dt)
        handle = cp.cuda.device.get_cusparse_handle()
        size = cs.spMM_bufferSize(handle, cs.CUSPARSE_OPERATION_NON_TRANSPOSE,
                                  cs.CUSPARSE_OPERATION_NON_TRANSPOSE, self.alpha.ctypes.data,
                                  self.mat, self.dx, self.beta.ctypes.data, self.dy,
                                  self.dtype, self.alg)
        self.workspace = cp.empty(max(size, 1), dtype=np.uint8)

    def __call__(self, graph, x, weight_csr, out):
        cs = self.cs
        handle = cp.cuda.device.get_cusparse_handle()
        cs.setStream(handle, current_stream())
        vals = self.ones if weight_csr is None else weight_csr
        cs.spMatSetValues(self.mat, vals.data.ptr)
        cs.dnMatSetValues(self.dx, x.data.ptr)
        cs.dnMatSetValues(self.dy, out.data.ptr)
        cs.spMM(handle, cs.CUSPARSE_OPERATION_NON_TRANSPOSE, cs.CUSPARSE_OPERATION_NON_TRANSPOSE,
                self.alpha.ctypes.data, self.mat, self.dx, self.beta.ctypes.data, self.dy,
                self.dtype, self.alg, self.workspace.data.ptr)
        return out

    def __del__(self):
        try:
            self.cs.destroySpMat(self.mat)
            self.cs.destroyDnMat(self.dx)
            self.cs.destroyDnMat(self.dy)
        except Exception:
            pass


def cusparse_supports(graph, vtype):
    return vtype in _CUDA_R and graph.num_edges > 0 and graph.num_dst > 0 and graph.num_src > 0


def spmm_cusparse(graph, x, weight_csr, vtype, alg="default", out=None):
    F = x.shape[1]
    out = cp.empty((graph.num_dst, F), dtype=x.dtype) if out is None else out
    if not cusparse_supports(graph, vtype) or F == 0:
        if F and graph.num_dst:
            out.fill(0)
        return out
    w = None if weight_csr is None else weight_csr.astype(x.dtype, copy=False)
    plan = graph.cached(("cusparse_plan", F, vtype, alg),
                        lambda: CusparsePlan(graph, F, vtype, alg))
    return plan(graph, x, w, out)


# --------------------------------------------------------------- dispatch
@dataclasses.dataclass
class SpmmChoice:
    path: str            # "custom" or "cusparse"
    option: object       # chunk size or cuSPARSE algorithm name
    timings_ms: dict     # candidate -> median ms measured once


def _candidates(graph, vtype, deterministic, custom_only=False):
    cands = [("custom", c) for c in CHUNKS]
    if cusparse_supports(graph, vtype) and not custom_only:
        algs = DETERMINISTIC_ALGS if deterministic else tuple(CUSPARSE_ALGS)
        cands += [("cusparse", a) for a in algs]
    return cands


def _run(graph, x, w, vtype, path, option, out=None, bias=None):
    if path == "custom":
        return spmm_custom(graph, x, w, vtype, chunk=option, out=out, bias=bias)
    return spmm_cusparse(graph, x, w, vtype, alg=option, out=out)


BURST = 8            # back-to-back launches per timed measurement of `choose`


def _launcher(graph, x, w, vtype, path, option, out, bias):
    """A callable that runs one candidate on these buffers with as little
    host work as the candidate allows: the custom kernel's cached launch
    plan on fixed addresses (a workspace allocated once), cuSPARSE's cached
    descriptors. What `choose` times is then the kernels, not the launch
    path: fastgnn.torch runs the custom kernel through the same plan, at a
    host cost far below the kernels' time on all but the smallest graphs."""
    if path == "cusparse":
        return lambda: spmm_cusparse(graph, x, w, vtype, alg=option, out=out)
    F = x.shape[1]
    acc = _acc_dtype(vtype)
    w = None if w is None else w.astype(acc, copy=False)
    vec = spmm_vec(vtype, F, *((a.data.ptr, a.itemsize) for a in (x, out, bias) if a is not None))
    plan = spmm_plan(graph, F, vtype, w is not None, option, vec)
    ws = cp.empty(plan.workspace_bytes, dtype=np.uint8) if plan.workspace_bytes else None
    ptrs = (x.data.ptr, _ptr(w), 0, 0, _ptr(bias), out.data.ptr, _ptr(ws))
    stream = current_stream()
    # (the defaults keep the workspace and the converted weights allocated
    # for as long as the launcher is timed)
    return lambda keep=(ws, w): plan.run(stream, ptrs)


def median_ms(fn, repeats=3, burst=1):
    """Median CUDA-event time (ms) per call of fn() on the current stream,
    after one untimed call (which compiles and builds plans); each of the
    `repeats` measurements times `burst` back-to-back calls, so that the
    GPU queue stays full and the host's time per call hides behind the
    kernels'."""
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    fn()  # warm-up (compiles, builds plans)
    times = []
    for _ in range(repeats):
        start.record()
        for _ in range(burst):
            fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / burst)
    return float(np.median(times))


def choose(graph, x, w, vtype, deterministic=True, bias=None) -> SpmmChoice:
    """The fastest candidate for this request: the graph's or its size
    class's choice when one was made (`known_choice`), else every candidate
    timed once on these inputs and the fastest kept for the graph and its
    class. With a
    bias only the custom kernel's chunk sizes compete (it alone fuses the
    bias), recorded under the key ("spmm_plan", F, vtype, weighted, "bias").
    Each candidate is timed by its kernels (`_launcher`, `BURST` calls per
    measurement): timed through a launch path whose host time exceeds the
    kernels' (CuPy's, on a graph of ~10^6 edges) the candidates measure
    alike and the pick is noise."""
    key = ("spmm_plan", x.shape[1], vtype, w is not None,
           deterministic if bias is None else "bias")
    choice = known_choice(graph, *key[1:])
    if choice is not None:
        return choice
    out = cp.empty((graph.num_dst, x.shape[1]), dtype=x.dtype)
    timings = {}
    for path, opt in _candidates(graph, vtype, deterministic, custom_only=bias is not None):
        try:
            timings[(path, opt)] = median_ms(
                _launcher(graph, x, w, vtype, path, opt, out, bias), burst=BURST)
        except Exception as e:  # an algorithm cuSPARSE refuses for this shape
            timings[(path, opt)] = float("inf")
            if path == "custom":
                raise
            del e
    best = min(timings, key=timings.get)
    for (path, opt) in timings:  # drop plans of the losers (descriptors, workspaces)
        if path == "cusparse" and (path, opt) != best:
            graph.cache.pop(("cusparse_plan", x.shape[1], vtype, opt), None)
    choice = SpmmChoice(best[0], best[1], {f"{p}:{o}": t for (p, o), t in timings.items()})
    graph.cache[key] = decisions.decide(key, graph, cp.cuda.runtime.getDevice(), choice)
    return choice


def known_choice(graph, F, vtype, weighted, kind):
    """The SpmmChoice of a request (kind: deterministic, or "bias") made on
    this graph, or else on its size class (`decisions`: then recorded on
    the graph too); None when it must still be timed (`choose`)."""
    key = ("spmm_plan", F, vtype, weighted, kind)
    choice = graph.cache.get(key)
    if choice is None:
        choice = decisions.decided(key, graph, cp.cuda.runtime.getDevice())
        if choice is not None:
            graph.cache[key] = choice
    return choice


def chosen_paths(graph):
    """{(F, vtype, weighted, deterministic or "bias"): SpmmChoice} made so far on this graph."""
    return {k[1:]: v for k, v in graph.cache.items() if isinstance(k, tuple) and k[0] == "spmm_plan"}


def spmm(graph, x, weight_csr, vtype, path="auto", deterministic=True, row_scale=None,
         col_scale=None, bias=None):
    """[num_dst, F]: out[i] = r_i sum_e w_e c_j x[j] (+ bias) on the GPU (see
    module docstring for paths). deterministic=False lets "auto" also try
    cuSPARSE algorithms whose results may differ in the last bits from run
    to run. Row/column scales and the bias are fused by the custom kernel,
    which then serves every path (cuSPARSE would need a scaled copy of x or
    the weights, and for the bias a broadcast pass writing C first, beta = 1:
    the pass the fusion saves). Without scales, "auto" picks the custom
    kernel's chunk size for a bias by timing (see `choose`)."""
    if row_scale is not None or col_scale is not None:
        return spmm_custom(graph, x, weight_csr, vtype, row_scale=row_scale, col_scale=col_scale,
                           bias=bias)
    if bias is not None:
        chunk = DEFAULT_CHUNK
        if path == "auto" and graph.num_edges and x.shape[1]:
            chunk = choose(graph, x, weight_csr, vtype, deterministic, bias).option
        return spmm_custom(graph, x, weight_csr, vtype, chunk=chunk, bias=bias)
    if path == "custom" or (path == "cusparse" and not cusparse_supports(graph, vtype)):
        return spmm_custom(graph, x, weight_csr, vtype)
    if path == "cusparse":
        return spmm_cusparse(graph, x, weight_csr, vtype)
    if graph.num_edges == 0 or x.shape[1] == 0:
        return spmm_custom(graph, x, weight_csr, vtype)
    c = choose(graph, x, weight_csr, vtype, deterministic)
    return _run(graph, x, weight_csr, vtype, c.path, c.option)


def column_sums(x, vtype, index_dtype=np.int32):
    """[F] sum over the rows of x [N, F] (contiguous; fixed order, fp32
    accumulation for 16-bit types), in x's dtype: one ColumnSumPlan (its
    levels, then the cast for 16-bit types). index_dtype only picks the
    compiled spmm module that holds the kernels (the caller's graph's)."""
    itype = _ITYPE[np.dtype(index_dtype)]
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return cp.zeros(cols, dtype=x.dtype)
    plan = column_sum_plan("spmm", vtype, itype, rows, cols, True,
                           x.dtype != _acc_dtype(vtype))
    out = cp.empty(cols, dtype=x.dtype)
    ws = cp.empty(plan.workspace_bytes, dtype=np.uint8) if plan.workspace_bytes else None
    plan.run(current_stream(), (x.data.ptr, out.data.ptr, _ptr(ws)))
    return out
