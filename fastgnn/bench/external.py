"""Explicit calls into the optional third-party baselines: turbo-gnn and DGL.

Neither is a dependency of fastgnn: each is imported inside the builders, an
`Impl(available=...)` reason says why it cannot run here, and no code of
theirs is copied. Every call is spelled out against the library's documented
signature (nothing is guessed from parameter names): a call that does not fit
fails loudly and its reason lands in the record.

turbo-gnn 0.1.0rc4 (`turbo_gnn.ops`, `turbo_gnn.graph`):

    graph = AdjacencyForwardBackwardWithNodeBuckets.from_edge_list(
                edge_index,        # [2, E] int64, CUDA
                num_nodes, quantile=0.99, index_dtype=torch.int32)
    gatv2_aggr(graph, x, x_neighbors, attention_weights, negative_slope)
        x: destination side [N, H, D], x_neighbors: source side [N, H, D]
        (the messages), attention_weights [H, D]            -> [N, H, D]
        (0.1.0rc4 returns [N, H, D] although its docstring says [N, H*D])
    graph_transformer_aggr(graph, x, Q, K, V, scale)
        x [N, F] shape only; Q indexed by the SOURCE u, K by the destination
        v (score = Q[u] . K[v]); V [N, H, D]                 -> [N, H, D]
    reduction_aggr(graph, X, reduce="min" | "max")          -> [N, F]
    spmm_aggr(x, forward_indptr, forward_indices, norm_type, algorithm, block_dim)
        norm_type "none" (sum) / "right" (mean), int32 indices only

The ops functions are wrapped by turbo-gnn's autotune decorator; the bench
never passes `autotune=True`, so they run with their default kernel
parameters (TURBO_SETTINGS).

DGL (`dgl.ops`, `dgl.nn.pytorch`): gspmm-style ops (copy_u_sum / _mean /
_max, u_add_v, u_dot_v, u_mul_e_sum), edge_softmax, and the GraphConv /
SAGEConv layers, on `dgl.graph((src, dst), num_nodes=n)`.
"""
from __future__ import annotations

TURBO_SETTINGS = "autotune off (default kernel parameters), int32 indices"
TURBO_GRAPH = ("AdjacencyForwardBackwardWithNodeBuckets.from_edge_list(edge_index, n, "
               "quantile=0.99, index_dtype=torch.int32) built once")
SPMM_BLOCK_DIM = 256
SPMM_NORM = {"sum": "none", "mean": "right"}


def _import_reason(module: str) -> str | None:
    try:
        __import__(module)
    except Exception as exc:  # noqa: BLE001 - any import failure is a reason
        text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
        return f"{module} not importable ({text[:160]})"
    return None


def turbo_gnn_reason() -> str | None:
    return _import_reason("turbo_gnn")


def dgl_reason() -> str | None:
    return _import_reason("dgl")


# ------------------------------------------------------------ turbo-gnn


def turbo_graph(torch, edge_index, num_nodes):
    """turbo-gnn's dual-CSR graph with int32 indices."""
    from turbo_gnn.graph import AdjacencyForwardBackwardWithNodeBuckets
    return AdjacencyForwardBackwardWithNodeBuckets.from_edge_list(
        edge_index, num_nodes, quantile=0.99, index_dtype=torch.int32)


def turbo_spmm(torch, graph, x, reduce):
    """sum / mean aggregation by cached cuSPARSE: x [N, F] -> [N, F].

    float32 only: turbo-gnn's cuSPARSE matrix holds float32 values, which
    cuSPARSE does not combine with 16-bit dense operands, and its
    CHECK_CUSPARSE calls exit() on such an error (it would end the whole
    run), so other dtypes are refused here, not attempted."""
    if x.dtype != torch.float32:
        raise NotImplementedError(
            f"turbo_gnn spmm_aggr with {x.dtype} is not attempted: float32 cuSPARSE matrix "
            "values with 16-bit dense operands are not supported by cuSPARSE, and turbo-gnn "
            "exits the process on a cuSPARSE error")
    from turbo_gnn.ops import spmm_aggr
    return spmm_aggr(x, graph.forward_indptr, graph.forward_indices, SPMM_NORM[reduce], -1,
                     SPMM_BLOCK_DIM)


def turbo_gatv2(graph, xl, xr, att, negative_slope):
    """fastgnn's gatv2 naming: xl = source side (messages), xr = target side.
    [N, H, C] x2, [H, C] -> [N, H, C]."""
    from turbo_gnn.ops import gatv2_aggr
    return gatv2_aggr(graph, xr, xl, att, negative_slope=negative_slope)


def turbo_transformer(graph, q, k, v, scale):
    """fastgnn's dot naming: q = target queries, k / v = source keys / values.
    turbo-gnn indexes its Q by the source, so Q = k and K = q. -> [N, H, C]."""
    from turbo_gnn.ops import graph_transformer_aggr
    return graph_transformer_aggr(graph, q.flatten(1), k, q, v, scale=scale)


def turbo_reduction(graph, x, reduce):
    """min / max over in-neighbours (0 for empty rows): [N, F] -> [N, F]."""
    from turbo_gnn.ops import reduction_aggr
    return reduction_aggr(graph, x, reduce=reduce)


# ------------------------------------------------------------ DGL


def dgl_graph(edge_index, num_nodes):
    import dgl
    return dgl.graph((edge_index[0], edge_index[1]), num_nodes=num_nodes)


def dgl_reduce(graph, x, reduce):
    """copy_u_<reduce>: out[i] = reduce_(j->i) x[j] (DGL gives 0 to empty rows)."""
    import dgl
    return getattr(dgl.ops, f"copy_u_{reduce}")(graph, x)


def dgl_attention(torch, graph, score, ts, slope):
    """The attention aggregations of cases_attention with dgl.ops + edge_softmax;
    ts in cases_attention.NAMES order. Returns [N, H*C]."""
    import dgl
    import torch.nn.functional as Fn
    from dgl.nn.functional import edge_softmax
    if score == "gatv2":
        xl, xr, att = ts
        e = Fn.leaky_relu(dgl.ops.u_add_v(graph, xl, xr), slope)       # [E, H, C]
        s = (e * att).sum(-1, keepdim=True)                              # [E, H, 1]
        msg = xl
    elif score == "dot":
        q, k, v = ts
        s = dgl.ops.u_dot_v(graph, k, q) / q.shape[-1] ** 0.5            # [E, H, 1]
        msg = v
    else:
        v, a_src, a_dst = ts
        s = Fn.leaky_relu(dgl.ops.u_add_v(graph, a_src, a_dst), slope).unsqueeze(-1)
        msg = v
    out = dgl.ops.u_mul_e_sum(graph, msg, edge_softmax(graph, s))
    return out.reshape(out.shape[0], -1)
