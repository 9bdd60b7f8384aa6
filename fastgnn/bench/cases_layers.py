"""Layer-level cases: fastgnn.torch's drop-in GCNConv / SAGEConv(mean) /
GINConv against PyG 2.8's layers, F -> F features.

Every implementation of one case starts from the same float32 parameters
(a PyG layer initialised with the bench seed; loaded into the fastgnn layer by
name, the two share PyG's parameter names), cast to the bench dtype.

PyG input forms:
  pyg[edge_index]  a [2, E] tensor: gather x[src], scatter into targets.
  pyg[csr adj_t]   a torch.sparse_csr_tensor with rows = targets (PyG's
                   `adj_t`, int64 indices): the fused message_and_aggregate
                   path, torch.sparse.mm (cuSPARSE). This is PyG's fastest
                   input without torch_sparse; a sorted `EdgeIndex` is not
                   faster for these layers: they do not set
                   SUPPORTS_FUSED_EDGE_INDEX, so it takes the edge_index path.
The float32 reference is pyg[edge_index] with the dtype-rounded parameters.
"""
from __future__ import annotations

from .cases_spmm import clear_fastgnn_cache, fastgnn_paths
from .core import Case, Impl, Prepared, register
from .graphs import csr_adj_t


def _pyg_layer(name, width):
    import torch
    from torch_geometric import nn as pnn
    if name == "GCNConv":
        return pnn.GCNConv(width, width, cached=True)
    if name == "SAGEConv":
        return pnn.SAGEConv(width, width, aggr="mean")
    if name == "GINConv":
        mlp = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                  torch.nn.Linear(width, width))
        return pnn.GINConv(mlp)
    raise KeyError(name)


def _fastgnn_layer(name, width):
    import torch

    import fastgnn.torch as fgt
    cls = getattr(fgt, name, None)
    if cls is None:
        raise ImportError(f"fastgnn.torch.{name} is not available yet")
    if name == "GCNConv":
        return cls(width, width, cached=True)
    if name == "SAGEConv":
        return cls(width, width, aggr="mean")
    mlp = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                              torch.nn.Linear(width, width))
    return cls(mlp)


def _master_state(ctx, name, make=None):
    """float32 parameters shared by every implementation (built once per ctx).
    make(ctx) builds the PyG layer (default: this module's `_pyg_layer`)."""
    torch = ctx.torch
    key = ("master", name)
    if key not in ctx.state:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(ctx.seed)
            layer = make(ctx) if make is not None else _pyg_layer(name, ctx.width)
        ctx.state[key] = {k: v.detach().clone() for k, v in layer.state_dict().items()}
    return ctx.state[key]


def _load(module, state, dtype, device, torch):
    """Load `state` (rounded to dtype) into module by parameter name; returns
    a note when names did not all match."""
    rounded = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in state.items()}
    missing, unexpected = module.load_state_dict(rounded, strict=False)
    module.to(device=device, dtype=dtype)
    if missing or unexpected:
        return f"parameters not all shared (missing {list(missing)}, unexpected {list(unexpected)})"
    return None


def _prepared(ctx, module, call, note=None, cleanup=None, extra_info=None):
    x = ctx.leaf()
    params = [p for p in module.parameters() if p.requires_grad]

    def info():
        d = dict(extra_info()) if extra_info else {}
        if note:
            d["note"] = note
        return d
    return Prepared(lambda: call(module, x), [x] + params, info, cleanup=cleanup)


def layer_impls(name, settings):
    def impls(ctx):
        torch = ctx.torch
        ei = ctx.graph.edge_index

        def build_fastgnn(ctx):
            import fastgnn.torch as fgt
            m = _fastgnn_layer(name, ctx.width)
            note = _load(m, _master_state(ctx, name), ctx.dtype, ctx.device, torch)
            n = ctx.graph.num_nodes

            def paths():
                if not ctx.cuda:
                    return {"path": "cpu (numba)"}
                # the layer's graph comes from to_graph's cache (a hit while it lives)
                return fastgnn_paths(fgt.to_graph(ei, n))
            return _prepared(ctx, m, lambda m, x: m(x, ei), note,
                             cleanup=lambda: clear_fastgnn_cache(fgt), extra_info=paths)

        def build_pyg(ctx):
            m = _pyg_layer(name, ctx.width)
            _load(m, _master_state(ctx, name), ctx.dtype, ctx.device, torch)
            return _prepared(ctx, m, lambda m, x: m(x, ei))

        def build_pyg_csr(ctx):
            m = _pyg_layer(name, ctx.width)
            _load(m, _master_state(ctx, name), ctx.dtype, ctx.device, torch)
            adj_t = csr_adj_t(torch, ctx.graph, ctx.dtype, torch.int64)
            return _prepared(ctx, m, lambda m, x: m(x, adj_t))

        return [
            Impl("fastgnn[edge_index]", f"fastgnn.torch.{name}({settings}) on edge_index "
                 "(graph built once by fastgnn.torch.to_graph's cache)", build_fastgnn, fastgnn=True),
            Impl("pyg[edge_index]", f"torch_geometric.nn.{name}({settings}) on edge_index "
                 "(index_select + scatter message passing)", build_pyg),
            Impl("pyg[csr adj_t]", f"torch_geometric.nn.{name}({settings}) on adj_t = "
                 "torch.sparse_csr_tensor (rows = targets, int64 indices, built once): fused "
                 "message_and_aggregate -> torch.sparse.mm", build_pyg_csr),
        ]
    return impls


def layer_reference(name, make=None):
    """The float32 PyG layer on edge_index with the shared parameters;
    make(ctx) builds the PyG layer (default: `_pyg_layer`)."""
    def ref(ctx):
        torch = ctx.torch
        m = make(ctx) if make is not None else _pyg_layer(name, ctx.width)
        # parameters rounded to the bench dtype, then computed in float32
        state = {k: (v.to(ctx.dtype).float() if v.is_floating_point() else v)
                 for k, v in _master_state(ctx, name, make).items()}
        m.load_state_dict(state)
        m.to(device=ctx.device, dtype=torch.float32)
        x = ctx.leaf(ctx.x_ref)
        ei = ctx.graph.edge_index
        return Prepared(lambda: m(x, ei), [x])
    return ref


for _name, _settings, _desc in (
        ("GCNConv", "F, F, cached=True", "GCN layer: linear, then symmetric-normalised sum with self-loops"),
        ("SAGEConv", "F, F, aggr='mean'", "GraphSAGE layer: mean of neighbours + root weight"),
        ("GINConv", "nn=Linear-ReLU-Linear (F, F)", "GIN layer: MLP((1 + eps) x + sum of neighbours)")):
    register(Case(_name, "layer", "spmm", _desc, layer_impls(_name, _settings),
                  layer_reference(_name)))
