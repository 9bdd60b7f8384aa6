"""Developer probe (GPU): the spread of a drop-in layer's host time per
forward+backward call, against the bench's CUDA-event figure, on a small
graph. The bench (fastgnn.bench.core.time_calls) records events around each
of 10 back-to-back calls; other probes report a median of per-call host
stamps. When the two disagree, this shows why: per call, the host ms
(perf_counter around forward + autograd.grad) as p10 / p50 / p90 / max and
mean, and the events median, with Python's cyclic garbage collector on, off
(gc.disable) and with the process's objects frozen out of it (gc.freeze).

    python benchmarks/probe_call_spread.py [graph spec] [layer] [calls]
"""
import gc
import statistics
import sys
import time

import torch

from fastgnn.bench import graphs
from profile_layer_host import F, LAYERS   # benchmarks/ (this folder)


def spread(step, calls):
    host, ev = [], []
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(calls)]
    torch.cuda.synchronize()
    for a, b in pairs:
        t0 = time.perf_counter()
        a.record()
        step()
        b.record()
        host.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    ev = [a.elapsed_time(b) for a, b in pairs]
    q = statistics.quantiles(host, n=10)
    return (f"host p10 {q[0]:.3f} p50 {statistics.median(host):.3f} p90 {q[-1]:.3f} "
            f"max {max(host):.3f} mean {statistics.mean(host):.3f} | events p50 "
            f"{statistics.median(ev):.3f} mean {statistics.mean(ev):.3f} ms")


def main(spec="mesh3d44k26", layer="SAGEConv_max", calls=200):
    dev = torch.device("cuda")
    g = graphs.make(spec, torch, dev)
    ei, n = g.edge_index, g.num_nodes
    mod = LAYERS[layer]().to(dev)
    x = torch.randn(n, F, device=dev, requires_grad=True)
    cot = torch.randn(n, F, device=dev)
    params = [x, *mod.parameters()]

    def step():
        torch.autograd.grad(mod(x, ei), params, cot)
    print(f"graph {g.name}: {n} nodes, {ei.shape[1]} edges; {layer}, F={F}; gc thresholds "
          f"{gc.get_threshold()}, {len(gc.get_objects())} tracked objects", flush=True)
    for _ in range(10):
        step()
    for label, setup, undo in (("gc on", lambda: None, lambda: None),
                               ("gc off", gc.disable, gc.enable),
                               ("gc frozen", gc.freeze, gc.unfreeze)):
        setup()
        try:
            print(f"  {label:10s} {calls} calls: {spread(step, calls)}", flush=True)
            # the bench's form: 10 calls after 1 warm-up, five times
            rows = []
            for _ in range(5):
                step()
                rows.append(spread(step, 10).split("| ")[1])
            print(f"  {label:10s} 10 calls x5: " + "; ".join(rows), flush=True)
        finally:
            undo()


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0] if a else "mesh3d44k26", a[1] if len(a) > 1 else "SAGEConv_max",
         int(a[2]) if len(a) > 2 else 200)
