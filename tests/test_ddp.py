"""fastgnn.torch under torch.nn.parallel.DistributedDataParallel, on the CPU.

Two gloo processes (this file run as a script is one rank, started as
torchrun would start it: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) train
small float64 models of fastgnn layers (GCN, GraphSAGE, GAT; and the three
together under torch.compile around the DDP module, its graph split at the
gradient buckets), each rank on batches of its own. After a few SGD steps
the ranks' gradients are bitwise equal, and they and the parameters equal
those of a single-process run on the union of the ranks' batches (the
disjoint union of their graphs, the loss averaged over all their seed
nodes) to rounding; every entry of fastgnn's graph caches holds arrays on
the rank's own device. In this process: every layer's parameters get a
gradient from one forward and backward (so DDP's default
find_unused_parameters=False is right for them), and the example
examples/ddp_minibatch.py trains as a group of one with either layer set.
The same two-rank run over NCCL runs where two GPUs are visible.
"""
from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import fastgnn                                   # noqa: E402
import fastgnn.torch as ft                       # noqa: E402
from fastgnn.bench.cases_minibatch import node_net_class   # noqa: E402
from fastgnn.testing import awkward_edge_index   # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="needs torch.distributed with the gloo backend")

WORLD = 2
STEPS = 3
SEEDS = 12               # seed nodes of each rank's batch (the loss reads their rows)
F_IN, HIDDEN, CLASSES = 7, 8, 3
WIDE = 384               # the compiled model's width: its GATConv's weights alone fill a bucket
BUCKET_MB = 1            # the least bucket torch.compile's DDP graph splitting takes
LR = 0.1
TIMEOUT_S = 300          # for the whole two-rank run: a hung rank fails the test after it


def _net(*convs):
    """conv -> ReLU -> conv ... -> conv (the mini-batch benchmark's model)."""
    return node_net_class()(list(convs))


def _models():
    """name -> a function making the model (2 or 3 conv layers)."""
    return {
        "GCN": lambda: _net(ft.GCNConv(F_IN, HIDDEN), ft.GCNConv(HIDDEN, CLASSES)),
        "SAGE": lambda: _net(ft.SAGEConv(F_IN, HIDDEN), ft.SAGEConv(HIDDEN, CLASSES, aggr="max")),
        "GAT": lambda: _net(ft.GATConv(F_IN, HIDDEN // 2, heads=2),
                            ft.GATConv(HIDDEN, CLASSES, heads=1)),
        "GCN-GAT-SAGE": lambda: _net(ft.GCNConv(F_IN, WIDE),
                                     ft.GATConv(WIDE, WIDE // 2, heads=2),
                                     ft.SAGEConv(WIDE, CLASSES)),
    }


# (model, compiled) runs of the ranks: one model per layer eagerly, then
# the three layers together compiled
RUNS = (("GCN", False), ("SAGE", False), ("GAT", False), ("GCN-GAT-SAGE", True))


def _batch(seed, step, rank):
    """Rank `rank`'s batch of step `step`: (x [n, F_IN], edge_index [2, E],
    y [SEEDS]) on a graph with empty rows, self-loops, duplicate edges and a
    hub; the loss reads the first SEEDS rows. Sizes differ between ranks
    (and stay the same from step to step: one compilation per rank)."""
    n = 30 + 7 * rank
    gen = torch.Generator().manual_seed(seed * 1000 + step * 10 + rank)
    ei = torch.from_numpy(awkward_edge_index(n, 4 * n, seed=seed + 31 * step + rank))
    x = torch.randn(n, F_IN, generator=gen, dtype=torch.float64)
    y = torch.randint(0, CLASSES, (SEEDS,), generator=gen)
    return x, ei, y


def _union(batches):
    """The disjoint union of the ranks' batches: (x, edge_index, y, seed rows)."""
    xs, eis, ys, seeds, offset = [], [], [], [], 0
    for x, ei, y in batches:
        xs.append(x)
        eis.append(ei + offset)
        ys.append(y)
        seeds.append(torch.arange(offset, offset + SEEDS))
        offset += x.shape[0]
    return torch.cat(xs), torch.cat(eis, 1), torch.cat(ys), torch.cat(seeds)


def _model(name, seed):
    torch.manual_seed(seed)
    return _models()[name]().double()


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _grads(model):
    return {k: p.grad.detach().clone() for k, p in model.named_parameters()}


def _loss(model, x, ei, y, seeds):
    return torch.nn.functional.cross_entropy(model(x, ei)[seeds], y)


def _train(model, batches):
    """STEPS SGD steps of `model` on `batches` (one (x, ei, y, seeds) per
    step); returns the last step's gradients."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for x, ei, y, seeds in batches:
        opt.zero_grad()
        _loss(model, x, ei, y, seeds).backward()
        opt.step()
    return _grads(getattr(model, "module", model))


# ------------------------------------------------------------------ the ranks


def _array_devices(obj, seen, out):
    """Collect the devices ("cpu", "cuda:1") of every tensor and array that
    obj holds: tensors, NumPy/CuPy arrays, fastgnn Graphs (their arrays and
    per-graph caches), and the tuples, lists, dicts and plain objects around them."""
    if id(obj) in seen or obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        out.add(str(obj.device))
    elif isinstance(obj, np.ndarray):
        out.add("cpu")
    elif type(obj).__module__.startswith("cupy") and hasattr(obj, "device"):
        out.add(f"cuda:{obj.device.id}")
    elif isinstance(obj, fastgnn.Graph):
        for value in (obj.indptr, obj.indices, obj.cache):
            _array_devices(value, seen, out)
    elif isinstance(obj, dict):
        for value in obj.values():
            _array_devices(value, seen, out)
    elif isinstance(obj, (tuple, list)):
        for value in obj:
            _array_devices(value, seen, out)
    elif hasattr(obj, "__dict__"):
        _array_devices(vars(obj), seen, out)


def cache_devices():
    """(number of cache entries, devices their arrays live on) over every
    LRU cache of fastgnn.torch (graph_cache._CACHES)."""
    from fastgnn.torch import graph_cache
    entries, devices, seen = 0, set(), set()
    for cache in graph_cache._CACHES:
        for _anchor, value in list(cache._d.values()):
            entries += 1
            _array_devices(value, seen, devices)
    return entries, devices


def _rank_main(out_dir, seed, device_kind):
    """One rank: train every model under DDP, eagerly and compiled, and write
    what the test compares to out_dir/rank<r>.pt."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from fastgnn.torch import functional, gemm
    functional.FUSED_MIN_NUMEL = gemm.MIN_NUMEL = 0      # as tests/conftest.py sets them
    rank = int(os.environ["RANK"])
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    if device_kind == "cuda":
        # rank r on cuda:r while cuda:0 stays torch's current device (no
        # set_device): fastgnn's caches follow the tensors' device
        device = torch.device("cuda", rank)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    try:
        result = {}
        for name, compiled in RUNS:
            ft.clear_graph_cache()
            model = _model(name, seed + rank).to(device)    # DDP broadcasts rank 0's weights
            # gradients reduced in several buckets (eagerly: a bucket per
            # parameter); under torch.compile a graph split at every bucket
            # (torch._dynamo's DDPOptimizer), between fastgnn's ops
            ddp = DDP(model, device_ids=[rank] if device.type == "cuda" else None,
                      bucket_cap_mb=BUCKET_MB if compiled else 1e-6)
            runner = torch.compile(ddp, backend="aot_eager") if compiled else ddp
            batches = []
            for step in range(STEPS):
                x, ei, y = (t.to(device) for t in _batch(seed, step, rank))
                batches.append((x, ei, y, torch.arange(SEEDS, device=device)))
            grads = _train(runner, batches)
            result[name, compiled] = {
                "grads": {k: v.cpu() for k, v in grads.items()},
                "state": {k: v.cpu() for k, v in _state(model).items()},
                "cache": cache_devices(), "device": str(device)}
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------ the test side


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_ranks(out_dir, seed, device_kind="cpu", world=WORLD):
    """Start `world` ranks of this file as torchrun would, wait for them
    (TIMEOUT_S at most, then kill them) and return their results."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, __file__, str(out_dir), str(seed), device_kind],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        pytest.fail(f"a rank did not finish within {TIMEOUT_S} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} failed:\n{log[-4000:]}"
    return [torch.load(Path(out_dir) / f"rank{r}.pt") for r in range(world)]


@pytest.fixture(scope="module")
def ranks(request, tmp_path_factory):
    """(seed, each rank's results) of one two-rank run on the CPU."""
    from conftest import seed_for
    seed = seed_for(request.node.nodeid) % 100_000
    return seed, launch_ranks(tmp_path_factory.mktemp("ddp"), seed)


def _single_process(name, seed):
    """The reference: one process training on the union of the ranks' batches."""
    model = _model(name, seed)              # rank 0's initial weights
    batches = [_union([_batch(seed, step, r) for r in range(WORLD)]) for step in range(STEPS)]
    grads = _train(model, batches)
    return grads, _state(model)


def _assert_matches_one_process(ranks, name, compiled, rtol=1e-10, atol=1e-12):
    """Every rank's last gradients bitwise equal to rank 0's (DDP's
    all-reduce) and, with its parameters after the steps, equal to one
    process's on the union of the batches to rounding."""
    seed, results = ranks
    want_grads, want_state = _single_process(name, seed)
    first = results[0][name, compiled]
    for r, result in enumerate(results):
        got = result[name, compiled]
        for k, want in want_grads.items():
            assert torch.equal(got["grads"][k], first["grads"][k]), \
                f"seed {seed}: rank {r}'s gradient of {k} differs from rank 0's"
            torch.testing.assert_close(got["grads"][k], want, rtol=rtol, atol=atol,
                                       msg=lambda m: f"seed {seed}, rank {r}, gradient of {k}: {m}")
        for k, want in want_state.items():
            torch.testing.assert_close(got["state"][k], want, rtol=rtol, atol=atol,
                                       msg=lambda m: f"seed {seed}, rank {r}, parameter {k}: {m}")


def _assert_caches_on_rank_devices(results):
    for r, result in enumerate(results):
        for key, got in result.items():
            entries, devices = got["cache"]
            assert entries > 0, f"rank {r}, {key}: no cache entries to check"
            assert devices == {got["device"]}, f"rank {r}, {key}: cache arrays on {devices}"


@pytest.mark.parametrize("name", [n for n, compiled in RUNS if not compiled])
def test_ddp_matches_one_process_on_the_union(ranks, name):
    """Gradients in sync and equal to one process's on the union of the
    batches, and so the parameters after every step."""
    _assert_matches_one_process(ranks, name, compiled=False)


def test_compiled_ddp_matches_one_process_on_the_union(ranks):
    """torch.compile(DDP(model)), its graph split at every gradient bucket."""
    _assert_matches_one_process(ranks, "GCN-GAT-SAGE", compiled=True)


def test_every_cache_entry_is_on_the_ranks_device(ranks):
    """After each run, every array in every entry of fastgnn.torch's caches
    (graphs, their derived arrays and plans, per-tensor entries) lives on the
    rank's device."""
    _assert_caches_on_rank_devices(ranks[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2
                    or not dist.is_nccl_available(), reason="needs 2 CUDA devices and NCCL")
def test_ddp_on_two_gpus(seed, tmp_path):
    """The same run over NCCL, rank r on cuda:r (float64 on the GPU against
    the CPU's single process: rounding of a different summation order)."""
    seed %= 100_000
    results = launch_ranks(tmp_path, seed, "cuda")
    for name, compiled in RUNS:
        _assert_matches_one_process((seed, results), name, compiled, rtol=1e-8, atol=1e-10)
    _assert_caches_on_rank_devices(results)


# ------------------------------------------------ find_unused_parameters=False

def _layer_cases():
    """name -> (layer constructor, forward(layer, x, edge_index, edge_attr, edge_type)):
    every fastgnn.torch layer, with the options that add parameters."""
    F, D, R = 6, 3, 3
    deg = torch.tensor([0, 3, 5, 8, 4, 2])
    plain = lambda m, x, ei, ea, et: m(x, ei)          # noqa: E731
    edge = lambda m, x, ei, ea, et: m(x, ei, ea)       # noqa: E731
    typed = lambda m, x, ei, ea, et: m(x, ei, et)      # noqa: E731
    multi = {"mode": "attn", "mode_kwargs": {"in_channels": F, "out_channels": F, "num_heads": 2}}
    return {
        "GCNConv": (lambda: ft.GCNConv(F, 4), plain),
        "SAGEConv-project": (lambda: ft.SAGEConv(F, 4, project=True), plain),
        "SAGEConv-softmax": (lambda: ft.SAGEConv(F, 4, aggr="softmax",
                                                 aggr_kwargs={"learn": True}), plain),
        "SAGEConv-powermean": (lambda: ft.SAGEConv(F, 4, aggr="powermean",
                                                   aggr_kwargs={"learn": True}), plain),
        "SAGEConv-multi-attn": (lambda: ft.SAGEConv(F, 4, aggr=["mean", "max"],
                                                    aggr_kwargs=multi), plain),
        "GINConv": (lambda: ft.GINConv(torch.nn.Linear(F, 4), train_eps=True), plain),
        "GATConv": (lambda: ft.GATConv(F, 2, heads=2, edge_dim=D, residual=True), edge),
        "GATv2Conv": (lambda: ft.GATv2Conv(F, 2, heads=2, edge_dim=D, residual=True), edge),
        "TransformerConv": (lambda: ft.TransformerConv(F, 2, heads=2, beta=True, edge_dim=D),
                            edge),
        "GraphConv": (lambda: ft.GraphConv(F, 4), plain),
        "SGConv": (lambda: ft.SGConv(F, 4, K=2), plain),
        "TAGConv": (lambda: ft.TAGConv(F, 4), plain),
        "LEConv": (lambda: ft.LEConv(F, 4), plain),
        "ClusterGCNConv": (lambda: ft.ClusterGCNConv(F, 4), plain),
        "ChebConv": (lambda: ft.ChebConv(F, 4, K=3), plain),
        "GINEConv": (lambda: ft.GINEConv(torch.nn.Linear(F, 4), edge_dim=D, train_eps=True),
                     edge),
        "ResGatedGraphConv": (lambda: ft.ResGatedGraphConv(F, 4), plain),
        "GENConv": (lambda: ft.GENConv(F, 4, aggr="powermean", learn_p=True, msg_norm=True,
                                       learn_msg_scale=True, edge_dim=D), edge),
        "GENConv-softmax": (lambda: ft.GENConv(F, 4, learn_t=True), plain),
        "PNAConv": (lambda: ft.PNAConv(F, 4, ["mean", "max"], ["identity", "amplification"],
                                       deg, edge_dim=D, towers=2), edge),
        "RGCNConv": (lambda: ft.RGCNConv(F, 4, R, num_bases=2), typed),
        "RGCNConv-blocks": (lambda: ft.RGCNConv(F, 4, R, num_blocks=2), typed),
        "FastRGCNConv": (lambda: ft.FastRGCNConv(F, 4, R), typed),
    }


def test_every_layer_parameter_gets_a_gradient(seed):
    """One forward and backward reaches every parameter of every layer (with
    the options that add parameters): DDP's default find_unused_parameters=False
    waits for exactly those, and would hang or raise on one left out. (APPNP
    has no parameters.)"""
    n, e = 40, 200
    ei = torch.from_numpy(awkward_edge_index(n, e, seed=seed))
    x = torch.randn(n, 6, dtype=torch.float64)
    ea = torch.randn(ei.shape[1], 3, dtype=torch.float64)
    et = torch.randint(0, 3, (ei.shape[1],))
    for name, (make, forward) in _layer_cases().items():
        layer = make().double()
        out = forward(layer, x, ei, ea, et)
        (out * torch.randn_like(out)).sum().backward()
        missing = [k for k, p in layer.named_parameters() if p.requires_grad and p.grad is None]
        assert not missing, f"{name}: no gradient for {missing}"


# ------------------------------------------------ the example and the benchmark script

ROOT = Path(__file__).resolve().parents[1]


def _load(relative):
    """The module of a script of this repository, by its path."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(Path(relative).stem, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TINY = ["--graph", "rmat9e4", "--features", "8", "--hidden", "8", "--heads", "2",
        "--fanouts", "3", "3", "--batch-size", "8", "--pool", "3", "--warmup", "1"]


@pytest.mark.parametrize("model", ["sage", "gat"])
def test_example_trains_as_one_rank(model, monkeypatch, tmp_path):
    """examples/ddp_minibatch.py in this process as a group of one (as
    torchrun's environment describes it): fastgnn's layers and PyG's train
    the same weights on the same batches to the same losses."""
    pytest.importorskip("torch_geometric")
    example = _load("examples/ddp_minibatch.py")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    results = {}
    for layers in ("fastgnn", "pyg"):
        out = tmp_path / f"{layers}.json"
        example.main(["--model", model, "--layers", layers, "--device", "cpu", "--steps", "2",
                      "--json", str(out), *TINY])
        results[layers] = json.loads(out.read_text())
    fast, pyg = results["fastgnn"], results["pyg"]
    assert fast["world_size"] == 1 and fast["backend"] == "gloo" and fast["samples_per_s"] > 0
    for key in ("rank0_loss_first", "rank0_loss_last"):
        assert fast[key] == pytest.approx(pyg[key], rel=1e-4), key
    assert not dist.is_initialized()


@pytest.mark.slow
def test_scaling_script_runs_the_example_under_torchrun(tmp_path):
    """benchmarks/ddp_scaling.py's dry run on the CPU: torchrun with 1 and 2
    gloo processes, both layer sets; the records, speedups and report."""
    pytest.importorskip("torch_geometric")
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ddp_scaling.py"),
                          "--device", "cpu", "--gpus", "1", "2", "--models", "sage",
                          "--out", str(tmp_path), "--", "--steps", "2", *TINY],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    records = json.loads(next(tmp_path.glob("ddp_scaling_cpu*.json")).read_text())
    assert [(r["layers"], r["world_size"]) for r in records] == [
        ("fastgnn", 1), ("fastgnn", 2), ("pyg", 1), ("pyg", 2)]
    by = {(r["layers"], r["world_size"]): r for r in records}
    for n in (1, 2):
        assert by["fastgnn", n]["rank0_loss_first"] == pytest.approx(
            by["pyg", n]["rank0_loss_first"], rel=1e-4)
        assert by["fastgnn", n]["fastgnn_over_pyg"] > 0
    assert by["fastgnn", 1]["speedup_vs_1"] == 1.0
    assert "| SAGE-mean | fastgnn | 2 |" in next(tmp_path.glob("ddp_scaling_cpu*.md")).read_text()


if __name__ == "__main__":
    _rank_main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
