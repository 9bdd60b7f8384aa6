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
  pyg[compiled]    (opt-in, --compile) torch.compile of the PyG layer on its
                   fastest eager form, falling back to edge_index where
                   that form does not compile (`compiled_impl`).
The float32 reference is pyg[edge_index] with the dtype-rounded parameters.
"""
from __future__ import annotations

import time

from . import core, external
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


def compiled_impl(ctx, layer, make, forms):
    """The PyG layer under torch.compile, or None unless --compile was given.

    make(ctx) -> the PyG module with the shared parameters loaded;
    forms: [(label, ctx -> graph input)] tried in order (PyG's fastest eager
    input form first). Compilation happens in build(), outside every timed
    call: a no-grad forward and a forward+backward, each twice (a cached
    layer recompiles once its cache is set); its seconds go to `compile_s`.
    A form that fails to compile is noted and the next one tried; when none
    compiles the build raises NotImplementedError ("unsupported: <reason>").
    torch._dynamo.reset() before each try and after the run, so one layer's
    graphs never count against another's recompile limit."""
    mode = getattr(ctx, "compile", None)
    if not mode:
        return None
    dynamic = bool(getattr(ctx, "compile_dynamic", False))
    labels = " or ".join(label for label, _ in forms)

    def build(ctx):
        torch = ctx.torch
        failures = []
        for label, graph_input in forms:
            torch._dynamo.reset()
            try:
                g = graph_input(ctx)
                cm = torch.compile(make(ctx), mode=mode, dynamic=dynamic)
                prep = _prepared(ctx, cm, lambda m, x, g=g: m(x, g))
                t0 = time.perf_counter()
                for _ in range(2):
                    with torch.no_grad():
                        prep.forward()
                    torch.autograd.grad(prep.forward(), prep.inputs, ctx.grad_out,
                                        allow_unused=True)
                if ctx.cuda:
                    torch.cuda.synchronize()
                secs = round(time.perf_counter() - t0, 1)
            except Exception as exc:  # noqa: BLE001 - recorded below
                if core.classify(exc) == "oom":
                    raise
                failures.append(f"{label}: {core.describe(exc, 200)}")
                continue
            info = {"compiled_form": label, "compile_s": secs}
            if failures:
                info["note"] = "torch.compile failed on " + "; ".join(failures)
            prep.info = lambda: info
            prep.cleanup = torch._dynamo.reset
            return prep
        torch._dynamo.reset()
        raise NotImplementedError("torch.compile failed: " + "; ".join(failures))
    return Impl("pyg[compiled]", f"torch.compile(torch_geometric.nn.{layer}, mode={mode!r}, "
                f"dynamic={dynamic}) on {labels} (the first that compiles; compile time outside "
                "timing, recorded as compile_s)", build)


DGL_LAYERS = {"GCNConv": "GraphConv(F, F, norm='none', allow_zero_in_degree=True) with "
                          "edge_weight = PyG's gcn_norm weights on the graph with self-loops",
              "SAGEConv": "SAGEConv(F, F, 'mean')"}


def _dgl_params(name, state):
    """PyG's parameters under DGL's names (weights transposed where DGL
    stores [in, out]); DGL SAGEConv keeps its bias either apart or in fc_neigh."""
    if name == "GCNConv":
        return {"weight": state["lin.weight"].t().contiguous(), "bias": state["bias"]}
    return {"fc_self.weight": state["lin_r.weight"], "fc_neigh.weight": state["lin_l.weight"],
            "bias": state["lin_l.bias"]}


def dgl_layer_impl(ctx, name, settings):
    """dgl.nn.pytorch's layer with PyG's parameters, or None where DGL has no
    layer of the same definition here."""
    if name not in DGL_LAYERS:
        return None

    def build(ctx):
        from dgl import nn as dnn
        ei, n = ctx.graph.edge_index, ctx.graph.num_nodes
        F = ctx.width
        kw = {}
        if name == "GCNConv":
            from torch_geometric.nn.conv.gcn_conv import gcn_norm
            ei, w = gcn_norm(ei, None, n, add_self_loops=True)
            kw["edge_weight"] = w.to(ctx.dtype)
            m = dnn.GraphConv(F, F, norm="none", allow_zero_in_degree=True)
        else:
            m = dnn.SAGEConv(F, F, "mean")
        params = _dgl_params(name, _master_state(ctx, name))
        own = m.state_dict()
        if "bias" not in own and "fc_neigh.bias" in own:
            params["fc_neigh.bias"] = params.pop("bias")
        m.load_state_dict(params, strict=True)
        m.to(device=ctx.device, dtype=ctx.dtype)
        g = external.dgl_graph(ei, n)
        return _prepared(ctx, m, lambda m, x: m(g, x, **kw))
    return Impl("dgl[graph]", f"dgl.nn.pytorch.{DGL_LAYERS[name]} (as PyG {name}({settings}), "
                "PyG's parameters) on dgl.graph((src, dst), num_nodes=n) built once", build,
                available=external.dgl_reason)


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
            return _prepared(ctx, pyg(ctx), lambda m, x: m(x, ei))

        def build_pyg_csr(ctx):
            adj_t = csr_adj_t(torch, ctx.graph, ctx.dtype, torch.int64)
            return _prepared(ctx, pyg(ctx), lambda m, x: m(x, adj_t))

        def pyg(ctx):
            m = _pyg_layer(name, ctx.width)
            _load(m, _master_state(ctx, name), ctx.dtype, ctx.device, torch)
            return m

        out = [
            Impl("fastgnn[edge_index]", f"fastgnn.torch.{name}({settings}) on edge_index "
                 "(graph built once by fastgnn.torch.to_graph's cache)", build_fastgnn, fastgnn=True),
            Impl("pyg[edge_index]", f"torch_geometric.nn.{name}({settings}) on edge_index "
                 "(index_select + scatter message passing)", build_pyg, per_edge=True),
            Impl("pyg[csr adj_t]", f"torch_geometric.nn.{name}({settings}) on adj_t = "
                 "torch.sparse_csr_tensor (rows = targets, int64 indices, built once): fused "
                 "message_and_aggregate -> torch.sparse.mm", build_pyg_csr),
        ]
        comp = compiled_impl(ctx, f"{name}({settings})", pyg, [
            ("csr adj_t", lambda ctx: csr_adj_t(torch, ctx.graph, ctx.dtype, torch.int64)),
            ("edge_index", lambda ctx: ei)])
        dgl = dgl_layer_impl(ctx, name, settings)
        return out + [i for i in (comp, dgl) if i is not None]
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
