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

`drop_in_impls` makes these implementations for any drop-in layer; the
opt-in layer cases of cases_layers_extended.py use it with their own
constructors, forward arguments (edge features, relation types), further
PyG classes of the same function, and a reason where PyG lacks the CSR form.
"""
from __future__ import annotations

import time

from . import core, external
from .cases_spmm import clear_fastgnn_cache, fastgnn_paths
from .core import Case, Impl, Prepared, register
from .graphs import csr_adj_t, csr_by_target


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


def compiled_impl(ctx, layer, make, forms, args=None):
    """The PyG layer under torch.compile, or None unless --compile was given.

    make(ctx) -> the PyG module with the shared parameters loaded;
    forms: [(label, ctx -> graph input)] tried in order (PyG's fastest eager
    input form first); args(ctx) -> the forward arguments after (x, graph)
    (edge features, relation types), none by default. Compilation happens in
    build(), outside every timed call: a no-grad forward and a
    forward+backward, each twice (a cached layer recompiles once its cache is
    set); its seconds go to `compile_s`.
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
                more = tuple(args(ctx)) if args else ()
                cm = torch.compile(make(ctx), mode=mode, dynamic=dynamic)
                prep = _prepared(ctx, cm, lambda m, x, g=g, more=more: m(x, g, *more))
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


def sorted_edge_index(ctx):
    """PyG's EdgeIndex of the bench graph sorted by target (sort_order='col'),
    its cache filled (built outside timing)."""
    from torch_geometric import EdgeIndex
    torch = ctx.torch
    n = ctx.graph.num_nodes
    ptr, col = csr_by_target(torch, ctx.graph, torch.int64)
    dst = torch.repeat_interleave(torch.arange(n, device=ptr.device), ptr[1:] - ptr[:-1])
    eidx = EdgeIndex(torch.stack([col, dst]), sparse_size=(n, n), sort_order="col")
    eidx.fill_cache_()
    return eidx


def built_deterministic(torch, make):
    """make() under torch.use_deterministic_algorithms(True): PyG's aggregation
    modules read the switch once, at construction, and then reduce by the
    CSR offsets of a sorted EdgeIndex (torch._segment_reduce)."""
    prev = (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        torch.use_deterministic_algorithms(True)
        return make()
    finally:
        torch.use_deterministic_algorithms(prev[0], warn_only=prev[1])


PYG_EDGE_INDEX = "index_select + scatter message passing"
PYG_CSR_ADJ_T = ("adj_t = torch.sparse_csr_tensor (rows = targets, int64 indices, built once): "
                 "fused message_and_aggregate -> torch.sparse.mm")
SORTED = "an EdgeIndex sorted by target (sort_order='col', cache filled)"
# csc= forms of drop_in_impls: (impl name, how PyG runs on the sorted EdgeIndex)
PYG_CSC = {"fused": ("pyg[EdgeIndex csc]", f"on {SORTED}: fused message_and_aggregate "
                     "(the class sets SUPPORTS_FUSED_EDGE_INDEX) -> EdgeIndex matmul"),
           "segment": ("pyg[EdgeIndex csc,segment]", "built under torch.use_deterministic_"
                       "algorithms(True) (its aggregation then takes the ptr path) on "
                       f"{SORTED}: gather + torch._segment_reduce")}


def drop_in_impls(name, settings, pyg_make, fastgnn_make, *, layer=None, args=None,
                  args_note="", pyg_note=PYG_EDGE_INDEX, csr_skip=None, csc=None,
                  pyg_also=(), more=None):
    """ctx -> [Impl] of a layer case: fastgnn.torch's layer on edge_index, PyG's
    on edge_index and on a CSR adj_t, further PyG layers of the same function,
    PyG under torch.compile (--compile) and more(ctx)'s Impl (or None).

    name:          the case; the key of the shared parameters (`_master_state`)
    settings:      the constructor arguments as the report shows them
    pyg_make, fastgnn_make: ctx -> the layer, parameters not loaded yet
                   (pyg_make also builds the shared parameters)
    layer:         the class name in both libraries (default: name)
    args:          ctx -> the forward arguments after (x, graph) in the bench
                   dtype (edge features, relation types), drawn once per ctx;
                   args_note says what they are
    pyg_note:      how PyG's layer runs on edge_index, for the report
    csr_skip:      None: PyG also runs on a CSR adj_t (its fused path); else
                   why that form is not timed (the row is listed as skipped)
    csc:           "fused" / "segment": PyG also runs on a sorted EdgeIndex
                   (`PYG_CSC`; layers without further forward arguments)
    pyg_also:      [(class name, ctx -> layer, how it runs)]: PyG layers of
                   the same function and parameter names, timed on
                   edge_index as pyg[<class name>,edge_index]"""
    layer = layer or name
    if csc and args:
        raise ValueError(f"{name}: a sorted EdgeIndex reorders the edges; csc= takes no args")

    def impls(ctx):
        torch = ctx.torch
        ei = ctx.graph.edge_index
        more_args = tuple(args(ctx)) if args else ()

        def build_fastgnn(ctx):
            import fastgnn.torch as fgt
            m = fastgnn_make(ctx)
            note = _load(m, _master_state(ctx, name, pyg_make), ctx.dtype, ctx.device, torch)
            n = ctx.graph.num_nodes

            def paths():
                if not ctx.cuda:
                    return {"path": "cpu (numba)"}
                # the layer's graph comes from to_graph's cache (a hit while it lives)
                return fastgnn_paths(fgt.to_graph(ei, n))
            return _prepared(ctx, m, lambda m, x: m(x, ei, *more_args), note,
                             cleanup=lambda: clear_fastgnn_cache(fgt), extra_info=paths)

        def loaded(ctx, make=pyg_make):
            """(the layer with the shared parameters, a note when names differ)"""
            m = make(ctx)
            return m, _load(m, _master_state(ctx, name, pyg_make), ctx.dtype, ctx.device, torch)

        def on(graph_input, make=pyg_make):
            def build(ctx):
                m, note = loaded(ctx, make)
                g = graph_input(ctx)
                return _prepared(ctx, m, lambda m, x: m(x, g, *more_args), note)
            return build

        def pyg(ctx):
            return loaded(ctx)[0]

        def csr(ctx):
            return csr_adj_t(torch, ctx.graph, ctx.dtype, torch.int64)

        def edge_index(ctx):
            return ei

        out = [
            Impl("fastgnn[edge_index]", f"fastgnn.torch.{layer}({settings}) on edge_index"
                 f"{args_note} (graph built once by fastgnn.torch.to_graph's cache)",
                 build_fastgnn, fastgnn=True),
            Impl("pyg[edge_index]", f"torch_geometric.nn.{layer}({settings}) on edge_index"
                 f"{args_note} ({pyg_note})", on(edge_index), per_edge=True)]
        out += [Impl(f"pyg[{cls},edge_index]", f"torch_geometric.nn.{cls}({settings}) on "
                     f"edge_index{args_note}, {layer}'s parameters ({note})",
                     on(edge_index, make), per_edge=True) for cls, make, note in pyg_also]
        out.append(Impl("pyg[csr adj_t]", f"torch_geometric.nn.{layer}({settings}) on "
                        f"{PYG_CSR_ADJ_T}", on(csr), available=lambda: csr_skip))
        if csc:
            def build_csc(ctx):
                m, note = (built_deterministic(torch, lambda: loaded(ctx)) if csc == "segment"
                           else loaded(ctx))
                g = sorted_edge_index(ctx)
                return _prepared(ctx, m, lambda m, x: m(x, g), note)
            impl, how = PYG_CSC[csc]
            out.append(Impl(impl, f"torch_geometric.nn.{layer}({settings}) {how}", build_csc,
                            per_edge=csc == "segment"))
        forms = ([] if csr_skip else [("csr adj_t", csr)]) + [("edge_index", edge_index)]
        comp = compiled_impl(ctx, f"{layer}({settings})", pyg, forms, args)
        extra = more(ctx) if more else None
        return out + [i for i in (comp, extra) if i is not None]
    return impls


def layer_impls(name, settings):
    return drop_in_impls(name, settings, lambda ctx: _pyg_layer(name, ctx.width),
                         lambda ctx: _fastgnn_layer(name, ctx.width),
                         more=lambda ctx: dgl_layer_impl(ctx, name, settings))


def layer_reference(name, make=None, args=None):
    """The float32 PyG layer on edge_index with the shared parameters;
    make(ctx) builds the PyG layer (default: `_pyg_layer`); args(ctx) -> the
    forward arguments after (x, edge_index), float ones given in float32."""
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
        more = tuple(a.float() if a.is_floating_point() else a for a in args(ctx)) if args else ()
        return Prepared(lambda: m(x, ei, *more), [x])
    return ref


for _name, _settings, _desc in (
        ("GCNConv", "F, F, cached=True", "GCN layer: linear, then symmetric-normalised sum with self-loops"),
        ("SAGEConv", "F, F, aggr='mean'", "GraphSAGE layer: mean of neighbours + root weight"),
        ("GINConv", "nn=Linear-ReLU-Linear (F, F)", "GIN layer: MLP((1 + eps) x + sum of neighbours)")):
    register(Case(_name, "layer", "spmm", _desc, layer_impls(_name, _settings),
                  layer_reference(_name)))
