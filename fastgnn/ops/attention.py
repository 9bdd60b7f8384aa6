"""Attention family: edge softmax, and fused edge attention (GAT, GATv2, Graph
Transformer) with nothing of size edges x heads x channels stored.

Messages flow source j -> target i along edges e = (j -> i); N(i) is the set of
in-edges of i; h is the head (H heads), c the channel (C per head).

edge_softmax
------------
    p[e, h]   = exp(s[e, h] - lse[i, h]),    lse[i, h] = log sum_{e' in N(i)} exp(s[e', h])
    out[e, h] = p[e, h] * z[e, h]
    grad_s    = p * (g z - sum_{e' in N(i)} p g z)            (per target, per head)

with z the dropout factor (below; z = 1 without dropout). Targets without
in-edges simply have no entries.

edge_attention
--------------
Per head, a score s_e per edge, the softmax p_e over N(i), dropout z_e, and the
weighted sum of messages m_e:

    out[i, h] = sum_{e in N(i)} p_e z_e m_e[h]              (0 for targets without in-edges)

    "gat":   s_e = LeakyReLU(a_src[j] + a_dst[i] + a_edge[e])                 m_e = v[j]
    "gatv2": s_e = sum_c att[h,c] LeakyReLU(xl[j,h,c] + xr[i,h,c] + xe[e,h,c])   m_e = xl[j]
    "dot":   s_e = scale * <q[i,h], k[j,h] + ee[e,h]>                        m_e = v[j] + ee[e]

(a_edge, xe, ee are optional; LeakyReLU(u) = u if u > 0 else negative_slope * u;
scale defaults to 1/sqrt(C)). The forward is one pass over each target's
in-edges with an online softmax (running max, running sum, rescaled
accumulator); it keeps only lse[i, h] (float32, float64 for float64 inputs).

The backward recomputes s_e, p_e = exp(s_e - lse_i) and z_e edge by edge.
With g = grad_out, ga = grad_alpha (the cotangent of the returned attention
weights p, optional) and

    D[i, h] = <g[i,h], out[i,h]> + sum_{e in N(i)} p_e ga_e            (per target, per head)
    ds_e    = p_e (z_e <g[i,h], m_e[h]> + ga_e - D[i, h])

the gradients are, per score (lr' = 1 where the LeakyReLU argument is > 0,
else negative_slope, as torch):

    "gat":   du_e = ds_e lr'(u_e);  grad_a_dst[i] = sum_{N(i)} du_e;  grad_a_edge[e] = du_e;
             grad_a_src[j] = sum_{e out of j} du_e;  grad_v[j] = sum_{e out of j} p_e z_e g[i]
    "gatv2": dt_e = ds_e att lr'(t_e) (per channel; t_e the LeakyReLU argument);
             grad_xr[i] = sum_{N(i)} dt_e;  grad_xe[e] = dt_e;
             grad_xl[j] = sum_{e out of j} (dt_e + p_e z_e g[i]);
             grad_att = sum_e ds_e LeakyReLU(t_e)
    "dot":   grad_q[i] = scale sum_{N(i)} ds_e (k[j] + ee[e]);
             grad_ee[e] = scale ds_e q[i] + p_e z_e g[i];
             grad_k[j] = scale sum_{e out of j} ds_e q[i];  grad_v[j] = sum_{e out of j} p_e z_e g[i]

computed without atomics: D and the target-side and per-edge terms in one
pass per target over the CSR, the source-side terms in one pass per source
over the cached transpose, and grad_att as per-chunk partial sums (a fixed
chunking of the targets) added in a fixed order. Results are bitwise repeatable.

Dropout
-------
z[e, h] = keep[e, h] / (1 - p) with keep drawn by the counter-based generator
of `fastgnn.rng` from (seed, n = offset + e * H + h), e the caller's edge id:
no mask is stored, the backward (and every backend) regenerates it. The
returned attention weights are p (before dropout; PyG's GATv2Conv and
TransformerConv return those); `fastgnn.rng.keep_mask(seed, offset, E, H, p)`
gives the mask when the dropped weights are wanted.

Backend interface
-----------------
A backend module (`fastgnn.backends.cpu`, later `fastgnn.backends.cuda`)
provides the functions below. The op layer has validated everything: arrays
are C-contiguous, on the graph's device, of one value type `vtype` (float32 or
float64 on the CPU; also float16/bfloat16 on the GPU, bf16 as 16-bit ints),
shapes as listed. Every per-edge array, in or out, is in the *caller's* edge
order and is indexed through `caller_ids(graph)` ([E], CSR position -> caller
id) in target passes and `transpose_caller_ids(graph)` ([E], transpose position
-> caller id) in source passes; no per-edge array is permuted, so nothing of
size E x H x C is ever copied. `drop` is a `DropoutSpec` (host scalars).

    edge_softmax_fwd(graph, scores, drop, vtype) -> (out, lse)
        scores [E, H]; out [E, H] (vtype); lse [num_dst, H] (lse dtype: float64
        for float64, else float32; -inf for targets without in-edges).
    edge_softmax_bwd(graph, scores, lse, grad, drop, vtype) -> grad_scores [E, H]

    edge_attention_fwd(graph, score, arrays, params, need_alpha)
            -> (out [num_dst, H, C], lse [num_dst, H], alpha [E, H] or None)
    edge_attention_bwd(graph, score, arrays, out, lse, grad_out, grad_alpha, params, needs)
            -> {name: gradient or None} for every name of SCORE_INPUTS[score]

`score` is "gat", "gatv2" or "dot"; `arrays` is a dict holding, under the names
of SCORE_INPUTS[score], the inputs in these shapes (None for an absent
optional edge term):

    "gat":   a_src [num_src, H, 1], a_dst [num_dst, H, 1], a_edge [E, H, 1] | None,
             v [num_src, H, C]   (the per-node logits carry a trailing axis of 1)
    "gatv2": xl [num_src, H, C], xr [num_dst, H, C], att [H, C], xe [E, H, C] | None
    "dot":   q [num_dst, H, C], k [num_src, H, C], v [num_src, H, C], ee [E, H, C] | None

`params` is an `AttentionParams` (negative_slope, scale, drop); `need_alpha`
asks for alpha[e, h] = p[e, h] in vtype; `out` is the forward's output;
grad_out [num_dst, H, C] or None (zero), grad_alpha [E, H] or None (zero);
`needs` maps each input name to whether its gradient is wanted (absent inputs
are False). Gradients come back in the inputs' shapes and vtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import rng
from .._array import CPU_VALUE_TYPES, as_backend_array, is_cupy, same_device, vtype_of
from ..backends import backend_for
from ..graph import Graph, as_graph

SCORES = ("gat", "gatv2", "dot")


# ------------------------------------------------------------------ shared
@dataclass(frozen=True)
class DropoutSpec:
    """Attention dropout as host scalars (see `fastgnn.rng`): keep weight (e, h)
    iff (bits(seed, offset + e*H + h) >> 11) >= threshold; kept weights times scale."""
    p: float                 # probability of dropping, in [0, 1); 0 = off
    seed: int
    offset: int              # uint64
    key: int                 # rng.seed_key(seed), uint64
    threshold: int           # rng.drop_threshold(p), uint64 (0 when p = 0)
    scale: float             # 1 / (1 - p)

    @property
    def active(self) -> bool:
        return self.p > 0


def dropout_spec(dropout, seed, offset) -> DropoutSpec:
    """Validate the dropout arguments of a public function."""
    if isinstance(dropout, (bool, np.bool_)) or not isinstance(dropout, (int, float, np.number)):
        raise TypeError(f"dropout must be a float in [0, 1), got {type(dropout).__name__}")
    p = float(dropout)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
    seed = rng.check_seed(seed, "seed")
    offset = rng.check_seed(offset, "offset")
    return DropoutSpec(p, seed, offset, rng.seed_key(seed), rng.drop_threshold(p), 1.0 / (1.0 - p))


def caller_ids(graph: Graph):
    """[E] caller edge id of each CSR position (graph.edge_ids, or arange)."""
    if graph.edge_ids is not None:
        return graph.edge_ids
    return graph.cached("caller_ids", lambda: graph.xp.arange(graph.num_edges,
                                                              dtype=graph.index_dtype))


def transpose_caller_ids(graph: Graph):
    """[E] caller edge id of each position of graph.transpose() (cached)."""
    def build():
        t = graph.transpose()
        return t.edge_ids if graph.edge_ids is None else graph.edge_ids[t.edge_ids]
    return graph.cached("transpose_caller_ids", build)


def _backend(x, name):
    """The backend function `name` for arrays like x (NotImplementedError if
    that backend does not provide it yet)."""
    be = backend_for(x)
    fn = getattr(be, name, None)
    if fn is None:
        raise NotImplementedError(f"the {be.__name__.rsplit('.', 1)[-1].upper()} backend has "
                                  f"no {name} yet")
    return fn


def lse_dtype(vtype):
    return np.float64 if vtype == "float64" else np.float32


def _check_device(graph, a, name):
    if not same_device(a, graph.indices):
        raise ValueError(f"{name} lives on {'GPU' if is_cupy(a) else 'CPU'} but the graph on "
                         f"{graph.device}; move one of them (Graph.to(device))")


def _check_vtype(a, vtype, name):
    vt = vtype_of(a, vtype, name)
    if not is_cupy(a) and vt not in CPU_VALUE_TYPES:
        raise TypeError(f"{name}: the CPU backend supports {CPU_VALUE_TYPES}, got {vt}; "
                        "cast to float32 or run on the GPU")
    return vt


# ------------------------------------------------------------ edge_softmax
@dataclass
class EdgeSoftmaxResiduals:
    """What `edge_softmax_bwd` needs: the scores (a reference) and lse."""
    scores: object           # [E, H] the forward's input (not a copy)
    lse: object              # [num_dst, H] float32/float64
    drop: DropoutSpec
    vtype: str
    flat: bool               # scores were [E] (returned gradient is [E] too)


def _validate_edge_scores(graph, a, name, vtype=None):
    a = as_backend_array(a, name)
    if a is None:
        raise TypeError(f"{name} must be an array of shape [E] or [E, H], got None")
    if a.ndim not in (1, 2) or a.shape[0] != graph.num_edges:
        raise ValueError(f"{name} must have shape [E] or [E, H] with E = {graph.num_edges}, "
                         f"got {tuple(a.shape)}")
    _check_device(graph, a, name)
    vt = _check_vtype(a, vtype, name)
    flat = a.ndim == 1
    a = graph.xp.ascontiguousarray(a)
    return (a[:, None] if flat else a), vt, flat


def edge_softmax_fwd(graph, scores, *, dropout=0.0, seed=0, offset=0, vtype=None):
    """Forward of `edge_softmax`; returns (out, EdgeSoftmaxResiduals)."""
    graph = as_graph(graph)
    s, vt, flat = _validate_edge_scores(graph, scores, "scores", vtype)
    drop = dropout_spec(dropout, seed, offset)
    out, lse = _backend(s, "edge_softmax_fwd")(graph, s, drop, vt)
    return (out[:, 0] if flat else out), EdgeSoftmaxResiduals(s, lse, drop, vt, flat)


def edge_softmax_bwd(graph, res: EdgeSoftmaxResiduals, grad_out):
    """Backward of `edge_softmax`: grad_scores in the scores' shape and type,
    grad_s = p * (g z - sum_{N(i)} p g z) (see module docstring)."""
    graph = as_graph(graph)
    if res.scores.shape[0] != graph.num_edges or res.lse.shape[0] != graph.num_dst:
        raise ValueError("edge_softmax_bwd: the residuals come from a different graph")
    g, _, flat = _validate_edge_scores(graph, grad_out, "grad_out", res.vtype)
    if g.shape != res.scores.shape or flat != res.flat:
        want = (res.scores.shape[0],) if res.flat else tuple(res.scores.shape)
        raise ValueError(f"grad_out must have shape {list(want)}, got "
                         f"{tuple(g.shape[:1]) if flat else tuple(g.shape)}")
    gs = _backend(g, "edge_softmax_bwd")(graph, res.scores, res.lse, g, res.drop, res.vtype)
    return gs[:, 0] if res.flat else gs


def edge_softmax(graph, scores, *, dropout=0.0, seed=0, offset=0, vtype=None):
    """Softmax of per-edge scores over each target's in-edges, per head
    (PyG's `torch_geometric.utils.softmax(scores, index=dst)`):

        out[e, h] = z[e, h] * exp(s[e, h]) / sum_{e' in N(i)} exp(s[e', h])     (e = (j -> i))

    graph:   fastgnn.Graph.
    scores:  [E, H] (or [E]) float scores in the caller's edge order.
    dropout: probability p in [0, 1) of zeroing a weight; kept weights are
             scaled by z = 1/(1-p) (0: off).
    seed, offset: the counter-based generator's seed and counter offset
             (`fastgnn.rng`): weight (e, h) uses counter offset + e*H + h,
             so the same arguments give the same mask, in forward and backward.
    Returns [E, H] (or [E]) in the caller's edge order and the scores' dtype.
    """
    out, _ = edge_softmax_fwd(graph, scores, dropout=dropout, seed=seed, offset=offset,
                              vtype=vtype)
    return out
