"""Backends by array type: NumPy arrays run the Numba CPU kernels, CuPy arrays
the CUDA kernels. `reference` holds the float64 NumPy twins used by tests."""
from .._array import is_cupy


def backend_for(x):
    """The backend module serving arrays like `x` (imported lazily: CuPy and
    the CUDA launchers only for CuPy arrays)."""
    if is_cupy(x):
        from .cuda import api
        return api
    from . import cpu
    return cpu
