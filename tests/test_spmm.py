"""SpMM family against the float64 reference: outputs, VJPs, GCN normalisation,
determinism and validation, on CPU and (when CuPy sees one) GPU."""
import numpy as np
import pytest

import fastgnn
from fastgnn import Graph, gcn_norm, spmm, spmm_bwd, spmm_fwd
from fastgnn.backends import reference as ref
from fastgnn.testing import (assert_close, awkward_edge_index, devices, from_bf16_bits,
                             to_bf16_bits, to_device, to_numpy)

WIDTHS = [1, 7, 32, 129]


def _seed():
    """A seed drawn from NumPy's global state, which conftest seeds per test
    (FASTGNN_TEST_SEED; a failing test prints its seed)."""
    return np.random.randint(1 << 30)


def _case(device, width, weighted, num_src=None, hub=None, index_dtype=None, n=300):
    rng = np.random.default_rng(_seed())
    ei = awkward_edge_index(n, 2000, hub_degree=hub, seed=rng.integers(1 << 30), num_src=num_src)
    ns = n if num_src is None else num_src
    kw = {"num_nodes": n} if num_src is None else {"num_src": ns, "num_dst": n}
    g = Graph.from_edge_index(to_device(ei, device), index_dtype=index_dtype, **kw)
    x = rng.standard_normal((ns, width))
    w = rng.standard_normal(ei.shape[1]) if weighted else None
    go = rng.standard_normal((n, width))
    return ei, g, x, w, go


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_spmm_matches_reference(device, reduce, weighted, width, dtype):
    ei, g, x, w, go = _case(device, width, weighted)
    x = x.astype(dtype)
    w = None if w is None else w.astype(dtype)
    xd, wd = to_device(x, device), to_device(w, device)
    out, res = spmm_fwd(g, xd, wd, reduce)
    assert out.dtype == x.dtype and out.shape == (300, width)
    assert_close(to_numpy(out), ref.spmm(ei, x, w, reduce, 300), dtype)
    gx, gw, _ = spmm_bwd(g, res, to_device(go.astype(dtype), device))
    rgx, rgw = ref.spmm_vjp(ei, x, w, reduce, go.astype(dtype))
    assert_close(to_numpy(gx), rgx, dtype, "grad_x")
    if weighted:
        assert gw.dtype == w.dtype
        assert_close(to_numpy(gw), rgw, dtype, "grad_edge_weight")
    else:
        assert gw is None
    # empty rows (last tenth of the targets) are exactly zero
    assert np.all(to_numpy(out)[-30:] == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cpu_spmm_adds_edges_in_csr_order(dtype):
    """The CPU kernel takes up to eight edges per pass over the features; its
    sums are bitwise those of one edge at a time in CSR order (the order the
    CUDA kernel adds them in), on rows of 0 to 29 edges and a hub."""
    rng = np.random.default_rng(_seed())
    n = 120
    deg = np.concatenate([np.arange(30), rng.integers(0, 30, n - 31), [400]])
    dst = np.repeat(np.arange(n), deg)
    src = rng.integers(0, n, dst.shape[0])
    g = Graph.from_edge_index(np.stack([src, dst]), num_nodes=n)
    x = rng.standard_normal((n, 13)).astype(dtype)
    w = rng.standard_normal(dst.shape[0])
    for weight in (None, w):
        want = np.zeros((n, 13), dtype=dtype)
        ww = None if weight is None else g.to_csr_order(weight).astype(dtype)
        for i in range(n):
            for e in range(int(g.indptr[i]), int(g.indptr[i + 1])):
                want[i] += x[g.indices[e]] if ww is None else ww[e] * x[g.indices[e]]
        got = spmm(g, x, weight)
        assert got.dtype == dtype and np.array_equal(got, want)


@pytest.mark.parametrize("device", devices())
def test_bipartite_and_int64(device):
    ei, g, x, w, go = _case(device, 16, True, num_src=77, index_dtype=np.int64)
    assert g.index_dtype == np.int64
    out, res = spmm_fwd(g, to_device(x, device), to_device(w, device), "mean")
    assert_close(to_numpy(out), ref.spmm(ei, x, w, "mean", 300), "float64")
    gx, gw, _ = spmm_bwd(g, res, to_device(go, device))
    rgx, rgw = ref.spmm_vjp(ei, x, w, "mean", go)
    assert gx.shape == (77, 16)
    assert_close(to_numpy(gx), rgx, "float64")
    assert_close(to_numpy(gw), rgw, "float64")


def test_reference_vjp_by_finite_differences():
    """The oracle itself: its VJP agrees with central differences in float64."""
    rng = np.random.default_rng(_seed())
    ei = awkward_edge_index(20, 80, seed=rng.integers(1 << 30))
    x = rng.standard_normal((20, 3))
    w = rng.standard_normal(ei.shape[1])
    go = rng.standard_normal((20, 3))
    for reduce in ("sum", "mean"):
        gx, gw = ref.spmm_vjp(ei, x, w, reduce, go)
        f = lambda x_, w_: np.sum(ref.spmm(ei, x_, w_, reduce, 20) * go)  # noqa: E731
        h = 1e-6
        for _ in range(5):
            i, k, e = rng.integers(20), rng.integers(3), rng.integers(ei.shape[1])
            dx = np.zeros_like(x)
            dx[i, k] = h
            assert abs((f(x + dx, w) - f(x - dx, w)) / (2 * h) - gx[i, k]) < 1e-6
            dw = np.zeros_like(w)
            dw[e] = h
            assert abs((f(x, w + dw) - f(x, w - dw)) / (2 * h) - gw[e]) < 1e-6


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("improved", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("loops", [False, True])
def test_gcn_norm_matches_pyg_semantics(device, improved, weighted, loops):
    rng = np.random.default_rng(_seed())
    ei = awkward_edge_index(100, 600, seed=rng.integers(1 << 30))
    w = rng.uniform(0.5, 2.0, ei.shape[1]) if weighted else None
    g = Graph.from_edge_index(to_device(ei, device), num_nodes=100)
    g2, w2 = gcn_norm(g, to_device(w, device), add_self_loops=loops, improved=improved)
    rei, rw = ref.gcn_norm(ei, 100, w, add_self_loops=loops, improved=improved)
    x = rng.standard_normal((100, 5))
    out = spmm(g2, to_device(x, device), w2)
    tol = "float64" if weighted else "float32"
    assert_close(to_numpy(out), ref.spmm(rei, x, rw, "sum", 100), tol)
    if not weighted:
        assert gcn_norm(g, add_self_loops=loops, improved=improved)[0] is g2  # cached


@pytest.mark.parametrize("device", devices())
def test_inputs_not_mutated(device):
    ei, g, x, w, go = _case(device, 9, True)
    xd, wd, god = to_device(x, device), to_device(w, device), to_device(go, device)
    copies = [to_numpy(a).copy() for a in (xd, wd, god)]
    out, res = spmm_fwd(g, xd, wd, "mean")
    spmm_bwd(g, res, god)
    for a, c in zip((xd, wd, god), copies):
        np.testing.assert_array_equal(to_numpy(a), c)


@pytest.mark.parametrize("device", devices())
def test_bad_inputs_raise_clear_errors(device):
    ei, g, x, w, go = _case(device, 4, True)
    xd = to_device(x, device)
    cases = [
        (lambda: spmm(g, to_device(x[:-1], device)), ValueError, "x has 299 rows"),
        (lambda: spmm(g, to_device(x[:, 0], device)), ValueError, "x must have shape"),
        (lambda: spmm(g, to_device(x.astype(np.int32), device)), TypeError, "x must be"),
        (lambda: spmm(g, xd, to_device(w[:-1], device)), ValueError, "edge_weight must have shape"),
        (lambda: spmm(g, xd, to_device(w.astype(np.int64), device)), TypeError, "edge_weight"),
        (lambda: spmm(g, xd, reduce="max"), ValueError, "reduce must be one of"),
        (lambda: spmm(g, xd, path="fast"), ValueError, "path must be one of"),
        (lambda: spmm(g, "not an array"), TypeError, "x must be"),
    ]
    if device == "cpu":
        cases.append((lambda: spmm(g, x.astype(np.float16)), TypeError, "CPU backend supports"))
    else:
        cases.append((lambda: spmm(g, x), ValueError, "x lives on CPU"))
    for fn, err, words in cases:
        with pytest.raises(err) as info:
            fn()
        assert words in str(info.value), str(info.value)


# ---------------------------------------------------------------- GPU only
gpu = pytest.mark.skipif(not fastgnn.gpu_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("path", ["custom", "cusparse", "auto"])
@pytest.mark.parametrize("hub", [5, 3000])
@pytest.mark.parametrize("width", [3, 64, 128, 200, 1433])
def test_gpu_paths_and_hub_split(path, hub, width):
    """Hub rows (3000 in-edges) are split into tasks and recombined; widths
    200 and 1433 on 300 rows are cut into feature slices (grid y), 1433
    (odd: one value per lane) into many, the last one partial."""
    ei, g, x, w, go = _case("cuda", width, True, hub=hub)
    x32, w32 = x.astype(np.float32), w.astype(np.float32)
    out, res = spmm_fwd(g, to_device(x32, "cuda"), to_device(w32, "cuda"), "sum", path=path)
    assert_close(to_numpy(out), ref.spmm(ei, x32, w32, "sum", 300), "float32")
    gx, gw, _ = spmm_bwd(g, res, to_device(go.astype(np.float32), "cuda"))
    rgx, rgw = ref.spmm_vjp(ei, x32, w32, "sum", go.astype(np.float32))
    assert_close(to_numpy(gx), rgx, "float32", "grad_x")
    assert_close(to_numpy(gw), rgw, "float32", "grad_edge_weight")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("chunk", [64, 256, 1024])
def test_gpu_custom_chunks(chunk):
    import cupy as cp

    from fastgnn.backends.cuda.spmm import spmm_custom
    ei, g, x, w, go = _case("cuda", 33, False, hub=2500)
    out = spmm_custom(g, cp.asarray(x.astype(np.float32)), None, "float32", chunk=chunk)
    assert_close(to_numpy(out), ref.spmm(ei, x.astype(np.float32), None, "sum", 300), "float32")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("vtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("width", [8, 128, 37])
def test_gpu_half_types(vtype, width):
    ei, g, x, w, go = _case("cuda", width, True, hub=1000)
    if vtype == "bfloat16":
        xb, gob = to_bf16_bits(x), to_bf16_bits(go)
        xr, gor = from_bf16_bits(xb), from_bf16_bits(gob)
        kw = {"vtype": "bfloat16"}
    else:
        xb, gob = x.astype(np.float16), go.astype(np.float16)
        xr, gor = xb.astype(np.float64), gob.astype(np.float64)
        kw = {}
    out, res = spmm_fwd(g, to_device(xb, "cuda"), to_device(w.astype(np.float32), "cuda"),
                        "mean", **kw)
    o = to_numpy(out)
    o = from_bf16_bits(o) if vtype == "bfloat16" else o.astype(np.float64)
    assert_close(o, ref.spmm(ei, xr, w, "mean", 300), vtype)
    gx, gw, _ = spmm_bwd(g, res, to_device(gob, "cuda"))
    gx = to_numpy(gx)
    gx = from_bf16_bits(gx) if vtype == "bfloat16" else gx.astype(np.float64)
    rgx, rgw = ref.spmm_vjp(ei, xr, w, "mean", gor)
    assert_close(gx, rgx, vtype, "grad_x")
    assert_close(to_numpy(gw), rgw, vtype, "grad_edge_weight")


@pytest.mark.gpu
@gpu
def test_gpu_backward_is_bitwise_repeatable_and_records_choice():
    from fastgnn.backends.cuda import chosen_paths
    ei, g, x, w, go = _case("cuda", 64, True, hub=4000)
    xd, wd = to_device(x.astype(np.float32), "cuda"), to_device(w.astype(np.float32), "cuda")
    god = to_device(go.astype(np.float32), "cuda")
    runs = []
    for _ in range(3):
        out, res = spmm_fwd(g, xd, wd)
        gx, gw, _ = spmm_bwd(g, res, god)
        runs.append((to_numpy(out), to_numpy(gx), to_numpy(gw)))
    for r in runs[1:]:
        for a, b in zip(runs[0], r):
            np.testing.assert_array_equal(a, b)
    choices = chosen_paths(g)
    assert choices[(64, "float32", True, True)].path in ("custom", "cusparse")


@pytest.mark.gpu
@gpu
def test_gpu_runs_on_current_stream():
    import cupy as cp
    ei, g, x, w, go = _case("cuda", 32, False)
    xd = cp.asarray(x.astype(np.float32))
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        out = spmm(g, xd, path="custom")
        out2 = spmm(g, xd, path="cusparse")
    s.synchronize()
    r = ref.spmm(ei, x, None, "sum", 300)
    assert_close(to_numpy(out), r, "float32")
    assert_close(to_numpy(out2), r, "float32")


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("hub", [5, 3000])
def test_row_and_column_scales(device, reduce, weighted, hub):
    """out[i] = s_i r_i sum_e w_e c_j x[j]; gradients of x and w (scales are constants)."""
    ei, g, x, w, go = _case(device, 20, weighted, num_src=90, hub=hub)
    rng = np.random.default_rng(_seed())
    r, c = rng.uniform(0.5, 2, 300), rng.uniform(0.5, 2, 90)
    out, res = spmm_fwd(g, to_device(x, device), to_device(w, device), reduce,
                        row_scale=to_device(r, device), col_scale=to_device(c, device))
    expect = ref.spmm(ei, x * c[:, None], w, reduce, 300) * r[:, None]
    assert_close(to_numpy(out), expect, "float64")
    gx, gw, _ = spmm_bwd(g, res, to_device(go, device))
    rgx, rgw = ref.spmm_vjp(ei, x * c[:, None], w, reduce, go * r[:, None])
    assert_close(to_numpy(gx), rgx * c[:, None], "float64", "grad_x")
    if weighted:
        assert_close(to_numpy(gw), rgw, "float64", "grad_edge_weight")
    with pytest.raises(ValueError, match="row_scale must have shape"):
        spmm(g, to_device(x, device), row_scale=to_device(r[:-1], device))
    with pytest.raises(ValueError, match="col_scale must have shape"):
        spmm(g, to_device(x, device), col_scale=to_device(r, device))


# ------------------------------------------------------------ bias epilogue
@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_spmm_bias_matches_reference(device, reduce, weighted, width, dtype):
    """out = spmm(...) + b in the kernel's store (empty rows get b); grad_b =
    column sum of grad_out; the other gradients as without a bias."""
    ei, g, x, w, go = _case(device, width, weighted, hub=1500)
    rng = np.random.default_rng(_seed())
    b = rng.standard_normal(width).astype(dtype)
    x = x.astype(dtype)
    w = None if w is None else w.astype(dtype)
    out, res = spmm_fwd(g, to_device(x, device), to_device(w, device), reduce,
                        bias=to_device(b, device))
    assert out.dtype == x.dtype
    expect = ref.spmm(ei, x, w, reduce, 300, bias=b)
    assert_close(to_numpy(out), expect, dtype)
    empty = np.bincount(ei[1], minlength=300) == 0
    assert empty.any()
    np.testing.assert_allclose(to_numpy(out)[empty], np.broadcast_to(b, (empty.sum(), width)),
                               rtol=0, atol=0)
    gx, gw, gb = spmm_bwd(g, res, to_device(go.astype(dtype), device))
    rgx, rgw = ref.spmm_vjp(ei, x, w, reduce, go.astype(dtype))
    assert gb.dtype == x.dtype and gb.shape == (width,)
    # a column sum of 300 random values can nearly cancel (width 1: one
    # column): its rounding error scales with sum |g|, not with |sum g|
    want_gb = ref.column_sum(go.astype(dtype))
    cond = np.linalg.norm(np.abs(go).sum(0)) / max(np.linalg.norm(want_gb), 1e-300)
    assert_close(to_numpy(gb), want_gb, dtype, "grad_bias",
                 tol=1e-5 * max(1.0, cond) if dtype == "float32" else None)
    assert_close(to_numpy(gx), rgx, dtype, "grad_x")
    if weighted:
        assert_close(to_numpy(gw), rgw, dtype, "grad_edge_weight")
    # no bias: no bias gradient; only the requested gradients are computed
    _, res0 = spmm_fwd(g, to_device(x, device), to_device(w, device), reduce)
    assert spmm_bwd(g, res0, to_device(go.astype(dtype), device))[2] is None
    assert spmm_bwd(g, res, to_device(go.astype(dtype), device), needs_x_grad=False,
                    needs_bias_grad=False)[::2] == (None, None)


@pytest.mark.parametrize("device", devices())
def test_spmm_bias_with_scales_and_no_edges(device):
    ei, g, x, w, go = _case(device, 7, True, num_src=90, hub=5)
    rng = np.random.default_rng(_seed())
    r, c, b = rng.uniform(0.5, 2, 300), rng.uniform(0.5, 2, 90), rng.standard_normal(7)
    out = spmm(g, to_device(x, device), to_device(w, device), "mean", bias=to_device(b, device),
               row_scale=to_device(r, device), col_scale=to_device(c, device))
    expect = ref.spmm(ei, x * c[:, None], w, "mean", 300) * r[:, None] + b
    assert_close(to_numpy(out), expect, "float64")
    # a graph without edges: every row is the bias
    g0 = Graph.from_edge_index(to_device(np.zeros((2, 0), np.int64), device), num_nodes=5)
    out0 = spmm(g0, to_device(np.ones((5, 3)), device), bias=to_device(b[:3], device))
    np.testing.assert_array_equal(to_numpy(out0), np.broadcast_to(b[:3], (5, 3)))
    _, res0 = spmm_fwd(g0, to_device(np.ones((5, 3)), device), bias=to_device(b[:3], device))
    gx0, _, gb0 = spmm_bwd(g0, res0, to_device(np.ones((5, 3)), device))
    np.testing.assert_array_equal(to_numpy(gx0), np.zeros((5, 3)))
    np.testing.assert_array_equal(to_numpy(gb0), np.full(3, 5.0))


def test_bias_vjp_by_finite_differences():
    """grad_bias of the oracle (and of the CPU backend) by central differences."""
    rng = np.random.default_rng(_seed())
    ei = awkward_edge_index(20, 80, seed=rng.integers(1 << 30))
    g = Graph.from_edge_index(ei, num_nodes=20)
    x, b, go = rng.standard_normal((20, 3)), rng.standard_normal(3), rng.standard_normal((20, 3))
    for reduce in ("sum", "mean"):
        f = lambda b_: np.sum(ref.spmm(ei, x, None, reduce, 20, bias=b_) * go)  # noqa: E731
        fc = lambda b_: np.sum(spmm(g, x, reduce=reduce, bias=b_) * go)  # noqa: E731
        _, res = spmm_fwd(g, x, reduce=reduce, bias=b)
        gb = spmm_bwd(g, res, go)[2]
        h = 1e-6
        for k in range(3):
            db = np.zeros(3)
            db[k] = h
            fd = (f(b + db) - f(b - db)) / (2 * h)
            assert abs(fd - ref.column_sum(go)[k]) < 1e-6
            assert abs((fc(b + db) - fc(b - db)) / (2 * h) - gb[k]) < 1e-6


@pytest.mark.parametrize("device", devices())
def test_bad_bias_raises_clear_errors(device):
    ei, g, x, w, go = _case(device, 4, False)
    xd = to_device(x, device)
    cases = [
        (lambda: spmm(g, xd, bias=to_device(np.ones(5), device)), ValueError, "bias must have shape"),
        (lambda: spmm(g, xd, bias=to_device(np.ones((1, 4)), device)), ValueError,
         "bias must have shape"),
        (lambda: spmm(g, xd, bias=to_device(np.ones(4, np.float32), device)), TypeError,
         "bias must have x's dtype"),
        (lambda: spmm(g, xd, bias=to_device(np.ones(4, np.int64), device)), TypeError, "bias"),
        (lambda: spmm(g, xd, bias="zeros"), TypeError, "bias"),
    ]
    if device != "cpu":
        cases.append((lambda: spmm(g, xd, bias=np.ones(4)), ValueError, "bias lives on CPU"))
    for fn, err, words in cases:
        with pytest.raises(err) as info:
            fn()
        assert words in str(info.value), str(info.value)


# ---------------------------------------------- constant CSR-ordered weights
@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("loops", [False, True])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_gcn_norm_weights_match_scales_and_reference(device, loops, reduce):
    """w_e = d_i d_j in CSR and transpose order == fused scales == gcn_norm
    weights; gradient of x through the transpose's weights; with a bias."""
    rng = np.random.default_rng(_seed())
    ei = awkward_edge_index(200, 1500, hub_degree=900, seed=rng.integers(1 << 30))
    g = Graph.from_edge_index(to_device(ei, device), num_nodes=200)
    g2, cw = fastgnn.gcn_norm_weights(g, add_self_loops=loops, dtype=np.float64)
    assert fastgnn.gcn_norm_weights(g, add_self_loops=loops, dtype=np.float64)[1] is cw  # cached
    g2s, d = fastgnn.gcn_norm_scales(g, add_self_loops=loops, dtype=np.float64)
    assert g2s is g2
    np.testing.assert_array_equal(to_numpy(cw.transposed),
                                  to_numpy(cw.csr)[to_numpy(g2.transpose().edge_ids)])
    rei, rw = ref.gcn_norm(ei, 200, None, add_self_loops=loops)
    x, go, b = rng.standard_normal((200, 9)), rng.standard_normal((200, 9)), rng.standard_normal(9)
    out, res = spmm_fwd(g2, to_device(x, device), None, reduce, csr_weights=cw,
                        bias=to_device(b, device))
    assert_close(to_numpy(out), ref.spmm(rei, x, rw, reduce, 200, bias=b), "float64")
    out_s = spmm(g2, to_device(x, device), None, reduce, row_scale=d, col_scale=d,
                 bias=to_device(b, device))
    assert_close(to_numpy(out), to_numpy(out_s), "float64")
    gx, gw, gb = spmm_bwd(g2, res, to_device(go, device))
    assert gw is None                                    # constants: no weight gradient
    rgx, _ = ref.spmm_vjp(rei, x, rw, reduce, go)
    assert_close(to_numpy(gx), rgx, "float64", "grad_x")
    assert_close(to_numpy(gb), ref.column_sum(go), "float64", "grad_bias")
    # float32 weights for float32 features
    _, cw32 = fastgnn.gcn_norm_weights(g, add_self_loops=loops)
    assert cw32.csr.dtype == np.float32
    out32 = spmm(g2, to_device(x.astype(np.float32), device), csr_weights=cw32)
    assert_close(to_numpy(out32), ref.spmm(rei, x, rw, "sum", 200), "float32")


@pytest.mark.parametrize("device", devices())
def test_bad_csr_weights_raise(device):
    ei, g, x, w, go = _case(device, 4, True)
    xd = to_device(x, device)
    cw = fastgnn.CsrWeights.from_csr(g, to_device(np.ones(g.num_edges), device))
    with pytest.raises(ValueError, match="edge_weight or csr_weights"):
        spmm(g, xd, to_device(w, device), csr_weights=cw)
    with pytest.raises(TypeError, match="csr_weights must be a CsrWeights"):
        spmm(g, xd, csr_weights=to_device(np.ones(g.num_edges), device))
    short = fastgnn.CsrWeights(cw.csr[:-1], cw.transposed)
    with pytest.raises(ValueError, match="csr_weights.csr must have shape"):
        spmm(g, xd, csr_weights=short)


# ------------------------------------------------------- bias, GPU only
@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("path", ["custom", "cusparse", "auto"])
@pytest.mark.parametrize("hub", [5, 3000])
@pytest.mark.parametrize("width", [3, 64, 128, 200])
def test_gpu_bias_paths_and_hub_split(path, hub, width):
    """The bias on every path (the custom kernel serves them all), direct and
    split (spmm_combine) rows, and a bias that is not 16-byte aligned."""
    import cupy as cp
    ei, g, x, w, go = _case("cuda", width, True, hub=hub)
    x32, w32 = x.astype(np.float32), w.astype(np.float32)
    b = np.random.default_rng(_seed()).standard_normal(width + 1).astype(np.float32)
    for bias in (cp.asarray(b[:width]), cp.asarray(b)[1:]):     # aligned, then offset by 4 B
        out, res = spmm_fwd(g, cp.asarray(x32), cp.asarray(w32), "sum", path=path, bias=bias)
        bh = cp.asnumpy(bias)
        assert_close(to_numpy(out), ref.spmm(ei, x32, w32, "sum", 300, bias=bh), "float32")
        gx, gw, gb = spmm_bwd(g, res, cp.asarray(go.astype(np.float32)))
        rgx, rgw = ref.spmm_vjp(ei, x32, w32, "sum", go.astype(np.float32))
        assert_close(to_numpy(gx), rgx, "float32", "grad_x")
        assert_close(to_numpy(gw), rgw, "float32", "grad_edge_weight")
        assert_close(to_numpy(gb), ref.column_sum(go.astype(np.float32)), "float32", "grad_bias")
    if path == "auto":
        from fastgnn.backends.cuda import chosen_paths
        assert chosen_paths(g)[(width, "float32", True, "bias")].path == "custom"


@pytest.mark.gpu
@gpu
def test_gpu_bias_is_bitwise_repeatable_and_leaves_plain_path_unchanged():
    import cupy as cp
    ei, g, x, w, go = _case("cuda", 64, True, hub=4000)
    xd, wd = cp.asarray(x.astype(np.float32)), cp.asarray(w.astype(np.float32))
    god = cp.asarray(go.astype(np.float32))
    b = cp.zeros(64, dtype=np.float32)
    runs = []
    for _ in range(3):
        out, res = spmm_fwd(g, xd, wd, path="custom", bias=b)
        runs.append([cp.asnumpy(a) for a in (out, *spmm_bwd(g, res, god))])
    plain = cp.asnumpy(spmm(g, xd, wd, path="custom"))
    for r in runs[1:]:
        for a, c in zip(runs[0], r):
            np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(runs[0][0], plain)      # + 0 in the store changes nothing


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("rows,width", [(1, 5), (63, 128), (64, 7), (300001, 33)])
def test_gpu_bias_grad_column_sum_levels(rows, width):
    """The fixed-order column sum over 1, 2 and 3 levels of 64-row blocks."""
    import cupy as cp

    from fastgnn.backends.cuda.spmm import column_sums
    a = np.random.default_rng(_seed()).standard_normal((rows, width))
    for dt, vt in ((np.float32, "float32"), (np.float64, "float64"), (np.float16, "float16")):
        s = column_sums(cp.asarray(a.astype(dt)), vt)
        assert s.dtype == dt and s.shape == (width,)
        assert_close(cp.asnumpy(s).astype(np.float64), a.astype(dt).astype(np.float64).sum(0), vt)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("vtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("width", [8, 128, 37])
def test_gpu_half_types_bias(vtype, width):
    ei, g, x, w, go = _case("cuda", width, True, hub=1000)
    b = np.random.default_rng(_seed()).standard_normal(width)
    if vtype == "bfloat16":
        xb, gob, bb = to_bf16_bits(x), to_bf16_bits(go), to_bf16_bits(b)
        xr, gor, br = from_bf16_bits(xb), from_bf16_bits(gob), from_bf16_bits(bb)
        kw = {"vtype": "bfloat16"}
        back = from_bf16_bits
    else:
        xb, gob, bb = x.astype(np.float16), go.astype(np.float16), b.astype(np.float16)
        xr, gor, br = (a.astype(np.float64) for a in (xb, gob, bb))
        kw = {}
        back = lambda a: a.astype(np.float64)  # noqa: E731
    out, res = spmm_fwd(g, to_device(xb, "cuda"), to_device(w.astype(np.float32), "cuda"),
                        "mean", bias=to_device(bb, "cuda"), **kw)
    assert_close(back(to_numpy(out)), ref.spmm(ei, xr, w, "mean", 300, bias=br), vtype)
    gx, _, gb = spmm_bwd(g, res, to_device(gob, "cuda"))
    assert to_numpy(gb).dtype == bb.dtype
    assert_close(back(to_numpy(gx)), ref.spmm_vjp(ei, xr, w, "mean", gor)[0], vtype, "grad_x")
    assert_close(back(to_numpy(gb)), ref.column_sum(gor), vtype, "grad_bias")


# -------------------------------------------------------------- column_sum
@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (4099, 33), (70000, 5), (0, 4), (5, 0)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_column_sum_matches_reference(device, shape, dtype):
    """fastgnn.column_sum == the float64 sum over rows (the several levels of
    the GPU's blocked sum included: 70000 rows), repeatable bit for bit, and
    the input is left as it was; a transposed (non-contiguous) input too."""
    rng = np.random.default_rng(_seed())
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    xd = to_device(x, device)
    before = to_numpy(xd).copy()
    s = fastgnn.column_sum(xd)
    assert s.shape == (shape[1],) and s.dtype == np.dtype(dtype)
    assert_close(to_numpy(s), ref.column_sum(x), dtype, "column_sum")
    assert np.array_equal(to_numpy(fastgnn.column_sum(xd)), to_numpy(s))
    assert np.array_equal(to_numpy(xd), before)
    xt = to_device(np.ascontiguousarray(x.T), device).T        # a transposed view
    assert_close(to_numpy(fastgnn.column_sum(xt)), ref.column_sum(x), dtype, "transposed")


@gpu
@pytest.mark.gpu
def test_column_sum_bf16_and_fp16_on_gpu():
    """16-bit inputs: fp32 accumulation, rounded once to the input's type."""
    import cupy as cp
    rng = np.random.default_rng(_seed())
    x = rng.standard_normal((5000, 17)).astype(np.float32)
    bits = to_bf16_bits(x)
    s = fastgnn.column_sum(cp.asarray(bits), vtype="bfloat16")
    assert s.dtype.itemsize == 2
    assert_close(from_bf16_bits(s.get()), ref.column_sum(from_bf16_bits(bits)), "bfloat16",
                 "bf16 column_sum")
    h = x.astype(np.float16)
    assert_close(fastgnn.column_sum(cp.asarray(h)).get(), ref.column_sum(h), "float16",
                 "fp16 column_sum")


@pytest.mark.parametrize("device", devices())
def test_column_sum_bad_input_raises(device):
    for bad, err, words in [(to_device(np.ones(4), device), ValueError, "x must have shape [N, F]"),
                            (to_device(np.ones((2, 2), np.int32), device), TypeError, "x must be"),
                            ("ones", TypeError, "x")]:
        with pytest.raises(err) as info:
            fastgnn.column_sum(bad)
        assert words in str(info.value), str(info.value)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("loops", ["none", "some", "repeated"])
def test_self_loop_structure_is_the_sorted_build_of_the_loop_edge_list(loops, device):
    """self_loop_structure's graph, built in CSR order without a sort (on a
    GPU by graph.cu's self_loop kernels), equals the NumPy
    Graph.from_edge_index of PyG's add_remaining_self_loops edge list (the
    non-loop edges in caller order, then loops 0..n-1); kept are the
    non-loop edges' ids, last each node's last existing loop (or -1). Every
    other case gives the edges sorted by target (edge ids = positions)."""
    from fastgnn.ops.spmm import self_loop_structure
    seed = _seed()
    rng = np.random.default_rng(seed)
    for case in range(20):
        n, E = int(rng.integers(1, 50)), int(rng.integers(0, 250))
        src, dst = rng.integers(0, n, E), rng.integers(0, n, E)
        if loops == "none":
            src = np.where(src == dst, (src + 1) % max(n, 2), src) % n
            keep = src != dst
            src, dst = src[keep], dst[keep]
        elif loops == "repeated":
            hot = rng.random(src.shape[0]) < 0.3
            src[hot] = dst[hot] = rng.integers(0, min(n, 3), int(hot.sum()))
        else:
            hot = rng.random(src.shape[0]) < 0.15
            src[hot] = dst[hot]
        ei = np.stack([src, dst])
        if case % 2:
            ei = ei[:, np.argsort(ei[1], kind="stable")]
        g = Graph.from_edge_index(to_device(ei, device), num_nodes=n)
        g2, kept, last = self_loop_structure(g)
        g2 = Graph(*map(to_numpy, (g2.indptr, g2.indices, g2.edge_ids)), n, n)
        kept, last = to_numpy(kept), to_numpy(last)
        not_loop = ei[0] != ei[1]
        want = Graph.from_edge_index(
            np.concatenate([ei[:, not_loop], np.stack([np.arange(n), np.arange(n)])], axis=1),
            num_nodes=n)
        msg = f"seed {seed} case {case}"
        np.testing.assert_array_equal(g2.indptr, want.indptr, err_msg=msg)
        np.testing.assert_array_equal(g2.indices, want.indices, err_msg=msg)
        ids = [np.arange(x.num_edges) if x.edge_ids is None else x.edge_ids for x in (g2, want)]
        np.testing.assert_array_equal(*ids, err_msg=msg)     # (None: ids are positions)
        np.testing.assert_array_equal(kept, np.flatnonzero(not_loop), err_msg=msg)
        want_last = np.full(n, -1)
        for e in np.flatnonzero(~not_loop):
            want_last[ei[0, e]] = e
        np.testing.assert_array_equal(last, want_last, err_msg=msg)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("chunk", [4, 64, 256])
def test_task_plan_cuts_rows_into_tasks_in_visit_order(chunk):
    """task_plan: each row, in visit order, is ceil(deg / chunk) tasks (an
    empty row one) of consecutive edges; the split rows' tasks get
    consecutive partial slots, in task order; rows that fit one task write
    directly (slot -1). Graphs with and without split rows (built by
    graph.cu's task kernels), with and without a visit order."""
    spmm_be = pytest.importorskip("fastgnn.backends.cuda.spmm")
    from fastgnn.reorder import Permutation
    seed = _seed()
    rng = np.random.default_rng(seed)
    for case in range(12):
        n = int(rng.integers(1, 80))
        deg = rng.integers(0, int(rng.choice([3, chunk + 1, 3 * chunk])), n)
        ei = np.stack([rng.integers(0, n, int(deg.sum())), np.repeat(np.arange(n), deg)])
        g = Graph.from_edge_index(to_device(ei, "cuda"), num_nodes=n)
        visit = np.arange(n)
        if case % 2:
            visit = rng.permutation(n)
            g = g.reorder(Permutation.from_perm(visit, n), relabel=False)
        plan = spmm_be.task_plan(g, chunk)
        g = Graph(to_numpy(g.indptr), to_numpy(g.indices), None, n, n)
        ntask = np.maximum(-(-deg[visit] // chunk), 1)
        row = np.repeat(visit, ntask)
        first = np.repeat(np.r_[0, np.cumsum(ntask)[:-1]], ntask)
        begin = g.indptr[row] + (np.arange(row.shape[0]) - first) * chunk
        split = np.repeat(ntask > 1, ntask)
        slot = np.where(split, np.cumsum(split) - 1, -1)
        msg = f"seed {seed} case {case}"
        for got, want in ((plan.task_row, row), (plan.task_begin, begin),
                          (plan.task_slot, slot), (plan.split_row, visit[ntask > 1]),
                          (plan.slot_ptr, np.r_[0, np.cumsum(ntask[ntask > 1])])):
            got = to_numpy(got)
            np.testing.assert_array_equal(got, want, err_msg=msg)
            assert got.dtype == g.index_dtype, msg
        assert plan.num_slots == int(ntask[ntask > 1].sum()), msg
        # the attention grids' work prefix over these tasks (graph.cu task_work)
        from fastgnn.backends.cuda import graph_build
        work = np.minimum(begin + chunk, g.indptr[row + 1]) - begin + 4
        np.testing.assert_array_equal(
            to_numpy(graph_build.task_work_prefix(plan.task_row, plan.task_begin,
                                                  to_device(g.indptr, "cuda"), chunk, 4)),
            np.r_[0, np.cumsum(work)], err_msg=msg)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("add_self_loops", [True, False])
def test_gcn_norm_keeps_a_bad_weight_in_its_own_rows(bad, add_self_loops):
    """A NaN or inf edge weight reaches only the normalised weights of edges
    touching its target's degree (its own row's and the edges leaving that
    node), as PyG's per-node degree sums give: the path 0 -> 1 -> ... -> 5
    with the weight of 1 -> 2 bad, and a random graph against a float64
    per-node reference."""
    from fastgnn.ops.spmm import self_loop_structure
    seed = _seed()
    rng = np.random.default_rng(seed)
    path = np.array([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]])
    n, E = 40, 160
    cases = [(path, 6, np.array([1, bad, 1, 1, 1], dtype=np.float32))]
    w = rng.random(E).astype(np.float32) + 0.5
    w[rng.integers(0, E, 2)] = bad
    cases.append((np.stack([rng.integers(0, n, E), rng.integers(0, n, E)]), n, w))
    for ei, nodes, w in cases:
        g = Graph.from_edge_index(ei, num_nodes=nodes)
        g2, got = gcn_norm(g, w, add_self_loops=add_self_loops)
        if add_self_loops:
            _, kept, last = self_loop_structure(g)
            w2 = np.concatenate([w[kept], np.where(last >= 0, w[np.maximum(last, 0)], 1.0)])
            e2 = np.concatenate([ei[:, kept], np.stack([np.arange(nodes)] * 2)], axis=1)
        else:
            w2, e2 = w, ei
        deg = np.zeros(nodes)
        np.add.at(deg, e2[1], w2.astype(np.float64))
        with np.errstate(divide="ignore", invalid="ignore"):
            dis = np.where(deg == 0, 0, deg ** -0.5)
            want = dis[e2[0]] * w2 * dis[e2[1]]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"seed {seed}")
        ok = np.isfinite(want)
        np.testing.assert_allclose(got[ok], want[ok], rtol=1e-5, err_msg=f"seed {seed}")
