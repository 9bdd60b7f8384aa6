"""Float64 NumPy twins of every op: the test oracle, written from the math on
the caller's edge list (not on fastgnn's CSR), so they share no code with the
backends they check."""
import numpy as np


def _f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


def spmm(edge_index, x, edge_weight=None, reduce="sum", num_dst=None):
    """out[i] = s_i * sum_{e=(j->i)} w_e x[j]; s_i = 1 or 1/deg_in(i)."""
    src, dst = np.asarray(edge_index)
    x = _f64(x)
    num_dst = x.shape[0] if num_dst is None else num_dst
    w = np.ones(src.shape[0]) if edge_weight is None else _f64(edge_weight)
    out = np.zeros((num_dst, x.shape[1]))
    np.add.at(out, dst, w[:, None] * x[src])
    if reduce == "mean":
        deg = np.bincount(dst, minlength=num_dst)
        out /= np.maximum(deg, 1)[:, None]
    return out


def spmm_vjp(edge_index, x, edge_weight, reduce, grad_out):
    """(grad_x, grad_edge_weight) of `spmm` for cotangent grad_out."""
    src, dst = np.asarray(edge_index)
    x, g = _f64(x), _f64(grad_out)
    w = np.ones(src.shape[0]) if edge_weight is None else _f64(edge_weight)
    if reduce == "mean":
        deg = np.bincount(dst, minlength=g.shape[0])
        g = g / np.maximum(deg, 1)[:, None]
    grad_x = np.zeros_like(x)
    np.add.at(grad_x, src, w[:, None] * g[dst])
    grad_w = np.einsum("ef,ef->e", g[dst], x[src])
    return grad_x, grad_w


def gcn_norm(edge_index, num_nodes, edge_weight=None, add_self_loops=True, improved=False):
    """(edge_index', w') as PyG's gcn_norm (source_to_target), in float64."""
    src, dst = np.asarray(edge_index)
    w = np.ones(src.shape[0]) if edge_weight is None else _f64(edge_weight)
    if add_self_loops:
        keep = src != dst
        loop_w = np.full(num_nodes, 2.0 if improved else 1.0)
        for e in np.nonzero(~keep)[0]:
            loop_w[src[e]] = w[e]
        nodes = np.arange(num_nodes)
        src = np.concatenate([src[keep], nodes])
        dst = np.concatenate([dst[keep], nodes])
        w = np.concatenate([w[keep], loop_w])
    deg = np.zeros(num_nodes)
    np.add.at(deg, dst, w)
    with np.errstate(divide="ignore"):
        dis = np.where(deg == 0, 0.0, deg ** -0.5)
    return np.stack([src, dst]), dis[src] * w * dis[dst]
