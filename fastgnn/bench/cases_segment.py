"""Cases of the reduction (segment) family: `segment_max`, `segment_mean`,
`segment_multi`, `segment_mul` (ops) and `SAGEConv_max` (layer).

    out[i] = reduce_{e = (j -> i)} x[j]        x: [n, F], out: [n, R*F]

segment_multi computes ["mean", "max", "min", "std"] in one call (PyG's
MultiAggregation, mode="cat"): out is [n, 4F], and its upstream gradient is
drawn [n, 4F] (the case replaces ctx.grad_out, seeded, before anything runs).

Op implementations:
  fastgnn                   fastgnn.torch.segment_reduce(graph, x, reduce) on a
                            graph built once by fastgnn.torch.to_graph
  fastgnn[nondeterministic] segment_max / segment_multi, GPU: the same with
                            deterministic=False (the max/min backward by float
                            atomics over the targets, no transpose walk for max)
  pyg-scatter[edge_index]   PyG's eager form: x.index_select(0, src), then
                            max: zeros.scatter_reduce_(amax, include_self=False)
                            (MaxAggregation without torch_scatter), mean:
                            torch_geometric.utils.scatter(mean), multi:
                            MultiAggregation([...])(x[src], index=dst)
  pyg-aggr[ptr]             PyG's aggregation module on edges sorted by target:
                            aggr(x[col], ptr=crow, dim_size=n), i.e.
                            torch._segment_reduce (no atomics)
  turbo-gnn[reduction_aggr] max only, GPU, when turbo_gnn imports (explicit
                            calls in bench.external, autotune off)
  dgl[copy_u_max|mean]      DGL's gspmm, when dgl imports

Layer SAGEConv_max: SAGEConv(F, F, aggr="max"), fastgnn.torch against PyG on
edge_index, on a CSR adj_t (PyG 2.8 raises NotImplementedError for max/min on
a CUDA torch.sparse tensor: recorded as unsupported) and on a col-sorted
EdgeIndex with a deterministic aggregation module (PyG's segment path).
On the GPU fastgnn[edge_index,nondeterministic] also runs the layer with
deterministic=False; the report's headline stays the default, bitwise
repeatable fastgnn row (the first one).

If fastgnn.torch.segment_reduce (or SAGEConv's aggr="max") is missing, the
fastgnn rows are recorded "unsupported" with the reason.
"""
from __future__ import annotations

import math
import statistics

from . import report
from .cases_layers import (_load, _prepared, built_deterministic, compiled_impl,
                           sorted_edge_index)
from . import external
from .cases_spmm import (clear_fastgnn_cache, dgl_reduce_impl, fastgnn_takes, reference_spmm,
                         spmm_floor)
from .core import Case, Impl, Prepared, register
from .graphs import csr_adj_t, csr_by_target

MULTI = ["mean", "max", "min", "std"]
OPS = {"segment_max": "max", "segment_mean": "mean", "segment_multi": MULTI, "segment_mul": "mul"}


def _nreduce(reduce):
    return 1 if isinstance(reduce, str) else len(reduce)


def _fgt_segment():
    """fastgnn.torch with segment_reduce, or NotImplementedError (-> 'unsupported')."""
    try:
        import fastgnn.torch as fgt
    except Exception as exc:  # noqa: BLE001
        raise NotImplementedError(f"fastgnn.torch not importable: {exc}") from exc
    if not hasattr(fgt, "segment_reduce"):
        raise NotImplementedError("fastgnn.torch.segment_reduce is not available (not supported "
                                  "by this fastgnn version)")
    return fgt


def _fastgnn_path(ctx):
    return {"path": "cuda (segment kernels)" if ctx.cuda else "cpu (numba)"}


def _grad_out(ctx, reduce):
    """Give ctx an upstream gradient of the op's width R*F (seeded, drawn once)."""
    torch = ctx.torch
    r = _nreduce(reduce)
    if r > 1 and ctx.grad_out.shape[1] != r * ctx.width:
        gen = torch.Generator(device=ctx.device).manual_seed(ctx.seed + 2)
        ctx.grad_out = torch.randn(ctx.graph.num_nodes, r * ctx.width, generator=gen,
                                   device=ctx.device).to(ctx.dtype)


def _sorted_csr(torch, ctx):
    """(ptr int64 [n+1], col int64 [E]): edges sorted by target (stable)."""
    return csr_by_target(torch, ctx.graph, torch.int64)


# ------------------------------------------------------------ reference


def reference_segment(torch, ctx, reduce, x, chunk=1 << 22):
    """float32 chunked gather + index_add_ / scatter_reduce (autograd-capable),
    PyG's definitions (empty rows 0, mul 1; std = sqrt(clamp(var, 1e-5)), 0 below)."""
    names = [reduce] if isinstance(reduce, str) else list(reduce)
    ei = ctx.graph.edge_index
    n, f = ctx.graph.num_nodes, x.shape[1]
    deg = torch.bincount(ei[1], minlength=n).to(x.dtype)[:, None]
    need = set(names)
    s = sq = mx = mn = None
    if need & {"mean", "sum", "var", "std"}:
        s = x.new_zeros(n, f)
    if need & {"var", "std"}:
        sq = x.new_zeros(n, f)
    if "max" in need:
        mx = x.new_full((n, f), -math.inf)
    if "min" in need:
        mn = x.new_full((n, f), math.inf)
    pr = x.new_ones(n, f) if "mul" in need else None
    for b in range(0, ei.shape[1], chunk):
        src, dst = ei[0, b:b + chunk], ei[1, b:b + chunk]
        msg = x.index_select(0, src)
        idx = dst[:, None].expand(-1, f)
        if s is not None:
            s = s.index_add(0, dst, msg)
        if sq is not None:
            sq = sq.index_add(0, dst, msg * msg)
        if mx is not None:
            mx = mx.scatter_reduce(0, idx, msg, reduce="amax", include_self=True)
        if mn is not None:
            mn = mn.scatter_reduce(0, idx, msg, reduce="amin", include_self=True)
        if pr is not None:
            pr = pr.scatter_reduce(0, idx, msg, reduce="prod", include_self=True)
    has = deg > 0
    d1 = deg.clamp(min=1)
    outs = []
    for r in names:
        if r == "sum":
            outs.append(s)
        elif r == "mean":
            outs.append(s / d1)
        elif r == "max":
            outs.append(torch.where(has, mx, torch.zeros_like(mx)))
        elif r == "min":
            outs.append(torch.where(has, mn, torch.zeros_like(mn)))
        elif r == "mul":
            outs.append(pr)
        else:
            var = sq / d1 - (s / d1) ** 2
            if r == "var":
                outs.append(var)
            else:
                std = var.clamp(min=1e-5).sqrt()
                outs.append(std.masked_fill(std <= math.sqrt(1e-5), 0.0))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


def segment_reference(reduce):
    def ref(ctx):
        _grad_out(ctx, reduce)
        x = ctx.leaf(ctx.x_ref)
        if reduce == "mean":
            return Prepared(lambda: reference_spmm(ctx.torch, ctx, "mean", x), [x])
        return Prepared(lambda: reference_segment(ctx.torch, ctx, reduce, x), [x])
    return ref


def segment_floor(reduce):
    """ctx -> (fwd bytes, fwd+bwd bytes). Fewest bytes: read x once, write the
    R output blocks once, read indptr + indices once (spmm_floor plus R-1 more
    output blocks); the backward moves
    the same (read the R gradient blocks, write grad_x, read the transpose).
    Residuals (argmax/argmin positions) are not counted: a lower bound."""
    def floor(ctx):
        one = spmm_floor(ctx)[0]
        one += (_nreduce(reduce) - 1) * ctx.graph.num_nodes * ctx.width * ctx.x.element_size()
        return one, 2 * one
    return floor


# ------------------------------------------------------------ op implementations


def _pyg_aggr(reduce):
    from torch_geometric.nn import aggr as paggr
    if not isinstance(reduce, str):
        return paggr.MultiAggregation(list(reduce))
    return {"max": paggr.MaxAggregation, "min": paggr.MinAggregation,
            "mean": paggr.MeanAggregation, "sum": paggr.SumAggregation,
            "std": paggr.StdAggregation, "var": paggr.VarAggregation,
            "mul": paggr.MulAggregation}[reduce]()


def segment_impls(reduce):
    label = reduce if isinstance(reduce, str) else list(reduce)

    def impls(ctx):
        torch = ctx.torch
        _grad_out(ctx, reduce)
        n = ctx.graph.num_nodes
        out = []

        def build_fastgnn(ctx, det=None):
            fgt = _fgt_segment()
            g = fgt.to_graph(ctx.graph.edge_index, n)
            x = ctx.leaf()
            kw = {} if det is None else {"deterministic": det}
            return Prepared(lambda: fgt.segment_reduce(g, x, reduce, **kw), [x],
                            lambda: _fastgnn_path(ctx), cleanup=lambda: clear_fastgnn_cache(fgt))
        graph_note = ("graph = fastgnn.torch.to_graph(edge_index) built once (CSR by target, "
                      "int32 indices, cached transpose)")
        out.append(Impl("fastgnn", f"fastgnn.torch.segment_reduce(graph, x, {label!r}); "
                        + graph_note, build_fastgnn, fastgnn=True))
        names = [reduce] if isinstance(reduce, str) else reduce
        if ctx.cuda and {"max", "min"} & set(names) and fastgnn_takes("segment_reduce"):
            out.append(Impl("fastgnn[nondeterministic]",
                            f"fastgnn.torch.segment_reduce(graph, x, {label!r}, "
                            f"deterministic=False); {graph_note}; max/min backward with float "
                            "atomics", lambda ctx: build_fastgnn(ctx, False), fastgnn=True))

        def build_scatter(ctx):
            x = ctx.leaf()
            src, dst = ctx.graph.edge_index[0], ctx.graph.edge_index[1]
            f = ctx.width
            if reduce in ("max", "min"):
                how = f"zeros.scatter_reduce_(a{reduce}, include_self=False)"

                def fwd():
                    msg = x.index_select(0, src)
                    return msg.new_zeros(n, f).scatter_reduce_(
                        0, dst[:, None].expand_as(msg), msg, reduce="a" + reduce,
                        include_self=False)
            elif isinstance(reduce, str):
                from torch_geometric.utils import scatter
                how = "torch_geometric.utils.scatter"
                fwd = lambda: scatter(x.index_select(0, src), dst, 0, dim_size=n,  # noqa: E731
                                      reduce=reduce)
            else:
                aggr = _pyg_aggr(reduce).to(ctx.device)
                how = "torch_geometric.nn.aggr.MultiAggregation(index=dst)"
                fwd = lambda: aggr(x.index_select(0, src), index=dst, dim_size=n)  # noqa: E731
            return Prepared(fwd, [x], lambda: {"scatter": how})
        if reduce in ("max", "min"):
            s_set = (f"x.index_select(0, edge_index[0]) then x.new_zeros(n, F).scatter_reduce_(0, "
                     f"edge_index[1] (broadcast), msg, reduce='a{reduce}', include_self=False), as "
                     f"PyG's {reduce.capitalize()}Aggregation does without torch_scatter")
        elif isinstance(reduce, str):
            s_set = ("x.index_select(0, edge_index[0]) then torch_geometric.utils.scatter(msg, "
                     f"edge_index[1], reduce={reduce!r})")
        else:
            s_set = (f"torch_geometric.nn.aggr.MultiAggregation({label!r})(x[edge_index[0]], "
                     "index=edge_index[1], dim_size=n) (mode='cat')")
        out.append(Impl("pyg-scatter[edge_index]", s_set + " (materialises [E, F] messages)",
                        build_scatter, per_edge=True))

        def build_ptr(ctx):
            aggr = _pyg_aggr(reduce).to(ctx.device)
            ptr, col = _sorted_csr(torch, ctx)
            x = ctx.leaf()
            return Prepared(lambda: aggr(x.index_select(0, col), ptr=ptr, dim_size=n), [x])
        name = ("MultiAggregation(%r)" % label if not isinstance(reduce, str)
                else f"{reduce.capitalize()}Aggregation()")
        out.append(Impl("pyg-aggr[ptr]", f"torch_geometric.nn.aggr.{name}(x[col], ptr=crow, "
                        "dim_size=n) with edges sorted by target (crow/col int64, built once): "
                        "PyG's segment path (torch._segment_reduce), gather still materialised",
                        build_ptr, per_edge=True))

        if ctx.cuda and reduce in ("max", "min"):
            def build_turbo(ctx):
                g = external.turbo_graph(torch, ctx.graph.edge_index, n)
                x = ctx.leaf()
                return Prepared(lambda: external.turbo_reduction(g, x, reduce), [x])
            out.append(Impl("turbo-gnn[reduction_aggr]",
                            f"turbo_gnn.ops.reduction_aggr(g, x, reduce={reduce!r}); g = "
                            f"{external.TURBO_GRAPH}; {external.TURBO_SETTINGS}", build_turbo,
                            devices=("cuda",), available=external.turbo_gnn_reason))
        if reduce in ("max", "min", "mean", "sum"):
            out.append(dgl_reduce_impl(reduce))
        return out
    return impls


for _name, _reduce, _default, _desc in (
        ("segment_max", "max", True, "out[i] = max_(j->i) x[j] (0 for empty rows)"),
        ("segment_mean", "mean", False, "out[i] = mean_(j->i) x[j] (reduction-family kernel)"),
        ("segment_multi", MULTI, True, "[mean | max | min | std]_(j->i) x[j] in one call, "
         "out [n, 4F] (PyG MultiAggregation)"),
        ("segment_mul", "mul", False, "out[i] = prod_(j->i) x[j] (1 for empty rows; PyG "
         "MulAggregation, which takes no ptr)")):
    register(Case(_name, "op", "segment", _desc, segment_impls(_reduce),
                  segment_reference(_reduce), segment_floor(_reduce), default=_default))


# ------------------------------------------------------------ layer: SAGEConv(aggr="max")


def _pyg_sage_max(width):
    from torch_geometric import nn as pnn
    return pnn.SAGEConv(width, width, aggr="max")


def _sage_state(ctx):
    torch = ctx.torch
    key = ("master", "SAGEConv_max")
    if key not in ctx.state:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(ctx.seed)
            layer = _pyg_sage_max(ctx.width)
        ctx.state[key] = {k: v.detach().clone() for k, v in layer.state_dict().items()}
    return ctx.state[key]


def sage_max_impls(ctx):
    torch = ctx.torch
    ei = ctx.graph.edge_index

    def build_fastgnn(ctx, deterministic=True):
        try:
            import fastgnn.torch as fgt
            kw = {} if deterministic else {"deterministic": False}
            m = fgt.SAGEConv(ctx.width, ctx.width, aggr="max", **kw)
        except (ImportError, AttributeError) as exc:
            raise NotImplementedError(f"fastgnn.torch.SAGEConv(aggr='max') not supported: "
                                      f"{exc}") from exc
        note = _load(m, _sage_state(ctx), ctx.dtype, ctx.device, torch)
        return _prepared(ctx, m, lambda m, x: m(x, ei), note,
                         cleanup=lambda: clear_fastgnn_cache(fgt),
                         extra_info=lambda: _fastgnn_path(ctx))

    def pyg(ctx):
        m = _pyg_sage_max(ctx.width)
        _load(m, _sage_state(ctx), ctx.dtype, ctx.device, torch)
        return m

    def build_pyg(ctx):
        return _prepared(ctx, pyg(ctx), lambda m, x: m(x, ei))

    def build_pyg_csr(ctx):
        m = pyg(ctx)
        adj_t = csr_adj_t(torch, ctx.graph, ctx.dtype, torch.int64)
        return _prepared(ctx, m, lambda m, x: m(x, adj_t))

    def build_pyg_sorted(ctx):
        m = built_deterministic(torch, lambda: pyg(ctx))
        eidx = sorted_edge_index(ctx)
        return _prepared(ctx, m, lambda m, x: m(x, eidx))

    settings = "F, F, aggr='max'"
    nondet = []
    if ctx.cuda and fastgnn_takes("segment_reduce"):
        nondet.append(Impl("fastgnn[edge_index,nondeterministic]",
                           f"fastgnn.torch.SAGEConv({settings}, deterministic=False) on "
                           "edge_index: the max backward adds its gradient with float atomics",
                           lambda ctx: build_fastgnn(ctx, False), fastgnn=True))
    return [
        Impl("fastgnn[edge_index]", f"fastgnn.torch.SAGEConv({settings}) on edge_index (graph "
             "built once by fastgnn.torch.to_graph's cache)", build_fastgnn, fastgnn=True),
    ] + nondet + [
        Impl("pyg[edge_index]", f"torch_geometric.nn.SAGEConv({settings}) on edge_index "
             "(index_select + scatter_reduce amax)", build_pyg, per_edge=True),
        Impl("pyg[csr adj_t]", f"torch_geometric.nn.SAGEConv({settings}) on adj_t = "
             "torch.sparse_csr_tensor (rows = targets, int64): message_and_aggregate -> "
             "torch.sparse.mm(adj_t, x, 'max'), CPU only (PyG 2.8 raises NotImplementedError "
             "for max on CUDA sparse tensors)", build_pyg_csr),
        Impl("pyg[EdgeIndex csc,segment]", f"torch_geometric.nn.SAGEConv({settings}) built under "
             "torch.use_deterministic_algorithms(True) (its MaxAggregation then takes the ptr "
             "path) on an EdgeIndex sorted by target (sort_order='col', cache filled): gather + "
             "torch._segment_reduce", build_pyg_sorted, per_edge=True),
    ] + [i for i in (compiled_impl(ctx, f"SAGEConv({settings})", pyg,
                                   [("edge_index", lambda ctx: ei)]),) if i is not None]


def sage_max_reference(ctx):
    torch = ctx.torch
    m = _pyg_sage_max(ctx.width)
    state = {k: (v.to(ctx.dtype).float() if v.is_floating_point() else v)
             for k, v in _sage_state(ctx).items()}
    m.load_state_dict(state)
    m.to(device=ctx.device, dtype=torch.float32)
    x = ctx.leaf(ctx.x_ref)
    ei = ctx.graph.edge_index
    return Prepared(lambda: m(x, ei), [x])


register(Case("SAGEConv_max", "layer", "segment",
              "GraphSAGE layer with max aggregation + root weight",
              sage_max_impls, sage_max_reference))


# ------------------------------------------------------------ report lines

MULTI_TARGET = 1.5      # target: the fused multi costs <= 1.5x a single max
SAGE_MEDIAN_TARGET = 5.0


def _headline(r):
    """A default fastgnn record (not the opt-in nondeterministic rows)."""
    return r["fastgnn"] and "nondeterministic" not in r["impl"]


def _fastgnn_rec(recs, case):
    return next((r for r in recs if r["case"] == case and _headline(r)), None)


def segment_summary(records):
    """Markdown lines: fused multi / single max per graph and dtype, and the
    SAGEConv_max acceptance metric (median fwd+bwd speedup over PyG's fastest form)."""
    lines = []
    by = {}
    for r in records:
        if r.get("family") == "segment":
            by.setdefault((r["graph"], r["dtype"], r["width"]), []).append(r)
    rows = []
    for (g, d, w), recs in by.items():
        mx, mu = _fastgnn_rec(recs, "segment_max"), _fastgnn_rec(recs, "segment_multi")
        if mx is None or mu is None:
            continue
        rat = {}
        for k in ("fwd_ms", "fwd_bwd_ms"):
            rat[k] = mu[k] / mx[k] if mu.get(k) and mx.get(k) else None
        ok = [v <= MULTI_TARGET for v in rat.values() if v is not None]
        if not ok:
            continue
        rows.append(f"| {g} | {d} | {w} | {_ratio(rat['fwd_ms'])} | {_ratio(rat['fwd_bwd_ms'])} | "
                    f"{'yes' if all(ok) else 'no'} |")
    if rows:
        lines += ["## Reduction family: fused multi / single max", "",
                  f"fastgnn `segment_multi` ({' '.join(MULTI)} in one call) time / fastgnn "
                  f"`segment_max` time (target <= {MULTI_TARGET:g}x).", "",
                  "| graph | dtype | F | multi/max fwd | multi/max fwd+bwd "
                  f"| <= {MULTI_TARGET:g}x |", "|---|---|---|---|---|---|"] + rows + [""]
    sage = {}
    for r in records:
        if r["case"] == "SAGEConv_max" and _headline(r):
            sage.setdefault((r["dtype"], r["width"]), []).append(r)
    sage_lines = []
    for (d, w), recs in sage.items():
        sp = [(r["graph"], r.get("speedup_fwd_bwd")) for r in recs]
        got = [v for _, v in sp if v is not None]
        per = ", ".join(f"{g} {_ratio(v)}" for g, v in sp)
        if got:
            med, low = statistics.median(got), min(got)
            verdict = ("met" if med >= SAGE_MEDIAN_TARGET and low >= 1 and len(got) == len(sp)
                       else "not met")
            head = (f"median {med:.2f}x, min {low:.2f}x over {len(got)} graph(s): "
                    f"target (median >= {SAGE_MEDIAN_TARGET:g}x, none < 1x) {verdict}")
        else:
            head = "no fastgnn fwd+bwd measurement"
        sage_lines.append(f"- {d} F={w}: {head} ({per})")
    if sage_lines:
        lines += ["## SAGEConv(aggr='max') forward+backward vs PyG's fastest input form", "",
                  "fastgnn's `SAGEConv_max` fwd+bwd speedup over the fastest PyG row (edge_index, "
                  "CSR adj_t or sorted EdgeIndex) per graph; target: median >= "
                  f"{SAGE_MEDIAN_TARGET:g}x and no graph below 1x.", ""] + sage_lines + [""]
    return lines


def _ratio(v):
    return "-" if v is None else f"{v:.2f}x"


report.SUMMARIES.append(segment_summary)
