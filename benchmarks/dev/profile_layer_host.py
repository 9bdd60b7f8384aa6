"""Developer probe (GPU): host time against GPU time of one drop-in layer's
forward and forward+backward on a small graph, where a call costs what Python
and the launches cost rather than what the kernels move.

For each phase it prints: host ms per call (perf_counter over back-to-back
calls, no sync: what the CPU spends), CUDA-event ms per call (what the bench
reports), GPU kernel ms per call (torch.profiler, sum of device time), the
per-call counts of CUDA runtime calls that block or cost (synchronize,
memcpy, malloc, launches), and cProfile's top functions by own time.

    python benchmarks/dev/profile_layer_host.py [graph spec] [layer] [calls]
    python benchmarks/dev/profile_layer_host.py file:.data/soc-brightkite.txt SAGEConv_max 200
"""
import cProfile
import pstats
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import fastgnn.torch as ft
from fastgnn.bench import graphs

F, HEADS = 128, 4
LAYERS = {
    "SAGEConv_max": lambda: ft.SAGEConv(F, F, aggr="max"),
    "SAGEConv": lambda: ft.SAGEConv(F, F),
    "GCNConv": lambda: ft.GCNConv(F, F, cached=True),
    "GATv2Conv": lambda: ft.GATv2Conv(F, F // HEADS, heads=HEADS),
    "TransformerConv": lambda: ft.TransformerConv(F, F // HEADS, heads=HEADS),
}
RUNTIME_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync",
                 "cudaMemcpy", "cudaMalloc", "cudaFree", "cudaLaunchKernel", "cuLaunchKernel",
                 "cudaEventSynchronize", "cudaStreamWaitEvent")


def event_ms(step, calls):
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(calls)]
    torch.cuda.synchronize()
    for a, b in ev:
        a.record()
        step()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


def host_ms(step, calls):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        step()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / calls * 1e3, (t2 - t0) / calls * 1e3


def print_times(name, step, calls, unit="call", top=12, profiled=20):
    """One line of host ms, wall ms, CUDA-event ms and GPU kernel ms per
    step (torch.profiler over `profiled` steps), with the counts of the
    costly CUDA runtime calls per step, then the `top` kernels."""
    host, wall = host_ms(step, calls)
    ev = event_ms(step, calls)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(profiled):
            step()
        torch.cuda.synchronize()
    avg = prof.key_averages()
    gpu = sum(e.self_device_time_total for e in avg
              if e.device_type.name == "CUDA") / (profiled * 1e3)
    counts = {e.key: e.count / profiled for e in avg if e.key in RUNTIME_CALLS}
    print(f"== {name}: host {host:.3f} ms/{unit}, wall {wall:.3f}, events {ev:.3f}, "
          f"GPU kernels {gpu:.3f} ms/{unit}; runtime calls per {unit}: "
          + ", ".join(f"{k} {v:g}" for k, v in sorted(counts.items())), flush=True)
    kernels = sorted((e for e in avg if e.device_type.name == "CUDA"),
                     key=lambda e: -e.self_device_time_total)[:top]
    for e in kernels:
        print(f"   {e.self_device_time_total / (profiled * 1e3):7.3f} ms "
              f"x{e.count / profiled:g}  {e.key[:90]}")


def main(spec="file:.data/soc-brightkite.txt", layer="SAGEConv_max", calls=200):
    dev = torch.device("cuda")
    g = graphs.make(spec, torch, dev)
    ei, n = g.edge_index, g.num_nodes
    print(f"graph {g.name}: {n} nodes, {ei.shape[1]} edges; layer {layer}, F={F}")
    mod = LAYERS[layer]().to(dev)
    x = torch.randn(n, F, device=dev, requires_grad=True)
    cot = torch.randn(n, F, device=dev)
    params = [x, *mod.parameters()]

    def fwd():
        with torch.no_grad():
            mod(x, ei)

    def fwd_bwd():
        out = mod(x, ei)
        torch.autograd.grad(out, params, cot)

    for name, step in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
        for _ in range(10):
            step()
        print_times(name, step, calls, "call", top=12)
        prof_py = cProfile.Profile()
        prof_py.enable()
        for _ in range(calls):
            step()
        prof_py.disable()
        torch.cuda.synchronize()
        st = pstats.Stats(prof_py)
        print(f"   python function calls per call: {st.total_calls / calls:.0f}")
        st.sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0] if a else "file:.data/soc-brightkite.txt", a[1] if len(a) > 1 else "SAGEConv_max",
         int(a[2]) if len(a) > 2 else 200)
