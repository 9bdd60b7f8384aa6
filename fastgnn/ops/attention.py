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

    out[i, h] = sum_{e in N(i)} p_e z_e m_e[h]  (+ b[h])     (0 for targets without in-edges)

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

    D[i, h] = <g[i,h], out[i,h] - b[h]> + sum_{e in N(i)} p_e ga_e     (per target, per head;
                                               the backends keep out without b and read that)
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
             grad_k[j] = scale sum_{e out of j} ds_e q[i];
             grad_v[j] = sum_{e out of j} p_e z_e g[i]

and grad_b[h] = sum_i g[i, h] (the optional bias b [H, C]),
computed without atomics: D and the target-side and per-edge terms in one
pass per target over the CSR, the source-side terms in one pass per source
over the cached transpose, and grad_att as per-chunk partial sums (a fixed
chunking of the targets; on the GPU it follows the launch grid, so one
machine and build give the same bits) added in a fixed order. Results are
bitwise repeatable. (Opt-in `deterministic=False`, GPU only, gatv2: the pass
per target also adds the source-side terms with float atomics and the pass
per source is skipped.)

Dropout
-------
z[e, h] = keep[e, h] / (1 - p) with keep drawn by the counter-based generator
of `fastgnn.rng` from (seed, n = offset + e * H + h), e the caller's edge id:
no mask is stored, the backward (and every backend) regenerates it. The
returned attention weights are p (before dropout, as PyG's TransformerConv
returns them; PyG's GATConv and GATv2Conv return them after dropout, which
fastgnn.torch's layers reproduce with `fastgnn.rng.keep_mask(seed, offset, E,
H, p)`, the mask of the same draw).

Backend interface
-----------------
A backend module (`fastgnn.backends.cpu`; `fastgnn.backends.cuda.api` for CuPy
arrays) provides the four functions below; `backend_for(array)` picks it. The
op layer has validated everything: arrays are C-contiguous, on the graph's
device, all of one value type `vtype` (float32 or float64 on the CPU; also
float16 and bfloat16 on the GPU, bf16 as 16-bit integers), shapes as listed.

Edge order: every per-edge array, in or out, is in the *caller's* edge order.
Kernels reach it through `caller_ids(graph)` ([E], CSR position -> caller id)
in passes over targets and `transpose_caller_ids(graph)` ([E], position in
graph.transpose() -> caller id) in passes over sources (both cached on the
graph; they, DropoutSpec, AttentionParams and the score tables live in
fastgnn/backends/attention_spec.py, below both layers). No per-edge array is
ever permuted or copied, so nothing of size E x H x C is allocated. Dropout
counters use the caller id e.

Dropout: `drop` is a `DropoutSpec` of host scalars: active (p > 0), key =
rng.seed_key(seed), offset, threshold = rng.drop_threshold(p) (all uint64) and
scale = 1/(1-p); z[e, h] = scale if (bits >> 11) >= threshold else 0, with
bits = mix64(key + (offset + e*H + h + 1) * G) (fastgnn/rng.py, mod 2^64).

    edge_softmax_fwd(graph, scores, drop, vtype) -> (out, lse)
        scores [E, H]; out [E, H] = p z (vtype); lse [num_dst, H] (float64 for
        float64, else float32; -inf for targets without in-edges).
    edge_softmax_bwd(graph, scores, lse, grad, drop, vtype) -> grad_scores
        grad [E, H] (cotangent of out); grad_scores [E, H] = p (g z - sum_row p g z).

    edge_attention_fwd(graph, score, arrays, params, need_alpha)
        -> (out [num_dst, H, C] vtype, lse [num_dst, H] (as above), alpha [E, H] vtype or None,
            out_b = out + bias [num_dst, H, C] vtype or None)
    edge_attention_bwd(graph, score, arrays, out, lse, grad_out, grad_alpha, params, needs)
        -> {name: gradient or None} for every name of SCORE_INPUTS[score]

`score` is "gat", "gatv2" or "dot"; `arrays` is a dict holding, under the names
of SCORE_INPUTS[score], the inputs in these shapes (None for an absent
optional edge term):

    "gat":   a_src [num_src, H, 1], a_dst [num_dst, H, 1], a_edge [E, H, 1] | None,
             v [num_src, H, C]   (the per-node logits carry a trailing axis of 1)
    "gatv2": xl [num_src, H, C], xr [num_dst, H, C], att [H, C], xe [E, H, C] | None
    "dot":   q [num_dst, H, C], k [num_src, H, C], v [num_src, H, C], ee [E, H, C] | None

(xl may be the same array as xr.) Every score may also hold "bias" [H, C] (or
None): the forward then also returns out_b = out + bias, written in the same
store (the fourth result, else None); the backward reads `out`, the
attention output without the bias; the bias gradient is the column sum of
grad_out. `params` is an `AttentionParams`
(negative_slope, scale: the value to use, 1/sqrt(C) already filled in for
"dot", drop, deterministic: False allows float atomics in the backward, which
a backend may ignore). `need_alpha` asks for alpha[e, h] = p[e, h] (before dropout).
Backward: `out` and `lse` are the forward's; grad_out [num_dst, H, C] or None
(zero), grad_alpha [E, H] or None (zero); `needs` maps every name of
SCORE_INPUTS[score] to whether its gradient is wanted (False for absent
inputs). Each wanted gradient is returned in its input's backend shape and in
vtype, fully written (0 for nodes without edges); the others are None. The
reference semantics are the formulas above: D from `out` (not recomputed),
no float atomics unless params.deterministic is False (bitwise repeatable), grad_att summed from per-chunk
partials in a fixed order. Accumulate in float32 (float64 for float64).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import blocksparse as _tc
from .._array import as_backend_array, backend_vtype, check_deterministic, is_cupy, same_device
from ..backends import backend_for
from ..backends.attention_spec import (OPTIONAL_INPUTS, SCORE_INPUTS, SCORES, AttentionParams,
                                       DropoutSpec, dropout_spec)
from ..graph import as_graph


# ------------------------------------------------------------------ shared
def _backend(x, name):
    """The backend function `name` for arrays like x (NotImplementedError if
    that backend does not provide it yet)."""
    be = backend_for(x)
    fn = getattr(be, name, None)
    if fn is None:
        raise NotImplementedError(f"the {be.__name__.split('.')[2].upper()} backend has "
                                  f"no {name} yet")
    return fn


def _check_device(graph, a, name):
    if not same_device(a, graph.indices):
        raise ValueError(f"{name} lives on {'GPU' if is_cupy(a) else 'CPU'} but the graph on "
                         f"{graph.device}; move one of them (Graph.to(device))")


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
    vt = backend_vtype(a, vtype, name)
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


# ---------------------------------------------------------- edge_attention
_ALL_INPUTS = ("a_src", "a_dst", "a_edge", "v", "xl", "xr", "att", "xe", "q", "k", "ee", "bias")


@dataclass
class AttentionResiduals:
    """What `edge_attention_bwd` needs: the inputs (references, not copies),
    the output (a reference: do not modify it in place before the backward;
    the torch adapter saves it so autograd's version check would catch that)
    and the per-(target, head) log-sum-exp. Nothing per edge."""
    score: str
    arrays: dict             # inputs in the backend's shapes (see module docstring)
    shapes: dict             # the caller's shape of each given input
    out: object              # [num_dst, H, C], the attention output (without any bias)
    lse: object              # [num_dst, H] float32/float64
    params: AttentionParams
    vtype: str
    num_src: int
    num_dst: int
    num_edges: int
    tensor_cores: bool = False   # the forward ran the Tensor Core kernels (fastgnn.blocksparse)


def _shape_specs(score, graph, heads, channels):
    """{name: (expected shape, its description)} in the caller's terms."""
    ns, nd, E, H, C = graph.num_src, graph.num_dst, graph.num_edges, heads, channels
    bias = {"bias": ((H, C), "[heads, C] (or [heads * C])")}
    if score == "gat":
        return {"a_src": ((ns, H), "[num_src, heads]"), "a_dst": ((nd, H), "[num_dst, heads]"),
                "a_edge": ((E, H), "[E, heads]"), "v": ((ns, H, C), "[num_src, heads, C]"),
                **bias}
    if score == "gatv2":
        return {"xl": ((ns, H, C), "[num_src, heads, C]"),
                "xr": ((nd, H, C), "[num_dst, heads, C]"),
                "att": ((H, C), "[heads, C] (or [1, heads, C])"),
                "xe": ((E, H, C), "[E, heads, C]"), **bias}
    return {"q": ((nd, H, C), "[num_dst, heads, C]"), "k": ((ns, H, C), "[num_src, heads, C]"),
            "v": ((ns, H, C), "[num_src, heads, C]"), "ee": ((E, H, C), "[E, heads, C]"),
            **bias}


_ANCHOR = {"gat": "v", "gatv2": "xl", "dot": "q"}   # the input that fixes H, C and the dtype


def _validate_inputs(graph, score, given, vtype):
    """(arrays in the backend's shapes, the caller's shapes, vtype, H, C)."""
    if not isinstance(score, str) or score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    names = SCORE_INPUTS[score]
    stray = [n for n, a in given.items() if a is not None and n not in names]
    if stray:
        raise ValueError(f"score={score!r} takes {', '.join(names)}; got {', '.join(stray)} "
                         f"(inputs of another score function)")
    missing = [n for n in names if n not in OPTIONAL_INPUTS and given.get(n) is None]
    if missing:
        optional = [n for n in names if n in OPTIONAL_INPUTS]
        raise TypeError(f"edge_attention(score={score!r}) needs {', '.join(missing)} "
                        f"(inputs: {', '.join(names)}; {' and '.join(optional)} are optional)")
    arrays = {n: as_backend_array(given.get(n), n) for n in names}
    anchor_name = _ANCHOR[score]
    anchor = arrays[anchor_name]
    if anchor.ndim != 3 or anchor.shape[1] < 1 or anchor.shape[2] < 1:
        raise ValueError(f"{anchor_name} must have shape [nodes, heads, C] with heads, C >= 1, "
                         f"got {tuple(anchor.shape)}")
    H, C = int(anchor.shape[1]), int(anchor.shape[2])
    vt = backend_vtype(anchor, vtype, anchor_name)
    specs = _shape_specs(score, graph, H, C)
    shapes = {}
    xp = graph.xp
    for n in names:
        a = arrays[n]
        if a is None:
            continue
        want, desc = specs[n]
        shape = tuple(a.shape)
        ok = (shape == want or (n == "att" and shape == (1,) + want)
              or (n == "bias" and shape == (H * C,)))
        if not ok:
            raise ValueError(f"{n} must have shape {desc} = {list(want)}, got {shape}"
                             + (f" (heads and C come from {anchor_name})" if n != anchor_name
                                else ""))
        _check_device(graph, a, n)
        backend_vtype(a, vtype, n)
        if a.dtype != anchor.dtype:
            raise TypeError(f"{n} has dtype {a.dtype} but {anchor_name} has {anchor.dtype}; "
                            "all inputs must share one dtype")
        shapes[n] = shape
        a = xp.ascontiguousarray(a)
        if n in ("att", "bias"):
            a = a.reshape(H, C)
        elif score == "gat" and n != "v":
            a = a.reshape(shape + (1,))
        arrays[n] = a
    return arrays, shapes, vt, H, C


def _attention_params(score, negative_slope, scale, channels, dropout, seed, offset,
                      deterministic=True, mma_scores=True):
    check_deterministic(deterministic)
    if isinstance(negative_slope, (bool, np.bool_)) or not isinstance(
            negative_slope, (int, float, np.number)) or not math.isfinite(negative_slope):
        raise TypeError(f"negative_slope must be a finite float, got {negative_slope!r}")
    if score == "dot":
        if scale is None:
            scale = 1.0 / math.sqrt(channels)
        elif isinstance(scale, (bool, np.bool_)) or not isinstance(
                scale, (int, float, np.number)) or not math.isfinite(scale):
            raise TypeError(f"scale must be a finite float, got {scale!r}")
    elif scale is not None:
        raise ValueError(f"scale applies to score='dot' only, got scale={scale!r} with "
                         f"score={score!r}")
    else:
        scale = 1.0
    return AttentionParams(float(negative_slope), float(scale),
                           dropout_spec(dropout, seed, offset), bool(deterministic),
                           bool(mma_scores))


def edge_attention_fwd(graph, score, *, a_src=None, a_dst=None, a_edge=None, v=None, xl=None,
                       xr=None, att=None, xe=None, q=None, k=None, ee=None, bias=None,
                       negative_slope=0.2, scale=None, dropout=0.0, seed=0, offset=0,
                       return_attention_weights=False, vtype=None, deterministic=True,
                       tensor_cores="auto", tf32=False):
    """Forward of `edge_attention`; returns (out or (out, alpha), AttentionResiduals)."""
    graph = as_graph(graph)
    given = {"a_src": a_src, "a_dst": a_dst, "a_edge": a_edge, "v": v, "xl": xl, "xr": xr,
             "att": att, "xe": xe, "q": q, "k": k, "ee": ee, "bias": bias}
    arrays, shapes, vt, H, C = _validate_inputs(graph, score, given, vtype)
    params = _attention_params(score, negative_slope, scale, C, dropout, seed, offset,
                               deterministic, mma_scores=tensor_cores is not False)
    anchor = arrays[_ANCHOR[score]]
    tc = _tc.attention_path(graph, score, arrays, params, bool(return_attention_weights), vt,
                            tensor_cores, tf32=_tc.check_tf32(tf32))
    if tc:
        out, lse, out_b = _tc.attention_fwd(graph, arrays, params, vt)
        alpha = None
    else:
        out, lse, alpha, out_b = _backend(anchor, "edge_attention_fwd")(
            graph, score, arrays, params, bool(return_attention_weights))
    # the residuals keep the attention output itself; with a bias the caller
    # gets a separate out + bias, free to edit in place
    res = AttentionResiduals(score, arrays, shapes, out, lse, params, vt, graph.num_src,
                             graph.num_dst, graph.num_edges, tc)
    ret = out if out_b is None else out_b
    return ((ret, alpha) if return_attention_weights else ret), res


def edge_attention_bwd(graph, res: AttentionResiduals, grad_out, grad_alpha=None, *, needs=None):
    """Backward of `edge_attention`: one gradient per input of the score, in
    SCORE_INPUTS[score] order ("gat": a_src, a_dst, a_edge, v, bias; "gatv2":
    xl, xr, att, xe, bias; "dot": q, k, v, ee, bias), each in its input's
    shape and dtype, or None for an input not given or not in `needs`.

    grad_out:   [num_dst, H, C] cotangent of out (None: zero).
    grad_alpha: [E, H] cotangent of the returned attention weights (None: zero).
    needs:      names of the inputs whose gradient is wanted (default: all given).
    """
    graph = as_graph(graph)
    if (graph.num_src, graph.num_dst, graph.num_edges) != (res.num_src, res.num_dst,
                                                           res.num_edges):
        raise ValueError("edge_attention_bwd: the residuals come from a different graph")
    names = SCORE_INPUTS[res.score]
    if needs is None:
        needs = {n: res.arrays[n] is not None for n in names}
    else:
        needs = set([needs] if isinstance(needs, str) else needs)
        bad = sorted(needs - set(names))
        if bad:
            raise ValueError(f"needs names {bad}, which are not inputs of score="
                             f"{res.score!r} ({', '.join(names)})")
        needs = {n: n in needs and res.arrays[n] is not None for n in names}
    H, C = res.out.shape[1], res.out.shape[2]
    g = ga = None
    if grad_out is not None:
        g = as_backend_array(grad_out, "grad_out")
        if tuple(g.shape) != (graph.num_dst, H, C):
            raise ValueError(f"grad_out must have shape [num_dst, heads, C] = "
                             f"{[graph.num_dst, H, C]}, got {tuple(g.shape)}")
        _check_device(graph, g, "grad_out")
        backend_vtype(g, res.vtype, "grad_out")
        g = graph.xp.ascontiguousarray(g, dtype=res.out.dtype)
    if grad_alpha is not None:
        ga = as_backend_array(grad_alpha, "grad_alpha")
        if tuple(ga.shape) != (graph.num_edges, H):
            raise ValueError(f"grad_alpha must have shape [E, heads] = {[graph.num_edges, H]}, "
                             f"got {tuple(ga.shape)}")
        _check_device(graph, ga, "grad_alpha")
        backend_vtype(ga, res.vtype, "grad_alpha")
        ga = graph.xp.ascontiguousarray(ga, dtype=res.out.dtype)
    if not any(needs.values()):
        return tuple(None for _ in names)
    if (res.tensor_cores and ga is None
            and _tc.attention_backward_path(graph, res.score, res.arrays, res.params, res.vtype)):
        grads = _tc.attention_bwd(graph, res.arrays, res.out, res.lse, g, res.params, needs,
                                  res.vtype)
    else:
        grads = _backend(res.out, "edge_attention_bwd")(graph, res.score, res.arrays, res.out,
                                                         res.lse, g, ga, res.params, needs)
    return tuple(None if grads[n] is None else grads[n].reshape(res.shapes[n]) for n in names)


def edge_attention(graph, score, *, a_src=None, a_dst=None, a_edge=None, v=None, xl=None,
                   xr=None, att=None, xe=None, q=None, k=None, ee=None, bias=None,
                   negative_slope=0.2,
                   scale=None, dropout=0.0, seed=0, offset=0, return_attention_weights=False,
                   vtype=None, deterministic=True, tensor_cores="auto", tf32=False):
    """Fused edge attention over each target's in-edges (see the module
    docstring for the math and the gradients). Per head h, for edges
    e = (j -> i):

        out[i, h] = sum_{e in N(i)} softmax_{N(i)}(s)_e z_e m_e[h]

    score="gat" (GATConv; the layer computes the per-node logits
        a_src = <x_src, att_src>, a_dst = <x_dst, att_dst>, a_edge = <e, att_edge>):
        a_src:  [num_src, H]       a_dst: [num_dst, H]      a_edge: [E, H] optional
        v:      [num_src, H, C]    messages
        s_e = LeakyReLU(a_src[j] + a_dst[i] + a_edge[e]),  m_e = v[j]
    score="gatv2" (GATv2Conv):
        xl:     [num_src, H, C]    W_l x (the message too)
        xr:     [num_dst, H, C]    W_r x
        att:    [H, C] or [1, H, C]
        xe:     [E, H, C] optional, the caller's projected edge features W_e e.
                Passing it is itself an E x H x C tensor; fusing the edge
                projection into the kernel (reading e [E, D] and W_e) is future work.
        s_e = sum_c att[h, c] LeakyReLU(xl[j] + xr[i] + xe[e])[c],  m_e = xl[j]
    score="dot" (TransformerConv):
        q:      [num_dst, H, C]    k, v: [num_src, H, C]    ee: [E, H, C] optional
        s_e = scale <q[i], k[j] + ee[e]>,  m_e = v[j] + ee[e]

    bias:     [H, C] or [H * C] optional, added to every output row in the
              kernel's store (out[i, h] += bias[h], targets without in-edges
              get it too): a layer's output bias with no pass of its own
              (the kernel stores each row with and without it; the backward
              reads the one without, the caller gets the other and may edit
              it in place). Its gradient is the column sum of grad_out.
    negative_slope: LeakyReLU slope ("gat", "gatv2"; default 0.2).
    scale:    "dot" only; default 1/sqrt(C).
    dropout:  probability p in [0, 1) of dropping an attention weight (kept
              ones scaled by 1/(1-p)); seed/offset drive the counter-based
              generator (`fastgnn.rng`; weight (e, h) uses counter
              offset + e*H + h): no mask is stored, same mask in backward.
    return_attention_weights: also return alpha [E, H] (the softmax weights,
              before dropout) in the caller's edge order.
    deterministic: True (default): the backward uses no float atomics and is
              bitwise repeatable. False (GPU only; the CPU backend ignores it
              and stays deterministic): for "gatv2", where that is faster,
              the backward's pass over the targets also adds the
              source-side gradient (of xl) with float atomics and the pass
              over the cached transpose is skipped: faster, but the sums'
              order, so their last bits, vary. "gat" and "dot" keep the
              deterministic passes (faster for them), and so does 16-bit
              "gatv2" where its backward scores on Tensor Cores (see
              tensor_cores; faster than the atomic one).
    tensor_cores: "auto" (default), True or False: the block-sparse Tensor
              Core kernels (`fastgnn.blocksparse`: score="dot" with bf16/fp16
              inputs, or fp32 with tf32=True; no edge term, dropout or returned weights, no duplicate
              edges) where its fill rule says they are faster on this graph;
              True forces them (ValueError where they cannot serve the
              call), False keeps the CUDA-core kernels. Apart from those,
              the 16-bit "gatv2" forward and its backward's pass over the
              targets score on Tensor Cores where its heads fill a warp (no
              edge term, heads of 32 channels, a multiple of 4 heads,
              16-byte aligned rows; exact products, fp32 sums) unless
              tensor_cores=False. Results agree to the dtype's tolerance.
    tf32:     False (default) or True: let fp32 inputs take the Tensor Core
              kernels as TF32 (q, k, v and the probabilities rounded to 10
              mantissa bits in the products, fp32 softmax and sums; relative
              error about 2^-11 per product, as a 16-bit float's).
    Per-edge inputs and outputs are in the caller's edge order. Targets
    without in-edges get 0. Returns out [num_dst, H, C] (and alpha) in the
    inputs' dtype; nothing of size E x H x C is allocated.
    """
    out, _ = edge_attention_fwd(graph, score, a_src=a_src, a_dst=a_dst, a_edge=a_edge, v=v,
                                xl=xl, xr=xr, att=att, xe=xe, q=q, k=k, ee=ee, bias=bias,
                                negative_slope=negative_slope, scale=scale, dropout=dropout,
                                seed=seed, offset=offset,
                                return_attention_weights=return_attention_weights, vtype=vtype,
                                deterministic=deterministic, tensor_cores=tensor_cores,
                                tf32=tf32)
    return out
