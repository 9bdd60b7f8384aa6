"""Developer probe: the block-sparse Tensor Core path against the CUDA-core
path per graph (CUDA events, median of `repeats` after a warm-up): the
form's build time and fill statistics, dot attention forward and
forward+backward (H x C), and the SpMM (F features) against the
custom CUDA-core kernel and cuSPARSE's best (torch.sparse.mm on a CSR
adjacency in bf16 and fp32, where torch is installed). Each graph ends with
one line of speedups and what `tensor_cores="auto"` picks; the threshold
constants of fastgnn/blocksparse.py (MIN_FILL, MAX_TILES_PER_WINDOW,
MAX_WINDOW_SKEW) are set from
these lines. A correctness line per graph compares both paths' outputs.

    python benchmarks/dev/probe_blocksparse.py [graph ...] [--heads 4] [--channels 32]
        [--features 128] [--repeats 10] [--dtype bf16|tf32]
    (--dtype tf32: fp32 inputs, the Tensor Core path as TF32 (tf32=True)
    against the fp32 CUDA-core path; default graphs: clustered19 grid mesh3d molecules knn rmat20 uniform20)
"""
import argparse
import time

import cupy as cp
import numpy as np

import fastgnn
from fastgnn import blocksparse as tc
from fastgnn.backends.cuda.blocksparse import build
from fastgnn.backends.cuda.spmm import median_ms
from fastgnn.bench.graphs import parse
from fastgnn.testing import rel_err

DEFAULT = ["clustered19", "grid", "mesh3d", "molecules", "knn", "rmat20", "uniform20"]


def bf16(rng, *shape):
    a = rng.standard_normal(shape, dtype=cp.float32)
    return (a.view(cp.uint32) >> 16).astype(cp.uint16)


def bf16_values(a):
    return (a.astype(cp.uint32) << 16).view(cp.float32).get().astype(np.float64)


def random_inputs(rng, dtype, *shape):
    """Random normal inputs: bf16 bits, or fp32 (dtype "tf32", full fp32
    mantissas, so the check line shows TF32's input rounding)."""
    return bf16(rng, *shape) if dtype == "bf16" else rng.standard_normal(shape, dtype=cp.float32)


def values(a, dtype):
    return bf16_values(a) if dtype == "bf16" else a.get().astype(np.float64)


def cusparse_ms(g, x_bits, repeats):
    """torch.sparse.mm over a CSR adjacency (cuSPARSE): {dtype: ms}."""
    try:
        import torch
    except ImportError:
        return {}
    crow = torch.from_dlpack(g.indptr.astype(cp.int64))
    col = torch.from_dlpack(g.indices.astype(cp.int64))
    out = {}
    xf = torch.from_dlpack((x_bits.astype(cp.uint32) << 16).view(cp.float32))
    for name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        try:
            vals = torch.ones(g.num_edges, dtype=dt, device=xf.device)
            A = torch.sparse_csr_tensor(crow, col, vals, size=(g.num_dst, g.num_src))
            x = xf.to(dt)
            out[name] = median_ms(lambda: torch.sparse.mm(A, x), repeats)
        except RuntimeError as e:          # a dtype cuSPARSE refuses
            out[name] = f"n/a ({str(e).splitlines()[0][:60]})"
    return out


def probe(spec, H, C, F, repeats, dtype="bf16"):
    name, desc, make = parse(spec)
    made = make(cp, 0)
    ei, n = made[0], made[1]
    g = fastgnn.Graph.from_edge_index(cp.asarray(ei), num_nodes=int(n))
    g.csr_rows                                          # cached, as the ops have it
    cp.cuda.Device().synchronize()
    build(g)                                            # compile the builder
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    bs = build(g)
    cp.cuda.Device().synchronize()
    build_wall = (time.perf_counter() - t0) * 1e3
    build_ms = median_ms(lambda: build(g), max(3, repeats // 3))
    g.cache["blocksparse"] = bs
    st = bs.stats
    print(f"{name}: {desc}; n={g.num_dst} E={g.num_edges} duplicates={bs.num_duplicates}")
    print(f"  form: build {build_ms:.2f} ms (first timed call {build_wall:.2f} ms wall); "
          f"tiles {st['num_tiles']} fill {st['fill']:.3f} tiles/window "
          f"{st['tiles_per_window']:.2f} max {st['max_tiles_window']} empty windows "
          f"{st['empty_windows']}/{st['num_windows']}; auto rule: "
          f"{'Tensor Cores' if tc.pays(st) else 'CUDA cores'}"
          + (f" (TF32 SpMM: {'Tensor Cores' if tc.pays(st, 'spmm', 'float32') else 'CUDA cores'})"
             if dtype == "tf32" else ""))
    rng = cp.random.default_rng(0)
    q, k, v, go = (random_inputs(rng, dtype, g.num_dst, H, C) for _ in range(4))
    vt = dict(vtype="bfloat16") if dtype == "bf16" else dict(tf32=True)
    kw = dict(q=q, k=k, v=v, **vt)
    res_line = []
    times = {}
    for path in (True, False):
        if path and bs.num_duplicates:
            continue
        fwd = lambda p=path: fastgnn.edge_attention_fwd(g, "dot", tensor_cores=p, **kw)  # noqa: E731
        out, res = fwd()

        def fwd_bwd(p=path):
            _, r = fastgnn.edge_attention_fwd(g, "dot", tensor_cores=p, **kw)
            fastgnn.edge_attention_bwd(g, r, go)
        times[("fwd", path)] = median_ms(fwd, repeats)
        times[("fwdbwd", path)] = median_ms(fwd_bwd, repeats)
        res_line.append(values(out, dtype))
        x = random_inputs(rng, dtype, g.num_src, F)
        sp = lambda p=path: fastgnn.spmm(g, x, tensor_cores=p, **vt)  # noqa: E731
        times[("spmm", path)] = median_ms(sp, repeats)
    cus = cusparse_ms(g, bf16(rng, g.num_src, F), repeats)
    for key, label in (("fwd", f"dot attention fwd (H={H}, C={C}, {dtype})"),
                       ("fwdbwd", "dot attention fwd+bwd"), ("spmm", f"SpMM sum (F={F}, {dtype})")):
        t_tc, t_cc = times.get((key, True)), times[(key, False)]
        tc_s = f"{t_tc:.3f} ms" if t_tc is not None else "n/a"
        sp = f", speedup {t_cc / t_tc:.2f}x" if t_tc else ""
        print(f"  {label}: tensor cores {tc_s}, CUDA cores {t_cc:.3f} ms{sp}")
    if cus:
        print("  cuSPARSE (torch.sparse.mm, CSR): " + ", ".join(
            f"{d} {t:.3f} ms" if isinstance(t, float) else f"{d} {t}" for d, t in cus.items()))
    if len(res_line) == 2:
        print(f"  check: attention out rel diff tensor vs CUDA cores {rel_err(*res_line):.2e}")
    if times.get(("fwd", True)):
        print(f"SUMMARY {name} {dtype} fill={st['fill']:.3f} skew="
              f"{st['max_tiles_window'] / max(st['tiles_per_window'], 1e-9):.1f} "
              f"fwd={times[('fwd', False)] / times[('fwd', True)]:.2f}x "
              f"fwdbwd={times[('fwdbwd', False)] / times[('fwdbwd', True)]:.2f}x "
              f"spmm={times[('spmm', False)] / times[('spmm', True)]:.2f}x "
              f"build={build_ms:.1f}ms auto={'tc' if tc.pays(st) else 'cc'}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graphs", nargs="*", default=DEFAULT)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--channels", type=int, default=32)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--dtype", choices=("bf16", "tf32"), default="bf16")
    a = ap.parse_args()
    for spec in a.graphs:
        probe(spec, a.heads, a.channels, a.features, a.repeats, a.dtype)
        cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
