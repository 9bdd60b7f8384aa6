"""CUDA backend: CuPy launchers for kernels_cuda/ (compiled lazily, launched
on CuPy's current stream)."""
# Nothing here imports CuPy, so the kernel loader and the NVRTC compile check
# (loader.py, compile_check.py) import without it. The interface the ops call
# is api.py, imported by backend_for for CuPy arrays; its names (but `spmm`,
# which here is the launcher module) load from this package on first access.
_API = ("chosen_paths", "column_sums", "sddmm", "segment_bwd", "segment_fwd",
        "edge_softmax_fwd", "edge_softmax_bwd", "edge_attention_fwd", "edge_attention_bwd")


def __getattr__(name):
    if name in _API:
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
