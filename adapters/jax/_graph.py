"""The graph argument of every `fastgnn.jax` function.

A `Graph` wraps one `fastgnn.Graph` (CSR by destination, built on the host
from NumPy or JAX arrays, validated by the core) together with the caches the
kernels fill on it (the transpose, degree scales, plans). It is registered as
a pytree with no leaves whose auxiliary data is the graph itself, and it
hashes and compares by identity, so

- it may be passed to a `jax.jit`ted function as an ordinary argument (it
  traces to nothing: no array is transferred or rebuilt per call) or as a
  static argument (`static_argnums`), or be closed over;
- a jitted function compiles once per graph object and reuses that program
  for every later call with the same object.

Build graphs outside `jax.jit`: the structure must be concrete on the host.
"""
from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp

from fastgnn.graph import Graph as CoreGraph

__all__ = ["Graph"]


def _host(a, name):
    """A JAX or NumPy array as a NumPy array (a copy off the device)."""
    if a is None:
        return None
    if isinstance(a, jax.core.Tracer):
        raise TypeError(f"{name} is a traced value; build the fastgnn.jax Graph outside "
                        "jax.jit / jax.grad (its structure must be known on the host)")
    return np.asarray(a)


class Graph:
    """A fastgnn graph for JAX: built once on the host, passed to jitted code
    as a leafless pytree (or a static argument), hashed by identity.

    Graph.from_edge_index(edge_index, num_nodes=None, *, num_src=None, num_dst=None)
    Graph.from_csr(indptr, indices, num_src=None)
    Graph(core) wraps an existing fastgnn.Graph.
    """

    __slots__ = ("core", "__weakref__")

    def __init__(self, core: CoreGraph):
        if not isinstance(core, CoreGraph):
            raise TypeError(f"Graph wraps a fastgnn.Graph, got {type(core).__name__}; use "
                            "Graph.from_edge_index or Graph.from_csr")
        self.core = core

    @classmethod
    def from_edge_index(cls, edge_index, num_nodes=None, *, num_src=None, num_dst=None):
        """From an edge index [2, E] (row 0 sources, row 1 targets; NumPy or JAX)."""
        return cls.of(CoreGraph.from_edge_index(_host(edge_index, "edge_index"), num_nodes,
                                                num_src=num_src, num_dst=num_dst))

    @classmethod
    def from_csr(cls, indptr, indices, num_src=None):
        """From CSR-by-destination arrays (edge ids are CSR positions)."""
        return cls.of(CoreGraph.from_csr(_host(indptr, "indptr"), _host(indices, "indices"),
                                         num_src))

    @classmethod
    def of(cls, core: CoreGraph) -> "Graph":
        """The one JAX graph of a core graph (cached on it, so the identity,
        hence jit's cache entry, is stable)."""
        return core.cached(("fastgnn.jax", "graph"), lambda: cls(core))

    @property
    def num_src(self) -> int:
        return self.core.num_src

    @property
    def num_dst(self) -> int:
        return self.core.num_dst

    @property
    def num_nodes(self) -> int:
        if self.core.num_src != self.core.num_dst:
            raise ValueError("a bipartite graph has num_src and num_dst, not num_nodes")
        return self.core.num_dst

    @property
    def num_edges(self) -> int:
        return self.core.num_edges

    @property
    def edge_index(self):
        """[2, E] int32 JAX array in the caller's edge order (a constant)."""
        ei = self.core.cached(("fastgnn.jax", "edge_index"),
                              lambda: self.core.edge_index().astype(np.int32))
        return jnp.asarray(ei)          # cached on the host: never a tracer kept across calls

    def with_self_loops(self) -> "Graph":
        """The graph with existing self-loops removed and one loop per node
        added (original edges first, in their order; then loops of nodes
        0..n-1), as GAT-style layers use. Cached. Needs num_dst <= num_src."""
        if self.num_dst > self.num_src:
            raise ValueError(f"with_self_loops needs num_dst <= num_src (a loop i -> i for "
                             f"every target i), got num_src={self.num_src}, "
                             f"num_dst={self.num_dst}")
        from fastgnn.ops.spmm import self_loop_structure
        return Graph.of(self_loop_structure(self.core)[0])

    def __repr__(self):
        return f"fastgnn.jax.{self.core!r}"

    # identity semantics (object's __eq__ / __hash__): one graph, one jit entry


jax.tree_util.register_pytree_node(Graph, lambda g: ((), g), lambda g, _: g)
