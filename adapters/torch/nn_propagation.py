"""Drop-in replacements for PyG 2.8's propagation layers of the SpMM family:

    GraphConv       x'_i = W_1 x_i + W_2 aggr_{j -> i} e_ji x_j
    SGConv          X' = (D^-1/2 (A + I) D^-1/2)^K X Theta
    APPNP           X^(k) = (1 - alpha) D^-1/2 (A + I) D^-1/2 X^(k-1) + alpha X, K steps
    TAGConv         X' = sum_k (D^-1/2 A D^-1/2)^k X Theta_k
    LEConv          x'_i = sum_{j -> i} e_ji (a_j - b_i) + W_3 x_i
    ClusterGCNConv  X' = (D^-1 (A + I) + lambda diag(D^-1 (A + I))) X W_1 + X W_2
    ChebConv        X' = sum_k T_k(L_hat) X Theta_k

Same constructor arguments, parameter names (a PyG `state_dict` loads with
`strict=True`, and ours into PyG's), forward inputs (edge_index tensor, PyG
EdgeIndex, torch sparse adj_t where PyG takes one, `(x_src, x_dst)` pairs
for GraphConv and LEConv, x [*, N, F] as a static graph) and the same
function as PyG's, `flow` read per call as in nn.py. Every propagation is one
of fastgnn's SpMMs (`fastgnn.torch.spmm`: CUDA kernels on the GPU, the Numba
backend on the CPU) over weights built once per call or per graph (GCN
normalisation through `gcn_normalized`, ClusterGCN's degree weights, the
scaled Laplacian): nothing of size [E, F] is built. Linear maps run on the
narrower side of each propagation (before it when they shrink the features:
Horner / Clenshaw evaluation for the polynomial filters).

torch.compile: these layers have no custom op of their own; their forward
runs eagerly (`torch.compiler.disable`: a graph break around each call), so a
compiled model that contains them works, and `fullgraph=True` refuses them.
"""
from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F
from torch import Tensor

from fastgnn.ops.spmm import self_loop_structure

from ._autograd import to_tensor
from .functional import _cached_edge_index, _norm_dtype, add_bias, gcn_norm
from .graph_cache import resolve, reversed_input, to_graph
from .nn import (_PAIR_FLOW, _add_linear, _check_features, _check_flow, _check_single_features,
                 _graph_sizes, _is_sparse, _linear, _message_passing_options, _oriented, _pair,
                 _plain_linear, _register_bias, _spmm_bias, linear_of_propagation,
                 propagation_graph, shared_input_linears)

__all__ = ["GraphConv", "SGConv", "APPNP", "TAGConv", "LEConv", "ClusterGCNConv", "ChebConv"]


# ------------------------------------------------------------------- helpers
def _eager(forward):
    """forward run eagerly inside a compiled program (a graph break)."""
    disable = getattr(torch.compiler, "disable", None)
    return forward if disable is None else disable(forward)


def _check_hops(layer, K, least):
    """K, the number of hops (or of polynomial terms), an int >= least."""
    if isinstance(K, bool) or not isinstance(K, numbers.Integral):
        raise TypeError(f"{layer}: K must be an int, got {type(K).__name__}")
    if K < least:
        raise ValueError(f"{layer}: K must be >= {least}, got {K}")
    return int(K)


def _check_widths(layer, x, in_channels):
    """Each feature tensor's width against in_channels (an int, or the
    (source, target) widths; -1 is lazy: taken from the first input).
    Raises ValueError naming x (x_src / x_dst of a pair)."""
    widths = (tuple(in_channels) if isinstance(in_channels, (tuple, list))
              else (in_channels, in_channels))
    if isinstance(x, (tuple, list)):
        named = (("x_src", x[0], widths[0]), ("x_dst", x[1], widths[1]))
    else:
        named = (("x", x, widths[0]), ("x", x, widths[1]))
    for what, t, want in named:
        if t is not None and want is not None and want > 0 and t.shape[-1] != want:
            raise ValueError(f"'{type(layer).__name__}': {what} has {t.shape[-1]} features per "
                             f"node, but in_channels says {want}")


def _hop(propagation, x, reduce="sum", bias=None):
    """One SpMM of x over a (graph, weight, csr_weights) propagation, bias
    added in its store."""
    graph, weight, csr_weights = propagation
    return _spmm_bias(graph, x, weight, bias, reduce=reduce, csr_weights=csr_weights)


def _in_flow_direction(layer, graph, edge_index):
    """graph as the layer's `flow` reads it, for weights PyG computes on
    edge_index's own orientation whatever the flow (ClusterGCNConv's and
    ChebConv's degrees): "target_to_source" gives graph's reverse, whose edge
    ids are graph's, so per-edge weights computed on graph serve it too."""
    if _check_flow(type(layer).__name__, layer.flow) == "source_to_target":
        return graph
    if _is_sparse(edge_index):
        reversed_input(edge_index)          # raises: PyG takes no adj_t with this flow
    return reversed_input(graph)


def _polynomial(x, lins, bias, hop, next_hop, beta):
    r"""sum_k lins[k](T_k(P) x) + bias for polynomials of a propagation P
    with T_0 = 1, T_1 = P, T_{k+1} = alpha P T_k + beta T_{k-1}:
    hop(t, b) = P t + b, next_hop(t) = alpha P t. x [N, F_in] (or [*, N, F_in]).

    When the linears shrink the features, the sum is evaluated on the output
    side (Clenshaw: b_k = h_k + alpha P b_{k+1} + beta b_{k+2} over
    h_k = lins[k](x), result h_0 + P b_1 + beta b_2), so every SpMM moves
    out_channels features; otherwise T_k x is built by the recurrence and
    each term accumulated into the output in its GEMM's epilogue. Either way
    len(lins) - 1 SpMMs."""
    terms = len(lins)
    if lins[0].out_features < x.shape[-1]:
        h = shared_input_linears(x, tuple(lins))
        if terms == 1:
            return h[0] if bias is None else add_bias(h[0], bias)
        b1, b2 = h[-1], None                         # b_{k+1}, b_{k+2} (None: 0)
        for k in range(terms - 2, 0, -1):
            b = next_hop(b1) + h[k]
            if beta and b2 is not None:
                b = torch.add(b, b2, alpha=beta)
            b1, b2 = b, b1
        out = hop(b1, bias) + h[0]
        if beta and b2 is not None:
            out = torch.add(out, b2, alpha=beta)
        return out
    out = lins[0](x)
    owned = _plain_linear(lins[0], x.dtype)
    previous, current = None, x
    for k, lin in enumerate(lins[1:], start=1):
        following = hop(current, None) if k == 1 else next_hop(current)
        if k > 1 and beta:
            following = torch.add(following, previous, alpha=beta)
        previous, current = current, following
        out = _add_linear(out, lin, current, out_is_ours=owned)
    return out if bias is None else add_bias(out, bias)


# ----------------------------------------------------------------- GraphConv
class GraphConv(torch.nn.Module):
    r"""Graph convolution of Morris et al. ("Weisfeiler and Leman go neural"),
    PyG 2.8's `GraphConv`:

        x'_i = W_1 x_i + W_2 aggr_{e = (j -> i)} e_ji x_j        (e_ji = 1 unweighted)

    in_channels:  int, or (source, target) widths for bipartite graphs (-1: lazy).
    out_channels: output width.
    aggr:         "add" (default) / "sum", "mean", "max" or "min" (the
                  weighted max/min of e_ji x_j); others raise NotImplementedError.
    bias:         learnable bias of W_2 (`lin_rel`).
    forward(x [N, in] | (x_src [Ns, in_s], x_dst [Nt, in_t] or None),
            edge_index [2, E] | EdgeIndex | adj_t [Nt, Ns], edge_weight [E] = None,
            size=None) -> [Nt, out]
        With a sparse adj_t its values are the weights and edge_weight is
        ignored, as in PyG.

    Parameters `lin_rel` (W_2, with bias) and `lin_root` (W_1, no bias), as PyG
    names them. A sum/mean aggregation runs on the narrower side of lin_rel;
    W_1 x_i is added in lin_root's GEMM epilogue.
    """

    def __init__(self, in_channels, out_channels: int, aggr: str = "add", bias: bool = True,
                 **kwargs):
        super().__init__()
        _message_passing_options(self, {**kwargs, "aggr": aggr}, ("sum", "mean", "max", "min"))
        self.in_channels = in_channels
        self.out_channels = out_channels
        if isinstance(in_channels, int):
            in_channels = (in_channels, in_channels)
        self.lin_rel = _linear(in_channels[0], out_channels, bias=bias)
        self.lin_root = _linear(in_channels[1], out_channels, bias=False)
        self.reset_parameters()

    def reset_parameters(self):
        self.lin_rel.reset_parameters()
        self.lin_root.reset_parameters()

    @_eager
    def forward(self, x, edge_index, edge_weight: Tensor | None = None, size=None) -> Tensor:
        _check_features(self, x, edge_index)
        _check_widths(self, x, self.in_channels)
        edge_index, size = _oriented(self, edge_index, size,
                                     None if isinstance(x, Tensor) else _PAIR_FLOW)
        x_src, x_dst = _pair(x)
        graph, adj_w = resolve(edge_index, _graph_sizes(x_src, x_dst, size, edge_index,
                                                        node_dim=-2))
        weight = adj_w if _is_sparse(edge_index) else edge_weight
        out = linear_of_propagation(
            x_src, self.lin_rel,
            lambda t, b: _spmm_bias(graph, t, weight, b, reduce=self._reduce),
            commutes=self._reduce in ("sum", "mean"))
        if x_dst is not None:
            out = _add_linear(out, self.lin_root, x_dst,
                              out_is_ours=_plain_linear(self.lin_rel, out.dtype))
        return out

    def __repr__(self):
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels})"


# -------------------------------------------------------------------- SGConv
class SGConv(torch.nn.Module):
    r"""Simplified graph convolution (Wu et al.), PyG 2.8's `SGConv`:

        X' = (D^-1/2 (A + I) D^-1/2)^K X Theta + b,   deg(i) = sum_j (A + I)_ij

    in_channels, out_channels: widths (in_channels=-1: lazy).
    K:              number of hops, an int >= 0.
    cached:         keep (D^-1/2 (A + I) D^-1/2)^K X of the first call and use
                    it (detached) in every later call, whatever x and the graph
                    (transductive use only, as in PyG).
    add_self_loops: add (replace) self-loops before normalising.
    bias:           learnable bias of `lin`.
    forward(x [N, in], edge_index [2, E] | EdgeIndex | adj_t [N, N],
            edge_weight [E] = None) -> [N, out]
        x may be [*, N, in] (the same graph for every leading index).

    Parameter `lin` (Theta, b). The K SpMMs read GCN-normalised weights
    (`gcn_normalized`: constant and built once per graph when unweighted);
    without `cached` they run after lin when it shrinks the features, the
    bias added in the last SpMM's store.
    """

    def __init__(self, in_channels: int, out_channels: int, K: int = 1, cached: bool = False,
                 add_self_loops: bool = True, bias: bool = True, **kwargs):
        super().__init__()
        _message_passing_options(self, kwargs)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.K = _check_hops(type(self).__name__, K, 0)
        self.cached = cached
        self.add_self_loops = add_self_loops
        self._cached_x = None
        self.lin = _linear(in_channels, out_channels, bias=bias)
        self.reset_parameters()

    def reset_parameters(self):
        self.lin.reset_parameters()
        self._cached_x = None

    @_eager
    def forward(self, x: Tensor, edge_index, edge_weight: Tensor | None = None) -> Tensor:
        _check_single_features(self, x, edge_index)
        _check_widths(self, x, self.in_channels)
        if self._cached_x is not None:
            return self.lin(self._cached_x.detach())
        if self.K == 0:
            return self.lin(x)
        edge_index, _ = _oriented(self, edge_index)
        norm = propagation_graph(edge_index, int(x.shape[-2]), edge_weight, x.dtype,
                                 normalize=True, add_self_loops=self.add_self_loops)

        def propagate(t, bias):
            for k in range(self.K):
                t = _hop(norm, t, self._reduce, bias if k == self.K - 1 else None)
            return t
        if self.cached:
            self._cached_x = propagate(x, None)
            return self.lin(self._cached_x)
        return linear_of_propagation(x, self.lin, propagate)

    def __repr__(self):
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels}, K={self.K})"


# --------------------------------------------------------------------- APPNP
class APPNP(torch.nn.Module):
    r"""Approximate personalised propagation (Gasteiger et al.), PyG 2.8's `APPNP`:

        X^(0) = X,   X^(k) = (1 - alpha) D^-1/2 (A + I) D^-1/2 X^(k-1) + alpha X,   X' = X^(K)

    K:              number of steps, an int >= 0.
    alpha:          teleport probability.
    dropout:        probability of dropping each (normalised) edge weight in
                    every step while training, a float in [0, 1].
    cached:         keep the normalised graph of the first call (transductive use).
    add_self_loops: add (replace) self-loops before normalising.
    normalize:      GCN normalisation; without it the graph's own weights
                    (edge_weight, or a sparse adj_t's values; 1 if none).
    forward(x [N, F], edge_index [2, E] | EdgeIndex | adj_t [N, N],
            edge_weight [E] = None) -> [N, F]
        x may be [*, N, F].

    No parameters. Each step is one SpMM and one fused add, alpha X computed
    once. Dropout draws one mask per step over the previous step's weights,
    as PyG does (a weight dropped once stays dropped, the others are scaled
    by 1 / (1 - dropout) again in each step), in PyG's edge order for an
    edge_index (the same draws from the same seed); without normalize or
    weights, the ones it drops from are made per call (PyG requires edge
    weights there).
    """

    def __init__(self, K: int, alpha: float, dropout: float = 0.0, cached: bool = False,
                 add_self_loops: bool = True, normalize: bool = True, **kwargs):
        super().__init__()
        name = type(self).__name__
        _message_passing_options(self, kwargs)
        self.K = _check_hops(name, K, 0)
        self.alpha = alpha
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"{name}: dropout must be a probability in [0, 1], got {dropout}")
        self.dropout = dropout
        self.cached = cached
        self.add_self_loops = add_self_loops
        self.normalize = normalize
        self._cached_edge_index = None
        self._cached_adj_t = None

    def reset_parameters(self):
        self._cached_edge_index = None
        self._cached_adj_t = None

    @_eager
    def forward(self, x: Tensor, edge_index, edge_weight: Tensor | None = None) -> Tensor:
        _check_single_features(self, x, edge_index)
        edge_index, _ = _oriented(self, edge_index)
        n = int(x.shape[-2])
        norm = self._cached_edge_index if self.normalize else None
        if norm is None:
            norm = propagation_graph(edge_index, n, edge_weight, x.dtype,
                                     normalize=self.normalize, add_self_loops=self.add_self_loops)
            if self.normalize and self.cached:
                self._cached_edge_index = norm
        dropping = self.dropout > 0 and self.training
        if dropping:
            graph, weight = self._weights(norm, edge_index, n, x)
        h, alpha_h = x, None
        for _ in range(self.K):
            if dropping:        # from the last step's weights, as PyG (drops accumulate)
                weight = F.dropout(weight, p=self.dropout)
                norm = (graph, weight, None)
            out = _hop(norm, x, self._reduce)
            if alpha_h is None:
                alpha_h = self.alpha * h
            x = torch.add(alpha_h, out, alpha=1 - self.alpha)
        return x

    def _weights(self, norm, edge_index, n, x):
        """(graph, weight [E]) of a propagation, the weights as a tensor
        (dropout draws over it): GCN weights that the propagation holds in the
        kernels' orders are taken as `gcn_norm` gives them; a graph without
        weights gets ones."""
        graph, weight, csr_weights = norm
        if csr_weights is not None:
            return gcn_norm(edge_index, None, n, add_self_loops=self.add_self_loops,
                            dtype=x.dtype)
        if weight is None:
            weight = torch.ones(graph.num_edges, dtype=_norm_dtype(x.dtype), device=x.device)
        return graph, weight

    def __repr__(self):
        return f"{type(self).__name__}(K={self.K}, alpha={self.alpha})"


# --------------------------------------------------------- polynomial filters
class _PolynomialFilter(torch.nn.Module):
    """A layer X' = sum_k T_k(P) X Theta_k + b (TAGConv, ChebConv): the
    linears `lins` (Theta_k, no bias) and `bias` (b), as PyG holds them, and
    the MessagePassing keywords. The subclass resets the parameters once its
    own attributes are set."""

    def __init__(self, in_channels, out_channels, terms, bias, weight_initializer, kwargs):
        super().__init__()
        _message_passing_options(self, kwargs)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.lins = torch.nn.ModuleList([
            _linear(in_channels, out_channels, bias=False, weight_initializer=weight_initializer)
            for _ in range(terms)])
        _register_bias(self, out_channels, bias)

    def reset_parameters(self):
        for lin in self.lins:
            lin.reset_parameters()
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)


# ------------------------------------------------------------------- TAGConv
class TAGConv(_PolynomialFilter):
    r"""Topology adaptive graph convolution (Du et al.), PyG 2.8's `TAGConv`:

        X' = sum_{k=0}^{K} (D^-1/2 A D^-1/2)^k X Theta_k + b      (no self-loops added)

    in_channels, out_channels: widths (in_channels=-1: lazy).
    K:         number of hops, an int >= 0 (K + 1 linears).
    bias:      learnable bias b.
    normalize: GCN normalisation without self-loops; without it the graph's
               own weights (edge_weight, or a sparse adj_t's values).
    forward(x [N, in], edge_index [2, E] | EdgeIndex | adj_t [N, N],
            edge_weight [E] = None) -> [N, out]
        x may be [*, N, in].

    Parameters `lins.k.weight` (Theta_k, no bias) and `bias`, as PyG's. K SpMMs
    either way: on the output side by Horner's rule (X Theta_0 + P (X Theta_1
    + P (...))) when out_channels < in_channels, else on the input side.
    """

    def __init__(self, in_channels: int, out_channels: int, K: int = 3, bias: bool = True,
                 normalize: bool = True, **kwargs):
        K = _check_hops(type(self).__name__, K, 0)
        super().__init__(in_channels, out_channels, K + 1, bias, None, kwargs)
        self.K = K
        self.normalize = normalize
        self.reset_parameters()

    @_eager
    def forward(self, x: Tensor, edge_index, edge_weight: Tensor | None = None) -> Tensor:
        _check_single_features(self, x, edge_index)
        _check_widths(self, x, self.in_channels)
        edge_index, _ = _oriented(self, edge_index)
        norm = propagation_graph(edge_index, int(x.shape[-2]), edge_weight, x.dtype,
                                 normalize=self.normalize, add_self_loops=False)

        def hop(t, bias=None):
            return _hop(norm, t, self._reduce, bias)
        return _polynomial(x, self.lins, self.bias, hop, hop, beta=0.0)

    def __repr__(self):
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels}, K={self.K})"


# -------------------------------------------------------------------- LEConv
class LEConv(torch.nn.Module):
    r"""Local extremum operator (Ranjan et al., ASAP), PyG 2.8's `LEConv`:

        x'_i = sum_{e = (j -> i)} e_ji (a_j - b_i) + W_3 x_i,
        a = W_1 x + b_1,  b = W_2 x,                              (e_ji = 1 unweighted)

    computed as (A_e a)_i - s_i b_i + W_3 x_i with s_i = sum_{j -> i} e_ji
    (with aggr="mean", both divided by the in-degree): two SpMMs, one of
    them over a single column, instead of a message per edge.

    in_channels:  int, or (source, target) widths for bipartite graphs (-1: lazy).
    out_channels: output width.
    bias:         learnable biases of W_1 (`lin1`) and W_3 (`lin3`).
    aggr:         "add" (default) / "sum" or "mean" (a keyword, as in PyG).
    forward(x [N, in] | (x_src [Ns, in_s], x_dst [Nt, in_t]),
            edge_index [2, E] | EdgeIndex | adj_t [Nt, Ns], edge_weight [E] = None) -> [Nt, out]
        With a sparse adj_t the weights are edge_weight (in adj_t's entry
        order) if given, else its values, as in PyG.

    Parameters `lin1`, `lin2`, `lin3`, as PyG names them.
    """

    def __init__(self, in_channels, out_channels: int, bias: bool = True, **kwargs):
        super().__init__()
        _message_passing_options(self, kwargs)
        self.in_channels = in_channels
        self.out_channels = out_channels
        if isinstance(in_channels, int):
            in_channels = (in_channels, in_channels)
        self.lin1 = _linear(in_channels[0], out_channels, bias=bias)
        self.lin2 = _linear(in_channels[1], out_channels, bias=False)
        self.lin3 = _linear(in_channels[1], out_channels, bias=bias)
        self.reset_parameters()

    def reset_parameters(self):
        self.lin1.reset_parameters()
        self.lin2.reset_parameters()
        self.lin3.reset_parameters()

    @_eager
    def forward(self, x, edge_index, edge_weight: Tensor | None = None) -> Tensor:
        _check_features(self, x, edge_index)
        if not isinstance(x, Tensor) and x[1] is None:
            raise ValueError(f"'{type(self).__name__}': x must be a tensor or a pair "
                             "(x_src, x_dst) of tensors; x_dst is None")
        _check_widths(self, x, self.in_channels)
        edge_index, _ = _oriented(self, edge_index)
        x_src, x_dst = _pair(x)
        graph, adj_w = resolve(edge_index, _graph_sizes(x_src, x_dst, None, edge_index,
                                                        node_dim=-2))
        weight = adj_w if edge_weight is None else edge_weight
        if x_src is x_dst:
            a, b, root = shared_input_linears(x_src, (self.lin1, self.lin2, self.lin3))
        else:
            a, = shared_input_linears(x_src, (self.lin1,))
            b, root = shared_input_linears(x_dst, (self.lin2, self.lin3))
        ones = torch.ones(graph.num_src, 1, dtype=a.dtype, device=a.device)
        in_weight = _spmm_bias(graph, ones, weight, None, reduce=self._reduce)   # [Nt, 1]
        out = _spmm_bias(graph, a, weight, None, reduce=self._reduce)
        return torch.addcmul(root, in_weight, b, value=-1) + out

    def __repr__(self):
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels})"


# ------------------------------------------------------------ ClusterGCNConv
def _cluster_gcn_weights(graph, diag_lambda, dtype):
    """[E] ClusterGCN weights of a square graph, in its caller order:
    w_e = (1 + diag_lambda [e is a self-loop]) / max(deg_in(i), 1) for
    e = (j -> i). Computed in torch's default dtype, as PyG computes them,
    then cast to the weight type of features of `dtype`; cached per graph."""
    def build():
        ei = _cached_edge_index(graph)
        deg = torch.bincount(ei[1], minlength=graph.num_dst).to(torch.get_default_dtype())
        deg_inv = 1.0 / deg.clamp(min=1.0)
        weight = deg_inv[ei[1]]
        loops = ei[0] == ei[1]
        weight = torch.where(loops, weight + (diag_lambda * deg_inv)[ei[1]], weight)
        return weight.to(_norm_dtype(dtype))
    key = ("fastgnn.torch", "cluster_gcn_weights", float(diag_lambda), str(dtype),
           str(torch.get_default_dtype()))
    return graph.cached(key, build)


class ClusterGCNConv(torch.nn.Module):
    r"""Cluster-GCN convolution (Chiang et al.), PyG 2.8's `ClusterGCNConv`:

        X' = (A_hat + lambda diag(A_hat)) X W_out + b + X W_root,
        A_hat = D^-1 (A + I),   deg(i) = in-degree of i in A + I (at least 1)

    in_channels, out_channels: widths (in_channels=-1: lazy).
    diag_lambda:    lambda, the extra weight of each self-loop.
    add_self_loops: replace the graph's self-loops by one per node (else the
                    graph's own loops take lambda's extra weight).
    bias:           learnable bias b of `lin_out`.
    forward(x [N, in], edge_index [2, E] | EdgeIndex | adj_t [N, N]) -> [N, out]
        A sparse adj_t's values are ignored, as in PyG (the weights come
        from the degrees). x may be [*, N, in].

    Parameters `lin_out` (W_out, b) and `lin_root` (W_root, no bias), as PyG's.
    The weights are constant per graph (built once and cached); one SpMM on
    the narrower side of lin_out, lin_root added in its GEMM epilogue.
    Without add_self_loops PyG adds lambda's weight to the graph's self-loops
    by their position among the loops, which works only for one loop per
    node in node order; fastgnn adds it per loop's node, which is the same
    there and defined for any graph.
    """

    def __init__(self, in_channels: int, out_channels: int, diag_lambda: float = 0.0,
                 add_self_loops: bool = True, bias: bool = True, **kwargs):
        super().__init__()
        _message_passing_options(self, kwargs)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.diag_lambda = diag_lambda
        self.add_self_loops = add_self_loops
        self.lin_out = _linear(in_channels, out_channels, bias=bias, weight_initializer="glorot")
        self.lin_root = _linear(in_channels, out_channels, bias=False,
                                weight_initializer="glorot")
        self.reset_parameters()

    def reset_parameters(self):
        self.lin_out.reset_parameters()
        self.lin_root.reset_parameters()

    @_eager
    def forward(self, x: Tensor, edge_index) -> Tensor:
        _check_single_features(self, x, edge_index)
        _check_widths(self, x, self.in_channels)
        graph, _ = resolve(edge_index, int(x.shape[-2]))
        if self.add_self_loops:
            graph = self_loop_structure(graph)[0]
        weight = _cluster_gcn_weights(graph, self.diag_lambda, x.dtype)
        graph = _in_flow_direction(self, graph, edge_index)
        out = linear_of_propagation(
            x, self.lin_out, lambda t, b: _spmm_bias(graph, t, weight, b, reduce=self._reduce))
        return _add_linear(out, self.lin_root, x,
                           out_is_ours=_plain_linear(self.lin_out, out.dtype))

    def __repr__(self):
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"diag_lambda={self.diag_lambda})")


# ------------------------------------------------------------------ ChebConv
_NORMALIZATIONS = (None, "sym", "rw")


def _scaled_laplacian(graph, edge_weight, normalization, lambda_max, batch, dtype):
    """(graph', weight [E']): L_hat = 2 L / lambda_max - I over graph' (the
    graph's non-loop edges in order, then a loop per node: its loops are
    dropped, as PyG's get_laplacian drops them), with PyG's Laplacians

        None:  L = D - A          sym: L = I - D^-1/2 A D^-1/2          rw: L = I - D^-1 A

    deg(i) = sum of the weights of the edges leaving i (edge_index[0], as
    PyG, whatever the flow). lambda_max None: 2 max(L) (differentiable, as
    PyG's); a number; or a tensor, per graph of `batch` when it has several
    values. Torch ops over [E'] (differentiable in edge_weight)."""
    looped, kept, _ = self_loop_structure(graph)
    kept = to_tensor(kept).long()
    ei = _cached_edge_index(looped)
    num_kept, n = int(kept.shape[0]), looped.num_dst
    src, dst = ei[0, :num_kept], ei[1, :num_kept]
    if edge_weight is None:
        weight = torch.ones(num_kept, dtype=dtype, device=ei.device)
    else:
        weight = edge_weight[kept]
    deg = torch.zeros(n, dtype=weight.dtype, device=weight.device).index_add_(0, src, weight)
    if normalization == "sym":
        d = deg.pow(-0.5)
        d = d.masked_fill(d == float("inf"), 0)
        laplacian = torch.cat([-(d[src] * weight * d[dst]), weight.new_ones(n)])
    elif normalization == "rw":
        d = 1.0 / deg
        d = d.masked_fill(d == float("inf"), 0)
        laplacian = torch.cat([-(d[src] * weight), weight.new_ones(n)])
    else:
        laplacian = torch.cat([-weight, deg])
    if lambda_max is None:
        lambda_max = 2.0 * laplacian.max()
    elif not isinstance(lambda_max, Tensor):
        lambda_max = torch.tensor(lambda_max, dtype=dtype, device=ei.device)
    if batch is not None and lambda_max.numel() > 1:
        lambda_max = lambda_max[batch[ei[0]]]
    scaled = (2.0 * laplacian) / lambda_max
    scaled = scaled.masked_fill(scaled == float("inf"), 0)
    scaled = torch.cat([scaled[:num_kept], scaled[num_kept:] - 1])
    return looped, scaled.to(_norm_dtype(dtype))


class ChebConv(_PolynomialFilter):
    r"""Chebyshev spectral graph convolution (Defferrard et al.), PyG 2.8's `ChebConv`:

        X' = sum_{k=0}^{K-1} T_k(L_hat) X Theta_k + b,   L_hat = 2 L / lambda_max - I,
        T_0 = I, T_1 = L_hat, T_k = 2 L_hat T_{k-1} - T_{k-2}

    with L the graph Laplacian of `normalization` (None: D - A; "sym":
    I - D^-1/2 A D^-1/2; "rw": I - D^-1 A; self-loops dropped, degrees over
    edge_index[0]).

    in_channels, out_channels: widths (in_channels=-1: lazy).
    K:             number of terms, an int >= 1.
    normalization: None, "sym" (default) or "rw".
    bias:          learnable bias b.
    forward(x [N, in], edge_index [2, E] | EdgeIndex, edge_weight [E] = None,
            batch [N] = None, lambda_max = None) -> [N, out]
        lambda_max: None (2 max L, as PyG), a number, or a tensor of one
        value or of one per graph in `batch`. PyG takes no sparse adj_t
        here, nor does this layer. x may be [*, N, in].

    Parameters `lins.k.weight` (Theta_k, no bias) and `bias`, as PyG's. L_hat's
    weights are built by torch ops over the edges (cached per graph when
    nothing in them takes a gradient and lambda_max is not a tensor); the
    K - 1 SpMMs run on the output side (Clenshaw's recurrence) when
    out_channels < in_channels, else on the input side; 2 L_hat T is one SpMM
    over doubled weights.
    """

    def __init__(self, in_channels: int, out_channels: int, K: int,
                 normalization: str | None = "sym", bias: bool = True, **kwargs):
        name = type(self).__name__
        K = _check_hops(name, K, 1)
        if normalization not in _NORMALIZATIONS:
            raise ValueError(f"{name}: normalization must be None, 'sym' or 'rw', "
                             f"got {normalization!r}")
        super().__init__(in_channels, out_channels, K, bias, "glorot", kwargs)
        self.normalization = normalization
        self.reset_parameters()

    @_eager
    def forward(self, x: Tensor, edge_index, edge_weight: Tensor | None = None,
                batch: Tensor | None = None, lambda_max=None) -> Tensor:
        name = type(self).__name__
        _check_single_features(self, x, edge_index)
        _check_widths(self, x, self.in_channels)
        if _is_sparse(edge_index):
            raise NotImplementedError(f"{name}: edge_index must be a [2, E] tensor or a PyG "
                                      "EdgeIndex (PyG's ChebConv takes no sparse adj_t either)")
        if isinstance(lambda_max, Tensor) and lambda_max.numel() > 1 and batch is None:
            raise ValueError(f"{name}: lambda_max holds {lambda_max.numel()} values (one per "
                             "graph) but batch is None; pass batch, or one value")
        graph = to_graph(edge_index, int(x.shape[-2]))

        def laplacian():        # (graph', L_hat's weights, 2 L_hat's)
            looped, weight = _scaled_laplacian(graph, edge_weight, self.normalization,
                                               lambda_max, batch, x.dtype)
            return looped, weight, 2.0 * weight
        if edge_weight is None and not isinstance(lambda_max, Tensor):     # constant
            key = ("fastgnn.torch", "scaled_laplacian", self.normalization, lambda_max,
                   str(x.dtype))
            looped, weight, doubled = graph.cached(key, laplacian)
        else:
            looped, weight, doubled = laplacian()
        looped = _in_flow_direction(self, looped, edge_index)

        def hop(t, bias=None):
            return _spmm_bias(looped, t, weight, bias, reduce=self._reduce)

        def next_hop(t):
            return _spmm_bias(looped, t, doubled, None, reduce=self._reduce)
        return _polynomial(x, self.lins, self.bias, hop, next_hop, beta=-1.0)

    def __repr__(self):
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"K={len(self.lins)}, normalization={self.normalization})")
