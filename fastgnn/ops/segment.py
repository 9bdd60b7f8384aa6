"""Reduction family: neighbour sum, mean, max, min, var, std and mul (product),
alone or several at once (PyG's MultiAggregation with mode="cat").

Math (messages flow source j -> target i, edges e = (j -> i), d_i = deg_in(i)):

    sum:  out[i] = sum_e x[j]                 mean: out[i] = sum_e x[j] / d_i
    max:  out[i] = max_e x[j]                 min:  out[i] = min_e x[j]
    var:  out[i] = mean_e x[j]^2 - (mean_e x[j])^2          (PyG VarAggregation, no clamp)
    std:  out[i] = sqrt(max(var_i, 1e-5)), then 0 where that is <= sqrt(1e-5)
                                                             (PyG StdAggregation)
    mul:  out[i] = prod_e x[j]   (PyG MulAggregation), computed as P_i = the
          product of the nonzero values times 0 if any value is 0 (so NaN when
          P_i is inf or NaN)

per feature; rows without in-edges give 0 for every reduction except mul,
which gives 1 (PyG's scatter "mul" starts from ones). Max/min ties
go to the first CSR position (the caller's first edge in the row); a NaN
input makes the max/min NaN (as torch.amax). Several reductions produce
[num_dst, R*F] with block r = reduction r.

The vector-Jacobian product is one pass over the cached transpose, without
atomics (so bitwise repeatable):

    grad_x[j] = sum_{e=(j->i)} coef_a[i] + coef_b[i] * x[j]
                + [argmax[i] == p_e] g_max[i] + [argmin[i] == p_e] g_min[i]
                + (coef_c[i] / x[j] where x[j] != 0, else coef_d[i])

with p_e = e - indptr[i] the position of edge e within row i, g_max, g_min
the max/min blocks of the cotangent (read where they are, only for the
winning edge), and, from the cotangent block g of each other
reduction (m_i = mean, s_i = std):

    sum:  coef_a += g                mean: coef_a += g / d_i
    var:  coef_a += -2 g m_i / d_i,  coef_b += 2 g / d_i
    std:  as var with g_var = g * 0.5 / s_i where s_i != 0, else 0 (the
          gradient of PyG's clamp + masked_fill)
    mul:  coef_c = g out_i (out_i / x[j]: the product of the others where
          x[j] != 0), coef_d = g P_i where row i has exactly one zero, else
          g out_i (torch's prod gradient: the only zero gets the product of
          the others, one of several zeros g out_i: 0, or NaN with a NaN/inf
          product)

coef_a/coef_b are built in one fused pass over the cotangent (float32, or
float64 for float64 inputs). The residuals hold only what the VJP needs: the
argmax/argmin positions within the row (Graph.position_dtype: uint8 when
every target has fewer than 256 in-edges, uint16 below 65536, else the index
dtype), the mean (and std) written by the forward kernel for
var/std, the mul output and the one-zero product for mul, in that
accumulation precision, and x for var/std/mul.

Opt-in `deterministic=False` (GPU only): the max/min terms are scattered
instead, one float atomic per (target, feature):

    grad_x[j_i,f] += g_max[i,f]      j_i,f = the source of row i's winning edge

into a zeroed float32 (float64 for float64) accumulator, cast once to the
value type for float16/bfloat16. A pure max/min then skips the transpose
walk (and its per-edge read of the arg rows) entirely; a multi-reduction's
walk keeps only the coef_a/coef_b terms. Faster, but the order of the sums,
so their last bits, vary from run to run. The forward is unchanged, and so is
a backward without max/min (sum, mean, var, std: the flag has no effect). The
CPU backend accepts the flag and stays deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass

from .._array import as_backend_array, check_deterministic, data_ptr, same_device, xp_of
from ..backends import backend_for
from ..graph import Graph, _index_dtype, as_graph, check_offsets
from .spmm import validate_features

REDUCES = ("sum", "mean", "max", "min", "var", "std", "mul")


@dataclass
class SegmentResiduals:
    """What `segment_reduce_bwd` needs, and nothing else."""
    codes: tuple             # the requested reductions, in output block order
    vtype: str
    width: int               # F
    num_src: int
    x: object                # [num_src, F] features, only with var/std/mul
    mean: object             # [num_dst, F] float32 (float64 for float64), only with var/std
    std: object              # [num_dst, F] float32 (float64 for float64), only with std
    argmax: object           # [num_dst, F] winner's position in its row (Graph.position_dtype), only with max
    argmin: object           # [num_dst, F] winner's position in its row (Graph.position_dtype), only with min
    mul: object              # (out, zero factor) [num_dst, F] each, mean's dtype, only with mul
    has_grad: bool           # False when the forward ran with needs_x_grad=False
    deterministic: bool = True   # False: the GPU max/min backward may use float atomics


def parse_reduce(reduce):
    """reduce (a str or a list/tuple of str) -> (tuple of names, single: bool)."""
    if isinstance(reduce, str):
        names, single = (reduce,), True
    elif isinstance(reduce, (list, tuple)):
        names, single = tuple(reduce), False
        if not names:
            raise ValueError(f"reduce must name at least one of {REDUCES}, got an empty list")
    else:
        raise TypeError(f"reduce must be a str or a list/tuple of str from {REDUCES}, "
                        f"got {type(reduce).__name__}")
    for r in names:
        if not isinstance(r, str) or r not in REDUCES:
            raise ValueError(f"reduce must be one of {REDUCES} (or a list of them), got {r!r}")
    dup = sorted({r for r in names if names.count(r) > 1})
    if dup:
        raise ValueError(f"reduce lists {dup} more than once: {list(names)}")
    return names, single


def segment_reduce_fwd(graph, x, reduce="sum", *, vtype=None, needs_x_grad=True,
                       deterministic=True):
    """Forward of `segment_reduce`; returns (out, SegmentResiduals). The
    residuals carry `deterministic` to `segment_reduce_bwd` (see the module
    docstring); the forward itself does not depend on it."""
    return _fwd(as_graph(graph), x, reduce, vtype, needs_x_grad, "x", deterministic)


def _fwd(graph, x, reduce, vtype, needs_x_grad, name, deterministic):
    deterministic = check_deterministic(deterministic)
    codes, _ = parse_reduce(reduce)
    x, vt = validate_features(graph, x, vtype, name=name)
    needs_x_grad = bool(needs_x_grad)
    out, argmax, argmin, mean, std, mul = backend_for(x).segment_fwd(
        graph, x, codes, vt, residuals=needs_x_grad)
    keep_x = x if mean is not None or mul is not None else None
    res = SegmentResiduals(codes, vt, x.shape[1], graph.num_src, keep_x, mean, std,
                           argmax, argmin, mul, needs_x_grad, deterministic)
    return out, res


def segment_reduce_bwd(graph, res: SegmentResiduals, grad_out, *, addend=None, out=None):
    """Backward of `segment_reduce`: grad_x [num_src, F] in x's value type,
    plus `addend` when given.

    grad_out: [num_dst, R*F] (or [num_dst, F] for a single reduction).
    addend:   optional [num_src, F] in x's value type (not modified): returns
              addend + grad_x, the sum done before grad_x is rounded to the
              value type (on the GPU inside the transpose walk's store, so a
              layer whose x also has another gradient, e.g. a root term's
              g W, pays one read of it instead of a separate add pass).
    out:      optional contiguous [num_src, F] array in x's value type to
              write the result into (returned); it may be `addend` itself,
              which then holds the sum (no third [num_src, F] buffer).
    Bitwise repeatable unless the forward ran with deterministic=False (then,
    on the GPU, the max/min terms are added with float atomics)."""
    graph = as_graph(graph)
    if not res.has_grad:
        raise ValueError("segment_reduce_fwd was called with needs_x_grad=False")
    if res.num_src != graph.num_src:
        raise ValueError(f"graph has {graph.num_src} source nodes but the residuals come from "
                         f"a graph with {res.num_src}")
    g, _ = validate_features(graph, grad_out, res.vtype, name="grad_out", rows=graph.num_dst)
    f, nr = res.width, len(res.codes)
    if g.shape[1] != nr * f:
        raise ValueError(f"grad_out must have shape [num_dst, {nr * f}] = [{graph.num_dst}, "
                         f"{nr} reductions x {f}], got {tuple(g.shape)}")
    if addend is not None:
        addend, _ = validate_features(graph, addend, res.vtype, name="addend")
        if addend.shape[1] != f:
            raise ValueError(f"addend must have shape [num_src, F] = [{graph.num_src}, {f}], "
                             f"got {tuple(addend.shape)}")
        if addend.dtype != g.dtype:
            raise TypeError(f"addend must have grad_out's dtype {g.dtype}, got {addend.dtype}")
    if out is not None:
        out_arr = as_backend_array(out, "out")
        if xp_of(out_arr) is not xp_of(g) or not same_device(out_arr, graph.indices):
            raise ValueError(f"out must live on the graph's device ({graph.device})")
        if tuple(out_arr.shape) != (graph.num_src, f) or out_arr.dtype != g.dtype:
            raise ValueError(f"out must be a [{graph.num_src}, {f}] array of dtype {g.dtype}, "
                             f"got {tuple(out_arr.shape)} {out_arr.dtype}")
        if not out_arr.flags.c_contiguous:
            raise ValueError("out must be C-contiguous")
        out = out_arr
        for name, a in (("grad_out", g), ("the residuals' x", res.x), ("addend", addend)):
            if a is not None and _overlap(out, a) and not (a is addend and _same_span(out, a)):
                raise ValueError(f"out overlaps {name} (out may only be addend itself)")
    return backend_for(g).segment_bwd(graph, res.x, g, res.codes, res.mean, res.std,
                                      res.argmax, res.argmin, res.vtype, mul=res.mul,
                                      deterministic=res.deterministic, addend=addend, out=out)


def _overlap(a, b) -> bool:
    """a and b (arrays of one backend) may share memory: their byte ranges meet."""
    return bool(xp_of(a).may_share_memory(a, b))


def _same_span(a, b) -> bool:
    """a and b (contiguous) cover the same bytes."""
    return data_ptr(a) == data_ptr(b) and a.nbytes == b.nbytes


def segment_reduce(graph, x, reduce="sum", *, vtype=None, deterministic=True):
    """Neighbour reductions: out[i] = reduce_{e=(j->i)} x[j] (see module docstring).

    graph:  fastgnn.Graph with num_src source and num_dst target nodes.
    x:      [num_src, F] float features (NumPy -> CPU, CuPy -> GPU; bf16 as
            16-bit integers with vtype="bfloat16").
    reduce: one of "sum", "mean", "max", "min", "var", "std", "mul", or a
            list/tuple of distinct ones (computed in one pass over the neighbours).
    deterministic: a bool (TypeError otherwise). True (default): the backward
            (`segment_reduce_fwd` / `segment_reduce_bwd`) uses no float atomics
            and is bitwise repeatable. False (GPU only; the CPU backend accepts
            it and stays deterministic): the max/min terms of the backward are
            added with float atomics over the targets, skipping the transpose
            walk for a pure max/min: faster, last bits vary. No effect on the
            forward, nor on sum/mean/var/std alone.
    Returns [num_dst, F] for a single str, else [num_dst, R*F] with block r
    holding reduce[r] (PyG MultiAggregation mode="cat" order); x's dtype.
    Empty rows give 0 (mul: 1).
    """
    out, _ = segment_reduce_fwd(graph, x, reduce, vtype=vtype, needs_x_grad=False,
                                deterministic=deterministic)
    return out


# ------------------------------------------------------------ segment_csr
@dataclass
class SegmentCsrResiduals:
    graph: Graph             # the Graph built from indptr (its transpose is cached on it)
    inner: SegmentResiduals


def _csr_graph(indptr, values):
    """The graph of Graph.from_csr(indptr, arange(E)), built after one check
    of indptr: edge e carries values[e], so the graph ops reduce per-edge
    values over CSR segments."""
    if values is None:
        raise TypeError("values must be an array of shape [E, F], got None")
    values = as_backend_array(values, "values")
    indptr = as_backend_array(indptr, "indptr")
    if indptr.ndim != 1 or indptr.shape[0] < 1:
        raise ValueError(f"indptr must have shape [num_segments + 1], got {tuple(indptr.shape)}")
    if values.ndim != 2:
        raise ValueError(f"values must have shape [E, F], got {tuple(values.shape)}")
    if indptr.dtype.kind not in "iu":
        raise TypeError(f"indptr must hold integers, got dtype {indptr.dtype}")
    e, n = int(values.shape[0]), int(indptr.shape[0]) - 1
    check_offsets(indptr, "values", e, "rows")               # (one copy to the host)
    # (source e of edge e: valid by construction, so no from_csr check of it)
    idx = _index_dtype(e, n)
    xp = xp_of(indptr)
    return Graph(indptr.astype(idx), xp.arange(e, dtype=idx), None, e, n), values


def segment_csr_fwd(indptr, values, reduce="sum", *, vtype=None, needs_x_grad=True,
                    deterministic=True):
    """Forward of `segment_csr`; returns (out, SegmentCsrResiduals)."""
    graph, values = _csr_graph(indptr, values)
    out, res = _fwd(graph, values, reduce, vtype, needs_x_grad, "values", deterministic)
    return out, SegmentCsrResiduals(graph, res)


def segment_csr_bwd(indptr, res: SegmentCsrResiduals, grad_out):
    """Backward of `segment_csr`: grad_values [E, F] (indptr must be the forward's)."""
    indptr = as_backend_array(indptr, "indptr")
    if indptr.shape != res.graph.indptr.shape:
        raise ValueError(f"indptr has shape {tuple(indptr.shape)} but segment_csr_fwd was "
                         f"called with shape {tuple(res.graph.indptr.shape)}")
    return segment_reduce_bwd(res.graph, res.inner, grad_out)


def segment_csr(indptr, values, reduce="sum", *, vtype=None, deterministic=True):
    """Reductions of per-edge values over CSR segments (torch_scatter's segment_csr):

        out[i] = reduce_{indptr[i] <= e < indptr[i+1]} values[e]

    indptr: [num_segments + 1] non-decreasing offsets from 0 to E.
    values: [E, F] float values (NumPy -> CPU, CuPy -> GPU).
    reduce: as in `segment_reduce` (a str or a list of distinct reductions).
    deterministic: as in `segment_reduce` (for `segment_csr_fwd`'s backward).
    Implemented as `segment_reduce(Graph.from_csr(indptr, arange(E)), values,
    reduce)`, so every semantic (empty segments give 0, first-position ties,
    NaN propagation, var/std as PyG) is the same.
    Returns [num_segments, F] (or [num_segments, R*F]) in values' dtype.
    """
    out, _ = segment_csr_fwd(indptr, values, reduce, vtype=vtype, needs_x_grad=False,
                             deterministic=deterministic)
    return out
