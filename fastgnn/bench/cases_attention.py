"""Cases of the attention family: `attn_gatv2`, `attn_dot`, `attn_gat` (ops) and
`GATConv`, `GATv2Conv`, `TransformerConv` (layers).

Ops: the bare attention aggregation, H heads x C channels (F = --width split
over --heads, default 4 x 32 for F=128), per edge e = (j -> i):

    attn_gatv2: s_e = sum_c att[h,c] LeakyReLU(xl[j] + xr[i])[c],   m_e = xl[j]
    attn_dot:   s_e = <q[i,h], k[j,h]> / sqrt(C),                   m_e = v[j]
    attn_gat:   s_e = LeakyReLU(a_src[j,h] + a_dst[i,h]),           m_e = v[j]
    out[i, h] = sum_{e in N(i)} softmax_{N(i)}(s)_e m_e[h]           out: [n, H*C]

x (the bench's features, [n, F] viewed [n, H, C]) is xl / q / v; the other
inputs are drawn once per case (seeded). fwd+bwd differentiates every tensor
input (random upstream gradient); agreement is checked on out and grad_x.

Op implementations:
  fastgnn                 fastgnn.torch.edge_attention(graph, score, ...) on a
                          graph built once by fastgnn.torch.to_graph
  fastgnn[nondeterministic]  the same with deterministic=False (GPU): the
                          backward adds the source-side gradients with float
                          atomics instead of a pass over the transpose
  pyg-style[edge_index]   PyG 2.8's message passing written out with torch ops:
                          index_select x[src] / x[dst] per edge, leaky_relu,
                          torch_geometric.utils.softmax, multiply, then
                          torch_geometric.utils.scatter(sum): materialises
                          E x H x C tensors as PyG's GATv2Conv / TransformerConv do
  turbo-gnn[...]          gatv2_aggr / graph_transformer_aggr (GPU, when
                          turbo_gnn imports; explicit calls in bench.external:
                          its graph transformer indexes Q by the source and K
                          by the destination, so it gets Q = k, K = q; autotune
                          off)
  dgl[ops+edge_softmax]   dgl.ops scores + edge_softmax + u_mul_e_sum, when
                          dgl imports

Layers: GATConv / GATv2Conv / TransformerConv(F, F/H, heads=H) (concat, PyG
defaults otherwise: self-loops for the GAT layers, root weight for
TransformerConv), fastgnn.torch against PyG on edge_index, same float32
parameters (PyG's, loaded by name). PyG gains nothing from a CSR adj_t or a
sorted EdgeIndex for these layers (docs/GPU notes), so only edge_index runs.
On the GPU fastgnn[edge_index,nondeterministic] also runs the layer with
deterministic=False (atomic backward); the report's headline stays the
default, bitwise repeatable fastgnn[edge_index].
"""
from __future__ import annotations

import math

from . import external, report
from .cases_layers import _load, _master_state, _prepared, compiled_impl, layer_reference
from .cases_spmm import clear_fastgnn_cache, fastgnn_takes
from .core import Case, Impl, Prepared, register

SCORES = {"attn_gatv2": "gatv2", "attn_dot": "dot", "attn_gat": "gat"}
# per score: tensor names in the order given to autograd (the first is x)
NAMES = {"gatv2": ("xl", "xr", "att"), "dot": ("q", "k", "v"), "gat": ("v", "a_src", "a_dst")}
SLOPE = 0.2


def _heads(ctx):
    h = int(getattr(ctx, "heads", 4) or 4)
    if ctx.width % h:
        raise ValueError(f"--width {ctx.width} is not divisible by --heads {h}")
    return h, ctx.width // h


def _inputs(ctx, score):
    """{name: tensor in ctx.dtype (no grad)}, drawn once per ctx (seeded); the
    first is ctx.x viewed [n, H, C]. Also the float32 copies for the reference."""
    key = ("attn_inputs", score)
    if key not in ctx.state:
        torch = ctx.torch
        H, C = _heads(ctx)
        n = ctx.graph.num_nodes
        gen = torch.Generator(device=ctx.device).manual_seed(ctx.seed + 3)

        def rnd(*shape, scale=1.0):
            return (torch.randn(*shape, generator=gen, device=ctx.device) * scale).to(ctx.dtype)
        x = ctx.x.view(n, H, C)
        if score == "gatv2":
            t = {"xl": x, "xr": rnd(n, H, C), "att": rnd(H, C, scale=C ** -0.5)}
        elif score == "dot":
            t = {"q": x, "k": rnd(n, H, C), "v": rnd(n, H, C)}
        else:
            t = {"v": x, "a_src": rnd(n, H), "a_dst": rnd(n, H)}
        ref = {k: v.float() for k, v in t.items()}
        ref[NAMES[score][0]] = ctx.x_ref.view(n, H, C) if ctx.x_ref is not None else x.float()
        ctx.state[key] = (t, ref)
    return ctx.state[key]


def _leaves(tensors, score):
    return [tensors[k].detach().requires_grad_(True) for k in NAMES[score]]


# ------------------------------------------------------------ PyG-style baseline


def pyg_style(torch, score, ts, src, dst, n):
    """PyG 2.8's computation with torch ops: per-edge gathers, leaky_relu,
    torch_geometric.utils.softmax, message, scatter-sum. Returns [n, H*C]."""
    import torch.nn.functional as Fn
    from torch_geometric.utils import scatter, softmax
    if score == "gatv2":                      # GATv2Conv.message: x = x_i + x_j
        xl, xr, att = ts
        x_j = xl.index_select(0, src)
        x = Fn.leaky_relu(xr.index_select(0, dst) + x_j, SLOPE)
        alpha = (x * att.unsqueeze(0)).sum(dim=-1)
        alpha = softmax(alpha, dst, num_nodes=n)
        msg = x_j * alpha.unsqueeze(-1)
    elif score == "dot":                      # TransformerConv.message
        q, k, v = ts
        alpha = (q.index_select(0, dst) * k.index_select(0, src)).sum(dim=-1) / math.sqrt(q.shape[-1])
        alpha = softmax(alpha, dst, num_nodes=n)
        msg = v.index_select(0, src) * alpha.unsqueeze(-1)
    else:                                     # GATConv.edge_update + message
        v, a_src, a_dst = ts
        alpha = Fn.leaky_relu(a_src.index_select(0, src) + a_dst.index_select(0, dst), SLOPE)
        alpha = softmax(alpha, dst, num_nodes=n)
        msg = alpha.unsqueeze(-1) * v.index_select(0, src)
    out = scatter(msg, dst, 0, dim_size=n, reduce="sum")
    return out.reshape(n, -1)


def attn_reference(score):
    def ref(ctx):
        torch = ctx.torch
        _, r = _inputs(ctx, score)
        leaves = _leaves(r, score)
        ei = ctx.graph.edge_index
        n = ctx.graph.num_nodes
        return Prepared(lambda: pyg_style(torch, score, leaves, ei[0], ei[1], n), leaves)
    return ref


def attn_floor(score):
    """ctx -> (fwd bytes, fwd+bwd bytes), a lower bound: forward reads every node
    input once, writes out once, reads indptr + indices; the backward reads the
    inputs and grad_out again, writes one gradient per input and reads the CSR
    and its transpose (the per-(node, head) log-sum-exp is not counted)."""
    def floor(ctx):
        g = ctx.graph
        n, E = g.num_nodes, g.stats["num_edges"]
        H, C = _heads(ctx)
        vb = ctx.x.element_size()
        ib = g.index_bytes
        node = {"gatv2": 2 * n * H * C + H * C, "dot": 3 * n * H * C,
                "gat": n * H * C + 2 * n * H}[score] * vb
        out = n * H * C * vb
        idx = (n + 1) * ib + E * ib
        fwd = node + out + idx
        return fwd, fwd + 2 * node + out + 2 * idx
    return floor


# ------------------------------------------------------------ turbo-gnn

TURBO_FN = {"gatv2": "gatv2_aggr", "dot": "graph_transformer_aggr"}


def turbo_attention(score, g, ts, C):
    """() -> out [n, H*C]: turbo-gnn's fused op on the case's tensors (names as
    NAMES[score]); the argument mapping is spelled out in bench.external."""
    if score == "gatv2":
        xl, xr, att = ts
        return lambda: external.turbo_gatv2(g, xl, xr, att, SLOPE).flatten(1)
    q, k, v = ts
    scale = 1.0 / math.sqrt(C)
    return lambda: external.turbo_transformer(g, q, k, v, scale).flatten(1)


# ------------------------------------------------------------ op implementations


def attn_impls(score):
    def impls(ctx):
        torch = ctx.torch
        n = ctx.graph.num_nodes
        ei = ctx.graph.edge_index
        H, C = _heads(ctx)
        t, _ = _inputs(ctx, score)
        ctx.state[("attn_inputs", score)] = (t, None)     # float32 copies not held while timing
        names = NAMES[score]
        out = []

        def build_fastgnn(ctx, det=None):
            import fastgnn.torch as fgt
            if not hasattr(fgt, "edge_attention"):
                raise NotImplementedError("fastgnn.torch.edge_attention is not available")
            g = fgt.to_graph(ei, n)
            leaves = _leaves(t, score)
            kw = dict(zip(names, leaves))
            if score != "dot":
                kw["negative_slope"] = SLOPE
            if det is not None:
                kw["deterministic"] = det
            return Prepared(lambda: fgt.edge_attention(g, score, **kw).reshape(n, H * C), leaves,
                            lambda: {"path": "cuda" if ctx.cuda else "cpu (numba)", "heads": H},
                            cleanup=lambda: clear_fastgnn_cache(fgt))
        settings = (f"fastgnn.torch.edge_attention(graph, {score!r}, {', '.join(names)}) with "
                    f"H={H}, C={C}; graph = fastgnn.torch.to_graph(edge_index) built once (CSR "
                    "by target, cached transpose)")
        out.append(Impl("fastgnn", settings, build_fastgnn, fastgnn=True))
        if ctx.cuda and fastgnn_takes("edge_attention"):
            out.append(Impl("fastgnn[nondeterministic]", settings.replace(
                ") with", ", deterministic=False) with", 1) + "; backward with float atomics",
                lambda ctx: build_fastgnn(ctx, False), fastgnn=True))

        def build_pyg(ctx):
            leaves = _leaves(t, score)
            return Prepared(lambda: pyg_style(torch, score, leaves, ei[0], ei[1], n), leaves,
                            lambda: {"heads": H})
        out.append(Impl("pyg-style[edge_index]", "PyG 2.8's message passing with torch ops: "
                        "index_select per edge, leaky_relu, torch_geometric.utils.softmax, "
                        "message, torch_geometric.utils.scatter(sum) (materialises E x H x C)",
                        build_pyg, per_edge=True))

        if ctx.cuda and score in TURBO_FN:
            fname = TURBO_FN[score]

            def build_turbo(ctx):
                g = external.turbo_graph(torch, ei, n)
                leaves = _leaves(t, score)
                return Prepared(turbo_attention(score, g, leaves, C), leaves, lambda: {"heads": H})
            call = {"gatv2": "gatv2_aggr(g, x=xr, x_neighbors=xl, attention_weights=att, "
                             f"negative_slope={SLOPE})",
                    "dot": "graph_transformer_aggr(g, x, Q=k, K=q, V=v, scale=1/sqrt(C)) "
                           "(its Q is indexed by the source, K by the destination)"}[score]
            out.append(Impl(f"turbo-gnn[{fname}]", f"turbo_gnn.ops.{call}, inputs [n, H, C], "
                            f"H={H}, C={C}; g = {external.TURBO_GRAPH}; {external.TURBO_SETTINGS}",
                            build_turbo, devices=("cuda",), available=external.turbo_gnn_reason))

        def build_dgl(ctx):
            g = external.dgl_graph(ei, n)
            leaves = _leaves(t, score)
            return Prepared(lambda: external.dgl_attention(torch, g, score, leaves, SLOPE), leaves,
                            lambda: {"heads": H})
        out.append(Impl("dgl[ops+edge_softmax]", "dgl.ops u_add_v / u_dot_v scores, "
                        "dgl.nn.functional.edge_softmax, dgl.ops.u_mul_e_sum on g = dgl.graph("
                        "(src, dst), num_nodes=n) built once (E x H x C intermediates for gatv2)",
                        build_dgl, available=external.dgl_reason))
        return out
    return impls


for _name, _desc in (
        ("attn_gatv2", "GATv2 aggregation: softmax_(j->i)(att . LeakyReLU(xl[j] + xr[i])) xl[j], H x C"),
        ("attn_dot", "Graph Transformer aggregation: softmax_(j->i)(<q[i], k[j]>/sqrt(C)) v[j], H x C"),
        ("attn_gat", "GAT aggregation: softmax_(j->i)(LeakyReLU(a_src[j] + a_dst[i])) v[j], H x C")):
    register(Case(_name, "op", "attention", _desc, attn_impls(SCORES[_name]),
                  attn_reference(SCORES[_name]), attn_floor(SCORES[_name])))


# ------------------------------------------------------------ layers

LAYERS = ("GATConv", "GATv2Conv", "TransformerConv")


def _layer(mod, name, ctx, **kw):
    H, C = _heads(ctx)
    cls = getattr(mod, name, None)
    if cls is None:
        raise NotImplementedError(f"{mod.__name__}.{name} is not available")
    return cls(ctx.width, C, heads=H, **kw)


def _pyg_maker(name):
    """make(ctx) for cases_layers' shared state and reference: the PyG layer."""
    def make(ctx):
        from torch_geometric import nn as pnn
        return _layer(pnn, name, ctx)
    return make


def _layer_state(ctx, name):
    return _master_state(ctx, name, _pyg_maker(name))


def attn_layer_impls(name):
    def impls(ctx):
        torch = ctx.torch
        ei = ctx.graph.edge_index
        H, C = _heads(ctx)

        def build_fastgnn(ctx, deterministic=True):
            import fastgnn.torch as fgt
            m = _layer(fgt, name, ctx, deterministic=deterministic)
            note = _load(m, _layer_state(ctx, name), ctx.dtype, ctx.device, torch)
            return _prepared(ctx, m, lambda m, x: m(x, ei), note,
                             cleanup=lambda: clear_fastgnn_cache(fgt),
                             extra_info=lambda: {"path": "cuda" if ctx.cuda else "cpu (numba)"})

        def pyg(ctx):
            from torch_geometric import nn as pnn
            m = _layer(pnn, name, ctx)
            _load(m, _layer_state(ctx, name), ctx.dtype, ctx.device, torch)
            return m

        def build_pyg(ctx):
            return _prepared(ctx, pyg(ctx), lambda m, x: m(x, ei))

        settings = f"F, {C}, heads={H} (concat)"
        out = [
            Impl("fastgnn[edge_index]", f"fastgnn.torch.{name}({settings}) on edge_index (graph "
                 "built once by fastgnn.torch.to_graph's cache)", build_fastgnn, fastgnn=True),
            Impl("pyg[edge_index]", f"torch_geometric.nn.{name}({settings}) on edge_index "
                 "(per-edge gathers, softmax, scatter: E x H x C intermediates)", build_pyg,
                 per_edge=True),
        ]
        if ctx.cuda:
            out.insert(1, Impl("fastgnn[edge_index,nondeterministic]",
                               f"fastgnn.torch.{name}({settings}, deterministic=False): the "
                               "backward adds source-side gradients with float atomics",
                               lambda ctx: build_fastgnn(ctx, False), fastgnn=True))
        comp = compiled_impl(ctx, f"{name}({settings})", pyg, [("edge_index", lambda ctx: ei)])
        return out + ([comp] if comp else [])
    return impls


for _name, _desc in (
        ("GATConv", "GAT layer, H heads x F/H, concat, self-loops (PyG defaults)"),
        ("GATv2Conv", "GATv2 layer, H heads x F/H, concat, self-loops (PyG defaults)"),
        ("TransformerConv", "Graph Transformer layer, H heads x F/H, concat, root weight")):
    register(Case(_name, "layer", "attention", _desc, attn_layer_impls(_name),
                  layer_reference(_name, _pyg_maker(_name))))


# ------------------------------------------------------------ report lines

CASES_ORDER = ("attn_gatv2", "attn_dot", "attn_gat") + LAYERS


def _x(v):
    return "-" if v is None else f"{v:.2f}x"


def attention_summary(records):
    """One line per (graph, dtype, F): for each attention case, fastgnn's
    fwd+bwd speedup over the fastest baseline and its peak memory / that
    baseline's peak (GPU only)."""
    groups = {}
    for r in records:
        if r.get("family") == "attention" and r.get("kind") in ("op", "layer"):
            groups.setdefault((r["graph"], r.get("dtype"), r.get("width")), []).append(r)
    lines = []
    for (g, d, w), recs in groups.items():
        parts = []
        for case in CASES_ORDER:
            rs = [r for r in recs if r["case"] == case]
            fg = next((r for r in rs if r.get("fastgnn")), None)
            if fg is None:
                continue
            base_name = fg.get("best_baseline_fwd_bwd")
            base = next((r for r in rs if r["impl"] == base_name), None)
            peak = (fg["peak_mib"] / base["peak_mib"]
                    if base and fg.get("peak_mib") and base.get("peak_mib") else None)
            sp = fg.get("speedup_fwd_bwd")
            if sp is None and fg.get("status", {}).get("fwd_bwd") not in (None, "ok"):
                parts.append(f"{case} {fg['status']['fwd_bwd']}")
                continue
            tail = f", peak {_x(peak)}" if peak is not None else ""
            if fg.get("peak_over_needed") is not None:
                tail += f", peak/needed {fg['peak_over_needed']:.2f}"
            parts.append(f"{case} {_x(sp)} vs {base_name or '-'}{tail}")
        if parts:
            lines.append(f"- {g} {d} F={w}: " + "; ".join(parts))
    if not lines:
        return []
    return ["## Attention family: fastgnn / fastest baseline", "",
            "fwd+bwd speedup of fastgnn over the fastest baseline of each case, and fastgnn's "
            "peak memory as a fraction of that baseline's (GPU runs only); peak/needed: "
            "fastgnn's peak over what must exist anyway (memory live before the call: "
            "inputs, parameters, cotangent, graph with its cached transpose; plus the "
            "output and the gradients; the target is <= 1.2).", ""] + lines + [""]


report.SUMMARIES.append(attention_summary)
