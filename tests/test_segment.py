"""Reduction family (sum, mean, max, min, var, std and multi-reductions)
against the float64 reference and PyG's aggregations: outputs, VJPs, empty
rows, ties, NaN, segment_csr and validation, on CPU and (when CuPy sees one) GPU."""
import numpy as np
import pytest

from fastgnn import (Graph, segment_csr, segment_csr_bwd, segment_csr_fwd, segment_reduce,
                     segment_reduce_bwd, segment_reduce_fwd)
from fastgnn.backends import reference as ref
from fastgnn.testing import (assert_close, awkward_edge_index, devices, from_bf16_bits,
                             to_bf16_bits, to_device, to_numpy)

WIDTHS = [1, 7, 32, 129]
SINGLE = ["sum", "mean", "max", "min", "var", "std", "mul"]
MULTI = [["mean", "max", "min", "std"], ["sum", "var"]]
ALL_REDUCES = SINGLE + MULTI


def _id(reduce):
    return reduce if isinstance(reduce, str) else "+".join(reduce)


def _nr(reduce):
    return 1 if isinstance(reduce, str) else len(reduce)


def _seed():
    """A seed drawn from NumPy's global state, which conftest seeds per test
    (FASTGNN_TEST_SEED; a failing test prints its seed)."""
    return np.random.randint(1 << 30)


def _case(device, width, num_src=None, hub=None, index_dtype=None, n=300, reduce="sum"):
    rng = np.random.default_rng(_seed())
    ei = awkward_edge_index(n, 2000, hub_degree=hub, seed=rng.integers(1 << 30), num_src=num_src)
    ns = n if num_src is None else num_src
    kw = {"num_nodes": n} if num_src is None else {"num_src": ns, "num_dst": n}
    g = Graph.from_edge_index(to_device(ei, device), index_dtype=index_dtype, **kw)
    x = rng.standard_normal((ns, width))
    go = rng.standard_normal((n, _nr(reduce) * width))
    return ei, g, x, go


def _check(device, ei, g, x, go, reduce, dtype):
    n = g.num_dst
    x, go = x.astype(dtype), go.astype(dtype)
    out, res = segment_reduce_fwd(g, to_device(x, device), reduce)
    assert out.dtype == x.dtype and out.shape == (n, _nr(reduce) * x.shape[1])
    assert_close(to_numpy(out), ref.segment_reduce(ei, x, reduce, n), dtype, f"{reduce} out")
    gx = segment_reduce_bwd(g, res, to_device(go, device))
    assert gx.dtype == x.dtype and gx.shape == x.shape
    # var/std follow PyG's E[x^2] - E[x]^2, which cancels: with fp32
    # accumulation (the GPU kernels) their gradients (scaled by 1/std) carry
    # fp32's error times the rows' conditioning E[x^2] / var, a tail that
    # passed 1e-4 in about 1 of 60 random graphs (also in a NumPy float32
    # emulation of the kernels' arithmetic); so 1e-4 plus a fraction of that
    # bound (the emulation's worst error was 0.056 of it; over 80 graphs the
    # tolerance has a median of ~1.8e-4, where one wrong element of a
    # 300 x 32 gradient is ~1e-2)
    names = [reduce] if isinstance(reduce, str) else list(reduce)
    loose = dtype == "float32" and any(r in ("var", "std") for r in names)
    tol = 1e-4 + 0.25 * np.finfo(np.float32).eps * _var_condition(ei, x, n) if loose else None
    assert_close(to_numpy(gx), ref.segment_reduce_vjp(ei, x, reduce, n, go), dtype,
                 f"{reduce} grad_x", tol=tol)
    return to_numpy(out)


def _var_condition(ei, x, n):
    """max of E[x^2] / var (float64) over the (row, feature) pairs with var >
    1e-5: how much var = E[x^2] - E[x]^2 amplifies rounding. Pairs at or
    below 1e-5 (degree-1 rows, repeated values) are clamped by PyG's std and
    have no such gradient, so they do not count."""
    src, dst = np.asarray(ei[0]), np.asarray(ei[1])
    x = np.asarray(x, dtype=np.float64)
    deg = np.bincount(dst, minlength=n)[:, None].astype(np.float64)
    s, sq = np.zeros((n, x.shape[1])), np.zeros((n, x.shape[1]))
    np.add.at(s, dst, x[src])
    np.add.at(sq, dst, x[src] ** 2)
    has = deg[:, 0] > 0
    if not has.any():
        return 1.0
    msq = sq[has] / deg[has]
    var = msq - (s[has] / deg[has]) ** 2
    keep = var > 1e-5
    return float((msq[keep] / var[keep]).max()) if keep.any() else 1.0


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("reduce", ALL_REDUCES, ids=_id)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_segment_matches_reference(device, reduce, width, dtype):
    ei, g, x, go = _case(device, width, reduce=reduce)
    out = _check(device, ei, g, x, go, reduce, dtype)
    names = [reduce] if isinstance(reduce, str) else reduce
    empty = np.zeros(len(names) * width)          # empty rows (last tenth): exactly 0, mul 1
    for k, name in enumerate(names):
        if name == "mul":
            empty[k * width:(k + 1) * width] = 1.0
    assert np.all(out[-30:] == empty)
    # the single-str form gives the same values as the forward pair
    np.testing.assert_array_equal(to_numpy(segment_reduce(g, to_device(x.astype(dtype), device),
                                                          reduce)), out)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("bipartite", [False, True])
def test_hub_row(device, dtype, bipartite):
    """A target with 12000 in-edges, every reduction in one pass."""
    reduce = list(SINGLE)
    ei, g, x, go = _case(device, 32, hub=12000, reduce=reduce,
                         num_src=500 if bipartite else None)
    _check(device, ei, g, x, go, reduce, dtype)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("reduce", [["max"], ["mean", "min", "std"]], ids=_id)
def test_wide_features_on_few_rows(device, reduce):
    """1433 features on 300 rows (a first layer on Cora's raw features): the
    GPU forward cuts them into feature slices (grid y), the last one
    partial; hub rows' partial states are merged across the slices."""
    ei, g, x, go = _case(device, 1433, hub=3000, reduce=reduce)
    _check(device, ei, g, x, go, reduce, "float32")


# combinations that run a larger statistic set (forward) or term bound
# (backward) than they need, with hub rows so split partial states are merged
SUPERSETS = [["max"], ["min"], ["mean", "max"], ["sum", "min"], ["max", "min"],
             ["var", "max"], ["std", "min", "sum"], ["var"]]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("reduce", SUPERSETS, ids=_id)
@pytest.mark.parametrize("width", [37, 64])
def test_statistic_supersets_with_hub(device, reduce, width):
    ei, g, x, go = _case(device, width, hub=3000, reduce=reduce)
    out = _check(device, ei, g, x, go, reduce, "float32")
    # inference (no residuals written) gives the same values
    inf = to_numpy(segment_reduce(g, to_device(x.astype("float32"), device), reduce))
    np.testing.assert_array_equal(inf, out)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("reduce", MULTI + [["max"], ["min", "var"]], ids=_id)
def test_bipartite_and_int64(device, reduce):
    ei, g, x, go = _case(device, 16, num_src=77, index_dtype=np.int64, reduce=reduce)
    assert g.index_dtype == np.int64
    _check(device, ei, g, x, go, reduce, "float64")


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("reduce", [["max", "min"], ["min", "sum", "max"]], ids=_id)
def test_ties_go_to_first_edge(device, reduce):
    """Integer-valued features: many exact ties between distinct sources; the
    gradient goes to the first edge of the row in caller order."""
    ei, g, x, go = _case(device, 9, reduce=reduce)
    x = np.random.default_rng(_seed()).integers(-2, 3, x.shape).astype(np.float64)
    _check(device, ei, g, x, go, reduce, "float64")


@pytest.mark.parametrize("device", devices())
def test_nan_propagates_through_max_min(device):
    ei, g, x, go = _case(device, 5, reduce=["max", "min"])
    rng = np.random.default_rng(_seed())
    x[rng.integers(0, 300, 40), rng.integers(0, 5, 40)] = np.nan
    out, res = segment_reduce_fwd(g, to_device(x, device), ["max", "min"])
    out = to_numpy(out)
    r = ref.segment_reduce(ei, x, ["max", "min"], 300)
    assert np.isnan(r).any()
    np.testing.assert_array_equal(out, r)         # NaN in the same places, same values elsewhere
    gx = to_numpy(segment_reduce_bwd(g, res, to_device(go, device)))
    np.testing.assert_allclose(gx, ref.segment_reduce_vjp(ei, x, ["max", "min"], 300, go),
                               rtol=1e-12, atol=1e-12)
    # the inference forward (no positions; fp32 on the GPU: PTX max.NaN / min.NaN)
    x32 = x.astype(np.float32)
    for reduce in (["max", "min"], "max", "min", ["mean", "max", "min", "std"]):
        inf = to_numpy(segment_reduce(g, to_device(x32, device), reduce))
        r32 = ref.segment_reduce(ei, x32.astype(np.float64), reduce, 300)
        names = [reduce] if isinstance(reduce, str) else reduce
        for k, name in enumerate(names):
            if name in ("max", "min"):                # NaN alike, exact elsewhere
                np.testing.assert_array_equal(inf[:, 5 * k:5 * k + 5],
                                              r32[:, 5 * k:5 * k + 5].astype(np.float32))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("hub", [255, 256, 65535, 65536],
                         ids=["uint8", "uint16-256", "uint16", "wide"])
@pytest.mark.parametrize("dtype,width", [("float64", 3), ("float32", 64)])
def test_arg_positions_narrow_and_wide(device, hub, dtype, width):
    """Max/min args are positions within the row in the narrowest type that
    holds them with the all-ones value left to mark empty rows: uint8 while
    every row has at most 255 edges, uint16 up to 65535, the index dtype
    from 65536 on. Segments: one of `hub` values (from 65535: split into many
    tasks), empty ones, short ones; small integers (ties everywhere) and NaNs,
    ties at the hub's last positions."""
    rng = np.random.default_rng(_seed())
    counts = rng.integers(0, 40, 50)
    counts[::6] = 0                               # empty segments
    counts[7] = hub                               # rows split into tasks, merged in slot order
    counts[20] = min(700, hub)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    e = int(indptr[-1])
    values = rng.integers(-2, 3, (e, width)).astype(dtype)
    values[rng.integers(0, e, 30), rng.integers(0, width, 30)] = np.nan
    hub_col = values[int(indptr[7]):int(indptr[8]), 0]
    hub_col[np.isnan(hub_col)] = 0
    hub_col[hub - 6:] = 9                         # ties at the last narrow positions
    ei = np.stack([np.arange(e), np.repeat(np.arange(50), counts)])
    reduce = ["max", "min", "sum"]
    out, res = segment_csr_fwd(to_device(indptr, device), to_device(values, device), reduce)
    want = _position_dtype(hub, res.graph.index_dtype)
    assert res.inner.argmax.dtype == want and res.inner.argmin.dtype == want
    amx = to_numpy(res.inner.argmax)
    assert np.all(amx[counts == 0] == np.array(-1).astype(want))    # empty rows: all ones
    assert amx[7, 0] == hub - 6                   # the first of the tied 9s, row-relative
    out = to_numpy(out)
    r = ref.segment_reduce(ei, values, reduce, 50)
    np.testing.assert_array_equal(out[:, :2 * width], r[:, :2 * width])   # exact, NaN alike
    go = rng.standard_normal((50, 3 * width)).astype(dtype)
    gv = to_numpy(segment_csr_bwd(to_device(indptr, device), res, to_device(go, device)))
    rtol = 1e-12 if dtype == "float64" else 1e-6
    np.testing.assert_allclose(gv, ref.segment_reduce_vjp(ei, values, reduce, 50, go),
                               rtol=rtol, atol=rtol)


MUL_REDUCES = ["mul", ["mean", "mul", "max", "std"], ["mul", "min"]]


def _mul_case(device, width, hub, reduce, rng):
    """_case with features of magnitude 0.5-1.5 (products stay finite) and
    zeros placed so rows hold none, exactly one or several per feature."""
    ei, g, x, go = _case(device, width, hub=hub, reduce=reduce)
    x = rng.uniform(0.5, 1.5, x.shape) * rng.choice([-1.0, 1.0], x.shape)
    x[rng.integers(0, x.shape[0], x.size // 40), rng.integers(0, width, x.size // 40)] = 0.0
    hub_src = np.asarray(ei[0])[np.asarray(ei[1]) == 0]
    # the hub's sources: features 2.. near +-1 and nonzero, so its product is
    # O(1) there and a wrong merge of split-row partials shows
    x[hub_src, 2:] = rng.uniform(0.97, 1.03, (len(hub_src), max(width - 2, 0))) * np.sign(
        x[hub_src, 2:] + 0.5)
    x[hub_src[:3], 0] = 0.0                   # the hub: several zeros in feature 0 ...
    uniq, count = np.unique(hub_src, return_counts=True)
    if width > 1 and (count == 1).any():     # ... exactly one in feature 1 (a source
        x[uniq, 1] = np.where(x[uniq, 1] == 0, 1.0, x[uniq, 1])   # the hub holds once)
        x[uniq[count == 1][0], 1] = 0.0
    return ei, g, x, go


def _assert_close_nan(out, want, vtype, what, tol=None):
    """NaN where the reference has NaN, close elsewhere."""
    out, want = np.asarray(out, dtype=np.float64), np.asarray(want, dtype=np.float64)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want), err_msg=f"{what}: NaN pattern")
    assert_close(np.nan_to_num(out), np.nan_to_num(want), vtype, what, tol=tol)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("reduce", MUL_REDUCES, ids=_id)
@pytest.mark.parametrize("width", [1, 5, 64])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_mul_matches_reference(device, reduce, width, dtype):
    """mul (PyG's MulAggregation): empty rows give 1; zeros follow torch's
    prod gradient (the only zero of a row gets the product of the others, one
    of several gets 0); a NaN makes its row's product and gradients NaN; a
    hub of 500 in-edges (split into tasks on the GPU) merges partial
    products and zero counts. Alone and fused with other reductions."""
    rng = np.random.default_rng(_seed())
    ei, g, x, go = _mul_case(device, width, 500, reduce, rng)
    n, f = g.num_dst, width
    names = [reduce] if isinstance(reduce, str) else reduce
    k = names.index("mul")
    x = x.astype(dtype)
    out, res = segment_reduce_fwd(g, to_device(x, device), reduce)
    out = to_numpy(out)
    want = ref.segment_reduce(ei, x, reduce, n)
    # a product of n fp32 roundings is off by up to n * 2^-24 (3e-5 for the
    # hub's 500), which an O(1) hub product carries into the norm
    tol32 = 1e-4 if dtype == "float32" else None
    assert_close(out, want, dtype, f"{_id(reduce)} out", tol=tol32)
    np.testing.assert_array_equal(out[-30:, k * f:(k + 1) * f], 1.0)   # empty rows: 1
    hub = slice(k * f + 2, (k + 1) * f)        # the hub row's zero-free features, one by one
    np.testing.assert_allclose(out[0, hub], want[0, hub], rtol=1e-4 if dtype == "float32"
                               else 1e-10)
    gx = segment_reduce_bwd(g, res, to_device(go.astype(dtype), device))
    # with std in the list its fp32 gradient carries var's cancellation (see _check)
    tol_gx = tol32
    if dtype == "float32" and "std" in names:
        tol_gx = 1e-4 + 0.25 * np.finfo(np.float32).eps * _var_condition(ei, x, n)
    assert_close(to_numpy(gx), ref.segment_reduce_vjp(ei, x, reduce, n, go), dtype,
                 f"{_id(reduce)} grad_x", tol=tol_gx)
    # a NaN feature value: NaN products and gradients where the reference has them
    x[int(np.asarray(ei[0])[0]), 0] = np.nan
    out, res = segment_reduce_fwd(g, to_device(x, device), reduce)
    _assert_close_nan(to_numpy(out), ref.segment_reduce(ei, x, reduce, n), dtype, "out (NaN)",
                      tol32)
    gx = segment_reduce_bwd(g, res, to_device(go.astype(dtype), device))
    want = ref.segment_reduce_vjp(ei, x, reduce, n, go)
    if "std" not in names:       # std's NaN handling has its own test
        _assert_close_nan(to_numpy(gx), want, dtype, "grad_x (NaN)", tol32)


@pytest.mark.parametrize("device", devices())
def test_nan_propagates_through_var_std(device):
    """A NaN input makes var and std NaN (torch.clamp keeps NaN), not 0."""
    reduce = ["var", "std", "mean"]
    ei, g, x, _ = _case(device, 5, reduce=reduce)
    rng = np.random.default_rng(_seed())
    x[rng.integers(0, 300, 40), rng.integers(0, 5, 40)] = np.nan
    out = to_numpy(segment_reduce(g, to_device(x, device), reduce))
    r = ref.segment_reduce(ei, x, reduce, 300)
    assert np.isnan(r).any()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(r))


@pytest.mark.parametrize("device", devices())
def test_graph_without_edges(device):
    ei = np.zeros((2, 0), dtype=np.int64)
    g = Graph.from_edge_index(to_device(ei, device), num_nodes=6)
    x = np.random.default_rng(_seed()).standard_normal((6, 3))
    out, res = segment_reduce_fwd(g, to_device(x, device), list(SINGLE))
    r = len(SINGLE)
    mul = SINGLE.index("mul")
    assert out.shape == (6, 3 * r)
    out = to_numpy(out)
    assert np.all(out[:, 3 * mul:3 * mul + 3] == 1)          # mul: 1, as PyG's
    assert np.all(np.delete(out, np.s_[3 * mul:3 * mul + 3], axis=1) == 0)
    gx = segment_reduce_bwd(g, res, to_device(np.ones((6, 3 * r)), device))
    assert np.all(to_numpy(gx) == 0)


def test_reference_vjp_by_finite_differences():
    """The oracle itself: its VJP agrees with central differences in float64.
    Continuous random inputs keep max/min away from ties between distinct
    sources and var away from the std clamp boundary (duplicate-only rows have
    var exactly 0 on both sides of the step)."""
    rng = np.random.default_rng(_seed())
    ei = awkward_edge_index(20, 80, seed=rng.integers(1 << 30))
    x = rng.standard_normal((20, 3))
    h = 1e-6
    for reduce in ALL_REDUCES:
        go = rng.standard_normal((20, _nr(reduce) * 3))
        gx = ref.segment_reduce_vjp(ei, x, reduce, 20, go)
        f = lambda x_: np.sum(ref.segment_reduce(ei, x_, reduce, 20) * go)  # noqa: E731
        fd = np.zeros_like(x)
        for i in range(20):
            for k in range(3):
                dx = np.zeros_like(x)
                dx[i, k] = h
                fd[i, k] = (f(x + dx) - f(x - dx)) / (2 * h)
        np.testing.assert_allclose(gx, fd, atol=1e-6, rtol=1e-6, err_msg=_id(reduce))


@pytest.mark.parametrize("reduce", ALL_REDUCES, ids=_id)
def test_matches_pyg_aggregations(reduce):
    """PyG 2.8's aggregations (index=dst, dim_size) in float64, outputs and
    gradients by torch autograd with a random cotangent."""
    torch = pytest.importorskip("torch")
    aggr = pytest.importorskip("torch_geometric.nn.aggr")
    classes = {"sum": aggr.SumAggregation, "mean": aggr.MeanAggregation,
               "max": aggr.MaxAggregation, "min": aggr.MinAggregation,
               "var": aggr.VarAggregation, "std": aggr.StdAggregation,
               "mul": aggr.MulAggregation}
    module = classes[reduce]() if isinstance(reduce, str) else aggr.MultiAggregation(list(reduce))
    ei, g, x, go = _case("cpu", 6, reduce=reduce)
    xt = torch.tensor(x, requires_grad=True)
    src, dst = torch.from_numpy(ei[0]), torch.from_numpy(ei[1])
    out_t = module(xt[src], dst, dim_size=300)
    (out_t * torch.from_numpy(go)).sum().backward()
    out, res = segment_reduce_fwd(g, x, reduce)
    gx = segment_reduce_bwd(g, res, go)
    assert_close(out, out_t.detach().numpy(), "float64", f"{_id(reduce)} vs PyG")
    assert_close(gx, xt.grad.numpy(), "float64", f"{_id(reduce)} grad vs PyG")


def test_std_gradient_at_clamp_matches_pyg():
    """Rows whose variance is below 1e-5 (std output 0) pass no gradient, as
    PyG's clamp + masked_fill."""
    torch = pytest.importorskip("torch")
    aggr = pytest.importorskip("torch_geometric.nn.aggr")
    ei = np.array([[0, 1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 2, 2, 2]])
    x = np.array([[1.0, 2.0], [1.001, 2.0], [3.0, -1.0], [3.0, 1.0], [0.0, 5.0], [0.5, 5.0],
                  [0.0002, 5.0]])
    go = np.random.default_rng(_seed()).standard_normal((3, 2))
    xt = torch.tensor(x, requires_grad=True)
    out_t = aggr.StdAggregation()(xt[torch.from_numpy(ei[0])], torch.from_numpy(ei[1]),
                                  dim_size=3)
    (out_t * torch.from_numpy(go)).sum().backward()
    g = Graph.from_edge_index(ei, num_src=7, num_dst=3)
    out, res = segment_reduce_fwd(g, x, "std")
    assert out[0, 0] == 0 and out[0, 1] == 0 and out[1, 0] == 0
    np.testing.assert_allclose(out, out_t.detach().numpy(), rtol=1e-12, atol=0)
    np.testing.assert_allclose(segment_reduce_bwd(g, res, go), xt.grad.numpy(),
                               rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("reduce", ["sum", "max", "std"] + MULTI, ids=_id)
def test_segment_csr_matches_reference(device, reduce):
    rng = np.random.default_rng(_seed())
    counts = rng.integers(0, 6, 60)
    counts[::7] = 0                               # empty segments
    counts[3] = 700                               # a long one
    counts[-1] = 0
    indptr = np.concatenate([[0], np.cumsum(counts)])
    e = int(indptr[-1])
    values = rng.standard_normal((e, 11))
    ei = np.stack([np.arange(e), np.repeat(np.arange(60), counts)])
    out, res = segment_csr_fwd(to_device(indptr, device), to_device(values, device), reduce)
    assert_close(to_numpy(out), ref.segment_reduce(ei, values, reduce, 60), "float64")
    assert np.all(to_numpy(out)[counts == 0] == 0)
    go = rng.standard_normal((60, _nr(reduce) * 11))
    gv = segment_csr_bwd(to_device(indptr, device), res, to_device(go, device))
    assert_close(to_numpy(gv), ref.segment_reduce_vjp(ei, values, reduce, 60, go), "float64")
    np.testing.assert_array_equal(
        to_numpy(segment_csr(to_device(indptr, device), to_device(values, device), reduce)),
        to_numpy(out))


@pytest.mark.parametrize("device", devices())
def test_deterministic_flag_is_validated(device):
    """`deterministic` must be a bool (NumPy's too) on every public entry point
    of the family; anything else raises TypeError naming it, before any work."""
    ei, g, x, _ = _case(device, 3)
    xd = to_device(x, device)
    indptr = to_device(np.array([0, 2, 2, 5]), device)
    vals = to_device(np.ones((5, 3)), device)
    calls = [lambda d: segment_reduce(g, xd, "max", deterministic=d),
             lambda d: segment_reduce_fwd(g, xd, ["mean", "min"], deterministic=d),
             lambda d: segment_csr(indptr, vals, "max", deterministic=d),
             lambda d: segment_csr_fwd(indptr, vals, ["sum", "max"], deterministic=d)]
    for call in calls:
        for bad in ("no", 0, 1, None, np.int64(0)):
            with pytest.raises(TypeError, match="deterministic must be a bool"):
                call(bad)
        for ok in (True, False, np.bool_(False)):
            call(ok)
    _, res = segment_reduce_fwd(g, xd, "max", deterministic=np.bool_(False))
    assert res.deterministic is False


def test_cpu_ignores_deterministic_false():
    """The CPU backend has no atomic variant: deterministic=False gives the
    same bits as the default, forward and backward."""
    for reduce in ["max", "min", ["mean", "max", "min", "std"], ["sum", "var"]]:
        ei, g, x, go = _case("cpu", 7, hub=500, reduce=reduce)
        x = np.random.default_rng(_seed()).integers(-3, 4, x.shape).astype(np.float64)  # ties
        runs = []
        for det in (True, False):
            out, res = segment_reduce_fwd(g, x, reduce, deterministic=det)
            runs.append((out, segment_reduce_bwd(g, res, go)))
        for a, b in zip(*runs):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("device", devices())
def test_inputs_not_mutated_and_repeatable(device):
    reduce = list(SINGLE)
    ei, g, x, go = _case(device, 9, reduce=reduce)
    xd, god = to_device(x, device), to_device(go, device)
    copies = [to_numpy(a).copy() for a in (xd, god)]
    runs = []
    for _ in range(2):
        out, res = segment_reduce_fwd(g, xd, reduce)
        runs.append((to_numpy(out).copy(), to_numpy(segment_reduce_bwd(g, res, god))))
        out[...] = 7                              # overwriting an output leaves residuals intact
        np.testing.assert_array_equal(to_numpy(segment_reduce_bwd(g, res, god)), runs[-1][1])
    for a, c in zip((xd, god), copies):
        np.testing.assert_array_equal(to_numpy(a), c)
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)       # bitwise repeatable


@pytest.mark.parametrize("device", devices())
def test_bad_inputs_raise_clear_errors(device):
    ei, g, x, go = _case(device, 4)
    xd = to_device(x, device)
    _, res = segment_reduce_fwd(g, xd, ["max", "var"])
    _, res_nograd = segment_reduce_fwd(g, xd, "max", needs_x_grad=False)
    indptr = to_device(np.array([0, 2, 2, 5]), device)
    vals = to_device(np.ones((5, 3)), device)
    cases = [
        (lambda: segment_reduce(g, xd, "median"), ValueError, "reduce must be one of"),
        (lambda: segment_reduce(g, xd, ["max", "Max"]), ValueError, "reduce must be one of"),
        (lambda: segment_reduce(g, xd, ["max", "sum", "max"]), ValueError, "more than once"),
        (lambda: segment_reduce(g, xd, []), ValueError, "at least one"),
        (lambda: segment_reduce(g, xd, 3), TypeError, "reduce must be a str"),
        (lambda: segment_reduce(g, to_device(x[:-1], device)), ValueError, "x has 299 rows"),
        (lambda: segment_reduce(g, to_device(x[:, 0], device)), ValueError, "x must have shape"),
        (lambda: segment_reduce(g, to_device(x.astype(np.int32), device), "max"), TypeError,
         "x must be"),
        (lambda: segment_reduce(g, "not an array"), TypeError, "x must be"),
        (lambda: segment_reduce(np.zeros((2, 3)), xd), TypeError, "graph must be"),
        (lambda: segment_reduce_bwd(g, res, to_device(go, device)), ValueError,
         "grad_out must have shape"),
        (lambda: segment_reduce_bwd(g, res_nograd, to_device(go, device)), ValueError,
         "needs_x_grad=False"),
        (lambda: segment_csr(indptr, to_device(np.ones((4, 3)), device)), ValueError,
         "values has 4 rows but indptr ends at 5"),
        (lambda: segment_csr(indptr, to_device(np.ones(5), device)), ValueError,
         "values must have shape"),
        (lambda: segment_csr(to_device(np.array([0.0, 2, 5]), device), vals), TypeError,
         "indptr must hold integers"),
        (lambda: segment_csr(to_device(np.array([0, 3, 2, 5]), device), vals), ValueError,
         "indptr must be non-decreasing"),
        (lambda: segment_csr(indptr, to_device(np.ones((5, 3), dtype=np.int64), device)),
         TypeError, "values must be"),
        (lambda: segment_csr(indptr, vals, "avg"), ValueError, "reduce must be one of"),
    ]
    if device == "cpu":
        cases.append((lambda: segment_reduce(g, x.astype(np.float16)), TypeError,
                      "CPU backend supports"))
    else:
        cases.append((lambda: segment_reduce(g, x), ValueError, "x lives on CPU"))
    for fn, err, words in cases:
        with pytest.raises(err) as info:
            fn()
        assert words in str(info.value), str(info.value)


# ---------------------------------------------------------------- GPU only
@pytest.mark.parametrize("device", [p for p in devices() if p != "cpu"])
@pytest.mark.parametrize("hub", [200, 3000], ids=["uint8", "uint16"])
@pytest.mark.parametrize("width", [5, 64])
def test_gpu_split_rows_merge_positions(device, hub, width):
    """Rows cut into many tasks (chunk 16 instead of the default 256, so
    uint8 rows split too) merge their partial max/min states and positions
    in slot order (segment_combine) to the same args and values as the
    default cut, and the results match the float64 reference."""
    from fastgnn.backends.cuda import segment as cuda_segment
    reduce = ("mean", "max", "min", "std")
    ei, g, x, go = _case(device, width, hub=hub, reduce=list(reduce))
    x = np.random.default_rng(_seed()).integers(-3, 4, x.shape).astype(np.float32)  # ties
    xd = to_device(x, device)
    small = cuda_segment.segment_fwd(g, xd, reduce, "float32", chunk=16)
    default = cuda_segment.segment_fwd(g, xd, reduce, "float32")
    assert small[1].dtype == _position_dtype(hub, g.index_dtype)
    for a, b in zip(small[1:3], default[1:3]):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    out = to_numpy(small[0])
    np.testing.assert_array_equal(out[:, width:3 * width], to_numpy(default[0])[:, width:3 * width])
    assert_close(out, ref.segment_reduce(ei, x, list(reduce), g.num_dst), "float32", "out")
    god = to_device(go.astype(np.float32), device)
    gx = cuda_segment.segment_bwd(g, xd, god, reduce, *small[3:5], *small[1:3], "float32",
                                  chunk=16)
    assert_close(to_numpy(gx), ref.segment_reduce_vjp(ei, x, list(reduce), g.num_dst, go),
                 "float32", "grad_x", tol=1e-4)


@pytest.mark.parametrize("device", [p for p in devices() if p != "cpu"])
@pytest.mark.parametrize("hub", [200, 3000], ids=["uint8", "uint16"])
@pytest.mark.parametrize("width", [4, 128])
def test_gpu_max_backward_walk_forms_agree_bitwise(device, hub, width, monkeypatch):
    """The max backward's two walks (one edge at a time, and WIDE_UNROLL
    edges in flight), each made the timed winner in turn, give bitwise the
    same gradient (the same additions in the same order) on rows whose
    degrees are no multiple of 4 and a split hub row, equal to the reference."""
    from fastgnn.backends.cuda import decisions, loader
    from fastgnn.backends.cuda import segment as cuda_segment
    ei, _, x, go = _case(device, width, hub=hub, reduce="max")
    n = x.shape[0]
    x, go = x.astype(np.float32), go.astype(np.float32)
    xd, god = to_device(x, device), to_device(go, device)
    grads = []
    for wide_wins in (False, True):
        clock = iter([2.0, 1.0] if wide_wins else [1.0, 2.0])
        monkeypatch.setattr(cuda_segment, "median_ms", lambda fn, **kw: next(clock))
        # a fresh plan cache, and no walk decided for the graph's size class yet
        monkeypatch.setattr(decisions, "_decided", {})
        g = Graph.from_edge_index(to_device(ei, device), num_nodes=n)
        _, argmax, argmin, mean, std, _ = cuda_segment.segment_fwd(g, xd, ("max",), "float32")
        gx = cuda_segment.segment_bwd(g, xd, god, ("max",), mean, std, argmax, argmin, "float32")
        plan, = [v for k, v in g.cache.items()
                 if isinstance(k, tuple) and k[0] == "cuda_segment_bwd"]
        assert plan.has_wide and plan.unroll == (loader.WIDE_UNROLL if wide_wins else 1)
        grads.append(to_numpy(gx))
    np.testing.assert_array_equal(grads[0], grads[1])
    assert_close(grads[0], ref.segment_reduce_vjp(ei, x.astype(np.float64), "max", n,
                                                  go.astype(np.float64)), "float32", "grad_x")


@pytest.mark.parametrize("device", [p for p in devices() if p != "cpu"])
@pytest.mark.parametrize("vtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("reduce", MULTI, ids=_id)
@pytest.mark.parametrize("width", [8, 37, 128])
def test_gpu_half_types(device, vtype, reduce, width):
    ei, g, x, go = _case(device, width, hub=3000, reduce=reduce)
    if vtype == "bfloat16":
        xb, gob = to_bf16_bits(x), to_bf16_bits(go)
        xr, gor = from_bf16_bits(xb).astype(np.float64), from_bf16_bits(gob).astype(np.float64)
        kw = {"vtype": "bfloat16"}
        back = lambda a: from_bf16_bits(to_numpy(a)).astype(np.float64)  # noqa: E731
    else:
        xb, gob = x.astype(np.float16), go.astype(np.float16)
        xr, gor = xb.astype(np.float64), gob.astype(np.float64)
        kw = {}
        back = lambda a: to_numpy(a).astype(np.float64)  # noqa: E731
    out, res = segment_reduce_fwd(g, to_device(xb, device), reduce, **kw)
    assert_close(back(out), ref.segment_reduce(ei, xr, reduce, 300), vtype, "out")
    gx = segment_reduce_bwd(g, res, to_device(gob, device))
    assert_close(back(gx), ref.segment_reduce_vjp(ei, xr, reduce, 300, gor), vtype, "grad_x")


@pytest.mark.parametrize("device", [p for p in devices() if p != "cpu"])
@pytest.mark.parametrize("width", [5, 64])
def test_gpu_split_rows_merge_products(device, width):
    """mul with rows cut into tasks of 16 edges: the partial products and zero
    counts of a 500-edge hub (and of every row above 16 edges) merge to the
    default cut's values up to rounding order, and match the reference."""
    from fastgnn.backends.cuda import segment as cuda_segment
    reduce = ("mul", "max")
    rng = np.random.default_rng(_seed())
    ei, g, x, go = _mul_case(device, width, 500, list(reduce), rng)
    x = x.astype(np.float32)
    xd = to_device(x, device)
    small = cuda_segment.segment_fwd(g, xd, reduce, "float32", chunk=16)
    default = cuda_segment.segment_fwd(g, xd, reduce, "float32")
    out, want = to_numpy(small[0]), ref.segment_reduce(ei, x, list(reduce), g.num_dst)
    # products of up to 500 fp32 roundings in two orders: within ~n * 2^-24 each
    np.testing.assert_allclose(out, to_numpy(default[0]), rtol=1e-4, atol=0)
    np.testing.assert_allclose(out[0, 2:width], want[0, 2:width], rtol=1e-4)   # the hub
    assert_close(out, want, "float32", "out", tol=1e-4)
    god = to_device(go.astype(np.float32), device)
    gx = cuda_segment.segment_bwd(g, xd, god, reduce, None, None, *small[1:3], "float32",
                                  mul=small[5], chunk=16)
    assert_close(to_numpy(gx), ref.segment_reduce_vjp(ei, x, list(reduce), g.num_dst, go),
                 "float32", "grad_x", tol=1e-4)


@pytest.mark.parametrize("device", [p for p in devices() if p != "cpu"])
@pytest.mark.parametrize("vtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("reduce", [["mul", "max"], "mul"], ids=_id)
def test_gpu_mul_half_types_and_atomic_backward(device, vtype, reduce):
    """mul in 16-bit types (fp32 products) against the float64 reference of
    the rounded inputs, and with deterministic=False (the max term by
    atomics, mul's term still walked) equal to the default up to rounding."""
    rng = np.random.default_rng(_seed())
    ei, g, x, go = _mul_case(device, 37, 3000, reduce, rng)
    # the hub's 3000 edges reach each of its sources about 10 times: values
    # within 0.5% of 1 keep its product inside float16's range (65504)
    x = rng.uniform(0.995, 1.005, x.shape) * np.where(x == 0, 0.0, 1.0)
    xd, xr, kw = _typed(x, vtype, device)
    god, gor, _ = _typed(go, vtype, device)
    out, res = segment_reduce_fwd(g, xd, reduce, **kw)
    assert_close(_values(out, vtype), ref.segment_reduce(ei, xr, reduce, g.num_dst), vtype, "out")
    want = ref.segment_reduce_vjp(ei, xr, reduce, g.num_dst, gor)
    gx = _values(segment_reduce_bwd(g, res, god), vtype)
    assert_close(gx, want, vtype, "grad_x")
    _, res_n = segment_reduce_fwd(g, xd, reduce, deterministic=False, **kw)
    gx_n = _values(segment_reduce_bwd(g, res_n, god), vtype)
    np.testing.assert_allclose(gx_n, gx, rtol=_ELEMENT_RTOL[vtype],
                               atol=_ELEMENT_RTOL[vtype] * float(np.abs(gx).max()))


# ------------------------------- the atomic max/min backward (opt-in, GPU)
NONDET_REDUCES = ["max", "min", ["mean", "max", "min", "std"], ["max", "min"], ["sum", "max"]]
# elementwise: the same fp32/fp64 sums in another order, rounded once to the
# value type (16-bit: within about one ulp)
_ELEMENT_RTOL = {"float64": 1e-12, "float32": 1e-5, "float16": 2.0 ** -9, "bfloat16": 2.0 ** -6}
_ARG_CASES = {"uint8": (200, None), "uint16": (3000, None), "wide-int32": (65536, np.int32),
              "wide-int64": (65536, np.int64)}


def _position_dtype(max_degree, index_dtype):
    """The arg positions' dtype for a graph whose largest in-degree is max_degree."""
    return (np.dtype(np.uint8) if max_degree < 256 else np.dtype(np.uint16)
            if max_degree < 65536 else np.dtype(index_dtype))


def _typed(a, vtype, device):
    """(device array in vtype's storage, the float64 values it holds, fwd kwargs)."""
    if vtype == "bfloat16":
        bits = to_bf16_bits(a)
        return to_device(bits, device), from_bf16_bits(bits).astype(np.float64), {
            "vtype": "bfloat16"}
    a = a.astype(vtype)
    return to_device(a, device), a.astype(np.float64), {}


def _values(a, vtype):
    a = to_numpy(a)
    return (from_bf16_bits(a) if vtype == "bfloat16" else a).astype(np.float64)


@pytest.mark.parametrize("device", [p for p in devices() if p != "cpu"])
@pytest.mark.parametrize("args", list(_ARG_CASES))
@pytest.mark.parametrize("width", [5, 64])
@pytest.mark.parametrize("vtype", ["float32", "bfloat16", "float16", "float64"])
@pytest.mark.parametrize("reduce", NONDET_REDUCES, ids=_id)
def test_gpu_nondeterministic_backward_matches_default(device, reduce, vtype, width, args):
    """deterministic=False (max/min terms by float atomics over the targets;
    the transpose walk skipped, or kept for the linear terms only) gives the
    default's forward bit for bit (as does the inference forward, which
    tracks no positions) and its gradient up to summation order, on
    a graph with empty rows, a hub (split into tasks; 65536 in-edges: args in
    the index dtype, 3000: uint16, 200: uint8), duplicates, self-loops and ties everywhere
    (small integer features), at an odd width (scalar loads and atomics) and
    a vector one."""
    hub, index_dtype = _ARG_CASES[args]
    ei, g, x, go = _case(device, width, hub=hub, index_dtype=index_dtype, reduce=reduce)
    rng = np.random.default_rng(_seed())
    x = rng.integers(-3, 4, x.shape).astype(np.float64)
    xd, xr, kw = _typed(x, vtype, device)
    god, gor, _ = _typed(go, vtype, device)
    out_d, res_d = segment_reduce_fwd(g, xd, reduce, **kw)
    out_n, res_n = segment_reduce_fwd(g, xd, reduce, deterministic=False, **kw)
    np.testing.assert_array_equal(to_numpy(out_n), to_numpy(out_d))
    # inference tracks no positions (STAT_NOARG): the same values
    np.testing.assert_array_equal(to_numpy(segment_reduce(g, xd, reduce, **kw)), to_numpy(out_d))
    want = _position_dtype(int(to_numpy(g.in_degree).max()), g.index_dtype)
    assert want == _position_dtype(hub, g.index_dtype)     # the hub is the largest row
    for a in (res_n.argmax, res_n.argmin):
        assert a is None or a.dtype == want
    gx_d = _values(segment_reduce_bwd(g, res_d, god), vtype)
    gx_n = segment_reduce_bwd(g, res_n, god)
    assert gx_n.dtype == xd.dtype and gx_n.shape == xd.shape
    gx_n = _values(gx_n, vtype)
    assert np.isfinite(gx_n).all()
    assert_close(gx_n, gx_d, vtype, f"{_id(reduce)} grad_x: atomic vs default")
    scale = float(np.abs(gx_d).max())
    np.testing.assert_allclose(gx_n, gx_d, rtol=_ELEMENT_RTOL[vtype],
                               atol=_ELEMENT_RTOL[vtype] * scale)
    if vtype in ("float32", "float64"):
        r = ref.segment_reduce_vjp(ei, xr, reduce, g.num_dst, gor)
        names = [reduce] if isinstance(reduce, str) else reduce
        loose = vtype == "float32" and "std" in names
        assert_close(gx_n, r, vtype, f"{_id(reduce)} grad_x: atomic vs reference",
                     tol=1e-4 if loose else None)


# ------------------------------------------------ the backward's addend
ADDEND_REDUCES = ["max", ["mean", "max", "min", "std"], "sum", "mul"]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("vtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("reduce", ADDEND_REDUCES, ids=_id)
def test_backward_addend(device, vtype, deterministic, reduce):
    """segment_reduce_bwd(..., addend=a) is a + grad_x (before grad_x's
    rounding), for every path of the backward (transpose walk, atomic
    max/min with and without linear terms, 16-bit fp32 sums), on a graph
    with empty source rows and a hub split into tasks; a is not modified."""
    if device == "cpu" and vtype in ("float16", "bfloat16"):
        pytest.skip("16-bit types are GPU-only")
    ei, g, x, go = _case(device, 37, num_src=400, hub=3000, reduce=reduce)
    rng = np.random.default_rng(_seed())
    xd, xr, kw = _typed(x, vtype, device)
    god, gor, _ = _typed(go, vtype, device)
    ad, ar, _ = _typed(rng.standard_normal(x.shape), vtype, device)
    before = to_numpy(ad).copy()
    _, res = segment_reduce_fwd(g, xd, reduce, deterministic=deterministic, **kw)
    plain = _values(segment_reduce_bwd(g, res, god), vtype)
    got = segment_reduce_bwd(g, res, god, addend=ad)
    assert got.dtype == xd.dtype and got.shape == xd.shape
    np.testing.assert_array_equal(to_numpy(ad), before)
    got = _values(got, vtype)
    loose = vtype == "float32" and reduce != "sum"
    assert_close(got, plain + ar, vtype, f"{_id(reduce)} grad_x + addend",
                 tol=1e-4 if loose else None)
    if vtype in ("float32", "float64"):
        want = ref.segment_reduce_vjp(ei, xr, reduce, g.num_dst, gor) + ar
        assert_close(got, want, vtype, f"{_id(reduce)} grad_x + addend vs reference",
                     tol=1e-4 if loose else None)
    # out=: a separate destination, and addend itself (the sum in place)
    xp = g.xp
    dest = xp.full(xd.shape, 7, dtype=xd.dtype)
    same = segment_reduce_bwd(g, res, god, addend=ad, out=dest)
    assert same is dest
    inplace = xp.array(ad, copy=True)
    r = segment_reduce_bwd(g, res, god, addend=inplace, out=inplace)
    assert r is inplace
    for a, what in ((dest, "out"), (inplace, "out=addend")):
        a = _values(a, vtype)
        if deterministic or device == "cpu":
            np.testing.assert_array_equal(a, got, err_msg=what)
        else:
            assert_close(a, got, vtype, f"{_id(reduce)} {what}")
    plain_out = xp.full(xd.shape, 7, dtype=xd.dtype)
    assert segment_reduce_bwd(g, res, god, out=plain_out) is plain_out
    assert_close(_values(plain_out, vtype), plain, vtype, f"{_id(reduce)} out, no addend")


@pytest.mark.parametrize("device", devices())
def test_backward_addend_is_validated(device):
    ei, g, x, go = _case(device, 4, reduce="max")
    _, res = segment_reduce_fwd(g, to_device(x, device), "max")
    god = to_device(go, device)
    for bad, err, what in ((np.zeros((x.shape[0], 5)), ValueError, "shape"),
                           (np.zeros((x.shape[0] + 1, 4)), ValueError, "rows"),
                           (np.zeros(x.shape, np.float32), TypeError, "dtype")):
        with pytest.raises(err, match="addend"):
            segment_reduce_bwd(g, res, god, addend=to_device(bad, device))
    xp = g.xp
    ad = to_device(np.zeros(x.shape), device)
    both = xp.zeros((x.shape[0] + 1, 4))
    for out, word in ((xp.zeros((x.shape[0], 5)), "out must be"),
                      (xp.zeros(x.shape, np.float32), "out must be"),
                      (xp.zeros((4, x.shape[0])).T, "out must be"),
                      (god[:x.shape[0]] if go.shape[0] >= x.shape[0] else None, "overlaps")):
        if out is None:
            continue
        with pytest.raises(ValueError, match=word):
            segment_reduce_bwd(g, res, god, out=out)
    with pytest.raises(ValueError, match="overlaps addend"):
        segment_reduce_bwd(g, res, god, addend=both[1:], out=both[:-1])
