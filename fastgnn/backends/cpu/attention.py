"""Numba kernels of the attention family (interface and math:
fastgnn/ops/attention.py).

Parallel mapping: targets (sources of the transpose, for source-side
gradients) are cut into a FIXED number of contiguous chunks, independent of
the thread count, so the chunked partial sums of grad_att are bitwise
repeatable on any machine. A task owns a run of chunks and walks each row's
edges in CSR order, heads innermost, accumulating in float64 in per-task
scratch of size H or H x C. Tasks run on a thread pool of
numba.get_num_threads() threads calling `nogil` kernels rather than `prange`
ones: a parfor kernel takes about three times longer to compile, and these
are compiled afresh for each value type on every CI run. Index arrays are
passed as int64 (cached per graph), so each value type compiles once per
specialisation: the edge_attention row kernels exist per (score kind, edge
term present) as closures (`_by_kind`), compiled on first use, which lets
numba drop the kind / edge-term branches from the per-channel loops (about
4x faster than one kernel with runtime branches, at three to six times the
compile time of the kinds in use).

Per-edge arrays are read and written at the caller's edge id through the
CSR-position -> caller-id maps, so nothing of size E is permuted and nothing
of size E x H x C is allocated: the only temporaries are per-node ([num_dst,
H] float64 D in the backward) or per-chunk ([256, H, C] partial grad_att).
Memory traffic per pass: the row's edge inputs and source rows once (scores
are recomputed from them), the target row once.

edge_softmax_fwd:   per target, per head: online max / rescaled sum, then
                    out[e, h] = exp(s - lse) z.
edge_softmax_bwd:   per target, per head: S = sum p g z, then grad = p (g z - S).
edge_attention_fwd: per target: online softmax and the weighted message sum
                    in one pass over the in-edges (+ a pass for alpha if asked).
edge_attention_bwd: per target: D_i = <g_i, out_i> (+ sum p ga), then per
                    edge ds_e -> target-side and per-edge gradients and the
                    chunk's grad_att; per source (transpose): source-side and
                    message gradients.
"""
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from ..attention_spec import (SCORE_INPUTS, SLOT_NAMES, caller_ids, lse_dtype, score_slots,
                              transpose_caller_ids)
from ...rng import keep_nb
from .spmm import column_sums

NUM_CHUNKS = 256           # fixed (see above): a few per thread on any CPU
SERIAL_EDGES = 4096        # below this many edges, run in the calling thread

_pool = None
_pool_lock = threading.Lock()


def _num_chunks(rows):
    return max(min(rows, NUM_CHUNKS), 1)


def _executor(threads):
    """The shared pool (rebuilt when the thread count changes, and in a forked
    child, which inherits the pool object but not its threads)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[1] != threads or _pool[2] != os.getpid():
            if _pool is not None and _pool[2] == os.getpid():
                _pool[0].shutdown(wait=False)
            _pool = (ThreadPoolExecutor(threads, thread_name_prefix="fastgnn-attention"),
                     threads, os.getpid())
        return _pool[0]


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


@numba.njit(inline="always", error_model="numpy")
def _chunk(c, nchunks, n):
    return c * n // nchunks, (c + 1) * n // nchunks


@numba.njit(inline="always", error_model="numpy")
def _factor(drop_on, key, offset, threshold, dscale, ce, heads, h):
    """The dropout factor z of weight (ce, h): 0 or 1/(1-p) (1 when off)."""
    if not drop_on:
        return 1.0
    if keep_nb(key, offset, ce, heads, h, threshold):
        return dscale
    return 0.0


# ------------------------------------------------------------ edge_softmax
@numba.njit(nogil=True, cache=True, error_model="numpy")
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
                elif v != v:             # a NaN score makes the row NaN, as torch/PyG
                    l[h] = v
        for h in range(H):
            m[h] = m[h] + np.log(l[h])
            lse[i, h] = m[h]
        for p in range(start, end):
            ce = cid[p]
            for h in range(H):
                z = _factor(drop_on, key, offset, threshold, dscale, ce, H, h)
                out[ce, h] = np.exp(np.float64(s[ce, h]) - m[h]) * z


@numba.njit(nogil=True, cache=True, error_model="numpy")
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
    indptr, _, cid = _index64(graph)
    _run(_softmax_fwd_rows, graph.num_dst, graph.num_edges, indptr, cid, scores,
         *_drop_args(drop), out, lse)
    return out, lse


def edge_softmax_bwd(graph, scores, lse, grad, drop, vtype):
    """grad_scores [E, H] caller order."""
    out = np.empty_like(scores)
    indptr, _, cid = _index64(graph)
    _run(_softmax_bwd_rows, graph.num_dst, graph.num_edges, indptr, cid, scores, lse, grad,
         *_drop_args(drop), out)
    return out


# ---------------------------------------------------------- edge_attention
# Generic slots (SLOT_NAMES in fastgnn/backends/attention_spec.py names each score's arrays):
#   S  [num_src, H, Cs]  source-side score input   gat: a_src (Cs = 1)  gatv2: xl  dot: k
#   Dn [num_dst, H, Cs]  target-side score input   gat: a_dst (Cs = 1)  gatv2: xr  dot: q
#   Ed [E, H, Cs]        edge term (caller order)  gat: a_edge          gatv2: xe  dot: ee
#   V  [num_src, H, C]   message                   gat: v               gatv2: xl  dot: v (+ ee)
#   att [H, C]           gatv2's attention vector (empty otherwise)
GAT, GATV2, DOT = 0, 1, 2
KINDS = {"gat": GAT, "gatv2": GATV2, "dot": DOT}


def _by_kind(make):
    """{(kind, has_e): make(kind, has_e)}: one kernel per score kind and
    edge-term presence, both closure constants, so the per-channel loops
    carry no such branches (numba folds them and can vectorise; each
    closure compiles on first use and is cached on its own)."""
    return {(kind, has_e): make(kind, has_e) for kind in (GAT, GATV2, DOT)
            for has_e in (False, True)}


@numba.njit(inline="always", error_model="numpy")
def _lrelu(u, slope):
    return u if u > 0 else slope * u


@numba.njit(inline="always", error_model="numpy")
def _score(kind, S, Dn, Ed, has_e, att, j, i, ce, h, slope, scale):
    """s_e for head h of edge ce = (j -> i), in float64."""
    if kind == GAT:
        u = np.float64(S[j, h, 0]) + np.float64(Dn[i, h, 0])
        if has_e:
            u += np.float64(Ed[ce, h, 0])
        return _lrelu(u, slope)
    acc = 0.0
    if kind == GATV2:
        for c in range(S.shape[2]):
            t = np.float64(S[j, h, c]) + np.float64(Dn[i, h, c])
            if has_e:
                t += np.float64(Ed[ce, h, c])
            acc += np.float64(att[h, c]) * _lrelu(t, slope)
        return acc
    for c in range(S.shape[2]):
        kk = np.float64(S[j, h, c])
        if has_e:
            kk += np.float64(Ed[ce, h, c])
        acc += np.float64(Dn[i, h, c]) * kk
    return acc * scale


@numba.njit(inline="always", error_model="numpy")
def _msg(kind, V, Ed, has_e, j, ce, h, c):
    """Message m_e[h, c]: V[j] (+ the edge term for "dot")."""
    m = np.float64(V[j, h, c])
    if kind == DOT and has_e:
        m += np.float64(Ed[ce, h, c])
    return m


def _make_attn_fwd_rows(kind, has_e):
    """_attn_fwd_rows specialised on the score kind and edge term (see _by_kind)."""
    @numba.njit(nogil=True, cache=True, error_model="numpy")
    def _attn_fwd_rows(c0, c1, nchunks, indptr, indices, cid, S, Dn, Ed, att, V,
                       slope, scale, drop_on, key, offset, threshold, dscale,
                       out, lse, need_alpha, alpha):
        """Forward, one target row at a time. Phase 0: online softmax over the
        row's edges (running max m, running sum l, accumulator rescaled when m
        grows), then out = acc / l, lse = m + log l. Phase 1 (only for alpha):
        alpha = exp(s - lse). (One score site, so the inlined score code is
        compiled once.)"""
        n = indptr.shape[0] - 1
        H, C = V.shape[1], V.shape[2]
        m = np.empty(H)
        l = np.empty(H)  # noqa: E741
        acc = np.empty((H, C))
        phases = 2 if need_alpha else 1
        r0, r1 = _chunk(c0, nchunks, n)[0], _chunk(c1 - 1, nchunks, n)[1]
        for i in range(r0, r1):
            start, end = indptr[i], indptr[i + 1]
            for h in range(H):
                m[h] = -np.inf
                l[h] = 0.0
                for c in range(C):
                    acc[h, c] = 0.0
            for phase in range(phases):
                for p in range(start, end):
                    j, ce = indices[p], cid[p]
                    for h in range(H):
                        s = _score(kind, S, Dn, Ed, has_e, att, j, i, ce, h, slope, scale)
                        if phase == 1:
                            alpha[ce, h] = np.exp(s - m[h])
                            continue
                        if s > m[h]:
                            corr = np.exp(m[h] - s)
                            l[h] = l[h] * corr + 1.0
                            for c in range(C):
                                acc[h, c] *= corr
                            m[h] = s
                            w = 1.0
                        elif s > -np.inf:
                            w = np.exp(s - m[h])
                            l[h] += w
                        else:
                            if s != s:               # NaN score: NaN row, as torch
                                l[h] = s
                            w = 0.0
                        w *= _factor(drop_on, key, offset, threshold, dscale, ce, H, h)
                        if w != 0.0:
                            for c in range(C):
                                acc[h, c] += w * _msg(kind, V, Ed, has_e, j, ce, h, c)
                if phase == 0:
                    for h in range(H):
                        if start == end:
                            lse[i, h] = -np.inf
                            for c in range(C):
                                out[i, h, c] = 0.0
                        else:
                            inv = 1.0 / l[h]
                            m[h] = m[h] + np.log(l[h])
                            lse[i, h] = m[h]
                            for c in range(C):
                                out[i, h, c] = acc[h, c] * inv
    return _attn_fwd_rows

_ATTN_FWD_ROWS = _by_kind(_make_attn_fwd_rows)


@numba.njit(inline="always", error_model="numpy")
def _edge_terms(kind, V, Ed, has_e, j, i, ce, h, s, drop_on, key, offset, threshold, dscale,
                lse, g, has_g, ga, has_ga, delta):
    """Backward terms of edge ce, head h, from its recomputed score s:
    (w = p z, ds = p (z <g_i, m_e> + ga_e - D_i))."""
    # The optional terms are loops of 0 or 1 (C) trips, not `if` blocks: an
    # `if` around a loop in an inlined helper keeps LLVM from optimising the
    # caller's edge loop (GAT backward, 12 K edges x 4 heads: 2.8 -> 0.66 ms).
    H = V.shape[1]
    pr = np.exp(s - np.float64(lse[i, h]))
    z = _factor(drop_on, key, offset, threshold, dscale, ce, H, h)
    gd = 0.0
    for c in range(V.shape[2] if has_g else 0):
        gd += np.float64(g[i, h, c]) * _msg(kind, V, Ed, has_e, j, ce, h, c)
    dp = z * gd if z != 0.0 else 0.0
    for _ in range(1 if has_ga else 0):
        dp += np.float64(ga[ce, h])
    return pr * z, pr * (dp - delta[i, h])


@numba.njit(inline="always", error_model="numpy")
def _score_input_grad(kind, S, Dn, Ed, has_e, att, j, i, ce, h, c, slope, scale, ds):
    """ds times d s_e / d(score input at channel c): the same for the source
    and target inputs of "gat"/"gatv2" (they enter the LeakyReLU argument
    symmetrically); for "dot" the target side, scale ds (k_j + ee_e)."""
    if kind == GAT:
        u = np.float64(S[j, h, 0]) + np.float64(Dn[i, h, 0])
        if has_e:
            u += np.float64(Ed[ce, h, 0])
        return ds if u > 0 else ds * slope
    if kind == GATV2:
        t = np.float64(S[j, h, c]) + np.float64(Dn[i, h, c])
        if has_e:
            t += np.float64(Ed[ce, h, c])
        d = ds * np.float64(att[h, c])
        return d if t > 0 else d * slope
    kk = np.float64(S[j, h, c])
    if has_e:
        kk += np.float64(Ed[ce, h, c])
    return scale * ds * kk


def _make_attn_bwd_dst_rows(kind, has_e):
    """_attn_bwd_dst_rows specialised on the score kind and edge term (see _by_kind)."""
    @numba.njit(nogil=True, cache=True, error_model="numpy")
    def _attn_bwd_dst_rows(c0, c1, nchunks, indptr, indices, cid, S, Dn, Ed, att, V,
                           slope, scale, drop_on, key, offset, threshold, dscale,
                           out, lse, g, has_g, ga, has_ga, delta, do_edges,
                           gDn, need_gDn, gEd, need_gEd, gatt_part, need_gatt):
        """Backward, target side, one row at a time: D_i = <g_i, out_i> (+ phase 0
        with grad_alpha: sum_e p_e ga_e), then phase 1 per edge: ds_e, the
        target-side gradient (accumulated over the row), the per-edge gradient
        (written at the caller's edge id) and this chunk's partial grad_att."""
        n = indptr.shape[0] - 1
        H, C, Cs = V.shape[1], V.shape[2], S.shape[2]
        dacc = np.empty((H, Cs))
        patt = np.empty((H, C))
        for ch in range(c0, c1):
            r0, r1 = _chunk(ch, nchunks, n)
            if need_gatt:
                for h in range(H):
                    for c in range(C):
                        patt[h, c] = 0.0
            for i in range(r0, r1):
                start, end = indptr[i], indptr[i + 1]
                for h in range(H):
                    d = 0.0
                    if has_g and start < end:
                        for c in range(C):
                            d += np.float64(g[i, h, c]) * np.float64(out[i, h, c])
                    delta[i, h] = d
                    for c in range(Cs):
                        dacc[h, c] = 0.0
                for phase in range(0 if has_ga else 1, 2 if do_edges else 1):
                    for p in range(start, end):
                        j, ce = indices[p], cid[p]
                        for h in range(H):
                            s = _score(kind, S, Dn, Ed, has_e, att, j, i, ce, h, slope, scale)
                            if phase == 0:
                                pr = np.exp(s - np.float64(lse[i, h]))
                                delta[i, h] += pr * np.float64(ga[ce, h])
                                continue
                            w, ds = _edge_terms(kind, V, Ed, has_e, j, i, ce, h, s, drop_on, key,
                                                offset, threshold, dscale, lse, g, has_g, ga, has_ga,
                                                delta)
                            for c in range(Cs):
                                d = _score_input_grad(kind, S, Dn, Ed, has_e, att, j, i, ce, h, c,
                                                      slope, scale, ds)
                                dacc[h, c] += d
                                if need_gEd:
                                    if kind == DOT:  # ee enters the score (like k) and the message
                                        d = scale * ds * np.float64(Dn[i, h, c])
                                        if has_g:
                                            d += w * np.float64(g[i, h, c])
                                    gEd[ce, h, c] = d
                            if need_gatt:
                                for c in range(C):
                                    t = np.float64(S[j, h, c]) + np.float64(Dn[i, h, c])
                                    if has_e:
                                        t += np.float64(Ed[ce, h, c])
                                    patt[h, c] += ds * _lrelu(t, slope)
                if need_gDn:
                    for h in range(H):
                        for c in range(Cs):
                            gDn[i, h, c] = dacc[h, c]
            if need_gatt:
                for h in range(H):
                    for c in range(C):
                        gatt_part[ch, h, c] = patt[h, c]
    return _attn_bwd_dst_rows

_ATTN_BWD_DST_ROWS = _by_kind(_make_attn_bwd_dst_rows)


def _make_attn_bwd_src_rows(kind, has_e):
    """_attn_bwd_src_rows specialised on the score kind and edge term (see _by_kind)."""
    @numba.njit(nogil=True, cache=True, error_model="numpy")
    def _attn_bwd_src_rows(c0, c1, nchunks, t_indptr, t_indices, t_cid, S, Dn, Ed, att, V,
                           slope, scale, drop_on, key, offset, threshold, dscale,
                           lse, g, has_g, ga, has_ga, delta, gS, need_gS, gV, need_gV):
        """Backward, source side, one source row of the transpose at a time:
        grad of the source-side score input and of the message (for "gatv2" the
        two are xl, summed into gS)."""
        n = t_indptr.shape[0] - 1
        H, C, Cs = V.shape[1], V.shape[2], S.shape[2]
        sacc = np.empty((H, Cs))
        vacc = np.empty((H, C))
        msg_into_s = kind == GATV2
        need_msg = has_g and (need_gV or (msg_into_s and need_gS))
        r0, r1 = _chunk(c0, nchunks, n)[0], _chunk(c1 - 1, nchunks, n)[1]
        for j in range(r0, r1):
            for h in range(H):
                for c in range(Cs):
                    sacc[h, c] = 0.0
                for c in range(C):
                    vacc[h, c] = 0.0
            for tp in range(t_indptr[j], t_indptr[j + 1]):
                i, ce = t_indices[tp], t_cid[tp]
                for h in range(H):
                    s = _score(kind, S, Dn, Ed, has_e, att, j, i, ce, h, slope, scale)
                    w, ds = _edge_terms(kind, V, Ed, has_e, j, i, ce, h, s, drop_on, key, offset,
                                        threshold, dscale, lse, g, has_g, ga, has_ga, delta)
                    if need_gS:
                        for c in range(Cs):
                            if kind == DOT:
                                sacc[h, c] += scale * ds * np.float64(Dn[i, h, c])
                            else:
                                sacc[h, c] += _score_input_grad(kind, S, Dn, Ed, has_e, att, j, i,
                                                                ce, h, c, slope, scale, ds)
                    if need_msg and w != 0.0:
                        for c in range(C):
                            vacc[h, c] += w * np.float64(g[i, h, c])
            for h in range(H):
                if need_gS:
                    for c in range(Cs):
                        gS[j, h, c] = sacc[h, c] + vacc[h, c] if msg_into_s else sacc[h, c]
                if need_gV:
                    for c in range(C):
                        gV[j, h, c] = vacc[h, c]
    return _attn_bwd_src_rows

_ATTN_BWD_SRC_ROWS = _by_kind(_make_attn_bwd_src_rows)


def _index64(graph, transpose=False):
    """(indptr, indices, caller ids) as int64, of the graph or of its transpose:
    the CPU kernels take one index type, so each value type compiles once
    (cached on the graph; the same arrays for an int64 graph)."""
    def build():
        if transpose:
            t = graph.transpose()
            arrays = (t.indptr, t.indices, transpose_caller_ids(graph))
        else:
            arrays = (graph.indptr, graph.indices, caller_ids(graph))
        return tuple(np.ascontiguousarray(a, dtype=np.int64) for a in arrays)
    return graph.cached(("cpu_attention_index64", transpose), build)


def _kernel_args(score, arrays, params):
    """((kind, has_e): the specialisation key of the row kernels, the
    arguments they share: S, Dn, Ed, att, V, slope, scale, dropout)."""
    S, Dn, Ed, att, V = score_slots(score, arrays)
    dt = V.dtype
    has_e = Ed is not None
    Ed = Ed if has_e else np.empty((0, 0, 0), dtype=dt)
    att = att if att is not None else np.empty((0, 0), dtype=dt)
    return (KINDS[score], has_e), (S, Dn, Ed, att, V, float(params.negative_slope),
                                   float(params.scale), *_drop_args(params.drop))


def edge_attention_fwd(graph, score, arrays, params, need_alpha):
    """(out [num_dst, H, C], lse [num_dst, H], alpha [E, H] or None, out + bias
    or None); see fastgnn/ops/attention.py."""
    key, common = _kernel_args(score, arrays, params)
    V = common[4]
    H, C = V.shape[1], V.shape[2]
    out = np.empty((graph.num_dst, H, C), dtype=V.dtype)
    lse = np.empty((graph.num_dst, H), dtype=lse_dtype(str(V.dtype)))
    alpha = np.empty((graph.num_edges, H) if need_alpha else (0, 0), dtype=V.dtype)
    _run(_ATTN_FWD_ROWS[key], graph.num_dst, graph.num_edges, *_index64(graph), *common,
         out, lse, bool(need_alpha), alpha)
    bias = arrays.get("bias")
    out_b = out + bias if bias is not None else None    # [H, C] over every target row
    return out, lse, (alpha if need_alpha else None), out_b


def edge_attention_bwd(graph, score, arrays, out, lse, grad_out, grad_alpha, params, needs):
    """{input name: gradient or None}; see fastgnn/ops/attention.py."""
    key, common = _kernel_args(score, arrays, params)
    has_e = key[1]
    S, Dn, Ed, att, V = common[:5]
    dt = V.dtype
    H, C = V.shape[1], V.shape[2]
    s_name, d_name, e_name, v_name = SLOT_NAMES[score]
    need_gS = bool(needs.get(s_name))
    need_gDn = bool(needs.get(d_name))
    need_gEd = has_e and bool(needs.get(e_name))
    need_gV = score != "gatv2" and bool(needs.get(v_name))
    need_gatt = score == "gatv2" and bool(needs.get("att"))
    has_g, has_ga = grad_out is not None, grad_alpha is not None
    g = grad_out if has_g else np.empty((0, 0, 0), dtype=dt)
    ga = grad_alpha if has_ga else np.empty((0, 0), dtype=dt)
    empty3 = np.empty((0, 0, 0), dtype=dt)

    bias = arrays.get("bias")
    delta = np.empty((graph.num_dst, H))
    gDn = np.empty(Dn.shape, dtype=dt) if need_gDn else empty3
    gEd = np.empty(Ed.shape, dtype=dt) if need_gEd else empty3
    nchunks = _num_chunks(graph.num_dst)
    gatt_part = np.empty((nchunks, H, C) if need_gatt else (0, 0, 0))
    _run(_ATTN_BWD_DST_ROWS[key], graph.num_dst, graph.num_edges, *_index64(graph),
         *common, out, lse, g, has_g, ga, has_ga, delta, need_gDn or need_gEd or need_gatt,
         gDn, need_gDn, gEd, need_gEd, gatt_part, need_gatt)

    gS = np.empty(S.shape, dtype=dt) if need_gS else empty3
    gV = np.empty(V.shape, dtype=dt) if need_gV else empty3
    if need_gS or need_gV:
        _run(_ATTN_BWD_SRC_ROWS[key], graph.num_src, graph.num_edges,
             *_index64(graph, transpose=True), *common, lse, g, has_g, ga, has_ga, delta,
             gS, need_gS, gV, need_gV)

    grads = {name: None for name in SLOT_NAMES[score]}
    grads["att"] = None
    if need_gS:
        grads[s_name] = gS
    if need_gDn:
        grads[d_name] = gDn
    if need_gEd:
        grads[e_name] = gEd
    if need_gV:
        grads[v_name] = gV
    if need_gatt:
        grads["att"] = gatt_part.sum(axis=0).astype(dt)   # fixed chunks, fixed order
    grads["bias"] = None
    if bias is not None and needs.get("bias"):
        grads["bias"] = (np.zeros(bias.shape, dtype=dt) if not has_g else
                         column_sums(grad_out.reshape(-1, H * C), None).reshape(H, C))
    return {name: grads[name] for name in SCORE_INPUTS[score]}
