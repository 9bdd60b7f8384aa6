"""CUDA backend: CuPy launchers for kernels_cuda/ (compiled lazily, launched
on CuPy's current stream)."""
from .segment import segment_bwd, segment_fwd  # noqa: F401
from .spmm import chosen_paths, sddmm, spmm  # noqa: F401
