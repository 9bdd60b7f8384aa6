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
