"""Loaders for real graphs in their standard on-disk formats (local files only).

Every loader takes a path, reads it offline, and returns a `GraphData`:
`edge_index` (int64 numpy `[2, E]`, row 0 = sources, row 1 = targets),
`num_nodes`, optional node features `x` / labels `y`, the graph id of every
node (`batch`) for sets of graphs, the standard train / validation / test
masks where the format has them, `name` and `source` (the path read).
A missing file raises FileNotFoundError naming it and what else the format
needs; a file that does not parse raises ValueError saying why.

    load_planetoid(path, name=None)  ind.<name>.{x,tx,allx,y,ty,ally,graph,test.index}
    load_npz(path)                   heterophilous `edges` / gnn-benchmark `adj_*` CSR / `edge_index`
    load_ogb(path)                   OGB raw csv folder: raw/edge.csv[.gz], num-node-list.csv[.gz]
    load_edgelist(path)              SNAP / Network Repository / plain `u v` text (.gz too)
    load_mtx(path)                   Matrix Market (scipy.io.mmread)
    load_tu(path, name=None)         TU dataset zip or folder (NAME_A.txt, NAME_graph_indicator.txt)
    load_karateclub(path)            karateclub edges.csv (+ target.csv) or graphs.json sets
    load(path, format=None)          any of the above, chosen from the path (or a name, via find)
    find(name)                       a dataset's path by name under $FASTGNN_DATASETS

Where the data sets live: set the environment variable FASTGNN_DATASETS to
the folder that holds them (several folders joined with os.pathsep, ':' on
Linux), e.g. `export FASTGNN_DATASETS=$HOME/graphs`; `find("planetoid/cora")`,
`find("tolokers")` and `load("tolokers")` then search below it. Nothing else
is searched: a path given to a loader is read as it is, and `find(name,
dirs=[...])` searches the folders given. `fastgnn bench` takes the same
folder as `--datasets DIR`.

Splits (`train_mask`, `val_mask`, `test_mask`, boolean numpy arrays, None
where the format has none):

    Planetoid       the public split of Yang et al. 2016, as PyG's Planetoid
                    (split="public"): train = the ind.<name>.y rows (20 per
                    class), val = the next 500 nodes, test = ind.<name>.test.index;
                    shape [num_nodes]
    heterophilous   the file's train_masks / val_masks / test_masks (10 splits),
    npz             transposed to [num_nodes, splits] as PyG does; an npz with
                    1-D train_mask / val_mask / test_mask gives [num_nodes]
    OGB             split/<kind>/{train,valid,test}.csv[.gz] beside raw/, as
                    masks [num_nodes] (over graphs, [num_graphs], for ogbg-*)

`GraphData.split(i)` gives the (train, val, test) masks of split i as 1-D
arrays and `num_splits` how many there are.

Edge options, shared by every loader (the defaults give the simple symmetric
graph that the datasets README counts, nnz = 2E):

    symmetrise=True         add the reverse of every edge
    remove_self_loops=True  drop (i, i)
    dedup=True              keep each (src, dst) pair once, sorted by (src, dst)

With dedup=False the edges keep the file's order (reverse copies appended
after the originals). None of them renumbers nodes, so features, labels and
masks stay aligned. Features and labels are returned as stored: `x` is a
dense float32 array or a scipy.sparse CSR matrix (Planetoid, gnn-benchmark,
twitch), `y` int64 with -1 where a node has no label.

Pickled Planetoid files are unpickled with a restricted unpickler that only
builds numpy arrays, scipy sparse matrices and plain containers.
"""
from __future__ import annotations

import glob
import gzip
import io
import json
import os
import pickle
import re
import warnings
import zipfile
from dataclasses import dataclass, field

import numpy as np

from ._edges import graph_stats, sorted_unique

__all__ = ["GraphData", "load", "find", "datasets_dirs", "load_planetoid", "load_npz",
           "load_ogb", "load_edgelist", "load_mtx", "load_tu", "load_karateclub", "graph_stats"]


@dataclass
class GraphData:
    """A graph read from disk. `edge_index` is int64 numpy [2, E]."""
    edge_index: np.ndarray
    num_nodes: int
    name: str
    source: str
    x: object = None                  # [n, d] float32 ndarray or scipy.sparse CSR, or None
    y: np.ndarray | None = None       # [n] int64 node labels (-1: none), or None
    batch: np.ndarray | None = None   # [n] int64 graph id per node (sets of graphs)
    graph_y: np.ndarray | None = None  # [num_graphs] graph labels
    node_ids: np.ndarray | None = None  # original id of each node when the file's ids were relabelled
    notes: list = field(default_factory=list)   # what was missing or changed
    train_mask: np.ndarray | None = None   # bool [n] or [n, splits] (see the module docstring)
    val_mask: np.ndarray | None = None
    test_mask: np.ndarray | None = None

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])

    @property
    def num_graphs(self) -> int:
        return 1 if self.batch is None or not len(self.batch) else int(self.batch.max()) + 1

    @property
    def num_splits(self) -> int:
        """How many train / val / test splits come with the graph (0: none)."""
        if self.train_mask is None:
            return 0
        return 1 if self.train_mask.ndim == 1 else int(self.train_mask.shape[1])

    def split(self, i: int = 0):
        """(train, val, test) boolean masks of split `i`, each 1-D (None for
        a part the file does not have)."""
        if self.train_mask is None:
            raise ValueError(f"{self.name}: no train/val/test split came with this graph "
                             f"(read from {self.source})")
        if not 0 <= i < self.num_splits:
            raise IndexError(f"{self.name}: split {i} of {self.num_splits}")
        return tuple(m if m is None or m.ndim == 1 else m[:, i]
                     for m in (self.train_mask, self.val_mask, self.test_mask))

    def stats(self) -> dict:
        """`graph_stats` of this graph (as `fastgnn.generators.graph_stats`)."""
        return graph_stats(self.edge_index, self.num_nodes, np)

    def __repr__(self):
        extra = []
        if self.x is not None:
            extra.append(f"x={tuple(self.x.shape)}")
        if self.y is not None:
            extra.append("y")
        if self.batch is not None:
            extra.append(f"graphs={self.num_graphs}")
        if self.train_mask is not None:
            extra.append(f"splits={self.num_splits}")
        return (f"GraphData({self.name!r}, num_nodes={self.num_nodes:,}, "
                f"num_edges={self.num_edges:,}{', ' if extra else ''}{', '.join(extra)})")


# ------------------------------------------------------------------ helpers

ENV_VAR = "FASTGNN_DATASETS"
HOW_TO_POINT = (f"set {ENV_VAR} to the folder holding the data sets (several joined with "
                f"{os.pathsep!r}), e.g. `export {ENV_VAR}=$HOME/graphs`, and load them by name, "
                "or give the file's path")


def _finish(src, dst, n, name, source, *, symmetrise=True, remove_self_loops=True, dedup=True,
            **fields) -> GraphData:
    """Validate ids, apply the edge options, build the GraphData."""
    src = np.asarray(src, dtype=np.int64).ravel()
    dst = np.asarray(dst, dtype=np.int64).ravel()
    n = int(n)
    if src.shape != dst.shape:
        raise ValueError(f"{source}: {src.shape[0]} sources but {dst.shape[0]} targets")
    if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n):
        lo, hi = int(min(src.min(), dst.min())), int(max(src.max(), dst.max()))
        raise ValueError(f"{source}: node ids span [{lo}, {hi}] but the graph has {n} nodes")
    if remove_self_loops:
        keep = src != dst
        if not keep.all():
            src, dst = src[keep], dst[keep]
    if symmetrise:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    if dedup and src.size:
        key = sorted_unique(src * n + dst)
        src, dst = key // n, key % n
    ei = np.stack([src, dst]) if src.size else np.zeros((2, 0), dtype=np.int64)
    return GraphData(np.ascontiguousarray(ei), n, name, source, **fields)


def _edge_opts(kw):
    return {k: kw.pop(k) for k in ("symmetrise", "remove_self_loops", "dedup") if k in kw}


def _open_text(path):
    """A text stream of a plain or .gz file."""
    if str(path).endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def _first_data_line(path, comments):
    with _open_text(path) as f:
        for line in f:
            s = line.strip()
            if s and not any(s.startswith(c) for c in comments):
                return s
    return None


def _is_number(tok):
    try:
        float(tok)
        return True
    except ValueError:
        return False


def _read_table(path, *, comments=("#", "%"), delimiter=None, usecols=None, dtype=np.int64,
                ndmin=2):
    """np.loadtxt of a text table, skipping a header line of non-numbers;
    ValueError naming the file when it does not parse."""
    first = _first_data_line(path, comments)
    if first is None:
        return np.zeros((0, len(usecols) if usecols else 0), dtype=dtype)
    toks = [t for t in re.split(r"[\s,;]+" if delimiter is None else re.escape(delimiter), first)
            if t]
    cols = usecols if usecols is not None else range(len(toks))
    header = any(not _is_number(toks[c]) for c in cols if c < len(toks))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)     # "input contained no data"
            with _open_text(path) as f:
                a = np.loadtxt(f, dtype=dtype, comments=list(comments), delimiter=delimiter,
                               usecols=usecols, skiprows=1 if header else 0, ndmin=ndmin)
    except ValueError as exc:
        raise ValueError(f"{path}: cannot read it as a table of numbers "
                         f"(delimiter {delimiter or 'whitespace'!r}): {exc}") from None
    return a


def _require(path, what):
    if not os.path.exists(path):
        raise FileNotFoundError(f"{what}: {path} does not exist ({_missing_hint()})")


def _missing_hint():
    env = os.environ.get(ENV_VAR)
    return f"{ENV_VAR}={env!r}; load(name) searches it" if env else HOW_TO_POINT


def _existing(*cands):
    for c in cands:
        if os.path.exists(c):
            return c
    return None


def _labels_from(a, n):
    """int64 [n] labels from a label vector or one-hot matrix; -1 for rows of zeros."""
    a = np.asarray(a)
    if a.ndim == 2:
        y = a.argmax(axis=1).astype(np.int64)
        y[a.sum(axis=1) == 0] = -1
    else:
        y = a.astype(np.int64).ravel()
    if y.shape[0] < n:
        y = np.concatenate([y, np.full(n - y.shape[0], -1, dtype=np.int64)])
    return y


# ------------------------------------------------------------------ Planetoid

PLANETOID_PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")


class _RestrictedUnpickler(pickle.Unpickler):
    """Builds numpy arrays, scipy sparse matrices and plain containers only."""
    ALLOWED = {("collections", "defaultdict"), ("collections", "OrderedDict"),
               ("builtins", "list"), ("builtins", "dict"), ("builtins", "set"),
               ("__builtin__", "list"), ("__builtin__", "dict"), ("__builtin__", "set"),
               ("builtins", "tuple"), ("builtins", "int"), ("builtins", "float"),
               ("numpy", "ndarray"), ("numpy", "dtype"),
               ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
               ("_codecs", "encode"),                  # bytes in protocol-2 pickles of Python 3
               ("copyreg", "_reconstructor")}          # builds only classes allowed here

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED or (
                module.startswith("scipy.sparse") and name.endswith(("_matrix", "_array"))):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}")


def _unpickle(path):
    with open(path, "rb") as f, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)   # numpy.core / scipy.sparse.csr paths
        return _RestrictedUnpickler(f, encoding="latin1").load()


def _planetoid_locate(path, name):
    """(folder, name) from a folder, an ind.<name>.* file or an ind.<name> prefix."""
    if os.path.isdir(path):
        folder = path
        if name is None:
            found = sorted({os.path.basename(p)[4:-6]
                            for p in glob.glob(os.path.join(path, "ind.*.graph"))})
            if len(found) != 1:
                raise (FileNotFoundError if not found else ValueError)(
                    f"Planetoid: {path} holds {'no ind.<name>.graph file' if not found else 'several datasets: ' + ', '.join(found)}"
                    + ("" if not found else "; pass name=..."))
            name = found[0]
        return folder, name
    base = os.path.basename(path)
    m = re.fullmatch(r"ind\.([^.]+)(?:\..*)?", base)
    if not m:
        raise FileNotFoundError(f"Planetoid: {path} is neither a folder nor an ind.<name>.* file")
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"Planetoid: folder {folder} does not exist")
    return folder, name or m.group(1)


def load_planetoid(path, name=None, **opts) -> GraphData:
    """Planetoid pickles (Cora, CiteSeer, PubMed as in kimiyoung/planetoid):
    `path` is their folder (with `name` = "cora" ... when it holds several),
    any `ind.<name>.*` file, or the `ind.<name>` prefix.

    Needs `ind.<name>.graph`; features need allx + tx + test.index, labels
    ally + ty + test.index, and each is skipped with a warning when a part is
    missing (the shared PubMed copy lacks allx: graph and labels only). The
    test rows are put back in test.index order; test ids without a tx row
    (CiteSeer) get zero features and label -1. Nodes: the largest of the
    graph's keys, its neighbour ids and the label rows (Cora 2,708).

    The masks are the public split, as PyG's Planetoid(split="public"):
    train_mask = the first len(ind.<name>.y) nodes (Cora 140, CiteSeer 120,
    PubMed 60), val_mask = the 500 nodes after them, test_mask = the ids of
    ind.<name>.test.index (1,000). They need test.index and ind.<name>.y (or
    .x, which has as many rows); without them the masks are None and a note
    says why."""
    folder, name = _planetoid_locate(str(path), name)
    part = {p: os.path.join(folder, f"ind.{name}.{p}") for p in PLANETOID_PARTS}
    if not os.path.exists(part["graph"]):
        present = [p for p in PLANETOID_PARTS if os.path.exists(part[p])]
        raise FileNotFoundError(
            f"Planetoid {name!r}: {part['graph']} is missing (the graph is required; "
            f"present: {', '.join(present) or 'nothing'}; features need allx, tx, test.index)")
    adj = _unpickle(part["graph"])
    if not hasattr(adj, "items"):
        raise ValueError(f"{part['graph']}: expected a dict of neighbour lists, got {type(adj).__name__}")
    src, dst = [], []
    for k, nbrs in adj.items():
        nbrs = np.asarray(list(nbrs), dtype=np.int64)
        src.append(np.full(nbrs.shape[0], int(k), dtype=np.int64))
        dst.append(nbrs)
    src = np.concatenate(src) if src else np.zeros(0, np.int64)
    dst = np.concatenate(dst) if dst else np.zeros(0, np.int64)
    n = max(len(adj), int(max(src.max(initial=-1), dst.max(initial=-1))) + 1,
            max((int(k) for k in adj), default=-1) + 1)
    notes = []

    test_idx = None
    if os.path.exists(part["test.index"]):
        test_idx = np.loadtxt(part["test.index"], dtype=np.int64, ndmin=1)

    def rebuild(all_part, test_part, what):
        need = [p for p in (all_part, test_part, "test.index") if not os.path.exists(part[p])]
        if need:
            msg = (f"Planetoid {name!r}: {what} not loaded: "
                   f"{', '.join('ind.%s.%s' % (name, p) for p in need)} missing in {folder}")
            warnings.warn(msg, stacklevel=3)
            notes.append(msg)
            return None
        try:
            a, t = _unpickle(part[all_part]), _unpickle(part[test_part])
        except Exception as exc:  # noqa: BLE001 - an unreadable optional part is not fatal
            msg = f"Planetoid {name!r}: {what} not loaded: {type(exc).__name__}: {exc}"
            warnings.warn(msg, stacklevel=3)
            notes.append(msg)
            return None
        return a, t

    def place(a, t):
        """rows of `a` first, then tx row i at node test_idx[i] (zeros elsewhere)."""
        import scipy.sparse as sp
        if t.shape[0] != test_idx.shape[0]:
            raise ValueError(f"Planetoid {name!r}: {t.shape[0]} test rows but "
                             f"{test_idx.shape[0]} ids in ind.{name}.test.index")
        rows = max(n, a.shape[0], int(test_idx.max(initial=-1)) + 1)
        if sp.issparse(a) or sp.issparse(t):
            a, t = sp.coo_matrix(a), sp.coo_matrix(t)
            return sp.csr_matrix((np.concatenate([a.data, t.data]),
                                  (np.concatenate([a.row, test_idx[t.row]]),
                                   np.concatenate([a.col, t.col]))),
                                 shape=(rows, a.shape[1]))
        a, t = np.asarray(a), np.asarray(t)
        out = np.zeros((rows,) + a.shape[1:], dtype=a.dtype)
        out[: a.shape[0]] = a
        out[test_idx] = t
        return out

    x = y = None
    got = rebuild("allx", "tx", "features")
    if got is not None:
        x = place(*got).astype(np.float32)
    got = rebuild("ally", "ty", "labels")
    if got is not None:
        y = _labels_from(place(*got), n)
    for a in (x, y):
        if a is not None:
            n = max(n, int(a.shape[0]))
    if y is not None and y.shape[0] < n:
        y = _labels_from(y, n)
    if x is not None and x.shape[0] < n:
        import scipy.sparse as sp
        x = (sp.vstack([x, sp.csr_matrix((n - x.shape[0], x.shape[1]), dtype=x.dtype)]).tocsr()
             if sp.issparse(x) else np.concatenate([x, np.zeros((n - x.shape[0], x.shape[1]), x.dtype)]))
    masks = _planetoid_public_split(part, test_idx, n, name, notes)
    return _finish(src, dst, n, name, os.path.join(folder, f"ind.{name}.*"), x=x, y=y,
                   notes=notes, **masks, **opts)


PLANETOID_VAL_SIZE = 500     # validation nodes of the public split, after the training rows


def _planetoid_public_split(part, test_idx, n, name, notes) -> dict:
    """train / val / test masks of the public Planetoid split, or {} with a note."""
    labelled = next((p for p in ("y", "x") if os.path.exists(part[p])), None)
    missing = ([f"ind.{name}.test.index"] if test_idx is None else []) + \
        ([f"ind.{name}.y (or .x)"] if labelled is None else [])
    if missing:
        notes.append(f"Planetoid {name!r}: no public split: {' and '.join(missing)} missing")
        return {}
    try:
        num_train = int(_unpickle(part[labelled]).shape[0])
    except Exception as exc:  # noqa: BLE001 - an unreadable optional part is not fatal
        notes.append(f"Planetoid {name!r}: no public split: ind.{name}.{labelled}: "
                     f"{type(exc).__name__}: {exc}")
        return {}
    bad_ids = test_idx.size and not 0 <= test_idx.min() <= test_idx.max() < n
    if num_train + PLANETOID_VAL_SIZE > n or bad_ids:
        notes.append(f"Planetoid {name!r}: no public split: {num_train} training rows + "
                     f"{PLANETOID_VAL_SIZE} validation nodes or the test ids do not fit "
                     f"{n} nodes")
        return {}
    masks = {k: np.zeros(n, dtype=bool) for k in ("train_mask", "val_mask", "test_mask")}
    masks["train_mask"][:num_train] = True
    masks["val_mask"][num_train:num_train + PLANETOID_VAL_SIZE] = True
    masks["test_mask"][test_idx] = True
    return masks


# ------------------------------------------------------------------ npz


def load_npz(path, **opts) -> GraphData:
    """An `.npz` graph: the heterophilous benchmark format (`edges` int (E, 2),
    0-based; `node_features`, `node_labels`), the gnn-benchmark format
    (directed CSR in `adj_data/adj_indices/adj_indptr/adj_shape`, features
    CSR in `attr_*`, `labels`) or a plain `edge_index` (2, E) with optional
    `num_nodes`, `x`, `y`. Loaded with allow_pickle=False.

    Masks: `train_masks` / `val_masks` / `test_masks` of shape (splits, n)
    (the heterophilous files hold 10 splits) come back transposed, as
    [n, splits]; `train_mask` / `val_mask` / `test_mask` as stored ([n] or
    [n, splits]). Masks shorter than n are padded with False."""
    path = str(path)
    _require(path, "npz graph")
    name = os.path.splitext(os.path.basename(path))[0]
    with np.load(path, allow_pickle=False) as z:
        files = set(z.files)
        x = y = None
        masks = _npz_masks(z, files, path)
        if "edges" in files:
            edges = np.asarray(z["edges"], dtype=np.int64)
            if edges.ndim != 2 or 2 not in edges.shape:
                raise ValueError(f"{path}: 'edges' has shape {edges.shape}, expected (E, 2)")
            if edges.shape[1] != 2:
                edges = edges.T
            src, dst = edges[:, 0], edges[:, 1]
            n = int(max(src.max(initial=-1), dst.max(initial=-1))) + 1
            if "node_features" in files:
                x = np.asarray(z["node_features"], dtype=np.float32)
            if "node_labels" in files:
                y = np.asarray(z["node_labels"]).astype(np.int64)
        elif "adj_indptr" in files:
            missing = [k for k in ("adj_indices", "adj_shape") if k not in files]
            if missing:
                raise ValueError(f"{path}: gnn-benchmark CSR without {', '.join(missing)}")
            indptr = np.asarray(z["adj_indptr"], dtype=np.int64)
            src = np.repeat(np.arange(indptr.shape[0] - 1, dtype=np.int64), np.diff(indptr))
            dst = np.asarray(z["adj_indices"], dtype=np.int64)
            n = int(max(z["adj_shape"]))
            if {"attr_data", "attr_indices", "attr_indptr", "attr_shape"} <= files:
                import scipy.sparse as sp
                x = sp.csr_matrix((z["attr_data"], z["attr_indices"], z["attr_indptr"]),
                                  shape=tuple(z["attr_shape"])).astype(np.float32)
            elif "attr_matrix" in files:
                x = np.asarray(z["attr_matrix"], dtype=np.float32)
            if "labels" in files:
                y = np.asarray(z["labels"]).astype(np.int64)
        elif "edge_index" in files:
            ei = np.asarray(z["edge_index"], dtype=np.int64)
            if ei.ndim != 2 or ei.shape[0] != 2:
                raise ValueError(f"{path}: 'edge_index' has shape {ei.shape}, expected (2, E)")
            src, dst = ei
            n = int(z["num_nodes"]) if "num_nodes" in files else int(ei.max(initial=-1)) + 1
            if "x" in files:
                x = np.asarray(z["x"])
            if "y" in files:
                y = np.asarray(z["y"]).astype(np.int64)
        else:
            raise ValueError(f"{path}: no graph in it: expected 'edges' (heterophilous), "
                             f"'adj_indptr' + 'adj_indices' + 'adj_shape' (gnn-benchmark) or "
                             f"'edge_index'; it has {sorted(files)}")
    for a in (x, y, *masks.values()):
        if a is not None:
            n = max(n, int(a.shape[0]))
    if y is not None and y.ndim > 1:
        y = _labels_from(y, n)
    masks = {k: _mask_rows(m, n) for k, m in masks.items()}
    return _finish(src, dst, n, name, path, x=x, y=y, **masks, **opts)


def _npz_masks(z, files, path):
    """{train_mask, val_mask, test_mask: bool [rows] or [rows, splits]} found in an npz."""
    out = {}
    for part in ("train", "val", "test"):
        if f"{part}_masks" in files:            # (splits, n), as the heterophilous files
            m = np.asarray(z[f"{part}_masks"])
            m = m.T if m.ndim == 2 else m
        elif f"{part}_mask" in files:
            m = np.asarray(z[f"{part}_mask"])
        else:
            continue
        if m.ndim not in (1, 2):
            raise ValueError(f"{path}: the {part} mask has shape {m.shape}, expected "
                             "(n,), (n, splits) or, as *_masks, (splits, n)")
        out[f"{part}_mask"] = m.astype(bool)
    shapes = {m.shape for m in out.values()}
    if len(shapes) > 1:
        raise ValueError(f"{path}: the train / val / test masks differ in shape "
                         f"({', '.join(f'{k} {m.shape}' for k, m in out.items())})")
    return out


def _mask_rows(m, n):
    """A bool mask [rows(, splits)] padded with False to n rows."""
    if m.shape[0] < n:
        m = np.concatenate([m, np.zeros((n - m.shape[0],) + m.shape[1:], dtype=bool)])
    return np.ascontiguousarray(m)


# ------------------------------------------------------------------ OGB


def _ogb_file(folder, stem):
    return _existing(os.path.join(folder, stem + ".csv.gz"), os.path.join(folder, stem + ".csv"))


def load_ogb(path, **opts) -> GraphData:
    """An OGB dataset from its raw csv folder (as the ogb package downloads
    it: `<root>/<dataset>/raw/edge.csv.gz`, `num-node-list.csv.gz`, optional
    `node-feat`, `node-label`, `graph-label`, `num-edge-list`; `.csv` or
    `.csv.gz`). `path` is the dataset folder, its `raw/` folder or the edge
    file. Several lines in num-node-list make a set of graphs whose edges use
    per-graph ids (ogbg-*): they are offset with num-edge-list and `batch` is
    set. Heterogeneous datasets (ogbn-mag's relations/) are not supported.

    The split of `<dataset>/split/<kind>/` ({train,valid,test}.csv[.gz], one
    index per line: nodes, or graphs for ogbg-*) becomes train_mask /
    val_mask / test_mask ([num_nodes], or [num_graphs] for a set of graphs);
    with several kinds the first by name is taken and a note names the rest."""
    path = str(path)
    _require(path, "OGB dataset")
    if os.path.isfile(path):
        raw = os.path.dirname(path) or "."
    elif os.path.isdir(os.path.join(path, "raw")):
        raw = os.path.join(path, "raw")
    else:
        raw = path
    edge = _ogb_file(raw, "edge")
    if edge is None:
        if os.path.isdir(os.path.join(raw, "relations")):
            raise ValueError(f"{raw}: a heterogeneous OGB dataset (relations/); not supported")
        raise FileNotFoundError(f"OGB: {raw} has no edge.csv.gz or edge.csv (the raw folder of an "
                                "OGB dataset holds edge.csv.gz and num-node-list.csv.gz)")
    nn_file = _ogb_file(raw, "num-node-list")
    if nn_file is None:
        raise FileNotFoundError(f"OGB: {raw} has no num-node-list.csv.gz or num-node-list.csv "
                                "(needed for the node count)")
    edges = _read_table(edge, delimiter=",", usecols=(0, 1))
    nn = _read_table(nn_file, delimiter=",", usecols=(0,), ndmin=1).ravel()
    parent = os.path.dirname(os.path.abspath(raw)) if os.path.basename(raw) == "raw" else raw
    name = os.path.basename(os.path.normpath(parent))
    fields = {}
    n = int(nn.sum())
    src, dst = edges[:, 0], edges[:, 1]
    if nn.shape[0] > 1:
        ne_file = _ogb_file(raw, "num-edge-list")
        if ne_file is None:
            raise FileNotFoundError(f"OGB: {raw} lists {nn.shape[0]} graphs but has no "
                                    "num-edge-list.csv[.gz] (needed to offset per-graph ids)")
        ne = _read_table(ne_file, delimiter=",", usecols=(0,), ndmin=1).ravel()
        if int(ne.sum()) != edges.shape[0] or ne.shape[0] != nn.shape[0]:
            raise ValueError(f"{raw}: num-edge-list ({ne.shape[0]} graphs, {int(ne.sum())} edges) "
                             f"does not match edge ({edges.shape[0]}) / num-node-list "
                             f"({nn.shape[0]} graphs)")
        offs = np.repeat(np.concatenate([[0], np.cumsum(nn)[:-1]]), ne)
        src, dst = src + offs, dst + offs
        fields["batch"] = np.repeat(np.arange(nn.shape[0], dtype=np.int64), nn)
        gl = _ogb_file(raw, "graph-label")
        if gl is not None:
            fields["graph_y"] = _read_table(gl, delimiter=",", dtype=np.float64)
    feat = _ogb_file(raw, "node-feat")
    if feat is not None:
        fields["x"] = _read_table(feat, delimiter=",", dtype=np.float32)
    lab = _ogb_file(raw, "node-label")
    if lab is not None:
        yl = _read_table(lab, delimiter=",", dtype=np.float64)
        y = np.full(yl.shape[0], -1, dtype=np.int64)
        ok = np.isfinite(yl[:, 0])
        y[ok] = yl[ok, 0].astype(np.int64)
        fields["y"] = y
    notes = []
    graphs = nn.shape[0] > 1
    fields.update(_ogb_split(parent, int(nn.shape[0]) if graphs else n,
                             "graphs" if graphs else "nodes", notes))
    return _finish(src, dst, n, name, raw, notes=notes, **fields, **opts)


def _ogb_split(folder, size, what, notes) -> dict:
    """Masks over `size` nodes or graphs (`what`) from folder/split/<kind>/{train,valid,test}.csv[.gz], or {}."""
    root = os.path.join(folder, "split")
    kinds = sorted(d for d in os.listdir(root) if _ogb_file(os.path.join(root, d), "train")) \
        if os.path.isdir(root) else []
    if not kinds:
        return {}
    if len(kinds) > 1:
        notes.append(f"OGB: split {kinds[0]!r} read; also in {root}: {', '.join(kinds[1:])}")
    masks = {}
    for part, key in (("train", "train_mask"), ("valid", "val_mask"), ("test", "test_mask")):
        f = _ogb_file(os.path.join(root, kinds[0]), part)
        if f is None:
            continue
        idx = _read_table(f, delimiter=",", usecols=(0,), ndmin=1).ravel()
        if idx.size and not 0 <= idx.min() <= idx.max() < size:
            raise ValueError(f"{f}: indices span [{idx.min()}, {idx.max()}] but there are "
                             f"{size} {what}")
        masks[key] = np.zeros(size, dtype=bool)
        masks[key][idx] = True
    return masks


# ------------------------------------------------------------------ edge lists


def _relabel(src, dst, relabel, num_nodes, path):
    """(src, dst, n, node_ids) after the id policy of load_edgelist."""
    ids = sorted_unique(np.concatenate([src, dst]))
    if ids.size and ids[0] < 0:
        raise ValueError(f"{path}: negative node id {int(ids[0])}")
    node_ids = None
    if relabel == "auto":
        if num_nodes is not None or not ids.size:
            relabel = False
        elif ids[-1] == ids.size - 1:              # 0..n-1, every id used
            relabel = False
        elif ids[0] == 1 and ids[-1] == ids.size:  # 1..n: 1-based
            return src - 1, dst - 1, int(ids.size), ids
        else:
            relabel = True
    if relabel is True:
        src = np.searchsorted(ids, src)
        dst = np.searchsorted(ids, dst)
        n, node_ids = int(ids.size), ids
    elif relabel is False:
        n = int(num_nodes) if num_nodes is not None else (int(ids[-1]) + 1 if ids.size else 0)
    else:
        raise ValueError(f"relabel must be 'auto', True or False, got {relabel!r}")
    return src, dst, n, node_ids


def load_edgelist(path, *, relabel="auto", num_nodes=None, delimiter=None, comments=("#", "%"),
                  name=None, **opts) -> GraphData:
    """A text edge list: one `u v` pair per line, extra columns ignored
    (weights, timestamps, the `{}` of networkx / Network Repository files),
    lines starting with '#' or '%' skipped (SNAP headers), a header line of
    words skipped, whitespace / comma / tab separated (`delimiter` to force
    one), plain or .gz.

    Node ids (`relabel`): "auto" keeps 0..n-1 ids, shifts 1..n ids down by
    one and relabels anything else (gaps, large ids) to 0..n-1 in id order,
    keeping the file ids in `node_ids`; True always relabels; False keeps the
    ids as they are (n = max id + 1, or `num_nodes`)."""
    path = str(path)
    _require(path, "edge list")
    comments = tuple(comments) if not isinstance(comments, str) else (comments,)
    first = _first_data_line(path, comments)
    if delimiter is None and first is not None and "," in first:
        delimiter = ","
    a = _read_table(path, comments=comments, delimiter=delimiter, usecols=(0, 1))
    src, dst = a[:, 0], a[:, 1]
    src, dst, n, node_ids = _relabel(src, dst, relabel, num_nodes, path)
    if name is None:
        name = re.sub(r"\.(txt|edges|el|tsv|csv|edgelist|graph)$", "",
                      re.sub(r"\.(gz|bz2)$", "", os.path.basename(path)))
    return _finish(src, dst, n, name, path, node_ids=node_ids, **opts)


# ------------------------------------------------------------------ Matrix Market


def load_mtx(path, **opts) -> GraphData:
    """A Matrix Market file (`.mtx`, `.mtx.gz`) read with scipy.io.mmread:
    entry (i, j) becomes the edge i -> j; "symmetric" files (lower triangle
    stored) come back with both triangles. Values are ignored (the pattern
    is the graph); the matrix must be square."""
    path = str(path)
    _require(path, "Matrix Market file")
    import scipy.io
    import scipy.sparse as sp
    try:
        m = scipy.io.mmread(path)
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"{path}: scipy.io.mmread cannot read it: {exc}") from None
    m = sp.coo_matrix(m)
    if m.shape[0] != m.shape[1]:
        raise ValueError(f"{path}: a {m.shape[0]} x {m.shape[1]} matrix is not an adjacency "
                         "matrix (must be square)")
    name = re.sub(r"\.mtx(\.gz|\.bz2)?$", "", os.path.basename(path))
    return _finish(m.row, m.col, m.shape[0], name, path, **opts)


# ------------------------------------------------------------------ TU


class _TUSource:
    """Files NAME_<part>.txt of a TU dataset in a zip or a folder."""

    def __init__(self, path, name):
        self.path = path
        self.zip = zipfile.ZipFile(path) if zipfile.is_zipfile(path) else None
        names = self.zip.namelist() if self.zip else [
            os.path.relpath(p, path) for p in glob.glob(os.path.join(path, "**", "*_A.txt"),
                                                        recursive=True)]
        a_files = sorted(p for p in names if p.endswith("_A.txt"))
        if name is not None:
            a_files = [p for p in a_files if os.path.basename(p) == f"{name}_A.txt"]
        if not a_files:
            raise FileNotFoundError(
                f"TU dataset: no {name + '_A.txt' if name else '<NAME>_A.txt'} in {path} "
                "(a TU dataset holds NAME_A.txt and NAME_graph_indicator.txt, optionally "
                "NAME_node_labels.txt, NAME_graph_labels.txt, NAME_node_attributes.txt)")
        if len(a_files) > 1:
            raise ValueError(f"{path} holds several TU datasets "
                             f"({', '.join(os.path.basename(p)[:-6] for p in a_files)}); pass name=...")
        self.prefix = a_files[0][: -len("A.txt")]
        self.name = os.path.basename(self.prefix)[:-1]

    def has(self, part):
        if self.zip:
            return self.prefix + part + ".txt" in self.zip.namelist()
        return os.path.exists(os.path.join(self.path, self.prefix + part + ".txt"))

    def read(self, part, dtype, usecols=None):
        where = self.prefix + part + ".txt"
        if self.zip:
            with self.zip.open(where) as raw:
                text = io.TextIOWrapper(raw, encoding="utf-8")
                return self._load(text, dtype, usecols, where)
        with open(os.path.join(self.path, where), encoding="utf-8") as f:
            return self._load(f, dtype, usecols, where)

    def _load(self, f, dtype, usecols, where):
        try:
            return np.loadtxt(f, dtype=dtype, delimiter=",", usecols=usecols, ndmin=2)
        except ValueError as exc:
            raise ValueError(f"{self.path}: {where} does not parse: {exc}") from None


def load_tu(path, name=None, **opts) -> GraphData:
    """A TU graph-classification dataset from its zip or folder (standard TU
    layout, e.g. MUTAG.zip holding MUTAG/MUTAG_*.txt): NAME_A.txt (1-based
    `i, j` lines, both directions listed) and NAME_graph_indicator.txt (graph
    id of every node) are required; NAME_node_labels.txt (-> y),
    NAME_graph_labels.txt (-> graph_y) and NAME_node_attributes.txt (-> x)
    are read when present. `batch` is the 0-based graph id of each node."""
    path = str(path)
    _require(path, "TU dataset")
    src_ = _TUSource(path, name)
    if not src_.has("graph_indicator"):
        raise FileNotFoundError(f"TU dataset {src_.name}: {src_.prefix}graph_indicator.txt is "
                                f"missing in {path} (it gives the node count and graph ids)")
    a = src_.read("A", np.int64)
    gi = src_.read("graph_indicator", np.int64).ravel()
    n = gi.shape[0]
    fields = {"batch": gi - gi.min() if n else gi}
    if src_.has("node_labels"):
        fields["y"] = src_.read("node_labels", np.int64, usecols=(0,)).ravel()
    if src_.has("graph_labels"):
        fields["graph_y"] = src_.read("graph_labels", np.int64, usecols=(0,)).ravel()
    if src_.has("node_attributes"):
        fields["x"] = src_.read("node_attributes", np.float32)
    return _finish(a[:, 0] - 1, a[:, 1] - 1, n, src_.name, path, **fields, **opts)


# ------------------------------------------------------------------ karateclub


def load_karateclub(path, **opts) -> GraphData:
    """A karateclub dataset. Node level: a folder with `edges.csv` (header
    `id_1,id_2`, 0-based, each undirected edge once) and optional
    `target.csv` (`id,target` -> y) and sparse `features.csv`
    (`node_id,feature_id,value` -> x as CSR); `path` is the folder or the
    edges.csv. Graph level: `graphs.json` (graph id -> [[u, v], ...], ids
    0-based per graph) or its folder: the graphs are stacked block-diagonally
    with `batch`, and `target.csv` gives graph_y."""
    path = str(path)
    _require(path, "karateclub dataset")
    folder = path if os.path.isdir(path) else (os.path.dirname(path) or ".")
    if os.path.basename(path) == "graphs.json" or (
            os.path.isdir(path) and os.path.exists(os.path.join(path, "graphs.json"))):
        return _load_graph_set_json(os.path.join(folder, "graphs.json"), folder, **opts)
    edges_file = path if os.path.isfile(path) else os.path.join(folder, "edges.csv")
    if not os.path.exists(edges_file):
        raise FileNotFoundError(f"karateclub: {folder} has no edges.csv (node-level datasets hold "
                                "edges.csv and target.csv) and no graphs.json (graph-level)")
    e = _read_table(edges_file, delimiter=",", usecols=(0, 1))
    n = int(e.max(initial=-1)) + 1
    fields = {}
    target = os.path.join(folder, "target.csv")
    if os.path.exists(target):
        t = _read_table(target, delimiter=",", usecols=(0, 1))
        n = max(n, int(t[:, 0].max(initial=-1)) + 1)
        y = np.full(n, -1, dtype=np.int64)
        y[t[:, 0]] = t[:, 1]
        fields["y"] = y
    feats = os.path.join(folder, "features.csv")
    if os.path.exists(feats):
        f = _read_table(feats, delimiter=",", usecols=(0, 1, 2), dtype=np.float64)
        if f.size:
            import scipy.sparse as sp
            rows, cols = f[:, 0].astype(np.int64), f[:, 1].astype(np.int64)
            n = max(n, int(rows.max()) + 1)
            fields["x"] = sp.csr_matrix((f[:, 2].astype(np.float32), (rows, cols)),
                                        shape=(n, int(cols.max()) + 1))
    if "y" in fields and fields["y"].shape[0] < n:
        fields["y"] = _labels_from(fields["y"], n)
    name = os.path.basename(os.path.normpath(folder))
    return _finish(e[:, 0], e[:, 1], n, name, edges_file, **fields, **opts)


def _load_graph_set_json(path, folder, **opts):
    with open(path, encoding="utf-8") as f:
        try:
            graphs = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON: {exc}") from None
    if not isinstance(graphs, dict):
        raise ValueError(f"{path}: expected an object mapping graph id to an edge list")
    keys = sorted(graphs, key=lambda k: (0, int(k)) if str(k).isdigit() else (1, str(k)))
    srcs, dsts, sizes = [], [], []
    off = 0
    for k in keys:
        e = np.asarray(graphs[k], dtype=np.int64).reshape(-1, 2)
        size = int(e.max(initial=-1)) + 1
        srcs.append(e[:, 0] + off)
        dsts.append(e[:, 1] + off)
        sizes.append(size)
        off += size
    fields = {"batch": np.repeat(np.arange(len(keys), dtype=np.int64), sizes)}
    target = os.path.join(folder, "target.csv")
    if os.path.exists(target):
        t = _read_table(target, delimiter=",", usecols=(0, 1))
        pos = {str(k): i for i, k in enumerate(keys)}
        gy = np.full(len(keys), -1, dtype=np.int64)
        for gid, lab in t:
            if str(gid) in pos:
                gy[pos[str(gid)]] = lab
        fields["graph_y"] = gy
    name = os.path.basename(os.path.normpath(folder))
    return _finish(np.concatenate(srcs) if srcs else [], np.concatenate(dsts) if dsts else [],
                   off, name, path, **fields, **opts)


# ------------------------------------------------------------------ dispatch

FORMATS = {"planetoid": load_planetoid, "npz": load_npz, "ogb": load_ogb,
           "edgelist": load_edgelist, "snap": load_edgelist, "netrepo": load_edgelist,
           "mtx": load_mtx, "tu": load_tu, "karateclub": load_karateclub}


def detect_format(path) -> str:
    """The loader for a path (see `load`)."""
    path = str(path)
    base = os.path.basename(os.path.normpath(path))
    if not os.path.exists(path):
        if re.fullmatch(r"ind\.[^.]+", base) and glob.glob(path + ".*"):
            return "planetoid"
        raise FileNotFoundError(f"{path} does not exist ({_missing_hint()})")
    if os.path.isdir(path):
        j = lambda *p: os.path.join(path, *p)  # noqa: E731
        if glob.glob(j("ind.*.graph")):
            return "planetoid"
        if _ogb_file(j("raw"), "edge") or _ogb_file(path, "edge"):
            return "ogb"
        if os.path.exists(j("edges.csv")) or os.path.exists(j("graphs.json")):
            return "karateclub"
        if glob.glob(j("*_A.txt")) or glob.glob(j("*", "*_A.txt")):
            return "tu"
        raise ValueError(f"{path}: a folder without a known graph layout (looked for "
                         "ind.<name>.graph, raw/edge.csv[.gz], edges.csv, graphs.json, *_A.txt)")
    if base.startswith("ind."):
        return "planetoid"
    low = base.lower()
    if low.endswith(".npz"):
        return "npz"
    if re.search(r"\.mtx(\.gz|\.bz2)?$", low):
        return "mtx"
    if low.endswith(".zip"):
        return "tu"
    if base in ("edges.csv", "graphs.json"):
        return "karateclub"
    if re.fullmatch(r"edge\.csv(\.gz)?", base):
        return "ogb"
    if base.endswith("_A.txt"):
        return "tu"
    return "edgelist"


def load(path, format=None, **opts) -> GraphData:
    """Load a graph file or folder, choosing the loader from the path (or
    `format`: planetoid, npz, ogb, edgelist / snap / netrepo, mtx, tu,
    karateclub). A folder with ind.<name>.graph is Planetoid, with
    raw/edge.csv[.gz] OGB, with edges.csv or graphs.json karateclub, with
    *_A.txt TU; a file by its extension (.npz, .mtx, .zip), name (ind.*,
    edges.csv, edge.csv.gz, *_A.txt), else a text edge list. Options go to
    the loader (symmetrise, remove_self_loops, dedup, name, relabel, ...).

    A relative path that does not exist is taken for a data set's name and
    looked up with `find` under $FASTGNN_DATASETS (`load("tolokers")`,
    `load("planetoid/cora")`)."""
    path = str(path)
    if not os.path.isabs(path) and not os.path.exists(path) and not glob.glob(path + ".*"):
        try:
            path = find(path)
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"{path} does not exist, and no data set by that name: "
                                    f"{exc}") from None
    fmt = format or detect_format(path)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(sorted(FORMATS))}")
    if fmt == "tu" and os.path.isfile(path) and path.endswith("_A.txt"):
        return load_tu(os.path.dirname(path) or ".", name=os.path.basename(path)[:-6], **opts)
    return FORMATS[fmt](path, **opts)


def datasets_dirs(extra=()):
    """Folders searched by `find`: those in `extra` (e.g. `fastgnn bench
    --datasets DIR`), then those in $FASTGNN_DATASETS (joined with
    os.pathsep), each once and only where it exists."""
    cands = [str(d) for d in extra] + os.environ.get(ENV_VAR, "").split(os.pathsep)
    seen, out = set(), []
    for c in cands:
        c = os.path.expanduser(c)
        if c and os.path.isdir(c) and os.path.realpath(c) not in seen:
            seen.add(os.path.realpath(c))
            out.append(os.path.normpath(os.path.abspath(c)))
    return out


def _where_searched(dirs):
    if dirs:
        return f"searched {', '.join(dirs)}"
    env = os.environ.get(ENV_VAR)
    return (f"{ENV_VAR}={env!r} names no existing folder" if env
            else f"no datasets folder: {ENV_VAR} is not set") + f"; {HOW_TO_POINT}"


_EXTS = (".npz", ".mtx", ".mtx.gz", ".zip", ".txt", ".txt.gz", ".edges", ".el", ".csv.gz", ".tsv")


def find(name, dirs=None) -> str:
    """The path of a dataset by name, searched under `dirs` (default
    `datasets_dirs()`, i.e. $FASTGNN_DATASETS): an existing path is returned as is; else a path
    relative to a datasets folder, else a file or folder named NAME (or
    NAME.npz / .mtx / .zip / .txt ..., or Planetoid's ind.NAME.graph),
    case-insensitive, anywhere below. A leading folder narrows the search
    (`planetoid/cora`, `gnn_benchmark_npz/cora`). FileNotFoundError if none,
    ValueError listing them if several match."""
    name = str(name)
    if os.path.exists(name):
        return name
    dirs = datasets_dirs() if dirs is None else [str(d) for d in dirs]
    for d in dirs:
        p = os.path.join(d, name)
        if os.path.exists(p):
            return p
    parent, leaf = os.path.split(name.strip("/"))
    want = {leaf.lower()} | {(leaf + e).lower() for e in _EXTS} | {f"ind.{leaf}.graph".lower()}
    hits = []
    for d in dirs:
        for root, subdirs, files in os.walk(d):
            subdirs.sort()
            for entry in sorted(subdirs + files):
                if entry.lower() not in want:
                    continue
                p = os.path.join(root, entry)
                rel = os.path.relpath(p, d)
                if parent and not os.path.dirname(rel).lower().endswith(parent.lower()):
                    continue
                hits.append((rel, p))
    if not hits:
        raise FileNotFoundError(f"dataset {name!r} not found ({_where_searched(dirs)})")
    if len(hits) > 1:
        raise ValueError(f"dataset {name!r} is ambiguous: {', '.join(r for r, _ in hits)}; "
                         "name it with its folder, e.g. "
                         f"{os.path.dirname(hits[0][0]) or '.'}/{leaf}")
    return hits[0][1]
