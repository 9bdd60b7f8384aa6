"""Shared pytest set-up."""
import pytest


@pytest.fixture(autouse=True)
def _fused_layer_paths(monkeypatch):
    """The drop-in layers switch to their fused Python autograd Functions
    (shared-input linears, add_bias) only above a size (FUSED_MIN_NUMEL);
    test graphs are small, so lower it to 0 and let every layer test check the
    fused paths, and the GEMM-form dispatch (gemm.MIN_NUMEL) likewise.
    test_torch_layers.py checks the size switch itself."""
    try:
        from fastgnn.torch import functional, gemm
    except ImportError:                 # torch not installed: nothing to switch
        return
    monkeypatch.setattr(functional, "FUSED_MIN_NUMEL", 0)
    monkeypatch.setattr(gemm, "MIN_NUMEL", 0)


@pytest.fixture
def set_tf32():
    """set_tf32(on): let fp32 CUDA matmuls use TF32 or not, through the API
    this torch has (matmul.fp32_precision, else allow_tf32); restored after
    the test."""
    import torch
    matmul = torch.backends.cuda.matmul
    name = "fp32_precision" if hasattr(matmul, "fp32_precision") else "allow_tf32"
    before = getattr(matmul, name)

    def set_tf32(on: bool):
        setattr(matmul, name, ("tf32" if on else "ieee") if name == "fp32_precision" else on)
    yield set_tf32
    setattr(matmul, name, before)
