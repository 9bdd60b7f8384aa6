"""PyTorch adapter (installed as fastgnn.torch)."""
