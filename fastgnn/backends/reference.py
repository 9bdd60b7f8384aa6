"""Float64 NumPy twins of every op: the test oracle, written from the math on
the caller's edge list (not on fastgnn's CSR), so they share no code with the
backends they check."""
import numpy as np


def _f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


def spmm(edge_index, x, edge_weight=None, reduce="sum", num_dst=None, bias=None):
    """out[i] = s_i * sum_{e=(j->i)} w_e x[j] (+ bias [F]); s_i = 1 or 1/deg_in(i)."""
    src, dst = np.asarray(edge_index)
    x = _f64(x)
    num_dst = x.shape[0] if num_dst is None else num_dst
    w = np.ones(src.shape[0]) if edge_weight is None else _f64(edge_weight)
    out = np.zeros((num_dst, x.shape[1]))
    np.add.at(out, dst, w[:, None] * x[src])
    if reduce == "mean":
        deg = np.bincount(dst, minlength=num_dst)
        out /= np.maximum(deg, 1)[:, None]
    if bias is not None:
        out += _f64(bias)[None, :]
    return out


def column_sum(a):
    """[F] sum over the rows of a [N, F]: the bias gradient of `spmm`."""
    return _f64(a).sum(axis=0)


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


# ------------------------------------------------------------ reductions
_STD_EPS = 1e-5


def _reduce_names(reduce):
    return (reduce,) if isinstance(reduce, str) else tuple(reduce)


def _rows_in_caller_order(dst, num_dst):
    """For each target i, the caller edge ids e with dst[e] == i, in caller order."""
    return [np.flatnonzero(dst == i) for i in range(num_dst)]


def _row_stats(v):
    """Per-feature reductions of one row's gathered values v [deg, F] (deg >= 1)."""
    mean = v.mean(axis=0)
    var = (v * v).mean(axis=0) - mean * mean
    with np.errstate(invalid="ignore"):
        std = np.sqrt(np.maximum(var, _STD_EPS))
        std = np.where(std <= np.sqrt(_STD_EPS), 0.0, std)
    zeros = (v == 0).sum(axis=0)
    with np.errstate(over="ignore", under="ignore"):      # inf / 0 products are results too
        nonzero_prod = np.where(v == 0, 1.0, v).prod(axis=0)
    with np.errstate(invalid="ignore"):
        mul = np.where(zeros > 0, nonzero_prod * 0.0, nonzero_prod)   # inf/NaN * 0 = NaN
    return {"sum": v.sum(axis=0), "mean": mean, "max": v.max(axis=0), "min": v.min(axis=0),
            "var": var, "std": std, "mul": mul, "zeros": zeros, "nonzero_prod": nonzero_prod}


def segment_reduce(edge_index, x, reduce, num_dst):
    """out[i] = reduce_{e=(j->i)} x[j] per feature, blocks in `reduce` order;
    empty rows 0 (mul: 1); var = mean(x^2) - mean(x)^2; std = sqrt(max(var,
    1e-5)), 0 where <= sqrt(1e-5) (PyG); max/min propagate NaN; mul = the
    product of the nonzero values, times 0 when there is a zero (so NaN when
    that product is inf or NaN)."""
    src, dst = np.asarray(edge_index)
    x = _f64(x)
    names = _reduce_names(reduce)
    f = x.shape[1]
    out = np.zeros((num_dst, len(names) * f))
    for r, name in enumerate(names):
        if name == "mul":
            out[:, r * f:(r + 1) * f] = 1.0
    for i, ids in enumerate(_rows_in_caller_order(dst, num_dst)):
        if ids.size:
            stats = _row_stats(x[src[ids]])
            for r, name in enumerate(names):
                out[i, r * f:(r + 1) * f] = stats[name]
    return out


def segment_reduce_vjp(edge_index, x, reduce, num_dst, grad_out):
    """grad_x of `segment_reduce` for cotangent grad_out [num_dst, R*F]; max/min
    send the gradient to the first edge (caller order) holding the extreme
    value (a NaN counts as the extreme)."""
    src, dst = np.asarray(edge_index)
    x, g = _f64(x), _f64(grad_out)
    names = _reduce_names(reduce)
    f = x.shape[1]
    grad_x = np.zeros_like(x)
    cols = np.arange(f)
    for i, ids in enumerate(_rows_in_caller_order(dst, num_dst)):
        if not ids.size:
            continue
        v = x[src[ids]]
        deg = ids.size
        stats = _row_stats(v)
        for r, name in enumerate(names):
            gi = g[i, r * f:(r + 1) * f]
            if name == "sum":
                np.add.at(grad_x, src[ids], np.broadcast_to(gi, v.shape))
            elif name == "mean":
                np.add.at(grad_x, src[ids], np.broadcast_to(gi / deg, v.shape))
            elif name in ("max", "min"):
                first = np.argmax(v, axis=0) if name == "max" else np.argmin(v, axis=0)
                np.add.at(grad_x, (src[ids][first], cols), gi)
            elif name == "mul":
                # torch's prod gradient: g * out / x_e for x_e != 0; for the
                # row's only zero, g * (product of the others); for a zero
                # among several, g * out (0, or NaN with a NaN/inf product)
                with np.errstate(divide="ignore", invalid="ignore"):
                    part = np.where(v != 0, gi * stats["mul"] / np.where(v == 0, 1.0, v),
                                    np.where(stats["zeros"] == 1, gi * stats["nonzero_prod"],
                                             gi * stats["mul"]))
                np.add.at(grad_x, src[ids], part)
            else:
                if name == "std":
                    s = stats["std"]
                    with np.errstate(divide="ignore", invalid="ignore"):
                        gi = np.where(s != 0, gi * 0.5 / s, 0.0)
                # d var / d v_e = 2 (v_e - mean) / deg
                np.add.at(grad_x, src[ids], 2.0 * gi * (v - stats["mean"]) / deg)
    return grad_x


# ------------------------------------------------------------- attention
def _keep_factor(num_edges, heads, dropout, seed, offset):
    """[E, H] dropout factor z (0 or 1/(1-p); 1 without dropout), from the
    counter-based generator's specification (fastgnn.rng)."""
    if not dropout:
        return np.ones((num_edges, heads))
    from .. import rng
    return rng.keep_mask(seed, offset, num_edges, heads, dropout) / (1.0 - dropout)


def _group_softmax(dst, s, num_dst):
    """[E, H] softmax of s over the edges of each target dst[e] (float64)."""
    mx = np.full((num_dst,) + s.shape[1:], -np.inf)
    np.maximum.at(mx, dst, s)
    ex = np.exp(s - mx[dst])
    den = np.zeros_like(mx)
    np.add.at(den, dst, ex)
    return ex / den[dst]


def edge_softmax(edge_index, scores, num_dst, dropout=0.0, seed=0, offset=0):
    """out[e, h] = z[e, h] exp(s[e, h]) / sum_{e' -> same target} exp(s[e', h])."""
    dst = np.asarray(edge_index)[1]
    s = _f64(scores)
    s2 = s[:, None] if s.ndim == 1 else s
    p = _group_softmax(dst, s2, num_dst) * _keep_factor(s2.shape[0], s2.shape[1], dropout,
                                                       seed, offset)
    return p[:, 0] if s.ndim == 1 else p


def edge_softmax_vjp(edge_index, scores, num_dst, grad_out, dropout=0.0, seed=0, offset=0):
    """grad_scores = p (g z - sum_{same target} p g z)."""
    dst = np.asarray(edge_index)[1]
    s, g = _f64(scores), _f64(grad_out)
    flat = s.ndim == 1
    s2, g2 = (s[:, None], g[:, None]) if flat else (s, g)
    p = _group_softmax(dst, s2, num_dst)
    gz = g2 * _keep_factor(s2.shape[0], s2.shape[1], dropout, seed, offset)
    tot = np.zeros((num_dst, s2.shape[1]))
    np.add.at(tot, dst, p * gz)
    out = p * (gz - tot[dst])
    return out[:, 0] if flat else out


def _lrelu(u, slope):
    return np.where(u > 0, u, slope * u)


def _attention_edges(edge_index, score, inputs, negative_slope, scale):
    """Per-edge tensors of `edge_attention`, materialised: (s [E, H],
    message [E, H, C], what the VJP needs)."""
    src, dst = np.asarray(edge_index)
    x = {k: _f64(v) for k, v in inputs.items() if v is not None}
    if score == "gat":
        u = x["a_src"][src] + x["a_dst"][dst] + (x["a_edge"] if "a_edge" in x else 0.0)
        return _lrelu(u, negative_slope), x["v"][src], {"u": u}
    if score == "gatv2":
        att = x["att"].reshape(x["xl"].shape[1:])
        t = x["xl"][src] + x["xr"][dst] + (x["xe"] if "xe" in x else 0.0)
        return (att * _lrelu(t, negative_slope)).sum(-1), x["xl"][src], {"t": t, "att": att}
    if score == "dot":
        scale = 1.0 / np.sqrt(x["q"].shape[2]) if scale is None else scale
        ee = x["ee"] if "ee" in x else 0.0
        kk = x["k"][src] + ee
        return scale * (x["q"][dst] * kk).sum(-1), x["v"][src] + ee, {"kk": kk, "scale": scale}
    raise ValueError(f"unknown score {score!r}")


def edge_attention(edge_index, score, num_dst, inputs, negative_slope=0.2, scale=None,
                   dropout=0.0, seed=0, offset=0):
    """(out [num_dst, H, C], alpha [E, H]) of fastgnn's `edge_attention`,
    from the math on the caller's edge list: s_e per score, alpha = softmax of s
    over each target's in-edges, out[i] = sum_e alpha_e z_e m_e. `inputs` maps
    the score's input names (fastgnn.ops.attention.SCORE_INPUTS) to arrays."""
    dst = np.asarray(edge_index)[1]
    s, msg, _ = _attention_edges(edge_index, score, inputs, negative_slope, scale)
    alpha = _group_softmax(dst, s, num_dst)
    z = _keep_factor(s.shape[0], s.shape[1], dropout, seed, offset)
    out = np.zeros((num_dst,) + msg.shape[1:])
    np.add.at(out, dst, (alpha * z)[..., None] * msg)
    if inputs.get("bias") is not None:
        out = out + _f64(inputs["bias"]).reshape(msg.shape[1:])   # every target row
    return out, alpha


def edge_attention_softmax_terms(edge_index, score, num_dst, inputs, grad_out, grad_alpha=None,
                                 negative_slope=0.2, scale=None, dropout=0.0, seed=0, offset=0):
    """The softmax part of `edge_attention_vjp`, per edge (float64): a dict of
    p [E, H] (attention weights), z [E, H] (dropout factors), msg [E, H, C],
    aux (the score's intermediates, `_attention_edges`), dp_e = z_e <g_i, m_e>
    + ga_e [E, H] and D_i = sum_{same target} p dp [num_dst, H]; then
    ds_e = p_e (dp_e - D_i)."""
    dst = np.asarray(edge_index)[1]
    s, msg, aux = _attention_edges(edge_index, score, inputs, negative_slope, scale)
    E, H = s.shape
    p = _group_softmax(dst, s, num_dst)
    z = _keep_factor(E, H, dropout, seed, offset)
    dp = z * np.einsum("ehc,ehc->eh", _f64(grad_out)[dst], msg)
    if grad_alpha is not None:
        dp = dp + _f64(grad_alpha)
    tot = np.zeros((num_dst, H))
    np.add.at(tot, dst, p * dp)
    return {"p": p, "z": z, "msg": msg, "aux": aux, "dp": dp, "D": tot}


def edge_attention_vjp(edge_index, score, num_dst, inputs, grad_out, grad_alpha=None,
                       negative_slope=0.2, scale=None, dropout=0.0, seed=0, offset=0):
    """{input name: gradient} of `edge_attention` for the cotangents grad_out
    [num_dst, H, C] and grad_alpha [E, H] (optional), by explicit formulas:
    dp_e = z_e <g_i, m_e> + ga_e, ds_e = p_e (dp_e - sum_{same target} p dp),
    then the chain rule through each score function."""
    src, dst = np.asarray(edge_index)
    x = {k: _f64(v) for k, v in inputs.items() if v is not None}
    sm = edge_attention_softmax_terms(edge_index, score, num_dst, inputs, grad_out, grad_alpha,
                                      negative_slope, scale, dropout, seed, offset)
    p, z, msg, aux, dp, tot = sm["p"], sm["z"], sm["msg"], sm["aux"], sm["dp"], sm["D"]
    g = _f64(grad_out)
    ds = p * (dp - tot[dst])
    dmsg = (p * z)[..., None] * g[dst]

    def scatter(vals, idx, n):
        out = np.zeros((n,) + vals.shape[1:])
        np.add.at(out, idx, vals)
        return out

    grads = {}
    if score == "gat":
        du = ds * np.where(aux["u"] > 0, 1.0, negative_slope)
        grads["a_src"] = scatter(du, src, x["a_src"].shape[0])
        grads["a_dst"] = scatter(du, dst, num_dst)
        grads["a_edge"] = du
        grads["v"] = scatter(dmsg, src, x["v"].shape[0])
    elif score == "gatv2":
        t, att = aux["t"], aux["att"]
        dt = ds[..., None] * att * np.where(t > 0, 1.0, negative_slope)
        grads["xl"] = scatter(dt + dmsg, src, x["xl"].shape[0])
        grads["xr"] = scatter(dt, dst, num_dst)
        grads["xe"] = dt
        grads["att"] = (ds[..., None] * _lrelu(t, negative_slope)).sum(0).reshape(
            x["att"].shape)
    else:
        dkk = aux["scale"] * ds[..., None] * x["q"][dst]
        grads["q"] = scatter(aux["scale"] * ds[..., None] * aux["kk"], dst, num_dst)
        grads["k"] = scatter(dkk, src, x["k"].shape[0])
        grads["v"] = scatter(dmsg, src, x["v"].shape[0])
        grads["ee"] = dkk + dmsg
    if "bias" in x:                     # out[i] += b for every target i
        grads["bias"] = g.sum(0).reshape(x["bias"].shape)
    return {k: v for k, v in grads.items() if k in x}
