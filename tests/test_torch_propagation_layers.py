"""The propagation layers of fastgnn.torch (nn_propagation.py: GraphConv,
SGConv, APPNP, TAGConv, LEConv, ClusterGCNConv, ChebConv) against PyG 2.8's.

Each case loads a PyG layer's state_dict into ours (strict=True) and ours
back into PyG's (`run_and_compare`), then compares the output and EVERY
gradient (x, x_dst, edge_weight where the layer reads it, every parameter)
in float64 on the CPU under a random cotangent. Graphs are drawn from the
test's seed (`seed` fixture; FASTGNN_TEST_SEED=random explores others) and
hold duplicate edges, self-loops, targets without in-edges, a hub, isolated
nodes and an odd feature width; the seed is in every failure message."""
import warnings

import numpy as np
import pytest
import torch
import torch_geometric.nn as pyg
from torch_geometric import EdgeIndex

import fastgnn
import fastgnn.torch as ft
from fastgnn.testing import awkward_edge_index, fresh_pyg_class
from test_torch_layers import _adj_t, _overwritten_loops, run_and_compare

warnings.filterwarnings("ignore", message=".*[Ss]parse.*")

needs_gpu = pytest.mark.skipif(not (fastgnn.gpu_available() and torch.cuda.is_available()),
                               reason="needs a CUDA device visible to CuPy and torch")

N, N_SRC = 41, 29          # nodes (targets), sources of the bipartite graphs
ISOLATED = 3               # the last nodes of x are in no edge
F_IN, F_DST = 7, 5         # odd feature widths


def _inputs(seed, bipartite=False):
    """(edge_index [2, E], x [N or N_SRC, F_IN], x_dst [N, F_DST], w [E]) of
    the seed: `awkward_edge_index` over all but the last ISOLATED nodes."""
    rng = np.random.default_rng(seed)
    live = N - ISOLATED
    ei = awkward_edge_index(live, 4 * live, seed=seed,
                            num_src=N_SRC - ISOLATED if bipartite else None)
    x = rng.standard_normal((N_SRC if bipartite else N, F_IN))
    x_dst = rng.standard_normal((N, F_DST))
    w = rng.random(ei.shape[1]) + 0.1
    return (torch.from_numpy(ei), torch.from_numpy(x), torch.from_numpy(x_dst),
            torch.from_numpy(w))


def _graph_input(form, ei, w, num_src=N, num_dst=N):
    """(graph input, edge_weight or None) of a form: an edge_index, a torch
    sparse adj_t (weighted: w as its values) or a PyG EdgeIndex, each
    "weighted_" one with w."""
    weighted = form.startswith("weighted_")
    kind = form[len("weighted_"):] if weighted else form
    if kind == "adj_t":
        return _adj_t(ei, num_src, num_dst, w if weighted else None), None
    if kind == "EdgeIndex":
        ei = EdgeIndex(ei, sparse_size=(num_src, num_dst))
    return ei, (w if weighted else None)


def _layers(name, *args, **kwargs):
    """PyG's layer (a fresh class: `fresh_pyg_class`) and ours from the same
    constructor call, each built from the same generator state."""
    torch.manual_seed(0)
    ref = fresh_pyg_class(getattr(pyg, name))(*args, **kwargs)
    torch.manual_seed(0)
    return ref, getattr(ft, name)(*args, **kwargs)


def _compare(seed, ref, ours, x, adj, w=None, **kw):
    try:
        return run_and_compare(ref, ours, x, adj, w, seed=seed, **kw)
    except AssertionError as error:
        raise AssertionError(f"seed {seed}: {error}") from None


FORMS = ["edge_index", "weighted_edge_index", "adj_t", "weighted_adj_t", "EdgeIndex",
         "weighted_EdgeIndex"]


# ----------------------------------------------------------------- GraphConv
@pytest.mark.parametrize("out_channels", [3, 9])
@pytest.mark.parametrize("form", FORMS + ["bipartite", "weighted_bipartite", "bipartite_adj_t",
                                          "dst_none"])
@pytest.mark.parametrize("aggr", ["add", "mean", "max", "min"])
def test_graph_conv_matches_pyg(aggr, form, out_channels, seed):
    bipartite = "bipartite" in form or form == "dst_none"
    ei, x, x_dst, w = _inputs(seed, bipartite)
    in_channels, xin, sizes = F_IN, x, (N, N)
    if bipartite:
        in_channels, xin, sizes = (F_IN, F_DST), (x, x_dst), (N_SRC, N)
    if form == "dst_none":
        xin, keep = (x, None), ei[1] < N_SRC
        ei, w = ei[:, keep], w[keep]
    kind = {"bipartite": "edge_index", "weighted_bipartite": "weighted_edge_index",
            "bipartite_adj_t": "weighted_adj_t", "dst_none": "weighted_edge_index"}.get(form, form)
    adj, ew = _graph_input(kind, ei, w, *sizes)
    ref, ours = _layers("GraphConv", in_channels, out_channels, aggr=aggr,
                        bias=out_channels == 3)
    _compare(seed, ref, ours, xin, adj, ew)


# -------------------------------------------------------------------- SGConv
@pytest.mark.parametrize("out_channels", [3, 9])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("K,cached,add_self_loops", [(1, False, True), (3, False, True),
                                                     (0, False, True), (2, True, True),
                                                     (2, False, False)])
def test_sg_conv_matches_pyg(K, cached, add_self_loops, form, out_channels, seed):
    ei, x, _, w = _inputs(seed)
    adj, ew = _graph_input(form, ei, w)
    ref, ours = _layers("SGConv", F_IN, out_channels, K=K, cached=cached,
                        add_self_loops=add_self_loops)
    loops = _overwritten_loops(ei) if add_self_loops else None
    _compare(seed, ref, ours, x, adj, ew, overwritten_loops=loops)
    if cached and K > 0:       # later calls reuse the first propagation, whatever they get
        other = torch.empty(2, 0, dtype=torch.long)
        with torch.no_grad():
            assert torch.allclose(ours(x, other), ref(x, other)), f"seed {seed}"


# --------------------------------------------------------------------- APPNP
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("K,alpha,normalize,add_self_loops,cached", [
    (3, 0.1, True, True, False), (0, 0.1, True, True, False), (5, 0.25, True, False, True),
    (2, 0.5, False, True, False)])
def test_appnp_matches_pyg(K, alpha, normalize, add_self_loops, cached, form, seed):
    ei, x, _, w = _inputs(seed)
    adj, ew = _graph_input(form, ei, w)
    ref, ours = _layers("APPNP", K, alpha, cached=cached, add_self_loops=add_self_loops,
                        normalize=normalize)
    loops = _overwritten_loops(ei) if normalize and add_self_loops else None
    _compare(seed, ref, ours, x, adj, ew, overwritten_loops=loops)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("cached", [False, True])
def test_appnp_edge_dropout_draws_as_pyg(weighted, cached, seed):
    """Training with dropout: from the same generator state the same weights
    are dropped in every step (PyG's edge order), so outputs and gradients
    equal PyG's; in eval mode nothing is dropped."""
    ei, x, _, w = _inputs(seed)
    ref, ours = _layers("APPNP", 3, 0.2, dropout=0.4, cached=cached)
    results = []
    for layer in (ref, ours):
        xs = x.clone().requires_grad_()
        ws = w.clone().requires_grad_() if weighted else None
        torch.manual_seed(seed)
        out = layer(xs, ei, ws) if weighted else layer(xs, ei)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(seed),
                                 dtype=out.dtype))
        results.append((out, xs.grad, None if ws is None else ws.grad))
    overwritten = _overwritten_loops(ei)
    for what, want, got in zip(("output", "grad x", "grad edge_weight"), *results):
        if want is None:
            continue
        if what == "grad edge_weight":
            want = want.masked_fill(overwritten, 0)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12,
                                   msg=lambda m: f"seed {seed}, {what}: {m}")
    ref.eval()
    ours.eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(x, ei), ref(x, ei), msg=f"seed {seed}, eval")


# ------------------------------------------------------------------- TAGConv
@pytest.mark.parametrize("out_channels", [3, 9])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("K,normalize,bias", [(3, True, True), (1, True, False), (0, True, True),
                                              (2, False, True)])
def test_tag_conv_matches_pyg(K, normalize, bias, form, out_channels, seed):
    ei, x, _, w = _inputs(seed)
    adj, ew = _graph_input(form, ei, w)
    ref, ours = _layers("TAGConv", F_IN, out_channels, K=K, normalize=normalize, bias=bias)
    _compare(seed, ref, ours, x, adj, ew)


# -------------------------------------------------------------------- LEConv
@pytest.mark.parametrize("aggr", ["add", "mean"])
@pytest.mark.parametrize("form", FORMS + ["adj_t_and_edge_weight", "bipartite",
                                          "weighted_bipartite", "bipartite_adj_t"])
def test_le_conv_matches_pyg(form, aggr, seed):
    bipartite = "bipartite" in form
    ei, x, x_dst, w = _inputs(seed, bipartite)
    in_channels, xin, sizes = F_IN, x, (N, N)
    if bipartite:
        in_channels, xin, sizes = (F_IN, F_DST), (x, x_dst), (N_SRC, N)
    kind = {"bipartite": "edge_index", "weighted_bipartite": "weighted_edge_index",
            "bipartite_adj_t": "weighted_adj_t", "adj_t_and_edge_weight": "adj_t"}.get(form, form)
    adj, ew = _graph_input(kind, ei, w, *sizes)
    if form == "adj_t_and_edge_weight":    # PyG then weighs adj_t's entries by edge_weight
        ew = torch.from_numpy(np.random.default_rng(seed).random(adj.values().shape[0]) + 0.1)
    ref, ours = _layers("LEConv", in_channels, 6, bias=aggr == "add", aggr=aggr)
    _compare(seed, ref, ours, xin, adj, ew)


# ------------------------------------------------------------ ClusterGCNConv
@pytest.mark.parametrize("out_channels", [3, 9])
@pytest.mark.parametrize("form", ["edge_index", "adj_t", "weighted_adj_t", "EdgeIndex"])
@pytest.mark.parametrize("diag_lambda,bias", [(0.0, True), (0.7, False)])
def test_cluster_gcn_conv_matches_pyg(diag_lambda, bias, form, out_channels, seed):
    ei, x, _, w = _inputs(seed)
    adj, _ = _graph_input(form, ei, w)     # (adj_t's values are ignored, as in PyG)
    ref, ours = _layers("ClusterGCNConv", F_IN, out_channels, diag_lambda=diag_lambda, bias=bias)
    if "adj_t" in form:
        # PyG's float64 run fails on an adj_t (its degree weights are float32,
        # which torch.sparse.mm refuses beside float64 features): in float32,
        # PyG on the adj_t gives what it gives on the adj_t's entries as an
        # edge_index, which is then the float64 reference
        ours.load_state_dict(ref.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(ours(x.float(), adj.float()), ref(x.float(), adj.float()),
                                       msg=lambda m: f"seed {seed}: {m}")
        pyg_forward = ref.forward
        ref.forward = lambda x, adj: pyg_forward(x, adj.to_sparse_coo().indices().flip(0))
    _compare(seed, ref, ours, x, adj)


@pytest.mark.parametrize("diag_lambda", [0.0, 0.4])
def test_cluster_gcn_conv_without_added_loops(diag_lambda, seed):
    """add_self_loops=False: the graph's own loops take lambda's weight. PyG
    runs only when the graph has one loop per node, in node order (it adds
    lambda by the loops' positions); there both agree."""
    ei, x, _, _ = _inputs(seed)
    nodes = torch.arange(N)
    ei = torch.cat([ei[:, ei[0] != ei[1]], torch.stack([nodes, nodes])], 1)
    ref, ours = _layers("ClusterGCNConv", F_IN, 4, diag_lambda=diag_lambda, add_self_loops=False)
    _compare(seed, ref, ours, x, ei)


# ------------------------------------------------------------------ ChebConv
@pytest.mark.parametrize("out_channels", [3, 9])
@pytest.mark.parametrize("form", ["edge_index", "weighted_edge_index", "EdgeIndex",
                                  "weighted_EdgeIndex"])
@pytest.mark.parametrize("K,normalization,lambda_max", [
    (3, "sym", None), (1, "sym", None), (2, "rw", None), (4, None, None), (3, "sym", 1.7),
    (3, "rw", "per_graph"), (2, None, "tensor")])
def test_cheb_conv_matches_pyg(K, normalization, lambda_max, form, out_channels, seed):
    ei, x, _, w = _inputs(seed)
    adj, ew = _graph_input(form, ei, w)
    extra = {}
    if lambda_max == "per_graph":     # two graphs in a batch, each its own lambda_max
        extra = {"batch": (torch.arange(N) >= N // 2).long(),
                 "lambda_max": torch.tensor([1.9, 2.3], dtype=torch.float64)}
    elif lambda_max == "tensor":
        extra = {"lambda_max": torch.tensor(3.1, dtype=torch.float64)}
    elif lambda_max is not None:
        extra = {"lambda_max": lambda_max}
    ref, ours = _layers("ChebConv", F_IN, out_channels, K, normalization=normalization,
                        bias=K != 2)
    _compare(seed, ref, ours, x, adj, ew, extra=extra)


def test_cheb_conv_caches_the_unweighted_laplacian(seed):
    """The scaled Laplacian of an unweighted graph is built once per graph,
    normalization and lambda_max; another normalization builds its own."""
    ei, x, _, _ = _inputs(seed)
    ref, ours = _layers("ChebConv", F_IN, 4, 3)
    ref, ours = ref.double(), ours.double()
    ours.load_state_dict(ref.state_dict())
    graph = ft.to_graph(ei, N)
    with torch.no_grad():
        first = ours(x, ei)
        cached = [k for k in graph.cache if "scaled_laplacian" in str(k)]
        assert torch.equal(ours(x, ei), first) and len(cached) == 1, f"seed {seed}"
        ref.normalization = ours.normalization = "rw"
        torch.testing.assert_close(ours(x, ei), ref(x, ei), msg=f"seed {seed}")


# --------------------------------------------------------- all of the layers
def _make(lib, name, in_channels=F_IN, out_channels=4):
    """A layer of every kind from `lib` (PyG's nn or fastgnn.torch)."""
    cls = getattr(lib, name)
    if lib is pyg:
        cls = fresh_pyg_class(cls)
    return {"GraphConv": lambda: cls(in_channels, out_channels, aggr="mean"),
            "SGConv": lambda: cls(in_channels, out_channels, K=2),
            "APPNP": lambda: cls(3, 0.15),
            "TAGConv": lambda: cls(in_channels, out_channels, K=2),
            "LEConv": lambda: cls(in_channels, out_channels),
            "ClusterGCNConv": lambda: cls(in_channels, out_channels, diag_lambda=0.3),
            "ChebConv": lambda: cls(in_channels, out_channels, 3)}[name]()


LAYERS = ["GraphConv", "SGConv", "APPNP", "TAGConv", "LEConv", "ClusterGCNConv", "ChebConv"]
WEIGHTED = {"GraphConv", "SGConv", "APPNP", "TAGConv", "LEConv", "ChebConv"}


@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
@pytest.mark.parametrize("name", LAYERS)
def test_flow_set_after_construction_matches_pyg(name, flow, seed):
    """`conv.flow = ...` after construction, read per call as PyG's
    MessagePassing does (target_to_source: messages from edge_index[1] to
    edge_index[0]; the GCN degrees then count edge_index[0], ClusterGCN's
    and ChebConv's stay where PyG computes them)."""
    ei, x, _, w = _inputs(seed)
    torch.manual_seed(0)
    ref = _make(pyg, name)
    torch.manual_seed(0)
    ours = _make(ft, name)
    ref.flow = ours.flow = flow
    loops = _overwritten_loops(ei) if name in ("SGConv", "APPNP") else None
    _compare(seed, ref, ours, x, ei, w if name in WEIGHTED else None, overwritten_loops=loops)


def test_le_conv_bipartite_flow_target_to_source(seed):
    """LEConv with a pair and target_to_source: PyG reads a at edge_index[1]
    (sources) and b at edge_index[0] (targets): the reversed graph."""
    ei, x, x_dst, w = _inputs(seed, bipartite=True)
    ref, ours = _layers("LEConv", (F_IN, F_DST), 4, flow="target_to_source")
    _compare(seed, ref, ours, (x, x_dst), ei.flip(0), w)


@pytest.mark.parametrize("name", LAYERS)
def test_static_graph_batch_matches_pyg(name, seed):
    """x [B, N, F]: the same graph for every batch element (node_dim=-2)."""
    ei, _, _, w = _inputs(seed)
    x = torch.randn(2, N, F_IN, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(seed))
    torch.manual_seed(0)
    ref = _make(pyg, name)
    torch.manual_seed(0)
    ours = _make(ft, name)
    loops = _overwritten_loops(ei) if name in ("SGConv", "APPNP") else None
    _compare(seed, ref, ours, x, ei, w if name in WEIGHTED else None, overwritten_loops=loops)


@pytest.mark.parametrize("name", LAYERS)
def test_float32_matches_pyg(name, seed):
    ei, x, _, w = _inputs(seed)
    torch.manual_seed(0)
    ref = _make(pyg, name)
    torch.manual_seed(0)
    ours = _make(ft, name)
    loops = _overwritten_loops(ei) if name in ("SGConv", "APPNP") else None
    _compare(seed, ref, ours, x, ei, w if name in WEIGHTED else None, dtype=torch.float32,
             vtype="float32", overwritten_loops=loops, same_dtype_baseline=True)


@pytest.mark.parametrize("name", LAYERS)
def test_state_dicts_load_both_ways(name):
    assert_state_dicts_load_both_ways(_make, name)


def assert_state_dicts_load_both_ways(make, name):
    """The same keys in the same order; each side's state_dict loads into
    the other with strict=True and gives the same values back; the seeded
    construction draws PyG's weights and leaves the generator where PyG does.
    make(lib, name): the layer `name` of PyG's nn or fastgnn.torch.
    Returns (PyG's layer, ours)."""
    made = []
    for lib in (pyg, ft):
        torch.manual_seed(1234)
        made += [make(lib, name), torch.rand(4)]
    ref, ref_next, ours, our_next = made
    want = ref.state_dict()
    assert list(ours.state_dict()) == list(want)
    for key, value in want.items():
        assert torch.equal(ours.state_dict()[key], value), key
    assert torch.equal(our_next, ref_next)
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(torch.randn_like(p))
    ref.load_state_dict(ours.state_dict(), strict=True)
    ours.load_state_dict(ref.state_dict(), strict=True)
    for key, value in ours.state_dict().items():
        assert torch.equal(ref.state_dict()[key], value), key
    assert repr(ours) == repr(ref).replace(type(ref).__name__, name)
    return ref, ours


@pytest.mark.parametrize("name", [n for n in LAYERS if n != "APPNP"])
def test_lazy_in_channels_draw_at_the_first_call_as_pyg(name, seed):
    """in_channels=-1: the widths come from the first call, where the
    weights are drawn as PyG draws them. PyG's TAGConv and ChebConv call
    their lazy linears past the hook that materialises them (and fail);
    ours then take the weights of a PyG layer of the same widths."""
    ei, x, _, _ = _inputs(seed)
    layers = []
    for lib in (pyg, ft):
        torch.manual_seed(5)
        lazy = lib is ft or name not in ("TAGConv", "ChebConv")
        layer = _make(lib, name, in_channels=-1 if lazy else F_IN)
        layer(x.float(), ei)
        layer.next_draw = torch.rand(4)
        layers.append(layer)
    ref, ours = layers
    if name not in ("TAGConv", "ChebConv"):
        assert torch.equal(ours.next_draw, ref.next_draw)
        for key, value in ref.state_dict().items():
            assert torch.equal(ours.state_dict()[key], value), key
    _compare(seed, ref, ours, x, ei)


@pytest.mark.parametrize("name", LAYERS)
def test_a_compiled_model_runs_the_layers_eagerly(name, seed):
    """Under torch.compile the layers run eagerly behind a graph break: the
    compiled model gives the eager output and gradients."""
    ei, x, _, _ = _inputs(seed)
    torch.manual_seed(0)
    conv = _make(ft, name).double()

    def model(x, edge_index):          # torch ops around the layer, compiled
        return conv(torch.tanh(x), edge_index).square()

    def run(fn):
        xs = x.clone().requires_grad_()
        out = fn(xs, ei)
        out.sum().backward()
        return out.detach(), xs.grad
    want = run(model)
    torch._dynamo.reset()
    try:
        got = run(torch.compile(model, backend="aot_eager"))
    finally:
        torch._dynamo.reset()
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, msg=f"seed {seed}")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("graph_input", ["edge_index", "adj_t"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", LAYERS)
def test_gpu_layers_match_pyg_float64(name, dtype, graph_input, seed):
    """On the GPU (fastgnn's CUDA kernels) in float32 and bfloat16 against
    PyG's float64 CPU run, within the tolerance of the type or twice PyG's
    own error on the GPU in that type."""
    if graph_input == "adj_t" and name in ("ChebConv", "ClusterGCNConv"):
        pytest.skip("PyG's ChebConv takes no adj_t; its ClusterGCNConv none in float64")
    n = 1501
    rng = np.random.default_rng(seed)
    ei = torch.from_numpy(awkward_edge_index(n, 12 * n, seed=seed))
    x = torch.from_numpy(rng.standard_normal((n, 24)))
    w = torch.from_numpy(rng.random(ei.shape[1]) + 0.1) if name in WEIGHTED else None
    if graph_input == "adj_t":
        ei, w = _adj_t(ei, n, n, None if w is None else w.to(dtype).double()), None
    torch.manual_seed(0)
    ref = _make(pyg, name, in_channels=24, out_channels=16)
    torch.manual_seed(0)
    ours = _make(ft, name, in_channels=24, out_channels=16)
    loops = (_overwritten_loops(ei) if name in ("SGConv", "APPNP") and graph_input == "edge_index"
             else None)
    _compare(seed, ref, ours, x, ei, w, device="cuda", dtype=dtype,
             vtype="tf32" if dtype == torch.float32 else "bfloat16", overwritten_loops=loops,
             same_dtype_baseline=True)


# ---------------------------------------------------------------- bad inputs
def _square_graph():
    return torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])


@pytest.mark.parametrize("name", [n for n in LAYERS if n != "APPNP"])
def test_wrong_feature_width_names_x(name):
    conv = _make(ft, name, in_channels=6)
    with pytest.raises(ValueError, match="x has 5 features per node, but in_channels says 6"):
        conv(torch.randn(4, 5), _square_graph())


@pytest.mark.parametrize("name,bad,error", [
    ("GraphConv", (torch.randn(4, 6), torch.randn(4, 3)), "x_dst has 3 features"),
    ("LEConv", (torch.randn(4, 5), torch.randn(4, 6)), "x_src has 5 features"),
    ("LEConv", (torch.randn(4, 6), None), "x_dst is None"),
    ("SGConv", (torch.randn(4, 6), torch.randn(4, 6)), "bipartite"),
    ("ChebConv", (torch.randn(4, 6), torch.randn(4, 6)), "bipartite"),
    ("TAGConv", torch.randint(0, 3, (4, 6)), "floating-point"),
    ("APPNP", torch.randn(4), "x must have shape"),
])
def test_bad_features_name_x(name, bad, error):
    conv = _make(ft, name, in_channels=(6, 4) if name == "GraphConv" else 6)
    with pytest.raises((ValueError, TypeError), match=error):
        conv(bad, _square_graph())


@pytest.mark.parametrize("make,error,words", [
    (lambda: ft.SGConv(6, 4, K=-1), ValueError, "K must be >= 0"),
    (lambda: ft.TAGConv(6, 4, K=2.0), TypeError, "K must be an int"),
    (lambda: ft.APPNP(True, 0.1), TypeError, "K must be an int"),
    (lambda: ft.ChebConv(6, 4, 0), ValueError, "K must be >= 1"),
    (lambda: ft.ChebConv(6, 4, 2, normalization="lap"), ValueError, "normalization"),
    (lambda: ft.APPNP(2, 0.1, dropout=1.5), ValueError, "dropout"),
    (lambda: ft.GraphConv(6, 4, aggr="std"), NotImplementedError, "aggr='std'"),
    (lambda: ft.LEConv(6, 4, aggr="max"), NotImplementedError, "aggr='max'"),
    (lambda: ft.TAGConv(6, 4, node_dim=1), NotImplementedError, "node_dim"),
    (lambda: ft.ClusterGCNConv(6, 4, improved=True), TypeError, "improved"),
    (lambda: ft.SGConv(6, 4, flow="sideways"), ValueError, "flow"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_bad_constructor_arguments_name_them(make, error, words):
    with pytest.raises(error, match=words):
        make()


def test_bad_graph_inputs_name_them():
    x = torch.randn(4, 6)
    adj = _adj_t(_square_graph(), 4, 4).float()
    with pytest.raises(NotImplementedError, match="edge_index must be"):
        ft.ChebConv(6, 3, 2)(x, adj)
    with pytest.raises(ValueError, match="lambda_max holds 2 values"):
        ft.ChebConv(6, 3, 2)(x, _square_graph(), lambda_max=torch.tensor([2.0, 2.0]))
    with pytest.raises(TypeError, match="edge_index must hold integers"):
        ft.TAGConv(6, 3)(x, _square_graph().float())
    conv = ft.ClusterGCNConv(6, 3)
    conv.flow = "target_to_source"
    with pytest.raises(ValueError, match="adj_t.t()"):           # as PyG
        conv(x, adj)
    with pytest.raises(ValueError, match="rows of the source features"):
        ft.GraphConv(6, 3)(x[:2], _square_graph())
