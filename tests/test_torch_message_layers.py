"""The per-edge message layers of fastgnn.torch (nn_messages.py: GINEConv,
ResGatedGraphConv, GENConv, PNAConv, DegreeScalerAggregation) against PyG 2.8's.

Each case builds PyG's layer and ours from the same generator state, loads
PyG's state_dict into ours (strict=True), and compares the output and EVERY
gradient under a random cotangent: x (x_src and x_dst of a pair), edge_attr
and each parameter, in float64 on the CPU. Graphs are drawn from the test's
seed (`seed` fixture; FASTGNN_TEST_SEED=random explores others) and hold
duplicate edges, self-loops, targets without in-edges, a hub, isolated nodes
and odd feature widths; the seed is in every failure message. The graph
comes as an edge_index, a PyG EdgeIndex or a torch sparse adj_t (CSR or CSC;
edge_attr then in its stored entries' order).

PyG's own test files for these layers run against our classes when a PyG
checkout's test/nn/conv folder is found (FASTGNN_PYG_TESTS, or beside an
installed source tree); otherwise those cases skip."""
import warnings

import numpy as np
import pytest
import torch
import torch_geometric.nn as pyg
from torch_geometric import EdgeIndex

import fastgnn
import fastgnn.torch as ft
from fastgnn.testing import (awkward_edge_index, fresh_pyg_class, pyg_test_folder,
                             run_pyg_test_file)
from test_torch_layers import run_and_compare
from test_torch_propagation_layers import assert_state_dicts_load_both_ways

warnings.filterwarnings("ignore", message=".*[Ss]parse.*")

needs_gpu = pytest.mark.skipif(not (fastgnn.gpu_available() and torch.cuda.is_available()),
                               reason="needs a CUDA device visible to CuPy and torch")

N, N_SRC = 37, 23          # nodes (targets), sources of the bipartite graphs
ISOLATED = 3               # the last nodes of x are in no edge
F_IN, F_DST, D = 7, 5, 3   # odd widths: node features, target features, edge features
DEG = torch.tensor([2, 9, 7, 4, 1, 0, 3])        # a training degree histogram for PNA
AGGREGATORS = ["sum", "mean", "min", "max", "var", "std"]
SCALERS = ["identity", "amplification", "attenuation", "linear", "inverse_linear"]


# ------------------------------------------------------------------ helpers
def _graph(seed, bipartite=False):
    """edge_index [2, E] of the seed over all but the last ISOLATED nodes."""
    ei = awkward_edge_index(N - ISOLATED, 4 * (N - ISOLATED), seed=seed,
                            num_src=N_SRC - ISOLATED if bipartite else None)
    return torch.from_numpy(ei)


def _randn(seed, *shape):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape))


def _graph_input(form, ei, num_src, num_dst):
    """(graph input, the number of edges edge_attr then has): an edge_index,
    a PyG EdgeIndex, or a torch sparse adj_t [num_dst, num_src] in CSR or
    CSC layout (duplicates merged: its stored entries are the edges)."""
    if form == "edge_index":
        return ei, ei.shape[1]
    if form == "EdgeIndex":
        return EdgeIndex(ei, sparse_size=(num_src, num_dst)), ei.shape[1]
    coo = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1], dtype=torch.float64),
                                  (num_dst, num_src)).coalesce()
    adj = coo.to_sparse_csr() if form == "adj_t" else coo.to_sparse_csc()
    return adj, coo.indices().shape[1]


def _pair_of_layers(name, *args, **kwargs):
    """PyG's layer (a fresh class: `fresh_pyg_class`) and ours, each built from
    the same generator state; a callable argument named "nn" is called per
    build (GINEConv's module)."""
    made = []
    for lib in (pyg, ft):
        torch.manual_seed(0)
        kw = {k: (v() if k == "nn" else v) for k, v in kwargs.items()}
        cls = getattr(lib, name)
        made.append((fresh_pyg_class(cls) if lib is pyg else cls)(*args, **kw))
    return made


def _forward_backward(layer, x, adj, edge_attr, extra, seed):
    """{name: tensor} of the output and every gradient under a random cotangent."""
    def leaf(t):
        return None if t is None else t.detach().clone().requires_grad_()
    xs = tuple(leaf(t) for t in x) if isinstance(x, tuple) else leaf(x)
    ea = leaf(edge_attr)
    args = (xs, adj) if ea is None else (xs, adj, ea)
    out = layer(*args, **extra)
    cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed),
                      dtype=out.dtype)
    (out * cot).sum().backward()
    result = {"output": out.detach()}
    for what, t in zip(("x_src", "x_dst"), xs if isinstance(xs, tuple) else (xs,)):
        if t is not None:
            result[f"grad {what}"] = t.grad
    if ea is not None:
        result["grad edge_attr"] = ea.grad
    for key, p in layer.named_parameters():
        if p.requires_grad:
            result[f"grad {key}"] = p.grad
    return result


def _compare(seed, ref, ours, x, adj, edge_attr=None, extra=None, rtol=1e-9, atol=1e-11):
    """Load ref's state into ours (float64, strict) and compare both runs."""
    ref = ref.double()
    ours = ours.double()
    ours.load_state_dict(ref.state_dict(), strict=True)
    want = _forward_backward(ref, x, adj, edge_attr, extra or {}, seed)
    got = _forward_backward(ours, x, adj, edge_attr, extra or {}, seed)
    assert sorted(got) == sorted(want), f"seed {seed}: {sorted(got)} != {sorted(want)}"
    for key, value in want.items():
        assert got[key] is not None or value is None, f"seed {seed}: no {key}"
        if value is None:
            continue
        torch.testing.assert_close(got[key], value, rtol=rtol, atol=atol,
                                   msg=lambda m, key=key: f"seed {seed}, {key}: {m}")
    for key, value in ref.state_dict().items():        # running statistics move alike
        torch.testing.assert_close(ours.state_dict()[key], value, rtol=rtol, atol=atol,
                                   msg=lambda m, key=key: f"seed {seed}, state {key}: {m}")


def _mlp(f_in=F_IN, f_out=4):
    return lambda: torch.nn.Sequential(torch.nn.Linear(f_in, 6), torch.nn.ReLU(),
                                       torch.nn.Linear(6, f_out))


FORMS = ["edge_index", "EdgeIndex", "adj_t", "adj_t_csc"]


# ------------------------------------------------------------------ GINEConv
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("edge_dim,train_eps", [(D, True), (None, False)])
def test_gine_conv_matches_pyg(edge_dim, train_eps, form, seed):
    ei = _graph(seed)
    adj, e = _graph_input(form, ei, N, N)
    ref, ours = _pair_of_layers("GINEConv", nn=_mlp(), eps=0.3, train_eps=train_eps,
                                edge_dim=edge_dim)
    _compare(seed, ref, ours, _randn(seed, N, F_IN), adj, _randn(seed + 1, e, edge_dim or F_IN))


@pytest.mark.parametrize("x_dst", ["tensor", "none"])
@pytest.mark.parametrize("form", ["edge_index", "adj_t"])
def test_gine_conv_bipartite_matches_pyg(form, x_dst, seed):
    ei = _graph(seed, bipartite=True)
    adj, e = _graph_input(form, ei, N_SRC, N)
    ref, ours = _pair_of_layers("GINEConv", nn=_mlp(), train_eps=True, edge_dim=D)
    x = (_randn(seed, N_SRC, F_IN), _randn(seed + 2, N, F_IN) if x_dst == "tensor" else None)
    extra = {"size": (N_SRC, N)} if form == "edge_index" else {}
    _compare(seed, ref, ours, x, adj, _randn(seed + 1, e, D), extra)


@pytest.mark.parametrize("aggr", ["mean", "max", "std", "softmax"])
def test_gine_conv_other_aggregations_match_pyg(aggr, seed):
    ei = _graph(seed)
    ref, ours = _pair_of_layers("GINEConv", nn=_mlp(), edge_dim=D, aggr=aggr)
    _compare(seed, ref, ours, _randn(seed, N, F_IN), ei, _randn(seed + 1, ei.shape[1], D))


def test_gine_conv_static_graph_matches_pyg(seed):
    """x [B, N, F]: the same graph for every batch element (edge features shared)."""
    ei = _graph(seed)
    ref, ours = _pair_of_layers("GINEConv", nn=_mlp(), train_eps=True, edge_dim=D)
    _compare(seed, ref, ours, _randn(seed, 2, N, F_IN), ei, _randn(seed + 1, ei.shape[1], D))


# --------------------------------------------------------- ResGatedGraphConv
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("edge_dim,root_weight,bias", [(None, True, True), (D, True, False),
                                                       (D, False, True)])
def test_res_gated_graph_conv_matches_pyg(edge_dim, root_weight, bias, form, seed):
    ei = _graph(seed)
    adj, e = _graph_input(form, ei, N, N)
    ref, ours = _pair_of_layers("ResGatedGraphConv", F_IN, 9, edge_dim=edge_dim,
                                root_weight=root_weight, bias=bias)
    edge_attr = _randn(seed + 1, e, D) if edge_dim else None
    _compare(seed, ref, ours, _randn(seed, N, F_IN), adj, edge_attr)


@pytest.mark.parametrize("edge_dim", [None, D])
@pytest.mark.parametrize("form", ["edge_index", "adj_t"])
def test_res_gated_graph_conv_bipartite_matches_pyg(form, edge_dim, seed):
    ei = _graph(seed, bipartite=True)
    adj, e = _graph_input(form, ei, N_SRC, N)
    ref, ours = _pair_of_layers("ResGatedGraphConv", (F_IN, F_DST), 4, edge_dim=edge_dim)
    edge_attr = _randn(seed + 1, e, D) if edge_dim else None
    _compare(seed, ref, ours, (_randn(seed, N_SRC, F_IN), _randn(seed + 2, N, F_DST)), adj,
             edge_attr)


@pytest.mark.parametrize("act,aggr,edge_dim", [
    (torch.nn.Tanh(), "add", None), (torch.sigmoid, "mean", D), (torch.nn.Sigmoid(), "max", None),
    (torch.nn.ReLU(), "add", D)], ids=["tanh", "sigmoid-mean", "sigmoid-max", "relu-edges"])
def test_res_gated_graph_conv_other_gates_match_pyg(act, aggr, edge_dim, seed):
    ei = _graph(seed)
    ref, ours = _pair_of_layers("ResGatedGraphConv", F_IN, 6, act=act, aggr=aggr,
                                edge_dim=edge_dim)
    edge_attr = _randn(seed + 1, ei.shape[1], D) if edge_dim else None
    _compare(seed, ref, ours, _randn(seed, N, F_IN), ei, edge_attr)


def test_res_gated_graph_conv_static_graph_matches_pyg(seed):
    ei = _graph(seed)
    ref, ours = _pair_of_layers("ResGatedGraphConv", F_IN, 6)
    _compare(seed, ref, ours, _randn(seed, 2, N, F_IN), ei)


def test_res_gated_graph_conv_hooked_linears_match_pyg(seed):
    """A forward hook on lin_key: the per-edge concatenations run through the
    modules as PyG runs them (and the hook sees what PyG's sees)."""
    ei = _graph(seed)
    ref, ours = _pair_of_layers("ResGatedGraphConv", F_IN, 6, edge_dim=D)
    seen = []
    for layer in (ref, ours):
        layer.lin_key.register_forward_hook(lambda m, i, o: seen.append(i[0].shape))
    _compare(seed, ref, ours, _randn(seed, N, F_IN), ei, _randn(seed + 1, ei.shape[1], D))
    assert seen[0] == seen[1] == (ei.shape[1], F_IN + D), f"seed {seed}: {seen}"


# ------------------------------------------------------------------- GENConv
GEN_CASES = [
    dict(aggr="softmax", learn_t=True, t=0.7),
    dict(aggr="softmax_sg", t=1.3),
    dict(aggr="powermean", learn_p=True, p=1.5),
    dict(aggr="add", msg_norm=True, learn_msg_scale=True, norm="layer"),
    dict(aggr="mean", norm="instance", bias=True),
    dict(aggr="max", norm=None, num_layers=3, expansion=3),
    dict(aggr=["softmax", "mean"], bias=True, msg_norm=True),
]


@pytest.mark.parametrize("edges", ["none", "same_width", "edge_dim"])
@pytest.mark.parametrize("options", GEN_CASES, ids=lambda o: str(o["aggr"]))
def test_gen_conv_matches_pyg(options, edges, seed):
    ei = _graph(seed)
    out = 8
    edge_dim = D if edges == "edge_dim" else None
    ref, ours = _pair_of_layers("GENConv", F_IN, out, edge_dim=edge_dim, **options)
    edge_attr = {"none": None, "same_width": _randn(seed + 1, ei.shape[1], out),
                 "edge_dim": _randn(seed + 1, ei.shape[1], D)}[edges]
    _compare(seed, ref, ours, _randn(seed, N, F_IN), ei, edge_attr)


@pytest.mark.parametrize("form", ["EdgeIndex", "adj_t", "adj_t_csc"])
def test_gen_conv_graph_inputs_match_pyg(form, seed):
    ei = _graph(seed)
    adj, e = _graph_input(form, ei, N, N)
    ref, ours = _pair_of_layers("GENConv", F_IN, 6, learn_t=True, edge_dim=D, bias=True)
    _compare(seed, ref, ours, _randn(seed, N, F_IN), adj, _randn(seed + 1, e, D))


@pytest.mark.parametrize("x_dst", ["tensor", "none"])
@pytest.mark.parametrize("with_edges", [False, True])
def test_gen_conv_bipartite_matches_pyg(with_edges, x_dst, seed):
    ei = _graph(seed, bipartite=True)
    ref, ours = _pair_of_layers("GENConv", (F_IN, F_DST), 6, aggr="powermean", learn_p=True,
                                edge_dim=D if with_edges else None, bias=True)
    x = (_randn(seed, N_SRC, F_IN), _randn(seed + 2, N, F_DST) if x_dst == "tensor" else None)
    edge_attr = _randn(seed + 1, ei.shape[1], D) if with_edges else None
    _compare(seed, ref, ours, x, ei, edge_attr, {"size": (N_SRC, N)})


# ------------------------------------------------------------------- PNAConv
PNA_CASES = [
    dict(),
    dict(edge_dim=D),
    dict(towers=2, out=6),
    dict(towers=2, divide_input=True, in_=8, edge_dim=D, out=6),
    dict(pre_layers=2, post_layers=3, edge_dim=D),
    dict(pre_layers=3, act="leaky_relu", act_kwargs={"negative_slope": 0.3}),
    dict(aggregators=["mean", "mul", "max"], scalers=["identity", "linear"], edge_dim=D),
    dict(aggregators=["std", "sum"], scalers=["attenuation"], train_norm=True, towers=3, out=9),
]


@pytest.mark.parametrize("options", PNA_CASES, ids=lambda o: "-".join(map(str, o)) or "default")
def test_pna_conv_matches_pyg(options, seed):
    options = dict(options)
    f_in, out = options.pop("in_", F_IN), options.pop("out", 4)
    aggregators = options.pop("aggregators", AGGREGATORS)
    scalers = options.pop("scalers", SCALERS)
    ei = _graph(seed)
    ref, ours = _pair_of_layers("PNAConv", f_in, out, aggregators, scalers, DEG, **options)
    edge_attr = _randn(seed + 1, ei.shape[1], D) if options.get("edge_dim") else None
    _compare(seed, ref, ours, _randn(seed, N, f_in), ei, edge_attr)


@pytest.mark.parametrize("form", ["EdgeIndex", "adj_t", "adj_t_csc"])
def test_pna_conv_graph_inputs_match_pyg(form, seed):
    ei = _graph(seed)
    adj, e = _graph_input(form, ei, N, N)
    ref, ours = _pair_of_layers("PNAConv", F_IN, 4, AGGREGATORS, SCALERS, DEG, edge_dim=D)
    _compare(seed, ref, ours, _randn(seed, N, F_IN), adj, _randn(seed + 1, e, D))


def test_pna_degree_histogram_matches_pyg(seed):
    graphs = []
    for k in range(3):
        ei = _graph(seed + k)
        graphs.append(type("Data", (), {"edge_index": ei, "num_nodes": N})())
    want = pyg.PNAConv.get_degree_histogram(graphs)
    assert torch.equal(ft.PNAConv.get_degree_histogram(graphs), want), f"seed {seed}"


@pytest.mark.parametrize("aggr,scaler", [("mean", "amplification"), (["max", "std"], SCALERS),
                                         ("softmax", ["linear", "identity"])],
                         ids=["mean", "max-std", "softmax"])
@pytest.mark.parametrize("call", ["index", "ptr", "neighbour"])
def test_degree_scaler_aggregation_matches_pyg(aggr, scaler, call, seed):
    """Standalone, in PyG's call form (by index or by ptr) and on a graph."""
    ei = _graph(seed)
    torch.manual_seed(0)
    ref = pyg.aggr.DegreeScalerAggregation(aggr, scaler, DEG, train_norm=True)
    if isinstance(aggr, str) and not isinstance(scaler, str):
        ref.scaler = scaler                    # PyG wraps the list of a str aggr in a list
    ours = ft.DegreeScalerAggregation(aggr, scaler, DEG, train_norm=True)
    assert isinstance(ours, pyg.aggr.Aggregation)
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = _randn(seed, N, F_IN).requires_grad_()
    order = torch.argsort(ei[1], stable=True)
    index = ei[1][order]

    def messages():                            # per edge, grouped by target
        return x[ei[0][order]]
    want = ref(messages(), index, dim_size=N)
    if call == "index":
        got = ours(messages(), index, dim_size=N)
    elif call == "ptr":
        ptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.bincount(index, minlength=N)
                         .cumsum(0)])
        got = ours(messages(), ptr=ptr)
    else:
        got = ours.neighbour(ei, x)
    cot = torch.randn(want.shape, generator=torch.Generator().manual_seed(seed),
                      dtype=want.dtype)
    g_want = torch.autograd.grad((want * cot).sum(), [x, *ref.parameters()], allow_unused=True)
    g_got = torch.autograd.grad((got * cot).sum(), [x, *ours.parameters()], allow_unused=True)
    torch.testing.assert_close(got, want, msg=lambda m: f"seed {seed}: {m}")
    for a, b in zip(g_got, g_want):
        assert (a is None) == (b is None), f"seed {seed}"
        if a is not None:
            torch.testing.assert_close(a, b, msg=lambda m: f"seed {seed}, gradient: {m}")


# --------------------------------------------------------- all of the layers
def _make(lib, name, in_channels=F_IN):
    """One layer of each kind from `lib` (PyG's nn or fastgnn.torch)."""
    cls = getattr(lib, name)
    if lib is pyg:
        cls = fresh_pyg_class(cls)
    return {"GINEConv": lambda: cls(_mlp(in_channels)(), train_eps=True, edge_dim=D),
            "ResGatedGraphConv": lambda: cls(in_channels, 6, edge_dim=D),
            "GENConv": lambda: cls(in_channels, 6, learn_t=True, msg_norm=True, edge_dim=D,
                                   bias=True),
            "PNAConv": lambda: cls(in_channels, 4, AGGREGATORS, SCALERS, DEG, edge_dim=D,
                                   towers=2, pre_layers=2, train_norm=True)}[name]()


LAYERS = ["GINEConv", "ResGatedGraphConv", "GENConv", "PNAConv"]


@pytest.mark.parametrize("name", LAYERS)
def test_state_dicts_load_both_ways(name):
    ref, ours = assert_state_dicts_load_both_ways(_make, name)
    ours.reset_parameters()
    ref.reset_parameters()
    for key, value in ref.state_dict().items():     # deterministic resets (eps, norms, ...)
        if not key.endswith("weight") and not key.endswith("bias"):
            assert torch.equal(ours.state_dict()[key], value), key


@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
@pytest.mark.parametrize("name", LAYERS)
def test_flow_matches_pyg(name, flow, seed):
    """flow (a keyword, or set after construction, read per call as PyG's)."""
    ei = _graph(seed)
    # PyG's GENConv reads x_j from the unprojected features under
    # target_to_source, which fails with lin_src: in == out there
    f = 6 if name == "GENConv" else F_IN
    torch.manual_seed(0)
    ref = _make(pyg, name, f)
    torch.manual_seed(0)
    ours = _make(ft, name, f)
    ref.flow = ours.flow = flow
    _compare(seed, ref, ours, _randn(seed, N, f), ei, _randn(seed + 1, ei.shape[1], D))


def _assert_same_draws(ref, ours, seed):
    """Lazy layers after their first call: the same parameters (drawn there),
    the generator left where PyG's is (`next_draw`), buffers alike up to the
    forward's rounding (running statistics)."""
    assert torch.equal(ours.next_draw, ref.next_draw), f"seed {seed}"
    for key, value in ref.named_parameters():
        assert torch.equal(ours.get_parameter(key), value), key
    for key, value in ref.named_buffers():
        torch.testing.assert_close(ours.get_buffer(key), value, msg=f"seed {seed}, {key}")


@pytest.mark.parametrize("name", ["GINEConv", "ResGatedGraphConv", "GENConv"])
def test_lazy_in_channels_draw_at_the_first_call_as_pyg(name, seed):
    """in_channels=-1 (GINEConv: a lazy first Linear in nn): the widths come
    from the first call, where the weights are drawn as PyG draws them."""
    ei = _graph(seed)
    x = _randn(seed, N, F_IN).float()
    layers = []
    for lib in (pyg, ft):
        torch.manual_seed(5)
        if name == "GINEConv":
            cls = fresh_pyg_class(pyg.GINEConv) if lib is pyg else ft.GINEConv
            layer = cls(torch.nn.Sequential(torch.nn.LazyLinear(6), torch.nn.ReLU()))
            layer(x, ei, _randn(seed + 1, ei.shape[1], F_IN).float())
        else:
            cls = fresh_pyg_class(getattr(pyg, name)) if lib is pyg else getattr(ft, name)
            layer = cls(-1, 6)
            layer(x, ei)
        layer.next_draw = torch.rand(4)
        layers.append(layer)
    _assert_same_draws(*layers, seed)


@pytest.mark.parametrize("name", LAYERS)
def test_float32_matches_pyg(name, seed):
    ei = _graph(seed)
    torch.manual_seed(0)
    ref = _make(pyg, name)
    torch.manual_seed(0)
    ours = _make(ft, name)
    ours.load_state_dict(ref.state_dict())
    x = _randn(seed, N, F_IN).float()
    edge_attr = _randn(seed + 1, ei.shape[1], D).float()
    torch.testing.assert_close(ours(x, ei, edge_attr), ref(x, ei, edge_attr), rtol=1e-4,
                               atol=1e-5, msg=lambda m: f"seed {seed}: {m}")


def test_the_message_rows_keep_no_per_edge_values_for_the_backward(seed):
    """What autograd keeps per edge: GINEConv a bit mask, ResGatedGraphConv
    nothing (it recomputes the gate); PyG keeps [E, F] floats for both."""
    ei = _graph(seed)
    e = ei.shape[1]
    x = _randn(seed, N, F_IN).requires_grad_()
    edge_attr = _randn(seed + 1, e, D)
    for layer, args, allowed in [
            (ft.GINEConv(torch.nn.Linear(F_IN, 4), edge_dim=D).double(), (x, ei, edge_attr),
             torch.bool),
            (ft.ResGatedGraphConv(F_IN, 6, edge_dim=D).double(), (x, ei, edge_attr), None)]:
        kept = []

        def pack(t):
            if t.dim() == 2 and t.shape[0] == e and t.shape[1] > D:
                kept.append(t.dtype)
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            layer(*args).sum().backward()
        assert all(dtype == allowed for dtype in kept), f"{type(layer).__name__}: {kept}"


def test_backward_after_the_graph_input_is_gone(seed):
    """The backward reads the graph's transpose: it works after the forward's
    edge_index was freed and its graph dropped from the cache by a later
    call (the autograd node keeps the graph)."""
    x = _randn(seed, N, F_IN).requires_grad_()
    for layer in (ft.GINEConv(torch.nn.Linear(F_IN, 4)).double(),
                  ft.ResGatedGraphConv(F_IN, 6, edge_dim=D).double()):
        width = D if isinstance(layer, ft.ResGatedGraphConv) else F_IN
        outs = [layer(x, _graph(seed + k), _randn(seed + k, _graph(seed + k).shape[1], width))
                for k in range(2)]
        (outs[0] + outs[1]).sum().backward()
        assert x.grad is not None and torch.isfinite(x.grad).all()
        x.grad = None


@pytest.mark.parametrize("name", LAYERS)
def test_edge_attr_as_the_values_of_a_hybrid_adj_t_matches_pyg(name, seed):
    """A torch sparse adj_t with one row of values per entry ([nnz, D]): PyG
    reads those rows as edge_attr when none is given; so does ours. (PyG's
    backward fails on such an adj_t, so the gradients are checked against
    PyG given its entries as an edge_index and its values as edge_attr.)"""
    ei = _graph(seed)
    coo = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1]), (N, N)).coalesce()
    nnz = coo.indices().shape[1]
    adj = torch.sparse_coo_tensor(coo.indices(), _randn(seed + 1, nnz, D), (N, N, D)).coalesce()
    x = _randn(seed, N, F_IN)
    torch.manual_seed(0)
    ref = _make(pyg, name).double()
    torch.manual_seed(0)
    ours = _make(ft, name).double()
    ours.load_state_dict(ref.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(ours(x, adj), ref(x, adj), msg=lambda m: f"seed {seed}: {m}")
    pyg_forward = ref.forward
    ref.forward = lambda x, adj: pyg_forward(x, adj.indices().flip(0), adj.values())
    _compare(seed, ref, ours, x, adj)


@pytest.mark.parametrize("name", ["GINEConv", "GENConv", "PNAConv"])
def test_lazy_edge_dim_matches_pyg(name, seed):
    """edge_dim=-1: the edge Linear takes its width from the first edge_attr,
    drawing its weights there as PyG's."""
    ei = _graph(seed)
    x, edge_attr = _randn(seed, N, F_IN).float(), _randn(seed + 1, ei.shape[1], D).float()
    layers = []
    for lib in (pyg, ft):
        cls = fresh_pyg_class(getattr(pyg, name)) if lib is pyg else getattr(ft, name)
        torch.manual_seed(3)
        layer = {"GINEConv": lambda: cls(_mlp()(), edge_dim=-1),
                 "GENConv": lambda: cls(F_IN, 6, edge_dim=-1),
                 "PNAConv": lambda: cls(F_IN, 4, AGGREGATORS, SCALERS, DEG, edge_dim=-1)}[name]()
        layer(x, ei, edge_attr)
        layer.next_draw = torch.rand(4)
        layers.append(layer)
    _assert_same_draws(*layers, seed)
    _compare(seed, *layers, x.double(), ei, edge_attr.double())


BLOCK_CASES = [("GINEConv", {}), ("GINEConv", {"edge_dim": None}), ("GINEConv", {"static": True}),
               ("ResGatedGraphConv", {}), ("ResGatedGraphConv", {"act": torch.nn.Tanh()}),
               ("GENConv", {}), ("PNAConv", {}), ("PNAConv", {"pre_layers": 1})]


@pytest.mark.parametrize("name,options", BLOCK_CASES,
                         ids=[f"{n}-{'-'.join(o) or 'default'}" for n, o in BLOCK_CASES])
def test_message_rows_in_small_blocks_match_pyg(name, options, seed, monkeypatch):
    """Blocks of a row or two (the edge loops' temporaries bounded to a few
    elements): the same results, forward and backward."""
    from fastgnn.torch import nn_messages
    monkeypatch.setattr(nn_messages, "_BLOCK_ELEMENTS", 13)
    ei = _graph(seed)
    options = dict(options)
    static = options.pop("static", False)
    width = F_IN if options.get("edge_dim", D) is None else D
    made = []
    for lib in (pyg, ft):
        cls = fresh_pyg_class(getattr(pyg, name)) if lib is pyg else getattr(ft, name)
        torch.manual_seed(0)
        made.append({"GINEConv": lambda: cls(_mlp()(), train_eps=True,
                                             edge_dim=options.get("edge_dim", D)),
                     "ResGatedGraphConv": lambda: cls(F_IN, 6, edge_dim=D, **options),
                     "GENConv": lambda: cls(F_IN, 6, learn_t=True, edge_dim=D),
                     "PNAConv": lambda: cls(F_IN, 4, AGGREGATORS, SCALERS, DEG, edge_dim=D,
                                            towers=2, pre_layers=options.get("pre_layers", 2))
                     }[name]())
    x = _randn(seed, 2, N, F_IN) if static else _randn(seed, N, F_IN)
    _compare(seed, *made, x, ei, _randn(seed + 1, ei.shape[1], width))


@pytest.mark.parametrize("name", ["GINEConv", "GENConv", "PNAConv"])
def test_hooked_modules_take_the_per_edge_path_as_pyg(name, seed):
    """A forward hook on the edge Linear (GINEConv, GENConv) or on a tower's
    first Linear (PNAConv): the modules run on what PyG's run on."""
    ei = _graph(seed)
    torch.manual_seed(0)
    ref = _make(pyg, name)
    torch.manual_seed(0)
    ours = _make(ft, name)
    seen = []
    for layer in (ref, ours):
        module = {"GINEConv": lambda: layer.lin, "GENConv": lambda: layer.lin_edge,
                  "PNAConv": lambda: layer.pre_nns[1][0]}[name]()
        module.register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    _compare(seed, ref, ours, _randn(seed, N, F_IN), ei, _randn(seed + 1, ei.shape[1], D))
    assert seen[0] == seen[1], f"seed {seed}: {seen}"


def test_message_rows_gradcheck(seed):
    """The autograd Functions of the message rows against finite differences:
    every term kind ("src", "dst", "edge", "linear"), the ReLU with eps, the
    static-graph broadcast, and the gated sum; an edge order that is not the
    CSR order."""
    from fastgnn.torch import nn_messages as nm
    n = 6
    ei = torch.from_numpy(awkward_edge_index(n - 1, 12, seed=seed))
    edges = nm._edges(ft.to_graph(ei, n))
    assert edges.ids is not None, "the caller order should differ from the CSR order"
    e = ei.shape[1]

    def t(*shape):
        return torch.randn(*shape, dtype=torch.float64,
                           generator=torch.Generator().manual_seed(seed + sum(shape)))
    p, q, v = t(n, 4).requires_grad_(), t(n, 4).requires_grad_(), t(n, 4).requires_grad_()
    wide = t(n, 8).requires_grad_()
    a, w, b = t(e, 3).requires_grad_(), t(4, 3).requires_grad_(), t(4).requires_grad_()
    c = t(e, 4).requires_grad_()
    cases = [
        (lambda p, q, a, w, b: nm._edge_messages(
            edges, [("dst", (p,)), ("src", (q,)), ("linear", (a, w, b))]), (p, q, a, w, b)),
        (lambda q, c: nm._edge_messages(edges, [("src", (q,)), ("edge", (c,))], relu=True,
                                        eps=0.1), (q, c)),
        (lambda x, a, w, b: nm._edge_messages(edges, [("src", (x,)), ("linear", (a, w, b))],
                                              relu=True), (wide, a, w, b)),
        (lambda p, q, v, c, a, w, b: nm._GatedSum.apply(edges, ("edge",), ("linear",), p, q, v,
                                                        c, a, w, b), (p, q, v, c, a, w, b)),
    ]
    for fn, inputs in cases:
        assert torch.autograd.gradcheck(fn, inputs), f"seed {seed}"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("name", LAYERS)
def test_gpu_layers_match_pyg_float64(name, seed):
    """On the GPU (fastgnn's CUDA segment kernels) in float32 against PyG's
    float64 CPU run, within TF32's tolerance or twice PyG's own error on the
    GPU (`run_and_compare`; edge_attr takes the place of its edge weights,
    which it passes in float32)."""
    dtype = torch.float32
    n = 1501
    ei = torch.from_numpy(awkward_edge_index(n, 12 * n, seed=seed))
    x = _randn(seed, n, 24)
    edge_attr = _randn(seed + 1, ei.shape[1], D)
    made = []
    for lib in (pyg, ft):
        torch.manual_seed(0)
        made.append(_make(lib, name, in_channels=24))
    run_and_compare(*made, x, ei, edge_attr, device="cuda", dtype=dtype,
                    vtype="tf32", seed=seed, same_dtype_baseline=True)


# ---------------------------------------------------------------- bad inputs
def _square_graph():
    return torch.tensor([[0, 1, 2, 3, 3], [1, 2, 3, 0, 0]])


@pytest.mark.parametrize("make,call,error,words", [
    (lambda: ft.GINEConv(torch.nn.Linear(6, 4)), lambda c: c(torch.randn(4, 6), _square_graph()),
     ValueError, "edge_attr is required"),
    (lambda: ft.GINEConv(torch.nn.Linear(6, 4)),
     lambda c: c(torch.randn(4, 6), _square_graph(), torch.randn(5, 3)),
     ValueError, "edge_attr has 3 features"),
    (lambda: ft.GINEConv(torch.nn.Linear(6, 4), edge_dim=2),
     lambda c: c(torch.randn(4, 6), _square_graph(), torch.randn(4, 2)),
     ValueError, "edge_attr has 4 rows, but the graph has 5 edges"),
    (lambda: ft.GINEConv(torch.nn.Linear(6, 4), edge_dim=2),
     lambda c: c(torch.randn(4, 6), _square_graph(), torch.randn(5)),
     ValueError, "edge_attr must have shape"),
    (lambda: ft.GINEConv(torch.nn.Linear(6, 4), edge_dim=2),
     lambda c: c(torch.randn(4, 6), _square_graph(), torch.ones(5, 2, dtype=torch.long)),
     TypeError, "edge_attr must be a floating-point"),
    (lambda: ft.GINEConv(torch.nn.Linear(6, 4), edge_dim=2),
     lambda c: c(torch.randn(4, 6), _square_graph(), torch.randn(5, 2, dtype=torch.float64)),
     TypeError, "edge_attr has dtype"),
    (lambda: ft.GINEConv(torch.nn.Linear(5, 4), edge_dim=2),
     lambda c: c(torch.randn(4, 6), _square_graph(), torch.randn(5, 2)),
     ValueError, "x has 6 features per node"),
    (lambda: ft.ResGatedGraphConv(6, 4), lambda c: c(torch.randn(4, 5), _square_graph()),
     ValueError, "x has 5 features"),
    (lambda: ft.ResGatedGraphConv(6, 4),
     lambda c: c(torch.randn(4, 6), _square_graph(), torch.randn(5, 2)),
     ValueError, "edge_attr must be given exactly when edge_dim"),
    (lambda: ft.ResGatedGraphConv(6, 4, edge_dim=2),
     lambda c: c(torch.randn(4, 6), _square_graph()),
     ValueError, "edge_attr must be given exactly when edge_dim"),
    (lambda: ft.ResGatedGraphConv((6, 3), 4),
     lambda c: c((torch.randn(4, 6), None), _square_graph()), ValueError, "x_dst is None"),
    (lambda: ft.GENConv(6, 4), lambda c: c(torch.randint(0, 3, (4, 6)), _square_graph()),
     TypeError, "floating-point"),
    (lambda: ft.GENConv(6, 4), lambda c: c(torch.randn(4, 6), _square_graph(),
                                           torch.randn(5, 3)),
     ValueError, "edge_attr has 3 features per edge, but the layer takes 4"),
    (lambda: ft.PNAConv(6, 4, ["mean"], ["identity"], DEG),
     lambda c: c((torch.randn(4, 6), torch.randn(4, 6)), _square_graph()),
     ValueError, "bipartite"),
    (lambda: ft.PNAConv(6, 4, ["mean"], ["identity"], DEG),
     lambda c: c(torch.randn(4, 5), _square_graph()), ValueError, "x has 5 features"),
    (lambda: ft.PNAConv(6, 4, ["mean"], ["identity"], DEG),
     lambda c: c(torch.randn(4, 6), _square_graph().float()), TypeError,
     "edge_index must hold integers"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_bad_forward_inputs_name_them(make, call, error, words):
    with pytest.raises(error, match=words):
        call(make())


@pytest.mark.parametrize("make,error,words", [
    (lambda: ft.GINEConv(torch.nn.ReLU(), edge_dim=3), ValueError, "could not infer input"),
    (lambda: ft.GINEConv(torch.nn.Linear(4, 4), edge_dim=0), ValueError, "edge_dim must be >= 1"),
    (lambda: ft.GINEConv(torch.nn.Linear(4, 4), aggr="lstm"), NotImplementedError, "lstm"),
    (lambda: ft.GINEConv(torch.nn.Linear(4, 4), node_dim=1), NotImplementedError, "node_dim"),
    (lambda: ft.GINEConv(torch.nn.Linear(4, 4), flow="sideways"), ValueError, "flow"),
    (lambda: ft.ResGatedGraphConv(-1, 4, edge_dim=2), ValueError, "lazy in_channels"),
    (lambda: ft.ResGatedGraphConv(6, 4, act="sigmoid"), TypeError, "act must be callable"),
    (lambda: ft.ResGatedGraphConv(6, 4, improved=True), TypeError, "improved"),
    (lambda: ft.GENConv(6, 4, norm="group"), NotImplementedError, "norm='group'"),
    (lambda: ft.GENConv(6, 4, num_layers=0), ValueError, "num_layers must be >= 1"),
    (lambda: ft.GENConv(6, 4, aggr="softmax_sg", learn_t=True), ValueError, "semi_grad"),
    (lambda: ft.GENConv(6, 4, aggr=None), NotImplementedError, "aggr=None"),
    (lambda: ft.PNAConv(6, 4, "mean", ["identity"], DEG), TypeError, "aggregators must be"),
    (lambda: ft.PNAConv(6, 4, ["mean"], "identity", DEG), TypeError, "scalers must be"),
    (lambda: ft.PNAConv(6, 4, ["mean"], ["cubic"], DEG), ValueError, "unknown scaler 'cubic'"),
    (lambda: ft.PNAConv(6, 4, ["mean"], ["identity"], torch.zeros(3)), ValueError,
     "deg must count"),
    (lambda: ft.PNAConv(6, 5, ["mean"], ["identity"], DEG, towers=2), ValueError,
     "out_channels=5 must be divisible by towers=2"),
    (lambda: ft.PNAConv(5, 4, ["mean"], ["identity"], DEG, towers=2, divide_input=True),
     ValueError, "in_channels=5 must be divisible"),
    (lambda: ft.PNAConv(6, 4, ["mean"], ["identity"], DEG, act="nope", pre_layers=2),
     ValueError, "act='nope'"),
    (lambda: ft.PNAConv(6, 4, ["mean"], ["identity"], DEG, aggr="max"), TypeError, "aggr"),
    (lambda: ft.PNAConv(6, 4, ["lstm"], ["identity"], DEG), NotImplementedError, "lstm"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_bad_constructor_arguments_name_them(make, error, words):
    with pytest.raises(error, match=words):
        make()


# ------------------------------------------------------- PyG's own test files
PYG_TEST_FILES = {"test_gin_conv.py": ("GINEConv",),
                  "test_res_gated_graph_conv.py": ("ResGatedGraphConv",),
                  "test_gen_conv.py": ("GENConv",), "test_pna_conv.py": ("PNAConv",)}


@pytest.mark.parametrize("filename", sorted(PYG_TEST_FILES))
def test_pyg_own_tests_pass_with_fastgnn_layers(filename):
    """Run PyG's test functions that use these layers with ours put in their
    place (the module's names rebound); functions needing fixtures or
    packages this environment lacks are left out."""
    folder = pyg_test_folder()
    if folder is None:
        pytest.skip("PyG's test files are not here (set FASTGNN_PYG_TESTS to a PyG "
                    "checkout's test/nn/conv)")
    ran = run_pyg_test_file(folder / filename,
                            {name: getattr(ft, name) for name in PYG_TEST_FILES[filename]})
    if not ran:
        pytest.skip(f"no test function of {filename} could run here")
