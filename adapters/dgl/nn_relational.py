"""Drop-in replacement for DGL 2.x's `dgl.nn.RelGraphConv` on fastgnn's kernels.

The same constructor arguments, submodules and parameter names as DGL's
(`linear_r` is DGL's own `TypedLinear`, holding the relation weights
`linear_r.W` and, with bases, `linear_r.coeff`; `h_bias`, `loop_weight`,
`layer_norm_weight`), so a DGL `state_dict` loads with `strict=True` and
ours into DGL's, and seeded construction draws DGL's initial weights. The
same forward inputs (a DGLGraph, homogeneous or a block; one feature
tensor; etypes; norm) and function.

The relation-typed aggregation is fastgnn.torch's RGCNConv machinery: the
edges are grouped by relation once per (graph, etypes) pair into
relation-expanded fastgnn Graphs (`fastgnn.torch.nn_hetero.relation_graphs`),
and each forward is one SpMM over such a graph plus dense GEMMs for the
relation weights (`_typed_aggregate`): no launch per relation and nothing of
size [E, out_feat]. DGL's message passing makes W_{r_e} h_u per edge.
"""
from __future__ import annotations

import numbers

import torch
from torch import nn

from dgl.nn.pytorch.linear import TypedLinear

from fastgnn.torch.functional import _cached_edge_index
from fastgnn.torch.nn_hetero import _typed_aggregate, relation_graphs

from .checks import _check_feat, _dgl_graph, _positive_sizes
from .ops import _tensor

__all__ = ["RelGraphConv"]


def _edge_types(graph, etypes, num_rels):
    """etypes as a [E] integer tensor in DGL's edge order: a tensor as given
    (checked by `relation_graphs`), or a list of per-relation edge counts
    (edges sorted by relation, DGL's earlier form) expanded once per graph."""
    if not isinstance(etypes, (list, tuple)):
        return etypes
    if any(isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 0 for c in etypes):
        raise TypeError(f"RelGraphConv: etypes must be a [E] integer tensor of edge types, or "
                        f"a list of per-relation edge counts (non-negative ints), got {etypes!r}")
    counts = tuple(int(c) for c in etypes)
    if len(counts) > num_rels or sum(counts) != graph.num_edges:
        raise ValueError(f"RelGraphConv: etypes as a list holds the number of edges of each "
                         f"relation (edges sorted by relation): at most num_rels = {num_rels} "
                         f"counts summing to the graph's {graph.num_edges} edges, got "
                         f"{len(counts)} summing to {sum(counts)} (per-edge types: pass a "
                         "tensor)")

    def build():
        device = _cached_edge_index(graph).device
        return torch.repeat_interleave(torch.arange(len(counts), device=device),
                                       torch.tensor(counts, device=device),
                                       output_size=graph.num_edges)
    return graph.cached(("fastgnn.dgl", "edge_types", counts), build)


def _edge_norm(norm, graph, feat):
    """norm [E] or [E, 1] (one scalar per edge, DGL's edge order) -> [E]."""
    if norm is None:
        return None
    _tensor(norm, "norm")
    if tuple(norm.shape) not in ((graph.num_edges,), (graph.num_edges, 1)):
        raise ValueError(f"RelGraphConv: norm must have shape [E, 1] = [{graph.num_edges}, 1] "
                         f"(one scalar per edge, in DGL's edge order), got {tuple(norm.shape)}")
    if norm.device != feat.device:
        raise ValueError(f"RelGraphConv: norm is on {norm.device} but feat on {feat.device}")
    return norm.reshape(graph.num_edges)


class RelGraphConv(nn.Module):
    r"""Relational graph convolution (Schlichtkrull et al.), DGL's `RelGraphConv`:

        h'_v = dropout(sigma(LN(sum_{e=(u->v)} c_e W_{r_e} h_u) + b + W_0 h_v))

    r_e = etypes[e], c_e = norm[e] (1 without norm), LN the layer norm (with
    layer_norm), b the bias, W_0 the self-loop weight (with self_loop; h_v
    the first num_dst rows of feat, as DGL).

    in_feat, out_feat, num_rels, regularizer (None: a W_r per relation;
    "basis": W_r = sum_b a_rb V_b over num_bases bases; "bdd": W_r
    block-diagonal with num_bases blocks, which must divide in_feat and
    out_feat), num_bases (None: num_rels), bias, activation, self_loop,
    dropout, layer_norm: as in DGL.
    forward(g, feat [N_src, in_feat], etypes [E] integer tensor (or a list of
            per-relation edge counts, edges sorted by relation),
            norm=None [E, 1], *, presorted=False) -> [N_dst, out_feat]
        presorted is accepted and not needed (the edges are grouped by
        relation once per (graph, etypes) pair whatever their order).

    Parameters `linear_r.W` ([num_rels, in, out]; basis: [num_bases, in,
    out] and `linear_r.coeff` [num_rels, num_bases]; bdd: [num_rels,
    num_bases * in/num_bases * out/num_bases]), `h_bias` [out],
    `loop_weight` [in, out], `layer_norm_weight` (a LayerNorm), as DGL's.
    Bad inputs raise a TypeError / ValueError naming the argument (feat,
    etypes, norm, the sizes and options).
    """

    def __init__(self, in_feat, out_feat, num_rels, regularizer=None, num_bases=None,
                 bias=True, activation=None, self_loop=True, dropout=0.0, layer_norm=False):
        super().__init__()
        _positive_sizes("RelGraphConv", in_feat=in_feat, out_feat=out_feat, num_rels=num_rels)
        if regularizer not in (None, "basis", "bdd"):
            raise ValueError(f"RelGraphConv: regularizer must be None, 'basis' or 'bdd', "
                             f"got {regularizer!r}")
        if regularizer is not None and num_bases is None:
            num_bases = num_rels
        if regularizer is not None:
            _positive_sizes("RelGraphConv", num_bases=num_bases)
        if regularizer == "bdd" and (in_feat % num_bases or out_feat % num_bases):
            raise ValueError(f"RelGraphConv: num_bases={num_bases} (blocks of 'bdd') must divide "
                             f"in_feat ({in_feat}) and out_feat ({out_feat})")
        self._in_feat, self._num_rels = in_feat, num_rels
        self.linear_r = TypedLinear(in_feat, out_feat, num_rels, regularizer, num_bases)
        self.bias = bias
        self.activation = activation
        self.self_loop = self_loop
        self.layer_norm = layer_norm
        if bias:
            self.h_bias = nn.Parameter(torch.zeros(out_feat))
        if layer_norm:
            self.layer_norm_weight = nn.LayerNorm(out_feat, elementwise_affine=True)
        if self_loop:
            self.loop_weight = nn.Parameter(torch.empty(in_feat, out_feat))
            nn.init.xavier_uniform_(self.loop_weight, gain=nn.init.calculate_gain("relu"))
        self.dropout = nn.Dropout(dropout)

    def _relation_weights(self):
        """(weights, blocks) for `_typed_aggregate`: W_r stacked [R, in, out]
        (bases composed), or bdd's [R, K, in/K, out/K] and K."""
        lin = self.linear_r
        if lin.regularizer == "bdd":
            K = lin.num_bases
            return lin.W.view(self._num_rels, K, lin.submat_in, lin.submat_out), K
        return lin.get_weight(), None

    def forward(self, g, feat, etypes, norm=None, *, presorted=False):
        graph = _dgl_graph(g)
        if not isinstance(feat, torch.Tensor):
            raise TypeError(f"RelGraphConv: feat must be a tensor [num_src, in_feat] (as DGL's, "
                            f"it takes no (src, dst) pair: its self-loop reads the first "
                            f"num_dst rows), got {type(feat).__name__}")
        _check_feat(self, graph, feat, (self._in_feat, None))
        if feat.dim() != 2:
            raise ValueError(f"RelGraphConv: feat must have shape [num_src, in_feat], got "
                             f"{tuple(feat.shape)}")
        if self.self_loop and graph.num_dst > graph.num_src:
            raise ValueError(f"RelGraphConv: the self-loop reads the first num_dst rows of feat, "
                             f"but the graph has {graph.num_dst} destination and "
                             f"{graph.num_src} source nodes")
        groups = relation_graphs(_cached_edge_index(graph),
                                 _edge_types(graph, etypes, self._num_rels), self._num_rels,
                                 (graph.num_src, graph.num_dst), type_name="etypes")
        weight, blocks = self._relation_weights()
        bias = self.h_bias if self.bias and not self.layer_norm else None
        h, bias_added = _typed_aggregate(groups, feat, weight, "sum", bias,
                                         _edge_norm(norm, graph, feat), blocks)
        if self.layer_norm:
            h = self.layer_norm_weight(h)
        if self.bias and not bias_added:
            h = h + self.h_bias
        if self.self_loop:
            h = torch.addmm(h, feat[:graph.num_dst], self.loop_weight)
        if self.activation:
            h = self.activation(h)
        return self.dropout(h)
