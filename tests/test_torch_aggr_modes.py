"""fastgnn.torch's SoftmaxAggregation, PowerMeanAggregation and
MultiAggregation in every combine mode, against PyG 2.8's own modules holding
the same state_dict: outputs and the gradients of x and of every parameter
(learnable t / p, the proj and attn weights) under a random cotangent, in
float64 on the CPU. Inputs come from the test's seed (printed with a
failure): unsorted and sorted `index` and `ptr`, empty groups between live
ones and after the last (dim_size > max(index) + 1), odd widths. Also: the
fused neighbour path and SAGEConv, state_dicts both ways and seeded
construction, PyG instances and names, what softmax keeps for its backward,
torch.compile, and bad arguments."""
import math
import warnings

import numpy as np
import pytest
import torch
import torch_geometric.nn as pyg
from torch_geometric.nn import aggr as pyg_aggr
from torch_geometric.nn.resolver import aggregation_resolver

import fastgnn.torch as ft
from fastgnn.testing import assert_results_match, awkward_edge_index, fresh_pyg_class
from fastgnn.torch import aggr as ft_aggr

warnings.filterwarnings("ignore", message=".*[Ss]parse.*")

FORMS = ["unsorted_index", "sorted_index", "ptr"]
WIDTHS = (1, 3, 7)
DIM_SIZE = 17


def _single_specs(width):
    """name -> (class name, kwargs) of the softmax and power mean cases."""
    return {
        "softmax": ("SoftmaxAggregation", {}),
        "softmax_t": ("SoftmaxAggregation", dict(t=2.5)),
        "softmax_learn": ("SoftmaxAggregation", dict(t=0.7, learn=True)),
        "softmax_channels": ("SoftmaxAggregation", dict(t=1.3, learn=True, channels=width)),
        "softmax_semi_grad": ("SoftmaxAggregation", dict(t=3.0, semi_grad=True)),
        "powermean": ("PowerMeanAggregation", {}),
        "powermean_p": ("PowerMeanAggregation", dict(p=2.0)),
        "powermean_learn": ("PowerMeanAggregation", dict(p=1.7, learn=True)),
        "powermean_channels": ("PowerMeanAggregation", dict(p=2.5, learn=True, channels=width)),
        "powermean_no_min": ("PowerMeanAggregation", dict(p=2.0, clamp_min=None)),
    }


MEMBERS = ["mean", "softmax", "max", "powermean", "std"]
MEMBER_KWARGS = [{}, dict(t=0.5, learn=True), {}, dict(p=1.5, learn=True), {}]
MODES = ["cat", "proj", "attn", "sum", "mean", "max", "min", "logsumexp", "std", "var"]


def _multi_spec(mode, width, members=MEMBERS, member_kwargs=MEMBER_KWARGS):
    mode_kwargs = {"proj": dict(in_channels=width, out_channels=5),
                   "attn": dict(in_channels=width, out_channels=6, num_heads=2)}.get(mode)
    return ("MultiAggregation", dict(aggrs=list(members), aggrs_kwargs=list(member_kwargs),
                                     mode=mode, mode_kwargs=mode_kwargs))


def _build(lib, spec, seed=None):
    """The module of `spec` from `lib` (fastgnn.torch or PyG's aggr), in float64."""
    name, kwargs = spec
    if seed is not None:
        torch.manual_seed(seed)
    return getattr(lib, name)(**kwargs).double()


def _pair(spec, seed):
    """(ours, PyG's) with PyG's initial state loaded into ours."""
    theirs = _build(pyg_aggr, spec, seed)
    ours = _build(ft, spec, seed)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return ours, theirs


def _groups(rng, width, form, num_rows=60):
    """x [num_rows, width] and PyG call kwargs: groups 2, 7, 12 and the last
    three of DIM_SIZE hold no row; `form` as in FORMS."""
    live = np.array([g for g in range(DIM_SIZE - 3) if g % 5 != 2])
    index = rng.choice(live, num_rows)
    if form != "unsorted_index":
        index = np.sort(index)
    x = torch.from_numpy(rng.standard_normal((num_rows, width)))
    index = torch.from_numpy(index)
    if form == "ptr":
        counts = torch.bincount(index, minlength=DIM_SIZE)
        return x, dict(ptr=torch.cat([counts.new_zeros(1), counts.cumsum(0)]),
                       dim_size=DIM_SIZE)
    return x, dict(index=index, dim_size=DIM_SIZE)


def _run(fn, module, x, seed):
    """fn(x) and the gradients of x and of module's named parameters under
    a cotangent drawn from `seed`."""
    x = x.detach().clone().requires_grad_()
    module.zero_grad(set_to_none=True)
    out = fn(x)
    cot = torch.from_numpy(np.random.default_rng(seed).standard_normal(tuple(out.shape)))
    (out * cot).sum().backward()
    res = {"output": out.detach(), "grad x": x.grad}
    res.update({f"grad {n}": p.grad for n, p in module.named_parameters()})
    return res


def _match(ours, theirs, what):
    try:
        assert_results_match(ours, theirs)
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from None


def _compare(spec, x, kw, seed, what):
    ours, theirs = _pair(spec, seed)
    got = _run(lambda v: ours(v, **kw), ours, x, seed)
    want = _run(lambda v: theirs(v, **kw), theirs, x, seed)
    _match(got, want, f"{what} (seed {seed})")
    return got


# ------------------------------------------------------------ PyG's call
@pytest.mark.parametrize("form", FORMS)
def test_softmax_and_power_mean_match_pyg(form, rng, seed):
    for width in WIDTHS:
        x, kw = _groups(rng, width, form)
        for name, spec in _single_specs(width).items():
            got = _compare(spec, x, kw, seed, f"{name}, width {width}, {form}")
            if name.startswith("softmax"):
                assert not got["output"][-3:].any(), name      # empty groups give 0


@pytest.mark.parametrize("form", FORMS)
def test_multi_aggregation_modes_match_pyg(form, rng, seed):
    for width in WIDTHS:
        x, kw = _groups(rng, width, form)
        for mode in MODES:
            _compare(_multi_spec(mode, width), x, kw, seed, f"mode={mode}, width {width}, {form}")
        # basic members only: one fused pass, then the combine
        spec = _multi_spec("proj", width, ["max", "mean", "var"], [{}] * 3)
        _compare(spec, x, kw, seed, f"basic members, proj, width {width}, {form}")


def test_three_dimensional_input_and_single_group(rng, seed):
    """x [2, E, 5] reduced along dim=1 (scalar parameters broadcast over the
    other dimensions), and no index or ptr: one group of every row."""
    x, kw = _groups(rng, 5, "unsorted_index")
    x3 = torch.stack([x, 2 * x.flip(1) - 0.5])
    specs = {**{n: s for n, s in _single_specs(1).items() if "channels" not in n},
             **{f"multi_{m}": _multi_spec(m, 5) for m in ("cat", "proj", "sum", "std")}}
    for name, spec in specs.items():
        _compare(spec, x3, dict(kw, dim=1), seed, f"{name}, [2, E, 5] along dim=1")
        _compare(spec, x, {}, seed, f"{name}, one group")


def test_empty_input(seed):
    x = torch.zeros(0, 3, dtype=torch.float64)
    kw = dict(index=torch.zeros(0, dtype=torch.long), dim_size=4)
    for spec in [("SoftmaxAggregation", dict(learn=True)), ("PowerMeanAggregation", dict(p=2.0)),
                 _multi_spec("proj", 3), _multi_spec("attn", 3)]:
        got = _compare(spec, x, kw, seed, f"{spec[0]} of no rows")
        assert got["grad x"].shape == (0, 3)


# ------------------------------------------------------------ fused path
def test_neighbour_matches_pyg_messages(rng, seed):
    """agg.neighbour(graph, x_src) = PyG's aggregation of x_src[src] by dst,
    on a bipartite graph with a hub, duplicates and targets without edges."""
    n, ns, width = 41, 23, 3
    ei = torch.from_numpy(awkward_edge_index(n, 200, seed=seed % 2**31, num_src=ns,
                                             hub_degree=30))
    x = torch.from_numpy(rng.standard_normal((ns, width)))
    specs = {**_single_specs(width), **{f"multi_{m}": _multi_spec(m, width) for m in MODES}}
    for name, spec in specs.items():
        ours, theirs = _pair(spec, seed)
        got = _run(lambda v: ours.neighbour(ei, v, (ns, n)), ours, x, seed)
        want = _run(lambda v: theirs(v[ei[0]], ei[1], dim_size=n), theirs, x, seed)
        _match(got, want, f"{name} neighbour (seed {seed})")


SAGE_AGGRS = [
    ("softmax", {}),
    ("softmax", dict(aggr_kwargs=dict(t=2.0, learn=True, channels=5))),
    ("power_mean", dict(aggr_kwargs=dict(p=1.5, learn=True))),
    (["mean", "softmax", "max"], {}),
    (["max", "std", "powermean"], dict(aggr_kwargs=dict(
        mode="proj", mode_kwargs=dict(in_channels=5, out_channels=4)))),
    (["mean", "softmax"], dict(aggr_kwargs=dict(
        mode="attn", mode_kwargs=dict(in_channels=5, out_channels=6, num_heads=3)))),
    (["min", "softmax"], dict(aggr_kwargs=dict(mode="logsumexp"))),
]


def test_sage_conv_with_the_new_aggregations(rng, seed):
    """ft.SAGEConv(aggr=...) against PyG's: sizes, state_dicts both ways,
    output and every gradient (layer and aggregation parameters)."""
    n = 37
    ei = torch.from_numpy(awkward_edge_index(n, 160, seed=seed % 2**31))
    x = torch.from_numpy(rng.standard_normal((n, 5)))
    for aggr, kwargs in SAGE_AGGRS:
        torch.manual_seed(seed)
        theirs = fresh_pyg_class(pyg.SAGEConv)(5, 3, aggr=aggr, **kwargs).double()
        ours = ft.SAGEConv(5, 3, aggr=aggr, **kwargs).double()
        assert ours.lin_l.in_features == theirs.lin_l.in_channels, aggr
        ours.load_state_dict(theirs.state_dict(), strict=True)
        theirs.load_state_dict(ours.state_dict(), strict=True)
        _match(_run(lambda v: ours(v, ei), ours, x, seed),
               _run(lambda v: theirs(v, ei), theirs, x, seed), f"SAGEConv({aggr}) (seed {seed})")


# ---------------------------------------------------- state and construction
def _all_specs(width=3):
    return {**_single_specs(width), **{f"multi_{m}": _multi_spec(m, width) for m in MODES}}


def test_state_dicts_load_both_ways_and_seeded_construction(seed):
    """The same keys as PyG's; strict loads both ways; torch.manual_seed(s)
    before construction (and before reset_parameters) gives PyG's values
    bit for bit and leaves the generator where PyG leaves it; PyG's repr."""
    for name, spec in _all_specs().items():
        theirs = _build(pyg_aggr, spec, seed)
        after_theirs = torch.rand(3)
        ours = _build(ft, spec, seed)
        after_ours = torch.rand(3)
        assert isinstance(ours, pyg_aggr.Aggregation), name
        assert repr(ours) == repr(theirs), name
        want, got = theirs.state_dict(), ours.state_dict()
        assert list(got) == list(want), name
        assert all(torch.equal(got[k], want[k]) for k in want), name
        assert torch.equal(after_ours, after_theirs), name
        for module in (theirs, ours):
            torch.manual_seed(seed + 1)
            module.reset_parameters()
        assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(),
                                                      theirs.state_dict().values())), name
        ours.load_state_dict(theirs.state_dict(), strict=True)
        theirs.load_state_dict(ours.state_dict(), strict=True)


def test_out_channels_as_pyg():
    for mode in MODES:
        spec = _multi_spec(mode, 3)
        assert (_build(ft, spec).get_out_channels(3)
                == _build(pyg_aggr, spec).get_out_channels(3)), mode


def test_names_resolve_as_pyg():
    for name in ("softmax", "SoftmaxAggregation", "soft_max", "powermean", "power_mean",
                 "PowerMeanAggregation", "Power-Mean"):
        ours = ft_aggr.resolve_aggregation(name)
        assert type(ours).__name__ == type(aggregation_resolver(name)).__name__, name
    ours = ft_aggr.resolve_aggregation("softmax", t=2.0, learn=True, channels=4)
    assert ours.t.shape == (4,) and torch.equal(ours.t, torch.full((4,), 2.0))
    assert ft_aggr.resolve_aggregation("power_mean", p=3.0, clamp_max=None).max_value is None


def test_pyg_instances_are_translated_sharing_their_weights(rng, seed):
    """A PyG instance given to resolve_aggregation (and so to SAGEConv or
    MultiAggregation) becomes ours, holding PyG's Parameter objects."""
    x, kw = _groups(rng, 3, "unsorted_index")
    theirs = pyg_aggr.SoftmaxAggregation(t=0.3, learn=True, channels=3).double()
    ours = ft_aggr.resolve_aggregation(theirs)
    assert isinstance(ours, ft.SoftmaxAggregation) and ours.t is theirs.t
    theirs = pyg_aggr.PowerMeanAggregation(p=2.0, learn=True, clamp_max=50.0).double()
    ours = ft_aggr.resolve_aggregation(theirs)
    assert ours.p is theirs.p and ours.max_value == 50.0
    for mode in ("proj", "attn", "var"):
        theirs = _build(pyg_aggr, _multi_spec(mode, 3), seed)
        ours = ft_aggr.resolve_aggregation(theirs)
        assert isinstance(ours, ft.MultiAggregation) and ours.mode == mode
        assert all(a is b for a, b in zip(ours.parameters(), theirs.parameters())), mode
        _match(_run(lambda v: ours(v, **kw), ours, x, seed),
               _run(lambda v: theirs(v, **kw), theirs, x, seed), f"translated {mode}")
    multi = ft.MultiAggregation(["mean", pyg_aggr.SoftmaxAggregation(learn=True)])
    assert isinstance(multi.aggrs[1], ft.SoftmaxAggregation)


# ------------------------------------------------------------- internals
def test_softmax_keeps_nothing_larger_than_x(rng):
    """Softmax's backward recomputes its weights: autograd keeps the rows it
    reduced (x itself, or x gathered into group order for an unsorted
    index, whose order it keeps too) and [S, F] statistics, never an [E, F]
    tensor of weights or exponentials."""
    for form in ("ptr", "unsorted_index"):
        x, kw = _groups(rng, 7, form, num_rows=200)
        shapes = []

        def keep(t):
            shapes.append(tuple(t.shape))
            return t
        agg = ft.SoftmaxAggregation(t=0.5, learn=True).double()
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            out = agg(x.clone().requires_grad_(), **kw)
        out.sum().backward()
        assert shapes.count(tuple(x.shape)) == 1, (form, shapes)
        assert all(math.prod(s) <= DIM_SIZE * 7 or s in ((200,), tuple(x.shape))
                   for s in shapes), (form, shapes)


def test_gradcheck_softmax_and_power_mean(rng):
    """Finite differences on a path PyG's modules do not take: x [2, 7, 2]
    reduced along dim=1 with a learnable scalar t or p."""
    x = torch.from_numpy(rng.uniform(0.2, 2.0, (2, 7, 2))).requires_grad_()
    index = torch.tensor([0, 2, 2, 0, 3, 3, 0])
    for agg in (ft.SoftmaxAggregation(t=0.8, learn=True).double(),
                ft.PowerMeanAggregation(p=1.6, learn=True).double()):
        name, param = next(agg.named_parameters())

        def fn(x, q):
            return torch.func.functional_call(agg, {name: q}, (x, index),
                                              dict(dim=1, dim_size=5))
        assert torch.autograd.gradcheck(fn, (x, param.detach().clone().requires_grad_()))


def test_compiled_matches_eager(rng, seed):
    x, kw = _groups(rng, 3, "unsorted_index")
    for spec in (("SoftmaxAggregation", dict(t=0.6, learn=True)),
                 ("SoftmaxAggregation", dict(t=2.0, semi_grad=True)),
                 ("PowerMeanAggregation", dict(p=2.0, clamp_min=0.5, clamp_max=None)),
                 _multi_spec("proj", 3)):
        agg = _build(ft, spec, seed)
        eager = _run(lambda v: agg(v, **kw), agg, x, seed)
        fn = torch.compile(lambda v: agg(v, **kw), fullgraph=True, backend="aot_eager")
        _match(_run(fn, agg, x, seed), eager, f"compiled {spec[0]}")


# ------------------------------------------------------------ bad arguments
BAD = [
    (lambda: ft.SoftmaxAggregation(t="1"), TypeError, "t must"),
    (lambda: ft.SoftmaxAggregation(learn=1), TypeError, "learn"),
    (lambda: ft.SoftmaxAggregation(semi_grad="no"), TypeError, "semi_grad"),
    (lambda: ft.SoftmaxAggregation(learn=True, semi_grad=True), ValueError, "semi_grad"),
    (lambda: ft.SoftmaxAggregation(channels=3), ValueError, "channels"),
    (lambda: ft.SoftmaxAggregation(learn=True, channels=0), ValueError, "channels"),
    (lambda: ft.SoftmaxAggregation(learn=True, channels=2.0), TypeError, "channels"),
    (lambda: ft.SoftmaxAggregation(deterministic="no"), TypeError, "deterministic"),
    (lambda: ft.PowerMeanAggregation(p=None), TypeError, "p must"),
    (lambda: ft.PowerMeanAggregation(clamp_min="0"), TypeError, "clamp_min"),
    (lambda: ft.PowerMeanAggregation(clamp_min=2.0, clamp_max=1.0), ValueError, "clamp_min"),
    (lambda: ft.PowerMeanAggregation(channels=2), ValueError, "channels"),
    (lambda: ft.MultiAggregation(["mean", "max"], mode="median"), ValueError, "mode"),
    (lambda: ft.MultiAggregation(["mean", "max"], mode=None), ValueError, "mode"),
    (lambda: ft.MultiAggregation(["mean", "max"], mode_kwargs=[1]), TypeError, "mode_kwargs"),
    (lambda: ft.MultiAggregation(["mean", "max"], mode="sum", mode_kwargs=dict(bias=False)),
     TypeError, "mode_kwargs"),
    (lambda: ft.MultiAggregation(["mean"], mode="proj",
                                 mode_kwargs=dict(in_channels=3, out_channels=3)),
     ValueError, "two aggregations"),
    (lambda: ft.MultiAggregation(["mean", "max"], mode="proj",
                                 mode_kwargs=dict(out_channels=3)), ValueError, "in_channels"),
    (lambda: ft.MultiAggregation(["mean", "max"], mode="attn", mode_kwargs=dict(in_channels=3)),
     ValueError, "out_channels"),
    (lambda: ft.MultiAggregation(["mean", "max"], mode="proj",
                                 mode_kwargs=dict(in_channels=[3, 3, 3], out_channels=3)),
     ValueError, "in_channels"),
    (lambda: ft.MultiAggregation(["mean", "max"], mode="proj",
                                 mode_kwargs=dict(in_channels=3, out_channels=0)),
     ValueError, "out_channels"),
    (lambda: ft.MultiAggregation(["mean", "max"], mode="proj",
                                 mode_kwargs=dict(in_channels=3.0, out_channels=3)),
     ValueError, "in_channels"),
    (lambda: ft.MultiAggregation(["mean", "max"], mode="attn",
                                 mode_kwargs=dict(in_channels=3, out_channels=4, num_heads=3)),
     ValueError, "num_heads"),
    (lambda: ft.MultiAggregation(["mean", "max"], mode="proj",
                                 mode_kwargs=dict(in_channels=3, out_channels=4, scale=2)),
     TypeError, "scale"),
    (lambda: ft.MultiAggregation(["mean", "softmax"], [{}, dict(tau=2.0)]), TypeError, "tau"),
    (lambda: ft_aggr.resolve_aggregation("power_mean", q=2.0), TypeError, "q"),
    (lambda: ft.MultiAggregation(["mean", "lstm"]), NotImplementedError, "lstm"),
]


def test_bad_arguments_name_the_argument(rng):
    for make, err, word in BAD:
        with pytest.raises(err, match=word):
            make()
    x, kw = _groups(rng, 3, "ptr")
    agg = ft.SoftmaxAggregation(learn=True, channels=4)
    with pytest.raises(ValueError, match="channels=4, but x has 3 features"):
        agg(x.float(), **kw)
    with pytest.raises(ValueError, match="two-dimensional"):
        ft.PowerMeanAggregation(learn=True, channels=3)(torch.stack([x, x]).float(), dim=1)
    for agg in (ft.SoftmaxAggregation(), ft.PowerMeanAggregation(p=2.0),
                ft.MultiAggregation(["softmax", "max"], mode="sum")):
        with pytest.raises(ValueError, match="non-decreasing"):
            agg(x, ptr=torch.tensor([0, 40, 20, 60]))
        with pytest.raises(ValueError, match="rows"):
            agg(x, ptr=torch.tensor([0, 20, 50]))
        with pytest.raises(ValueError, match="dim_size"):
            agg(x, index=torch.zeros(60, dtype=torch.long) + 5, dim_size=3)
    ei = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match="x_src"):
        ft.SoftmaxAggregation().neighbour(ei, x[:2].float(), (5, 2))
