"""Drop-in replacements for PyG 2.8's layers whose messages depend on each edge:

    GINEConv           x'_i = h((1 + eps) x_i + sum_{j -> i} relu(x_j + W_e e_ji + b_e))
    ResGatedGraphConv  x'_i = W_1 x_i + sum_{j -> i} sigmoid(W_3 x_i + W_4 x_j) * W_2 x_j + b
    GENConv            x'_i = MLP(x_i + AGG_{j -> i} (relu(x_j + e_ji) + eps))
    PNAConv            x'_i = W (post(x_i, scalers(deg_i) x aggregators_{j -> i} pre(x_i, x_j, e_ji)))
    DegreeScalerAggregation
                       PNA's degree scalers over fastgnn's aggregations (PyG's
                       `DegreeScalerAggregation`; it imports PyG, so it is built
                       on first access, as the modules of aggr.py are)

Same constructor arguments, parameter names (a PyG `state_dict` loads with
`strict=True`, and ours into PyG's), forward inputs (edge_index tensor, PyG
EdgeIndex, torch sparse adj_t, `edge_attr` in the graph input's edge order,
`(x_src, x_dst)` pairs where PyG takes them) and the same function as PyG's,
`flow` read per call as in nn.py. A sparse adj_t's scalar values are
ignored, as these layers' PyG versions ignore them; values with one row per
entry ([nnz, D]) are edge_attr when none is given, as PyG reads them.

How the messages are built
--------------------------
Every aggregation is fastgnn's: `segment_reduce` where the message is a
function of the source node alone (no per-edge tensor at all), otherwise
`segment_csr` (or an aggregation module of aggr.py) over one message row per
edge, made in the graph's CSR order (grouped by target, so no sort).
fastgnn has no kernel that fuses these layers' gathers, nonlinearities and
reduction, so where a message depends on the edge, ONE [E, F] message tensor
is made: the node terms (x_j, x_i) are gathered into it and the edge terms
(edge_attr, or its linear map as a GEMM per block of edges) added in place,
a bounded block of rows at a time (`_add_terms`), so no second [E, F] tensor
exists at once. PyG makes several (x_j, the projected edge features, their
sum, the activation). For the backward, the rows keep a bit mask of the
ReLU (GINEConv, GENConv) or nothing at all (ResGatedGraphConv recomputes
its gate from node-level tensors), and the backward makes at most two
[E, F] tensors besides the per-edge gradients it returns. A fused kernel
(gather, nonlinearity and reduction in one pass, nothing per edge) is future
work; the layer docstrings say which tensors each case makes.

Gradients of per-edge rows are summed per target by fastgnn's
`segment_csr`, and per source by `segment_csr` over the graph's cached
transpose (`_scatter_src`): fixed order, no float atomics, bitwise
repeatable, as fastgnn's default backward passes are.

torch.compile: these layers have no custom op of their own; their forward
runs eagerly (a graph break around each call), as nn_propagation.py's.
"""
from __future__ import annotations

import functools
import numbers
import weakref

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from .functional import _csr_tensors, add_bias, segment_csr, segment_reduce
from .graph_cache import resolve
from .nn import (_PAIR_FLOW, _add_linear, _check_features, _check_kwargs, _check_single_features,
                 _graph_sizes, _linear, _no_hooks, _oriented, _pair, _plain_linear, _register_bias,
                 _register_eps, _reset, Linear)
from .nn_propagation import _check_widths, _eager

__all__ = ["GINEConv", "ResGatedGraphConv", "GENConv", "PNAConv", "DegreeScalerAggregation"]

# elements of the per-block temporaries of the edge loops (`_blocks`): 2^22
# (16 MiB in float32) bounds what a block adds next to the [E, F] message
_BLOCK_ELEMENTS = 1 << 22
# aggregation names a layer's `aggr` may give as one fastgnn reduction code
_CODES = {"add": "sum", "sum": "sum", "mean": "mean", "max": "max", "min": "min",
          "var": "var", "std": "std", "mul": "mul"}


# ------------------------------------------------------------- edge rows
class _Edges:
    """A graph's edges in CSR order (grouped by target) as int64 tensors:
    ptr [num_dst + 1], src [E] (source of each position), dst [E] (target of
    each position), ids [E] (the caller's edge id of each position, None when
    the caller's order is the CSR order); `by_source()` the same positions
    grouped by source (the graph's transpose, built on first use)."""

    def __init__(self, graph):
        self.ptr, self.src, self.ids = _csr_tensors(graph)
        self.num_src, self.num_dst, self.num_edges = graph.num_src, graph.num_dst, graph.num_edges
        counts = self.ptr[1:] - self.ptr[:-1]
        self.dst = torch.repeat_interleave(
            torch.arange(self.num_dst, device=self.ptr.device), counts, output_size=self.num_edges)
        # weak (the graph's cache holds this: no cycle); an autograd node whose
        # backward calls by_source() holds the graph itself
        self._graph = weakref.ref(graph)
        self._by_source = None

    def degree(self, dtype):
        """[num_dst] in-degrees (duplicates and self-loops counted) in `dtype`."""
        return (self.ptr[1:] - self.ptr[:-1]).to(dtype)

    def by_source(self):
        """(ptr [num_src + 1], its host copy, pos [E]: the CSR positions
        grouped by source, or None when that is the CSR order)."""
        if self._by_source is None:
            t = self._graph().transpose()
            ptr, _, pos = _csr_tensors(t)
            self._by_source = (ptr, ptr.cpu().numpy(), pos)
        return self._by_source


def _edges(graph) -> _Edges:
    return graph.cached(("fastgnn.torch", "message_edges"), lambda: _Edges(graph))


def _blocks(rows, width):
    """(start, stop) row ranges of about _BLOCK_ELEMENTS elements each."""
    step = max(1, _BLOCK_ELEMENTS // max(1, width))
    return [(s, min(s + step, rows)) for s in range(0, rows, step)]


def _edge_rows(t, edges, s, e):
    """Rows s:e of the CSR order of a per-edge tensor t [E, D] in caller order."""
    return t[s:e] if edges.ids is None else t.index_select(0, edges.ids[s:e])


# The terms of an edge row. `kinds` names them in order; each takes tensors
# from the flat list in that order:
#   "src"     table [num_src, C]:  table[j]          (C = L * F)
#   "dst"     table [num_dst, C]:  table[i]
#   "edge"    t [E, F] (caller order):  t[e], repeated over the L blocks of C
#   "linear"  a [E, D], W [F, D], b [F] or None:  W a[e] + b, repeated likewise
_WIDTH = {"src": 1, "dst": 1, "edge": 1, "linear": 3}


def _split(kinds, tensors):
    """[(kind, its tensors)] of a flat tensor list."""
    out, k = [], 0
    for kind in kinds:
        out.append((kind, tensors[k:k + _WIDTH[kind]]))
        k += _WIDTH[kind]
    return out


def _add_broadcast(block, rows):
    """block [b, L*F] += rows [b, F] in each of the L blocks."""
    if block.shape[1] == rows.shape[1]:
        block.add_(rows)
    else:
        block.view(block.shape[0], -1, rows.shape[1]).add_(rows.unsqueeze(1))


def _add_terms(m, edges, kinds, tensors, start=0):
    """m [b, C] += every term, for the CSR positions start .. start + b - 1,
    a block of rows at a time: each block's gathers are the only
    temporaries (no second tensor of m's size)."""
    terms = _split(kinds, tensors)
    for s, e in _blocks(m.shape[0], m.shape[1]):
        block, ps, pe = m[s:e], start + s, start + e
        for kind, ts in terms:
            if kind == "src":
                block.add_(ts[0].index_select(0, edges.src[ps:pe]))
            elif kind == "dst":
                block.add_(ts[0].index_select(0, edges.dst[ps:pe]))
            elif kind == "edge":
                _add_broadcast(block, _edge_rows(ts[0], edges, ps, pe))
            else:
                a, w, _ = ts
                rows = _edge_rows(a, edges, ps, pe)
                if block.shape[1] == w.shape[0]:
                    block.addmm_(rows, w.t())
                else:
                    _add_broadcast(block, rows.mm(w.t()))
    for kind, ts in terms:
        if kind == "linear" and ts[2] is not None:
            m.view(m.shape[0], -1, ts[2].shape[0]).add_(ts[2])


def _gathered(edges, kinds, tensors):
    """A new [E, C] tensor holding the sum of the terms: the first (a "src"
    or "dst" table [*, C]) gathered into it, the others added in place."""
    (kind, (table,)), = _split(kinds[:1], tensors[:1])
    m = table.index_select(0, edges.src if kind == "src" else edges.dst)
    _add_terms(m, edges, kinds[1:], tensors[1:])
    return m


def _term_grads(g, edges, kinds, tensors, needs):
    """The gradients of the terms' tensors for g [E, C], the gradient of the
    rows they were added into (CSR order); None where `needs` (one flag per
    tensor) is False."""
    grads, k = [], 0
    summed = {}                                     # F -> g summed over its L blocks [E, F]

    def per_edge(f):
        if f not in summed:
            summed[f] = g if g.shape[1] == f else g.view(g.shape[0], -1, f).sum(1)
        return summed[f]
    for kind, ts in _split(kinds, tensors):
        want = needs[k:k + len(ts)]
        k += len(ts)
        if kind == "src":
            grads.append(_scatter_src(g, edges, ts[0].shape[0]) if want[0] else None)
        elif kind == "dst":
            grads.append(segment_csr(edges.ptr, g, "sum") if want[0] else None)
        elif kind == "edge":
            grads.append(_to_caller(per_edge(ts[0].shape[1]), edges) if want[0] else None)
        else:
            a, w, b = ts
            grads.extend(_linear_term_grads(per_edge(w.shape[0]) if any(want) else None,
                                            a, w, b, edges, want))
    return grads


def _scatter_src(g, edges, num_src):
    """[num_src, C]: the rows of g [E, C] (CSR order) summed per source, in
    a fixed order: gathered into the transpose's order a block of rows at a
    time, each block reduced by fastgnn's `segment_csr` (a source whose
    edges straddle blocks gets its partial sums added in block order)."""
    ptr, host_ptr, pos = edges.by_source()
    blocks = _blocks(g.shape[0], g.shape[1])
    if len(blocks) <= 1:
        return segment_csr(ptr, g if pos is None else g.index_select(0, pos), "sum")
    out = g.new_zeros((num_src, g.shape[1]))
    for s, e in blocks:
        rows = g[s:e] if pos is None else g.index_select(0, pos[s:e])
        first = int(np.searchsorted(host_ptr, s, side="right")) - 1
        last = int(np.searchsorted(host_ptr, e - 1, side="right")) - 1
        local = (ptr[first:last + 2].clamp(s, e) - s)
        out[first:last + 1] += segment_csr(local, rows, "sum")
    return out


def _to_caller(g, edges):
    """Per-edge rows in CSR order -> a new tensor in the caller's edge order."""
    if edges.ids is None:
        return g.clone()
    return g.new_empty(g.shape).index_copy_(0, edges.ids, g)


def _linear_term_grads(ge, a, w, b, edges, want):
    """[grad a, grad W, grad b] of a "linear" term W a[e] + b, for its rows'
    gradient ge [E, F], a block of edges at a time (no [E, D] gather)."""
    ga = a.new_empty(a.shape) if want[0] else None
    gw = w.new_zeros(w.shape) if want[1] else None
    if want[0] or want[1]:
        for s, e in _blocks(ge.shape[0], max(ge.shape[1], a.shape[1])):
            if want[1]:
                gw.addmm_(ge[s:e].t(), _edge_rows(a, edges, s, e))
            if want[0]:
                rows = ge[s:e].mm(w)
                if edges.ids is None:
                    ga[s:e] = rows
                else:
                    ga.index_copy_(0, edges.ids[s:e], rows)
    gb = ge.sum(0) if b is not None and want[2] else None
    return [ga, gw, gb]


class _EdgeRows(torch.autograd.Function):
    r"""rows [E, C] in CSR order: the sum of the terms (see `_add_terms`;
    the first a "src" or "dst" table [*, C]), then relu(.) + eps with
    `relu`. The forward makes this one [E, C] tensor; the backward keeps
    only the ReLU's mask ([E, C] booleans) of its own.

    forward(ctx, edges, kinds, relu, eps, *tensors)."""

    @staticmethod
    def forward(ctx, edges, kinds, relu, eps, *tensors):
        m = _gathered(edges, kinds, tensors)
        mask = None
        if relu:
            if any(ctx.needs_input_grad[4:]):
                mask = m > 0
            m.clamp_min_(0)
            if eps:
                m.add_(eps)
        ctx.edges, ctx.kinds = edges, kinds
        ctx.graph = edges._graph()      # kept for the backward's `by_source`
        ctx.save_for_backward(mask, *tensors)
        return m

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        mask, *tensors = ctx.saved_tensors
        if mask is not None:
            g = g * mask
        grads = _term_grads(g, ctx.edges, ctx.kinds, tensors, ctx.needs_input_grad[4:])
        return (None, None, None, None, *grads)


def _edge_messages(edges, terms, relu=False, eps=0.0):
    """`_EdgeRows` of [(kind, tensors)] terms."""
    kinds = tuple(kind for kind, _ in terms)
    return _EdgeRows.apply(edges, kinds, relu, float(eps), *(t for _, ts in terms for t in ts))


class _GatedSum(torch.autograd.Function):
    r"""out [num_dst, C] = sum_{e = (j -> i)} sigmoid(K_i + Q_j + a_e) * (V_j + b_e)
    by fastgnn's `segment_csr` over message rows in CSR order; a_e and b_e
    are sums of "edge" / "linear" terms (maybe none).

    The forward makes one [E, C] tensor (the messages) and saves nothing
    per edge: the backward recomputes the gate from K, Q and a, with two
    [E, C] tensors:

        g_e = G_i s_e,  s_e = sigmoid(K_i + Q_j + a_e)
        grad V_j += g_e,   grad b_e = g_e
        h_e = g_e (1 - s_e) (V_j + b_e)
        grad K_i += h_e,   grad Q_j += h_e,   grad a_e = h_e

    forward(ctx, edges, a_kinds, b_kinds, K, Q, V, *a_tensors, *b_tensors)."""

    @staticmethod
    def forward(ctx, edges, a_kinds, b_kinds, k, q, v, *tensors):
        na = sum(_WIDTH[kind] for kind in a_kinds)
        m = _gate(edges, k, q, a_kinds, tensors[:na])
        for s, e in _blocks(m.shape[0], m.shape[1]):
            values = v.index_select(0, edges.src[s:e])
            _add_terms(values, edges, b_kinds, tensors[na:], start=s)
            m[s:e].mul_(values)
        ctx.edges, ctx.kinds, ctx.na = edges, (a_kinds, b_kinds), na
        ctx.graph = edges._graph()      # kept for the backward's `by_source`
        ctx.save_for_backward(k, q, v, *tensors)
        return segment_csr(edges.ptr, m, "sum")

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        k, q, v, *tensors = ctx.saved_tensors
        edges, (a_kinds, b_kinds), na = ctx.edges, ctx.kinds, ctx.na
        a_tensors, b_tensors = tensors[:na], tensors[na:]
        needs = ctx.needs_input_grad
        need_k, need_q, need_v = needs[3:6]
        need_a, need_b = needs[6:6 + na], needs[6 + na:]
        grad_k = grad_q = grad_v = None
        grad_a, grad_b = [None] * len(a_tensors), [None] * len(b_tensors)
        s = _gate(edges, k, q, a_kinds, a_tensors)                  # s_e      [E, C]
        g = grad_out.index_select(0, edges.dst).mul_(s)            # g_e      [E, C]
        if need_v:
            grad_v = _scatter_src(g, edges, v.shape[0])
        if any(need_b):
            grad_b = _term_grads(g, edges, b_kinds, b_tensors, need_b)
        if need_k or need_q or any(need_a):
            g.mul_(s.neg_().add_(1))                               # g_e (1 - s_e)
            torch.index_select(v, 0, edges.src, out=s)             # V_j + b_e
            _add_terms(s, edges, b_kinds, b_tensors)
            g.mul_(s)                                              # h_e
            del s
            if need_k:
                grad_k = segment_csr(edges.ptr, g, "sum")
            if need_q:
                grad_q = _scatter_src(g, edges, q.shape[0])
            if any(need_a):
                grad_a = _term_grads(g, edges, a_kinds, a_tensors, need_a)
        return (None, None, None, grad_k, grad_q, grad_v, *grad_a, *grad_b)


def _gate(edges, k, q, a_kinds, a_tensors):
    """sigmoid(K_i + Q_j + a_e) [E, C] in CSR order, one tensor."""
    s = _gathered(edges, ("dst", "src") + tuple(a_kinds), (k, q, *a_tensors))
    return s.sigmoid_()


# ------------------------------------------------------------------ helpers
def _aggregation(layer, aggr, aggr_kwargs):
    """A layer's aggregation, resolved once at construction: sets layer.aggr
    (PyG's string form), layer._code (one fastgnn reduction for a plain name,
    else None) and layer.aggr_module (else one of aggr.py's modules, which
    imports PyG; None with a code)."""
    name = type(layer).__name__
    if aggr is None:
        raise NotImplementedError(f"{name}: aggr=None is not supported by fastgnn.torch")
    if isinstance(aggr, (list, tuple)):
        layer.aggr = [str(a) for a in aggr]
    else:
        layer.aggr = aggr if isinstance(aggr, str) else str(aggr)
    if aggr_kwargs is not None and not isinstance(aggr_kwargs, dict):
        raise TypeError(f"{name}: aggr_kwargs must be a dict or None, "
                        f"got {type(aggr_kwargs).__name__}")
    layer._code = _CODES.get(aggr) if isinstance(aggr, str) and not aggr_kwargs else None
    layer.aggr_module = None
    if layer._code is None:
        from .aggr import resolve_aggregation          # imports PyG: only when needed
        layer.aggr_module = resolve_aggregation(aggr, **(aggr_kwargs or {}))


def _reduce_rows(layer, rows, edges):
    """The layer's aggregation of message rows [E, C] in CSR order -> [num_dst, *]."""
    if layer._code is not None:
        return segment_csr(edges.ptr, rows, layer._code)
    return layer.aggr_module(rows, ptr=edges.ptr, dim_size=edges.num_dst, dim=0)


def _reduce_nodes(layer, graph, h):
    """The layer's aggregation of messages h[j] that depend on the source
    alone (h [num_src, C]): `segment_reduce` (nothing per edge; softmax
    gathers its rows)."""
    if layer._code is not None:
        return segment_reduce(graph, h, layer._code)
    return layer.aggr_module.neighbour(graph, h)


def _message_kwargs(layer, kwargs, default_aggr="add"):
    """MessagePassing's keywords of a layer: aggr, aggr_kwargs, then the
    ones `_check_kwargs` validates (flow kept on the layer)."""
    _aggregation(layer, kwargs.pop("aggr", default_aggr), kwargs.pop("aggr_kwargs", None))
    layer.flow = _check_kwargs(type(layer).__name__, kwargs)


def _node_rows(x):
    """(x as [N, L*F] rows, a function putting [M, L*F] back into x's
    layout [*, M, F]) for x [*, N, F]: a static graph's leading dimensions
    folded into the columns."""
    if x.dim() == 2:
        return x, lambda out: out
    lead, n, f = x.shape[:-2], x.shape[-2], x.shape[-1]
    rows = x.movedim(-2, 0).reshape(n, -1)
    return rows, lambda out: out.reshape(out.shape[0], *lead, f).movedim(0, -2)


def _check_edge_attr(layer, edge_attr, edges, width, like):
    """edge_attr [E, width] in the graph input's edge order, on `like`'s
    device and in its dtype; raises TypeError / ValueError naming it."""
    name = type(layer).__name__
    if not isinstance(edge_attr, Tensor):
        raise TypeError(f"'{name}': edge_attr must be a tensor [E, D], "
                        f"got {type(edge_attr).__name__}")
    if not edge_attr.is_floating_point():
        raise TypeError(f"'{name}': edge_attr must be a floating-point tensor, "
                        f"got {edge_attr.dtype}")
    if edge_attr.dim() != 2:
        raise ValueError(f"'{name}': edge_attr must have shape [E, D], got "
                         f"{tuple(edge_attr.shape)} (one feature per edge: edge_attr.unsqueeze(-1))")
    if edge_attr.shape[0] != edges.num_edges:
        raise ValueError(f"'{name}': edge_attr has {edge_attr.shape[0]} rows, but the graph "
                         f"has {edges.num_edges} edges (a sparse adj_t: its stored entries)")
    if width is not None and edge_attr.shape[1] != width:
        raise ValueError(f"'{name}': edge_attr has {edge_attr.shape[1]} features per edge, "
                         f"but the layer takes {width}")
    if edge_attr.device != like.device:
        raise ValueError(f"'{name}': edge_attr is on {edge_attr.device} but x on {like.device}")
    if edge_attr.dtype != like.dtype:
        raise TypeError(f"'{name}': edge_attr has dtype {edge_attr.dtype} but x {like.dtype}; "
                        "cast one of them")


def _edge_term(lin, edge_attr, dtype):
    """The (kind, tensors) term of lin(edge_attr) (lin None: edge_attr itself):
    a plain Linear's GEMM runs per block of edges inside the message rows
    ("linear"), any other module is called on edge_attr first ([E, F])."""
    if lin is None:
        return "edge", (edge_attr,)
    if _plain_linear(lin, dtype):
        return "linear", (edge_attr, lin.weight, lin.bias)
    return "edge", (lin(edge_attr),)


def _edge_dim(layer, edge_dim, lazy=True):
    """edge_dim validated: None, an int >= 1, or -1 (lazy: the width comes
    from the first edge_attr) where the layer's edge Linear can be lazy."""
    if edge_dim is None:
        return None
    name = type(layer).__name__
    if isinstance(edge_dim, bool) or not isinstance(edge_dim, numbers.Integral):
        raise TypeError(f"{name}: edge_dim must be an int or None, got {type(edge_dim).__name__}")
    if edge_dim < 1 and not (lazy and edge_dim == -1):
        raise ValueError(f"{name}: edge_dim must be >= 1{' (or -1: lazy)' if lazy else ''}, "
                         f"got {edge_dim}")
    return int(edge_dim)


def _in_width(lin):
    """A Linear's input width, or None while it is lazy (not yet materialised)."""
    if isinstance(lin, torch.nn.modules.lazy.LazyModuleMixin) and lin.has_uninitialized_params():
        return None
    return lin.in_features


def _hybrid_input(edge_index, edge_attr, size):
    """A torch sparse adj_t whose values are rows ([nnz, D], one dense
    dimension) is read as PyG reads it: its stored entries are the edges
    and, when edge_attr is None, its values are edge_attr. Returns (graph
    input, edge_attr, size): the entries as an edge_index [2, nnz] (made per
    call, so the graph is built per call) and adj_t's sizes; any other
    input comes back as given."""
    if not (isinstance(edge_index, Tensor) and edge_index.layout != torch.strided
            and edge_index.dense_dim() > 0):
        return edge_index, edge_attr, size
    adj = edge_index
    if adj.dim() != 3:
        raise ValueError(f"adj_t with values of shape {tuple(adj.values().shape)}: only "
                         "scalar values or one row per entry ([nnz, D]) are supported")
    if adj.layout == torch.sparse_coo:
        adj = adj if adj.is_coalesced() else adj.coalesce()
        targets, sources = adj.indices()
    elif adj.layout == torch.sparse_csr:
        ptr, sources = adj.crow_indices(), adj.col_indices()
        targets = torch.repeat_interleave(torch.arange(adj.shape[0], device=ptr.device),
                                          ptr.diff())
    elif adj.layout == torch.sparse_csc:
        ptr, targets = adj.ccol_indices(), adj.row_indices()
        sources = torch.repeat_interleave(torch.arange(adj.shape[1], device=ptr.device),
                                          ptr.diff())
    else:
        raise TypeError(f"adj_t has unsupported layout {adj.layout}")
    if edge_attr is None:
        edge_attr = adj.values()
    return (torch.stack([sources, targets]), edge_attr,
            (int(adj.shape[1]), int(adj.shape[0])) if size is None else size)


def _check_edge_dim(layer, edge_attr):
    """edge_attr given exactly when the layer has an edge_dim (as PyG asks)."""
    if (edge_attr is None) != (layer.edge_dim is None):
        raise ValueError(f"'{type(layer).__name__}': edge_attr must be given exactly when "
                         f"edge_dim is set (edge_dim={layer.edge_dim}, edge_attr "
                         f"{'None' if edge_attr is None else 'given'})")


def _graph_of(edge_index, size, x_src, x_dst):
    """(fastgnn Graph, _Edges) of a graph input (already oriented by the flow)."""
    graph, _ = resolve(edge_index, _graph_sizes(x_src, x_dst, size, edge_index, node_dim=-2))
    return graph, _edges(graph)


def _is_sigmoid(act) -> bool:
    return (type(act) is torch.nn.Sigmoid and not act._forward_hooks
            and not act._forward_pre_hooks) or act in (torch.sigmoid, F.sigmoid,
                                                        Tensor.sigmoid)


def _count(layer, name, value, least):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{layer}: {name} must be an int, got {type(value).__name__}")
    if value < least:
        raise ValueError(f"{layer}: {name} must be >= {least}, got {value}")
    return int(value)


# ------------------------------------------------------------------ GINEConv
def _nn_in_channels(nn):
    """The input width of GINEConv's nn: its first module's in_features or
    in_channels (the first of a Sequential)."""
    first = nn[0] if isinstance(nn, torch.nn.Sequential) and len(nn) else nn
    for attr in ("in_features", "in_channels"):
        value = getattr(first, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise ValueError("'GINEConv': could not infer input channels from `nn` (its first "
                     "module has neither in_features nor in_channels); edge_dim needs them")


def _gine_messages(edges, rows, edge_term):
    """GINE's messages relu(x_j + t_e), ONE [E, C] tensor in CSR order, for
    rows [N_s, C] (x_j) and edge_term a (kind, tensors) term of t_e ("edge":
    t [E, C] in the caller's edge order; "linear": W a_e + b): `_EdgeRows`,
    whose backward keeps the ReLU's bit mask."""
    return _edge_messages(edges, [("src", (rows,)), edge_term], relu=True)


class GINEConv(torch.nn.Module):
    r"""GIN with edge features (Hu et al., "Strategies for Pre-training Graph
    Neural Networks"), PyG 2.8's `GINEConv`:

        x'_i = h_Theta((1 + eps) x_i + sum_{e = (j -> i)} relu(x_j + W_e e_ji + b_e))

    with W_e e + b_e the Linear `lin` when edge_dim is given, else e_ji itself.

    nn:        h_Theta (e.g. an MLP), stored as `nn`.
    eps:       initial epsilon; train_eps makes it a parameter, else a buffer
               (`eps` in the state_dict either way, as in PyG).
    edge_dim:  edge feature width D; None: the edge features must have x's
               width F. With edge_dim, lin: D -> nn's input width.
    aggr:      "add" (default) or another aggregation (a keyword, as in PyG:
               "mean", "max", "min", "var", "std", "mul", "softmax", ..., a
               list, an Aggregation).
    forward(x [N, F] | (x_src [Ns, F], x_dst [Nt, F] or None),
            edge_index [2, E] | EdgeIndex | adj_t [Nt, Ns], edge_attr [E, D] (required),
            size=None) -> nn output [Nt, *]
        x may be [*, N, F] (a static graph). edge_attr follows the graph
        input's edge order (an adj_t: its stored entries).

    Parameters `nn.*`, `eps`, `lin.weight` [F, D], `lin.bias` [F], as PyG's.
    The message rows relu(x_j + W_e e_ji + b_e) are ONE [E, F] tensor in CSR
    order (x_j gathered into it, lin's GEMM added in place per block of
    edges: `_EdgeRows`), summed per target by fastgnn's `segment_csr`; the
    backward keeps the ReLU's [E, F] bit mask. PyG makes x_j, lin(e), their
    sum and the ReLU ([E, F] each) and keeps the last.
    """

    def __init__(self, nn, eps: float = 0.0, train_eps: bool = False, edge_dim: int | None = None,
                 **kwargs):
        super().__init__()
        _message_kwargs(self, kwargs)
        self.nn = nn
        _register_eps(self, eps, train_eps)
        if _edge_dim(self, edge_dim) is not None:
            self.lin = _linear(edge_dim, _nn_in_channels(nn))
        else:
            self.lin = None
        self.reset_parameters()

    def reset_parameters(self):
        if self.aggr_module is not None:
            self.aggr_module.reset_parameters()
        _reset(self.nn)
        with torch.no_grad():
            self.eps.fill_(self.initial_eps)
        if self.lin is not None:
            self.lin.reset_parameters()

    @_eager
    def forward(self, x, edge_index, edge_attr: Tensor | None = None, size=None) -> Tensor:
        name = type(self).__name__
        _check_features(self, x, edge_index)
        edge_index, size = _oriented(self, edge_index, size,
                                     None if isinstance(x, Tensor) else _PAIR_FLOW)
        edge_index, edge_attr, size = _hybrid_input(edge_index, edge_attr, size)
        x_src, x_dst = _pair(x)
        graph, edges = _graph_of(edge_index, size, x_src, x_dst)
        if edge_attr is None:
            raise ValueError(f"'{name}': edge_attr is required (its messages are "
                             "relu(x_j + e_ji)); use GINConv without edge features")
        f = x_src.shape[-1]
        if self.lin is not None and self.lin.out_features != f:
            raise ValueError(f"'{name}': x has {f} features per node, but lin maps edge_attr "
                             f"to {self.lin.out_features} (nn's input width)")
        _check_edge_attr(self, edge_attr, edges, f if self.lin is None else _in_width(self.lin),
                         x_src)
        rows, restore = _node_rows(x_src)
        messages = _gine_messages(edges, rows, _edge_term(self.lin, edge_attr, x_src.dtype))
        out = restore(_reduce_rows(self, messages, edges))
        if x_dst is not None:
            out = out + (1 + self.eps) * x_dst
        return self.nn(out)

    def __repr__(self):
        return f"{type(self).__name__}(nn={self.nn})"


# --------------------------------------------------------- ResGatedGraphConv
class ResGatedGraphConv(torch.nn.Module):
    r"""Residual gated graph convolution (Bresson & Laurent), PyG 2.8's
    `ResGatedGraphConv`:

        x'_i = W_skip x_i + sum_{e = (j -> i)} act(k_i + q_j) * v_j + b,
        k_i = W_k [x_i || e_ji] + b_k,  q_j = W_q [x_j || e_ji] + b_q,
        v_j = W_v [x_j || e_ji] + b_v                 (|| e_ji only with edge_dim)

    in_channels:  int, or (source, target) widths (-1: lazy; not with edge_dim).
    out_channels: output width C.
    act:          the gate (default torch.nn.Sigmoid()).
    edge_dim:     edge feature width D (then edge_attr is required; else
                  it must be None, as in PyG).
    root_weight:  add W_skip x_i (`lin_skip`, no bias).
    bias:         learnable b.
    aggr:         "add" (default) or another aggregation (a keyword, as in PyG).
    forward(x [N, F] | (x_src [Ns, F_s], x_dst [Nt, F_t]),
            edge_index [2, E] | EdgeIndex | adj_t [Nt, Ns], edge_attr [E, D] = None) -> [Nt, C]
        x may be [*, N, F] (a static graph; not with edge_dim, as in PyG).

    Parameters `lin_key`, `lin_query`, `lin_value` (each [C, F + D] and [C]),
    `lin_skip`, `bias`, as PyG's. Their linear maps split over the
    concatenation: k_i = W_k^x x_i + b_k + W_k^e e_ji, and likewise q, v, so
    the projections are node-level ([N, C]) and the edge parts are GEMMs per
    block of edges. With the sigmoid gate and "add", `_GatedSum` makes the
    messages as ONE [E, C] tensor in CSR order, sums them by `segment_csr`
    and keeps nothing per edge for the backward (it recomputes the gate, two
    [E, C] tensors); PyG makes the gathered k_i, q_j, v_j (and, with
    edge_dim, the [E, F + D] concatenations), the gate and the product, and
    keeps several. Any other act or aggr: the pre-activation and the values
    are one [E, C] tensor each (`_EdgeRows`), act and the product run in torch.
    """

    def __init__(self, in_channels, out_channels: int, act=torch.nn.Sigmoid(),
                 edge_dim: int | None = None, root_weight: bool = True, bias: bool = True,
                 **kwargs):
        super().__init__()
        name = type(self).__name__
        _message_kwargs(self, kwargs)
        if not callable(act):
            raise TypeError(f"{name}: act must be callable, got {type(act).__name__}")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.act = act
        self.edge_dim = edge_dim
        self.root_weight = root_weight
        if isinstance(in_channels, int):
            in_channels = (in_channels, in_channels)
        if _edge_dim(self, edge_dim, lazy=False) is not None:
            if min(in_channels) <= 0:
                raise ValueError(f"{name}: lazy in_channels (-1) cannot be combined with "
                                 "edge_dim; give the node feature widths")
        extra = edge_dim if edge_dim is not None else 0
        self.lin_key = _linear(in_channels[1] + extra, out_channels)
        self.lin_query = _linear(in_channels[0] + extra, out_channels)
        self.lin_value = _linear(in_channels[0] + extra, out_channels)
        if root_weight:
            self.lin_skip = _linear(in_channels[1], out_channels, bias=False)
        else:
            self.register_parameter("lin_skip", None)
        _register_bias(self, out_channels, bias)
        self.reset_parameters()

    def reset_parameters(self):
        if self.aggr_module is not None:
            self.aggr_module.reset_parameters()
        self.lin_key.reset_parameters()
        self.lin_query.reset_parameters()
        self.lin_value.reset_parameters()
        if self.lin_skip is not None:
            self.lin_skip.reset_parameters()
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    @_eager
    def forward(self, x, edge_index, edge_attr: Tensor | None = None) -> Tensor:
        name = type(self).__name__
        _check_features(self, x, edge_index)
        if not isinstance(x, Tensor) and x[1] is None:
            raise ValueError(f"'{name}': x must be a tensor or a pair (x_src, x_dst) of "
                             "tensors; x_dst is None")
        _check_widths(self, x, self.in_channels)
        edge_index, _ = _oriented(self, edge_index, None,
                                  None if isinstance(x, Tensor) else _PAIR_FLOW)
        edge_index, edge_attr, size = _hybrid_input(edge_index, edge_attr, None)
        x_src, x_dst = _pair(x)
        graph, edges = _graph_of(edge_index, size, x_src, x_dst)
        _check_edge_dim(self, edge_attr)
        if edge_attr is not None:
            if x_src.dim() != 2 or x_dst.dim() != 2:
                raise ValueError(f"'{name}': x must be [N, F] with edge features (a static "
                                 "graph's [*, N, F] takes none, as in PyG)")
            _check_edge_attr(self, edge_attr, edges, self.edge_dim, x_src)
        out, owned = self._propagate(x_src, x_dst, edge_attr, edges)
        if self.root_weight:
            out = _add_linear(out, self.lin_skip, x_dst, out_is_ours=owned)
        if self.bias is not None:
            out = add_bias(out, self.bias)
        return out

    def _propagate(self, x_src, x_dst, edge_attr, edges):
        """(sum_{j -> i} act(k_i + q_j) * v_j (the layer's aggregation) [Nt, *, C],
        whether nothing else holds that tensor: the fused sum's output, which
        its backward does not read, may take the root term in place)."""
        lins = (self.lin_key, self.lin_query, self.lin_value)
        a_terms, b_terms = [], []
        if edge_attr is None:
            k = self.lin_key(x_dst)
            q, v = (self.lin_query(x_src), self.lin_value(x_src))
        elif all(_plain_linear(lin, x_src.dtype) for lin in lins):
            fd, fs = x_dst.shape[-1], x_src.shape[-1]
            wk, wq, wv = (lin.weight for lin in lins)
            k = F.linear(x_dst, wk[:, :fd], self.lin_key.bias)
            q = F.linear(x_src, wq[:, :fs], self.lin_query.bias)
            v = F.linear(x_src, wv[:, :fs], self.lin_value.bias)
            a_terms = [("linear", (edge_attr, wk[:, fd:] + wq[:, fs:], None))]
            b_terms = [("linear", (edge_attr, wv[:, fs:], None))]
        else:
            return self._propagate_per_edge(x_src, x_dst, edge_attr, edges)
        (k, restore), (q, _), (v, _) = _node_rows(k), _node_rows(q), _node_rows(v)
        if _is_sigmoid(self.act) and self._code == "sum":
            a_kinds = tuple(kind for kind, _ in a_terms)
            b_kinds = tuple(kind for kind, _ in b_terms)
            tensors = [t for _, ts in a_terms + b_terms for t in ts]
            return restore(_GatedSum.apply(edges, a_kinds, b_kinds, k, q, v, *tensors)), True
        pre = _edge_messages(edges, [("dst", (k,)), ("src", (q,)), *a_terms])
        values = _edge_messages(edges, [("src", (v,)), *b_terms])
        return restore(_reduce_rows(self, self.act(pre) * values, edges)), False

    def _propagate_per_edge(self, x_src, x_dst, edge_attr, edges):
        """PyG's message as it stands (linears with hooks or in another
        dtype): the concatenations [x_i || e_ji], [x_j || e_ji] per edge,
        CSR order."""
        e = edge_attr if edges.ids is None else edge_attr.index_select(0, edges.ids)
        xi = x_dst.index_select(0, edges.dst)
        xj = x_src.index_select(0, edges.src)
        k = self.lin_key(torch.cat([xi, e], dim=-1))
        q = self.lin_query(torch.cat([xj, e], dim=-1))
        v = self.lin_value(torch.cat([xj, e], dim=-1))
        return _reduce_rows(self, self.act(k + q) * v, edges), False

    def __repr__(self):
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels})"


# ------------------------------------------------------------------- GENConv
class MessageNorm(torch.nn.Module):
    r"""Message normalisation (DeeperGCN), PyG's `MessageNorm`:
    out = s ||x||_p m / ||m||_p per row, m the aggregated messages [N, F],
    x the node features [N, F'] and s the Parameter `scale` [1] (learnt only
    with learn_scale)."""

    def __init__(self, learn_scale: bool = False):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.empty(1), requires_grad=learn_scale)
        self.reset_parameters()

    def reset_parameters(self):
        with torch.no_grad():
            self.scale.fill_(1.0)

    def forward(self, x: Tensor, msg: Tensor, p: float = 2.0) -> Tensor:
        return F.normalize(msg, p=p, dim=-1) * x.norm(p=p, dim=-1, keepdim=True) * self.scale

    def __repr__(self):
        return f"{type(self).__name__}(learn_scale={self.scale.requires_grad})"


_MLP_NORMS = ("batch", "layer", "instance")


class MLP(torch.nn.Sequential):
    """GENConv's MLP, as PyG lays it out: Linear(c_0, c_1), then for each
    further width norm(c_k), ReLU, Dropout(dropout), Linear(c_k, c_k+1);
    norm "batch" (BatchNorm1d, affine), "layer" (LayerNorm, affine),
    "instance" (InstanceNorm1d, not affine) or none."""

    def __init__(self, channels, norm: str | None = None, bias: bool = True,
                 dropout: float = 0.0):
        if norm and norm not in _MLP_NORMS:
            raise NotImplementedError(f"GENConv: norm={norm!r} is not supported (PyG's "
                                      f"choices: {', '.join(_MLP_NORMS)} or None)")
        modules = []
        for k in range(1, len(channels)):
            modules.append(Linear(channels[k - 1], channels[k], bias=bias))
            if k < len(channels) - 1:
                width = channels[k]
                if norm == "batch":
                    modules.append(torch.nn.BatchNorm1d(width, affine=True))
                elif norm == "layer":
                    modules.append(torch.nn.LayerNorm(width, elementwise_affine=True))
                elif norm == "instance":
                    modules.append(torch.nn.InstanceNorm1d(width, affine=False))
                modules.append(torch.nn.ReLU())
                modules.append(torch.nn.Dropout(dropout))
        super().__init__(*modules)


_GEN_ALIASES = {"softmax_sg": "softmax", "power": "powermean"}


class GENConv(torch.nn.Module):
    r"""Generalised graph convolution (Li et al., DeeperGCN), PyG 2.8's `GENConv`:

        x'_i = MLP(x_i + AGG_{e = (j -> i)} (relu(x_j + e_ji) + eps))

    with x_j = lin_src(x_j) when in_channels (source) != out_channels,
    e_ji = lin_edge(e_ji) when edge_dim != out_channels, AGG's output
    mapped by lin_aggr_out when it is wider than out_channels (a list of
    aggregations), then m_i <- msg_norm(x_i, m_i) with msg_norm, and x_i =
    lin_dst(x_i) when in_channels (target) != out_channels.

    in_channels:  int, or (source, target) widths (-1: lazy).
    out_channels: output width C.
    aggr:         "softmax" (default; "softmax_sg": semi_grad=True), "powermean"
                  ("power"), "add", "mean", "max", ..., a list (MultiAggregation),
                  or an Aggregation; run by aggr.py's modules.
    t, learn_t:   softmax's initial inverse temperature, learnt or fixed.
    p, learn_p:   power mean's initial power, learnt or fixed.
    msg_norm, learn_msg_scale: message normalisation (`MessageNorm`).
    norm:         the MLP's norm: "batch" (default), "layer", "instance" or None.
    num_layers, expansion: the MLP's depth and hidden width factor.
    eps:          added to each message.
    bias:         biases of every Linear (default False, as in PyG).
    edge_dim:     edge feature width (None: edge features must have width C).
    forward(x [N, F] | (x_src [Ns, F_s], x_dst [Nt, F_t] or None),
            edge_index [2, E] | EdgeIndex | adj_t [Nt, Ns], edge_attr [E, D] = None,
            size=None) -> [Nt, C]

    Parameters `aggr_module.t` / `.p` (when learnt), `lin_src`, `lin_edge`,
    `lin_aggr_out`, `lin_dst`, `mlp.*`, `msg_norm.scale`, as PyG's. Without
    edge_attr the message depends on the source alone: relu(x_j) + eps is
    computed per node and aggregated by `segment_reduce` (nothing per edge;
    softmax gathers its [E, C] rows, as PyG's message). With edge_attr the
    messages are ONE [E, C] tensor in CSR order (`_EdgeRows`: lin_edge's GEMM
    added in place per block of edges; the backward keeps the ReLU's bit
    mask) reduced by the aggregation module (softmax's own reduction makes
    its [E, C] weights, as PyG's); PyG makes x_j, lin_edge(e), the sum, the
    ReLU and the message ([E, C] each).

    flow="target_to_source" runs the reversed graph on the projected
    features; PyG's reads x_j from the unprojected ones there and fails when
    lin_src exists (the same result where it does not).
    """

    def __init__(self, in_channels, out_channels: int, aggr="softmax", t: float = 1.0,
                 learn_t: bool = False, p: float = 1.0, learn_p: bool = False,
                 msg_norm: bool = False, learn_msg_scale: bool = False, norm: str | None = "batch",
                 num_layers: int = 2, expansion: int = 2, eps: float = 1e-7, bias: bool = False,
                 edge_dim: int | None = None, **kwargs):
        super().__init__()
        name = type(self).__name__
        semi_grad = isinstance(aggr, str) and aggr == "softmax_sg"
        if isinstance(aggr, str):
            aggr = _GEN_ALIASES.get(aggr, aggr)
        if "aggr_kwargs" not in kwargs:
            if isinstance(aggr, str) and aggr == "softmax":
                kwargs["aggr_kwargs"] = dict(t=t, learn=learn_t, semi_grad=semi_grad)
            elif isinstance(aggr, str) and aggr == "powermean":
                kwargs["aggr_kwargs"] = dict(p=p, learn=learn_p)
        _message_kwargs(self, kwargs, aggr)
        num_layers = _count(name, "num_layers", num_layers, 1)
        expansion = _count(name, "expansion", expansion, 1)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.eps = eps
        if isinstance(in_channels, int):
            in_channels = (in_channels, in_channels)
        if in_channels[0] != out_channels:
            self.lin_src = _linear(in_channels[0], out_channels, bias=bias)
        if _edge_dim(self, edge_dim) is not None and edge_dim != out_channels:
            self.lin_edge = _linear(edge_dim, out_channels, bias=bias)
        aggr_out = out_channels
        if self.aggr_module is not None and hasattr(self.aggr_module, "get_out_channels"):
            aggr_out = self.aggr_module.get_out_channels(out_channels)
        if aggr_out != out_channels:
            self.lin_aggr_out = _linear(aggr_out, out_channels, bias=bias)
        if in_channels[1] != out_channels:
            self.lin_dst = _linear(in_channels[1], out_channels, bias=bias)
        channels = [out_channels] + [out_channels * expansion] * (num_layers - 1) + [out_channels]
        self.mlp = MLP(channels, norm=norm, bias=bias)
        if msg_norm:
            self.msg_norm = MessageNorm(learn_msg_scale)

    def reset_parameters(self):
        if self.aggr_module is not None:
            self.aggr_module.reset_parameters()
        _reset(self.mlp)
        for name in ("msg_norm", "lin_src", "lin_edge", "lin_aggr_out", "lin_dst"):
            if hasattr(self, name):
                getattr(self, name).reset_parameters()

    @_eager
    def forward(self, x, edge_index, edge_attr: Tensor | None = None, size=None) -> Tensor:
        name = type(self).__name__
        _check_features(self, x, edge_index)
        _check_widths(self, x, self.in_channels)
        if any(t is not None and t.dim() != 2 for t in (x if isinstance(x, tuple) else (x,))):
            raise NotImplementedError(f"'{name}': x must be [N, F] (leading dimensions "
                                      "[*, N, F] are not supported by fastgnn.torch here)")
        edge_index, size = _oriented(self, edge_index, size,
                                     None if isinstance(x, Tensor) else _PAIR_FLOW)
        edge_index, edge_attr, size = _hybrid_input(edge_index, edge_attr, size)
        x_src, x_dst = _pair(x)
        if hasattr(self, "lin_src"):
            x_src = self.lin_src(x_src)
        graph, edges = _graph_of(edge_index, size, x_src, x_dst)
        if edge_attr is None:
            out = _reduce_nodes(self, graph, F.relu(x_src) + self.eps)
        else:
            lin = getattr(self, "lin_edge", None)
            _check_edge_attr(self, edge_attr, edges,
                             self.out_channels if lin is None else _in_width(lin), x_src)
            messages = _edge_messages(edges, [("src", (x_src,)),
                                              _edge_term(lin, edge_attr, x_src.dtype)],
                                      relu=True, eps=self.eps)
            out = _reduce_rows(self, messages, edges)
        if hasattr(self, "lin_aggr_out"):
            out = self.lin_aggr_out(out)
        if hasattr(self, "msg_norm"):
            out = self.msg_norm(x_dst if x_dst is not None else x_src, out)
        if x_dst is not None:
            if hasattr(self, "lin_dst"):
                x_dst = self.lin_dst(x_dst)
            out = out + x_dst
        return self.mlp(out)

    def __repr__(self):
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels}, aggr={self.aggr})"


# ---------------------------------------------------- DegreeScalerAggregation
_SCALERS = ("identity", "amplification", "attenuation", "linear", "inverse_linear")


def _average_degrees(deg):
    """(mean degree, mean log(degree + 1)) of the nodes counted by the
    histogram deg (deg[d] = number of nodes of in-degree d), computed in
    float32 as PyG computes them."""
    if not isinstance(deg, Tensor) or deg.dim() != 1 or deg.numel() == 0:
        raise ValueError("deg must be a one-dimensional tensor [max_degree + 1], the histogram "
                         "of in-degrees (PNAConv.get_degree_histogram)")
    deg = deg.to(torch.float)
    nodes = int(deg.sum())
    if nodes <= 0:
        raise ValueError("deg must count at least one node (its entries sum to 0)")
    bins = torch.arange(deg.numel(), device=deg.device)
    return (float((bins * deg).sum()) / nodes, float(((bins + 1).log() * deg).sum()) / nodes)


def _check_scalers(scaler):
    scalers = [scaler] if isinstance(scaler, str) else scaler
    if not isinstance(scalers, (list, tuple)) or not scalers:
        raise TypeError(f"scalers must be a name or a non-empty list of names "
                        f"({', '.join(_SCALERS)}), got {scaler!r}")
    for s in scalers:
        if s not in _SCALERS:
            raise ValueError(f"unknown scaler {s!r} (choices: {', '.join(_SCALERS)})")
    return list(scalers)


class _DegreeScaling:
    r"""The body of `DegreeScalerAggregation` (PyG's, for PNA): the outputs
    of an aggregation o_i scaled by functions of each target's in-degree d_i,
    concatenated along the last dimension in the order of `scaler`:

        identity:        o_i
        amplification:   o_i log(d_i + 1) / delta_log
        attenuation:     o_i delta_log / log(max(d_i, 1) + 1)
        linear:          o_i d_i / delta_lin
        inverse_linear:  o_i delta_lin / max(d_i, 1)

    delta_lin, delta_log: the mean of d and of log(d + 1) over the training
    histogram `deg` (buffers `avg_deg_lin`, `avg_deg_log` [1], Parameters with
    train_norm).

    aggr:        a name, a list of names (a MultiAggregation, cat mode) or an
                 Aggregation; fastgnn's modules (aggr.py).
    scaler:      a name or a list of names.
    deg:         [max_degree + 1] histogram of in-degrees.
    train_norm:  learn delta_lin and delta_log.
    aggr_kwargs: as PyG: the aggregation's kwargs (a list of dicts for a list).
    Call forms: PyG's (x, index or ptr, dim_size, dim) and `neighbour(graph,
    x_src)` (the aggregation's fused path; degrees from the graph).
    """
    _codes = ()

    def __init__(self, aggr, scaler, deg, train_norm: bool = False, aggr_kwargs=None, *,
                 deterministic: bool = True):
        super().__init__(deterministic=deterministic)
        from .aggr import MultiAggregation, _SegmentAggregation, resolve_aggregation
        if isinstance(aggr, (list, tuple)):
            self.aggr = MultiAggregation(list(aggr), aggr_kwargs)
        elif isinstance(aggr, str) or isinstance(aggr, torch.nn.Module):
            self.aggr = resolve_aggregation(aggr, **(aggr_kwargs or {}))
        else:
            raise ValueError(f"DegreeScalerAggregation: aggr must be a name, a list of names or "
                             f"an Aggregation, got {type(aggr).__name__}")
        if not isinstance(self.aggr, _SegmentAggregation):
            raise NotImplementedError("DegreeScalerAggregation: aggr is not supported")
        self.scaler = _check_scalers(scaler)
        self.init_avg_deg_lin, self.init_avg_deg_log = _average_degrees(deg)
        if train_norm:
            self.avg_deg_lin = torch.nn.Parameter(torch.empty(1))
            self.avg_deg_log = torch.nn.Parameter(torch.empty(1))
        else:
            self.register_buffer("avg_deg_lin", torch.empty(1))
            self.register_buffer("avg_deg_log", torch.empty(1))
        self.reset_parameters()

    def reset_parameters(self):
        with torch.no_grad():
            self.avg_deg_lin.fill_(self.init_avg_deg_lin)
            self.avg_deg_log.fill_(self.init_avg_deg_log)

    def forward(self, x: Tensor, index: Tensor | None = None, ptr: Tensor | None = None,
                dim_size: int | None = None, dim: int = -2,
                max_num_elements: int | None = None) -> Tensor:
        """PyG's call: the aggregation of x's rows along `dim` into groups (by
        `index`, or CSR offsets `ptr`), scaled by each group's size."""
        if index is None and ptr is None:
            raise ValueError("DegreeScalerAggregation needs index or ptr (the degrees are the "
                             "group sizes)")
        out = self.aggr(x, index, ptr, dim_size, dim)
        dim = dim % x.dim()
        if ptr is not None:
            deg = ptr[1:] - ptr[:-1]
        else:
            deg = torch.bincount(index, minlength=out.shape[dim])
        return self.scale(out, deg, dim)

    def neighbour(self, graph, x_src: Tensor, num_nodes=None, *,
                  deterministic: bool = True) -> Tensor:
        """The aggregation's fused path (`aggr.neighbour`) scaled by the in-degrees."""
        from .functional import _resolve_for
        out = self.aggr.neighbour(graph, x_src, num_nodes, deterministic=deterministic)
        resolved, _ = _resolve_for(graph, x_src, num_nodes)
        return self.scale(out, _edges(resolved).degree(out.dtype), 0)

    def scale(self, out: Tensor, deg: Tensor, dim: int = 0) -> Tensor:
        """out (groups along `dim`) times each scaler's factor of the group
        degrees deg [S], concatenated along the last dimension."""
        shape = [1] * out.dim()
        shape[dim] = -1
        deg = deg.to(out.dtype).view(shape)
        outs = []
        for s in self.scaler:
            if s == "identity":
                outs.append(out)
            elif s == "amplification":
                outs.append(out * (torch.log(deg + 1) / self.avg_deg_log))
            elif s == "attenuation":
                outs.append(out * (self.avg_deg_log / torch.log(deg.clamp(min=1) + 1)))
            elif s == "linear":
                outs.append(out * (deg / self.avg_deg_lin))
            else:
                outs.append(out * (self.avg_deg_lin / deg.clamp(min=1)))
        return torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0]

    def _per_edge(self) -> bool:
        return self.aggr._per_edge()

    def __repr__(self):
        return f"{type(self).__name__}({self.aggr}, scaler={self.scaler})"


@functools.lru_cache(maxsize=None)
def _degree_scaler_class():
    """DegreeScalerAggregation: `_DegreeScaling` on aggr.py's base (a PyG
    Aggregation when PyG is installed), made on first use, since importing
    aggr.py imports PyG."""
    from .aggr import _SegmentAggregation
    cls = type("DegreeScalerAggregation", (_DegreeScaling, _SegmentAggregation),
               {"__module__": __name__, "__doc__": _DegreeScaling.__doc__})
    cls.__qualname__ = "DegreeScalerAggregation"
    return cls


def __getattr__(name):
    if name == "DegreeScalerAggregation":
        return _degree_scaler_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------- PNAConv
def _activation(act, act_kwargs):
    """PyG's activation lookup: a name of a torch.nn activation class (case,
    '-', '_' and ' ' ignored; an "act" in the class name optional) gives a
    new instance made with act_kwargs; anything else is used as given."""
    if not isinstance(act, str):
        return act

    def normal(s):
        return s.lower().replace("-", "").replace("_", "").replace(" ", "")
    key = normal(act)
    for cls in vars(torch.nn.modules.activation).values():
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
            name = normal(cls.__name__)
            if key in (name, name.replace("act", "")):
                return cls(**(act_kwargs or {}))
    raise ValueError(f"PNAConv: act={act!r} names no torch.nn activation")


# aggregators whose value on x_i + y_j is y's shifted by a per-target constant
_SHIFTABLE = {"sum", "mean", "max", "min", "var", "std"}


class PNAConv(torch.nn.Module):
    r"""Principal neighbourhood aggregation (Corso et al.), PyG 2.8's `PNAConv`:

        x'_i = W_out [gamma_1(x_i, a_i^1) || ... || gamma_T(x_i, a_i^T)] + b_out,
        a_i^t = scalers(d_i) (x) aggregators_{e = (j -> i)} h_t([x_i^t || x_j^t || E e_ji])

    per tower t = 1..T (x^t: x itself, or its t-th slice of in_channels / T
    with divide_input); h_t (`pre_nns[t]`: Linear, then (act, Linear) x
    (pre_layers - 1)) and gamma_t (`post_nns[t]`, on [x_i^t || a_i^t]) are
    MLPs; E is `edge_encoder` (with edge_dim); d_i the in-degree; the
    scalers those of `DegreeScalerAggregation`.

    in_channels, out_channels: widths (out_channels divisible by towers;
                   in_channels too with divide_input).
    aggregators:   list of "sum", "mean", "min", "max", "var", "std" (any name
                   aggr.py resolves).
    scalers:       list of "identity", "amplification", "attenuation",
                   "linear", "inverse_linear".
    deg:           [max_degree + 1] in-degree histogram of the training graphs
                   (`get_degree_histogram`).
    edge_dim:      edge feature width (then edge_attr is required).
    towers, pre_layers, post_layers, divide_input, act, act_kwargs, train_norm:
                   as in PyG.
    forward(x [N, in_channels], edge_index [2, E] | EdgeIndex | adj_t [N, N],
            edge_attr [E, edge_dim] = None) -> [N, out_channels]

    Parameters `aggr_module.avg_deg_lin` / `.avg_deg_log`, `edge_encoder`,
    `pre_nns.t.k`, `post_nns.t.k`, `lin`, as PyG's. The first Linear of h_t
    splits over the concatenation: h_t = P_i + Q_j + C E e_ji with P = x W_i^T
    + b, Q = x W_j^T node-level ([N, T * F]). With pre_layers=1 and
    aggregators among sum, mean, min, max, var, std, P_i is a per-target
    shift of every message (sum: d_i P_i, mean/min/max: P_i where d_i > 0,
    var/std: none), so without edge_attr all aggregators are ONE fused
    `segment_reduce` of Q (nothing per edge), and with it one `segment_csr`
    over the [E, T * F] rows Q_j + C E e_ji (`_EdgeRows`, the GEMM per block
    of edges). Otherwise the rows P_i + Q_j (+ C E e_ji) are one [E, T * F]
    tensor, the rest of each h_t runs on its slice in torch, and the
    aggregators reduce the result. PyG makes [x_i || x_j || e_ji] ([E, T,
    3F]) and every layer of each h_t per edge.
    """

    def __init__(self, in_channels: int, out_channels: int, aggregators, scalers, deg: Tensor,
                 edge_dim: int | None = None, towers: int = 1, pre_layers: int = 1,
                 post_layers: int = 1, divide_input: bool = False, act="relu",
                 act_kwargs=None, train_norm: bool = False, **kwargs):
        super().__init__()
        name = type(self).__name__
        for taken in ("aggr", "node_dim"):
            if taken in kwargs:
                raise TypeError(f"{name} sets {taken} itself; got {taken}={kwargs[taken]!r}")
        self.flow = _check_kwargs(name, kwargs)
        if not isinstance(aggregators, (list, tuple)) or not aggregators:
            raise TypeError(f"{name}: aggregators must be a non-empty list of names, "
                            f"got {aggregators!r}")
        if isinstance(scalers, str):
            raise TypeError(f"{name}: scalers must be a list of names, got {scalers!r}")
        in_channels = _count(name, "in_channels", in_channels, 1)
        out_channels = _count(name, "out_channels", out_channels, 1)
        towers = _count(name, "towers", towers, 1)
        pre_layers = _count(name, "pre_layers", pre_layers, 1)
        post_layers = _count(name, "post_layers", post_layers, 1)
        if divide_input and in_channels % towers:
            raise ValueError(f"{name}: in_channels={in_channels} must be divisible by "
                             f"towers={towers} with divide_input")
        if out_channels % towers:
            raise ValueError(f"{name}: out_channels={out_channels} must be divisible by "
                             f"towers={towers}")
        _edge_dim(self, edge_dim)
        if act is None and (pre_layers > 1 or post_layers > 1):
            raise ValueError(f"{name}: act=None leaves no activation between the "
                             "pre/post layers; give one (e.g. 'relu')")
        self.aggr = "DegreeScalerAggregation"
        self.aggr_module = _degree_scaler_class()(list(aggregators), scalers, deg, train_norm)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.edge_dim = edge_dim
        self.towers = towers
        self.divide_input = divide_input
        self.F_in = in_channels // towers if divide_input else in_channels
        self.F_out = out_channels // towers
        if edge_dim is not None:
            self.edge_encoder = _linear(edge_dim, self.F_in)
        self.pre_nns = torch.nn.ModuleList()
        self.post_nns = torch.nn.ModuleList()
        blocks = len(aggregators) * len(self.aggr_module.scaler)
        for _ in range(towers):
            modules = [Linear((3 if edge_dim else 2) * self.F_in, self.F_in)]
            for _ in range(pre_layers - 1):
                modules += [_activation(act, act_kwargs), Linear(self.F_in, self.F_in)]
            self.pre_nns.append(torch.nn.Sequential(*modules))
            modules = [Linear((blocks + 1) * self.F_in, self.F_out)]
            for _ in range(post_layers - 1):
                modules += [_activation(act, act_kwargs), Linear(self.F_out, self.F_out)]
            self.post_nns.append(torch.nn.Sequential(*modules))
        self.lin = Linear(out_channels, out_channels)
        self.reset_parameters()

    def reset_parameters(self):
        self.aggr_module.reset_parameters()
        if self.edge_dim is not None:
            self.edge_encoder.reset_parameters()
        for nn in self.pre_nns:
            _reset(nn)
        for nn in self.post_nns:
            _reset(nn)
        self.lin.reset_parameters()

    @_eager
    def forward(self, x: Tensor, edge_index, edge_attr: Tensor | None = None) -> Tensor:
        name = type(self).__name__
        _check_single_features(self, x, edge_index)
        if x.dim() != 2:
            raise ValueError(f"'{name}': x must have shape [N, in_channels], got "
                             f"{tuple(x.shape)}")
        _check_widths(self, x, self.in_channels)
        edge_index, _ = _oriented(self, edge_index)
        edge_index, edge_attr, size = _hybrid_input(edge_index, edge_attr, None)
        graph, edges = _graph_of(edge_index, size, x, x)
        _check_edge_dim(self, edge_attr)
        if edge_attr is not None:
            _check_edge_attr(self, edge_attr, edges, _in_width(self.edge_encoder), x)
        n, towers, f = x.shape[0], self.towers, self.F_in
        xt = x.view(n, towers, f) if self.divide_input else x.view(n, 1, f).expand(n, towers, f)
        agg = self._aggregate(x, xt, edge_attr, graph, edges)          # [N, A * T * F]
        blocks = agg.shape[1] // (towers * f)
        agg = agg.view(n, blocks, towers, f).transpose(1, 2).reshape(n, towers, blocks * f)
        out = torch.cat([xt, self.aggr_module.scale(agg, edges.degree(agg.dtype), 0)], dim=-1)
        out = torch.cat([nn(out[:, t]) for t, nn in enumerate(self.post_nns)], dim=1)
        return self.lin(out)

    def _aggregate(self, x, xt, edge_attr, graph, edges):
        """Every aggregator over the towers' messages: [N, A * T * F], block
        a the a-th aggregator over the T * F columns (tower-major)."""
        aggr = self.aggr_module.aggr
        firsts = [nn[0] for nn in self.pre_nns]
        if not all(_plain_linear(lin, x.dtype) and _no_hooks(nn)
                   for lin, nn in zip(firsts, self.pre_nns)):
            return aggr(self._messages_per_edge(xt, edge_attr, edges), ptr=edges.ptr,
                        dim_size=edges.num_dst, dim=0)
        f = self.F_in
        if self.divide_input:
            p = torch.cat([F.linear(xt[:, t], lin.weight[:, :f], lin.bias)
                           for t, lin in enumerate(firsts)], dim=1)
            q = torch.cat([F.linear(xt[:, t], lin.weight[:, f:2 * f])
                           for t, lin in enumerate(firsts)], dim=1)
        else:
            p = F.linear(x, torch.cat([lin.weight[:, :f] for lin in firsts]),
                         torch.cat([lin.bias for lin in firsts]))
            q = F.linear(x, torch.cat([lin.weight[:, f:2 * f] for lin in firsts]))
        terms = []
        if edge_attr is not None:
            encoded = self.edge_encoder(edge_attr)                   # [E, F]
            terms = [("linear", (encoded, torch.cat([lin.weight[:, 2 * f:] for lin in firsts]),
                                 None))]
        codes = aggr._codes if aggr._fused_cat() else ()
        if all(len(nn) == 1 for nn in self.pre_nns) and codes and set(codes) <= _SHIFTABLE:
            if terms:
                out = aggr(_edge_messages(edges, [("src", (q,)), *terms]), ptr=edges.ptr,
                           dim_size=edges.num_dst, dim=0)
            else:
                out = aggr.neighbour(graph, q)
            return _shifted(out, p, codes, edges.degree(out.dtype))
        rows = _edge_messages(edges, [("dst", (p,)), ("src", (q,)), *terms])
        if any(len(nn) > 1 for nn in self.pre_nns):
            rows = torch.cat([nn[1:](rows[:, t * f:(t + 1) * f])
                              for t, nn in enumerate(self.pre_nns)], dim=1)
        return aggr(rows, ptr=edges.ptr, dim_size=edges.num_dst, dim=0)

    def _messages_per_edge(self, xt, edge_attr, edges):
        """PyG's messages as they stand (pre_nns with hooks or in another
        dtype): h_t([x_i || x_j || E e]) per edge, CSR order, [E, T * F]."""
        parts = [xt.index_select(0, edges.dst), xt.index_select(0, edges.src)]
        if edge_attr is not None:
            e = self.edge_encoder(edge_attr)
            e = e if edges.ids is None else e.index_select(0, edges.ids)
            parts.append(e.unsqueeze(1).expand(-1, self.towers, -1))
        h = torch.cat(parts, dim=-1)
        return torch.cat([nn(h[:, t]) for t, nn in enumerate(self.pre_nns)], dim=1)

    @staticmethod
    def get_degree_histogram(loader) -> Tensor:
        """[max_degree + 1] counts of nodes by in-degree over every graph of
        `loader` (objects with edge_index and num_nodes), for `deg`."""
        hist = torch.zeros(1, dtype=torch.long)
        for data in loader:
            deg = torch.bincount(data.edge_index[1], minlength=data.num_nodes)
            counts = torch.bincount(deg, minlength=hist.numel())
            hist = hist.to(counts.device)
            if counts.numel() > hist.numel():
                counts[:hist.numel()] += hist
                hist = counts
            else:
                hist += counts
        return hist

    def __repr__(self):
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"towers={self.towers}, edge_dim={self.edge_dim})")


def _shifted(out, p, codes, deg):
    """The aggregators' blocks of out [N, A * C] (the values of y_j) turned
    into those of p_i + y_j: sum + d_i p_i; mean, max, min + p_i where
    d_i > 0 (an empty group stays 0); var, std unchanged."""
    width = p.shape[1]
    has = (deg > 0).to(p.dtype).unsqueeze(1)
    blocks = []
    for k, code in enumerate(codes):
        block = out[:, k * width:(k + 1) * width]
        if code == "sum":
            block = block + deg.unsqueeze(1) * p
        elif code in ("mean", "max", "min"):
            block = block + has * p
        blocks.append(block)
    return torch.cat(blocks, dim=1) if len(blocks) > 1 else blocks[0]
