"""Operators, one module per kernel family; each op is a forward/backward pair."""
from .spmm import column_sum, gcn_norm, spmm, spmm_bwd, spmm_fwd  # noqa: F401
from .segment import (segment_csr, segment_csr_bwd, segment_csr_fwd,  # noqa: F401
                      segment_reduce, segment_reduce_bwd, segment_reduce_fwd)
from .attention import edge_softmax, edge_softmax_bwd, edge_softmax_fwd  # noqa: F401
from .attention import edge_attention, edge_attention_bwd, edge_attention_fwd  # noqa: F401
