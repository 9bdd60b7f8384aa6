"""fastgnn for DGL (installed as fastgnn.dgl): DGL graphs and drop-in `dgl.nn` layers.

    # from dgl.nn import GraphConv, SAGEConv, GATConv
    from fastgnn.dgl.nn import GraphConv, SAGEConv, GATConv
    # dgl.ops.u_mul_e_sum(g, x, w), dgl.nn.functional.edge_softmax(g, e)
    import fastgnn.dgl as fd
    fd.ops.u_mul_e_sum(g, x, w), fd.edge_softmax(g, e)

    GraphConv, SAGEConv, GINConv, GINEConv, GATConv, GATv2Conv, RelGraphConv
                      DGL's modules: constructor arguments, parameter names
                      (state_dicts load both ways with strict=True), forward
                      inputs and errors (nn.py, nn_relational.py); they run
                      inside DGL's HeteroGraphConv as its per-relation modules
    edge_softmax, ops.copy_u_*, ops.copy_e_*, ops.u_mul_e_*, ops.gspmm
                      DGL's functional ops where fastgnn has the kernel
                      (sum, mean, max, min; ops.py)
    to_graph          the fastgnn.Graph of a DGLGraph (cached per graph)

A DGLGraph (homogeneous, or a bipartite block from `dgl.to_block` and DGL's
samplers) is converted once, following DGL's direction (messages src -> dst,
reduced at dst) and edge ids, and cached; every `fastgnn.torch` op takes it
as its graph argument too. Everything runs through fastgnn.torch's ops and
its one autograd bridge (DGL's tensors are torch tensors), on the CPU and on
CUDA alike. Needs dgl (its wheels support torch 2.0-2.2 and numpy < 2).
"""
from . import nn, ops
from .nn import GATConv, GATv2Conv, GINConv, GINEConv, GraphConv, RelGraphConv, SAGEConv
from .ops import edge_softmax, to_graph

__all__ = ["GraphConv", "SAGEConv", "GINConv", "GINEConv", "GATConv", "GATv2Conv",
           "RelGraphConv", "edge_softmax", "to_graph", "nn", "ops"]
