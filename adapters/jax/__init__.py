"""fastgnn for JAX: the kernels as differentiable, jit-able JAX functions.

    import jax, jax.numpy as jnp
    import fastgnn.jax as fj

    graph = fj.Graph.from_edge_index(edge_index)          # once, on the host
    out = jax.jit(fj.spmm, static_argnames="reduce")(graph, x, reduce="mean")

Functions: `spmm`, `gcn_norm`, `segment_reduce`, `edge_softmax`,
`edge_attention` (fastgnn.jax.ops), all driven by one `jax.custom_vjp`
bridge over the core's forward/backward pairs (fastgnn.jax._bridge: how
they run, residuals, vmap). Layers as plain functions of (params, graph, x)
with `init` functions: `fastgnn.jax.nn`; thin Flax NNX modules over them
(where flax is installed): `fastgnn.jax.nnx`.

Arguments are checked when a call is traced (the core's checks): a bad one
raises a TypeError / ValueError naming it at the call, eagerly and under
`jax.jit` alike.

The kernels run as buffer callbacks on XLA's own buffers: the CUDA kernels
on XLA's stream on a GPU, the Numba kernels on the CPU. Value types:
float32, float64 with `jax_enable_x64`, and bfloat16 / float16 on the GPU.
"""
from ._graph import Graph
from .ops import edge_attention, edge_softmax, gcn_norm, segment_reduce, spmm
from . import nn

__all__ = ["Graph", "spmm", "gcn_norm", "segment_reduce", "edge_softmax", "edge_attention",
           "nn"]
