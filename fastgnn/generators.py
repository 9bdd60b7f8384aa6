"""Seeded graph generators for tests and benchmarks.

Every generator returns `(edge_index, num_nodes)`: an int64 `[2, E]` edge
index (row 0 = sources, row 1 = targets) in the array namespace `xp` (NumPy,
or CuPy to build large graphs on the GPU), plus the node count. The same seed
gives the same graph on the same namespace; NumPy and CuPy draw from
different random streams, so a seed does not give the same graph on both.

    rmat(scale, edge_factor=16)          power-law (R-MAT a=0.57, b=c=0.19)
    uniform(scale, edge_factor=16)       Erdos-Renyi-like, uniform endpoints
    clustered(num_nodes, block=64)       locally dense blocks + random long edges
    grid(side)                           2-D mesh, 4-neighbour, both directions

All generated graphs are deduplicated and have no self-loops. `load_npz`
reads a real graph from a `.npz` file (the heterophilous benchmark format
`edges` (E, 2), or the gnn-benchmark CSR format) and symmetrises it.
`graph_stats` summarises any edge index (n, E, in-degree max/mean).
"""
from __future__ import annotations

import os

import numpy as np

from .testing import rmat_edge_index

__all__ = ["rmat", "uniform", "clustered", "grid", "load_npz", "graph_stats",
           "dedup_edges", "symmetrise"]


def dedup_edges(src, dst, num_nodes, xp=np, self_loops=False):
    """Unique (src, dst) pairs sorted by (src, dst), self-loops dropped unless
    asked for. Returns an int64 [2, E] edge index."""
    src = src.astype(np.int64, copy=False)
    dst = dst.astype(np.int64, copy=False)
    if not self_loops:
        keep = src != dst
        src, dst = src[keep], dst[keep]
    key = xp.unique(src * num_nodes + dst)
    return xp.stack([key // num_nodes, key % num_nodes])


def symmetrise(edge_index, num_nodes, xp=np):
    """Both directions of every edge, deduplicated, without self-loops."""
    s, d = edge_index[0], edge_index[1]
    return dedup_edges(xp.concatenate([s, d]), xp.concatenate([d, s]), num_nodes, xp)


def rmat(scale, edge_factor=16, *, a=0.57, b=0.19, c=0.19, seed=0, xp=np):
    """R-MAT power-law graph: 2**scale nodes, about edge_factor * 2**scale
    directed edges before deduplication (scale 20: 16.08 M edges after)."""
    return rmat_edge_index(scale, edge_factor, a, b, c, seed=seed, dedup=True,
                           self_loops=False, xp=xp)


def uniform(scale, edge_factor=16, *, seed=0, xp=np):
    """2**scale nodes, edge_factor * 2**scale endpoints drawn uniformly
    (balanced in-degrees, no locality), deduplicated."""
    n = 1 << scale
    m = edge_factor * n
    rs = xp.random.RandomState(seed)
    src = rs.randint(0, n, size=m, dtype=np.int64)
    dst = rs.randint(0, n, size=m, dtype=np.int64)
    return dedup_edges(src, dst, n, xp), n


def clustered(num_nodes=262_144, block=64, random_per_node=2, *, seed=0, xp=np):
    """Locally dense graph: nodes in consecutive blocks of `block`; inside each
    block, block**2 / 2 ordered (i, j) pairs drawn with replacement become
    edges (about 39% of the pairs after deduplication); plus `random_per_node`
    edges into every node from uniformly random sources. Deduplicated, no
    self-loops. At the default size: 262,144 nodes, about 7.02 M edges."""
    if num_nodes % block:
        raise ValueError(f"num_nodes ({num_nodes}) must be a multiple of block ({block})")
    rs = xp.random.RandomState(seed)
    nblocks = num_nodes // block
    per_block = block * block // 2
    base = xp.repeat(xp.arange(nblocks, dtype=np.int64) * block, per_block)
    src_in = base + rs.randint(0, block, size=base.shape[0], dtype=np.int64)
    dst_in = base + rs.randint(0, block, size=base.shape[0], dtype=np.int64)
    dst_far = xp.repeat(xp.arange(num_nodes, dtype=np.int64), random_per_node)
    src_far = rs.randint(0, num_nodes, size=dst_far.shape[0], dtype=np.int64)
    ei = dedup_edges(xp.concatenate([src_in, src_far]), xp.concatenate([dst_in, dst_far]),
                     num_nodes, xp)
    return ei, num_nodes


def grid(side=1024, *, seed=0, xp=np):
    """2-D mesh of side x side nodes (row-major ids), each node joined to its
    4 neighbours in both directions: 4 * side * (side - 1) edges, max in-degree 4.
    Deterministic (`seed` is accepted for a uniform signature)."""
    n = side * side
    ids = xp.arange(n, dtype=np.int64).reshape(side, side)
    right = xp.stack([ids[:, :-1].ravel(), ids[:, 1:].ravel()])
    down = xp.stack([ids[:-1, :].ravel(), ids[1:, :].ravel()])
    one_way = xp.concatenate([right, down], axis=1)   # already unique, no loops
    return xp.concatenate([one_way, one_way[::-1]], axis=1), n


def load_npz(path, *, xp=np):
    """A real graph from an `.npz` file, symmetrised, deduplicated, no self-loops.

    Reads the heterophilous-benchmark format (`edges`: int (E, 2), 0-based;
    node count from `node_labels` / `node_features` when present) or the
    gnn-benchmark format (CSR in `adj_indptr` / `adj_indices` / `adj_shape`).
    Returns (edge_index [2, E'] int64 in xp, num_nodes). Raises
    FileNotFoundError when the file is absent (callers skip the graph)."""
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    with np.load(path, allow_pickle=False) as z:
        if "edges" in z.files:
            edges = np.asarray(z["edges"], dtype=np.int64)
            src, dst = edges[:, 0], edges[:, 1]
            n = int(max(src.max(initial=-1), dst.max(initial=-1))) + 1
            for key in ("node_labels", "node_features"):
                if key in z.files:
                    n = max(n, int(z[key].shape[0]))
        elif "adj_indptr" in z.files:
            indptr = np.asarray(z["adj_indptr"], dtype=np.int64)
            src = np.repeat(np.arange(indptr.shape[0] - 1, dtype=np.int64), np.diff(indptr))
            dst = np.asarray(z["adj_indices"], dtype=np.int64)
            n = int(max(z["adj_shape"]))
        else:
            raise ValueError(f"{path}: no 'edges' or 'adj_indptr' array (has {z.files})")
    ei = symmetrise(np.stack([src, dst]), n, np)
    if xp is not np:
        ei = xp.asarray(ei)
    return ei, n


def graph_stats(edge_index, num_nodes, xp=None):
    """{'num_nodes', 'num_edges', 'max_in_degree', 'mean_in_degree',
    'max_out_degree'} of an edge index (plain Python numbers)."""
    if xp is None:
        xp = np if isinstance(edge_index, np.ndarray) else __import__("cupy")
    E = int(edge_index.shape[1])
    if E:
        din = xp.bincount(edge_index[1], minlength=num_nodes)
        dout = xp.bincount(edge_index[0], minlength=num_nodes)
        max_in, max_out = int(din.max()), int(dout.max())
    else:
        max_in = max_out = 0
    return {"num_nodes": int(num_nodes), "num_edges": E, "max_in_degree": max_in,
            "mean_in_degree": round(E / num_nodes, 3) if num_nodes else 0.0,
            "max_out_degree": max_out}
