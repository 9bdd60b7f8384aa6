"""Edge-index helpers shared by the generators and the loaders: sorted
unique keys, deduplication, symmetrising and `graph_stats` (the summary every
benchmark record carries). Plain NumPy or CuPy through the `xp` argument."""
from __future__ import annotations

import numpy as np

__all__ = ["sorted_unique", "dedup_edges", "symmetrise", "graph_stats"]


def dedup_edges(src, dst, num_nodes, xp=np, self_loops=False):
    """Unique (src, dst) pairs sorted by (src, dst), self-loops dropped unless
    asked for. Returns an int64 [2, E] edge index."""
    src = src.astype(np.int64, copy=False)
    dst = dst.astype(np.int64, copy=False)
    if not self_loops:
        keep = src != dst
        src, dst = src[keep], dst[keep]
    key = sorted_unique(src * num_nodes + dst, xp)
    return xp.stack([key // num_nodes, key % num_nodes])


def sorted_unique(a, xp=np):
    """xp.unique by sort + neighbour compare (NumPy 2's hash-based unique is
    several times slower on large int64 keys)."""
    a = xp.sort(a)
    if a.shape[0] < 2:
        return a
    keep = xp.concatenate([xp.ones(1, dtype=bool), a[1:] != a[:-1]])
    return a[keep]


def symmetrise(edge_index, num_nodes, xp=np):
    """Both directions of every edge, deduplicated, without self-loops."""
    s, d = edge_index[0], edge_index[1]
    return dedup_edges(xp.concatenate([s, d]), xp.concatenate([d, s]), num_nodes, xp)


def _gini(deg, xp):
    """Gini coefficient of a degree vector (0 = all equal, -> 1 = one hub)."""
    n = int(deg.shape[0])
    tot = float(deg.sum())
    if n == 0 or tot == 0:
        return 0.0
    d = xp.sort(deg).astype(np.float64)
    ranks = xp.arange(1, n + 1, dtype=np.float64)
    return float(2.0 * float((ranks * d).sum()) / (n * tot) - (n + 1) / n)


def _sig(v, digits=4):
    return float(f"{v:.{digits}g}")


def graph_stats(edge_index, num_nodes, xp=None, chunk=1 << 24):
    """Summary of an edge index (plain Python numbers), reported with every
    benchmark result:

    num_nodes, num_edges, max_in_degree, mean_in_degree, max_out_degree;
    in_degree_skew (max / mean in-degree) and in_degree_gini (0 = regular,
    -> 1 = all edges into one node): how unbalanced the rows are;
    edge_span_mean and edge_span_max (mean and max |src - dst| / n: small =
    neighbours have nearby ids, i.e. gathers stay local; the max is the
    bandwidth fraction); isolated_nodes (no edge at all), zero_in_degree
    (rows with nothing to aggregate), self_loops."""
    if xp is None:
        xp = np if isinstance(edge_index, np.ndarray) else __import__("cupy")
    n = int(num_nodes)
    E = int(edge_index.shape[1])
    out = {"num_nodes": n, "num_edges": E, "max_in_degree": 0,
           "mean_in_degree": round(E / n, 3) if n else 0.0, "max_out_degree": 0,
           "in_degree_skew": 0.0, "in_degree_gini": 0.0, "edge_span_mean": 0.0,
           "edge_span_max": 0.0, "isolated_nodes": n, "zero_in_degree": n, "self_loops": 0}
    if not E or not n:
        return out
    din = xp.bincount(edge_index[1], minlength=n)
    dout = xp.bincount(edge_index[0], minlength=n)
    out["max_in_degree"] = int(din.max())
    out["max_out_degree"] = int(dout.max())
    out["in_degree_skew"] = _sig(out["max_in_degree"] / (E / n))
    out["in_degree_gini"] = _sig(_gini(din, xp))
    out["isolated_nodes"] = int(((din + dout) == 0).sum())
    out["zero_in_degree"] = int((din == 0).sum())
    del din, dout
    span_sum, span_max, loops = 0.0, 0, 0
    for lo in range(0, E, chunk):
        d = xp.abs(edge_index[0, lo:lo + chunk] - edge_index[1, lo:lo + chunk])
        span_sum += float(d.sum(dtype=np.float64))
        span_max = max(span_max, int(d.max()))
        loops += int((d == 0).sum())
    out["edge_span_mean"] = _sig(span_sum / E / n)
    out["edge_span_max"] = _sig(span_max / n)
    out["self_loops"] = loops
    return out
