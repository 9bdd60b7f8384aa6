"""Numba CPU backend (parallel over target rows)."""
from .spmm import column_sums, sddmm, spmm  # noqa: F401
from .segment import segment_bwd, segment_fwd  # noqa: F401
from .attention import edge_softmax_bwd, edge_softmax_fwd  # noqa: F401
from .attention import edge_attention_bwd, edge_attention_fwd  # noqa: F401
