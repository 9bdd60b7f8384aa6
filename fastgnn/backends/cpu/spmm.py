"""Numba kernels of the SpMM family.

spmm:  one parallel task per chunk of target rows (serial in the calling
       thread with one Numba thread or little work); each row walks its CSR
       segment and accumulates w_e * c[src_e] * x[src_e] (in the caller's
       dtype, as the CUDA kernel's accumulator for fp32/fp64) in its output
       row, then applies the row scale r[row] and adds the bias there.
column_sums: sums over rows, the bias gradient (float64 accumulation, row order).
sddmm: one parallel task per target row; for each in-edge, the dot product
       of grad_out[row] with x[src] (accumulated in float64).
"""
import numba
import numpy as np


@numba.njit(cache=True)
def _spmm_range(indptr, indices, weights, has_weight, row_scale, has_row, col_scale, has_col,
                bias, has_bias, x, out, lo, hi):
    """Rows lo..hi-1 of out, each accumulated in place in its output row (in
    the value type). Edges are taken four at a time into one pass over the
    features, o[k] = (((o[k] + w0 x0[k]) + w1 x1[k]) + w2 x2[k]) + w3 x3[k]:
    the same additions in the same order as one edge per pass (bitwise the
    same sums), with o[k] loaded and stored once per four edges instead of
    once per edge. Unit weights (no edge weight, no column scale) add x[j]
    itself (1 * x == x: the same values, no multiply), eight edges per pass
    while a row has eight left (2 cores, F = 32, fp32, one thread: clustered10
    78 -> 69 us, knn10 43 -> 41, rmat10 37 -> 35; rows of fewer edges are
    unchanged)."""
    f = out.shape[1]
    one = x.dtype.type(1)
    unit = not (has_weight or has_col)
    for i in range(lo, hi):
        o = out[i]
        for k in range(f):
            o[k] = 0
        e, end = indptr[i], indptr[i + 1]
        if unit:
            while e + 7 < end:
                x0, x1 = x[indices[e]], x[indices[e + 1]]
                x2, x3 = x[indices[e + 2]], x[indices[e + 3]]
                x4, x5 = x[indices[e + 4]], x[indices[e + 5]]
                x6, x7 = x[indices[e + 6]], x[indices[e + 7]]
                for k in range(f):
                    o[k] = (((((((o[k] + x0[k]) + x1[k]) + x2[k]) + x3[k]) + x4[k]) + x5[k])
                            + x6[k]) + x7[k]
                e += 8
            while e + 3 < end:
                x0, x1 = x[indices[e]], x[indices[e + 1]]
                x2, x3 = x[indices[e + 2]], x[indices[e + 3]]
                for k in range(f):
                    o[k] = (((o[k] + x0[k]) + x1[k]) + x2[k]) + x3[k]
                e += 4
            while e < end:
                xj = x[indices[e]]
                for k in range(f):
                    o[k] += xj[k]
                e += 1
        else:
            while e + 3 < end:
                j0, j1, j2, j3 = indices[e], indices[e + 1], indices[e + 2], indices[e + 3]
                w0 = weights[e] if has_weight else one
                w1 = weights[e + 1] if has_weight else one
                w2 = weights[e + 2] if has_weight else one
                w3 = weights[e + 3] if has_weight else one
                if has_col:
                    w0 *= col_scale[j0]
                    w1 *= col_scale[j1]
                    w2 *= col_scale[j2]
                    w3 *= col_scale[j3]
                x0, x1, x2, x3 = x[j0], x[j1], x[j2], x[j3]
                for k in range(f):
                    o[k] = (((o[k] + w0 * x0[k]) + w1 * x1[k]) + w2 * x2[k]) + w3 * x3[k]
                e += 4
            while e < end:
                j = indices[e]
                w = weights[e] if has_weight else one
                if has_col:
                    w *= col_scale[j]
                xj = x[j]
                for k in range(f):
                    o[k] += w * xj[k]
                e += 1
        if has_row:
            r = row_scale[i]
            for k in range(f):
                o[k] *= r
        if has_bias:
            for k in range(f):
                o[k] += bias[k]


@numba.njit(parallel=True, cache=True)
def _spmm_rows(indptr, indices, weights, has_weight, row_scale, has_row, col_scale, has_col,
               bias, has_bias, x, out, nchunks):
    n = out.shape[0]
    for c in numba.prange(nchunks):
        _spmm_range(indptr, indices, weights, has_weight, row_scale, has_row, col_scale,
                    has_col, bias, has_bias, x, out, c * n // nchunks, (c + 1) * n // nchunks)


@numba.njit(parallel=True, cache=True)
def _sddmm_rows(indptr, indices, a, b, out):
    n, f = a.shape
    for i in numba.prange(n):
        for e in range(indptr[i], indptr[i + 1]):
            j = indices[e]
            acc = 0.0
            for k in range(f):
                acc += a[i, k] * b[j, k]
            out[e] = acc


def _num_chunks(rows):
    """Row chunks for the parallel loops (a few per thread)."""
    return max(min(rows, 4 * numba.get_num_threads()), 1)


# Below this many edge x feature products a call runs the serial kernel:
# the parallel launch costs more than the work it splits (and with one
# Numba thread there is nothing to split).
SERIAL_MAX_WORK = 1 << 16


def _serial(work):
    return work < SERIAL_MAX_WORK or numba.get_num_threads() == 1


def _or_empty(a, dtype):
    return (a.astype(dtype, copy=False), True) if a is not None else (np.empty(0, dtype), False)


def spmm_runner(graph, dtype, weight_csr=None, row_scale=None, col_scale=None):
    """run(x, out, bias=None) for one graph, value dtype and set of constant
    weights and scales: the kernel's arguments other than x, out and bias
    (weights and scales in `dtype`, the serial/parallel choice) prepared
    once. `spmm` builds one per call; fastgnn.torch keeps them (its CPU plans)."""
    dtype = np.dtype(dtype)
    w, has_w = _or_empty(weight_csr, dtype)
    r, has_r = _or_empty(row_scale, dtype)
    c, has_c = _or_empty(col_scale, dtype)
    indptr, indices, n = graph.indptr, graph.indices, graph.num_dst
    none = np.empty(0, dtype)
    nchunks = _num_chunks(n)

    def run(x, out, bias=None):
        b, has_b = (none, False) if bias is None else (bias, True)
        if _serial(graph.num_edges * x.shape[1]):
            _spmm_range(indptr, indices, w, has_w, r, has_r, c, has_c, b, has_b, x, out, 0, n)
        else:
            _spmm_rows(indptr, indices, w, has_w, r, has_r, c, has_c, b, has_b, x, out, nchunks)
        return out
    return run


def spmm(graph, x, weight_csr, vtype, path="auto", deterministic=True, row_scale=None,
         col_scale=None, bias=None):
    """[num_dst, F]: out[i] = r_i sum_e w_e c_j x[j] (+ bias [F]) on the CPU
    (path and deterministic are GPU options; the CPU kernel is always
    deterministic)."""
    out = np.empty((graph.num_dst, x.shape[1]), dtype=x.dtype)
    b = None if bias is None else bias.astype(x.dtype, copy=False)
    return spmm_runner(graph, x.dtype, weight_csr, row_scale, col_scale)(x, out, b)


def column_sums(x, vtype, index_dtype=None):
    """[F] sum over the rows of x [N, F] (float64 accumulation, row order), in
    x's dtype (index_dtype: unused, as the CUDA backend's signature)."""
    return x.sum(axis=0, dtype=np.float64).astype(x.dtype)


def sddmm(graph, a, b, vtype):
    """[E] in CSR order: <a[row_e], b[src_e]> (float64 accumulation, x's float type out)."""
    out = np.empty(graph.num_edges, dtype=a.dtype)
    _sddmm_rows(graph.indptr, graph.indices, a, b, out)
    return out
