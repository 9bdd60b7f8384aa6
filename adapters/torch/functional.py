"""Functional PyTorch API: differentiable fastgnn ops on torch tensors."""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

import fastgnn
from fastgnn.ops.segment import segment_csr_bwd, segment_csr_fwd, segment_reduce_bwd, segment_reduce_fwd
from fastgnn.graph import Graph
from fastgnn.ops.spmm import self_loop_structure, spmm_bwd, spmm_fwd

from ._autograd import (Op, _backward, _forward, _torch_stream_ptr, apply, device_scope, to_array,
                        to_tensor)
from . import cpu_plans, custom_ops, plans
from .gemm import g_w, tf32_allowed, x_wt
from .graph_cache import _is_edge_index_type, graph_input, is_dgl_graph, resolve

__all__ = ["spmm", "gcn_norm", "segment_reduce", "segment_reduce_linear", "segment_csr",
           "add_bias", "bias_grad", "SPMM",
           "SEGMENT_REDUCE", "SEGMENT_CSR"]


# ------------------------------------------------------------------- bias
# The bias gradient of a contiguous fp32 CUDA cotangent g [N, F] is the
# matrix-vector product g^T 1 (cuBLAS SGEMV, reading g once; the ones vector
# is cached per device and stream): on an H200, F = 128, it takes 0.033 ms at
# N = 2^17 and 0.136 ms at 2^20 against torch's g.sum(0) 0.130 / 0.298 ms and
# fastgnn.column_sum's 0.124 / 0.146 ms, at 17 us of host time (column_sum:
# 100 us; benchmarks/dev/probe_bias_grad.py). Layers reach
# it through their fused autograd nodes (FUSED_MIN_NUMEL below); smaller
# inputs run torch's Linear, whose backward sums with g.sum(0). Only while
# TF32 is off for matmuls (torch's default): a TF32 GEMV would round g to 10
# mantissa bits. 16-bit types stay on the sum paths below (cuBLAS may reduce
# their split-K partials in 16 bits: torch's allow_*_reduced_precision_reduction).
_ones: dict = {}   # (device index, stream, dtype) -> a ones vector, grown as needed
# Smallest 16-bit (or TF32-mode fp32, or fp64) gradient [N, F] (elements)
# whose bias gradient goes through fastgnn.column_sum on CUDA. The streaming
# pass saves GPU time in
# proportion to the size (N = 2^20, F = 128 fp32 on an H200: 0.16 ms against
# torch's sum(0) 0.30 ms) but costs ~60 us more host
# time (device scope, DLPack, two launches), which is what a small graph's
# call is made of: it breaks even around 2^25 elements.
COLUMN_SUM_MIN_NUMEL = 1 << 25
# Smallest input [N, F] (elements) for which the layers use their fused
# Python autograd Functions (add_bias, nn.shared_input_linears). Each saves
# one read-read-write pass over [N, F] (12 N F bytes in fp32: 0.15 ms at
# 2^25.5 elements on an H200), and each Python node in a CUDA backward costs
# 0.1-0.4 ms of host time: autograd runs it on its device thread, another
# core, where Python and the torch calls around it run up to 2x slower
# (benchmarks/dev/probe_backward_handoff.py). Below this size the
# plain torch ops (C++ autograd nodes) run instead. Tests set it to 0.
FUSED_MIN_NUMEL = 1 << 25
_COLUMN_SUM_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _ones_vector(device: torch.device, dtype: torch.dtype, n: int) -> torch.Tensor:
    """[n] ones on `device` (a view of a vector cached per stream, so that a
    grown one is freed only behind the kernels of its own stream; callers
    skip it during a CUDA graph capture, whose memory would be the graph's).
    Inside a custom op's kernel (a compiled program, maybe in a CUDA graph
    tree's pool) the vector is made per call and not cached."""
    if custom_ops.in_kernel():
        return torch.ones(n, device=device, dtype=dtype)
    key = (device.index, _torch_stream_ptr(device.index), dtype)
    ones = _ones.get(key)
    if ones is None or ones.shape[0] < n:
        if len(_ones) > 64:                     # streams come and go; keep this small
            _ones.clear()
        ones = _ones[key] = torch.ones(n, device=device, dtype=dtype)
    return ones[:n]


def bias_grad(g: torch.Tensor) -> torch.Tensor:
    """[F] gradient of a bias added to every row of an output with cotangent
    g [N, F]: sum_i g[i]. Contiguous fp32 CUDA tensors with TF32 off: the
    GEMV g^T 1 (cuBLAS, fixed order); other large contiguous CUDA tensors:
    `fastgnn.column_sum` (fixed order, fp32 accumulation for 16-bit types);
    otherwise, and when building a graph for double backward, torch's g.sum(0)."""
    if (not g.is_cuda or g.dim() != 2 or not g.is_contiguous()
            or (torch.is_grad_enabled() and g.requires_grad)):
        return g.sum(0)
    if (g.dtype == torch.float32 and not tf32_allowed()
            and not torch.cuda.is_current_stream_capturing()):
        return torch.mv(g.t(), _ones_vector(g.device, g.dtype, g.shape[0]))
    if g.numel() < COLUMN_SUM_MIN_NUMEL or g.dtype not in _COLUMN_SUM_DTYPES:
        return g.sum(0)
    with device_scope(g.device):
        bf16 = g.dtype == torch.bfloat16
        s = fastgnn.column_sum(to_array(g), vtype="bfloat16" if bf16 else None)
        return to_tensor(s, bf16)


class _AddBias(torch.autograd.Function):
    """out = x + b for x [N, F], b [F]; b's gradient through `bias_grad`."""

    @staticmethod
    def forward(ctx, x, b):
        return x + b

    @staticmethod
    def backward(ctx, g):
        gb = bias_grad(g) if ctx.needs_input_grad[1] else None
        return g, gb


def add_bias(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x [N, F] + b [F] (broadcast over rows), with the bias gradient of
    `bias_grad`; other shapes, x below FUSED_MIN_NUMEL and compiled programs
    fall back to x + b."""
    if (x.dim() != 2 or b.dim() != 1 or b.shape[0] != x.shape[1] or b.dtype != x.dtype
            or x.numel() < FUSED_MIN_NUMEL or custom_ops.compiling()):
        return x + b
    return _AddBias.apply(x, b)


def _spmm_fwd(graph, x, edge_weight, bias, **static):
    # fp32 may take the Tensor Core kernel as TF32 where torch lets matmuls
    return spmm_fwd(graph, x, edge_weight, bias=bias, **static, tf32=tf32_allowed())


SPMM = Op("spmm", _spmm_fwd, spmm_bwd, inputs=("x", "edge_weight", "bias"),
          features=("x", "bias"), fwd_flags={"needs_weight_grad": "edge_weight"},
          bwd_flags={"needs_x_grad": "x", "needs_weight_grad": "edge_weight",
                     "needs_bias_grad": "bias"}, cuda=plans.SPMM,
          cpu=cpu_plans.SPMM)


def _rows(x):
    return int(x.shape[0]) if isinstance(x, torch.Tensor) and x.dim() == 2 else None


def _node_sizes(edge_index_or_graph, x, num_nodes):
    """num_nodes for `resolve`: the caller's, else x.size(0) sources and as
    many targets, unless the input carries its own target count (a sparse
    adj_t's rows, an EdgeIndex's sparse_size()[1], a DGLGraph's destination
    nodes), which then stands."""
    if num_nodes is not None:
        return num_nodes
    adj = edge_index_or_graph
    own = is_dgl_graph(adj) or isinstance(adj, torch.Tensor) and (
        adj.layout != torch.strided
        or (_is_edge_index_type(adj) and adj.sparse_size()[1] is not None))
    return (_rows(x), None) if own else _rows(x)


def _resolve_for(edge_index_or_graph, x, num_nodes):
    """(graph, adj_t values or None) for node features x [N, F]: a square
    graph of x.size(0) nodes unless num_nodes or the input's own target count
    says otherwise (`_node_sizes`)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if type(edge_index_or_graph) is Graph and not custom_ops.compiling():
        return edge_index_or_graph, None        # (resolve's answer, without the sizes)
    return resolve(edge_index_or_graph, _node_sizes(edge_index_or_graph, x, num_nodes))


def spmm(edge_index_or_graph, x, edge_weight=None, reduce="sum", num_nodes=None, path="auto",
         *, row_scale=None, col_scale=None, bias=None, csr_weights=None):
    r"""Neighbour aggregation `out = A_w @ x (+ bias)`, differentiable in x,
    edge_weight and bias.

    Messages flow source j -> target i along each edge e = (j -> i):

        sum:   out[i] = sum_{e=(j->i)} w_e x[j]  (+ b)
        mean:  out[i] = 1/deg_in(i) * sum_{e=(j->i)} w_e x[j]  (+ b)    (0 (+ b) for deg_in(i) = 0)
        max:   out[i] = max_{e=(j->i)} w_e x[j]  (+ b)                   (0 (+ b) for deg_in(i) = 0)
        min:   likewise with min

    with w_e = 1 when no weight is given (torch_geometric.utils.spmm's four
    reductions; max/min send the gradient to one winner per (row, feature),
    as `segment_reduce`).

    edge_index_or_graph: [2, E] integer tensor (row 0 sources, row 1 targets),
                 PyG EdgeIndex (read as an edge_index, so it is the transpose
                 of the matrix torch_geometric.utils.spmm reads from it),
                 torch sparse adj_t [num_dst, num_src] (its values are the
                 weights), DGLGraph (edges in DGL's order) or fastgnn.Graph;
                 the others are turned into a Graph once and cached
                 (`fastgnn.torch.to_graph`).
    x:           [num_src, F] float tensor (float32/float64 on CPU; also
                 float16/bfloat16 on CUDA), on the graph's device.
    edge_weight: [E] optional float tensor in edge_index's column order
                 (must be None for a sparse adj_t).
    reduce:      "sum", "mean", "max" or "min". Weighted max/min build the
                 messages w_e x[j] per edge ([E, F]); unweighted ones do not.
    num_nodes:   None (x.size(0) sources; as many targets, or a sparse adj_t's
                 rows, or an EdgeIndex's sparse_size()[1] when it has one), an
                 int (square), or (num_src, num_dst) for a bipartite graph.
    path:        GPU kernel choice for sum/mean: "auto", "cusparse" or "custom".
    row_scale, col_scale: optional [num_dst] / [num_src] factors r, c fused into
                 the kernel: out[i] = r_i * (...) with x[j] scaled by c_j
                 (constants: they take no gradient; sum/mean only, as is
                 csr_weights).
    bias:        optional [F] tensor b in x's dtype (may require grad), added to
                 every output row inside the kernel's store (no extra pass);
                 grad_bias is a fixed-order column sum of grad_out.
    csr_weights: optional fastgnn.CsrWeights of the graph instead of
                 edge_weight: constant weights already in the kernels' orders
                 (e.g. `fastgnn.gcn_norm_weights`); they take no gradient.
    Returns [num_dst, F] in x's dtype.
    """
    if custom_ops.compiling():
        if csr_weights is not None:
            raise NotImplementedError(
                "spmm(csr_weights=...) under torch.compile: precomputed CsrWeights cannot "
                "enter a compiled program; pass edge_weight (GCNConv builds its weights "
                "inside its op)")
        ei, sizes = graph_input(edge_index_or_graph, _node_sizes(edge_index_or_graph, x, num_nodes))
        return custom_ops.call("spmm", ei, x, edge_weight, bias, row_scale, col_scale,
                               num_nodes=sizes, reduce=reduce, path=path)
    graph, adj_w = _resolve_for(edge_index_or_graph, x, num_nodes)
    if adj_w is not None:
        if edge_weight is not None or csr_weights is not None:
            raise ValueError("edge_weight and csr_weights must be None when the graph is a "
                             "sparse adj_t: its values are the edge weights")
        edge_weight = adj_w
    if reduce in ("max", "min"):
        if row_scale is not None or col_scale is not None or csr_weights is not None:
            raise ValueError(f"spmm(reduce={reduce!r}) takes no row_scale, col_scale or "
                             "csr_weights (they scale sums)")
        out = _neighbour_extreme(graph, x, edge_weight, reduce)
        return out if bias is None else out + bias
    static = {k: (v.detach() if isinstance(v, torch.Tensor) else v)
              for k, v in (("row_scale", row_scale), ("col_scale", col_scale)) if v is not None}
    if csr_weights is not None:
        static["csr_weights"] = csr_weights
    return apply(SPMM, graph, x, edge_weight, bias, reduce=reduce, path=path, **static)


def _neighbour_extreme(graph, x, edge_weight, reduce):
    """max/min over each target's in-edges of w_e x[j] (0 for a target
    without in-edges), as torch_geometric.utils.spmm. Unweighted, it is the
    segment reduction (gather fused, nothing per edge); weighted, the
    messages w_e x[j] are made per edge in CSR order ([E, F]) and reduced by
    `segment_csr`, as the kernels take no weights."""
    if edge_weight is None:
        return apply(SEGMENT_REDUCE, graph, x, reduce=reduce, deterministic=True)
    if not isinstance(edge_weight, torch.Tensor):
        raise TypeError(f"edge_weight must be a torch.Tensor, got {type(edge_weight).__name__}")
    if tuple(edge_weight.shape) != (graph.num_edges,):
        raise ValueError(f"edge_weight must have shape [E] = [{graph.num_edges}], "
                         f"got {tuple(edge_weight.shape)}")
    if x.dim() != 2 or x.shape[0] != graph.num_src:
        raise ValueError(f"x must have shape [num_src, F] = [{graph.num_src}, F], "
                         f"got {tuple(x.shape)}")
    indptr, sources, edge_ids = _csr_tensors(graph)
    w = edge_weight if edge_ids is None else edge_weight[edge_ids]
    return segment_csr(indptr, x[sources] * w.to(x.dtype).unsqueeze(1), reduce)


def _csr_tensors(graph):
    """(indptr, source per CSR position, caller edge id per CSR position or
    None) of the graph as int64 tensors on its device (cached)."""
    def build():
        ids = None if graph.edge_ids is None else _torch(graph.edge_ids).long()
        return _torch(graph.indptr).long(), _torch(graph.indices).long(), ids
    return graph.cached(("fastgnn.torch", "csr_tensors"), build)


# ------------------------------------------------------------ reductions
def _segment_reduce_bwd(graph, res, grad_out, addend=None, out=None):
    return (segment_reduce_bwd(graph, res, grad_out, addend=addend, out=out),)


def _segment_csr_fwd(_graph, ptr, src, **kw):
    return segment_csr_fwd(ptr, src, **kw)


def _segment_csr_bwd(_graph, res, grad_out):
    # the CSR Graph built in the forward holds the offsets; ptr takes no gradient
    return None, segment_csr_bwd(res.graph.indptr, res, grad_out)


SEGMENT_REDUCE = Op("segment_reduce", segment_reduce_fwd, _segment_reduce_bwd, inputs=("x",),
                    features=("x",), fwd_flags={"needs_x_grad": "x"}, cuda=plans.SEGMENT_REDUCE,
                    cpu=cpu_plans.SEGMENT_REDUCE)
SEGMENT_CSR = Op("segment_csr", _segment_csr_fwd, _segment_csr_bwd, inputs=("ptr", "src"),
                 features=("src",), fwd_flags={"needs_x_grad": "src"})


def _reduce_arg(reduce):
    """PyG spells sum "add": accept it (alone or in a list); the core validates the rest."""
    if isinstance(reduce, str):
        return "sum" if reduce == "add" else reduce
    if isinstance(reduce, (list, tuple)):
        return ["sum" if r == "add" else r for r in reduce]
    return reduce


def segment_reduce(edge_index_or_graph, x, reduce="sum", num_nodes=None, *,
                   deterministic=True):
    r"""Neighbour reductions, differentiable in x (gather fused: no per-edge tensor).

    Messages flow source j -> target i along each edge e = (j -> i), d_i = deg_in(i):

        sum:  out[i] = sum_e x[j]                 mean: out[i] = (1/d_i) sum_e x[j]
        max:  out[i] = max_e x[j]                 min:  out[i] = min_e x[j]
        var:  out[i] = mean_e x[j]^2 - (mean_e x[j])^2           (PyG VarAggregation)
        std:  out[i] = sqrt(max(var_i, 1e-5)), set to 0 where <= sqrt(1e-5)
                                                                  (PyG StdAggregation)
        mul:  out[i] = prod_e x[j]                                (PyG MulAggregation)

    per feature; a target without in-edges gets 0 from every reduction but mul
    (1, as PyG). Mul's gradient is torch's prod gradient. Max/min
    send the gradient to one winner per (row, feature): the first of tied
    edges in caller order (PyG splits it evenly among ties; the two differ
    only when distinct sources tie exactly).

    edge_index_or_graph: [2, E] integer tensor (row 0 sources, row 1 targets),
                 PyG EdgeIndex, unweighted torch sparse adj_t [num_dst, num_src],
                 DGLGraph or fastgnn.Graph (cached as in `spmm`).
    x:           [num_src, F] float tensor (float32/float64 on CPU; also
                 float16/bfloat16 on CUDA), on the graph's device.
    reduce:      "sum" (or "add"), "mean", "max", "min", "var", "std", "mul", or a
                 list of distinct ones, computed in one pass over the neighbours.
    num_nodes:   as in `spmm` (None: x.size(0) sources and as many targets,
                 unless a sparse adj_t or an EdgeIndex gives its own).
    deterministic: True (default) keeps the backward bitwise repeatable (no
                 float atomics). False (CUDA only; ignored on the CPU) adds the
                 max/min gradients with float atomics, one per (target,
                 feature), instead of walking the transpose: faster, last
                 bits vary. No effect on the forward, nor on sum/mean/var/std.
    Returns [num_dst, F] for a single str, else [num_dst, R*F] with block r
    = reduce[r] (PyG MultiAggregation mode="cat" order), in x's dtype.
    """
    if custom_ops.compiling():
        ei, sizes = graph_input(edge_index_or_graph, _rows(x) if num_nodes is None else num_nodes)
        return custom_ops.call("segment_reduce", ei, x, num_nodes=sizes,
                               reduce=_reduce_arg(reduce), deterministic=deterministic)
    graph, adj_w = _resolve_for(edge_index_or_graph, x, num_nodes)
    if adj_w is not None:
        raise ValueError("segment_reduce takes no edge weights, but the sparse adj_t has values "
                         "other than 1; pass an edge_index, a fastgnn.Graph or an adj_t of ones")
    return apply(SEGMENT_REDUCE, graph, x, reduce=_reduce_arg(reduce),
                 deterministic=deterministic)


def _project(agg, w, b, root, w_root):
    """agg W^T (+ b) (+ root W_r^T): the root product accumulated into the
    first GEMM's fresh output (addmm_, beta = 1)."""
    out = F.linear(agg, w, b) if b is not None else x_wt(agg, w)
    if w_root is not None:
        out.addmm_(root, w_root.t())
    return out


class _SegmentReduceLinear(torch.autograd.Function):
    """out = segment_reduce(x) W^T (+ b) (+ r W_r^T) as one autograd node,
    r = x_root, or x itself when x_root is None (see `segment_reduce_linear`).

    forward(ctx, graph, static, x, W, b, W_r, x_root); b, W_r, x_root may be None."""

    @staticmethod
    def forward(ctx, graph, static, x, w, b, w_root, x_root):
        needs = ctx.needs_input_grad
        # (on CUDA: the reduction's launch plans on torch buffers, see plans.py)
        (agg,), _, res, bf16, device = _forward(SEGMENT_REDUCE, graph, static, (x,),
                                                {"x": needs[2]})
        out = _project(agg, w, b, x if x_root is None else x_root, w_root)
        ctx.set_materialize_grads(False)
        # x stays saved as the residuals may alias it (version check, as
        # FastgnnFunction); agg only for W's gradient
        ctx.save_for_backward(x, agg if needs[3] else None, w, w_root, x_root)
        ctx.graph, ctx.res, ctx.bf16, ctx.device = graph, (res if needs[2] else None), bf16, device
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        if g is None:
            return (None,) * 7
        x, agg, w, w_root, x_root = ctx.saved_tensors
        needs = ctx.needs_input_grad
        root = x if x_root is None else x_root
        gw = g.t().mm(agg) if needs[3] else None
        gb = bias_grad(g) if needs[4] else None
        gw_root = g.t().mm(root) if w_root is not None and needs[5] else None
        # the root term's input gradient g W_r: x_root's, or added to x's
        # inside the segment backward (its addend: no separate add pass)
        wants_root = w_root is not None and (needs[6] if x_root is not None else needs[2])
        g_root = g_w(g, w_root) if wants_root else None
        gx = g_root if x_root is None else None
        if needs[2]:
            # in place: g_root's buffer becomes x's gradient (one [N, F] less at the peak)
            gx, = _backward(SEGMENT_REDUCE, ctx.graph, ctx.res, ctx.device, ctx.bf16,
                            [x.dtype], {"x": True}, (g_w(g, w),), {"addend": gx, "out": gx})
        gx_root = g_root if x_root is not None else None
        return None, None, gx, gw, gb, gw_root, gx_root


def segment_reduce_linear(edge_index_or_graph, x, reduce, weight, bias=None, root_weight=None,
                          x_root=None, num_nodes=None, *, deterministic=True):
    r"""A neighbour reduction followed by a linear map, plus an optional root
    term, differentiable in every tensor (GraphSAGE's layer with max, min,
    var, std, mul or several aggregations):

        out[i] = W a_i + b + W_r r_i,   a_i = reduce_{e=(j->i)} x[j]  (`segment_reduce`)

    with r = x_root, or x itself when x_root is None (a square graph). One
    autograd node: its backward feeds x's two gradients, W^T g through the
    reduction's transpose walk and W_r^T g, into one store (the walk's
    addend) instead of adding them in a separate pass, and runs the weight
    and bias gradients (g^T a, g^T r, sum_i g_i) itself.

    x:           [num_src, F] float tensor (as in `segment_reduce`).
    reduce:      as in `segment_reduce` (a str or a list of distinct ones).
    weight:      [M, R*F] (R reductions), bias [M] or None, in x's dtype.
    root_weight: [M, F_r] or None; x_root [num_dst, F_r] or None (then x is
                 the root input, and the graph must be square).
    num_nodes, deterministic: as in `segment_reduce`.
    Returns [num_dst, M] in x's dtype.
    """
    if custom_ops.compiling():
        ei, sizes = graph_input(edge_index_or_graph, _rows(x) if num_nodes is None else num_nodes)
        return custom_ops.call("segment_reduce_linear", ei, x, weight, bias, root_weight, x_root,
                               num_nodes=sizes, reduce=_reduce_arg(reduce),
                               deterministic=deterministic)
    graph, adj_w = _resolve_for(edge_index_or_graph, x, num_nodes)
    if adj_w is not None:
        raise ValueError("segment_reduce_linear takes no edge weights, but the sparse adj_t has "
                         "values other than 1; pass an edge_index, a fastgnn.Graph or an adj_t "
                         "of ones")
    for name, t in (("weight", weight), ("bias", bias), ("root_weight", root_weight),
                    ("x_root", x_root)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t is not None and t.dtype != x.dtype:
            raise TypeError(f"{name} must have x's dtype {x.dtype}, got {t.dtype}")
    if x.dim() != 2:
        raise ValueError(f"x must have shape [num_src, F], got {tuple(x.shape)}")
    reduce = _reduce_arg(reduce)
    width = (1 if isinstance(reduce, str) else len(reduce)) * x.shape[1]
    if weight is None or weight.dim() != 2 or weight.shape[1] != width:
        raise ValueError(f"weight must have shape [M, R*F] = [M, {width}] (R reductions of x's "
                         f"F features), got {None if weight is None else tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must have shape [{weight.shape[0]}], got {tuple(bias.shape)}")
    if x_root is not None and root_weight is None:
        raise ValueError("x_root was given without root_weight")
    if root_weight is not None:
        r_rows = graph.num_dst if x_root is not None else graph.num_src
        r = x if x_root is None else x_root
        if x_root is None and graph.num_src != graph.num_dst:
            raise ValueError(f"without x_root the graph must be square (it has "
                             f"{graph.num_src} sources, {graph.num_dst} targets)")
        if r.dim() != 2 or r.shape[0] != r_rows:
            raise ValueError(f"x_root must have shape [num_dst, F_r] = [{r_rows}, *], "
                             f"got {tuple(r.shape)}")
        if root_weight.dim() != 2 or tuple(root_weight.shape) != (weight.shape[0], r.shape[1]):
            raise ValueError(f"root_weight must have shape [{weight.shape[0]}, {r.shape[1]}], "
                             f"got {tuple(root_weight.shape)}")
    static = {"reduce": reduce, "deterministic": deterministic}
    tensors = (x, weight, bias, root_weight, x_root)
    if not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)):
        agg = apply(SEGMENT_REDUCE, graph, x, **static)
        return _project(agg, weight, bias, x if x_root is None else x_root, root_weight)
    return _SegmentReduceLinear.apply(graph, static, *tensors)


def segment_csr(ptr, src, reduce="sum", *, deterministic=True):
    r"""Reductions of per-row values over CSR segments (torch_scatter's `segment_csr`),
    differentiable in src:

        out[i] = reduce_{ptr[i] <= e < ptr[i+1]} src[e]

    with the reductions of `segment_reduce` (sum/add, mean, max, min, var, std,
    or a list of them); empty segments give 0.

    ptr:    [S + 1] integer tensor, non-decreasing from 0 to E, on src's device.
    src:    [E] or [E, *] float tensor (trailing dimensions are reduced independently).
    reduce: a str, or a list of distinct reductions (then src must be [E, F]).
    deterministic: as in `segment_reduce` (False: atomic max/min backward on CUDA).
    Returns [S, *] for a str (the trailing shape of src), [S, R*F] for a list
    (block r = reduce[r]), in src's dtype.
    """
    if custom_ops.compiling():
        return custom_ops.call("segment_csr", None, ptr, src, reduce=_reduce_arg(reduce),
                               deterministic=deterministic)
    for name, t in (("ptr", ptr), ("src", src)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if src.dim() < 1:
        raise ValueError(f"src must have shape [E] or [E, *], got {tuple(src.shape)}")
    reduce = _reduce_arg(reduce)
    if not isinstance(reduce, str) and src.dim() != 2:
        raise ValueError(f"src must have shape [E, F] for a list of reductions, "
                         f"got {tuple(src.shape)}")
    if ptr.dtype.is_floating_point or ptr.dtype.is_complex or ptr.dtype == torch.bool:
        raise TypeError(f"ptr must hold integers, got dtype {ptr.dtype}")
    if ptr.device != src.device:
        raise ValueError(f"ptr is on {ptr.device} but src on {src.device}")
    rest = tuple(src.shape[1:])
    flat = src.reshape(src.shape[0], math.prod(rest)) if src.dim() != 2 else src
    out = apply(SEGMENT_CSR, None, ptr, flat, reduce=reduce, deterministic=deterministic)
    return out.reshape(out.shape[0], *rest) if src.dim() != 2 else out


# ---------------------------------------------------------------- GCN norm
def _torch(a):
    return to_tensor(a)


def _cached_edge_index(graph):
    """[2, E] int64 tensor of the graph's edges in caller order (cached)."""
    return graph.cached(("fastgnn.torch", "edge_index"),
                        lambda: _torch(graph.edge_index()).long())


def _appended_loops(graph):
    """Graph with one self-loop per node appended after all edges (existing
    loops kept), PyG's `add_self_loops` on a sparse adj_t (cached)."""
    def build():
        ei = _cached_edge_index(graph)
        nodes = torch.arange(graph.num_dst, device=ei.device)
        return fastgnn.Graph.from_edge_index(torch.cat([ei, torch.stack([nodes, nodes])], 1),
                                             num_nodes=graph.num_dst).with_visit_order_of(graph)
    return graph.cached(("fastgnn.torch", "appended_self_loops"), build)


_NP_DTYPES = {torch.float32: np.float32, torch.float64: np.float64}


def _norm_dtype(dtype):
    """Weights for features of `dtype`: float64 for float64, else float32 (the
    16-bit kernels take float32 weights)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _sym_norm(ei, w, n):
    """deg^-1/2[src] * w * deg^-1/2[dst] over n nodes with torch ops (differentiable in w)."""
    deg = torch.zeros(n, dtype=w.dtype, device=w.device).index_add_(0, ei[1], w)
    dis = deg.pow(-0.5)
    dis = dis.masked_fill(dis == float("inf"), 0)
    return dis[ei[0]] * w * dis[ei[1]]


def gcn_norm(edge_index_or_adj, edge_weight=None, num_nodes=None, *, improved=False,
             add_self_loops=True, dtype=torch.float32):
    r"""GCN normalisation as PyG 2.8's `gcn_norm`; returns (graph', weight' [E']).

        w'_e = deg(j)^-1/2 * w_e * deg(i)^-1/2   for e = (j -> i),  deg(i) = sum of w into i

    Self-loops, with add_self_loops, follow PyG per input kind:
      edge_index / EdgeIndex / Graph: existing loops are replaced by one loop
          per node (weight of the node's last loop, else 2 if improved else 1),
          as `add_remaining_self_loops`; graph' edges are the non-loop edges in
          order, then loops 0..n-1. Without edge_weight every loop weighs 1
          even if improved (PyG 2.8 fills loops only for weighted graphs).
          Gradients are the true ones: a node's overwritten earlier loops get
          0 (PyG's index_put gives them the last loop's gradient too).
      sparse adj_t (values = weights; edge_weight is ignored, as in PyG):
          one loop per node is appended after all entries (fill 2 or 1), as
          `add_self_loops`.
    weight' is in graph''s caller edge order, on the graph's device. Without
    weights (or all-ones adj_t values) the result is cached on the graph; with
    weights that require grad it is computed by differentiable torch ops.
    dtype: value type for the unweighted case (float64 stays float64, every
    other type gives float32 weights); weighted results keep the weights' dtype.
    """
    graph, adj_w = resolve(edge_index_or_adj, num_nodes)
    sparse = isinstance(edge_index_or_adj, torch.Tensor) and edge_index_or_adj.layout != torch.strided
    w = adj_w if sparse else edge_weight
    if add_self_loops and graph.num_src != graph.num_dst:
        raise ValueError("gcn_norm with add_self_loops needs a square graph "
                         f"(got num_src={graph.num_src}, num_dst={graph.num_dst})")
    if w is None and not sparse:
        # PyG 2.8 quirk, kept for drop-in equality: add_remaining_self_loops
        # only fills loop weights when there are edge weights, so `improved`
        # has no effect on an unweighted edge_index.
        improved = False
    fill = 2.0 if improved else 1.0
    device = torch.device(graph.device)

    if w is not None and w.requires_grad:                       # differentiable path
        if w.dim() == 2 and w.shape[1] == 1:
            w = w[:, 0]
        if w.dim() != 1 or w.shape[0] != graph.num_edges:
            raise ValueError(f"edge_weight must have shape [E] = [{graph.num_edges}], "
                             f"got {tuple(w.shape)}")
        with device_scope(device):
            if not add_self_loops:
                g2, w2 = graph, w
            elif sparse:
                g2 = _appended_loops(graph)
                w2 = torch.cat([w, w.new_full((graph.num_dst,), fill)])
            else:
                g2, kept, last = self_loop_structure(graph)
                kept, last = _torch(kept).long(), _torch(last).long()
                # a node's weight is its last existing loop's, else the fill
                # (no edges: nothing to gather from)
                loop_w = (torch.where(last >= 0, w[last.clamp(min=0)], w.new_tensor(fill))
                          if w.numel() else w.new_full((graph.num_dst,), fill))
                w2 = torch.cat([w[kept], loop_w])
            return g2, _sym_norm(_cached_edge_index(g2), w2, g2.num_dst)

    with device_scope(device):                                   # fastgnn core path
        wdt = _norm_dtype(dtype)
        if w is None:
            if sparse and add_self_loops:
                g2 = _appended_loops(graph)
                key = ("fastgnn.torch", "gcn_norm_appended", improved, str(wdt))

                def build():
                    xp = g2.xp
                    ndt = _NP_DTYPES[wdt]
                    w2 = xp.concatenate([xp.ones(graph.num_edges, dtype=ndt),
                                         xp.full(graph.num_dst, fill, dtype=ndt)])
                    return fastgnn.gcn_norm(g2, w2, add_self_loops=False)[1]
                return g2, _torch(g2.cached(key, build))
            if wdt == torch.float32:                             # cached by the core
                g2, w2 = fastgnn.gcn_norm(graph, add_self_loops=add_self_loops, improved=improved)
                return g2, _torch(w2)
            key = ("fastgnn.torch", "gcn_norm", add_self_loops, improved, str(wdt))

            def build():
                ones = graph.xp.ones(graph.num_edges, dtype=np.float64)
                return fastgnn.gcn_norm(graph, ones, add_self_loops=add_self_loops,
                                        improved=improved)
            g2, w2 = graph.cached(key, build)
            return g2, _torch(w2)
        if sparse and add_self_loops:
            g2 = _appended_loops(graph)
            xp = g2.xp
            wa = to_array(w)
            w2 = xp.concatenate([wa, xp.full(graph.num_dst, fill, dtype=wa.dtype)])
            return g2, _torch(fastgnn.gcn_norm(g2, w2, add_self_loops=False)[1])
        g2, w2 = fastgnn.gcn_norm(graph, to_array(w), add_self_loops=add_self_loops,
                                  improved=improved)
        return g2, _torch(w2)


# ------------------------------------------------ compiled graph functions
# The ops above as torch.library custom ops (custom_ops.py): each eager body
# is the function itself, each fake gives its output's shape.
def _num_dst(num_nodes, name):
    if num_nodes[1] is None:
        raise ValueError(f"{name} under torch.compile needs the number of targets: pass "
                         "num_nodes=(num_src, num_dst)")
    return num_nodes[1]


def _width(reduce, f):
    return f if isinstance(reduce, str) else len(reduce) * f


def _spmm_fake(edge_index, x, edge_weight, bias, row_scale, col_scale, *, num_nodes, reduce,
               path):
    return [x.new_empty((_num_dst(num_nodes, "spmm"), x.shape[1]))]


@custom_ops.graph_op("spmm", ("x", "edge_weight", "bias", "row_scale", "col_scale"), _spmm_fake,
                     sizes=("num_nodes",))
def _spmm_op(edge_index, x, edge_weight, bias, row_scale, col_scale, *, num_nodes, reduce, path):
    return spmm(edge_index, x, edge_weight, reduce, tuple(num_nodes), path, row_scale=row_scale,
                col_scale=col_scale, bias=bias)


def _segment_reduce_fake(edge_index, x, *, num_nodes, reduce, deterministic):
    return [x.new_empty((_num_dst(num_nodes, "segment_reduce"), _width(reduce, x.shape[1])))]


@custom_ops.graph_op("segment_reduce", ("x",), _segment_reduce_fake, sizes=("num_nodes",))
def _segment_reduce_op(edge_index, x, *, num_nodes, reduce, deterministic):
    return segment_reduce(edge_index, x, reduce, tuple(num_nodes), deterministic=deterministic)


def _segment_reduce_linear_fake(edge_index, x, weight, bias, root_weight, x_root, *, num_nodes,
                                reduce, deterministic):
    return [x.new_empty((_num_dst(num_nodes, "segment_reduce_linear"), weight.shape[0]))]


@custom_ops.graph_op("segment_reduce_linear", ("x", "weight", "bias", "root_weight", "x_root"),
                     _segment_reduce_linear_fake, sizes=("num_nodes",))
def _segment_reduce_linear_op(edge_index, x, weight, bias, root_weight, x_root, *, num_nodes,
                              reduce, deterministic):
    return segment_reduce_linear(edge_index, x, reduce, weight, bias, root_weight, x_root,
                                 tuple(num_nodes), deterministic=deterministic)


def _segment_csr_fake(_graph, ptr, src, *, reduce, deterministic):
    rows = ptr.shape[0] - 1
    if isinstance(reduce, str):
        return [src.new_empty((rows, *src.shape[1:]))]
    return [src.new_empty((rows, _width(reduce, src.shape[1])))]


@custom_ops.graph_op("segment_csr", ("ptr", "src"), _segment_csr_fake)
def _segment_csr_op(_graph, ptr, src, *, reduce, deterministic):
    return segment_csr(ptr, src, reduce, deterministic=deterministic)
