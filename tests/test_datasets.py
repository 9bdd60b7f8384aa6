"""fastgnn.datasets: every loader on tiny files written here, the real files of
../shared/datasets when present (counts from its README), and find/load."""
import gzip
import json
import os
import pickle
import zipfile
from collections import defaultdict

import numpy as np
import pytest

from fastgnn import datasets as ds
from fastgnn import generators as gen

DATASETS = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                                         "datasets"))


def pairs(g):
    return sorted(map(tuple, g.edge_index.T.tolist()))


def undirected(*edges):
    return sorted({(a, b) for a, b in edges} | {(b, a) for a, b in edges})


def check_simple_symmetric(g):
    ei, n = g.edge_index, g.num_nodes
    assert ei.dtype == np.int64 and ei.shape[0] == 2
    assert ei.size == 0 or (ei.min() >= 0 and ei.max() < n)
    assert not (ei[0] == ei[1]).any()
    key = ei[0] * n + ei[1]
    assert np.unique(key).size == key.size
    assert np.array_equal(np.sort(key), np.sort(ei[1] * n + ei[0]))


# ------------------------------------------------------------------ Planetoid


def write_planetoid(folder, name="tiny", skip=()):
    import scipy.sparse as sp
    # 6 nodes: 0..3 labelled (allx), test ids 5, 4 (tx rows in that order)
    allx = sp.csr_matrix(np.arange(4 * 3, dtype=np.float32).reshape(4, 3))
    tx = sp.csr_matrix(np.array([[50, 0, 0], [40, 0, 0]], dtype=np.float32))
    ally = np.eye(2, dtype=np.int32)[[0, 1, 0, 1]]
    ty = np.eye(2, dtype=np.int32)[[1, 0]]
    graph = defaultdict(list, {0: [1, 2], 1: [0], 2: [0, 2], 3: [4], 4: [3], 5: []})
    parts = {"x": allx[:2], "tx": tx, "allx": allx, "y": ally[:2], "ty": ty, "ally": ally,
             "graph": graph}
    for k, v in parts.items():
        if k not in skip:
            with open(folder / f"ind.{name}.{k}", "wb") as f:
                pickle.dump(v, f, protocol=2)
    if "test.index" not in skip:
        (folder / f"ind.{name}.test.index").write_text("5\n4\n")


def test_planetoid(tmp_path):
    write_planetoid(tmp_path)
    for path in (tmp_path, tmp_path / "ind.tiny.graph", str(tmp_path / "ind.tiny")):
        g = ds.load(path)
        assert g.name == "tiny" and g.num_nodes == 6
        assert pairs(g) == undirected((0, 1), (0, 2), (3, 4))      # self-loop 2-2 dropped
        x = g.x.toarray()
        assert x.shape == (6, 3) and x.dtype == np.float32
        assert x[5, 0] == 50 and x[4, 0] == 40 and x[3, 2] == 11   # test rows at their ids
        assert g.y.tolist() == [0, 1, 0, 1, 0, 1]
    g = ds.load_planetoid(tmp_path, "tiny", remove_self_loops=False, symmetrise=False)
    assert (2, 2) in pairs(g) and (1, 0) in pairs(g) and (4, 3) in pairs(g)


def test_planetoid_missing_parts(tmp_path):
    write_planetoid(tmp_path, skip=("allx",))
    with pytest.warns(UserWarning, match="features not loaded: ind.tiny.allx missing"):
        g = ds.load_planetoid(tmp_path)
    assert g.x is None and g.y is not None and g.num_nodes == 6 and g.notes
    (tmp_path / "ind.tiny.graph").unlink()
    with pytest.raises(FileNotFoundError, match=r"ind\.tiny\.graph is missing"):
        ds.load_planetoid(tmp_path, "tiny")
    with pytest.raises(FileNotFoundError, match="no ind.<name>.graph"):
        ds.load_planetoid(tmp_path)


def test_planetoid_refuses_arbitrary_pickles(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))
    write_planetoid(tmp_path)
    with open(tmp_path / "ind.tiny.graph", "wb") as f:
        pickle.dump(Evil(), f, protocol=2)
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        ds.load_planetoid(tmp_path)


def write_planetoid_split(folder, name="split", num_train=4, num_test=3):
    """A Planetoid set big enough for the public split: `num_train` labelled
    training rows (ind.y), 500 more labelled nodes, `num_test` test nodes at
    the end (listed out of order in test.index); a chain graph."""
    import scipy.sparse as sp
    n_all = num_train + ds.PLANETOID_VAL_SIZE
    n = n_all + num_test
    classes = 2
    ally = np.eye(classes, dtype=np.int32)[np.arange(n_all) % classes]
    parts = {"x": sp.csr_matrix(np.ones((num_train, 2), np.float32)),
             "allx": sp.csr_matrix(np.ones((n_all, 2), np.float32)),
             "tx": sp.csr_matrix(np.ones((num_test, 2), np.float32)),
             "y": ally[:num_train], "ally": ally,
             "ty": np.eye(classes, dtype=np.int32)[np.arange(num_test) % classes],
             "graph": defaultdict(list, {i: [i + 1] for i in range(n - 1)})}
    for k, v in parts.items():
        with open(folder / f"ind.{name}.{k}", "wb") as f:
            pickle.dump(v, f, protocol=2)
    test_ids = np.arange(n_all, n)[::-1]
    (folder / f"ind.{name}.test.index").write_text("".join(f"{i}\n" for i in test_ids))
    return n, test_ids


def test_planetoid_public_split(tmp_path):
    n, test_ids = write_planetoid_split(tmp_path)
    g = ds.load(tmp_path)
    assert g.num_nodes == n and g.num_splits == 1 and "splits=1" in repr(g)
    for m in (g.train_mask, g.val_mask, g.test_mask):
        assert m.dtype == bool and m.shape == (n,)
    assert np.flatnonzero(g.train_mask).tolist() == [0, 1, 2, 3]
    assert np.flatnonzero(g.val_mask).tolist() == list(range(4, 4 + ds.PLANETOID_VAL_SIZE))
    assert np.flatnonzero(g.test_mask).tolist() == sorted(test_ids.tolist())
    assert not (g.train_mask & g.val_mask).any() and not (g.val_mask & g.test_mask).any()
    train, val, test = g.split(0)
    assert train is g.train_mask and val is g.val_mask and test is g.test_mask
    with pytest.raises(IndexError):
        g.split(1)
    # the masks do not depend on the edge options
    raw = ds.load_planetoid(tmp_path, symmetrise=False, dedup=False)
    assert np.array_equal(raw.test_mask, g.test_mask)


def test_planetoid_without_a_public_split(tmp_path):
    write_planetoid(tmp_path)               # 6 nodes: 2 training rows + 500 do not fit
    g = ds.load(tmp_path)
    assert g.train_mask is None and g.num_splits == 0
    assert any("no public split" in note for note in g.notes)
    with pytest.raises(ValueError, match="no train/val/test split"):
        g.split()
    (tmp_path / "ind.tiny.test.index").unlink()
    with pytest.warns(UserWarning):
        g = ds.load(tmp_path)
    assert g.train_mask is None
    assert any("ind.tiny.test.index missing" in note for note in g.notes)


# ------------------------------------------------------------------ npz


def test_npz_formats(tmp_path):
    p = tmp_path / "het.npz"
    np.savez(p, edges=np.array([[0, 1], [1, 2], [2, 2], [1, 0]]),
             node_features=np.ones((5, 2), np.float32), node_labels=np.arange(5))
    g = ds.load(p)
    assert g.name == "het" and g.num_nodes == 5 and g.x.shape == (5, 2)
    assert pairs(g) == undirected((0, 1), (1, 2)) and g.y.tolist() == [0, 1, 2, 3, 4]
    assert ds.load_npz(p, symmetrise=False, dedup=False).num_edges == 3

    import scipy.sparse as sp
    adj = sp.csr_matrix(np.array([[0, 1, 0], [0, 0, 1], [0, 0, 0]]))
    attr = sp.csr_matrix(np.eye(3))
    np.savez(tmp_path / "gb.npz", adj_data=adj.data, adj_indices=adj.indices,
             adj_indptr=adj.indptr, adj_shape=adj.shape, attr_data=attr.data,
             attr_indices=attr.indices, attr_indptr=attr.indptr, attr_shape=attr.shape,
             labels=np.array([0, 1, 1], np.int8))
    g = ds.load(tmp_path / "gb.npz")
    assert g.num_nodes == 3 and pairs(g) == undirected((0, 1), (1, 2))
    assert g.x.shape == (3, 3) and g.y.tolist() == [0, 1, 1]

    np.savez(tmp_path / "ei.npz", edge_index=np.array([[0, 3], [3, 0]]), num_nodes=7)
    assert ds.load(tmp_path / "ei.npz").num_nodes == 7

    np.savez(tmp_path / "bad.npz", foo=np.zeros(3))
    with pytest.raises(ValueError, match="no graph in it"):
        ds.load(tmp_path / "bad.npz")
    with pytest.raises(FileNotFoundError):
        ds.load_npz(tmp_path / "absent.npz")
    # the old generators entry point still works
    ei, n = gen.load_npz(str(p))
    assert n == 5 and ei.shape[1] == 4


def test_npz_masks(tmp_path):
    """heterophilous *_masks (splits, n) come back as [n, splits]; 1-D masks as stored."""
    rng = np.random.default_rng(0)
    n, splits = 7, 3
    masks = {k: rng.random((splits, n)) < 0.4 for k in ("train_masks", "val_masks", "test_masks")}
    p = tmp_path / "het.npz"
    np.savez(p, edges=np.array([[0, 1], [1, 2], [5, 6]]), node_labels=np.arange(n), **masks)
    g = ds.load(p)
    assert g.num_splits == splits and "splits=3" in repr(g)
    for key, m in zip(("train_mask", "val_mask", "test_mask"), masks.values()):
        got = getattr(g, key)
        assert got.dtype == bool and got.shape == (n, splits)
        assert np.array_equal(got, m.T)
    for i in range(splits):
        assert all(np.array_equal(a, masks[k][i]) for a, k in zip(g.split(i), masks))

    # one split, 1-D, shorter than the node count (padded with False)
    np.savez(tmp_path / "one.npz", edge_index=np.array([[0, 4], [4, 0]]), num_nodes=6,
             train_mask=np.array([1, 1, 0, 0], bool), val_mask=np.array([0, 0, 1, 0], bool),
             test_mask=np.array([0, 0, 0, 1], bool))
    g = ds.load(tmp_path / "one.npz")
    assert g.num_splits == 1 and g.train_mask.shape == (6,)
    assert g.train_mask.tolist() == [True, True, False, False, False, False]
    assert g.split()[2].tolist() == [False, False, False, True, False, False]

    np.savez(tmp_path / "odd.npz", edges=np.array([[0, 1]]), train_masks=np.ones((2, 2), bool),
             val_masks=np.ones((1, 2), bool))
    with pytest.raises(ValueError, match="differ in shape"):
        ds.load(tmp_path / "odd.npz")
    np.savez(tmp_path / "train_only.npz", edges=np.array([[0, 1]]), train_mask=[True, False])
    train, val, test = ds.load(tmp_path / "train_only.npz").split()
    assert train.tolist() == [True, False] and val is None and test is None
    np.savez(tmp_path / "plain.npz", edges=np.array([[0, 1]]))
    assert ds.load(tmp_path / "plain.npz").train_mask is None


# ------------------------------------------------------------------ OGB


def test_ogb(tmp_path):
    raw = tmp_path / "ogbn_tiny" / "raw"
    raw.mkdir(parents=True)
    with gzip.open(raw / "edge.csv.gz", "wt") as f:
        f.write("0,1\n1,2\n3,2\n")
    with gzip.open(raw / "num-node-list.csv.gz", "wt") as f:
        f.write("5\n")
    with gzip.open(raw / "node-label.csv.gz", "wt") as f:
        f.write("1\n0\n2\nnan\n1\n")
    (raw / "node-feat.csv").write_text("\n".join("0.5,1.5" for _ in range(5)) + "\n")
    for path in (tmp_path / "ogbn_tiny", raw, raw / "edge.csv.gz"):
        g = ds.load(path)
        assert g.name == "ogbn_tiny" and g.num_nodes == 5
        assert pairs(g) == undirected((0, 1), (1, 2), (3, 2))
        assert g.y.tolist() == [1, 0, 2, -1, 1] and g.x.shape == (5, 2)

    # a set of graphs (ogbg-*): per-graph ids offset by num-edge-list
    graw = tmp_path / "ogbg_tiny" / "raw"
    graw.mkdir(parents=True)
    (graw / "edge.csv").write_text("0,1\n1,2\n0,1\n")
    (graw / "num-node-list.csv").write_text("3\n2\n")
    (graw / "num-edge-list.csv").write_text("2\n1\n")
    (graw / "graph-label.csv").write_text("0\n1\n")
    g = ds.load(tmp_path / "ogbg_tiny")
    assert g.num_nodes == 5 and g.batch.tolist() == [0, 0, 0, 1, 1] and g.num_graphs == 2
    assert pairs(g) == undirected((0, 1), (1, 2), (3, 4))
    (graw / "num-edge-list.csv").unlink()
    with pytest.raises(FileNotFoundError, match="num-edge-list"):
        ds.load_ogb(tmp_path / "ogbg_tiny")
    (raw / "num-node-list.csv.gz").unlink()
    with pytest.raises(FileNotFoundError, match="num-node-list"):
        ds.load_ogb(tmp_path / "ogbn_tiny")


def test_ogb_split(tmp_path):
    root = tmp_path / "ogbn_split"
    (root / "raw").mkdir(parents=True)
    (root / "raw" / "edge.csv").write_text("0,1\n1,2\n2,3\n")
    (root / "raw" / "num-node-list.csv").write_text("5\n")
    g = ds.load(root)
    assert g.train_mask is None and g.num_splits == 0
    split = root / "split" / "time"
    split.mkdir(parents=True)
    for part, ids in (("train", "0\n1\n"), ("valid", "2\n"), ("test", "3\n4\n")):
        with gzip.open(split / f"{part}.csv.gz", "wt") as f:
            f.write(ids)
    g = ds.load(root)
    assert g.train_mask.tolist() == [True, True, False, False, False]
    assert g.val_mask.tolist() == [False, False, True, False, False]
    assert g.test_mask.tolist() == [False, False, False, True, True] and not g.notes
    (root / "split" / "year").mkdir()
    (root / "split" / "year" / "train.csv").write_text("4\n")
    g = ds.load(root)
    assert g.train_mask.tolist()[:2] == [True, True] and "year" in g.notes[0]
    with gzip.open(split / "test.csv.gz", "wt") as f:
        f.write("9\n")
    with pytest.raises(ValueError, match="5 nodes"):
        ds.load(root)


# ------------------------------------------------------------------ edge lists


def test_snap_edgelist(tmp_path):
    p = tmp_path / "web-Tiny.txt"
    p.write_text("# Directed graph: web-Tiny\n# FromNodeId\tToNodeId\n0\t1\n1\t2\n2\t0\n2\t2\n")
    g = ds.load(p)
    assert g.name == "web-Tiny" and g.num_nodes == 3 and g.node_ids is None
    assert pairs(g) == undirected((0, 1), (1, 2), (2, 0))
    g = ds.load_edgelist(p, symmetrise=False, remove_self_loops=False)
    assert pairs(g) == [(0, 1), (1, 2), (2, 0), (2, 2)]
    # gz, 1-based, a weight column
    with gzip.open(tmp_path / "one.txt.gz", "wt") as f:
        f.write("% comment\n1 2 0.5\n2 3 1.5\n")
    g = ds.load(tmp_path / "one.txt.gz")
    assert g.name == "one" and g.num_nodes == 3 and g.node_ids.tolist() == [1, 2, 3]
    assert pairs(g) == undirected((0, 1), (1, 2))
    # non-contiguous ids are relabelled in id order; relabel=False keeps them
    (tmp_path / "gaps.txt").write_text("10 30\n30 20\n")
    g = ds.load(tmp_path / "gaps.txt")
    assert g.num_nodes == 3 and g.node_ids.tolist() == [10, 20, 30]
    assert pairs(g) == undirected((0, 2), (2, 1))
    g = ds.load_edgelist(tmp_path / "gaps.txt", relabel=False)
    assert g.num_nodes == 31 and g.node_ids is None
    with pytest.raises(ValueError, match="node ids span"):
        ds.load_edgelist(tmp_path / "gaps.txt", relabel=False, num_nodes=20)
    (tmp_path / "bad.txt").write_text("1 2\nthree 4\n")
    with pytest.raises(ValueError, match="bad.txt"):
        ds.load(tmp_path / "bad.txt")


def test_netrepo_edgelist(tmp_path):
    p = tmp_path / "ca-Tiny.txt"
    p.write_text("2 3 {}\n2 5 {}\n5 3 {}\n3 2 {}\n")      # ids 2..5 with 4 unused
    g = ds.load(p)
    assert g.num_nodes == 3 and g.node_ids.tolist() == [2, 3, 5]
    assert g.num_edges == 6
    (tmp_path / "csv.csv").write_text("src,dst\n0,1\n1,2\n")
    assert ds.load(tmp_path / "csv.csv").num_edges == 4


# ------------------------------------------------------------------ Matrix Market


def test_mtx(tmp_path):
    import scipy.io
    import scipy.sparse as sp
    lower = sp.coo_matrix(([1.0, 1.0, 2.0], ([1, 2, 2], [0, 1, 2])), shape=(4, 4))
    scipy.io.mmwrite(str(tmp_path / "sym.mtx"), lower + sp.triu(lower.T, 1), symmetry="symmetric")
    g = ds.load(tmp_path / "sym.mtx")
    assert g.name == "sym" and g.num_nodes == 4 and g.stats()["isolated_nodes"] == 1
    assert pairs(g) == undirected((1, 0), (2, 1))
    g = ds.load_mtx(tmp_path / "sym.mtx", symmetrise=False, remove_self_loops=False)
    assert (2, 2) in pairs(g) and g.num_edges == 5        # mmread returns both triangles
    scipy.io.mmwrite(str(tmp_path / "rect.mtx"), sp.coo_matrix(np.ones((2, 3))))
    with pytest.raises(ValueError, match="square"):
        ds.load(tmp_path / "rect.mtx")
    (tmp_path / "junk.mtx").write_text("not a matrix\n")
    with pytest.raises(ValueError, match="mmread"):
        ds.load(tmp_path / "junk.mtx")


# ------------------------------------------------------------------ TU


TU_FILES = {"A": "1, 2\n2, 1\n2, 3\n3, 2\n4, 5\n5, 4\n", "graph_indicator": "1\n1\n1\n2\n2\n",
            "graph_labels": "1\n-1\n", "node_labels": "0\n1\n0\n2\n2\n",
            "node_attributes": "0.5, 1\n1, 1\n2, 1\n3, 1\n4, 1\n"}


def check_tu(g):
    assert g.name == "TINY" and g.num_nodes == 5 and g.num_graphs == 2
    assert g.batch.tolist() == [0, 0, 0, 1, 1] and g.graph_y.tolist() == [1, -1]
    assert g.y.tolist() == [0, 1, 0, 2, 2] and g.x.shape == (5, 2) and g.x[0, 0] == 0.5
    assert pairs(g) == undirected((0, 1), (1, 2), (3, 4))


def test_tu_zip_and_folder(tmp_path):
    z = tmp_path / "TINY.zip"
    with zipfile.ZipFile(z, "w") as f:
        for part, text in TU_FILES.items():
            f.writestr(f"TINY/TINY_{part}.txt", text)
    check_tu(ds.load(z))
    folder = tmp_path / "tu" / "TINY"
    folder.mkdir(parents=True)
    for part, text in TU_FILES.items():
        (folder / f"TINY_{part}.txt").write_text(text)
    check_tu(ds.load(folder))
    check_tu(ds.load(tmp_path / "tu"))                      # one level up
    check_tu(ds.load(folder / "TINY_A.txt"))
    (folder / "TINY_graph_indicator.txt").unlink()
    with pytest.raises(FileNotFoundError, match="graph_indicator"):
        ds.load_tu(folder)
    with pytest.raises(FileNotFoundError, match="_A.txt"):
        ds.load_tu(tmp_path / "tu" / "TINY", name="OTHER")


# ------------------------------------------------------------------ karateclub


def test_karateclub(tmp_path):
    d = tmp_path / "lastfm"
    d.mkdir()
    (d / "edges.csv").write_text("id_1,id_2\n0,1\n1,2\n2,2\n")
    (d / "target.csv").write_text("id,target\n0,3\n1,4\n2,5\n3,6\n")
    (d / "features.csv").write_text("node_id,feature_id,value\n0,2,1\n3,0,1\n")
    for path in (d, d / "edges.csv"):
        g = ds.load(path)
        assert g.name == "lastfm" and g.num_nodes == 4          # node 3 only in target.csv
        assert pairs(g) == undirected((0, 1), (1, 2)) and g.y.tolist() == [3, 4, 5, 6]
        assert g.x.shape == (4, 3) and g.x[0, 2] == 1
    s = tmp_path / "reddit_tiny"
    s.mkdir()
    (s / "graphs.json").write_text(json.dumps({"0": [[0, 1], [1, 2]], "1": [[0, 1]]}))
    (s / "target.csv").write_text("id,target\n0,1\n1,0\n")
    g = ds.load(s)
    assert g.num_nodes == 5 and g.batch.tolist() == [0, 0, 0, 1, 1]
    assert g.graph_y.tolist() == [1, 0] and pairs(g) == undirected((0, 1), (1, 2), (3, 4))
    with pytest.raises(FileNotFoundError, match="edges.csv"):
        ds.load_karateclub(tmp_path)


# ------------------------------------------------------------------ dispatch, find


def test_load_and_find_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ds.load(tmp_path / "nothing.npz")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="without a known graph layout"):
        ds.load(tmp_path / "empty")
    with pytest.raises(ValueError, match="unknown format"):
        ds.load(tmp_path, format="graphml")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    np.savez(tmp_path / "a" / "g.npz", edges=np.array([[0, 1]]))
    (tmp_path / "b" / "g.txt").write_text("0 1\n")
    with pytest.raises(ValueError, match="ambiguous"):
        ds.find("g", [tmp_path])
    assert ds.find("a/g", [tmp_path]).endswith(os.path.join("a", "g.npz"))
    assert ds.find("B/G", [tmp_path]).endswith(os.path.join("b", "g.txt"))
    assert ds.find("a/g.npz", [tmp_path]) == os.path.join(str(tmp_path), "a", "g.npz")
    with pytest.raises(FileNotFoundError, match="not found"):
        ds.find("zzz", [tmp_path])


def test_graph_stats_keys():
    # a star into node 0 plus an isolated node 5
    ei = np.array([[1, 2, 3, 4], [0, 0, 0, 0]])
    s = gen.graph_stats(ei, 6)
    assert s["max_in_degree"] == 4 and s["isolated_nodes"] == 1 and s["zero_in_degree"] == 5
    assert s["in_degree_skew"] == pytest.approx(4 / (4 / 6), rel=1e-3)
    assert 0.8 < s["in_degree_gini"] <= 1
    assert s["edge_span_mean"] == pytest.approx(2.5 / 6, rel=1e-3)
    assert s["edge_span_max"] == pytest.approx(4 / 6, rel=1e-3) and s["self_loops"] == 0
    ei, n = gen.grid(8)
    s = gen.graph_stats(ei, n)
    assert s["in_degree_gini"] < 0.1 and s["edge_span_max"] == pytest.approx(8 / 64)
    assert gen.graph_stats(np.zeros((2, 0), np.int64), 3)["isolated_nodes"] == 3


# ------------------------------------------------------------------ real files


def real(*parts):
    p = os.path.join(DATASETS, *parts)
    if not os.path.exists(p):
        pytest.skip(f"{p} absent (../shared/datasets is optional)")
    return p


def und(g):
    """(n, undirected E, max degree) after the README's counting rules."""
    check_simple_symmetric(g)
    return g.num_nodes, g.num_edges // 2, g.stats()["max_in_degree"]


@pytest.mark.parametrize("name,n,E,dmax,feat", [
    ("cora", 2708, 5278, 168, 1433), ("citeseer", 3327, 4552, 99, 3703)])
def test_real_planetoid(name, n, E, dmax, feat):
    g = ds.load_planetoid(real("planetoid"), name)
    assert und(g) == (n, E, dmax)
    assert g.x.shape == (n, feat) and g.y.shape == (n,)
    if name == "citeseer":
        assert g.stats()["isolated_nodes"] == 48 and (g.y == -1).sum() == 15


def test_real_pubmed_without_allx():
    p = real("planetoid", "ind.pubmed.graph")
    if os.path.exists(os.path.join(DATASETS, "planetoid", "ind.pubmed.allx")):
        pytest.skip("this copy has ind.pubmed.allx")
    with pytest.warns(UserWarning, match="allx missing"):
        g = ds.load(p)
    assert und(g) == (19717, 44324, 171) and g.x is None and g.y.max() == 2


@pytest.mark.parametrize("parts,n,E,dmax", [
    (("gnn_benchmark_npz", "cora.npz"), 2708, 5278, 168),
    (("heterophilous", "tolokers.npz"), 11758, 519000, 2138),
    (("heterophilous", "minesweeper.npz"), 10000, 39402, 8),
    (("suitesparse_mtx", "karate.mtx"), 34, 78, 17),
    (("suitesparse_mtx", "bcsstk13.mtx"), 2003, 40940, None),
    (("netrepo_edgelists", "ca-HepPh.txt"), 11203, 117618, 491),
    (("netrepo_edgelists", "soc-wiki-Vote.txt"), 889, 2914, 102),
    (("karateclub", "node_level", "github"), 37700, 289003, 9458),
    (("karateclub", "node_level", "facebook"), 22470, 170823, 709),
])
def test_real_graphs(parts, n, E, dmax):
    g = ds.load(real(*parts))
    got = und(g)
    assert got[:2] == (n, E)
    if dmax is not None:
        assert got[2] == dmax


def test_real_tu_and_graph_sets():
    g = ds.load(real("tu_cleaned", "MUTAG.zip"))
    assert (g.num_graphs, g.num_nodes, g.num_edges // 2) == (135, 2545, 2813)
    assert g.graph_y.shape == (135,) and g.y.shape == (2545,)
    p = real("karateclub", "graph_level", "reddit10k")
    raw = ds.load(p, symmetrise=False, dedup=False, remove_self_loops=False)
    assert (raw.num_graphs, raw.num_nodes, raw.num_edges) == (10000, 237390, 247549)
    sizes = np.bincount(raw.batch)
    assert sizes.min() == 11 and sizes.max() == 97 and raw.graph_y.shape == (10000,)


def test_real_find_names():
    real()
    assert ds.find("tolokers", [DATASETS]).endswith("tolokers.npz")
    assert ds.find("planetoid/cora", [DATASETS]).endswith("ind.cora.graph")
    with pytest.raises(ValueError, match="ambiguous"):
        ds.find("cora", [DATASETS])


def test_datasets_folder_from_the_environment(tmp_path, monkeypatch):
    """find / load(name) search $FASTGNN_DATASETS (several folders joined with
    os.pathsep) and nothing else; without it the error says how to set it."""
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "het").mkdir(parents=True)
    b.mkdir()
    np.savez(a / "het" / "one.npz", edges=np.array([[0, 1]]))
    (b / "two.txt").write_text("0 1\n1 2\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ds.ENV_VAR, raising=False)
    assert ds.datasets_dirs() == []
    with pytest.raises(FileNotFoundError, match=f"{ds.ENV_VAR} is not set.*export"):
        ds.find("one")
    with pytest.raises(FileNotFoundError, match=f"does not exist.*{ds.ENV_VAR}"):
        ds.load("two")
    with pytest.raises(FileNotFoundError, match=ds.ENV_VAR):
        ds.load_npz(tmp_path / "absent.npz")
    monkeypatch.setenv(ds.ENV_VAR, os.pathsep.join([str(a), str(tmp_path / "gone"), str(b)]))
    assert ds.datasets_dirs() == [str(a), str(b)]
    assert ds.datasets_dirs(extra=[b]) == [str(b), str(a)]
    assert ds.find("one") == str(a / "het" / "one.npz")
    assert ds.load("het/one").num_nodes == 2 and ds.load("two").num_nodes == 3
    with pytest.raises(FileNotFoundError, match="searched"):
        ds.find("three")


def test_datasets_does_not_import_generators():
    """fastgnn.datasets and fastgnn.generators share fastgnn._edges, not each other."""
    import subprocess
    import sys
    code = ("import sys, fastgnn.datasets; "
            "assert 'fastgnn.generators' not in sys.modules, 'datasets imports generators'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name,train,n", [("cora", 140, 2708), ("citeseer", 120, 3327),
                                          ("pubmed", 60, 19717)])
def test_real_planetoid_public_split(name, train, n):
    real("planetoid", f"ind.{name}.graph")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                  # PubMed's missing allx
        g = ds.load_planetoid(real("planetoid"), name)
    assert g.num_nodes == n and g.num_splits == 1
    assert [int(m.sum()) for m in g.split()] == [train, 500, 1000]
    assert np.flatnonzero(g.train_mask).tolist() == list(range(train))
    assert not (g.val_mask & g.test_mask).any() and not (g.train_mask & g.test_mask).any()
    assert (g.y[g.train_mask] >= 0).all()
    assert np.bincount(g.y[g.train_mask]).tolist() == [20] * (int(g.y.max()) + 1)


@pytest.mark.parametrize("name", ["cora", "citeseer"])
def test_real_planetoid_split_matches_pyg(name, tmp_path):
    """The masks equal PyG's Planetoid(split="public") built from the same files."""
    import shutil
    import warnings
    real("planetoid", f"ind.{name}.graph")
    pytest.importorskip("torch")
    datasets = pytest.importorskip("torch_geometric.datasets")
    pyg_name = {"cora": "Cora", "citeseer": "CiteSeer"}[name]
    raw = tmp_path / pyg_name / "raw"
    raw.mkdir(parents=True)
    for part in ds.PLANETOID_PARTS:
        shutil.copy(real("planetoid", f"ind.{name}.{part}"), raw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = datasets.Planetoid(str(tmp_path), pyg_name, split="public")[0]
    g = ds.load_planetoid(real("planetoid"), name)
    assert ref.num_nodes == g.num_nodes
    for key in ("train_mask", "val_mask", "test_mask"):
        assert np.array_equal(getattr(ref, key).numpy(), getattr(g, key)), key


@pytest.mark.parametrize("file", ["texas.npz", "chameleon_filtered.npz", "minesweeper.npz",
                                  "tolokers.npz"])
def test_real_heterophilous_masks(file):
    p = real("heterophilous", file)
    g = ds.load(p)
    with np.load(p) as z:
        file_masks = [z[k] for k in ("train_masks", "val_masks", "test_masks")]
    splits = file_masks[0].shape[0]
    assert splits == 10 and g.num_splits == splits
    for got, want in zip((g.train_mask, g.val_mask, g.test_mask), file_masks):
        assert got.shape == (g.num_nodes, splits) and np.array_equal(got, want.T)
    for i in range(splits):
        train, val, test = g.split(i)
        assert not (train & val).any() and not (train & test).any() and not (val & test).any()
        assert train.sum() > 0 and test.sum() > 0
