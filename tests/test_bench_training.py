"""The training suite (`fastgnn bench --suite training`) on a tiny generated
graph, CPU only: the rows' fields, and fastgnn and PyG from the same weights
reaching the same first-epoch loss."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch_geometric")

from fastgnn.bench import __main__ as bench  # noqa: E402
from fastgnn.bench import cases_training as ct  # noqa: E402

FIELDS = ("graph", "graph_stats", "model", "framework", "mode", "status", "error", "metric",
          "split", "features", "epochs", "warmup", "timed_epochs", "ms_per_epoch",
          "ms_per_epoch_min", "first_epoch_s", "loss_first", "loss_last", "val_metric",
          "test_metric", "speedup", "speedup_vs_pyg_eager")


def _run(tmp_path, *extra):
    out = tmp_path / "train.json"
    rc = bench.main(["--suite", "training", "--device", "cpu", "--datasets-names", "rmat8",
                     "--epochs", "3", "--warmup", "1", "--width", "16", "--heads", "2",
                     "--threads", "1", "--no-progress", "--out", str(out), *extra])
    assert rc == 0
    return json.loads(out.read_text()), out


def test_training_rows(tmp_path):
    recs, out = _run(tmp_path, "--modes", "eager")
    assert len(recs) == 2 * len(ct.MODELS)
    assert {(r["model"], r["framework"]) for r in recs} == \
        {(m, f) for m in ct.MODELS for f in ("pyg", "fastgnn")}
    for r in recs:
        for k in FIELDS:
            assert k in r, k
        assert r["kind"] == "training" and r["mode"] == "eager" and r["status"] == "ok", r
        assert r["epochs"] == 3 and r["timed_epochs"] == 2 and r["ms_per_epoch"] > 0
        assert r["split"].startswith("random 60/20/20") and r["metric"] == "accuracy"
        assert 0.0 <= r["test_metric"] <= 1.0 and np.isfinite(r["loss_last"])
    for r in recs:
        if r["framework"] == "fastgnn":
            # the same weights and dropout masks: the same first-epoch loss in fp32
            assert abs(r["loss_first_diff"]) <= 1e-5 * max(1.0, abs(r["loss_first"])), r["model"]
            assert r["speedup"] is not None
    md = out.with_suffix(".md").read_text()
    assert "| rmat8 | GAT | eager |" in md


def test_readme_table_of_training_records(tmp_path, capsys):
    """report --readme-table on training records: one row per (data set,
    model) with PyG eager, fastgnn eager and the captured step side by side."""
    from fastgnn.bench import report
    base = {"kind": "training", "graph": "g", "status": "ok", "metric": "accuracy"}
    recs = [dict(base, model="GCN", framework="pyg", mode="eager", ms_per_epoch=3.0),
            dict(base, model="GCN", framework="fastgnn", mode="eager", ms_per_epoch=2.0,
                 speedup_vs_pyg_eager=1.5),
            dict(base, model="GCN", framework="fastgnn", mode="capture", ms_per_epoch=0.5,
                 speedup_vs_pyg_eager=6.0),
            dict(base, model="GAT", framework="pyg", mode="eager", ms_per_epoch=4.0)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(recs))
    assert report.main([str(path), "--readme-table", "--models", "GCN"]) == 0
    txt = capsys.readouterr().out
    assert "| g | GCN | 3.000 ms | 2.000 ms | 0.500 ms | 1.50x | 6.00x |" in txt
    assert "GAT" not in txt


def test_readme_training_table_is_the_committed_results():
    """The README's training table is what its command prints from the
    committed JSON."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "fastgnn.bench.report",
                          "benchmarks/results/training_h200.json", "--readme-table"],
                         cwd=root, capture_output=True, text=True, check=True).stdout
    assert out.strip() and out.strip() in (root / "README.md").read_text()


def test_compile_failure_is_a_row(tmp_path, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("no compiler here")
    monkeypatch.setattr(torch, "compile", broken)
    recs, _ = _run(tmp_path, "--models", "GCN", "--modes", "eager,compile")
    status = {(r["framework"], r["mode"]): r["status"] for r in recs}
    assert status[("pyg", "eager")] == status[("fastgnn", "eager")] == "ok"
    assert status[("pyg", "compile")] == status[("fastgnn", "compile")] == "failed: RuntimeError"
    assert all("no compiler here" in r["error"] for r in recs if r["mode"] == "compile")


def test_same_weights_same_loss():
    data = ct.generated_data(torch, torch.device("cpu"), "rmat7", seed=3, width=12)
    for name in ct.MODELS:
        state = ct.master_state(torch, name, data, 8, 2, seed=3)
        losses = []
        for fw in ("pyg", "fastgnn"):
            m = ct.build_model(fw, name, 12, 8, data.classes, 2)
            m.load_state_dict(state, strict=True)
            torch.manual_seed(0)
            out = m(data.x, data.edge_index)
            losses.append(torch.nn.functional.cross_entropy(out[data.train], data.y[data.train]))
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)


def test_roc_auc_and_split():
    assert ct.roc_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert ct.roc_auc([1.0, 1.0], [0, 1]) == pytest.approx(0.5)
    assert ct.roc_auc([0.3, 0.2], [1, 1]) is None
    labelled = np.ones(1000, bool)
    labelled[::10] = False
    tr, va, te = ct.random_split(labelled, 0)
    assert not (tr & va).any() and not (tr & te).any() and not (va & te).any()
    assert ((tr | va | te) == labelled).all() and tr.sum() == 540 and va.sum() == 180
    assert (ct.random_split(labelled, 0)[0] == tr).all()


def test_row_gate_closes_on_budget_and_on_a_lost_cuda_context():
    """A spent --budget-minutes and a CUDA context lost in a failed row both
    stop the later rows, noted once with the row they stopped at."""
    import types

    from fastgnn.bench import runinfo
    skipped = []
    gate = runinfo.RowGate(None, skipped)
    assert not gate.closed("a") and not skipped
    cpu = types.SimpleNamespace(type="cpu")
    gate.after_failure(None, cpu, "a", "RuntimeError: x")     # the CPU: nothing to check
    assert not gate.closed("b")

    class LostContext:                     # a torch whose every CUDA call raises
        def ones(self, *a, **k):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
    cuda = types.SimpleNamespace(type="cuda")
    gate.after_failure(LostContext(), cuda, "Cora GAT capture pyg", "AcceleratorError: boom")
    assert gate.closed("Cora GAT capture fastgnn") and gate.closed("Cora GCN eager pyg")
    assert len(skipped) == 1
    assert skipped[0].startswith("from Cora GAT capture fastgnn on: not run, the CUDA context "
                                 "was lost when Cora GAT capture pyg failed (AcceleratorError")
    spent = []
    assert runinfo.RowGate(0, spent).closed("x") and "--budget-minutes 0 was spent" in spent[0]


def test_suites_that_measure_nothing_exit_1_saying_why(tmp_path, monkeypatch, capsys):
    """The training suite without its data sets, and the mini-batch suite
    with no time to run, measure nothing: exit status 1 and the reasons."""
    monkeypatch.setenv("FASTGNN_DATASETS", str(tmp_path / "none"))
    rc = bench.main(["--suite", "training", "--device", "cpu", "--datasets-names", "Cora",
                     "--no-progress", "--out", str(tmp_path / "t.json")])
    assert rc == 1
    assert "nothing was measured" in capsys.readouterr().err
    rc = bench.main(["--suite", "minibatch", "--quick", "--device", "cpu", "--budget-minutes",
                     "0", "--no-progress", "--out", str(tmp_path / "m.json")])
    assert rc == 1
    assert "--budget-minutes 0 was spent" in capsys.readouterr().err


def test_an_interrupted_run_writes_its_report(tmp_path, monkeypatch, capsys):
    """Ctrl-C in the middle of the suite: the rows measured so far still get
    their JSON and report, the report says it was interrupted, exit 130; on
    the CPU the suite says up front what it will run and its time limit."""
    from fastgnn.bench import cases_training
    real, calls = cases_training.run_row, []

    def run_row(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)
    monkeypatch.setattr(cases_training, "run_row", run_row)
    out = tmp_path / "train.json"
    rc = bench.main(["--suite", "training", "--device", "cpu", "--datasets-names", "rmat8",
                     "--models", "GCN", "--epochs", "3", "--warmup", "1", "--width", "16",
                     "--threads", "1", "--no-progress", "--out", str(out)])
    assert rc == 130
    assert len(json.loads(out.read_text())) == 1
    assert "interrupted (Ctrl-C)" in out.with_suffix(".md").read_text()
    assert f"stops starting rows after {cases_training.CPU_BUDGET_MINUTES:g} minutes" in \
        capsys.readouterr().err
