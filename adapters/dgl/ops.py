"""`dgl.ops`-style message passing and edge softmax on fastgnn's kernels.

Every function takes a DGLGraph (homogeneous, or a bipartite block from
`dgl.to_block` and DGL's samplers) and torch tensors shaped as DGL's: node
features [num_src, *] on the source nodes, edge features [E, *] in DGL's edge
order; results are [num_dst, *] on the destination nodes (or [E, *] for
`edge_softmax`). Messages flow src -> dst along each edge e = (u -> v) and are
reduced at v:

    copy_u_<r>(g, x)[v]    = r_{e=(u->v)} x[u]
    copy_e_<r>(g, y)[v]    = r_{e=(u->v)} y[e]
    u_mul_e_<r>(g, x, y)[v] = r_{e=(u->v)} x[u] * y[e]      (broadcast as DGL: numpy rules
                                                              over the trailing shapes)

for r in sum, mean (the sum over deg_in(v)), max, min. A node without
in-edges gets what dgl.ops gives it: 0 from sum and mean, -inf from max and
+inf from min, except in a graph without any edge, where every reduction
gives 0 (DGL's message passing, `update_all` with fn.max, gives 0 there
always: the modules in fastgnn.dgl.nn do, too). All of them are
differentiable in every tensor input; the constant rows of empty max/min get
no gradient (DGL's own backward sends their cotangent to node or edge 0, and
in a graph without edges to every input). The graph is converted once
(`fastgnn.dgl.to_graph`, cached) and the work runs through the same
fastgnn.torch ops and autograd bridge as the PyG-style layers: `spmm` (one
weight per edge, or per edge and head), `segment_reduce`, `segment_csr` and
`edge_softmax`.
"""
from __future__ import annotations

import math

import torch

from dgl import DGLError
from dgl.base import ALL

import fastgnn.torch as ft
from fastgnn.torch._autograd import device_scope, to_tensor
from fastgnn.torch.functional import _csr_tensors
from fastgnn.torch.graph_cache import from_dgl, is_dgl_graph

__all__ = ["to_graph", "edge_softmax", "gspmm",
           "copy_u_sum", "copy_u_mean", "copy_u_max", "copy_u_min",
           "copy_e_sum", "copy_e_mean", "copy_e_max", "copy_e_min",
           "u_mul_e_sum", "u_mul_e_mean", "u_mul_e_max", "u_mul_e_min"]

REDUCES = ("sum", "mean", "max", "min")


def to_graph(g, *, reverse=False):
    """The fastgnn.Graph of DGLGraph `g` (cached per graph structure; see
    `fastgnn.torch.graph_cache.from_dgl`): CSR over the destination nodes,
    sources in its column indices, DGL's edge ids as its edge ids, so that
    per-edge tensors are read and returned in DGL's edge order. reverse=True:
    every edge turned around (reductions over out-edges)."""
    if not is_dgl_graph(g):
        raise TypeError(f"g must be a DGLGraph, got {type(g).__name__}")
    return from_dgl(g, reverse=reverse)


def _tensor(t, name):
    """t a floating-point tensor with a leading node or edge dimension."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype} (cast it, e.g. "
                        f"{name}.float())")
    if t.dim() < 1:
        raise ValueError(f"{name} must have a leading node or edge dimension, got a scalar")
    return t


def _rows(t, n, name, what):
    if t.shape[0] != n:
        raise ValueError(f"{name} must have {n} rows ({what}), got shape {tuple(t.shape)}")


def _check_reduce(reduce, name="reduce"):
    if reduce not in REDUCES:
        raise ValueError(f"{name} must be one of {REDUCES}, got {reduce!r}")


# the argument names the messages use: the ops' own, or gspmm's
_OWN = {"x": "x", "y": "y", "reduce": "reduce"}
_GSPMM = {"x": "lhs_data", "y": "rhs_data", "reduce": "reduce_op"}
_EDGE_X = {"y": "x", "reduce": "reduce"}        # copy_e_<r>(g, x): its edge features are x


def _empty_fill(graph, out, reduce):
    """out [num_dst, *] with the rows of nodes without in-edges set to -inf
    (max) or +inf (min), as dgl.ops's gspmm leaves them (it returns zeros
    for a graph without edges)."""
    if reduce not in ("max", "min") or graph.num_edges == 0:
        return out

    def build():
        empty = to_tensor(graph.in_degree) == 0
        return empty if bool(empty.any()) else None
    with device_scope(out.device):
        empty = graph.cached(("fastgnn.dgl", "empty_rows"), build)
    if empty is None:
        return out
    fill = float("-inf") if reduce == "max" else float("inf")
    return out.masked_fill(empty.view(-1, *(1,) * (out.dim() - 1)), fill)


def _flat(t):
    """[n, *s] -> [n, prod(s)] (a view where the layout allows)."""
    return t.reshape(t.shape[0], math.prod(t.shape[1:]))


def copy_u(g, x, reduce):
    """r_{e=(u->v)} x[u] for reduce r in sum/mean/max/min: x [num_src, *] ->
    [num_dst, *]. Sum and mean run fastgnn's SpMM, max and min its segment
    reduction (no per-edge tensor either way)."""
    return _copy_u(g, x, reduce, _OWN)


def _copy_u(g, x, reduce, names):
    _check_reduce(reduce, names["reduce"])
    graph = to_graph(g)
    x = _tensor(x, names["x"])
    _rows(x, graph.num_src, names["x"], "the graph's source nodes")
    out = ft.spmm(graph, _flat(x), reduce=reduce)
    return _empty_fill(graph, out.reshape(graph.num_dst, *x.shape[1:]), reduce)


def copy_e(g, y, reduce):
    """r_{e=(u->v)} y[e] for reduce r in sum/mean/max/min: y [E, *] in DGL's
    edge order -> [num_dst, *] (fastgnn's `segment_csr` over the edges in CSR
    order)."""
    return _copy_e(g, y, reduce, _OWN)


def _copy_e(g, y, reduce, names):
    _check_reduce(reduce, names["reduce"])
    graph = to_graph(g)
    y = _tensor(y, names["y"])
    _rows(y, graph.num_edges, names["y"], "one per edge")
    indptr, _, edge_ids = _csr_tensors(graph)
    flat = _flat(y)
    out = ft.segment_csr(indptr, flat if edge_ids is None else flat[edge_ids], reduce)
    return _empty_fill(graph, out.reshape(graph.num_dst, *y.shape[1:]), reduce)


def u_mul_e(g, x, y, reduce):
    """r_{e=(u->v)} x[u] * y[e]: x [num_src, *a], y [E, *b] (DGL's edge
    order), broadcast over the trailing shapes (numpy rules, as DGL's binary
    message functions) -> [num_dst, *broadcast(a, b)].

    With s = broadcast(a, b) split as s = (groups, rest) after the last axis
    on which y is not 1, y holds one weight per (edge, group):
      one group (a scalar per edge, y [E] or [E, 1, ...]): one weighted SpMM;
      several groups of rest > 1 (per-head weights, y [E, H, 1] against
                   x [N, H, F]): one weighted SpMM per group;
      rest = 1 (a weight per edge and feature): the messages x[u] * y[e] are
                   made per edge ([E, prod(s)]) and reduced by `segment_csr`.
    Weighted max/min make the messages per edge in every case (fastgnn's
    kernels take no weights there)."""
    return _u_mul_e(g, x, y, reduce, _OWN)


def _u_mul_e(g, x, y, reduce, names):
    _check_reduce(reduce, names["reduce"])
    graph = to_graph(g)
    nx, ny = names["x"], names["y"]
    x, y = _tensor(x, nx), _tensor(y, ny)
    _rows(x, graph.num_src, nx, "the graph's source nodes")
    _rows(y, graph.num_edges, ny, "one per edge")
    a, b = tuple(x.shape[1:]), tuple(y.shape[1:])
    try:
        s = tuple(torch.broadcast_shapes(a, b))
    except RuntimeError:
        raise ValueError(f"{nx}'s feature shape {a} and {ny}'s {b} do not broadcast") from None
    bp = (1,) * (len(s) - len(b)) + b
    split = max((i + 1 for i, d in enumerate(bp) if d != 1), default=0)
    groups, rest = math.prod(s[:split]), math.prod(s[split:])
    xs = x.reshape(x.shape[0], *((1,) * (len(s) - len(a)) + a)).expand(x.shape[0], *s)
    xs = xs.reshape(x.shape[0], groups, rest)
    w = y.reshape(y.shape[0], *bp).expand(y.shape[0], *s[:split], *((1,) * (len(s) - split)))
    w = w.reshape(y.shape[0], groups)
    if groups == 1:
        out = ft.spmm(graph, xs[:, 0], w[:, 0], reduce=reduce)
    elif rest > 1:
        out = torch.stack([ft.spmm(graph, xs[:, k], w[:, k], reduce=reduce)
                           for k in range(groups)], dim=1)
    else:
        indptr, sources, edge_ids = _csr_tensors(graph)
        w_csr = w if edge_ids is None else w[edge_ids]
        out = ft.segment_csr(indptr, xs[:, :, 0][sources] * w_csr, reduce)
    return _empty_fill(graph, out.reshape(graph.num_dst, *s), reduce)


def gspmm(g, op, reduce_op, lhs_data, rhs_data):
    """DGL's generalized SpMM for the message functions fastgnn has kernels
    for: op "copy_lhs" (`copy_u`), "copy_rhs" (`copy_e`) or "mul" (`u_mul_e`),
    reduce_op "sum", "mean", "max" or "min"; lhs_data [num_src, *] node
    features, rhs_data [E, *] edge features (None where the op reads none).
    Other ops raise NotImplementedError."""
    if op == "copy_lhs":
        return _copy_u(g, lhs_data, reduce_op, _GSPMM)
    if op == "copy_rhs":
        return _copy_e(g, rhs_data, reduce_op, _GSPMM)
    if op == "mul":
        return _u_mul_e(g, lhs_data, rhs_data, reduce_op, _GSPMM)
    raise NotImplementedError(f"gspmm: op={op!r} has no fastgnn kernel (supported: "
                              "'copy_lhs', 'copy_rhs', 'mul'); use dgl.ops for it")


def _named(kind, reduce):
    if kind == "copy_u":
        def f(g, x):
            return copy_u(g, x, reduce)
        f.__doc__ = f"out[v] = {reduce}_{{e=(u->v)}} x[u]; x [num_src, *] -> [num_dst, *]."
    elif kind == "copy_e":
        def f(g, x):
            return _copy_e(g, x, reduce, _EDGE_X)
        f.__doc__ = f"out[v] = {reduce}_{{e=(u->v)}} x[e]; x [E, *] -> [num_dst, *]."
    else:
        def f(g, x, y):
            return u_mul_e(g, x, y, reduce)
        f.__doc__ = (f"out[v] = {reduce}_{{e=(u->v)}} x[u] * y[e]; x [num_src, *a], "
                     "y [E, *b] -> [num_dst, *broadcast(a, b)] (see `u_mul_e`).")
    f.__name__ = f.__qualname__ = f"{kind}_{reduce}"
    return f


copy_u_sum, copy_u_mean, copy_u_max, copy_u_min = (_named("copy_u", r) for r in REDUCES)
copy_e_sum, copy_e_mean, copy_e_max, copy_e_min = (_named("copy_e", r) for r in REDUCES)
u_mul_e_sum, u_mul_e_mean, u_mul_e_max, u_mul_e_min = (_named("u_mul_e", r) for r in REDUCES)


class _InvalidEdgeIds(DGLError, ValueError):
    """eids out of the graph's range: a ValueError, and the DGLError DGL raises for it."""


def edge_softmax(graph, logits, eids=ALL, norm_by="dst"):
    r"""Softmax of edge logits over each destination node's in-edges (DGL's
    `edge_softmax`), per trailing element, differentiable in logits:

        out[e] = exp(s[e]) / sum_{e' = (u' -> v)} exp(s[e'])      for e = (u -> v)

    graph:   a DGLGraph (homogeneous or a block).
    logits:  [E, *] float tensor in DGL's edge order (or [len(eids), *] in
             eids' order when eids is given).
    eids:    dgl.base.ALL (every edge), or an integer tensor of edge ids: the
             softmax then runs over those edges only.
    norm_by: "dst" (over in-edges, the default) or "src" (over each source
             node's out-edges).
    Returns a tensor of logits' shape and dtype (fastgnn's fused
    `edge_softmax`; a node without edges gets none).
    """
    if norm_by not in ("dst", "src"):
        raise ValueError(f"norm_by must be 'dst' or 'src', got {norm_by!r}")
    if not is_dgl_graph(graph):
        raise TypeError(f"graph must be a DGLGraph, got {type(graph).__name__}")
    logits = _tensor(logits, "logits")
    rev = norm_by == "src"
    if isinstance(eids, str) and eids == ALL:
        g = to_graph(graph, reverse=rev)
        _rows(logits, g.num_edges, "logits", "one per edge")
    else:
        if (not isinstance(eids, torch.Tensor) or eids.dim() != 1 or eids.is_floating_point()
                or eids.is_complex() or eids.dtype == torch.bool):
            raise TypeError("eids must be dgl.base.ALL or a 1-D integer tensor of edge ids, got "
                            + (f"a {eids.dtype} tensor of shape {tuple(eids.shape)}"
                               if isinstance(eids, torch.Tensor) else type(eids).__name__))
        _rows(logits, eids.shape[0], "logits", "one per edge in eids")
        if eids.numel():
            lo, hi = (int(v) for v in torch.stack([eids.min(), eids.max()]).tolist())
            if lo < 0 or hi >= graph.num_edges():
                raise _InvalidEdgeIds(f"eids holds edge id {lo if lo < 0 else hi}, but the "
                                      f"graph's edge ids are 0..{graph.num_edges() - 1}")
        src, dst = graph.find_edges(eids)
        sizes = (graph.num_src_nodes(), graph.num_dst_nodes())
        g = torch.stack([dst, src] if rev else [src, dst]).long()
        g = ft.to_graph(g, sizes[::-1] if rev else sizes)
    flat = logits if logits.dim() == 1 else _flat(logits)
    return ft.edge_softmax(g, flat).reshape(logits.shape)
