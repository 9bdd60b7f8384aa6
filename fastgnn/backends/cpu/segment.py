"""Numba kernels of the reduction family.

segment_fwd: one parallel task per chunk of target rows (serial in the
    calling thread with one Numba thread or little work); each row
    accumulates the union of the statistics the requested reductions need
    (sums and sum of squares in float64, max / min in x's dtype, with their
    CSR positions when training, product of the nonzero values + zero
    count), one walk of its CSR segment per statistic, then writes every
    requested block of the [num_dst, R*F] output. Max/min: the first CSR
    position wins ties; a NaN, once seen, stays. When training it also
    writes the argmax/argmin positions (of the winning edge within its row,
    Graph.position_dtype) and the mean/std/mul residuals of the backward.
segment_bwd: one fused pass over the target rows building coef_a/coef_b from
    the cotangent blocks (see fastgnn/ops/segment.py), then one parallel task
    per chunk of source rows of the transpose (no atomics, bitwise
    repeatable); for each out-edge e = (j -> i), at position p_e in row i,

        grad_x[j] += coef_a[i] + coef_b[i] * x[j]
                     + [argmax[i] == p_e] g_max[i] + [argmin[i] == p_e] g_min[i]
                     + (coef_c[i] / x[j] if x[j] != 0 else coef_d[i])

    accumulated in float64 (g_max, g_min: the max/min blocks of the cotangent;
    p_e from Graph.transpose_positions). Always deterministic: the CUDA
    backend's opt-in atomic variant (deterministic=False) has no CPU twin, the
    flag is accepted and ignored here.

Reduction codes (shared with kernels_cuda/segment.cu): 0 sum, 1 mean, 2 max,
3 min, 4 var, 5 std, 6 mul. Products are accumulated in float64 like the
sums, so a float32 product that overflows on the GPU (or in torch) can stay
finite here; the mul residuals are rounded to float32 afterwards.
"""
import numba
import numpy as np

CODES = {"sum": 0, "mean": 1, "max": 2, "min": 3, "var": 4, "std": 5, "mul": 6}
_STD_EPS = 1e-5
_STD_MIN = np.sqrt(_STD_EPS)
# Below this many edge x feature visits the forward runs serially in the
# calling thread (as spmm's kernel): the parallel launch costs more than the
# work it splits, and with one Numba thread there is nothing to split.
SERIAL_MAX_WORK = 1 << 16


def _num_chunks(rows):
    """Row chunks for the parallel loop (a few per thread; scratch is per chunk)."""
    return min(rows, 4 * numba.get_num_threads())


@numba.njit(inline="always")
def _chunk(c, nchunks, n):
    return c * n // nchunks, (c + 1) * n // nchunks


@numba.njit(inline="always")
def _product(nonzero_product, zeros):
    """mul's value: the product of the nonzero values, times 0 after a zero
    (so NaN when that product is inf or NaN), as kernels_cuda's product()."""
    return nonzero_product * 0.0 if zeros > 0 else nonzero_product


@numba.njit(inline="always")
def _pick(v, m, is_max):
    """m, or v where v beats it (max: v > m, min: v < m, or v is NaN) and m
    is not NaN; `|`, not `or`: a select, no branch per element."""
    return m if ((v <= m) if is_max else (v >= m)) | (m != m) else v


@numba.njit(inline="always")
def _extreme(acc, x, indices, e, last, is_max):
    """acc = max (is_max) or min of acc and x[indices[e:last]], four edges per
    pass over the features (one load and store of acc per four edges; the
    same picks in the same order as one edge per pass)."""
    f = acc.shape[0]
    while e + 3 < last:
        j0, j1, j2, j3 = indices[e], indices[e + 1], indices[e + 2], indices[e + 3]
        for k in range(f):
            m = _pick(x[j0, k], acc[k], is_max)
            m = _pick(x[j1, k], m, is_max)
            m = _pick(x[j2, k], m, is_max)
            acc[k] = _pick(x[j3, k], m, is_max)
        e += 4
    while e < last:
        j = indices[e]
        for k in range(f):
            acc[k] = _pick(x[j, k], acc[k], is_max)
        e += 1


@numba.njit(cache=True)
def _segment_fwd_range(indptr, indices, x, ops, need_sq, need_max, need_min, need_mul,
                       out, argmax, argmin, has_args, res_mean, has_mean, res_std, has_std,
                       res_mul, res_mul_zero, has_mul, r0, r1):
    """Rows r0..r1-1. Each statistic has its own loops over the edges and
    features, so the per-element loops carry no flag tests (an unneeded
    statistic's loops run 0 trips); max/min start from the row's
    first edge (no "no value yet" test) and update by a select,
    `m = m if (v <= m) | (m != m) else v` (the NaN and first-tie rules of
    kernels_cuda), which vectorizes where a branch does not. Max/min are kept
    in x's dtype (exact: a comparison and a copy), the sums in float64; the
    winning positions are tracked only when they are written (has_args)."""
    f = x.shape[1]
    need_sum = False
    for r in range(ops.shape[0]):
        if ops[r] in (0, 1, 4, 5):
            need_sum = True
    fs = f if need_sum else 0
    fq = f if need_sq else 0
    fmul = f if need_mul else 0
    fmx = f if need_max else 0
    fmn = f if need_min else 0
    famx = f if need_max and has_args else 0
    famn = f if need_min and has_args else 0
    s = np.empty(f)
    q = np.empty(f)
    mx = np.empty(f, dtype=x.dtype)
    mn = np.empty(f, dtype=x.dtype)
    amx = np.empty(f, dtype=np.int64)
    amn = np.empty(f, dtype=np.int64)
    pr = np.empty(f)                        # product of the nonzero values
    zc = np.empty(f, dtype=np.int64)        # zero values seen
    zero = x.dtype.type(0)
    for i in range(r0, r1):
        start, end = indptr[i], indptr[i + 1]
        for k in range(fs):
            s[k] = 0.0
        for k in range(fq):
            q[k] = 0.0
        for k in range(fmul):
            pr[k] = 1.0
            zc[k] = 0
        if start < end:
            j0 = indices[start]
            for k in range(fmx):
                mx[k] = x[j0, k]
            for k in range(fmn):
                mn[k] = x[j0, k]
            for k in range(famx):
                amx[k] = 0
            for k in range(famn):
                amn[k] = 0
        else:
            for k in range(fmx):
                mx[k] = zero
            for k in range(fmn):
                mn[k] = zero
            for k in range(famx):
                amx[k] = -1
            for k in range(famn):
                amn[k] = -1
        # sums and, without positions, max/min (`_extreme`): four edges per
        # pass over the features, one load and store of the accumulator per
        # four edges (the same operations in the same order as one edge per
        # pass: the same bits)
        e = start
        last = end if fs > 0 else start
        while e + 3 < last:
            j0, j1, j2, j3 = indices[e], indices[e + 1], indices[e + 2], indices[e + 3]
            for k in range(f):
                s[k] = (((s[k] + x[j0, k]) + x[j1, k]) + x[j2, k]) + x[j3, k]
            e += 4
        while e < last:
            j = indices[e]
            for k in range(f):
                s[k] += x[j, k]
            e += 1
        e = start
        last = end if fq > 0 else start
        while e + 3 < last:
            j0, j1, j2, j3 = indices[e], indices[e + 1], indices[e + 2], indices[e + 3]
            for k in range(f):
                v0 = np.float64(x[j0, k])
                v1 = np.float64(x[j1, k])
                v2 = np.float64(x[j2, k])
                v3 = np.float64(x[j3, k])
                q[k] = (((q[k] + v0 * v0) + v1 * v1) + v2 * v2) + v3 * v3
            e += 4
        while e < last:
            j = indices[e]
            for k in range(f):
                v = np.float64(x[j, k])
                q[k] += v * v
            e += 1
        _extreme(mx, x, indices, start + 1, end if fmx > 0 and famx == 0 else 0, True)
        _extreme(mn, x, indices, start + 1, end if fmn > 0 and famn == 0 else 0, False)
        # one edge per pass: max/min with their positions, products
        for e in range(start, end if famx > 0 or famn > 0 or fmul > 0 else start):
            j = indices[e]
            p = e - start
            if p > 0:
                for k in range(famx):
                    v = x[j, k]
                    if not (v <= mx[k]) and mx[k] == mx[k]:
                        mx[k] = v
                        amx[k] = p
                for k in range(famn):
                    v = x[j, k]
                    if not (v >= mn[k]) and mn[k] == mn[k]:
                        mn[k] = v
                        amn[k] = p
            for k in range(fmul):
                v = np.float64(x[j, k])
                if v == 0:
                    zc[k] += 1
                else:
                    pr[k] *= v
        deg = end - start
        inv = 1.0 / deg if deg > 0 else 0.0
        for r in range(ops.shape[0]):
            op = ops[r]
            base = r * f
            if deg == 0:
                for k in range(f):
                    out[i, base + k] = 1.0 if op == 6 else 0.0
            elif op == 6:
                for k in range(f):
                    out[i, base + k] = _product(pr[k], zc[k])
            elif op == 0:
                for k in range(f):
                    out[i, base + k] = s[k]
            elif op == 1:
                for k in range(f):
                    out[i, base + k] = s[k] * inv
            elif op == 2:
                for k in range(f):
                    out[i, base + k] = mx[k]
            elif op == 3:
                for k in range(f):
                    out[i, base + k] = mn[k]
            else:
                for k in range(f):
                    m = s[k] * inv
                    val = q[k] * inv - m * m
                    if op == 5:
                        if val < _STD_EPS:       # written so that NaN stays NaN
                            val = _STD_EPS
                        val = np.sqrt(val)
                        if val <= _STD_MIN:
                            val = 0.0
                    out[i, base + k] = val
        for k in range(famx):
            argmax[i, k] = amx[k]
        for k in range(famn):
            argmin[i, k] = amn[k]
        for k in range(f if has_mean or has_std else 0):
            m = s[k] * inv
            if has_mean:
                res_mean[i, k] = m
            if has_std:
                val = q[k] * inv - m * m
                if val < _STD_EPS:
                    val = _STD_EPS
                val = np.sqrt(val)
                res_std[i, k] = 0.0 if val <= _STD_MIN else val
        for k in range(f if has_mul else 0):
            res_mul[i, k] = _product(pr[k], zc[k])
            res_mul_zero[i, k] = pr[k] if zc[k] == 1 else res_mul[i, k]


@numba.njit(parallel=True, cache=True)
def _segment_fwd_rows(indptr, indices, x, ops, need_sq, need_max, need_min, need_mul,
                      out, argmax, argmin, has_args, res_mean, has_mean, res_std, has_std,
                      res_mul, res_mul_zero, has_mul, nchunks):
    n = indptr.shape[0] - 1
    for c in numba.prange(nchunks):
        r0, r1 = _chunk(c, nchunks, n)
        _segment_fwd_range(indptr, indices, x, ops, need_sq, need_max, need_min, need_mul,
                           out, argmax, argmin, has_args, res_mean, has_mean, res_std, has_std,
                           res_mul, res_mul_zero, has_mul, r0, r1)


def _segment_fwd(indptr, indices, x, ops, need_sq, need_max, need_min, need_mul, out, argmax,
                 argmin, has_args, res_mean, has_mean, res_std, has_std, res_mul, res_mul_zero,
                 has_mul, work):
    """The forward over every row: serial (`_segment_fwd_range` in the calling
    thread) with one Numba thread or below SERIAL_MAX_WORK edge x feature
    visits, else the parallel kernel."""
    n = indptr.shape[0] - 1
    if work < SERIAL_MAX_WORK or numba.get_num_threads() == 1:
        _segment_fwd_range(indptr, indices, x, ops, need_sq, need_max, need_min, need_mul,
                           out, argmax, argmin, has_args, res_mean, has_mean, res_std, has_std,
                           res_mul, res_mul_zero, has_mul, 0, n)
    else:
        _segment_fwd_rows(indptr, indices, x, ops, need_sq, need_max, need_min, need_mul,
                          out, argmax, argmin, has_args, res_mean, has_mean, res_std, has_std,
                          res_mul, res_mul_zero, has_mul, _num_chunks(n))
    return out


@numba.njit(parallel=True, cache=True)
def _segment_coef_rows(indptr, g, ops, mean, std, mul_out, mul_zero, coef_a, has_a, coef_b,
                       has_b, coef_c, coef_d, has_c, n, f, nchunks):
    """coef_a/coef_b of the linear reductions and coef_c/coef_d of mul, one
    pass over g (see ops/segment.py)."""
    for c in numba.prange(nchunks):
        r0, r1 = _chunk(c, nchunks, n)
        for i in range(r0, r1):
            deg = indptr[i + 1] - indptr[i]
            inv = 1.0 / deg if deg > 0 else 0.0
            for k in range(f):
                a = 0.0
                b = 0.0
                for r in range(ops.shape[0]):
                    op = ops[r]
                    if op == 2 or op == 3:
                        continue
                    gv = np.float64(g[i, r * f + k])
                    if op == 6:
                        coef_c[i, k] = gv * mul_out[i, k]
                        coef_d[i, k] = gv * mul_zero[i, k]
                    elif op == 0:
                        a += gv
                    elif op == 1:
                        a += gv * inv
                    else:
                        if op == 5:
                            s = np.float64(std[i, k])
                            gv = gv * 0.5 / s if s != 0 else 0.0   # NaN std keeps NaN
                        gi = gv * inv
                        a += -2.0 * gi * mean[i, k]
                        b += 2.0 * gi
                if has_a:
                    coef_a[i, k] = a
                if has_b:
                    coef_b[i, k] = b


@numba.njit(parallel=True, cache=True)
def _segment_bwd_rows(t_indptr, t_indices, t_pos, x, a, has_a, b, has_b, cc, cd, has_c,
                      g, argmax, off_max, has_max, argmin, off_min, has_min, grad_x, nchunks):
    n, f = grad_x.shape
    for c in numba.prange(nchunks):
        r0, r1 = _chunk(c, nchunks, n)
        acc_a = np.empty(f)
        acc_b = np.empty(f)
        acc_c = np.empty(f)
        for j in range(r0, r1):
            for k in range(f):
                acc_a[k] = 0.0
                acc_b[k] = 0.0
                acc_c[k] = 0.0
            for te in range(t_indptr[j], t_indptr[j + 1]):
                i = t_indices[te]
                p = t_pos[te]
                # one loop per term, chosen outside it (no flag tests per element)
                if has_a:
                    for k in range(f):
                        acc_a[k] += a[i, k]
                if has_b:
                    for k in range(f):
                        acc_b[k] += b[i, k]
                if has_max:
                    for k in range(f):
                        if argmax[i, k] == p:
                            acc_a[k] += g[i, off_max + k]
                if has_min:
                    for k in range(f):
                        if argmin[i, k] == p:
                            acc_a[k] += g[i, off_min + k]
                if has_c:           # mul: coef_c / x[j], or coef_d where x[j] == 0
                    for k in range(f):
                        acc_c[k] += cc[i, k] if x[j, k] != 0 else cd[i, k]
            for k in range(f):
                val = acc_a[k]
                if has_b:
                    val += acc_b[k] * np.float64(x[j, k])
                if has_c:
                    xv = np.float64(x[j, k])
                    val += acc_c[k] / xv if xv != 0 else acc_c[k]
                grad_x[j, k] = val


def _coef_dtype(vtype):
    return np.float64 if vtype == "float64" else np.float32


def segment_fwd_runner(graph, dtype, codes):
    """run(x, out) -> out: the inference forward (no residuals) for one graph,
    value dtype and reduction tuple, its arguments other than x and out
    prepared once. `segment_fwd` builds one per inference call; fastgnn.torch
    keeps them (its CPU plans). out: [num_dst, len(codes) * F] in x's dtype."""
    ops = np.array([CODES[c] for c in codes], dtype=np.int64)
    need_max, need_min, need_mul = "max" in codes, "min" in codes, "mul" in codes
    need_sq = "var" in codes or "std" in codes
    none = np.empty((0, 0), dtype=np.dtype(dtype))
    args = np.empty((0, 0), dtype=graph.position_dtype if need_max or need_min
                    else graph.index_dtype)
    indptr, indices, edges = graph.indptr, graph.indices, graph.num_edges

    def run(x, out):
        return _segment_fwd(indptr, indices, x, ops, need_sq, need_max, need_min, need_mul, out,
                            args, args, False, none, False, none, False, none, none, False,
                            edges * x.shape[1])
    return run


def segment_fwd(graph, x, codes, vtype, residuals=True):
    """(out, argmax, argmin, mean, std, mul): out [num_dst, len(codes)*F] in
    x's dtype (see module docstring); with residuals (training) also argmax /
    argmin [num_dst, F] positions of the winners within their row
    (Graph.position_dtype; all ones for empty rows) when max / min are
    requested, the mean / std [num_dst, F] (float32, float64 for float64)
    when var / std are, and mul = (mul_out, mul_zero) [num_dst, F] in that
    precision when mul is: the product, and what a zero input's gradient is
    scaled by (the product of the others for a row's only zero, else the
    product again); None otherwise."""
    if not residuals:
        out = np.empty((graph.num_dst, len(codes) * x.shape[1]), dtype=x.dtype)
        return segment_fwd_runner(graph, x.dtype, codes)(x, out), None, None, None, None, None
    f, n = x.shape[1], graph.num_dst
    ops = np.array([CODES[c] for c in codes], dtype=np.int64)
    need_max, need_min, need_mul = "max" in codes, "min" in codes, "mul" in codes
    need_sq = "var" in codes or "std" in codes
    out = np.empty((n, len(codes) * f), dtype=x.dtype)
    pos = graph.position_dtype if need_max or need_min else graph.index_dtype
    cdt = _coef_dtype(vtype)

    def alloc(flag, dtype):
        return np.empty((n, f) if flag else (0, 0), dtype=dtype)

    flags = (residuals and need_max, residuals and need_min, residuals and need_sq,
             residuals and "std" in codes, residuals and need_mul, residuals and need_mul)
    argmax, argmin, mean, std, mul_out, mul_zero = (
        alloc(fl, dt) for fl, dt in zip(flags, (pos, pos, cdt, cdt, cdt, cdt)))
    _segment_fwd(graph.indptr, graph.indices, x, ops, need_sq, need_max, need_min, need_mul,
                 out, argmax, argmin, residuals, mean, flags[2], std, flags[3],
                 mul_out, mul_zero, flags[4], graph.num_edges * f)
    res = tuple(a if fl else None for a, fl in zip((argmax, argmin, mean, std), flags))
    return (out, *res, (mul_out, mul_zero) if flags[4] else None)


def segment_bwd(graph, x, g, codes, mean, std, argmax, argmin, vtype, mul=None,
                deterministic=True, addend=None, out=None):
    """grad_x [num_src, F] in the value type `vtype`; see module docstring.
    g: [num_dst, R*F] cotangent (block r for codes[r]); mean, std, argmax,
    argmin, mul: the residuals of segment_fwd (None when not needed); x
    [num_src, F] is needed only with var/std/mul. deterministic: accepted for
    the CUDA backend's interface and ignored: this pass has no atomic
    variant, so deterministic=False gives the same bits. addend: optional
    [num_src, F] added to the result; out: optional [num_src, F] destination
    (returned; it may be addend itself)."""
    R = len(codes)
    f = g.shape[1] // R
    n = graph.num_dst
    cdt = _coef_dtype(vtype)
    ops = np.array([CODES[c] for c in codes], dtype=np.int64)
    has_a = any(c not in ("max", "min", "mul") for c in codes)
    has_b = any(c in ("var", "std") for c in codes)
    has_c = "mul" in codes
    none_f = np.zeros((0, 0), dtype=cdt)
    has_args = argmax is not None or argmin is not None
    pos = graph.position_dtype if has_args else graph.index_dtype
    none_i = np.zeros((0, 0), dtype=pos)

    def alloc(flag):
        return np.empty((n, f), dtype=cdt) if flag else none_f
    coef_a, coef_b, coef_c, coef_d = alloc(has_a), alloc(has_b), alloc(has_c), alloc(has_c)
    if has_a or has_c:
        mul_out, mul_zero = mul if has_c else (none_f, none_f)
        _segment_coef_rows(graph.indptr, g, ops, none_f if mean is None else mean,
                           none_f if std is None else std, mul_out, mul_zero, coef_a, has_a,
                           coef_b, has_b, coef_c, coef_d, has_c, n, f, _num_chunks(n))
    t = graph.transpose()
    grad_x = np.empty((graph.num_src, f), dtype=np.dtype(vtype))
    off = {c: r * f for r, c in enumerate(codes)}
    t_pos = graph.transpose_positions if has_args else np.zeros(0, dtype=pos)
    _segment_bwd_rows(t.indptr, t.indices, t_pos,
                      x if has_b or has_c else none_f, coef_a, has_a, coef_b, has_b,
                      coef_c, coef_d, has_c, g,
                      none_i if argmax is None else argmax.astype(pos, copy=False), off.get("max", 0),
                      argmax is not None,
                      none_i if argmin is None else argmin.astype(pos, copy=False), off.get("min", 0),
                      argmin is not None,
                      grad_x, _num_chunks(graph.num_src))
    if addend is not None:                      # [num_src, F] in the value type
        return np.add(grad_x, addend, out=grad_x if out is None else out)
    if out is not None:
        out[...] = grad_x
        return out
    return grad_x
