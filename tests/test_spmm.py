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
    gx, gw = spmm_bwd(g, res, to_device(go.astype(dtype), device))
    rgx, rgw = ref.spmm_vjp(ei, x, w, reduce, go.astype(dtype))
    assert_close(to_numpy(gx), rgx, dtype, "grad_x")
    if weighted:
        assert gw.dtype == w.dtype
        assert_close(to_numpy(gw), rgw, dtype, "grad_edge_weight")
    else:
        assert gw is None
    # empty rows (last tenth of the targets) are exactly zero
    assert np.all(to_numpy(out)[-30:] == 0)


@pytest.mark.parametrize("device", devices())
def test_bipartite_and_int64(device):
    ei, g, x, w, go = _case(device, 16, True, num_src=77, index_dtype=np.int64)
    assert g.index_dtype == np.int64
    out, res = spmm_fwd(g, to_device(x, device), to_device(w, device), "mean")
    assert_close(to_numpy(out), ref.spmm(ei, x, w, "mean", 300), "float64")
    gx, gw = spmm_bwd(g, res, to_device(go, device))
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
@pytest.mark.parametrize("width", [3, 64, 128, 200])
def test_gpu_paths_and_hub_split(path, hub, width):
    """Hub rows (3000 in-edges) are split into tasks and recombined."""
    ei, g, x, w, go = _case("cuda", width, True, hub=hub)
    x32, w32 = x.astype(np.float32), w.astype(np.float32)
    out, res = spmm_fwd(g, to_device(x32, "cuda"), to_device(w32, "cuda"), "sum", path=path)
    assert_close(to_numpy(out), ref.spmm(ei, x32, w32, "sum", 300), "float32")
    gx, gw = spmm_bwd(g, res, to_device(go.astype(np.float32), "cuda"))
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
    gx, gw = spmm_bwd(g, res, to_device(gob, "cuda"))
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
        gx, gw = spmm_bwd(g, res, god)
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
    gx, gw = spmm_bwd(g, res, to_device(go, device))
    rgx, rgw = ref.spmm_vjp(ei, x * c[:, None], w, reduce, go * r[:, None])
    assert_close(to_numpy(gx), rgx * c[:, None], "float64", "grad_x")
    if weighted:
        assert_close(to_numpy(gw), rgw, "float64", "grad_edge_weight")
    with pytest.raises(ValueError, match="row_scale must have shape"):
        spmm(g, to_device(x, device), row_scale=to_device(r[:-1], device))
    with pytest.raises(ValueError, match="col_scale must have shape"):
        spmm(g, to_device(x, device), col_scale=to_device(r, device))
