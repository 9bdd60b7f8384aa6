"""Seeded graph generators for tests and benchmarks.

Every generator returns `(edge_index, num_nodes)`: an int64 `[2, E]` edge
index (row 0 = sources, row 1 = targets) in the array namespace `xp` (NumPy,
or CuPy to build large graphs on the GPU), plus the node count. The same seed
gives the same graph on the same namespace; NumPy and CuPy draw from
different random streams, so a seed does not give the same graph on both
(`knn` draws on the host, so it does).

    rmat(scale, edge_factor=16)          power-law (R-MAT a=0.57, b=c=0.19)
    uniform(scale, edge_factor=16)       Erdos-Renyi-like, uniform endpoints
    clustered(num_nodes, block=64)       locally dense blocks + random long edges
    grid(side)                           2-D mesh, 4-neighbour, both directions
    mesh3d(side, k=6)                    3-D mesh, 6 / 18 / 26 neighbours, both directions
    molecules(num_graphs)                many small ring + branch graphs, block-diagonal
    knn(num_points, k=16)                k-NN graph of random points (in-degree exactly k)

All generated graphs are deduplicated and have no self-loops. rmat, uniform,
clustered and molecules are sorted by (source, target); grid and mesh3d come
in construction order and knn grouped by target.

Sizes and memory (host or device bytes at the peak of generation, roughly):

    | graph | nodes | edges | peak |
    |---|---|---|---|
    | rmat(20) / uniform(20) | 1.05 M | 16.1 M / 16.8 M | ~40 B per drawn edge (R-MAT: + 8 B per edge per scale bit, transient) |
    | rmat(23, 12) | 8.4 M | ~95 M | ~4 GB |
    | clustered(2**18) | 262 k | 7.0 M | ~30 B per edge |
    | grid(1024) / mesh3d(128) | 1.05 M / 2.1 M | 4.2 M / 12.5 M | ~40 B per edge |
    | mesh3d(170, k=26) | 4.9 M | ~124 M | ~5 GB |
    | molecules(76_000) | ~4.2 M | ~10 M | ~60 B per edge (sort for dedup) |
    | knn(2**20, k=16) | 1.05 M | 16.8 M | ~300 B per point + 16 B per edge, host |

An int64 edge index alone is 16 bytes per edge (1.6 GB at 10^8 edges).
`graph_stats` summarises any edge index (n, E, degrees, skew, locality,
isolated nodes); it, `dedup_edges` and `symmetrise` live in `fastgnn._edges`,
shared with the loaders. `load_npz` is kept for compatibility: the loaders of
real graph files live in `fastgnn.datasets`.
"""
from __future__ import annotations

import numpy as np

from ._edges import dedup_edges, graph_stats, symmetrise

__all__ = ["rmat", "rmat_draws", "uniform", "clustered", "grid", "mesh3d", "molecules", "knn",
           "load_npz", "graph_stats", "dedup_edges", "symmetrise"]


def rmat_draws(scale, edge_factor=16, a=0.57, b=0.19, c=0.19, *, seed=0, xp=np):
    """The raw R-MAT draws (src, dst, n): edge_factor * 2**scale int64 pairs
    on n = 2**scale nodes, duplicates and self-loops included. Each of the
    `scale` bits of an endpoint picks a quadrant with probabilities a, b, c,
    1 - a - b - c (one uniform draw per bit and edge)."""
    n = 1 << scale
    m = edge_factor * n
    rs = xp.random.RandomState(seed)
    src = xp.zeros(m, dtype=np.int64)
    dst = xp.zeros(m, dtype=np.int64)
    for bit in range(scale):
        r = rs.random_sample(m)
        down = r >= a + b                 # lower half (c or d quadrant)
        right = ((r >= a) & (r < a + b)) | (r >= a + b + c)
        src += down.astype(np.int64) << bit
        dst += right.astype(np.int64) << bit
    return src, dst, n


def rmat(scale, edge_factor=16, *, a=0.57, b=0.19, c=0.19, seed=0, xp=np):
    """R-MAT power-law graph: 2**scale nodes, about edge_factor * 2**scale
    directed edges before deduplication (scale 20: 16.08 M edges after)."""
    src, dst, n = rmat_draws(scale, edge_factor, a, b, c, seed=seed, xp=xp)
    return dedup_edges(src, dst, n, xp), n


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


def mesh3d(side=64, k=6, *, seed=0, xp=np):
    """3-D mesh on a `side` x `side` x `side` lattice (or `side` = (nx, ny, nz)),
    ids row-major (x slowest, z fastest). Each node is joined, in both
    directions, to its lattice neighbours: k=6 (faces), 18 (+ edge diagonals)
    or 26 (+ corner diagonals). A cube of side s has 6 s^2 (s-1) edges for
    k=6 (in-degree <= 6 / 18 / 26). Deterministic (`seed` is accepted for a
    uniform signature)."""
    dims = (side,) * 3 if np.isscalar(side) else tuple(int(d) for d in side)
    if len(dims) != 3 or min(dims) < 1:
        raise ValueError(f"mesh3d: side must be a positive int or three of them, got {side!r}")
    if k not in (6, 18, 26):
        raise ValueError(f"mesh3d: k must be 6, 18 or 26, got {k!r}")
    nx, ny, nz = dims
    n = nx * ny * nz
    offsets = [(1, 0, 0), (0, 1, 0), (0, 0, 1)]
    if k >= 18:
        offsets += [(1, 1, 0), (1, -1, 0), (1, 0, 1), (1, 0, -1), (0, 1, 1), (0, 1, -1)]
    if k == 26:
        offsets += [(1, 1, 1), (1, 1, -1), (1, -1, 1), (1, -1, -1)]
    ids = xp.arange(n, dtype=np.int64).reshape(nx, ny, nz)
    src, dst = [], []
    for dx, dy, dz in offsets:
        sl = tuple(slice(max(0, -d), m - max(0, d)) for d, m in zip((dx, dy, dz), dims))
        s = ids[sl].ravel()
        if s.shape[0] == 0:
            continue
        src.append(s)
        dst.append(s + (dx * ny + dy) * nz + dz)
    if not src:
        return xp.zeros((2, 0), dtype=np.int64), n
    s, d = xp.concatenate(src), xp.concatenate(dst)
    return xp.stack([xp.concatenate([s, d]), xp.concatenate([d, s])]), n


def molecules(num_graphs=1000, min_nodes=10, max_nodes=100, *, ring_prob=0.2, branch_prob=0.25,
              seed=0, xp=np, return_ptr=False):
    """A batch of `num_graphs` small molecule-like graphs, block-diagonal
    (graph g owns nodes ptr[g] .. ptr[g+1]-1), sizes uniform in
    [min_nodes, max_nodes]. Each graph is a chain with branches (node i
    bonds to i-1, or with probability `branch_prob` to i-2 .. i-4) plus ring
    closures (with probability `ring_prob`, node i also bonds to i-4 or
    i-5: 5- and 6-rings). Undirected (both directions), deduplicated, no
    self-loops, max degree ~6; about 2.4 directed edges per node, mean 55
    nodes per graph at the defaults. With `return_ptr` also returns the
    graph offsets `ptr` (int64 [num_graphs + 1]) for per-graph pooling."""
    if num_graphs < 1 or not 1 <= min_nodes <= max_nodes:
        raise ValueError(f"molecules: need num_graphs >= 1 and 1 <= min_nodes <= max_nodes, got "
                         f"{num_graphs}, {min_nodes}, {max_nodes}")
    rs = xp.random.RandomState(seed)
    sizes = rs.randint(min_nodes, max_nodes + 1, size=num_graphs).astype(np.int64)
    ptr = xp.zeros(num_graphs + 1, dtype=np.int64)
    ptr[1:] = xp.cumsum(sizes)
    n = int(ptr[-1])
    node = xp.arange(n, dtype=np.int64)
    gid = xp.searchsorted(ptr[1:], node, side="right")
    local = node - ptr[gid]
    branch = rs.random_sample(n) < branch_prob
    back = 1 + xp.where(branch, rs.randint(1, 4, size=n).astype(np.int64), 0)
    back = xp.minimum(back, xp.maximum(local, 1))
    tree = local > 0
    ring = (local >= 5) & (rs.random_sample(n) < ring_prob)
    span = xp.where(rs.random_sample(n) < 0.5, 4, 5).astype(np.int64)
    src = xp.concatenate([node[tree] - back[tree], node[ring] - span[ring]])
    dst = xp.concatenate([node[tree], node[ring]])
    ei = symmetrise(xp.stack([src, dst]), n, xp)
    return (ei, n, ptr) if return_ptr else (ei, n)


def _morton_order(pos, bits=10):
    """Permutation sorting points in [0, 1)^d along a Z-order curve."""
    q = np.minimum((pos * (1 << bits)).astype(np.int64), (1 << bits) - 1)
    d = pos.shape[1]
    code = np.zeros(pos.shape[0], dtype=np.int64)
    for b in range(bits):
        for j in range(d):
            code |= ((q[:, j] >> b) & 1) << (b * d + j)
    return np.argsort(code, kind="stable")


def knn(num_points=1 << 16, k=16, dim=3, *, seed=0, xp=np, order="morton", return_pos=False,
        chunk=1 << 20):
    """k-nearest-neighbour graph of `num_points` points drawn uniformly in the
    unit cube of `dim` dimensions: edges (j -> i) from each of the k nearest
    other points j of i (PyG's knn_graph convention), so every in-degree is
    exactly k and E = k * num_points (not symmetric). `order="morton"`
    numbers the points along a Z-order curve (as scanned / voxelised point
    clouds come, with locality); "random" keeps the draw order.

    Built on the host with scipy's cKDTree (queries in chunks of `chunk`
    points, all cores), then moved to `xp`; the points come from NumPy's
    generator, so a seed gives the same graph on NumPy and CuPy. Memory:
    ~(k+1) * 16 bytes per point of a chunk plus the int64 result. With
    `return_pos` also returns the positions (float64 [num_points, dim], host)."""
    from scipy.spatial import cKDTree
    if k < 1 or num_points < k + 1:
        raise ValueError(f"knn: need k >= 1 and num_points > k, got num_points={num_points}, k={k}")
    if order not in ("morton", "random"):
        raise ValueError(f"knn: order must be 'morton' or 'random', got {order!r}")
    rs = np.random.RandomState(seed)
    pos = rs.random_sample((num_points, dim))
    if order == "morton":
        pos = pos[_morton_order(pos, bits=max(1, min(16, 60 // dim)))]
    tree = cKDTree(pos)
    nbrs = np.empty((num_points, k), dtype=np.int64)
    for lo in range(0, num_points, chunk):
        hi = min(num_points, lo + chunk)
        _, idx = tree.query(pos[lo:hi], k=k + 1, workers=-1)
        idx = idx.astype(np.int64, copy=False)
        keep = idx != np.arange(lo, hi, dtype=np.int64)[:, None]
        full = keep.all(axis=1)                 # self not among them (duplicate points)
        keep[full, -1] = False
        nbrs[lo:hi] = idx[keep].reshape(hi - lo, k)
    dst = np.repeat(np.arange(num_points, dtype=np.int64), k)
    ei = np.stack([nbrs.ravel(), dst])
    del nbrs, dst
    if xp is not np:
        ei = xp.asarray(ei)
    return (ei, num_points, pos) if return_pos else (ei, num_points)


def load_npz(path, *, xp=np):
    """A real graph from an `.npz` file, symmetrised, deduplicated, no
    self-loops: `fastgnn.datasets.load_npz(path)` as (edge_index in xp,
    num_nodes). Raises FileNotFoundError when the file is absent."""
    from .datasets import load_npz as _load
    g = _load(path)
    ei = g.edge_index if xp is np else xp.asarray(g.edge_index)
    return ei, g.num_nodes
