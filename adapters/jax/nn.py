"""GNN layers as small framework-neutral functions of (params, graph, x).

Each layer is a pair: `<layer>_init(key, in_dim, out_dim, ...) -> params` (a
dict of JAX arrays: a pytree any optimiser or module system can hold) and
`<layer>(params, graph, x, ...) -> [num_dst, out]`. The aggregation runs in
fastgnn's kernels (fastgnn.jax.ops); the dense projections are plain JAX.
Shapes and semantics follow the PyG layers of the same name:

    gcn        GCNConv:   D^-1/2 (A + I) D^-1/2 x W + b
    sage       SAGEConv:  aggr_{j in N(i)} x_j W_l + b + x_i W_r   (aggr "mean" or "max")
    gin        GINConv:   MLP((1 + eps) x_i + sum_{j in N(i)} x_j)  (a 2-layer ReLU MLP)
    gat        GATConv    (heads, concat or mean over heads, self-loops, attention dropout)
    gatv2      GATv2Conv  (shared or separate source/target projections)
    transformer TransformerConv (dot-product attention, root weight)

Attention dropout takes a `seed` (int or integer scalar array, may be traced).
The inits check their sizes, the layers their graph, x (floating point,
[num_src, in_dim] with in_dim from params) and options at entry, with a
TypeError / ValueError naming the argument.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from fastgnn.ops.spmm import validate_features

from ._bridge import as_array, stand_in
from ._graph import Graph
from .ops import edge_attention, gcn_norm, segment_reduce, spmm

__all__ = ["glorot", "gcn_init", "gcn", "sage_init", "sage", "gin_init", "gin", "gat_init", "gat",
           "gatv2_init", "gatv2", "transformer_init", "transformer"]


def glorot(key, shape, dtype=jnp.float32):
    """Glorot-uniform weights of `shape` (fan in and out from the last two axes)."""
    fan_in, fan_out = shape[-2] if len(shape) > 1 else 1, shape[-1]
    a = math.sqrt(6.0 / (fan_in + fan_out))
    return jax.random.uniform(key, shape, dtype, -a, a)


def _dst(graph, x):
    return x[:graph.num_dst]


def _positive(**sizes):
    """Each size a positive int (TypeError / ValueError naming it)."""
    for name, v in sizes.items():
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be a positive int, got {type(v).__name__} {v!r}")
        if v < 1:
            raise ValueError(f"{name} must be a positive int, got {v}")


def _inputs(layer, params, weight, graph, x):
    """A layer's graph and x checked at its entry; returns x as a JAX array.
    x is the source features [num_src, in_dim] (in_dim: the rows of
    params[weight]), floating point (the core's checks); the targets'
    features are its first num_dst rows, so num_dst <= num_src."""
    if not isinstance(graph, Graph):
        raise TypeError(f"{layer}: graph must be a fastgnn.jax.Graph, got "
                        f"{type(graph).__name__}; build one with "
                        "fastgnn.jax.Graph.from_edge_index(edge_index)")
    if graph.num_dst > graph.num_src:
        raise ValueError(f"{layer}: the graph has {graph.num_dst} targets but only "
                         f"{graph.num_src} sources; the targets' features are x's first "
                         "num_dst rows, so a layer needs num_dst <= num_src")
    x = as_array(x, "x")
    validate_features(graph.core, stand_in(x), None)
    in_dim = params[weight].shape[0]
    if x.shape[1] != in_dim:
        raise ValueError(f"{layer}: x must have shape [num_src, in_dim] = "
                         f"[{graph.num_src}, {in_dim}] (in_dim: the rows of "
                         f"params[{weight!r}]), got {tuple(x.shape)}")
    return x


# ---------------------------------------------------------------- GCN
def gcn_init(key, in_dim, out_dim, dtype=jnp.float32):
    _positive(in_dim=in_dim, out_dim=out_dim)
    return {"weight": glorot(key, (in_dim, out_dim), dtype), "bias": jnp.zeros(out_dim, dtype)}


def gcn(params, graph, x, *, add_self_loops=True, improved=False):
    """GCNConv: the normalised graph is built once per graph and cached."""
    x = _inputs("gcn", params, "weight", graph, x)
    g2, w = gcn_norm(graph, add_self_loops=add_self_loops, improved=improved)
    h = x @ params["weight"]
    return spmm(g2, h, w.astype(h.dtype), bias=params["bias"])


# --------------------------------------------------------------- SAGE
def sage_init(key, in_dim, out_dim, dtype=jnp.float32):
    _positive(in_dim=in_dim, out_dim=out_dim)
    k1, k2 = jax.random.split(key)
    return {"lin_l": glorot(k1, (in_dim, out_dim), dtype), "bias": jnp.zeros(out_dim, dtype),
            "lin_r": glorot(k2, (in_dim, out_dim), dtype)}


def sage(params, graph, x, *, aggr="mean"):
    """SAGEConv with aggr "mean" (a fused mean SpMM) or "max" (segment max;
    nodes without in-edges aggregate to 0)."""
    x = _inputs("sage", params, "lin_l", graph, x)
    if aggr == "mean":
        agg = spmm(graph, x, reduce="mean")
    elif aggr == "max":
        agg = segment_reduce(graph, x, "max")
    else:
        raise ValueError(f"aggr must be 'mean' or 'max', got {aggr!r}")
    return agg @ params["lin_l"] + params["bias"] + _dst(graph, x) @ params["lin_r"]


# ---------------------------------------------------------------- GIN
def gin_init(key, in_dim, out_dim, hidden=None, dtype=jnp.float32):
    hidden = out_dim if hidden is None else hidden
    _positive(in_dim=in_dim, out_dim=out_dim, hidden=hidden)
    k1, k2 = jax.random.split(key)
    return {"w1": glorot(k1, (in_dim, hidden), dtype), "b1": jnp.zeros(hidden, dtype),
            "w2": glorot(k2, (hidden, out_dim), dtype), "b2": jnp.zeros(out_dim, dtype),
            "eps": jnp.zeros((), dtype)}


def gin(params, graph, x):
    """GINConv with a learnable eps (params["eps"]; keep it fixed by not
    updating it) and the MLP Linear-ReLU-Linear."""
    x = _inputs("gin", params, "w1", graph, x)
    h = (1 + params["eps"]) * _dst(graph, x) + spmm(graph, x)
    h = jax.nn.relu(h @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


# ---------------------------------------------------------------- GAT
def gat_init(key, in_dim, out_dim, heads=1, *, concat=True, dtype=jnp.float32):
    _positive(in_dim=in_dim, out_dim=out_dim, heads=heads)
    k1, k2, k3 = jax.random.split(key, 3)
    return {"weight": glorot(k1, (in_dim, heads * out_dim), dtype),
            "att_src": glorot(k2, (heads, out_dim), dtype),
            "att_dst": glorot(k3, (heads, out_dim), dtype),
            "bias": jnp.zeros(heads * out_dim if concat else out_dim, dtype)}


def _heads_out(out, bias, concat):
    n, h, c = out.shape
    out = out.reshape(n, h * c) if concat else out.mean(axis=1)
    return out + bias


def gat(params, graph, x, *, concat=True, negative_slope=0.2, dropout=0.0, seed=0,
        add_self_loops=True):
    """GATConv: heads and channels come from params["att_src"] [H, C]."""
    x = _inputs("gat", params, "weight", graph, x)
    H, C = params["att_src"].shape
    g = graph.with_self_loops() if add_self_loops else graph
    h = (x @ params["weight"]).reshape(-1, H, C)
    a_src = (h * params["att_src"]).sum(-1)
    a_dst = (_dst(g, h) * params["att_dst"]).sum(-1)
    out = edge_attention(g, "gat", a_src=a_src, a_dst=a_dst, v=h,
                         negative_slope=negative_slope, dropout=dropout, seed=seed)
    return _heads_out(out, params["bias"], concat)


# -------------------------------------------------------------- GATv2
def gatv2_init(key, in_dim, out_dim, heads=1, *, concat=True, share_weights=False,
               dtype=jnp.float32):
    _positive(in_dim=in_dim, out_dim=out_dim, heads=heads)
    k1, k2, k3 = jax.random.split(key, 3)
    p = {"lin_l": glorot(k1, (in_dim, heads * out_dim), dtype),
         "att": glorot(k3, (heads, out_dim), dtype),
         "bias": jnp.zeros(heads * out_dim if concat else out_dim, dtype)}
    if not share_weights:
        p["lin_r"] = glorot(k2, (in_dim, heads * out_dim), dtype)
    return p


def gatv2(params, graph, x, *, concat=True, negative_slope=0.2, dropout=0.0, seed=0,
          add_self_loops=True):
    """GATv2Conv (lin_r absent: shared weights)."""
    x = _inputs("gatv2", params, "lin_l", graph, x)
    H, C = params["att"].shape
    g = graph.with_self_loops() if add_self_loops else graph
    xl = (x @ params["lin_l"]).reshape(-1, H, C)
    xr = xl if "lin_r" not in params else (x @ params["lin_r"]).reshape(-1, H, C)
    out = edge_attention(g, "gatv2", xl=xl, xr=_dst(g, xr), att=params["att"],
                         negative_slope=negative_slope, dropout=dropout, seed=seed)
    return _heads_out(out, params["bias"], concat)


# -------------------------------------------------------- Transformer
def transformer_init(key, in_dim, out_dim, heads=1, *, concat=True, dtype=jnp.float32):
    _positive(in_dim=in_dim, out_dim=out_dim, heads=heads)
    ks = jax.random.split(key, 4)
    width = heads * out_dim
    p = {n: glorot(k, (in_dim, width), dtype) for n, k in zip(("query", "key", "value"), ks)}
    p.update({f"{n}_bias": jnp.zeros(width, dtype) for n in ("query", "key", "value")})
    p["root"] = glorot(ks[3], (in_dim, width if concat else out_dim), dtype)
    p["bias"] = jnp.zeros(width if concat else out_dim, dtype)
    return p


def transformer(params, graph, x, *, heads=1, concat=True, dropout=0.0, seed=0):
    """TransformerConv with a root weight: softmax(<q_i, k_j> / sqrt(C)) v_j
    summed over in-edges, plus x_i W_root + b (heads as given to the init)."""
    x = _inputs("transformer", params, "query", graph, x)
    _positive(heads=heads)
    width = params["query"].shape[1]
    if width % heads:
        raise ValueError(f"transformer: heads={heads} does not divide params['query']'s width "
                         f"{width} (heads * out_dim); pass the heads given to transformer_init")
    H = heads

    def proj(n, rows):
        return (rows @ params[n] + params[f"{n}_bias"]).reshape(rows.shape[0], H, -1)
    q = proj("query", _dst(graph, x))
    k, v = proj("key", x), proj("value", x)
    out = edge_attention(graph, "dot", q=q, k=k, v=v, dropout=dropout, seed=seed)
    n, h, c = out.shape
    out = out.reshape(n, h * c) if concat else out.mean(axis=1)
    return out + _dst(graph, x) @ params["root"] + params["bias"]
