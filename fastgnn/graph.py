"""`Graph`: the one graph format every fastgnn op takes.

Messages flow source -> target. The graph is stored as CSR *by destination*:

    indptr   [num_dst + 1]   row i's in-edges are positions indptr[i]:indptr[i+1]
    indices  [E]             source node of each CSR position
    edge_ids [E] or None     caller's edge id of each CSR position (None = identity)

Edges keep the caller's relative order inside a row (stable sort), so results
are independent of how the sort is implemented. Index arrays are int32 when
every index and offset fits, int64 otherwise. Arrays live where the input
lived: NumPy (CPU backend) or CuPy (CUDA backend).

Derived data is built lazily once and cached on the graph: degrees, the
transpose (CSC, for backward passes) with each of its edges' position in its
row here, normalisation weights, GPU plans.
"""
from __future__ import annotations

import os
import weakref

import numpy as np

from ._array import as_backend_array, device_name, host_ints, is_cupy, xp_of

INT32_MAX = 2**31 - 1
_TRANSPOSE_OF = "transpose_of"   # a transpose's cache key: weakref to the graph it reverses


def _index_dtype(num_edges: int, num_nodes: int, forced=None):
    fits = max(num_edges, num_nodes) <= INT32_MAX
    if forced is None:
        return np.int32 if fits else np.int64
    forced = np.dtype(forced)
    if forced not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise ValueError(f"index_dtype must be int32 or int64, got {forced}")
    if forced == np.int32 and not fits:
        raise ValueError("index_dtype=int32 cannot hold this graph's edge or node count")
    return forced.type


def _check_int_array(a, name: str):
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")


class Graph:
    """A directed graph in CSR-by-destination form (see module docstring).

    Build one with `Graph.from_edge_index`, `Graph.from_scipy` or
    `Graph.from_csr`; the constructor itself trusts its arguments.
    """

    def __init__(self, indptr, indices, edge_ids, num_src: int, num_dst: int):
        self.indptr = indptr
        self.indices = indices
        self.edge_ids = edge_ids
        self.num_src = int(num_src)
        self.num_dst = int(num_dst)
        self.num_edges = int(indices.shape[0])
        self.cache: dict = {}  # derived data and backend plans, keyed by name
        self.permutation = None  # the fastgnn.reorder.Permutation of a relabelled graph
        self.visit_order = None  # the Permutation whose order the GPU kernels visit rows in

    # ------------------------------------------------------------------ build
    @classmethod
    def from_edge_index(cls, edge_index, num_nodes=None, *, num_src=None, num_dst=None,
                        index_dtype=None):
        """Graph from an edge index `[2, E]` (row 0 = sources, row 1 = targets).

        edge_index: NumPy, CuPy or any DLPack array (torch, jax) of integers.
        num_nodes:  node count of a square graph; inferred as max index + 1 if
                    neither it nor num_src/num_dst is given.
        num_src, num_dst: sizes of a bipartite graph (source and target sets).
        index_dtype: force int32 or int64 indices (default: int32 when they fit).
        Edge ids are column positions of `edge_index`. Edges already sorted by
        target (a sampler's CSC-ordered output, a PyG `EdgeIndex` sorted by
        column) are taken as they are, without a sort.
        """
        ei = as_backend_array(edge_index, "edge_index")
        if ei.ndim != 2 or ei.shape[0] != 2:
            raise ValueError(f"edge_index must have shape [2, E], got {tuple(ei.shape)}")
        _check_int_array(ei, "edge_index")
        xp = xp_of(ei)
        src, dst = ei[0], ei[1]
        E = int(src.shape[0])
        cuda = _cuda_build(ei)
        if E:
            # what validation and the sort need, in one copy to the host (on a
            # GPU, the build's only synchronisation)
            if cuda is not None:
                lo, max_src, max_dst, descents, loops = cuda.edge_stats(src, dst)
            else:
                lo, max_src, max_dst, descents, loops = host_ints(
                    ei.min(), src.max(), dst.max(), (dst[1:] < dst[:-1]).sum(),
                    (src == dst).sum())
            if lo < 0:
                raise ValueError(f"edge_index holds a negative index ({lo})")
        else:
            max_src = max_dst = -1
            descents = loops = 0
        if num_nodes is not None:
            if num_src is not None or num_dst is not None:
                raise ValueError("give either num_nodes or num_src/num_dst, not both")
            num_src = num_dst = int(num_nodes)
        elif num_src is None and num_dst is None:
            num_src = num_dst = max(max_src, max_dst) + 1
        else:
            num_src = max_src + 1 if num_src is None else int(num_src)
            num_dst = max_dst + 1 if num_dst is None else int(num_dst)
        if num_src < 0 or num_dst < 0:
            raise ValueError("num_nodes/num_src/num_dst must be non-negative")
        if max_src >= num_src:
            raise ValueError(f"edge_index[0] holds source index {max_src}, but there are "
                             f"only {num_src} source nodes (num_nodes / num_src: in a layer, "
                             "the rows of the source features x)")
        if max_dst >= num_dst:
            raise ValueError(f"edge_index[1] holds target index {max_dst}, but there are "
                             f"only {num_dst} target nodes (num_nodes / num_dst: in a layer, "
                             "the rows of the target features)")
        idx = _index_dtype(E, max(num_src, num_dst), index_dtype)
        if xp is np:
            _check_host_memory((num_dst + 1) * np.dtype(idx).itemsize, num_dst)
        if cuda is not None:
            # one pass writes offsets, sources and ids; edges already sorted by
            # target (a sampler's CSC output, a PyG EdgeIndex sorted by column)
            # are read as they are: no sort, edge ids are positions
            order = None if descents == 0 else _stable_argsort(xp, dst)
            g = cls(*cuda.csr_from_order(dst, num_dst, idx, vals=src, order=order),
                    num_src, num_dst)
        elif descents == 0:
            g = cls(_offsets(xp, dst, max_dst, num_dst, idx), src.astype(idx), None,
                    num_src, num_dst)
        else:
            order = _stable_argsort(xp, dst)
            g = cls(_offsets(xp, dst[order], max_dst, num_dst, idx), src[order].astype(idx),
                    order.astype(idx), num_src, num_dst)
        g.cache["num_self_loops"] = loops      # (edges i -> i; the copy brought it)
        return g

    @classmethod
    def from_csr(cls, indptr, indices, num_src=None, *, index_dtype=None):
        """Graph from CSR-by-destination arrays; edge ids are CSR positions.

        indptr:  [num_dst + 1] non-decreasing offsets starting at 0.
        indices: [E] source node of each position.
        """
        indptr = as_backend_array(indptr, "indptr")
        indices = as_backend_array(indices, "indices")
        for a, n in ((indptr, "indptr"), (indices, "indices")):
            if a.ndim != 1:
                raise ValueError(f"{n} must be one-dimensional, got shape {tuple(a.shape)}")
            _check_int_array(a, n)
        if is_cupy(indptr) != is_cupy(indices):
            raise ValueError("indptr and indices must live on the same device")
        xp = xp_of(indptr)
        if indptr.shape[0] < 1:
            raise ValueError("indptr must have at least one entry")
        E = int(indices.shape[0])
        # every check's value in one copy to the host (on a GPU, the only synchronisation)
        zero = xp.zeros((), dtype=np.int64)
        max_src, min_src = check_offsets(indptr, "indices", E, "entries",
                                         indices.max() if E else zero - 1,
                                         indices.min() if E else zero)
        if min_src < 0:
            raise ValueError("indices holds a negative index")
        num_src = max_src + 1 if num_src is None else int(num_src)
        if max_src >= num_src:
            raise ValueError(f"indices holds {max_src}, but num_src={num_src}")
        num_dst = indptr.shape[0] - 1
        idx = _index_dtype(E, max(num_src, num_dst), index_dtype)
        return cls(indptr.astype(idx), indices.astype(idx), None, num_src, num_dst)

    @classmethod
    def from_scipy(cls, matrix):
        """Graph from a SciPy (or cupyx) sparse matrix A of shape [num_dst, num_src]:
        A[i, j] != 0 means an edge j -> i, so `spmm(g, x, A.tocsr().data)` is A @ x.
        Edge ids are positions in `A.tocsr()` (which keeps duplicates)."""
        if not hasattr(matrix, "tocsr"):
            raise TypeError(f"matrix must be a scipy.sparse matrix, got {type(matrix).__name__}")
        csr = matrix.tocsr()
        return cls.from_csr(csr.indptr, csr.indices, num_src=csr.shape[1])

    # ---------------------------------------------------------------- derived
    @property
    def xp(self):
        return xp_of(self.indices)

    @property
    def device(self) -> str:
        return device_name(self.indices)

    @property
    def index_dtype(self):
        return self.indices.dtype

    def cached(self, key, build):
        """Memoise `build()` under `key` on this graph."""
        if key not in self.cache:
            self.cache[key] = build()
        return self.cache[key]

    @property
    def in_degree(self):
        """[num_dst] number of in-edges of each target node (index dtype)."""
        return self.cached("in_degree", lambda: self.xp.diff(self.indptr))

    @property
    def out_degree(self):
        """[num_src] number of out-edges of each source node (int64)."""
        return self.cached("out_degree",
                           lambda: self.xp.bincount(self.indices, minlength=self.num_src))

    @property
    def csr_rows(self):
        """[E] target node of each CSR position (index dtype)."""
        return self.cached("csr_rows", lambda: segment_ids(self.indptr, self.num_edges))

    @property
    def num_self_loops(self) -> int:
        """Edges i -> i (index equality, also in a bipartite graph), counted
        once: `from_edge_index` brings the count with its validation copy."""
        def build():
            if not self.num_edges:
                return 0
            return host_ints((self.indices == self.csr_rows).sum())[0]
        return self.cached("num_self_loops", build)

    @property
    def max_in_degree(self) -> int:
        """The largest in-degree (0 without targets), built once. It costs one
        copy to the host, which also brings the transpose's value (this
        graph's largest out-degree) when the transpose is built: the launch
        plans of both (`task_plan`: rows longer than a task) then need no
        further synchronisation."""
        value = self.cache.get("max_in_degree")
        if value is None:
            t = self._built_transpose()
            pair = [g for g in (self, t) if g is not None and "max_in_degree" not in g.cache]
            xp = self.xp
            zero = xp.zeros((), dtype=self.index_dtype)
            for g, v in zip(pair, host_ints(*(xp.diff(g.indptr).max() if g.num_dst else zero
                                              for g in pair))):
                g.cache["max_in_degree"] = v
            value = self.cache["max_in_degree"]
        return value

    @property
    def position_dtype(self):
        """dtype of a position within a target's CSR row (0 .. deg-1, all ones
        = none): the narrowest of uint8 (every in-degree below 256), uint16
        (below 65536) and the index dtype. The max/min arg residuals of the
        reductions use it (1-2 bytes per row and feature instead of 4-8: the
        max backward gathers one such row per edge); chosen once (one device
        sync, `max_in_degree`)."""
        def build():
            deg = self.max_in_degree
            for narrow in (np.uint8, np.uint16):
                if deg <= np.iinfo(narrow).max:     # positions stop at deg - 1 < all ones
                    return np.dtype(narrow)
            return np.dtype(self.index_dtype)
        return self.cached("position_dtype", build)

    @property
    def transpose_positions(self):
        """[E] for each edge of `transpose()` (transpose order), its position
        within its row of this graph, in `position_dtype` (built once)."""
        def build():
            t = self.transpose()
            return (t.edge_ids - self.indptr[t.indices]).astype(self.position_dtype)
        return self.cached("transpose_positions", build)

    def transpose(self) -> "Graph":
        """The reverse graph (CSC of this one), built once and cached.

        Its `edge_ids` are *CSR positions of this graph*, so a per-edge array
        in this graph's CSR order is gathered into transpose order by
        `values[t.edge_ids]`. Within a source node, edges stay in CSR order.
        The transpose's own transpose is this graph, held weakly (no
        reference cycle: a graph dropped by its owner is freed at once, with
        its device memory, not at the next cyclic garbage collection).
        """
        def build():
            xp = self.xp
            order = _stable_argsort(xp, self.indices)
            cuda = _cuda_build(self.indices)
            if cuda is not None:
                t = Graph(*cuda.csr_from_order(self.indices, self.num_src, self.index_dtype,
                                               rows_of=self.indptr, order=order),
                          self.num_dst, self.num_src)
            else:
                indptr = _offsets(xp, self.indices[order], self.num_src - 1, self.num_src,
                                  self.index_dtype)
                t = Graph(indptr, self.csr_rows[order].astype(self.index_dtype),
                          order.astype(self.index_dtype), self.num_dst, self.num_src)
            t.cache[_TRANSPOSE_OF] = weakref.ref(self)
            t.permutation = self.permutation
            t.visit_order = self.visit_order      # square: sources visited in the same order
            return t
        t = self._built_transpose()
        return t if t is not None else self.cached("transpose", build)

    def _built_transpose(self):
        """The transpose if it exists already (built from this graph, or this
        graph being a transpose whose graph still lives), else None."""
        t = self.cache.get("transpose")
        if t is None:
            back = self.cache.get(_TRANSPOSE_OF)
            t = None if back is None else back()
        return t

    def to_csr_order(self, edge_values):
        """Per-edge values in caller order -> CSR order (a gather; no copy of
        the caller's array is modified)."""
        if self.edge_ids is None:
            return edge_values
        return edge_values[self.edge_ids]

    def to_caller_order(self, csr_values):
        """Per-edge values in CSR order -> caller order (inverse permutation)."""
        if self.edge_ids is None:
            return csr_values
        out = self.xp.empty_like(csr_values)
        out[self.edge_ids] = csr_values
        return out

    def edge_index(self):
        """[2, E] edge index in the caller's edge order."""
        xp = self.xp
        ei = xp.stack([self.indices, self.csr_rows])
        if self.edge_ids is None:
            return ei
        out = xp.empty_like(ei)
        out[:, self.edge_ids] = ei
        return out

    def reorder(self, method_or_permutation="auto", *, relabel=True, seed=0,
                **options) -> "Graph":
        """This graph in a node order (see `fastgnn.reorder`): relabelled, or
        with the same ids and only the order its rows are visited in.

        method_or_permutation: a method name ("rcm", "degree", "cluster",
            "metis", "random", "identity", "auto"; options and seed go to
            `fastgnn.reorder.order`), a `Permutation`, or a new -> old id array.
        relabel=True: the nodes get new ids. The result remembers the order
            as `permutation` (perm new -> old, inverse old -> new): move node
            arrays in with `fastgnn.reorder.permute_nodes(x, g)` and outputs
            back with `unpermute_nodes(y, g)`. Its edge ids are this graph's
            caller edge positions, so per-edge arrays in the caller's edge
            order (edge weights, edge features) are used unchanged. A graph
            that is already relabelled is reordered again from its current
            labels (the new permutation is relative to them).
        relabel=False: the ids, the CSR arrays (shared, not copied) and every
            input and output stay the caller's; the result remembers the
            order as `visit_order`, and the GPU row kernels of the custom
            SpMM and the segment reductions (forward, and the transpose
            passes of the backward) walk the target rows, and the
            transpose's source rows, in the order's sequence: rows visited
            together read the same neighbour rows while they are in the L2
            cache. Nothing moves per call. Results are those of this graph
            (forward bitwise: each row sums the same terms in the same
            order). The fused attention (a visit order slowed it down),
            cuSPARSE, the Tensor Core path and the CPU backend ignore it.
        Square graphs only."""
        from . import reorder as _reorder
        if self.num_src != self.num_dst:
            raise ValueError(f"reorder needs a square graph, got num_src={self.num_src}, "
                             f"num_dst={self.num_dst}")
        if not isinstance(relabel, bool):
            raise TypeError(f"relabel must be True or False, got {relabel!r}")
        p = method_or_permutation
        if isinstance(p, str):
            p = _reorder.order(self, p, seed=seed, **options)
        elif options:
            raise TypeError(f"options {sorted(options)} apply only with a method name")
        elif not isinstance(p, _reorder.Permutation):
            if p is None or isinstance(p, (bool, int, float)):
                raise TypeError("method_or_permutation must be a method name, a Permutation "
                                f"or an id array, got {type(p).__name__}")
            p = _reorder.Permutation.from_perm(p, self.num_dst, name="method_or_permutation")
        if p.num_nodes != self.num_dst:
            raise ValueError(f"method_or_permutation has {p.num_nodes} nodes, the graph "
                             f"{self.num_dst}")
        if not relabel:
            new = self._sharing_arrays(p)
            if "transpose" in self.cache:         # share the built transpose's arrays too
                nt = self.cache["transpose"]._sharing_arrays(p)
                nt.cache[_TRANSPOSE_OF] = weakref.ref(new)
                new.cache["transpose"] = nt
            return new
        # built from the relabelled edge index in caller edge order: edge ids stay
        inv = p.inverse if self.xp is np else self.xp.asarray(p.inverse)
        new = Graph.from_edge_index(inv[self.edge_index()], num_nodes=self.num_dst,
                                    index_dtype=self.index_dtype)
        new.permutation = p
        return new

    def _sharing_arrays(self, visit_order) -> "Graph":
        """A graph on this one's arrays (no copy, empty cache), with its
        permutation and the given visit order."""
        g = Graph(self.indptr, self.indices, self.edge_ids, self.num_src, self.num_dst)
        g.permutation, g.visit_order = self.permutation, visit_order
        return g

    def with_visit_order_of(self, other: "Graph") -> "Graph":
        """Give this graph `other`'s visit order where both have the same
        node sets (a graph derived from `other`, e.g. with self-loops added);
        returns self. A new order drops what is cached on this graph (task
        plans and launch plans follow the order)."""
        if (other.visit_order is not None and other.visit_order is not self.visit_order
                and self.num_src == self.num_dst
                and (self.num_src, self.num_dst) == (other.num_src, other.num_dst)):
            self.visit_order = other.visit_order
            self.cache.clear()
        return self

    def visit_rows(self):
        """[num_dst] the target rows in the order the GPU row kernels visit
        them (`visit_order.perm` on this graph's device, index dtype), or
        None for the natural order."""
        if self.visit_order is None:
            return None
        return self.cached("visit_rows", lambda: self.xp.asarray(
            self.visit_order.perm.astype(self.index_dtype)))

    def to(self, device: str) -> "Graph":
        """A copy of the graph's structure on "cpu" or "cuda[:k]" (caches are not copied)."""
        if device == "cpu":
            conv = lambda a: a if not is_cupy(a) else a.get()  # noqa: E731
        elif device.startswith("cuda"):
            import cupy
            dev = int(device.split(":")[1]) if ":" in device else cupy.cuda.Device().id
            def conv(a):
                with cupy.cuda.Device(dev):
                    return cupy.asarray(a)
        else:
            raise ValueError(f"device must be 'cpu' or 'cuda[:k]', got {device!r}")
        ids = None if self.edge_ids is None else conv(self.edge_ids)
        g = Graph(conv(self.indptr), conv(self.indices), ids, self.num_src, self.num_dst)
        g.permutation = self.permutation
        g.visit_order = self.visit_order
        return g

    def __repr__(self):
        shape = (f"num_nodes={self.num_dst}" if self.num_src == self.num_dst
                 else f"num_src={self.num_src}, num_dst={self.num_dst}")
        order = "" if self.visit_order is None else f", visit_order={self.visit_order.method!r}"
        return (f"Graph({shape}, num_edges={self.num_edges}, "
                f"index={np.dtype(self.index_dtype).name}, device={self.device}{order})")


def check_offsets(indptr, name: str, length: int, unit: str, *more):
    """Check CSR offsets indptr [n + 1] into `length` items of array `name`
    (`unit`: what they are, for the message): from 0 to `length`, never
    decreasing. The checks and the 0-d integer arrays `more` reach the host
    in one copy (on a GPU, one synchronisation); returns the values of `more`."""
    xp = xp_of(indptr)
    first, last, descents, *rest = host_ints(indptr[0], indptr[-1],
                                             (xp.diff(indptr) < 0).sum(), *more)
    if first != 0:
        raise ValueError(f"indptr must start at 0, got {first}")
    if last != length:
        raise ValueError(f"{name} has {length} {unit} but indptr ends at {last}: indptr must "
                         f"end at len({name})")
    if descents:
        raise ValueError("indptr must be non-decreasing")
    return rest


def _check_host_memory(nbytes: int, num_dst: int):
    """MemoryError at once, with what to do, when the CSR offsets of num_dst
    targets (nbytes) would not fit the free host memory (Linux; elsewhere
    the allocation itself decides)."""
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return
    if nbytes > free:
        raise MemoryError(f"a graph of {num_dst} target nodes needs {nbytes / 2**30:.1f} GiB "
                          f"for its CSR offsets, more than the {free / 2**30:.1f} GiB of free "
                          "memory; pass the node count the edges use (num_nodes / num_dst = "
                          "largest index + 1) or relabel the nodes")


def _offsets(xp, sorted_keys, max_key: int, num_rows: int, dtype):
    """[num_rows + 1] CSR offsets of sorted_keys [E] (non-decreasing, all
    <= max_key < num_rows): row r starts where the first key >= r is. A
    binary search per row up to max_key + 1, the rows past it empty (E), so
    no count reaches the host (CuPy's bincount synchronises twice)."""
    E = int(sorted_keys.shape[0])
    indptr = xp.full(num_rows + 1, E, dtype=dtype)
    used = max_key + 2 if E else 1
    indptr[:used] = xp.searchsorted(sorted_keys, xp.arange(used, dtype=sorted_keys.dtype),
                                    side="left")
    return indptr


def _cuda_build(a):
    """The CUDA graph build launchers (fastgnn.backends.cuda.graph_build)
    when `a` is a CuPy array of int32 or int64, else None (the array code
    below builds)."""
    if not is_cupy(a) or a.dtype not in (np.int32, np.int64):
        return None
    from .backends.cuda import graph_build
    return graph_build


def _stable_argsort(xp, keys):
    """Stable argsort of integer keys on either backend (CuPy's argsort is
    stable: its documented only kind, a key-value stable sort)."""
    if xp is np:
        return np.argsort(keys, kind="stable")
    return xp.argsort(keys)


def segment_ids(offsets, total):
    """[total] segment of each position for offsets [n + 1] (like repeat(arange(n),
    diff(offsets)), which CuPy cannot do with array counts)."""
    xp = xp_of(offsets)
    pos = xp.arange(total, dtype=offsets.dtype)
    return (xp.searchsorted(offsets[1:], pos, side="right")).astype(offsets.dtype)


def as_graph(graph) -> Graph:
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a fastgnn.Graph, got {type(graph).__name__}; "
                        "build one with Graph.from_edge_index(edge_index)")
    return graph
