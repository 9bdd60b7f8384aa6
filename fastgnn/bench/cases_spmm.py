"""Op-level cases of the SpMM family: `spmm_sum` (default) and `spmm_mean`.

    out[i] = reduce_{e = (j -> i)} x[j]        x: [n, F], out: [n, F]

Implementations:
  fastgnn[auto|cusparse|custom]  fastgnn.torch.spmm on a prebuilt fastgnn Graph
                                 (forced paths on the GPU only)
  torch.sparse.mm[csr]           cuSPARSE / MKL through torch on a CSR tensor
  pyg-scatter[edge_index]        PyG's eager message passing: x.index_select
                                 then torch_geometric.utils.scatter
  turbo-gnn[spmm_aggr]           cached cuSPARSE (GPU, float32, when turbo_gnn
                                 imports; explicit calls in bench.external)
  dgl[copy_u_sum|mean]           DGL's gspmm, when dgl imports

The float32 reference is a chunked gather / index_add_ (exact summation order
does not matter at the tolerances reported; memory stays bounded).
"""
from __future__ import annotations

import inspect

from . import external
from .core import Case, Impl, Prepared, register
from .graphs import csr_adj_t

# ------------------------------------------------------------ helpers


def fastgnn_torch():
    """The fastgnn.torch module, or raise ImportError with the reason."""
    import fastgnn.torch as fgt
    if not hasattr(fgt, "spmm"):
        raise ImportError("fastgnn.torch has no spmm yet")
    return fgt


def fastgnn_paths(graph) -> dict:
    """{'path': ..., 'path_bwd': ...}: the CUDA paths chosen so far, read from
    the plans recorded in `graph.cache` (keys starting with "spmm_plan", values
    with a `.path`) of the graph, of graphs derived from it and cached on it
    (self-loop / GCN graphs) and of their transposes (the backward passes)."""
    found = {"path": set(), "path_bwd": set()}
    seen = set()

    def graphs_in(val, depth=0):
        if hasattr(val, "cache") and hasattr(val, "indptr"):
            yield val
        elif isinstance(val, (tuple, list)) and depth < 2:
            for v in val:
                yield from graphs_in(v, depth + 1)

    def walk(g, transposed):
        if id(g) in seen:
            return
        seen.add(id(g))
        for key, val in list(getattr(g, "cache", {}).items()):
            k0 = key[0] if isinstance(key, tuple) and key else key
            if isinstance(k0, str) and k0.startswith("spmm_plan"):
                p = getattr(val, "path", None)
                if p is not None:
                    opt = getattr(val, "option", None)
                    found["path_bwd" if transposed else "path"].add(
                        f"{p}:{opt}" if opt is not None else str(p))
            elif key == "transpose":
                walk(val, not transposed)
            else:
                for sub in graphs_in(val):
                    walk(sub, transposed)
    walk(graph, False)
    return {k: ",".join(sorted(v)) for k, v in found.items() if v}


def clear_fastgnn_cache(fgt):
    """Drop fastgnn.torch's graph cache so that the next implementation's peak
    memory does not carry fastgnn's structures."""
    fn = getattr(fgt, "clear_graph_cache", None)
    if fn is None:
        fn = getattr(getattr(fgt, "graph_cache", None), "clear_graph_cache", None)
    if fn is not None:
        fn()


def _forced_path(path, vtype_is_bf16):
    if path == "cusparse" and vtype_is_bf16:
        return "custom (cuSPARSE path takes no bf16: falls back)"
    return path


def reference_spmm(torch, ctx, reduce, x, chunk=1 << 22):
    """float32 gather + index_add_ over edge chunks (autograd-capable)."""
    ei = ctx.graph.edge_index
    n = ctx.graph.num_nodes
    out = torch.zeros(n, x.shape[1], dtype=x.dtype, device=x.device)
    for s in range(0, ei.shape[1], chunk):
        src, dst = ei[0, s:s + chunk], ei[1, s:s + chunk]
        out = out.index_add(0, dst, x.index_select(0, src))
    if reduce == "mean":
        deg = torch.bincount(ei[1], minlength=n).clamp(min=1).to(x.dtype)
        out = out / deg[:, None]
    return out


def fastgnn_takes(fn, keyword="deterministic"):
    """Whether fastgnn.torch.<fn> exists and takes `keyword` (e.g. the core's
    `deterministic` switch); False when fastgnn.torch does not import."""
    try:
        import fastgnn.torch as fgt
        return keyword in inspect.signature(getattr(fgt, fn)).parameters
    except Exception:  # noqa: BLE001
        return False


def dgl_reduce_impl(reduce):
    """DGL's gspmm (dgl.ops.copy_u_<reduce>) on a DGL graph built once."""
    def build(ctx):
        g = external.dgl_graph(ctx.graph.edge_index, ctx.graph.num_nodes)
        x = ctx.leaf()
        return Prepared(lambda: external.dgl_reduce(g, x, reduce), [x])
    return Impl(f"dgl[copy_u_{reduce}]", f"dgl.ops.copy_u_{reduce}(g, x) (gspmm) on "
                "g = dgl.graph((src, dst), num_nodes=n) built once", build,
                available=external.dgl_reason)


# ------------------------------------------------------------ implementations


def spmm_impls(reduce):
    def impls(ctx):
        torch = ctx.torch
        bf16 = ctx.dtype == torch.bfloat16
        out = []

        variants = [("auto", None)]
        if ctx.cuda:
            variants += [("cusparse", None), ("custom", None)]
            if fastgnn_takes("spmm"):
                variants.append(("auto", False))
        for path, det in variants:
            def build(ctx, path=path, det=det):
                fgt = fastgnn_torch()
                g = fgt.to_graph(ctx.graph.edge_index, ctx.graph.num_nodes)
                x = ctx.leaf()
                kw = {} if det is None else {"deterministic": det}

                def info():
                    d = fastgnn_paths(g) if path == "auto" else {}
                    if path != "auto":
                        d["path"] = _forced_path(path, bf16)
                    elif "path" not in d:
                        d["path"] = "auto" if ctx.cuda else "cpu (numba)"
                    return d
                return Prepared(lambda: fgt.spmm(g, x, reduce=reduce, path=path, **kw), [x], info,
                                cleanup=lambda: clear_fastgnn_cache(fgt))
            tag = path if det is None else f"{path},nondeterministic"
            extra = "" if det is None else ", deterministic=False"
            out.append(Impl(f"fastgnn[{tag}]",
                            f"fastgnn.torch.spmm(graph, x, reduce={reduce!r}, path={path!r}{extra}); "
                            "graph = fastgnn.torch.to_graph(edge_index) built once (CSR by "
                            "target, int32 indices, cached transpose and plans)",
                            build, fastgnn=True))

        def build_sparse(ctx):
            x = ctx.leaf()
            err = None
            for idx in (None, torch.int64):        # int32 indices first, int64 if refused
                A = csr_adj_t(torch, ctx.graph, ctx.dtype, idx)
                try:
                    with torch.no_grad():
                        torch.sparse.mm(A, x.detach()[:, :1].contiguous())
                    break
                except Exception as exc:  # noqa: BLE001
                    err = exc
                    A = None
            if A is None:
                raise err
            if reduce == "sum":
                fwd = lambda: torch.sparse.mm(A, x)  # noqa: E731
            else:
                crow = A.crow_indices()
                deg = (crow[1:] - crow[:-1]).clamp(min=1).to(ctx.dtype)[:, None]
                fwd = lambda: torch.sparse.mm(A, x) / deg  # noqa: E731
            return Prepared(fwd, [x], lambda: {"index_dtype": str(A.crow_indices().dtype)})
        out.append(Impl("torch.sparse.mm[csr]",
                        "torch.sparse.mm(A, x) with A = torch.sparse_csr_tensor (rows = "
                        "targets, values = ones in x's dtype, int32 indices, int64 if "
                        "refused), built once" + ("; mean = sum / clamp(deg, 1)" if reduce == "mean" else ""),
                        build_sparse))

        def build_scatter(ctx):
            try:
                from torch_geometric.utils import scatter
                how = "torch_geometric.utils.scatter"
            except Exception:  # noqa: BLE001
                scatter = None
                how = "index_add_"
            x = ctx.leaf()
            src, dst = ctx.graph.edge_index[0], ctx.graph.edge_index[1]
            n = ctx.graph.num_nodes
            if scatter is not None:
                fwd = lambda: scatter(x.index_select(0, src), dst, 0, dim_size=n, reduce=reduce)  # noqa: E731
            else:
                def fwd():
                    o = x.new_zeros(n, x.shape[1]).index_add_(0, dst, x.index_select(0, src))
                    if reduce == "mean":
                        o = o / torch.bincount(dst, minlength=n).clamp(min=1)[:, None].to(o.dtype)
                    return o
            return Prepared(fwd, [x], lambda: {"scatter": how})
        out.append(Impl("pyg-scatter[edge_index]",
                        "PyG eager message passing: x.index_select(0, edge_index[0]) then "
                        f"torch_geometric.utils.scatter(..., edge_index[1], reduce={reduce!r}) "
                        "(materialises [E, F] messages)", build_scatter, per_edge=True))

        if ctx.cuda:
            def build_turbo(ctx):
                g = external.turbo_graph(torch, ctx.graph.edge_index, ctx.graph.num_nodes)
                x = ctx.leaf()
                return Prepared(lambda: external.turbo_spmm(torch, g, x, reduce), [x])
            out.append(Impl("turbo-gnn[spmm_aggr]",
                            f"turbo_gnn.ops.spmm_aggr(x, g.forward_indptr, g.forward_indices, "
                            f"{external.SPMM_NORM[reduce]!r}, -1, {external.SPMM_BLOCK_DIM}) "
                            f"(cached cuSPARSE, float32 only); g = {external.TURBO_GRAPH}; "
                            f"{external.TURBO_SETTINGS}", build_turbo, devices=("cuda",),
                            available=external.turbo_gnn_reason))
        out.append(dgl_reduce_impl(reduce))
        return out
    return impls


def spmm_reference(reduce):
    def ref(ctx):
        x = ctx.leaf(ctx.x_ref)
        return Prepared(lambda: reference_spmm(ctx.torch, ctx, reduce, x), [x])
    return ref


def spmm_floor(ctx):
    """Fewest bytes: read x once, write out once, read indptr + indices; the
    backward does the same over the transpose (grad_out in, grad_x out)."""
    g = ctx.graph
    n, E, F = g.num_nodes, g.stats["num_edges"], ctx.width
    vb = ctx.x.element_size()
    ib = g.index_bytes
    one = 2 * n * F * vb + (n + 1) * ib + E * ib
    return one, 2 * one


for _reduce, _default in (("sum", True), ("mean", False)):
    register(Case(f"spmm_{_reduce}", "op", "spmm",
                  f"out[i] = {_reduce}_(j->i) x[j] (neighbour aggregation, no weights)",
                  spmm_impls(_reduce), spmm_reference(_reduce), spmm_floor, default=_default))
