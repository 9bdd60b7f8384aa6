"""Developer tool (GPU): where one fastgnn.torch op's forward+backward time
goes, as the op benchmark calls it (a graph built once by to_graph, x
[n, F] fp32 requiring grad, torch.autograd.grad with a fixed cotangent).

Prints the CUDA-event median of 30 forward and forward+backward calls
(after 5 warm-up calls), then torch.profiler's CUDA kernels over 10
forward+backward calls (time per call), so that the sum of the kernels can
be read against the event time.

    python benchmarks/dev/profile_op.py [graph spec] [spmm|max|mean] [F]
    python benchmarks/dev/profile_op.py npz:tolokers max 128
"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import fastgnn.torch as ft
from fastgnn.bench import graphs as bgraphs
from fastgnn.bench.core import time_calls


def events_ms(fn):
    """The op benchmark's time per call (CUDA events, 5 warm-up calls, median of 30)."""
    return time_calls(torch, fn, repeats=30, warmup=5, cuda=True)[0]


def main(spec="npz:tolokers", op="spmm", F=128):
    name, desc, build = bgraphs.parse(spec)
    ei, n, *_ = build(__import__("numpy"), 0)
    ei = torch.as_tensor(ei, device="cuda")
    g = ft.to_graph(ei, n)
    x = torch.randn(n, F, device="cuda", requires_grad=True)
    go = torch.randn(n, F, device="cuda")
    call = (lambda: ft.spmm(g, x)) if op == "spmm" else (lambda: ft.segment_reduce(g, x, op))

    def fwd():
        with torch.no_grad():
            return call()

    def fwd_bwd():
        return torch.autograd.grad(call(), [x], go)

    print(f"{name}: {desc}; {n} nodes, {g.num_edges} edges; {op}, F = {F}, fp32")
    print(f"events: fwd {events_ms(fwd):.4f} ms, fwd+bwd {events_ms(fwd_bwd):.4f} ms")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fwd_bwd()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / 10 / 1e3, e.count // 10) for e in prof.key_averages()
            if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    print("kernel ms per fwd+bwd (calls):")
    for key, ms, calls in rows[:15]:
        print(f"  {ms:8.4f}  ({calls})  {key[:110]}")
    print(f"  {sum(r[1] for r in rows):8.4f}  total")


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0] if a else "npz:tolokers", a[1] if len(a) > 1 else "spmm",
         int(a[2]) if len(a) > 2 else 128)
