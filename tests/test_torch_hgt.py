"""fastgnn.torch's HGTConv (nn_hgt.py) against PyG 2.8's.

Each comparison loads PyG's state_dict into ours and ours back into PyG's
(strict=True both ways), then compares every output and EVERY gradient
(each node type's features, each parameter) in float64 on the CPU under a
random cotangent. The typed graphs are drawn from the test's seed (`seed`
fixture; FASTGNN_TEST_SEED=random explores others): four node types, two
relations within one node type (self-loops, duplicate edges, a hub),
bipartite relations, a node type that only sends (no incoming edges, so no
output), an edge type without edges in each direction, and isolated rows
of every node type; the graph comes per edge type as an edge_index, a PyG
EdgeIndex or a torch sparse adj_t (CSR, CSC, or COO with its duplicates
stored). The seed is in every failure message.

PyG's own test file for HGTConv runs against our class when a PyG
checkout's test/nn/conv folder is found (FASTGNN_PYG_TESTS, or beside an
installed source tree); otherwise that case skips."""
import gc

import numpy as np
import pytest
import torch
import torch_geometric.nn as pyg
from torch_geometric import EdgeIndex

import fastgnn
import fastgnn.torch as ft
from fastgnn.testing import (assert_results_match, awkward_edge_index, fresh_pyg_class,
                             pyg_test_folder, run_pyg_test_file, shapes_seen)
from fastgnn.torch import nn_hgt
from test_torch_hetero import _run_hetero

pytestmark = pytest.mark.filterwarnings("ignore:.*[Ss]parse.*")

needs_gpu = pytest.mark.skipif(not (fastgnn.gpu_available() and torch.cuda.is_available()),
                               reason="needs a CUDA device visible to CuPy and torch")

OUT = 6
ROWS = {"paper": 19, "author": 13, "institution": 7, "topic": 5}
WIDTHS = {"paper": OUT, "author": 4, "institution": 5, "topic": OUT}   # OUT wide: the skip gate
EDGE_TYPES = [("author", "writes", "paper"), ("paper", "written_by", "author"),
              ("paper", "cites", "paper"), ("paper", "extends", "paper"),
              ("institution", "employs", "author"), ("topic", "about", "paper"),
              ("paper", "has_topic", "topic")]
EMPTY = {("topic", "about", "paper"), ("paper", "has_topic", "topic")}
METADATA = (list(ROWS), EDGE_TYPES)


def _features(seed, rows=ROWS, widths=WIDTHS):
    rng = np.random.default_rng(seed)
    return {t: torch.from_numpy(rng.standard_normal((rows[t], widths[t]))) for t in rows}


def _edge_indices(seed, edge_types=EDGE_TYPES, rows=ROWS):
    """{edge type: [2, E] int64} over all but the last two rows of each node type."""
    out = {}
    for i, (src, rel, dst) in enumerate(edge_types):
        if (src, rel, dst) in EMPTY:
            out[(src, rel, dst)] = torch.empty(2, 0, dtype=torch.long)
            continue
        ns, nd = rows[src] - 2, rows[dst] - 2
        ei = awkward_edge_index(nd, 3 * nd, seed=seed + i, num_src=None if src == dst else ns)
        out[(src, rel, dst)] = torch.from_numpy(ei)
    return out


def _graph_form(ei, num_src, num_dst, form):
    """One edge type's graph input in `form`."""
    if form == "edge_index":
        return ei
    if form == "EdgeIndex":
        return EdgeIndex(ei, sparse_size=(num_src, num_dst))
    values = torch.ones(ei.shape[1])
    coo = torch.sparse_coo_tensor(ei.flip(0), values, (num_dst, num_src))   # duplicates stored
    if form == "coo":
        return coo
    return coo.to_sparse_csr() if form == "csr" else coo.to_sparse_csc()


def _graph(seed, form="edge_index", rows=ROWS):
    return {et: _graph_form(ei, rows[et[0]], rows[et[2]], form)
            for et, ei in _edge_indices(seed, rows=rows).items()}


def _run(model, x_dict, ei_dict, seed):
    """({output of each node type, gradient of each feature tensor and
    parameter}, the output's node types in order)."""
    res = _run_hetero(model, x_dict, ei_dict, seed)
    return res, [k[len("output "):] for k in res if k.startswith("output ")]


def _compare(seed, ref, ours, x_dict, ei_dict, unused=(), ref_ei_dict=None):
    """Materialise lazy parameters with one call each, load PyG's parameters
    into ours and back (strict), then compare the outputs (the same node
    types, in the same order) and every gradient. unused: parameters ours
    leaves without gradient (kqv_lin of a node type that takes no part),
    where PyG's gradient must be zero. ref_ei_dict: PyG's graph input where
    it differs from ours (default ei_dict)."""
    ref, ours = ref.double(), ours.double()
    ref_ei_dict = ei_dict if ref_ei_dict is None else ref_ei_dict
    with torch.no_grad():
        ref(x_dict, ref_ei_dict)
        ours(x_dict, ei_dict)
        gen = torch.Generator().manual_seed(seed)
        for p in ref.parameters():      # skip and p_rel start at ones: move every value
            if not isinstance(p, torch.nn.parameter.UninitializedParameter):
                p.add_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    ours.load_state_dict(ref.state_dict(), strict=True)
    ref.load_state_dict(ours.state_dict(), strict=True)
    (got, got_types), (want, want_types) = (_run(ours, x_dict, ei_dict, seed),
                                            _run(ref, x_dict, ref_ei_dict, seed))
    try:
        assert got_types == want_types
        for name in unused:
            key = f"grad {name}"
            assert got.pop(key) is None and not want.pop(key).any(), name
        assert_results_match(got, want)
    except AssertionError as error:
        raise AssertionError(f"seed {seed}: {error}") from None


def _layers(*args, **kwargs):
    """PyG's HGTConv (a fresh class: `fresh_pyg_class`) and ours, each built
    from the same generator state."""
    made = []
    for cls in (fresh_pyg_class(pyg.HGTConv), ft.HGTConv):
        torch.manual_seed(0)
        made.append(cls(*args, **kwargs))
    return made


# ------------------------------------------------------------ against PyG
@pytest.mark.parametrize("heads,form", [(1, "edge_index"), (2, "edge_index"), (3, "edge_index"),
                                        (2, "EdgeIndex"), (2, "csr"), (3, "csc"), (1, "coo")])
def test_hgt_matches_pyg(heads, form, seed):
    """PyG gets graph inputs of its own (it flags an uncoalesced COO adj_t
    coalesced in place). PyG 2.8.1's HGTConv fails on EdgeIndex inputs (its
    concatenated EdgeIndex keeps the first edge type's sizes): ours is held
    to PyG's on the plain edge_index there."""
    ref, ours = _layers(WIDTHS, OUT, METADATA, heads=heads)
    x_dict, ei_dict = _features(seed), _graph(seed, form)
    ref_ei_dict = _graph(seed, "edge_index" if form == "EdgeIndex" else form)
    _compare(seed, ref, ours, x_dict, ei_dict, ref_ei_dict=ref_ei_dict)


@pytest.mark.parametrize("in_channels", ["int", "lazy", "lazy dict"])
def test_hgt_in_channels_forms_match_pyg(in_channels, seed):
    """One width for every node type (OUT: the skip gate everywhere), or
    lazy -1 (also per node type in a dict): the widths come from the first
    features."""
    widths = dict.fromkeys(ROWS, OUT) if in_channels == "int" else WIDTHS
    arg = {"int": OUT, "lazy": -1, "lazy dict": {**WIDTHS, "author": -1, "topic": -1}}
    ref, ours = _layers(arg[in_channels], OUT, METADATA, heads=2)
    _compare(seed, ref, ours, _features(seed, widths=widths), _graph(seed))


def test_lazy_weights_are_drawn_as_pygs(seed):
    """A lazy layer materialised by its first call holds PyG's values from
    the same generator state (and its state_dict loads into a lazy PyG
    layer, strict)."""
    x_dict, ei_dict = _features(seed), _graph(seed)
    made = []
    for cls in (pyg.HGTConv, ft.HGTConv):
        torch.manual_seed(seed)
        layer = cls(-1, OUT, METADATA, heads=2).double()
        layer(x_dict, ei_dict)
        made.append(layer)
    ref, ours = (m.state_dict() for m in made)
    assert list(ref) == list(ours)
    for key in ref:
        assert torch.equal(ref[key], ours[key]), key
    lazy = pyg.HGTConv(-1, OUT, METADATA, heads=2).double()
    lazy.load_state_dict(made[1].state_dict(), strict=True)
    assert torch.equal(lazy.kqv_lin.lins["author"].weight, made[1].kqv_lin.lins["author"].weight)


def test_missing_types_match_pyg(seed):
    """metadata names more than the inputs hold: an edge type absent from
    edge_index_dict, a node type absent from x_dict (a mini-batch without
    it), and a node type whose only incoming edge type is absent (its output
    is out_lin(gelu(0)), gated with its features)."""
    rows = {**ROWS, "venue": 4}
    edge_types = EDGE_TYPES + [("author", "knows", "author"), ("paper", "published_in", "venue"),
                               ("university", "hosts", "author")]
    metadata = (list(rows) + ["university"], edge_types)
    ref, ours = _layers(-1, OUT, metadata, heads=2)
    widths = {**WIDTHS, "venue": OUT}
    _compare(seed, ref, ours, _features(seed, rows, widths), _graph(seed, rows=rows),
             unused=["kqv_lin.lins.venue.weight", "kqv_lin.lins.venue.bias"])


class _TwoLayers(torch.nn.Module):
    """A per-node-type input Linear, two HGTConv layers, as PyG's HGT examples."""

    def __init__(self, conv, metadata):
        super().__init__()
        self.lin = pyg.HeteroDictLinear(-1, 8, types=metadata[0])
        self.conv1 = conv(8, 8, metadata, heads=2)
        self.conv2 = conv(8, OUT, metadata, heads=3)

    def forward(self, x_dict, edge_index_dict):
        h = {t: x.relu() for t, x in self.lin(x_dict).items()}
        return self.conv2(self.conv1(h, edge_index_dict), edge_index_dict)


def test_stacked_layers_match_pyg(seed):
    """Two layers: the second takes the first's output dict."""
    edge_types = [et for et in EDGE_TYPES if et[0] != "institution"]
    rows = {t: n for t, n in ROWS.items() if t != "institution"}
    metadata = (list(rows), edge_types)
    models = []
    for conv in (fresh_pyg_class(pyg.HGTConv), ft.HGTConv):
        torch.manual_seed(seed)
        models.append(_TwoLayers(conv, metadata))
    ei_dict = {et: ei for et, ei in _graph(seed).items() if et in edge_types}
    _compare(seed, models[0], models[1], _features(seed, rows), ei_dict)


def test_state_dict_and_seeded_construction_are_pygs():
    """The same parameter names, order and shapes as PyG's, the same values
    drawn from the same generator state; repr as PyG's."""
    ref, ours = _layers(WIDTHS, OUT, METADATA, heads=3)
    a, b = ref.state_dict(), ours.state_dict()
    assert list(a) == list(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert repr(ours) == repr(ref) == f"HGTConv(-1, {OUT}, heads=3)"
    before = ours.k_rel.weight.detach().clone()
    with torch.no_grad():
        ours.skip["paper"].zero_()
    ours.reset_parameters()
    assert not torch.equal(ours.k_rel.weight, before) and float(ours.skip["paper"].detach()) == 1.0


def test_type_names_pyg_stores_differently_load_both_ways(seed):
    """A node type that is a ParameterDict attribute and a relation name
    with a '.' keep PyG's state_dict names (skip.<copy>, p_rel.copy__re#l__v2)."""
    rows = {"copy": 6, "v2": 5}
    edge_types = [("copy", "to", "v2"), ("v2", "re.l", "copy")]
    ref, ours = _layers(4, OUT, (list(rows), edge_types), heads=2)
    assert list(ref.state_dict()) == list(ours.state_dict())
    assert {"skip.<copy>", "p_rel.v2__re#l__copy"} <= set(ours.state_dict())
    x_dict = _features(seed, rows, dict.fromkeys(rows, 4))
    ei_dict = {et: torch.stack([torch.arange(4) % rows[et[0]], torch.arange(4) % rows[et[2]]])
               for et in edge_types}
    _compare(seed, ref, ours, x_dict, ei_dict)


# ------------------------------------------------------- graphs, once each
def test_destination_graphs_are_built_once(monkeypatch, seed):
    """One Graph per destination type with edge types, built on first use;
    a forward and backward later builds nothing; an in-place edit of one
    edge_index rebuilds its destination's only; a graph input of the same
    key as a freed one is not answered from the cache."""
    built = []
    original = nn_hgt._build_destination_graph

    def counting(blocks, num_dst, device):
        built.append(num_dst)
        return original(blocks, num_dst, device)
    monkeypatch.setattr(nn_hgt, "_build_destination_graph", counting)
    ft.clear_graph_cache()
    layer = ft.HGTConv(WIDTHS, OUT, METADATA, heads=2).double()
    x_dict, ei_dict = _features(seed), _graph(seed)
    layer(x_dict, ei_dict)
    assert sorted(built) == sorted(ROWS[t] for t in ("paper", "author", "topic"))
    layer(x_dict, ei_dict)["paper"].sum().backward()
    assert len(built) == 3
    ei_dict[("paper", "cites", "paper")].add_(0)        # an in-place write: a new version
    layer(x_dict, ei_dict)
    assert built[3:] == [ROWS["paper"]]
    # a freed input's key met again (as when its address is reused): rebuilt
    monkeypatch.setattr(nn_hgt, "_tkey", lambda t: ("same", tuple(t.shape)))
    layer(x_dict, ei_dict)
    assert len(built) == 7                              # new keys: all three again
    et = ("paper", "extends", "paper")
    ei_dict[et] = ei_dict[et].clone()
    gc.collect()
    layer(x_dict, ei_dict)
    assert built[7:] == [ROWS["paper"]]


def test_no_per_edge_feature_tensor(seed):
    """No tensor of [E_t, ...] for the edges E_t into any node type, forward
    or backward (PyG's messages are [E, heads, D]); only index vectors."""
    x_dict, ei_dict = _features(seed), _graph(seed)
    into = {}
    for et, ei in ei_dict.items():
        into[et[2]] = into.get(et[2], 0) + ei.shape[1]
    counts = {n for n in into.values() if n}
    assert not counts & (set(ROWS.values()) | {2, OUT}), counts
    layer = ft.HGTConv(WIDTHS, OUT, METADATA, heads=2).double()
    xs = {t: x.clone().requires_grad_() for t, x in x_dict.items()}
    with shapes_seen() as seen:
        out = layer(xs, ei_dict)
        sum(o.sum() for o in out.values()).backward()
    assert not [s for s in seen.shapes if len(s) >= 2 and s[0] in counts], f"seed {seed}"


def test_inputs_are_not_mutated(seed):
    x_dict, ei_dict = _features(seed), _graph(seed, "coo")
    x_before = {t: x.clone() for t, x in x_dict.items()}
    coalesced = {et: adj.is_coalesced() for et, adj in ei_dict.items()}
    ft.HGTConv(WIDTHS, OUT, METADATA, heads=2).double()(x_dict, ei_dict)
    for t, x in x_dict.items():
        assert torch.equal(x, x_before[t]) and x.shape == (ROWS[t], WIDTHS[t])
    assert {et: adj.is_coalesced() for et, adj in ei_dict.items()} == coalesced


# --------------------------------------------------------------- bad inputs
def _bad_inputs(seed):
    x_dict, ei_dict = _features(seed), _graph(seed)
    layer = ft.HGTConv(WIDTHS, OUT, METADATA, heads=2).double()
    et = ("author", "writes", "paper")
    ei = ei_dict[et]

    def call(x=None, edges=None, **replace):
        if x is None:
            x = dict(x_dict)
        if edges is None:
            edges = {**ei_dict, **{e: v for e, v in replace.items()}}
        return lambda: layer(x, edges)

    def with_edges(value):
        return call(edges={**ei_dict, et: value})

    out_of_range = ei.clone()
    out_of_range[0, 0] = ROWS["author"]
    negative = ei.clone()
    negative[1, 0] = -1
    wide_adj = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1]),
                                       (ROWS["paper"], ROWS["author"] + 1))
    return {
        "x_dict list": (call(x=list(x_dict.values())), TypeError, "x_dict"),
        "x ints": (call(x={**x_dict, "paper": torch.zeros(ROWS["paper"], OUT, dtype=torch.long)}),
                   TypeError, r"x_dict\['paper'\]"),
        "x 1-D": (call(x={**x_dict, "paper": x_dict["paper"][:, 0]}), TypeError, "x_dict"),
        "x width": (call(x={**x_dict, "author": x_dict["paper"][:ROWS["author"]]}), ValueError,
                    r"x_dict\['author'\]"),
        "x float32": (call(x={**x_dict, "topic": x_dict["topic"].float()}), TypeError,
                      r"x_dict\['topic'\]"),
        "x_dict missing a source": (call(x={t: x for t, x in x_dict.items()
                                            if t != "institution"}), ValueError, "institution"),
        "edge_index_dict list": (call(edges=list(ei_dict.values())), TypeError,
                                 "edge_index_dict"),
        "unknown edge type": (call(edges={**ei_dict, ("paper", "likes", "author"): ei.flip(0)}),
                              ValueError, "likes"),
        "edge_index out of range": (with_edges(out_of_range), ValueError, "writes"),
        "edge_index negative": (with_edges(negative), ValueError, "writes"),
        "edge_index float": (with_edges(ei.double()), TypeError, "writes"),
        "edge_index 3 rows": (with_edges(torch.cat([ei, ei[:1]])), ValueError, "writes"),
        "edge_index list": (with_edges(ei.tolist()), TypeError, "writes"),
        "EdgeIndex sizes": (with_edges(EdgeIndex(ei, sparse_size=(ROWS["author"] + 1,
                                                                  ROWS["paper"]))),
                            ValueError, "writes"),
        "adj_t shape": (with_edges(wide_adj), ValueError, "writes"),
        "edge_index on another device": (with_edges(ei.to("meta")), ValueError, "meta"),
        "heads not dividing": (lambda: ft.HGTConv(4, 6, METADATA, heads=4), ValueError, "heads"),
        "no heads": (lambda: ft.HGTConv(4, 6, METADATA, heads=0), ValueError, "heads"),
        "in_channels 0": (lambda: ft.HGTConv(0, 6, METADATA), ValueError, "in_channels"),
        "in_channels str": (lambda: ft.HGTConv({"paper": "4"}, 6, METADATA), ValueError,
                            "in_channels"),
        "metadata one list": (lambda: ft.HGTConv(4, 6, list(ROWS)), ValueError, "metadata"),
        "metadata unknown node type": (lambda: ft.HGTConv(4, 6, (["paper"], EDGE_TYPES)),
                                       ValueError, "metadata"),
        "metadata pair edge type": (lambda: ft.HGTConv(4, 6, (["paper"], [("paper", "paper")])),
                                    ValueError, "metadata"),
        "flow": (lambda: ft.HGTConv(4, 6, METADATA, flow="target_to_source"),
                 NotImplementedError, "flow"),
        "flow set later": (_flow_set_later(layer, x_dict, ei_dict), NotImplementedError, "flow"),
        "aggr": (lambda: ft.HGTConv(4, 6, METADATA, aggr="mean"), TypeError, "aggr"),
    }


def _flow_set_later(layer, x_dict, ei_dict):
    def call():
        layer.flow = "target_to_source"
        try:
            layer(x_dict, ei_dict)
        finally:
            layer.flow = "source_to_target"
    return call


BAD = list(_bad_inputs(0))


@pytest.mark.parametrize("case", BAD)
def test_bad_inputs_raise_naming_the_argument(case, seed):
    make, error, name = _bad_inputs(seed)[case]
    with pytest.raises(error, match=name):
        make()


# ------------------------------------------------------ PyG's own test file
def test_pyg_own_hgt_tests_pass_with_fastgnn_layer():
    folder = pyg_test_folder()
    if folder is None:
        pytest.skip("PyG's test files are not here (set FASTGNN_PYG_TESTS to a PyG "
                    "checkout's test/nn/conv)")
    if not run_pyg_test_file(folder / "test_hgt_conv.py", {"HGTConv": ft.HGTConv}):
        pytest.skip("no test function of test_hgt_conv.py could run here")


# ------------------------------------------------------------------- CUDA
@needs_gpu
@pytest.mark.parametrize("form", ["edge_index", "csr"])
def test_hgt_on_cuda_matches_pyg(form, seed):
    """float32 on the GPU against PyG float64 on the CPU."""
    ref, ours = _layers(WIDTHS, OUT, METADATA, heads=2)
    ref = ref.double()
    ours.load_state_dict(ref.state_dict(), strict=True)
    ours = ours.to("cuda", torch.float32)
    ref.load_state_dict({k: v.float().double() for k, v in ours.state_dict().items()})
    x_dict = {t: x.float().double() for t, x in _features(seed).items()}
    want, _ = _run(ref, x_dict, _graph(seed, form), seed)
    cuda_graph = {et: adj.cuda() for et, adj in _graph(seed, form).items()}
    got, _ = _run(ours, {t: x.float().cuda() for t, x in x_dict.items()}, cuda_graph, seed)
    got = {k: None if v is None else v.double().cpu() for k, v in got.items()}
    assert_results_match(got, want, "float32")
