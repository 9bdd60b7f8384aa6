"""PyG 2.8's `HGTConv` (Heterogeneous Graph Transformer, Hu et al.) as a
fastgnn.torch drop-in, carried by the fused edge attention ("dot" score).

HGTConv's softmax runs over every in-edge of a node, whatever the edge type.
Here each destination node type t gets one bipartite fastgnn Graph whose
sources are blocks, one per edge type into t (that edge type's source nodes,
offset into one index space), built once per set of graph inputs and cached
(`_destination_graph`). A block's keys and values are its source type's K and
V through the edge type's per-head relation transforms, the keys also scaled
by the edge type's prior p_rel and 1/sqrt(D) (folded into the [D, D]
transform), so one `edge_attention(score="dot")` per destination type
computes every attention-weighted sum into t at once. No tensor of size
[E, heads, D] is made (PyG's messages are one), forward or backward.
"""
from __future__ import annotations

import math
import numbers
import weakref
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from fastgnn.graph import Graph

from ._autograd import device_scope
from .attention import _materialise, edge_attention
from .graph_cache import _LRU, _SPARSE_LAYOUTS, _edge_index_parts, _tkey
from .nn import _autocast_on, _check_kwargs, _linear, _oriented, _pop_deterministic
from .nn_hetero import _positive
from .nn_propagation import _eager

__all__ = ["HGTConv"]


# ------------------------------------------------------------------ parameters
def _kaiming_uniform_(t: Tensor, fan: int):
    """PyG's kaiming_uniform(t, fan, a=sqrt(5)): uniform(+-sqrt(6 / ((1 + a^2) fan)))."""
    a = math.sqrt(5)
    bound = math.sqrt(6 / ((1 + a**2) * fan))
    with torch.no_grad():
        t.uniform_(-bound, bound)


class _TypedLinears(torch.nn.Module):
    """One Linear per type, `lins[type]` (PyG's HeteroDictLinear parameter
    names: lins.<type>.weight [out, in], lins.<type>.bias [out]); in -1 is
    lazy, materialised from the first features of that type."""

    def __init__(self, in_channels: dict, out_channels: int):
        super().__init__()
        self.lins = torch.nn.ModuleDict({t: _linear(c, out_channels)
                                         for t, c in in_channels.items()})
        self.reset_parameters()

    def reset_parameters(self):
        for lin in self.lins.values():
            lin.reset_parameters()

    def materialise(self, x_dict: dict):
        """Give every lazy Linear with features in x_dict its weight, in
        x_dict's order, each drawn twice as PyG's lazy HeteroDictLinear does
        (on materialising, then reset), so seeded layers agree with PyG's."""
        for t, x in x_dict.items():
            lin = self.lins[t]
            if isinstance(lin, torch.nn.LazyLinear) and lin.has_uninitialized_params():
                _materialise(lin, x)
                lin.reset_parameters()


class _RelationWeights(torch.nn.Module):
    """`weight` [heads * R, D, D] (PyG's HeteroLinear without bias): row
    h * R + r is head h's transform of edge type r, applied as x @ W."""

    def __init__(self, num: int, dim: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(num, dim, dim))
        self.reset_parameters()

    def reset_parameters(self):
        _kaiming_uniform_(self.weight, self.weight.shape[1])


_PARAMETER_DICT_ATTRS = frozenset(dir(torch.nn.ParameterDict))


def _parameter_key(name: str) -> str:
    """A type's key in `skip` / `p_rel` as PyG's ParameterDict stores it
    (the state_dict's names): '.' becomes '#', a name that is a
    ParameterDict attribute is wrapped in <>."""
    if name in _PARAMETER_DICT_ATTRS:
        name = f"<{name}>"
    return name.replace(".", "#")


def _check_metadata(metadata):
    """(node types [str], edge types [(src, rel, dst)]) of PyG's metadata,
    every edge type's end points among the node types."""
    if not isinstance(metadata, (tuple, list)) or len(metadata) != 2:
        raise ValueError("HGTConv: metadata must be a pair (node_types, edge_types), as "
                         f"HeteroData.metadata() returns, got {metadata!r}")
    node_types, edge_types = list(metadata[0]), [tuple(e) for e in metadata[1]]
    if not node_types or not all(isinstance(t, str) for t in node_types):
        raise ValueError(f"HGTConv: metadata[0] must list the node types (strings), got "
                         f"{metadata[0]!r}")
    for et in edge_types:
        if len(et) != 3 or not all(isinstance(p, str) for p in et):
            raise ValueError("HGTConv: metadata[1] must list edge types (src, relation, dst) "
                             f"of strings, got {et!r}")
        for end in (et[0], et[2]):
            if end not in node_types:
                raise ValueError(f"HGTConv: edge type {et} of metadata names node type "
                                 f"{end!r}, which metadata[0] does not list")
    if not edge_types:
        raise ValueError("HGTConv: metadata[1] lists no edge types")
    return node_types, edge_types


def _check_in_channels(in_channels, node_types):
    """{node type: width} (-1: lazy) from an int or a dict."""
    if not isinstance(in_channels, Mapping):
        in_channels = {t: in_channels for t in node_types}
    checked = {}
    for t, c in in_channels.items():
        if isinstance(c, bool) or not isinstance(c, numbers.Integral) or (c < 1 and c != -1):
            raise ValueError(f"HGTConv: in_channels must be a positive int or -1 (lazy), or "
                             f"a dict of them per node type, got {c!r} for {t!r}")
        checked[t] = int(c)
    return checked


# --------------------------------------------------------- graph of one type
def _edge_reader(adj, num_src, num_dst, what):
    """(key, read) for one edge type's graph input: key identifies its index
    tensors (as the graph cache does), read() gives its edges (src [E],
    dst [E]). Raises TypeError / ValueError naming `what`."""
    if isinstance(adj, Tensor) and adj.layout in _SPARSE_LAYOUTS:
        if adj.dim() != 2 or adj.dense_dim() != 0 or tuple(adj.shape) != (num_dst, num_src):
            raise ValueError(f"{what}: a sparse adj_t must be [num_dst, num_src] = "
                             f"[{num_dst}, {num_src}] with scalar values, got "
                             f"{tuple(adj.shape)}")
        if adj.layout == torch.sparse_csr:
            ptr, minor = adj.crow_indices(), adj.col_indices()
        elif adj.layout == torch.sparse_csc:
            ptr, minor = adj.ccol_indices(), adj.row_indices()
        else:
            # the stored entries, duplicates included, as PyG reads them
            ij = adj._indices()
            return (_tkey(ij),), lambda: (ij[1], ij[0])

        def read():
            major = torch.repeat_interleave(
                torch.arange(ptr.shape[0] - 1, device=ptr.device), ptr.diff())
            return (minor, major) if adj.layout == torch.sparse_csr else (major, minor)
        return (str(adj.layout), _tkey(ptr), _tkey(minor)), read
    if type(adj).__name__ == "SparseTensor" and hasattr(adj, "coo"):
        if tuple(adj.sparse_sizes()) != (num_dst, num_src):
            raise ValueError(f"{what}: a SparseTensor adj_t must be [num_dst, num_src] = "
                             f"[{num_dst}, {num_src}], got {tuple(adj.sparse_sizes())}")
        row, col, _ = adj.coo()
        return (_tkey(row), _tkey(col)), lambda: (col, row)
    if not isinstance(adj, Tensor) or adj.layout != torch.strided:
        raise TypeError(f"{what} must be an edge_index [2, E], a PyG EdgeIndex or a sparse "
                        f"adj_t [num_dst, num_src], got {type(adj).__name__}")
    try:
        ei, _, _ = _edge_index_parts(adj, num_src, num_dst)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{what}: {error}") from None
    return (_tkey(ei),), lambda: (ei[0], ei[1])


def _build_destination_graph(blocks, num_dst, device):
    """The bipartite Graph of blocks [(what, read, num_src)]: block b's
    edges with their sources offset by the rows of the blocks before it."""
    srcs, dsts, offset, spans = [], [], 0, []
    for what, read, num_src in blocks:
        src, dst = (t.detach().long() for t in read())
        if src.numel():
            spans.append((what, num_src, torch.stack([src.min(), src.max(), dst.min(),
                                                      dst.max()])))
        srcs.append(src + offset)
        dsts.append(dst)
        offset += num_src
    if spans:
        bounds = torch.stack([s for _, _, s in spans]).tolist()
        for (what, num_src, _), (lo_s, hi_s, lo_d, hi_d) in zip(spans, bounds):
            if min(lo_s, lo_d) < 0 or hi_s >= num_src or hi_d >= num_dst:
                raise ValueError(f"{what} holds an edge outside its node types' "
                                 f"{num_src} source and {num_dst} destination nodes")
    with device_scope(device):
        return Graph.from_edge_index(torch.stack([torch.cat(srcs), torch.cat(dsts)]),
                                     num_src=offset, num_dst=num_dst)


_DESTINATION_GRAPHS = _LRU(32)   # one entry per destination node type of each graph


def _destination_graph(blocks, num_dst, device) -> Graph:
    """The Graph of every edge type into one node type, blocks [(what,
    graph input, num_src)] in source order, built once and reused while
    every graph input lives and is unchanged (the graph cache's key of each
    index tensor, and the node counts)."""
    readers = [(what, *_edge_reader(adj, num_src, num_dst, what), num_src)
               for what, adj, num_src in blocks]
    key = ("hgt_destination", num_dst) + tuple((k, n) for _, k, _, n in readers)
    refs = tuple(weakref.ref(adj) for _, adj, _ in blocks)

    def build():
        return refs, _build_destination_graph([(w, r, n) for w, _, r, n in readers], num_dst,
                                              device)

    def alive(value):
        return all(ref() is not None for ref in value[0])
    return _DESTINATION_GRAPHS.get(key, blocks[0][1], build, valid=alive)[1]


# ------------------------------------------------------------------- HGTConv
# why HGTConv refuses flow="target_to_source" (at construction and per call)
_HGT_FLOW = "(HGTConv's edge types lead from their first node type to their last)"


class HGTConv(torch.nn.Module):
    r"""Heterogeneous graph transformer layer (Hu et al.), PyG 2.8's `HGTConv`.

    For node j of type tau(j), K, Q, V = split(kqv_lin[tau(j)](x_j)) into
    heads h of D = out_channels / heads channels. Per edge type r = (s, rel, t)
    and head h (R edge types in metadata, W_{h,r} = k_rel/v_rel.weight[h R + r]):

        k'_{j,r,h} = p_rel[r][h] K_{j,h} W^k_{h,r},    v'_{j,r,h} = V_{j,h} W^v_{h,r}
        m_{i,h}    = sum_{e = (j -> i)} softmax_e(<Q_{i,h}, k'_{j,r_e,h}> / sqrt(D)) v'_{j,r_e,h}

    the softmax over every in-edge of i across the edge types (a node
    without in-edges gets m_i = 0); then

        a_i  = out_lin[tau(i)](gelu(m_i)),
        x'_i = sigma a_i + (1 - sigma) x_i,  sigma = sigmoid(skip[tau(i)])
               (x'_i = a_i where x_i is not out_channels wide).

    in_channels:  an int for every node type, a dict {node type: int}, or -1
                  (lazy: widths from the first features).
    out_channels: divisible by heads.
    metadata:     (node types, edge types (src, relation, dst)), as
                  HeteroData.metadata().
    heads:        attention heads.
    deterministic (fastgnn only, keyword): False lets the GPU backward use
                  float atomics.
    forward(x_dict {node type: [N_type, in]},
            edge_index_dict {edge type: edge_index [2, E] | EdgeIndex |
                             adj_t [N_dst, N_src] (torch sparse CSR/CSC/COO
                             or SparseTensor; values ignored, COO entries as
                             stored)})
        -> {node type: [N_type, out_channels]} for the node types of x_dict
           that metadata's edge types lead into, in kqv_lin's order; other
           node types are left out, as PyG 2.8 does. Edge types of metadata
           may be missing from edge_index_dict or have no edges.

    Parameters as PyG's: `kqv_lin.lins.<type>` and `out_lin.lins.<type>`
    (weight, bias), `k_rel.weight`, `v_rel.weight` [heads R, D, D],
    `skip.<type>` [1], `p_rel.<src>__<rel>__<dst>` [1, heads]: a PyG
    state_dict loads with strict=True, and ours into PyG's.

    Per destination type one fused attention over a Graph of all its edge
    types (sources: one block per edge type, made once per set of graph
    inputs); p_rel / sqrt(D) is folded into the [D, D] key transforms. The
    relation transforms cost sum over edge types of N_src x heads x D, as
    PyG's; nothing per edge is stored. K, Q, V are computed only for the
    node types that take part (sources, and destinations of an edge type of
    edge_index_dict), so kqv_lin of any other node type gets no gradient
    (None; PyG's are zeros).
    """

    def __init__(self, in_channels, out_channels: int, metadata, heads: int = 1, **kwargs):
        super().__init__()
        name = type(self).__name__
        self.deterministic = _pop_deterministic(name, kwargs)
        self.flow = _check_kwargs(name, kwargs)
        _oriented(self, None, unsupported=_HGT_FLOW)
        self.aggr = "add"
        out_channels = _positive(name, "out_channels", out_channels)
        heads = _positive(name, "heads", heads)
        if out_channels % heads:
            raise ValueError(f"{name}: out_channels (got {out_channels}) must be divisible by "
                             f"the number of heads (got {heads})")
        self.node_types, self.edge_types = _check_metadata(metadata)
        self.in_channels = _check_in_channels(in_channels, self.node_types)
        self.out_channels, self.heads = out_channels, heads
        self.edge_types_map = {et: r for r, et in enumerate(self.edge_types)}
        self.dst_node_types = {et[-1] for et in self.edge_types}
        dim, num = out_channels // heads, heads * len(self.edge_types)
        self.kqv_lin = _TypedLinears(self.in_channels, 3 * out_channels)
        self.out_lin = _TypedLinears({t: out_channels for t in self.node_types}, out_channels)
        self.k_rel = _RelationWeights(num, dim)
        self.v_rel = _RelationWeights(num, dim)
        # the state_dict's order as PyG's: skip's keys sorted (a ParameterDict
        # made from a dict sorts them), p_rel's in metadata's order
        self.skip = torch.nn.ParameterDict({_parameter_key(t): torch.nn.Parameter(
            torch.empty(1)) for t in self.node_types})
        self.p_rel = torch.nn.ParameterDict()
        for et in self.edge_types:
            self.p_rel[_parameter_key("__".join(et))] = torch.nn.Parameter(torch.empty(1, heads))
        self.reset_parameters()

    def reset_parameters(self):
        """kqv_lin, out_lin (PyG's Linear draws), k_rel, v_rel (kaiming
        uniform over D), in that order, as PyG's; skip and p_rel ones."""
        self.kqv_lin.reset_parameters()
        self.out_lin.reset_parameters()
        self.k_rel.reset_parameters()
        self.v_rel.reset_parameters()
        with torch.no_grad():
            for p in (*self.skip.values(), *self.p_rel.values()):
                p.fill_(1.0)

    # ------------------------------------------------------------ inputs
    def _features(self, x_dict):
        """{node type: x} of x_dict's node types that have a kqv_lin, in its
        order (PyG's; other node types are ignored), each checked."""
        name = type(self).__name__
        if not isinstance(x_dict, Mapping):
            raise TypeError(f"'{name}': x_dict must be a dict {{node type: features}}, got "
                            f"{type(x_dict).__name__}")
        ref = self.k_rel.weight
        features = {}
        for t, lin in self.kqv_lin.lins.items():
            if t not in x_dict:
                continue
            x, what = x_dict[t], f"x_dict[{t!r}]"
            if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() != 2:
                raise TypeError(f"'{name}': {what} must be a float tensor [num_nodes, "
                                f"in_channels], got {_describe(x)}")
            width = None if isinstance(lin, torch.nn.LazyLinear) else lin.in_features
            if width is not None and x.shape[1] != width:
                raise ValueError(f"'{name}': {what} must have {width} features "
                                 f"(in_channels), got {x.shape[1]}")
            if x.dtype != ref.dtype and not _autocast_on(x.device.type):
                raise TypeError(f"'{name}': {what} has dtype {x.dtype} but the layer's "
                                f"parameters {ref.dtype} (convert one of them)")
            if x.device != ref.device:
                raise ValueError(f"'{name}': {what} is on {x.device} but the layer on "
                                 f"{ref.device}")
            features[t] = x
        return features

    def _incoming(self, edge_index_dict, features):
        """{destination type: [(edge type, graph input)]} in edge_index_dict's
        order, every edge type checked against metadata and x_dict."""
        name = type(self).__name__
        if not isinstance(edge_index_dict, Mapping):
            raise TypeError(f"'{name}': edge_index_dict must be a dict {{edge type: "
                            f"edge_index}}, got {type(edge_index_dict).__name__}")
        incoming = {}
        for et, adj in edge_index_dict.items():
            if et not in self.edge_types_map:
                raise ValueError(f"'{name}': edge_index_dict has edge type {et!r}, which is "
                                 "not among metadata's edge types")
            for end in (et[0], et[2]):
                if end not in features:
                    raise ValueError(f"'{name}': edge_index_dict has edge type {et!r} but "
                                     f"x_dict has no features of node type {end!r}")
            if isinstance(adj, Tensor) and adj.device != self.k_rel.weight.device:
                raise ValueError(f"'{name}': edge_index_dict[{et!r}] is on {adj.device} but "
                                 f"the layer on {self.k_rel.weight.device}")
            incoming.setdefault(et[2], []).append((et, adj))
        return incoming

    # ------------------------------------------------------------- forward
    def _attend(self, blocks, k, q, v, dst):
        """m [N_dst, out_channels] of one destination type: one fused
        attention over the Graph of its edge types (`blocks`)."""
        H, R = self.heads, len(self.edge_types)
        D = self.out_channels // H
        graph = _destination_graph(
            [(f"edge_index_dict[{et!r}]", adj, k[et[0]].shape[0]) for et, adj in blocks],
            q[dst].shape[0], q[dst].device)
        w_k = self.k_rel.weight.view(H, R, D, D)
        w_v = self.v_rel.weight.view(H, R, D, D)
        keys, values = [], []
        for et, _ in blocks:
            r = self.edge_types_map[et]
            prior = self.p_rel[_parameter_key("__".join(et))].view(H, 1, 1) / math.sqrt(D)
            keys.append(torch.einsum("nhd,hde->nhe", k[et[0]], w_k[:, r] * prior))
            values.append(torch.einsum("nhd,hde->nhe", v[et[0]], w_v[:, r]))
        out = edge_attention(graph, "dot", q=q[dst], k=torch.cat(keys), v=torch.cat(values),
                             scale=1.0, deterministic=self.deterministic)
        return out.reshape(-1, self.out_channels)

    @_eager
    def forward(self, x_dict, edge_index_dict):
        _oriented(self, None, unsupported=_HGT_FLOW)      # flow may be set after construction
        features = self._features(x_dict)
        incoming = self._incoming(edge_index_dict, features)
        self.kqv_lin.materialise(features)
        H = self.heads
        D = self.out_channels // H
        # K, Q, V of the node types that take part: sources, and destinations with in-edges
        taking_part = set(incoming).union(et[0] for blocks in incoming.values()
                                          for et, _ in blocks)
        k, q, v = {}, {}, {}
        for t, x in features.items():
            if t in taking_part:
                k[t], q[t], v[t] = self.kqv_lin.lins[t](x).view(-1, 3, H, D).unbind(1)
        out = {}
        for t, x in features.items():
            if t not in self.dst_node_types:
                continue
            if t in incoming:
                m = self._attend(incoming[t], k, q, v, t)
            else:       # no edge type into t in edge_index_dict
                m = x.new_zeros((x.shape[0], self.out_channels))
            a = self.out_lin.lins[t](F.gelu(m))
            if a.shape[-1] == x.shape[-1]:
                gate = self.skip[_parameter_key(t)].sigmoid()
                a = gate * a + (1 - gate) * x
            out[t] = a
        return out

    def __repr__(self):
        return f"{type(self).__name__}(-1, {self.out_channels}, heads={self.heads})"


def _describe(x):
    if isinstance(x, Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return type(x).__name__
