"""CUDA backend: CuPy launchers for kernels_cuda/ (compiled lazily, launched
on CuPy's current stream)."""
from .segment import segment_bwd, segment_fwd  # noqa: F401
from .spmm import column_sums, chosen_paths, sddmm, spmm  # noqa: F401


# attention.py imports the attention op module; load it on first use only
def edge_softmax_fwd(*args, **kwargs):
    from .attention import edge_softmax_fwd as fn
    return fn(*args, **kwargs)


def edge_softmax_bwd(*args, **kwargs):
    from .attention import edge_softmax_bwd as fn
    return fn(*args, **kwargs)


def edge_attention_fwd(*args, **kwargs):
    from .attention import edge_attention_fwd as fn
    return fn(*args, **kwargs)


def edge_attention_bwd(*args, **kwargs):
    from .attention import edge_attention_bwd as fn
    return fn(*args, **kwargs)
