"""Attention family (edge softmax; fused GAT, GATv2 and dot-product attention)
and the counter-based generator behind its dropout, against the float64
reference and PyG: outputs, every gradient, dropout statistics, validation, on
CPU and (when CuPy sees one) GPU."""
import numpy as np
import pytest

from fastgnn import Graph, edge_softmax, edge_softmax_bwd, edge_softmax_fwd, rng
from fastgnn.backends import reference as ref
from fastgnn.testing import assert_close, awkward_edge_index, devices, to_device, to_numpy


def _seed():
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
