"""CUDA backend: CuPy launchers for kernels_cuda/ (compiled lazily)."""
