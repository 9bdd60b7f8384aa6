"""Benchmark graphs by name.

    rmat<S>[e<EF>]       R-MAT, 2**S nodes, edge factor EF (16)         rmat20, rmat16e8
    uniform<S>[e<EF>]    uniform random endpoints, 2**S nodes            uniform20
    clustered[<S>]       blocks of 64, 2**S nodes (default 262,144)      clustered, clustered12
    grid[<SIDE>]         SIDE x SIDE 2-D mesh (default 1024)             grid, grid64
    mesh3d[<SIDE>][k<K>] SIDE^3 3-D mesh, K = 6 / 18 / 26 neighbours     mesh3d (128, k6), mesh3d64k26
                         (default side 128, k 6)
    molecules[<S>]       about 2**S nodes of small molecule-like graphs  molecules (S=22: ~4.2 M nodes,
                         (10-100 nodes each, 2**S // 55 graphs)           ~9.7 M edges), molecules10
    knn[<S>][k<K>]       k-NN graph of 2**S random 3-D points, K = 16    knn (S=20: 16.8 M edges), knn10k8
    file:PATH|NAME       a real graph file or folder read by fastgnn.datasets.load (Planetoid,
                         npz, OGB raw csv, SNAP / Network Repository edge list, Matrix Market,
                         TU, karateclub), symmetrised, deduplicated, no self-loops; NAME is
                         looked up under --datasets DIR and $FASTGNN_DATASETS
                         (fastgnn.datasets.find)
                                                                          file:tolokers, file:planetoid/cora
    npz:PATH|NAME        the same for .npz files (NAME -> <datasets>/**/NAME.npz)  npz:tolokers

Generated graphs are built with CuPy when the benchmark runs on CUDA and
CuPy works (fast at scale; knn always on the host), else NumPy; then handed
to torch by DLPack.
"""
from __future__ import annotations

import glob
import os
import re
import warnings
from dataclasses import dataclass, field

import numpy as np

from .. import datasets as ds
from .. import generators as gen

DEFAULT_CLUSTERED_SCALE = 18   # 262,144 nodes, 7.0 M edges
DEFAULT_GRID_SIDE = 1024
DEFAULT_MESH3D_SIDE = 128      # 2.1 M nodes, 12.5 M edges (k=6)
DEFAULT_MOLECULES_SCALE = 22   # ~76 k graphs, ~4.2 M nodes, ~9.7 M edges
DEFAULT_KNN_SCALE = 20         # 1 M points, k=16: 16.8 M edges
MOLECULE_MEAN_NODES = 55       # (10 + 100) / 2


@dataclass
class BenchGraph:
    name: str
    edge_index: object          # torch int64 [2, E] on the bench device
    num_nodes: int
    stats: dict
    source: str                 # how it was made
    cache: dict = field(default_factory=dict)   # derived torch structures (CSR, ...)

    def cached(self, key, build):
        if key not in self.cache:
            self.cache[key] = build()
        return self.cache[key]

    @property
    def index_bytes(self) -> int:
        """Bytes per index as fastgnn stores them (int32 when everything fits)."""
        return 4 if max(self.stats["num_edges"], self.num_nodes) <= 2**31 - 1 else 8


class GraphUnavailable(Exception):
    """The graph cannot be made here (a missing dataset file): skip it."""


DATASETS_HINT = ("fastgnn bench looks data sets up under --datasets DIR and "
                 f"${ds.ENV_VAR}")


def datasets_dirs():
    """Folders searched for dataset names (fastgnn.datasets.datasets_dirs:
    $FASTGNN_DATASETS, which --datasets DIR extends for the run)."""
    return ds.datasets_dirs()


def _resolve_npz(arg: str) -> str:
    if os.path.exists(arg):
        return arg
    name = os.path.basename(arg)
    name = name if name.endswith(".npz") else name + ".npz"
    for d in datasets_dirs():
        hits = sorted(glob.glob(os.path.join(d, "**", name), recursive=True))
        if hits:
            return hits[0]
    where = ", ".join(datasets_dirs()) or f"no datasets folder: {ds.HOW_TO_POINT}"
    raise GraphUnavailable(f"npz graph {arg!r} not found (looked in {where}); {DATASETS_HINT}")


def _resolve_file(arg: str) -> str:
    try:
        return ds.find(arg)
    except FileNotFoundError as exc:
        raise GraphUnavailable(f"{exc}; {DATASETS_HINT}") from None


def _file_builder(path):
    def build(xp, seed):
        g = ds.load(path)
        ei = g.edge_index if xp is np else xp.asarray(g.edge_index)
        return ei, g.num_nodes, g.name
    return build


GRAPH_NAMES = ("rmat<S>[e<EF>], uniform<S>[e<EF>], clustered[<S>], grid[<SIDE>], "
               "mesh3d[<SIDE>][k<K>], molecules[<S>], knn[<S>][k<K>], file:PATH|NAME, npz:PATH|NAME")


def parse(spec: str):
    """(canonical name, description, builder(xp, seed) -> (edge_index, n)).
    Raises ValueError for an unknown name, GraphUnavailable for a missing file."""
    if spec.startswith("npz:"):
        path = _resolve_npz(spec[4:])
        name = os.path.splitext(os.path.basename(path))[0]
        return name, f"load_npz({path!r}) symmetrised", _file_builder(path)
    if spec.startswith("file:"):
        path = _resolve_file(spec[5:])
        try:
            fmt = ds.detect_format(path)
        except FileNotFoundError as exc:
            raise GraphUnavailable(str(exc)) from None
        name = os.path.basename(os.path.normpath(path))     # replaced by the loaded name
        return name, f"fastgnn.datasets.load({path!r}) [{fmt}], symmetrised, dedup, no self-loops", \
            _file_builder(path)
    m = re.fullmatch(r"(rmat|uniform)(\d+)(?:e(\d+))?", spec)
    if m:
        kind, scale, ef = m.group(1), int(m.group(2)), int(m.group(3) or 16)
        f = gen.rmat if kind == "rmat" else gen.uniform
        desc = f"{kind}(scale={scale}, edge_factor={ef})"
        return spec, desc, lambda xp, seed: f(scale, ef, seed=seed, xp=xp)
    m = re.fullmatch(r"clustered(\d+)?", spec)
    if m:
        scale = int(m.group(1) or DEFAULT_CLUSTERED_SCALE)
        n = 1 << scale
        desc = f"clustered(num_nodes={n}, block=64, random_per_node=2)"
        return spec, desc, lambda xp, seed: gen.clustered(n, seed=seed, xp=xp)
    m = re.fullmatch(r"grid(\d+)?", spec)
    if m:
        side = int(m.group(1) or DEFAULT_GRID_SIDE)
        return spec, f"grid(side={side})", lambda xp, seed: gen.grid(side, seed=seed, xp=xp)
    m = re.fullmatch(r"mesh3d(\d+)?(?:k(\d+))?", spec)
    if m:
        side, k = int(m.group(1) or DEFAULT_MESH3D_SIDE), int(m.group(2) or 6)
        if k not in (6, 18, 26):
            raise ValueError(f"graph {spec!r}: mesh3d takes k6, k18 or k26")
        return spec, f"mesh3d(side={side}, k={k})", \
            lambda xp, seed: gen.mesh3d(side, k, seed=seed, xp=xp)
    m = re.fullmatch(r"molecules(\d+)?", spec)
    if m:
        scale = int(m.group(1) or DEFAULT_MOLECULES_SCALE)
        graphs = max(1, (1 << scale) // MOLECULE_MEAN_NODES)
        return spec, f"molecules(num_graphs={graphs}, 10..100 nodes)", \
            lambda xp, seed: gen.molecules(graphs, seed=seed, xp=xp)
    m = re.fullmatch(r"knn(\d+)?(?:k(\d+))?", spec)
    if m:
        scale, k = int(m.group(1) or DEFAULT_KNN_SCALE), int(m.group(2) or 16)
        return spec, f"knn(num_points={1 << scale}, k={k}, dim=3, order='morton')", \
            lambda xp, seed: gen.knn(1 << scale, k, seed=seed, xp=xp)
    raise ValueError(f"unknown graph {spec!r}: use {GRAPH_NAMES}")


def nominal_edges(spec: str) -> int | None:
    """About how many edges the named generated graph has (for run-time
    estimates, without building it); None for files and unknown names."""
    m = re.fullmatch(r"(rmat|uniform)(\d+)(?:e(\d+))?", spec)
    if m:       # R-MAT loses ~4% of its draws to the deduplication (rmat20: 16.08 M of 16.78 M)
        return int((1 << int(m.group(2))) * int(m.group(3) or 16) * (0.96 if m.group(1) == "rmat" else 1))
    m = re.fullmatch(r"clustered(\d+)?", spec)
    if m:       # ~26.8 edges per node (clustered: 7.02 M edges, 262,144 nodes)
        return int((1 << int(m.group(1) or DEFAULT_CLUSTERED_SCALE)) * 26.8)
    m = re.fullmatch(r"grid(\d+)?", spec)
    if m:
        side = int(m.group(1) or DEFAULT_GRID_SIDE)
        return 4 * side * (side - 1)
    m = re.fullmatch(r"mesh3d(\d+)?(?:k(\d+))?", spec)
    if m:       # faces, + edge diagonals (k18), + corner diagonals (k26), both directions
        s, k = int(m.group(1) or DEFAULT_MESH3D_SIDE), int(m.group(2) or 6)
        und = 3 * s * s * (s - 1) + (6 * s * (s - 1) ** 2 if k >= 18 else 0) \
            + (4 * (s - 1) ** 3 if k >= 26 else 0)
        return 2 * und
    m = re.fullmatch(r"molecules(\d+)?", spec)
    if m:
        return int((1 << int(m.group(1) or DEFAULT_MOLECULES_SCALE)) * 2.3)
    m = re.fullmatch(r"knn(\d+)?(?:k(\d+))?", spec)
    if m:
        return (1 << int(m.group(1) or DEFAULT_KNN_SCALE)) * int(m.group(2) or 16)
    return None


def make(spec: str, torch, device, seed: int = 0, reorder: str | None = None) -> BenchGraph:
    """Build the named graph on `device` (a torch.device). Raises
    GraphUnavailable for a missing dataset, ValueError for a bad name.
    reorder: a fastgnn.reorder method applied to the node ids first (the
    graph's name gets "+METHOD", its source the method's time)."""
    name, desc, build = parse(spec)
    xp = np
    if device.type == "cuda" and not spec.startswith(("npz:", "file:")):
        from .._array import gpu_available
        if gpu_available():
            import cupy
            xp = cupy
    built = build(xp, seed)
    ei, n = built[0], built[1]
    if len(built) > 2:                          # a file: the loader's name for it
        name = built[2]
    if reorder is not None:
        from .. import reorder as _reorder
        # "auto" judges the order by where the calls run: the bench's device
        opts = {"device": "cuda" if device.type == "cuda" else "cpu"} if reorder == "auto" else {}
        p = _reorder.order(ei, reorder, num_nodes=n, seed=seed, **opts)
        ei = p.to(xp)[1][ei]
        name = f"{name}+{reorder}"
        desc = f"{desc}, reordered by {reorder} ({p.info.get('chosen', reorder)}, {p.time_s:.3g} s)"
    stats = gen.graph_stats(ei, n, xp)
    if xp is np:
        t = torch.from_numpy(np.ascontiguousarray(ei)).to(device)
    else:
        with torch.cuda.device(device):
            t = torch.from_dlpack(ei).to(device).clone()
        del ei
    return BenchGraph(name, t.contiguous(), int(n), stats, f"{desc}, seed={seed}, built with {xp.__name__}")


# ------------------------------------------------------------ torch structures


def csr_by_target(torch, g: BenchGraph, index_dtype=None):
    """(crow [n+1], col [E]) of A with rows = targets (PyG's adj_t), stable in
    edge order, in `index_dtype` (int32 when it fits by default). Built anew
    on each call (outside timing) so that no implementation's peak memory
    carries another's structures."""
    if index_dtype is None:
        index_dtype = torch.int32 if g.index_bytes == 4 else torch.int64

    def build():
        src, dst = g.edge_index[0], g.edge_index[1]
        order = torch.sort(dst, stable=True).indices
        counts = torch.bincount(dst, minlength=g.num_nodes)
        crow = torch.zeros(g.num_nodes + 1, dtype=torch.int64, device=dst.device)
        crow[1:] = torch.cumsum(counts, 0)
        return crow.to(index_dtype), src[order].to(index_dtype)
    return build()


def csr_adj_t(torch, g: BenchGraph, dtype, index_dtype=None):
    """torch.sparse_csr_tensor of A^T-as-PyG-calls-it (rows = targets), values 1."""
    crow, col = csr_by_target(torch, g, index_dtype)
    vals = torch.ones(col.shape[0], dtype=dtype, device=col.device)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]parse.*")   # "beta state" notices
        return torch.sparse_csr_tensor(crow, col, vals, size=(g.num_nodes, g.num_nodes),
                                       check_invariants=False)
