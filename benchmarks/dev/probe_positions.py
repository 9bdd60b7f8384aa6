"""Developer probe (GPU): the max/min arg positions' type, uint8 (every row
below 256 in-edges: Graph.position_dtype's choice on such graphs) against
uint16 (forced on a second Graph of the same edges), in one process.

Per graph and case, fwd+bwd ms (CUDA events, median of `calls` after a
warm-up; the two position types alternate call by call so drift hits both):
segment_reduce max and mean+max+min+std through torch autograd, and
SAGEConv(aggr="max") (F = 128, fp32). Graphs with a row of 256 in-edges or
more take uint16 either way and are skipped.

    python benchmarks/dev/probe_positions.py [calls] [graph spec ...]
"""
import statistics
import sys

import numpy as np
import torch

import fastgnn.torch as ft
from fastgnn.bench import graphs

F = 128
SPECS = ["uniform17", "mesh3d44k26", "clustered16", "uniform20", "clustered19", "mesh3d88k26"]


def alternating_ms(steps: dict, calls: int) -> dict:
    """{name: median ms} of each step, the steps called in turn `calls` times."""
    times = {k: [] for k in steps}
    for step in steps.values():                # warm-up (compiles, caches, allocator)
        for _ in range(3):
            step()
    for _ in range(calls):
        for k, step in steps.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            b.synchronize()
            times[k].append(a.elapsed_time(b))
    return {k: statistics.median(v) for k, v in times.items()}


def main(calls=20, specs=SPECS):
    dev = torch.device("cuda")
    torch.manual_seed(0)
    print(f"fwd+bwd ms, median of {calls}, F={F} fp32; uint8 positions vs uint16 "
          "(same edges, second Graph)")
    for spec in specs:
        g = graphs.make(spec, torch, dev)
        ei, n = g.edge_index, g.num_nodes
        narrow = ft.to_graph(ei, n)
        if narrow.position_dtype != np.uint8:
            print(f"{spec}: positions {narrow.position_dtype} (a row of 256+ in-edges), skipped")
            continue
        wide = ft.to_graph(ei.clone(), n)
        wide.cache["position_dtype"] = np.dtype(np.uint16)   # before anything asks for it
        x = torch.randn(n, F, device=dev, requires_grad=True)
        sage = ft.SAGEConv(F, F, aggr="max").to(dev)
        params = [x, *sage.parameters()]
        cases = {
            "max": (lambda G: ft.segment_reduce(G, x, "max"), [x]),
            "mean+max+min+std": (lambda G: ft.segment_reduce(G, x, ["mean", "max", "min", "std"]),
                                 [x]),
            "SAGEConv_max": (lambda G: sage(x, G), params),
        }
        print(f"{spec}: {n} nodes, {ei.shape[1]} edges, max in-degree "
              f"{int(narrow.in_degree.max())}", flush=True)
        for case, (fn, wrt) in cases.items():
            cot = torch.randn_like(fn(narrow))

            def step(G, fn=fn, wrt=wrt, cot=cot):
                torch.autograd.grad(fn(G), wrt, cot)
            ms = alternating_ms({"uint8": lambda: step(narrow), "uint16": lambda: step(wide)},
                                calls)
            print(f"  {case:18s} uint8 {ms['uint8']:7.3f}  uint16 {ms['uint16']:7.3f}  "
                  f"ratio {ms['uint16'] / ms['uint8']:.3f}", flush=True)
        del narrow, wide, x, sage, params
        torch.cuda.empty_cache()


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]) if a else 20, a[1:] or SPECS)
