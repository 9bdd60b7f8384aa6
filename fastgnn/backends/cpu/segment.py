"""Numba kernels of the reduction family.

segment_fwd: one parallel task per chunk of target rows; each row walks its
    CSR segment ONCE, accumulating in float64 the union of the statistics the
    requested reductions need (sum, sum of squares, max + CSR position, min +
    CSR position), then writes every requested block of the [num_dst, R*F]
    output. Max/min: the first CSR position wins ties; a NaN, once seen, stays.
segment_bwd: one parallel task per chunk of source rows of the transpose (no
    atomics, bitwise repeatable); for each out-edge e = (j -> i)

        grad_x[j] += coef_a[i] + coef_b[i] * x[j]
                     + [argmax[i] == e] gmax[i] + [argmin[i] == e] gmin[i]

    accumulated in float64.

Reduction codes (shared with kernels_cuda/segment.cu): 0 sum, 1 mean, 2 max,
3 min, 4 var, 5 std.
"""
import numba
import numpy as np

CODES = {"sum": 0, "mean": 1, "max": 2, "min": 3, "var": 4, "std": 5}
_STD_EPS = 1e-5
_STD_MIN = np.sqrt(_STD_EPS)


def _num_chunks(rows):
    """Row chunks for the parallel loop (a few per thread; scratch is per chunk)."""
    return min(rows, 4 * numba.get_num_threads())


@numba.njit(inline="always")
def _chunk(c, nchunks, n):
    return c * n // nchunks, (c + 1) * n // nchunks


@numba.njit(parallel=True, cache=True)
def _segment_fwd_rows(indptr, indices, x, ops, need_sq, need_max, need_min,
                      out, argmax, argmin, nchunks):
    n = indptr.shape[0] - 1
    f = x.shape[1]
    for c in numba.prange(nchunks):
        r0, r1 = _chunk(c, nchunks, n)
        s = np.empty(f)
        q = np.empty(f)
        mx = np.empty(f)
        mn = np.empty(f)
        amx = np.empty(f, dtype=np.int64)
        amn = np.empty(f, dtype=np.int64)
        for i in range(r0, r1):
            start, end = indptr[i], indptr[i + 1]
            for k in range(f):
                s[k] = 0.0
                q[k] = 0.0
                mx[k] = 0.0
                mn[k] = 0.0
                amx[k] = -1
                amn[k] = -1
            for e in range(start, end):
                j = indices[e]
                for k in range(f):
                    v = np.float64(x[j, k])
                    s[k] += v
                    if need_sq:
                        q[k] += v * v
                    if need_max:
                        if amx[k] < 0 or v > mx[k] or (v != v and mx[k] == mx[k]):
                            mx[k] = v
                            amx[k] = e
                    if need_min:
                        if amn[k] < 0 or v < mn[k] or (v != v and mn[k] == mn[k]):
                            mn[k] = v
                            amn[k] = e
            deg = end - start
            inv = 1.0 / deg if deg > 0 else 0.0
            for r in range(ops.shape[0]):
                op = ops[r]
                base = r * f
                for k in range(f):
                    if deg == 0:
                        val = 0.0
                    elif op == 0:
                        val = s[k]
                    elif op == 1:
                        val = s[k] * inv
                    elif op == 2:
                        val = mx[k]
                    elif op == 3:
                        val = mn[k]
                    else:
                        m = s[k] * inv
                        val = q[k] * inv - m * m
                        if op == 5:
                            if val < _STD_EPS:       # written so that NaN stays NaN
                                val = _STD_EPS
                            val = np.sqrt(val)
                            if val <= _STD_MIN:
                                val = 0.0
                    out[i, base + k] = val
            if need_max:
                for k in range(f):
                    argmax[i, k] = amx[k]
            if need_min:
                for k in range(f):
                    argmin[i, k] = amn[k]


@numba.njit(parallel=True, cache=True)
def _segment_bwd_rows(t_indptr, t_indices, t_edge, x, a, has_a, b, has_b,
                      argmax, gmax, has_max, argmin, gmin, has_min, grad_x, nchunks):
    n, f = grad_x.shape
    for c in numba.prange(nchunks):
        r0, r1 = _chunk(c, nchunks, n)
        acc_a = np.empty(f)
        acc_b = np.empty(f)
        for j in range(r0, r1):
            for k in range(f):
                acc_a[k] = 0.0
                acc_b[k] = 0.0
            for te in range(t_indptr[j], t_indptr[j + 1]):
                i = t_indices[te]
                e = t_edge[te]
                for k in range(f):
                    if has_a:
                        acc_a[k] += a[i, k]
                    if has_b:
                        acc_b[k] += b[i, k]
                    if has_max and argmax[i, k] == e:
                        acc_a[k] += gmax[i, k]
                    if has_min and argmin[i, k] == e:
                        acc_a[k] += gmin[i, k]
            for k in range(f):
                if has_b:
                    grad_x[j, k] = acc_a[k] + acc_b[k] * np.float64(x[j, k])
                else:
                    grad_x[j, k] = acc_a[k]


def segment_fwd(graph, x, codes, vtype):
    """(out [num_dst, len(codes)*F] in x's dtype, argmax, argmin): see module
    docstring. argmax/argmin are [num_dst, F] CSR positions of the winners
    (index dtype, -1 for empty rows), or None when not requested."""
    f = x.shape[1]
    ops = np.array([CODES[c] for c in codes], dtype=np.int64)
    need_max, need_min = "max" in codes, "min" in codes
    need_sq = "var" in codes or "std" in codes
    out = np.empty((graph.num_dst, len(codes) * f), dtype=x.dtype)
    idx = graph.index_dtype
    argmax = np.empty((graph.num_dst, f), dtype=idx) if need_max else np.empty((0, 0), dtype=idx)
    argmin = np.empty((graph.num_dst, f), dtype=idx) if need_min else np.empty((0, 0), dtype=idx)
    _segment_fwd_rows(graph.indptr, graph.indices, x, ops, need_sq, need_max, need_min,
                      out, argmax, argmin, _num_chunks(graph.num_dst))
    return out, (argmax if need_max else None), (argmin if need_min else None)


def segment_bwd(graph, x, coef_a, coef_b, argmax, gmax, argmin, gmin, vtype):
    """grad_x [num_src, F] in the value type `vtype`; see module docstring.
    coef_a, coef_b, gmax, gmin: [num_dst, F] float32/float64 or None;
    argmax, argmin: [num_dst, F] CSR positions or None; x is needed only with coef_b."""
    present = [a for a in (coef_a, coef_b, gmax, gmin) if a is not None]
    if not present:
        raise ValueError("segment_bwd needs at least one of coef_a, coef_b, gmax, gmin")
    if coef_b is not None and x is None:
        raise ValueError("segment_bwd: x is required when coef_b is given")
    if (argmax is None) != (gmax is None) or (argmin is None) != (gmin is None):
        raise ValueError("segment_bwd: argmax/gmax and argmin/gmin come in pairs")
    f = present[0].shape[1]
    cdt = present[0].dtype
    t = graph.transpose()
    idx = graph.index_dtype
    none_f = np.zeros((0, 0), dtype=cdt)
    none_i = np.zeros((0, 0), dtype=idx)
    grad_x = np.empty((graph.num_src, f), dtype=np.dtype(vtype))
    _segment_bwd_rows(t.indptr, t.indices, t.edge_ids,
                      none_f if x is None else x,
                      none_f if coef_a is None else coef_a, coef_a is not None,
                      none_f if coef_b is None else coef_b, coef_b is not None,
                      none_i if argmax is None else argmax,
                      none_f if gmax is None else gmax, gmax is not None,
                      none_i if argmin is None else argmin,
                      none_f if gmin is None else gmin, gmin is not None,
                      grad_x, _num_chunks(graph.num_src))
    return grad_x
