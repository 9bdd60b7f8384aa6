"""CUDA launchers of the graph build kernels (kernels_cuda/graph.cu).

fastgnn.Graph's construction on CuPy arrays calls these instead of its
NumPy-style array code (fastgnn/graph.py and `self_loop_structure` in
fastgnn/ops/spmm.py keep that code: it is the CPU build and the reference
the CUDA build is tested against). Each launcher is one or two kernels
where the array code takes a dozen operations, each with its own host cost:
a new graph every training step pays them every step.

    edge_stats(src, dst)               -> (min, max src, max dst, descents, loops)
    csr_from_order(keys, vals | rows_of, order, num_rows, idx)
                                       -> (indptr, indices, edge_ids or None)
    self_loop_structure(indptr, indices, edge_ids, num_loops)
                                       -> (new indptr, indices, ids, kept, last)
    task_lists(indptr, order, chunk)   -> the task lists of a TaskPlan
    gcn_norm_weights(indptr, indices, t_indptr, t_indices, dtype)
                                       -> (weights in CSR order, in transpose order)
    task_work_prefix(task_row, task_begin, indptr, chunk, cost)
                                       -> [T + 1] running sums of the tasks' work
    slot_cuts(work_before, num_slots, rounds)
                                       -> the persistent attention grids' task cuts

All run on CuPy's current stream; `edge_stats` and `task_lists` copy sizes
to the host (one copy each), the others nothing.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from .loader import C_INDEX, GRAPH_VTYPE, SLOT_CUT_THREADS, get_function
from .plan import BLOCK, launch_now

_C_INDEX = {np.dtype(k): v for k, v in C_INDEX.items()}
_I64_MAX = np.iinfo(np.int64).max
# edge_stats' grid stride: at most this many blocks (each thread then reads
# several edges; a warp adds its five values with one atomic each)
STATS_BLOCKS = 1024


def _kernel(itype, name):
    return get_function("graph", GRAPH_VTYPE, np.dtype(itype).name, name)


def _blocks(n: int, limit: int | None = None) -> tuple:
    b = max(1, -(-n // BLOCK))
    return (b if limit is None else min(b, limit),)


def _elem_stride(a) -> np.int64:
    return np.int64(a.strides[0] // a.itemsize)


def edge_stats(src, dst):
    """(smallest index of both rows, largest source, largest target, number of
    descents dst[e + 1] < dst[e], number of self-loops src == dst) of the
    edges src [E], dst [E] (one integer dtype, any element stride, E > 0), as
    Python ints: one kernel and one copy to the host."""
    I = _C_INDEX[src.dtype]
    stats = cp.array([_I64_MAX, -1, -1, 0, 0], dtype=np.int64)
    E = int(src.shape[0])
    launch_now(_kernel(src.dtype, f"edge_stats<{I}>"), _blocks(E, STATS_BLOCKS),
               (src, dst, _elem_stride(src), _elem_stride(dst), np.int64(E), stats))
    return tuple(int(v) for v in cp.asnumpy(stats))


def csr_from_order(keys, num_rows: int, idx, *, vals=None, rows_of=None, order=None):
    """CSR arrays (indptr [num_rows + 1], indices [E], edge_ids [E] or None)
    in dtype `idx` of E edges whose targets `keys` [E] (any stride, all <
    num_rows) are non-decreasing when read in `order` (int64 [E]; None: as
    they are): indices are the edges' sources in that order, given as
    `vals` [E] (keys' dtype, any stride) or as the rows of CSR positions
    of the graph with offsets `rows_of` (its transpose's sources); edge_ids
    are `order` (None without an order)."""
    E = int(keys.shape[0])
    indptr = cp.empty(num_rows + 1, dtype=idx)
    indices = cp.empty(E, dtype=idx)
    edge_ids = None if order is None else cp.empty(E, dtype=idx)
    K, I = _C_INDEX[keys.dtype], _C_INDEX[np.dtype(idx)]
    if vals is None:
        if rows_of.dtype != keys.dtype:
            raise TypeError("csr_from_order: rows_of must have the keys' dtype")
        val_args = (None, np.int64(0), rows_of, np.int64(rows_of.shape[0] - 1))
    else:
        val_args = (vals, _elem_stride(vals), None, np.int64(0))
    launch_now(_kernel(idx, f"csr_from_order<{K}, {I}>"), _blocks(max(E, num_rows + 1)),
               (keys, _elem_stride(keys)) + val_args
               + (order, np.int64(E), np.int64(num_rows), indptr, indices, edge_ids))
    return indptr, indices, edge_ids


def self_loop_structure(indptr, indices, edge_ids, num_loops: int):
    """The arrays of PyG's add_remaining_self_loops graph, in CSR order
    without a sort (the semantics of fastgnn.ops.spmm.self_loop_structure, on
    a graph whose index dtype holds E - num_loops + n): (new indptr [n + 1],
    new indices [E_kept + n], new ids [E_kept + n] (the graph's dtype),
    kept [E_kept] int64 caller ids of the non-loop edges in caller order,
    last [n] int64 caller id of each node's last loop or -1)."""
    idx = indptr.dtype
    I = _C_INDEX[idx]
    n, E = int(indptr.shape[0]) - 1, int(indices.shape[0])
    E_kept = E - num_loops
    loops_upto = loops_caller_upto = None
    if num_loops:
        flags = cp.empty(E, dtype=np.int32)
        loop_caller = None if edge_ids is None else cp.empty(E, dtype=np.int32)
        launch_now(_kernel(idx, f"self_loop_mark<{I}>"), _blocks(E),
                   (indptr, indices, edge_ids, np.int64(n), np.int64(E), flags, loop_caller))
        loops_upto = cp.cumsum(flags, dtype=np.int64)
        if loop_caller is not None:
            loops_caller_upto = cp.cumsum(loop_caller, dtype=np.int64)
    new_indptr = cp.empty(n + 1, dtype=idx)
    new_indices = cp.empty(E_kept + n, dtype=idx)
    new_ids = cp.empty(E_kept + n, dtype=idx)
    kept = cp.empty(E_kept, dtype=np.int64)
    last = cp.empty(n, dtype=np.int64)
    launch_now(_kernel(idx, f"self_loop_fill<{I}>"), _blocks(max(E, n + 1)),
               (indptr, indices, edge_ids, loops_upto, loops_caller_upto, np.int64(n),
                np.int64(E), np.int64(E_kept), new_indptr, new_indices, new_ids, kept, last))
    return new_indptr, new_indices, new_ids, kept, last


def task_lists(indptr, order, chunk: int):
    """The task lists of rows cut into tasks of <= chunk edges, in visit
    order (`order` [n] the row at each position, or None), as
    fastgnn.backends.cuda.spmm.TaskPlan holds them: (task_row [T],
    task_begin [T], task_slot [T], split_row [S], slot_ptr [S + 1],
    num_slots), in indptr's dtype. Two kernels, two running counts and one
    copy to the host (T and S size the lists)."""
    idx = indptr.dtype
    I = _C_INDEX[idx]
    n = int(indptr.shape[0]) - 1
    ntask = cp.empty(n, dtype=np.int64)
    split = cp.empty(n, dtype=np.int64)
    launch_now(_kernel(idx, f"task_count<{I}>"), _blocks(n),
               (indptr, order, np.int64(n), np.int32(chunk), ntask, split))
    task_upto, split_upto = cp.cumsum(ntask), cp.cumsum(split)
    T, S = (int(v) for v in cp.asnumpy(cp.stack([task_upto[-1], split_upto[-1]])))
    task_row, task_begin, task_slot = (cp.empty(T, dtype=idx) for _ in range(3))
    split_row, slot_ptr = cp.empty(S, dtype=idx), cp.empty(S + 1, dtype=idx)
    launch_now(_kernel(idx, f"task_fill<{I}>"), _blocks(n),
               (indptr, order, task_upto, split_upto, np.int64(n), np.int32(chunk),
                task_row, task_begin, task_slot, split_row, slot_ptr))
    return task_row, task_begin, task_slot, split_row, slot_ptr, T - (n - S)


def gcn_norm_weights(indptr, indices, t_indptr, t_indices, dtype):
    """GCN's w_e = d_i d_j (d = in-degree^-1/2, 0 for none; double, stored
    as `dtype` float32/float64) of a square graph in its CSR order and in
    its transpose's (t_indptr, t_indices): (w_csr [E], w_t [E])."""
    idx = indptr.dtype
    W = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}[np.dtype(dtype)]
    n, E = int(indptr.shape[0]) - 1, int(indices.shape[0])
    w_csr, w_t = cp.empty(E, dtype=dtype), cp.empty(E, dtype=dtype)
    if E:
        launch_now(_kernel(idx, f"gcn_norm_weights<{_C_INDEX[idx]}, {W}>"), _blocks(E),
                   (indptr, indices, t_indptr, t_indices, np.int64(n), np.int64(E), w_csr, w_t))
    return w_csr, w_t


def task_work_prefix(task_row, task_begin, indptr, chunk: int, cost: int):
    """[T + 1] int64 running sums of the tasks' work (each task's edges, at
    most chunk, plus `cost`), from 0: one kernel and one scan."""
    idx = indptr.dtype
    T = int(task_row.shape[0])
    work = cp.empty(T + 1, dtype=np.int64)
    launch_now(_kernel(idx, f"task_work<{_C_INDEX[idx]}>"), _blocks(T + 1),
               (task_row, task_begin, indptr, np.int64(T), np.int32(chunk), np.int32(cost),
                work))
    return cp.cumsum(work)


def slot_cuts(work_before, num_slots: int, rounds: int):
    """[num_slots * rounds + 1] int64 task cuts of the persistent attention
    grids from the work prefix work_before [T + 1] int64 (on the device), as
    fastgnn.backends.cuda.attention.slot_cuts computes them on the host: one
    block, rounds one after another, nothing copied to the host."""
    T = int(work_before.shape[0]) - 1
    done = cp.zeros(num_slots, dtype=np.int64)
    cuts = cp.empty(num_slots * rounds + 1, dtype=np.int64)
    launch_now(_kernel(np.int32, f"slot_cuts<{SLOT_CUT_THREADS}>"), (1,),
               (work_before, np.int64(T), np.int64(num_slots), np.int64(rounds), done, cuts),
               block=(SLOT_CUT_THREADS,))
    return cuts
