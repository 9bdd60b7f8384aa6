"""Attention family (edge softmax; fused GAT, GATv2 and dot-product attention)
and the counter-based generator behind its dropout, against the float64
reference and PyG: outputs, every gradient, dropout statistics, validation, on
CPU and (when CuPy sees one) GPU."""
import numpy as np
import pytest

from fastgnn import Graph, edge_softmax, edge_softmax_bwd, edge_softmax_fwd, gpu_available, rng
from fastgnn.backends import reference as ref
from fastgnn.ops.attention import SCORE_INPUTS
from fastgnn.testing import (TOLERANCES, assert_close, awkward_edge_index, devices,
                             from_bf16_bits, to_bf16_bits, to_device, to_numpy)

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs a CUDA device visible to CuPy")


def _seed():
    """A seed drawn from NumPy's global state, which conftest seeds per test
    (FASTGNN_TEST_SEED; a failing test prints its seed)."""
    return np.random.randint(1 << 30)


def _graph(device, n=120, e=700, num_src=None, hub=None, seed=None):
    """An awkward graph (empty rows, self-loops, duplicates, a hub) and its edge index."""
    ei = awkward_edge_index(n, e, hub_degree=hub, seed=seed if seed is not None else _seed(),
                            num_src=num_src)
    kw = {"num_nodes": n} if num_src is None else {"num_src": num_src, "num_dst": n}
    return ei, Graph.from_edge_index(to_device(ei, device), **kw)


def _directional_fd(f, x, d, h=1e-6):
    return (f(x + h * d) - f(x - h * d)) / (2 * h)


# -------------------------------------------------------------------- rng
def test_rng_known_answers_and_twins_agree_bitwise():
    for (seed, n), bits in rng.KNOWN_ANSWERS.items():
        assert rng.bits_int(seed, n) == bits
        assert int(rng.random_bits(seed, np.array([n], dtype=np.uint64))[0]) == bits
        assert int(rng.random_bits_numba(seed, np.array([n], dtype=np.uint64))[0]) == bits
    assert rng.seed_key(0) == 0xE220A8397B1DCDAF       # SplitMix64's first output from 0
    counters = rng.attention_counters(5000, 3, offset=(1 << 64) - 7000)   # wraps mod 2^64
    for seed in (0, 1, 2**63 + 5):
        np.testing.assert_array_equal(rng.random_bits(seed, counters),
                                      rng.random_bits_numba(seed, counters))


def test_rng_uniform_and_keep_rate():
    """Uniform on [0, 1): mean, a chi-square over 64 bins and the keep rate
    at several p, each with a bound many standard deviations wide."""
    n = 1 << 18
    u = rng.uniform(1234, np.arange(n))
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 6 * np.sqrt(1 / 12 / n)
    counts = np.bincount((u * 64).astype(int), minlength=64)
    chi2 = ((counts - n / 64) ** 2 / (n / 64)).sum()
    assert chi2 < 150                                  # 63 dof: mean 63, sd 11
    for p in (0.1, 0.5, 0.9):
        keep = rng.keep_mask(99, 17, n // 4, 4, p)
        assert abs(keep.mean() - (1 - p)) < 6 * np.sqrt(p * (1 - p) / n)
        # the mask is the uniform test, weight (e, h) at counter offset + e*H + h
        np.testing.assert_array_equal(keep.ravel(), rng.uniform(99, 17 + np.arange(n)) >= p)
    # neighbouring seeds are unrelated streams
    assert abs(np.corrcoef(u, rng.uniform(1235, np.arange(n)))[0, 1]) < 6 / np.sqrt(n)


# ------------------------------------------------------------ edge_softmax
@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("heads", [1, 3, 8])
@pytest.mark.parametrize("dropout", [0.0, 0.4])
def test_edge_softmax_matches_reference(device, dtype, heads, dropout):
    ei, g = _graph(device, hub=300)
    r = np.random.default_rng(_seed())
    s = (3 * r.standard_normal((ei.shape[1], heads))).astype(dtype)
    go = r.standard_normal(s.shape).astype(dtype)
    seed = int(r.integers(1 << 40))
    out, res = edge_softmax_fwd(g, to_device(s, device), dropout=dropout, seed=seed, offset=11)
    assert out.dtype == s.dtype and out.shape == s.shape
    assert_close(to_numpy(out), ref.edge_softmax(ei, s, 120, dropout, seed, 11), dtype)
    gs = edge_softmax_bwd(g, res, to_device(go, device))
    assert gs.dtype == s.dtype and gs.shape == s.shape
    assert_close(to_numpy(gs), ref.edge_softmax_vjp(ei, s, 120, go, dropout, seed, 11), dtype,
                 "grad_scores")
    if dropout == 0:
        sums = np.zeros((120, heads))
        np.add.at(sums, ei[1], to_numpy(out).astype(np.float64))
        has = np.bincount(ei[1], minlength=120) > 0
        np.testing.assert_allclose(sums[has], 1, rtol=1e-5)


@pytest.mark.parametrize("device", devices())
def test_edge_softmax_flat_bipartite_and_int64(device):
    ei = awkward_edge_index(50, 300, seed=_seed(), num_src=17)
    g = Graph.from_edge_index(to_device(ei, device), num_src=17, num_dst=50, index_dtype=np.int64)
    r = np.random.default_rng(_seed())
    s, go = r.standard_normal(ei.shape[1]), r.standard_normal(ei.shape[1])
    out, res = edge_softmax_fwd(g, to_device(s, device))
    assert out.shape == s.shape
    assert_close(to_numpy(out), ref.edge_softmax(ei, s, 50), "float64")
    assert_close(to_numpy(edge_softmax_bwd(g, res, to_device(go, device))),
                 ref.edge_softmax_vjp(ei, s, 50, go), "float64")


def test_edge_softmax_matches_pyg():
    torch = pytest.importorskip("torch")
    pyg_softmax = pytest.importorskip("torch_geometric.utils").softmax
    ei, g = _graph("cpu", hub=200)
    r = np.random.default_rng(_seed())
    s, go = 4 * r.standard_normal((ei.shape[1], 4)), r.standard_normal((ei.shape[1], 4))
    st = torch.tensor(s, requires_grad=True)
    out_t = pyg_softmax(st, torch.from_numpy(ei[1]), num_nodes=120)
    (out_t * torch.from_numpy(go)).sum().backward()
    out, res = edge_softmax_fwd(g, s)
    assert_close(out, out_t.detach().numpy(), "float64", "vs PyG")
    assert_close(edge_softmax_bwd(g, res, go), st.grad.numpy(), "float64", "grad vs PyG")


def test_edge_softmax_extreme_scores():
    """Large scores do not overflow; a -inf score gets weight 0 (no NaN)."""
    ei = np.array([[0, 1, 2, 3, 4], [0, 0, 0, 1, 1]])
    g = Graph.from_edge_index(ei, num_nodes=5)
    s = np.array([1000.0, 999.0, -np.inf, -np.inf, 3.0])
    out = edge_softmax(g, s)
    e = np.exp(-1.0)
    np.testing.assert_allclose(out, [1 / (1 + e), e / (1 + e), 0, 0, 1], rtol=1e-12)


def test_reference_softmax_vjp_by_finite_differences():
    ei, _ = _graph("cpu", n=20, e=80)
    r = np.random.default_rng(_seed())
    s, go = r.standard_normal((ei.shape[1], 2)), r.standard_normal((ei.shape[1], 2))
    for dropout in (0.0, 0.5):
        f = lambda s_: np.sum(ref.edge_softmax(ei, s_, 20, dropout, 3, 5) * go)  # noqa: E731
        gs = ref.edge_softmax_vjp(ei, s, 20, go, dropout, 3, 5)
        for _ in range(3):
            d = r.standard_normal(s.shape)
            assert abs(_directional_fd(f, s, d) - np.sum(gs * d)) < 1e-6


@pytest.mark.parametrize("device", devices())
def test_edge_softmax_dropout_is_reproducible(device):
    ei, g = _graph(device)
    s = to_device(np.random.default_rng(_seed()).standard_normal((ei.shape[1], 2)), device)
    a = to_numpy(edge_softmax(g, s, dropout=0.5, seed=7))
    np.testing.assert_array_equal(a, to_numpy(edge_softmax(g, s, dropout=0.5, seed=7)))
    assert not np.array_equal(a, to_numpy(edge_softmax(g, s, dropout=0.5, seed=8)))
    assert not np.array_equal(a, to_numpy(edge_softmax(g, s, dropout=0.5, seed=7, offset=1)))
    keep = rng.keep_mask(7, 0, ei.shape[1], 2, 0.5)
    np.testing.assert_array_equal(a == 0, ~keep)       # the documented mask, caller order


@pytest.mark.parametrize("device", devices())
def test_edge_softmax_bad_inputs(device):
    ei, g = _graph(device)
    s = to_device(np.ones((ei.shape[1], 2)), device)
    _, res = edge_softmax_fwd(g, s)
    cases = [
        (lambda: edge_softmax(g, to_device(np.ones((ei.shape[1] - 1, 2)), device)), ValueError,
         "scores must have shape [E] or [E, H]"),
        (lambda: edge_softmax(g, to_device(np.ones((ei.shape[1], 2, 1)), device)), ValueError,
         "scores must have shape"),
        (lambda: edge_softmax(g, to_device(np.ones((ei.shape[1], 2), dtype=np.int64), device)),
         TypeError, "scores must be"),
        (lambda: edge_softmax(g, None), TypeError, "scores must be"),
        (lambda: edge_softmax(g, s, dropout=1.0), ValueError, "dropout must be in [0, 1)"),
        (lambda: edge_softmax(g, s, dropout=-0.1), ValueError, "dropout must be in [0, 1)"),
        (lambda: edge_softmax(g, s, dropout="0.1"), TypeError, "dropout must be a float"),
        (lambda: edge_softmax(g, s, seed=-1), ValueError, "seed must be in [0, 2^64)"),
        (lambda: edge_softmax(g, s, seed=1.5), TypeError, "seed must be an integer"),
        (lambda: edge_softmax(g, s, offset=2**64), ValueError, "offset must be in"),
        (lambda: edge_softmax(ei, s), TypeError, "graph must be a fastgnn.Graph"),
        (lambda: edge_softmax_bwd(g, res, to_device(np.ones((ei.shape[1], 3)), device)),
         ValueError, "grad_out must have shape"),
    ]
    if device == "cpu":
        cases.append((lambda: edge_softmax(g, np.ones((ei.shape[1], 2), np.float16)), TypeError,
                      "CPU backend supports"))
    for fn, err, words in cases:
        with pytest.raises(err) as info:
            fn()
        assert words in str(info.value), str(info.value)


def test_cpu_thread_pool_is_bitwise_equal_to_serial(monkeypatch):
    """The CPU backend splits fixed chunks over a thread pool: same bits as one thread."""
    import fastgnn.backends.cpu.attention as cpu
    ei, g = _graph("cpu", n=900, e=6000, hub=2000)
    r = np.random.default_rng(_seed())
    s, go = r.standard_normal((ei.shape[1], 3)), r.standard_normal((ei.shape[1], 3))
    runs = []
    for serial in (10**12, 0):
        monkeypatch.setattr(cpu, "SERIAL_EDGES", serial)
        out, res = edge_softmax_fwd(g, s, dropout=0.2, seed=4)
        runs.append((out, edge_softmax_bwd(g, res, go)))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------- edge_attention
# (heads, C, negative_slope): heads 1..8, odd widths, several slopes
SHAPES = [(1, 1, 0.2), (2, 3, 0.0), (3, 7, -0.5), (8, 16, 0.2), (4, 5, 1.5)]
SCORES = ["gat", "gatv2", "dot"]


def _inputs(score, graph, heads, channels, edge_term, rng_, dtype=np.float64, bias=False):
    """Random inputs of `score` for `graph` (NumPy, caller's shapes); bias:
    also an output bias, [H, C] or (bias="flat") [H * C]."""
    ns, nd, E = graph.num_src, graph.num_dst, graph.num_edges
    H, C = heads, channels
    n = lambda *shape: rng_.standard_normal(shape).astype(dtype)  # noqa: E731
    if score == "gat":
        x = {"a_src": n(ns, H), "a_dst": n(nd, H), "a_edge": n(E, H), "v": n(ns, H, C)}
    elif score == "gatv2":
        x = {"xl": n(ns, H, C), "xr": n(nd, H, C), "att": n(H, C), "xe": n(E, H, C)}
    else:
        x = {"q": n(nd, H, C), "k": n(ns, H, C), "v": n(ns, H, C), "ee": n(E, H, C)}
    if not edge_term:
        x = {k: v for k, v in x.items() if k not in ("a_edge", "xe", "ee")}
    if bias:
        x["bias"] = n(H * C) if bias == "flat" else n(H, C)
    return x


def _att_bound(ei, num_dst, x, go, ga, ref_att, **kw):
    """eps32 * ||sum_e p_e (|dp_e| + |D_i|) |lrelu(t_e)| || / ||grad att||: the
    fp32 rounding of gatv2's grad att = sum_e ds_e lrelu(t_e), term by term,
    relative to a sum that cancels (ds sums to 0 over every target's edges).
    benchmarks/dev/probe_gatv2_att_rounding.py measures a GPU's error against it."""
    sm = ref.edge_attention_softmax_terms(ei, "gatv2", num_dst, x, go, ga, **kw)
    dst = np.asarray(ei)[1]
    lt = ref._lrelu(sm["aux"]["t"], kw.get("negative_slope", 0.2))
    terms = (sm["p"] * (np.abs(sm["dp"]) + np.abs(sm["D"][dst])))[..., None] * np.abs(lt)
    den = np.linalg.norm(ref_att)
    return np.finfo(np.float32).eps * np.linalg.norm(terms.sum(0)) / den if den > 0 else 0.0


def _att_tol(ei, num_dst, x, go, ga, ref_att, vtype, tol, **kw):
    """Tolerance of gatv2's grad att: in fp32 `tol` (None: TOLERANCES) or
    `_att_bound` where that is larger (on an H200, over 7307 random graphs,
    the error was at most 0.68 of the bound and above 1e-5 in 23 of them,
    mostly one head of width 1); other dtypes `tol`."""
    if vtype != "float32":
        return tol
    return max(TOLERANCES["float32"] if tol is None else tol,
               _att_bound(ei, num_dst, x, go, ga, ref_att, **kw))


def _att_bf16_reference(ei, num_dst, x, go, out, **kw):
    """gatv2's grad att as a bf16 backward without grad_alpha or bias
    computes it: D_i = <g_i, out_i> of the bf16-rounded output `out`
    [num_dst, H, C] (float64 values) instead of the exact D. ds sums to 0
    over every target's edges, so D's rounding (2^-9 of |g||out|) reaches
    grad att amplified by that cancellation: a GPU test of one head of width
    1 was 0.109 off the exact reference."""
    sm = ref.edge_attention_softmax_terms(ei, "gatv2", num_dst, x, go, None, **kw)
    dst = np.asarray(ei)[1]
    delta = np.einsum("nhc,nhc->nh", np.asarray(go, np.float64), np.asarray(out, np.float64))
    lt = ref._lrelu(sm["aux"]["t"], kw.get("negative_slope", 0.2))
    return ((sm["p"] * (sm["dp"] - delta[dst]))[..., None] * lt).sum(0).reshape(
        np.shape(x["att"]))


def _on_kink(x):
    """x with gat's and gatv2's score inputs (a_src, a_dst; xl, xr) rounded
    to integers in [-2, 2]: their LeakyReLU argument is then exactly 0 on
    about a quarter of the (edge, channel) pairs."""
    return {k: np.clip(np.round(v), -2, 2) if k in ("xl", "xr", "a_src", "a_dst") else v
            for k, v in x.items()}


def _off_kink(ei, score, x, margin=1e-5, step=1e-3):
    """x with the edge term moved off LeakyReLU's kink: where the exact
    argument of gat's / gatv2's LeakyReLU (a sum of three inputs) is within
    `margin` of 0, the edge term moves by `step` away from it. fp32 kernels
    round such a sum to exactly 0 and take the slope there, the float64
    reference the exact sign, so one gradient element would differ by
    (1 - slope) ds att: about 1 test run in 1300 of an fp32 GPU case with an
    edge term (a 1.6e-3 grad xl error in one such run). Without an
    edge term the sum is one rounded addition, whose sign is exact."""
    key = {"gatv2": "xe", "gat": "a_edge"}.get(score)
    if key not in x:
        return x
    _, _, aux = ref._attention_edges(ei, score, x, 0.2, None)
    t = aux["t" if score == "gatv2" else "u"]          # the LeakyReLU argument
    near = np.abs(t) < margin
    return {**x, key: np.where(near, x[key] + np.where(t < 0, -step, step), x[key]).astype(
        x[key].dtype)}


def _check_attention(device, ei, g, score, x, dtype, *, slope=0.2, scale=None, dropout=0.0,
                     seed=0, offset=0, with_alpha=False, rng_=None):
    """Forward (and alpha) and every gradient against the reference."""
    from fastgnn import edge_attention_bwd, edge_attention_fwd
    from fastgnn.ops.attention import SCORE_INPUTS
    rng_ = rng_ or np.random.default_rng(_seed())
    x = _off_kink(ei, score, x)
    xd = {k: to_device(v, device) for k, v in x.items()}
    kw = dict(negative_slope=slope, scale=scale, dropout=dropout, seed=seed, offset=offset)
    out, res = edge_attention_fwd(g, score, **xd, return_attention_weights=with_alpha, **kw)
    out, alpha = out if with_alpha else (out, None)
    r_out, r_alpha = ref.edge_attention(ei, score, g.num_dst, x, **kw)
    assert out.dtype == np.dtype(dtype) and out.shape == r_out.shape
    assert_close(to_numpy(out), r_out, dtype, f"{score} out")
    if with_alpha:
        assert alpha.shape == (g.num_edges, r_out.shape[1]) and alpha.dtype == np.dtype(dtype)
        assert_close(to_numpy(alpha), r_alpha, dtype, f"{score} alpha")
    go = rng_.standard_normal(r_out.shape).astype(dtype)
    ga = rng_.standard_normal(r_alpha.shape).astype(dtype) if with_alpha else None
    grads = edge_attention_bwd(g, res, to_device(go, device), to_device(ga, device))
    r_grads = ref.edge_attention_vjp(ei, score, g.num_dst, x, go, ga, **kw)
    names = SCORE_INPUTS[score]
    assert len(grads) == len(names)
    for name, gr in zip(names, grads):
        if name not in x:
            assert gr is None, name
            continue
        assert gr.shape == x[name].shape and gr.dtype == np.dtype(dtype), name
        tol = (_att_tol(ei, g.num_dst, x, go, ga, r_grads[name], dtype, None, **kw)
               if name == "att" else None)
        assert_close(to_numpy(gr), r_grads[name], dtype, f"{score} grad {name}", tol=tol)
    return to_numpy(out), grads


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("edge_term", [False, True])
@pytest.mark.parametrize("heads,channels,slope", SHAPES)
def test_attention_matches_reference(device, score, dtype, edge_term, heads, channels, slope):
    ei, g = _graph(device, hub=300)
    r = np.random.default_rng(_seed())
    x = _inputs(score, g, heads, channels, edge_term, r, dtype)
    out, _ = _check_attention(device, ei, g, score, x, dtype, slope=slope, rng_=r)
    assert np.all(out[-12:] == 0)                 # targets without in-edges (last tenth)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("score", ["gat", "gatv2"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("slope", [0.2, -0.5])
def test_attention_on_the_kink_matches_reference(device, score, dtype, slope):
    """Score inputs rounded to integers in [-2, 2]: the LeakyReLU argument
    (gatv2's xl_j + xr_i, gat's a_src + a_dst) is exactly 0 on about a
    quarter of the pairs, where every pass takes lrelu'(0) = slope, as the
    reference does."""
    ei, g = _graph(device, hub=300)
    r = np.random.default_rng(_seed())
    x = _on_kink(_inputs(score, g, 4, 8, False, r, dtype))
    t = (x["xl"][ei[0]] + x["xr"][ei[1]] if score == "gatv2"
         else x["a_src"][ei[0]] + x["a_dst"][ei[1]])
    assert np.mean(t == 0) > 0.1
    _check_attention(device, ei, g, score, x, dtype, slope=slope, rng_=r)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("bias", [True, "flat"])
@pytest.mark.parametrize("with_alpha", [False, True])
def test_attention_with_bias_matches_reference(device, score, dtype, bias, with_alpha):
    """An output bias ([H, C] or [H * C]) added in the store: out and every
    gradient against the reference (grad_bias = column sums of grad_out; D
    from out - bias, so the other gradients are those without a bias), with
    odd widths, a hub and targets without in-edges (which get the bias)."""
    ei, g = _graph(device, hub=300)
    r = np.random.default_rng(_seed())
    x = _inputs(score, g, 3, 5, True, r, dtype, bias=bias)
    out, _ = _check_attention(device, ei, g, score, x, dtype, rng_=r, with_alpha=with_alpha,
                              dropout=0.25, seed=5)
    assert np.allclose(out[-12:], np.broadcast_to(x["bias"].reshape(3, 5), (12, 3, 5)))


def test_attention_bad_bias_raises():
    from fastgnn import edge_attention
    ei, g = _graph("cpu")
    x = _inputs("gatv2", g, 2, 4, False, np.random.default_rng(0))
    for b, err, words in [(np.ones(7), ValueError, "bias must have shape [heads, C]"),
                          (np.ones((4, 2)), ValueError, "bias must have shape"),
                          (np.ones((2, 4), np.float32), TypeError, "bias has dtype float32"),
                          ("b", TypeError, "bias")]:
        with pytest.raises(err) as info:
            edge_attention(g, "gatv2", **x, bias=b)
        assert words in str(info.value), str(info.value)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("score", SCORES)
def test_attention_bipartite_int64_and_scale(device, score):
    ei = awkward_edge_index(90, 600, seed=_seed(), num_src=41, hub_degree=250)
    g = Graph.from_edge_index(to_device(ei, device), num_src=41, num_dst=90,
                              index_dtype=np.int64)
    r = np.random.default_rng(_seed())
    x = _inputs(score, g, 3, 6, True, r)
    kw = {"scale": 0.37} if score == "dot" else {"slope": 0.05}
    _check_attention(device, ei, g, score, x, "float64", rng_=r, **kw)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("score", SCORES)
def test_attention_graph_without_edges(device, score):
    g = Graph.from_edge_index(to_device(np.zeros((2, 0), dtype=np.int64), device), num_nodes=6)
    from fastgnn import edge_attention_bwd, edge_attention_fwd
    x = _inputs(score, g, 2, 3, True, np.random.default_rng(_seed()))
    out, res = edge_attention_fwd(g, score, **{k: to_device(v, device) for k, v in x.items()})
    assert out.shape == (6, 2, 3) and np.all(to_numpy(out) == 0)
    for name, gr in zip(SCORE_INPUTS[score], edge_attention_bwd(
            g, res, to_device(np.ones((6, 2, 3)), device))):
        if name == "bias":
            assert gr is None               # not given
            continue
        assert gr is not None and np.all(to_numpy(gr) == 0)
    # with a bias every row is the bias, and its gradient the column sum
    x = _inputs(score, g, 2, 3, True, np.random.default_rng(_seed()), bias=True)
    out, res = edge_attention_fwd(g, score, **{k: to_device(v, device) for k, v in x.items()})
    assert np.array_equal(to_numpy(out), np.broadcast_to(x["bias"], (6, 2, 3)))
    grads = dict(zip(SCORE_INPUTS[score], edge_attention_bwd(
        g, res, to_device(np.ones((6, 2, 3)), device))))
    assert np.array_equal(to_numpy(grads["bias"]), np.full((2, 3), 6.0))


@pytest.mark.parametrize("score", SCORES)
def test_reference_attention_vjp_by_finite_differences(score):
    """The oracle itself: directional derivatives of <out, g> + <alpha, ga>
    for every input, with and without dropout."""
    ei, g = _graph("cpu", n=25, e=120)
    r = np.random.default_rng(_seed())
    x = _inputs(score, g, 2, 3, True, r)
    go, ga = r.standard_normal((25, 2, 3)), r.standard_normal((ei.shape[1], 2))
    for dropout in (0.0, 0.4):
        kw = dict(negative_slope=0.3, dropout=dropout, seed=5, offset=2)
        grads = ref.edge_attention_vjp(ei, score, 25, x, go, ga, **kw)

        def f(name, val):
            o, a = ref.edge_attention(ei, score, 25, {**x, name: val}, **kw)
            return np.sum(o * go) + np.sum(a * ga)
        for name in x:
            d = r.standard_normal(x[name].shape)
            fd = _directional_fd(lambda v: f(name, v), x[name], d)
            assert abs(fd - np.sum(grads[name] * d)) < 1e-6 * max(1, abs(fd)), (name, dropout)


@pytest.mark.parametrize("device", devices())
def test_gatv2_att_layouts_and_shared_weights(device):
    """att as PyG stores it ([1, H, C], gradient in that shape) or [H, C];
    xl and xr the same array (GATv2Conv's share_weights): one gradient each."""
    ei, g = _graph(device)
    r = np.random.default_rng(_seed())
    x = _inputs("gatv2", g, 3, 4, True, r)
    x["att"] = x["att"][None]
    _check_attention(device, ei, g, "gatv2", x, "float64", rng_=r)
    x["xr"] = x["xl"]
    _check_attention(device, ei, g, "gatv2", x, "float64", rng_=r)


# ------------------------------------------- dropout and attention weights
@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("heads,channels", [(1, 3), (4, 7)])
def test_attention_dropout_and_weights_match_reference(device, score, dtype, heads, channels):
    """Dropout from the documented counter-based mask, alpha (before dropout)
    and its cotangent, against the reference; every gradient."""
    ei, g = _graph(device, hub=300)
    r = np.random.default_rng(_seed())
    x = _inputs(score, g, heads, channels, True, r, dtype)
    seed, offset = int(r.integers(1 << 62)), int(r.integers(1 << 40))
    _check_attention(device, ei, g, score, x, dtype, dropout=0.35, seed=seed, offset=offset,
                     with_alpha=True, rng_=r)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("score", SCORES)
def test_attention_dropout_is_reproducible(device, score):
    from fastgnn import edge_attention, edge_attention_bwd, edge_attention_fwd
    ei, g = _graph(device)
    r = np.random.default_rng(_seed())
    x = {k: to_device(v, device) for k, v in _inputs(score, g, 2, 5, True, r).items()}
    go = to_device(r.standard_normal((120, 2, 5)), device)

    def run(**kw):
        (out, alpha), res = edge_attention_fwd(g, score, **x, dropout=0.5,
                                               return_attention_weights=True, **kw)
        return [to_numpy(a) for a in (out, alpha, *edge_attention_bwd(g, res, go))]
    a = run(seed=3)
    for u, w in zip(a, run(seed=3)):
        np.testing.assert_array_equal(u, w)           # bitwise, forward and backward
    b, c = run(seed=4), run(seed=3, offset=1)
    assert not np.array_equal(a[0], b[0]) and not np.array_equal(a[0], c[0])
    # alpha is the softmax before dropout: the same for every seed and without dropout
    np.testing.assert_array_equal(a[1], b[1])
    _, alpha0 = edge_attention(g, score, **x, return_attention_weights=True)
    np.testing.assert_array_equal(a[1], to_numpy(alpha0))
    sums = np.zeros((120, 2))
    np.add.at(sums, ei[1], a[1])
    has = np.bincount(ei[1], minlength=120) > 0
    np.testing.assert_allclose(sums[has], 1, rtol=1e-12)


@pytest.mark.parametrize("score", SCORES)
def test_attention_dropout_expected_value(score):
    """Averaged over many seeds, the dropped-out output and gradients are the
    no-dropout ones (z has mean 1 and both are linear in z): every element
    within 6 standard errors (estimated from the samples)."""
    from fastgnn import edge_attention_bwd, edge_attention_fwd
    ei, g = _graph("cpu", n=30, e=120)
    r = np.random.default_rng(_seed())
    x = _inputs(score, g, 2, 3, True, r)
    go = r.standard_normal((30, 2, 3))

    def run(**kw):
        out, res = edge_attention_fwd(g, score, **x, **kw)
        return np.concatenate([out.ravel()] + [gr.ravel() for gr in
                                               edge_attention_bwd(g, res, go) if gr is not None])
    exact = run()
    n = 1000
    base = int(r.integers(1 << 40))
    samples = np.stack([run(dropout=0.3, seed=base + s) for s in range(n)])
    mean, sd = samples.mean(0), samples.std(0, ddof=1)
    # constant up to rounding: targets without in-edges, or with one (whose
    # softmax gradient vanishes)
    const = sd < 1e-10
    np.testing.assert_allclose(mean[const], exact[const], rtol=1e-9, atol=1e-9)
    zscore = np.abs(mean - exact)[~const] / (sd[~const] / np.sqrt(n))
    assert zscore.max() < 6, zscore.max()
    assert (~const).sum() > 100


@pytest.mark.parametrize("score", SCORES)
def test_attention_backward_matches_finite_differences_with_dropout(score):
    """The backend's backward regenerates the forward's mask: its VJP equals
    directional finite differences of its own forward at a fixed seed."""
    from fastgnn import edge_attention_bwd, edge_attention_fwd
    ei, g = _graph("cpu", n=25, e=120)
    r = np.random.default_rng(_seed())
    x = _inputs(score, g, 3, 4, True, r)
    go, ga = r.standard_normal((25, 3, 4)), r.standard_normal((ei.shape[1], 3))
    kw = dict(dropout=0.5, seed=int(r.integers(1 << 30)), offset=9,
              return_attention_weights=True)
    _, res = edge_attention_fwd(g, score, **x, **kw)
    grads = dict(zip(x, edge_attention_bwd(g, res, go, ga)))

    def f(name, val):
        (o, a), _ = edge_attention_fwd(g, score, **{**x, name: val}, **kw)
        return np.sum(o * go) + np.sum(a * ga)
    for name in x:
        d = r.standard_normal(x[name].shape)
        fd = _directional_fd(lambda v: f(name, v), x[name], d)
        assert abs(fd - np.sum(grads[name] * d)) < 1e-6 * max(1, abs(fd)), name


# ------------------------------------------------ memory, determinism, errors
@pytest.mark.parametrize("score", SCORES)
def test_attention_allocates_nothing_of_size_edges_heads_channels(score):
    """Forward + backward (without edge terms, whose gradient is E x H x C by
    nature) allocate far less than one E x H x C array (NumPy allocations are
    traced by tracemalloc; the kernels' scratch is per chunk)."""
    import tracemalloc

    from fastgnn import edge_attention_bwd, edge_attention_fwd
    ei, g = _graph("cpu", n=100, e=30000)
    r = np.random.default_rng(_seed())
    x = _inputs(score, g, 4, 16, False, r, np.float32)
    go = r.standard_normal((100, 4, 16)).astype(np.float32)
    _, res = edge_attention_fwd(g, score, **x, dropout=0.1)
    edge_attention_bwd(g, res, go)                    # warm caches (transpose, index maps)
    tracemalloc.start()
    try:
        _, res = edge_attention_fwd(g, score, **x, dropout=0.1)
        edge_attention_bwd(g, res, go)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    ehc = g.num_edges * 4 * 16 * 4
    assert peak < ehc / 8, (peak, ehc)


@pytest.mark.parametrize("score", SCORES)
def test_attention_repeatable_not_mutating_and_thread_independent(score, monkeypatch):
    import fastgnn.backends.cpu.attention as cpu
    from fastgnn import edge_attention_bwd, edge_attention_fwd
    ei, g = _graph("cpu", n=700, e=6000, hub=2000)
    r = np.random.default_rng(_seed())
    x = _inputs(score, g, 2, 5, True, r, np.float32)
    go = r.standard_normal((700, 2, 5)).astype(np.float32)
    ga = r.standard_normal((ei.shape[1], 2)).astype(np.float32)
    copies = {k: v.copy() for k, v in x.items()}
    runs = []
    for serial in (10**12, 0, 0):
        monkeypatch.setattr(cpu, "SERIAL_EDGES", serial)
        (out, alpha), res = edge_attention_fwd(g, score, **x, dropout=0.2, seed=1,
                                               return_attention_weights=True)
        runs.append([out, alpha, *edge_attention_bwd(g, res, go, ga)])
    for run in runs[1:]:
        for a, b in zip(runs[0], run):
            np.testing.assert_array_equal(a, b)
    for k, v in x.items():
        np.testing.assert_array_equal(v, copies[k])


@pytest.mark.parametrize("device", devices())
def test_attention_bad_inputs(device):
    from fastgnn import edge_attention, edge_attention_bwd, edge_attention_fwd
    ei, g = _graph(device)
    r = np.random.default_rng(_seed())
    d = lambda a: to_device(a, device)  # noqa: E731
    gat = {k: d(v) for k, v in _inputs("gat", g, 2, 3, True, r).items()}
    v2 = {k: d(v) for k, v in _inputs("gatv2", g, 2, 3, True, r).items()}
    dot = {k: d(v) for k, v in _inputs("dot", g, 2, 3, True, r).items()}
    E = ei.shape[1]
    _, res = edge_attention_fwd(g, "dot", **dot)
    cases = [
        (lambda: edge_attention(g, "gcn", **gat), ValueError, "score must be one of"),
        (lambda: edge_attention(g, "gat", **gat, q=dot["q"]), ValueError,
         "score='gat' takes a_src, a_dst, a_edge, v, bias; got q"),
        (lambda: edge_attention(g, "gat", v=gat["v"], a_dst=gat["a_dst"]), TypeError,
         "needs a_src"),
        (lambda: edge_attention(g, "dot", q=dot["q"], k=dot["k"]), TypeError, "needs v"),
        (lambda: edge_attention(g, "gat", **{**gat, "a_src": d(np.ones((120, 3)))}),
         ValueError, "a_src must have shape [num_src, heads] = [120, 2], got (120, 3)"),
        (lambda: edge_attention(g, "gat", **{**gat, "a_edge": d(np.ones((E - 1, 2)))}),
         ValueError, "a_edge must have shape [E, heads]"),
        (lambda: edge_attention(g, "gat", **{**gat, "v": d(np.ones((120, 6)))}),
         ValueError, "v must have shape [nodes, heads, C]"),
        (lambda: edge_attention(g, "gatv2", **{**v2, "att": d(np.ones((2, 4)))}),
         ValueError, "att must have shape [heads, C] (or [1, heads, C]) = [2, 3]"),
        (lambda: edge_attention(g, "gatv2", **{**v2, "xr": d(np.ones((119, 2, 3)))}),
         ValueError, "xr must have shape [num_dst, heads, C]"),
        (lambda: edge_attention(g, "dot", **{**dot, "k": d(np.ones((120, 2, 4)))}),
         ValueError, "k must have shape [num_src, heads, C] = [120, 2, 3]"),
        (lambda: edge_attention(g, "dot", **{**dot, "ee": d(np.ones((E, 2, 3), np.float32))}),
         TypeError, "ee has dtype float32 but q has float64"),
        (lambda: edge_attention(g, "dot", **{**dot, "v": d(np.ones((120, 2, 3), np.int64))}),
         TypeError, "v must be"),
        (lambda: edge_attention(g, "dot", **{**dot, "q": d(np.ones((120, 2, 0)))}),
         ValueError, "q must have shape [nodes, heads, C] with heads, C >= 1"),
        (lambda: edge_attention(g, "gat", **gat, scale=0.5), ValueError,
         "scale applies to score='dot' only"),
        (lambda: edge_attention(g, "dot", **dot, scale="big"), TypeError,
         "scale must be a finite float"),
        (lambda: edge_attention(g, "gat", **gat, negative_slope=None), TypeError,
         "negative_slope must be a finite float"),
        (lambda: edge_attention(g, "gat", **gat, dropout=1.0), ValueError,
         "dropout must be in [0, 1)"),
        (lambda: edge_attention(g, "gat", **gat, seed=-3), ValueError, "seed must be in"),
        (lambda: edge_attention(g, "gat", **gat, deterministic="no"), TypeError,
         "deterministic must be a bool"),
        (lambda: edge_attention(ei, "gat", **gat), TypeError, "graph must be a fastgnn.Graph"),
        (lambda: edge_attention_bwd(g, res, d(np.ones((120, 2, 4)))), ValueError,
         "grad_out must have shape [num_dst, heads, C] = [120, 2, 3]"),
        (lambda: edge_attention_bwd(g, res, None, d(np.ones((E, 3)))), ValueError,
         "grad_alpha must have shape [E, heads]"),
        (lambda: edge_attention_bwd(g, res, None, needs=["q", "xl"]), ValueError,
         "needs names ['xl']"),
        (lambda: edge_attention_bwd(_graph(device, e=701)[1], res, None), ValueError,
         "residuals come from a different graph"),
    ]
    if device == "cpu":
        cases.append((lambda: edge_attention(g, "dot", **{k: v.astype(np.float16)
                                                          for k, v in dot.items()}),
                      TypeError, "CPU backend supports"))
    else:
        cases.append((lambda: edge_attention(g, "dot", **{**dot, "k": np.ones((120, 2, 3))}),
                      ValueError, "k lives on CPU"))
    for fn, err, words in cases:
        with pytest.raises(err) as info:
            fn()
        assert words in str(info.value), str(info.value)


@pytest.mark.parametrize("device", devices())
def test_attention_needs_and_missing_cotangents(device):
    """needs selects gradients (others None); grad_out=None means zero."""
    from fastgnn import edge_attention_bwd, edge_attention_fwd
    ei, g = _graph(device)
    r = np.random.default_rng(_seed())
    x = _inputs("dot", g, 2, 3, True, r)
    (out, alpha), res = edge_attention_fwd(g, "dot", **{k: to_device(v, device)
                                                        for k, v in x.items()},
                                           return_attention_weights=True)
    go = r.standard_normal((120, 2, 3))
    full = edge_attention_bwd(g, res, to_device(go, device))
    part = edge_attention_bwd(g, res, to_device(go, device), needs=["k", "ee"])
    assert part[0] is None and part[2] is None
    np.testing.assert_array_equal(to_numpy(part[1]), to_numpy(full[1]))
    np.testing.assert_array_equal(to_numpy(part[3]), to_numpy(full[3]))
    # source side alone (k, v): no target-side gradient, the same bits
    src = edge_attention_bwd(g, res, to_device(go, device), needs=["k", "v"])
    assert src[0] is None and src[3] is None
    np.testing.assert_array_equal(to_numpy(src[1]), to_numpy(full[1]))
    np.testing.assert_array_equal(to_numpy(src[2]), to_numpy(full[2]))
    ga = r.standard_normal((ei.shape[1], 2))
    only_alpha = edge_attention_bwd(g, res, None, to_device(ga, device))
    r_grads = ref.edge_attention_vjp(ei, "dot", 120, x, np.zeros((120, 2, 3)), ga)
    for name, gr in zip(("q", "k", "v", "ee"), only_alpha):
        assert_close(to_numpy(gr), r_grads[name], "float64", name)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_cpu_thread_pool_survives_fork(monkeypatch):
    """A forked child (e.g. a data-loader worker) inherits the pool object but
    not its threads; the backend builds a new pool there instead of hanging."""
    import multiprocessing as mp

    import fastgnn.backends.cpu.attention as cpu
    monkeypatch.setattr(cpu, "SERIAL_EDGES", 0)
    ei, g = _graph("cpu", n=300, e=3000)
    s = np.random.default_rng(_seed()).standard_normal((ei.shape[1], 2))
    expect = edge_softmax(g, s)                        # the parent's pool exists now
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(edge_softmax, (g, s)).get(timeout=60)
    np.testing.assert_array_equal(got, expect)


@pytest.mark.parametrize("device", devices())
def test_edge_softmax_nan_score_poisons_its_row_like_pyg(device):
    """A NaN score makes its whole target row NaN (torch's scatter max does), and
    no other row: the CPU and CUDA kernels and PyG's softmax agree."""
    import torch
    from torch_geometric.utils import softmax as pyg_softmax
    ei = np.array([[0, 1, 2, 0, 1], [1, 1, 1, 2, 0]])
    s = np.array([[0.1], [np.nan], [0.3], [0.5], [2.0]])
    g = Graph.from_edge_index(to_device(ei, device), num_nodes=3)
    out = to_numpy(edge_softmax(g, to_device(s, device)))
    ref = pyg_softmax(torch.tensor(s), torch.tensor(ei[1]), num_nodes=3).numpy()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_allclose(out[~np.isnan(out)], ref[~np.isnan(ref)])


# ------------------------------------------------- GPU backward: fp32 and bf16
# Gradients of fp32 and bf16 runs against the float64 reference on the values
# the GPU saw, covering every path of delta_i = <g_i, out_i>: computed inside
# the target pass (grad_out only; hub rows of > 256 in-edges split into
# several tasks, each computing it) and by attn_delta with grad_alpha's term
# (the attention weights' cotangent). bf16: delta uses the bf16-rounded `out`, and
# the target-side sums of ds_e (which cancel exactly for the exact delta) carry
# that rounding: ~1e-2 relative in a NumPy emulation of these cases, so 3x that.
GPU_GRAD_TOL = {"float32": TOLERANCES["float32"], "bfloat16": 3e-2}
# the source-side inputs of each score (the gradients of the source pass)
SOURCE_SIDE = {"gat": ["a_src", "v"], "gatv2": ["xl"], "dot": ["k", "v"]}
# case: (heads, channels, edge term, dropout, attention weights, needs, num_src)
GPU_CASES = {
    "plain": (4, 32, False, 0.0, False, None, None),
    "odd_width": (3, 7, False, 0.0, False, None, None),
    "wide": (2, 320, False, 0.0, False, None, None),        # several register chunks
    "edge_dropout": (4, 32, True, 0.3, False, None, None),
    "weights": (4, 32, True, 0.3, True, None, None),        # grad_alpha given
    "source_only": (4, 32, True, 0.3, False, "source", None),
    "bipartite": (2, 16, True, 0.0, False, None, 9),         # split source rows too
    # the output bias (cases named bias*): in the store, D from out - bias
    "bias": (4, 32, True, 0.3, False, None, None),
    "bias_weights": (4, 32, False, 0.0, True, None, None),   # D by attn_delta
    "bias_odd_width": (3, 7, False, 0.0, False, None, 9),
    # inputs rounded to integers (KINK_CASES): gat's and gatv2's LeakyReLU
    # argument is exactly 0 on many (edge, channel) pairs
    "kink": (4, 32, False, 0.0, False, None, None),
    # 16-bit gatv2 without edge term at heads of 32 scores on Tensor Cores
    # (attn_fwd_mma): with dropout, and two warps per (task, all heads)
    "dropout": (4, 32, False, 0.3, False, None, None),
    "eight_heads": (8, 32, False, 0.0, False, None, None),
}
# Cases whose score inputs are integers in [-2, 2]: t = xl_j + xr_i (gat:
# a_src + a_dst) is exactly 0 for about a quarter of the pairs, where every
# pass must take lrelu'(0) = slope as the reference does (t > 0 false): the
# fp32 comparison x > -d and the 16-bit pair comparisons alike.
KINK_CASES = {"kink"}


def _gpu_cast(a, vtype):
    """NumPy float64 -> (CuPy array in vtype (bf16 as its uint16 bits), the
    float64 values it holds)."""
    import cupy as cp
    if vtype == "bfloat16":
        bits = to_bf16_bits(a)
        return cp.asarray(bits), from_bf16_bits(bits).astype(np.float64)
    return cp.asarray(a.astype(vtype)), a.astype(vtype).astype(np.float64)


def _gpu_values(a, vtype):
    a = to_numpy(a)
    return from_bf16_bits(a).astype(np.float64) if vtype == "bfloat16" else a.astype(np.float64)


def _gpu_backward(score, vtype, case, rng_, **options):
    """Run one GPU_CASES case; check out (and alpha) and every wanted gradient
    against the reference; returns {name: gradient (float64)} and the
    forward's {"out": ..., "alpha": ... (when asked for)}."""
    from fastgnn import edge_attention_bwd, edge_attention_fwd
    from fastgnn.ops.attention import SCORE_INPUTS
    heads, channels, edge_term, dropout, weights, needs, num_src = GPU_CASES[case]
    n = 300
    ei, g = _graph("cuda", n=n, e=3000, hub=700, num_src=num_src, seed=int(rng_.integers(1 << 30)))
    x = _off_kink(ei, score, _inputs(score, g, heads, channels, edge_term, rng_,
                                     bias=case.startswith("bias")))
    if case in KINK_CASES:
        x = _on_kink(x)
    dev, xr = {}, {}
    for k, v in x.items():
        dev[k], xr[k] = _gpu_cast(v, vtype)
    go_d, go = _gpu_cast(rng_.standard_normal((n, heads, channels)), vtype)
    ga_d, ga = (_gpu_cast(rng_.standard_normal((g.num_edges, heads)), vtype) if weights
                else (None, None))
    kw = dict(dropout=dropout, seed=17, offset=3)
    vt = {"vtype": "bfloat16"} if vtype == "bfloat16" else {}
    out, res = edge_attention_fwd(g, score, **dev, return_attention_weights=weights, **kw, **vt,
                                  **options)
    out, alpha = out if weights else (out, None)
    r_out, r_alpha = ref.edge_attention(ei, score, n, xr, **kw)
    assert_close(_gpu_values(out, vtype), r_out, vtype, f"{score} out")
    if weights:
        assert_close(_gpu_values(alpha, vtype), r_alpha, vtype, f"{score} alpha")
    wanted = SOURCE_SIDE[score] if needs == "source" else list(x)
    grads = edge_attention_bwd(g, res, go_d, ga_d, needs=wanted)
    r_grads = ref.edge_attention_vjp(ei, score, n, xr, go, ga, **kw)
    got = {"out": _gpu_values(out, vtype)}
    if weights:
        got["alpha"] = _gpu_values(alpha, vtype)
    for name, gr in zip(SCORE_INPUTS[score], grads):
        if name not in wanted:
            assert gr is None, name
            continue
        assert gr.shape == x[name].shape, name
        got[name] = _gpu_values(gr, vtype)
        want, tol = r_grads[name], GPU_GRAD_TOL[vtype]
        if name == "att":
            tol = _att_tol(ei, n, xr, go, ga, want, vtype, tol, **kw)
            # D = <g, out> alone: no bias (D would read the stored output
            # without it, which the test does not see) and no grad_alpha term
            if vtype == "bfloat16" and "bias" not in x and ga is None:
                want = _att_bf16_reference(ei, n, xr, go, _gpu_values(out, vtype), **kw)
        assert_close(got[name], want, vtype, f"{score} {case} grad {name}", tol=tol)
    return got


@pytest.mark.parametrize("tensor_cores,on", [("auto", True), (False, False)])
def test_tensor_cores_false_keeps_the_gatv2_forward_scores_off_tensor_cores(monkeypatch,
                                                                            tensor_cores, on):
    """The backend gets params.mma_scores = False from tensor_cores=False
    (the CUDA backend then keeps the 16-bit gatv2 forward on attn_fwd, and
    the backward, which takes the residuals' params, on attn_bwd_dst), True
    by default."""
    from fastgnn import edge_attention_fwd
    from fastgnn.backends import cpu
    seen = []
    real = cpu.edge_attention_fwd

    def spy(graph, score, arrays, params, need_alpha):
        seen.append(params.mma_scores)
        return real(graph, score, arrays, params, need_alpha)
    monkeypatch.setattr(cpu, "edge_attention_fwd", spy)
    r = np.random.default_rng(_seed())
    ei, g = _graph("cpu", seed=int(r.integers(1 << 30)))
    x = _inputs("gatv2", g, 4, 32, False, r, np.float32)
    edge_attention_fwd(g, "gatv2", **x, tensor_cores=tensor_cores)
    assert seen == [on]


@gpu
@needs_gpu
@pytest.mark.parametrize("case", list(GPU_CASES))
@pytest.mark.parametrize("vtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("score", SCORES)
def test_gpu_attention_backward_matches_reference(score, vtype, case):
    _gpu_backward(score, vtype, case, np.random.default_rng(_seed()))


@gpu
@needs_gpu
@pytest.mark.parametrize("vtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("heads,dropout,bias", [(4, 0.0, False), (8, 0.3, True)])
def test_gpu_gatv2_tensor_core_scores_match_the_lane_group_passes(monkeypatch, vtype, heads,
                                                                  dropout, bias):
    """The 16-bit gatv2 forward and its backward's target pass on Tensor
    Cores (heads of 32 channels; empty rows, a split hub row, dropout, bias)
    against the same calls with tensor_cores=False, the lane-group kernels.
    The scores differ only by the order of fp32 sums, so lse agrees to fp32
    rounding, out to one unit in its last 16-bit place plus the fp32 sums'
    difference, which scales with the rows it averages (out = sum_e p_e
    xl_j cancels: 1e-5 max|xl|, some 40x above the differences seen on the
    H200), and the gradients to the dtype's tolerance."""
    import cupy as cp

    from fastgnn import edge_attention_fwd
    r = np.random.default_rng(_seed())
    n = 400
    ei, g = _graph("cuda", n=n, e=5000, hub=2500, seed=int(r.integers(1 << 30)))
    x = _inputs("gatv2", g, heads, 32, False, r, bias=bias)
    dev = {k: _gpu_cast(v, vtype)[0] for k, v in x.items()}
    vt = {"vtype": "bfloat16"} if vtype == "bfloat16" else {}
    kw = dict(dropout=dropout, seed=5, **vt)
    got = [edge_attention_fwd(g, "gatv2", **dev, tensor_cores=tc, **kw) for tc in ("auto", False)]
    (o_mma, r_mma), (o_lane, r_lane) = got
    assert int(cp.count_nonzero(cp.diff(g.indptr) == 0)) > 0, "the graph has empty rows"
    a, b = (_gpu_values(o, vtype) for o in (o_mma, o_lane))
    ulp = 2.0 ** (-7 if vtype == "bfloat16" else -10)
    bound = ulp * np.maximum(np.abs(b), 2.0 ** -14) + 1e-5 * np.abs(x["xl"]).max()
    worst = np.argmax(np.abs(a - b) - bound)
    assert np.all(np.abs(a - b) <= bound), (
        f"out ({vtype}, {heads} heads): {a.flat[worst]} vs {b.flat[worst]} at {worst}")
    la, lb = to_numpy(r_mma.lse), to_numpy(r_lane.lse)
    np.testing.assert_array_equal(np.isfinite(la), np.isfinite(lb))
    np.testing.assert_allclose(la[np.isfinite(la)], lb[np.isfinite(lb)], rtol=1e-5, atol=1e-5)
    # the backward's target pass on Tensor Cores too (attn_bwd_dst_mma) against the lane groups
    from fastgnn import edge_attention_bwd
    from fastgnn.backends.cuda import attention as cuda_attention
    loaded = []
    real = cuda_attention.get_function

    def spy(*args):
        loaded.append(args[-1].split("<")[0])
        return real(*args)
    monkeypatch.setattr(cuda_attention, "get_function", spy)
    go = _gpu_cast(r.standard_normal((n, heads, 32)), vtype)[0]
    gm = edge_attention_bwd(g, r_mma, go)
    assert "attn_bwd_dst_mma" in loaded and "attn_bwd_dst" not in loaded, loaded
    loaded.clear()
    gl = edge_attention_bwd(g, r_lane, go)
    assert "attn_bwd_dst" in loaded and "attn_bwd_dst_mma" not in loaded, loaded
    loaded.clear()        # deterministic=False: the Tensor Core pass, faster than atomics
    _, r_any = edge_attention_fwd(g, "gatv2", **dev, deterministic=False, **kw)
    edge_attention_bwd(g, r_any, go)
    assert "attn_bwd_dst_mma" in loaded, loaded
    for name, x_mma, x_lane in zip(SCORE_INPUTS["gatv2"], gm, gl):
        if x_lane is None:
            continue
        assert_close(_gpu_values(x_mma, vtype), _gpu_values(x_lane, vtype), vtype,
                     f"grad {name} ({vtype}, {heads} heads)")


@gpu
@needs_gpu
@pytest.mark.parametrize("score", SCORES)
def test_gpu_attention_backward_bitwise_repeatable(score):
    """The default backward has no float atomics: the same bits every run."""
    seed = _seed()
    a = _gpu_backward(score, "float32", "edge_dropout", np.random.default_rng(seed))
    b = _gpu_backward(score, "float32", "edge_dropout", np.random.default_rng(seed))
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


# ------------------------------- gatv2's grad_att: partial rows per block
# (heads, C): the target pass sums grad_att per thread block (BLOCK_GATT)
# where a block holds more (task, head) pairs than there are heads, else per
# task: (8, 17) takes the per-task rows (32 lanes per head, one value each: 8
# pairs per block), every other shape is summed per block, with blocks
# starting at any head (3, 5, 6, 7 heads). Odd widths run one value per lane
# (runtime groups), (3, 136) several register chunks in fp32.
GATT_SHAPES = [(1, 1), (2, 3), (3, 7), (4, 32), (5, 17), (6, 8), (7, 64), (8, 16), (8, 17),
               (3, 136)]


@gpu
@needs_gpu
@pytest.mark.parametrize("vtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("heads,channels", GATT_SHAPES)
def test_gpu_gatv2_grad_att_block_partials(vtype, heads, channels):
    """grad_att over ~5000 tasks (hundreds of thread blocks, heads mixed
    inside them, the last block as a rule partly without tasks) matches the
    float64 reference, and two backward calls give the same bits."""
    from fastgnn import edge_attention_bwd, edge_attention_fwd
    from fastgnn.ops.attention import SCORE_INPUTS
    rng_ = np.random.default_rng(_seed())
    n = 5001
    ei, g = _graph("cuda", n=n, e=30000, hub=2000, seed=int(rng_.integers(1 << 30)))
    x = _off_kink(ei, "gatv2", _inputs("gatv2", g, heads, channels, heads % 2 == 1, rng_))
    dev, xr = {}, {}
    for k, v in x.items():
        dev[k], xr[k] = _gpu_cast(v, vtype)
    go_d, go = _gpu_cast(rng_.standard_normal((n, heads, channels)), vtype)
    vt = {"vtype": "bfloat16"} if vtype == "bfloat16" else {}
    out, res = edge_attention_fwd(g, "gatv2", **dev, **vt)
    att_at = SCORE_INPUTS["gatv2"].index("att")
    first = edge_attention_bwd(g, res, go_d)[att_at]
    again = edge_attention_bwd(g, res, go_d)[att_at]
    want = (_att_bf16_reference(ei, n, xr, go, _gpu_values(out, vtype))
            if vtype == "bfloat16" else ref.edge_attention_vjp(ei, "gatv2", n, xr, go, None)["att"])
    assert first.shape == (heads, channels)
    assert_close(_gpu_values(first, vtype), want, vtype, f"grad att ({heads}, {channels})",
                 tol=_att_tol(ei, n, xr, go, None, want, vtype, GPU_GRAD_TOL[vtype]))
    np.testing.assert_array_equal(to_numpy(first), to_numpy(again))


def test_gatt_partial_rows_plan():
    """The launcher's choice for grad_att's partial rows: per block within
    the shared-memory budget for every head layout, where a block holds more
    (task, head) pairs than heads (8 tasks' pairs on rmat20: 8 lanes of 4
    values per head in fp32 and bf16), else per task."""
    attn = pytest.importorskip("fastgnn.backends.cuda.attention")   # needs CuPy, not a GPU
    from types import SimpleNamespace
    ntask = 1_048_576 + 3000                       # rmat20's rows plus split hub tasks
    for vtype, smem in (("float32", 4096), ("bfloat16", 4096)):
        aligned = SimpleNamespace(data=SimpleNamespace(ptr=0), ndim=3, shape=(1, 4, 32))
        group = attn._shape(vtype, "gatv2", 32, (aligned,), True)[3]
        assert attn._block_gatt(ntask, 4, 32, group, attn._acc(vtype)) == (True, smem), vtype
    assert attn._block_gatt(ntask, 8, 128, 32, np.float32) == (False, 0)
    for vtype in ("float32", "float64", "float16", "bfloat16"):
        for C in range(1, 1025):
            for ptr in (0, 2):                     # wide vectors, or one value per lane
                a = SimpleNamespace(data=SimpleNamespace(ptr=ptr), ndim=3, shape=(1, 1, C))
                try:
                    group = attn._shape(vtype, "gatv2", C, (a,), True)[3]
                except NotImplementedError:        # wider than the kernels hold
                    continue
                for H in (1, 2, 3, 5, 8, 13, 32, 64):
                    block, shared = attn._block_gatt(1000, H, C, group, attn._acc(vtype))
                    assert block == (attn.BLOCK // group > H), (vtype, C, H)
                    assert shared <= attn.GATT_SMEM_BUDGET


def _task_case(deg, chunk=256):
    """(Graph, TaskPlan) of in-degrees `deg` cut into tasks of <= chunk
    edges, as task_plan would (NumPy, no device)."""
    from fastgnn.backends.cuda.spmm import TaskPlan
    indptr = np.r_[0, np.cumsum(deg)]
    g = Graph(indptr, np.zeros(indptr[-1], dtype=np.int64), None, 1, len(deg))
    ntask = np.maximum(-(-deg // chunk), 1)
    row = np.repeat(np.arange(len(deg)), ntask)
    first = np.r_[0, np.cumsum(ntask)][row]
    begin = indptr[row] + (np.arange(len(row)) - first) * chunk
    return g, TaskPlan(chunk, row, begin, np.full(len(row), -1), None, None, 0)


def test_persistent_grid_plan(monkeypatch):
    """The persistent grid: one group per (task, head) pair while that fits
    on the device at once (slot_begin NULL), else the resident blocks, whose
    slots of H groups take contiguous task ranges of about equal work that
    cover every task once, in order; PERSISTENT = False gives the
    one-group-per-pair grid."""
    attn = pytest.importorskip("fastgnn.backends.cuda.attention")   # needs CuPy, not a GPU
    deg = np.r_[np.zeros(5, int), np.ones(300, int), np.full(40, 16), [5000, 700]]
    g, plan = _task_case(deg)
    chunk, begin, row, indptr = plan.chunk, plan.task_begin, plan.task_row, g.indptr
    T = len(row)
    monkeypatch.setattr(attn, "RESIDENT_BLOCKS", 3)
    monkeypatch.setattr(attn, "TASKS_PER_RANGE", 0)                # ROUNDS, however few tasks
    monkeypatch.setattr(attn, "ROUNDS", 1)                         # one range per slot first
    grid, slot_begin, rounds = attn._persistent_grid(None, g, plan, 4, 8)   # 3 x 32 groups / 4
    assert grid == (3,) and slot_begin.shape == (25,) and rounds == 1
    assert slot_begin[0] == 0 and slot_begin[-1] == T and np.all(np.diff(slot_begin) >= 0)
    work = np.minimum(begin + chunk, indptr[row + 1]) - begin + attn.TASK_COST_EDGES
    per_slot = np.add.reduceat(np.r_[work, 0], slot_begin[:-1])[np.diff(slot_begin) > 0]
    assert per_slot.max() <= work.sum() / 24 + work.max()          # balanced up to one task
    # each slot starts at the task boundary nearest s / 24 of the total work
    before = np.r_[0, np.cumsum(work)]
    for s_, t_ in enumerate(slot_begin[1:-1], start=1):
        goal = work.sum() * s_ / 24
        assert np.abs(before[t_] - goal) <= np.abs(before - goal).min(), s_
    assert attn._persistent_grid(None, g, plan, 4, 8)[1] is slot_begin   # cached on the graph
    monkeypatch.setattr(attn, "TASK_COST_EDGES", 0)                 # edges alone: other cuts
    assert not np.array_equal(attn._persistent_grid(None, g, plan, 4, 8)[1], slot_begin)
    monkeypatch.setattr(attn, "RESIDENT_BLOCKS", 1000)
    assert attn._persistent_grid(None, g, plan, 4, 8) == ((-(-T * 4 * 8 // 256),), attn.NULL, 1)
    monkeypatch.setattr(attn, "RESIDENT_BLOCKS", 3)
    monkeypatch.setattr(attn, "PERSISTENT", False)
    assert attn._persistent_grid(None, g, plan, 4, 8) == ((-(-T * 4 * 8 // 256),), attn.NULL, 1)
    # 4 heads of 4 lanes in two edge phases: a slot per warp, 24 on 3 blocks
    monkeypatch.setattr(attn, "PERSISTENT", True)
    assert attn._persistent_grid(None, g, plan, 4, 4, phases=2)[1].shape == (25,)
    assert attn._persistent_grid(None, g, plan, 1, 4, phases=8)[1].shape == (25,)
    assert attn._persistent_grid(None, g, plan, 4, 4)[1].shape == (49,)    # 2 slots per warp
    # rounds: 24 slots x 3 rounds of ranges
    monkeypatch.setattr(attn, "ROUNDS", 3)
    _, ranges, rounds = attn._persistent_grid(None, g, plan, 4, 8)
    assert rounds == 3 and ranges.shape == (73,) and ranges[-1] == T
    np.testing.assert_array_equal(ranges, attn.task_slots(g, plan, 24, 3))
    # fewer rounds where ranges would hold under TASKS_PER_RANGE tasks on average
    monkeypatch.setattr(attn, "ROUNDS", 32)
    monkeypatch.setattr(attn, "TASKS_PER_RANGE", 4)
    assert attn._persistent_grid(None, g, plan, 4, 8)[2] == max(1, min(32, T // (24 * 4)))
    monkeypatch.setattr(attn, "TASKS_PER_RANGE", 1)
    assert attn._persistent_grid(None, g, plan, 4, 8)[2] == max(1, min(32, T // 24))


def _slot_cuts_by_arrays(work_before, num_slots, rounds):
    """task_slots' cuts as whole-array operations per round (the reference of
    the sequential sweep `slot_cuts` and of graph.cu's kernel), in work
    scaled by num_slots * rounds (integers throughout)."""
    num_tasks = work_before.shape[0] - 1
    scaled = work_before.astype(np.int64) * (num_slots * rounds)
    done = np.zeros(num_slots, dtype=np.int64)
    start = np.zeros(1, dtype=np.int64)
    cuts = [np.zeros(1, dtype=np.int64)]
    for r in range(rounds):
        goal = start + np.cumsum(np.maximum(work_before[-1] * (r + 1) - done, 0))
        hi = np.minimum(np.searchsorted(scaled, goal, side="left"), num_tasks)
        lo = np.maximum(hi - 1, 0)
        end = np.where(goal - scaled[lo] < scaled[hi] - goal, lo, hi)
        end = np.maximum(end, cuts[-1][-1:])
        if r == rounds - 1:
            end[-1] = num_tasks
        ends = scaled[end]
        done += ends - np.concatenate([start, ends[:-1]])
        start = ends[-1:]
        cuts.append(end.astype(np.int64))
    return np.concatenate(cuts)


def test_slot_cuts_match_the_array_form():
    """The host sweep of the persistent grids' cuts, and on a GPU the
    device's kernel, give the cuts of the per-round array form on random
    work (light and heavy tasks, a hub task, more slots than tasks (and
    than the kernel's threads), no tasks)."""
    attn = pytest.importorskip("fastgnn.backends.cuda.attention")   # needs CuPy, not a GPU
    seed = _seed()
    rng = np.random.default_rng(seed)
    for case in range(120):
        T, S = int(rng.integers(0, 2000)), int(rng.integers(1, 300 if case % 4 else 3000))
        rounds = int(rng.choice([1, 2, 3, 8, 32]))
        work = rng.integers(4, int(rng.choice([6, 50, 2000])), T)
        if case % 5 == 0 and T:
            work[rng.integers(0, T)] += 100_000
        before = np.zeros(T + 1, dtype=np.int64)
        np.cumsum(work, out=before[1:])
        want = _slot_cuts_by_arrays(before, S, rounds)
        np.testing.assert_array_equal(attn.slot_cuts(before, S, rounds), want,
                                      err_msg=f"seed {seed} case {case}")
        if gpu_available():
            import cupy
            from fastgnn.backends.cuda import graph_build
            got = graph_build.slot_cuts(cupy.asarray(before), S, rounds).get()
            np.testing.assert_array_equal(got, want, err_msg=f"seed {seed} case {case} (GPU)")


def _slot_work(attn, g, plan, slots, rounds):
    """[slots] each slot's work over its rounds' ranges (task_slots)."""
    cuts = attn.task_slots(g, plan, slots, rounds)
    prefix = attn._task_work(g, plan)
    return (prefix[cuts[1:]] - prefix[cuts[:-1]]).reshape(rounds, slots).sum(0)


def test_round_cuts_cover_the_tasks_and_balance_the_slots(seed):
    """Every round count's ranges cover the tasks once, in order, and leave
    every slot within one task's work of its share: the cuts of a round
    make up for the slot's rounding in the rounds before (ranges of equal
    work let it add up: checked against that cut on the same degrees)."""
    attn = pytest.importorskip("fastgnn.backends.cuda.attention")   # needs CuPy, not a GPU
    # power-law in-degrees, shuffled, plus empty rows and two hubs of many tasks
    deg = np.r_[(3000 / np.sqrt(1 + np.arange(20000))).astype(np.int64), np.zeros(50, int),
                [9000, 4000]]
    g, plan = _task_case(np.random.default_rng(seed).permutation(deg))
    prefix = attn._task_work(g, plan)
    biggest = int(np.diff(prefix).max())
    equal_worst = []
    for slots in (24, 150, 400):
        for rounds in (1, 3, 8, 32):
            cuts = attn.task_slots(g, plan, slots, rounds)
            assert cuts.shape == (slots * rounds + 1,) and cuts[0] == 0, (seed, slots, rounds)
            assert cuts[-1] == len(plan.task_row) and np.all(np.diff(cuts) >= 0), (seed, slots, rounds)
            work = _slot_work(attn, g, plan, slots, rounds)
            assert work.sum() == prefix[-1]
            assert np.abs(work - prefix[-1] / slots).max() <= biggest, (seed, slots, rounds)
            equal = np.searchsorted(prefix, np.arange(slots * rounds + 1) * prefix[-1] // (slots * rounds))
            by_range = (prefix[equal[1:]] - prefix[equal[:-1]]).reshape(rounds, slots).sum(0)
            equal_worst.append(by_range.max() / by_range.mean() - work.max() / work.mean())
    assert max(equal_worst) > 0.2, seed           # the equal-work cut is far worse somewhere


def test_round_cuts_never_step_back_over_tasks_of_no_work(monkeypatch, seed):
    """With no fixed cost per task, empty rows are tasks of no work (equal
    prefix sums): a round's first cut must not fall before the last one."""
    attn = pytest.importorskip("fastgnn.backends.cuda.attention")   # needs CuPy, not a GPU
    monkeypatch.setattr(attn, "TASK_COST_EDGES", 0)
    rng = np.random.default_rng(seed)
    g, plan = _task_case(np.array([1, 0, 2]), chunk=10**9)
    assert np.all(np.diff(attn.task_slots(g, plan, 3, 2)) >= 0)
    for _ in range(200):
        deg = rng.integers(0, 4, rng.integers(1, 30))         # many empty rows
        g, plan = _task_case(deg, chunk=3)
        slots, rounds = int(rng.integers(1, 12)), int(rng.integers(1, 6))
        cuts = attn.task_slots(g, plan, slots, rounds)
        assert cuts[0] == 0 and cuts[-1] == len(plan.task_row), (seed, deg, slots, rounds)
        assert np.all(np.diff(cuts) >= 0), (seed, deg, slots, rounds)


def test_edge_phases():
    """The 16-bit kernels of 8 values per lane fill a warp with a slot's lane
    groups: 32 / (H x group) edge phases where the H groups take fewer lanes
    than a warp and divide it; every other kernel, and those layouts, 1."""
    attn = pytest.importorskip("fastgnn.backends.cuda.attention")   # needs CuPy, not a GPU
    from types import SimpleNamespace
    for vtype in ("bfloat16", "float16"):
        assert [attn.edge_phases(vtype, 8, 4, g) for g in (4, 8, 16, 32)] == [2, 1, 1, 1]
        assert [attn.edge_phases(vtype, 8, 1, g) for g in (4, 8, 16, 32)] == [8, 4, 2, 1]
        assert ([attn.edge_phases(vtype, 8, H, 4) for H in (2, 3, 5, 6, 8, 16)]
                == [4, 1, 1, 1, 1, 1])
        assert attn.edge_phases(vtype, 4, 1, 4) == 1
    assert attn.edge_phases("float32", 4, 1, 8) == 1
    # GAT's backward takes 16-bit heads of 32 at 8 values per lane; its
    # forward, GATv2's and dot's passes and fp32 at 4
    aligned = SimpleNamespace(data=SimpleNamespace(ptr=0), ndim=3, shape=(1, 4, 32))
    assert attn._shape("bfloat16", "gat", 32, (aligned,), True)[:4] == (8, 1, 4, 4)
    assert attn._shape("bfloat16", "gat", 32, (aligned,), False)[:4] == (4, 1, 8, 8)
    for score in ("gatv2", "dot"):
        for backward in (False, True):
            assert attn._shape("bfloat16", score, 32, (aligned,), backward)[:4] == (4, 1, 8, 8)
    assert attn._shape("float32", "gat", 32, (aligned,), True)[:4] == (4, 1, 8, 8)


@gpu
@needs_gpu
@pytest.mark.parametrize("rounds", [1, 3])
@pytest.mark.parametrize("case", ["plain", "odd_width", "wide", "weights", "bipartite", "bias"])
@pytest.mark.parametrize("vtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("score", SCORES)
def test_gpu_persistent_grid_walks_many_tasks_per_group(score, vtype, case, rounds, monkeypatch):
    """A grid of two blocks, where every lane group walks many tasks, in one
    range or in `rounds` ranges (gatv2's block grad_att summed across them;
    odd_width's 3 heads leave groups past the last slot of 3 idle), gives the
    reference's results (checked in _gpu_backward), and the output,
    attention weights and every gradient but grad_att bit for bit as on a
    grid of one group per pair (grad_att sums in another order)."""
    from fastgnn.backends.cuda import attention as attn
    seed = _seed()
    monkeypatch.setattr(attn, "PERSISTENT", False)
    full = _gpu_backward(score, vtype, case, np.random.default_rng(seed))
    monkeypatch.setattr(attn, "PERSISTENT", True)
    monkeypatch.setattr(attn, "RESIDENT_BLOCKS", 2)
    monkeypatch.setattr(attn, "TASKS_PER_RANGE", 0)
    monkeypatch.setattr(attn, "ROUNDS", rounds)
    few = _gpu_backward(score, vtype, case, np.random.default_rng(seed))
    assert sorted(few) == sorted(full)
    for name in full:
        if name != "att":
            np.testing.assert_array_equal(few[name], full[name], err_msg=f"{score} {case} {name}")


# ------------------------------------------- the atomic backward (opt-in)
@gpu
@needs_gpu
@pytest.mark.parametrize("case", ["plain", "odd_width", "wide", "weights", "source_only",
                                  "bipartite", "bias", "bias_odd_width"])
@pytest.mark.parametrize("vtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("score", SCORES)
def test_gpu_atomic_backward_close_to_deterministic(score, vtype, case, monkeypatch):
    """deterministic=False (source-side gradients by float atomics in the
    target pass, no source pass) matches the reference and the default
    backward up to rounding: the same sums in another order (fp32 sums of
    bf16 values round once to bf16 at the end, so 1 ulp at most there).
    Every score's atomic pass, also those the launcher leaves out of
    ATOMIC_SCORES (slower there)."""
    from fastgnn.backends.cuda import attention as attn
    monkeypatch.setattr(attn, "ATOMIC_SCORES", frozenset(SCORES))
    seed = _seed()
    atomic = _gpu_backward(score, vtype, case, np.random.default_rng(seed), deterministic=False)
    default = _gpu_backward(score, vtype, case, np.random.default_rng(seed))
    assert sorted(atomic) == sorted(default)
    for name in atomic:
        assert_close(atomic[name], default[name], vtype, f"{score} {case} {name}: atomic vs default")


def test_cpu_ignores_deterministic_false():
    """The CPU backend has no atomic variant: deterministic=False gives the same bits."""
    from fastgnn import edge_attention_bwd, edge_attention_fwd
    ei, g = _graph("cpu", hub=300)
    r = np.random.default_rng(_seed())
    for score in SCORES:
        x = _inputs(score, g, 2, 5, True, r)
        go = r.standard_normal((120, 2, 5))
        runs = []
        for det in (True, False):
            out, res = edge_attention_fwd(g, score, **x, dropout=0.2, seed=3, deterministic=det)
            runs.append([out, *edge_attention_bwd(g, res, go)])
        for a, b in zip(*runs):
            np.testing.assert_array_equal(a, b)
