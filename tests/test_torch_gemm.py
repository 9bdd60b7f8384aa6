"""fastgnn.torch.gemm: the layers' large dense products, in whichever cuBLAS
form was faster when the shape was first timed. Both forms must give the
product torch gives; CPU tensors, small operands and other layouts go to
torch unchanged."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fastgnn
from fastgnn.torch import gemm
from fastgnn.testing import assert_close

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not (fastgnn.gpu_available() and torch.cuda.is_available()),
                               reason="needs a CUDA device visible to CuPy and torch")


def _operands(device, dtype, n=333, k=37, m=19, seed=0):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(n, k, generator=gen, dtype=torch.float64)
    g = torch.randn(n, m, generator=gen, dtype=torch.float64)
    w = torch.randn(m, k, generator=gen, dtype=torch.float64)
    return a.to(device, dtype), g.to(device, dtype), w.to(device, dtype)


def test_small_or_cpu_products_are_torchs(monkeypatch):
    """Below MIN_NUMEL, or on the CPU, nothing is timed or cached."""
    monkeypatch.setattr(gemm, "_lt_wins", {})
    a, g, w = _operands("cpu", torch.float64)
    monkeypatch.setattr(gemm, "MIN_NUMEL", 0)
    assert torch.equal(gemm.x_wt(a, w), F.linear(a, w))
    assert torch.equal(gemm.g_w(g, w), g.mm(w))
    assert gemm._lt_wins == {}


@gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("lt", [False, True])
def test_gpu_both_forms_give_the_product(monkeypatch, dtype, lt):
    """Each form, forced through the cache, against the float64 product; then
    an empty cache times the shape once and records a choice."""
    monkeypatch.setattr(gemm, "MIN_NUMEL", 0)
    a, g, w = _operands("cuda", dtype, seed=int(lt))
    ref_y = F.linear(a.double(), w.double()).cpu().numpy()
    ref_d = g.double().mm(w.double()).cpu().numpy()
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5 if dtype == torch.float32 else 1e-12
    n, k = a.shape
    m = w.shape[0]
    dev = a.device.index
    monkeypatch.setattr(gemm, "_lt_wins", {(dev, dtype, n, k, m, "x_wt"): lt,
                                           (dev, dtype, n, m, k, "g_w"): lt})
    y, d = gemm.x_wt(a, w), gemm.g_w(g, w)
    assert y.shape == (n, m) and d.shape == (n, k) and y.dtype == d.dtype == dtype
    assert_close(y.double().cpu().numpy(), ref_y, tol=tol)
    assert_close(d.double().cpu().numpy(), ref_d, tol=tol)
    monkeypatch.setattr(gemm, "_lt_wins", {})
    y2 = gemm.x_wt(a, w)
    assert set(gemm._lt_wins) == {(dev, dtype, n, k, m, "x_wt")}
    assert_close(y2.double().cpu().numpy(), ref_y, tol=tol)
    assert np.isfinite(y2.double().cpu().numpy()).all()


@gpu
@needs_gpu
def test_gpu_non_contiguous_operands_go_to_torch(monkeypatch):
    monkeypatch.setattr(gemm, "MIN_NUMEL", 0)
    monkeypatch.setattr(gemm, "_lt_wins", {})
    a, g, w = _operands("cuda", torch.float32)
    at = a.t().contiguous().t()                      # same values, column-major
    assert torch.equal(gemm.x_wt(at, w), F.linear(at, w))
    assert gemm._lt_wins == {}
