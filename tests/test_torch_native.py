"""The native backward node (fastgnn.torch.native) in the fake CUDA world
(fastgnn.testing.fake_cuda: CPU tensors on the plan path, launches recorded):
its launches are the Python node's, slot for slot, with its own gradient
buffers; autograd's checks (in-place edits, a second backward, double
backward) hold; ops without a native program keep the Python node. The GPU
tests compare the two nodes' gradients bitwise (tests/test_launch_plans.py)."""
import ctypes

import numpy as np
import pytest
import torch

import fastgnn.torch as ft
from fastgnn import testing
from fastgnn.backends.cuda import segment
from fastgnn.backends.cuda import spmm as cuda_spmm
from fastgnn.testing import awkward_edge_index
from fastgnn.torch import native

pytestmark = pytest.mark.skipif(not native.ENABLED or native.module() is None,
                                reason="the native extension cannot be built here")

# call buffers each plan kind allocates per backward (its gradient, its workspace)
FRESH = {segment.BwdPlan: {segment.BWD_GRAD, segment.BWD_WORKSPACE},
         cuda_spmm.SpmmPlan: {5, 6}, cuda_spmm.ColumnSumPlan: {1, 2}}


def _launches_by_func(*graphs):
    plans = [v for g in graphs for v in g.cache.values() if isinstance(v, tuple(FRESH))]
    plans += list(cuda_spmm._column_sum_plans.values())
    return {l.func: (p, l) for p in plans for l in p.launches}


def _read(params, n):
    ptrs = (ctypes.c_uint64 * n).from_address(params)
    return [ctypes.c_uint64.from_address(p).value for p in ptrs]


def _masked(launch, values):
    """values with the per-call slots (buffer addresses) masked."""
    per_call = {i for i, _, _ in launch.dynamic}
    return [None if i in per_call else v for i, v in enumerate(values)]


def _both(monkeypatch, build, seed):
    """For the Python node and then the native one, on the same graph and
    inputs: (recorded backward launches as (func, grid, block, smem, stream,
    masked values), the gradients, the values of their fresh slots, the
    node's name)."""
    rec = testing.fake_cuda(monkeypatch, native_node=True)
    graphs, inputs, forward = build(seed)
    gen = torch.Generator().manual_seed(seed)
    cot = None
    runs = []
    for native_node in (False, True):
        monkeypatch.setattr(native, "ENABLED", native_node)
        out = forward()
        if cot is None:
            cot = torch.randn(out.shape, dtype=out.dtype, generator=gen)
        rec.clear()
        rec.native.clear()
        grads = torch.autograd.grad(out, inputs, cot)
        by_func = _launches_by_func(*graphs)
        rows = rec.native if native_node else [
            (f, gr, bl, sm, st, _read(p, len(by_func[f][1].kinds))) for f, gr, bl, sm, st, p in rec]
        got, slots = [], set()
        for func, grid, block, smem, stream, values in rows:
            plan, launch = by_func[func]
            got.append((func, grid, block, smem, stream, _masked(launch, values)))
            slots |= {values[i] for i, k, _ in launch.dynamic if k in FRESH[type(plan)]}
            # the cotangent slot holds the cotangent (contiguous: as given)
            cot_index = segment.BWD_G if isinstance(plan, segment.BwdPlan) else 0
            assert all(values[i] == cot.data_ptr() + off for i, k, off in launch.dynamic
                       if k == cot_index)
        name = out.grad_fn.name() if native_node else type(out.grad_fn).__name__
        runs.append((got, grads, slots, name))
    return runs


def _segment_case(reduce, dtype=torch.float64):
    def build(seed):
        n = 300
        ei = torch.from_numpy(awkward_edge_index(n, 3000, hub_degree=700, seed=seed))
        g = ft.to_graph(ei, n)
        x = torch.randn(n, 16, dtype=dtype, generator=torch.Generator().manual_seed(seed))
        x.requires_grad_()
        return (g,), [x], lambda: ft.segment_reduce(g, x, reduce)
    return build


def _spmm_case(reduce, with_bias, need_x=True):
    def build(seed):
        n, f = 300, 12
        ei = torch.from_numpy(awkward_edge_index(n, 3000, hub_degree=700, seed=seed))
        g = ft.to_graph(ei, n)
        g.transpose()                          # (the bridge's first backward builds it)
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(n, f, generator=gen).requires_grad_(need_x)
        b = torch.randn(f, generator=gen).requires_grad_() if with_bias else None
        inputs = [t for t in (x, b) if t is not None and t.requires_grad]
        return (g, g.transpose()), inputs, lambda: ft.spmm(g, x, reduce=reduce, bias=b,
                                                           path="custom")
    return build


CASES = {
    "segment-max": _segment_case("max"),
    "segment-multi": _segment_case(["mean", "max", "min", "std"]),
    "segment-mul": _segment_case("mul"),
    "segment-sum-var-fp32": _segment_case(["sum", "var"], torch.float32),
    "spmm-sum-bias": _spmm_case("sum", True),
    "spmm-mean": _spmm_case("mean", False),
    "spmm-bias-only": _spmm_case("sum", True, need_x=False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_native_node_launches_what_the_python_node_launches(monkeypatch, case):
    seed = 7
    (want, want_grads, _, py_name), (got, grads, fresh, name) = _both(monkeypatch, CASES[case],
                                                                      seed)
    assert py_name == "FastgnnFunctionBackward"
    assert name.startswith("fastgnn::") and name.endswith("Backward"), name
    assert got == want, f"seed {seed}"
    assert [g.shape for g in grads] == [g.shape for g in want_grads]
    assert [g.dtype for g in grads] == [g.dtype for g in want_grads]
    for g in grads:                            # the gradients are the buffers the launches wrote
        assert g.data_ptr() in fresh


def test_native_node_checks_in_place_edits_and_a_second_backward(monkeypatch):
    testing.fake_cuda(monkeypatch, native_node=True)
    n = 100
    ei = torch.from_numpy(awkward_edge_index(n, 600, seed=3))
    x = torch.randn(n, 8, dtype=torch.float64, requires_grad=True)
    y = x * 1.0
    out = ft.segment_reduce(ei, y, "std")      # the std backward reads its input
    with torch.no_grad():
        y.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
    out = ft.segment_reduce(ei, x, "max")
    loss = out.sum()
    loss.backward(retain_graph=True)
    loss.backward()                            # retained: runs again
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()


def test_native_node_gradients_are_once_differentiable(monkeypatch):
    testing.fake_cuda(monkeypatch, native_node=True)
    n = 100
    ei = torch.from_numpy(awkward_edge_index(n, 600, seed=4))
    x = torch.randn(n, 8, dtype=torch.float64, requires_grad=True)
    out = ft.segment_reduce(ei, x, "max")
    cot = torch.ones(out.shape, dtype=out.dtype, requires_grad=True)
    gx, = torch.autograd.grad(out, [x], cot, create_graph=True)
    with pytest.raises(RuntimeError, match="not differentiable"):
        gx.sum().backward()


def test_native_node_absent_cotangent_is_zero(monkeypatch):
    """An output whose cotangent autograd does not give (undefined) reads
    as zeros, as the Python node's materialised gradient."""
    rec = testing.fake_cuda(monkeypatch, native_node=True)
    n = 80
    ei = torch.from_numpy(awkward_edge_index(n, 400, seed=5))
    x = torch.randn(n, 4, dtype=torch.float64, requires_grad=True)
    out = ft.segment_reduce(ei, x, "max")
    node = out.grad_fn
    gx = node(None)                            # called with no cotangent
    walk = next(v for f, _, _, _, _, v in rec.native)
    assert gx.shape == x.shape and walk        # (launched on a zero cotangent)


def test_ops_without_a_native_program_keep_the_python_node(monkeypatch):
    testing.fake_cuda(monkeypatch, native_node=True)
    n = 100
    ei = torch.from_numpy(awkward_edge_index(n, 600, seed=6))
    g = ft.to_graph(ei, n)
    s = torch.randn(g.num_edges, 2, dtype=torch.float64, requires_grad=True)
    assert type(ft.edge_softmax(g, s).grad_fn).__name__ == "FastgnnFunctionBackward"


def test_native_switch_off_keeps_the_python_node(monkeypatch):
    testing.fake_cuda(monkeypatch, native_node=True)
    monkeypatch.setattr(native, "ENABLED", False)
    n = 100
    ei = torch.from_numpy(awkward_edge_index(n, 600, seed=6))
    x = torch.randn(n, 8, dtype=torch.float64, requires_grad=True)
    assert type(ft.segment_reduce(ei, x, "max").grad_fn).__name__ == "FastgnnFunctionBackward"
    assert np.isfinite(x.detach().numpy()).all()


# ------------------------------------------------------------------- GPU
def _gpu():
    import fastgnn
    return fastgnn.gpu_available() and torch.cuda.is_available()


GPU_CASES = [("segment_reduce", "max", torch.float32), ("segment_reduce", ["mean", "max", "std"],
             torch.float64), ("segment_reduce", "sum", torch.bfloat16),
             ("spmm", "sum", torch.float32), ("spmm", "mean", torch.float64)]


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA device visible to CuPy and torch")
@pytest.mark.parametrize("op,reduce,dtype", GPU_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("width", [5, 64])
def test_gpu_native_node_gradients_equal_the_python_nodes_bitwise(monkeypatch, op, reduce, dtype,
                                                                   width):
    seed = 11
    n = 700
    ei = torch.from_numpy(awkward_edge_index(n, 9000, hub_degree=3000, seed=seed)).cuda()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, width, device="cuda", generator=gen).to(dtype).requires_grad_()
    b = torch.randn(width, device="cuda", generator=gen).to(dtype).requires_grad_()
    results = []
    for enabled in (False, False, True):       # (the first call: the bridge builds the caches)
        monkeypatch.setattr(native, "ENABLED", enabled)
        if op == "spmm":
            out = ft.spmm(ei, x, reduce=reduce, bias=b, num_nodes=n, path="custom")
            inputs = [x, b]
        else:
            out = ft.segment_reduce(ei, x, reduce)
            inputs = [x]
        kind = out.grad_fn.name() if enabled else type(out.grad_fn).__name__
        assert kind.startswith("fastgnn::") == enabled, kind
        cot = torch.randn(out.shape, device="cuda", generator=gen.manual_seed(seed + 1)).to(dtype)
        results.append([out, *torch.autograd.grad(out, inputs, cot)])
    for want, got in zip(*results[1:]):
        assert torch.equal(want, got), f"seed {seed}"


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA device visible to CuPy and torch")
def test_gpu_native_node_replays_in_a_captured_training_step():
    """A SAGE(max) + GCN step with native nodes, captured in a CUDA graph
    after one eager step, replays to the eager step's losses."""
    torch.manual_seed(3)
    n, f = 500, 24
    ei = torch.from_numpy(awkward_edge_index(n, 5000, hub_degree=900, seed=3)).cuda()
    x = torch.randn(n, f, device="cuda")
    y = torch.randint(0, 4, (n,), device="cuda")

    def model():
        torch.manual_seed(5)
        return torch.nn.ModuleList([ft.SAGEConv(f, 16, aggr="max"), ft.GCNConv(16, 4)]).cuda()

    def step(m, opt):
        opt.zero_grad(set_to_none=False)
        h = m[0](x, ei).relu()
        loss = torch.nn.functional.cross_entropy(m[1](h, ei), y)
        loss.backward()
        opt.step()
        return loss.detach()

    eager_m = model()
    eager_opt = torch.optim.SGD(eager_m.parameters(), lr=0.1)
    eager = [step(eager_m, eager_opt).item() for _ in range(4)]
    assert eager_m[0](x, ei).grad_fn is not None
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        first = step(m, opt).item()             # warm-up: plans and programs built
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = step(m, opt)
    replayed = [first]
    for _ in range(3):
        graph.replay()
        replayed.append(loss.item())
    np.testing.assert_allclose(replayed, eager, rtol=1e-5)


# A process whose first backward is a native node's: autograd's device thread
# has made no CUDA runtime call yet, so the node binds the context itself.
_FIRST_BACKWARD = """
import sys, torch
import fastgnn.torch as ft
from fastgnn.testing import awkward_edge_index
from fastgnn.torch import native
n, f = 700, 64
ei = torch.from_numpy(awkward_edge_index(n, 9000, hub_degree=3000, seed=7)).cuda()
x = torch.randn(n, f, device="cuda", requires_grad=True)
with torch.no_grad():
    ft.segment_reduce(ei, x, "max")              # plans built, no backward yet
out = ft.segment_reduce(ei, x, "max")
assert out.grad_fn.name().startswith("fastgnn::"), out.grad_fn.name()
cot = torch.randn(out.shape, device="cuda")
got, = torch.autograd.grad(out, [x], cot)
native.ENABLED = False
want, = torch.autograd.grad(ft.segment_reduce(ei, x, "max"), [x], cot)
sys.exit(0 if torch.equal(got, want) else 3)
"""


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA device visible to CuPy and torch")
def test_gpu_native_node_runs_first_on_a_fresh_device_thread():
    """The first backward of a process through a native node (no Python node
    before it on autograd's device thread) runs and equals the Python node's
    gradient bitwise; in a subprocess, so that a crash fails only this test."""
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-c", _FIRST_BACKWARD], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, (f"exit status {run.returncode} (3: gradients differ; "
                                 f"-11: a crash)\n{run.stderr[-3000:]}")
