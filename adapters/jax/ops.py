"""fastgnn's ops as differentiable JAX functions (see `_bridge` for how they run).

Each public function converts its arguments and calls `apply` with an `Op`
record; the core (fastgnn.ops) runs the kernels. Its checks of the
arguments run when a call is traced (each Op's `check`, on stand-ins of the
arrays' shapes and dtypes), so a bad argument raises a TypeError /
ValueError naming it at the call, under `jax.jit` too. All of
them work eagerly and under `jax.jit`, `jax.grad`, `jax.lax.scan` and
`jax.vmap` (vmap runs the examples one after the other through the host
callback's sequential rule). Value types: float32, and float64 with
`jax_enable_x64`. `spmm` and `edge_attention` let float32 inputs take the
Tensor Core path as TF32 exactly where JAX lets float32 matmuls use TF32
(`tf32_allowed`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fastgnn.backends.attention_spec import SCORE_INPUTS, dropout_spec
from fastgnn.ops.attention import (_attention_params, _validate_edge_scores, _validate_inputs,
                                   edge_attention_bwd, edge_attention_fwd, edge_softmax_bwd,
                                   edge_softmax_fwd)
from fastgnn.ops.segment import parse_reduce, segment_reduce_bwd, segment_reduce_fwd
from fastgnn.ops.spmm import REDUCES as SPMM_REDUCES
from fastgnn.ops.spmm import gcn_norm as _core_gcn_norm
from fastgnn.ops.spmm import (self_loop_structure, spmm_bwd, spmm_fwd, validate_bias,
                              validate_edge_weight, validate_features)
from fastgnn.rng import check_seed

from ._bridge import Op, apply, as_array, stand_in
from ._graph import Graph

__all__ = ["spmm", "gcn_norm", "segment_reduce", "edge_softmax", "edge_attention",
           "tf32_allowed", "SPMM", "SEGMENT_REDUCE", "EDGE_SOFTMAX", "EDGE_ATTENTION"]

# Values of `jax_default_matmul_precision` (lower case; precision names and
# dot-algorithm presets) whose float32 products are TF32 or coarser. None is
# JAX's default, under which a GPU's float32 matmuls use TF32.
_TF32_PRECISIONS = frozenset({
    None, "default", "fastest", "bfloat16", "high", "tensorfloat32", "tf32_tf32_f32",
    "bf16_bf16_bf16", "bf16_bf16_f32", "f16_f16_f16", "f16_f16_f32", "any_f8_any_f8_f32",
    "any_f8_any_f8_f32_fast_accum", "any_f8_any_f8_any", "any_f8_any_f8_any_fast_accum"})


def tf32_allowed() -> bool:
    """Whether JAX lets float32 matmuls round their products to TF32 (or
    coarser): `jax.config.jax_default_matmul_precision` (or the
    `jax.default_matmul_precision(...)` context) is unset or one of
    "default"/"bfloat16", "high"/"tensorfloat32", or a dot-algorithm preset of
    TF32, 16-bit or 8-bit products; "float32"/"highest", F32_F32_F32 and the
    multi-pass presets keep fp32. Read when a call is traced, so jit's cache
    follows it."""
    p = jax.config.jax_default_matmul_precision
    return (None if p is None else str(p).lower()) in _TF32_PRECISIONS


# ------------------------------------------------------------------ spmm
def _spmm_fwd(graph, x, edge_weight, bias, **static):
    return spmm_fwd(graph, x, edge_weight, bias=bias, **static)


def _spmm_shapes(graph, shapes, static):
    shape, dt = shapes["x"]
    return (((graph.num_dst,) + tuple(shape[1:]), dt),)


def _spmm_check(graph, a, static):
    if static["reduce"] not in SPMM_REDUCES:
        raise ValueError(f"reduce must be one of {SPMM_REDUCES}, got {static['reduce']!r}")
    x, vt = validate_features(graph, a["x"], None)
    validate_edge_weight(graph, a["edge_weight"])
    validate_bias(graph, a["bias"], x, vt)


SPMM = Op("spmm", _spmm_fwd, spmm_bwd, inputs=("x", "edge_weight", "bias"),
          features=("x", "bias"), outputs=_spmm_shapes, check=_spmm_check,
          fwd_flags={"needs_weight_grad": "edge_weight"})


def spmm(graph: Graph, x, edge_weight=None, reduce="sum", *, bias=None):
    """Neighbour aggregation (fastgnn.spmm), differentiable in x, edge_weight and bias:

        out[i] = s_i * sum_{e=(j->i)} w_e * x[j]  (+ bias)

    graph: fastgnn.jax.Graph; x: [num_src, F]; edge_weight: [E] in the
    caller's edge order (default 1); reduce: "sum" (s = 1) or "mean"
    (s_i = 1/deg_in(i), empty rows 0); bias: [F]. Returns [num_dst, F].
    float32 features on a locally dense graph run as TF32 on the Tensor Cores
    where `tf32_allowed()` (fastgnn.spmm's tf32=True)."""
    return apply(SPMM, graph, x, edge_weight, bias, reduce=reduce, tf32=tf32_allowed())


# ------------------------------------------------------------ gcn_norm
def gcn_norm(graph: Graph, edge_weight=None, *, add_self_loops=True, improved=False):
    """GCN normalisation (fastgnn.gcn_norm, PyG's gcn_norm): returns
    (graph', w' [E']) with w'_e = deg(j)^-1/2 w_e deg(i)^-1/2 over graph'
    (graph with one self-loop per node when add_self_loops).

    Without edge weights the result is a constant, computed once by the core
    and cached on the graph. With edge weights, w' is differentiable in them:
    the structure (graph', which edges are kept, which old loop gives each
    node's loop weight) comes from the core on the host, and the few
    elementwise operations and the degree sum on top of it are JAX
    operations (no kernel is involved), so JAX differentiates, jits and
    vmaps them natively."""
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a fastgnn.jax.Graph, got {type(graph).__name__}")
    core = graph.core
    if edge_weight is None:
        # the core caches (graph', w' as NumPy); w' enters JAX per call, as a constant
        g2, w = _core_gcn_norm(core, None, add_self_loops=add_self_loops, improved=improved)
        return Graph.of(g2), jnp.asarray(w)
    w = as_array(edge_weight, "edge_weight")
    validate_edge_weight(core, stand_in(w))
    if w.ndim == 2:
        w = w[:, 0]
    if add_self_loops:
        if core.num_src != core.num_dst:
            raise ValueError("gcn_norm with add_self_loops needs a square graph "
                             "(num_src == num_dst)")
        g2, kept, last = self_loop_structure(core)
        fill = 2.0 if improved else 1.0
        loop_w = jnp.where(jnp.asarray(last >= 0), w[jnp.asarray(np.maximum(last, 0))],
                           jnp.asarray(fill, w.dtype))
        w2 = jnp.concatenate([w[jnp.asarray(kept)], loop_w])
    else:
        g2, w2 = core, w
    src, dst = (jnp.asarray(a) for a in g2.edge_index())
    deg = jax.ops.segment_sum(w2, dst, num_segments=g2.num_dst)
    safe = jnp.where(deg == 0, 1, deg)
    dis = jnp.where(deg == 0, 0, safe ** -0.5)
    return Graph.of(g2), dis[src] * w2 * dis[dst]


# ------------------------------------------------------ segment_reduce
def _segment_bwd(graph, res, grad_out):
    return (segment_reduce_bwd(graph, res, grad_out),)


def _segment_shapes(graph, shapes, static):
    names, _ = parse_reduce(static["reduce"])
    shape, dt = shapes["x"]
    return (((graph.num_dst, len(names) * shape[1]), dt),)


def _segment_check(graph, a, static):
    parse_reduce(static["reduce"])
    validate_features(graph, a["x"], None)


SEGMENT_REDUCE = Op("segment_reduce", segment_reduce_fwd, _segment_bwd, inputs=("x",),
                    features=("x",), outputs=_segment_shapes, check=_segment_check,
                    fwd_flags={"needs_x_grad": "x"})


def segment_reduce(graph: Graph, x, reduce="sum"):
    """Neighbour reductions (fastgnn.segment_reduce), differentiable in x:
    reduce is one of "sum", "mean", "max", "min", "var", "std", "mul" or a
    list of distinct ones. Returns [num_dst, F] (one reduction) or
    [num_dst, R*F] (block r = reduce[r]); empty rows 0 (mul: 1)."""
    if isinstance(reduce, list):
        reduce = tuple(reduce)
    return apply(SEGMENT_REDUCE, graph, x, reduce=reduce)


# -------------------------------------------------------- edge_softmax
def _softmax_fwd(graph, scores, **kw):
    return edge_softmax_fwd(graph, scores, **kw)


def _softmax_bwd(graph, res, grad_out):
    return edge_softmax_bwd(graph, res, grad_out), None


def _same_as(name):
    return lambda graph, shapes, static: (shapes[name],)


def _softmax_check(graph, a, static):
    _validate_edge_scores(graph, a["scores"], "scores")
    dropout_spec(static["dropout"], static.get("seed", 0), static["offset"])


EDGE_SOFTMAX = Op("edge_softmax", _softmax_fwd, _softmax_bwd, inputs=("scores", "seed"),
                  features=("scores",), scalars=("seed",), outputs=_same_as("scores"),
                  check=_softmax_check)


def edge_softmax(graph: Graph, scores, *, dropout=0.0, seed=0, offset=0):
    """Softmax of per-edge scores over each target's in-edges, per head
    (fastgnn.edge_softmax), differentiable in scores [E, H] (or [E]).

    dropout: probability of zeroing a weight (kept ones scaled by 1/(1-p));
    seed: a Python int or an integer scalar array (may be traced, e.g. a new
    seed per training step without recompiling; from a PRNG key:
    `jax.random.bits(key, dtype=jnp.uint32)`); offset: the generator's
    counter offset. The mask is regenerated in the backward, never stored."""
    return apply(EDGE_SOFTMAX, graph, scores, seed, dropout=dropout,
                 offset=check_seed(offset, "offset"))


# ------------------------------------------------------ edge_attention
_ATTN_INPUTS = ("a_src", "a_dst", "a_edge", "v", "xl", "xr", "att", "xe", "q", "k", "ee", "bias")
_ANCHOR = {"gat": "v", "gatv2": "xl", "dot": "q"}


def _attention_fwd(graph, *arrays, score, **kw):
    return edge_attention_fwd(graph, score, **dict(zip(_ATTN_INPUTS, arrays)), **kw)


def _attention_bwd(graph, res, grad_out, grad_alpha=None):
    grads = dict(zip(SCORE_INPUTS[res.score],
                     edge_attention_bwd(graph, res, grad_out, grad_alpha)))
    return tuple(grads.get(n) for n in _ATTN_INPUTS) + (None,)


def _attention_shapes(graph, shapes, static):
    (_, h, c), dt = shapes[_ANCHOR[static["score"]]]
    out = ((graph.num_dst, h, c), dt)
    return (out, ((graph.num_edges, h), dt)) if static["return_attention_weights"] else (out,)


def _attention_check(graph, a, static):
    _, _, _, _, C = _validate_inputs(graph, static["score"], a, None)
    _attention_params(static["score"], static["negative_slope"], static["scale"], C,
                      static["dropout"], static.get("seed", 0), static["offset"])


EDGE_ATTENTION = Op("edge_attention", _attention_fwd, _attention_bwd,
                    inputs=_ATTN_INPUTS + ("seed",), features=_ATTN_INPUTS, scalars=("seed",),
                    outputs=_attention_shapes, check=_attention_check)


def edge_attention(graph: Graph, score, *, a_src=None, a_dst=None, a_edge=None, v=None,
                   xl=None, xr=None, att=None, xe=None, q=None, k=None, ee=None, bias=None,
                   negative_slope=0.2, scale=None, dropout=0.0, seed=0, offset=0,
                   return_attention_weights=False):
    """Fused edge attention (fastgnn.edge_attention), differentiable in every
    array input. Per head, for edges e = (j -> i):

        out[i, h] = sum_{e in N(i)} softmax_{N(i)}(s)_e z_e m_e[h]  (+ bias[h])

    score="gat":   a_src [num_src, H], a_dst [num_dst, H], a_edge [E, H] optional,
                   v [num_src, H, C]
    score="gatv2": xl [num_src, H, C], xr [num_dst, H, C], att [H, C], xe [E, H, C] optional
    score="dot":   q [num_dst, H, C], k, v [num_src, H, C], ee [E, H, C] optional
    bias [H, C] (or [H*C]) optional. dropout/seed/offset as in `edge_softmax`
    (seed may be a traced integer scalar). Returns out [num_dst, H, C], and
    alpha [E, H] (the softmax weights before dropout) with
    return_attention_weights. float32 inputs on a locally dense graph run as
    TF32 on the Tensor Cores where `tf32_allowed()` (fastgnn.edge_attention's
    tf32=True)."""
    given = dict(a_src=a_src, a_dst=a_dst, a_edge=a_edge, v=v, xl=xl, xr=xr, att=att, xe=xe,
                 q=q, k=k, ee=ee, bias=bias)
    return apply(EDGE_ATTENTION, graph, *(given[n] for n in _ATTN_INPUTS), seed, score=score,
                 negative_slope=negative_slope, scale=scale, dropout=dropout,
                 offset=check_seed(offset, "offset"),
                 return_attention_weights=bool(return_attention_weights),
                 tf32=tf32_allowed())
