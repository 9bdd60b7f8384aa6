"""Drop-in layers: load a PyG 2.8 layer's state_dict into ours (strict=True),
then compare outputs and EVERY gradient (inputs, edge weights, parameters)
under a random cotangent, for every option combination and input form."""
import gc
import itertools
import warnings

import numpy as np
import pytest
import torch
import torch_geometric.nn as pyg

import fastgnn
import fastgnn.torch as ft
from fastgnn.testing import (assert_close, assert_results_match, awkward_edge_index,
                             fresh_pyg_class)

warnings.filterwarnings("ignore", message=".*[Ss]parse.*")

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not (fastgnn.gpu_available() and torch.cuda.is_available()),
                               reason="needs a CUDA device visible to CuPy and torch")

N = 61


def _adj_t(ei, num_src, num_dst, values=None):
    """PyG's adj_t (rows = targets) as a torch sparse CSR tensor; duplicates summed."""
    ei = torch.as_tensor(ei)
    values = torch.ones(ei.shape[1], dtype=torch.float64) if values is None else values
    return torch.sparse_coo_tensor(ei.flip(0), values, (num_dst, num_src)).coalesce().to_sparse_csr()


def _leaf(t, device="cpu", dtype=None, grad=True):
    t = t.detach().to(device=device, dtype=dtype or t.dtype).clone()
    return t.requires_grad_(grad)


def _adj_to(adj, device, dtype):
    if isinstance(adj, torch.Tensor) and adj.layout == torch.sparse_csr:
        return torch.sparse_csr_tensor(adj.crow_indices().to(device), adj.col_indices().to(device),
                                       adj.values().to(device, dtype), adj.shape)
    return adj.to(device)


def _fwd_bwd(layer, x, adj, edge_weight, device, dtype, cot, extra, check_dtype=True):
    """Output and every gradient of `layer` under cotangent `cot`, as a dict
    of CPU float64 tensors (None for a gradient that does not exist)."""
    xs = tuple(None if t is None else _leaf(t, device, dtype) for t in x)
    w = None
    if edge_weight is not None:
        w = _leaf(edge_weight, device, torch.float64 if dtype == torch.float64 else torch.float32)
    args = [xs if len(xs) == 2 else xs[0], _adj_to(adj, device, dtype)]
    if w is not None:
        args.append(w)
    out = layer(*args, **extra)
    assert out.device.type == device
    assert out.dtype == dtype or not check_dtype, f"output dtype {out.dtype}, expected {dtype}"
    (out * cot(out.shape).to(device, dtype)).sum().backward()

    def host(t):
        return None if t is None else t.detach().cpu().double()
    res = {"output": host(out)}
    for i, t in enumerate(xs):
        if t is not None:
            res[f"grad x[{i}]"] = host(t.grad)
    if w is not None:
        res["grad edge_weight"] = host(w.grad)
    for name, p in layer.named_parameters():
        res[f"grad {name}"] = host(p.grad)
    return res


def run_and_compare(ref_layer, our_layer, x, adj, edge_weight=None, *, device="cpu",
                    dtype=torch.float64, vtype="float64", extra=None, seed=0,
                    overwritten_loops=None, same_dtype_baseline=False, exact_zeros=False):
    """Run PyG (CPU, float64) and ours (device, dtype) on the same inputs and
    compare the output, the grads of x (and x_dst), of edge_weight and of every
    parameter. With same_dtype_baseline, PyG also runs on `device` in `dtype`,
    and ours may be off by up to twice PyG's own error there when that exceeds
    the tolerance (bf16 ReLU kinks flip differently from float64). With
    exact_zeros, a result that is ~0 against the largest (zero in exact
    arithmetic: on tiny graphs, an attention key shared by all of a target's
    edges) is held to the noise rule of assert_results_match."""
    extra = extra or {}
    ref_layer = ref_layer.double()
    our_layer.load_state_dict(ref_layer.state_dict(), strict=True)
    our_layer = our_layer.to(device=device, dtype=dtype)
    # the reference sees the parameters and inputs the device run sees (rounded to dtype)
    rounded = {k: v.to(dtype).double() for k, v in our_layer.state_dict().items()}
    ref_layer.load_state_dict(rounded)
    xs = x if isinstance(x, tuple) else (x,)
    xs = tuple(None if t is None else t.to(dtype).double() for t in xs)
    if edge_weight is not None:
        edge_weight = edge_weight.float().double()
    def cot(shape):     # the same random cotangent for every run
        return torch.randn(shape, generator=torch.Generator().manual_seed(seed),
                           dtype=torch.float64)
    if same_dtype_baseline:
        import copy
        base_layer = copy.deepcopy(ref_layer).to(device=device, dtype=dtype)
    ref = _fwd_bwd(ref_layer, xs, adj, edge_weight, "cpu", torch.float64, cot, extra)
    ours = _fwd_bwd(our_layer, xs, adj, edge_weight, device, dtype, cot, extra)
    base = None
    if same_dtype_baseline:
        try:
            # (PyG may promote bf16 to float32 when the edge weights are float32)
            base = _fwd_bwd(base_layer, xs, adj, edge_weight, device, dtype, cot, extra,
                            check_dtype=False)
        except (RuntimeError, NotImplementedError):   # PyG op without this dtype there
            base = None
    if overwritten_loops is not None and ref.get("grad edge_weight") is not None:
        # PyG's index_put also hands the gradient to a node's earlier,
        # overwritten self-loops; they do not affect the output, so the true
        # gradient (ours) is 0 there
        ref["grad edge_weight"] = ref["grad edge_weight"].masked_fill(overwritten_loops, 0)
        if base is not None and base.get("grad edge_weight") is not None:
            base["grad edge_weight"] = base["grad edge_weight"].masked_fill(overwritten_loops, 0)
    assert ours["output"].shape == ref["output"].shape
    noise_scale = (max(float(r.norm()) for r in ref.values() if r is not None)
                   if exact_zeros else None)
    assert_results_match(ours, ref, vtype, base, noise_scale=noise_scale)
    return ours, ref


def _overwritten_loops(ei):
    """[E] bool: self-loops followed by a later self-loop on the same node."""
    src, dst = ei.numpy()
    mask = np.zeros(src.shape[0], dtype=bool)
    last = {}
    for e in np.nonzero(src == dst)[0]:
        if src[e] in last:
            mask[last[src[e]]] = True
        last[src[e]] = e
    return torch.from_numpy(mask)


def _inputs(seed, n=N, f=6, num_src=None, f_dst=None):
    rng = np.random.default_rng(seed)
    ei = awkward_edge_index(n, 5 * n, seed=seed, num_src=num_src)
    ns = n if num_src is None else num_src
    x = torch.from_numpy(rng.standard_normal((ns, f)))
    x_dst = torch.from_numpy(rng.standard_normal((n, f_dst or f)))
    w = torch.from_numpy(rng.random(ei.shape[1]) + 0.1)
    return torch.from_numpy(ei), x, x_dst, w


# ------------------------------------------------------------------ GCNConv
GCN_GRID = [dict(improved=i, cached=c, add_self_loops=a, normalize=nz, bias=b)
            for i, c, (a, nz), b in itertools.product(
                [False, True], [False, True], [(True, True), (False, True), (False, False)],
                [False, True])]


@pytest.mark.parametrize("opts", GCN_GRID, ids=lambda o: "-".join(f"{k}={int(v)}" for k, v in o.items()))
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("graph_input", ["edge_index", "adj_t"])
def test_gcn_matches_pyg(opts, weighted, graph_input):
    ei, x, _, w = _inputs(1)
    torch.manual_seed(0)
    ref = pyg.GCNConv(6, 5, **opts)
    ours = ft.GCNConv(6, 5, **opts)
    if graph_input == "edge_index":
        adj, ew = ei, (w if weighted else None)
    else:   # adj_t: its values are the weights; PyG ignores edge_weight then
        adj, ew = _adj_t(ei, N, N, w if weighted else None), None
    overwritten = _overwritten_loops(ei) if opts["add_self_loops"] else None
    run_and_compare(ref, ours, x, adj, ew, overwritten_loops=overwritten)
    if opts["cached"] and opts["normalize"]:      # later calls reuse the first graph, whatever they are given
        other = torch.empty(2, 0, dtype=torch.long)
        with torch.no_grad():
            again = ours(x, other)
            again_ref = ref(x, other)
        assert torch.allclose(again_ref, again) and again.abs().sum() > 0


def test_gcn_weighted_without_edges_matches_pyg():
    """Nodes but no edges, with an (empty) edge_weight: every node gets its
    self-loop's fill weight, as in PyG."""
    x = torch.randn(4, 6, dtype=torch.float64)
    ei = torch.zeros(2, 0, dtype=torch.long)
    w = torch.zeros(0, dtype=torch.float64)
    torch.manual_seed(0)
    run_and_compare(pyg.GCNConv(6, 3), ft.GCNConv(6, 3), x, ei, w)


def test_gcn_self_loops_without_normalize_is_an_error():
    with pytest.raises(ValueError):
        ft.GCNConv(3, 4, add_self_loops=True, normalize=False)
    with pytest.raises(ValueError, match="bipartite"):
        ft.GCNConv(3, 4)((torch.randn(5, 3), torch.randn(5, 3)), torch.zeros(2, 0, dtype=torch.long))


def test_gcn_float32_and_unweighted_cache():
    ei, x, _, _ = _inputs(2)
    ref, ours = pyg.GCNConv(6, 5), ft.GCNConv(6, 5)
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = x.float()
    a = ours(x, ei)
    g = ft.to_graph(ei, N)
    assert ("gcn_norm_weights", True, "float32") in g.cache  # normalisation cached on the graph
    b = ours(x, ei)
    assert torch.equal(a, b)
    assert_close(a.detach().double().numpy(), ref(x, ei).detach().double().numpy(), "float32")


# ----------------------------------------------------------------- SAGEConv
SAGE_FORMS = ["square", "bipartite", "dst_none", "adj_t", "adj_t_bipartite"]
# every option combination once, cycling through input forms and output widths
# (3: aggregate after lin_l's narrowing, 11: before) to keep the run short
SAGE_GRID = [(dict(aggr=a, normalize=nz, root_weight=r, project=p, bias=b),
              SAGE_FORMS[i % 5], (3, 11)[(i // 5) % 2])
             for i, (a, nz, r, p, b) in enumerate(itertools.product(
                 ["mean", "sum"], [False, True], [False, True], [False, True], [False, True]))]


@pytest.mark.parametrize("opts,form,out_channels", SAGE_GRID,
                         ids=["-".join([f"{k}={v}" for k, v in o.items()] + [f, str(c)])
                              for o, f, c in SAGE_GRID])
def test_sage_matches_pyg(opts, form, out_channels):
    ns, nd, fs, fd = 37, N, 6, 4
    if form in ("square", "adj_t"):
        ei, x, _, _ = _inputs(3)
        in_ch, xin = fs, x
        sizes = (N, N)
    else:
        ei, x, x_dst, _ = _inputs(4, num_src=ns, f_dst=fd)
        in_ch, xin = (fs, fd), (x, x_dst)
        sizes = (ns, nd)
        if form == "dst_none":
            in_ch, xin = (fs, fd), (x, None)
            ei = ei[:, ei[1] < ns]
    adj = _adj_t(ei, *sizes) if form.startswith("adj_t") else ei
    torch.manual_seed(0)
    run_and_compare(fresh_pyg_class(pyg.SAGEConv)(in_ch, out_channels, **opts),
                    ft.SAGEConv(in_ch, out_channels, **opts), xin, adj)


def test_sage_weighted_adj_t_and_unsupported_aggr():
    ei, x, _, w = _inputs(5)
    torch.manual_seed(0)
    run_and_compare(fresh_pyg_class(pyg.SAGEConv)(6, 4), ft.SAGEConv(6, 4), x, _adj_t(ei, N, N, w))
    with pytest.raises(NotImplementedError, match="lstm"):
        ft.SAGEConv(6, 4, aggr="lstm")


def test_sage_lazy_in_channels():
    ei, x, _, _ = _inputs(6)
    ref, ours = fresh_pyg_class(pyg.SAGEConv)(-1, 4), ft.SAGEConv(-1, 4)
    ref(x.float(), ei)
    ours(x.float(), ei)
    run_and_compare(ref, ours, x, ei)


# ------------------------------------------------------------------ GINConv
@pytest.mark.parametrize("eps", [0.0, 0.3])
@pytest.mark.parametrize("train_eps", [False, True])
@pytest.mark.parametrize("form", ["square", "bipartite", "dst_none", "adj_t"])
def test_gin_matches_pyg(eps, train_eps, form):
    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.ReLU(), torch.nn.Linear(9, 5))
    ns = 29
    if form in ("square", "adj_t"):
        ei, x, _, _ = _inputs(7)
        xin, sizes = x, (N, N)
    else:
        ei, x, x_dst, _ = _inputs(8, num_src=ns)
        xin, sizes = (x, x_dst), (ns, N)
        if form == "dst_none":
            xin = (x, None)
            ei = ei[:, ei[1] < ns]
    adj = _adj_t(ei, *sizes) if form == "adj_t" else ei
    torch.manual_seed(0)
    ref = pyg.GINConv(mlp(), eps=eps, train_eps=train_eps)
    ours = ft.GINConv(mlp(), eps=eps, train_eps=train_eps)
    run_and_compare(ref, ours, xin, adj)
    assert "eps" in ours.state_dict()


# --------------------------------------------------------------------- GPU
def _gpu_layers():
    def mlp():  # smooth: in bf16 a ReLU kink flips for a few units and the eps
        #            gradient (one sum over all nodes) then measures only that noise
        return torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.Tanh(),
                                   torch.nn.Linear(40, 16))
    return [
        ("gcn", lambda: pyg.GCNConv(24, 16), lambda: ft.GCNConv(24, 16), True),
        ("gcn_improved_cached", lambda: pyg.GCNConv(24, 16, improved=True, cached=True),
         lambda: ft.GCNConv(24, 16, improved=True, cached=True), True),
        ("gcn_no_norm", lambda: pyg.GCNConv(24, 16, normalize=False),
         lambda: ft.GCNConv(24, 16, normalize=False), True),
        ("sage_mean", lambda: fresh_pyg_class(pyg.SAGEConv)(24, 16, project=True, normalize=True),
         lambda: ft.SAGEConv(24, 16, project=True, normalize=True), False),
        ("sage_sum", lambda: fresh_pyg_class(pyg.SAGEConv)(24, 40, aggr="sum"),
         lambda: ft.SAGEConv(24, 40, aggr="sum"), False),
        ("gin", lambda: pyg.GINConv(mlp(), train_eps=True),
         lambda: ft.GINConv(mlp(), train_eps=True), False),
    ]


@gpu
@needs_gpu
@pytest.mark.parametrize("case", _gpu_layers(), ids=lambda c: c[0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("graph_input", ["edge_index", "adj_t"])
def test_gpu_layers_match_pyg_float64(case, dtype, graph_input):
    name, make_ref, make_ours, takes_weight = case
    n = 1501
    rng = np.random.default_rng(0)
    ei = torch.from_numpy(awkward_edge_index(n, 12 * n, seed=0))
    x = torch.from_numpy(rng.standard_normal((n, 24)))
    w = torch.from_numpy(rng.random(ei.shape[1]) + 0.1)
    torch.manual_seed(0)
    ref, ours = make_ref(), make_ours()
    vtype = "float32" if dtype == torch.float32 else "bfloat16"
    if graph_input == "adj_t":
        adj, ew = _adj_t(ei, n, n, w.to(dtype).double() if takes_weight else None), None
    else:
        adj, ew = ei, (w if takes_weight else None)
    # fp32 layers: the GEMMs and sums differ in order from the CPU float64 run
    tol_vtype = "tf32" if dtype == torch.float32 else vtype
    replaces_loops = name.startswith("gcn") and ref.normalize and graph_input == "edge_index"
    run_and_compare(ref, ours, x, adj, ew, device="cuda", dtype=dtype, vtype=tol_vtype,
                    overwritten_loops=_overwritten_loops(ei) if replaces_loops else None,
                    same_dtype_baseline=True)


@gpu
@needs_gpu
def test_gpu_layer_memory_is_counted_by_torch():
    n = 20001
    ei = torch.from_numpy(awkward_edge_index(n, 10 * n, seed=1)).cuda()
    x = torch.randn(n, 128, device="cuda", requires_grad=True)
    conv = ft.GCNConv(128, 128).cuda()
    conv(x, ei).sum().backward()                    # warm caches
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = conv(x, ei)
    peak = torch.cuda.max_memory_allocated() - base
    # lin output + spmm output at least, all from torch's allocator
    assert peak >= 2 * out.numel() * out.element_size()


@pytest.mark.parametrize("improved", [False, True])
@pytest.mark.parametrize("add_self_loops", [False, True])
def test_gcn_constant_edge_weight_matches_pyg(improved, add_self_loops):
    """Weights without grad take the fastgnn core path (not torch ops)."""
    ei, x, _, w = _inputs(9)
    ref = pyg.GCNConv(6, 5, improved=improved, add_self_loops=add_self_loops).double()
    ours = ft.GCNConv(6, 5, improved=improved, add_self_loops=add_self_loops).double()
    ours.load_state_dict(ref.state_dict(), strict=True)
    for xx, ww in ((x, w), (x.float(), w.float())):
        ref.to(xx.dtype), ours.to(xx.dtype)
        vt = "float64" if xx.dtype == torch.float64 else "float32"
        assert_close(ours(xx, ei, ww).detach().double().numpy(),
                     ref(xx, ei, ww).detach().double().numpy(), vt)
    from torch_geometric import EdgeIndex
    eix = EdgeIndex(ei, sparse_size=(N, N))
    ref.double(), ours.double()
    assert_close(ours(x, eix, w).detach().numpy(), ref(x, ei, w).detach().numpy(), "float64")


def test_gcn_edge_weight_gradient_is_the_true_one():
    """gradcheck through the differentiable normalisation, on a graph with a
    node holding two self-loops (only the last one counts)."""
    ei = torch.tensor([[0, 1, 2, 2, 3, 1, 1, 4],
                       [1, 2, 0, 2, 3, 1, 1, 0]])
    x = torch.randn(5, 3, dtype=torch.float64)
    conv = ft.GCNConv(3, 2).double()
    w = (torch.rand(ei.shape[1], dtype=torch.float64) + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda w: conv(x, ei, w), (w,))
    improved = ft.GCNConv(3, 2, improved=True).double()
    assert torch.autograd.gradcheck(lambda w: improved(x, ei, w), (w,))


@pytest.mark.parametrize("add_self_loops", [False, True])
@pytest.mark.parametrize("improved", [False, True])
def test_functional_gcn_norm_matches_reference(add_self_loops, improved):
    from fastgnn.backends import reference as ref
    ei, _, _, w = _inputs(10)
    g2, w2 = ft.gcn_norm(ei, w, N, improved=improved, add_self_loops=add_self_loops,
                         dtype=torch.float64)
    ei_ref, w_ref = ref.gcn_norm(ei.numpy(), N, w.numpy(), add_self_loops, improved)
    assert np.array_equal(g2.edge_index(), ei_ref)
    assert_close(w2.numpy(), w_ref, "float64")
    wg = w.clone().requires_grad_()
    _, w3 = ft.gcn_norm(ei, wg, N, improved=improved, add_self_loops=add_self_loops)
    assert_close(w3.detach().numpy(), w_ref, "float64")


# ------------------------------------------------ linears sharing one input
def _three_linears(bias_pattern=(True, False, True)):
    torch.manual_seed(0)
    return [torch.nn.Linear(5, o, bias=b).double() for o, b in zip((3, 4, 2), bias_pattern)]


@pytest.mark.parametrize("bias_pattern", [(True, False, True), (False, False, False)])
def test_shared_input_linears_match_separate_linears(bias_pattern):
    """Outputs and every gradient (x, weights, biases) as the modules called
    one by one, including an output that takes no gradient; gradcheck too."""
    from fastgnn.torch.nn import _SharedInputLinears, shared_input_linears
    lins = _three_linears(bias_pattern)
    x = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    params = [p for lin in lins for p in lin.parameters()]
    cots = [torch.randn(7, lin.out_features, dtype=torch.float64) for lin in lins]
    for used in ((0, 1, 2), (0, 2), (1,)):
        fused = shared_input_linears(x, lins)
        separate = [lin(x) for lin in lins]
        for a, b in zip(fused, separate):
            assert torch.equal(a, b)
        ga = torch.autograd.grad([fused[k] for k in used], [x] + params,
                                 [cots[k] for k in used], allow_unused=True)
        gb = torch.autograd.grad([separate[k] for k in used], [x] + params,
                                 [cots[k] for k in used], allow_unused=True)
        for a, b in zip(ga, gb):
            assert (a is None) == (b is None)
            if a is not None:
                assert_close(a.numpy(), b.numpy(), tol=1e-12)
    wb = [t for lin in lins for t in (lin.weight, lin.bias)]
    assert torch.autograd.gradcheck(lambda x_, *p: _SharedInputLinears.apply(x_, *p),
                                    (x, *wb))


def test_shared_input_linears_fall_back_to_the_modules():
    """Hooks, a 3-D input or autocast: the modules are called one by one
    (hooks fire), results unchanged."""
    from fastgnn.torch.nn import _SharedInputLinears, shared_input_linears
    lins = _three_linears()
    calls = []
    h = lins[1].register_forward_hook(lambda m, i, o: calls.append(1))
    x = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    out = shared_input_linears(x, lins)
    assert calls == [1] and out[1].grad_fn.name() != _SharedInputLinears.__name__ + "Backward"
    h.remove()
    out = shared_input_linears(x, lins)
    assert "SharedInputLinears" in out[0].grad_fn.name()
    x3 = torch.randn(2, 7, 5, dtype=torch.float64)
    assert [o.shape for o in shared_input_linears(x3, lins)] == [(2, 7, 3), (2, 7, 4), (2, 7, 2)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = shared_input_linears(x.float(), [lin.float() for lin in _three_linears()])
    assert y[0].dtype == torch.bfloat16 and "SharedInputLinears" not in y[0].grad_fn.name()


def test_shared_input_linears_double_backward():
    """create_graph=True through the fused backward (a gradient penalty) gives
    the separate linears' second derivatives."""
    from fastgnn.torch.nn import shared_input_linears
    lins = _three_linears()
    x = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)

    def penalty_grads(fused):
        ys = shared_input_linears(x, lins) if fused else [lin(x) for lin in lins]
        loss = sum((y ** 3).sum() for y in ys)
        (gx,) = torch.autograd.grad(loss, [x], create_graph=True)
        return torch.autograd.grad(gx.pow(2).sum(), [x, lins[0].weight, lins[2].bias])

    for a, b in zip(penalty_grads(True), penalty_grads(False)):
        assert_close(a.numpy(), b.numpy(), tol=1e-12)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[gpu, needs_gpu])])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_bias_grad_and_add_bias(device, dtype, monkeypatch, set_tf32):
    """bias_grad == the float64 column sum, for tensors above and below the
    size where CUDA switches to fastgnn.column_sum (lowered here to keep the
    tensors small), a non-contiguous and an expanded cotangent; add_bias's
    gradients as x + b's; a double backward through add_bias (torch's sum
    then) as x + b's."""
    from fastgnn.torch import functional
    from fastgnn.torch.functional import add_bias, bias_grad
    monkeypatch.setattr(functional, "COLUMN_SUM_MIN_NUMEL", 1 << 18)
    COLUMN_SUM_MIN_NUMEL = functional.COLUMN_SUM_MIN_NUMEL
    if device == "cpu" and dtype == torch.bfloat16:
        pytest.skip("bf16 column sums are a GPU path")
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    rows = COLUMN_SUM_MIN_NUMEL // 96 + 17          # F = 96: just above the switch
    for shape in [(rows, 96), (33, 7)]:
        g = torch.randn(shape, dtype=torch.float64, device=device)
        got = bias_grad(g.to(dtype))
        assert got.dtype == dtype and got.shape == (shape[1],)
        assert_close(got.double().cpu().numpy(), g.to(dtype).double().sum(0).cpu().numpy(),
                     tol=tol)
    gt = torch.randn(96, rows, dtype=dtype, device=device).t()        # non-contiguous
    assert_close(bias_grad(gt).double().cpu().numpy(), gt.double().sum(0).cpu().numpy(), tol=tol)
    ge = torch.ones(1, 96, dtype=dtype, device=device).expand(rows, 96)  # expanded
    assert torch.equal(bias_grad(ge).cpu(), torch.full((96,), float(rows)).to(dtype))
    if device == "cuda" and dtype == torch.float32:
        # the GEMV path (TF32 off), twice on one grown ones vector, then with
        # TF32 allowed: the sum paths, which never round g to TF32
        for n in (rows, 3 * rows + 5):
            g = torch.randn(n, 96, dtype=torch.float64, device=device)
            assert_close(bias_grad(g.float()).double().cpu().numpy(), g.sum(0).cpu().numpy(),
                         tol=tol)
        set_tf32(True)
        g = torch.randn(rows, 96, dtype=dtype, device=device) * 1e3 + 1.0
        assert torch.equal(bias_grad(g), bias_grad(g.clone()))
        assert_close(bias_grad(g).double().cpu().numpy(), g.double().sum(0).cpu().numpy(),
                     tol=tol)

    x = torch.randn(rows, 96, dtype=dtype, device=device, requires_grad=True)
    b = torch.randn(96, dtype=dtype, device=device, requires_grad=True)
    cot = torch.randn(rows, 96, dtype=dtype, device=device)
    out = add_bias(x, b)
    assert torch.equal(out, x + b)
    gx, gb = torch.autograd.grad(out, [x, b], cot)
    assert torch.equal(gx, cot)
    assert_close(gb.double().cpu().numpy(), cot.double().sum(0).cpu().numpy(), tol=tol)
    if dtype == torch.float64:
        xs, bs = x[:50].detach().requires_grad_(), b.detach().requires_grad_()
        for fn in (add_bias, torch.add):
            (gxs,) = torch.autograd.grad((fn(xs, bs) ** 3).sum(), [xs], create_graph=True)
            second = torch.autograd.grad(gxs.sum(), [xs, bs])
            if fn is add_bias:
                ours = second
        for a, c in zip(ours, second):
            assert_close(a.cpu().numpy(), c.cpu().numpy(), tol=1e-12)


@pytest.mark.parametrize("api", ["legacy", "fp32_precision"])
def test_tf32_allowed_reads_either_api(api, set_tf32):
    """gemm.tf32_allowed follows TF32 set through either torch API without
    raising (torch's legacy allow_tf32 getter raises once fp32_precision
    was set), so bias_grad and GATConv's logits can ask it on any torch."""
    from fastgnn.torch.gemm import tf32_allowed
    matmul = torch.backends.cuda.matmul
    if api == "fp32_precision" and not hasattr(matmul, "fp32_precision"):
        pytest.skip("this torch has no fp32_precision setting")
    set_tf32(False)
    for on in (True, False):
        if api == "legacy":
            torch.set_float32_matmul_precision("high" if on else "highest")
        else:
            matmul.fp32_precision = "tf32" if on else "ieee"
        assert tf32_allowed() is on


def test_small_inputs_take_the_plain_torch_ops(monkeypatch):
    """Below FUSED_MIN_NUMEL the layers use torch's own linear and add (C++
    autograd nodes, no Python hand-off in the backward); results and every
    gradient equal the fused path's."""
    from fastgnn.torch import functional
    from fastgnn.torch.nn import shared_input_linears
    lins = _three_linears()
    x = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    runs = {}
    for threshold in (0, 7 * 5 + 1):
        monkeypatch.setattr(functional, "FUSED_MIN_NUMEL", threshold)
        ys = shared_input_linears(x, lins)
        z = functional.add_bias(ys[0], b)
        names = {ys[0].grad_fn.name(), z.grad_fn.name()}
        fused = any("SharedInputLinears" in n or "AddBias" in n for n in names)
        assert fused == (threshold == 0), names
        loss = (z ** 2).sum() + sum((y ** 3).sum() for y in ys[1:])
        params = [x, b, *[p for lin in lins for p in lin.parameters()]]
        runs[threshold] = [z, *torch.autograd.grad(loss, params)]
    for a, c in zip(*runs.values()):
        assert_close(a.detach().numpy(), c.detach().numpy(), tol=1e-12)


def test_sage_root_weight_leaves_hooked_outputs_alone():
    """SAGEConv accumulates lin_r(x) into its own intermediate in place
    (addmm_); an output a user's forward hook on lin_l kept must stay as
    lin_l returned it, and the layer's result is the same either way."""
    ei = torch.from_numpy(awkward_edge_index(N, 300, seed=3))
    for out_channels, aggr in ((8, "mean"), (4, "mean"), (8, "max")):   # 4 < 6: narrow path
        torch.manual_seed(0)
        layer = ft.SAGEConv(6, out_channels, aggr=aggr).double()
        x = torch.randn(N, 6, dtype=torch.float64, requires_grad=True)
        plain = layer(x, ei)
        kept = []
        h = layer.lin_l.register_forward_hook(
            lambda m, i, o: kept.append((o, o.detach().clone())))
        hooked = layer(x, ei)
        h.remove()
        assert len(kept) == 1 and torch.equal(kept[0][0], kept[0][1]), (out_channels, aggr)
        assert_close(hooked.detach().numpy(), plain.detach().numpy(), tol=1e-12)
        gx, = torch.autograd.grad(hooked.sum(), [x])
        gx0, = torch.autograd.grad(plain.sum(), [x])
        assert_close(gx.numpy(), gx0.numpy(), tol=1e-12)


@pytest.mark.parametrize("aggr", ["mean", "max"])
@pytest.mark.parametrize("fused", [False, True])
def test_sage_with_backward_and_global_hooks(monkeypatch, aggr, fused):
    """Hooks on lin_l (full backward hook) and global module hooks run and see
    what the module returned; results and gradients as without hooks, on the
    small-graph path (torch's linear) and the fused path."""
    from fastgnn.torch import functional
    monkeypatch.setattr(functional, "FUSED_MIN_NUMEL", 0 if fused else 1 << 40)
    ei = torch.from_numpy(awkward_edge_index(N, 300, seed=5))
    torch.manual_seed(1)
    layer = ft.SAGEConv(6, 8, aggr=aggr).double()
    x = torch.randn(N, 6, dtype=torch.float64, requires_grad=True)
    ref = layer(x, ei)
    ref_gx, = torch.autograd.grad(ref.sum(), [x])
    seen, kept = [], []
    hb = layer.lin_l.register_full_backward_hook(lambda m, gi, go: seen.append("bwd"))
    hg = torch.nn.modules.module.register_module_forward_hook(
        lambda m, i, o: kept.append((o, o.detach().clone())) if m is layer.lin_l else None)
    try:
        out = layer(x, ei)
        gx, = torch.autograd.grad(out.sum(), [x])
    finally:
        hb.remove()
        hg.remove()
    assert seen == ["bwd"] and len(kept) == 1 and torch.equal(kept[0][0], kept[0][1])
    assert_close(out.detach().numpy(), ref.detach().numpy(), tol=1e-12)
    assert_close(gx.numpy(), ref_gx.numpy(), tol=1e-12)


@pytest.mark.parametrize("make", [lambda: ft.GATConv(6, 3, heads=2),
                                  lambda: ft.GATv2Conv(6, 3, heads=2),
                                  lambda: ft.GATConv(6, 3, heads=2, residual=True),
                                  lambda: ft.TransformerConv(6, 3, heads=2)],
                         ids=["gat", "gatv2", "gat_residual", "transformer"])
def test_attention_layer_output_takes_in_place_edits(make):
    """As with PyG, the default layers' output may be edited in place (relu_)
    before the backward: the bias is added outside the op unless a residual
    follows, so the op's saved output is never what the layer returns."""
    ei = torch.from_numpy(awkward_edge_index(N, 300, seed=7))
    torch.manual_seed(2)
    layer = make().double()
    x = torch.randn(N, 6, dtype=torch.float64, requires_grad=True)
    ref = torch.relu(layer(x, ei))
    ref_gx, = torch.autograd.grad(ref.sum(), [x])
    out = layer(x, ei)
    out.relu_()
    gx, = torch.autograd.grad(out.sum(), [x])
    assert_close(out.detach().numpy(), ref.detach().numpy(), tol=1e-12)
    assert_close(gx.numpy(), ref_gx.numpy(), tol=1e-12)


def test_mixed_feature_dtypes_name_the_argument():
    ei = torch.from_numpy(awkward_edge_index(N, 300, seed=7))
    xl = torch.randn(N, 2, 4)
    with pytest.raises(TypeError, match="bias must have xl's dtype torch.float32, got torch.bfloat16"):
        ft.edge_attention(ei, "gatv2", xl=xl, xr=xl, att=torch.randn(2, 4),
                          bias=torch.zeros(8, dtype=torch.bfloat16))


# ------------------------------------------------------- seeded construction
def _pyg_and_ours(name, *args, **kwargs):
    """The same constructor call on PyG's layer and ours, each from the same
    generator state: (PyG layer, its next torch.rand(4), ours, its next torch.rand(4))."""
    import torch_geometric.nn.aggr as pyg_aggr
    import fastgnn.torch.aggr as ft_aggr
    made = []
    for module in ((pyg, pyg_aggr), (ft, ft_aggr)):
        torch.manual_seed(1234)
        cls = getattr(module[0], name, None) or getattr(module[1], name)
        layer = cls(*args, **kwargs)
        made += [layer, torch.rand(4)]
    return made


SEEDED = [
    ("GCNConv", (6, 5), {}), ("GCNConv", (6, 5), {"bias": False}),
    ("GCNConv", (6, 5), {"normalize": False, "improved": True}),
    ("SAGEConv", (6, 5), {}), ("SAGEConv", ((6, 4), 5), {}),
    ("SAGEConv", (6, 5), {"project": True}), ("SAGEConv", (6, 5), {"root_weight": False}),
    ("SAGEConv", (6, 5), {"bias": False, "normalize": True}),
    *[("SAGEConv", (6, 5), {"aggr": a}) for a in ("sum", "max", "min", "var", "std", "mul")],
    ("SAGEConv", (6, 5), {"aggr": ["mean", "max", "std"]}),
    ("SAGEConv", ((6, 4), 5), {"aggr": "max", "project": True}),
    ("GATConv", (6, 3), {}), ("GATConv", (6, 3), {"heads": 2}),
    ("GATConv", ((6, 4), 3), {"heads": 2}),
    ("GATConv", (6, 3), {"heads": 3, "edge_dim": 2, "residual": True}),
    ("GATConv", ((6, 4), 3), {"heads": 2, "concat": False, "residual": True, "bias": False}),
    ("GATv2Conv", (6, 3), {"heads": 2}), ("GATv2Conv", (6, 3), {"heads": 2, "share_weights": True}),
    ("GATv2Conv", ((6, 4), 3), {"heads": 2, "edge_dim": 2, "residual": True}),
    ("GATv2Conv", (6, 3), {"heads": 2, "share_weights": True, "edge_dim": 2, "bias": False}),
    ("GATv2Conv", (6, 3), {"heads": 2, "concat": False, "residual": True}),
    ("TransformerConv", (6, 3), {"heads": 2}), ("TransformerConv", ((6, 4), 3), {"heads": 2}),
    ("TransformerConv", (6, 3), {"heads": 2, "edge_dim": 2, "beta": True}),
    ("TransformerConv", (6, 3), {"heads": 2, "concat": False, "beta": True, "bias": False}),
    ("TransformerConv", (6, 3), {"heads": 2, "root_weight": False, "beta": True}),
    *[(f"{a}Aggregation", (), {}) for a in ("Sum", "Mean", "Max", "Min", "Var", "Std", "Mul")],
    ("MultiAggregation", (["mean", "max"],), {}),
]


@pytest.mark.parametrize("name,args,kwargs", SEEDED,
                         ids=[f"{n}-{a}-{k}" for n, a, k in SEEDED])
def test_seeded_construction_gives_pyg_weights(name, args, kwargs):
    """torch.manual_seed(s) before building the layer gives PyG's weights,
    bit for bit, and leaves the generator where PyG leaves it."""
    ref, ref_next, ours, our_next = _pyg_and_ours(name, *args, **kwargs)
    want, got = ref.state_dict(), ours.state_dict()
    assert list(got) == list(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key
    assert torch.equal(our_next, ref_next)
    torch.manual_seed(99)        # reset_parameters draws in PyG's order too
    ref.reset_parameters()
    ref_next = torch.rand(4)
    torch.manual_seed(99)
    ours.reset_parameters()
    assert torch.equal(torch.rand(4), ref_next)
    for key, value in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key


@pytest.mark.parametrize("name,args,kwargs", [
    ("GCNConv", (-1, 5), {}), ("SAGEConv", ((-1, -1), 5), {"aggr": "max"}),
    ("GATConv", (-1, 3), {"heads": 2, "residual": True}),
    ("GATv2Conv", (-1, 3), {"heads": 2, "residual": True}),
    ("TransformerConv", (-1, 3), {"heads": 2, "beta": True})], ids=lambda v: str(v))
def test_seeded_lazy_layers_draw_at_the_first_call_as_pyg(name, args, kwargs):
    ei, x, _, _ = _inputs(11)
    x = x.float()
    ref, _, ours, _ = _pyg_and_ours(name, *args, **kwargs)
    for layer in (ref, ours):
        torch.manual_seed(5)
        layer(x, ei)
        layer.next_draw = torch.rand(4)
    assert torch.equal(ours.next_draw, ref.next_draw)
    for key, value in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key


@pytest.mark.parametrize("train_eps", [False, True])
def test_seeded_gin_gives_pyg_weights(train_eps):
    made = []
    for module in (pyg, ft):
        torch.manual_seed(7)
        mlp = torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.ReLU(), torch.nn.Linear(9, 5))
        made += [module.GINConv(mlp, eps=0.2, train_eps=train_eps).state_dict(), torch.rand(4)]
    want, ref_next, got, our_next = made
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert torch.equal(our_next, ref_next)


# ------------------------------------------------------- PyG's test suite finds
@pytest.mark.parametrize("name,make", [
    ("gcn", lambda m: m.GCNConv(6, 5)), ("gcn_plain", lambda m: m.GCNConv(6, 5, normalize=False)),
    ("sage", lambda m: m.SAGEConv(6, 5)), ("sage_max", lambda m: m.SAGEConv(6, 5, aggr="max")),
    ("gin", lambda m: m.GINConv(torch.nn.Linear(6, 5)))])
def test_float_edge_index_is_refused(name, make):
    """PyG refuses a float edge_index; truncating it would name other nodes."""
    ei, x, _, _ = _inputs(12)
    with pytest.raises(TypeError, match="edge_index must hold integers"):
        make(ft).double()(x, ei.double())


@pytest.mark.parametrize("opts,weighted", [
    ({}, False), ({}, True), ({"improved": True}, True), ({"normalize": False}, True),
    ({"cached": True, "bias": False}, False)], ids=str)
def test_gcn_static_graph_batch_matches_pyg(opts, weighted):
    """x [B, N, F]: the same graph for every batch element, as PyG's node_dim=-2
    (PyG takes it with an edge_index; torch.sparse.mm refuses a 3-D x)."""
    ei, _, _, w = _inputs(13)
    x = torch.randn(3, N, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    run_and_compare(pyg.GCNConv(7, 5, **opts), ft.GCNConv(7, 5, **opts), x, ei,
                    w if weighted else None,
                    overwritten_loops=_overwritten_loops(ei) if opts.get("normalize", 1) else None)


@pytest.mark.parametrize("size", [None, (N, N)])
def test_gin_static_graph_batch_matches_pyg(size):
    ei, _, _, _ = _inputs(14)
    x = torch.randn(2, 4, N, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.ReLU(), torch.nn.Linear(9, 5))
    torch.manual_seed(0)
    run_and_compare(pyg.GINConv(mlp(), eps=0.3, train_eps=True),
                    ft.GINConv(mlp(), eps=0.3, train_eps=True), x, ei, extra={"size": size})


FLOW_LAYERS = [
    ("gcn", lambda m: m.GCNConv(6, 5), True),          # (third: edge weights)
    ("gcn_improved", lambda m: m.GCNConv(6, 5, improved=True, cached=True), True),
    ("gcn_unweighted", lambda m: m.GCNConv(6, 5), False),
    ("gcn_plain", lambda m: m.GCNConv(6, 5, normalize=False), True),
    ("sage", lambda m: m.SAGEConv(6, 5), False),
    ("sage_sum_no_root", lambda m: m.SAGEConv(6, 5, aggr="sum", root_weight=False), False),
    ("sage_max", lambda m: m.SAGEConv(6, 5, aggr="max"), False),
    ("sage_multi", lambda m: m.SAGEConv(6, 5, aggr=["mean", "max", "std"]), False),
    ("gin", lambda m: m.GINConv(torch.nn.Linear(6, 5), train_eps=True), False),
]


@pytest.mark.parametrize("name,make,weighted", FLOW_LAYERS, ids=[c[0] for c in FLOW_LAYERS])
@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
def test_flow_set_after_construction_matches_pyg(name, make, weighted, flow):
    """`conv.flow = ...` after construction is honoured per call, as PyG's
    MessagePassing reads it (target_to_source: messages from edge_index[1]
    to edge_index[0]; GCN's degrees then count edge_index[0])."""
    ei, x, _, w = _inputs(15)
    torch.manual_seed(0)
    ref, ours = make(pyg), make(ft)
    ref.flow = ours.flow = flow
    loops = getattr(ours, "add_self_loops", False)     # GCN replaces existing loops
    run_and_compare(ref, ours, x, ei, w if weighted else None,
                    overwritten_loops=_overwritten_loops(ei) if loops else None)


def test_flow_target_to_source_limits():
    ei, x, _, _ = _inputs(16)
    adj = _adj_t(ei, N, N)
    conv = ft.GCNConv(6, 5).double()
    conv.flow = "target_to_source"
    with pytest.raises(ValueError, match="adj_t.t()"):        # as PyG
        conv(x, adj)
    conv.flow = "bogus"
    with pytest.raises(ValueError, match="flow"):
        conv(x, ei)
    with pytest.raises(ValueError, match="flow"):
        ft.SAGEConv(6, 5, flow="bogus")
    for conv, xin in ((ft.SAGEConv(6, 5, flow="target_to_source"), (x, x)),
                      (ft.SAGEConv(6, 5, project=True, flow="target_to_source"), x),
                      (ft.GINConv(torch.nn.Identity(), flow="target_to_source"), (x, x))):
        with pytest.raises(NotImplementedError, match="target_to_source"):
            conv.double()(xin, ei)
    for make in (ft.GATConv, ft.GATv2Conv):
        with pytest.raises(NotImplementedError, match="target_to_source"):
            make(6, 5, flow="target_to_source")
        conv = make(6, 5).double()
        conv.flow = "target_to_source"
        with pytest.raises(NotImplementedError, match="target_to_source"):
            conv(x, ei)


_BAD_X = {
    "one_dimensional": (lambda: torch.randn(3), ValueError, "x must have shape"),
    "integer": (lambda: torch.randint(0, 3, (3, 4)), TypeError, "floating-point"),
    "other_device": (lambda: torch.randn(3, 4, device="meta"), ValueError, "one device"),
    "too_few_rows": (lambda: torch.randn(2, 4), ValueError, "rows of the source features"),
    "not_a_tensor": (lambda: np.ones((3, 4), dtype=np.float32), TypeError,
                     "x must be a tensor"),
}


@pytest.mark.parametrize("bad", sorted(_BAD_X))
@pytest.mark.parametrize("layer", ["GCNConv", "SAGEConv", "GINConv", "GATConv", "GATv2Conv",
                                   "TransformerConv"])
def test_layers_refuse_bad_features_naming_x(layer, bad):
    """Every drop-in layer refuses node features of the wrong rank, dtype,
    device, row count or type with a TypeError / ValueError that says what is
    wrong with x, before any kernel runs."""
    import fastgnn.torch as ft
    make, error, words = _BAD_X[bad]
    conv = (ft.GINConv(torch.nn.Linear(4, 4)) if layer == "GINConv"
            else getattr(ft, layer)(4, 4))
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    with pytest.raises(error, match=words):
        conv(make(), edge_index)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("layer", ["GCNConv", "SAGEConv", "SAGEConv-max", "GINConv", "GATConv",
                                   "TransformerConv"])
def test_a_bad_feature_reaches_the_rows_pyg_gives(layer, bad):
    """A NaN or inf in one node's features makes the same output rows
    non-finite as in PyG from the same weights (no error: the CPU kernels
    divide by zero as NumPy does), and the other rows equal PyG's (for inf in
    the attention layers, fewer entries: see `subset`). GCNConv also with a
    bad edge weight."""
    import fastgnn.torch as ft
    # an inf feature can give a head a score of -inf: PyG multiplies its 0 weight
    # by the inf message (NaN), the fused softmax adds nothing; there fastgnn's
    # non-finite entries are a subset of PyG's
    subset = bad == float("inf") and layer in ("GATConv", "TransformerConv")

    def make(lib):
        if layer == "GINConv":
            return lib.GINConv(torch.nn.Linear(4, 3))
        if layer == "SAGEConv-max":
            return lib.SAGEConv(4, 3, aggr="max")
        return getattr(lib, layer)(4, 3, **({"heads": 2} if "Conv" in layer and layer in (
            "GATConv", "TransformerConv") else {}))
    seed = int(np.random.randint(1 << 30))
    torch.manual_seed(seed)
    theirs = make(pyg)
    ours = make(ft)
    ours.load_state_dict(theirs.state_dict())
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 2], [1, 2, 3, 4, 5, 0, 5]])
    x = torch.randn(6, 4)
    x[2, 1] = bad
    weight = None
    inputs = [(x, None)]
    if layer == "GCNConv":
        weight = torch.ones(7)
        weight[1] = bad
        inputs.append((torch.randn(6, 4), weight))
    for x, w in inputs:
        args = (x, edge_index) if w is None else (x, edge_index, w)
        with torch.no_grad():
            want, got = theirs(*args), ours(*args)
        bad_rows = ~torch.isfinite(want)
        if subset:
            assert not (~torch.isfinite(got) & ~bad_rows).any(), f"seed {seed}"
            bad_rows = bad_rows | ~torch.isfinite(got)
        else:
            assert torch.equal(bad_rows, ~torch.isfinite(got)), f"seed {seed}"
        torch.testing.assert_close(got[~bad_rows], want[~bad_rows], msg=f"seed {seed}")
