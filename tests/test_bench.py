"""Generators (sizes, seeds) and a tiny CPU run of `python -m fastgnn.bench`."""
import json
import os

import numpy as np
import pytest

from fastgnn import generators as gen

DATASETS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "datasets")


def _check_simple(ei, n):
    assert ei.dtype == np.int64 and ei.ndim == 2 and ei.shape[0] == 2
    assert ei.min() >= 0 and ei.max() < n
    assert not (ei[0] == ei[1]).any(), "self-loops"
    assert np.unique(ei[0] * n + ei[1]).shape[0] == ei.shape[1], "duplicates"


@pytest.mark.parametrize("make", [
    lambda seed: gen.rmat(9, seed=seed),
    lambda seed: gen.uniform(9, 8, seed=seed),
    lambda seed: gen.clustered(1024, seed=seed),
    lambda seed: gen.molecules(20, seed=seed),
    lambda seed: gen.knn(500, 6, seed=seed),
])
def test_generators_seeded(make):
    a, n = make(0)
    b, n2 = make(0)
    c, _ = make(1)
    assert n == n2
    _check_simple(a, n)
    np.testing.assert_array_equal(a, b)
    assert a.shape != c.shape or not np.array_equal(a, c)


def test_generator_sizes():
    ei, n = gen.rmat(10)
    assert n == 1024 and 0.6 * 16 * n < ei.shape[1] <= 16 * n
    ei, n = gen.uniform(10)
    assert n == 1024 and 0.95 * 16 * n < ei.shape[1] <= 16 * n
    s = gen.graph_stats(ei, n)
    assert s["num_edges"] == ei.shape[1] and s["max_in_degree"] < 60

    ei, n = gen.clustered(2048, block=64)
    _check_simple(ei, n)
    src, dst = ei
    in_block = (src // 64) == (dst // 64)
    # per block: 64*64/2 draws with replacement -> ~1612 unique pairs, ~25 loops dropped
    per_block = in_block.sum() / (n // 64)
    assert 1500 < per_block < 1700
    assert (~in_block).sum() <= 2 * n
    with pytest.raises(ValueError):
        gen.clustered(1000, block=64)

    side = 7
    ei, n = gen.grid(side)
    _check_simple(ei, n)
    assert n == 49 and ei.shape[1] == 4 * side * (side - 1)
    s = gen.graph_stats(ei, n)
    assert s["max_in_degree"] == 4 and s["max_out_degree"] == 4
    # symmetric
    fwd = set(map(tuple, ei.T.tolist()))
    assert all((d, s_) in fwd for s_, d in fwd)


def test_mesh3d():
    s = 3
    per_k = {6: 3 * s * s * (s - 1),
             18: 3 * s * s * (s - 1) + 6 * s * (s - 1) ** 2,
             26: 3 * s * s * (s - 1) + 6 * s * (s - 1) ** 2 + 4 * (s - 1) ** 3}
    for k, und in per_k.items():
        ei, n = gen.mesh3d(s, k)
        _check_simple(ei, n)
        assert n == 27 and ei.shape[1] == 2 * und
        st = gen.graph_stats(ei, n)
        assert st["max_in_degree"] == k                   # the centre node
        fwd = set(map(tuple, ei.T.tolist()))
        assert all((d, s_) in fwd for s_, d in fwd)
    ei, n = gen.mesh3d((2, 3, 4))
    assert n == 24 and ei.shape[1] == 2 * (1 * 3 * 4 + 2 * 2 * 4 + 2 * 3 * 3)
    with pytest.raises(ValueError):
        gen.mesh3d(4, k=8)


def test_molecules():
    ei, n, ptr = gen.molecules(50, 10, 30, seed=3, return_ptr=True)
    _check_simple(ei, n)
    sizes = np.diff(ptr)
    assert ptr[0] == 0 and ptr[-1] == n and len(sizes) == 50
    assert sizes.min() >= 10 and sizes.max() <= 30
    gid = np.searchsorted(ptr[1:], np.arange(n), side="right")
    assert (gid[ei[0]] == gid[ei[1]]).all(), "an edge crosses two molecules"
    # connected chain + branches + rings: at least n - graphs undirected bonds, degree <= 7
    assert ei.shape[1] // 2 >= n - 50 and gen.graph_stats(ei, n)["max_in_degree"] <= 8
    assert 1.9 < ei.shape[1] / n < 3.0
    with pytest.raises(ValueError):
        gen.molecules(3, 20, 10)


def test_knn():
    ei, n, pos = gen.knn(300, 5, order="random", seed=1, return_pos=True)
    assert n == 300 and ei.shape == (2, 1500) and ei.dtype == np.int64
    _check_simple(ei, n)
    assert (np.bincount(ei[1], minlength=n) == 5).all()
    d = ((pos[:, None, :] - pos[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(d, np.inf)
    brute = np.sort(np.argsort(d, axis=1)[:, :5], axis=1)
    got = np.sort(ei[0].reshape(n, 5), axis=1)                 # grouped by target
    assert np.array_equal(brute, got)
    a, _ = gen.knn(300, 5, seed=1)                             # morton order: more local
    assert gen.graph_stats(a, n)["edge_span_mean"] < gen.graph_stats(ei, n)["edge_span_mean"]
    with pytest.raises(ValueError):
        gen.knn(4, 4)


def test_load_npz(tmp_path):
    p = tmp_path / "g.npz"
    edges = np.array([[0, 1], [1, 2], [2, 2], [1, 0], [3, 4]], dtype=np.int64)
    np.savez(p, edges=edges, node_labels=np.zeros(6, dtype=np.int64))
    ei, n = gen.load_npz(str(p))
    assert n == 6
    _check_simple(ei, n)
    assert sorted(map(tuple, ei.T.tolist())) == [(0, 1), (1, 0), (1, 2), (2, 1), (3, 4), (4, 3)]
    with pytest.raises(FileNotFoundError):
        gen.load_npz(str(tmp_path / "absent.npz"))


@pytest.mark.skipif(not os.path.isdir(DATASETS), reason="../shared/datasets absent")
def test_load_real_npz():
    path = os.path.join(DATASETS, "heterophilous", "texas.npz")
    if not os.path.exists(path):
        pytest.skip("texas.npz absent")
    ei, n = gen.load_npz(path)
    assert n == 183 and ei.shape[1] == 2 * 279   # README: E=279 undirected, nnz=558


STATS = ["num_nodes", "num_edges", "max_in_degree", "mean_in_degree", "in_degree_skew",
         "in_degree_gini", "edge_span_mean", "edge_span_max", "isolated_nodes"]
REQUIRED = ["gpu", "versions", "graph", "graph_stats", "case", "kind", "impl", "settings",
            "dtype", "width", "fwd_ms", "fwd_bwd_ms", "peak_mib", "floor_ms", "rel_err",
            "path", "status", "command", "speedup_fwd", "speedup_fwd_bwd"]


def test_bench_quick_cpu(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    from fastgnn.bench.__main__ import main

    out = tmp_path / "r.json"
    rc = main(["--quick", "--device", "cpu", "--graphs", "rmat7", "npz:/nonexistent/x.npz",
               "--width", "8", "--repeats", "2", "--warmup", "0", "--no-progress", "--no-plots",
               "--out", str(out)])
    assert rc == 0
    recs = json.loads(out.read_text())
    assert recs, "no records"
    for r in recs:
        missing = [k for k in REQUIRED if k not in r]
        assert not missing, f"{r['impl']}: missing {missing}"
        assert r["graph"] == "rmat7" and r["dtype"] == "fp32" and r["width"] == 8
        assert set(STATS) <= set(r["graph_stats"])
        assert set(r["versions"]) >= {"torch", "pyg", "cupy", "fastgnn"}
    impls = {(r["case"], r["impl"]) for r in recs}
    assert ("spmm_sum", "torch.sparse.mm[csr]") in impls
    assert ("spmm_sum", "pyg-scatter[edge_index]") in impls
    assert {"GCNConv", "SAGEConv", "GINConv"} <= {r["case"] for r in recs}
    # baselines ran and agree with the float32 reference
    for r in recs:
        if not r["fastgnn"]:
            assert r["status"]["fwd"] == "ok", r
            assert r["rel_err"] < 1e-5, r
    md = out.with_suffix(".md")
    assert md.exists() and "| graph |" in md.read_text()
    assert "nonexistent" in md.read_text()      # the missing dataset is listed as skipped
    del torch


def test_bench_failures_are_recorded(tmp_path):
    """A baseline that raises is recorded (oom / unsupported / error), never fatal."""
    pytest.importorskip("torch")
    from fastgnn.bench import core
    from fastgnn.bench.__main__ import main
    from fastgnn.bench.cases_spmm import spmm_reference

    def boom(exc):
        def build(ctx):
            x = ctx.leaf()

            def fwd():
                raise exc
            return core.Prepared(fwd, [x])
        return build

    def ok_fwd_only(ctx):
        x = ctx.leaf()
        return core.Prepared(lambda: x * 2, [x], backward=False)

    case = core.Case("test_fail", "op", "test", "failure capture",
                     lambda ctx: [core.Impl("oom", "", boom(RuntimeError("CUDA out of memory."))),
                                  core.Impl("nyi", "", boom(NotImplementedError("nope"))),
                                  core.Impl("bad", "", boom(ValueError("broken"))),
                                  core.Impl("fwd-only", "", ok_fwd_only)],
                     spmm_reference("sum"), default=False)
    core.register(case)
    try:
        out = tmp_path / "f.json"
        main(["--quick", "--device", "cpu", "--graphs", "grid4", "--width", "4", "--ops",
              "test_fail", "--layers", "none", "--repeats", "1", "--no-progress",
              "--out", str(out)])
        recs = {r["impl"]: r for r in json.loads(out.read_text())}
    finally:
        core.CASES.pop("test_fail")
    assert recs["oom"]["status"]["fwd"] == "oom" and recs["oom"]["fwd_ms"] is None
    assert recs["nyi"]["status"]["fwd"] == "unsupported"
    assert recs["bad"]["status"]["fwd"] == "error" and "broken" in recs["bad"]["errors"]["fwd"]
    assert recs["fwd-only"]["status"] == {"fwd": "ok", "fwd_bwd": "unsupported"}
    assert recs["fwd-only"]["fwd_ms"] is not None and recs["fwd-only"]["rel_err"] > 0.1


def test_bench_segment_family_cpu(tmp_path):
    """The reduction family: op + layer cases, floors, and the report's summary lines."""
    pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    from fastgnn.bench.__main__ import main

    out = tmp_path / "s.json"
    rc = main(["--quick", "--device", "cpu", "--family", "segment", "--graphs", "rmat7",
               "--width", "8", "--repeats", "1", "--warmup", "0", "--no-progress",
               "--out", str(out)])
    assert rc == 0
    recs = json.loads(out.read_text())
    assert {r["case"] for r in recs} == {"segment_max", "segment_multi", "SAGEConv_max"}
    assert all(r["family"] == "segment" for r in recs)
    by = {(r["case"], r["impl"]): r for r in recs}
    for key in [("segment_max", "pyg-scatter[edge_index]"), ("segment_max", "pyg-aggr[ptr]"),
                ("segment_multi", "pyg-scatter[edge_index]"), ("segment_multi", "pyg-aggr[ptr]"),
                ("SAGEConv_max", "pyg[edge_index]"), ("SAGEConv_max", "pyg[csr adj_t]"),
                ("SAGEConv_max", "pyg[EdgeIndex csc,segment]")]:
        r = by[key]
        assert r["status"] == {"fwd": "ok", "fwd_bwd": "ok"}, r
        assert r["rel_err"] < 1e-5 and r["rel_err_grad"] < 1e-5, r
    # fastgnn rows agree, or say why they cannot run (adapter not there yet)
    for r in recs:
        if r["fastgnn"]:
            if r["status"]["fwd"] == "ok":
                assert r["rel_err"] < 1e-5, r
            else:
                assert r["status"]["fwd"] == "unsupported", r
    # floor: x read once + R output blocks + CSR; multi writes 3 more blocks than max
    mx, mu = by[("segment_max", "fastgnn")], by[("segment_multi", "fastgnn")]
    n = mx["graph_stats"]["num_nodes"]
    assert mu["bytes_fwd"] - mx["bytes_fwd"] == 3 * n * 8 * 4
    assert mx["bytes_fwd_bwd"] == 2 * mx["bytes_fwd"]
    md = out.with_suffix(".md").read_text()
    if mx["fwd_ms"] and mu["fwd_ms"]:
        assert "multi/max fwd" in md and "| rmat7 | fp32 | 8 |" in md
    if by[("SAGEConv_max", "fastgnn[edge_index]")]["fwd_bwd_ms"]:
        assert "SAGEConv(aggr='max') forward+backward" in md


def test_bench_attention_family_cpu(tmp_path):
    """The attention family: ops + layers agree with PyG; floor; the report's summary line."""
    pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    from fastgnn.bench.__main__ import main

    out = tmp_path / "a.json"
    rc = main(["--quick", "--device", "cpu", "--family", "attention", "--graphs", "rmat7",
               "--width", "8", "--heads", "2", "--repeats", "1", "--warmup", "0",
               "--no-progress", "--no-plots", "--out", str(out)])
    assert rc == 0
    recs = json.loads(out.read_text())
    cases = {"attn_gatv2", "attn_dot", "attn_gat", "GATConv", "GATv2Conv", "TransformerConv"}
    assert {r["case"] for r in recs} == cases and all(r["family"] == "attention" for r in recs)
    for r in recs:
        if r["fastgnn"] and r["status"]["fwd"] != "ok":
            assert r["status"]["fwd"] == "unsupported", r
            continue
        assert r["status"] == {"fwd": "ok", "fwd_bwd": "ok"}, r
        assert r["rel_err"] < 1e-5 and r["rel_err_grad"] < 1e-5, r
    g = next(r for r in recs if r["case"] == "attn_dot")
    n = g["graph_stats"]["num_nodes"]
    assert g["bytes_fwd"] > 4 * n * 8 * 4          # q, k, v read + out written
    assert "Attention family" in out.with_suffix(".md").read_text()


def test_bench_new_graphs_plots_and_failures(tmp_path):
    """Generator and file: graph names, graph stats in every record, the plots
    beside the report, and a graph that fails to load recorded, not fatal."""
    pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    pytest.importorskip("matplotlib")
    from fastgnn.bench.__main__ import main

    edges = tmp_path / "tiny-snap.txt"
    edges.write_text("# a SNAP-style file\n1 2\n2 3\n3 1\n3 4\n")
    broken = tmp_path / "broken.txt"
    broken.write_text("1 2\nnot numbers\n")
    out = tmp_path / "n.json"
    rc = main(["--quick", "--device", "cpu", "--graphs", "mesh3d3k26", "molecules6", "knn6k4",
               f"file:{edges}", f"file:{broken}", "file:/nonexistent/graph.txt",
               "--ops", "spmm_sum", "--layers", "none", "--width", "4", "--repeats", "1",
               "--warmup", "0", "--no-progress", "--out", str(out)])
    assert rc == 0
    recs = json.loads(out.read_text())
    by_graph = {}
    for r in recs:
        by_graph.setdefault(r["graph"], []).append(r)
    assert {"mesh3d3k26", "molecules6", "knn6k4", "tiny-snap"} <= set(by_graph)
    assert by_graph["mesh3d3k26"][0]["graph_stats"]["num_edges"] == 316
    assert by_graph["knn6k4"][0]["graph_stats"]["num_edges"] == 64 * 4
    assert by_graph["tiny-snap"][0]["graph_stats"]["num_nodes"] == 4
    for name in ("mesh3d3k26", "molecules6", "knn6k4", "tiny-snap"):
        for r in by_graph[name]:
            assert set(STATS) <= set(r["graph_stats"]), r["graph"]
            if not r["fastgnn"]:
                assert r["status"]["fwd"] == "ok" and r["rel_err"] < 1e-5, r
    fail = [r for r in recs if r["case"] == "(graph build)"]
    assert len(fail) == 1 and fail[0]["status"]["fwd"] == "error"
    assert "broken.txt" in fail[0]["errors"]["setup"]
    md = out.with_suffix(".md").read_text()
    assert "nonexistent" in md and "## Failures" in md and "(graph build)" in md
    plots = tmp_path / "n_plots"
    assert (plots / "speedup.png").exists() and (plots / "time_vs_edges.png").exists()
    assert "](n_plots/speedup.png)" in md
    assert not (plots / "peak_memory.png").exists()     # CPU: no device memory to plot
    with pytest.raises(SystemExit, match="unknown graph"):
        main(["--device", "cpu", "--graphs", "mesh3d3", "nosuchgraph", "--out",
              str(tmp_path / "x.json")])


def _fake_records():
    """GPU-like records of two graphs x (one op, one layer) x two implementations."""
    recs = []
    for graph, edges in (("g1", 1000), ("g2", 8000)):
        stats = {"num_nodes": 100, "num_edges": edges, "max_in_degree": 50,
                 "mean_in_degree": edges / 100, "max_out_degree": 40}
        for case, kind in (("spmm_sum", "op"), ("GCNConv", "layer")):
            for impl, fg, t in (("fastgnn[auto]", True, 1.0), ("torch.sparse.mm[csr]", False, 2.0)):
                recs.append({"gpu": "Fake GPU", "device": "cuda:0", "versions": {"torch": "x"},
                             "graph": graph, "graph_stats": stats, "graph_source": "test",
                             "case": case, "kind": kind, "family": "spmm", "impl": impl,
                             "fastgnn": fg, "settings": "s", "dtype": "fp32", "width": 64,
                             "fwd_ms": t, "fwd_bwd_ms": 3 * t, "peak_mib": 100 * t,
                             "floor_frac": 0.5 / t if kind == "op" else None,
                             "floor_frac_fwd_bwd": 0.4 / t if kind == "op" else None,
                             "status": {"fwd": "ok", "fwd_bwd": "ok"}, "errors": {},
                             "repeats": 10, "warmup": 2, "bandwidth_gbs": 4190.0,
                             "command": "python -m fastgnn.bench --fake"})
    recs.append(dict(recs[-1], impl="pyg[edge_index]", fwd_ms=None, fwd_bwd_ms=None,
                     peak_mib=None, status={"fwd": "oom", "fwd_bwd": "oom"},
                     errors={"fwd": "CUDA out of memory"}))
    return recs


def test_report_from_json(tmp_path):
    """python -m fastgnn.bench.report rebuilds markdown + plots from JSON files."""
    pytest.importorskip("matplotlib")
    from fastgnn.bench import report

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    recs = _fake_records()
    a.write_text(json.dumps(recs))
    newer = [dict(r, fwd_ms=0.5) if r["fastgnn"] else r for r in recs
             if r["graph"] == "g2" and r["case"] == "spmm_sum"]
    b.write_text(json.dumps(newer))               # replaces two records of a.json
    assert report.main([str(a), str(b), "--out", str(tmp_path / "rep" / "r.md")]) == 0
    md = (tmp_path / "rep" / "r.md").read_text()
    for f in ("speedup", "time_vs_edges", "peak_memory", "floor_efficiency"):
        png = tmp_path / "rep" / "r_plots" / f"{f}.png"
        assert png.exists() and 1000 < png.stat().st_size < 200_000, f
        assert f"](r_plots/{f}.png)" in md
    assert "Fake GPU" in md and "a.json` (9 records)" in md and "## Headline" in md
    assert "| g1 | 1,000 | fastgnn[auto] | 1.000 | 3.000 | 2.000 torch.sparse.mm[csr] |" in md
    assert "| spmm_sum | fp32 | 64 | 2 | 2.83 | 2.00 | 2.00 |" in md   # geomean of 2x and 4x
    assert md.index("| g1 | spmm_sum |") < md.index("| g2 | spmm_sum |")   # run order kept
    assert "oom" in md and "## Failures" in md
    # tables only; a folder as --out
    assert report.main([str(a), "--out", str(tmp_path / "tables"), "--no-plots"]) == 0
    assert (tmp_path / "tables" / "report.md").exists()
    assert not (tmp_path / "tables" / "report_plots").exists()


# ------------------------------------------------------------ baselines (turbo-gnn, compile, DGL)


def _fake_turbo(monkeypatch, torch, calls):
    """A stand-in `turbo_gnn` with turbo-gnn 0.1.0rc4's documented signatures and
    semantics, computed with the bench's own PyG-style formulas: the bench's
    explicit calls must map fastgnn's tensors onto its arguments correctly."""
    import sys
    import types

    from fastgnn.bench.cases_attention import pyg_style

    class Graph:
        @classmethod
        def from_edge_list(cls, edge_index, num_nodes, quantile=0.99, index_dtype=None):
            calls.append(("graph", quantile, index_dtype))
            g = cls()
            g.src, g.dst, g.n = edge_index[0], edge_index[1], num_nodes
            g.forward_indptr = g.forward_indices = None
            return g

    def gatv2_aggr(graph, x, x_neighbors, attention_weights, negative_slope=0.2):
        # e_uv = att . LeakyReLU(x[v] + x_neighbors[u]), messages x_neighbors[u]
        assert negative_slope == 0.2
        return pyg_style(torch, "gatv2", [x_neighbors, x, attention_weights], graph.src,
                         graph.dst, graph.n)

    def graph_transformer_aggr(graph, x, Q, K, V, scale=None):
        # score = Q[u] . K[v] * scale, u the source: Q plays fastgnn's k
        assert x.shape == (Q.shape[0], Q.shape[1] * Q.shape[2])
        assert abs(scale - Q.shape[-1] ** -0.5) < 1e-12
        return pyg_style(torch, "dot", [K, Q, V], graph.src, graph.dst, graph.n).view(Q.shape)

    tg = types.ModuleType("turbo_gnn")
    graph_mod = types.ModuleType("turbo_gnn.graph")
    graph_mod.AdjacencyForwardBackwardWithNodeBuckets = Graph
    ops = types.ModuleType("turbo_gnn.ops")
    ops.gatv2_aggr, ops.graph_transformer_aggr = gatv2_aggr, graph_transformer_aggr
    tg.graph, tg.ops = graph_mod, ops
    for name, mod in (("turbo_gnn", tg), ("turbo_gnn.graph", graph_mod), ("turbo_gnn.ops", ops)):
        monkeypatch.setitem(sys.modules, name, mod)


def test_turbo_gnn_explicit_calls(monkeypatch):
    """turbo-gnn gets fastgnn's tensors in its own argument order (gatv2: x =
    target side, x_neighbors = source side; transformer: Q = k, K = q), on an
    asymmetric graph where a swap would show; spmm_aggr refuses bf16."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    from fastgnn.bench import external
    from fastgnn.bench.cases_attention import pyg_style, turbo_attention

    calls = []
    _fake_turbo(monkeypatch, torch, calls)
    assert external.turbo_gnn_reason() is None
    n, H, C = 7, 2, 4
    ei = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 0, 2], [1, 2, 0, 0, 0, 4, 5, 3, 6]])
    g = external.turbo_graph(torch, ei, n)
    assert calls == [("graph", 0.99, torch.int32)]
    gen = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(n, H, C, generator=gen) for _ in range(3))
    att = torch.randn(H, C, generator=gen)
    for score, ts in (("gatv2", [a, b, att]), ("dot", [a, b, c])):
        got = turbo_attention(score, g, ts, C)()
        want = pyg_style(torch, score, ts, ei[0], ei[1], n)
        assert got.shape == (n, H * C)
        torch.testing.assert_close(got, want)
        swapped = pyg_style(torch, score, [ts[1], ts[0], ts[2]], ei[0], ei[1], n)
        assert not torch.allclose(got, swapped), score     # the test can see a swap
    with pytest.raises(NotImplementedError, match="not attempted"):
        external.turbo_spmm(torch, g, torch.zeros(n, 4, dtype=torch.bfloat16), "sum")


def test_bench_baselines_absent_and_reasons(tmp_path, monkeypatch):
    """DGL / turbo-gnn absent: reported as skipped with the import error; a
    failing baseline carries a short reason in its record and in the tables;
    --compile records a layer that does not compile as unsupported (torch.compile
    replaced here: real compilation takes tens of seconds) and one that does with
    its form and compile time."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    from fastgnn.bench import external
    from fastgnn.bench.__main__ import main

    def refuse(module, **kw):
        raise RuntimeError("dynamo says no")
    monkeypatch.setattr(torch, "compile", refuse)
    out = tmp_path / "c.json"
    rc = main(["--quick", "--device", "cpu", "--graphs", "grid5", "--width", "4", "--ops",
               "spmm_sum", "--layers", "GCNConv", "GATConv", "--heads", "2", "--compile",
               "--repeats", "1", "--warmup", "0", "--no-progress", "--no-plots", "--out", str(out)])
    assert rc == 0
    recs = {(r["case"], r["impl"]): r for r in json.loads(out.read_text())}
    comp = recs[("GCNConv", "pyg[compiled]")]
    assert comp["status"] == {"fwd": "unsupported", "fwd_bwd": "unsupported"}
    assert "torch.compile failed" in comp["reason"] and "csr adj_t" in comp["reason"]
    assert "edge_index: RuntimeError: dynamo says no" in comp["reason"]
    assert "mode='default', dynamic=False" in comp["settings"]
    assert recs[("GATConv", "pyg[compiled]")]["status"]["fwd"] == "unsupported"
    md = out.with_suffix(".md").read_text()
    assert "failure reason" in md and "dynamo says no" in md
    if external.dgl_reason():
        assert "dgl[copy_u_sum]: dgl not importable" in md
        assert not any(k[1].startswith("dgl") for k in recs)

    monkeypatch.setattr(torch, "compile", lambda module, **kw: module)
    rc = main(["--quick", "--device", "cpu", "--graphs", "grid5", "--width", "4", "--ops",
               "none", "--layers", "GCNConv", "--compile", "max-autotune", "--impls", "compiled",
               "--repeats", "1", "--warmup", "0", "--no-progress", "--no-plots", "--out", str(out)])
    (r,) = json.loads(out.read_text())
    assert r["status"] == {"fwd": "ok", "fwd_bwd": "ok"} and r["rel_err"] < 1e-5
    assert r["compiled_form"] == "csr adj_t" and r["compile_s"] >= 0 and r["reason"] is None
    assert "mode='max-autotune'" in r["settings"]


def test_bench_suite_preset_and_budget(tmp_path):
    """--suite full fills what was not given; its graphs parse; its estimate is
    under 8 minutes; --budget-minutes 0 runs nothing and says so."""
    pytest.importorskip("torch")
    from fastgnn.bench import graphs as bgraphs
    from fastgnn.bench.__main__ import (EST_START_S, SUITES, _estimate_case_s, _load_cases,
                                        _select, main)

    suite = SUITES["full"]
    kinds = {"rmat": 0, "uniform": 0, "clustered": 0, "mesh3d": 0}
    for spec in suite["graphs"]:
        if spec.startswith(("file:", "npz:")):      # a data set's name, not a local path
            assert "/" not in spec and "." not in spec, spec
        try:
            bgraphs.parse(spec)
        except bgraphs.GraphUnavailable as exc:
            assert "--datasets DIR" in str(exc) and "FASTGNN_DATASETS" in str(exc)
        edges = bgraphs.nominal_edges(spec)
        for k in kinds:
            if spec.startswith(k):
                kinds[k] += 1
                assert 1.5e6 < edges < 2.5e6 or 1.3e7 < edges < 1.8e7, spec
    assert all(v == 2 for v in kinds.values()), kinds
    _load_cases()
    n_cases = len(_select(None, "op") + _select(None, "layer"))
    est = EST_START_S + n_cases * sum(_estimate_case_s(s, d, suite["lean_above"])
                                      for s in suite["graphs"] for d in ("float32", "bfloat16"))
    assert est < 8 * 60, est / 60

    out = tmp_path / "s.json"
    main(["--suite", "full", "--device", "cpu", "--graphs", "grid4", "--ops", "spmm_sum",
          "--layers", "none", "--impls", "torch.sparse", "--no-progress", "--no-plots",
          "--out", str(out)])
    (r,) = json.loads(out.read_text())
    assert (r["repeats"], r["warmup"]) == (10, 1)
    rc = main(["--device", "cpu", "--graphs", "grid4", "grid5", "--budget-minutes", "0",
               "--no-progress", "--no-plots", "--out", str(out)])
    assert rc == 1                                  # nothing was measured
    assert json.loads(out.read_text()) == []
    assert "time budget" in out.with_suffix(".md").read_text()


def test_readme_table(tmp_path, capsys):
    from fastgnn.bench import report

    recs = _fake_records()
    recs.append(dict(recs[0], graph="g2", impl="turbo-gnn[spmm_aggr]", fastgnn=False,
                     fwd_ms=0.5, fwd_bwd_ms=1.5, peak_mib=2048.0,
                     graph_stats=recs[4]["graph_stats"]))
    a = tmp_path / "a.json"
    a.write_text(json.dumps(recs))
    assert report.main([str(a), "--readme-table"]) == 0
    txt = capsys.readouterr().out
    assert "on g2 (8,000 edges), fp32, F = 64" in txt
    assert "| op | fastgnn | PyG (fastest form) | turbo-gnn | x vs PyG | x vs turbo-gnn |" in txt
    # g2: fastgnn 3 ms / 100 MiB; torch.sparse.mm 6 ms; turbo 1.5 ms, 2 GiB
    assert ("| spmm_sum | 3 ms, 100 MiB | 6 ms, 200 MiB `torch.sparse.mm[csr]` | "
            "1.5 ms, 2.00 GiB | 2.00x | 0.50x | 2.00x (2) |") in txt
    assert "| layer | fastgnn |" in txt and "| GCNConv |" in txt


def test_peak_reports_resident_and_returned_memory():
    """_peak's (peak, memory live before the call, bytes the call returns),
    with torch.cuda stubbed (the CPU machine has none); a failing call gives Nones."""
    import types

    import torch

    from fastgnn.bench import core

    class FakeCuda:
        def synchronize(self):
            pass

        def reset_peak_memory_stats(self):
            pass

        def memory_allocated(self):
            return 3 * 2**20

        def max_memory_allocated(self):
            return 10 * 2**20

    fake = types.SimpleNamespace(cuda=FakeCuda(), Tensor=torch.Tensor)
    returned = (torch.zeros(2**18), None, torch.zeros(2**18, dtype=torch.float64))   # 1 + 2 MiB
    assert core._peak(fake, lambda: returned) == (10.0, 3.0, 3.0)
    assert core._peak(fake, lambda: 1 / 0) == (None, None, None)


def test_attention_summary_shows_peak_over_needed():
    from fastgnn.bench.cases_attention import attention_summary
    base = dict(family="attention", kind="op", graph="g", dtype="fp32", width=64,
                case="attn_gatv2", status={"fwd_bwd": "ok"})
    recs = [dict(base, impl="fastgnn", fastgnn=True, peak_mib=120.0, peak_over_needed=1.17,
                 speedup_fwd_bwd=10.0, best_baseline_fwd_bwd="pyg-style[edge_index]"),
            dict(base, impl="pyg-style[edge_index]", fastgnn=False, peak_mib=1200.0)]
    (line,) = [s for s in attention_summary(recs) if s.startswith("- g")]
    assert "attn_gatv2 10.00x vs pyg-style[edge_index], peak 0.10x, peak/needed 1.17" in line


# ------------------------------------------------------------------ the CLI for a newcomer

TINY = ["--ops", "spmm_sum", "--layers", "none", "--impls", "torch.sparse", "--width", "4",
        "--repeats", "1", "--warmup", "0", "--no-progress", "--no-plots"]


def test_cpu_plan_picks_cpu_sizes_or_says_what_to_run(capsys):
    """Without CUDA a plain run is --quick, and --suite full stops at once."""
    pytest.importorskip("torch")
    from fastgnn.bench.__main__ import _plan_for_the_cpu, build_parser, main

    args = build_parser().parse_args([])
    _plan_for_the_cpu(args)
    assert args.quick and "running the CPU preset --quick" in capsys.readouterr().err
    args = build_parser().parse_args(["--graphs", "rmat20"])
    _plan_for_the_cpu(args)
    assert not args.quick                           # explicit graphs: as asked
    args = build_parser().parse_args(["--suite", "full", "--graphs", "grid4"])
    _plan_for_the_cpu(args)
    from fastgnn.bench.__main__ import _warn_cpu_size
    capsys.readouterr()
    _warn_cpu_size("rmat20", 16_000_000, True, args)
    _warn_cpu_size("rmat14", 250_000, False, build_parser().parse_args([]))
    _warn_cpu_size("rmat14", 250_000, True, args)
    _warn_cpu_size("rmat10", 16_000, False, args)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "rmat20 has ~16 M edges" in err[0] and "--quick" in err[1]
    with pytest.raises(SystemExit, match=r"sized for an H200(.|\n)*fastgnn bench --quick"):
        main(["--suite", "full", "--device", "cpu"])


def test_nothing_measured_exits_non_zero(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    from fastgnn.bench.__main__ import main

    monkeypatch.delenv("FASTGNN_DATASETS", raising=False)
    out = tmp_path / "r.json"
    rc = main(["--device", "cpu", "--graphs", "npz:no_such_graph", "file:no_such_either",
               "--out", str(out)] + TINY)
    err = capsys.readouterr().err
    assert rc == 1 and json.loads(out.read_text()) == []
    assert "nothing was measured" in err and "no_such_graph" in err and "no_such_either" in err
    assert "FASTGNN_DATASETS" in err and "--datasets DIR" in err
    assert "no_such_graph" in out.with_suffix(".md").read_text()


def test_results_go_to_the_working_directory_or_out(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import fastgnn
    from fastgnn.bench.__main__ import OUT_DIR, main, results_path

    monkeypatch.chdir(tmp_path)
    assert main(["--device", "cpu", "--graphs", "grid4"] + TINY) == 0
    (made,) = (tmp_path / OUT_DIR).glob("*.json")
    assert made.name.startswith("bench-cpu") and made.with_suffix(".md").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [OUT_DIR]
    assert main(["--device", "cpu", "--graphs", "grid4", "--out", "mine"] + TINY) == 0
    assert len(list((tmp_path / "mine").glob("*.json"))) == 1
    package = os.path.dirname(fastgnn.__file__)
    with pytest.raises(SystemExit, match="inside the fastgnn package"):
        results_path(os.path.join(package, "bench", "r.json"), "bench", "cpu")
    monkeypatch.chdir(package)
    with pytest.raises(SystemExit, match="inside the fastgnn package"):
        results_path(None, "bench", "cpu")


def test_default_results_folder_is_ignored_by_git():
    """Run from a checkout, the default results folder leaves `git status` clean."""
    import shutil
    import subprocess
    from fastgnn.bench.__main__ import OUT_DIR

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if shutil.which("git") is None or not os.path.exists(os.path.join(root, ".git")):
        pytest.skip("not a git checkout")
    for where in (f"{OUT_DIR}/bench-cpu-x.json", f"benchmarks/{OUT_DIR}/bench-cpu-x_plots/a.png"):
        assert subprocess.run(["git", "check-ignore", "-q", where], cwd=root).returncode == 0, where


def test_datasets_option_finds_graphs_by_name(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from fastgnn.bench.__main__ import main

    data = tmp_path / "graphs"
    (data / "het").mkdir(parents=True)
    np.savez(data / "het" / "tiny_het.npz", edges=np.array([[0, 1], [1, 2], [2, 3]]))
    monkeypatch.setenv("FASTGNN_DATASETS", str(tmp_path / "elsewhere"))
    out = tmp_path / "r.json"
    assert main(["--device", "cpu", "--graphs", "npz:tiny_het", "--datasets", str(data),
                 "--out", str(out)] + TINY) == 0
    (r,) = json.loads(out.read_text())
    assert r["graph"] == "tiny_het" and r["graph_stats"]["num_nodes"] == 4
    assert os.environ["FASTGNN_DATASETS"] == str(tmp_path / "elsewhere")   # restored
    monkeypatch.setenv("FASTGNN_DATASETS", str(data))
    assert main(["--device", "cpu", "--graphs", "file:tiny_het", "--out", str(out)] + TINY) == 0


def test_terminal_summary_per_family_and_layer():
    """The run's last lines: per op family and layer, rows, geomean x and the
    worst forward+backward row, what x means, and where the report is."""
    from fastgnn.bench import report

    def rec(graph, case, impl, fwd, fwd_bwd, **kw):
        return dict(graph=graph, case=case, dtype="fp32", width=32, impl=impl,
                    fastgnn=impl.startswith("fastgnn"), fwd_ms=fwd, fwd_bwd_ms=fwd_bwd, **kw)
    op = dict(kind="op", family="spmm", layer=None)
    layer = dict(kind="layer", family="layer", layer="GCNConv")
    records = [rec("a", "spmm_sum", "pyg", 2.0, 8.0, **op),
               rec("a", "spmm_sum", "fastgnn[auto]", 1.0, 2.0, **op),
               rec("b", "spmm_sum", "pyg", 1.0, 1.0, **op),
               rec("b", "spmm_sum", "fastgnn[auto]", 1.0, 2.0, **op),
               rec("a", "GCNConv", "pyg", 3.0, 3.0, **layer),
               rec("a", "GCNConv", "fastgnn", 1.0, 1.0, **layer)]
    report.add_speedups(records)
    lines = report.terminal_summary(records, "out.md", "out_plots")
    assert "x = baseline ms / fastgnn ms" in lines[1]
    spmm = next(ln for ln in lines if ln.strip().startswith("ops spmm"))
    # geomean fwd of 2 and 1, fwd+bwd of 4 and 0.5; the worst row is graph b
    assert spmm.split()[2:5] == ["2", "1.41", "1.41"] and "0.50 (spmm_sum on b, fp32, F=32)" in spmm
    assert any(ln.strip().startswith("layer GCNConv") and "3.00" in ln for ln in lines)
    assert lines[-1] == "full report: out.md (plots in out_plots)"


def test_contradicting_measurements_are_flagged():
    """A forward+backward faster than its forward, and repeats whose median is
    far above their best, are flagged in the report and counted at the end."""
    from fastgnn.bench import report
    base = dict(graph="g", case="spmm_sum", dtype="fp32", width=8, kind="op", family="spmm")
    fine = dict(base, impl="fastgnn[auto]", fastgnn=True, fwd_ms=1.0, fwd_ms_min=0.9,
                fwd_bwd_ms=3.0, fwd_bwd_ms_min=2.9)
    inverted = dict(base, impl="pyg", fastgnn=False, fwd_ms=2.0, fwd_ms_min=1.9,
                    fwd_bwd_ms=1.0, fwd_bwd_ms_min=1.0)
    noisy = dict(base, graph="h", impl="pyg", fastgnn=False, fwd_ms=3.0, fwd_ms_min=1.0,
                 fwd_bwd_ms=4.0, fwd_bwd_ms_min=3.9)
    assert report.row_flags(fine) == []
    assert report.row_flags(inverted) == ["fwd+bwd 1 ms < fwd 2 ms"]
    assert report.row_flags(noisy) == ["fwd repeats disagree (median 3 ms, best 1 ms)"]
    section = "\n".join(report.flagged_section([fine, inverted, noisy]))
    assert "## Flagged measurements" in section and section.count("| pyg |") == 2
    report.add_speedups([fine, inverted, noisy])
    assert any("2 measurement(s) flagged" in ln
               for ln in report.terminal_summary([fine, inverted, noisy], "r.md"))
