"""Developer probe: where fastgnn.torch's per-call host time goes on a small
graph (the GPU work is tiny, so a call costs what Python does). cProfile over
fwd+bwd calls of spmm, segment max and gatv2 attention; prints the top
functions by cumulative and by own time.

    python benchmarks/profile_overhead.py [scale] [calls]
"""
import cProfile
import pstats
import sys
import time

import torch

import fastgnn.torch as ft
from fastgnn.testing import rmat_edge_index


def main(scale=14, calls=200):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ei, n = rmat_edge_index(scale)
    ei = torch.from_numpy(ei).to(dev)
    x = torch.randn(n, 64, device=dev, requires_grad=True)
    xl = torch.randn(n, 4, 16, device=dev, requires_grad=True)
    xr = torch.randn(n, 4, 16, device=dev, requires_grad=True)
    att = torch.randn(4, 16, device=dev, requires_grad=True)
    g = ft.to_graph(ei, n)
    cases = {
        "spmm": lambda: ft.spmm(g, x).sum().backward(),
        "segment_max": lambda: ft.segment_reduce(g, x, "max").sum().backward(),
        "gatv2": lambda: ft.edge_attention(g, "gatv2", xl=xl, xr=xr, att=att).sum().backward(),
    }
    for name, step in cases.items():
        for _ in range(5):
            step()
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            step()
        if dev == "cuda":
            torch.cuda.synchronize()
        per_call = (time.perf_counter() - t0) / calls * 1e3
        print(f"== {name} on rmat{scale} ({dev}): {per_call:.3f} ms per fwd+bwd (wall, incl. .sum())")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            step()
        prof.disable()
        st = pstats.Stats(prof)
        st.sort_stats("cumulative").print_stats(22)
        st.sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
