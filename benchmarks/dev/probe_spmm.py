"""Developer probe (GPU): the SpMM paths on rmat20 (developer tool; the full
benchmark is `python -m fastgnn.bench`). Prints one line per variant."""
import sys
import time

import cupy as cp
import numpy as np
import torch

import fastgnn
import importlib
from fastgnn.testing import rmat_edge_index


cs = importlib.import_module("fastgnn.backends.cuda.spmm")


def bench(fn, reps=20):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return float(np.median(ts))


def main(scale=20, F=128):
    t0 = time.time()
    ei, n = rmat_edge_index(scale, xp=cp)
    g = fastgnn.Graph.from_edge_index(ei, num_nodes=n)
    print(f"rmat{scale}: n={n} E={g.num_edges} maxdeg={int(g.in_degree.max())} build {time.time()-t0:.1f}s")
    x = cp.random.standard_normal((n, F), dtype=cp.float32)
    t = g.transpose()
    rows = []
    for chunk in cs.CHUNKS:
        rows.append((f"custom chunk={chunk}", bench(lambda: cs.spmm_custom(g, x, None, "float32", chunk))))
    for alg in cs.CUSPARSE_ALGS:
        try:
            rows.append((f"cusparse {alg}", bench(lambda: cs.spmm_cusparse(g, x, None, "float32", alg))))
            r1 = cs.spmm_cusparse(g, x, None, "float32", alg).copy()
            r2 = cs.spmm_cusparse(g, x, None, "float32", alg)
            rows.append((f"  {alg} bitwise repeatable", str(bool((r1 == r2).all()))))
        except Exception as e:
            rows.append((f"cusparse {alg}", f"failed {e}"))
    xb = cp.random.standard_normal((n, F), dtype=cp.float32).astype(cp.float16).view(cp.uint16)
    for chunk in cs.CHUNKS:
        rows.append((f"custom bf16 chunk={chunk}", bench(lambda: cs.spmm_custom(g, xb, None, "bfloat16", chunk))))
    rows.append(("auto fwd", bench(lambda: fastgnn.spmm(g, x))))
    rows.append(("auto bwd (transpose)", bench(lambda: fastgnn.spmm(t, x))))
    print(cs.chosen_paths(g), cs.chosen_paths(t))
    # torch.sparse.mm baseline
    src, dst = torch.from_dlpack(ei[0]), torch.from_dlpack(ei[1])
    A = torch.sparse_coo_tensor(torch.stack([dst, src]), torch.ones(src.numel(), device="cuda"), (n, n)).coalesce().to_sparse_csr()
    xt = torch.from_dlpack(x)
    rows.append(("torch.sparse.mm csr", bench(lambda: torch.sparse.mm(A, xt))))
    for name, v in rows:
        print(f"{name:28s} {v if isinstance(v, str) else f'{v:8.3f} ms'}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
