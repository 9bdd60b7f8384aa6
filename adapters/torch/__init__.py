"""PyTorch adapter (installed as fastgnn.torch).

    spmm, gcn_norm, segment_reduce, segment_reduce_linear, segment_csr
                            differentiable ops on torch tensors (functional.py)
    GCNConv, SAGEConv, GINConv
                            drop-in PyG 2.8 layers (nn.py)
    GraphConv, SGConv, APPNP, TAGConv, LEConv, ClusterGCNConv, ChebConv
                            drop-in PyG 2.8 propagation layers of the SpMM
                            family (nn_propagation.py)
    GINEConv, ResGatedGraphConv, GENConv, PNAConv
                            drop-in PyG 2.8 layers with per-edge messages
                            (nn_messages.py; DegreeScalerAggregation, PNA's
                            scalers, loads on first access like aggr.py's)
    RGCNConv, FastRGCNConv  drop-in PyG 2.8 relational layers (nn_hetero.py)
    HGTConv                 drop-in PyG 2.8 heterogeneous graph transformer, one
                            fused attention per destination node type (nn_hgt.py)
    to_hetero               PyG's to_hetero for models of fastgnn.torch layers
                            (nn_hetero.py; imports PyG when called)
    edge_softmax, edge_attention
                            fused attention ops on torch tensors (attention.py)
    GATConv, GATv2Conv, TransformerConv
                            drop-in PyG 2.8 attention layers (attention.py)
    SumAggregation, MeanAggregation, MaxAggregation, MinAggregation,
    VarAggregation, StdAggregation, MulAggregation, SoftmaxAggregation,
    PowerMeanAggregation, MultiAggregation (every PyG combine mode)
                            PyG-compatible Aggregation modules (aggr.py; they
                            import PyG, so they load on first access)
    to_graph                fastgnn.Graph from edge_index / EdgeIndex / sparse adj_t /
                            DGLGraph, cached (graph_cache.py)
    apply, Op, FastgnnFunction
                            the one generic bridge from any fastgnn forward/backward
                            pair to torch.autograd (_autograd.py)

CUDA tensors run on PyTorch's current stream with memory from PyTorch's
caching allocator; nothing touches the GPU at import time.
"""
from ._autograd import FastgnnFunction, Op, apply, device_scope
from .functional import gcn_norm, segment_csr, segment_reduce, segment_reduce_linear, spmm
from .custom_ops import warm_up
from .graph_cache import clear_graph_cache, to_graph
from .attention import GATConv, GATv2Conv, TransformerConv, edge_attention, edge_softmax
from .nn import GCNConv, GINConv, SAGEConv
from .nn_propagation import (APPNP, ChebConv, ClusterGCNConv, GraphConv, LEConv, SGConv,
                             TAGConv)
from .nn_messages import GENConv, GINEConv, PNAConv, ResGatedGraphConv
from .nn_hetero import FastRGCNConv, RGCNConv, to_hetero
from .nn_hgt import HGTConv

_AGGREGATIONS = ("SumAggregation", "MeanAggregation", "MaxAggregation", "MinAggregation",
                 "VarAggregation", "StdAggregation", "MulAggregation", "SoftmaxAggregation",
                 "PowerMeanAggregation", "MultiAggregation")

__all__ = ["spmm", "gcn_norm", "segment_reduce", "segment_reduce_linear", "segment_csr", "to_graph",
           "clear_graph_cache", "warm_up", "GCNConv", "SAGEConv", "GINConv", "GraphConv", "SGConv",
           "APPNP", "TAGConv", "LEConv", "ClusterGCNConv", "ChebConv", "GINEConv",
           "ResGatedGraphConv", "GENConv", "PNAConv", "RGCNConv", "FastRGCNConv",
           "HGTConv", "to_hetero", "edge_softmax", "edge_attention",
           "GATConv", "GATv2Conv", "TransformerConv", *_AGGREGATIONS, "DegreeScalerAggregation",
           "apply", "Op",
           "FastgnnFunction", "device_scope"]


def __getattr__(name):
    # aggr.py subclasses PyG's Aggregation; importing PyG costs seconds, so
    # `import fastgnn.torch` leaves it until an aggregation is first asked for
    if name in _AGGREGATIONS:
        from . import aggr
        return getattr(aggr, name)
    if name == "DegreeScalerAggregation":
        from . import nn_messages
        return nn_messages.DegreeScalerAggregation
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
