"""fastgnn.torch under torch.compile and CUDA graphs: the custom ops
(`custom_ops.py`) checked with torch.library.opcheck, every layer compiled
with fullgraph=True (no graph break) against eager, compiled training steps,
graphs that change every step under dynamic shapes (one compile for 20
batches of other sizes, counted with Dynamo's counters), and on the GPU a
CUDA-graph-captured training step against eager.

Most cases compile with the "aot_eager" backend: it runs Dynamo, the fake
implementations and AOTAutograd's joint forward/backward trace, which is
where a fastgnn op could break, without spending CPU time in Inductor's
code generation; one model per test goes through Inductor itself."""
import warnings

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

import fastgnn
import fastgnn.torch as ft
from fastgnn.testing import awkward_edge_index
from fastgnn.torch import custom_ops

warnings.filterwarnings("ignore", message=".*[Ss]parse.*")

needs_gpu = pytest.mark.skipif(not (fastgnn.gpu_available() and torch.cuda.is_available()),
                               reason="needs a CUDA device visible to CuPy and torch")

N, F, E = 53, 12, 400


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _compiles():
    """How many graphs Dynamo compiled since the test began: one per
    compiled function, and one more for each recompile or graph break."""
    return counters["stats"]["unique_graphs"]


def _close(got, want, rtol=1e-5, atol=1e-6, what="output"):
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def _graph(seed, device="cpu"):
    ei = awkward_edge_index(N, E, seed=seed)          # empty rows, loops, duplicates, a hub
    return torch.from_numpy(ei).to(device)


def _tensor(*shape, device="cpu", dtype=torch.float32, grad=True):
    t = torch.randn(*shape, dtype=dtype, device=device)
    return t.requires_grad_(grad)


def _run(fn, inputs, params=()):
    """fn(*inputs) and the gradients of sum(out^2) in inputs and params."""
    out = fn(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum((o.float() ** 2).sum() for o in outs if o.is_floating_point())
    wrt = [t for t in (*inputs, *params) if isinstance(t, torch.Tensor) and t.requires_grad]
    grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    return outs, grads


def _assert_compiled_matches(fn, inputs, params=(), backend="aot_eager", rtol=1e-5, atol=1e-5):
    want = _run(fn, inputs, params)
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    _assert_same_run(_run(compiled, inputs, params), want, rtol, atol)


def _assert_same_run(got, want, rtol, atol):
    """Two `_run` results agree: outputs and gradients."""
    (got_out, got_grads), (want_out, want_grads) = got, want
    assert len(got_out) == len(want_out)
    for i, (g, w) in enumerate(zip(got_out, want_out)):
        _close(g, w, rtol=rtol, atol=atol, what=f"output {i}")
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        if w is None:
            assert g is None or not g.any()
        else:
            _close(g, w, rtol=rtol, atol=atol, what=f"gradient {i}")


# ------------------------------------------------------------------ opcheck
def _opcheck_cases(seed):
    ei = _graph(seed)
    x = _tensor(N, F, dtype=torch.float64)
    w = _tensor(ei.shape[1], dtype=torch.float64)
    a_src, a_dst = _tensor(N, 2, dtype=torch.float64), _tensor(N, 2, dtype=torch.float64)
    v = _tensor(N, 2, 3, dtype=torch.float64)
    ptr = torch.tensor([0, 3, 3, 10, 17])
    src = _tensor(17, F, dtype=torch.float64)
    att = dict.fromkeys(ft.attention._ATTN_INPUTS)
    att.update(a_src=a_src, a_dst=a_dst, v=v)
    args = custom_ops.op_arguments
    return {
        "spmm": args("spmm", ei, x, w, None, None, None, num_nodes=[N, N], reduce="mean",
                     path="auto"),
        "segment_reduce": args("segment_reduce", ei, x, num_nodes=[N, N],
                               reduce=["max", "std"], deterministic=True),
        "segment_csr": args("segment_csr", None, ptr, src, reduce="min", deterministic=True),
        "gcn_propagate": args("gcn_propagate", ei, x, None, None, num_nodes=[N, N],
                              normalize=True, add_self_loops=True, improved=False,
                              reduce="sum"),
        "edge_attention": args("edge_attention", ei, *att.values(), None, num_nodes=[N, N],
                               num_loops=N, score="gat", negative_slope=0.2, scale=None,
                               dropout=0.0, offset=0, return_attention_weights=False,
                               deterministic=True, dropped=False),
    }


@pytest.mark.parametrize("name", ["spmm", "segment_reduce", "segment_csr", "gcn_propagate",
                                  "edge_attention"])
def test_custom_op_opcheck(name, seed):
    """Schema, fake implementation, autograd registration and AOT dispatch of
    each custom op, by torch.library.opcheck on seeded float64 inputs (seed
    in the report); its dynamic-shape pass runs the fake implementation on
    symbolic sizes."""
    op = getattr(torch.ops.fastgnn, name).default
    torch.library.opcheck(op, _opcheck_cases(seed)[name])


def test_every_graph_function_is_registered():
    import fastgnn.torch.aggr  # noqa: F401  (loaded on first use; it registers "aggregation")
    names = set(custom_ops.registered())
    assert {"spmm", "segment_reduce", "segment_reduce_linear", "segment_csr", "gcn_propagate",
            "edge_softmax", "edge_attention", "attention_loop_edge_attr",
            "aggregation"} <= names
    for name in names:     # each has its backward op beside it
        assert hasattr(torch.ops.fastgnn, name) and hasattr(torch.ops.fastgnn, name + "_backward")


def test_custom_op_gradient_equals_eager(seed):
    """The recomputing backward op returns the eager autograd gradients."""
    ei = _graph(seed)
    x, w = _tensor(N, F, dtype=torch.float64), _tensor(ei.shape[1], dtype=torch.float64)
    want = _run(lambda x, w: ft.spmm(ei, x, w, reduce="mean"), (x, w))
    got = _run(lambda x, w: custom_ops.call("spmm", ei, x, w, None, None, None,
                                            num_nodes=[N, N], reduce="mean", path="auto"), (x, w))
    for g, e in zip((*got[0], *got[1]), (*want[0], *want[1])):
        _close(g, e, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------- functional ops
def test_functional_ops_compile(seed):
    ei = _graph(seed)
    x, w = _tensor(N, F), _tensor(ei.shape[1])
    scores = _tensor(ei.shape[1], 3)

    def fn(x, w, scores):
        return (ft.spmm(ei, x, w, reduce="mean"),
                ft.segment_reduce(ei, x, ["max", "min", "std"]),
                ft.edge_softmax(ei, scores, N),
                ft.segment_csr(torch.tensor([0, 5, 5, 20]), x[:20], "max"))
    _assert_compiled_matches(fn, (x, w, scores))


# ------------------------------------------------------------------ layers
LAYERS = {
    "GCNConv": lambda: ft.GCNConv(F, 8),
    "GCNConv-cached": lambda: ft.GCNConv(F, 8, cached=True),
    "GCNConv-plain": lambda: ft.GCNConv(F, 8, normalize=False),
    "SAGEConv-mean": lambda: ft.SAGEConv(F, 8),
    "SAGEConv-sum": lambda: ft.SAGEConv(F, 8, aggr="sum"),
    "SAGEConv-max": lambda: ft.SAGEConv(F, 8, aggr="max"),
    "SAGEConv-min": lambda: ft.SAGEConv(F, 8, aggr="min"),
    "SAGEConv-std": lambda: ft.SAGEConv(F, 8, aggr="std"),
    "SAGEConv-var": lambda: ft.SAGEConv(F, 8, aggr="var"),
    "SAGEConv-multi": lambda: ft.SAGEConv(F, 8, aggr=["mean", "max", "std"]),
    "SAGEConv-project-normalize": lambda: ft.SAGEConv(F, 8, project=True, normalize=True),
    "GINConv": lambda: ft.GINConv(torch.nn.Sequential(torch.nn.Linear(F, 8), torch.nn.ReLU(),
                                                      torch.nn.Linear(8, 8)), train_eps=True),
    "GATConv": lambda: ft.GATConv(F, 4, heads=3),
    "GATConv-mean-heads": lambda: ft.GATConv(F, 4, heads=3, concat=False),
    "GATConv-edge": lambda: ft.GATConv(F, 4, heads=3, edge_dim=5),
    "GATv2Conv": lambda: ft.GATv2Conv(F, 4, heads=3),
    "GATv2Conv-edge-mean-fill": lambda: ft.GATv2Conv(F, 4, heads=3, edge_dim=5,
                                                     fill_value="mean"),
    "GATv2Conv-shared": lambda: ft.GATv2Conv(F, 4, heads=2, share_weights=True),
    "TransformerConv": lambda: ft.TransformerConv(F, 4, heads=3),
    "TransformerConv-edge-beta": lambda: ft.TransformerConv(F, 4, heads=3, edge_dim=5,
                                                            beta=True),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_compiles_fullgraph_and_matches_eager(name, seed):
    """Every fastgnn layer under torch.compile(fullgraph=True): no graph break
    (fullgraph raises on one), outputs and every gradient equal to eager."""
    layer = LAYERS[name]()
    ei = _graph(seed)
    x = _tensor(N, F)
    uses_edges = getattr(layer, "lin_edge", None) is not None
    edge_attr = _tensor(ei.shape[1], 5) if uses_edges else None

    def fn(x, edge_attr):
        return layer(x, ei, edge_attr) if uses_edges else layer(x, ei)
    _assert_compiled_matches(fn, (x, edge_attr), tuple(layer.parameters()), rtol=1e-4,
                             atol=1e-5)


def test_gcn_with_edge_weight_compiles(seed):
    layer = ft.GCNConv(F, 8, improved=True)
    ei, x = _graph(seed), _tensor(N, F)
    w = torch.rand(ei.shape[1]).requires_grad_()
    _assert_compiled_matches(lambda x, w: layer(x, ei, w), (x, w), tuple(layer.parameters()),
                             rtol=1e-4)


def test_bipartite_sage_compiles(seed):
    layer = ft.SAGEConv((F, 7), 8, aggr="max")
    ei = torch.from_numpy(awkward_edge_index(31, 300, num_src=N, seed=seed))
    xs, xd = _tensor(N, F), _tensor(31, 7)
    _assert_compiled_matches(lambda xs, xd: layer((xs, xd), ei), (xs, xd),
                             tuple(layer.parameters()), rtol=1e-4)


def test_attention_weights_compile(seed):
    """return_attention_weights=True: the self-looped graph's size is only
    known at run time (an unbacked size in the fake implementation)."""
    layer = ft.GATConv(F, 4, heads=2)
    ei, x = _graph(seed), _tensor(N, F)

    def fn(x):
        out, (ei_out, alpha) = layer(x, ei, return_attention_weights=True)
        return out, alpha, ei_out
    want = fn(x)
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(x)
    for g, w in zip(got, want):
        _close(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["SumAggregation", "MaxAggregation", "StdAggregation",
                                  "MultiAggregation"])
def test_aggregation_compiles(name, seed):
    cls = getattr(ft, name)
    aggr = cls(["mean", "max", "min"]) if name == "MultiAggregation" else cls()
    x = _tensor(40, F)
    index = torch.randint(0, 9, (40,))
    _assert_compiled_matches(lambda x: aggr(x, index, dim_size=9), (x,))


def test_dropout_training_compiles(seed):
    """Attention dropout inside a compiled program draws its seed there; the
    recomputed backward drops the same weights (the gradient of a linear
    function of the output is the output's own factorisation)."""
    layer = ft.GATConv(F, 4, heads=2, dropout=0.5).train()
    ei, x = _graph(seed), _tensor(N, F)
    out = torch.compile(lambda x: layer(x, ei), fullgraph=True, backend="aot_eager")(x)
    assert out.shape == (N, 8) and torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_compiled_errors_say_what_to_pass(seed):
    g = ft.to_graph(_graph(seed), N)
    fn = torch.compile(lambda x: ft.spmm(g, x), fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match="edge_index tensor rather than a fastgnn.Graph"):
        fn(_tensor(N, F))


# ----------------------------------------------------------- training steps
class _Net(torch.nn.Module):
    def __init__(self, conv1, conv2):
        super().__init__()
        self.conv1, self.conv2 = conv1, conv2

    def forward(self, x, ei):
        return self.conv2(self.conv1(x, ei).relu(), ei)


def _models():
    return {
        "gcn": lambda: _Net(ft.GCNConv(F, 16), ft.GCNConv(16, 5)),
        "sage-max": lambda: _Net(ft.SAGEConv(F, 16, aggr="max"), ft.SAGEConv(16, 5, aggr="max")),
        "gatv2": lambda: _Net(ft.GATv2Conv(F, 8, heads=2), ft.GATv2Conv(16, 5)),
        "transformer": lambda: _Net(ft.TransformerConv(F, 8, heads=2),
                                    ft.TransformerConv(16, 5)),
    }


def _train_step(model, opt, x, ei, y, before_step=None, set_to_none=False):
    """One training step (forward, cross-entropy, backward, optimizer) -> its
    loss. Gradients are zeroed in place (a captured step's static buffers)
    or dropped (set_to_none: CUDA graph trees, whose outputs the next replay
    overwrites)."""
    def step():
        if before_step is not None:
            before_step()
        opt.zero_grad(set_to_none=set_to_none)
        loss = torch.nn.functional.cross_entropy(model(x, ei), y)
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def _losses(model, x, ei, y, steps, before_step=None, set_to_none=False):
    step = _train_step(model, torch.optim.Adam(model.parameters(), lr=0.01), x, ei, y,
                       before_step, set_to_none)
    return torch.stack([step().clone() for _ in range(steps)])


@pytest.mark.parametrize("kind", ["gcn", "sage-max", "gatv2"])
def test_compiled_training_matches_eager(kind, seed):
    """A compiled model (Inductor for the GCN, aot_eager for the others)
    trains to the same losses as the eager one from the same weights."""
    ei, x = _graph(seed), torch.randn(N, F)
    y = torch.randint(0, 5, (N,))
    eager = _models()[kind]()
    compiled = _models()[kind]()
    compiled.load_state_dict(eager.state_dict())
    backend = "inductor" if kind == "gcn" else "aot_eager"
    want = _losses(eager, x, ei, y, 4)
    got = _losses(torch.compile(compiled, fullgraph=True, backend=backend), x, ei, y, 4)
    _close(got, want, rtol=1e-4, atol=1e-5)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["gcn", "sage-max", "gatv2"])
def test_cuda_graph_training_step_replays_eager_losses(kind, seed):
    """A whole training step (forward, backward, Adam) captured in a CUDA
    graph after one eager warm-up step, replayed: the same losses as eager."""
    dev = "cuda"
    ei, x = _graph(seed, dev), torch.randn(N, F, device=dev)
    y = torch.randint(0, 5, (N,), device=dev)
    eager = _models()[kind]().to(dev)
    captured = _models()[kind]().to(dev)
    captured.load_state_dict(eager.state_dict())
    want = _losses(eager, x, ei, y, 6)

    opt = torch.optim.Adam(captured.parameters(), lr=0.01, capturable=True)
    step = _train_step(captured, opt, x, ei, y)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        first = step().clone()             # warm-up: builds every graph cache
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step()
    losses = [first]
    for _ in range(5):
        graph.replay()
        losses.append(static_loss.clone())
    _close(torch.stack(losses), want, rtol=1e-4, atol=1e-5)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["gcn", "sage-max", "gatv2", "transformer"])
def test_reduce_overhead_training_matches_eager(kind, seed):
    dev = "cuda"
    ei, x = _graph(seed, dev), torch.randn(N, F, device=dev)
    y = torch.randint(0, 5, (N,), device=dev)
    eager = _models()[kind]().to(dev)
    compiled = _models()[kind]().to(dev)
    compiled.load_state_dict(eager.state_dict())
    want = _losses(eager, x, ei, y, 6)
    ft.warm_up(compiled, x, ei)               # caches built outside the trees' pool
    torch._dynamo.mark_static_address(ei)     # not copied into the trees' static inputs
    got = _losses(torch.compile(compiled, mode="reduce-overhead", fullgraph=True), x, ei, y, 6,
                  before_step=torch.compiler.cudagraph_mark_step_begin, set_to_none=True)
    _close(got, want, rtol=1e-4, atol=1e-5)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["GCNConv", "SAGEConv-max", "GATConv", "GATv2Conv", "TransformerConv"])
def test_layer_compiles_on_gpu(name, seed):
    layer = LAYERS[name]().cuda()
    ei, x = _graph(seed, "cuda"), _tensor(N, F, device="cuda")
    _assert_compiled_matches(lambda x: layer(x, ei), (x,), tuple(layer.parameters()),
                             backend="inductor", rtol=1e-4, atol=1e-5)


def test_static_arguments_are_plain_json():
    """The static string is sorted JSON (what Dynamo folds as a constant)."""
    s = custom_ops._encode((("b", [1, None]), ("a", 1), ("c", "x")))
    assert s == '{"a": 1, "b": [1, null], "c": "x"}'


# -------------------------------------------- graphs that change every step
STEPS = 20


def _changing_batches(seed, steps=STEPS, device="cpu"):
    """`steps` mini-batches as PyG's DataLoader makes them from small graphs
    (a NeighborLoader's sampled subgraphs look the same to a layer): new
    tensors every step, 3 to 7 graphs of 8 to 30 nodes each, numbered one
    after the other, each with empty rows, self-loops, duplicate edges and a
    hub. Yields (edge_index [2, E], batch [N], num_graphs). Every N is above
    the feature widths here (Dynamo would give equal sizes of the first call
    one symbol)."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        sizes = rng.integers(8, 31, int(rng.integers(3, 8)))
        parts, start = [], 0
        for n in sizes:
            ei = awkward_edge_index(int(n), int(rng.integers(n, 4 * n)),
                                    seed=int(rng.integers(2**31)))
            parts.append(torch.from_numpy(ei) + start)
            start += int(n)
        batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.from_numpy(sizes))
        yield torch.cat(parts, dim=1).to(device), batch.to(device), len(sizes)


def _layer_call(layer):
    """layer as fn(x, edge_index, edge_attr), edge_attr [E, 5] when it takes one."""
    uses_edges = getattr(layer, "lin_edge", None) is not None

    def fn(x, ei, edge_attr):
        return layer(x, ei, edge_attr) if uses_edges else layer(x, ei)
    return fn, uses_edges


def _quick(names, quick):
    """names as parameters, those not in `quick` marked slow (20 new graphs
    cost seconds per case on the CPU, most of it fastgnn's eager steps)."""
    return [n if n in quick else pytest.param(n, marks=pytest.mark.slow) for n in names]


# GCNConv(cached=True) keeps the first graph's normalisation: it is for a graph
# that does not change. The quick ones: a normalised SpMM, a reduction with a
# fused linear, attention with PyG's self-loops and their edge features
# (sizes known only to the data).
CHANGING_GRAPH_LAYERS = _quick(sorted(set(LAYERS) - {"GCNConv-cached"}),
                               {"GCNConv", "SAGEConv-max", "GATConv-edge"})


@pytest.mark.parametrize("name", CHANGING_GRAPH_LAYERS)
def test_layer_compiles_once_for_changing_graphs(name, seed):
    """torch.compile(dynamic=True, fullgraph=True) of every layer over 20
    mini-batches with other node and edge counts: one compile (no
    recompile, no graph break), and on each batch the outputs and every
    gradient (x, edge_attr, parameters) equal eager's."""
    layer = LAYERS[name]()
    fn, uses_edges = _layer_call(layer)
    compiled = torch.compile(fn, dynamic=True, fullgraph=True, backend="aot_eager")
    params = tuple(layer.parameters())
    for ei, batch, _ in _changing_batches(seed):
        x = _tensor(batch.shape[0], F)
        edge_attr = _tensor(ei.shape[1], 5) if uses_edges else None
        want = _run(fn, (x, ei, edge_attr), params)
        _assert_same_run(_run(compiled, (x, ei, edge_attr), params), want, rtol=1e-4,
                         atol=1e-5)
    assert _compiles() == 1


@pytest.mark.parametrize("name", _quick(["GCNConv", "SAGEConv-max", "GATConv-edge"],
                                        {"GCNConv"}))
def test_mark_dynamic_compiles_once_for_changing_graphs(name, seed):
    """The same with torch._dynamo.mark_dynamic on the node and edge
    dimensions instead of dynamic=True: one compile over 20 batches, the
    outputs of eager."""
    layer = LAYERS[name]()
    fn, uses_edges = _layer_call(layer)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    for ei, batch, _ in _changing_batches(seed):
        x = _tensor(batch.shape[0], F)
        edge_attr = _tensor(ei.shape[1], 5) if uses_edges else None
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(ei, 1)
        if uses_edges:
            torch._dynamo.mark_dynamic(edge_attr, 0)
        _close(compiled(x, ei, edge_attr), fn(x, ei, edge_attr), rtol=1e-4, atol=1e-5)
    assert _compiles() == 1


class _GraphClassifier(torch.nn.Module):
    """Two convolutions, a mean over each graph's nodes (global_mean_pool,
    by fastgnn's MeanAggregation or PyG's own) and a linear head."""

    def __init__(self, conv1, conv2, pool="fastgnn"):
        super().__init__()
        self.conv1, self.conv2 = conv1, conv2
        self.head = torch.nn.Linear(16, 3)
        self.pool = pool
        self.mean = ft.MeanAggregation()

    def forward(self, x, ei, batch, num_graphs):
        h = self.conv2(self.conv1(x, ei).relu(), ei).relu()
        if self.pool == "pyg":
            from torch_geometric.nn import global_mean_pool
            h = global_mean_pool(h, batch, size=num_graphs)
        else:
            h = self.mean(h, batch, dim_size=num_graphs)
        return self.head(h)


def _classifiers():
    return {
        "gcn": lambda: _GraphClassifier(ft.GCNConv(F, 16), ft.GCNConv(16, 16)),
        "sage-max-pyg-pool": lambda: _GraphClassifier(ft.SAGEConv(F, 16, aggr="max"),
                                                      ft.SAGEConv(16, 16, aggr="max"),
                                                      pool="pyg"),
        "gin": lambda: _GraphClassifier(ft.GINConv(torch.nn.Linear(F, 16)),
                                        ft.GINConv(torch.nn.Linear(16, 16), train_eps=True)),
        "gat": lambda: _GraphClassifier(ft.GATConv(F, 8, heads=2), ft.GATConv(16, 8, heads=2)),
    }


def _labelled_batches(seed, steps=STEPS, device="cpu"):
    """`_changing_batches` with features and graph labels:
    [(x [N, F], edge_index, batch, num_graphs, y [num_graphs])]."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for ei, batch, num_graphs in _changing_batches(seed, steps, device):
        x = torch.randn(batch.shape[0], F, generator=gen).to(device)
        y = torch.randint(0, 3, (num_graphs,), generator=gen).to(device)
        out.append((x, ei, batch, num_graphs, y))
    return out


def _training_losses(model, batches, compile_fn=None, before_step=None):
    """Losses of training steps (forward, pooling, cross-entropy over the
    graphs, backward, Adam), one per batch; compile_fn wraps the loss
    function (None: eager). Adam's step sees the same parameter shapes
    every step, whatever the graph."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def loss_fn(x, ei, batch, num_graphs, y):
        return torch.nn.functional.cross_entropy(model(x, ei, batch, num_graphs), y)
    if compile_fn is not None:
        loss_fn = compile_fn(loss_fn)
    losses = []
    for inputs in batches:
        if before_step is not None:
            before_step()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(*inputs)
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    return torch.stack(losses)


@pytest.mark.parametrize("kind, backend", [
    ("gcn", "inductor"),
    *(pytest.param(k, "aot_eager", marks=pytest.mark.slow)
      for k in ("gcn", "sage-max-pyg-pool", "gin", "gat")),
])
def test_training_on_changing_graphs_compiles_once(kind, backend, seed):
    """20 training steps of a graph classifier on new batches: the loss
    function (forward, pooling over the batch vector, loss; its backward is
    compiled with it) compiles once, and the losses equal eager training
    from the same weights."""
    eager = _classifiers()[kind]()
    compiled = _classifiers()[kind]()
    compiled.load_state_dict(eager.state_dict())
    batches = _labelled_batches(seed)
    got = _training_losses(compiled, batches, lambda f: torch.compile(
        f, dynamic=True, fullgraph=True, backend=backend))
    _close(got, _training_losses(eager, batches), rtol=1e-4, atol=1e-5)
    assert _compiles() == 1


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["gcn", "gat"])
def test_reduce_overhead_across_graph_sizes_matches_eager(kind, seed):
    """mode="reduce-overhead" with dynamic=True over three batches of other
    sizes, in turn (buckets: each a fixed edge_index and batch vector,
    warmed up and marked as static addresses): one compile, a CUDA graph
    recorded per size and replayed after, and the losses of eager
    training."""
    dev = "cuda"
    buckets = _labelled_batches(seed, 3, dev)
    eager = _classifiers()[kind]().to(dev)
    compiled = _classifiers()[kind]().to(dev)
    compiled.load_state_dict(eager.state_dict())
    for x, ei, batch, num_graphs, _ in buckets:
        ft.warm_up(compiled, x, ei, batch, num_graphs)   # caches built outside the trees' pool
        torch._dynamo.mark_static_address(ei)
        torch._dynamo.mark_static_address(batch)
    batches = buckets * 3
    want = _training_losses(eager, batches)
    got = _training_losses(compiled, batches, lambda f: torch.compile(
        f, mode="reduce-overhead", dynamic=True, fullgraph=True),
        before_step=torch.compiler.cudagraph_mark_step_begin)
    _close(got, want, rtol=1e-4, atol=1e-5)
    assert _compiles() == 1
