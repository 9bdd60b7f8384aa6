"""Attention for PyTorch: `edge_softmax` and `edge_attention` on torch tensors,
and drop-in replacements for PyG 2.8's `GATConv`, `GATv2Conv` and
`TransformerConv`.

Both functions run fastgnn's forward/backward pairs through the one generic
bridge (`fastgnn.torch.apply`, one `Op` per pair): the softmax and the
weighted sum are fused, nothing of size edges x heads x channels is
allocated by the op, and the backward recomputes the scores.

Dropout seeds
-------------
Attention dropout uses fastgnn's counter-based generator (`fastgnn.rng`):
weight (e, h) is kept iff a hash of (seed, offset + e*H + h) says so; no mask
is stored and the backward regenerates it. With `seed=None` (the default, and
what the layers use) every call draws a fresh seed from torch's default CPU
generator (`torch.randint`, also for CUDA tensors: no device sync), so
`torch.manual_seed(s)` makes training runs reproducible and each call gets a
new mask; `offset` is then 0. An explicit `seed` gives the same mask for the
same (seed, offset) every time: a caller that reuses one seed over several
calls keeps an offset counter and advances it by E * H per call (as
PyTorch's Philox seed/offset pairs do). Dropout is active only when
`training` is true and `dropout > 0`. Dropout draws differ from PyG's
`F.dropout` masks; the distribution is the same (keep with probability
1 - p, kept weights scaled by 1/(1 - p)).

Layers
------
Same constructor arguments, parameter names (a PyG `state_dict` loads with
`strict=True`), forward inputs (edge_index tensor, PyG EdgeIndex or torch
sparse adj_t, `(x_src, x_dst)` pairs, `edge_attr`, `return_attention_weights`)
and the same function as PyG 2.8. The dense projections are torch ops
(nn.Linear); the per-edge part (scores, softmax over in-edges, dropout,
weighted sum) is one fastgnn op. Graphs with added self-loops are built once
per edge_index and cached (`fastgnn.torch.to_graph`'s LRU). A sparse adj_t
is read as PyG reads it: its entries (COO coalesced, duplicates merged) are
the edges, its values are ignored, and GATConv/GATv2Conv loop it as they
loop an edge_index, returning their weights as the looped adj_t's values.
"""
from __future__ import annotations

import functools
import math
import numbers

import numpy as np
import torch
from torch import Tensor

from fastgnn import rng
from fastgnn.graph import Graph
from fastgnn.ops.spmm import self_loop_structure
from fastgnn.ops.attention import (SCORE_INPUTS, dropout_spec, edge_attention_bwd,
                                   edge_attention_fwd, edge_softmax_bwd, edge_softmax_fwd)

from . import custom_ops, plans
from ._autograd import Op, apply, device_scope, to_tensor
from .functional import add_bias, segment_reduce
from .gemm import tf32_allowed
from .graph_cache import (_GRAPHS, CompiledGraph, _check_edge_index, _is_edge_index_type, _tkey,
                          graph_input, resolve, to_graph)
from .nn import (_check_features, _check_kwargs, _graph_sizes, _is_sparse, _linear, _oriented,
                 _pair, _pop_deterministic, shared_input_linears)

__all__ = ["edge_softmax", "edge_attention", "GATConv", "GATv2Conv", "TransformerConv",
           "EDGE_SOFTMAX", "EDGE_ATTENTION"]


# ------------------------------------------------------------------ the Ops
def _softmax_fwd(graph, scores, **kw):
    return edge_softmax_fwd(graph, scores, **kw)


def _softmax_bwd(graph, res, grad_out):
    return (edge_softmax_bwd(graph, res, grad_out),)


EDGE_SOFTMAX = Op("edge_softmax", _softmax_fwd, _softmax_bwd, inputs=("scores",),
                  features=("scores",), cuda=plans.EDGE_SOFTMAX)

# every array input of edge_attention, over all score functions, in call order
_ATTN_INPUTS = ("a_src", "a_dst", "a_edge", "v", "xl", "xr", "att", "xe", "q", "k", "ee", "bias")


def _attention_fwd(graph, *arrays, score, **kw):
    # fp32 may take the Tensor Core kernels as TF32 where torch lets matmuls
    return edge_attention_fwd(graph, score, **dict(zip(_ATTN_INPUTS, arrays)), **kw,
                              tf32=tf32_allowed())


def _attention_bwd(graph, res, grad_out, grad_alpha=None, **flags):
    names = SCORE_INPUTS[res.score]
    needs = [n for n in names if flags.get(f"needs_{n}")]
    grads = dict(zip(names, edge_attention_bwd(graph, res, grad_out, grad_alpha, needs=needs)))
    return tuple(grads.get(n) for n in _ATTN_INPUTS)


EDGE_ATTENTION = Op("edge_attention", _attention_fwd, _attention_bwd, inputs=_ATTN_INPUTS,
                    features=_ATTN_INPUTS, bwd_flags={f"needs_{n}": n for n in _ATTN_INPUTS},
                    cuda=plans.EDGE_ATTENTION)
# the plan path's backward falls back to this op's bridge where no plan serves
plans.EDGE_ATTENTION.op = EDGE_ATTENTION


# ------------------------------------------------------------------ dropout
def draw_seed() -> int:
    """A dropout seed from torch's default CPU generator (reproducible under
    torch.manual_seed)."""
    return int(torch.randint(0, 2**63 - 1, (1,), dtype=torch.int64).item())


def _dropout(dropout, seed, offset, training):
    """(p, seed, offset) for the core: p = 0 unless training with dropout > 0;
    seed None draws one (see the module docstring)."""
    spec = dropout_spec(dropout, 0 if seed is None else seed, offset)   # validates
    if not training or spec.p == 0:
        return 0.0, 0, 0
    return spec.p, (draw_seed() if seed is None else spec.seed), spec.offset


def _graph_arg(edge_index_or_graph, num_nodes):
    graph, _ = resolve(edge_index_or_graph, num_nodes)   # attention ignores adj_t values
    return graph


# --------------------------------------------------------------- functional
def edge_softmax(edge_index_or_graph, scores, num_nodes=None, *, dropout=0.0, seed=None,
                 offset=0, training=True):
    r"""Softmax of per-edge scores over each target's in-edges, per head, with
    optional attention dropout (PyG's `softmax(scores, edge_index[1])`,
    followed by `F.dropout`), differentiable in scores:

        out[e, h] = z[e, h] exp(s[e, h]) / sum_{e' in N(i)} exp(s[e', h])    (e = (j -> i))

    edge_index_or_graph: [2, E] integer tensor (row 0 sources, row 1 targets),
                 PyG EdgeIndex, torch sparse adj_t [num_dst, num_src] (its
                 values are ignored; edges in storage order), DGLGraph (edges
                 in DGL's order) or fastgnn.Graph.
    scores:      [E] or [E, H] float tensor in the edges' order.
    num_nodes:   number of targets (None: max target index + 1), or
                 (num_src, num_dst).
    dropout:     probability p of zeroing a weight (kept ones scaled by
                 z = 1/(1-p)); only when `training`.
    seed, offset: the counter-based generator's seed and counter offset; seed
                 None draws a fresh seed from torch's default generator per
                 call (see the module docstring).
    Returns a tensor of the scores' shape and dtype.
    """
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"scores must be a torch.Tensor, got {type(scores).__name__}")
    if num_nodes is not None and not isinstance(num_nodes, (tuple, list)):
        num_nodes = (None, int(num_nodes))          # sources do not matter here
    if custom_ops.compiling():
        ei, sizes = graph_input(edge_index_or_graph, num_nodes)
        p, seed_t = _compiled_dropout(dropout, seed, training)
        return custom_ops.call("edge_softmax", ei, scores, seed_t, num_nodes=sizes, dropout=p,
                               offset=offset)
    graph = _graph_arg(edge_index_or_graph, num_nodes)
    p, seed, offset = _dropout(dropout, seed, offset, training)
    return apply(EDGE_SOFTMAX, graph, scores, dropout=p, seed=seed, offset=offset)


_SIDES = {"gat": (("v", "a_src"), ("a_dst",)), "gatv2": (("xl",), ("xr",)),
          "dot": (("k", "v"), ("q",))}


def edge_attention(edge_index_or_graph, score, *, a_src=None, a_dst=None, a_edge=None, v=None,
                   xl=None, xr=None, att=None, xe=None, q=None, k=None, ee=None, bias=None,
                   negative_slope=0.2, scale=None, dropout=0.0, seed=None, offset=0,
                   training=True, return_attention_weights=False, num_nodes=None,
                   deterministic=True):
    r"""Fused edge attention over each target's in-edges, differentiable in
    every tensor input (see `fastgnn.edge_attention` for the math). Per head h,
    for edges e = (j -> i):

        out[i, h] = sum_{e in N(i)} softmax_{N(i)}(s)_e z_e m_e[h]      (0 without in-edges)

    score="gat":   a_src [num_src, H], a_dst [num_dst, H], a_edge [E, H] optional,
                   v [num_src, H, C]:   s_e = LeakyReLU(a_src[j] + a_dst[i] + a_edge[e]),
                   m_e = v[j]
    score="gatv2": xl [num_src, H, C], xr [num_dst, H, C], att [H, C] or [1, H, C],
                   xe [E, H, C] optional:
                   s_e = sum_c att[h, c] LeakyReLU(xl[j] + xr[i] + xe[e])[c],  m_e = xl[j]
    score="dot":   q [num_dst, H, C], k, v [num_src, H, C], ee [E, H, C] optional:
                   s_e = scale <q[i], k[j] + ee[e]>,  m_e = v[j] + ee[e]

    edge_index_or_graph: as in `edge_softmax` (adj_t values are ignored).
    negative_slope: LeakyReLU slope ("gat", "gatv2").
    scale:     "dot" only; default 1/sqrt(C).
    bias:      [H, C] or [H * C] optional, added to every output row in the
               kernel's store (no pass of its own); differentiable.
    dropout, seed, offset, training: attention dropout as in `edge_softmax`.
    return_attention_weights: also return alpha [E, H], the softmax weights
               before dropout, in the edges' order (differentiable).
    num_nodes: (num_src, num_dst) or an int (square); default from the inputs'
               rows (source side: a_src/v, xl, k/v; target side: a_dst, xr, q).
    deterministic: True (default) keeps the backward bitwise repeatable; False
               (CUDA only, ignored on the CPU) lets it add the source-side
               gradients with float atomics, skipping a pass (faster).
    Returns out [num_dst, H, C] (and alpha) in the inputs' dtype.
    """
    tensors = dict(a_src=a_src, a_dst=a_dst, a_edge=a_edge, v=v, xl=xl, xr=xr, att=att, xe=xe,
                   q=q, k=k, ee=ee, bias=bias)
    if num_nodes is None and isinstance(score, str) and score in _SIDES:
        src_side, dst_side = _SIDES[score]

        def rows(names):
            for n in names:
                t = tensors[n]
                if isinstance(t, torch.Tensor) and t.dim() >= 1:
                    return int(t.shape[0])
            return None
        num_nodes = (rows(src_side), rows(dst_side))
    if custom_ops.compiling():
        ei, sizes = graph_input(edge_index_or_graph, num_nodes)
        return _compiled_attention(CompiledGraph(ei, sizes, None), score, tensors,
                                   bool(return_attention_weights), dropout, seed, offset,
                                   training, negative_slope=negative_slope, scale=scale,
                                   deterministic=deterministic, dropped=False)[:2]
    graph = _graph_arg(edge_index_or_graph, num_nodes)
    p, seed, offset = _dropout(dropout, seed, offset, training)
    return apply(EDGE_ATTENTION, graph, *(tensors[n] for n in _ATTN_INPUTS), score=score,
                 negative_slope=negative_slope, scale=scale, dropout=p, seed=seed,
                 offset=offset, return_attention_weights=bool(return_attention_weights),
                 deterministic=deterministic)


# ------------------------------------------------------------------ helpers
def _glorot(t):
    """PyG's glorot for a tensor: uniform(+-sqrt(6 / (fan of the last two dims)))."""
    if t is not None:
        bound = math.sqrt(6.0 / (t.size(-2) + t.size(-1)))
        with torch.no_grad():
            t.uniform_(-bound, bound)


def _materialise(lin, x):
    """Run a lazy Linear once on an empty slice so its weight exists."""
    if isinstance(lin, torch.nn.LazyLinear) and lin.has_uninitialized_params():
        lin(x[:0])


def _plain(edge_index):
    return edge_index.as_tensor() if _is_edge_index_type(edge_index) else edge_index


def _loop_graph(edge_index, num_src, num_dst, num_loops):
    """PyG's remove_self_loops + add_self_loops(num_nodes=num_loops) on an
    edge_index: (Graph, looped_edge_index, kept [E''] int64, fill_graph), where
    looped_edge_index() returns edge_index' [2, E'] int64, the non-loop edges
    in order, then loops 0..num_loops-1, and kept are the positions of those
    non-loop edges; fill_graph() returns the Graph (loop node i <- the kept
    edges with target i, stable order) that reduces their features into the
    loops'. Both functions build their result on their first call: only
    returned attention weights and edge features need them, and a new graph
    every step should not pay for them otherwise. Built once per edge_index
    tensor (the graph cache's LRU)."""
    key = ("attention_self_loops", num_src, num_dst, num_loops)
    ei = None if isinstance(edge_index, Graph) else _plain(edge_index)
    if ei is not None:
        _check_edge_index(ei)       # before the .long() below could truncate floats

    def build():
        # a Graph's (e.g. a sparse adj_t's) edge_index is made on a cache miss only
        e = to_tensor(edge_index.edge_index()) if ei is None else ei
        with device_scope(e.device):
            e = e.detach().long()
            if ei is not None and num_src == num_dst == num_loops:
                # a loop on every node: the edge_index's own graph with its loops
                # replaced, in CSR order without a sort (self_loop_structure)
                graph, kept, _ = self_loop_structure(to_graph(edge_index, (num_src, num_dst)))
                kept = to_tensor(kept)
            else:
                kept, graph = torch.nonzero(e[0] != e[1]).view(-1), None

            def looped():
                with device_scope(e.device):
                    loops = torch.arange(num_loops, device=e.device).expand(2, num_loops)
                    return torch.cat([e[:, kept], loops], dim=1)
            looped = functools.lru_cache(maxsize=1)(looped)
            if graph is None:
                graph = Graph.from_edge_index(looped(), num_src=num_src, num_dst=num_dst)

            def fill():
                # loop node i <- the kept edges with target i (stable order): the
                # graph the loop features are reduced over
                with device_scope(e.device):
                    kept_dst = e[1, kept]
                    by_dst = torch.argsort(kept_dst, stable=True)
                    counts = torch.bincount(kept_dst, minlength=num_loops)[:num_loops]
                    ptr = torch.zeros(num_loops + 1, dtype=torch.long, device=e.device)
                    torch.cumsum(counts, 0, out=ptr[1:])
                    return Graph.from_csr(ptr, by_dst[:int(ptr[-1])], num_src=kept.shape[0])
            fill = functools.lru_cache(maxsize=1)(fill)
            if isinstance(edge_index, Graph):
                graph.with_visit_order_of(edge_index)
            return graph, looped, kept, fill
    if isinstance(edge_index, Graph):
        return edge_index.cached(("fastgnn.torch",) + key, build)
    return _GRAPHS.get(key + (_tkey(ei),), edge_index, build)


_FILL_SEGMENT = {"add": "sum", "sum": "sum", "mean": "mean", "max": "max", "amax": "max",
                 "min": "min", "amin": "min"}


def _loop_attr(edge_attr, dst, n, fill_value, fill_graph=None):
    """Edge features of the n added self-loops, PyG's `compute_loop_attr`
    re-implemented with differentiable ops (edge_attr: the non-loop edges'
    features, dst(): their targets, called only by the mul and any fills,
    which scatter by target). The sum/mean/max/min fills are fastgnn's
    segment reductions over `fill_graph()` (from `_loop_graph`; no gathered
    copy of edge_attr): deterministic on the GPU, unlike torch's scatter_add."""
    size = (n,) + tuple(edge_attr.shape[1:])
    if fill_value is None:
        return edge_attr.new_ones(size)
    if isinstance(fill_value, Tensor):
        fill = fill_value.to(edge_attr.device, edge_attr.dtype)
        if fill.dim() != edge_attr.dim():
            fill = fill.unsqueeze(0)
        return fill.expand(size).contiguous()
    if isinstance(fill_value, numbers.Number) and not isinstance(fill_value, bool):
        return edge_attr.new_full(size, float(fill_value))
    if not isinstance(fill_value, str):
        raise AttributeError("No valid 'fill_value' provided")
    if fill_value in _FILL_SEGMENT:
        flat = edge_attr.reshape(edge_attr.shape[0], math.prod(edge_attr.shape[1:]))
        return segment_reduce(fill_graph(), flat, _FILL_SEGMENT[fill_value]).reshape(size)
    index = dst().view((-1,) + (1,) * (edge_attr.dim() - 1)).expand_as(edge_attr)
    if fill_value == "mul":
        return edge_attr.new_ones(size).scatter_reduce(0, index, edge_attr, reduce="prod",
                                                       include_self=True)
    if fill_value == "any":
        return edge_attr.new_zeros(size).scatter(0, index, edge_attr)
    raise ValueError(f"Encountered invalid `reduce` argument '{fill_value}'")


def _attention_graph(layer, edge_index, edge_attr, num_src, num_dst, num_loops, fill_value,
                     need_attr):
    """(graph, returned edge_index, edge_attr in the graph's edge order) with
    or without PyG's self-loop handling (num_loops None: none added)."""
    if custom_ops.compiling():
        ei, sizes = graph_input(edge_index, (num_src, num_dst))
        if num_loops is not None and edge_attr is not None and need_attr:
            if isinstance(fill_value, Tensor):
                raise NotImplementedError(f"{layer} under torch.compile: fill_value must be a "
                                          "number or a reduction name, not a tensor")
            edge_attr = custom_ops.call("attention_loop_edge_attr", ei, edge_attr,
                                        num_nodes=sizes, num_loops=num_loops,
                                        fill_value=fill_value)
        elif num_loops is not None:
            edge_attr = None
        return CompiledGraph(ei, sizes, num_loops), None, edge_attr
    if num_loops is None:
        graph, _ = resolve(edge_index, (num_src, num_dst))
        return graph, edge_index, edge_attr
    if _is_sparse(edge_index):
        # PyG loops an adj_t's entries (storage order, COO coalesced) as an edge_index
        edge_index = resolve(edge_index, (num_src, num_dst))[0]
    graph, looped, kept, fill = _loop_graph(edge_index, num_src, num_dst, num_loops)
    if edge_attr is not None and need_attr:
        kept_attr = edge_attr[kept]
        loop = _loop_attr(kept_attr, lambda: looped()[1, :kept.shape[0]], num_loops,
                          fill_value, fill)
        edge_attr = torch.cat([kept_attr, loop], dim=0)
    else:
        edge_attr = None
    return graph, looped, edge_attr


def _dropped(alpha, p, seed, offset, training):
    """PyG's GATConv/GATv2Conv return the weights after dropout: alpha * z,
    with z regenerated from (seed, offset) (E x H only, on the host)."""
    if not training or p == 0:
        return alpha
    keep = rng.keep_mask(seed, offset, alpha.shape[0], alpha.shape[1], p)
    z = torch.from_numpy(keep.astype(np.float64) / (1.0 - p)).to(alpha.device, alpha.dtype)
    return alpha * z


def _returned(ei_out, edge_index, graph, alpha):
    """PyG's (edge_index, weights) handed back with the output. For an
    edge_index: the caller's own when no loops were added, else a copy of the
    cached looped one (ei_out is then `_loop_graph`'s function building it;
    a copy, so that editing it cannot touch the cache), and alpha as is.
    For a torch sparse adj_t: the (looped) adj_t in the caller's layout with
    alpha [E, H] as its values, and alpha in that storage order, as PyG's."""
    if _is_sparse(edge_index):
        return _sparse_weights(graph, edge_index.layout, alpha)
    if callable(ei_out):
        ei_out = ei_out()
    return (ei_out if ei_out is edge_index else ei_out.clone()), alpha


def _sparse_weights(graph, layout, alpha):
    """(adj [num_dst, num_src, H] in `layout` holding alpha, alpha in its
    storage order) for per-edge alpha [E, H] in the graph's edge order. The
    entries are sorted by row (target), then column, or for CSC by column,
    then row, as PyG's loop helpers build a looped adj_t; the order and the
    compressed indices are made once per graph."""
    def build():
        ei = to_tensor(graph.edge_index()).long()
        rows, cols = ei[1], ei[0]
        csc = layout == torch.sparse_csc
        major, minor = (cols, rows) if csc else (rows, cols)
        n, m = (graph.num_src, graph.num_dst) if csc else (graph.num_dst, graph.num_src)
        order = torch.argsort(major * m + minor, stable=True)
        ptr = torch.zeros(n + 1, dtype=torch.long, device=ei.device)
        torch.cumsum(torch.bincount(major, minlength=n), 0, out=ptr[1:])
        return order, ptr, minor[order], torch.stack([rows, cols])[:, order]
    order, ptr, minor, indices = graph.cached(("fastgnn.torch", "sparse_weights", str(layout)),
                                              build)
    values = alpha[order]
    size = (graph.num_dst, graph.num_src) + tuple(alpha.shape[1:])
    if layout == torch.sparse_coo:
        return torch.sparse_coo_tensor(indices, values, size, is_coalesced=True), values
    make = torch.sparse_csr_tensor if layout == torch.sparse_csr else torch.sparse_csc_tensor
    return make(ptr, minor, values, size), values


def _finish_heads(out, concat, H, C):
    return out.reshape(-1, H * C) if concat else out.mean(dim=1)


def _set_gat_options(layer, kwargs, **options):
    """Constructor options GATConv and GATv2Conv share, stored under PyG's names
    (after refusing unknown keyword arguments and any aggr but "add")."""
    layer.aggr = _pop_aggr(type(layer).__name__, kwargs)
    layer.deterministic = _pop_deterministic(type(layer).__name__, kwargs)
    layer.flow = _check_kwargs(type(layer).__name__, kwargs)
    _oriented(layer, None, unsupported=_GAT_FLOW)
    for name, value in options.items():
        setattr(layer, name, value)


# why GATConv and GATv2Conv refuse flow="target_to_source" (at construction and per call)
_GAT_FLOW = ("in GATConv and GATv2Conv (PyG then swaps the roles of the source and target "
             "projections, not only the edges' direction)")


def _add_residual_and_bias(layer, target_channels, residual, bias):
    """GATConv/GATv2Conv's optional `res` (a glorot linear from the target
    features) and `bias`, both of the layer's output width, under PyG's names."""
    total = layer.out_channels * (layer.heads if layer.concat else 1)
    if residual:
        layer.res = _linear(target_channels, total, bias=False, weight_initializer="glorot")
    else:
        layer.register_parameter("res", None)
    if bias:
        layer.bias = torch.nn.Parameter(torch.empty(total))
    else:
        layer.register_parameter("bias", None)


def _gat_family_output(layer, graph, score, tensors, H, C, res, ei_out, edge_index,
                       return_attention_weights):
    """The shared tail of GATConv and GATv2Conv: attention (dropout in
    training), heads concatenated or averaged, residual, bias, and PyG's
    (edge_index, weights after dropout) when asked."""
    p, seed, offset = _dropout(layer.dropout, None, 0, layer.training)
    want = bool(return_attention_weights)
    # Concatenated heads: the bias [H * C] goes into the kernel's store (one
    # more write of the output, not a pass of its own; the op returns out +
    # bias, a tensor its backward does not keep, so callers may edit it in
    # place as PyG's); averaged heads add their [C] bias after the mean.
    anchor = tensors["v" if score == "gat" else "xl"]
    fuse_bias = (layer.bias is not None and layer.concat and layer.bias.dtype == anchor.dtype
                 and layer.bias.shape == (H * C,))
    if fuse_bias:
        tensors = dict(tensors, bias=layer.bias)
    if isinstance(graph, CompiledGraph):
        out, alpha, ei_out = _compiled_attention(
            graph, score, tensors, want, layer.dropout, None, 0, layer.training,
            negative_slope=layer.negative_slope, scale=None, deterministic=layer.deterministic,
            dropped=True)
        return _gat_family_tail(layer, out, alpha, ei_out, H, C, res, fuse_bias, want)
    out = apply(EDGE_ATTENTION, graph, *(tensors.get(n) for n in _ATTN_INPUTS), score=score,
                negative_slope=layer.negative_slope, scale=None, dropout=p, seed=seed,
                offset=offset, return_attention_weights=want,
                deterministic=layer.deterministic)
    alpha = None
    if want:
        out, alpha = out
        ei_out, alpha = _returned(ei_out, edge_index, graph,
                                  _dropped(alpha, p, seed, offset, layer.training))
    return _gat_family_tail(layer, out, alpha, ei_out, H, C, res, fuse_bias, want)


def _gat_family_tail(layer, out, alpha, ei_out, H, C, res, fuse_bias, want):
    """Heads concatenated or averaged, residual and the unfused bias; with
    `want`, PyG's (out, (edge_index, weights after dropout))."""
    out = _finish_heads(out, layer.concat, H, C)
    if res is not None:
        out = out + res
    if layer.bias is not None and not fuse_bias:
        out = add_bias(out, layer.bias)
    if want:
        return out, (ei_out, alpha)
    return out


def _pop_aggr(layer, kwargs):
    aggr = kwargs.pop("aggr", "add")
    if aggr not in ("add", "sum"):
        raise NotImplementedError(f"{layer}: only aggr='add' is supported, got {aggr!r}")
    return aggr


# ------------------------------------------------------------------- GATConv
def _head_logits(x3: Tensor, *atts: Tensor) -> tuple:
    """((x3 * att).sum(-1) for att in atts): per-head logits [N, H] of x3
    [N, H, C] against attention vectors att [1, H, C], as one GEMM
    x3.view(N, H*C) @ [A_1 | A_2 ...] with A_k [H*C, H] block-diagonal
    (column h holds att_k[h] in rows h*C .. h*C + C-1). The GEMM reads x3
    once for every att, and its backward is two more (g A^T for x3, x3^T g
    for A), where the elementwise form writes and reduces [N, H, C]
    temporaries in both directions (H200, rmat20, H x C = 4 x 32, fp32: 4.7 ms
    of GATConv's 16.5 ms fwd+bwd under torch.profiler). The elementwise form
    stays for fp32 CUDA tensors while TF32 is allowed for matmuls (a TF32
    GEMM would round x3), for attention vectors of another dtype, and inside
    a compiled program (Inductor fuses the products and sums itself)."""
    H, C = x3.shape[1], x3.shape[2]
    if (custom_ops.compiling() or any(att.dtype != x3.dtype for att in atts)
            or (x3.is_cuda and x3.dtype == torch.float32 and tf32_allowed())):
        return tuple((x3 * att).sum(dim=-1) for att in atts)
    eye = torch.eye(H, dtype=x3.dtype, device=x3.device).view(H, 1, H)
    blocks = torch.cat([(att.reshape(H, C, 1) * eye).reshape(H * C, H) for att in atts], dim=1)
    return (x3.reshape(-1, H * C) @ blocks).split(H, dim=1)


class GATConv(torch.nn.Module):
    r"""Graph attention (Velickovic et al.), PyG 2.8's `GATConv`:

        x'_i = sum_{j in N(i) + i} alpha_ij Theta_s x_j,
        alpha_ij = softmax_j(LeakyReLU(a_s . Theta_s x_j + a_t . Theta_t x_i
                                       (+ a_e . Theta_e e_ij)))

    per head, concatenated (concat) or averaged over heads, plus the optional
    residual projection and bias.

    in_channels:    int (one projection `lin`) or (source, target) sizes
                    (`lin_src`, `lin_dst`); -1: lazy.
    out_channels, heads, concat, negative_slope, dropout (attention dropout),
    add_self_loops (remove existing loops, add one per node), edge_dim,
    fill_value (edge features of added loops: "mean", "add", "max", "min",
    "mul", a scalar, a tensor or None = 1), bias, residual: as in PyG.
    deterministic (fastgnn only, keyword): False lets the GPU backward use
    float atomics (faster, not bitwise repeatable).
    One difference from PyG: with concat, bias=False and no residual the
    output is the fused op's own output, which its backward reads; edit it
    in place (relu_) and the backward raises autograd's "modified by an
    inplace operation" error (use the out-of-place form there). The same
    holds for GATv2Conv and for TransformerConv with root_weight=False.
    forward(x [N, F] | (x_src [Ns, F_s], x_dst [Nt, F_t] or None),
            edge_index [2, E] | EdgeIndex | adj_t [Nt, Ns], edge_attr [E, edge_dim] = None,
            size = None, return_attention_weights = None)
        -> out [Nt, heads * out_channels] (concat) or [Nt, out_channels],
           and with return_attention_weights (truthy) also
           (edge_index' [2, E'], alpha [E', heads]): edge_index' includes the
           added self-loops in PyG's order; alpha is after dropout, as PyG's.
           For an adj_t, edge_index' is the (looped) adj_t in its layout
           with alpha as its values, alpha in its storage order, as PyG's.

    Parameters `lin.weight` (or `lin_src.weight`, `lin_dst.weight`),
    `att_src`, `att_dst` [1, heads, C], with edge_dim `lin_edge.weight` and
    `att_edge`, `res.weight` (residual), `bias`. The node logits
    <Theta x, a> are torch ops; the edge logit a_e . Theta_e e_ij is computed
    as e_ij @ (Theta_e folded with a_e) ([E, heads], no [E, heads, C] tensor).
    """

    def __init__(self, in_channels, out_channels: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, dropout: float = 0.0, add_self_loops: bool = True,
                 edge_dim: int | None = None, fill_value="mean", bias: bool = True,
                 residual: bool = False, **kwargs):
        super().__init__()
        _set_gat_options(self, kwargs, in_channels=in_channels, out_channels=out_channels,
                         heads=heads, concat=concat, negative_slope=negative_slope,
                         dropout=dropout, add_self_loops=add_self_loops, edge_dim=edge_dim,
                         fill_value=fill_value, residual=residual)
        HC = heads * out_channels
        self.lin = self.lin_src = self.lin_dst = None
        if isinstance(in_channels, int):
            self.lin = _linear(in_channels, HC, bias=False, weight_initializer="glorot")
        else:
            self.lin_src = _linear(in_channels[0], HC, bias=False, weight_initializer="glorot")
            self.lin_dst = _linear(in_channels[1], HC, bias=False, weight_initializer="glorot")
        self.att_src = torch.nn.Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = torch.nn.Parameter(torch.empty(1, heads, out_channels))
        if edge_dim is not None:
            self.lin_edge = _linear(edge_dim, HC, bias=False, weight_initializer="glorot")
            self.att_edge = torch.nn.Parameter(torch.empty(1, heads, out_channels))
        else:
            self.lin_edge = None
            self.register_parameter("att_edge", None)
        _add_residual_and_bias(self, in_channels if isinstance(in_channels, int) else in_channels[1],
                               residual, bias)
        self.reset_parameters()

    def reset_parameters(self):
        for lin in (self.lin, self.lin_src, self.lin_dst, self.lin_edge, self.res):
            if lin is not None:
                lin.reset_parameters()
        _glorot(self.att_src)
        _glorot(self.att_dst)
        _glorot(self.att_edge)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def _edge_logits(self, edge_attr):
        """[E, heads] logits <Theta_e e, a_e> without an [E, heads, C] tensor."""
        if edge_attr.dim() == 1:
            edge_attr = edge_attr.view(-1, 1)
        _materialise(self.lin_edge, edge_attr)
        H, C = self.heads, self.out_channels
        w = self.lin_edge.weight.view(H, C, -1)
        folded = (w * self.att_edge.view(H, C, 1)).sum(dim=1)      # [H, edge_dim]
        return edge_attr @ folded.t()

    def forward(self, x, edge_index, edge_attr: Tensor | None = None, size=None,
                return_attention_weights=None):
        _check_features(self, x, edge_index)
        _oriented(self, edge_index, unsupported=_GAT_FLOW)     # refuses target_to_source
        H, C = self.heads, self.out_channels
        res = None
        if isinstance(x, Tensor):
            if x.dim() != 2:
                raise ValueError("Static graphs not supported in 'GATConv'")
            if self.res is not None:
                res = self.res(x)
            if self.lin is not None:
                x_src = x_dst = self.lin(x).view(-1, H, C)
            else:
                x_src = self.lin_src(x).view(-1, H, C)
                x_dst = self.lin_dst(x).view(-1, H, C)
        else:
            x_src, x_dst = _pair(x)
            if x_src.dim() != 2:
                raise ValueError("Static graphs not supported in 'GATConv'")
            if x_dst is not None and self.res is not None:
                res = self.res(x_dst)
            lin_s, lin_d = (self.lin, self.lin) if self.lin is not None else (self.lin_src,
                                                                              self.lin_dst)
            x_src = lin_s(x_src).view(-1, H, C)
            if x_dst is not None:
                x_dst = lin_d(x_dst).view(-1, H, C)
        num_src, num_dst = _graph_sizes(x_src, x_dst, size, edge_index)
        if num_dst is None:
            num_dst = int(edge_index.shape[0])      # a sparse adj_t's own targets
        if x_dst is None:
            a_src, = _head_logits(x_src, self.att_src)
            a_dst = a_src.new_zeros((num_dst, H))
        elif x_dst is x_src:
            a_src, a_dst = _head_logits(x_src, self.att_src, self.att_dst)
        else:
            (a_src,), (a_dst,) = _head_logits(x_src, self.att_src), _head_logits(x_dst,
                                                                                self.att_dst)
        # PyG loops min(size), else min(rows of x_src, of x_dst or of a sparse adj_t)
        num_loops = min(num_src, num_dst) if self.add_self_loops else None
        use_edge = edge_attr is not None and self.lin_edge is not None
        graph, ei_out, edge_attr = _attention_graph(type(self).__name__, edge_index, edge_attr,
                                                    num_src, num_dst, num_loops,
                                                    self.fill_value, use_edge)
        a_edge = self._edge_logits(edge_attr) if use_edge else None
        return _gat_family_output(self, graph, "gat", dict(a_src=a_src, a_dst=a_dst,
                                                          a_edge=a_edge, v=x_src),
                                  H, C, res, ei_out, edge_index, return_attention_weights)

    def __repr__(self):
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"heads={self.heads})")


# ----------------------------------------------------------------- GATv2Conv
class GATv2Conv(torch.nn.Module):
    r"""GATv2 (Brody et al.), PyG 2.8's `GATv2Conv`:

        x'_i = sum_{j in N(i) + i} alpha_ij Theta_l x_j,
        alpha_ij = softmax_j(a . LeakyReLU(Theta_l x_j + Theta_r x_i (+ Theta_e e_ij)))

    per head, concatenated (concat) or averaged, plus residual and bias.

    in_channels:    int or (source, target) sizes (-1: lazy).
    out_channels, heads, concat, negative_slope, dropout, add_self_loops,
    edge_dim, fill_value, bias (also of lin_l/lin_r), share_weights (lin_r is
    lin_l), residual: as in PyG. deterministic (fastgnn only, keyword): False
    lets the GPU backward use float atomics (faster, not bitwise repeatable).
    forward(x [N, F] | (x_src [Ns, F_s], x_dst [Nt, F_t]),
            edge_index [2, E] | EdgeIndex | adj_t [Nt, Ns], edge_attr [E, edge_dim] = None,
            return_attention_weights = None)
        -> out, and with return_attention_weights (truthy) also
           (edge_index' [2, E'], alpha [E', heads]) (alpha after dropout, as
           PyG's; for an adj_t as in GATConv).

    Parameters `lin_l`, `lin_r` (the same module with share_weights; both
    appear in the state_dict, as in PyG), `att` [1, heads, C], `lin_edge`
    (edge_dim), `res` (residual), `bias`. The op receives xl, xr, att and
    xe = lin_edge(edge_attr) viewed [E, heads, C].
    """

    def __init__(self, in_channels, out_channels: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, dropout: float = 0.0, add_self_loops: bool = True,
                 edge_dim: int | None = None, fill_value="mean", bias: bool = True,
                 share_weights: bool = False, residual: bool = False, **kwargs):
        super().__init__()
        _set_gat_options(self, kwargs, in_channels=in_channels, out_channels=out_channels,
                         heads=heads, concat=concat, negative_slope=negative_slope,
                         dropout=dropout, add_self_loops=add_self_loops, edge_dim=edge_dim,
                         fill_value=fill_value, residual=residual)
        self.share_weights = share_weights
        HC = heads * out_channels
        ins = (in_channels, in_channels) if isinstance(in_channels, int) else in_channels
        self.lin_l = _linear(ins[0], HC, bias=bias, weight_initializer="glorot")
        if share_weights:
            self.lin_r = self.lin_l
        else:
            self.lin_r = _linear(ins[1], HC, bias=bias, weight_initializer="glorot")
        self.att = torch.nn.Parameter(torch.empty(1, heads, out_channels))
        if edge_dim is not None:
            self.lin_edge = _linear(edge_dim, HC, bias=False, weight_initializer="glorot")
        else:
            self.lin_edge = None
        _add_residual_and_bias(self, ins[1], residual, bias)
        self.reset_parameters()

    def reset_parameters(self):
        self.lin_l.reset_parameters()
        self.lin_r.reset_parameters()
        for lin in (self.lin_edge, self.res):
            if lin is not None:
                lin.reset_parameters()
        _glorot(self.att)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def forward(self, x, edge_index, edge_attr: Tensor | None = None,
                return_attention_weights=None):
        _check_features(self, x, edge_index)
        _oriented(self, edge_index, unsupported=_GAT_FLOW)     # refuses target_to_source
        H, C = self.heads, self.out_channels
        res = None
        x_res = x if isinstance(x, Tensor) else _pair(x)[1]
        if self.res is not None and x_res is not None:
            _materialise(self.res, x_res)   # PyG runs res first: a lazy one draws first
        if isinstance(x, Tensor):
            if x.dim() != 2:
                raise ValueError(f"'{type(self).__name__}' takes x of shape [N, F]")
            lins = (self.lin_l,) if self.share_weights else (self.lin_l, self.lin_r)
            ys = shared_input_linears(x, lins + ((self.res,) if self.res is not None else ()))
            xl = ys[0].view(-1, H, C)
            xr = xl if self.share_weights else ys[1].view(-1, H, C)
            if self.res is not None:
                res = ys[-1]
        else:
            x_l, x_r = _pair(x)
            if x_r is None:
                raise ValueError(f"'{type(self).__name__}' needs target features: pass "
                                 "(x_src, x_dst) with x_dst a tensor")
            if x_l.dim() != 2:
                raise ValueError(f"'{type(self).__name__}' takes x of shape [N, F]")
            xl = self.lin_l(x_l).view(-1, H, C)
            ys = shared_input_linears(x_r, (self.lin_r,) + ((self.res,) if self.res is not None
                                                            else ()))
            xr = ys[0].view(-1, H, C)
            if self.res is not None:
                res = ys[1]
        num_src, num_dst = int(xl.shape[0]), int(xr.shape[0])
        if edge_attr is not None and self.lin_edge is None:
            raise ValueError(f"'{type(self).__name__}' got edge_attr but was built without "
                             "edge_dim")
        num_loops = min(num_src, num_dst) if self.add_self_loops else None
        graph, ei_out, edge_attr = _attention_graph(type(self).__name__, edge_index, edge_attr,
                                                    num_src, num_dst, num_loops,
                                                    self.fill_value, True)
        xe = None
        if edge_attr is not None:
            if edge_attr.dim() == 1:
                edge_attr = edge_attr.view(-1, 1)
            xe = self.lin_edge(edge_attr).view(-1, H, C)
        return _gat_family_output(self, graph, "gatv2", dict(xl=xl, xr=xr, att=self.att, xe=xe),
                                  H, C, res, ei_out, edge_index, return_attention_weights)

    def __repr__(self):
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"heads={self.heads})")


# ----------------------------------------------------------- TransformerConv
class TransformerConv(torch.nn.Module):
    r"""Graph transformer (Shi et al.), PyG 2.8's `TransformerConv`:

        x'_i = W_1 x_i + sum_{j in N(i)} alpha_ij (W_2 x_j (+ W_6 e_ij)),
        alpha_ij = softmax_j((W_3 x_i) . (W_4 x_j (+ W_6 e_ij)) / sqrt(C))

    per head, concatenated (concat) or averaged; with beta the root term is
    gated: x'_i = beta_i W_1 x_i + (1 - beta_i) m_i, beta_i =
    sigmoid(w_5 . [m_i, W_1 x_i, m_i - W_1 x_i]). No self-loops are added.

    in_channels, out_channels, heads, concat, beta (only with root_weight),
    dropout, edge_dim, bias, root_weight: as in PyG. deterministic (fastgnn
    only, keyword): False lets the GPU backward use float atomics.
    forward(x [N, F] | (x_src [Ns, F_s], x_dst [Nt, F_t]),
            edge_index [2, E] | EdgeIndex | adj_t [Nt, Ns], edge_attr [E, edge_dim] = None,
            return_attention_weights = None)
        -> out, and with return_attention_weights a bool (True or False, as
           PyG) also (edge_index, alpha [E, heads]) (alpha before dropout, as
           PyG's; for an adj_t in its storage order). flow="target_to_source"
           (also set after construction) reads queries at edge_index[0].

    Parameters `lin_key`, `lin_query`, `lin_value`, `lin_edge` (edge_dim),
    `lin_skip`, `lin_beta` (beta). The op receives q, k, v and
    ee = lin_edge(edge_attr) viewed [E, heads, C], with scale 1/sqrt(C).
    """

    def __init__(self, in_channels, out_channels: int, heads: int = 1, concat: bool = True,
                 beta: bool = False, dropout: float = 0.0, edge_dim: int | None = None,
                 bias: bool = True, root_weight: bool = True, **kwargs):
        super().__init__()
        self.aggr = _pop_aggr(type(self).__name__, kwargs)
        self.deterministic = _pop_deterministic(type(self).__name__, kwargs)
        self.flow = _check_kwargs(type(self).__name__, kwargs)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.heads = heads
        self.beta = beta and root_weight
        self.root_weight = root_weight
        self.concat = concat
        self.dropout = dropout
        self.edge_dim = edge_dim
        ins = (in_channels, in_channels) if isinstance(in_channels, int) else in_channels
        HC = heads * out_channels
        self.lin_key = _linear(ins[0], HC, bias=bias)
        self.lin_query = _linear(ins[1], HC, bias=bias)
        self.lin_value = _linear(ins[0], HC, bias=bias)
        if edge_dim is not None:
            self.lin_edge = _linear(edge_dim, HC, bias=False)
        else:
            self.register_parameter("lin_edge", None)
        out_skip = HC if concat else out_channels
        self.lin_skip = _linear(ins[1], out_skip, bias=bias)
        if self.beta:
            self.lin_beta = _linear(3 * out_skip, 1, bias=False)
        else:
            self.register_parameter("lin_beta", None)
        self.reset_parameters()

    def reset_parameters(self):
        self.lin_key.reset_parameters()
        self.lin_query.reset_parameters()
        self.lin_value.reset_parameters()
        if self.edge_dim:
            self.lin_edge.reset_parameters()
        self.lin_skip.reset_parameters()
        if self.beta:
            self.lin_beta.reset_parameters()

    def forward(self, x, edge_index, edge_attr: Tensor | None = None,
                return_attention_weights=None):
        _check_features(self, x, edge_index)
        H, C = self.heads, self.out_channels
        x_src, x_dst = _pair(x)
        if x_dst is None:
            raise ValueError(f"'{type(self).__name__}' needs target features: pass "
                             "(x_src, x_dst) with x_dst a tensor")
        # the projections of one input share a backward GEMM chain (x's gradient
        # summed in the epilogues): q, k, v and the skip together when x is one tensor
        skip = (self.lin_skip,) if self.root_weight else ()
        if x_src is x_dst:
            q, k, v, *x_r = shared_input_linears(
                x_dst, (self.lin_query, self.lin_key, self.lin_value) + skip)
        else:
            q, *x_r = shared_input_linears(x_dst, (self.lin_query,) + skip)
            k, v = shared_input_linears(x_src, (self.lin_key, self.lin_value))
        q, k, v = q.view(-1, H, C), k.view(-1, H, C), v.view(-1, H, C)
        ee = None
        if self.lin_edge is not None:
            if edge_attr is None:
                raise ValueError(f"'{type(self).__name__}' was built with edge_dim and needs "
                                 "edge_attr")
            ee = self.lin_edge(edge_attr).view(-1, H, C)
        elif edge_attr is not None:
            raise NotImplementedError(
                f"'{type(self).__name__}' without edge_dim got edge_attr (PyG adds it to the "
                "messages unprojected); build the layer with edge_dim")
        # query i at edge_index[1] (edge_index[0] under flow="target_to_source"), key j at the other
        graph, _, _ = _attention_graph(type(self).__name__, _oriented(self, edge_index)[0], None,
                                       int(k.shape[0]), int(q.shape[0]), None, None, False)
        want = isinstance(return_attention_weights, bool)
        if isinstance(graph, CompiledGraph):
            out, alpha, _ = _compiled_attention(
                graph, "dot", dict(v=v, q=q, k=k, ee=ee), want, self.dropout, None, 0,
                self.training, negative_slope=0.2, scale=1.0 / math.sqrt(C),
                deterministic=self.deterministic, dropped=False)
        else:
            p, seed, offset = _dropout(self.dropout, None, 0, self.training)
            out = apply(EDGE_ATTENTION, graph, None, None, None, v, None, None, None, None, q, k,
                        ee, None, score="dot", negative_slope=0.2, scale=1.0 / math.sqrt(C),
                        dropout=p, seed=seed, offset=offset, return_attention_weights=want,
                        deterministic=self.deterministic)
            alpha = None
            if want:
                out, alpha = out
        out = _finish_heads(out, self.concat, H, C)
        if self.root_weight:
            x_r = x_r[0]
            if self.lin_beta is not None:
                b = self.lin_beta(torch.cat([out, x_r, out - x_r], dim=-1)).sigmoid()
                out = b * x_r + (1 - b) * out
            else:
                out = out + x_r
        if want:
            if _is_sparse(edge_index) and edge_index.layout == torch.sparse_coo:
                edge_index = edge_index.coalesce()  # the order alpha is in (self if coalesced)
            return out, (edge_index, alpha)
        return out

    def __repr__(self):
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"heads={self.heads})")


# ------------------------------------------------ compiled graph functions
# edge_softmax, edge_attention (with PyG's self-loops when a layer asks) and
# the self-loops' edge features as torch.library custom ops (custom_ops.py).
def _compiled_dropout(dropout, seed, training):
    """(p, seed tensor or None) inside a compiled program: a seed of None is
    drawn as a CPU tensor within the program (no host read while tracing)."""
    p = dropout_spec(dropout, 0 if seed is None else seed, 0).p if training else 0.0
    if p == 0:
        return 0.0, None
    if seed is None:
        return p, torch.randint(0, 2**63 - 1, (1,), dtype=torch.int64)
    return p, torch.tensor([int(seed)], dtype=torch.int64)


def _compiled_attention(graph, score, tensors, want, dropout, seed, offset, training, *,
                        negative_slope, scale, deterministic, dropped):
    """fastgnn::edge_attention -> (out, alpha or None, edge_index of alpha or None)."""
    p, seed_t = _compiled_dropout(dropout, seed, training)
    outs = custom_ops.call("edge_attention", graph.edge_index,
                           *(tensors.get(n) for n in _ATTN_INPUTS), seed_t,
                           num_nodes=graph.sizes, num_loops=graph.num_loops, score=score,
                           negative_slope=negative_slope, scale=scale, dropout=p, offset=offset,
                           return_attention_weights=want, deterministic=deterministic,
                           dropped=dropped)
    return (outs[0], outs[1], outs[2]) if want else (outs, None, None)


def _message_shape(score, a):
    """[rows, H, C] of the messages' tensor (v, or xl for gatv2)."""
    m = a["xl"] if score == "gatv2" else a["v"]
    return m.shape


def _edge_attention_fake(edge_index, *arrays, num_nodes, num_loops, score, negative_slope,
                         scale, dropout, offset, return_attention_weights, deterministic,
                         dropped):
    a = dict(zip(_ATTN_INPUTS, arrays))
    _, heads, channels = _message_shape(score, a)
    dst = {"gat": "a_dst", "gatv2": "xr", "dot": "q"}[score]
    num_dst = num_nodes[1] if num_nodes[1] is not None else a[dst].shape[0]
    m = a["xl"] if score == "gatv2" else a["v"]
    out = m.new_empty((num_dst, heads, channels))
    if not return_attention_weights:
        return [out]
    edges = (edge_index.shape[1] if num_loops is None
             else torch.library.get_ctx().new_dynamic_size())
    return [out, m.new_empty((edges, heads)), edge_index.new_empty((2, edges))]


@custom_ops.graph_op("edge_attention", _ATTN_INPUTS + ("seed",), _edge_attention_fake,
                     sizes=("num_nodes", "num_loops"))
def _edge_attention_op(edge_index, *arrays, num_nodes, num_loops, score, negative_slope, scale,
                       dropout, offset, return_attention_weights, deterministic, dropped):
    *arrays, seed_t = arrays
    seed = int(seed_t.item()) if seed_t is not None else 0
    if num_loops is None:
        graph, _ = resolve(edge_index, tuple(num_nodes))
        ei_out = edge_index
    else:
        graph, looped, _, _ = _loop_graph(edge_index, num_nodes[0], num_nodes[1], num_loops)
        ei_out = looped() if return_attention_weights else None
    out = apply(EDGE_ATTENTION, graph, *arrays, score=score, negative_slope=negative_slope,
                scale=scale, dropout=dropout, seed=seed, offset=offset,
                return_attention_weights=return_attention_weights, deterministic=deterministic)
    if not return_attention_weights:
        return out
    out, alpha = out
    if dropped:
        alpha = _dropped(alpha, dropout, seed, offset, True)
    return out, alpha, ei_out


def _edge_softmax_fake(edge_index, scores, seed, *, num_nodes, dropout, offset):
    return [torch.empty_like(scores)]


@custom_ops.graph_op("edge_softmax", ("scores", "seed"), _edge_softmax_fake,
                     sizes=("num_nodes",))
def _edge_softmax_op(edge_index, scores, seed_t, *, num_nodes, dropout, offset):
    seed = int(seed_t.item()) if seed_t is not None else 0
    return edge_softmax(edge_index, scores, tuple(num_nodes), dropout=dropout, seed=seed,
                        offset=offset, training=True)


def _loop_edge_attr_fake(edge_index, edge_attr, *, num_nodes, num_loops, fill_value):
    edges = torch.library.get_ctx().new_dynamic_size()
    return [edge_attr.new_empty((edges, *edge_attr.shape[1:]))]


@custom_ops.graph_op("attention_loop_edge_attr", ("edge_attr",), _loop_edge_attr_fake,
                     sizes=("num_nodes", "num_loops"))
def _loop_edge_attr_op(edge_index, edge_attr, *, num_nodes, num_loops, fill_value):
    """The edge features in the self-looped graph's order (PyG's
    remove_self_loops + add_self_loops with fill_value)."""
    return _attention_graph("attention", edge_index, edge_attr, num_nodes[0], num_nodes[1],
                            num_loops, fill_value, True)[2]
