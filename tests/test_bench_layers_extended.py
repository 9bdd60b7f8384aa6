"""The opt-in layer cases of fastgnn.bench (cases_layers_extended.py) on the
CPU: each runs on a tiny graph with fastgnn's and PyG's rows measured and in
agreement with the float32 PyG reference; selection; forms PyG lacks are
listed as skipped; --compile hands the further forward inputs on."""
import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch_geometric")

from fastgnn.bench import cases_layers_extended as ext  # noqa: E402

CASES = [spec.name for spec in ext.LAYER_CASES]
TINY = ["--device", "cpu", "--graphs", "rmat7", "--width", "8", "--repeats", "1", "--warmup",
        "0", "--no-progress", "--no-plots", "--ops", "none"]


@pytest.fixture(scope="module")
def extended_run(tmp_path_factory):
    """One quick CPU run of every opt-in layer case: (records by (case, impl), report text)."""
    from fastgnn.bench.__main__ import main

    out = tmp_path_factory.mktemp("extended") / "r.json"
    assert main(["--quick"] + TINY + ["--layers"] + CASES + ["--out", str(out)]) == 0
    recs = json.loads(out.read_text())
    by = {}
    for r in recs:
        assert (r["case"], r["impl"]) not in by, r
        by[(r["case"], r["impl"])] = r
    return by, out.with_suffix(".md").read_text()


def test_the_layers_fastgnn_torch_gained_are_cases():
    assert set(CASES) == {
        "GraphConv", "SGConv", "APPNP", "TAGConv", "LEConv", "ClusterGCNConv", "ChebConv",
        "RGCNConv_8rel", "FastRGCNConv_8rel", "GINEConv", "ResGatedGraphConv", "GENConv",
        "PNAConv", "HGTConv", "SAGEConv_softmax", "SAGEConv_powermean"}


@pytest.mark.parametrize("case", CASES)
def test_extended_case_runs_and_agrees(extended_run, case):
    by, md = extended_run
    spec = next(s for s in ext.LAYER_CASES if s.name == case)
    rows = {impl: r for (c, impl), r in by.items() if c == case}
    want = {"fastgnn[edge_index]", "pyg[edge_index]"}
    want |= {f"pyg[{cls},edge_index]" for cls in spec.pyg_also}
    if spec.csr_skip is None:
        want.add("pyg[csr adj_t]")
    else:
        assert f"{case} / pyg[csr adj_t]: {spec.csr_skip}" in md
    if spec.csc:
        want.add({"fused": "pyg[EdgeIndex csc]", "segment": "pyg[EdgeIndex csc,segment]"}[spec.csc])
    assert set(rows) == want
    for impl, r in rows.items():
        assert r["kind"] == "layer" and r["family"] == spec.family and r["layer"] == case
        assert r["status"] == {"fwd": "ok", "fwd_bwd": "ok"}, (impl, r.get("reason"))
        assert r["rel_err"] < 1e-5 and r["rel_err_grad"] < 1e-5, (impl, r)
        assert r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0
        assert "note" not in r, r["note"]                 # every parameter shared by name
        assert "errors" not in r or not r["errors"].get("reference"), r["errors"]
    assert rows["fastgnn[edge_index]"]["fastgnn"]
    assert rows["fastgnn[edge_index]"]["speedup_fwd_bwd"] is not None
    assert f"fastgnn.torch.{spec.layer}({spec.settings})" in rows["fastgnn[edge_index]"]["settings"]


def test_extended_cases_are_opt_in_and_selectable(tmp_path):
    from fastgnn.bench.__main__ import _load_cases, _select
    _load_cases()
    default = {c.name for c in _select(None, "layer")}
    assert {"GCNConv", "SAGEConv", "GINConv", "GATConv", "SAGEConv_max"} <= default
    assert not default & set(CASES)
    assert set(CASES) <= {c.name for c in _select(["all"], "layer")}
    spmm_all = {c.name for c in _select(["all"], "layer", family="spmm")}
    assert {"GraphConv", "ChebConv", "RGCNConv_8rel"} <= spmm_all and "GENConv" not in spmm_all
    assert [c.name for c in _select(["rgcnconv_8rel", "PNAConv"], "layer")] == [
        "RGCNConv_8rel", "PNAConv"]


def test_edge_inputs_are_seeded_per_ctx():
    import torch

    from fastgnn.bench import core
    from fastgnn.bench.graphs import make

    g = make("grid4", torch, torch.device("cpu"), 0)
    E = g.edge_index.shape[1]

    def ctx(seed):
        x = torch.zeros(g.num_nodes, 4)
        return core.Ctx(torch, torch.device("cpu"), torch.float32, "fp32", 4, g, x, x, x, seed)
    a, b, c = ctx(0), ctx(0), ctx(1)
    (ta,), (tb,), (tc,) = ext.edge_type(a), ext.edge_type(b), ext.edge_type(c)
    assert ta.shape == (E,) and ta.dtype == torch.int64
    assert 0 <= int(ta.min()) and int(ta.max()) < ext.RELATIONS
    assert torch.equal(ta, tb) and not torch.equal(ta, tc)
    assert ext.edge_type(a)[0] is ta                      # drawn once per ctx
    (ea,) = ext.edge_attr(a)
    assert ea.shape == (E, ext.EDGE_DIM) and torch.equal(ea, ext.edge_attr(b)[0])
    hist = ext.in_degree_histogram(a)
    assert int(hist.sum()) == g.num_nodes and int((hist * torch.arange(len(hist))).sum()) == E


def test_compiled_pyg_gets_the_edge_inputs(tmp_path, monkeypatch):
    """--compile on cases with edge features / relation types (torch.compile
    replaced by the identity here: real compilation takes tens of seconds)."""
    import torch

    from fastgnn.bench.__main__ import main

    monkeypatch.setattr(torch, "compile", lambda module, **kw: module)
    out = tmp_path / "c.json"
    assert main(TINY + ["--layers", "GINEConv", "RGCNConv_8rel", "GraphConv", "--compile",
                        "--impls", "compiled", "--out", str(out)]) == 0
    recs = {r["case"]: r for r in json.loads(out.read_text())}
    assert set(recs) == {"GINEConv", "RGCNConv_8rel", "GraphConv"}
    for case, r in recs.items():
        assert r["impl"] == "pyg[compiled]" and r["status"] == {"fwd": "ok", "fwd_bwd": "ok"}, r
        assert r["rel_err"] < 1e-5 and r["rel_err_grad"] < 1e-5, r
    assert recs["GINEConv"]["compiled_form"] == "edge_index"       # PyG lacks the CSR form
    assert recs["GraphConv"]["compiled_form"] == "csr adj_t"


def test_typed_graph_holds_every_edge_once():
    """HGTConv's typed inputs: each bench edge in exactly one edge type, by
    its end points' node types and its relation, with indices local to the
    node types; made once per ctx."""
    import torch

    from fastgnn.bench import core
    from fastgnn.bench.graphs import make

    g = make("grid4", torch, torch.device("cpu"), 0)
    x = torch.zeros(g.num_nodes, 4)
    ctx = core.Ctx(torch, torch.device("cpu"), torch.float32, "fp32", 4, g, x, x, x, 0)
    half, typed = ext.typed_graph(ctx)
    assert ext.typed_graph(ctx)[1] is typed and list(typed) == list(ext.HGT_EDGE_TYPES)
    (relation,) = ext.edge_type(ctx)
    rows = {"a": half, "b": g.num_nodes - half}
    offset = {"a": 0, "b": half}
    found = []
    for (src, rel, dst), ei in typed.items():
        assert 0 <= int(ei.min()) and int(ei[0].max()) < rows[src] and int(ei[1].max()) < rows[dst]
        found += [(int(s) + offset[src], int(d) + offset[dst], rel) for s, d in ei.t()]
    want = [(int(s), int(d), f"r{int(r) % ext.HGT_RELATIONS}")
            for (s, d), r in zip(g.edge_index.t(), relation)]
    assert sorted(found) == sorted(want)
