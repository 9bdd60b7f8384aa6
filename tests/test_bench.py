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


REQUIRED = ["gpu", "versions", "graph", "graph_stats", "case", "kind", "impl", "settings",
            "dtype", "width", "fwd_ms", "fwd_bwd_ms", "peak_mib", "floor_ms", "rel_err",
            "path", "status", "command", "speedup_fwd", "speedup_fwd_bwd"]


def test_bench_quick_cpu(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    from fastgnn.bench.__main__ import main

    out = tmp_path / "r.json"
    rc = main(["--quick", "--device", "cpu", "--graphs", "rmat7", "npz:/nonexistent/x.npz",
               "--width", "8", "--repeats", "2", "--warmup", "0", "--no-progress",
               "--out", str(out)])
    assert rc == 0
    recs = json.loads(out.read_text())
    assert recs, "no records"
    for r in recs:
        missing = [k for k in REQUIRED if k not in r]
        assert not missing, f"{r['impl']}: missing {missing}"
        assert r["graph"] == "rmat7" and r["dtype"] == "fp32" and r["width"] == 8
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
