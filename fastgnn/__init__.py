"""fastgnn: IO-aware GPU kernels for graph neural networks.

Pure array functions with forward/backward pairs over a `Graph`; NumPy arrays
run on the CPU (Numba), CuPy arrays on the GPU (CUDA). Framework adapters live
in `fastgnn.torch`, `fastgnn.jax` and `fastgnn.dgl`.
"""
from ._array import gpu_available
from .graph import Graph
from .ops.segment import (segment_csr, segment_csr_bwd, segment_csr_fwd, segment_reduce,
                          segment_reduce_bwd, segment_reduce_fwd)
from .ops.spmm import (CsrWeights, column_sum, gcn_norm, gcn_norm_scales, gcn_norm_weights, spmm, spmm_bwd,
                       spmm_fwd)
from .ops.attention import (edge_attention, edge_attention_bwd, edge_attention_fwd, edge_softmax,
                            edge_softmax_bwd, edge_softmax_fwd)

__version__ = "0.1.0"

__all__ = ["Graph", "spmm", "spmm_fwd", "spmm_bwd", "gcn_norm", "column_sum",
           "segment_reduce", "segment_reduce_fwd", "segment_reduce_bwd",
           "segment_csr", "segment_csr_fwd", "segment_csr_bwd", "gpu_available", "__version__",
           "edge_softmax", "edge_softmax_fwd", "edge_softmax_bwd",
           "edge_attention", "edge_attention_fwd", "edge_attention_bwd"]
