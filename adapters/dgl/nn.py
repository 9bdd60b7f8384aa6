"""Drop-in replacements for DGL 2.x's `dgl.nn` GraphConv, SAGEConv, GINConv,
GINEConv, GATConv and GATv2Conv on fastgnn's kernels (and RelGraphConv, from
nn_relational.py).

Same constructor arguments, submodules and parameter names as DGL's modules
(a DGL `state_dict` loads with `strict=True`, and ours into DGL's), the same
forward inputs (a DGLGraph, homogeneous or a block; a feature tensor or a
(src, dst) pair; edge_weight; get_attention) and the same function, with
DGL's errors: a graph with 0-in-degree nodes raises `dgl.DGLError` in
GraphConv, GATConv and GATv2Conv unless allow_zero_in_degree=True. Seeded
construction draws DGL's initial weights (the same modules, created and
initialised in the same order). Bad inputs are refused at entry with a
TypeError / ValueError naming the argument (sizes that are not positive
ints; a feat of the wrong kind, dtype, rank, rows or width); feat rows that
are not the graph's nodes raise one that is also the DGLError DGL raises.

The layers only convert: the graph once per structure (`fastgnn.dgl.to_graph`,
cached), then fastgnn.torch's differentiable ops (`spmm` with fused degree
scales and bias, `segment_reduce_linear`, `edge_attention`, `edge_softmax`)
through the same autograd bridge as the PyG-style layers. Where DGL computes
the same function in another order (a bias added in a kernel's store,
degree scales fused into the SpMM), results agree to rounding.

One difference: attention dropout (attn_drop > 0 in training) draws its mask
from fastgnn's counter-based generator inside the fused kernel, not from
torch's `nn.Dropout` (except GATConv with edge_weight, which is unfused), so
masks differ from DGL's (the distribution is the
same: keep with probability 1 - p, kept weights scaled by 1/(1 - p)); the
module still holds `attn_drop` as DGL's `nn.Dropout` and reads its `p`.
feat_drop is torch's Dropout, called as DGL calls it.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from dgl import DGLError

import fastgnn.torch as ft
from fastgnn.torch._autograd import device_scope, to_tensor
from fastgnn.torch.attention import _dropped, _head_logits, draw_seed
from fastgnn.torch.functional import _cached_edge_index
from fastgnn.torch.nn import shared_input_linears
from fastgnn.torch.nn_messages import _edges, _gine_messages

from .checks import _check_feat, _dgl_graph, _positive_sizes
from .nn_relational import RelGraphConv
from .ops import _tensor, u_mul_e

__all__ = ["GraphConv", "SAGEConv", "GINConv", "GINEConv", "GATConv", "GATv2Conv",
           "RelGraphConv"]


class _InvalidOption(DGLError, ValueError):
    """A constructor option DGL refuses: a ValueError, and the DGLError that
    DGL raises for it."""


class _InvalidAggregator(KeyError, ValueError):
    """GINConv's unknown aggregator_type: a ValueError, and the KeyError DGL raises."""


_ZERO_IN_DEGREE = (
    "There are 0-in-degree nodes in the graph; their output would be invalid (no message "
    "reaches them), which is harmful for some applications and causes silent performance "
    "regression. Add self-loops with `g = dgl.add_self_loop(g)`, or build the module with "
    "allow_zero_in_degree=True to suppress this check.")


# ------------------------------------------------------------------- helpers
def _check_zero_in_degree(graph):
    """Raise DGL's DGLError when a destination node has no in-edge (the
    answer is cached on the converted graph: one host read per graph)."""
    def build():
        return graph.num_dst > 0 and bool((graph.in_degree == 0).any())
    if graph.cached(("fastgnn.dgl", "zero_in_degree"), build):
        raise DGLError(_ZERO_IN_DEGREE)


def _degree_scale(graph, side, power, dtype):
    """[n] max(deg, 1)^power as a backend array of `dtype`, deg the in-degree
    of the destinations (side "in") or the out-degree of the sources ("out")
    counted in edges, as DGL's GraphConv normalises (cached on the graph)."""
    def build():
        deg = graph.in_degree if side == "in" else graph.out_degree
        with device_scope(torch.device(graph.device)):
            d = graph.xp.maximum(deg, 1).astype(np.float64)
            return (d ** power).astype(dtype)
    return graph.cached(("fastgnn.dgl", "degree_scale", side, power, np.dtype(dtype).name), build)


def _in_degree(graph, like):
    """[num_dst, 1] in-degrees (edge counts) as a tensor of like's dtype and
    device (cached on the graph)."""
    def build():
        with device_scope(like.device):
            return to_tensor(graph.in_degree).to(like.dtype).unsqueeze(-1)
    return graph.cached(("fastgnn.dgl", "in_degree_tensor", str(like.dtype)), build)


def _expand_pair(g, feat):
    """(source features, destination features) as DGL's expand_as_pair: a
    pair as given; one tensor for both, narrowed to its first num_dst rows on
    a block (a block's destination nodes lead its source nodes). feat is
    checked (`_check_feat`)."""
    if isinstance(feat, tuple):
        return feat
    if g.is_block:
        return feat, feat[:g.num_dst_nodes()]
    return feat, feat


def _dropped_features(module, graph, feat):
    """(h_src, h_dst) through module.feat_drop, called as DGL calls it: once
    per tensor of a pair; once for one tensor, then narrowed on a block."""
    if isinstance(feat, tuple):
        src, dst = _expand_pair(graph, feat)
        return module.feat_drop(src), module.feat_drop(dst)
    return _expand_pair(graph, module.feat_drop(feat))


class _ZeroInDegreeChecked(nn.Module):
    """A module with DGL's allow_zero_in_degree switch."""

    def set_allow_zero_in_degree(self, set_value):
        """Allow (True) or refuse (False) graphs with 0-in-degree nodes."""
        self._allow_zero_in_degree = set_value

    def _graph(self, graph):
        """The converted graph, after DGL's 0-in-degree check unless allowed."""
        g = _dgl_graph(graph)
        if not self._allow_zero_in_degree:
            _check_zero_in_degree(g)
        return g


def _edge_weight(edge_weight, graph):
    """edge_weight [E] (or [E, 1, ...]) in DGL's edge order -> [E], checked."""
    if edge_weight is None:
        return None
    if not isinstance(edge_weight, torch.Tensor):
        raise TypeError(f"edge_weight must be a torch.Tensor, got {type(edge_weight).__name__}")
    if edge_weight.dim() < 1 or edge_weight.shape[0] != graph.num_edges \
            or edge_weight.numel() != graph.num_edges:
        raise ValueError(f"edge_weight must have shape [E] = [{graph.num_edges}] (one scalar "
                         f"per edge, in DGL's edge order), got {tuple(edge_weight.shape)}")
    return edge_weight.reshape(graph.num_edges)


def _aggregate(graph, h, edge_weight, reduce, **kw):
    """reduce_{e=(u->v)} w_e h[u] for h [num_src, *] -> [num_dst, *] (w_e = 1
    without edge_weight): fastgnn's SpMM (sum, mean), its segment reduction
    (unweighted max), or weighted max over per-edge messages."""
    out = ft.spmm(graph, h.reshape(h.shape[0], -1), edge_weight, reduce=reduce, **kw)
    return out.reshape(graph.num_dst, *h.shape[1:])


def _pair_sizes(in_feats):
    return tuple(in_feats) if isinstance(in_feats, tuple) else (in_feats, in_feats)


# ------------------------------------------------------------------ GraphConv
class GraphConv(_ZeroInDegreeChecked):
    r"""Graph convolution (Kipf & Welling), DGL's `GraphConv`:

        h'_v = sigma(b + sum_{e=(u->v)} w_e c_u r_v h_u W)

    with c_u = deg_out(u)^-1/2 and r_v = deg_in(v)^-1/2 (norm="both"),
    c = 1, r_v = 1/deg_in(v) ("right"), c_u = 1/deg_out(u), r = 1 ("left"),
    or c = r = 1 ("none"); degrees count edges (not weights) and are clamped
    to at least 1; w_e = 1 without edge_weight.

    in_feats, out_feats, norm, weight (a learnable [in_feats, out_feats]
    matrix), bias, activation, allow_zero_in_degree: as in DGL.
    forward(graph, feat [N_src, *, in] or (src, dst) pair, weight=None
            [in, out] (only when built with weight=False), edge_weight=None [E])
        -> [N_dst, *, out]

    Parameters `weight` [in_feats, out_feats], `bias` [out_feats]. The
    aggregation is one fastgnn SpMM with both degree scales fused into it,
    run on the narrower side of W (before W when in_feats > out_feats, as
    DGL), the bias added in its store when W comes first.
    """

    def __init__(self, in_feats, out_feats, norm="both", weight=True, bias=True,
                 activation=None, allow_zero_in_degree=False):
        super().__init__()
        if norm not in ("none", "both", "right", "left"):
            raise _InvalidOption(f"GraphConv: norm must be 'none', 'both', 'right' or 'left', "
                                 f"got {norm!r}")
        _positive_sizes("GraphConv", in_feats=in_feats, out_feats=out_feats)
        self._in_feats = in_feats
        self._out_feats = out_feats
        self._norm = norm
        self._allow_zero_in_degree = allow_zero_in_degree
        if weight:
            self.weight = nn.Parameter(torch.empty(in_feats, out_feats))
        else:
            self.register_parameter("weight", None)
        if bias:
            self.bias = nn.Parameter(torch.empty(out_feats))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()
        self._activation = activation

    def reset_parameters(self):
        """Glorot-uniform weight, zero bias (DGL's initialisation)."""
        if self.weight is not None:
            nn.init.xavier_uniform_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _scales(self, graph, dtype):
        wdt = np.float64 if dtype == torch.float64 else np.float32
        power = -0.5 if self._norm == "both" else -1.0
        col = _degree_scale(graph, "out", power, wdt) if self._norm in ("both", "left") else None
        row = _degree_scale(graph, "in", power, wdt) if self._norm in ("both", "right") else None
        return row, col

    def forward(self, graph, feat, weight=None, edge_weight=None):
        g = self._graph(graph)
        if weight is not None and self.weight is not None:
            raise DGLError("GraphConv: an external weight was given to a module that has its "
                           "own weight parameter; build it with weight=False")
        if weight is not None and not isinstance(weight, torch.Tensor):
            raise TypeError(f"GraphConv: weight must be a tensor, got {type(weight).__name__}")
        if weight is not None and weight.dim() != 2:
            raise ValueError(f"GraphConv: weight must have shape [in_feats, out_feats], got "
                             f"{tuple(weight.shape)}")
        _check_feat(self, g, feat, (self._in_feats if self.weight is not None else None, None),
                    reads_dst=False)
        feat_src, _ = _expand_pair(graph, feat)
        if weight is not None and weight.shape[0] != feat_src.shape[-1]:
            raise ValueError(f"GraphConv: weight must have shape [in_feats, out_feats] with "
                             f"in_feats = {feat_src.shape[-1]} (feat's last dimension), got "
                             f"{tuple(weight.shape)}")
        w = self.weight if weight is None else weight
        ew = _edge_weight(edge_weight, g)
        row, col = self._scales(g, feat_src.dtype)
        if self._in_feats > self._out_feats:
            # W first: the SpMM reads the narrower features, bias in its store
            h = feat_src if w is None else torch.matmul(feat_src, w)
            fuse = self.bias is not None and h.dim() == 2 and self.bias.dtype == h.dtype
            rst = _aggregate(g, h, ew, "sum", row_scale=row, col_scale=col,
                             bias=self.bias if fuse else None)
            if self.bias is not None and not fuse:
                rst = rst + self.bias
        else:
            rst = _aggregate(g, feat_src, ew, "sum", row_scale=row, col_scale=col)
            if w is not None:
                if rst.dim() == 2 and self.bias is not None and self.bias.dtype == rst.dtype:
                    rst = torch.addmm(self.bias, rst, w)
                else:
                    rst = torch.matmul(rst, w)
                    if self.bias is not None:
                        rst = rst + self.bias
            elif self.bias is not None:
                rst = rst + self.bias
        if self._activation is not None:
            rst = self._activation(rst)
        return rst

    def extra_repr(self):
        s = f"in={self._in_feats}, out={self._out_feats}, normalization={self._norm}"
        if "_activation" in self.__dict__:
            s += f", activation={self._activation}"
        return s


# ------------------------------------------------------------------- SAGEConv
class SAGEConv(nn.Module):
    r"""GraphSAGE (Hamilton et al.), DGL's `SAGEConv`:

        h_N(v) = aggr_{e=(u->v)} w_e h_u,     h'_v = norm(sigma(W_self h_v + W_neigh h_N(v) + b))

    aggregator_type: "mean" (mean over in-edges), "gcn" (h'_v = W_neigh
        (sum_e w_e h_u + h_v) / (deg_in(v) + 1) + b, no W_self), "pool"
        (elementwise max of relu(W_pool h_u + b_pool), fastgnn's max). "lstm"
        raises NotImplementedError (fastgnn has no LSTM reducer).
    in_feats (int or (src, dst) pair), out_feats, feat_drop, bias, norm,
    activation: as in DGL.
    forward(graph, feat [N_src, in] or (src, dst) pair, edge_weight=None [E]) -> [N_dst, out]

    Submodules `fc_neigh` (no bias), `fc_self` (with bias; not for "gcn",
    which has `bias` instead), `fc_pool` ("pool"), `feat_drop`, as DGL's.
    Unweighted "pool" with plain Linears runs as one fastgnn node
    (`segment_reduce_linear`: max, W_neigh, W_self and the bias together).
    """

    def __init__(self, in_feats, out_feats, aggregator_type, feat_drop=0.0, bias=True,
                 norm=None, activation=None):
        super().__init__()
        if aggregator_type == "lstm":
            raise NotImplementedError("SAGEConv: aggregator_type='lstm' is not supported by "
                                      "fastgnn.dgl (no LSTM reducer); use dgl.nn.SAGEConv")
        if aggregator_type not in ("mean", "gcn", "pool"):
            raise _InvalidOption(f"SAGEConv: aggregator_type must be 'mean', 'gcn', 'pool' or "
                                 f"'lstm', got {aggregator_type!r}")
        _positive_sizes("SAGEConv", in_feats=in_feats, out_feats=out_feats)
        self._in_src_feats, self._in_dst_feats = _pair_sizes(in_feats)
        self._out_feats = out_feats
        self._aggre_type = aggregator_type
        self.norm = norm
        self.feat_drop = nn.Dropout(feat_drop)
        self.activation = activation
        if aggregator_type == "pool":
            self.fc_pool = nn.Linear(self._in_src_feats, self._in_src_feats)
        self.fc_neigh = nn.Linear(self._in_src_feats, out_feats, bias=False)
        if aggregator_type != "gcn":
            self.fc_self = nn.Linear(self._in_dst_feats, out_feats, bias=bias)
        elif bias:
            self.bias = nn.Parameter(torch.zeros(self._out_feats))
        else:
            self.register_buffer("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        """Glorot-uniform linear weights with the ReLU gain (DGL's initialisation)."""
        gain = nn.init.calculate_gain("relu")
        if self._aggre_type == "pool":
            nn.init.xavier_uniform_(self.fc_pool.weight, gain=gain)
        if self._aggre_type != "gcn":
            nn.init.xavier_uniform_(self.fc_self.weight, gain=gain)
        nn.init.xavier_uniform_(self.fc_neigh.weight, gain=gain)

    def forward(self, graph, feat, edge_weight=None):
        g = _dgl_graph(graph)
        # "gcn" adds the destination features to the aggregated source ones
        _check_feat(self, g, feat, (self._in_src_feats, None if self._aggre_type == "gcn"
                                    else self._in_dst_feats))
        feat_src, feat_dst = _dropped_features(self, graph, feat)
        ew = _edge_weight(edge_weight, g)
        lin_first = self._in_src_feats > self._out_feats
        kind = self._aggre_type
        if kind == "mean":
            h = self.fc_neigh(feat_src) if lin_first else feat_src
            h_neigh = _aggregate(g, h, ew, "mean")
            if not lin_first:
                h_neigh = self.fc_neigh(h_neigh)
        elif kind == "gcn":
            if tuple(feat_src.shape[1:]) != tuple(feat_dst.shape[1:]):
                raise ValueError(f"SAGEConv(aggregator_type='gcn'): the source and destination "
                                 f"features must have one shape, got {tuple(feat_src.shape)} "
                                 f"and {tuple(feat_dst.shape)}")
            h = self.fc_neigh(feat_src) if lin_first else feat_src
            if isinstance(feat, tuple):
                h_dst = self.fc_neigh(feat_dst) if lin_first else feat_dst
            else:
                h_dst = h[:g.num_dst] if graph.is_block else h
            deg = _in_degree(g, h)
            h_neigh = (_aggregate(g, h, ew, "sum") + h_dst) / (deg + 1)
            if not lin_first:
                h_neigh = self.fc_neigh(h_neigh)
        else:
            h = torch.relu(self.fc_pool(feat_src))
            fused = self._pool_fused(g, h, feat_dst, ew)
            if fused is not None:
                return self._finish(fused)
            h_neigh = self.fc_neigh(_aggregate(g, h, ew, "max"))
        if kind == "gcn":
            rst = h_neigh if self.bias is None else h_neigh + self.bias
        else:
            rst = self.fc_self(feat_dst) + h_neigh
        return self._finish(rst)

    def _pool_fused(self, g, h, feat_dst, ew):
        """W_neigh max(h) + b + W_self h_dst as one `segment_reduce_linear`
        node when unweighted, 2-D and both linears are plain torch Linears
        without hooks (else None)."""
        lins = (self.fc_neigh, self.fc_self)
        if (ew is not None or h.dim() != 2 or feat_dst.dim() != 2
                or any(type(m) is not nn.Linear or m._forward_hooks or m._forward_pre_hooks
                       or m.weight.dtype != h.dtype for m in lins)):
            return None
        return ft.segment_reduce_linear(g, h, "max", self.fc_neigh.weight, self.fc_self.bias,
                                        self.fc_self.weight, feat_dst)

    def _finish(self, rst):
        if self.activation is not None:
            rst = self.activation(rst)
        if self.norm is not None:
            rst = self.norm(rst)
        return rst


# -------------------------------------------------------------------- GINConv
class GINConv(nn.Module):
    r"""Graph isomorphism network layer (Xu et al.), DGL's `GINConv`:

        h'_v = sigma(f_Theta((1 + eps) h_v + aggr_{e=(u->v)} w_e h_u))

    apply_func (f_Theta, or None), aggregator_type ("sum", "max", "mean"),
    init_eps, learn_eps (eps a parameter, else a buffer; `eps` [1] float32
    either way), activation: as in DGL.
    forward(graph, feat [N_src, *] or (src, dst) pair, edge_weight=None [E])
        -> apply_func's output [N_dst, *]
    """

    def __init__(self, apply_func=None, aggregator_type="sum", init_eps=0, learn_eps=False,
                 activation=None):
        super().__init__()
        self.apply_func = apply_func
        self._aggregator_type = aggregator_type
        self.activation = activation
        if aggregator_type not in ("sum", "max", "mean"):
            raise _InvalidAggregator(f"GINConv: aggregator_type must be 'sum', 'max' or "
                                     f"'mean', got {aggregator_type!r}")
        eps = torch.tensor([float(init_eps)], dtype=torch.float32)
        if learn_eps:
            self.eps = nn.Parameter(eps)
        else:
            self.register_buffer("eps", eps)

    def forward(self, graph, feat, edge_weight=None):
        g = _dgl_graph(graph)
        _check_feat(self, g, feat, min_dim=1)         # apply_func takes any width
        feat_src, feat_dst = _expand_pair(graph, feat)
        ew = _edge_weight(edge_weight, g)
        neigh = _aggregate(g, feat_src, ew, self._aggregator_type)
        rst = (1 + self.eps) * feat_dst + neigh
        if self.apply_func is not None:
            rst = self.apply_func(rst)
        if self.activation is not None:
            rst = self.activation(rst)
        return rst


# ------------------------------------------------------------------- GINEConv
def _edge_feat(module, edge_feat, graph, node_feat):
    """edge_feat [E, *s] in DGL's edge order, s node_feat's feature shape,
    of its dtype and device; TypeError / ValueError naming edge_feat."""
    layer = type(module).__name__
    _tensor(edge_feat, "edge_feat")
    shape = (graph.num_edges, *node_feat.shape[1:])
    if tuple(edge_feat.shape) != shape:
        raise ValueError(f"{layer}: edge_feat must have shape [E, ...] = {list(shape)} (one row "
                         f"per edge, in DGL's edge order, shaped as a node's features), got "
                         f"{tuple(edge_feat.shape)}")
    if edge_feat.dtype != node_feat.dtype or edge_feat.device != node_feat.device:
        raise TypeError(f"{layer}: edge_feat is a {edge_feat.dtype} tensor on "
                        f"{edge_feat.device} but node_feat a {node_feat.dtype} one on "
                        f"{node_feat.device}; convert one of them")


class GINEConv(nn.Module):
    r"""GIN with edge features (Hu et al.), DGL's `GINEConv`:

        h'_v = f_Theta((1 + eps) h_v + sum_{e=(u->v)} relu(h_u + e_uv))

    apply_func (f_Theta, or None), init_eps, learn_eps (eps a parameter,
    else a buffer; `eps` [1] float32 either way): as in DGL.
    forward(graph, node_feat [N_src, *] or (src, dst) pair,
            edge_feat [E, *] (DGL's edge order, shaped as a node's features))
        -> apply_func's output [N_dst, *]

    The messages relu(h_u + e_uv) are fastgnn.torch's GINEConv messages: ONE
    [E, F] tensor in CSR order (h_u gathered into it, e_uv added in place;
    the backward keeps the ReLU's bit mask), summed per destination by
    fastgnn's `segment_csr`.
    """

    def __init__(self, apply_func=None, init_eps=0, learn_eps=False):
        super().__init__()
        self.apply_func = apply_func
        eps = torch.tensor([float(init_eps)], dtype=torch.float32)
        if learn_eps:
            self.eps = nn.Parameter(eps)
        else:
            self.register_buffer("eps", eps)

    def forward(self, graph, node_feat, edge_feat):
        g = _dgl_graph(graph)
        _check_feat(self, g, node_feat, min_dim=1, arg="node_feat")   # apply_func: any width
        feat_src, feat_dst = _expand_pair(graph, node_feat)
        _edge_feat(self, edge_feat, g, feat_src)
        edges = _edges(g)
        width = math.prod(feat_src.shape[1:])
        messages = _gine_messages(edges, feat_src.reshape(g.num_src, width),
                                  ("edge", (edge_feat.reshape(g.num_edges, width),)))
        neigh = ft.segment_csr(edges.ptr, messages, "sum").view(g.num_dst, *feat_src.shape[1:])
        rst = (1 + self.eps) * feat_dst + neigh
        if self.apply_func is not None:
            rst = self.apply_func(rst)
        return rst


# -------------------------------------------------------------- attention
def _attention_dropout(module):
    """(p, seed) of the module's attention dropout for this call: p from its
    `attn_drop` (DGL's nn.Dropout), 0 outside training; a fresh seed from
    torch's default generator when p > 0."""
    p = float(module.attn_drop.p) if module.training else 0.0
    return p, (draw_seed() if p > 0 else 0)


def _residual(module, h_dst, prefix):
    """res_fc(h_dst) viewed [*prefix, -1, out_feats] (None without residual)."""
    if module.res_fc is None:
        return None
    return module.res_fc(h_dst).view(*prefix, -1, module._out_feats)


def _attention_sizes(module, in_feats, out_feats, num_heads, allow_zero_in_degree):
    """Store the attention layers' sizes and switch under DGL's attribute
    names; returns the projected width num_heads * out_feats."""
    _positive_sizes(type(module).__name__, in_feats=in_feats, out_feats=out_feats,
                    num_heads=num_heads)
    module._num_heads = num_heads
    module._in_src_feats, module._in_dst_feats = _pair_sizes(in_feats)
    module._out_feats = out_feats
    module._allow_zero_in_degree = allow_zero_in_degree
    return out_feats * num_heads


def _res_fc(module, in_dst, bias):
    """DGL's residual: a Linear when the widths differ, an identity otherwise;
    returns whether it is the Linear."""
    width = module._out_feats * module._num_heads
    if in_dst != width:
        module.res_fc = nn.Linear(in_dst, width, bias=bias)
        return True
    module.res_fc = nn.Identity()
    return False


class GATConv(_ZeroInDegreeChecked):
    r"""Graph attention (Velickovic et al.), DGL's `GATConv`, per head k:

        h'_v = sigma(sum_{e=(u->v)} a_e w_e W h_u (+ res(h_v)) + b),
        a_e = softmax_{e into v}(LeakyReLU(<attn_l, W h_u> + <attn_r, W h_v>))

    with w_e = 1 without edge_weight (which scales the weights after the
    softmax and dropout, as DGL).

    in_feats (int: one `fc`; (src, dst): `fc_src`, `fc_dst`), out_feats,
    num_heads, feat_drop, attn_drop, negative_slope, residual, activation,
    allow_zero_in_degree, bias: as in DGL.
    forward(graph, feat [N_src, *, in] or (src, dst) pair, edge_weight=None [E],
            get_attention=False)
        -> [N_dst, *, num_heads, out_feats], and with get_attention also
           a [E, *, num_heads, 1] (after dropout and edge_weight, DGL's edge order).

    Parameters `fc.weight` (or `fc_src`, `fc_dst`), `attn_l`, `attn_r`
    [1, num_heads, out_feats], `res_fc` (a Linear when the residual changes
    width), `bias` [num_heads * out_feats] (absent when res_fc is a Linear,
    whose bias serves). Without edge_weight the scores, softmax, dropout and
    weighted sum are one fused fastgnn op (`edge_attention`, score "gat";
    the bias added in its store); with edge_weight the weights come from
    fastgnn's `edge_softmax`, dropped by the module's `attn_drop` (torch's
    masks, as DGL's) and summed by one SpMM per head.
    """

    def __init__(self, in_feats, out_feats, num_heads, feat_drop=0.0, attn_drop=0.0,
                 negative_slope=0.2, residual=False, activation=None,
                 allow_zero_in_degree=False, bias=True):
        super().__init__()
        width = _attention_sizes(self, in_feats, out_feats, num_heads, allow_zero_in_degree)
        if isinstance(in_feats, tuple):
            self.fc_src = nn.Linear(self._in_src_feats, width, bias=False)
            self.fc_dst = nn.Linear(self._in_dst_feats, width, bias=False)
        else:
            self.fc = nn.Linear(self._in_src_feats, width, bias=False)
        self.attn_l = nn.Parameter(torch.empty(1, num_heads, out_feats))
        self.attn_r = nn.Parameter(torch.empty(1, num_heads, out_feats))
        self.feat_drop = nn.Dropout(feat_drop)
        self.attn_drop = nn.Dropout(attn_drop)
        self.leaky_relu = nn.LeakyReLU(negative_slope)
        self.has_linear_res = False
        self.has_explicit_bias = False
        if residual:
            self.has_linear_res = _res_fc(self, self._in_dst_feats, bias)
        else:
            self.register_buffer("res_fc", None)
        if bias and not self.has_linear_res:
            self.bias = nn.Parameter(torch.empty(width))
            self.has_explicit_bias = True
        else:
            self.register_buffer("bias", None)
        self.reset_parameters()
        self.activation = activation

    def reset_parameters(self):
        """Glorot-normal weights and attention vectors with the ReLU gain,
        zero biases (DGL's initialisation)."""
        gain = nn.init.calculate_gain("relu")
        if hasattr(self, "fc"):
            nn.init.xavier_normal_(self.fc.weight, gain=gain)
        else:
            nn.init.xavier_normal_(self.fc_src.weight, gain=gain)
            nn.init.xavier_normal_(self.fc_dst.weight, gain=gain)
        nn.init.xavier_normal_(self.attn_l, gain=gain)
        nn.init.xavier_normal_(self.attn_r, gain=gain)
        if self.has_explicit_bias:
            nn.init.constant_(self.bias, 0)
        if isinstance(self.res_fc, nn.Linear):
            nn.init.xavier_normal_(self.res_fc.weight, gain=gain)
            if self.res_fc.bias is not None:
                nn.init.constant_(self.res_fc.bias, 0)

    def forward(self, graph, feat, edge_weight=None, get_attention=False):
        g = self._graph(graph)
        _check_feat(self, g, feat, (self._in_src_feats, self._in_dst_feats))
        H, C = self._num_heads, self._out_feats
        h_src, h_dst = _dropped_features(self, graph, feat)
        if isinstance(feat, tuple):
            fc_s, fc_d = (self.fc, self.fc) if hasattr(self, "fc") else (self.fc_src, self.fc_dst)
            feat_src = fc_s(h_src).view(*h_src.shape[:-1], H, C)
            feat_dst = fc_d(h_dst).view(*h_dst.shape[:-1], H, C)
            el, er = self._logits(feat_src, feat_dst)
        else:
            feat_src = self.fc(h_src).view(*h_src.shape[:-1], H, C)
            el, er = self._logits(feat_src, feat_src)
            er = er[:g.num_dst]
        prefix = tuple(feat_src.shape[1:-2])          # DGL's extra feature dimensions
        heads = math.prod(prefix) * H
        el, er = el.reshape(g.num_src, heads), er.reshape(g.num_dst, heads)
        v = feat_src.reshape(g.num_src, heads, C)
        ew = _edge_weight(edge_weight, g)
        fuse_bias = (self.has_explicit_bias and not prefix and self.bias.dtype == v.dtype)
        attn = None
        if ew is None:
            p, seed = _attention_dropout(self)
            out = ft.edge_attention(g, "gat", a_src=el, a_dst=er, v=v,
                                    bias=self.bias.view(H, C) if fuse_bias else None,
                                    negative_slope=self.leaky_relu.negative_slope, dropout=p,
                                    seed=seed, training=p > 0,
                                    return_attention_weights=get_attention)
            if get_attention:
                out, alpha = out
                attn = _dropped(alpha, p, seed, 0, p > 0)
        else:
            fuse_bias = False
            ei = _cached_edge_index(g)
            scores = self.leaky_relu(el[ei[0]] + er[ei[1]])
            attn = self.attn_drop(ft.edge_softmax(g, scores)) * ew.unsqueeze(-1).to(el.dtype)
            out = u_mul_e(graph, v, attn.unsqueeze(-1), "sum")
        rst = out.view(g.num_dst, *prefix, H, C)
        res = _residual(self, h_dst, (g.num_dst, *prefix))
        if res is not None:
            rst = rst + res
        if self.has_explicit_bias and not fuse_bias:
            rst = rst + self.bias.view(*((1,) * (len(prefix) + 1)), H, C)
        if self.activation:
            rst = self.activation(rst)
        if get_attention:
            return rst, attn.view(g.num_edges, *prefix, H, 1)
        return rst

    def _logits(self, feat_src, feat_dst):
        """(<feat_src, attn_l>, <feat_dst, attn_r>) per head, [N, *, H]: one
        GEMM against both vectors when the features are [N, H, C] and one
        tensor (fastgnn.torch's `_head_logits`)."""
        if feat_src.dim() == 3 and feat_dst is feat_src:
            return _head_logits(feat_src, self.attn_l, self.attn_r)
        if feat_src.dim() == 3 and feat_dst.dim() == 3:
            return _head_logits(feat_src, self.attn_l)[0], _head_logits(feat_dst, self.attn_r)[0]
        return (feat_src * self.attn_l).sum(-1), (feat_dst * self.attn_r).sum(-1)


class GATv2Conv(_ZeroInDegreeChecked):
    r"""GATv2 (Brody et al.), DGL's `GATv2Conv`, per head k:

        h'_v = sigma(sum_{e=(u->v)} a_e W_src h_u (+ res(h_v))),
        a_e = softmax_{e into v}(<attn, LeakyReLU(W_src h_u + W_dst h_v)>)

    in_feats (int or (src, dst)), out_feats, num_heads, feat_drop,
    attn_drop, negative_slope, residual, activation, allow_zero_in_degree,
    bias (of fc_src, fc_dst and res_fc; kept as a bool, as DGL),
    share_weights (fc_dst is fc_src for one feature tensor): as in DGL.
    forward(graph, feat [N_src, in] or (src, dst) pair, get_attention=False)
        -> [N_dst, num_heads, out_feats], and with get_attention also
           a [E, num_heads, 1] (after dropout, DGL's edge order).

    Parameters `fc_src`, `fc_dst` (both in the state_dict when shared, as
    DGL's), `attn` [1, num_heads, out_feats], `res_fc`. The scores, softmax,
    dropout and weighted sum are one fused fastgnn op (`edge_attention`,
    score "gatv2"); nothing of size edges x heads x channels is stored.
    """

    def __init__(self, in_feats, out_feats, num_heads, feat_drop=0.0, attn_drop=0.0,
                 negative_slope=0.2, residual=False, activation=None,
                 allow_zero_in_degree=False, bias=True, share_weights=False):
        super().__init__()
        width = _attention_sizes(self, in_feats, out_feats, num_heads, allow_zero_in_degree)
        self.fc_src = nn.Linear(self._in_src_feats, width, bias=bias)
        if isinstance(in_feats, tuple):
            self.fc_dst = nn.Linear(self._in_dst_feats, width, bias=bias)
        elif share_weights:
            self.fc_dst = self.fc_src
        else:
            self.fc_dst = nn.Linear(self._in_src_feats, width, bias=bias)
        self.attn = nn.Parameter(torch.empty(1, num_heads, out_feats))
        self.feat_drop = nn.Dropout(feat_drop)
        self.attn_drop = nn.Dropout(attn_drop)
        self.leaky_relu = nn.LeakyReLU(negative_slope)
        if residual:
            _res_fc(self, self._in_dst_feats, bias)
        else:
            self.register_buffer("res_fc", None)
        self.activation = activation
        self.share_weights = share_weights
        self.bias = bias
        self.reset_parameters()

    def reset_parameters(self):
        """Glorot-normal weights and attention vector with the ReLU gain,
        zero biases (DGL's initialisation)."""
        gain = nn.init.calculate_gain("relu")
        nn.init.xavier_normal_(self.fc_src.weight, gain=gain)
        if self.bias:
            nn.init.constant_(self.fc_src.bias, 0)
        if not self.share_weights:
            nn.init.xavier_normal_(self.fc_dst.weight, gain=gain)
            if self.bias:
                nn.init.constant_(self.fc_dst.bias, 0)
        nn.init.xavier_normal_(self.attn, gain=gain)
        if isinstance(self.res_fc, nn.Linear):
            nn.init.xavier_normal_(self.res_fc.weight, gain=gain)
            if self.bias:
                nn.init.constant_(self.res_fc.bias, 0)

    def forward(self, graph, feat, get_attention=False):
        g = self._graph(graph)
        _check_feat(self, g, feat, (self._in_src_feats, self._in_dst_feats))
        H, C = self._num_heads, self._out_feats
        h_src, h_dst = _dropped_features(self, graph, feat)
        if isinstance(feat, tuple):
            xl = self.fc_src(h_src).view(-1, H, C)
            xr = self.fc_dst(h_dst).view(-1, H, C)
        else:
            if self.share_weights:
                xl = self.fc_src(h_src).view(-1, H, C)
                xr = xl[:g.num_dst]
            elif not graph.is_block:
                # one input, two projections: x's gradient summed in the GEMMs' epilogues
                xl, xr = (y.view(-1, H, C) for y in
                          shared_input_linears(h_src, (self.fc_src, self.fc_dst)))
            else:
                xl = self.fc_src(h_src).view(-1, H, C)
                xr = self.fc_dst(h_dst).view(-1, H, C)
        p, seed = _attention_dropout(self)
        out = ft.edge_attention(g, "gatv2", xl=xl, xr=xr, att=self.attn,
                                negative_slope=self.leaky_relu.negative_slope, dropout=p,
                                seed=seed, training=p > 0, return_attention_weights=get_attention)
        attn = None
        if get_attention:
            out, alpha = out
            attn = _dropped(alpha, p, seed, 0, p > 0).unsqueeze(-1)
        res = _residual(self, h_dst, (h_dst.shape[0],))
        rst = out if res is None else out + res
        if self.activation:
            rst = self.activation(rst)
        if get_attention:
            return rst, attn
        return rst
