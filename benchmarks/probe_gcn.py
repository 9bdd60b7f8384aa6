"""Developer probe (H200): what GCN's normalisation costs inside fastgnn.spmm
on rmat20, F=128, fp32 -- plain sum, the self-loop graph, fused row/column
scales, precomputed per-edge weights in caller order (gathered into CSR
order per call) and in CSR order (gcn_norm_weights: what GCNConv uses), the
bias epilogue, and the bias gradient against torch's sum. One line each."""
import sys

import cupy as cp

import fastgnn
from fastgnn.backends.cuda.spmm import chosen_paths, median_ms
from fastgnn.testing import rmat_edge_index


def main(scale=20, F=128):
    ei, n = rmat_edge_index(scale, xp=cp)
    g = fastgnn.Graph.from_edge_index(ei, num_nodes=n)
    g2, d = fastgnn.gcn_norm_scales(g)
    gw, w = fastgnn.gcn_norm(g)
    _, cw = fastgnn.gcn_norm_weights(g)
    x = cp.random.standard_normal((n, F), dtype=cp.float32)
    b = cp.random.standard_normal(F, dtype=cp.float32)
    t2 = g2.transpose()
    from fastgnn.backends.cuda.spmm import bias_grad
    cases = {
        "plain sum": lambda: fastgnn.spmm(g, x),
        "self-loop graph, sum": lambda: fastgnn.spmm(g2, x),
        "self-loop graph, row+col scales": lambda: fastgnn.spmm(g2, x, row_scale=d, col_scale=d),
        "self-loop graph, col scale": lambda: fastgnn.spmm(g2, x, col_scale=d),
        "self-loop graph, row scale": lambda: fastgnn.spmm(g2, x, row_scale=d),
        "gcn_norm edge weights": lambda: fastgnn.spmm(gw, x, w),
        "gcn_norm edge weights, custom": lambda: fastgnn.spmm(gw, x, w, path="custom"),
        "transpose, row+col scales": lambda: fastgnn.spmm(g2.transpose(), x, row_scale=d,
                                                          col_scale=d),
        "csr-ordered weights (gcn_norm_weights)": lambda: fastgnn.spmm(g2, x, csr_weights=cw),
        "csr-ordered weights + bias": lambda: fastgnn.spmm(g2, x, csr_weights=cw, bias=b),
        "transpose, csr-ordered weights": lambda: fastgnn.spmm(
            t2, x, csr_weights=fastgnn.CsrWeights(cw.transposed, cw.csr)),
        "row+col scales + bias": lambda: fastgnn.spmm(g2, x, row_scale=d, col_scale=d, bias=b),
        "bias grad (column sum)": lambda: bias_grad(g2, x, "float32"),
        "cupy x.sum(0) (for comparison)": lambda: x.sum(0),
    }
    print(f"rmat{scale}: n={n} E={g.num_edges} E+loops={g2.num_edges}")
    for name, fn in cases.items():
        print(f"{name:40s} {median_ms(fn, 20):.3f} ms")
    print("paths:", chosen_paths(g), chosen_paths(g2), chosen_paths(gw))


if __name__ == "__main__":
    main(*map(int, sys.argv[1:3]))
