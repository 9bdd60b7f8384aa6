"""Developer probe (GPU): spmm_fwd and segment_fwd against the feature-slice
target (SLICE_TARGET_THREADS; 1 = one slice, the walk without grid y) on
first layers of wide raw features (Cora, CiteSeer) and on rmat18 at
F = 128 (many tasks: one slice whatever the target). CUDA events
(spmm.median_ms: one warm-up call, median of 30). Usage: python benchmarks/dev/probe_feature_slices.py"""
import cupy as cp
import numpy as np

import fastgnn
from fastgnn import datasets
from fastgnn.backends.cuda import segment as cseg
from fastgnn.backends.cuda import spmm as cs
from fastgnn.testing import rmat_edge_index

TARGETS = (1, 1 << 19, 1 << 20, 1 << 21, 1 << 22, 1 << 23, 1 << 30)


def graphs():
    for name in ("Cora", "CiteSeer"):
        d = datasets.load(datasets.find(name))
        x = d.x.toarray() if hasattr(d.x, "toarray") else d.x
        yield name, d.edge_index, d.num_nodes, np.ascontiguousarray(x, dtype=np.float32)
    ei, n = rmat_edge_index(18)
    yield "rmat18", np.asarray(ei), n, np.random.default_rng(0).standard_normal((n, 128), dtype=np.float32)


def main():
    default = cs.SLICE_TARGET_THREADS
    print("graph        F  op           " + " ".join(f"{t:>9}" for t in TARGETS) + "  (ms)")
    for name, ei, n, x in graphs():
        g = fastgnn.Graph.from_edge_index(cp.asarray(ei), num_nodes=n)
        xd = cp.asarray(x)
        ref_spmm = ref_max = None
        rows = {"spmm sum": [], "segment max": []}
        for target in TARGETS:
            cs.SLICE_TARGET_THREADS = target
            g.cache.clear()
            o1 = cs.spmm_custom(g, xd, None, "float32")
            o2 = cseg.segment_fwd(g, xd, ("max",), "float32", residuals=True)[0]
            if ref_spmm is None:
                ref_spmm, ref_max = o1.copy(), o2.copy()
            assert bool((o1 == ref_spmm).all()) and bool((o2 == ref_max).all()), (name, target)
            rows["spmm sum"].append(cs.median_ms(lambda: cs.spmm_custom(g, xd, None, "float32"),
                                                 repeats=30))
            rows["segment max"].append(cs.median_ms(
                lambda: cseg.segment_fwd(g, xd, ("max",), "float32", residuals=True), repeats=30))
        for op, ts in rows.items():
            print(f"{name:9} {x.shape[1]:5}  {op:12} " + " ".join(f"{t:9.4f}" for t in ts))
    cs.SLICE_TARGET_THREADS = default


if __name__ == "__main__":
    main()
