"""Numba kernels of the attention family (interface: fastgnn/ops/attention.py).

Parallel mapping: targets (or, for source-side gradients, sources of the
transpose) are cut into a FIXED number of contiguous chunks (independent of
the thread count, so chunked partial sums are bitwise repeatable on any
machine); a task owns a run of chunks and walks each row's edges in CSR
order, heads innermost, accumulating in float64 in per-task scratch of size
H or H x C. Tasks run on a thread pool of numba.get_num_threads() threads
calling `nogil` kernels (rather than `prange`): a parfor kernel takes about
three times longer to compile, and these kernels are compiled for every
value and index type on a fresh CI machine. Per-edge arrays are read and written in the caller's edge
order through the CSR-position -> caller-id map, so nothing of size E is
permuted and nothing of size E x H x C is ever allocated.

edge_softmax_fwd:  per target, per head: running max / rescaled sum (online),
                   then out[e, h] = exp(s - lse) z.
edge_softmax_bwd:  per target, per head: S = sum p g z, then grad = p (g z - S).
"""
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from ...ops.attention import caller_ids, lse_dtype
from ...rng import keep_nb

NUM_CHUNKS = 256           # fixed (see above): a few per thread on any CPU
SERIAL_EDGES = 4096        # below this many edges, run in the calling thread

_pool = None
_pool_lock = threading.Lock()


def _num_chunks(rows):
    return max(min(rows, NUM_CHUNKS), 1)


def _executor(threads):
    global _pool
    with _pool_lock:
        if _pool is None or _pool._max_workers != threads:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(threads, thread_name_prefix="fastgnn-attention")
        return _pool


def _run(kernel, rows, edges, *args):
    """kernel(c0, c1, nchunks, *args) over chunks [c0, c1) of `rows` rows,
    split into contiguous runs of chunks across the thread pool."""
    nchunks = _num_chunks(rows)
    threads = numba.get_num_threads()
    if threads <= 1 or edges < SERIAL_EDGES or nchunks == 1:
        kernel(0, nchunks, nchunks, *args)
        return
    tasks = min(nchunks, 4 * threads)
    bounds = [t * nchunks // tasks for t in range(tasks + 1)]
    futures = [_executor(threads).submit(kernel, bounds[t], bounds[t + 1], nchunks, *args)
               for t in range(tasks)]
    for f in futures:
        f.result()


@numba.njit(inline="always")
def _chunk(c, nchunks, n):
    return c * n // nchunks, (c + 1) * n // nchunks


@numba.njit(inline="always")
def _factor(drop_on, key, offset, threshold, dscale, ce, heads, h):
    """The dropout factor z of weight (ce, h): 0 or 1/(1-p) (1 when off)."""
    if not drop_on:
        return 1.0
    if keep_nb(key, offset, ce, heads, h, threshold):
        return dscale
    return 0.0


# ------------------------------------------------------------ edge_softmax
@numba.njit(nogil=True, cache=True)
def _softmax_fwd_rows(c0, c1, nchunks, indptr, cid, s, drop_on, key, offset, threshold, dscale,
                      out, lse):
    n = indptr.shape[0] - 1
    H = s.shape[1]
    m = np.empty(H)
    l = np.empty(H)  # noqa: E741
    r0, r1 = _chunk(c0, nchunks, n)[0], _chunk(c1 - 1, nchunks, n)[1]
    for i in range(r0, r1):
        start, end = indptr[i], indptr[i + 1]
        if start == end:
            for h in range(H):
                lse[i, h] = -np.inf
            continue
        for h in range(H):
            m[h] = -np.inf
            l[h] = 0.0
        for p in range(start, end):
            ce = cid[p]
            for h in range(H):
                v = np.float64(s[ce, h])
                if v > m[h]:
                    l[h] = l[h] * np.exp(m[h] - v) + 1.0
                    m[h] = v
                elif v > -np.inf:        # a -inf score adds nothing (and no NaN)
                    l[h] += np.exp(v - m[h])
        for h in range(H):
            m[h] = m[h] + np.log(l[h])
            lse[i, h] = m[h]
        for p in range(start, end):
            ce = cid[p]
            for h in range(H):
                z = _factor(drop_on, key, offset, threshold, dscale, ce, H, h)
                out[ce, h] = np.exp(np.float64(s[ce, h]) - m[h]) * z


@numba.njit(nogil=True, cache=True)
def _softmax_bwd_rows(c0, c1, nchunks, indptr, cid, s, lse, g, drop_on, key, offset, threshold,
                      dscale, grad):
    n = indptr.shape[0] - 1
    H = s.shape[1]
    acc = np.empty(H)
    r0, r1 = _chunk(c0, nchunks, n)[0], _chunk(c1 - 1, nchunks, n)[1]
    for i in range(r0, r1):
        start, end = indptr[i], indptr[i + 1]
        for h in range(H):
            acc[h] = 0.0
        for p in range(start, end):
            ce = cid[p]
            for h in range(H):
                z = _factor(drop_on, key, offset, threshold, dscale, ce, H, h)
                pr = np.exp(np.float64(s[ce, h]) - np.float64(lse[i, h]))
                acc[h] += pr * z * np.float64(g[ce, h])
        for p in range(start, end):
            ce = cid[p]
            for h in range(H):
                z = _factor(drop_on, key, offset, threshold, dscale, ce, H, h)
                pr = np.exp(np.float64(s[ce, h]) - np.float64(lse[i, h]))
                grad[ce, h] = pr * (z * np.float64(g[ce, h]) - acc[h])


def _drop_args(drop):
    return (drop.active, np.uint64(drop.key), np.uint64(drop.offset), np.uint64(drop.threshold),
            float(drop.scale))


def edge_softmax_fwd(graph, scores, drop, vtype):
    """(out [E, H] caller order, lse [num_dst, H]); see the module docstring."""
    out = np.empty_like(scores)
    lse = np.empty((graph.num_dst, scores.shape[1]), dtype=lse_dtype(vtype))
    _run(_softmax_fwd_rows, graph.num_dst, graph.num_edges,
         graph.indptr, caller_ids(graph), scores, *_drop_args(drop), out, lse)
    return out, lse


def edge_softmax_bwd(graph, scores, lse, grad, drop, vtype):
    """grad_scores [E, H] caller order."""
    out = np.empty_like(scores)
    _run(_softmax_bwd_rows, graph.num_dst, graph.num_edges,
         graph.indptr, caller_ids(graph), scores, lse, grad, *_drop_args(drop), out)
    return out
