"""fastgnn.Graph: construction, ordering, caches and validation (CPU and GPU)."""
import numpy as np
import pytest
import scipy.sparse as sp

from fastgnn import Graph
from fastgnn.testing import awkward_edge_index, devices, to_device, to_numpy


@pytest.mark.parametrize("device", devices())
def test_csr_by_destination_keeps_caller_order(device, seed):
    ei = awkward_edge_index(200, 1500, seed=seed)
    g = Graph.from_edge_index(to_device(ei, device), num_nodes=200)
    indptr, indices, ids = map(to_numpy, (g.indptr, g.indices, g.edge_ids))
    assert g.num_edges == ei.shape[1] and g.index_dtype == np.int32
    # each CSR position points back at a caller edge with the same endpoints
    np.testing.assert_array_equal(indices, ei[0][ids])
    rows = np.repeat(np.arange(200), np.diff(indptr))
    np.testing.assert_array_equal(rows, ei[1][ids])
    # stable: caller ids increase inside every row
    for i in range(200):
        seg = ids[indptr[i]:indptr[i + 1]]
        assert np.all(np.diff(seg) > 0)
    np.testing.assert_array_equal(to_numpy(g.edge_index()), ei)
    np.testing.assert_array_equal(to_numpy(g.in_degree), np.bincount(ei[1], minlength=200))
    np.testing.assert_array_equal(to_numpy(g.out_degree), np.bincount(ei[0], minlength=200))


@pytest.mark.parametrize("device", devices())
def test_transpose_is_cached_reverse_graph(device, seed):
    ei = awkward_edge_index(120, 900, seed=seed, num_src=77)
    g = Graph.from_edge_index(to_device(ei, device), num_src=77, num_dst=120)
    t = g.transpose()
    assert t is g.transpose() and t.num_src == 120 and t.num_dst == 77
    a = sp.csr_matrix((np.arange(1, g.num_edges + 1, dtype=float), to_numpy(g.indices),
                       to_numpy(g.indptr)), shape=(120, 77))
    vals = np.arange(1, g.num_edges + 1, dtype=float)[to_numpy(t.edge_ids)]
    at = sp.csr_matrix((vals, to_numpy(t.indices), to_numpy(t.indptr)), shape=(77, 120))
    assert abs(a.T - at).max() == 0
    # stable: within a source node, its edges keep their CSR order
    t_ptr, t_ids = to_numpy(t.indptr), to_numpy(t.edge_ids)
    for j in range(77):
        assert np.all(np.diff(t_ids[t_ptr[j]:t_ptr[j + 1]]) > 0), j


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("shape", [(120, 77, 900), (40, 40, 0), (0, 30, 0), (30, 0, 0)])
def test_max_in_degree_of_graph_and_transpose(device, shape, seed):
    num_dst, num_src, E = shape
    ei = (awkward_edge_index(num_dst, E, seed=seed, num_src=num_src) if E
          else np.zeros((2, 0), dtype=np.int64))
    g = Graph.from_edge_index(to_device(ei, device), num_src=num_src, num_dst=num_dst)
    t = g.transpose()
    expect_in = int(np.bincount(ei[1], minlength=num_dst).max()) if num_dst else 0
    expect_out = int(np.bincount(ei[0], minlength=num_src).max()) if num_src else 0
    assert g.max_in_degree == expect_in, f"seed {seed}"
    # the transpose's value came with the same copy
    assert t.cache["max_in_degree"] == expect_out and t.max_in_degree == expect_out
    # and the other way round: a transpose asked first brings its graph's
    g2 = Graph.from_edge_index(to_device(ei, device), num_src=num_src, num_dst=num_dst)
    assert g2.transpose().max_in_degree == expect_out and g2.cache["max_in_degree"] == expect_in


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("layout", ["unsorted", "sorted", "strided", "int32", "int64 graph",
                                    "bipartite", "empty", "isolated rows"])
def test_every_input_layout_builds_the_cpu_graph(device, layout, seed):
    """Graph.from_edge_index and transpose() give the same arrays, dtypes and
    self-loop count on every device (the GPU builds with graph.cu's kernels,
    the CPU with array code): unsorted and target-sorted edges (no sort, ids
    = positions), a strided [2, E] view, int32 input, a forced int64 graph, a
    bipartite graph, no edges, and targets past the largest index."""
    rng = np.random.default_rng(seed)
    num_src = num_dst = 60
    kw = {}
    E = 0 if layout == "empty" else 500
    ei = np.stack([rng.integers(0, num_src, E), rng.integers(0, num_dst, E)])
    ei[:, :40] = ei[0, :40]                       # some self-loops
    if layout == "sorted":
        ei = ei[:, np.argsort(ei[1], kind="stable")]
    elif layout == "int32":
        ei = ei.astype(np.int32)
    elif layout == "int64 graph":
        kw["index_dtype"] = np.int64
    elif layout == "bipartite":
        num_src, ei[0] = 90, rng.integers(0, 90, E)
    elif layout == "isolated rows":
        num_dst = 1000
    if layout == "strided":
        # rows of an [E, 2] array: element stride 2
        dev_ei = to_device(np.ascontiguousarray(ei.T), device).T
    else:
        dev_ei = to_device(ei, device)
    g = Graph.from_edge_index(dev_ei, num_src=num_src, num_dst=num_dst, **kw)
    want = Graph.from_edge_index(ei, num_src=num_src, num_dst=num_dst, **kw)
    msg = f"seed {seed} {layout}"
    for got, exp in ((g, want), (g.transpose(), want.transpose())):
        for name in ("indptr", "indices", "edge_ids"):
            a, b = to_numpy(getattr(got, name)), getattr(exp, name)
            assert (a is None) == (b is None), f"{msg}: {name}"
            if b is not None:
                np.testing.assert_array_equal(a, b, err_msg=f"{msg}: {name}")
                assert a.dtype == b.dtype, f"{msg}: {name}"
        assert (got.num_src, got.num_dst) == (exp.num_src, exp.num_dst), msg
    assert g.num_self_loops == want.num_self_loops == int((ei[0] == ei[1]).sum()), msg
    np.testing.assert_array_equal(to_numpy(dev_ei), ei, err_msg=f"{msg}: input changed")


def test_index_dtypes_and_scipy_and_csr():
    ei = awkward_edge_index(50, 300, seed=1)
    g64 = Graph.from_edge_index(ei, num_nodes=50, index_dtype=np.int64)
    assert g64.index_dtype == np.int64
    m = sp.coo_matrix((np.ones(ei.shape[1]), (ei[1], ei[0])), shape=(50, 50))
    gs = Graph.from_scipy(m)
    assert gs.num_edges == m.tocsr().nnz and gs.edge_ids is None
    gc = Graph.from_csr(gs.indptr, gs.indices, num_src=50)
    np.testing.assert_array_equal(gc.indices, gs.indices)


def test_inputs_not_mutated_and_empty_graph():
    ei = awkward_edge_index(30, 100, seed=2)
    before = ei.copy()
    Graph.from_edge_index(ei).transpose()
    np.testing.assert_array_equal(ei, before)
    g = Graph.from_edge_index(np.zeros((2, 0), dtype=np.int64), num_nodes=5)
    assert g.num_edges == 0 and to_numpy(g.indptr).tolist() == [0] * 6
    assert g.transpose().num_edges == 0


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("bad, kwargs, err, words", [
    (np.array([[0, -1], [1, 1]]), {}, ValueError, "negative"),
    (np.array([[0, 5], [1, 1]]), {"num_nodes": 3}, ValueError, "source index 5"),
    (np.array([[0, 1], [1, 9]]), {"num_src": 3, "num_dst": 4}, ValueError, "target index 9"),
    (np.array([0, 1, 2]), {}, ValueError, "shape [2, E]"),
    (np.array([[0.0, 1.0], [1.0, 0.0]]), {}, TypeError, "integers"),
])
def test_bad_edge_index(device, bad, kwargs, err, words):
    with pytest.raises(err, match="edge_index|" + words) as info:
        Graph.from_edge_index(to_device(bad, device), **kwargs)
    assert words in str(info.value)


def test_bad_csr():
    with pytest.raises(ValueError, match="non-decreasing"):
        Graph.from_csr(np.array([0, 2, 1, 3]), np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="end at len"):
        Graph.from_csr(np.array([0, 2]), np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="num_src"):
        Graph.from_csr(np.array([0, 2]), np.array([0, 4]), num_src=3)
    with pytest.raises(TypeError, match="Graph"):
        from fastgnn import spmm
        spmm(np.zeros((2, 3)), np.zeros((3, 2)))


def test_graph_and_its_transpose_are_freed_without_the_cycle_collector():
    """A graph with its transpose, self-looped graph and their caches built
    holds no reference cycle: dropping it frees it (and its device memory)
    at once, with the cyclic garbage collector off; the transpose still
    finds the graph it reverses while that lives."""
    import gc
    import weakref

    from fastgnn.ops.spmm import gcn_norm_weights
    g = Graph.from_edge_index(awkward_edge_index(40, 300, seed=2), num_nodes=40)
    t = g.transpose()
    assert t.transpose() is g
    g2, _ = gcn_norm_weights(g)
    g2.transpose()
    refs = [weakref.ref(x) for x in (g, t, g2)]
    was = gc.isenabled()
    gc.disable()
    try:
        del g, t, g2
        assert [r() for r in refs] == [None, None, None]
    finally:
        if was:
            gc.enable()


def test_a_node_count_past_memory_fails_at_once():
    """A huge num_nodes over a few edges raises MemoryError at once, saying
    what to pass, instead of filling the machine's memory; a large but
    affordable one gives empty rows past the last target."""
    import time
    ei = np.array([[0, 1, 2, 3], [1, 2, 3, 0]])
    t0 = time.perf_counter()
    with pytest.raises(MemoryError, match="largest index"):
        Graph.from_edge_index(ei, num_nodes=10**12)
    assert time.perf_counter() - t0 < 1.0
    g = Graph.from_edge_index(ei, num_nodes=100_000)
    assert g.indptr.shape == (100_001,) and int(g.indptr[5]) == 4 and int(g.indptr[-1]) == 4
    np.testing.assert_array_equal(g.indptr[:5], [0, 1, 2, 3, 4])
