"""Relation-typed and heterogeneous graphs in fastgnn.torch (nn_hetero.py)
against PyG 2.8: RGCNConv and FastRGCNConv, and fastgnn's layers inside
PyG's HeteroConv and `to_hetero`.

Each comparison loads a PyG layer's state_dict into ours and ours back into
PyG's (strict=True both ways), then compares the output and EVERY gradient
(float features, every parameter) in float64 on the CPU under a random
cotangent. Typed graphs are drawn from the test's seed (`seed` fixture;
FASTGNN_TEST_SEED=random explores others): several relations, the last one
without edges, duplicate edges of one relation, self-loops, targets without
in-edges, a hub and isolated nodes; the seed is in every failure message."""
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch_geometric.nn as pyg
from torch_geometric import EdgeIndex

import fastgnn
import fastgnn.torch as ft
from fastgnn.testing import (assert_results_match, awkward_edge_index, fresh_pyg_class,
                             shapes_seen)
from fastgnn.torch import nn_hetero

warnings.filterwarnings("ignore", message=".*[Ss]parse.*")

needs_gpu = pytest.mark.skipif(not (fastgnn.gpu_available() and torch.cuda.is_available()),
                               reason="needs a CUDA device visible to CuPy and torch")

ROOT = Path(__file__).resolve().parents[1]
N, N_SRC = 37, 23          # nodes (targets), sources of the bipartite graphs
ISOLATED = 3               # the last nodes are in no edge
R = 5                      # relations; relation R - 1 has no edges
NARROW, WIDE, OUT = 2, 8, 4   # feature widths: aggregation before / after Theta_r


def _typed_graph(seed, bipartite=False):
    """(edge_index [2, E], edge_type [E]) of the seed over all but the last
    ISOLATED nodes, with a few edges repeated with their relation."""
    rng = np.random.default_rng(seed)
    live = N - ISOLATED
    ei = awkward_edge_index(live, 4 * live, seed=seed,
                            num_src=N_SRC - ISOLATED if bipartite else None)
    et = rng.integers(0, R - 1, ei.shape[1])
    again = rng.integers(0, ei.shape[1], 6)
    return (torch.from_numpy(np.concatenate([ei, ei[:, again]], 1)),
            torch.from_numpy(np.concatenate([et, et[again]])))


def _features(seed, rows, width):
    return torch.from_numpy(np.random.default_rng(seed + rows + width).standard_normal(
        (rows, width)))


def _cotangent(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


def _layers(name, *args, ref_name=None, **kwargs):
    """PyG's layer (a fresh class: `fresh_pyg_class`) and ours from the same
    constructor call, float64."""
    ref = fresh_pyg_class(getattr(pyg, ref_name or name))(*args, **kwargs)
    return ref.double(), getattr(ft, name)(*args, **kwargs).double()


def _run(layer, x, *graph, seed):
    """{output, gradient of each float feature tensor, of each parameter}."""
    def leaf(t):
        return t.clone().requires_grad_() if t is not None and t.is_floating_point() else t
    xs = tuple(leaf(t) for t in x) if isinstance(x, tuple) else leaf(x)
    out = layer(xs, *graph)
    (out * _cotangent(out.shape, seed)).sum().backward()
    res = {"output": out.detach()}
    for i, t in enumerate(xs if isinstance(xs, tuple) else (xs,)):
        if t is not None and t.requires_grad:
            res[f"grad x[{i}]"] = t.grad
    res.update({f"grad {name}": p.grad for name, p in layer.named_parameters()})
    return res


def _compare(seed, ref, ours, x, *graph):
    """Load PyG's parameters into ours and ours back into PyG's (strict),
    then compare outputs and gradients; the seed in any failure."""
    ours.load_state_dict(ref.state_dict(), strict=True)
    ref.load_state_dict(ours.state_dict(), strict=True)
    try:
        assert_results_match(_run(ours, x, *graph, seed=seed), _run(ref, x, *graph, seed=seed))
    except AssertionError as error:
        raise AssertionError(f"seed {seed}: {error}") from None


DECOMPOSITIONS = {"full": {}, "bases": {"num_bases": 3}, "blocks": {"num_blocks": 2}}
RGCN_AGGRS = ["mean", "add", "sum", "max", "min", "mul", "var", "std"]
CASES = ([("RGCNConv", a) for a in RGCN_AGGRS]
         + [("FastRGCNConv", a) for a in ("mean", "add", "sum")])


# ------------------------------------------------------------------ RGCNConv
@pytest.mark.parametrize("width", [NARROW, WIDE])
@pytest.mark.parametrize("decomposition", list(DECOMPOSITIONS))
@pytest.mark.parametrize("name,aggr", CASES)
def test_rgcn_matches_pyg(name, aggr, decomposition, width, seed):
    ei, et = _typed_graph(seed)
    ref, ours = _layers(name, width, OUT, R, aggr=aggr, **DECOMPOSITIONS[decomposition])
    _compare(seed, ref, ours, _features(seed, N, width), ei, et)


@pytest.mark.parametrize("x_form", ["none", "indices"])
@pytest.mark.parametrize("decomposition", ["full", "bases"])
@pytest.mark.parametrize("name,aggr", [("RGCNConv", "mean"), ("RGCNConv", "add"),
                                       ("RGCNConv", "max"), ("RGCNConv", "std"),
                                       ("FastRGCNConv", "mean"), ("FastRGCNConv", "add")])
def test_rgcn_featureless_matches_pyg(name, aggr, decomposition, x_form, seed):
    """x None (node i's own learned row) or node indices (RGCNConv: the row
    the index names; FastRGCNConv: the node's position, as PyG's)."""
    ei, et = _typed_graph(seed)
    rows = N if x_form == "none" else N + 4
    x = None if x_form == "none" else torch.from_numpy(
        np.random.default_rng(seed).permutation(rows)[:N])
    ref, ours = _layers(name, rows, OUT, R, aggr=aggr, **DECOMPOSITIONS[decomposition])
    _compare(seed, ref, ours, x, ei, et)


BIPARTITE_FORMS = {"float": ((WIDE, NARROW), ("float", "float")),
                   "indices": ((N_SRC + 2, N + 2), ("index", "index")),
                   "none_src": ((N_SRC, N + 2), (None, "index")),
                   "index_src_float_dst": ((N_SRC, NARROW), (None, "float")),
                   "float_src_index_dst": ((WIDE, N + 2), ("float", "index"))}


def _pair(seed, kinds, widths):
    def side(kind, rows, width, salt):
        if kind == "float":
            return _features(seed + salt, rows, width)
        if kind == "index":
            return torch.from_numpy(np.random.default_rng(seed + salt).permutation(width)[:rows])
        return None
    return side(kinds[0], N_SRC, widths[0], 1), side(kinds[1], N, widths[1], 2)


@pytest.mark.parametrize("form", list(BIPARTITE_FORMS))
@pytest.mark.parametrize("name,aggr", [("RGCNConv", "mean"), ("RGCNConv", "max"),
                                       ("FastRGCNConv", "add")])
def test_rgcn_bipartite_matches_pyg(name, aggr, form, seed):
    """(x_src, x_dst) pairs. A float side beside an index side is refused by
    PyG's RGCNConv and computed by its FastRGCNConv: ours is held to
    FastRGCNConv there (the same function where both compute one)."""
    widths, kinds = BIPARTITE_FORMS[form]
    mixed = len({k or "index" for k in kinds}) == 2
    ei, et = _typed_graph(seed, bipartite=True)
    ref_name = "FastRGCNConv" if mixed and aggr != "max" else None
    if mixed and aggr == "max":
        pytest.skip("PyG computes a mixed pair only in FastRGCNConv, which has no max")
    ref, ours = _layers(name, widths, OUT, R, aggr=aggr, ref_name=ref_name)
    _compare(seed, ref, ours, _pair(seed, kinds, widths), ei, et)


@pytest.mark.parametrize("root_weight,bias", [(False, True), (True, False), (False, False)])
@pytest.mark.parametrize("name", ["RGCNConv", "FastRGCNConv"])
@pytest.mark.parametrize("width", [NARROW, WIDE])
def test_rgcn_without_root_or_bias_matches_pyg(width, name, root_weight, bias, seed):
    ei, et = _typed_graph(seed)
    ref, ours = _layers(name, width, OUT, R, root_weight=root_weight, bias=bias)
    _compare(seed, ref, ours, _features(seed, N, width), ei, et)


def test_rgcn_takes_an_edge_index_object(seed):
    ei, et = _typed_graph(seed)
    ref, ours = _layers("RGCNConv", WIDE, OUT, R)
    _compare(seed, ref, ours, _features(seed, N, WIDE), EdgeIndex(ei, sparse_size=(N, N)), et)


@pytest.mark.parametrize("x_form", ["float", "none"])
def test_rgcn_target_to_source_matches_pyg(x_form, seed):
    ei, et = _typed_graph(seed)
    width = WIDE if x_form == "float" else N
    ref, ours = _layers("RGCNConv", width, OUT, R, flow="target_to_source")
    x = _features(seed, N, WIDE) if x_form == "float" else None
    _compare(seed, ref, ours, x, ei, et)
    with pytest.raises(NotImplementedError, match="target_to_source"):
        ours((x if x is not None else torch.arange(N),) * 2, ei, et)


@pytest.mark.parametrize("name", ["RGCNConv", "FastRGCNConv"])
@pytest.mark.parametrize("decomposition", list(DECOMPOSITIONS))
def test_rgcn_state_dict_and_seeded_construction_are_pygs(name, decomposition):
    """The same parameter names and shapes as PyG's, and the same values
    drawn from the same generator state; repr as PyG's."""
    kwargs = DECOMPOSITIONS[decomposition]
    torch.manual_seed(3)
    ref = getattr(pyg, name)((WIDE, 6), OUT, R, **kwargs)
    torch.manual_seed(3)
    ours = getattr(ft, name)((WIDE, 6), OUT, R, **kwargs)
    a, b = ref.state_dict(), ours.state_dict()
    assert list(a) == list(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert repr(ours) == repr(ref)
    ours.reset_parameters()
    assert not torch.equal(ours.weight, ref.weight)


# ------------------------------------------------- grouping by relation, once
def test_relation_graphs_are_built_once_per_pair(monkeypatch, seed):
    ei, et = _typed_graph(seed)
    built = []
    original = nn_hetero.RelationGraphs.__init__

    def counting(self, *args):
        built.append(1)
        original(self, *args)
    monkeypatch.setattr(nn_hetero.RelationGraphs, "__init__", counting)
    layer = ft.RGCNConv(WIDE, OUT, R).double()
    x = _features(seed, N, WIDE)
    first = layer(x, ei, et)
    layer(x, ei, et).sum().backward()
    assert len(built) == 1
    groups = nn_hetero.relation_graphs(ei, et, R, (N, N))
    assert groups is nn_hetero.relation_graphs(ei, et, R, (N, N)) and len(built) == 1
    assert groups.edges_per_relation()[R - 1] == 0
    et.add_(0)                                  # an in-place write: a new version
    assert nn_hetero.relation_graphs(ei, et, R, (N, N)) is not groups
    other = et.clone()
    other[0] = (other[0] + 1) % (R - 1)
    assert not torch.allclose(layer(x, ei, other), first)
    assert len(built) == 3
    ft.clear_graph_cache()                      # forgets the groupings too
    assert len(nn_hetero._RELATIONS) == 0
    layer(x, ei, other)
    assert len(built) == 4


@pytest.mark.parametrize("name,x_form", [("RGCNConv", "float"), ("FastRGCNConv", "float"),
                                         ("FastRGCNConv", "none")])
def test_no_per_edge_feature_tensor(name, x_form, seed):
    """Neither layer makes an [E, F] tensor, forward or backward (PyG's
    FastRGCNConv makes [E, out] messages); only [2, E] index stacks."""
    ei, et = _typed_graph(seed)
    E = ei.shape[1]
    assert E not in (N, N * R)
    width = WIDE if x_form == "float" else N
    layer = getattr(ft, name)(width, OUT, R).double()
    x = _features(seed, N, WIDE).requires_grad_() if x_form == "float" else None
    with shapes_seen() as seen:
        layer(x, ei, et).sum().backward()
    assert not [s for s in seen.shapes if len(s) >= 2 and s[0] == E], f"seed {seed}"


# --------------------------------------------------------------- bad inputs
def _bad_inputs(seed):
    ei, et = _typed_graph(seed)
    x = _features(seed, N, WIDE)
    layer = ft.RGCNConv(WIDE, OUT, R).double()
    too_big = et.clone()
    too_big[3] = R
    negative = et.clone()
    negative[0] = -1
    sparse = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1]), (N, N))
    blocks = ft.RGCNConv(N + 1, OUT, R, num_blocks=2)
    return {
        "edge_type >= R": (lambda: layer(x, ei, too_big), ValueError, "edge_type"),
        "edge_type < 0": (lambda: layer(x, ei, negative), ValueError, "edge_type"),
        "edge_type short": (lambda: layer(x, ei, et[1:]), ValueError, "edge_type"),
        "edge_type 2-D": (lambda: layer(x, ei, et[None]), ValueError, "edge_type"),
        "edge_type float": (lambda: layer(x, ei, et.double()), TypeError, "edge_type"),
        "edge_type missing": (lambda: layer(x, ei), ValueError, "edge_type"),
        "edge_type list": (lambda: layer(x, ei, et.tolist()), TypeError, "edge_type"),
        "edge_index 3 rows": (lambda: layer(x, torch.cat([ei, ei[:1]]), et), ValueError,
                              "edge_index"),
        "edge_index float": (lambda: layer(x, ei.double(), et), TypeError, "edge_index"),
        "edge_index node out of range": (lambda: layer(x[:N - ISOLATED - 1], ei, et),
                                         ValueError, "edge_index"),
        "edge_index sparse": (lambda: layer(x, sparse, et), TypeError, "edge_index"),
        "x width": (lambda: layer(x[:, :3], ei, et), ValueError, "x"),
        "x 3-D": (lambda: layer(x[None], ei, et), ValueError, "x"),
        "x bool": (lambda: layer(x > 0, ei, et), TypeError, "x"),
        "x float32": (lambda: layer(x.float(), ei, et), TypeError, "x"),
        "x_dst None": (lambda: layer((x, None), ei, et), ValueError, "x_dst"),
        "x triple": (lambda: layer((x, x, x), ei, et), ValueError, "x"),
        "x indices 2-D": (lambda: layer(torch.arange(N)[:, None], ei, et), ValueError, "x"),
        "blocks of indices": (lambda: blocks(torch.arange(N), ei, et), ValueError, "block"),
        "bases and blocks": (lambda: ft.RGCNConv(4, 4, R, num_bases=2, num_blocks=2),
                             ValueError, "num_bases"),
        "blocks not dividing": (lambda: ft.RGCNConv(6, 4, R, num_blocks=4), ValueError,
                                "num_blocks"),
        "no relations": (lambda: ft.RGCNConv(4, 4, 0), ValueError, "num_relations"),
        "lazy in_channels": (lambda: ft.RGCNConv(-1, 4, R), ValueError, "in_channels"),
        "aggr unknown": (lambda: ft.RGCNConv(4, 4, R, aggr="median"), NotImplementedError,
                         "aggr"),
        "FastRGCNConv max": (lambda: ft.FastRGCNConv(4, 4, R, aggr="max"), ValueError, "aggr"),
        "unknown keyword": (lambda: ft.RGCNConv(4, 4, R, heads=2), TypeError, "heads"),
    }


BAD = list(_bad_inputs(0))


@pytest.mark.parametrize("case", BAD)
def test_bad_inputs_raise_naming_the_argument(case, seed):
    call, error, name = _bad_inputs(seed)[case]
    with pytest.raises(error, match=name):
        call()


# ------------------------------------------- HeteroConv and to_hetero
NODE_ROWS = {"paper": 19, "author": 13}
NODE_WIDTHS = {"paper": 6, "author": 4}
EDGE_TYPES = [("author", "writes", "paper"), ("paper", "written_by", "author"),
              ("paper", "cites", "paper"), ("paper", "extends", "paper")]


def _hetero_graph(seed):
    """x_dict and edge_index_dict of the seed (duplicates and self-loops in
    the paper -> paper relations, isolated rows on both sides)."""
    x_dict = {k: _features(seed + i, NODE_ROWS[k], NODE_WIDTHS[k])
              for i, k in enumerate(NODE_ROWS)}
    ei_dict = {}
    for i, (src, rel, dst) in enumerate(EDGE_TYPES):
        ns, nd = NODE_ROWS[src] - 2, NODE_ROWS[dst] - 2
        square = src == dst
        ei = awkward_edge_index(nd, 3 * nd, seed=seed + i, num_src=None if square else ns)
        ei_dict[(src, rel, dst)] = torch.from_numpy(ei)
    return x_dict, ei_dict


def _run_hetero(model, x_dict, ei_dict, seed):
    xs = {k: v.clone().requires_grad_() for k, v in x_dict.items()}
    out = model(xs, ei_dict)
    loss = sum((o * _cotangent(o.shape, seed + i)).sum()
               for i, (_, o) in enumerate(sorted(out.items())))
    loss.backward()
    res = {f"output {k}": o.detach() for k, o in out.items()}
    res.update({f"grad x {k}": t.grad for k, t in xs.items()})
    res.update({f"grad {name}": p.grad for name, p in model.named_parameters()})
    return res


def _compare_hetero(seed, ref, ours, x_dict, ei_dict):
    """Materialise lazy parameters with one call each, load PyG's parameters
    into ours and back (strict), then compare outputs and every gradient."""
    ref, ours = ref.double(), ours.double()
    with torch.no_grad():
        ref(x_dict, ei_dict)
        ours(x_dict, ei_dict)
    ours.load_state_dict(ref.state_dict(), strict=True)
    ref.load_state_dict(ours.state_dict(), strict=True)
    try:
        assert_results_match(_run_hetero(ours, x_dict, ei_dict, seed),
                             _run_hetero(ref, x_dict, ei_dict, seed))
    except AssertionError as error:
        raise AssertionError(f"seed {seed}: {error}") from None


def _hetero_convs(lib, kind):
    if kind == "sage":
        return {et: lib.SAGEConv((-1, -1), 5) for et in EDGE_TYPES}
    if kind == "gat":
        return {et: lib.GATConv((-1, -1), 3, heads=2, add_self_loops=False)
                for et in EDGE_TYPES}
    # GCNConv where PyG allows it: relations within one node type
    convs = {et: lib.SAGEConv((-1, -1), 5) for et in EDGE_TYPES if et[0] != et[2]}
    convs[EDGE_TYPES[2]] = lib.GCNConv(-1, 5)
    convs[EDGE_TYPES[3]] = lib.GCNConv(NODE_WIDTHS["paper"], 5, normalize=False)
    return convs


@pytest.mark.parametrize("aggr", ["sum", "mean", "cat"])
@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
def test_hetero_conv_matches_pyg(kind, aggr, seed):
    x_dict, ei_dict = _hetero_graph(seed)
    torch.manual_seed(seed)
    ref = pyg.HeteroConv(_hetero_convs(pyg, kind), aggr=aggr)
    torch.manual_seed(seed)
    ours = pyg.HeteroConv(_hetero_convs(ft, kind), aggr=aggr)
    _compare_hetero(seed, ref, ours, x_dict, ei_dict)


def test_hetero_conv_refuses_self_loops_on_bipartite_relations():
    with pytest.raises(ValueError, match="add_self_loops"):
        pyg.HeteroConv({EDGE_TYPES[0]: ft.GATConv((-1, -1), 3)})


class _TwoLayers(torch.nn.Module):
    """conv1 -> relu -> conv2, plus a node-level linear skip."""

    def __init__(self, conv1, conv2):
        super().__init__()
        self.conv1, self.conv2 = conv1, conv2
        self.skip = pyg.Linear(-1, 5)

    def forward(self, x, edge_index):
        h = self.conv1(x, edge_index).relu()
        return self.conv2(h, edge_index) + self.skip(x)


@pytest.mark.parametrize("aggr", ["sum", "mean", "max"])
def test_to_hetero_sage_matches_pyg(aggr, seed):
    x_dict, ei_dict = _hetero_graph(seed)
    metadata = (list(NODE_ROWS), EDGE_TYPES)
    models = {}
    for name, lib, convert in (("ref", pyg, pyg.to_hetero), ("ours", ft, ft.to_hetero)):
        torch.manual_seed(seed)
        models[name] = convert(_TwoLayers(lib.SAGEConv((-1, -1), 8),
                                          lib.SAGEConv((-1, -1), 5)), metadata, aggr=aggr)
    assert {k for k, _ in models["ours"].named_parameters()} >= {
        f"conv1.{'__'.join(et)}.lin_l.weight" for et in EDGE_TYPES}
    _compare_hetero(seed, models["ref"], models["ours"], x_dict, ei_dict)


def test_to_hetero_gcn_over_relations_of_one_node_type_matches_pyg(seed):
    x_dict, ei_dict = _hetero_graph(seed)
    x_dict = {"paper": x_dict["paper"]}
    ei_dict = {et: ei for et, ei in ei_dict.items() if et[0] == et[2] == "paper"}
    metadata = (["paper"], list(ei_dict))
    models = {}
    for name, lib, convert in (("ref", pyg, pyg.to_hetero), ("ours", ft, ft.to_hetero)):
        torch.manual_seed(seed)
        models[name] = convert(_TwoLayers(lib.GCNConv(-1, 8), lib.GCNConv(8, 5)), metadata)
    _compare_hetero(seed, models["ref"], models["ours"], x_dict, ei_dict)


def test_to_hetero_leaves_pygs_transformation_as_it_was():
    from torch_geometric.nn import fx
    before = fx.is_message_passing_op
    ft.to_hetero(_TwoLayers(ft.SAGEConv((-1, -1), 8), ft.SAGEConv((-1, -1), 5)),
                 (list(NODE_ROWS), EDGE_TYPES))
    assert fx.is_message_passing_op is before
    with pytest.raises(ValueError, match="add_self_loops"):     # PyG's own check still runs
        ft.to_hetero(_TwoLayers(ft.GCNConv(-1, 8), ft.GCNConv(8, 5)),
                     (list(NODE_ROWS), EDGE_TYPES))
    assert fx.is_message_passing_op is before


# ------------------------------------------------------------------- CUDA
@needs_gpu
@pytest.mark.parametrize("name,aggr,decomposition,x_form", [
    ("RGCNConv", "mean", "bases", "float"), ("RGCNConv", "max", "blocks", "float"),
    ("RGCNConv", "add", "full", "none"), ("FastRGCNConv", "mean", "full", "float")])
def test_rgcn_on_cuda_matches_pyg(name, aggr, decomposition, x_form, seed):
    """float32 on the GPU against PyG float64 on the CPU."""
    ei, et = _typed_graph(seed)
    width = WIDE if x_form == "float" else N
    ref, ours = _layers(name, width, OUT, R, aggr=aggr, **DECOMPOSITIONS[decomposition])
    ours.load_state_dict(ref.state_dict(), strict=True)
    ours = ours.to("cuda", torch.float32)
    ref.load_state_dict({k: v.float().double() for k, v in ours.state_dict().items()})
    x = _features(seed, N, WIDE).float().double() if x_form == "float" else None
    want = _run(ref, x, ei, et, seed=seed)
    got = _run(ours, None if x is None else x.float().cuda(), ei.cuda(), et.cuda(), seed=seed)
    got = {k: v.double().cpu() for k, v in got.items()}
    assert_results_match(got, want, "float32")


# ------------------------------------------------------------------ example
def test_example_trains():
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "rgcn_node_classification.py"),
                          "--nodes", "400", "--epochs", "4", "--every", "2", "--device", "cpu"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-2000:]
    losses = [float(line.split("loss")[1].split()[0]) for line in run.stdout.splitlines()
              if "loss" in line]
    assert len(losses) == 2 and all(np.isfinite(losses)), run.stdout
