"""PyTorch adapter (installed as fastgnn.torch).

    spmm, gcn_norm          differentiable ops on torch tensors (functional.py)
    GCNConv, SAGEConv, GINConv
                            drop-in PyG 2.8 layers (nn.py)
    to_graph                fastgnn.Graph from edge_index / EdgeIndex / sparse adj_t,
                            cached (graph_cache.py)
    apply, Op, FastgnnFunction
                            the one generic bridge from any fastgnn forward/backward
                            pair to torch.autograd (_autograd.py)

CUDA tensors run on PyTorch's current stream with memory from PyTorch's
caching allocator; nothing touches the GPU at import time.
"""
from ._autograd import FastgnnFunction, Op, apply, device_scope
from .functional import gcn_norm, spmm
from .graph_cache import clear_graph_cache, to_graph
from .nn import GCNConv, GINConv, SAGEConv

__all__ = ["spmm", "gcn_norm", "to_graph", "clear_graph_cache", "GCNConv", "SAGEConv",
           "GINConv", "apply", "Op", "FastgnnFunction", "device_scope"]
