"""Relation-typed and heterogeneous graphs in fastgnn.torch:

    RGCNConv, FastRGCNConv  PyG 2.8's relational graph convolutions as drop-ins
    relation_graphs         the edges of (edge_index, edge_type) grouped by
                            relation, built once per pair of tensors and cached
    to_hetero               torch_geometric.nn.to_hetero for models built from
                            fastgnn.torch layers

RGCNConv and FastRGCNConv take PyG's constructor arguments, parameter names
(`weight`, `comp`, `root`, `bias`: a PyG `state_dict` loads with
`strict=True`, and ours into PyG's) and forward inputs, and compute PyG's
function. Their relation-typed aggregation is carried by the SpMM family:
the edges are grouped by relation once per (edge_index, edge_type) pair
into relation-expanded fastgnn Graphs (`RelationGraphs`), and each forward
is one `spmm` (or `segment_reduce`) over such a graph plus dense GEMMs for
the relation weights. Nothing of size [E, F] is built, for FastRGCNConv
either (PyG's forms per-edge messages there).

HeteroConv needs nothing from fastgnn: it calls each edge type's layer with
(x_src, x_dst) pairs, which fastgnn's layers take as PyG's do. PyG's
`to_hetero` finds the layers to replicate per edge type by
`isinstance(module, MessagePassing)`, which fastgnn's layers (plain torch
modules, so that `import fastgnn.torch` does not import PyG) are not; this
module's `to_hetero` runs PyG's transformation with them recognised.
"""
from __future__ import annotations

import math
import numbers
import threading
import weakref

import torch
from torch import Tensor

from fastgnn.graph import Graph

from ._autograd import device_scope
from .functional import _norm_dtype, segment_reduce, spmm
from .graph_cache import _LRU, _capturing, _edge_index_parts, _tkey
from .nn import _PAIR_FLOW, _autocast_on, _check_kwargs, _oriented, _register_bias, _spmm_bias
from .nn_propagation import _eager

__all__ = ["RGCNConv", "FastRGCNConv", "RelationGraphs", "relation_graphs", "to_hetero"]


# ------------------------------------------------------ edges by relation
class RelationGraphs:
    r"""The edges e = (j -> i) of a relation-typed graph, r_e = edge_type[e]
    in 0 .. R-1, as three fastgnn Graphs (each built on first use), so that
    one SpMM or segment reduction aggregates every relation at once:

        by_target   sources j,           targets i R + r_e   (num_dst N_t R)
        by_source   sources j R + r_e,   targets i           (num_src N_s R)
        by_pair     sources j R + r_e,   targets i R + r_e

    Row i R + r of a by_target aggregation is node i's aggregate over its
    relation-r in-edges, so `spmm(by_target, x, reduce=...)` viewed as
    [N_t, R, F] is every per-relation aggregate (mean: over N_r(i); empty
    groups 0). Over by_source, a sum of x Theta_r rows (source row j R + r)
    is sum_r sum_{j in N_r(i)} x_j Theta_r in one pass; `mean_weights` makes
    it the per-relation mean. Edge ids are edge_index's columns throughout.
    """

    def __init__(self, edge_index: Tensor, edge_type: Tensor, num_relations: int,
                 num_src: int, num_dst: int):
        self.num_relations = num_relations
        self.num_src, self.num_dst = num_src, num_dst
        self.num_edges = int(edge_index.shape[1])
        self.device = edge_index.device
        self._src = edge_index[0].long()
        self._dst = edge_index[1].long()
        self._rel = edge_type.long()
        self._graphs: dict = {}
        self._weights: dict = {}

    def _graph(self, kind, src, dst, num_src, num_dst):
        graph = self._graphs.get(kind)
        if graph is None:
            with device_scope(self.device):
                graph = Graph.from_edge_index(torch.stack([src, dst]), num_src=num_src,
                                              num_dst=num_dst)
            self._graphs[kind] = graph
        return graph

    def _typed(self, nodes):
        return nodes * self.num_relations + self._rel

    @property
    def by_target(self) -> Graph:
        return self._graph("target", self._src, self._typed(self._dst), self.num_src,
                           self.num_dst * self.num_relations)

    @property
    def by_source(self) -> Graph:
        return self._graph("source", self._typed(self._src), self._dst,
                           self.num_src * self.num_relations, self.num_dst)

    @property
    def by_pair(self) -> Graph:
        return self._graph("pair", self._typed(self._src), self._typed(self._dst),
                           self.num_src * self.num_relations, self.num_dst * self.num_relations)

    def mean_weights(self, dtype) -> Tensor:
        """[E] constant weights 1 / |N_{r_e}(i_e)| in edge_index's order: a
        weighted sum over `by_source` is then the per-relation mean."""
        w = self._weights.get(dtype)
        if w is None:
            typed = self._typed(self._dst)
            count = torch.bincount(typed, minlength=self.num_dst * self.num_relations)
            w = self._weights[dtype] = count[typed].to(dtype).reciprocal()
        return w

    def edges_per_relation(self) -> list[int]:
        """How many edges each relation has (a copy to the host)."""
        return torch.bincount(self._rel, minlength=self.num_relations).tolist()


_RELATIONS = _LRU(8)    # edge_type -> {(R, sizes, edge_index key): (weakref, RelationGraphs)}


def _check_edge_type(edge_type, num_edges, device, name="edge_type"):
    if edge_type is None:
        raise ValueError(f"{name} is required: a [E] integer tensor with the relation of "
                         "each edge")
    if not isinstance(edge_type, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(edge_type).__name__}")
    if edge_type.dtype.is_floating_point or edge_type.dtype.is_complex or (
            edge_type.dtype == torch.bool):
        raise TypeError(f"{name} must hold integers, got dtype {edge_type.dtype}")
    if tuple(edge_type.shape) != (num_edges,):
        raise ValueError(f"{name} must have shape [E] = [{num_edges}] (one relation per "
                         f"edge), got {tuple(edge_type.shape)}")
    if edge_type.device != device:
        raise ValueError(f"{name} is on {edge_type.device} but the edges on {device}")


def relation_graphs(edge_index, edge_type: Tensor, num_relations: int,
                    num_nodes=None, *, type_name: str = "edge_type") -> RelationGraphs:
    """The `RelationGraphs` of edge_index [2, E] (a tensor or PyG EdgeIndex)
    with relations edge_type [E] (integers in 0 .. num_relations-1), built
    once and cached while both tensors live (keyed by address, shape,
    strides, dtype, device and version, as `to_graph`: an in-place edit
    rebuilds). num_nodes: None (max index + 1), an int, or (num_src, num_dst).
    Raises TypeError / ValueError naming edge_index or edge_type (as
    type_name: the caller's name for it)."""
    if isinstance(num_nodes, (tuple, list)):
        num_src, num_dst = num_nodes
    else:
        num_src = num_dst = num_nodes
    if not isinstance(edge_index, Tensor) or edge_index.layout != torch.strided:
        raise TypeError("edge_index must be a [2, E] integer tensor or a PyG EdgeIndex (a "
                        "sparse adj_t carries no relation per edge), got "
                        f"{type(edge_index).__name__}")
    anchor = edge_index
    ei, num_src, num_dst = _edge_index_parts(edge_index, num_src, num_dst)
    _check_edge_type(edge_type, int(ei.shape[1]), ei.device, type_name)
    if isinstance(num_relations, bool) or not isinstance(num_relations, numbers.Integral) or (
            num_relations < 1):
        raise ValueError(f"num_relations must be a positive int, got {num_relations!r}")
    if num_src is None or num_dst is None:
        top = int(ei.max()) + 1 if ei.numel() else 0
        num_src = top if num_src is None else num_src
        num_dst = top if num_dst is None else num_dst
    per_type = _RELATIONS.get(("edge_type", _tkey(edge_type)), edge_type, dict)
    key = (int(num_relations), int(num_src), int(num_dst), _tkey(ei))
    entry = per_type.get(key)
    if entry is not None and entry[0]() is not None:
        return entry[1]
    if _capturing():
        raise RuntimeError("fastgnn: a relation-typed graph was first met during CUDA graph "
                           "capture; run one eager step with the same edge_index and "
                           "edge_type before capturing")
    if edge_type.numel():
        lo, hi = (int(v) for v in torch.stack([edge_type.min(), edge_type.max()]).cpu())
        if lo < 0 or hi >= num_relations:
            raise ValueError(f"{type_name} holds relation {lo if lo < 0 else hi}, outside "
                             f"0 .. num_relations-1 = 0 .. {num_relations - 1}")
    groups = RelationGraphs(ei.detach(), edge_type.detach(), int(num_relations), int(num_src),
                            int(num_dst))
    if len(per_type) >= 8:          # one edge_type met with many edge_index tensors
        per_type.clear()
    per_type[key] = (weakref.ref(anchor), groups)
    return groups


# --------------------------------------------------------------- RGCNConv
_REDUCES = {"add": "sum", "sum": "sum", "mean": "mean", "max": "max", "min": "min",
            "mul": "mul", "var": "var", "std": "std"}


def _aggregate(graph, t, reduce, edge_weight=None):
    """The reduction of t's source rows into each target of graph (each row
    scaled by edge_weight [E], sum only, when given)."""
    if reduce in ("sum", "mean", "max", "min"):
        return spmm(graph, t, edge_weight, reduce=reduce)
    return segment_reduce(graph, t, reduce)


def _sum_by_source(groups, rows, reduce, bias, edge_weight=None):
    """sum of rows [N_s R, out] over `groups.by_source` (mean: weighted by
    1/|N_r(i)|; else by edge_weight [E] when given), the bias added in the
    SpMM's store."""
    weight = groups.mean_weights(_norm_dtype(rows.dtype)) if reduce == "mean" else edge_weight
    return _spmm_bias(groups.by_source, rows, weight, bias, reduce="sum")


def _typed_aggregate(groups, x, weight, reduce, bias=None, edge_weight=None, num_blocks=None):
    r"""sum_r aggr_{e = (j -> i), r_e = r} w_e x_j Theta_r for float x
    [N_s, in] over `RelationGraphs` groups: (out [N_t, out], whether bias
    [out] was added).

    weight:      Theta_r stacked, [R, in, out]; with num_blocks = K the
                 block-diagonal [R, K, in/K, out/K] (x's K chunks of in/K
                 features times the K blocks).
    reduce:      aggr per relation ("sum", "mean", ...; an empty N_r(i) gives 0).
    edge_weight: [E] w_e in the edges' order (reduce "sum" only; None: 1).

    With sum/mean and fewer output than input features (weighted by source
    and target counts) x Theta_r comes first ([N_s, R out]) and one SpMM over
    `by_source` sums its rows per target; otherwise one SpMM over `by_target`
    aggregates x per (target, relation) and one GEMM (an einsum for blocks)
    applies the stacked Theta_r."""
    R, n_dst, f_in = groups.num_relations, groups.num_dst, x.shape[1]
    if num_blocks is not None:
        agg = _aggregate(groups.by_target, x, reduce, edge_weight)
        agg = agg.view(n_dst, R, num_blocks, f_in // num_blocks)
        return torch.einsum("nrkc,rkcd->nkd", agg, weight).reshape(n_dst, -1), False
    out = weight.shape[2]
    if reduce in ("sum", "mean") and groups.num_src * out < n_dst * f_in:
        # x Theta_r first ([N_s, R out], row j R + r), then one sum per target
        rows = (x @ weight.transpose(0, 1).reshape(f_in, R * out)).view(-1, out)
        return _sum_by_source(groups, rows, reduce, bias, edge_weight), True
    agg = _aggregate(groups.by_target, x, reduce, edge_weight).view(n_dst, R * f_in)
    stacked = weight.reshape(R * f_in, out)
    if bias is not None and bias.dtype == agg.dtype:
        return torch.addmm(bias, agg, stacked), True
    return agg @ stacked, False


def _glorot(t):
    """Glorot-uniform draw over the last two dimensions (PyG's `glorot`)."""
    bound = math.sqrt(6.0 / (t.size(-2) + t.size(-1)))
    with torch.no_grad():
        t.uniform_(-bound, bound)


def _positive(layer, name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{layer}: {name} must be a positive int, got {value!r}")
    return int(value)


class RGCNConv(torch.nn.Module):
    r"""Relational graph convolution (Schlichtkrull et al.), PyG 2.8's `RGCNConv`:

        x'_i = Theta_root x_i + sum_r aggr_{j in N_r(i)} x_j Theta_r + b

    N_r(i): i's in-neighbours along relation r (edges with edge_type r);
    aggr: "mean" (default: 1/|N_r(i)| sum), "add"/"sum", "max", "min", "mul",
    "var" or "std" per relation, 0 for an empty N_r(i) (mul: 1, as PyG).

    in_channels:  int, or (source, target) sizes; with featureless nodes
                  (x None or node indices) the number of nodes: each node
                  then has its own learned row, x_j Theta_r = Theta_r[x_j].
    num_relations: R.
    num_bases:    basis decomposition Theta_r = sum_b comp[r, b] weight[b].
    num_blocks:   block-diagonal Theta_r = diag(weight[r, 0], ..., weight[r, K-1])
                  (K must divide in_channels and out_channels; float x only).
    root_weight, bias: the Theta_root x_i term and b, as in PyG.
    is_sorted:    accepted and kept (the edges are grouped by relation once
                  per (edge_index, edge_type) pair whatever their order).
    forward(x [N, in] float | [N] node indices | None | (x_src, x_dst),
            edge_index [2, E] | EdgeIndex, edge_type [E]) -> [N_dst, out]
        x_src may be None in a pair (every node featureless). A float side
        and an index side may be mixed in a pair (PyG's RGCNConv refuses
        that mix; its FastRGCNConv accepts it, as here).

    Parameters as PyG's: `weight` [R, in, out] ([num_bases, in, out] with
    bases, [R, K, in/K, out/K] with blocks), `comp` [R, num_bases] (or None),
    `root` [in_dst, out] (or None) and `bias` [out] (or None).

    The aggregation over every relation is one fastgnn SpMM (or segment
    reduction) over a relation-expanded graph (`RelationGraphs`, built once
    per (edge_index, edge_type) pair): float features are aggregated per
    (target, relation) and then multiplied by the stacked Theta_r in one GEMM
    ([N_dst, R in] x [R in, out]); for sum/mean with fewer output than input
    features (weighted by source and target counts) the product x Theta_r
    comes first and one SpMM sums its rows per target. The relation weights
    are dense GEMMs beside the SpMM, not fused into its kernel (no typed-SpMM
    kernel yet), and the [N_dst, R, in] aggregates are one tensor (PyG's loop
    keeps the same R [N_dst, in] products for its backward).
    """

    def __init__(self, in_channels, out_channels: int, num_relations: int,
                 num_bases: int | None = None, num_blocks: int | None = None,
                 aggr: str = "mean", root_weight: bool = True, is_sorted: bool = False,
                 bias: bool = True, **kwargs):
        super().__init__()
        name = type(self).__name__
        if num_bases is not None and num_blocks is not None:
            raise ValueError(f"{name}: num_bases and num_blocks cannot both be set (basis "
                             "and block-diagonal decompositions exclude each other)")
        self.aggr = aggr
        self._reduce = self._check_aggr(aggr)
        self.flow = _check_kwargs(name, kwargs)
        widths = in_channels if isinstance(in_channels, (tuple, list)) else (in_channels,) * 2
        if len(widths) != 2:
            raise ValueError(f"{name}: in_channels must be an int or a pair, got {in_channels!r}")
        in_src, in_dst = (_positive(name, "in_channels", w) for w in widths)
        self.in_channels = in_channels
        self.out_channels = _positive(name, "out_channels", out_channels)
        self.num_relations = _positive(name, "num_relations", num_relations)
        self.num_bases = None if num_bases is None else _positive(name, "num_bases", num_bases)
        self.num_blocks = (None if num_blocks is None
                           else _positive(name, "num_blocks", num_blocks))
        self.is_sorted = is_sorted
        self.in_channels_l = in_src
        R, out = self.num_relations, self.out_channels
        if self.num_bases is not None:
            self.weight = torch.nn.Parameter(torch.empty(self.num_bases, in_src, out))
            self.comp = torch.nn.Parameter(torch.empty(R, self.num_bases))
        else:
            if self.num_blocks is not None:
                K = self.num_blocks
                if in_src % K or out % K:
                    raise ValueError(f"{name}: num_blocks={K} must divide in_channels "
                                     f"({in_src}) and out_channels ({out})")
                shape = (R, K, in_src // K, out // K)
            else:
                shape = (R, in_src, out)
            self.weight = torch.nn.Parameter(torch.empty(shape))
            self.register_parameter("comp", None)
        if root_weight:
            self.root = torch.nn.Parameter(torch.empty(in_dst, out))
        else:
            self.register_parameter("root", None)
        _register_bias(self, out, bias)
        self.reset_parameters()

    def _check_aggr(self, aggr):
        reduce = _REDUCES.get(aggr) if isinstance(aggr, str) else None
        if reduce is None:
            raise NotImplementedError(
                f"{type(self).__name__}: aggr={aggr!r} is not supported by fastgnn.torch "
                f"(supported: {', '.join(_REDUCES)})")
        return reduce

    def reset_parameters(self):
        """Glorot-uniform weight, comp and root (drawn in that order, as
        PyG's), zero bias."""
        for p in (self.weight, self.comp, self.root):
            if p is not None:
                _glorot(p)
        if self.bias is not None:
            with torch.no_grad():
                self.bias.zero_()

    # ------------------------------------------------------------ inputs
    def _side(self, t, what, width):
        """A checked feature side: a float [N, width] tensor or an integer
        [N] tensor of node indices."""
        name = type(self).__name__
        if not isinstance(t, Tensor):
            raise TypeError(f"'{name}': {what} must be a tensor or None, got {type(t).__name__}")
        if t.is_floating_point():
            if t.dim() != 2 or t.shape[1] != width:
                raise ValueError(f"'{name}': {what} must have shape [num_nodes, {width}] (float "
                                 f"features) or [num_nodes] (node indices), got "
                                 f"{tuple(t.shape)}")
            if t.dtype != self.weight.dtype and not _autocast_on(t.device.type):
                raise TypeError(f"'{name}': {what} has dtype {t.dtype} but the layer's "
                                f"parameters {self.weight.dtype} (convert one of them)")
        elif t.is_complex() or t.dtype == torch.bool:
            raise TypeError(f"'{name}': {what} must hold floats or node indices, got {t.dtype}")
        elif t.dim() != 1:
            raise ValueError(f"'{name}': {what} of node indices must have shape [num_nodes], "
                             f"got {tuple(t.shape)}")
        if t.device != self.weight.device:
            raise ValueError(f"'{name}': {what} is on {t.device} but the layer on "
                             f"{self.weight.device}")
        return t

    def _features(self, x):
        """(x_src, x_dst, is_pair) with None replaced by node indices 0 .. in-1."""
        widths = (self.in_channels if isinstance(self.in_channels, (tuple, list))
                  else (self.in_channels,) * 2)
        pair = isinstance(x, (tuple, list))
        if pair and len(x) != 2:
            raise ValueError(f"'{type(self).__name__}': x must be a tensor, None or a pair "
                             f"(x_src, x_dst), got a sequence of {len(x)}")
        x_src, x_dst = x if pair else (x, x)
        if x_src is None:
            x_src = torch.arange(self.in_channels_l, device=self.weight.device)
            if not pair:
                x_dst = x_src
        if pair and x_dst is None:
            raise ValueError(f"'{type(self).__name__}': x_dst (x[1]) must be a tensor: it "
                             "gives the targets")
        x_src = self._side(x_src, "x_src" if pair else "x", widths[0])
        x_dst = self._side(x_dst, "x_dst" if pair else "x", widths[1])
        if self.num_blocks is not None and not x_src.is_floating_point():
            raise ValueError(f"'{type(self).__name__}': the block-diagonal decomposition "
                             "takes float features (x_src), not node indices")
        return x_src, x_dst, pair

    # ------------------------------------------------------------- forward
    def _relation_weights(self):
        """Theta_r stacked, [R, in, out] (bases composed; not for blocks)."""
        if self.num_bases is None:
            return self.weight
        return (self.comp @ self.weight.reshape(self.num_bases, -1)).view(
            self.num_relations, self.in_channels_l, self.out_channels)

    def _index_rows(self, x_src):
        """Node index per source row for featureless sources: x_src's values."""
        return x_src

    def _featureless(self, groups, x_src):
        """sum_r aggr_{j in N_r(i)} Theta_r[node(j)] for index sources."""
        R, out = self.num_relations, self.out_channels
        w = self._relation_weights()
        # row j R + r = Theta_r[node(j)]: a [N_s R, out] gather, no [E, out]
        rows = w.transpose(0, 1)[self._index_rows(x_src)].reshape(-1, out)
        if self._reduce in ("sum", "mean"):
            return _sum_by_source(groups, rows, self._reduce, self.bias), True
        agg = _aggregate(groups.by_pair, rows, self._reduce)
        return agg.view(groups.num_dst, R, out).sum(1), False

    def _with_features(self, groups, x):
        """sum_r aggr_{j in N_r(i)} x_j Theta_r for float sources: (out, bias added)."""
        weight = self.weight if self.num_blocks is not None else self._relation_weights()
        return _typed_aggregate(groups, x, weight, self._reduce, self.bias,
                                num_blocks=self.num_blocks)

    @_eager
    def forward(self, x, edge_index, edge_type: Tensor | None = None) -> Tensor:
        x_src, x_dst, pair = self._features(x)
        edge_index, _ = _oriented(self, edge_index, None, _PAIR_FLOW if pair else None)
        groups = relation_graphs(edge_index, edge_type, self.num_relations,
                                 (int(x_src.shape[0]), int(x_dst.shape[0])))
        if x_src.is_floating_point():
            out, has_bias = self._with_features(groups, x_src)
        else:
            out, has_bias = self._featureless(groups, x_src)
        if self.root is not None:
            if x_dst.is_floating_point():
                out = torch.addmm(out, x_dst, self.root)
            else:
                out = out + self.root[x_dst]
        if self.bias is not None and not has_bias:
            out = out + self.bias
        return out

    def __repr__(self):
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"num_relations={self.num_relations})")


class FastRGCNConv(RGCNConv):
    r"""PyG 2.8's `FastRGCNConv`: the function of `RGCNConv` (the same
    parameters and state_dict) for aggr "mean" (default), "add" or "sum".

    PyG's FastRGCNConv builds per-edge messages x_j Theta_{r_e} ([E, out]);
    here it runs RGCNConv's relation-expanded SpMM, so the two classes differ
    only where PyG's do: with node indices as x_src, the learned row of source
    j is Theta_r[j] (its position), whatever index x_src holds there
    (RGCNConv: Theta_r[x_src[j]]).
    """

    def _check_aggr(self, aggr):
        if aggr not in ("add", "sum", "mean"):
            raise ValueError(f"{type(self).__name__}: aggr must be 'add', 'sum' or 'mean', "
                             f"got {aggr!r}")
        return _REDUCES[aggr]

    def _index_rows(self, x_src):
        if x_src.shape[0] > self.in_channels_l:
            raise ValueError(f"'{type(self).__name__}': x_src has {x_src.shape[0]} nodes but "
                             f"in_channels (one learned row per node) is {self.in_channels_l}")
        return slice(0, x_src.shape[0])


# ------------------------------------------------------------- to_hetero
_TO_HETERO_LOCK = threading.Lock()


def _is_fastgnn_layer(module) -> bool:
    """A fastgnn.torch message-passing layer: a module of this package that
    carries MessagePassing's `flow` (every drop-in layer does)."""
    package = __name__.rpartition(".")[0]
    return type(module).__module__.startswith(package + ".") and hasattr(module, "flow")


def to_hetero(module: torch.nn.Module, metadata, aggr: str = "sum", input_map=None,
              debug: bool = False):
    """PyG's `torch_geometric.nn.to_hetero` (the same arguments and result)
    for models whose message-passing layers are fastgnn.torch's: each such
    layer is replicated per edge type and its outputs summed (aggr) per
    target node type, as PyG does for its own MessagePassing layers. PyG's
    transformation runs unchanged; only its test of which modules pass
    messages also accepts fastgnn's layers while it runs."""
    from torch_geometric.nn import fx as pyg_fx
    from torch_geometric.nn import to_hetero as pyg_to_hetero

    with _TO_HETERO_LOCK:
        plain = pyg_fx.is_message_passing_op

        def is_message_passing_op(root, op, target):
            return plain(root, op, target) or (
                op == "call_module" and _is_fastgnn_layer(pyg_fx.get_submodule(root, target)))

        pyg_fx.is_message_passing_op = is_message_passing_op
        try:
            return pyg_to_hetero(module, metadata, aggr=aggr, input_map=input_map, debug=debug)
        finally:
            pyg_fx.is_message_passing_op = plain
