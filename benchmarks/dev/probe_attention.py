"""Developer probe: time the fused attention forward against the SpMM on the
same graph (CUDA events, median of 10) for a few head layouts, so the gap
between them can be placed, then the backward pass alone (all input
gradients, random cotangent) of the three scores at 4 heads x 32 in fp32 and
bf16; run under `ncu` to read the counters of one launch of each kernel
(`bwd-once`: only one backward per score and type, nothing timed;
`fwdbwd`: only the scores' forward and backward at 4 x 32).
`--max-vec N` builds every score's kernels with at most N values per lane (loader's
ATTENTION_MAX_VEC), `--source FILE` compiles FILE instead of attention.cu
(a baseline with the same kernel signatures), and `--patch OLD NEW`
(repeatable) replaces text in the source before it is compiled: A/B runs of
a kernel change in one process each. `--rounds 1,8,32` repeats fwdbwd for
round count of the persistent grids (the launcher's ROUNDS); bwd-once runs
at the first count.

    python benchmarks/dev/probe_attention.py [scale | GRAPH] [bwd-once | fwdbwd] [--max-vec N] [--source FILE] [--patch OLD NEW]... [--rounds N,N,...]

GRAPH: a graph spec of study_reorder.py (a bench graph name, optionally
"+shuffle": node ids permuted) and ":ORDER" (relabelled by fastgnn.reorder's
ORDER), e.g. clustered20+shuffle:cluster; a bare number is rmat of that scale.
    ncu -k regex:attn_bwd --section SpeedOfLight --section WarpStateStats \
        python benchmarks/dev/probe_attention.py 20 bwd-once
"""
import sys

import cupy as cp

import fastgnn
from fastgnn.backends.cuda.spmm import median_ms
from fastgnn.testing import rmat_edge_index


def attention_inputs(rng, n, H, C, vtype):
    """({score: its inputs}, a cotangent [n, H, C]): random, fp32 or bf16 bits
    (truncated) as the op takes them."""
    def arr(*shape):
        a = rng.standard_normal(shape, dtype=cp.float32)
        return a if vtype == "float32" else (a.view(cp.uint32) >> 16).astype(cp.uint16)
    return ({"gatv2": dict(xl=arr(n, H, C), xr=arr(n, H, C), att=arr(H, C)),
             "dot": dict(q=arr(n, H, C), k=arr(n, H, C), v=arr(n, H, C)),
             "gat": dict(a_src=arr(n, H), a_dst=arr(n, H), v=arr(n, H, C))},
            arr(n, H, C))


def backward_pass(g, n, rng, repeats=10, H=4, C=32):
    """The forward and backward of each score at H x C in fp32 then bf16:
    timed (CUDA events, median of `repeats`, one line per type; bf16 gatv2's
    forward and backward also with tensor_cores=False, off their Tensor Core
    scores), or
    the backward run once and untimed with repeats=0 (for ncu)."""
    for vtype in ("float32", "bfloat16"):
        inputs, grad = attention_inputs(rng, n, H, C, vtype)
        line = []
        for kind, kw in inputs.items():
            _, res = fastgnn.edge_attention_fwd(g, kind, vtype=vtype, **kw)
            if not repeats:
                fastgnn.edge_attention_bwd(g, res, grad)
                continue
            tf = median_ms(lambda: fastgnn.edge_attention_fwd(g, kind, vtype=vtype, **kw), repeats)
            tb = median_ms(lambda: fastgnn.edge_attention_bwd(g, res, grad), repeats)
            line.append(f"{kind} fwd {tf:.3f} bwd {tb:.3f} sum {tf + tb:.3f} ms")
            if kind == "gatv2" and vtype != "float32":   # both passes without mma scores
                _, res_l = fastgnn.edge_attention_fwd(g, kind, vtype=vtype, tensor_cores=False, **kw)
                tl = median_ms(lambda: fastgnn.edge_attention_fwd(
                    g, kind, vtype=vtype, tensor_cores=False, **kw), repeats)
                tlb = median_ms(lambda: fastgnn.edge_attention_bwd(g, res_l, grad), repeats)
                line.append(f"(gatv2 with tensor_cores=False: fwd {tl:.3f} bwd {tlb:.3f} "
                            f"sum {tl + tlb:.3f} ms)")
        if repeats:
            print(f"{vtype} H={H} C={C}: " + "  ".join(line))
    cp.cuda.Device().synchronize()


def build_graph(spec):
    """(name, fastgnn.Graph, n) of a scale (rmat) or GRAPH spec (see above;
    the reorder study's graphs, study_reorder.build_graph)."""
    if spec.isdigit():
        ei, n = rmat_edge_index(int(spec), xp=cp)
        return f"rmat{spec}", fastgnn.Graph.from_edge_index(ei, num_nodes=n), n
    from study_reorder import Device
    from study_reorder import build_graph as study_graph
    base, _, method = spec.partition(":")
    _, g, _ = study_graph(base, Device(want_gpu=True))
    if method:
        g = g.reorder(method)
    return spec, g, g.num_dst


def main(spec="20", mode=""):
    name, g, n = build_graph(spec)
    rng = cp.random.default_rng(0)
    from fastgnn.backends.cuda import attention

    def force_rounds(rounds):
        if rounds is not None:
            attention.ROUNDS = rounds
        return attention.ROUNDS

    if mode == "bwd-once":                # at the first --rounds count, if any
        force_rounds(ROUNDS[0] if ROUNDS else None)
        return backward_pass(g, n, rng, repeats=0)
    if mode == "fwdbwd":                  # only the three scores at 4 x 32
        print(f"{name}: n={n} E={g.num_edges}")
        for rounds in ROUNDS or [None]:
            print(f"rounds {force_rounds(rounds)}")
            backward_pass(g, n, rng)
        return
    x = rng.standard_normal((n, 128), dtype=cp.float32)
    print(f"{name}: n={n} E={g.num_edges}")
    print(f"spmm sum F=128: {median_ms(lambda: fastgnn.spmm(g, x), 10):.3f} ms")
    for H, C in ((4, 32), (1, 128), (2, 64)):
        xl = x.reshape(n, H, C)
        xr = rng.standard_normal((n, H, C), dtype=cp.float32)
        att = rng.standard_normal((H, C), dtype=cp.float32)
        gat_s = rng.standard_normal((n, H), dtype=cp.float32)
        gat_d = rng.standard_normal((n, H), dtype=cp.float32)
        t2 = median_ms(lambda: fastgnn.edge_attention(g, "gatv2", xl=xl, xr=xr, att=att), 10)
        td = median_ms(lambda: fastgnn.edge_attention(g, "dot", q=xr, k=xl, v=xl), 10)
        tg = median_ms(lambda: fastgnn.edge_attention(g, "gat", a_src=gat_s, a_dst=gat_d, v=xl), 10)
        print(f"H={H} C={C}: gatv2 fwd {t2:.3f} ms  dot fwd {td:.3f} ms  gat fwd {tg:.3f} ms")
    backward_pass(g, n, rng)


ROUNDS = []


def build_options(argv):
    """Apply --max-vec / --patch (before any kernel is compiled) and --rounds;
    the other arguments, in order."""
    from fastgnn.backends.cuda import loader
    rest = []
    args = iter(argv)
    for a in args:
        if a == "--rounds":
            ROUNDS.extend(int(r) for r in next(args).split(","))
            continue
        if a == "--max-vec":
            loader.ATTENTION_MAX_VEC = dict.fromkeys(loader.ATTENTION_MAX_VEC, (int(next(args)),) * 2)
        elif a == "--source":
            with open(next(args)) as f:
                text = f.read()
            plain = loader.source
            loader.source = lambda family, plain=plain: text if family == "attention" else plain(family)
        elif a == "--patch":
            old, new = next(args), next(args)
            text = loader.source("attention")
            if old not in text:
                sys.exit(f"--patch: {old!r} is not in attention.cu")
            patched = text.replace(old, new)
            plain = loader.source
            loader.source = (lambda family, plain=plain, patched=patched:
                             patched if family == "attention" else plain(family))
        else:
            rest.append(a)
    return rest


if __name__ == "__main__":
    rest = build_options(sys.argv[1:])
    main(*rest[:2])
