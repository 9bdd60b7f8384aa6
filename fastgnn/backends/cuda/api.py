"""The CUDA backend's interface: the functions the ops call on CuPy arrays
(`fastgnn.backends.backend_for` returns this module for them). Importing it
imports CuPy and the launchers; nothing is compiled or launched until a call."""
from .attention import (edge_attention_bwd, edge_attention_fwd, edge_softmax_bwd,  # noqa: F401
                        edge_softmax_fwd)
from .segment import segment_bwd, segment_fwd  # noqa: F401
from .spmm import column_sums, chosen_paths, sddmm, spmm  # noqa: F401
