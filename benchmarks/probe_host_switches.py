"""Developer probe (GPU): where small-graph forward+backward time goes, by
switching two host-side mechanisms off one at a time, for a fastgnn.torch
layer and PyG's same layer on the same graph and inputs:

- Python's cyclic garbage collector (gc.disable());
- autograd's device threads (torch.autograd.set_multithreading_enabled(False):
  the backward runs on the calling thread instead of being handed to the
  CUDA device's worker thread and waited for).

Per setting: host ms per call (perf_counter over back-to-back calls) and the
median CUDA-event ms per call (what the bench reports). Neither switch is
something fastgnn sets for its users; the probe only says what they cost.

    python benchmarks/probe_host_switches.py [graph spec] [layer] [calls]
    python benchmarks/probe_host_switches.py file:.data/soc-brightkite.txt SAGEConv_max 300
"""
import gc
import sys

import torch

from fastgnn.bench import graphs
from profile_layer_host import F, HEADS, LAYERS, event_ms, host_ms   # benchmarks/ (this folder)


def pyg_layer(name):
    import torch_geometric.nn as pyg
    return {"SAGEConv_max": lambda: pyg.SAGEConv(F, F, aggr="max"),
            "GCNConv": lambda: pyg.GCNConv(F, F, cached=True),
            "GATv2Conv": lambda: pyg.GATv2Conv(F, F // HEADS, heads=HEADS)}[name]()


def measure(step, calls):
    """(host ms per call, median CUDA-event ms per call) after 20 warm-up calls."""
    for _ in range(20):
        step()
    return host_ms(step, calls)[0], event_ms(step, min(calls, 100))


def main(spec="file:.data/soc-brightkite.txt", layer="SAGEConv_max", calls=300):
    dev = torch.device("cuda")
    g = graphs.make(spec, torch, dev)
    ei, n = g.edge_index, g.num_nodes
    print(f"graph {g.name}: {n} nodes, {ei.shape[1]} edges; {layer}, F={F}; "
          "host ms/call / CUDA-event ms/call, fwd+bwd")
    x = torch.randn(n, F, device=dev, requires_grad=True)
    for impl, make in (("fastgnn", LAYERS[layer]), ("pyg", lambda: pyg_layer(layer))):
        mod = make().to(dev)
        params = [x, *mod.parameters()]
        cot = torch.randn(mod(x, ei).shape, device=dev)

        def step():
            torch.autograd.grad(mod(x, ei), params, cot)

        cells = []
        for gc_on in (True, False):
            for mt in (True, False):
                (gc.enable if gc_on else gc.disable)()
                torch.autograd.set_multithreading_enabled(mt)
                host, ev = measure(step, calls)
                cells.append(f"gc {'on ' if gc_on else 'off'} mt {'on ' if mt else 'off'}: "
                             f"{host:.3f} / {ev:.3f}")
        gc.enable()
        torch.autograd.set_multithreading_enabled(True)
        print(f"{impl:8s} " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    main(*(args[:2]), *(int(a) for a in args[2:3]))
