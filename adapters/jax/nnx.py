"""Thin Flax NNX modules over the functional layers of `fastgnn.jax.nn`
(importable only where flax is installed).

Each module holds the arrays of its layer's `init` as `nnx.Param`s and calls
the layer function with them: `GCNConv`, `SAGEConv`, `GINConv`, `GATConv`,
`GATv2Conv`, `TransformerConv`. Attention dropout draws its seed from the
`dropout` stream of the module's `rngs` on every call unless the module is
deterministic (`model.eval()` / `nnx.Module.set_attributes(deterministic=True)`).

    model = GATConv(16, 8, heads=4, dropout=0.2, rngs=nnx.Rngs(0))
    out = model(graph, x)                         # [num_dst, 32]
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from fastgnn.backends.attention_spec import dropout_spec

from . import nn

__all__ = ["GCNConv", "SAGEConv", "GINConv", "GATConv", "GATv2Conv", "TransformerConv"]


class _Layer(nnx.Module):
    """params from `init(key, in_dim, out_dim, **init_kw)`; each call runs
    `fn(params, graph, x, **call_kw)` (plus dropout and a fresh seed)."""
    init = staticmethod(lambda key, in_dim, out_dim: {})
    fn = staticmethod(lambda params, graph, x: x)
    init_keys = ()          # constructor keywords that go to `init`
    call_keys = ()          # constructor keywords that go to `fn`
    drops = False           # whether `fn` takes dropout/seed

    def __init__(self, in_dim, out_dim, *, rngs: nnx.Rngs, dropout=0.0, **kw):
        unknown = sorted(set(kw) - set(self.init_keys) - set(self.call_keys))
        if unknown or (dropout and not self.drops):
            raise TypeError(f"{type(self).__name__} takes no {unknown or ['dropout']}")
        params = self.init(rngs.params(), in_dim, out_dim,
                           **{k: v for k, v in kw.items() if k in self.init_keys})
        self.names = tuple(params)
        for k, v in params.items():
            setattr(self, k, nnx.Param(v))
        self.call_kw = tuple((k, v) for k, v in kw.items() if k in self.call_keys)
        self.dropout = dropout_spec(dropout, 0, 0).p
        self.deterministic = False
        self.rngs = rngs

    def __call__(self, graph, x):
        params = {k: getattr(self, k)[...] for k in self.names}
        kw = dict(self.call_kw)
        if self.dropout and not self.deterministic:
            kw.update(dropout=self.dropout,
                      seed=jax.random.bits(self.rngs.dropout(), dtype=jnp.uint32))
        return type(self).fn(params, graph, x, **kw)


def _module(name, init, fn, init_keys=(), call_keys=(), drops=False):
    return type(name, (_Layer,), {
        "init": staticmethod(init), "fn": staticmethod(fn), "init_keys": init_keys,
        "call_keys": call_keys, "drops": drops,
        "__doc__": f"Flax NNX module over fastgnn.jax.nn.{fn.__name__}: "
                   f"{name}(in_dim, out_dim, *, rngs, "
                   f"{', '.join(dict.fromkeys(init_keys + call_keys))}"
                   f"{', dropout' if drops else ''})."})


_ATT_CALL = ("concat", "negative_slope", "add_self_loops")
GCNConv = _module("GCNConv", nn.gcn_init, nn.gcn, (), ("add_self_loops", "improved"))
SAGEConv = _module("SAGEConv", nn.sage_init, nn.sage, (), ("aggr",))
GINConv = _module("GINConv", nn.gin_init, nn.gin, ("hidden",))
GATConv = _module("GATConv", nn.gat_init, nn.gat, ("heads", "concat"), _ATT_CALL, True)
GATv2Conv = _module("GATv2Conv", nn.gatv2_init, nn.gatv2, ("heads", "concat", "share_weights"),
                    _ATT_CALL, True)
TransformerConv = _module("TransformerConv", nn.transformer_init, nn.transformer,
                          ("heads", "concat"), ("heads", "concat"), True)
