"""fastgnn.torch functional API: spmm against the float64 reference, gradients
by finite differences, the graph cache, input validation, and (on a GPU) the
stream / allocator plumbing of the generic autograd bridge."""
import gc
import warnings

import numpy as np
import pytest
import torch

import fastgnn
import fastgnn.torch as ft
from fastgnn.backends import reference as ref
from fastgnn.testing import assert_close, awkward_edge_index
from fastgnn.torch import graph_cache

warnings.filterwarnings("ignore", message=".*[Ss]parse.*")

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not (fastgnn.gpu_available() and torch.cuda.is_available()),
                               reason="needs a CUDA device visible to CuPy and torch")

N = 97          # odd sizes on purpose


def _graph(seed, n=N, e=600, num_src=None):
    ei = awkward_edge_index(n, e, seed=seed, num_src=num_src)
    return ei, torch.from_numpy(ei)


def _np(t):
    return t.detach().cpu().double().numpy()


# ------------------------------------------------------------- forward values
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("width", [1, 7, 33])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_spmm_matches_reference(reduce, weighted, width, dtype):
    rng = np.random.default_rng(width)
    ei, eit = _graph(width)
    x = torch.from_numpy(rng.standard_normal((N, width))).to(dtype)
    w = torch.from_numpy(rng.random(ei.shape[1])).to(dtype) if weighted else None
    out = ft.spmm(eit, x, w, reduce)
    assert out.shape == (N, width) and out.dtype == dtype
    expect = ref.spmm(ei, _np(x), None if w is None else _np(w), reduce, N)
    assert_close(_np(out), expect, str(dtype)[6:])
    assert not out[N - N // 10:].any(), "empty rows must give 0"


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_spmm_bipartite(reduce):
    rng = np.random.default_rng(1)
    ns, nd = 41, 88
    ei = awkward_edge_index(nd, 300, seed=3, num_src=ns)
    x = torch.from_numpy(rng.standard_normal((ns, 5)))
    w = torch.from_numpy(rng.random(ei.shape[1]))
    out = ft.spmm(torch.from_numpy(ei), x, w, reduce, num_nodes=(ns, nd))
    assert out.shape == (nd, 5)
    assert_close(_np(out), ref.spmm(ei, _np(x), _np(w), reduce, nd), "float64")


@pytest.mark.parametrize("layout", ["csr", "csc", "coo", "coo_uncoalesced", "edge_index_type"])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_spmm_other_graph_inputs(layout, reduce):
    """Sparse adj_t (rows = targets, its values = weights) and PyG EdgeIndex
    give the same result as the plain edge_index."""
    rng = np.random.default_rng(5)
    ei, eit = _graph(5)
    x = torch.from_numpy(rng.standard_normal((N, 6)))
    vals = torch.from_numpy(rng.random(ei.shape[1]))
    if layout == "edge_index_type":
        from torch_geometric import EdgeIndex
        adj = EdgeIndex(eit, sparse_size=(N, N))
        out = ft.spmm(adj, x, vals, reduce)
        expect = ref.spmm(ei, _np(x), _np(vals), reduce, N)
    else:
        coo = torch.sparse_coo_tensor(eit.flip(0), vals, (N, N))
        if layout == "coo_uncoalesced":
            adj = coo
        else:
            coo = coo.coalesce()        # duplicates summed, as torch.sparse.mm sees them
            adj = {"csr": coo.to_sparse_csr, "csc": coo.to_sparse_csc, "coo": lambda: coo}[layout]()
        out = ft.spmm(adj, x, reduce=reduce)
        c = coo.coalesce()
        expect = ref.spmm(c.indices().flip(0).numpy(), _np(x), _np(c.values()), reduce, N)
    assert_close(_np(out), expect, "float64")


def _pyg_spmm_inputs(seed, layout, weighted, dtype=torch.float64):
    """A rectangular graph input (targets != sources, empty target rows,
    duplicates, a hub) in `layout` and the matrix torch_geometric.utils.spmm
    reads the same aggregation from: (ours, PyG's, weights leaf or None)."""
    from torch_geometric import EdgeIndex
    ns, nd = 53, 71
    rng = np.random.default_rng(seed)
    ei = torch.from_numpy(awkward_edge_index(nd, 400, seed=seed, num_src=ns))
    vals = torch.from_numpy(rng.random(ei.shape[1]) + 0.1).to(dtype) if weighted else None
    if layout == "edge_index_type":
        # ours reads an EdgeIndex as an edge_index (row 0 sources); PyG's spmm
        # reads it as the matrix, rows = targets: the transpose, row-sorted
        theirs = EdgeIndex(ei.flip(0), sparse_size=(nd, ns)).sort_by("row")[0]
        return EdgeIndex(ei, sparse_size=(ns, nd)), theirs, None
    leaf = vals.requires_grad_() if weighted else None
    coo = torch.sparse_coo_tensor(ei.flip(0), leaf if weighted else torch.ones(ei.shape[1],
                                                                               dtype=dtype),
                                  (nd, ns)).coalesce()
    adj = {"csr": coo.to_sparse_csr, "csc": coo.to_sparse_csc, "coo": lambda: coo}[layout]()
    return adj, adj, leaf


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "add"])
@pytest.mark.parametrize("layout,weighted", [("csr", False), ("csr", True), ("coo", False),
                                             ("coo", True), ("csc", False),
                                             ("edge_index_type", False)])
def test_spmm_matches_pyg_spmm(reduce, layout, weighted):
    """Rectangular inputs without num_nodes (the adj_t's or EdgeIndex's own
    target count) and every reduction of torch_geometric.utils.spmm, with
    gradients of x and of the adj_t's values."""
    from torch_geometric.utils import spmm as pyg_spmm
    # PyG's EdgeIndex matmul runs in float32 only
    dtype = torch.float32 if layout == "edge_index_type" else torch.float64
    ours_adj, pyg_adj, leaf = _pyg_spmm_inputs(12, layout, weighted, dtype)
    x = torch.randn(53, 7, dtype=dtype, generator=torch.Generator().manual_seed(3),
                    requires_grad=True)
    ref_out = pyg_spmm(pyg_adj, x, reduce="sum" if reduce == "add" else reduce)
    out = ft.spmm(ours_adj, x, reduce="sum" if reduce == "add" else reduce)
    assert out.shape == ref_out.shape == (71, 7)
    tol = "float32" if dtype == torch.float32 else "float64"
    assert_close(_np(out), _np(ref_out), tol)
    assert not out[71 - 71 // 10:].any(), "empty rows must give 0"
    if layout == "edge_index_type":         # its own sizes serve segment_reduce too
        assert_close(_np(ft.segment_reduce(ours_adj, x, reduce)), _np(out), tol)
    cot = torch.randn(out.shape, dtype=dtype, generator=torch.Generator().manual_seed(4))
    wrt = [x] + ([leaf] if weighted else [])
    want = torch.autograd.grad(ref_out, wrt, cot, retain_graph=True)
    got = torch.autograd.grad(out, wrt, cot)
    for name, g, w in zip(("x", "values"), got, want):
        assert_close(_np(g), _np(w), tol, what=f"grad {name}")


def test_spmm_max_min_on_edge_index_and_their_limits():
    """max/min of an edge_index with edge weights (per-edge messages) against
    a dense reference; fused scales do not combine with them."""
    rng = np.random.default_rng(8)
    ei, eit = _graph(8)
    x = torch.from_numpy(rng.standard_normal((N, 5))).requires_grad_()
    w = torch.from_numpy(rng.random(ei.shape[1]) + 0.1).requires_grad_()
    bias = torch.randn(5, dtype=torch.float64)
    for reduce, pick in (("max", torch.amax), ("min", torch.amin)):
        out = ft.spmm(eit, x, w, reduce, bias=bias)
        msgs = w[:, None] * x[eit[0]]
        expect = torch.stack([pick(msgs[eit[1] == i], 0) if (eit[1] == i).any()
                              else torch.zeros(5, dtype=torch.float64) for i in range(N)]) + bias
        assert_close(_np(out), _np(expect), "float64")
        got = torch.autograd.grad(out.sum(), [x, w])
        want = torch.autograd.grad(expect.sum(), [x, w])
        for g, e in zip(got, want):
            assert_close(_np(g), _np(e), "float64")
    with pytest.raises(ValueError, match="row_scale"):
        ft.spmm(eit, x, reduce="max", row_scale=torch.ones(N, dtype=torch.float64))
    with pytest.raises(ValueError, match="edge_weight"):
        ft.spmm(eit, x, w[:-1], reduce="min")


def test_spmm_sparse_rejects_edge_weight():
    _, eit = _graph(0)
    adj = torch.sparse_coo_tensor(eit.flip(0), torch.ones(eit.shape[1]), (N, N)).to_sparse_csr()
    with pytest.raises(ValueError, match="edge_weight"):
        ft.spmm(adj, torch.randn(N, 3), torch.ones(adj.values().shape[0]))


def test_spmm_on_fastgnn_graph_and_noncontiguous_inputs():
    rng = np.random.default_rng(2)
    ei, eit = _graph(2)
    g = fastgnn.Graph.from_edge_index(ei, num_nodes=N)
    xt = torch.from_numpy(rng.standard_normal((9, N)))            # x = xt.T: not contiguous
    w2 = torch.from_numpy(rng.random((ei.shape[1], 2)))            # w = w2[:, 1]: strided
    before = (xt.clone(), w2.clone(), eit.clone())
    out = ft.spmm(g, xt.T, w2[:, 1], "mean")
    assert_close(_np(out), ref.spmm(ei, _np(xt.T), _np(w2[:, 1]), "mean", N), "float64")
    for a, b in zip((xt, w2, eit), before):
        assert torch.equal(a, b)


# ---------------------------------------------------------------- gradients
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_spmm_gradcheck(reduce):
    rng = np.random.default_rng(7)
    n = 17
    ei = awkward_edge_index(n, 40, seed=7)
    eit = torch.from_numpy(ei)
    x = torch.from_numpy(rng.standard_normal((n, 3))).requires_grad_()
    w = torch.from_numpy(rng.random(ei.shape[1])).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: ft.spmm(eit, x, w, reduce), (x, w))
    # one input at a time (other backward flags); fast mode: random projections
    assert torch.autograd.gradcheck(lambda x: ft.spmm(eit, x, None, reduce), (x,),
                                    fast_mode=True)
    assert torch.autograd.gradcheck(lambda w: ft.spmm(eit, x.detach(), w, reduce), (w,),
                                    fast_mode=True)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("needs", ["x", "w", "both"])
def test_spmm_vjp_matches_reference(reduce, needs):
    rng = np.random.default_rng(11)
    ei, eit = _graph(11)
    x = torch.from_numpy(rng.standard_normal((N, 19))).float().requires_grad_(needs != "w")
    w = torch.from_numpy(rng.random(ei.shape[1])).float().requires_grad_(needs != "x")
    out = ft.spmm(eit, x, w, reduce)
    cot = torch.randn_like(out)
    (out * cot).sum().backward()
    gx, gw = ref.spmm_vjp(ei, _np(x), _np(w), reduce, _np(cot))
    if needs == "w":
        assert x.grad is None
    else:
        assert_close(_np(x.grad), gx, "float32", "grad x")
    if needs == "x":
        assert w.grad is None
    else:
        assert w.grad.dtype == w.dtype
        assert_close(_np(w.grad), gw, "float32", "grad edge_weight")


def test_spmm_inplace_edit_between_forward_and_backward_is_caught():
    ei, eit = _graph(0)
    x = torch.randn(N, 4, dtype=torch.float64)
    w = torch.rand(ei.shape[1], dtype=torch.float64, requires_grad=True)
    out = ft.spmm(eit, x, w)
    x.mul_(2)                          # the residuals alias x
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


# -------------------------------------------------------------- graph cache
def test_graph_cache_hits_and_rebuilds():
    graph_cache.clear_graph_cache()
    ei, eit = _graph(4)
    g1 = ft.to_graph(eit)
    assert ft.to_graph(eit) is g1
    assert ft.to_graph(eit[:, :]) is g1                      # a view of the same memory
    assert ft.to_graph(eit, num_nodes=N + 3) is not g1       # sizes are part of the key
    assert ft.to_graph(eit.clone()) is not g1                # other memory
    x = torch.randn(N, 2, dtype=torch.float64)
    ft.spmm(eit, x)
    hits = graph_cache._GRAPHS.hits
    ft.spmm(eit, x)
    assert graph_cache._GRAPHS.hits == hits + 1
    eit[0, 0] = (eit[0, 0] + 1) % N                          # in-place edit: _version changes
    g2 = ft.to_graph(eit)
    assert g2 is not g1
    out = ft.spmm(eit, x)
    assert_close(_np(out), ref.spmm(eit.numpy(), _np(x), None, "sum", N), "float64")
    g = fastgnn.Graph.from_edge_index(ei)
    assert ft.to_graph(g) is g


def test_graph_cache_entry_dies_with_its_tensor():
    graph_cache.clear_graph_cache()
    _, eit = _graph(6)
    ft.to_graph(eit)
    assert len(graph_cache._GRAPHS) == 1
    del eit
    gc.collect()
    graph_cache._GRAPHS.get(("probe",), torch.zeros(1), lambda: None)
    assert ("probe",) in graph_cache._GRAPHS._d and len(graph_cache._GRAPHS) == 1


def test_graph_cache_sparse_values_change():
    _, eit = _graph(8)
    vals = torch.ones(eit.shape[1], dtype=torch.float64)
    adj = torch.sparse_coo_tensor(eit.flip(0), vals, (N, N)).coalesce().to_sparse_csr()
    x = torch.randn(N, 3, dtype=torch.float64)
    a = ft.spmm(adj, x)
    adj.values().mul_(3)                                     # same structure, new weights
    b = ft.spmm(adj, x)
    assert torch.allclose(b, 3 * a)


# --------------------------------------------------------------- bad inputs
def test_bad_inputs_raise_naming_the_argument():
    ei, eit = _graph(9)
    x = torch.randn(N, 4)
    with pytest.raises(ValueError, match="edge_weight"):
        ft.spmm(eit, x, torch.ones(ei.shape[1] - 1))
    bad = eit.clone()
    bad[1, 3] = N + 5
    with pytest.raises(ValueError, match="edge_index"):
        ft.spmm(bad, x)
    bad = eit.clone()
    bad[0, 2] = -1
    with pytest.raises(ValueError, match="negative"):
        ft.spmm(bad, x)
    with pytest.raises(ValueError, match="x"):
        ft.spmm(eit, torch.randn(N))
    with pytest.raises(TypeError, match="x"):
        ft.spmm(eit, torch.ones(N, 4, dtype=torch.int64))
    with pytest.raises(TypeError, match="x"):
        ft.spmm(eit, np.ones((N, 4), dtype=np.float32))
    with pytest.raises(TypeError, match="edge_weight"):
        ft.spmm(eit, x, np.ones(ei.shape[1], dtype=np.float32))
    with pytest.raises(ValueError, match="edge_index"):
        ft.spmm(eit[:1], x)
    with pytest.raises(TypeError, match="edge_index"):
        ft.spmm(ei, x)                                       # NumPy graph input
    with pytest.raises(ValueError, match="reduce"):
        ft.spmm(eit, x, reduce="prod")
    with pytest.raises(TypeError, match="edge_index must hold integers"):
        ft.spmm(eit.float(), x)                              # PyG refuses it too
    with pytest.raises(ValueError, match="x"):
        ft.spmm(eit, torch.randn(N + 1, 4), num_nodes=N)


def test_inputs_not_mutated_by_forward_and_backward():
    ei, eit = _graph(10)
    x = torch.randn(N, 5, dtype=torch.float64, requires_grad=True)
    w = torch.rand(ei.shape[1], dtype=torch.float64, requires_grad=True)
    saved = (x.detach().clone(), w.detach().clone(), eit.clone())
    out = ft.spmm(eit, x, w, "mean")
    (out * torch.randn_like(out)).sum().backward()
    for a, b in zip((x.detach(), w.detach(), eit), saved):
        assert torch.equal(a, b)


# --------------------------------------------------------------------- GPU
def _gpu_case(dtype, reduce, weighted, width=45, seed=0):
    rng = np.random.default_rng(seed)
    ei = awkward_edge_index(1001, 20000, seed=seed)
    x64 = torch.from_numpy(rng.standard_normal((1001, width)))
    w64 = torch.from_numpy(rng.random(ei.shape[1])) if weighted else None
    # the reference sees the same (rounded) inputs the kernel sees
    x64 = x64.to(dtype).double()
    x = x64.to("cuda", dtype).requires_grad_()
    w = None if w64 is None else w64.float().cuda().requires_grad_()
    return ei, x64, w64, x, w


@gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_gpu_spmm_fwd_bwd(dtype, reduce, weighted):
    ei, x64, w64, x, w = _gpu_case(dtype, reduce, weighted)
    eit = torch.from_numpy(ei).cuda()
    out = ft.spmm(eit, x, w, reduce)
    assert out.dtype == dtype and out.device == x.device
    w_np = None if w64 is None else w64.float().double().numpy()
    vt = "float32" if dtype == torch.float32 else "bfloat16"
    assert_close(_np(out), ref.spmm(ei, x64.numpy(), w_np, reduce, 1001), vt)
    cot = torch.randn(out.shape, dtype=torch.float64)
    (out * cot.to("cuda", dtype)).sum().backward()
    gx, gw = ref.spmm_vjp(ei, x64.numpy(), w_np, reduce, cot.to(dtype).double().numpy())
    assert x.grad.dtype == dtype
    assert_close(_np(x.grad), gx, vt, "grad x")
    if weighted:
        assert w.grad.dtype == w.dtype
        assert_close(_np(w.grad), gw, vt, "grad edge_weight")


def in_torch_pool(ptr):
    """True when device address `ptr` lies in a segment of torch's caching allocator."""
    return any(seg["address"] <= ptr < seg["address"] + seg["total_size"]
               for seg in torch.cuda.memory_snapshot())


@gpu
@needs_gpu
def test_gpu_spmm_counts_in_torch_allocator_and_uses_current_stream():
    ei, x64, _, x, _ = _gpu_case(torch.float32, "sum", False, width=256)
    eit = torch.from_numpy(ei).cuda()
    graph_cache.clear_graph_cache()                       # no frees pending from other tests
    gc.collect()
    ft.spmm(eit, x.detach())                              # warm the graph cache
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = ft.spmm(eit, x.detach())
    nbytes = out.numel() * out.element_size()
    assert in_torch_pool(out.data_ptr()), "output not from torch's caching allocator"
    assert torch.cuda.max_memory_allocated() - base >= nbytes
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out2 = ft.spmm(eit, x.detach())
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(out, out2)


@gpu
@needs_gpu
def test_gpu_generic_bridge_plumbing():
    """The autograd bridge alone (a toy CuPy op, no fastgnn kernel): outputs and
    temporaries come from torch's allocator, work runs on torch's current
    stream, bf16 travels as int16 and comes back as bf16."""
    import cupy

    seen = {}

    def fwd(graph, x, *, scale, vtype=None):
        seen["stream"] = cupy.cuda.get_current_stream().ptr
        seen["vtype"] = vtype
        tmp = cupy.empty(1 << 24, dtype=cupy.uint8)       # a 16 MiB workspace
        tmp.fill(1)
        if vtype == "bfloat16":
            y = (x.view(cupy.uint16).astype(cupy.uint32) << 16).view(cupy.float32) * scale
            out = (y.view(cupy.uint32) >> 16).astype(cupy.uint16).view(cupy.int16)
        else:
            out = x * scale
        return out, scale

    def bwd(graph, scale, g):
        return (g * scale,) if g.dtype.kind == "f" else (None,)

    op = ft.Op("toy", fwd, bwd, inputs=("x",), features=("x",))
    x = torch.randn(1000, 33, device="cuda", requires_grad=True)
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = ft.apply(op, None, x, scale=2.0)
        assert seen["stream"] == side.cuda_stream
    torch.cuda.current_stream().wait_stream(side)
    assert torch.cuda.max_memory_allocated() - base >= (1 << 24), "workspace not in torch's pool"
    assert torch.equal(out, 2 * x.detach()) and in_torch_pool(out.data_ptr())
    out.backward(torch.ones_like(out))
    assert torch.equal(x.grad, torch.full_like(x, 2.0))
    xb = torch.randn(64, 8, device="cuda").bfloat16()
    outb = ft.apply(op, None, xb, scale=2.0)
    assert seen["vtype"] == "bfloat16" and outb.dtype == torch.bfloat16
    assert torch.equal(outb, xb * 2)



# ---------------------------------------------------------------- bias
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_spmm_bias_gradcheck_and_reference(reduce):
    """bias added in the kernel's store: output and every gradient (x, w, b)
    by finite differences, and against the float64 reference."""
    rng = np.random.default_rng(8)
    n = 17
    ei = awkward_edge_index(n, 40, seed=8)
    eit = torch.from_numpy(ei)
    x = torch.from_numpy(rng.standard_normal((n, 3))).requires_grad_()
    w = torch.from_numpy(rng.random(ei.shape[1])).requires_grad_()
    b = torch.from_numpy(rng.standard_normal(3)).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w, b: ft.spmm(eit, x, w, reduce, bias=b), (x, w, b))
    assert torch.autograd.gradcheck(lambda b: ft.spmm(eit, x.detach(), None, reduce, bias=b),
                                    (b,))
    out = ft.spmm(eit, x, w, reduce, bias=b)
    assert_close(_np(out), ref.spmm(ei, _np(x), _np(w), reduce, n, bias=_np(b)), "float64")
    cot = torch.from_numpy(rng.standard_normal((n, 3)))
    (out * cot).sum().backward()
    assert_close(_np(b.grad), ref.column_sum(cot.numpy()), "float64", "grad bias")
    gx, gw = ref.spmm_vjp(ei, _np(x), _np(w), reduce, cot.numpy())
    assert_close(_np(x.grad), gx, "float64", "grad x")
    assert_close(_np(w.grad), gw, "float64", "grad edge_weight")


def test_spmm_bad_bias_raises():
    ei, eit = _graph(9)
    x = torch.randn(N, 4)
    for bad, err, words in [(torch.zeros(5), ValueError, "bias must have shape"),
                            (torch.zeros(1, 4), ValueError, "bias must have shape"),
                            (torch.zeros(4, dtype=torch.float64), TypeError, "bias must have x's dtype"),
                            (torch.zeros(4, dtype=torch.bfloat16), TypeError, "bias must have x's dtype"),
                            (np.zeros(4, np.float32), TypeError, "bias must be a torch.Tensor")]:
        with pytest.raises(err) as info:
            ft.spmm(eit, x, bias=bad)
        assert words in str(info.value), str(info.value)


@gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_gpu_spmm_bias(dtype, reduce):
    ei, x64, w64, x, w = _gpu_case(dtype, reduce, True)
    eit = torch.from_numpy(ei).cuda()
    b64 = torch.randn(x.shape[1], dtype=torch.float64).to(dtype).double()
    b = b64.to("cuda", dtype).requires_grad_()
    out = ft.spmm(eit, x, w, reduce, bias=b)
    assert out.dtype == dtype
    w_np = w64.float().double().numpy()
    vt = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype]
    assert_close(_np(out), ref.spmm(ei, x64.numpy(), w_np, reduce, 1001, bias=b64.numpy()), vt)
    cot = torch.randn(out.shape, dtype=torch.float64)
    (out * cot.to("cuda", dtype)).sum().backward()
    assert b.grad.dtype == dtype
    assert_close(_np(b.grad), ref.column_sum(cot.to(dtype).double().numpy()), vt, "grad bias")
    gx, gw = ref.spmm_vjp(ei, x64.numpy(), w_np, reduce, cot.to(dtype).double().numpy())
    assert_close(_np(x.grad), gx, vt, "grad x")
    assert_close(_np(w.grad), gw, vt, "grad edge_weight")
    with pytest.raises(ValueError, match="bias lives on CPU"):
        ft.spmm(eit, x, w, reduce, bias=b.detach().cpu())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not (fastgnn.gpu_available() and torch.cuda.is_available()),
                                        reason="needs a CUDA device visible to CuPy and torch")])])
def test_no_grad_calls_run_the_inference_forward(monkeypatch, device):
    """Under torch.no_grad (or with no input requiring grad) an op's forward is
    told that no gradient is wanted (no residuals, no max/min positions) and
    makes no autograd node; its output equals the grad-mode one."""
    import fastgnn.ops.segment as seg
    from fastgnn.torch import plans
    seen = []
    real = seg._fwd
    monkeypatch.setattr(seg, "_fwd", lambda *a: seen.append(a[4]) or real(*a))
    # on CUDA the launch plan path serves the calls (residuals: its 4th argument)
    real_plan = plans.segment_forward
    monkeypatch.setattr(plans, "segment_forward",
                        lambda *a: seen.append(a[3]) or real_plan(*a))
    # on the CPU the CPU plan path serves the inference calls (no residuals)
    from fastgnn.torch import cpu_plans
    real_cpu = cpu_plans.SEGMENT_REDUCE.forward

    def cpu_plan(*a):
        done = real_cpu(*a)
        if done is not None:
            seen.append(False)
        return done
    monkeypatch.setattr(cpu_plans.SEGMENT_REDUCE, "forward", cpu_plan)
    ei = torch.from_numpy(awkward_edge_index(40, 200, seed=2)).to(device)
    x = torch.randn(40, 6, dtype=torch.float32, device=device, requires_grad=True)
    reduce = ["mean", "max", "min", "std"]
    y_grad = ft.segment_reduce(ei, x, reduce)
    with torch.no_grad():
        y_inf = ft.segment_reduce(ei, x, reduce)
    y_detached = ft.segment_reduce(ei, x.detach(), reduce)
    assert seen == [True, False, False]
    assert y_grad.grad_fn is not None and y_inf.grad_fn is None and y_detached.grad_fn is None
    torch.testing.assert_close(y_inf, y_grad.detach(), rtol=0, atol=0)
    torch.testing.assert_close(y_detached, y_grad.detach(), rtol=0, atol=0)


def test_device_allocation_failures_surface_as_torch_oom():
    """Inside a CUDA scope, Thrust's `MemoryError: std::bad_alloc` and CuPy's
    OutOfMemoryError leave as torch.OutOfMemoryError (chained); torch's own
    OOM and a host MemoryError pass unchanged."""
    from fastgnn.torch import _autograd

    def exit_with(exc):
        scope = _autograd._Scope("cuda:0")
        scope.entered, scope.prev = [], None        # as after entering on a GPU
        return scope.__exit__(type(exc), exc, None)

    bad_alloc = MemoryError("std::bad_alloc: cudaErrorMemoryAllocation: out of memory")
    with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory in fastgnn") as info:
        exit_with(bad_alloc)
    assert info.value.__cause__ is bad_alloc
    CupyOOM = type("OutOfMemoryError", (MemoryError,), {"__module__": "cupy.cuda.memory"})
    with pytest.raises(torch.OutOfMemoryError):
        exit_with(CupyOOM("Out of memory allocating 1,024 bytes"))
    assert exit_with(torch.OutOfMemoryError("CUDA out of memory.")) is False
    assert exit_with(MemoryError("host")) is False
    assert exit_with(ValueError("x")) is False
