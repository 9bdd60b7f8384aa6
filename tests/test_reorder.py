"""Node orders (fastgnn.reorder): valid permutations, results unchanged in
the caller's order, the locality they buy, and the auto rule."""
import sys

import numpy as np
import pytest

import fastgnn
from fastgnn import Graph, generators
from fastgnn.backends.attention_spec import SCORE_INPUTS
from fastgnn.reorder import (METHODS, Permutation, locality, order, permute_edge_index,
                             permute_edges, permute_nodes, unpermute_nodes)

HOST_METHODS = ("rcm", "degree", "cluster", "random", "identity", "auto")


def messy_edges(rng, n=150):
    """A graph with everything awkward: isolated nodes (the last 20), rows
    without in-edges, self-loops, duplicate edges, an in-hub and an out-hub;
    columns shuffled."""
    body = rng.integers(0, n - 20, (2, 400))
    body[1, body[1] % 7 == 0] += 1          # some targets never hit -> empty rows
    body[1] = np.minimum(body[1], n - 21)
    hub_in = np.stack([rng.integers(0, n - 20, 60), np.full(60, 3)])
    hub_out = np.stack([np.full(50, 5), rng.integers(0, n - 20, 50)])
    loops = np.stack([np.arange(10, 20)] * 2)
    ei = np.concatenate([body, hub_in, hub_out, loops], axis=1)
    ei = np.concatenate([ei, ei[:, :25]], axis=1)                   # duplicates
    return ei[:, rng.permutation(ei.shape[1])], n


def shuffled(ei, n, rng):
    return rng.permutation(n)[ei], n


def check_permutation(p, n):
    assert isinstance(p, Permutation)
    assert p.perm.dtype == np.int64 and p.inverse.dtype == np.int64
    assert p.perm.shape == (n,) and p.inverse.shape == (n,)
    assert np.array_equal(np.sort(p.perm), np.arange(n))
    assert np.array_equal(p.inverse[p.perm], np.arange(n))
    assert np.array_equal(p.perm[p.inverse], np.arange(n))
    assert p.time_s >= 0


# ------------------------------------------------------------ permutations
def test_pattern_is_the_symmetric_csr_without_loops_or_duplicates(rng):
    """The pattern the orders start from: A + A^T as CSR, sorted rows, no
    self-loops, each neighbour once, empty rows kept; int64 indptr."""
    from fastgnn.reorder import _Input
    ei, n = messy_edges(rng)
    ei = np.concatenate([ei, ei[:, :40], ei[::-1, :40], np.stack([np.arange(6), np.arange(6)])],
                        axis=1)
    n += 3                                       # isolated nodes at the end
    indptr, indices = _Input(ei[0].astype(np.int64), ei[1].astype(np.int64), n).pattern()
    s, d = ei[:, ei[0] != ei[1]]
    want = sorted(set(zip(s.tolist(), d.tolist())) | set(zip(d.tolist(), s.tolist())))
    got = [(r, int(c)) for r in range(n) for c in indices[indptr[r]:indptr[r + 1]]]
    assert got == want
    assert indptr.dtype == np.int64 and indptr.shape == (n + 1,) and indptr[-1] == len(want)


@pytest.mark.parametrize("method", HOST_METHODS)
def test_every_order_is_a_permutation(method, rng):
    ei, n = messy_edges(rng)
    g = Graph.from_edge_index(ei, num_nodes=n)
    from_graph = order(g, method, seed=3)
    from_edges = order(ei, method, seed=3, num_nodes=n)
    check_permutation(from_graph, n)
    check_permutation(from_edges, n)
    assert from_graph.method == method
    # the same graph gives the same order whichever form it comes in
    assert np.array_equal(from_graph.perm, from_edges.perm)
    # degenerate graphs: no edges, no nodes
    check_permutation(order(np.zeros((2, 0), dtype=np.int64), method, num_nodes=7), 7)
    check_permutation(order(np.zeros((2, 0), dtype=np.int64), method), 0)


@pytest.mark.parametrize("method", ("rcm", "cluster", "degree"))
def test_orders_on_larger_graphs_are_permutations(method, seed):
    for ei, n in (generators.rmat(12, seed=seed), generators.clustered(4096, seed=seed),
                  generators.molecules(40, seed=seed)):
        check_permutation(order(ei, method, num_nodes=n, seed=seed), n)


def test_seeded_methods_repeat(rng):
    ei, n = messy_edges(rng)
    for m in ("random", "cluster"):
        assert np.array_equal(order(ei, m, seed=5).perm, order(ei, m, seed=5).perm)
    assert not np.array_equal(order(ei, "random", seed=5).perm, order(ei, "random", seed=6).perm)


def test_degree_order_is_descending_and_stable(rng):
    ei, n = messy_edges(rng)
    p = order(ei, "degree", num_nodes=n)
    d = np.bincount(ei[1], minlength=n)[p.perm]
    assert (np.diff(d) <= 0).all()
    assert p.perm[0] == 3                               # the in-hub first
    for deg in np.unique(d):                            # ties keep the old order
        assert (np.diff(p.perm[d == deg]) > 0).all()
    assert order(ei, "degree", num_nodes=n, degree="out").perm[0] == 5


def test_cluster_finds_planted_blocks(seed):
    ei, n = generators.clustered(4096, block=64, random_per_node=0, seed=seed)
    ei, n = shuffled(ei, n, np.random.default_rng(seed))
    p = order(ei, "cluster", seed=seed)
    assert locality(ei[0], ei[1], p.inverse)["window_fraction"] > 0.7
    assert p.info["clusters"] >= n // 64 // 2


def test_metis_needs_the_extra(rng, monkeypatch):
    ei, n = messy_edges(rng)
    monkeypatch.setitem(sys.modules, "pymetis", None)
    with pytest.raises(ImportError, match=r"fastgnn\[metis\]"):
        order(ei, "metis")


def test_metis_order(rng):
    pytest.importorskip("pymetis")
    ei, n = messy_edges(rng)
    check_permutation(order(ei, "metis", parts=4, num_nodes=n), n)
    check_permutation(order(ei, "metis", part_size=1000, num_nodes=n), n)
    check_permutation(order(ei, "metis", part_size=16, num_nodes=n, seed=2), n)


def test_validation(rng):
    ei, n = messy_edges(rng)
    g = Graph.from_edge_index(ei, num_nodes=n)
    with pytest.raises(ValueError, match="method must be one of"):
        order(ei, "rabbit")
    with pytest.raises(TypeError, match="method must be a string"):
        order(ei, 3)
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['window'\]"):
        order(ei, "rcm", window=3)
    with pytest.raises(ValueError, match="degree must be"):
        order(ei, "degree", degree="sideways")
    with pytest.raises(TypeError, match="seed must be an integer"):
        order(ei, "random", seed=1.5)
    with pytest.raises(ValueError, match="shape"):
        order(ei[0], "rcm")
    with pytest.raises(TypeError, match="graph_or_edge_index"):
        order("edges", "rcm")
    with pytest.raises(ValueError, match="num_nodes"):
        order(ei, "rcm", num_nodes=10)
    with pytest.raises(ValueError, match="num_nodes is taken from the graph"):
        order(g, "rcm", num_nodes=n)
    with pytest.raises(ValueError, match="candidates"):
        order(ei, "auto", candidates=("metis",))
    bip = Graph.from_edge_index(np.array([[0, 1], [0, 2]]), num_src=2, num_dst=3)
    with pytest.raises(ValueError, match="bipartite"):
        order(bip, "rcm")
    with pytest.raises(ValueError, match="square"):
        bip.reorder("rcm")
    with pytest.raises(ValueError, match="not a permutation"):
        g.reorder(np.zeros(n, dtype=np.int64))
    with pytest.raises(ValueError, match="nodes"):
        g.reorder(np.arange(n - 1))
    with pytest.raises(TypeError, match="method_or_permutation"):
        g.reorder(None)
    with pytest.raises(TypeError, match="apply only with a method name"):
        g.reorder(np.arange(n), degree="in")
    with pytest.raises(ValueError, match="rows"):
        permute_nodes(np.zeros((n + 1, 2)), g.reorder("rcm"))
    with pytest.raises(ValueError, match="without a permutation"):
        permute_nodes(np.zeros((n, 2)), g)


# ------------------------------------------------------------ applying orders
def test_reordered_graph_structure(rng):
    ei, n = messy_edges(rng)
    g = Graph.from_edge_index(ei, num_nodes=n)
    g2 = g.reorder("rcm")
    p = g2.permutation
    assert g.permutation is None and g2.transpose().permutation is p
    assert g2.to("cpu").permutation is p
    # caller edge order kept: its edge index is the relabelled one, column for column
    assert np.array_equal(g2.edge_index(), p.inverse[ei])
    assert np.array_equal(g2.edge_index(), permute_edge_index(ei, p))
    # the same order given as a Permutation or as an array
    assert np.array_equal(g.reorder(p).edge_index(), g2.edge_index())
    assert np.array_equal(g.reorder(list(p.perm)).edge_index(), g2.edge_index())
    # permute_edges(sort=True) gives the CSR order of the reordered graph
    w = rng.random(ei.shape[1])
    ei_s, w_s = permute_edges(ei, p, w)
    assert np.array_equal(ei_s[1], g2.csr_rows) and np.array_equal(ei_s[0], g2.indices)
    assert np.array_equal(w_s, g2.to_csr_order(w))
    ei_u, w_u = permute_edges(ei, p, w, sort=False)
    assert np.array_equal(ei_u, p.inverse[ei]) and w_u is w
    # a graph from CSR arrays (no edge ids): its caller order is the CSR order
    gc = Graph.from_csr(g.indptr, g.indices, num_src=n)
    assert np.array_equal(gc.reorder(p).edge_index(), p.inverse[gc.edge_index()])
    x = rng.standard_normal((n, 3))
    assert np.array_equal(unpermute_nodes(permute_nodes(x, p), p), x)
    assert np.array_equal(permute_nodes(x, g2), x[p.perm])


@pytest.mark.parametrize("method", ("rcm", "cluster", "random", "degree"))
def test_ops_unchanged_in_the_callers_order(method, rng):
    ei, n = messy_edges(rng)
    E = ei.shape[1]
    g = Graph.from_edge_index(ei, num_nodes=n)
    g2 = g.reorder(method, seed=1)
    x = rng.standard_normal((n, 6)).astype(np.float32)
    w = rng.random(E).astype(np.float32)
    px = permute_nodes(x, g2)
    back = lambda y: unpermute_nodes(y, g2)     # noqa: E731
    # forward bitwise: the reordered graph adds the same terms in the same order per row
    close = np.testing.assert_array_equal
    # per-edge arrays in the caller's edge order are used unchanged
    for reduce in ("sum", "mean"):
        close(back(fastgnn.spmm(g2, px, w, reduce)), fastgnn.spmm(g, x, w, reduce))
    close(back(fastgnn.segment_reduce(g2, px, "max")), fastgnn.segment_reduce(g, x, "max"))
    close(back(fastgnn.segment_reduce(g2, px, ["min", "std"])),
          fastgnn.segment_reduce(g, x, ["min", "std"]))
    H, C = 2, 3
    a_src = rng.standard_normal((n, H)).astype(np.float32)
    a_dst = rng.standard_normal((n, H)).astype(np.float32)
    a_edge = rng.standard_normal((E, H)).astype(np.float32)
    v = rng.standard_normal((n, H, C)).astype(np.float32)
    ref, alpha = fastgnn.edge_attention(g, "gat", a_src=a_src, a_dst=a_dst, a_edge=a_edge, v=v,
                                        return_attention_weights=True)
    out2, alpha2 = fastgnn.edge_attention(g2, "gat", a_src=permute_nodes(a_src, g2),
                                          a_dst=permute_nodes(a_dst, g2), a_edge=a_edge,
                                          v=permute_nodes(v, g2), return_attention_weights=True)
    close(back(out2), ref)
    close(alpha2, alpha)
    # backward of the numpy pair: gradients come back in the caller's order too
    gy = rng.standard_normal((n, 6)).astype(np.float32)
    _, res = fastgnn.spmm_fwd(g, x, w)
    _, res2 = fastgnn.spmm_fwd(g2, px, w)
    gx, gw = fastgnn.spmm_bwd(g, res, gy)[:2]
    gx2, gw2 = fastgnn.spmm_bwd(g2, res2, permute_nodes(gy, g2))[:2]
    # the transpose lists a source's out-edges by target id, which the order
    # changes: the x gradient agrees to rounding, the per-edge one bitwise
    np.testing.assert_allclose(back(gx2), gx, rtol=1e-5, atol=1e-6)
    close(gw2, gw)


def test_visit_order_keeps_ids_and_shares_arrays(rng):
    """relabel=False: same ids, same CSR arrays (no copy), the order kept as
    visit_order through transpose() and to(); the CPU backend's results are
    the caller graph's, bitwise."""
    ei, n = messy_edges(rng)
    g = Graph.from_edge_index(ei, num_nodes=n)
    t = g.transpose()
    gv = g.reorder("cluster", relabel=False, seed=1)
    p = gv.visit_order
    check_permutation(p, n)
    assert gv.permutation is None and g.visit_order is None
    assert gv.indptr is g.indptr and gv.indices is g.indices and gv.edge_ids is g.edge_ids
    assert np.array_equal(gv.edge_index(), ei)
    # the built transpose's arrays are shared, and it visits sources in the same order
    assert gv.transpose().indices is t.indices and gv.transpose().visit_order is p
    assert gv.transpose().transpose() is gv and gv.to("cpu").visit_order is p
    assert np.array_equal(gv.visit_rows(), p.perm)
    assert g.visit_rows() is None and "visit_order='cluster'" in repr(gv)
    # graphs derived on the same nodes (self-loops added) visit in the same order
    from fastgnn.ops.spmm import self_loop_structure
    assert self_loop_structure(gv)[0].visit_order is p
    assert self_loop_structure(g)[0].visit_order is None
    # taking an order drops what was cached for the old one (plans follow it)
    h = Graph.from_edge_index(ei, num_nodes=n)
    h.cached("derived", lambda: 1)
    assert h.with_visit_order_of(gv) is h and h.visit_order is p and not h.cache
    h.cached("derived", lambda: 2)
    assert h.with_visit_order_of(gv).cache == {"derived": 2}     # the same order: kept
    # a relabelled graph can be given a visit order on top, and back
    g2 = g.reorder("rcm")
    g2v = g2.reorder(p, relabel=False)
    assert g2v.permutation is g2.permutation and g2v.visit_order is p
    x = rng.standard_normal((n, 5)).astype(np.float32)
    np.testing.assert_array_equal(fastgnn.spmm(gv, x), fastgnn.spmm(g, x))
    np.testing.assert_array_equal(fastgnn.segment_reduce(gv, x, "max"),
                                  fastgnn.segment_reduce(g, x, "max"))
    with pytest.raises(TypeError, match="relabel"):
        g.reorder("rcm", relabel="no")


def _torch_layer_case(layer_cls, make, rng, **call):
    torch = pytest.importorskip("torch")
    import fastgnn.torch as ft
    ei_np, n = messy_edges(rng)
    p = order(ei_np, "cluster", seed=2, num_nodes=n)
    ei = torch.from_numpy(ei_np)
    x = torch.from_numpy(rng.standard_normal((n, 5)).astype(np.float32)).requires_grad_()
    edge_attr = torch.from_numpy(rng.standard_normal((ei.shape[1], 3)).astype(np.float32))
    layer = make(ft)
    out = layer(x, ei, **({"edge_attr": edge_attr} if call.get("edges") else {}))
    gy = torch.from_numpy(rng.standard_normal(tuple(out.shape)).astype(np.float32))
    gx, *gp = torch.autograd.grad((out * gy).sum(), [x, *layer.parameters()])
    # sorted edges (permute_edges gathers the edge features along) and unsorted
    for sort in (True, False):
        ei2, ea2 = permute_edges(ei, p, edge_attr, sort=sort)
        x2 = permute_nodes(x, p)
        out2 = unpermute_nodes(layer(x2, ei2, **({"edge_attr": ea2} if call.get("edges") else {})),
                               p)
        torch.testing.assert_close(out2, out, rtol=1e-5, atol=1e-5)
        gx2, *gp2 = torch.autograd.grad((out2 * gy).sum(), [x, *layer.parameters()])
        torch.testing.assert_close(gx2, gx, rtol=1e-5, atol=1e-5)
        for a, b in zip(gp2, gp):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_gcnconv_gradients_unchanged(rng):
    _torch_layer_case("GCNConv", lambda ft: ft.GCNConv(5, 4), rng)


def test_gatconv_gradients_unchanged(rng):
    _torch_layer_case("GATConv", lambda ft: ft.GATConv(5, 4, heads=2, edge_dim=3), rng,
                      edges=True)


# ------------------------------------------------------------ locality and auto
def bandwidth(ei, inverse=None):
    s, d = (ei if inverse is None else inverse[ei])
    return int(np.abs(s - d).max())


def test_rcm_reduces_the_bandwidth_of_a_shuffled_grid(rng):
    side = 40
    ei, n = shuffled(*generators.grid(side), rng)
    p = order(ei, "rcm", num_nodes=n)
    assert bandwidth(ei) > n // 2
    assert bandwidth(ei, p.inverse) <= 2 * side + 2


@pytest.mark.parametrize("build", (lambda: generators.grid(128), lambda: generators.mesh3d(24),
                                   lambda: generators.mesh3d(20, k=26)))
def test_auto_keeps_a_local_mesh_order(build):
    ei, n = build()
    p = order(ei, "auto", num_nodes=n)
    assert p.is_identity and p.info["chosen"] == "identity"
    assert p.info["reason"] == "already local"
    g = Graph.from_edge_index(ei, num_nodes=n)
    assert np.array_equal(g.reorder("auto").edge_index(), g.edge_index())


def test_auto_reorders_a_shuffled_mesh_and_keeps_small_graphs(rng):
    ei, n = shuffled(*generators.grid(128), rng)
    p = order(ei, "auto", num_nodes=n, seed=1)
    assert p.info["chosen"] in ("rcm", "cluster")
    before, after = locality(ei[0], ei[1]), locality(ei[0], ei[1], p.inverse)
    assert after["gap_bits"] < 0.85 * before["gap_bits"]
    assert order(ei, "auto", num_nodes=n, candidates="rcm").info["chosen"] == "rcm"
    small, m = shuffled(*generators.grid(20), rng)
    assert order(small, "auto", num_nodes=m).is_identity


def test_auto_keeps_an_order_with_some_locality_of_its_own(rng):
    """A shuffled mesh with a tenth of its edges made local again (a crawl
    order's share): auto keeps it; fully shuffled, it reorders."""
    ei, n = shuffled(*generators.grid(128), rng)
    assert not order(ei, "auto", num_nodes=n, seed=1).is_identity
    local = rng.random(ei.shape[1]) < 0.1
    near = ei.copy()
    near[1, local] = np.minimum(near[0, local] + 1, n - 1)
    assert locality(near[0], near[1])["window_fraction"] >= 0.05
    p = order(near, "auto", num_nodes=n, seed=1)
    assert p.is_identity and p.info["reason"] == "partly local already"


def test_auto_reorders_only_what_can_pay_for_itself(rng, monkeypatch):
    """The payback test: on the GPU (device="cuda") no candidate can repay
    its cost within the default 100 calls, so auto keeps the order without
    computing one and says why; given enough calls (or calls=None) it
    reorders; an order whose measured cost is too high for the calls is not
    taken either."""
    from fastgnn import reorder
    ei, n = shuffled(*generators.grid(128), rng)
    wide = dict(width=1024)                       # 64 MiB of features: more than the L2
    p = order(ei, "auto", num_nodes=n, seed=1, device="cuda")
    assert p.is_identity and "pay for itself in 100 calls" in p.info["reason"]
    need = p.info["payback_calls"]
    saving = 128 * reorder.MAX_SAVING_PER_EDGE_FEATURE_S["cuda"]
    assert need["rcm"] == pytest.approx(reorder.MIN_COST_PER_EDGE_S["rcm"] / saving)
    assert 100 < need["rcm"] < need["cluster"]
    for calls in (10 ** 6, None):
        assert order(ei, "auto", num_nodes=n, seed=1, device="cuda", calls=calls,
                     **wide).info["chosen"] in ("rcm", "cluster")
    # wider rows make each call longer: the same order pays back sooner
    assert reorder.payback_calls(1.0, 1000, 1024, "cuda") == pytest.approx(
        reorder.payback_calls(1.0, 1000, 128, "cuda") / 8)
    # the measured cost decides too: every candidate passes the first bound,
    # none repays its real cost in one call
    monkeypatch.setattr(reorder, "MIN_COST_PER_EDGE_S", dict.fromkeys(("rcm", "cluster"), 0.0))
    p = order(ei, "auto", num_nodes=n, seed=1, device="cuda", calls=1, **wide)
    assert p.is_identity and "cannot pay for itself in 1 calls" in p.info["reason"]


def test_auto_keeps_graphs_whose_features_fit_in_the_gpu_cache(rng):
    """On the GPU a graph whose features fit in the L2 keeps its order, also
    with calls=None; the same graph with wider rows, or on the CPU, reorders."""
    from fastgnn import reorder
    ei, n = shuffled(*generators.grid(128), rng)
    assert n * 128 * 4 <= reorder.GPU_CACHE_BYTES < n * 1024 * 4
    p = order(ei, "auto", num_nodes=n, seed=1, device="cuda", calls=None)
    assert p.is_identity and "L2" in p.info["reason"]
    for kw in (dict(device="cuda", width=1024), dict(device="cpu")):
        assert not order(ei, "auto", num_nodes=n, seed=1, calls=None, **kw).is_identity


@pytest.mark.parametrize("bad, match", [({"calls": -1}, "calls"), ({"calls": 1.5}, "calls"),
                                        ({"width": 0}, "width"), ({"device": "tpu"}, "device"),
                                        ({"device": "tpu", "calls": None}, "device")])
def test_auto_refuses_bad_payback_options(rng, bad, match):
    ei, n = shuffled(*generators.grid(128), rng)
    with pytest.raises(ValueError, match=match):
        order(ei, "auto", num_nodes=n, **bad)


def test_methods_table_is_complete():
    assert set(METHODS) == {"rcm", "degree", "cluster", "metis", "random", "identity", "auto"}


def test_bench_graphs_take_an_order():
    torch = pytest.importorskip("torch")
    from fastgnn.bench import graphs as bgraphs
    plain = bgraphs.make("rmat10", torch, torch.device("cpu"), 0)
    re = bgraphs.make("rmat10", torch, torch.device("cpu"), 0, reorder="rcm")
    assert re.name == plain.name + "+rcm" and "reordered by rcm" in re.source
    p = order(plain.edge_index.numpy(), "rcm", num_nodes=plain.num_nodes)
    assert np.array_equal(re.edge_index.numpy(), p.inverse[plain.edge_index.numpy()])


# ------------------------------------------------------------ GPU
gpu = pytest.mark.skipif(not fastgnn.gpu_available(), reason="needs a CUDA device")


def _gpu_case(rng, hub=700):
    """messy_edges plus an in-hub of `hub` edges (split into tasks of the
    default chunk, 256) on the GPU, fp32 node arrays in the caller's order."""
    ei, n = messy_edges(rng)
    big = np.stack([rng.integers(0, n, hub), np.full(hub, 7)])
    ei = np.concatenate([ei, big], axis=1)
    ei = ei[:, rng.permutation(ei.shape[1])]
    return ei, n


def _gpu_results(g, arrays, reorder_in, reorder_out):
    """Every op's forward and backward on g, inputs moved in by reorder_in,
    node outputs moved back by reorder_out: {name: host array}."""
    import cupy as cp
    a = {k: v if k in ("w", "a_edge", "att") else reorder_in(v) for k, v in arrays.items()}
    r = {}
    y, res = fastgnn.spmm_fwd(g, a["x"], a["w"], path="custom")
    r["spmm"] = reorder_out(y)
    gx, gw, _ = fastgnn.spmm_bwd(g, res, a["gy"])
    r["spmm_gx"], r["spmm_gw"] = reorder_out(gx), gw
    for red in ("max", ("min", "std", "mean")):
        y, res = fastgnn.segment_reduce_fwd(g, a["x"], list(red) if isinstance(red, tuple) else red)
        name = red if isinstance(red, str) else "multi"
        r[name] = reorder_out(y)
        gy = a["gy"] if isinstance(red, str) else cp.concatenate([a["gy"]] * 3, axis=1)
        r[name + "_gx"] = reorder_out(fastgnn.segment_reduce_bwd(g, res, gy))
    node_inputs = {"a_src", "a_dst", "v", "xl", "xr", "q", "k"}
    for score, kw in (("gat", dict(a_src=a["a_src"], a_dst=a["a_dst"], a_edge=a["a_edge"],
                                   v=a["v"])),
                      ("gatv2", dict(xl=a["v"], xr=a["v2"], att=arrays["att"])),
                      ("dot", dict(q=a["v2"], k=a["v"], v=a["v3"]))):
        y, res = fastgnn.edge_attention_fwd(g, score, tensor_cores=False, **kw)
        r[score] = reorder_out(y)
        grads = fastgnn.edge_attention_bwd(g, res, a["go"])
        for name, v in zip(SCORE_INPUTS[score], grads):
            if v is not None:
                r[f"{score}_{name}"] = reorder_out(v) if name in node_inputs else v
    return {k: cp.asnumpy(v) for k, v in r.items()}


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("relabel", (False, True))
@pytest.mark.parametrize("method", ("cluster", "random"))
def test_gpu_ops_unchanged_by_an_order(method, relabel, rng):
    """Every op's outputs and gradients in the caller's order, GPU kernels,
    with a split hub row: a visit order (relabel=False) gives the same
    forward bits and every node input and output stays in the caller's
    order; a relabelled graph agrees to rounding."""
    import cupy as cp
    ei, n = _gpu_case(rng)
    E, H, C = ei.shape[1], 2, 8

    def r(*shape):
        return cp.asarray(rng.standard_normal(shape).astype(np.float32))
    arrays = dict(x=r(n, 24), gy=r(n, 24), w=r(E), a_src=r(n, H), a_dst=r(n, H), a_edge=r(E, H),
                  v=r(n, H, C), v2=r(n, H, C), v3=r(n, H, C), go=r(n, H, C), att=r(H, C))
    g = Graph.from_edge_index(cp.asarray(ei), num_nodes=n)
    ref = _gpu_results(g, arrays, lambda a: a, lambda a: a)
    g2 = g.reorder(method, relabel=relabel, seed=3)
    if relabel:
        got = _gpu_results(g2, arrays, lambda a: permute_nodes(a, g2),
                           lambda a: unpermute_nodes(a, g2))
    else:
        from fastgnn.backends.cuda.spmm import task_plan
        plan = task_plan(g2)
        rows = cp.asnumpy(plan.task_row)
        visited = rows[np.r_[True, rows[1:] != rows[:-1]]]      # a row's tasks are consecutive
        assert np.array_equal(visited, g2.visit_order.perm)
        got = _gpu_results(g2, arrays, lambda a: a, lambda a: a)
    assert got.keys() == ref.keys()
    for k in ref:
        if not relabel and k in ("spmm", "max", "multi", "gat", "gatv2", "dot"):
            np.testing.assert_array_equal(got[k], ref[k], err_msg=k)
        else:
            np.testing.assert_allclose(got[k], ref[k], rtol=2e-5, atol=2e-5, err_msg=k)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("layer", ("GCNConv", "SAGEConv_max", "GATConv", "GATv2Conv",
                                   "TransformerConv"))
def test_gpu_layers_unchanged_by_a_visit_order(layer, rng):
    """A drop-in layer given a visit-ordered Graph: outputs and every
    gradient as with the plain graph (same ids: nothing to permute)."""
    torch = pytest.importorskip("torch")
    import fastgnn.torch as ft
    ei_np, n = _gpu_case(rng)
    ei = torch.from_numpy(ei_np).cuda()
    g = ft.to_graph(ei, n)
    gv = g.reorder("cluster", relabel=False, seed=1)
    make = {"GCNConv": lambda: ft.GCNConv(6, 8),
            "SAGEConv_max": lambda: ft.SAGEConv(6, 8, aggr="max"),
            "GATConv": lambda: ft.GATConv(6, 4, heads=2),
            "GATv2Conv": lambda: ft.GATv2Conv(6, 4, heads=2),
            "TransformerConv": lambda: ft.TransformerConv(6, 4, heads=2)}[layer]
    mod = make().cuda()
    x = torch.randn(n, 6, device="cuda", requires_grad=True)
    outs = []
    gy = None
    for graph in (g, gv):
        out = mod(x, graph)
        gy = torch.randn_like(out) if gy is None else gy
        outs.append((out, torch.autograd.grad((out * gy).sum(), [x, *mod.parameters()])))
    (o1, g1), (o2, g2) = outs
    torch.testing.assert_close(o2, o1, rtol=0, atol=0)
    for a, b in zip(g2, g1):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("method", ("rcm", "degree", "cluster", "auto"))
def test_gpu_orders_equal_the_hosts(method, rng):
    """A graph or edge index on the GPU (its pattern and degrees counted
    there) gets the order the same edges get on the host; the input is
    left as it was."""
    import cupy as cp
    ei, n = _gpu_case(rng)
    ei = np.concatenate([ei, ei[:, :50], np.stack([np.arange(9), np.arange(9)])], axis=1)
    options = {"calls": None, "device": "cuda"} if method == "auto" else {}
    want = order(ei, method, num_nodes=n, **options).perm
    on_gpu = cp.asarray(ei)
    kept = on_gpu.copy()
    got = order(on_gpu, method, num_nodes=n, **options).perm
    assert isinstance(got, np.ndarray) and np.array_equal(got, want), method
    assert bool((on_gpu == kept).all())
    g = fastgnn.Graph.from_edge_index(on_gpu, num_nodes=n)
    want_g = order(fastgnn.Graph.from_edge_index(ei, num_nodes=n), method, **options).perm
    assert np.array_equal(order(g, method, **options).perm, want_g), method
