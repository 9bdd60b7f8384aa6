"""fastgnn.torch attention: `edge_softmax` / `edge_attention` on torch tensors
and the drop-in GATConv, GATv2Conv and TransformerConv. Each layer loads a
PyG 2.8 layer's state_dict (strict=True) and must give the same output,
attention weights (indices and values) and EVERY gradient (inputs, edge
features, all parameters) under a random cotangent, in eval mode; dropout in
training mode must be reproducible under torch.manual_seed and unbiased."""
import warnings

import numpy as np
import pytest
import torch
import torch_geometric.nn as pyg
from torch_geometric.utils import softmax as pyg_softmax

import fastgnn
import fastgnn.torch as ft
from fastgnn import rng
from fastgnn.testing import TOLERANCES, assert_results_match, awkward_edge_index, rel_err
from fastgnn.torch.attention import draw_seed

warnings.filterwarnings("ignore", message=".*[Ss]parse.*")

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not (fastgnn.gpu_available() and torch.cuda.is_available()),
                               reason="needs a CUDA device visible to CuPy and torch")

N = 61          # targets (the last tenth have no in-edges; node 0 is a hub)
NS = 37         # sources of the bipartite graphs
F_IN, F_DST, D_E = 6, 4, 3


# ------------------------------------------------------------------ inputs
def _graph(seed, form):
    """(x for the layer, edge_index, edge_attr [E, D_E]) for an input form:
    square: x [N, F_IN];  bipartite: (x_src [NS, F_IN], x_dst [N, F_DST]);
    pair: (x_src [NS, F_IN], x_dst [N, F_IN]) for an int in_channels;
    dst_none: (x_src [NS, F_IN], None) with targets < NS."""
    r = np.random.default_rng(seed)
    bip = form != "square"
    ei = awkward_edge_index(N, 4 * N, seed=seed, num_src=NS if bip else None)
    if form == "dst_none":
        ei = ei[:, ei[1] < NS]
    ei = torch.from_numpy(ei)
    ea = torch.from_numpy(r.standard_normal((ei.shape[1], D_E)))
    if form == "square":
        x = torch.from_numpy(r.standard_normal((N, F_IN)))
    else:
        xs = torch.from_numpy(r.standard_normal((NS, F_IN)))
        xd = torch.from_numpy(r.standard_normal((N, F_DST if form == "bipartite" else F_IN)))
        x = (xs, None if form == "dst_none" else xd)
    return x, ei, ea


def _in_channels(form, lazy=False):
    if lazy:
        return -1
    return (F_IN, F_DST) if form == "bipartite" else F_IN


def _leaf(t, device, dtype):
    return t.detach().to(device=device, dtype=dtype).clone().requires_grad_(True)


def _cot(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _run(layer, x, ei, ea, device, dtype, kw):
    """Output, returned attention (edge_index, alpha) and every gradient of
    `layer` under random cotangents on the output and on alpha, as CPU float64."""
    xs = x if isinstance(x, tuple) else (x,)
    leaves = tuple(None if t is None else _leaf(t, device, dtype) for t in xs)
    ea_l = None if ea is None else _leaf(ea, device, dtype)
    xin = leaves if isinstance(x, tuple) else leaves[0]
    got = layer(xin, ei.to(device), edge_attr=ea_l, **kw)
    out, att = (got if isinstance(got, tuple) else (got, None))
    assert out.device.type == device and out.dtype == dtype
    loss = (out * _cot(out.shape, 1).to(device, dtype)).sum()
    res = {"output": out.detach().cpu().double()}
    if att is not None:
        ei_ret, alpha = att
        assert alpha.dtype == dtype
        assert ei_ret.layout == ei.layout
        if ei_ret.layout != torch.strided and ei_ret.values().dim() == 2:
            assert torch.equal(ei_ret.values(), alpha)      # GAT layers' weights as an adj_t
        res["edge_index"] = _structure(ei_ret.detach().cpu())
        res["alpha"] = alpha.detach().cpu().double()
        loss = loss + (alpha * _cot(alpha.shape, 2).to(device, dtype)).sum()
    loss.backward()
    host = (lambda t: None if t is None else t.detach().cpu().double())
    for i, t in enumerate(leaves):
        if t is not None:
            res[f"grad x[{i}]"] = host(t.grad)
    if ea_l is not None:
        res["grad edge_attr"] = host(ea_l.grad)
    for name, p in layer.named_parameters():
        res[f"grad {name}"] = host(p.grad)
    return res


def _structure(adj):
    """An edge_index as is; a sparse adj_t's index tensors (compressed and
    plain) as one tensor, in storage order."""
    if adj.layout == torch.sparse_coo:
        return adj.indices()
    if adj.layout == torch.sparse_csr:
        return torch.cat([adj.crow_indices(), adj.col_indices()])
    if adj.layout == torch.sparse_csc:
        return torch.cat([adj.ccol_indices(), adj.row_indices()])
    return adj


def _grad_scale(res):
    """The largest gradient norm of a run (what rounding noise is measured against)."""
    return max([float(t.norm()) for k, t in res.items() if k.startswith("grad ")
                and t is not None] + [1e-300])


def assert_every_parameter_trained(ours, ref):
    """Fails if a parameter's gradient is None or zero where PyG's is not
    (a parameter detached somewhere in the layer; PyG gradients that are zero
    up to rounding are skipped)."""
    scale = _grad_scale(ref)
    for key, r in ref.items():
        if key.startswith("grad ") and r is not None and r.norm() > 1e-9 * scale:
            o = ours.get(key)
            assert o is not None, f"{key}: no gradient (detached?), PyG has one"
            assert o.abs().sum() > 0, f"{key}: zero gradient (detached?), PyG's is nonzero"


def compare(ref_layer, our_layer, x, ei, ea=None, *, kw=None, dtype=torch.float64,
            device="cpu", vtype=None, baseline=False):
    """Load PyG's state_dict into ours (strict=True), run both in eval mode (PyG
    on CPU in float64 on the same rounded parameters and inputs) and compare
    everything. With baseline, PyG also runs on `device` in `dtype` and ours may
    be off by up to twice PyG's own error when that exceeds the tolerance."""
    kw = kw or {}
    vtype = vtype or ("float64" if dtype == torch.float64 else "float32")
    ref_layer = ref_layer.double().eval()
    our_layer.load_state_dict(ref_layer.state_dict(), strict=True)
    assert set(our_layer.state_dict()) == set(ref_layer.state_dict())
    our_layer = our_layer.to(device=device, dtype=dtype).eval()
    ref_layer.load_state_dict({k: v.to(dtype).double()
                               for k, v in our_layer.state_dict().items()})
    rnd = (lambda t: None if t is None else t.to(dtype).double())
    x = tuple(rnd(t) for t in x) if isinstance(x, tuple) else rnd(x)
    ea = rnd(ea)
    base = None
    if baseline:
        import copy
        try:
            base = _run(copy.deepcopy(ref_layer).to(device, dtype), x, ei, ea, device, dtype, kw)
        except (RuntimeError, NotImplementedError):
            base = None
    ref = _run(ref_layer, x, ei, ea, "cpu", torch.float64, kw)
    ours = _run(our_layer, x, ei, ea, device, dtype, kw)
    if "edge_index" in ref:
        assert "edge_index" in ours
        assert torch.equal(ours["edge_index"], ref["edge_index"].to(ours["edge_index"].dtype)), \
            "returned edge_index differs from PyG's"
    # gradients zero in exact arithmetic (TransformerConv's lin_key.bias: a
    # shift of every key shifts all scores of a target alike) are compared as
    # rounding noise against the largest gradient
    assert_results_match(ours, ref, vtype, base, noise_scale=_grad_scale(ref),
                         skip=("edge_index",))
    assert_every_parameter_trained(ours, ref)
    return ours, ref


def _id(case):
    return "-".join(f"{k}={v}" for k, v in case.items()).replace(" ", "")


# ------------------------------------------------------------------ GATConv
# every option at least once, and the combinations that interact: self-loops
# (PyG's string fill_value scatters over all targets, so it fails on bipartite
# graphs whose targets outnumber min(num_src, num_dst): those use a number)
# with edge features and each fill_value, bipartite with residual and loops,
# concat=False with several heads, x_dst=None (with and without size)
GAT_CASES = [
    dict(form="square"),
    dict(form="square", heads=3, negative_slope=0.05, dropout=0.3, attn=True),
    dict(form="square", heads=2, concat=False, residual=True, bias=False),
    dict(form="square", heads=3, edge_dim=D_E, attn=True),
    dict(form="square", heads=2, edge_dim=D_E, fill_value="add"),
    dict(form="square", edge_dim=D_E, fill_value="max", concat=False, heads=2),
    dict(form="square", heads=2, edge_dim=D_E, fill_value="min", residual=True),
    dict(form="square", edge_dim=D_E, fill_value="mul"),
    dict(form="square", heads=2, edge_dim=D_E, fill_value=0.5, attn=True),
    dict(form="square", edge_dim=D_E, fill_value="tensor"),
    dict(form="square", heads=2, edge_dim=D_E, fill_value=None),
    dict(form="square", heads=2, edge_dim=1, fill_value="mean", flat_attr=True),
    dict(form="square", heads=3, add_self_loops=False, edge_dim=D_E, attn=True),
    dict(form="square", add_self_loops=False, attn=True, edge_attr_unused=True),
    dict(form="bipartite", heads=3, residual=True, attn=True),
    dict(form="bipartite", heads=2, add_self_loops=False, edge_dim=D_E, concat=False),
    dict(form="pair", heads=2, edge_dim=D_E, fill_value=0.5, residual=True),
    dict(form="dst_none", heads=2, residual=True, attn=True),
    dict(form="dst_none", heads=2, size=True),
    dict(form="square", heads=2, edge_index_type=True, attn=True),
    dict(form="square", heads=2, lazy=True, residual=True),
    dict(form="square", heads=2, adj_t="csr", attn=True),
    dict(form="square", heads=2, adj_t="coo", residual=True, attn=True),
    dict(form="square", heads=2, adj_t="csr", add_self_loops=False, edge_dim=D_E, attn=True),
    # (PyG's loops on a bipartite adj_t fill their values over all targets: it fails)
    dict(form="bipartite", heads=2, adj_t="coo", add_self_loops=False, residual=True, attn=True),
    dict(form="dst_none", heads=2, adj_t="csr", attn=True),
]
_LAYER_KEYS = ("heads", "concat", "negative_slope", "dropout", "add_self_loops", "edge_dim",
               "fill_value", "bias", "residual", "share_weights", "beta", "root_weight")


def _layer_args(case):
    args = {k: case[k] for k in _LAYER_KEYS if k in case}
    if args.get("fill_value") == "tensor":
        args["fill_value"] = torch.tensor([0.1, -0.2, 0.3], dtype=torch.float64)
    return args


def _case_inputs(case, seed):
    x, ei, ea = _graph(seed, case["form"])
    if case.get("flat_attr"):
        ea = ea[:, 0]
    use_attr = case.get("edge_dim") is not None or case.get("edge_attr_unused")
    kw = {}
    if case.get("attn"):
        kw["return_attention_weights"] = True
    if case.get("size"):
        kw["size"] = (NS, NS)
    if case.get("edge_index_type"):
        from torch_geometric import EdgeIndex
        n = int(x.shape[0]) if isinstance(x, torch.Tensor) else N
        ei = EdgeIndex(ei, sparse_size=(n, n))
    if case.get("adj_t"):       # PyG's adj_t [targets, sources]; edge_attr in its storage order
        n_src = N if case["form"] == "square" else NS
        n_dst = NS if case["form"] == "dst_none" else N
        coo = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1], dtype=torch.float64),
                                      (n_dst, n_src)).coalesce()
        ei = {"coo": coo, "csr": coo.to_sparse_csr(), "csc": coo.to_sparse_csc()}[case["adj_t"]]
        ea = ea[:coo._nnz()]
    return x, ei, (ea if use_attr else None), kw


def _lazy_warmup(ref, ours, x, ei, ea, kw):
    """Materialise lazy (-1) weights by one forward of each layer."""
    kw = {k: v for k, v in kw.items() if k != "return_attention_weights"}
    f32 = (lambda t: None if t is None else t.float())
    x = tuple(f32(t) for t in x) if isinstance(x, tuple) else f32(x)
    ref(x, ei, edge_attr=f32(ea), **kw)
    ours(x, ei, edge_attr=f32(ea), **kw)


@pytest.mark.parametrize("case", GAT_CASES, ids=_id)
def test_gat_matches_pyg(case):
    x, ei, ea, kw = _case_inputs(case, 11)
    torch.manual_seed(0)
    inc = _in_channels(case["form"], case.get("lazy"))
    ref, ours = pyg.GATConv(inc, 5, **_layer_args(case)), ft.GATConv(inc, 5, **_layer_args(case))
    if case.get("lazy"):
        _lazy_warmup(ref, ours, x, ei, ea, kw)
    compare(ref, ours, x, ei, ea, kw=kw)


@pytest.mark.parametrize("device,dtype", [
    ("cpu", torch.float64), ("cpu", torch.float32),
    pytest.param("cuda", torch.float32, marks=[gpu, needs_gpu]),
    pytest.param("cuda", torch.bfloat16, marks=[gpu, needs_gpu])])
@pytest.mark.parametrize("tf32", [False, True])
def test_head_logits_equal_the_elementwise_form(device, dtype, tf32, set_tf32):
    """GATConv's per-head logits (x * att).sum(-1) as one block-diagonal GEMM
    (attention._head_logits): values and the gradients of x and of every att
    equal the elementwise form's, in float64, for odd H and C and one, two
    atts; with TF32 allowed the fp32 CUDA path is the elementwise form itself."""
    from fastgnn.torch.attention import _head_logits
    set_tf32(tf32)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(37, 3, 5, generator=gen, dtype=torch.float64)
    atts = [torch.randn(1, 3, 5, generator=gen, dtype=torch.float64) for _ in range(2)]
    cot = torch.randn(37, 3, generator=gen, dtype=torch.float64)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5 if dtype == torch.float32 else 1e-12
    for k in (1, 2):
        xs = x.to(device, dtype).requires_grad_()
        ats = [a.to(device, dtype).requires_grad_() for a in atts[:k]]
        got = _head_logits(xs, *ats)
        assert len(got) == k and all(g.shape == (37, 3) and g.dtype == dtype for g in got)
        grads = torch.autograd.grad(sum((g * cot.to(device, dtype)).sum() for g in got),
                                    [xs, *ats])
        xd = x.clone().requires_grad_()
        ad = [a.clone().requires_grad_() for a in atts[:k]]
        want = [(xd * a).sum(-1) for a in ad]
        wgrads = torch.autograd.grad(sum((w * cot).sum() for w in want), [xd, *ad])
        for g, w in zip((*got, *grads), (*want, *wgrads)):
            assert rel_err(g.double().cpu().detach().numpy(), w.detach().numpy()) < tol


# ---------------------------------------------------------------- GATv2Conv
GATV2_CASES = [
    dict(form="square"),
    dict(form="square", heads=3, negative_slope=0.05, dropout=0.3, attn=True),
    dict(form="square", heads=2, share_weights=True, attn=True),
    dict(form="square", heads=2, concat=False, residual=True, bias=False),
    dict(form="square", heads=3, edge_dim=D_E, attn=True),
    dict(form="square", heads=2, edge_dim=D_E, fill_value="add", share_weights=True),
    dict(form="square", edge_dim=D_E, fill_value="max"),
    dict(form="square", heads=2, edge_dim=D_E, fill_value="tensor", residual=True),
    dict(form="square", heads=2, edge_dim=D_E, fill_value=-0.25, concat=False),
    dict(form="square", heads=2, edge_dim=1, flat_attr=True),
    dict(form="square", heads=2, add_self_loops=False, edge_dim=D_E, attn=True),
    dict(form="bipartite", heads=3, residual=True, attn=True),
    dict(form="bipartite", heads=2, add_self_loops=False, edge_dim=D_E, bias=False),
    dict(form="pair", heads=2, share_weights=True, edge_dim=D_E, fill_value=0.7),
    dict(form="square", heads=2, edge_index_type=True, attn=True),
    dict(form="square", heads=2, adj_t="csr", share_weights=True, attn=True),
    dict(form="square", heads=2, adj_t="coo", residual=True),
    dict(form="bipartite", heads=2, adj_t="coo", add_self_loops=False, edge_dim=D_E, attn=True),
]


@pytest.mark.parametrize("case", GATV2_CASES, ids=_id)
def test_gatv2_matches_pyg(case):
    x, ei, ea, kw = _case_inputs(case, 12)
    torch.manual_seed(0)
    inc = _in_channels(case["form"])
    ref = pyg.GATv2Conv(inc, 5, **_layer_args(case))
    ours = ft.GATv2Conv(inc, 5, **_layer_args(case))
    compare(ref, ours, x, ei, ea, kw=kw)


# ---------------------------------------------------------- TransformerConv
TRANSFORMER_CASES = [
    dict(form="square"),
    dict(form="square", heads=3, dropout=0.3, attn=True),
    dict(form="square", heads=2, beta=True, attn=True),
    dict(form="square", heads=3, concat=False, beta=True, edge_dim=D_E),
    dict(form="square", heads=2, root_weight=False, beta=True, edge_dim=D_E, attn=True),
    dict(form="square", heads=2, concat=False, bias=False),
    dict(form="square", heads=3, edge_dim=D_E, attn_false=True),
    dict(form="bipartite", heads=3, edge_dim=D_E, beta=True, attn=True),
    dict(form="bipartite", heads=2, root_weight=False, concat=False),
    dict(form="pair", heads=2, bias=False, beta=True),
    dict(form="square", heads=2, edge_index_type=True, attn=True),
    dict(form="square", heads=2, lazy=True, edge_dim=D_E),
    dict(form="square", heads=2, adj_t="csr", beta=True, attn=True),
    dict(form="bipartite", heads=2, adj_t="coo", edge_dim=D_E, attn=True),
    dict(form="square", heads=2, flow="target_to_source", attn=True),
    dict(form="bipartite", heads=2, flow="target_to_source", edge_dim=D_E, beta=True, attn=True),
]


@pytest.mark.parametrize("case", TRANSFORMER_CASES, ids=_id)
def test_transformer_matches_pyg(case):
    x, ei, ea, kw = _case_inputs(case, 13)
    if case.get("attn_false"):   # PyG returns the weights for any bool, False included
        kw["return_attention_weights"] = False
    torch.manual_seed(0)
    inc = _in_channels(case["form"], case.get("lazy"))
    ref = pyg.TransformerConv(inc, 5, **_layer_args(case))
    ours = ft.TransformerConv(inc, 5, **_layer_args(case))
    if case.get("flow"):        # set after construction, as PyG allows; targets then in row 0
        ref.flow = ours.flow = case["flow"]
        ei = ei.flip(0)
    if case.get("lazy"):
        _lazy_warmup(ref, ours, x, ei, ea, kw)
    got, _ = compare(ref, ours, x, ei, ea, kw=kw)
    assert ("alpha" in got) == ("return_attention_weights" in kw)


# ------------------------------------------------------------- float32
FLOAT32_LAYERS = [
    ("gat", lambda m: m.GATConv((F_IN, F_DST), 7, heads=4, edge_dim=D_E, residual=True,
                                      fill_value=0.5)),
    ("gatv2", lambda m: m.GATv2Conv((F_IN, F_DST), 7, heads=4, edge_dim=D_E, residual=True,
                                          fill_value=0.5)),
    ("transformer", lambda m: m.TransformerConv((F_IN, F_DST), 7, heads=4, edge_dim=D_E,
                                               beta=True)),
]


@pytest.mark.parametrize("name,make", FLOAT32_LAYERS, ids=[c[0] for c in FLOAT32_LAYERS])
def test_layers_float32_match_pyg_float64(name, make):
    x, ei, ea = _graph(14, "bipartite")
    torch.manual_seed(0)
    # float32 kernels (float32 accumulation, float32 log-sum-exp) against
    # PyG in float64 on the same rounded inputs
    compare(make(pyg), make(ft), x, ei, ea, kw={"return_attention_weights": True},
            dtype=torch.float32, vtype="float32")


# ------------------------------------------------------- detached parameter
def test_a_detached_parameter_is_caught():
    """The gradient comparison has teeth: a layer that detaches one parameter
    (here att_src, as turbo-gnn's layer does with its attention vector) fails."""
    x, ei, _ = _graph(15, "square")

    class Detached(ft.GATConv):
        def forward(self, *args, **kw):
            att = self.att_src
            try:
                self.att_src = torch.nn.Parameter(att.detach(), requires_grad=False)
                return super().forward(*args, **kw)
            finally:
                self.att_src = att
    torch.manual_seed(0)
    with pytest.raises(AssertionError, match="att_src"):
        compare(pyg.GATConv(F_IN, 5, heads=2), Detached(F_IN, 5, heads=2), x, ei)
    # and the check alone reports a zero gradient where PyG's is not
    with pytest.raises(AssertionError, match="zero gradient"):
        assert_every_parameter_trained({"grad w": torch.zeros(3)}, {"grad w": torch.ones(3)})
    with pytest.raises(AssertionError, match="no gradient"):
        assert_every_parameter_trained({"grad w": None}, {"grad w": torch.ones(3)})


# ------------------------------------------------------------------ dropout
DROP_LAYERS = [
    ("gat", lambda: ft.GATConv(F_IN, 4, heads=3, dropout=0.4, edge_dim=D_E)),
    ("gatv2", lambda: ft.GATv2Conv(F_IN, 4, heads=3, dropout=0.4, edge_dim=D_E)),
    ("transformer", lambda: ft.TransformerConv(F_IN, 4, heads=3, dropout=0.4, edge_dim=D_E)),
]


def _grads(layer, x, ei, ea):
    xl = x.clone().requires_grad_()
    out = layer(xl, ei, edge_attr=ea)
    (out * _cot(out.shape, 3).to(out)).sum().backward()
    g = [xl.grad] + [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    return out.detach(), g


@pytest.mark.parametrize("name,make", DROP_LAYERS, ids=[c[0] for c in DROP_LAYERS])
def test_dropout_reproducible_under_manual_seed(name, make):
    x, ei, ea = _graph(16, "square")
    torch.manual_seed(0)
    layer = make().double().train()
    torch.manual_seed(123)
    out1, g1 = _grads(layer, x, ei, ea)
    torch.manual_seed(123)
    out2, g2 = _grads(layer, x, ei, ea)
    assert torch.equal(out1, out2)
    assert all(torch.equal(a, b) for a, b in zip(g1, g2))
    out3, _ = _grads(layer, x, ei, ea)          # the generator moved on: a new mask
    assert not torch.equal(out1, out3)
    layer.eval()
    torch.manual_seed(123)
    out_eval = layer(x, ei, edge_attr=ea)
    assert not torch.equal(out1, out_eval)       # dropout is off in eval mode
    assert torch.equal(out_eval, layer(x, ei, edge_attr=ea))


@pytest.mark.parametrize("name,make", DROP_LAYERS, ids=[c[0] for c in DROP_LAYERS])
def test_dropout_expected_value(name, make):
    """Kept weights are scaled by 1/(1-p), so the output (linear in the weights
    here: no beta gating) averages to the eval output. Bound: 6 standard
    errors per entry, the standard error estimated from the samples."""
    x, ei, ea = _graph(17, "square")
    torch.manual_seed(0)
    layer = make().double()
    with torch.no_grad():
        want = layer.eval()(x, ei, edge_attr=ea)
        layer.train()
        torch.manual_seed(1)
        runs = torch.stack([layer(x, ei, edge_attr=ea) for _ in range(300)])
    mean, se = runs.mean(0), runs.std(0) / np.sqrt(runs.shape[0])
    assert ((mean - want).abs() <= 6 * se + 1e-9).all()
    assert (se > 0).any()
    # and not trivially: individual runs differ from the eval output
    assert (runs[0] - want).abs().max() > 1e-3


def test_gat_training_weights_are_the_dropped_ones():
    """In training mode GATConv returns alpha after dropout (as PyG) and the
    output is exactly the aggregation with those weights; the mask is the
    counter-based one of the seed drawn from torch's generator. TransformerConv
    returns the weights before dropout (as PyG)."""
    x, ei, _ = _graph(18, "square")
    torch.manual_seed(0)
    p, H, C = 0.5, 2, 3
    gat = ft.GATConv(F_IN, C, heads=H, dropout=p).double()
    with torch.no_grad():
        _, (ei2, alpha_eval) = gat.eval()(x, ei, return_attention_weights=True)
        gat.train()
        torch.manual_seed(5)
        out, (ei2b, alpha) = gat(x, ei, return_attention_weights=True)
        torch.manual_seed(5)
        seed = draw_seed()
        keep = torch.from_numpy(rng.keep_mask(seed, 0, ei2.shape[1], H, p))
        assert torch.equal(ei2, ei2b)
        assert torch.allclose(alpha, alpha_eval * keep / (1 - p), rtol=1e-12, atol=0)
        assert 0.35 < 1 - keep.double().mean() < 0.65
        v = gat.lin(x).view(-1, H, C)
        agg = torch.zeros(N, H, C, dtype=x.dtype).index_add_(0, ei2[1], alpha[..., None] *
                                                              v[ei2[0]])
        assert torch.allclose(out, agg.view(N, H * C) + gat.bias, rtol=1e-10, atol=1e-12)
    tr = ft.TransformerConv(F_IN, C, heads=H, dropout=p).double()
    with torch.no_grad():
        _, (_, a_eval) = tr.eval()(x, ei, return_attention_weights=True)
        _, (_, a_train) = tr.train()(x, ei, return_attention_weights=True)
    assert torch.allclose(a_eval, a_train, rtol=1e-12, atol=0)


# --------------------------------------------------------------- functional
def test_edge_softmax_matches_pyg_and_core():
    ei = torch.from_numpy(awkward_edge_index(N, 5 * N, seed=19))
    s = torch.randn(ei.shape[1], 3, dtype=torch.float64, requires_grad=True)
    s_ref = s.detach().clone().requires_grad_()
    cot = _cot(s.shape, 4)
    out = ft.edge_softmax(ei, s, N)
    ref = pyg_softmax(s_ref, ei[1], num_nodes=N)
    (out * cot).sum().backward()
    (ref * cot).sum().backward()
    assert rel_err(out.detach().numpy(), ref.detach().numpy()) < 1e-12
    assert rel_err(s.grad.numpy(), s_ref.grad.numpy()) < 1e-12
    # flat scores, float32, a Graph and num_nodes=None
    flat = ft.edge_softmax(ft.to_graph(ei, N), s[:, 1].detach().float())
    assert flat.shape == (ei.shape[1],) and flat.dtype == torch.float32
    assert rel_err(flat.numpy(), ref[:, 1].detach().numpy()) < 1e-5
    # dropout: an explicit (seed, offset) is the core's mask; training=False turns it off
    with torch.no_grad():
        d = ft.edge_softmax(ei, s, N, dropout=0.3, seed=77, offset=9)
        core = fastgnn.edge_softmax(ft.to_graph(ei, N), s.numpy(), dropout=0.3, seed=77,
                                    offset=9)
        assert np.array_equal(d.numpy(), core)
        assert torch.equal(d, ft.edge_softmax(ei, s, N, dropout=0.3, seed=77, offset=9))
        assert torch.equal(ft.edge_softmax(ei, s, N, dropout=0.3, training=False),
                           ft.edge_softmax(ei, s, N))
        torch.manual_seed(2)
        a = ft.edge_softmax(ei, s, N, dropout=0.3)
        torch.manual_seed(2)
        assert torch.equal(a, ft.edge_softmax(ei, s, N, dropout=0.3))
        assert not torch.equal(a, ft.edge_softmax(ei, s, N, dropout=0.3))
    with pytest.raises(ValueError, match="dropout"):
        ft.edge_softmax(ei, s, N, dropout=1.0)


def _torch_attention(ei, score, t, slope=0.2, scale=None):
    """Plain torch (per-edge tensors) attention: the reference."""
    src, dst = ei
    n_dst = {"gat": "a_dst", "gatv2": "xr", "dot": "q"}[score]
    if score == "gat":
        s = F_leaky(t["a_src"][src] + t["a_dst"][dst] + t["a_edge"], slope)
        msg = t["v"][src]
    elif score == "gatv2":
        s = (F_leaky(t["xl"][src] + t["xr"][dst] + t["xe"], slope) * t["att"]).sum(-1)
        msg = t["xl"][src]
    else:
        k = t["k"][src] + t["ee"]
        s = (t["q"][dst] * k).sum(-1) * scale
        msg = t["v"][src] + t["ee"]
    alpha = pyg_softmax(s, dst, num_nodes=t[n_dst].shape[0])
    out = torch.zeros((t[n_dst].shape[0],) + msg.shape[1:], dtype=msg.dtype)
    return out.index_add(0, dst, alpha[..., None] * msg), alpha


def F_leaky(u, slope):
    return torch.nn.functional.leaky_relu(u, slope)


@pytest.mark.parametrize("score", ["gat", "gatv2", "dot"])
def test_edge_attention_functional_matches_torch(score):
    """Every input's gradient, with a cotangent on the returned weights too,
    on a bipartite graph (sizes inferred from the inputs)."""
    ei = torch.from_numpy(awkward_edge_index(N, 5 * N, seed=20, num_src=NS))
    E, H, C = ei.shape[1], 3, 5
    g = torch.Generator().manual_seed(21)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)
    t = {"gat": dict(a_src=rnd(NS, H), a_dst=rnd(N, H), a_edge=rnd(E, H), v=rnd(NS, H, C)),
         "gatv2": dict(xl=rnd(NS, H, C), xr=rnd(N, H, C), att=rnd(1, H, C), xe=rnd(E, H, C)),
         "dot": dict(q=rnd(N, H, C), k=rnd(NS, H, C), v=rnd(NS, H, C), ee=rnd(E, H, C))}[score]
    ours_in = {k: v.clone().requires_grad_() for k, v in t.items()}
    ref_in = {k: v.clone().requires_grad_() for k, v in t.items()}
    out, alpha = ft.edge_attention(ei, score, **ours_in, negative_slope=0.1,
                                   return_attention_weights=True)
    r_out, r_alpha = _torch_attention(ei, score, ref_in, 0.1, 1 / np.sqrt(C))
    c1, c2 = _cot(out.shape, 5), _cot(alpha.shape, 6)
    ((out * c1).sum() + (alpha * c2).sum()).backward()
    ((r_out * c1).sum() + (r_alpha * c2).sum()).backward()
    assert rel_err(out.detach().numpy(), r_out.detach().numpy()) < 1e-12
    assert rel_err(alpha.detach().numpy(), r_alpha.detach().numpy()) < 1e-12
    for k in t:
        assert rel_err(ours_in[k].grad.numpy(), ref_in[k].grad.numpy()) < 1e-10, k
    # dropout: reproducible under torch.manual_seed, off when not training
    with torch.no_grad():
        torch.manual_seed(3)
        d1 = ft.edge_attention(ei, score, **t, dropout=0.5)
        torch.manual_seed(3)
        assert torch.equal(d1, ft.edge_attention(ei, score, **t, dropout=0.5))
        assert torch.equal(ft.edge_attention(ei, score, **t, dropout=0.5, training=False),
                           ft.edge_attention(ei, score, **t))
        assert not torch.equal(d1, ft.edge_attention(ei, score, **t))


@pytest.mark.parametrize("make", [lambda m: m.GATConv(F_IN, 4, heads=2),
                                  lambda m: m.GATv2Conv(F_IN, 4, heads=2, residual=True),
                                  lambda m: m.TransformerConv(F_IN, 4, heads=2)],
                         ids=["gat", "gatv2", "transformer"])
@pytest.mark.parametrize("layout", ["csc", "coo_uncoalesced"])
def test_layers_take_every_sparse_layout(make, layout):
    """A CSC or an uncoalesced COO adj_t (PyG refuses both) gives what PyG
    gives for the coalesced matrix: the same output, gradient and weights."""
    x, ei, _ = _graph(24, "square")
    coo = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1], dtype=torch.float64), (N, N))
    adj = coo.coalesce().to_sparse_csc() if layout == "csc" else coo
    torch.manual_seed(0)
    ref, ours = make(pyg).double(), make(ft).double()
    ours.load_state_dict(ref.state_dict())

    def run(layer, a):
        xl = x.clone().requires_grad_()
        out, (adj_w, alpha) = layer(xl, a, return_attention_weights=True)
        assert adj_w.layout == a.layout
        weights = torch.sparse_coo_tensor(_coo_indices(adj_w), alpha,
                                          adj_w.shape[:2] + alpha.shape[1:]).to_dense()
        return {"output": out.detach(), "grad x": torch.autograd.grad(out.sum(), xl)[0],
                "weights": weights.detach()}
    assert_results_match(run(ours, adj), run(ref, coo.coalesce()))


def _coo_indices(adj):
    """[2, nnz] (row, column) of a sparse matrix's entries in storage order."""
    if adj.layout == torch.sparse_coo:
        return adj.indices()
    if adj.layout == torch.sparse_csr:
        rows = torch.repeat_interleave(torch.arange(adj.shape[0]), adj.crow_indices().diff())
        return torch.stack([rows, adj.col_indices()])
    cols = torch.repeat_interleave(torch.arange(adj.shape[1]), adj.ccol_indices().diff())
    return torch.stack([adj.row_indices(), cols])


def test_layer_input_errors():
    x, ei, ea = _graph(22, "square")
    for layer in (ft.GATConv(F_IN, 4), ft.GATv2Conv(F_IN, 4), ft.TransformerConv(F_IN, 4),
                  ft.GATConv(F_IN, 4, add_self_loops=False)):
        with pytest.raises(TypeError, match="edge_index must hold integers"):
            layer.double()(x, ei.double())          # PyG refuses it too (no truncation)
    with pytest.raises(ValueError, match="edge_dim"):
        ft.GATv2Conv(F_IN, 4).double()(x, ei, edge_attr=ea)
    with pytest.raises(ValueError, match="edge_attr"):
        ft.TransformerConv(F_IN, 4, edge_dim=D_E).double()(x, ei)
    with pytest.raises(NotImplementedError, match="aggr"):
        ft.GATConv(F_IN, 4, aggr="mean")
    with pytest.raises(TypeError, match="unexpected"):
        ft.TransformerConv(F_IN, 4, bogus=1)
    assert repr(ft.GATv2Conv(F_IN, 4, heads=2)) == repr(pyg.GATv2Conv(F_IN, 4, heads=2))


def test_self_loop_graph_is_cached():
    x, ei, _ = _graph(23, "square")
    conv = ft.GATConv(F_IN, 4).double()
    from fastgnn.torch.attention import _loop_graph
    _, (a, _) = conv(x, ei, return_attention_weights=True)
    g = _loop_graph(ei, N, N, N)[0]
    _, (b, _) = conv(x, ei, return_attention_weights=True)
    assert _loop_graph(ei, N, N, N)[0] is g          # built once per edge_index
    assert torch.equal(a, b) and a is not b          # the caller gets a copy
    a.zero_()
    _, (c, _) = conv(x, ei, return_attention_weights=True)
    assert torch.equal(b, c)
    ei2 = ei.clone()
    assert _loop_graph(ei2, N, N, N)[0] is not g
    # GATConv/GATv2Conv return the weights only for a truthy flag (as PyG)
    assert isinstance(conv(x, ei, return_attention_weights=False), torch.Tensor)


# --------------------------------------------------------------------- GPU
def _gpu_layers():
    return [
        ("gat", lambda m: m.GATConv(24, 16, heads=4, edge_dim=D_E, residual=True)),
        ("gat_bipartite", lambda m: m.GATConv((24, 12), 16, heads=4, concat=False)),
        ("gatv2", lambda m: m.GATv2Conv(24, 16, heads=4, edge_dim=D_E, fill_value="add")),
        ("gatv2_shared", lambda m: m.GATv2Conv(24, 16, heads=2, share_weights=True,
                                               residual=True)),
        ("transformer", lambda m: m.TransformerConv(24, 16, heads=4, edge_dim=D_E, beta=True)),
        ("transformer_mean", lambda m: m.TransformerConv((24, 12), 16, heads=3, concat=False)),
    ]


def _gpu_inputs(name, n=1501):
    r = np.random.default_rng(0)
    bip = "bipartite" in name or name == "transformer_mean"
    ns = 997 if bip else n
    ei = torch.from_numpy(awkward_edge_index(n, 12 * n, seed=0, num_src=ns if bip else None))
    ea = torch.from_numpy(r.standard_normal((ei.shape[1], D_E)))
    xs = torch.from_numpy(r.standard_normal((ns, 24)))
    x = (xs, torch.from_numpy(r.standard_normal((n, 12)))) if bip else xs
    return x, ei, ea


@gpu
@needs_gpu
@pytest.mark.parametrize("case", _gpu_layers(), ids=lambda c: c[0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_layers_match_pyg_float64(case, dtype):
    """CUDA fp32 / bf16 against PyG's CPU float64 on the same rounded inputs;
    bf16 also against PyG's own bf16 error on the GPU (loose)."""
    name, make = case
    x, ei, ea = _gpu_inputs(name)
    torch.manual_seed(0)
    ref, ours = make(pyg), make(ft)
    use_ea = ref.edge_dim is not None
    vtype = "tf32" if dtype == torch.float32 else "bfloat16"
    compare(ref, ours, x, ei, ea if use_ea else None, kw={"return_attention_weights": True},
            dtype=dtype, device="cuda", vtype=vtype, baseline=dtype == torch.bfloat16)


@gpu
@needs_gpu
@pytest.mark.parametrize("name,make", DROP_LAYERS, ids=[c[0] for c in DROP_LAYERS])
def test_gpu_dropout_reproducible_and_same_mask_as_cpu(name, make):
    """The counter-based mask does not depend on the device: the same torch
    seed gives the same training output on CUDA (fp32) as on the CPU."""
    x, ei, ea = _graph(24, "square")
    torch.manual_seed(0)
    layer = make().double().train()
    torch.manual_seed(9)
    cpu_out, _ = _grads(layer, x, ei, ea)
    layer = layer.float().cuda()
    xs, eis, eas = x.float().cuda(), ei.cuda(), ea.float().cuda()
    torch.manual_seed(9)
    a = layer(xs, eis, edge_attr=eas)
    torch.manual_seed(9)
    b = layer(xs, eis, edge_attr=eas)
    assert torch.equal(a, b)
    assert rel_err(a.detach().cpu().double().numpy(), cpu_out.numpy()) < TOLERANCES["tf32"]


@gpu
@needs_gpu
def test_gpu_functional_matches_cpu():
    ei = torch.from_numpy(awkward_edge_index(N, 5 * N, seed=25))
    s = torch.randn(ei.shape[1], 4, dtype=torch.float64)
    cpu = ft.edge_softmax(ei, s, N, dropout=0.2, seed=5)
    dev = ft.edge_softmax(ei.cuda(), s.float().cuda(), N, dropout=0.2, seed=5)
    assert rel_err(dev.cpu().double().numpy(), cpu.numpy()) < TOLERANCES["float32"]
    q, k, v = (torch.randn(N, 2, 8, dtype=torch.float64) for _ in range(3))
    cpu = ft.edge_attention(ei, "dot", q=q, k=k, v=v)
    dev = ft.edge_attention(ei.cuda(), "dot", q=q.float().cuda(), k=k.float().cuda(),
                            v=v.float().cuda())
    assert rel_err(dev.cpu().double().numpy(), cpu.numpy()) < TOLERANCES["float32"]


@gpu
@needs_gpu
@pytest.mark.parametrize("score", ["gat", "gatv2", "dot"])
def test_gpu_functional_atomic_backward(score):
    """deterministic=False reaches the CUDA backward through autograd: every
    gradient close to the default (bitwise repeatable) one."""
    ei = torch.from_numpy(awkward_edge_index(N, 5 * N, seed=26, hub_degree=600)).cuda()
    H, C = 4, 32
    g = torch.Generator(device="cuda").manual_seed(27)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device="cuda")
    t = {"gat": dict(a_src=rnd(N, H), a_dst=rnd(N, H), v=rnd(N, H, C)),
         "gatv2": dict(xl=rnd(N, H, C), xr=rnd(N, H, C), att=rnd(H, C)),
         "dot": dict(q=rnd(N, H, C), k=rnd(N, H, C), v=rnd(N, H, C))}[score]
    cot = rnd(N, H, C)
    grads = []
    for det in (True, False):
        leaves = {k: v.clone().requires_grad_() for k, v in t.items()}
        (ft.edge_attention(ei, score, **leaves, deterministic=det) * cot).sum().backward()
        grads.append({k: v.grad.double().cpu().numpy() for k, v in leaves.items()})
    for k in t:
        assert rel_err(grads[1][k], grads[0][k]) < TOLERANCES["float32"], k


LAYER_MAKERS = [
    ("GATConv", lambda **kw: ft.GATConv(F_IN, 8, heads=2, edge_dim=D_E, **kw)),
    ("GATv2Conv", lambda **kw: ft.GATv2Conv(F_IN, 8, heads=2, edge_dim=D_E, **kw)),
    ("TransformerConv", lambda **kw: ft.TransformerConv(F_IN, 8, heads=2, edge_dim=D_E, **kw)),
]


@pytest.mark.parametrize("name,make", LAYER_MAKERS, ids=[c[0] for c in LAYER_MAKERS])
def test_layer_deterministic_keyword(name, make):
    """deterministic=False (fastgnn's own keyword) only changes the GPU
    backward: on the CPU outputs and every gradient are identical, the
    state_dict is PyG's, and a non-bool is refused by name."""
    x, ei, ea = _graph(16, "square")
    torch.manual_seed(0)
    a = make().double()
    torch.manual_seed(0)
    b = make(deterministic=False).double()
    assert a.deterministic is True and b.deterministic is False
    b.load_state_dict(a.state_dict(), strict=True)
    out_a, g_a = _grads(a, x, ei, ea)
    out_b, g_b = _grads(b, x, ei, ea)
    assert torch.equal(out_a, out_b)
    assert all(torch.equal(u, v) for u, v in zip(g_a, g_b))
    with pytest.raises(TypeError, match="deterministic"):
        make(deterministic="no")


@gpu
@needs_gpu
@pytest.mark.parametrize("name,make", LAYER_MAKERS, ids=[c[0] for c in LAYER_MAKERS])
def test_gpu_layer_atomic_backward_close_to_default(name, make):
    x, ei, ea = _graph(16, "square")
    x, ei, ea = x.float().cuda(), ei.cuda(), ea.float().cuda()
    torch.manual_seed(0)
    a = make().cuda()
    torch.manual_seed(0)
    b = make(deterministic=False).cuda()
    out_a, g_a = _grads(a, x, ei, ea)
    out_b, g_b = _grads(b, x, ei, ea)
    assert torch.equal(out_a, out_b)                 # the forward is the same kernel
    for u, v in zip(g_a, g_b):
        # relative, with an absolute floor of 1e-6 RMS: gradients that are zero
        # in exact arithmetic (TransformerConv's key bias: softmax ignores a
        # shift of the scores) are float noise (~1e-7) in both runs
        diff = torch.linalg.vector_norm((v - u).double())
        bound = TOLERANCES["float32"] * torch.linalg.vector_norm(u.double()) + 1e-6 * u.numel() ** 0.5
        assert diff <= bound, (diff, bound)


def test_inplace_edit_of_output_before_backward_is_caught():
    """The attention residuals reference the output: editing it in place must
    raise (autograd's version check) instead of giving wrong gradients."""
    ei = torch.from_numpy(awkward_edge_index(40, 200, seed=3))
    q, k, v = (torch.randn(40, 2, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = ft.edge_attention(ei, "dot", q=q, k=k, v=v)
    out.mul_(3)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


@pytest.mark.parametrize("fill_value", ["mean", "max", "add"])
def test_loop_fill_on_a_graph_of_only_self_loops(fill_value):
    """Every edge is a self-loop, so PyG removes them all and the loop
    features are reduced over no edges (0), gradients included."""
    torch.manual_seed(3)
    ei = torch.tensor([[0, 1, 2], [0, 1, 2]])
    x = torch.randn(4, 5, dtype=torch.float64)
    ea = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    ref = pyg.GATv2Conv(5, 3, heads=2, edge_dim=2, fill_value=fill_value).double()
    ours = ft.GATv2Conv(5, 3, heads=2, edge_dim=2, fill_value=fill_value).double()
    ours.load_state_dict(ref.state_dict())
    a, b = ref(x, ei, ea), ours(x, ei, ea)
    assert rel_err(b.detach().numpy(), a.detach().numpy()) < TOLERANCES["float64"]
    ga, = torch.autograd.grad(a.sum(), ref.lin_edge.weight)
    gb, = torch.autograd.grad(b.sum(), ours.lin_edge.weight)
    assert rel_err(gb.numpy(), ga.numpy()) < TOLERANCES["float64"]


@gpu
@needs_gpu
@pytest.mark.parametrize("tf32", [False, True])
def test_gpu_fp32_dot_attention_takes_tf32_tensor_cores_where_torch_allows(tf32, set_tf32,
                                                                          monkeypatch):
    """fp32 dot attention on a locally dense graph runs the Tensor Core
    kernels as TF32 exactly when torch lets fp32 matmuls use TF32 (forward
    and backward), and stays within TF32's tolerance of float64 either way."""
    from fastgnn import blocksparse as tc
    from fastgnn.generators import clustered
    ei, n = clustered(2048, block=32, random_per_node=1, seed=3)    # deduplicated
    H, C = 2, 32
    calls = []
    for name in ("attention_fwd", "attention_bwd"):
        monkeypatch.setattr(tc, name, (lambda f, name: lambda *a, **k: (calls.append(name),
                                                                         f(*a, **k))[1])(
            getattr(tc, name), name))
    set_tf32(tf32)
    gen = torch.Generator().manual_seed(4)
    q, k, v, go = (torch.randn(n, H, C, generator=gen, dtype=torch.float64) for _ in range(4))
    edge_index = torch.from_numpy(ei).cuda()
    leaves = [t.float().cuda().requires_grad_() for t in (q, k, v)]
    out = ft.edge_attention(edge_index, "dot", q=leaves[0], k=leaves[1], v=leaves[2])
    grads = torch.autograd.grad(out, leaves, go.float().cuda())
    assert calls == (["attention_fwd", "attention_bwd"] if tf32 else []), calls
    ref64 = [t.requires_grad_() for t in (q, k, v)]
    want = ft.edge_attention(torch.from_numpy(ei), "dot", q=ref64[0], k=ref64[1], v=ref64[2])
    want_grads = torch.autograd.grad(want, ref64, go)
    tol = TOLERANCES["tf32"] if tf32 else TOLERANCES["float32"]
    for what, a, b in [("out", out, want)] + [(f"grad {x}", a, b) for x, a, b in
                                             zip("qkv", grads, want_grads)]:
        err = rel_err(a.detach().cpu().double().numpy(), b.detach().numpy())
        assert err < 4 * tol, f"{what}: rel err {err:.2e} (tf32={tf32})"
