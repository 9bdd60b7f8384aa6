"""Developer tool: where a drop-in layer's forward+backward time goes on the
GPU (torch.profiler), to compare against the op-level benchmark.

    python benchmarks/dev/profile_layers.py [layer] [fp32|bf16|fp16]
"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import fastgnn.torch as ft


def main(layer="GCNConv", dtype="fp32", scale=20, F=128):
    import cupy as cp
    from fastgnn.testing import rmat_edge_index
    ei, n = rmat_edge_index(scale, xp=cp)
    ei = torch.from_dlpack(ei)
    x = torch.randn(n, F, device="cuda", requires_grad=True)
    heads = 4
    make = {"GCNConv": lambda: ft.GCNConv(F, F, cached=True),
            "SAGEConv": lambda: ft.SAGEConv(F, F),
            "SAGEConv_max": lambda: ft.SAGEConv(F, F, aggr="max"),
            "GATConv": lambda: ft.GATConv(F, F // heads, heads=heads),
            "GATv2Conv": lambda: ft.GATv2Conv(F, F // heads, heads=heads),
            "TransformerConv": lambda: ft.TransformerConv(F, F // heads, heads=heads)}
    if layer not in make:
        raise SystemExit(f"layer must be one of {sorted(make)}, got {layer!r}")
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if dtype not in dtypes:
        raise SystemExit(f"dtype must be one of {sorted(dtypes)}, got {dtype!r}")
    mod = make[layer]().cuda().to(dtypes[dtype])
    x = x.detach().to(dtypes[dtype]).requires_grad_()
    g = torch.randn(n, F, device="cuda", dtype=dtypes[dtype])

    def step():
        out = mod(x, ei)
        out.backward(g)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    for _ in range(10):
        step()
    ev[1].record()
    torch.cuda.synchronize()
    print(f"{layer} {dtype}: {ev[0].elapsed_time(ev[1]) / 10:.3f} ms per fwd+bwd (mean of 10)")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main(*sys.argv[1:3])
