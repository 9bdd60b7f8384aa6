"""Developer probe (GPU): how much of a SAGEConv(aggr="max") forward+backward
on a mid-sized graph is the aggregation's host time, and how much is what any
PyTorch layer with the same two linears costs. Per graph, host ms per call
(perf_counter over back-to-back calls, no sync) and CUDA-event ms per call of:

  layer      fastgnn.torch.SAGEConv(F, F, aggr="max"), forward + autograd.grad
  unfused    the same layer with its one-node path (segment_reduce_linear)
             switched off: the reduction's node, then torch's linear and add
  linears    the same layer's lin_l(x) + lin_r(x) with the aggregation left
             out (torch's Linear and addmm_: the floor of any aggregation)
  aggr op    fastgnn.torch.segment_reduce(..., "max") alone, forward + grad

    python benchmarks/dev/probe_host_floor.py [graph spec ...]

ROUNDS=k in the environment: only layer and unfused, alternated k times
(an A/B in one run, for graphs whose timings move between runs).
"""
import os
import sys

import torch

import fastgnn.torch as ft
from fastgnn.bench import graphs
from profile_layer_host import event_ms, host_ms   # benchmarks/dev/ (this folder)

F = 128
DEVICE = "cuda"


def main(specs):
    dev = torch.device(DEVICE)
    for spec in specs:
        g = graphs.make(spec, torch, dev)
        ei, n = g.edge_index, g.num_nodes
        layer = ft.SAGEConv(F, F, aggr="max").to(dev)
        x = torch.randn(n, F, device=dev, requires_grad=True)
        cot = torch.randn(n, F, device=dev)
        params = [x, *layer.parameters()]

        def layer_step():
            torch.autograd.grad(layer(x, ei), params, cot)

        def unfused_step():
            layer._segment_linear = lambda *args: None      # the instance only
            try:
                layer_step()
            finally:
                del layer._segment_linear

        def linears_step():
            out = layer.lin_l(x)
            out = out.addmm_(x, layer.lin_r.weight.t())
            torch.autograd.grad(out, params, cot)

        def aggr_step():
            out = ft.segment_reduce(ei, x, reduce="max")
            torch.autograd.grad(out, [x], cot)

        print(f"graph {g.name}: {n} nodes, {ei.shape[1]} edges, F={F}")
        rounds = int(os.environ.get("ROUNDS", "0"))
        steps = ((("layer", layer_step), ("unfused", unfused_step)) * rounds if rounds else
                 (("layer", layer_step), ("unfused", unfused_step), ("linears", linears_step),
                  ("aggr op", aggr_step)))
        for name, step in steps:
            for _ in range(10):
                step()
            host, _ = host_ms(step, 200)
            print(f"  {name:8s} host {host:.3f} ms/call, events {event_ms(step, 100):.3f} ms",
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["mesh3d44k26", "uniform17", "clustered16"])
