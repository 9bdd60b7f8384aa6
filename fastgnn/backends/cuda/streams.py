"""CuPy's view of a stream another framework owns (PyTorch's current
stream, XLA's compute stream), so that CuPy launches and allocations run on
it. Imports no CuPy: callers pass the module.
"""
from __future__ import annotations

_views: dict = {}       # (device, cudaStream_t) -> CuPy stream object
MAX_VIEWS = 256         # streams come and go; the cache is cleared past this


class _StreamHandle:
    """A raw cudaStream_t speaking the CUDA stream protocol (for CuPy >= 14)."""

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


def external_stream(cupy, ptr: int, device: int):
    """CuPy's stream object for the raw cudaStream_t `ptr` (an int; 0 = the
    legacy default stream) on `device`, cached per (device, ptr)."""
    key = (device, ptr)
    s = _views.get(key)
    if s is None:
        if ptr == 0:
            s = cupy.cuda.Stream.null
        elif hasattr(cupy.cuda.Stream, "from_external"):
            s = cupy.cuda.Stream.from_external(_StreamHandle(ptr))
        else:                                   # CuPy < 14
            s = cupy.cuda.ExternalStream(ptr, device)
        if len(_views) > MAX_VIEWS:
            _views.clear()
        _views[key] = s
    return s
