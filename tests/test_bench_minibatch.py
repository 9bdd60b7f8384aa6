"""The mini-batch suite (`fastgnn bench --suite minibatch`) on the CPU: the
neighbour sampler's output layout, the batches each timing trains on, the
rows' fields, and fastgnn and PyG from the same weights on the same batches
reaching the same losses."""
import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch_geometric")

from fastgnn import generators as gen  # noqa: E402
from fastgnn.bench import __main__ as bench  # noqa: E402
from fastgnn.bench import cases_minibatch as cm  # noqa: E402

FIELDS = ("workload", "model", "framework", "graph", "graph_stats", "batches", "status", "error",
          "steps", "warmup", "new_ms", "same_ms", "overhead_ms", "new_over_same", "new_ms_min",
          "same_ms_min", "loss_first", "loss_last", "losses_new", "losses_same", "losses_finite")


def _graph(scale=9, ef=6, seed=0):
    ei, n = gen.rmat(scale, ef, seed=seed)
    return torch.from_numpy(ei), n


def test_csc_by_target():
    ei, n = _graph()
    colptr, row = cm.csc_by_target(torch, ei, n)
    assert colptr.shape == (n + 1,) and row.shape == (ei.shape[1],)
    assert int(colptr[-1]) == ei.shape[1]
    for v in (0, 1, n // 2, n - 1):
        want = ei[0][ei[1] == v]                       # in edge order
        assert torch.equal(row[colptr[v]:colptr[v + 1]], want)


@pytest.mark.parametrize("fanouts", [(4, 3), (2, 2, 2)])
def test_sampler_layout(fanouts, seed):
    ei, n = _graph()
    colptr, row = cm.csc_by_target(torch, ei, n)
    g = torch.Generator().manual_seed(seed)
    seeds = torch.randperm(n, generator=g)[:32]
    sub = cm.sample_neighbors(torch, colptr, row, seeds, fanouts, generator=g)
    n_id, (src, dst) = sub.n_id, sub.edge_index
    m = sub.num_nodes
    # sizes and ranges
    assert sub.batch_size == 32 and torch.equal(n_id[:32], seeds)
    assert n_id.unique().numel() == m and sum(sub.num_sampled_nodes) == m
    assert len(sub.num_sampled_nodes) == len(fanouts) + 1
    assert len(sub.num_sampled_edges) == len(fanouts)
    assert sub.edge_index.dtype == torch.int64
    assert sub.edge_index.shape == (2, sum(sub.num_sampled_edges))
    assert int(src.min()) >= 0 and int(src.max()) < m and int(dst.min()) >= 0 and int(dst.max()) < m
    # sorted by target, NeighborLoader's CSC order
    assert bool((dst[1:] >= dst[:-1]).all())
    # every edge is an edge of the graph, once
    keys = set((ei[0] * n + ei[1]).tolist())
    pairs = (n_id[src] * n + n_id[dst]).tolist()
    assert set(pairs) <= keys and len(set(pairs)) == len(pairs)
    # hop h's edges go into the nodes first reached in hop h - 1, from nodes
    # reached up to hop h; a node keeps all its in-edges when it has at most
    # fanouts[h], else at most fanouts[h] of them
    bounds = np.cumsum([0] + sub.num_sampled_nodes)
    deg = colptr[1:] - colptr[:-1]
    counts = torch.bincount(dst, minlength=m)
    e0 = 0
    for h, k in enumerate(fanouts):
        lo, hi = bounds[h], bounds[h + 1]
        e1 = e0 + sub.num_sampled_edges[h]
        assert bool(((dst[e0:e1] >= lo) & (dst[e0:e1] < hi)).all())
        if e1 > e0:
            assert int(src[e0:e1].max()) < bounds[h + 2]
        for v in range(lo, hi):
            d, c = int(deg[n_id[v]]), int(counts[v])
            if d <= k:
                assert c == d
            else:
                assert 1 <= c <= k
        e0 = e1
    # nodes reached in the last hop are not expanded
    assert int(counts[bounds[-2]:].sum()) == 0
    # reproducible from the generator's seed
    g2 = torch.Generator().manual_seed(seed)
    again = cm.sample_neighbors(torch, colptr, row, torch.randperm(n, generator=g2)[:32], fanouts,
                                generator=g2)
    assert torch.equal(again.n_id, n_id) and torch.equal(again.edge_index, sub.edge_index)


def test_sampled_batches_are_edge_index_objects():
    from torch_geometric import EdgeIndex
    wl = cm.sampled_workload(torch, torch.device("cpu"), graph="rmat9e6", features=8, hidden=8,
                             fanouts=(3, 2), batch_size=16, pool=cm.MIN_POOL, seed=1)
    assert len(wl.pool) == cm.MIN_POOL and wl.settings["mean_edges"] > 0
    x, ei, y, b = wl.pool[0].inputs()
    assert isinstance(ei, EdgeIndex) and ei.sparse_size() == (x.shape[0], x.shape[0])
    assert ei.is_sorted_by_col and b == 16 and y.shape == (16,) and x.shape[1] == 8
    ei.validate()
    assert ei is not wl.pool[0].inputs()[1]                 # a new object per step


def test_new_cycles_the_pool_and_same_repeats_the_first(monkeypatch):
    wl = cm.small_workload(torch, torch.device("cpu"), features=4, hidden=8, graphs_per_batch=4,
                           pool=cm.MIN_POOL, graph_nodes=(10, 12), seed=2)
    assert len(wl.pool) == cm.MIN_POOL
    assert all(b.num_graphs == 4 and b.y.shape == (4,) for b in wl.pool)
    seen = []
    orig = cm.GraphsBatch.inputs

    def spy(self):
        seen.append(id(self))
        return orig(self)
    monkeypatch.setattr(cm.GraphsBatch, "inputs", spy)
    model = cm.build_model("pyg", "small", "GCN", 4, 8, wl.classes, 2)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ids = [id(b) for b in wl.pool]
    seen.clear()
    cm.run_phase(torch, model, state, wl, new=True, steps=cm.MIN_POOL + 3, warmup=2, cuda=False)
    # one batch per step (warm-up included), in turn
    assert seen == [ids[i % len(ids)] for i in range(cm.MIN_POOL + 5)]
    seen.clear()
    cm.run_phase(torch, model, state, wl, new=False, steps=3, warmup=1, cuda=False)
    assert seen == [ids[0]]


def _run(tmp_path, *extra):
    out = tmp_path / "mb.json"
    rc = bench.main(["--suite", "minibatch", "--quick", "--device", "cpu", "--threads", "1",
                     "--steps", "3", "--mb-warmup", "1", "--no-progress", "--out", str(out),
                     *extra])
    assert rc == 0
    return json.loads(out.read_text()), out


def test_minibatch_rows_and_losses(tmp_path):
    recs, out = _run(tmp_path, "--mb-models", "GCN", "SAGE-mean")
    assert {(r["workload"], r["model"], r["framework"]) for r in recs} == \
        {(w, m, f) for w in cm.WORKLOADS for m in ("GCN", "SAGE-mean") for f in ("pyg", "fastgnn")}
    for r in recs:
        for k in FIELDS:
            assert k in r, k
        assert r["kind"] == "minibatch" and r["status"] == "ok", r
        assert r["new_ms"] > 0 and r["same_ms"] > 0
        assert r["overhead_ms"] == pytest.approx(r["new_ms"] - r["same_ms"], abs=1e-3)
        assert len(r["losses_new"]) == len(r["losses_same"]) == 4 and r["losses_finite"]
        assert math.isfinite(r["loss_first"]) and math.isfinite(r["loss_last"])
        assert r["loss_first"] == r["losses_new"][0] and r["loss_last"] == r["losses_new"][-1]
        assert r["batches"]["pool"] == cm.MIN_POOL and r["batches"]["mean_nodes"] > 0
    for r in recs:
        if r["framework"] == "fastgnn":
            # same weights, same batches in the same order: the same losses in fp32
            assert r["loss_max_rel_diff"] <= 1e-4, (r["workload"], r["model"], r["losses_new"])
            assert r["speedup_new"] > 0 and r["speedup_same"] > 0
    md = out.with_suffix(".md").read_text()
    assert "| sampled | GCN |" in md and "| small | SAGE-mean |" in md and "## Summary" in md


def test_failed_framework_is_a_row(tmp_path, monkeypatch):
    import fastgnn.torch as fgt

    def broken(self, *a, **k):
        raise RuntimeError("this layer is broken")
    monkeypatch.setattr(fgt.GCNConv, "forward", broken)
    recs, out = _run(tmp_path, "--workloads", "small", "--mb-models", "GCN", "GIN")
    status = {(r["model"], r["framework"]): r["status"] for r in recs}
    assert status[("GCN", "fastgnn")] == "failed: RuntimeError: this layer is broken"
    assert status[("GCN", "pyg")] == status[("GIN", "pyg")] == status[("GIN", "fastgnn")] == "ok"
    assert "## Failures" in out.with_suffix(".md").read_text()


def test_options_are_checked():
    with pytest.raises(SystemExit, match="at least 16"):
        bench.main(["--suite", "minibatch", "--quick", "--device", "cpu", "--pool", "4"])
    with pytest.raises(SystemExit, match="unknown model"):
        bench.main(["--suite", "minibatch", "--quick", "--device", "cpu", "--mb-models", "GXN"])


def test_same_weights_same_forward():
    """Every model of both workloads: fastgnn's forward from PyG's state_dict
    equals PyG's on a sampled batch (EdgeIndex) and a batch of small graphs."""
    cpu = torch.device("cpu")
    wls = [cm.sampled_workload(torch, cpu, graph="rmat8e6", features=6, hidden=8, fanouts=(3, 3),
                               batch_size=8, pool=cm.MIN_POOL, classes=3, seed=4),
           cm.small_workload(torch, cpu, features=6, hidden=8, graphs_per_batch=3,
                             pool=cm.MIN_POOL, graph_nodes=(10, 14), classes=3, seed=4)]
    for wl in wls:
        for name in cm.MODELS:
            state = cm.master_state(torch, wl.name, name, 6, 8, 3, 2, seed=5)
            outs = []
            for fw in ("pyg", "fastgnn"):
                m = cm.build_model(fw, wl.name, name, 6, 8, 3, 2)
                m.load_state_dict(state, strict=True)
                inputs = wl.pool[1].inputs()
                outs.append(m(*inputs[:4]) if wl.graph_level else m(*inputs[:2]))
            torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-5,
                                       msg=lambda s: f"{wl.name} {name}: {s}")
