"""fastgnn.torch reductions: segment_reduce / segment_csr, the Aggregation
modules and SAGEConv(aggr=...), against PyG 2.8's own modules on the same
inputs: outputs and every gradient under a random cotangent, in float64 on CPU
(float32 on the GPU when one is visible).

Max/min: PyG splits the gradient among exact ties, ours sends it to one winner.
Random floats tie only through duplicate edges, which share their source, so
gradients w.r.t. node features agree; per-edge inputs never hold ties here."""
import copy
import warnings

import numpy as np
import pytest
import torch
import torch_geometric.nn as pyg
from torch_geometric.nn import aggr as pyg_aggr

import fastgnn
import fastgnn.torch as ft
from fastgnn.backends import reference as ref
from fastgnn.testing import assert_results_match, awkward_edge_index, fresh_pyg_class

warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
pytestmark = pytest.mark.filterwarnings("ignore:.*[Ss]parse")

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not (fastgnn.gpu_available() and torch.cuda.is_available()),
                               reason="needs a CUDA device visible to CuPy and torch")

SINGLE = ["sum", "mean", "max", "min", "var", "std"]
CLASS = {"sum": "SumAggregation", "mean": "MeanAggregation", "max": "MaxAggregation",
         "min": "MinAggregation", "var": "VarAggregation", "std": "StdAggregation",
         "mul": "MulAggregation"}
MULTI = ["mean", "max", "min", "std"]


def _id(a):
    return a if isinstance(a, str) else "+".join(a)


def _cot(shape, seed=0, dtype=torch.float64, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(device, dtype)


def _grads(fn, inputs, params=(), seed=0):
    """fn(*leaves) and the gradients of every leaf and parameter under a random
    cotangent, as CPU float64 tensors."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    for _, p in params:
        p.grad = None
    out = fn(*leaves)
    (out * _cot(out.shape, seed, out.dtype, out.device)).sum().backward()
    res = {"output": out.detach().cpu().double()}
    res.update({f"grad input {i}": None if t.grad is None else t.grad.cpu().double()
                for i, t in enumerate(leaves)})
    res.update({f"grad {n}": None if p.grad is None else p.grad.cpu().double()
                for n, p in params})
    return res


def _groups(seed, num_rows=400, dim_size=53, width=5, sort=False):
    """x [num_rows, width] and the group index of each row: a hub group, empty
    groups (the last few and some in between), unsorted unless `sort`."""
    rng = np.random.default_rng(seed)
    live = np.array([g for g in range(dim_size - 4) if g % 7 != 3])
    index = np.where(rng.random(num_rows) < 0.3, 0, rng.choice(live, num_rows))
    if sort:
        index = np.sort(index)
    x = torch.from_numpy(rng.standard_normal((num_rows, width)))
    return x, torch.from_numpy(index)


def _ptr(sorted_index, dim_size):
    counts = torch.bincount(sorted_index, minlength=dim_size)
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)])


def _pyg_module(aggr):
    if isinstance(aggr, str):
        return getattr(pyg_aggr, CLASS[aggr])()
    return pyg_aggr.MultiAggregation(list(aggr))


def _our_module(aggr):
    if isinstance(aggr, str):
        return getattr(ft, CLASS[aggr])()
    return ft.MultiAggregation(list(aggr))


# ------------------------------------------------------- Aggregation modules
@pytest.mark.parametrize("aggr", SINGLE + [MULTI], ids=_id)
@pytest.mark.parametrize("form", ["index", "ptr", "index_3d"])
def test_aggregation_matches_pyg(aggr, form):
    dim_size = 53
    ours, theirs = _our_module(aggr), _pyg_module(aggr)
    if form == "ptr":
        x, index = _groups(1, sort=True, dim_size=dim_size)
        ptr = _ptr(index, dim_size)
        kw = dict(ptr=ptr, dim_size=dim_size)
        inputs = (x,)
    elif form == "index":
        x, index = _groups(2, dim_size=dim_size)
        kw = dict(index=index, dim_size=dim_size)
        inputs = (x,)
    else:                                    # [B, E, F], reduced along dim=1
        x, index = _groups(3, dim_size=dim_size)
        x3 = torch.stack([x, x.flip(1) * 2 + 1], 0)
        kw = dict(index=index, dim_size=dim_size, dim=1)
        inputs = (x3,)
    got = _grads(lambda x: ours(x, **kw), inputs)
    ref_ = _grads(lambda x: theirs(x, **kw), inputs)
    assert_results_match(got, ref_)
    out = got["output"]
    rows = out[-4:] if form != "index_3d" else out[:, -4:]
    assert not rows.any()                    # empty groups give 0


def _with_zeros(x, index, rng):
    """x with zeros: several in group 0's feature 0, exactly one in its
    feature 1, a few scattered (torch's prod gradient treats each apart)."""
    x = x.clone()
    rows0 = torch.nonzero(index == 0).flatten()
    x[rows0[:3], 0] = 0.0
    x[rows0[3], 1] = 0.0
    x[torch.from_numpy(rng.integers(0, x.shape[0], 20)), 2] = 0.0
    return x


@pytest.mark.parametrize("form", ["index", "index_3d"])
@pytest.mark.parametrize("reduce", ["mul", ["mul", "mean", "std"]], ids=_id)
def test_mul_aggregation_matches_pyg(form, reduce):
    """MulAggregation (PyG's takes `index` only): outputs and gradients as
    PyG's, with zeros and empty groups (1)."""
    dim_size = 53
    rng = np.random.default_rng(4)
    x, index = _groups(4, dim_size=dim_size)
    x = _with_zeros(0.5 + x.abs(), index, rng) * torch.sign(x)   # |x| >= 0.5: finite products
    kw = dict(index=index, dim_size=dim_size)
    inputs = (x,)
    if form == "index_3d":
        inputs = (torch.stack([x, x.flip(1)], 0),)
        kw["dim"] = 1
    ours, theirs = _our_module(reduce), _pyg_module(reduce)
    got = _grads(lambda x: ours(x, **kw), inputs)
    assert_results_match(got, _grads(lambda x: theirs(x, **kw), inputs))
    if reduce == "mul":
        rows = got["output"][-4:] if form == "index" else got["output"][:, -4:]
        assert (rows == 1).all()                 # empty groups give 1
    # our ptr form (PyG has none for mul) gives the same as the index form
    if form == "index":
        order = torch.sort(index, stable=True).indices
        by_ptr = _grads(lambda x: ours(x[order], ptr=_ptr(index[order], dim_size)), inputs)
        assert_results_match(by_ptr, got)


def test_aggregation_without_dim_size_and_single_group():
    x, index = _groups(4)
    for name in SINGLE:
        ours, theirs = _our_module(name), _pyg_module(name)
        torch.testing.assert_close(ours(x, index), theirs(x, index))
        torch.testing.assert_close(ours(x), theirs(x))           # one group of all rows
    m, pm = ft.MultiAggregation(MULTI), pyg_aggr.MultiAggregation(MULTI)
    torch.testing.assert_close(m(x, index), pm(x, index))


def test_multi_aggregation_repeats_and_mixed_specs():
    """A repeated reduction and mixed specs (names, PyG class names, our and PyG
    instances); compared with PyG's single modules concatenated (PyG's fused
    MultiAggregation mishandles repeats)."""
    x, index = _groups(5)
    spec = ["mean", "MaxAggregation", ft.StdAggregation(), pyg_aggr.MinAggregation(), "mean",
            "add"]
    names = ["mean", "max", "std", "min", "mean", "sum"]
    m = ft.MultiAggregation(spec)
    assert m.get_out_channels(5) == 30
    got = _grads(lambda x: m(x, index, dim_size=60), (x,))
    ref_ = _grads(lambda x: torch.cat([_pyg_module(n)(x, index, dim_size=60) for n in names],
                                      -1), (x,))
    assert_results_match(got, ref_)


def test_aggregations_are_pyg_aggregations_with_loadable_state():
    for aggr in SINGLE + ["mul", MULTI]:
        ours, theirs = _our_module(aggr), _pyg_module(aggr)
        assert isinstance(ours, pyg_aggr.Aggregation)
        assert repr(ours) == repr(theirs)
        ours.load_state_dict(theirs.state_dict(), strict=True)
        theirs.load_state_dict(ours.state_dict(), strict=True)
        ours.reset_parameters()


def test_neighbour_fast_path_matches_pyg_messages():
    """agg.neighbour(graph, x_src) = PyG's aggregation of x_src[src] by dst."""
    n, ns = 71, 40
    ei = torch.from_numpy(awkward_edge_index(n, 400, seed=6, num_src=ns))
    x = torch.from_numpy(np.random.default_rng(6).standard_normal((ns, 7)))
    for aggr in SINGLE + ["mul", MULTI, ["std", "sum", "max"], ["mul", "mean"]]:
        ours, theirs = _our_module(aggr), _pyg_module(aggr)
        got = _grads(lambda x: ours.neighbour(ei, x, (ns, n)), (x,))
        ref_ = _grads(lambda x: theirs(x[ei[0]], ei[1], dim_size=n), (x,))
        assert_results_match(got, ref_)


def test_aggregation_bad_inputs():
    x, index = _groups(7)
    agg = ft.MaxAggregation()
    with pytest.raises(ValueError, match="entries"):
        agg(x, index[:-1])
    with pytest.raises(ValueError, match="negative"):
        agg(x, index - 1)
    with pytest.raises(ValueError, match="dim_size"):
        agg(x, index, dim_size=3)
    with pytest.raises(TypeError, match="integers"):
        agg(x, index.double())
    with pytest.raises(ValueError, match="dim_size"):
        agg(x, ptr=torch.tensor([0, 100, 400]), dim_size=5)
    with pytest.raises(ValueError, match="400 rows"):
        agg(x, ptr=torch.tensor([0, 100, 300]))
    with pytest.raises(ValueError, match="non-decreasing"):
        agg(x, ptr=torch.tensor([0, 300, 100, 400]))
    with pytest.raises(ValueError):
        agg(x, index, dim=2)
    with pytest.raises(TypeError):
        agg(x.long(), index)
    with pytest.raises(ValueError, match="mode"):
        ft.MultiAggregation(["mean", "max"], mode="median")
    with pytest.raises(NotImplementedError, match="lstm"):
        ft.MultiAggregation(["mean", "lstm"])
    with pytest.raises(NotImplementedError, match="semi_grad"):
        ft.StdAggregation(semi_grad=True)
    with pytest.raises(ValueError, match="empty"):
        ft.MultiAggregation([])


def test_empty_inputs():
    x = torch.zeros(0, 3, dtype=torch.float64, requires_grad=True)
    out = ft.MultiAggregation(MULTI)(x, torch.zeros(0, dtype=torch.long), dim_size=4)
    assert out.shape == (4, 12) and not out.any()
    out.sum().backward()
    assert x.grad.shape == (0, 3)
    out = ft.StdAggregation()(x, ptr=torch.zeros(1, dtype=torch.long))
    assert out.shape == (0, 3)


# ----------------------------------------------------------------- functional
@pytest.mark.parametrize("reduce", SINGLE + [MULTI], ids=_id)
def test_functional_segment_reduce_matches_reference(reduce):
    n = 90
    ei = awkward_edge_index(n, 700, seed=8)
    rng = np.random.default_rng(8)
    x = torch.from_numpy(rng.standard_normal((n, 6)))
    out = _grads(lambda x: ft.segment_reduce(torch.from_numpy(ei), x, reduce), (x,))
    go = _cot(out["output"].shape).numpy()
    np.testing.assert_allclose(out["output"].numpy(), ref.segment_reduce(ei, x.numpy(), reduce, n),
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out["grad input 0"].numpy(),
                               ref.segment_reduce_vjp(ei, x.numpy(), reduce, n, go),
                               rtol=1e-10, atol=1e-12)


def test_functional_gradcheck_and_aliases():
    ei = torch.tensor([[0, 1, 2, 2, 3, 1], [1, 2, 0, 2, 2, 0]])
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    for reduce in (["sum", "mean", "var"], "std", "max"):
        assert torch.autograd.gradcheck(lambda x: ft.segment_reduce(ei, x, reduce), (x,))
    g = fastgnn.Graph.from_edge_index(ei.numpy(), num_nodes=5)
    torch.testing.assert_close(ft.segment_reduce(g, x, "add"), ft.segment_reduce(ei, x, "sum"))
    torch.testing.assert_close(ft.segment_reduce(ei, x, ["add", "min"])[:, :3],
                               ft.segment_reduce(ei, x, "sum"))
    ptr = torch.tensor([0, 2, 2, 5])
    v = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: ft.segment_csr(ptr, v, "std"), (v,))
    assert ft.segment_csr(ptr, v, "max").shape == (3, 2, 3)
    v1 = v[:, 0, 0].detach()
    torch.testing.assert_close(ft.segment_csr(ptr, v1, "mean"),
                               torch.stack([v1[:2].mean(), v1.new_zeros(()), v1[2:].mean()]))
    both = ft.segment_csr(ptr, v[:, 0], ["max", "add"])
    torch.testing.assert_close(both[:, 3:], ft.segment_csr(ptr, v[:, 0], "sum"))


def test_functional_bad_inputs():
    ei = torch.tensor([[0, 1], [1, 0]])
    x = torch.randn(2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="reduce"):
        ft.segment_reduce(ei, x, "median")
    with pytest.raises(ValueError, match="more than once"):
        ft.segment_reduce(ei, x, ["max", "max"])
    with pytest.raises(TypeError, match="x must be"):
        ft.segment_reduce(ei, x.numpy())
    with pytest.raises(ValueError, match="rows"):
        ft.segment_reduce(ei, x, num_nodes=(3, 2))
    w = torch.sparse_coo_tensor(ei.flip(0), torch.tensor([2.0, 1.0]), (2, 2)).to_sparse_csr()
    with pytest.raises(ValueError, match="edge weights"):
        ft.segment_reduce(w, x, "max")
    with pytest.raises(TypeError, match="integers"):
        ft.segment_csr(torch.tensor([0.0, 2.0]), x, "max")
    with pytest.raises(ValueError, match="indptr ends"):
        ft.segment_csr(torch.tensor([0, 1]), x, "max")
    with pytest.raises(ValueError, match="list of reductions"):
        ft.segment_csr(torch.tensor([0, 2]), x[:, 0], ["max", "min"])


# -------------------------------------------------------------------- SAGEConv
SAGE_AGGRS = ["max", "min", "std", "var", ["mean", "max"], "mul", ["std", "mul"]]
SAGE_CASES = [(a, form, opts) for i, a in enumerate(SAGE_AGGRS)
              for form, opts in (
                  ("square", dict(out=11)),
                  ("bipartite", dict(out=3, project=i % 2 == 0, normalize=True)),
                  ("dst_none", dict(out=4, root_weight=False, bias=False)),
                  ("adj_t", dict(out=5, project=i % 2 == 1)))]


def _sage_inputs(form, seed):
    n, ns, fs, fd = 61, 37, 6, 4
    rng = np.random.default_rng(seed)
    if form in ("square", "adj_t"):
        ei = torch.from_numpy(awkward_edge_index(n, 5 * n, seed=seed))
        x = torch.from_numpy(rng.standard_normal((n, fs)))
        in_ch, xin, sizes = fs, (x,), (n, n)
    else:
        ei = torch.from_numpy(awkward_edge_index(n, 5 * n, seed=seed, num_src=ns))
        x = torch.from_numpy(rng.standard_normal((ns, fs)))
        x_dst = torch.from_numpy(rng.standard_normal((n, fd)))
        in_ch, xin, sizes = (fs, fd), (x, x_dst), (ns, n)
        if form == "dst_none":
            ei = ei[:, ei[1] < ns]
    adj = ei
    if form == "adj_t":
        # an adj_t of ones (duplicates dropped): PyG weighs max/min by its values
        ei = torch.unique(ei, dim=1)
        adj = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1], dtype=torch.float64),
                                      (sizes[1], sizes[0])).coalesce().to_sparse_csr()
    return in_ch, xin, adj


def _run_layer(layer, xin, adj):
    params = list(layer.named_parameters())

    def fn(*xs):
        if len(xs) == 1:
            return layer(xs[0], adj)
        return layer((xs[0], None if xs[1].numel() == 0 else xs[1]), adj)
    return _grads(fn, xin, params)


def _sage_compare(ref_layer, our_layer, xin, adj):
    ref_layer = ref_layer.double()
    our_layer.load_state_dict(ref_layer.state_dict(), strict=True)
    our_layer = our_layer.double()
    assert_results_match(_run_layer(our_layer, xin, adj), _run_layer(ref_layer, xin, adj))
    ref_layer.load_state_dict(our_layer.state_dict(), strict=True)


@pytest.mark.parametrize("aggr,form,opts", SAGE_CASES,
                         ids=[f"{_id(a)}-{f}" for a, f, _ in SAGE_CASES])
def test_sage_aggr_matches_pyg(aggr, form, opts):
    opts = dict(opts)
    out = opts.pop("out")
    in_ch, xin, adj = _sage_inputs(form, seed=11)
    if form == "dst_none":
        xin = (xin[0], torch.zeros(0, 4, dtype=torch.float64))   # stands for None
    torch.manual_seed(0)
    ref_layer = fresh_pyg_class(pyg.SAGEConv)(in_ch, out, aggr=aggr, **opts)
    ours = ft.SAGEConv(in_ch, out, aggr=aggr, **opts)
    assert ours.lin_l.in_features == ref_layer.lin_l.in_channels
    assert repr(ours) == repr(ref_layer)
    _sage_compare(ref_layer, ours, xin, adj)


@pytest.mark.parametrize("make", [
    lambda: ft.MaxAggregation(), lambda: pyg_aggr.StdAggregation(),
    lambda: ft.MultiAggregation(["min", "var", "sum"]),
    lambda: pyg_aggr.MultiAggregation(["max", "mean"]), lambda: ft.MeanAggregation(),
    lambda: "MinAggregation"], ids=["ours_max", "pyg_std", "ours_multi", "pyg_multi",
                                    "ours_mean", "class_name"])
def test_sage_aggregation_instances(make):
    in_ch, (x,), ei = _sage_inputs("square", seed=12)
    torch.manual_seed(0)
    ref_layer = fresh_pyg_class(pyg.SAGEConv)(in_ch, 5, aggr=make())
    ours = ft.SAGEConv(in_ch, 5, aggr=make())
    assert ours.lin_l.in_features == ref_layer.lin_l.in_channels
    _sage_compare(ref_layer, ours, (x,), ei)


def test_sage_weighted_adj_t_follows_pyg():
    """PyG uses a sparse adj_t's values only for str sum/mean/max/min (its fused
    path): std and Aggregation instances ignore them; weighted max is refused."""
    n = 61
    ei = torch.from_numpy(awkward_edge_index(n, 5 * n, seed=13))     # duplicates: values 2
    x = torch.from_numpy(np.random.default_rng(13).standard_normal((n, 6)))
    w = torch.rand(ei.shape[1], dtype=torch.float64) + 0.5
    adj = torch.sparse_coo_tensor(ei.flip(0), w, (n, n)).coalesce().to_sparse_csr()
    for aggr in ("std", ["max", "sum"], pyg_aggr.SumAggregation(), "mean"):
        torch.manual_seed(0)
        _sage_compare(fresh_pyg_class(pyg.SAGEConv)(6, 4, aggr=copy.deepcopy(aggr)),
                      ft.SAGEConv(6, 4, aggr=copy.deepcopy(aggr)), (x,), adj)
    with pytest.raises(NotImplementedError, match="weighted"):
        ft.SAGEConv(6, 4, aggr="max")(x, adj)


def test_sage_lazy_multi_and_unsupported():
    in_ch, (x,), ei = _sage_inputs("square", seed=14)
    ref_layer = fresh_pyg_class(pyg.SAGEConv)(-1, 4, aggr=["mean", "max", "std"])
    ours = ft.SAGEConv(-1, 4, aggr=["mean", "max", "std"])
    ref_layer(x.float(), ei)
    ours(x.float(), ei)
    assert ours.lin_l.in_features == 18
    _sage_compare(ref_layer, ours, (x,), ei)
    for bad in ("lstm", ["mean", "median"], pyg_aggr.MedianAggregation()):
        with pytest.raises(NotImplementedError):
            ft.SAGEConv(6, 4, aggr=bad)


# ------------------------------------------------------------------------ GPU
def test_deterministic_keyword_validated():
    """fastgnn's `deterministic` keyword: a bool everywhere, TypeError naming it."""
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    x = torch.randn(3, 4, dtype=torch.float64)
    ptr = torch.tensor([0, 2, 3])
    bad = [lambda: ft.segment_reduce(ei, x, "max", deterministic="no"),
           lambda: ft.segment_csr(ptr, x, "max", deterministic=1),
           lambda: ft.MaxAggregation(deterministic=None),
           lambda: ft.StdAggregation(deterministic="no"),
           lambda: ft.MultiAggregation(["max", "mean"], deterministic=0),
           lambda: ft.MaxAggregation().neighbour(ei, x, deterministic="no"),
           lambda: ft.SAGEConv(4, 4, aggr="max", deterministic="no")]
    for fn in bad:
        with pytest.raises(TypeError, match="deterministic must be a bool"):
            fn()
    with pytest.raises(TypeError, match="SAGEConv: deterministic"):
        ft.SAGEConv(4, 4, aggr="max", deterministic="no")
    assert ft.SAGEConv(4, 4, aggr="max").deterministic is True
    assert repr(ft.MaxAggregation()) == "MaxAggregation()"
    assert "deterministic=False" in repr(ft.MinAggregation(deterministic=False))


@pytest.mark.parametrize("make,want", [
    (lambda: ft.SAGEConv(4, 3, aggr="max"), True),
    (lambda: ft.SAGEConv(4, 3, aggr="max", deterministic=False), False),
    (lambda: ft.SAGEConv(4, 3, aggr=["mean", "min"], deterministic=False), False),
    (lambda: ft.SAGEConv(4, 3, aggr=ft.MaxAggregation(deterministic=False)), False),
    (lambda: ft.SAGEConv(4, 3, aggr="max", aggr_kwargs={"deterministic": False}), False),
    (lambda: ft.MultiAggregation(["max", ft.MinAggregation(deterministic=False)]), False),
    (lambda: ft.MultiAggregation(["max", "std"], deterministic=False), False),
    (lambda: ft.MultiAggregation(["max", "std"]), True),
    (lambda: ft.MaxAggregation(deterministic=False), False),
], ids=["sage_default", "sage_false", "sage_multi_false", "sage_instance_false",
        "sage_aggr_kwargs", "multi_sub_false", "multi_false", "multi_default", "max_false"])
def test_deterministic_reaches_the_backward(monkeypatch, make, want):
    """The keyword travels from the module through autograd to the backend's
    backward (the CPU one ignores it; the CUDA one switches to atomics), and
    the gradients stay those of the default."""
    from fastgnn.backends import cpu
    seen = []
    inner = cpu.segment_bwd

    def spy(*args, **kw):
        seen.append(kw.get("deterministic", True))
        return inner(*args, **kw)
    monkeypatch.setattr(cpu, "segment_bwd", spy)
    ei = torch.from_numpy(awkward_edge_index(40, 200, seed=5))
    x = torch.randn(40, 4, dtype=torch.float64, requires_grad=True)
    m = make().double()
    if isinstance(m, ft.SAGEConv):
        outs = [m(x, ei)]
    else:                     # the fused path and PyG's call (segment_csr)
        outs = [m.neighbour(ei, x), m(x[ei[0]], index=ei[1], dim_size=40)]
    for out in outs:
        (out * torch.randn_like(out)).sum().backward()
    assert len(seen) == len(outs) and all(s is want for s in seen), seen


@gpu
@needs_gpu
@pytest.mark.parametrize("aggr", ["max", ["mean", "max", "min", "std"]], ids=_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_sage_nondeterministic_matches_default(aggr, dtype):
    """SAGEConv(deterministic=False) on CUDA: the output bit for bit and every
    gradient (x and parameters) within rounding of the default layer."""
    n = 1501
    ei = torch.from_numpy(awkward_edge_index(n, 12 * n, hub_degree=3000, seed=17)).cuda()
    x = torch.randint(-3, 4, (n, 24), device="cuda").to(dtype)     # ties
    torch.manual_seed(0)
    a = ft.SAGEConv(24, 16, aggr=aggr).to("cuda", dtype)
    b = ft.SAGEConv(24, 16, aggr=aggr, deterministic=False).to("cuda", dtype)
    b.load_state_dict(a.state_dict(), strict=True)
    got = _grads(lambda x: b(x, ei), (x,), list(b.named_parameters()))
    want = _grads(lambda x: a(x, ei), (x,), list(a.named_parameters()))
    assert torch.equal(got["output"], want["output"])
    assert_results_match(got, want, "tf32" if dtype == torch.float32 else "bfloat16")


@gpu
@needs_gpu
@pytest.mark.parametrize("aggr", SINGLE + [MULTI], ids=_id)
@pytest.mark.parametrize("form", ["index", "ptr", "neighbour"])
def test_gpu_aggregation_float32_matches_pyg_float64(aggr, form):
    n = 3001
    rng = np.random.default_rng(15)
    ei = torch.from_numpy(awkward_edge_index(n, 12 * n, seed=15))
    x = torch.from_numpy(rng.standard_normal((n, 40))).float().double()
    ours, theirs = _our_module(aggr), _pyg_module(aggr)
    if form == "neighbour":
        ei_cuda = ei.cuda()
        got = _grads(lambda x: ours.neighbour(ei_cuda, x), (x.cuda().float(),))
        ref_ = _grads(lambda x: theirs(x[ei[0]], ei[1], dim_size=n), (x,))
    else:
        # per-edge messages: duplicate edges would make tied rows, whose max/min
        # gradient PyG splits; keep one copy of each edge
        ei = torch.unique(ei, dim=1)
        msgs, index = x[ei[0]], ei[1]
        if form == "ptr":
            order = torch.sort(index, stable=True).indices
            msgs, index = msgs[order], index[order]
            kw_cpu = dict(ptr=_ptr(index, n), dim_size=n)
        else:
            msgs, index = msgs.flip(0), index.flip(0)         # unsorted
            kw_cpu = dict(index=index, dim_size=n)
        kw_gpu = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in kw_cpu.items()}
        got = _grads(lambda m: ours(m, **kw_gpu), (msgs.cuda().float(),))
        ref_ = _grads(lambda m: theirs(m, **kw_cpu), (msgs,))
    assert got["output"].shape == ref_["output"].shape
    assert_results_match(got, ref_, "tf32")


@gpu
@needs_gpu
@pytest.mark.parametrize("aggr", ["max", "std", ["mean", "max", "min", "std"]], ids=_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_sage_aggr_matches_pyg_float64(aggr, dtype):
    n = 1501
    rng = np.random.default_rng(16)
    ei = torch.from_numpy(awkward_edge_index(n, 12 * n, seed=16))
    x = torch.from_numpy(rng.standard_normal((n, 24))).to(dtype).double()
    torch.manual_seed(0)
    ref_layer = fresh_pyg_class(pyg.SAGEConv)(24, 16, aggr=aggr).double()
    ours = ft.SAGEConv(24, 16, aggr=aggr)
    ours.load_state_dict(ref_layer.state_dict(), strict=True)
    ours = ours.to("cuda", dtype)
    # the reference sees the parameters the device run sees (rounded to dtype)
    ref_layer.load_state_dict({k: v.to(dtype).double() for k, v in ours.state_dict().items()})
    base_layer = copy.deepcopy(ref_layer).to("cuda", dtype)
    ei_cuda = ei.cuda()
    got = _grads(lambda x: ours(x, ei_cuda), (x.cuda().to(dtype),),
                 list(ours.named_parameters()))
    ref_ = _grads(lambda x: ref_layer(x, ei), (x,), list(ref_layer.named_parameters()))
    try:                                   # PyG itself in the same dtype on the device
        base = _grads(lambda x: base_layer(x, ei_cuda), (x.cuda().to(dtype),),
                      list(base_layer.named_parameters()))
    except (RuntimeError, NotImplementedError):
        base = None
    assert got["output"].shape == ref_["output"].shape
    if dtype == torch.bfloat16:
        # bf16 rounding ties distinct sources; max/min then send x's gradient to
        # one of the equal values where PyG splits it (parameter gradients agree)
        for d in (got, ref_, base):
            if d is not None:
                d.pop("grad input 0")
    assert_results_match(got, ref_, "tf32" if dtype == torch.float32 else "bfloat16", base)


@gpu
@needs_gpu
@pytest.mark.parametrize("aggr", ["mul", ["mul", "mean", "std"]], ids=_id)
@pytest.mark.parametrize("form", ["index", "neighbour", "sage"])
def test_gpu_mul_float32_matches_pyg_float64(aggr, form):
    """mul on the GPU (fp32 products; a hub of 600 in-edges split into tasks
    whose partial products and zero counts merge) against PyG in float64,
    with zeros in the features: per-edge messages by index, the fused
    neighbour path, and SAGEConv."""
    n = 3001
    rng = np.random.default_rng(17)
    ei = torch.from_numpy(awkward_edge_index(n, 12 * n, hub_degree=600, seed=17))
    x = rng.uniform(0.8, 1.25, (n, 40)) * rng.choice([-1.0, 1.0], (n, 40))
    x[rng.integers(0, n, 300), rng.integers(0, 40, 300)] = 0.0
    x = torch.from_numpy(x).float().double()
    ours, theirs = _our_module(aggr), _pyg_module(aggr)
    ei_cuda = ei.cuda()
    if form == "index":
        msgs, index = x[ei[0]], ei[1]
        got = _grads(lambda m: ours(m, index=index.cuda(), dim_size=n), (msgs.cuda().float(),))
        ref_ = _grads(lambda m: theirs(m, index=index, dim_size=n), (msgs,))
    elif form == "neighbour":
        got = _grads(lambda x: ours.neighbour(ei_cuda, x), (x.cuda().float(),))
        ref_ = _grads(lambda x: theirs(x[ei[0]], ei[1], dim_size=n), (x,))
    else:
        torch.manual_seed(0)
        ref_layer = fresh_pyg_class(pyg.SAGEConv)(40, 16, aggr=aggr).double()
        layer = ft.SAGEConv(40, 16, aggr=aggr)
        layer.load_state_dict(ref_layer.state_dict(), strict=True)
        layer = layer.cuda().float()
        ref_layer.load_state_dict({k: v.float().double() for k, v in layer.state_dict().items()})
        params, ref_params = list(layer.named_parameters()), list(ref_layer.named_parameters())
        got = _grads(lambda x: layer(x, ei_cuda), (x.cuda().float(),), params)
        ref_ = _grads(lambda x: ref_layer(x, ei), (x,), ref_params)
    assert got["output"].shape == ref_["output"].shape
    assert_results_match(got, ref_, "tf32")


# ------------------------------------------------------ segment_reduce_linear
def _linear_case(bipartite, seed, device="cpu", dtype=torch.float64):
    """(edge_index, x, x_root or None, W, b, W_r) with a hub and empty rows."""
    n, ns, f, fr, m = 70, 45, 7, 5, 6
    rng = np.random.default_rng(seed)
    ei = awkward_edge_index(n, 6 * n, hub_degree=40, seed=seed, num_src=ns if bipartite else None)
    t = lambda *s: torch.from_numpy(rng.standard_normal(s)).to(device, dtype)  # noqa: E731
    x = t(ns if bipartite else n, f)
    x_root = t(n, fr) if bipartite else None
    return torch.from_numpy(ei).to(device), x, x_root, t, (n, f, fr if bipartite else f, m)


@pytest.mark.parametrize("reduce", ["max", ["mean", "max", "min", "std"], "mul"], ids=_id)
@pytest.mark.parametrize("bipartite", [False, True])
@pytest.mark.parametrize("terms", ["all", "no_bias", "no_root"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[gpu, needs_gpu])])
def test_segment_reduce_linear_matches_composition(reduce, bipartite, terms, device):
    """One node for W reduce(x) + b + W_r x_root (x_root = x when square)
    against segment_reduce, F.linear and the root product composed by
    autograd: output and every gradient (x, W, b, W_r, x_root), with a hub,
    empty rows, duplicates and self-loops."""
    dtype = torch.float64 if device == "cpu" else torch.float32
    ei, x, x_root, t, (n, f, fr, m) = _linear_case(bipartite, 5, device, dtype)
    r = 1 if isinstance(reduce, str) else len(reduce)
    if reduce == "mul":
        x = x.sign() * (0.8 + 0.4 * x.abs().clamp(max=1))     # products stay in range
    w, b, wr = t(m, r * f), t(m), t(m, fr)
    if terms == "no_bias":
        b = None
    if terms == "no_root":
        wr, x_root = None, None
    nn = (x.shape[0], n)

    def ours(x, w, *rest):
        b_, wr_, xr_ = _unpack(rest)
        return ft.segment_reduce_linear(ei, x, reduce, w, b_, wr_, xr_, num_nodes=nn)

    def composed(x, w, *rest):
        b_, wr_, xr_ = _unpack(rest)
        out = torch.nn.functional.linear(ft.segment_reduce(ei, x, reduce, num_nodes=nn), w, b_)
        if wr_ is not None:
            out = out + (x if xr_ is None else xr_) @ wr_.t()
        return out

    def _unpack(rest):
        it = iter(rest)
        return (next(it) if b is not None else None, next(it) if wr is not None else None,
                next(it) if x_root is not None else None)

    inputs = [x, w] + [v for v in (b, wr, x_root) if v is not None]
    got, want = _grads(ours, inputs), _grads(composed, inputs)
    assert all(v is not None for v in got.values())
    assert_results_match(got, want, "float64" if dtype == torch.float64 else "float32")


def _count_calls(monkeypatch, module, *names):
    """{name: calls so far} of module's functions `names` (wrapped for the test)."""
    counts = dict.fromkeys(names, 0)
    for name in names:
        real = getattr(module, name)

        def counted(*a, _real=real, _name=name, **k):
            counts[_name] += 1
            return _real(*a, **k)
        monkeypatch.setattr(module, name, counted)
    return counts


@gpu
@needs_gpu
@pytest.mark.parametrize("reduce", ["max", ["mean", "max", "min", "std"], "mul", ["sum", "var"]],
                         ids=_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16],
                         ids=str)
@pytest.mark.parametrize("width", [128, 7])
@pytest.mark.parametrize("bipartite", [False, True])
def test_segment_reduce_linear_cuda_fast_path_matches_generic(reduce, dtype, width, bipartite,
                                                              monkeypatch):
    """On CUDA the node's reduction runs its launch plans on torch buffers
    (fastgnn.torch.plans, no DLPack bridge): the same kernels as the
    generic bridge, so the output and every gradient must be bitwise the
    generic path's. A hub of 700 in-edges (split over several tasks: the
    combine kernels run), empty rows, duplicates, a non-contiguous x, the
    inference forward, 16-bit types (x's gradient gets the root term as an
    fp32 addend)."""
    from fastgnn.torch import _autograd, plans
    n, ns, m = 300, 200, 24
    ei = torch.from_numpy(awkward_edge_index(n, 3000, hub_degree=700, seed=3,
                                             num_src=ns if bipartite else None)).cuda()
    rng = np.random.default_rng(4)
    r = 1 if isinstance(reduce, str) else len(reduce)
    t = lambda *s: torch.from_numpy(rng.standard_normal(s)).cuda().to(dtype)  # noqa: E731
    nsrc = ns if bipartite else n
    x = t(width, nsrc).t()                          # non-contiguous
    if reduce == "mul":
        x = x.sign() * (0.8 + 0.4 * x.abs().clamp(max=1))
    w, b, wr = t(m, r * width), t(m), t(m, width)
    x_root = t(n, width) if bipartite else None
    inputs = [x, w, b, wr] + ([x_root] if bipartite else [])

    def run(*leaves):
        xr = leaves[4] if bipartite else None
        return ft.segment_reduce_linear(ei, leaves[0], reduce, *leaves[1:4], xr,
                                        num_nodes=(nsrc, n))

    plan_calls = _count_calls(monkeypatch, plans, "segment_forward", "segment_backward")
    fast = _grads(run, inputs)
    with torch.no_grad():
        fast_inference = run(*inputs)
    # the plans served every call: training forward, backward, inference forward
    assert plan_calls == {"segment_forward": 2, "segment_backward": 1}, plan_calls
    monkeypatch.setattr(_autograd, "PLANS", False)
    generic = _grads(run, inputs)
    with torch.no_grad():
        generic_inference = run(*inputs)
    assert plan_calls == {"segment_forward": 2, "segment_backward": 1}, plan_calls
    def same_bits(a, b):                      # NaN where NaN (16-bit mul overflows)
        return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
    for key, want in generic.items():
        assert want is not None and same_bits(fast[key], want), key
    assert same_bits(fast_inference, generic_inference)


@gpu
@needs_gpu
def test_segment_reduce_linear_cuda_atomic_backward_stays_generic(monkeypatch):
    """deterministic=False with a max term is not the fast path's (its
    atomics live in the generic backend): the generic bridge serves it, and
    its gradients match the deterministic ones up to summation order."""
    from fastgnn.torch import _autograd, plans
    ei, x, _, t, (n, f, _, m) = _linear_case(False, 2, "cuda", torch.float32)
    w, b, wr = t(m, f), t(m), t(m, f)
    plan_calls = _count_calls(monkeypatch, plans, "segment_forward")
    bridge_calls = _count_calls(monkeypatch, _autograd, "device_scope")
    atomic = _grads(lambda x_, *v: ft.segment_reduce_linear(ei, x_, "max", *v,
                                                            deterministic=False), [x, w, b, wr])
    assert plan_calls == {"segment_forward": 0} and bridge_calls["device_scope"] >= 2
    det = _grads(lambda x_, *v: ft.segment_reduce_linear(ei, x_, "max", *v), [x, w, b, wr])
    assert_results_match(atomic, det, "float32")


def test_segment_reduce_linear_is_one_node_in_sage():
    """SAGEConv(aggr="max") and lists run as one segment_reduce_linear node
    (its output's grad_fn), repeated codes and hooked linears do not."""
    ei, x, *_ = _linear_case(False, 3)
    for aggr in ("max", ["mean", "max"], ["max", "min", "std"]):
        out = ft.SAGEConv(7, 4, aggr=aggr).double()(x.requires_grad_(), ei)
        assert type(out.grad_fn).__name__ == "_SegmentReduceLinearBackward", aggr
    out = ft.SAGEConv(7, 4, aggr=["max", "max"]).double()(x, ei)
    assert type(out.grad_fn).__name__ != "_SegmentReduceLinearBackward"
    layer = ft.SAGEConv(7, 4, aggr="max").double()
    layer.lin_l.register_forward_hook(lambda *a: None)
    assert type(layer(x, ei).grad_fn).__name__ != "_SegmentReduceLinearBackward"


def test_segment_reduce_linear_inference_and_partial_grads():
    """Under no_grad (no node) and with only the weights requiring grad (x
    takes none: the forward tracks no positions) it equals the composition."""
    ei, x, _, t, (n, f, _, m) = _linear_case(False, 9)
    w, b, wr = t(m, f), t(m), t(m, f)
    want = torch.nn.functional.linear(ft.segment_reduce(ei, x, "max"), w, b) + x @ wr.t()
    with torch.no_grad():
        got = ft.segment_reduce_linear(ei, x, "max", w.requires_grad_(), b, wr)
    assert got.grad_fn is None
    torch.testing.assert_close(got, want)
    out = ft.segment_reduce_linear(ei, x, "max", w, b, wr)
    gw, = torch.autograd.grad(out.sum(), [w])
    gw_want, = torch.autograd.grad(
        (torch.nn.functional.linear(ft.segment_reduce(ei, x, "max"), w, b) + x @ wr.t()).sum(),
        [w])
    torch.testing.assert_close(gw, gw_want)


def test_segment_reduce_linear_bad_inputs_raise():
    ei, x, _, t, (n, f, _, m) = _linear_case(False, 2)
    w = t(m, f)
    cases = [
        (lambda: ft.segment_reduce_linear(ei, x, "max", t(m, f + 1)), ValueError, "weight"),
        (lambda: ft.segment_reduce_linear(ei, x, ["max", "min"], w), ValueError, "weight"),
        (lambda: ft.segment_reduce_linear(ei, x, "max", w, t(m + 1)), ValueError, "bias"),
        (lambda: ft.segment_reduce_linear(ei, x, "max", w, None, t(m, f + 2)), ValueError,
         "root_weight"),
        (lambda: ft.segment_reduce_linear(ei, x, "max", w, None, None, x), ValueError, "x_root"),
        (lambda: ft.segment_reduce_linear(ei, x, "max", w, None, t(m, f), t(n + 1, f)),
         ValueError, "x_root"),
        (lambda: ft.segment_reduce_linear(ei, x, "max", w.float()), TypeError, "weight"),
        (lambda: ft.segment_reduce_linear(ei, x, "max", w.numpy()), TypeError, "weight"),
        (lambda: ft.segment_reduce_linear(ei, x[0], "max", w), ValueError, "x"),
        (lambda: ft.segment_reduce_linear(ei, x, "lstm", w), ValueError, "reduce"),
    ]
    for fn, err, word in cases:
        with pytest.raises(err, match=word):
            fn()
