"""`to_graph`: a fastgnn.Graph from PyTorch graph inputs, built once per input.

Accepted inputs
    edge_index  [2, E] integer tensor (row 0 = sources, row 1 = targets) or a
                PyG `EdgeIndex`; edge ids are column positions.
    adj_t       torch sparse tensor [num_dst, num_src] in CSR, CSC or COO
                layout, PyG's `adj_t` convention: rows are targets, columns
                are sources, so `adj_t @ x` is the aggregation. Its values
                are edge weights; edge ids are storage positions (COO: after
                coalescing, which sums duplicates as torch does).
    DGLGraph    a DGL graph with one edge type: homogeneous, or bipartite (a
                block from `dgl.to_block` and DGL's samplers). Messages flow
                src -> dst, as DGL's; edge ids are DGL's, so per-edge tensors
                are in DGL's edge order (`from_dgl`).
    Graph       a fastgnn.Graph passes through unchanged.

Cache
    A small LRU (8 entries, shared by all callers) maps an input to its Graph,
    so the CSR sort, the transpose and every cached derivative (degrees, GCN
    weights, GPU plans) are paid once per graph, not once per call. The key is

        (kind, sizes, and for every index tensor read:
         data_ptr, shape, stride, dtype, device, _version)

    where sizes are the requested (num_src, num_dst); a DGLGraph's key is the
    identity of its structure object (`from_dgl`). `_version` changes on
    every in-place write, so editing edge_index in place rebuilds. An entry
    also holds a weak reference to the tensor it was built from and is valid
    only while that tensor lives: a freed tensor's address can be reused by a
    new tensor with the same key, and a dead entry is dropped instead of
    answering for it. Views of a live tensor (same address and strides, shared
    version counter) hit the same entry.
"""
from __future__ import annotations

import sys
import threading
import weakref
from collections import OrderedDict

import torch

from fastgnn.graph import Graph

from . import custom_ops
from ._autograd import device_scope

__all__ = ["to_graph", "from_dgl", "resolve", "graph_input", "CompiledGraph",
           "clear_graph_cache"]

_SPARSE_LAYOUTS = (torch.sparse_csr, torch.sparse_csc, torch.sparse_coo)


_CACHES: list = []     # every _LRU, for clear_graph_cache


class _LRU:
    """Thread-safe LRU whose entries die with the tensor they were built from
    (each one is emptied by `clear_graph_cache`)."""

    def __init__(self, maxsize: int):
        _CACHES.append(self)
        self.maxsize = maxsize
        self._d: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self._dead: list = []       # keys whose anchor died (appended by weakref callbacks)
        self.hits = self.misses = 0

    def _purge(self):
        while self._dead:
            key = self._dead.pop()
            entry = self._d.get(key)
            if entry is not None and entry[0]() is None:
                del self._d[key]

    def get(self, key, anchor, build, valid=None):
        """The value under key while its anchor lives (and valid(value), for
        values built from more tensors than the anchor), else build()'s,
        stored with a weak reference to anchor."""
        with self._lock:
            self._purge()
            entry = self._d.get(key)
            if entry is not None and entry[0]() is not None and (valid is None
                                                                 or valid(entry[1])):
                self._d.move_to_end(key)
                self.hits += 1
                _keep_if_capturing(entry[1])
                return entry[1]
            self.misses += 1
        if _capturing():
            raise RuntimeError(
                "fastgnn: a graph was first met during CUDA graph capture, but building it "
                "needs the host; run one eager (warm-up) step with the same edge_index before "
                "capturing (torch.compile(mode='reduce-overhead') warms up by itself)")
        value = build()
        dead = self._dead
        ref = weakref.ref(anchor, lambda _r, key=key: dead.append(key))
        with self._lock:
            self._d[key] = (ref, value)
            self._d.move_to_end(key)
            while len(self._d) > self.maxsize:
                self._d.popitem(last=False)
        return value

    def clear(self):
        with self._lock:
            self._d.clear()
            self._dead.clear()
            self.hits = self.misses = 0

    def __len__(self):
        return len(self._d)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


_CAPTURED: list = []    # cache values used during a CUDA graph capture


def _keep_if_capturing(value):
    """A captured CUDA graph replays kernels that read this value's buffers
    (CSR arrays, plans, weights): keep it alive for the process's life even
    if the LRU drops it."""
    if _capturing() and not any(v is value for v in _CAPTURED):
        _CAPTURED.append(value)


_GRAPHS = _LRU(8)
_ONES = _LRU(8)    # "are these sparse values all ones" flags


def clear_graph_cache():
    """Forget every cached Graph and what was derived per input tensor (the
    flags of sparse values, reversed edge indices, relation groupings): all
    is rebuilt on next use."""
    for cache in _CACHES:
        cache.clear()


def _tkey(t: torch.Tensor):
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, t.device, t._version)


def _sizes(num_nodes):
    """num_nodes -> (num_src, num_dst), entries None when unknown."""
    if num_nodes is None:
        return None, None
    if isinstance(num_nodes, (tuple, list)):
        if len(num_nodes) != 2:
            raise ValueError(f"num_nodes must be an int or a pair (num_src, num_dst), "
                             f"got {num_nodes!r}")
        return tuple(None if n is None else int(n) for n in num_nodes)
    n = int(num_nodes)
    return n, n


def _is_edge_index_type(obj):
    return type(obj).__name__ == "EdgeIndex" and isinstance(obj, torch.Tensor)


def to_graph(edge_index_or_adj, num_nodes=None) -> Graph:
    """The fastgnn.Graph of an edge_index tensor, PyG EdgeIndex, torch sparse
    adj_t or DGLGraph (see the module docstring), from the cache when possible.

    num_nodes: None (edge_index: inferred as max index + 1; sparse, DGLGraph:
               its own sizes),
               an int (square graph), or (num_src, num_dst) (bipartite; None
               entries are inferred). For a sparse adj_t or an EdgeIndex with
               a sparse size, given sizes must agree with it.
    """
    return resolve(edge_index_or_adj, num_nodes)[0]


def resolve(adj, num_nodes=None):
    """(graph, edge_weight or None) for any graph input. edge_weight is a sparse
    adj_t's values (None when they are all ones and need no gradient), or None
    for edge_index inputs and Graphs."""
    if custom_ops.compiling():
        return CompiledGraph(*graph_input(adj, num_nodes)), None
    if isinstance(adj, Graph):
        return adj, None
    num_src, num_dst = _sizes(num_nodes)
    if is_dgl_graph(adj):
        graph = from_dgl(adj)
        _agree(graph.num_src, num_src, "num_src (rows of the source features)",
               "graph.num_src_nodes()")
        _agree(graph.num_dst, num_dst, "num_dst (rows of the target features)",
               "graph.num_dst_nodes()")
        return graph, None
    if not isinstance(adj, torch.Tensor):
        raise TypeError("edge_index must be a [2, E] integer tensor, a PyG EdgeIndex, a torch "
                        f"sparse tensor, a DGLGraph or a fastgnn.Graph, got {type(adj).__name__}")
    if adj.layout in _SPARSE_LAYOUTS:
        return _resolve_sparse(adj, num_src, num_dst)
    if adj.layout != torch.strided:
        raise TypeError(f"edge_index has unsupported layout {adj.layout}")
    anchor = adj
    adj, num_src, num_dst = _edge_index_parts(adj, num_src, num_dst)
    key = ("edge_index", num_src, num_dst, _tkey(adj))

    def build():
        with device_scope(adj.device):
            return Graph.from_edge_index(adj.detach(), num_src=num_src, num_dst=num_dst)
    return _GRAPHS.get(key, anchor, build), None


class CompiledGraph:
    """A graph input inside a compiled program, where `resolve` returns it:
    the caller's edge_index, its sizes [num_src, num_dst] (None: inferred)
    and the number of PyG self-loops an attention layer adds (None: none).
    The graph itself is built inside fastgnn's custom ops."""

    def __init__(self, edge_index, sizes, num_loops=None):
        self.edge_index, self.sizes, self.num_loops = edge_index, sizes, num_loops


def graph_input(adj, num_nodes=None):
    """(edge_index [2, E] tensor, [num_src, num_dst]) of a graph input inside
    a compiled program, where graphs are built inside fastgnn's custom ops
    (`custom_ops.py`) rather than here. Sizes stay None where unknown (the op
    infers them as `resolve` does). Only dense edge_index tensors and PyG
    EdgeIndex reach a compiled op; the other inputs raise, saying what to pass."""
    if isinstance(adj, CompiledGraph):
        if adj.num_loops is not None:
            raise ValueError("this graph carries an attention layer's self-loops; pass the "
                             "caller's edge_index instead")
        num_src, num_dst = _sizes(num_nodes)
        sizes = [num_src if adj.sizes[0] is None else adj.sizes[0],
                 num_dst if adj.sizes[1] is None else adj.sizes[1]]
        return adj.edge_index, sizes
    if isinstance(adj, Graph):
        raise TypeError("under torch.compile, pass the edge_index tensor rather than a "
                        "fastgnn.Graph (graphs are built and cached inside fastgnn's ops)")
    if is_dgl_graph(adj):
        raise NotImplementedError("fastgnn under torch.compile takes an edge_index [2, E]; a "
                                  "DGLGraph works in eager mode only")
    if not isinstance(adj, torch.Tensor):
        raise TypeError("edge_index must be a [2, E] integer tensor or a PyG EdgeIndex, "
                        f"got {type(adj).__name__}")
    if adj.layout != torch.strided:
        raise NotImplementedError(
            "fastgnn under torch.compile takes an edge_index [2, E] or a PyG EdgeIndex; a "
            f"torch sparse adj_t ({adj.layout}) works in eager mode only")
    adj, num_src, num_dst = _edge_index_parts(adj, *_sizes(num_nodes))
    return adj, [num_src, num_dst]


def _edge_index_parts(adj, num_src, num_dst):
    """(plain [2, E] integer tensor, num_src, num_dst) of a dense edge_index
    or PyG EdgeIndex, sizes merged with an EdgeIndex's own and checked."""
    if _is_edge_index_type(adj):
        ss = adj.sparse_size()
        num_src = _agree(ss[0], num_src, "num_src", "EdgeIndex.sparse_size()[0]")
        num_dst = _agree(ss[1], num_dst, "num_dst", "EdgeIndex.sparse_size()[1]")
        adj = adj.as_tensor()
    _check_edge_index(adj)
    return adj, num_src, num_dst


def _check_edge_index(ei):
    """Refuse an edge_index that is not a [2, E] integer tensor, as PyG does
    (a float one would be truncated by a later .long() and silently name
    other nodes). Every edge_index tensor a graph is built from passes here."""
    if ei.dtype.is_floating_point or ei.dtype.is_complex or ei.dtype == torch.bool:
        raise TypeError(f"edge_index must hold integers, got dtype {ei.dtype}")
    if ei.dim() != 2 or ei.shape[0] != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {tuple(ei.shape)}")


_REVERSED = _LRU(8)     # edge_index -> its rows swapped (flow="target_to_source")


def reversed_input(adj):
    """The graph input with every edge turned around, for PyG's
    flow="target_to_source" (messages from edge_index[1] to edge_index[0]):
    an edge_index tensor or EdgeIndex gives its rows swapped ([2, E], edge ids
    unchanged), made once per tensor so that the Graph built from it is
    cached like any other; a fastgnn.Graph gives its reverse (cached on it).
    A torch sparse adj_t raises ValueError, as in PyG (pass adj_t.t())."""
    if isinstance(adj, Graph):
        def build():
            ei = adj.edge_index()
            return Graph.from_edge_index(adj.xp.stack([ei[1], ei[0]]), num_src=adj.num_dst,
                                         num_dst=adj.num_src)
        return adj.cached(("fastgnn.torch", "reversed"), build)
    if isinstance(adj, torch.Tensor) and adj.layout in _SPARSE_LAYOUTS:
        raise ValueError("flow='target_to_source' takes an edge_index, not a torch sparse "
                         "adj_t (as in PyG): pass adj_t.t() with flow='source_to_target'")
    if not isinstance(adj, torch.Tensor) or adj.layout != torch.strided:
        return adj                  # resolve names what is wrong with it
    ei = adj.as_tensor() if _is_edge_index_type(adj) else adj
    _check_edge_index(ei)
    if custom_ops.compiling():
        return ei.flip(0)           # no cache lookups by address inside a traced program
    return _REVERSED.get(_tkey(ei), adj, lambda: ei.detach().flip(0))


def is_dgl_graph(obj) -> bool:
    """obj is a DGLGraph (a block included). Only a process that imported dgl
    can hold one, so this asks sys.modules and never imports dgl itself."""
    dgl = sys.modules.get("dgl")
    cls = getattr(dgl, "DGLGraph", None)
    return isinstance(cls, type) and isinstance(obj, cls)


def from_dgl(graph, *, reverse=False) -> Graph:
    """The fastgnn.Graph of a DGLGraph with one edge type, built once per graph
    structure and cached (the LRU above).

    Edge e = (u_e -> v_e), e a DGL edge id, becomes a message from source u_e
    to target v_e (DGL's direction: reduced at the destination), so that
    out[v] = reduce_{e: v_e = v} m_e; num_src = graph.num_src_nodes(),
    num_dst = graph.num_dst_nodes() (they differ for a block). The graph's
    edge ids are DGL's: per-edge tensors [E, ...] go in and come out in DGL's
    edge order. reverse=True gives the graph with every edge turned around
    (sources v_e, targets u_e, the same edge ids): reductions over each
    node's out-edges, as DGL's norm_by="src".

    The key is the identity of the graph's structure object (DGL keeps it
    across `local_scope` and shallow copies and replaces it when edges or
    nodes are added or removed), and the entry lives only as long as that
    object: an edited graph is converted anew."""
    if not is_dgl_graph(graph):
        raise TypeError(f"graph must be a DGLGraph, got {type(graph).__name__}")
    if len(graph.canonical_etypes) != 1:
        raise ValueError("graph must have one edge type (a homogeneous graph or a block), got "
                         f"{graph.canonical_etypes}; pass graph[etype] for one relation")
    anchor = getattr(graph, "_graph", graph)     # DGL's structure object (HeteroGraphIndex)
    key = ("dgl", bool(reverse), id(anchor))

    def build():
        src, dst = graph.edges(order="eid")
        num_src, num_dst = int(graph.num_src_nodes()), int(graph.num_dst_nodes())
        if reverse:
            src, dst, num_src, num_dst = dst, src, num_dst, num_src
        with device_scope(src.device):
            return Graph.from_edge_index(torch.stack([src, dst]), num_src=num_src,
                                         num_dst=num_dst)
    return _GRAPHS.get(key, anchor, build)


def _agree(known, given, name, what):
    if known is None:
        return given
    if given is not None and int(given) != int(known):
        raise ValueError(f"{name}={given} disagrees with {what}={known}")
    return int(known)


def _resolve_sparse(adj, num_src, num_dst):
    if adj.dim() != 2 or adj.dense_dim() != 0:
        raise ValueError(f"adj_t must be a 2-D sparse matrix [num_dst, num_src] with scalar "
                         f"values, got shape {tuple(adj.shape)}")
    n_dst, n_src = int(adj.shape[0]), int(adj.shape[1])
    _agree(n_src, num_src, "num_src (rows of the source features)", "adj_t.size(1)")
    _agree(n_dst, num_dst, "num_dst (rows of the target features)", "adj_t.size(0)")
    layout = adj.layout
    if layout == torch.sparse_coo and not adj.is_coalesced():
        adj = adj.coalesce()        # sums duplicates, as torch.sparse.mm does
    if layout == torch.sparse_csr:
        parts = (adj.crow_indices(), adj.col_indices())
    elif layout == torch.sparse_csc:
        parts = (adj.ccol_indices(), adj.row_indices())
    else:
        parts = (adj.indices(),)
    key = (str(layout), n_src, n_dst) + tuple(_tkey(p) for p in parts)

    def build():
        with device_scope(adj.device):
            if layout == torch.sparse_csr:
                return Graph.from_csr(parts[0], parts[1], num_src=n_src)
            if layout == torch.sparse_csc:
                ptr, rows = parts
                cols = torch.repeat_interleave(
                    torch.arange(n_src, device=ptr.device, dtype=rows.dtype), ptr.diff())
                ei = torch.stack([cols, rows])
            else:
                ei = parts[0].flip(0)
            return Graph.from_edge_index(ei, num_src=n_src, num_dst=n_dst)
    graph = _GRAPHS.get(key, adj, build)
    values = adj.values()
    if values.dtype in (torch.float16, torch.bfloat16):
        values = values.float()     # fastgnn takes 16-bit features, not 16-bit weights
    if values.requires_grad:
        return graph, values
    ones = _ONES.get(("ones", _tkey(values)), adj,
                     lambda: bool((values == 1).all()) if values.numel() else True)
    return graph, (None if ones else values)
