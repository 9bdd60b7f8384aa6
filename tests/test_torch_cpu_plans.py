"""The CPU plan path of fastgnn.torch (`Op.cpu`, adapters/torch/cpu_plans.py):
it serves inference calls on CPU tensors, falls back to the bridge where it
must, and its outputs equal the bridge's bitwise."""
import numpy as np
import pytest
import torch

import fastgnn
import fastgnn.torch as ft
from fastgnn.testing import awkward_edge_index
from fastgnn.torch import _autograd, cpu_plans, nn


@pytest.fixture
def served(monkeypatch):
    """Names of the plans that served a call (returned outputs)."""
    log = []
    for name in ("SPMM", "SEGMENT_REDUCE"):
        plan = getattr(cpu_plans, name)
        real = plan.forward

        def spy(*a, real=real, name=name):
            done = real(*a)
            if done is not None:
                log.append(name)
            return done
        monkeypatch.setattr(plan, "forward", spy)
    return log


def _bridge(fn, monkeypatch):
    monkeypatch.setattr(_autograd, "PLANS", False)
    try:
        return fn()
    finally:
        monkeypatch.setattr(_autograd, "PLANS", True)


def _graph(n=60, e=400, seed=3):
    ei = torch.from_numpy(awkward_edge_index(n, e, seed=seed))
    return ei, ft.to_graph(ei, n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_plans_serve_inference_and_match_the_bridge(served, monkeypatch, dtype):
    ei, g = _graph()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(60, 9, generator=gen, dtype=dtype)
    b = torch.randn(9, generator=gen, dtype=dtype)
    cw_graph, cw = fastgnn.gcn_norm_weights(g, dtype=np.float64 if dtype == torch.float64
                                            else np.float32)
    calls = {
        "sum": lambda: ft.spmm(g, x),
        "mean_bias": lambda: ft.spmm(g, x, reduce="mean", bias=b),
        "csr_weights": lambda: ft.spmm(cw_graph, x, csr_weights=cw, bias=b),
        "max": lambda: ft.segment_reduce(g, x, "max"),
        "multi": lambda: ft.segment_reduce(g, x, ["mean", "min", "std", "mul"]),
    }
    for name, call in calls.items():
        served.clear()
        with torch.no_grad():
            out = call()
        assert served, name
        ref = _bridge(call, monkeypatch)
        assert out.dtype == ref.dtype and torch.equal(out, ref), name
        assert out.data_ptr() not in (x.data_ptr(), b.data_ptr())


def test_layers_take_the_plans_under_no_grad(served, monkeypatch):
    ei, g = _graph()
    x = torch.randn(60, 16)
    torch.manual_seed(0)
    layers = [nn.GCNConv(16, 8), nn.SAGEConv(16, 8), nn.GINConv(torch.nn.Linear(16, 8)),
              nn.SAGEConv(16, 8, aggr="max")]
    for layer in layers:
        served.clear()
        with torch.no_grad():
            out = layer(x, ei)
        assert served, layer
        ref = _bridge(lambda: layer(x, ei), monkeypatch)
        assert torch.equal(out, ref.detach()), layer


def test_plans_fall_back_to_the_bridge(served):
    ei, g = _graph()
    x = torch.randn(60, 5, requires_grad=True)
    ft.spmm(g, x).sum().backward()                       # training: the bridge
    ft.segment_reduce(g, x, "max").sum().backward()
    with torch.no_grad():
        ft.spmm(g, x, edge_weight=torch.rand(g.num_edges))       # per-call weights
        ft.spmm(g, x, row_scale=torch.rand(60))                  # per-call scales
        ft.spmm(g, x.t().contiguous().t())                       # not contiguous
        ft.spmm(g, x.double()[:, :4])                            # a strided view
        ft.segment_reduce(g, x[:, :3].t().contiguous().t(), "max")
    assert served == []
    # errors stay the core's
    with torch.no_grad():
        with pytest.raises(ValueError, match="reduce must be one of"):
            ft.spmm(g, x, reduce="prod")
        with pytest.raises(ValueError, match="reduce must be one of"):
            ft.segment_reduce(g, x, "median")
        with pytest.raises(ValueError, match="rows but the graph has"):
            ft.spmm(g, x[:10], num_nodes=60)
        with pytest.raises(TypeError, match="bias must have x's dtype"):
            ft.spmm(g, x, bias=torch.zeros(5, dtype=torch.float64))
        with pytest.raises(TypeError):
            ft.segment_reduce(g, x, "max", deterministic=1)
    assert served == []


def test_plans_never_mutate_inputs(served):
    ei, g = _graph()
    x = torch.randn(60, 7)
    b = torch.randn(7)
    x0, b0 = x.clone(), b.clone()
    with torch.no_grad():
        y = ft.spmm(g, x, bias=b)
        z = ft.segment_reduce(g, x, ["max", "sum"])
    assert served == ["SPMM", "SEGMENT_REDUCE"]
    assert torch.equal(x, x0) and torch.equal(b, b0)
    y.add_(1)
    z.add_(1)                                            # outputs own their memory
    assert torch.equal(x, x0) and torch.equal(b, b0)
