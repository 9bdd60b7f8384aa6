"""Developer probe (GPU): the dense GEMMs of a SAGEConv / GCNConv layer
(N x F activations, F x F weights, fp32, TF32 off as torch's default) in the
formulations torch offers, each timed alone (CUDA events, median of 20), so
the layers can use the fastest form of each product. Also under
torch.backends.cuda.preferred_blas_library("cublaslt").

    python benchmarks/dev/probe_gemm.py [N] [F] [dtype] [default|cublaslt ...]
"""
import sys

import torch

from profile_layer_host import event_ms   # benchmarks/dev/ (this folder)


def median_ms(fn, repeats=20):
    fn()                                    # warm-up (cuBLAS heuristics, workspace)
    return event_ms(fn, repeats)


def cases(N, F, dtype):
    gen = torch.Generator(device="cuda").manual_seed(0)
    a, g = (torch.randn(N, F, device="cuda", generator=gen, dtype=dtype) for _ in range(2))
    W, W2 = (torch.randn(F, F, device="cuda", generator=gen, dtype=dtype) for _ in range(2))
    b = torch.randn(F, device="cuda", generator=gen, dtype=dtype)
    zero = torch.zeros(F, device="cuda", dtype=dtype)
    out = torch.empty(N, F, device="cuda", dtype=dtype)
    cat = torch.randn(N, 2 * F, device="cuda", generator=gen, dtype=dtype)
    Wcat = torch.cat([W, W2], 0)            # [2F, F]
    Wcat_t = torch.cat([W, W2], 1)          # [F, 2F]
    gt = g.t().contiguous()
    Wt = W.t().contiguous()
    return {
        "fwd  F.linear(a, W)          a W^T": lambda: torch.nn.functional.linear(a, W),
        "fwd  F.linear(a, W, b)       a W^T + b": lambda: torch.nn.functional.linear(a, W, b),
        "fwd  F.linear(a, W, zero)    a W^T + 0": lambda: torch.nn.functional.linear(a, W, zero),
        "fwd  a.mm(W.t())             a W^T": lambda: a.mm(W.t()),
        "fwd  out.addmm_(a, W.t())    out += a W^T": lambda: out.addmm_(a, W.t()),
        "bwd  g.mm(W)                 g W": lambda: g.mm(W),
        "bwd  torch.addmm(zero, g, W) g W + 0": lambda: torch.addmm(zero, g, W),
        "bwd  F.linear(g, Wt)         g (W^T)^T": lambda: torch.nn.functional.linear(g, Wt),
        "bwd  F.linear(g, Wt, zero)   g (W^T)^T + 0": lambda: torch.nn.functional.linear(g, Wt, zero),
        "bwd  out.addmm_(g, W)        out += g W": lambda: out.addmm_(g, W),
        "wgt  g.t().mm(a)             g^T a": lambda: g.t().mm(a),
        "wgt  a.t().mm(g).t()         (a^T g)^T": lambda: a.t().mm(g).t(),
        "wgt  gt.mm(a) (gt contig.)   g^T a": lambda: gt.mm(a),
        "cat  F.linear(a, Wcat)       a [W;W2]^T -> [N,2F]": lambda: torch.nn.functional.linear(a, Wcat),
        "cat  g.mm(Wcat_t)            g [W,W2] -> [N,2F]": lambda: g.mm(Wcat_t),
        "cat  F.linear(cat, Wcat_t)   [a,a2] [W,W2]^T (K=2F)": lambda: torch.nn.functional.linear(cat, Wcat_t),
        "cat  g.t().mm(cat)           g^T [a,a2] -> [F,2F]": lambda: g.t().mm(cat),
    }


def main(N=1 << 20, F=128, dtype="float32", libs=("default", "cublaslt")):
    print(f"N={N} F={F} {dtype}, allow_tf32={torch.backends.cuda.matmul.allow_tf32}; "
          f"one product = {2 * N * F * F / 1e9:.1f} GFLOP; ms (median of 20)")
    for lib in libs:
        if lib != "default":
            try:
                torch.backends.cuda.preferred_blas_library(lib)
            except Exception as exc:  # noqa: BLE001
                print(f"[{lib}] unavailable: {exc}")
                continue
        for name, fn in cases(N, F, getattr(torch, dtype)).items():
            print(f"[{lib:8s}] {name:55s} {median_ms(fn):.3f}", flush=True)
    torch.backends.cuda.preferred_blas_library("cublas")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(*(int(a) for a in args[:2]), *args[2:3], *([tuple(args[3:])] if args[3:] else []))
