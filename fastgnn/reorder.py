"""Node orders that improve the locality of graph kernels.

A node order is a permutation of the node ids. Gather-dominated kernels
(SpMM, segment reductions, fused attention) read the feature row of every
source neighbour of a target; when neighbours have nearby ids those reads
hit the same cache lines and pages, when ids are shuffled every read is a
miss. Reordering relabels the nodes so that neighbours get nearby ids; the
results are the same up to the permutation: forward results bitwise (the
reordered graph keeps the caller's edge order inside each target's row),
gradients that sum over a node's out-edges to rounding (the transpose lists
them by target id, which the order changes).

    order(graph_or_edge_index, method, *, seed=0, **options) -> Permutation

`Permutation.perm[new] = old` (the old id at each new position) and
`Permutation.inverse[old] = new`, both int64 NumPy arrays; `time_s` is the
wall time of computing the order (including building the symmetric pattern)
and `info` holds method details (cluster counts, the auto rule's numbers).

Methods (n nodes, E edges; "pattern" = the symmetrised pattern A + A^T
without self-loops or duplicates, as CSR: SciPy's COO -> CSR conversion on
the host (rows bucketed, each row sorted: O(E log d)), one sort of 2E int64
keys on the GPU):

    "rcm"      reverse Cuthill-McKee (scipy.sparse.csgraph): breadth-first
               sweeps from a low-degree node of each component, neighbours
               visited in increasing degree, the visit order reversed. Keeps
               every edge between consecutive BFS levels, so it minimises the
               bandwidth max |new(i) - new(j)| heuristically. O(E + n log n)
               after the pattern. Best on meshes and other low-dimensional
               graphs; on power-law graphs hubs make levels huge.
    "degree"   descending degree, stable (ties keep the old order): hubs get
               the first ids, so their rows (read by many targets) sit
               together in cache. option degree="in" (default), "out" or
               "total". O(E + n log n); no locality between ordinary nodes.
    "cluster"  label propagation on the pattern, then nodes grouped by
               cluster. Every node starts in its own cluster; each round a
               random half of the nodes (seeded) takes the label most common
               among its neighbours and itself (ties broken at random), until
               fewer than tol * n labels change or `iterations` rounds
               (default 8). A round is one parallel Numba pass over the
               pattern (fastgnn.backends.cpu.reorder; each node sorts its
               neighbours' labels, O(E log d) in all), no Python loop over
               nodes.
               Clusters are then laid out by their first position in the RCM
               sweep (cluster_order="sweep", default: neighbouring clusters
               stay near) or by decreasing size (cluster_order="size"), and
               the nodes inside a cluster in RCM order. A cheap stand-in for
               community orders such as Rabbit order: dense communities
               become contiguous id ranges, which is what keeps a target's
               gathers in few cache lines.
    "metis"    METIS k-way partitions (optional `pymetis`: pip install
               fastgnn[metis]), parts laid out in turn, RCM order inside.
               options parts (default ceil(n / part_size)), part_size
               (default 1024 nodes). Minimises edges between parts; cost is
               METIS's multilevel coarsening, roughly O(E) with a large
               constant.
    "random"   a uniform random shuffle (NumPy Generator on `seed`): the
               worst case, for studies of what a bad order costs.
    "identity" keep the order (arange); what "auto" returns when it keeps.
    "auto"     a rule from cheap statistics (see `auto_rule` and
               docs/reordering.md): keep an order that is already local,
               else the better of RCM and cluster when it improves
               locality enough and can pay for its cost within the calls
               the graph will serve (options calls=100, width=128,
               device), else keep.

The input is a square `fastgnn.Graph` or an edge index [2, E] (NumPy, CuPy
or any DLPack array; num_nodes= as in Graph.from_edge_index). For CuPy
inputs the pattern's sort and the degree counts run on the GPU and their
results (the pattern's CSR, the degrees) come to the host; the RCM sweep,
label propagation, METIS and auto's statistics run on the host, and
`Permutation.to(xp)` / the helpers below copy the permutation back to the
device as needed. Bipartite graphs
(num_src != num_dst) are refused: one permutation cannot relabel two node
sets.

Host timings (2 CPU cores, NumPy 2.4, SciPy 1.17, Numba kernels cached;
seconds, `time_s`; graphs from fastgnn.generators, rmat/uniform ids
shuffled; `python -m fastgnn.reorder` prints this table on the machine at
hand; docs/reordering.md has the locality each order buys):

    | graph (n, E)                        | rcm  | degree | cluster | random | auto |
    |---|---|---|---|---|---|
    | rmat(16) shuffled (65 k, 0.96 M)    | 0.12 | 0.006  | 0.24    | 0.002  | 0.28 |
    | grid(1024) (1.05 M, 4.2 M)          | 0.56 | 0.022  | 1.19    | 0.022  | 0.057 (keeps) |
    | uniform(19) shuffled (524 k, 8.4 M) | 1.39 | 0.053  | 2.59    | 0.018  | 3.48 |
    | rmat(20) shuffled (1.05 M, 16.1 M)  | 3.14 | 0.11   | 6.36    | 0.049  | 7.95 |

Applying an order: `Graph.reorder(method_or_permutation)` returns the
relabelled graph, which remembers its `permutation`; `permute_nodes` moves
node arrays (features, labels, masks) into the new order and
`unpermute_nodes` moves outputs back; `permute_edge_index` relabels an edge
index without moving its columns (so per-edge arrays stay aligned) and
`permute_edges` also sorts the edges by new target and gathers per-edge
arrays along.
"""
from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass, field

import numpy as np

from ._array import as_backend_array, is_cupy, xp_of

__all__ = ["Permutation", "order", "METHODS", "auto_rule", "locality",
           "permute_nodes", "unpermute_nodes", "permute_edge_index", "permute_edges"]

# ---------------------------------------------------------------- the result


@dataclass(frozen=True, eq=False)
class Permutation:
    """A node order: perm[new] = old id, inverse[old] = new position (int64,
    NumPy). method names how it was made, time_s how long that took, info
    holds method details."""

    perm: np.ndarray
    inverse: np.ndarray
    method: str = "given"
    time_s: float = 0.0
    info: dict = field(default_factory=dict, compare=False)

    @classmethod
    def from_perm(cls, perm, num_nodes=None, *, name="perm"):
        """Permutation from a new -> old array (validated: every id once)."""
        p = as_backend_array(perm, name)
        if is_cupy(p):
            p = p.get()
        p = np.asarray(p)
        if p.ndim != 1:
            raise ValueError(f"{name} must be one-dimensional, got shape {p.shape}")
        if p.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integers, got dtype {p.dtype}")
        n = p.shape[0]
        if num_nodes is not None and n != int(num_nodes):
            raise ValueError(f"{name} has {n} entries, but the graph has {int(num_nodes)} nodes")
        p = p.astype(np.int64)
        if n and (p.min() < 0 or p.max() >= n or np.bincount(p, minlength=n).max() != 1):
            raise ValueError(f"{name} is not a permutation of 0..{n - 1}")
        return cls(p, _invert(p), "given")

    @property
    def num_nodes(self) -> int:
        return int(self.perm.shape[0])

    def __len__(self):
        return self.num_nodes

    @property
    def is_identity(self) -> bool:
        return bool(np.array_equal(self.perm, np.arange(self.num_nodes)))

    def to(self, xp):
        """(perm, inverse) in array namespace xp (numpy or cupy)."""
        if xp is np:
            return self.perm, self.inverse
        return xp.asarray(self.perm), xp.asarray(self.inverse)

    def __repr__(self):
        return (f"Permutation(num_nodes={self.num_nodes}, method={self.method!r}, "
                f"time_s={self.time_s:.3g})")


def _invert(perm):
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.shape[0], dtype=perm.dtype)
    return inv


# ---------------------------------------------------------------- the input


class _Input:
    """int64 (src, dst) where the input lives (NumPy, or CuPy for a graph or
    edge index on the GPU), the node count, and the lazily built symmetric
    pattern (host CSR indptr/indices, sorted, no loops or duplicates; its
    sort runs where the edges are and only the pattern comes to the host)."""

    def __init__(self, src, dst, n, device="cpu"):
        self.src, self.dst, self.n = src, dst, n
        self.device = device        # where the input lived: "cuda" (CuPy) or "cpu"
        self._pattern = None
        self._rcm = None
        self._host_edges = None

    def host_edges(self):
        """(src, dst) as host int64 arrays (copied once from the device)."""
        if self._host_edges is None:
            self._host_edges = (_host(self.src), _host(self.dst))
        return self._host_edges

    def pattern(self):
        if self._pattern is None:
            keep = self.src != self.dst
            build = _host_pattern if xp_of(self.src) is np else _device_pattern
            self._pattern = build(self.src[keep], self.dst[keep], self.n)
        return self._pattern

    def rcm(self):
        if self._rcm is None:
            from scipy.sparse import csr_matrix
            from scipy.sparse.csgraph import reverse_cuthill_mckee
            indptr, indices = self.pattern()
            n = self.n
            if n == 0:
                self._rcm = np.zeros(0, dtype=np.int64)
            else:
                a = csr_matrix((np.ones(indices.shape[0], dtype=np.int8), indices, indptr),
                               shape=(n, n))
                self._rcm = reverse_cuthill_mckee(a, symmetric_mode=True).astype(np.int64)
        return self._rcm


def _host_pattern(s, d, n):
    """(indptr int64, indices) of A + A^T's pattern from host edge arrays
    without self-loops: SciPy's COO -> CSR conversion buckets the 2E entries
    by row and sorts each row, duplicates merged -- the same CSR as the
    device's global key sort, in 1.0 s against 1.9 s for NumPy's sort of
    the keys (shuffled rmat(19), 16.1 M entries, the 2-core development
    machine)."""
    from scipy.sparse import csr_matrix
    idx = np.int32 if max(n, 2 * s.shape[0]) < 2**31 else np.int64
    rows, cols = np.concatenate([s, d]).astype(idx), np.concatenate([d, s]).astype(idx)
    a = csr_matrix((np.ones(rows.shape[0], dtype=np.int8), (rows, cols)), shape=(n, n))
    del rows, cols
    a.sum_duplicates()                  # sorted rows, one entry per (row, column)
    return (a.indptr.astype(np.int64), a.indices.astype(np.int32 if n < 2**31 else np.int64))


def _device_pattern(s, d, n):
    """_host_pattern's CSR from CuPy edge arrays: one sort of the 2E keys
    row * n + column on the GPU, duplicates dropped; only the CSR comes to
    the host."""
    import cupy as cp
    key = cp.concatenate([s * n + d, d * n + s])
    del s, d                            # free what the sort does not need
    key.sort()
    if key.shape[0] > 1:
        key = key[cp.concatenate([cp.ones(1, dtype=bool), key[1:] != key[:-1]])]
    indptr = cp.zeros(n + 1, dtype=np.int64)
    cp.cumsum(cp.bincount(key // n, minlength=n), out=indptr[1:])
    return indptr.get(), (key % n).astype(np.int32 if n < 2**31 else np.int64).get()


def _host(a):
    return a.get() if is_cupy(a) else np.asarray(a)


def _is_graph(obj):
    """A fastgnn.Graph (by its attributes: this module sits below graph.py)."""
    return all(hasattr(obj, a) for a in ("indptr", "indices", "csr_rows", "num_src", "num_dst"))


def _read_input(graph_or_edge_index, num_nodes):
    if _is_graph(graph_or_edge_index):
        g = graph_or_edge_index
        if num_nodes is not None:
            raise ValueError("num_nodes is taken from the graph; give it only with an edge index")
        if g.num_src != g.num_dst:
            raise ValueError(f"graph is bipartite (num_src={g.num_src}, num_dst={g.num_dst}); "
                             "a node order needs one node set")
        dst = g.csr_rows.astype(np.int64, copy=False)     # where the graph lives
        src = g.indices.astype(np.int64, copy=False)
        return _Input(src, dst, g.num_dst, "cuda" if is_cupy(g.indices) else "cpu")
    try:
        ei = as_backend_array(graph_or_edge_index, "graph_or_edge_index")
    except TypeError:
        raise TypeError("graph_or_edge_index must be a fastgnn.Graph or an edge index [2, E], "
                        f"got {type(graph_or_edge_index).__name__}") from None
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise ValueError(f"graph_or_edge_index must have shape [2, E], got {tuple(ei.shape)}")
    if ei.dtype.kind not in "iu":
        raise TypeError(f"graph_or_edge_index must hold integers, got dtype {ei.dtype}")
    device = "cuda" if is_cupy(ei) else "cpu"
    ei = ei.astype(np.int64, copy=False)              # where it lives (never written)
    E = ei.shape[1]
    hi = int(ei.max()) if E else -1
    if E and int(ei.min()) < 0:
        raise ValueError("graph_or_edge_index holds a negative index")
    n = hi + 1 if num_nodes is None else int(num_nodes)
    if n < 0:
        raise ValueError(f"num_nodes must be non-negative, got {n}")
    if hi >= n:
        raise ValueError(f"graph_or_edge_index holds node {hi}, but num_nodes={n}")
    return _Input(ei[0], ei[1], n, device)


# ---------------------------------------------------------------- the methods


def _identity(inp, seed):
    return np.arange(inp.n, dtype=np.int64), {}


def _random(inp, seed):
    return np.random.default_rng(seed).permutation(inp.n).astype(np.int64), {}


def _rcm(inp, seed):
    return inp.rcm(), {}


def _degree(inp, seed, *, degree="in"):
    if degree not in ("in", "out", "total"):
        raise ValueError(f"degree must be 'in', 'out' or 'total', got {degree!r}")
    n = inp.n
    xp = xp_of(inp.dst)                             # counted where the edges are
    d = xp.zeros(n, dtype=np.int64)
    if degree in ("in", "total"):
        d += xp.bincount(inp.dst, minlength=n)
    if degree in ("out", "total"):
        d += xp.bincount(inp.src, minlength=n)
    return np.argsort(-_host(d), kind="stable").astype(np.int64), {}


def _group(inp, labels, cluster_order):
    """Nodes grouped by label; groups laid out by their first RCM position
    ("sweep"), by decreasing size ("size") or by label ("label"); RCM order
    inside a group."""
    n = inp.n
    rank = _invert(inp.rcm())
    if cluster_order == "sweep":
        first = np.full(n, n, dtype=np.int64)
        np.minimum.at(first, labels, rank)
        return np.lexsort((rank, first[labels])).astype(np.int64)
    if cluster_order == "label":
        return np.lexsort((rank, labels)).astype(np.int64)
    size = np.bincount(labels, minlength=n)
    return np.lexsort((rank, labels, -size[labels])).astype(np.int64)


def _label_propagation(inp, seed, iterations, tol):
    from .backends.cpu.reorder import label_propagation_round
    indptr, indices = inp.pattern()
    n = inp.n
    rng = np.random.default_rng(seed)
    labels = np.arange(n, dtype=np.int64)
    out = np.empty_like(labels)
    rounds = 0
    for rounds in range(1, iterations + 1):
        move = rng.random(n) < 0.5                  # a random half moves: no oscillation
        salt = int(rng.integers(0, 2**63))
        changed = label_propagation_round(indptr, indices, labels, move, salt, out)
        labels, out = out, labels
        if changed <= tol * n:
            break
    return labels, rounds


def _cluster(inp, seed, *, iterations=8, tol=1e-3, cluster_order="sweep"):
    if not isinstance(iterations, (int, np.integer)) or iterations < 0:
        raise ValueError(f"iterations must be a non-negative integer, got {iterations!r}")
    if not 0 <= float(tol) < 1:
        raise ValueError(f"tol must be in [0, 1), got {tol!r}")
    if cluster_order not in ("sweep", "size"):
        raise ValueError(f"cluster_order must be 'sweep' or 'size', got {cluster_order!r}")
    if inp.n == 0:
        return np.zeros(0, dtype=np.int64), {"clusters": 0, "rounds": 0}
    labels, rounds = _label_propagation(inp, seed, int(iterations), float(tol))
    sizes = np.bincount(labels, minlength=inp.n)
    info = {"clusters": int((sizes > 0).sum()), "largest_cluster": int(sizes.max()),
            "rounds": rounds}
    return _group(inp, labels, cluster_order), info


def _metis(inp, seed, *, parts=None, part_size=1024):
    try:
        import pymetis
    except ImportError:
        raise ImportError("method='metis' needs the optional pymetis package: "
                          "pip install fastgnn[metis]") from None
    n = inp.n
    if parts is None:
        if not isinstance(part_size, (int, np.integer)) or part_size < 1:
            raise ValueError(f"part_size must be a positive integer, got {part_size!r}")
        parts = max(1, math.ceil(n / part_size))
    if not isinstance(parts, (int, np.integer)) or parts < 1:
        raise ValueError(f"parts must be a positive integer, got {parts!r}")
    if n == 0:
        return np.zeros(0, dtype=np.int64), {"parts": 0}
    if parts == 1:
        labels = np.zeros(n, dtype=np.int64)
    else:
        indptr, indices = inp.pattern()
        indptr = indptr.astype(indices.dtype)           # METIS wants one index type
        kw = {"options": pymetis.Options(seed=int(seed) % 2**31)}
        if hasattr(pymetis, "CSRAdjacency"):
            kw["adjacency"] = pymetis.CSRAdjacency(indptr, indices)
        else:
            kw.update(xadj=indptr, adjncy=indices)
        _, membership = pymetis.part_graph(int(parts), **kw)
        labels = np.asarray(membership, dtype=np.int64)
        if labels.shape != (n,):
            raise RuntimeError(f"pymetis returned {labels.shape[0]} part labels for {n} nodes")
    return _group(inp, labels, "label"), {"parts": int(parts)}


METHODS = {"rcm": _rcm, "degree": _degree, "cluster": _cluster, "metis": _metis,
           "random": _random, "identity": _identity}      # and "auto", below auto_rule


def order(graph_or_edge_index, method, *, seed=0, num_nodes=None, **options) -> Permutation:
    """A node order of a square graph (see the module docstring for the
    methods, their options and costs).

    graph_or_edge_index: fastgnn.Graph, or an edge index [2, E] (NumPy, CuPy
                 or DLPack; CuPy stays on the GPU for the pattern and degrees).
    method:      "rcm", "degree", "cluster", "metis", "random", "identity" or "auto".
    seed:        seeds "random", "cluster" and "metis" (the same seed gives
                 the same order); the others are deterministic.
    num_nodes:   node count for an edge index (default max index + 1).
    Returns a Permutation (perm new -> old, inverse old -> new, time_s)."""
    if not isinstance(method, str):
        raise TypeError(f"method must be a string, got {type(method).__name__}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {sorted(METHODS)}, got {method!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an integer, got {type(seed).__name__}")
    fn = METHODS[method]
    allowed = [p.name for p in inspect.signature(fn).parameters.values()
               if p.kind is inspect.Parameter.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(f"order(method={method!r}) got unknown option(s) {unknown}; "
                        f"it takes {allowed or 'none'}")
    t0 = time.perf_counter()
    inp = _read_input(graph_or_edge_index, num_nodes)
    perm, info = fn(inp, int(seed), **options)
    t = time.perf_counter() - t0
    return Permutation(perm, _invert(perm), method, t, info)


# ---------------------------------------------------------------- auto


WINDOW = 64                # ids per "window": a few cache lines of 64-float rows apart
KEEP_WINDOW_FRACTION = 0.5  # keep when at least this share of edges is within a window
KEEP_GAP_BITS = 0.6        # ... or when the mean log2 gap is below this share of log2(n)
# ... or when even this share of edges is within a window: an order with some
# locality of its own (a crawl, a BFS) (H200 study: soc-brightkite in its
# given order, 6.4% within a window, lost with `cluster` on 4 of 5 kernels,
# 0.75-0.95x; its shuffle and every shuffled suite graph have ~0%)
PARTLY_LOCAL = 0.05
MIN_GAIN = 0.85            # take RCM only if it cuts the mean log2 gap to this share or less
MIN_NODES = 4096           # smaller graphs fit in cache in any order: keep
SAMPLE = 1 << 20           # edges sampled for the statistics

# The payback test (auto's `calls`): an order is worth computing only if it
# can repay its cost within the calls it will serve. Bounds measured on the
# H200 (benchmarks/results/reorder_study_h200.md; five kernels, ten
# graphs, every order): on graphs of 4 or more edges per node no order saved
# a call more than 3.7 ps per edge and feature (bf16 dot attention on
# shuffled clustered20 with `cluster`, which moved it onto the Tensor Core
# path: 16.8 -> 3.7 ms); on the batched molecules (2.3 edges per node) that
# move saved 6.2 ps (3.44 -> 1.51 ms with `rcm`), above the bound, yet broke
# even only after 129 calls. On the 2-core CPU no order saved more than 5.5
# ns (SpMM on a shuffled grid with `rcm`, docs/reordering.md). No order cost
# less per edge on the host than MIN_COST_PER_EDGE_S (the H200 machine's 16
# cores, the pattern built by a NumPy key sort; the 2-core development
# machine is slower). The pattern built by SciPy on the host (rcm 1.3x
# cheaper on rmat(20) on the 2-core machine) and by a key sort on the GPU
# (`rcm` down to 0.025 us per edge) cost less than that, so these bounds
# keep auto on the safe side (no `rcm` or `cluster` order of the study broke
# even in fewer than 109 calls).
MAX_SAVING_PER_EDGE_FEATURE_S = {"cuda": 4e-12, "cpu": 6e-9}
MIN_COST_PER_EDGE_S = {"rcm": 0.069e-6, "cluster": 0.118e-6, "degree": 0.008e-6}
# On the GPU, graphs whose node features (n x width x 4 bytes) fit in this
# much cache keep their order: every gather hits the L2 in any order (the
# H200's L2 is 50 MiB; on soc-brightkite, 29 MB of features, `rcm` and
# `cluster` moved the kernels by 0.71-1.09x, shuffled or not, within that
# graph's noise).
GPU_CACHE_BYTES = 50 << 20
DEFAULT_CALLS = 100        # kernel calls the reordered graph serves, unless told
DEFAULT_WIDTH = 128        # features per node the calls move, unless told


def _check_device(device):
    if device not in MAX_SAVING_PER_EDGE_FEATURE_S:
        raise ValueError(f"device must be one of {sorted(MAX_SAVING_PER_EDGE_FEATURE_S)}, "
                         f"got {device!r}")
    return device


def payback_calls(cost_s, num_edges, width=DEFAULT_WIDTH, device="cuda"):
    """The fewest calls in which an order that took `cost_s` seconds can pay
    for itself on a graph of `num_edges` edges at `width` features: its cost
    over the most an order was measured to save a call, per edge and feature
    on `device` (MAX_SAVING_PER_EDGE_FEATURE_S). A lower bound where those
    savings bound the graph's: real break-evens are later."""
    _check_device(device)
    saving = max(num_edges, 1) * width * MAX_SAVING_PER_EDGE_FEATURE_S[device]
    return cost_s / saving


def locality(src, dst, inverse=None, *, window=WINDOW, sample=SAMPLE, seed=0):
    """Cheap locality statistics of an edge list under a relabelling
    (inverse old -> new, None = as is): the fraction of edges with
    |src - dst| < window, and the mean of log2(1 + |src - dst|) ("gap
    bits"). At most `sample` edges are read (a seeded sample)."""
    src = np.asarray(src)
    dst = np.asarray(dst)
    E = src.shape[0]
    if E > sample:
        pick = np.random.default_rng(seed).integers(0, E, sample)
        src, dst = src[pick], dst[pick]
    if inverse is not None:
        src, dst = inverse[src], inverse[dst]
    if src.shape[0] == 0:
        return {"window_fraction": 1.0, "gap_bits": 0.0}
    gap = np.abs(src.astype(np.int64) - dst.astype(np.int64))
    return {"window_fraction": float((gap < window).mean()),
            "gap_bits": float(np.log2(1.0 + gap).mean())}


def auto_rule(graph_or_edge_index, *, seed=0, candidates=("rcm", "cluster"), num_nodes=None,
              calls=DEFAULT_CALLS, width=DEFAULT_WIDTH, device=None):
    """The rule behind order(..., "auto"): returns (perm, info).

    calls:  the kernel calls the reordered graph will serve (a training run:
            about epochs x layers x 2); None: as many as it takes.
    width:  the features per node those calls move (default 128).
    device: "cuda" or "cpu", where the calls run (default: where the input
            is: a CuPy graph or edge index "cuda", else "cpu"; pass
            "cuda" for host arrays that will be trained on a GPU).

    0. Payback: a candidate is considered only if it could pay for itself
       within `calls` (`payback_calls`: its least cost per edge on the host,
       MIN_COST_PER_EDGE_S, over the most an order saved a call in the
       study); the one chosen must also do so at its measured cost. On the
       GPU at width 128 that takes at least 135 calls for "rcm" and 231 for
       "cluster": with the default 100 calls "auto" keeps the order there
       without computing one.
    1. Graphs below MIN_NODES nodes keep their order (they fit in cache), and
       so do graphs whose features fit in the GPU's L2 (device "cuda":
       n * width * 4 bytes <= GPU_CACHE_BYTES).
    2. If the current order is already local -- at least KEEP_WINDOW_FRACTION
       of the edges join ids less than WINDOW apart, or the mean
       log2(1 + |src - dst|) ("gap bits") is at most KEEP_GAP_BITS * log2(n)
       -- keep it. (A shuffled graph has gap bits near log2(n) - 1.4; a 2-D
       or 3-D mesh in its natural order far fewer.) Keep it too when at
       least PARTLY_LOCAL of the edges are within a window (an order with
       some locality of its own).
    3. Else compute each of `candidates` ("rcm", "cluster", "degree") and
       take the one with the fewest gap bits if it cuts them to at most
       MIN_GAIN of before; else keep.

    The statistics read a seeded sample of SAMPLE edges. info records them
    before and after and the choice. The thresholds come from host-side
    locality measures and an H200 study (docs/reordering.md: seven graphs;
    PARTLY_LOCAL is set by its one real graph in a given order)."""
    inp = graph_or_edge_index if isinstance(graph_or_edge_index, _Input) else \
        _read_input(graph_or_edge_index, num_nodes)
    if isinstance(candidates, str):
        candidates = (candidates,)
    candidates = tuple(candidates)
    bad = [c for c in candidates if c not in ("rcm", "cluster", "degree")]
    if bad or not candidates:
        raise ValueError("candidates must name one or more of 'rcm', 'cluster', 'degree', "
                         f"got {candidates!r}")
    if calls is not None and (isinstance(calls, bool) or not isinstance(calls, (int, np.integer))
                              or calls < 0):
        raise ValueError(f"calls must be a non-negative integer or None, got {calls!r}")
    if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width <= 0:
        raise ValueError(f"width must be a positive integer, got {width!r}")
    device = _check_device(inp.device if device is None else device)
    n, E = inp.n, inp.src.shape[0]
    ident = np.arange(n, dtype=np.int64)
    if calls is not None:
        need = {c: payback_calls(MIN_COST_PER_EDGE_S[c] * E, E, width, device)
                for c in candidates}
        candidates = tuple(c for c in candidates if need[c] <= calls)
        if not candidates:
            return ident, {"chosen": "identity", "payback_calls": need,
                           "reason": f"no candidate can pay for itself in {calls} calls on "
                                     f"{device} (needs at least {min(need.values()):.0f})"}
    if n < MIN_NODES:
        return ident, {"chosen": "identity", "reason": f"fewer than {MIN_NODES} nodes"}
    if device == "cuda" and n * width * 4 <= GPU_CACHE_BYTES:
        return ident, {"chosen": "identity",
                       "reason": f"the features fit in the GPU's L2 ({GPU_CACHE_BYTES >> 20} MiB)"}
    src, dst = inp.host_edges()
    before = locality(src, dst, seed=seed)
    info = {"before": before}
    if before["window_fraction"] >= KEEP_WINDOW_FRACTION or \
            before["gap_bits"] <= KEEP_GAP_BITS * math.log2(n):
        info.update(chosen="identity", reason="already local")
        return ident, info
    if before["window_fraction"] >= PARTLY_LOCAL:
        info.update(chosen="identity", reason="partly local already")
        return ident, info
    best = None
    for c in candidates:
        t0 = time.perf_counter()
        perm = METHODS[c](inp, seed)[0]
        cost = time.perf_counter() - t0
        after = locality(src, dst, _invert(perm), seed=seed)
        info[c] = dict(after, cost_s=cost)
        if best is None or after["gap_bits"] < best[2]["gap_bits"]:
            best = (c, perm, after, cost)
    c, perm, after, cost = best
    if after["gap_bits"] <= MIN_GAIN * before["gap_bits"]:
        need = payback_calls(cost, E, width, device)
        if calls is not None and need > calls:
            info.update(chosen="identity", payback_calls={c: need},
                        reason=f"{c} took {cost:.3g} s: it cannot pay for itself in {calls} "
                               f"calls (needs at least {need:.0f})")
            return ident, info
        info.update(chosen=c, reason="improves locality")
        return perm, info
    info.update(chosen="identity", reason="no candidate improves locality enough")
    return ident, info


def _auto(inp, seed, *, candidates=("rcm", "cluster"), calls=DEFAULT_CALLS, width=DEFAULT_WIDTH,
          device=None):
    return auto_rule(inp, seed=seed, candidates=candidates, calls=calls, width=width,
                     device=device)


METHODS["auto"] = _auto


# ---------------------------------------------------------------- applying


def _perm_of(p, name="p"):
    if isinstance(p, Permutation):
        return p
    if _is_graph(p):
        if getattr(p, "permutation", None) is None:
            raise ValueError(f"{name} is a Graph without a permutation; use Graph.reorder first")
        return p.permutation
    raise TypeError(f"{name} must be a Permutation or a reordered Graph, got {type(p).__name__}")


def _take(a, idx, name):
    """a[idx] along axis 0 for NumPy, CuPy or torch arrays (torch keeps autograd)."""
    mod = type(a).__module__
    if mod.startswith("torch"):
        import torch
        return a[torch.from_numpy(idx).to(a.device)]
    if is_cupy(a):
        import cupy
        return a[cupy.asarray(idx)]
    if isinstance(a, np.ndarray):
        return a[idx]
    b = as_backend_array(a, name)
    return b[idx] if isinstance(b, np.ndarray) else b[__import__("cupy").asarray(idx)]


def _check_rows(a, n, name):
    shape = tuple(a.shape)
    if len(shape) < 1 or shape[0] != n:
        raise ValueError(f"{name} must have {n} rows (one per node), got shape {shape}")


def permute_nodes(x, p):
    """Node array x [n, ...] (features, labels, masks) in the caller's order
    -> the new order: x[p.perm]. p: Permutation or a reordered Graph.
    NumPy, CuPy and torch (differentiable) arrays."""
    p = _perm_of(p)
    _check_rows(x, p.num_nodes, "x")
    return _take(x, p.perm, "x")


def unpermute_nodes(y, p):
    """Node array y [n, ...] in the new order (an output) -> the caller's
    order: y[p.inverse]. Inverse of permute_nodes."""
    p = _perm_of(p)
    _check_rows(y, p.num_nodes, "y")
    return _take(y, p.inverse, "y")


def permute_edge_index(edge_index, p):
    """Relabel an edge index [2, E] into the new order: inverse[edge_index].
    Columns stay where they are, so per-edge arrays (weights, edge features)
    in the same column order need no change. NumPy, CuPy or torch."""
    p = _perm_of(p)
    shape = tuple(edge_index.shape)
    if len(shape) != 2 or shape[0] != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {shape}")
    mod = type(edge_index).__module__
    if mod.startswith("torch"):
        import torch
        inv = torch.from_numpy(p.inverse).to(edge_index.device)
        return inv[edge_index.long()].to(edge_index.dtype)
    ei = as_backend_array(edge_index, "edge_index")
    if ei.dtype.kind not in "iu":
        raise TypeError(f"edge_index must hold integers, got dtype {ei.dtype}")
    inv = p.inverse if isinstance(ei, np.ndarray) else __import__("cupy").asarray(p.inverse)
    return inv[ei].astype(ei.dtype)


def permute_edges(edge_index, p, *edge_arrays, sort=True):
    """Relabel an edge index and (sort=True) sort its columns by new target
    (stable: edges into one target keep their relative order), gathering
    each per-edge array [E, ...] into the same column order. Returns
    (edge_index', *edge_arrays'). The sorted layout is exactly the CSR order
    of `Graph.reorder`'s graph, so per-edge arrays are read in order and
    the forward of every op gives bitwise the results of the unsorted
    edges; with sort=False the arrays come back unchanged."""
    ei = permute_edge_index(edge_index, p)
    E = int(ei.shape[1])
    for i, a in enumerate(edge_arrays):
        if tuple(a.shape)[:1] != (E,):
            raise ValueError(f"edge_arrays[{i}] must have {E} rows (one per edge), "
                             f"got shape {tuple(a.shape)}")
    if not sort:
        return (ei, *edge_arrays)
    mod = type(ei).__module__
    key = ei[1].cpu().numpy() if mod.startswith("torch") else _host(ei[1])
    cols = np.argsort(key, kind="stable")
    out = [_take(ei.T, cols, "edge_index").T]
    out += [_take(a, cols, f"edge_arrays[{i}]") for i, a in enumerate(edge_arrays)]
    if not mod.startswith("torch") and not is_cupy(out[0]):
        out[0] = np.ascontiguousarray(out[0])
    elif mod.startswith("torch"):
        out[0] = out[0].contiguous()
    return tuple(out)


def _timing_table(rmat_scales=None, methods=("rcm", "degree", "cluster", "random", "auto")):
    """Print each method's time_s on generated graphs (markdown): the default
    suite, or shuffled R-MAT graphs of the given scales."""
    from . import generators as gen
    if rmat_scales:
        graphs = [(f"rmat({s}) shuffled", lambda s=s: _shuffled(*gen.rmat(s)))
                  for s in rmat_scales]
    else:
        graphs = [("rmat(16) shuffled", lambda: _shuffled(*gen.rmat(16))),
                  ("grid(1024)", lambda: gen.grid(1024)),
                  ("uniform(19) shuffled", lambda: _shuffled(*gen.uniform(19))),
                  ("rmat(20) shuffled", lambda: _shuffled(*gen.rmat(20)))]
    order(np.array([[0, 1], [1, 2]]), "cluster")      # load the Numba kernel before timing
    print("| graph (n, E) | " + " | ".join(methods) + " |")
    print("|---" * (len(methods) + 1) + "|")
    for name, build in graphs:
        ei, n = build()
        row = []
        for m in methods:
            p = order(ei, m, num_nodes=n)
            row.append(f"{p.time_s:.3g}")
        print(f"| {name} ({n}, {ei.shape[1]}) | " + " | ".join(row) + " |", flush=True)


def _shuffled(ei, n, seed=1):
    inv = np.random.default_rng(seed).permutation(n)
    return inv[ei], n


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(
        prog="python -m fastgnn.reorder",
        description="time each node order on generated graphs (seconds, this machine)")
    ap.add_argument("--rmat", type=int, nargs="+", metavar="SCALE",
                    help="shuffled R-MAT graphs of these scales instead of the default suite "
                         "(scale 23: about 1.3e8 edges)")
    ap.add_argument("--methods", nargs="+", help="default: rcm degree cluster random auto")
    a = ap.parse_args()
    _timing_table(a.rmat, *([tuple(a.methods)] if a.methods else []))
