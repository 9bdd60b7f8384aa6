"""SpMM family: neighbour sum / mean with optional edge weights, and the GCN
normalisation.

Math (messages flow source j -> target i, edges e = (j -> i)):

    sum:   out[i] = sum_{e=(j->i)} w_e * x[j]
    mean:  out[i] = (1 / deg_in(i)) * sum_{e=(j->i)} w_e * x[j]      (0 if deg_in(i) = 0)

with w_e = 1 when no edge weight is given. The vector-Jacobian products are

    grad_x[j] = sum_{e=(j->i)} s_i * w_e * grad_out[i]     (SpMM over the transpose)
    grad_w[e] = s_i * <grad_out[i], x[j]>                  (SDDMM on the graph pattern)

with s_i = 1 (sum) or 1/deg_in(i) (mean). Both backward products read the
cached transpose or the CSR pattern: no floating-point atomics, so results
are bitwise repeatable.

Internally "mean" is a row scale 1/deg_in applied in the kernel's epilogue
(and a column scale in the backward pass), so no per-edge weights are built.

An optional bias b [F] is added to every output row in the kernel's store
(rows without in-edges get b), so `spmm(..., bias=b) == spmm(...) + b` with
no extra pass over the output; its gradient is the column sum of grad_out
(a fixed-order sum: bitwise repeatable).

Constant weights that are reused on every call (GCN's d_i d_j) can be given
as `CsrWeights`, stored once in the CSR order the forward kernel reads and
in the transpose's order the backward reads (`gcn_norm_weights`): no
permutation gather per call, and no column-scale gather per edge.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import blocksparse as _tc
from .._array import as_backend_array, backend_vtype, is_cupy, same_device
from ..backends import backend_for
from ..graph import Graph, _index_dtype, as_graph

REDUCES = ("sum", "mean")
PATHS = ("auto", "cusparse", "custom")


@dataclass(frozen=True)
class CsrWeights:
    """Constant per-edge weights of one graph in the orders the kernels read
    them: no permutation gather per call. They take no gradient.

    csr:        [E] in the graph's CSR order (the forward pass).
    transposed: [E] the same weights in `graph.transpose()`'s CSR order
                (the backward pass), i.e. csr[graph.transpose().edge_ids].
    Both in the compute dtype (float32, or float64 for float64 features).
    Built by `gcn_norm_weights`; or `CsrWeights.from_csr(graph, w_csr)`.
    """
    csr: object
    transposed: object

    @classmethod
    def from_csr(cls, graph, w_csr):
        """Weights [E] in graph's CSR order -> CsrWeights (one gather, now)."""
        return cls(w_csr, w_csr[graph.transpose().edge_ids])


@dataclass
class SpmmResiduals:
    """What `spmm_bwd` needs, and nothing else."""
    x: object                 # [num_src, F] features, kept only if grad of edge_weight is needed
    weight_csr: object        # [E] caller weights in CSR order (compute dtype), or None
    row_scale: object         # [num_dst] combined target-side scale (mean and caller's), or None
    col_scale: object         # [num_src] source-side scale, or None
    vtype: str
    path: str
    weight_dtype: object      # dtype of the caller's edge_weight (None if not given)
    deterministic: bool
    weight_t: object = None   # [E] weights in the transpose's order (CsrWeights), or None
    has_bias: bool = False    # the forward added a bias (its gradient is a column sum)
    tensor_cores: bool = False   # the forward ran the Tensor Core kernel (fastgnn.blocksparse)


def _weight_dtype_for(vtype):
    return np.float64 if vtype == "float64" else np.float32


def _inv_in_degree(graph: Graph, dtype):
    """[num_dst] 1/deg_in, 0 for empty rows (cached per dtype)."""
    def build():
        deg = graph.in_degree.astype(dtype)
        xp = graph.xp
        return xp.where(deg > 0, 1 / xp.maximum(deg, 1), 0).astype(dtype)
    return graph.cached(("inv_in_degree", np.dtype(dtype).name), build)


def _validate_scale(graph, scale, size, name, dtype):
    if scale is None:
        return None
    s = as_backend_array(scale, name)
    if s.ndim != 1 or s.shape[0] != size:
        raise ValueError(f"{name} must have shape [{size}], got {tuple(s.shape)}")
    if s.dtype.kind != "f":
        raise TypeError(f"{name} must be floating point, got {s.dtype}")
    if not same_device(s, graph.indices):
        raise ValueError(f"{name} lives on a different device than the graph ({graph.device})")
    return s.astype(dtype, copy=False)


def validate_features(graph: Graph, x, vtype, name="x", rows=None):
    x = as_backend_array(x, name)
    rows = graph.num_src if rows is None else rows
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape [num_nodes, F], got {tuple(x.shape)}")
    if x.shape[0] != rows:
        raise ValueError(f"{name} has {x.shape[0]} rows but the graph has {rows} source nodes")
    if not same_device(x, graph.indices):
        raise ValueError(f"{name} lives on {'GPU' if is_cupy(x) else 'CPU'} but the graph on "
                         f"{graph.device}; move one of them (Graph.to(device))")
    vt = backend_vtype(x, vtype, name)
    if is_cupy(x) and x.dtype.kind != "f" and vt != "bfloat16":
        raise TypeError(f"{name} must be floating point, got {x.dtype}")
    xp = graph.xp
    return xp.ascontiguousarray(x), vt


def validate_edge_weight(graph: Graph, edge_weight, name="edge_weight"):
    if edge_weight is None:
        return None
    w = as_backend_array(edge_weight, name)
    if w.ndim == 2 and w.shape[1] == 1:
        w = w[:, 0]
    if w.ndim != 1 or w.shape[0] != graph.num_edges:
        raise ValueError(f"{name} must have shape [E] = [{graph.num_edges}], got {tuple(w.shape)}")
    if w.dtype.kind != "f":
        raise TypeError(f"{name} must be floating point, got {w.dtype}")
    if not same_device(w, graph.indices):
        raise ValueError(f"{name} lives on a different device than the graph ({graph.device})")
    return w


def validate_bias(graph: Graph, bias, x, vtype, name="bias"):
    """bias [F] in x's dtype (bf16: 16-bit integers, as x), on the graph's device."""
    if bias is None:
        return None
    b = as_backend_array(bias, name)
    F = x.shape[1]
    if b.ndim != 1 or b.shape[0] != F:
        raise ValueError(f"{name} must have shape [F] = [{F}] (x's width), got {tuple(b.shape)}")
    bf16_bits = vtype == "bfloat16" and b.dtype.kind in "iu" and b.dtype.itemsize == 2
    if b.dtype != x.dtype and not bf16_bits:
        raise TypeError(f"{name} must have x's dtype ({vtype}: {x.dtype}), got {b.dtype}")
    if not same_device(b, graph.indices):
        raise ValueError(f"{name} lives on {'GPU' if is_cupy(b) else 'CPU'} but the graph on "
                         f"{graph.device}")
    return graph.xp.ascontiguousarray(b).view(x.dtype)


def _validate_csr_weights(graph: Graph, cw, dtype):
    if not isinstance(cw, CsrWeights):
        raise TypeError(f"csr_weights must be a CsrWeights, got {type(cw).__name__}")
    arrays = []
    for name in ("csr", "transposed"):
        a = getattr(cw, name)
        if a.ndim != 1 or a.shape[0] != graph.num_edges or not same_device(a, graph.indices):
            raise ValueError(f"csr_weights.{name} must have shape [E] = [{graph.num_edges}] "
                             f"on the graph's device ({graph.device}), got {tuple(a.shape)}")
        arrays.append(a.astype(dtype, copy=False))
    return arrays


def spmm_fwd(graph, x, edge_weight=None, reduce="sum", *, bias=None, row_scale=None,
             col_scale=None, csr_weights=None, vtype=None, path="auto", deterministic=True,
             needs_weight_grad=True, tensor_cores="auto", tf32=False):
    """Forward of `spmm`; returns (out [num_dst, F], SpmmResiduals).

    csr_weights: a CsrWeights of this graph, instead of edge_weight: constant
    weights already in the kernels' orders (no gradient)."""
    graph = as_graph(graph)
    if reduce not in REDUCES:
        raise ValueError(f"reduce must be one of {REDUCES}, got {reduce!r}")
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    x, vt = validate_features(graph, x, vtype)
    w = validate_edge_weight(graph, edge_weight)
    b = validate_bias(graph, bias, x, vt)
    wdt = _weight_dtype_for(vt)
    r = _validate_scale(graph, row_scale, graph.num_dst, "row_scale", wdt)
    c = _validate_scale(graph, col_scale, graph.num_src, "col_scale", wdt)
    if reduce == "mean":
        inv = _inv_in_degree(graph, wdt)
        r = inv if r is None else r * inv
    w_t = None
    if csr_weights is not None:
        if w is not None:
            raise ValueError("give edge_weight or csr_weights, not both")
        w_csr, w_t = _validate_csr_weights(graph, csr_weights, wdt)
    else:
        w_csr = None if w is None else graph.to_csr_order(w).astype(wdt, copy=False)
    # an explicit path keeps the CUDA-core kernels unless tensor_cores=True
    tc = _tc.spmm_path(graph, x, vt, _tc.check_option(tensor_cores) if path == "auto"
                       else tensor_cores is True, _tc.check_tf32(tf32))
    if tc:
        out = _tc.spmm(graph, x, vt, w_csr, r, c, b)
    else:
        out = backend_for(x).spmm(graph, x, w_csr, vt, path, deterministic, r, c, bias=b)
    keep_x = x if (w is not None and needs_weight_grad) else None
    res = SpmmResiduals(keep_x, w_csr, r, c, vt, path, None if w is None else w.dtype,
                        bool(deterministic), w_t, b is not None, tc)
    return out, res


def spmm_bwd(graph, res: SpmmResiduals, grad_out, needs_x_grad=True, needs_weight_grad=True,
             needs_bias_grad=True):
    """Backward of `spmm`: returns one gradient (or None) per input,
    (grad_x [num_src, F], grad_edge_weight [E], grad_bias [F]).

    grad_x = c * (A_w^T (r * grad_out)) runs the forward kernel on the cached
    transpose with the two scales swapped; grad_w[e] = r_i c_j <grad_out[i], x[j]>;
    grad_bias = sum_i grad_out[i] (a fixed-order column sum; fp32 accumulation
    for 16-bit types), None when the forward had no bias. Weights given as
    CsrWeights and scales take no gradient.
    """
    graph = as_graph(graph)
    g, _ = validate_features(graph, grad_out, res.vtype, name="grad_out", rows=graph.num_dst)
    be = backend_for(g)
    grad_x = grad_w = grad_b = None
    if needs_x_grad:
        t = graph.transpose()
        w_t = res.weight_t
        if w_t is None and res.weight_csr is not None:
            w_t = res.weight_csr[t.edge_ids]
        if res.tensor_cores and _tc.spmm_path(t, g, res.vtype, True, tf32=True):
            grad_x = _tc.spmm(t, g, res.vtype, w_t, res.col_scale, res.row_scale)
        else:
            grad_x = be.spmm(t, g, w_t, res.vtype, res.path, res.deterministic,
                             res.col_scale, res.row_scale)
    if needs_bias_grad and res.has_bias:
        grad_b = be.column_sums(g, res.vtype, graph.index_dtype)
    if needs_weight_grad and res.weight_dtype is not None:
        if res.x is None:
            raise ValueError("spmm_fwd was called with needs_weight_grad=False")
        dots = be.sddmm(graph, g, res.x, res.vtype)  # [E] CSR order, fp32/fp64
        if res.row_scale is not None:
            dots = dots * res.row_scale[graph.csr_rows]
        if res.col_scale is not None:
            dots = dots * res.col_scale[graph.indices]
        grad_w = graph.to_caller_order(dots).astype(res.weight_dtype, copy=False)
    return grad_x, grad_w, grad_b


def spmm(graph, x, edge_weight=None, reduce="sum", *, bias=None, row_scale=None, col_scale=None,
         csr_weights=None, vtype=None, path="auto", deterministic=True, tensor_cores="auto",
         tf32=False):
    """Neighbour aggregation by sparse-dense product:

        out[i] = s_i * r_i * sum_{e=(j->i)} w_e * c_j * x[j]  (+ b)

    graph:       fastgnn.Graph with num_src source and num_dst target nodes.
    x:           [num_src, F] float features (NumPy -> CPU, CuPy -> GPU; bf16
                 as 16-bit integers with vtype="bfloat16").
    edge_weight: [E] optional weights w in the caller's edge order (default 1).
    reduce:      "sum" (s = 1) or "mean" (s_i = 1/deg_in(i); empty rows give 0).
    bias:        [F] optional b in x's dtype, added to every output row inside
                 the kernel's store (a row without in-edges gets b); on the GPU
                 the custom kernel then serves every path.
    row_scale:   [num_dst] optional target-side factor r (default 1).
    col_scale:   [num_src] optional source-side factor c (default 1). With
                 r = c = deg^-1/2 this is GCN's normalisation, fused into the
                 kernel with no per-edge weights. Scales take no gradient.
    csr_weights: optional CsrWeights of this graph instead of edge_weight:
                 constant weights [E] already in CSR (and transpose) order,
                 e.g. GCN's d_i d_j from `gcn_norm_weights`.
    path:        GPU only: "auto" (time cuSPARSE and the custom kernel once per
                 graph, width and dtype, keep the faster), "cusparse" or "custom".
                 Scales are fused by the custom kernel only.
    deterministic: GPU only: True (default) keeps results bitwise repeatable
                 (no float atomics anywhere); False lets "auto" also consider
                 cuSPARSE algorithms that are not.
    tensor_cores: "auto" (default), True or False: the block-sparse Tensor
                 Core kernel (`fastgnn.blocksparse`: bf16/fp16 features, or
                 fp32 with tf32=True; F a multiple of 16; duplicate edges'
                 weights summed) where its fill rule says it is faster on
                 this graph; True forces it (ValueError where it cannot
                 serve), False keeps `path`; an explicit `path` other than
                 "auto" turns "auto" off. The backward's grad_x follows the
                 forward's choice.
    tf32:        False (default) or True: let fp32 features take the Tensor
                 Core kernel as TF32 (x and the weights rounded to 10
                 mantissa bits, fp32 sums; relative error about 2^-11).
    Returns [num_dst, F] in x's dtype (fp32 accumulation for 16-bit types).
    """
    out, _ = spmm_fwd(graph, x, edge_weight, reduce, bias=bias, row_scale=row_scale,
                      col_scale=col_scale, csr_weights=csr_weights, vtype=vtype, path=path,
                      deterministic=deterministic, needs_weight_grad=False,
                      tensor_cores=tensor_cores, tf32=tf32)
    return out


def column_sum(x, *, vtype=None):
    """Sum over the rows, the gradient of a bias added to every row:

        out[c] = sum_i x[i, c]

    x:     [N, F] float array (NumPy: float32/float64; CuPy: also float16 and
           bfloat16 as 16-bit integers with vtype="bfloat16").
    Returns [F] in x's dtype. A fixed summation order (GPU: blocks of rows,
    then level by level; CPU: row order in float64), so bitwise repeatable;
    fp32 accumulation for 16-bit types. On the GPU one streaming pass over
    x, about twice as fast as torch's `sum(0)` for N x 128 fp32 on an H200.
    """
    a = as_backend_array(x, "x")
    if a is None:
        raise TypeError("x must be an array of shape [N, F], got None")
    if a.ndim != 2:
        raise ValueError(f"x must have shape [N, F], got {tuple(a.shape)}")
    vt = backend_vtype(a, vtype, "x")
    if not a.flags.c_contiguous:
        a = a.copy()                      # C order (NumPy and CuPy)
    return backend_for(a).column_sums(a, vt)


# --------------------------------------------------------------- GCN norm
def gcn_norm(graph, edge_weight=None, *, add_self_loops=True, improved=False):
    """GCN normalisation (flow source -> target), PyG's `gcn_norm` for weighted
    graphs. (PyG 2.8 ignores `improved` when there are no edge weights; this
    function does not: its loops then weigh 2. fastgnn.torch.GCNConv follows PyG.)

    With add_self_loops, existing self-loops are replaced by one loop per node
    whose weight is the old loop's weight if there was one, else the fill value
    (2 if improved else 1). Then, with deg(i) = sum of weights into i,

        w'_e = deg(j)^-1/2 * w_e * deg(i)^-1/2      for e = (j -> i)   (0 where deg = 0)

    Returns (graph', w' [E'] in graph' caller order). The unweighted result is
    cached on the graph; graph' edge ids: kept original edges in their order,
    then the self-loops of nodes 0..n-1.
    """
    graph = as_graph(graph)
    if graph.num_src != graph.num_dst and add_self_loops:
        raise ValueError("gcn_norm with add_self_loops needs a square graph (num_src == num_dst)")
    w = validate_edge_weight(graph, edge_weight)
    if w is None:
        key = ("gcn_norm", add_self_loops, improved)
        return graph.cached(key, lambda: _gcn_norm(graph, None, add_self_loops, improved))
    return _gcn_norm(graph, w, add_self_loops, improved)


def gcn_norm_scales(graph, *, add_self_loops=True, dtype=np.float32):
    """GCN normalisation of an unweighted graph as two node vectors instead of
    per-edge weights: returns (graph', d) with d = deg'^-1/2 (0 where deg' = 0)
    over graph' (graph with self-loops as `gcn_norm` adds them, or graph), so

        spmm(graph', x, row_scale=d, col_scale=d) == spmm(*gcn_norm(graph), x)

    with every weight 1 (no `improved` fill). Cached on the graph; the kernel
    applies the scales on the fly, so no edge-sized array is read or built.
    """
    graph = as_graph(graph)

    def build():
        g2, d = _gcn_inv_sqrt_degree(graph, add_self_loops)
        return g2, d.astype(dtype)
    return graph.cached(("gcn_norm_scales", add_self_loops, np.dtype(dtype).name), build)


def gcn_norm_weights(graph, *, add_self_loops=True, dtype=np.float32):
    """GCN normalisation of an unweighted graph as constant per-edge weights in
    the kernels' orders: returns (graph', CsrWeights) with, for each edge
    e = (j -> i) of graph' (as in `gcn_norm_scales`),

        w_e = d_i * d_j,   d = deg'^-1/2 (0 where deg' = 0)

    (computed in float64, stored in dtype) in graph''s CSR order and in its
    transpose's order, so

        spmm(graph', x, csr_weights=w) == spmm(graph', x, row_scale=d, col_scale=d)

    up to rounding. The kernels then read one weight per edge in sequence
    instead of gathering d_j per edge (and no caller-order permutation is
    gathered per call as for edge_weight). Built once and cached on the graph
    (2 x E' x sizeof(dtype) bytes); builds graph'.transpose() too.
    """
    graph = as_graph(graph)

    def build():
        if is_cupy(graph.indptr) and np.dtype(dtype) in (np.float32, np.float64):
            from ..backends.cuda import graph_build
            _check_square(graph)
            g2 = self_loop_structure(graph)[0] if add_self_loops else graph
            t = g2.transpose()
            return g2, CsrWeights(*graph_build.gcn_norm_weights(g2.indptr, g2.indices,
                                                                t.indptr, t.indices, dtype))
        g2, d = _gcn_inv_sqrt_degree(graph, add_self_loops)
        w = (d[g2.csr_rows] * d[g2.indices]).astype(dtype)
        return g2, CsrWeights.from_csr(g2, w)
    return graph.cached(("gcn_norm_weights", add_self_loops, np.dtype(dtype).name), build)


def _check_square(graph):
    if graph.num_src != graph.num_dst:
        raise ValueError("GCN normalisation needs a square graph (num_src == num_dst)")


def _gcn_inv_sqrt_degree(graph, add_self_loops):
    """(graph', d [num_nodes] float64): graph with self-loops as `gcn_norm`
    adds them (or graph) and deg'^-1/2 over it, 0 where deg' = 0."""
    _check_square(graph)
    g2 = self_loop_structure(graph)[0] if add_self_loops else graph
    deg = g2.in_degree.astype(np.float64)
    xp = g2.xp
    return g2, xp.where(deg > 0, 1 / xp.sqrt(xp.maximum(deg, 1)), 0)


def self_loop_structure(graph: Graph):
    """(graph with one self-loop per node, kept [E_kept] original edge ids,
    last_loop_edge [n] caller id of each node's last existing self-loop or -1).
    Cached.

    The graph is that of PyG's add_remaining_self_loops edge list (the
    non-loop edges in caller order, then loops 0..n-1), built in CSR order
    without a sort: row i holds its non-loop edges in their order, then the
    loop (i -> i). A non-loop edge at CSR position p of row i moves to
    p - L(p) + i, L(p) the loops before p; its new id is its caller id less
    the loops before it in caller order; loop i's id is E_kept + i."""
    def build():
        xp = graph.xp
        n, E = graph.num_dst, graph.num_edges
        num_loops = graph.num_self_loops
        E_kept = E - num_loops
        idx = _index_dtype(E_kept + n, n)
        if is_cupy(graph.indptr) and np.dtype(idx) == np.dtype(graph.index_dtype):
            from ..backends.cuda import graph_build
            indptr, indices, ids, kept, last = graph_build.self_loop_structure(
                graph.indptr, graph.indices, graph.edge_ids, num_loops)
            g2 = Graph(indptr, indices, ids, graph.num_src, n)
            return g2.with_visit_order_of(graph), kept, last
        rows = graph.csr_rows.astype(np.int64)
        if num_loops == 0:
            return _loops_appended(graph, rows, idx)
        loop_csr = graph.indices.astype(np.int64) == rows          # [E] CSR order
        loops_upto = xp.cumsum(loop_csr)                            # loops at or before p
        ids = (xp.arange(E, dtype=np.int64) if graph.edge_ids is None
               else graph.edge_ids.astype(np.int64))               # caller id per position
        loop_caller = xp.zeros(E, dtype=bool)
        loop_caller[ids] = loop_csr
        rank = xp.cumsum(~loop_caller) - 1                           # [E] rank among kept
        kept = xp.searchsorted(rank, xp.arange(E_kept), side="left")
        # the new CSR: kept edges moved down past the loops before them, a loop per row
        indptr = graph.indptr.astype(np.int64)
        L_row = xp.concatenate([xp.zeros(1, dtype=np.int64), loops_upto])[indptr]
        new_indptr = indptr - L_row + xp.arange(n + 1, dtype=np.int64)
        # the CSR positions of the kept edges, where the count of kept edges up to
        # p (p + 1 - loops_upto) steps (index arrays, not boolean masks: a mask's
        # result size would cost a copy to the host per use); a kept edge has
        # L(p) = loops_upto[p]
        kept_upto = xp.arange(1, E + 1, dtype=np.int64) - loops_upto
        kept_pos = xp.searchsorted(kept_upto, xp.arange(1, E_kept + 1), side="left")
        new_pos = kept_pos - loops_upto[kept_pos] + rows[kept_pos]
        indices = xp.empty(E_kept + n, dtype=idx)
        edge_ids = xp.empty(E_kept + n, dtype=idx)
        indices[new_pos] = graph.indices[kept_pos]
        edge_ids[new_pos] = rank[ids[kept_pos]].astype(idx)
        nodes = xp.arange(n, dtype=np.int64)
        indices[new_indptr[1:] - 1] = nodes.astype(idx)
        edge_ids[new_indptr[1:] - 1] = (E_kept + nodes).astype(idx)
        # a node's last loop wins, as PyG's scatter assignment does on CPU: a row's
        # loops keep their caller order in CSR order, so its last is the position
        # where the running loop count reaches the count at the row's end
        has_loop = L_row[1:] > L_row[:-1]
        q = xp.minimum(xp.searchsorted(loops_upto, L_row[1:], side="left"),
                       max(E - 1, 0))
        last = xp.where(has_loop, ids[q] if E else 0, -1).astype(np.int64)
        g2 = Graph(new_indptr.astype(idx), indices, edge_ids, graph.num_src, n)
        return g2.with_visit_order_of(graph), kept, last
    return graph.cached("self_loop_structure", build)


def _loops_appended(graph, rows, idx):
    """self_loop_structure of a graph without self-loops: every edge kept, at
    CSR position p + row, and each row's loop after its edges (ids E + i)."""
    xp = graph.xp
    n, E = graph.num_dst, graph.num_edges
    new_indptr = graph.indptr.astype(np.int64) + xp.arange(n + 1, dtype=np.int64)
    new_pos = xp.arange(E, dtype=np.int64) + rows
    indices = xp.empty(E + n, dtype=idx)
    edge_ids = xp.empty(E + n, dtype=idx)
    indices[new_pos] = graph.indices
    edge_ids[new_pos] = (xp.arange(E, dtype=idx) if graph.edge_ids is None
                         else graph.edge_ids.astype(idx))
    loops = new_indptr[1:] - 1
    nodes = xp.arange(n, dtype=idx)
    indices[loops] = nodes
    edge_ids[loops] = nodes + idx(E)
    g2 = Graph(new_indptr.astype(idx), indices, edge_ids, graph.num_src, n)
    return (g2.with_visit_order_of(graph), xp.arange(E, dtype=np.int64),
            xp.full(n, -1, dtype=np.int64))


def _gcn_norm(graph, w, add_self_loops, improved):
    xp = graph.xp
    wdt = np.float32 if w is None else w.dtype
    if add_self_loops:
        g2, kept, last = self_loop_structure(graph)
        fill = 2.0 if improved else 1.0
        if w is None:
            loop_w = xp.where(last >= 0, 1.0, fill).astype(wdt)
            w2 = xp.concatenate([xp.ones(kept.shape[0], dtype=wdt), loop_w])
        else:
            loop_w = xp.where(last >= 0, w[xp.maximum(last, 0)], xp.asarray(fill, dtype=wdt))
            w2 = xp.concatenate([w[kept], loop_w.astype(wdt)])
    else:
        g2 = graph
        w2 = xp.ones(graph.num_edges, dtype=wdt) if w is None else w
    ei = g2.edge_index()
    # deg by a float64 segment sum over each CSR row (fixed order, no atomics; a
    # NaN or inf weight stays in its own row, as in PyG)
    rows = Graph(g2.indptr, xp.arange(g2.num_edges, dtype=g2.index_dtype), None,
                 g2.num_edges, g2.num_dst)          # row i <- its own edges' positions
    w_csr = xp.ascontiguousarray(g2.to_csr_order(w2).astype(np.float64).reshape(-1, 1))
    deg = backend_for(w_csr).segment_fwd(rows, w_csr, ("sum",), "float64",
                                         residuals=False)[0][:, 0].astype(wdt)
    with np.errstate(divide="ignore", invalid="ignore"):   # (NaN and inf stay, as in PyG)
        dis = xp.where(deg == 0, 0, deg ** -0.5).astype(wdt)  # negative deg -> NaN, as PyG
        norm = dis[ei[0]] * w2 * dis[ei[1]]
    return g2, norm
