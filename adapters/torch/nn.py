"""Drop-in replacements for PyG 2.8's GCNConv, SAGEConv and GINConv.

Same constructor arguments, parameter names (a PyG `state_dict` loads with
`strict=True`), forward inputs (edge_index tensor, PyG EdgeIndex, torch sparse
adj_t, `(x_src, x_dst)` pairs where PyG takes them) and the same function; the
aggregation runs through fastgnn's SpMM (sum, mean) or segment reductions
(SAGEConv's max, min, var, std, multi), with the graph built once and cached
(`fastgnn.torch.to_graph`). `flow` (MessagePassing's keyword, also when set
on the layer after construction) is read per call: "target_to_source" runs
the reversed graph, and raises NotImplementedError where PyG's result is not
that (pairs of features, SAGEConv's project).
"""
from __future__ import annotations

import math

import numpy as np

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.modules import module as _torch_module

import fastgnn
from fastgnn._array import check_deterministic

from . import custom_ops
from . import functional as _functional
from .gemm import g_w, x_wt
from .functional import _norm_dtype, bias_grad, gcn_norm, segment_reduce_linear, spmm
from .graph_cache import graph_input, resolve, reversed_input, to_graph

__all__ = ["GCNConv", "SAGEConv", "GINConv", "Linear"]


# ------------------------------------------------------------------- helpers
class Linear(torch.nn.Linear):
    """torch.nn.Linear with PyG's initialisers: weight "glorot" or None
    (kaiming-uniform, a=sqrt(5): the torch default), bias uniform(1/sqrt(in))
    or "zeros". Parameters are `weight` [out, in] and `bias` [out], as PyG's.

    Seeded construction draws what PyG's Linear draws: one reset at the end
    of __init__, each bound computed as PyG computes it (torch's own
    kaiming/xavier formulas round differently in the last bit, and a
    different bound gives different weights from the same generator state)."""

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True,
                 weight_initializer: str | None = None, bias_initializer: str | None = None):
        super().__init__(in_channels, out_channels, bias)
        self.weight_initializer = weight_initializer
        self.bias_initializer = bias_initializer
        self.reset_parameters()

    def reset_parameters(self):
        if not hasattr(self, "weight_initializer"):
            return      # torch.nn.Linear.__init__'s call: PyG's draw comes once, above
        fan = self.in_features
        if fan <= 0:
            return
        if self.weight_initializer == "glorot":
            bound = math.sqrt(6.0 / (self.weight.size(-2) + self.weight.size(-1)))
        else:
            a = math.sqrt(5)
            bound = math.sqrt(6 / ((1 + a**2) * fan))
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None and self.bias_initializer == "zeros":
                self.bias.zero_()
            elif self.bias is not None:
                self.bias.uniform_(-1.0 / math.sqrt(fan), 1.0 / math.sqrt(fan))


class _LazyLinear(torch.nn.LazyLinear):
    """Linear whose in_channels (-1 in PyG) is taken from the first input."""
    cls_to_become = Linear

    def __init__(self, out_channels: int, bias: bool = True,
                 weight_initializer: str | None = None, bias_initializer: str | None = None):
        super().__init__(out_channels, bias)
        self.weight_initializer = weight_initializer
        self.bias_initializer = bias_initializer

    def reset_parameters(self):
        if not self.has_uninitialized_params() and self.in_features != 0:
            Linear.reset_parameters(self)


def _linear(in_channels, out_channels, bias=True, weight_initializer=None):
    if in_channels is None or in_channels <= 0:
        return _LazyLinear(out_channels, bias, weight_initializer)
    return Linear(in_channels, out_channels, bias, weight_initializer)


_AGGRS = {"add": "sum", "sum": "sum", "mean": "mean"}


def _aggr(aggr, layer, supported=("sum", "mean")):
    reduce = _AGGRS.get(aggr, aggr) if isinstance(aggr, str) else None
    if reduce not in supported:
        raise NotImplementedError(
            f"{layer}: aggr={aggr!r} is not supported by fastgnn.torch yet "
            f"(supported: {', '.join(supported)})")
    return reduce


def _pop_deterministic(layer, kwargs):
    """fastgnn's own constructor keyword (not in PyG) of the attention layers
    and SAGEConv, validated: deterministic=False lets the GPU backward use float
    atomics (attention: source-side gradients without a second pass over the
    transpose; SAGEConv: the max/min terms of its segment reduction) instead of
    its bitwise repeatable default; ignored on the CPU."""
    return check_deterministic(kwargs.pop("deterministic", True), f"{layer}: ")


def _check_flow(layer, flow):
    if flow not in ("source_to_target", "target_to_source"):
        raise ValueError(f"{layer}: flow must be 'source_to_target' or 'target_to_source', "
                         f"got {flow!r}")
    return flow


def _check_kwargs(layer, kwargs):
    """Refuse the MessagePassing keywords fastgnn does not honour and unknown
    ones; returns the validated `flow`, for the layer to keep as PyG does."""
    flow = _check_flow(layer, kwargs.pop("flow", "source_to_target"))
    node_dim = kwargs.pop("node_dim", -2)
    if node_dim not in (-2, 0):
        raise NotImplementedError(f"{layer}: only node_dim=-2 is supported, got {node_dim}")
    kwargs.pop("decomposed_layers", None)     # a PyG memory knob; nothing to decompose here
    if kwargs:
        raise TypeError(f"{layer} got unexpected keyword arguments {sorted(kwargs)}")
    return flow


def _message_passing_options(layer, kwargs, supported=("sum", "mean")):
    """A layer's MessagePassing keywords, validated once at construction:
    sets layer.aggr (PyG's string, "add" by default), layer._reduce (the
    SpMM's reduction: one of `supported`) and layer.flow (`_check_kwargs`)."""
    name = type(layer).__name__
    layer.aggr = kwargs.pop("aggr", "add")
    layer._reduce = _aggr(layer.aggr, name, supported)
    layer.flow = _check_kwargs(name, kwargs)


def _register_eps(layer, eps, train_eps):
    """GIN's epsilon: layer.initial_eps, and layer.eps [1] a Parameter with
    train_eps, else a buffer (`eps` in the state_dict either way, as in PyG;
    its value set by the layer's reset_parameters)."""
    layer.initial_eps = eps
    if train_eps:
        layer.eps = torch.nn.Parameter(torch.empty(1))
    else:
        layer.register_buffer("eps", torch.empty(1))


def _register_bias(layer, size, bias):
    """layer.bias: a learnable [size] Parameter with bias (its values set by
    the layer's reset_parameters), else a registered None, as PyG's."""
    if bias:
        layer.bias = torch.nn.Parameter(torch.empty(size))
    else:
        layer.register_parameter("bias", None)


# why a layer cannot honour flow="target_to_source" with an (x_src, x_dst) pair
_PAIR_FLOW = "with an (x_src, x_dst) pair (PyG then reads the messages from x_dst)"


def _oriented(layer, edge_index, size=None, unsupported=None):
    """(edge_index, size) as the layer's `flow` reads them, checked per call
    (PyG lets flow be set after construction). "target_to_source" sends
    messages from edge_index[1] to edge_index[0]: the graph input comes back
    turned around (`reversed_input`, made once per edge_index) and size,
    PyG's (rows at edge_index[0], rows at edge_index[1]), swapped into the
    reverse's (num_src, num_dst), so every later step takes them as a
    source-to-target input. unsupported: what keeps this call from honouring
    "target_to_source" (NotImplementedError then), or None."""
    name = type(layer).__name__
    if _check_flow(name, layer.flow) == "source_to_target":
        return edge_index, size
    if unsupported:
        raise NotImplementedError(f"{name}: flow='target_to_source' {unsupported} is not "
                                  "supported by fastgnn.torch")
    return reversed_input(edge_index), (None if size is None else (size[1], size[0]))


def _check_features(layer, x, edge_index=None):
    """A layer's node features checked once at its entry: x a tensor or a pair
    (x_src, x_dst) of tensors (None allowed in a pair), each floating-point,
    at least [num_nodes, in_channels], and on edge_index's device. Raises
    TypeError / ValueError naming x."""
    name = type(layer).__name__
    for t in (x if isinstance(x, (tuple, list)) else (x,)):
        if t is None and x is not t:
            continue
        if not isinstance(t, Tensor):
            raise TypeError(f"'{name}': x must be a tensor or a pair (x_src, x_dst) of "
                            f"tensors, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"'{name}': x must be a floating-point tensor, got {t.dtype} "
                            "(cast it, e.g. x.float())")
        if t.dim() < 2:
            raise ValueError(f"'{name}': x must have shape [num_nodes, in_channels], got "
                             f"{tuple(t.shape)} (a single feature per node: x.unsqueeze(-1))")
        if isinstance(edge_index, Tensor) and t.device != edge_index.device:
            raise ValueError(f"'{name}': x is on {t.device} but edge_index on "
                             f"{edge_index.device}; move both to one device")


def _check_single_features(layer, x, edge_index=None):
    """`_check_features` for a layer that takes one feature tensor: a pair
    (x_src, x_dst) raises ValueError, in PyG's words."""
    if isinstance(x, (tuple, list)):
        raise ValueError(f"'{type(layer).__name__}' received a tuple of node features as "
                         "input while this layer does not support bipartite message "
                         "passing. Please try other layers such as 'SAGEConv' instead")
    _check_features(layer, x, edge_index)


def _pair(x):
    """x or (x_src, x_dst) -> (x_src, x_dst)."""
    if isinstance(x, Tensor):
        return x, x
    if isinstance(x, (tuple, list)) and len(x) == 2:
        return x[0], x[1]
    raise TypeError(f"x must be a tensor or a pair (x_src, x_dst), got {type(x).__name__}")


def _graph_sizes(x_src, x_dst, size, edge_index, node_dim=0):
    """(num_src, num_dst) as PyG infers them: explicit `size` first, else the
    rows of x_src and x_dst (along node_dim); without x_dst, a sparse adj_t's
    own size or, for an edge_index, as many targets as sources."""
    num_src = num_dst = None
    if size is not None:
        num_src, num_dst = size
    if num_src is None:
        num_src = int(x_src.shape[node_dim])
    if num_dst is None and x_dst is not None:
        num_dst = int(x_dst.shape[node_dim])
    if num_dst is None and not _is_sparse(edge_index):
        num_dst = num_src
    return num_src, num_dst


def _reset(module):
    """reset_parameters() of `module`, or of each child that has one."""
    if hasattr(module, "reset_parameters"):
        module.reset_parameters()
        return
    for child in module.children():
        _reset(child)


# ------------------------------------------------------------------- GCNConv
class GCNConv(torch.nn.Module):
    r"""Graph convolution (Kipf & Welling), PyG 2.8's `GCNConv`:

        X' = D^-1/2 (A + I) D^-1/2 X Theta + b,   deg(i) = sum_{j} (A + I)_{ij}

    in_channels, out_channels: feature sizes (in_channels=-1: lazy).
    improved:       self-loop weight 2 instead of 1.
    cached:         keep the normalised graph of the first call for all later calls
                    (transductive use only, as in PyG).
    add_self_loops: default `normalize`; True without normalize is an error.
    normalize:      symmetric normalisation (else plain weighted sum).
    bias:           learnable additive bias.
    forward(x [N, in], edge_index [2, E] | EdgeIndex | adj_t [N, N], edge_weight [E] = None)
        -> [N, out]. With a sparse adj_t its values are the weights and
        edge_weight is ignored, as in PyG. x may be [*, N, in] (a static
        graph: the same graph for every leading index) -> [*, N, out].

    Parameters `lin.weight` [out, in] and `bias` [out]. The linear map is applied
    before aggregation, as in PyG; the bias is added in the SpMM kernel's store
    (its gradient a fixed-order column sum). Normalisation weights of an
    unweighted graph (d_i d_j, d = deg^-1/2) are computed once and cached on the
    fastgnn Graph in the orders the forward and backward kernels read them
    (`fastgnn.gcn_norm_weights`); weights that require grad are normalised by
    differentiable torch ops.
    """

    def __init__(self, in_channels: int, out_channels: int, improved: bool = False,
                 cached: bool = False, add_self_loops: bool | None = None,
                 normalize: bool = True, bias: bool = True, **kwargs):
        super().__init__()
        _message_passing_options(self, kwargs)
        if add_self_loops is None:
            add_self_loops = normalize
        if add_self_loops and not normalize:
            raise ValueError(f"'{type(self).__name__}' does not support adding self-loops to "
                             "the graph when no on-the-fly normalization is applied")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.improved = improved
        self.cached = cached
        self.add_self_loops = add_self_loops
        self.normalize = normalize
        self._cached_edge_index = None
        self._cached_adj_t = None
        self.lin = _linear(in_channels, out_channels, bias=False, weight_initializer="glorot")
        _register_bias(self, out_channels, bias)
        self.reset_parameters()

    def reset_parameters(self):
        self.lin.reset_parameters()
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)
        self._cached_edge_index = None
        self._cached_adj_t = None

    def forward(self, x: Tensor, edge_index, edge_weight: Tensor | None = None) -> Tensor:
        _check_single_features(self, x, edge_index)
        edge_index, _ = _oriented(self, edge_index)
        n = int(x.shape[-2])
        if custom_ops.compiling():
            # the normalised graph is built and cached inside the op
            x, = shared_input_linears(x, (self.lin,))
            ei, sizes = graph_input(edge_index, n)
            return custom_ops.call("gcn_propagate", ei, x, edge_weight, self.bias, num_nodes=sizes,
                                   normalize=self.normalize, add_self_loops=self.add_self_loops,
                                   improved=self.improved, reduce=self._reduce)
        norm = self._cached_edge_index if self.normalize else None
        x, = shared_input_linears(x, (self.lin,))
        out, norm = _gcn_propagate(edge_index, n, x, edge_weight, self.bias, norm,
                                   normalize=self.normalize, add_self_loops=self.add_self_loops,
                                   improved=self.improved, reduce=self._reduce)
        if self.normalize and self.cached and norm is not self._cached_edge_index:
            self._cached_edge_index = norm          # (Module.__setattr__: only on a change)
        return out

    def __repr__(self):
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels})"


def gcn_normalized(edge_index, n, edge_weight, dtype, *, add_self_loops, improved=False):
    """The GCN-normalised graph of a graph input over n nodes, for features
    of `dtype`: (graph', weight [E'] or None, csr_weights or None), one of the
    last two set, for `spmm(graph', x, weight, csr_weights=csr_weights)`.
    Unweighted edge_index inputs give constant weights in the kernels' orders
    (`fastgnn.gcn_norm_weights`: w_e = d_i d_j, d = deg^-1/2, built once per
    graph, one sequential weight read per edge, no gather; PyG ignores
    `improved` there); weighted ones and sparse adj_t go through `gcn_norm`
    (differentiable torch ops where the weights require grad)."""
    if edge_weight is None and not _is_sparse(edge_index):
        graph, csr_weights = fastgnn.gcn_norm_weights(
            to_graph(edge_index, n), add_self_loops=add_self_loops,
            dtype=np.float64 if dtype == torch.float64 else np.float32)
        return graph, None, csr_weights
    graph, weight = gcn_norm(edge_index, edge_weight, n, improved=improved,
                             add_self_loops=add_self_loops, dtype=_norm_dtype(dtype))
    return graph, weight, None


def propagation_graph(edge_index, n, edge_weight, dtype, *, normalize, add_self_loops,
                      improved=False):
    """(graph, weight [E] or None, csr_weights or None) for
    `spmm(graph, x, weight, csr_weights=csr_weights)` over a square graph of
    n nodes and features of `dtype`: GCN-normalised (`gcn_normalized`) with
    normalize, else the graph as given, weighted by a sparse adj_t's values
    or else by edge_weight (PyG ignores edge_weight beside an adj_t)."""
    if normalize:
        return gcn_normalized(edge_index, n, edge_weight, dtype, add_self_loops=add_self_loops,
                              improved=improved)
    graph, adj_w = resolve(edge_index, n)
    return graph, (adj_w if _is_sparse(edge_index) else edge_weight), None


def _gcn_propagate(edge_index, n, x, edge_weight, bias, norm=None, *, normalize, add_self_loops,
                   improved, reduce):
    """GCNConv's propagation of the projected features x [N, F] (bias added
    in the SpMM's store): (out [N, F], the normalisation (graph, weight,
    csr_weights) to cache, or None without normalize). `norm` is a cached
    normalisation from an earlier call."""
    if norm is None:
        norm = propagation_graph(edge_index, n, edge_weight, x.dtype, normalize=normalize,
                                 add_self_loops=add_self_loops, improved=improved)
    graph, weight, csr_weights = norm
    out = _spmm_bias(graph, x, weight, bias, reduce=reduce, csr_weights=csr_weights)
    return out, (norm if normalize else None)


def _gcn_propagate_fake(edge_index, x, edge_weight, bias, *, num_nodes, **_options):
    return [x.new_empty((*x.shape[:-2], num_nodes[1], x.shape[-1]))]


@custom_ops.graph_op("gcn_propagate", ("x", "edge_weight", "bias"), _gcn_propagate_fake,
                     sizes=("num_nodes",))
def _gcn_propagate_op(edge_index, x, edge_weight, bias, *, num_nodes, **options):
    return _gcn_propagate(edge_index, num_nodes[1], x, edge_weight, bias, **options)[0]


def _is_sparse(adj):
    return isinstance(adj, Tensor) and adj.layout != torch.strided


def _spmm_bias(graph, x, weight, bias, **kw):
    """spmm(graph, x, weight, **kw) + bias, the bias added in the kernel's store
    when it has x's dtype (else, e.g. under autocast, by a separate add that
    promotes as torch does). x may be [*, N, F], PyG's static graphs (the
    graph applied to every leading index): the leading dimensions are folded
    into the features, [N, * F], so that one SpMM serves them all."""
    if x.dim() > 2:
        lead, n, f = x.shape[:-2], x.shape[-2], x.shape[-1]
        out = spmm(graph, x.movedim(-2, 0).reshape(n, -1), weight, **kw)
        out = out.reshape(out.shape[0], *lead, f).movedim(0, -2)
        return out if bias is None else out + bias
    if bias is None or bias.dtype == x.dtype:
        return spmm(graph, x, weight, bias=bias, **kw)
    return spmm(graph, x, weight, **kw) + bias


# ------------------------------------------------------------------ SAGEConv
class SAGEConv(torch.nn.Module):
    r"""GraphSAGE (Hamilton et al.), PyG 2.8's `SAGEConv`:

        x'_i = W_1 x_i + W_2 . aggr_{j in N(i)} x_j

    with, if project, x_j <- relu(W_3 x_j + b) first, and if normalize,
    x'_i <- x'_i / ||x'_i||_2 last.

    in_channels:  int, or (source, target) sizes for bipartite graphs (-1: lazy).
    aggr:         "mean" (default), "sum"/"add", "max", "min", "var", "std", "mul",
                  "softmax", "powermean", a list of those (a MultiAggregation:
                  concatenated by default, W_2 then taking R*in features; other
                  combine modes through aggr_kwargs' mode / mode_kwargs, as in
                  PyG), or an Aggregation of those kinds (`fastgnn.torch.aggr`,
                  or PyG's own, translated).
                  Mean and sum strings run through SpMM (fused scales); the
                  others through `segment_reduce` (gather fused), together with
                  lin_l and lin_r as one autograd node (`segment_reduce_linear`)
                  when both are plain, hook-free Linears outside autocast.
    aggr_kwargs:  as in PyG: the aggregation's own arguments (t / learn / semi_grad
                  for softmax, p / learn for power mean, mode / mode_kwargs for a
                  list), and fastgnn's deterministic.
    normalize, root_weight, project, bias: as in PyG.
    deterministic (fastgnn only, keyword): False lets the GPU backward of a
                  max/min aggregation (alone or in a list) add its gradient with
                  float atomics instead of walking the transpose: faster, not
                  bitwise repeatable. An Aggregation instance given as aggr with
                  its own deterministic=False opts in too. No effect on the CPU,
                  on the forward, or on sum/mean/var/std/mul aggregations.
    forward(x [N, in] | (x_src [Ns, in_s], x_dst [Nt, in_t] or None),
            edge_index [2, E] | EdgeIndex | adj_t [Nt, Ns], size=None) -> [Nt, out]

    Parameters `lin_l` (aggregated neighbours, with bias), `lin_r` (root, no
    bias; only with root_weight) and `lin` (only with project), as PyG names them.
    A sum/mean aggregation runs on the narrower side of lin_l (before it when
    out_channels < in_channels), which gives the same function and moves fewer bytes.
    As in PyG, only the "sum"/"mean"/"max"/"min" strings use a sparse adj_t's
    values as weights; weighted max/min raise NotImplementedError, and the
    other aggregations ignore the values.
    """

    def __init__(self, in_channels, out_channels: int, aggr="mean", normalize: bool = False,
                 root_weight: bool = True, project: bool = False, bias: bool = True,
                 **kwargs):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.normalize = normalize
        self.root_weight = root_weight
        self.project = project
        aggr_kwargs = kwargs.pop("aggr_kwargs", None) or {}
        self.deterministic = _pop_deterministic(type(self).__name__, kwargs)
        self.flow = _check_kwargs(type(self).__name__, kwargs)
        # PyG's string form of aggr (kept for repr and code that reads it)
        if isinstance(aggr, str):
            self.aggr = aggr
        elif isinstance(aggr, (list, tuple)):
            self.aggr = [str(a) for a in aggr]
        else:
            self.aggr = str(aggr)
        # sum/mean strings: SpMM (with a sparse adj_t's values as weights, as PyG)
        self._reduce = _AGGRS.get(aggr) if isinstance(aggr, str) and not aggr_kwargs else None
        if self._reduce is not None:
            self.aggr_module = None
            self._weighted = True
        else:
            if aggr is None:
                raise NotImplementedError(f"{type(self).__name__}: aggr=None is not supported")
            from .aggr import resolve_aggregation       # imports PyG: only when needed
            self.aggr_module = resolve_aggregation(aggr, **aggr_kwargs)
            codes = self.aggr_module._codes
            # PyG fuses (and so weighs by adj_t values) only for str aggr in FUSE_AGGRS
            self._weighted = isinstance(aggr, str) and aggr in ("max", "min")
            if not isinstance(aggr, str) and len(codes) == 1 and codes[0] in ("sum", "mean"):
                self._reduce = codes[0]                   # SpMM, unweighted (as PyG)
        if isinstance(in_channels, int):
            in_channels = (in_channels, in_channels)
        if project:
            if in_channels[0] <= 0:
                raise ValueError(f"'{type(self).__name__}' does not support lazy "
                                 "initialization with `project=True`")
            self.lin = Linear(in_channels[0], in_channels[0], bias=True)
        aggr_out = in_channels[0]
        if self.aggr_module is not None and hasattr(self.aggr_module, "get_out_channels"):
            aggr_out = self.aggr_module.get_out_channels(in_channels[0])
        self.lin_l = _linear(aggr_out, out_channels, bias=bias)
        if root_weight:
            self.lin_r = _linear(in_channels[1], out_channels, bias=False)
        self.reset_parameters()

    def reset_parameters(self):
        if self.project:
            self.lin.reset_parameters()
        self.lin_l.reset_parameters()
        if self.root_weight:
            self.lin_r.reset_parameters()

    def forward(self, x, edge_index, size=None) -> Tensor:
        _check_features(self, x, edge_index)
        edge_index, size = _oriented(
            self, edge_index, size, _PAIR_FLOW if not isinstance(x, Tensor) else
            "with project=True (PyG then aggregates the unprojected x)" if self.project else None)
        x_src, x_dst = _pair(x)
        if self.project:
            x_src = self.lin(x_src).relu()
        graph, weight = resolve(edge_index, _graph_sizes(x_src, x_dst, size, edge_index))
        if not self._weighted:
            weight = None                              # PyG ignores adj_t values here
        lin_l = self.lin_l
        if self._reduce is None:                       # max/min/var/std/several
            if weight is not None:
                raise NotImplementedError(
                    f"{type(self).__name__}(aggr={self.aggr!r}) with a weighted sparse adj_t "
                    "(PyG computes max/min of value * x there) is not supported by "
                    "fastgnn.torch; pass an adj_t of ones or an edge_index")
            fused = self._segment_linear(graph, x_src, x_dst)
            if fused is not None:
                out = fused
                x_dst = None                           # its root term is in `fused`
            else:
                out, = shared_input_linears(self.aggr_module.neighbour(
                    graph, x_src, deterministic=self.deterministic), (lin_l,))
        else:
            out = linear_of_propagation(
                x_src, lin_l, lambda t, b: _spmm_bias(graph, t, weight, b, reduce=self._reduce))
        if self.root_weight and x_dst is not None:
            # out is the output of lin_l (no hooks: nothing else holds it) or of the SpMM
            out = _add_linear(out, self.lin_r, x_dst,
                              out_is_ours=_plain_linear(lin_l, out.dtype))
        if self.normalize:
            out = F.normalize(out, p=2.0, dim=-1)
        return out

    def _segment_linear(self, graph, x_src, x_dst):
        """lin_l(aggr(x_src)) + lin_r(x_dst) as one `segment_reduce_linear`
        node when both linears are plain (`_plain_linear`), the aggregation's
        blocks come from one segment_reduce call, and autocast is off (its
        casts happen per module call); else None. One Python autograd node
        instead of the reduction's plus torch's linear and add nodes, and
        x's two gradients meet in the reduction's backward store."""
        reduce = self.aggr_module.single_pass_reduce()
        root = self.lin_r if self.root_weight and x_dst is not None else None
        dtype = x_src.dtype
        if (reduce is None or x_src.dim() != 2 or _autocast_on(x_src.device.type)
                or not _plain_linear(self.lin_l, dtype)
                or (root is not None and not (_plain_linear(root, dtype) and root.bias is None
                                              and x_dst.dim() == 2))):
            return None
        lin_l = self.lin_l
        det = self.deterministic and self.aggr_module._deterministic_backward()
        return segment_reduce_linear(
            graph, x_src, reduce, lin_l.weight, lin_l.bias,
            None if root is None else root.weight,
            None if root is None or x_dst is x_src else x_dst, deterministic=det)

    def __repr__(self):
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels}, aggr={self.aggr})"


def linear_of_propagation(x, lin, propagate, commutes=True):
    """lin(propagate(x, None)) for x [N, F_in] (or [*, N, F_in]), where
    propagate(t, b) maps node features t to new rows and adds b (or
    nothing) to each. When propagate is linear in t (commutes, e.g. sum and
    mean SpMMs, not max/min), it runs on the narrower side of lin: before it
    when lin maps to fewer features, as propagate(x W^T, b) (the bias added
    in the SpMM's store), which gives the same function and moves fewer
    bytes. A hooked lin is called as a module after the propagation; a lazy
    one is materialised from x's width first."""
    if isinstance(lin, torch.nn.LazyLinear) and lin.has_uninitialized_params():
        lin(x[..., :0, :])                        # materialise from the input width
    if commutes and lin.out_features < lin.in_features and _plain_linear(lin, x.dtype):
        return propagate(F.linear(x, lin.weight), lin.bias)
    out, = shared_input_linears(propagate(x, None), (lin,))
    return out


def _no_hooks(module) -> bool:
    """Neither the module nor torch's global module hooks would run anything
    around its forward or backward."""
    has_global = getattr(_torch_module, "_has_any_global_hook", lambda: False)
    return not (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or getattr(module, "_backward_pre_hooks", None) or has_global())


def _plain_linear(lin, dtype):
    """lin is an initialised torch Linear (or ours) without hooks of its own
    or global ones, weights in `dtype`: its GEMM may be fused with a
    neighbour's without changing what the module would compute or run."""
    return type(lin) in (torch.nn.Linear, Linear) and lin.weight.dtype == dtype and _no_hooks(lin)


def _add_linear(out, lin, x, out_is_ours=False):
    """out + lin(x), with the sum done in the GEMM's epilogue (beta = 1) when
    lin is a plain (`_plain_linear`) bias-free Linear and both are 2-D: one
    pass over [N, F] less than the separate add.

    out_is_ours: `out` was just made by the layer and nothing holds it (no
    hook saw it, no autograd node saved it): then the GEMM accumulates into it
    in place (addmm_), where out-of-place torch.addmm first copies out into
    its result (one more read and write of [N, F]). Autograd's version
    counter would catch a node that did save it."""
    plain = (_plain_linear(lin, x.dtype) and lin.bias is None and out.dim() == 2
             and x.dim() == 2 and out.dtype == x.dtype)
    if plain:
        if out_is_ours and out.is_contiguous():
            return out.addmm_(x, lin.weight.t())
        return torch.addmm(out, x, lin.weight.t())
    return out + lin(x)


class _SharedInputLinears(torch.autograd.Function):
    """y_k = x W_k^T + b_k for several linears reading one x [N, F_in]. The
    forward is the separate GEMMs; the backward accumulates x's gradient in
    the GEMMs' epilogues, grad_x = G_1 W_1, then grad_x += G_k W_k in place
    (addmm_, beta = 1), where autograd would compute each G_k W_k on its own
    and add them: one read-read-write pass over [N, F_in] less per extra
    linear (a beta = 1 epilogue reads grad_x once instead). Weight and bias
    gradients as torch.nn.Linear's: G_k^T x and the column sums of G_k
    (`bias_grad`: one streaming pass on large CUDA tensors). One linear is
    torch's Linear with that bias gradient. Bias-free products x W^T and the
    first G_k W_k go through `gemm` (the faster cuBLAS form for the shape).

    forward(ctx, x, W_1, b_1, W_2, b_2, ...) -> (y_1, y_2, ...); b_k may be None."""

    @staticmethod
    def forward(ctx, x, *weights_and_biases):
        ws, bs = weights_and_biases[0::2], weights_and_biases[1::2]
        ctx.set_materialize_grads(False)        # an unused output sends no gradient
        ctx.save_for_backward(x, *ws)
        ctx.has_bias = tuple(b is not None for b in bs)
        return tuple(F.linear(x, w, b) if b is not None else x_wt(x, w) for w, b in zip(ws, bs))

    @staticmethod
    def backward(ctx, *grads):
        x, *ws = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grad_x = None
        out = [None] * (2 * len(ws))
        for k, (g, w) in enumerate(zip(grads, ws)):
            if g is None:
                continue
            if needs[0]:
                grad_x = g_w(g, w) if grad_x is None else grad_x.addmm_(g, w)
            if needs[1 + 2 * k]:
                out[2 * k] = g.t().mm(x)
            if ctx.has_bias[k] and needs[2 + 2 * k]:
                out[2 * k + 1] = bias_grad(g)
        return (grad_x, *out)


def _autocast_on(device_type):
    try:
        return torch.is_autocast_enabled(device_type)     # torch >= 2.4
    except TypeError:
        return torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled()


def shared_input_linears(x, lins):
    """(lin(x) for lin in lins) for linears that read the same x: through
    `_SharedInputLinears` (x's gradient summed in GEMM epilogues) when every
    lin is plain (`_plain_linear`) for x's dtype and x is 2-D outside
    autocast, with at least FUSED_MIN_NUMEL elements (functional.py: below
    that, a Python autograd node costs more than the passes it saves); else
    the modules are called one by one, as they are inside a compiled program
    (Inductor fuses the gradient sum itself)."""
    plain = (x.dim() == 2 and len(lins) >= 1 and not custom_ops.compiling()
             and not _autocast_on(x.device.type)
             and x.numel() >= _functional.FUSED_MIN_NUMEL
             and all(_plain_linear(lin, x.dtype) for lin in lins))
    if not plain:
        return tuple(lin(x) for lin in lins)
    params = [t for lin in lins for t in (lin.weight, lin.bias)]
    return _SharedInputLinears.apply(x, *params)


# ------------------------------------------------------------------- GINConv
class GINConv(torch.nn.Module):
    r"""Graph isomorphism operator (Xu et al.), PyG 2.8's `GINConv`:

        x'_i = h_Theta((1 + eps) x_i + sum_{j in N(i)} x_j)

    nn:        the module h_Theta (e.g. an MLP), stored as `nn`.
    eps:       initial epsilon; train_eps makes it a parameter, else it is a
               buffer (both appear in the state_dict as `eps`, as in PyG).
    forward(x [N, F] | (x_src [Ns, F], x_dst [Nt, F] or None),
            edge_index [2, E] | EdgeIndex | adj_t [Nt, Ns], size=None) -> nn output [Nt, *]
        Features may carry leading dimensions ([*, N, F], a static graph).
    """

    def __init__(self, nn, eps: float = 0.0, train_eps: bool = False, **kwargs):
        super().__init__()
        _message_passing_options(self, kwargs)
        self.nn = nn
        _register_eps(self, eps, train_eps)
        self.reset_parameters()

    def reset_parameters(self):
        _reset(self.nn)
        with torch.no_grad():
            self.eps.fill_(self.initial_eps)

    def forward(self, x, edge_index, size=None) -> Tensor:
        _check_features(self, x, edge_index)
        edge_index, size = _oriented(self, edge_index, size,
                                     None if isinstance(x, Tensor) else _PAIR_FLOW)
        x_src, x_dst = _pair(x)
        graph, weight = resolve(edge_index, _graph_sizes(x_src, x_dst, size, edge_index,
                                                         node_dim=-2))
        out = _spmm_bias(graph, x_src, weight, None, reduce=self._reduce)
        if x_dst is not None:
            eps = self.eps
            if (out.device.type == "cpu" and not custom_ops.compiling() and not eps.requires_grad
                    and not out.requires_grad
                    and not x_dst.requires_grad and out.shape == x_dst.shape
                    and out.dtype == x_dst.dtype and eps.item() == 0):
                # inference on the CPU with eps = 0: (1 + 0) * x == x, so the
                # self term is added into the aggregation's fresh output in
                # place (the same sums, two [N, F] passes fewer)
                out.add_(x_dst)
            else:
                out = out + (1 + eps) * x_dst
        return self.nn(out)

    def __repr__(self):
        return f"{type(self).__name__}(nn={self.nn})"
