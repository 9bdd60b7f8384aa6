"""Numba kernels of the SpMM family.

spmm:  one parallel task per chunk of target rows; each row walks its CSR
       segment and accumulates w_e * c[src_e] * x[src_e] (in the caller's
       dtype, as the CUDA kernel's accumulator for fp32/fp64) into a per-chunk
       scratch row, then applies the row scale r[row], adds the bias and
       stores the row once.
column_sums: sums over rows, the bias gradient (float64 accumulation, row order).
sddmm: one parallel task per target row; for each in-edge, the dot product
       of grad_out[row] with x[src] (accumulated in float64).
"""
import numba
import numpy as np


@numba.njit(parallel=True, cache=True)
def _spmm_rows(indptr, indices, weights, has_weight, row_scale, has_row, col_scale, has_col,
               bias, has_bias, x, out, nchunks):
    n, f = out.shape
    one = x.dtype.type(1)
    for c in numba.prange(nchunks):
        acc = np.empty(f, dtype=out.dtype)      # per-chunk scratch: the row stays in L1
        for i in range(c * n // nchunks, (c + 1) * n // nchunks):
            for k in range(f):
                acc[k] = 0
            for e in range(indptr[i], indptr[i + 1]):
                j = indices[e]
                w = weights[e] if has_weight else one
                if has_col:
                    w *= col_scale[j]
                for k in range(f):
                    acc[k] += w * x[j, k]
            if has_row:
                r = row_scale[i]
                for k in range(f):
                    acc[k] *= r
            if has_bias:
                for k in range(f):
                    acc[k] += bias[k]
            for k in range(f):
                out[i, k] = acc[k]


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
    """Row chunks for the parallel loops (a few per thread; scratch is per chunk)."""
    return max(min(rows, 4 * numba.get_num_threads()), 1)


def _or_empty(a, dtype):
    return (a.astype(dtype, copy=False), True) if a is not None else (np.empty(0, dtype), False)


def spmm(graph, x, weight_csr, vtype, path="auto", deterministic=True, row_scale=None,
         col_scale=None, bias=None):
    """[num_dst, F]: out[i] = r_i sum_e w_e c_j x[j] (+ bias [F]) on the CPU
    (path and deterministic are GPU options; the CPU kernel is always
    deterministic)."""
    out = np.empty((graph.num_dst, x.shape[1]), dtype=x.dtype)
    w, has_w = _or_empty(weight_csr, x.dtype)
    r, has_r = _or_empty(row_scale, x.dtype)
    c, has_c = _or_empty(col_scale, x.dtype)
    b, has_b = _or_empty(bias, x.dtype)
    _spmm_rows(graph.indptr, graph.indices, w, has_w, r, has_r, c, has_c, b, has_b, x, out,
               _num_chunks(graph.num_dst))
    return out


def column_sums(x, vtype, index_dtype=None):
    """[F] sum over the rows of x [N, F] (float64 accumulation, row order), in
    x's dtype (index_dtype: unused, as the CUDA backend's signature)."""
    return x.sum(axis=0, dtype=np.float64).astype(x.dtype)


def sddmm(graph, a, b, vtype):
    """[E] in CSR order: <a[row_e], b[src_e]> (float64 accumulation, x's float type out)."""
    out = np.empty(graph.num_edges, dtype=a.dtype)
    _sddmm_rows(graph.indptr, graph.indices, a, b, out)
    return out
