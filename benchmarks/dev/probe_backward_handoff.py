"""Developer probe (GPU): where a drop-in layer's forward+backward spends its
host time on a small graph, with autograd's device threads on and off.

Per call it stamps perf_counter (no syncs) at: forward start, forward end,
entry and exit of fastgnn's backward body (FastgnnFunction.backward, wrapped
here; it runs on autograd's CUDA device thread when multithreading is on),
and the return of torch.autograd.grad. Medians per segment:

    fwd      forward of the layer
    pre      autograd.grad called -> fastgnn's backward entered
             (the nodes before it: the linear layers' backward, the handoff)
    body     fastgnn's backward itself
    post     fastgnn's backward left -> autograd.grad returned
             (the nodes after it, the wake-up of the calling thread)

Settings: multithreading on / off, on with sys.setswitchinterval(1e-6) (if
the GIL hand-over is what waits, that shortens it), and on with the calling
thread and the device thread pinned to one core (if the two threads' cache
traffic is what costs, that removes it). "cpu": the thread's CPU time
(time.thread_time) in that segment; wall above cpu is waiting. The op alone
(fastgnn.torch.segment_reduce) gives the same stamps without the linear layers.

    python benchmarks/dev/probe_backward_handoff.py [graph spec] [layer] [calls]
    python benchmarks/dev/probe_backward_handoff.py file:.data/soc-brightkite.txt SAGEConv_max 200
    python benchmarks/dev/probe_backward_handoff.py uniform17 SAGEConv_max 200 generic

A fourth argument "generic" turns fastgnn.torch's CUDA launch plans off
(_autograd.PLANS = False): the DLPack bridge's figures.
"""
import os
import statistics
import sys
import threading
import time

import torch

import fastgnn.torch as ft
from fastgnn.torch import functional
from fastgnn.torch._autograd import FastgnnFunction
from fastgnn.bench import graphs
from profile_layer_host import F, LAYERS   # benchmarks/dev/ (this folder)

STAMPS = []          # per backward: (enter, leave, thread CPU seconds, thread name)
PIN = []             # [core]: the backward's thread pins itself there (Linux)


PIECES = {}         # name -> seconds spent in it during the current call


def _wrap_backward():
    for cls in (FastgnnFunction, functional._SegmentReduceLinear):
        _wrap_one(cls)
    # pieces of the fused node's backward body (the rest of it: the inline
    # weight-gradient GEMMs and Python)
    for name in ("_backward", "g_w", "bias_grad"):
        setattr(functional, name, _timed(name, getattr(functional, name)))


def _timed(name, fn):
    def wrapped(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            PIECES[name] = PIECES.get(name, 0.0) + time.perf_counter() - t0
    return wrapped


def _wrap_one(cls):
    inner = cls.backward

    def backward(ctx, *grad_outs):
        if PIN and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {PIN[0]})          # 0: the calling thread
        t0, c0 = time.perf_counter(), time.thread_time()
        r = inner(ctx, *grad_outs)
        STAMPS.append((t0, time.perf_counter(), time.thread_time() - c0,
                       threading.current_thread().name))
        return r
    cls.backward = staticmethod(backward)


def timeline(forward, params, cot, calls):
    rows, pieces = [], []
    for k in range(calls + 10):
        STAMPS.clear()
        PIECES.clear()
        t0, c0 = time.perf_counter(), time.thread_time()
        out = forward()
        t1, c1 = time.perf_counter(), time.thread_time()
        torch.autograd.grad(out, params, cot)
        t3 = time.perf_counter()
        if k >= 10 and STAMPS:
            b0 = min(s[0] for s in STAMPS)
            b1 = max(s[1] for s in STAMPS)
            rows.append((t1 - t0, c1 - c0, b0 - t1, b1 - b0, sum(s[2] for s in STAMPS), t3 - b1,
                         t3 - t0, STAMPS[0][3]))
            pieces.append(dict(PIECES))
    torch.cuda.synchronize()
    med = [statistics.median(r[i] for r in rows) * 1e3 for i in range(7)]
    body = "  ".join(f"{k} {statistics.median(p.get(k, 0.0) for p in pieces) * 1e3:.3f}"
                     for k in sorted({k for p in pieces for k in p}))
    return ("fwd {:.3f} (cpu {:.3f})  pre {:.3f}  body {:.3f} (cpu {:.3f})  post {:.3f}  "
            "total {:.3f} ms".format(*med) + f"  (backward on {rows[0][7]!r}; in body: {body})")


def main(spec="file:.data/soc-brightkite.txt", layer="SAGEConv_max", calls=200, device="cuda"):
    dev = torch.device(device)
    g = graphs.make(spec, torch, dev)
    ei, n = g.edge_index, g.num_nodes
    print(f"graph {g.name}: {n} nodes, {ei.shape[1]} edges; {layer}, F={F}; host ms per call, "
          "median")
    _wrap_backward()
    x = torch.randn(n, F, device=dev, requires_grad=True)
    mod = LAYERS[layer]().to(dev)
    cases = {layer: (lambda: mod(x, ei), [x, *mod.parameters()]),
             "segment_reduce max alone": (lambda: ft.segment_reduce(ei, x, "max", n), [x])}
    switch = sys.getswitchinterval()
    for name, (forward, params) in cases.items():
        cot = torch.randn(forward().shape, device=dev)
        for label, mt, interval in (("mt on ", True, switch), ("mt off", False, switch),
                                    ("mt on, switchinterval 1e-6", True, 1e-6)):
            torch.autograd.set_multithreading_enabled(mt)
            sys.setswitchinterval(interval)
            print(f"{name:26s} {label:28s} {timeline(forward, params, cot, calls)}", flush=True)
        torch.autograd.set_multithreading_enabled(True)
        sys.setswitchinterval(switch)
    # last (the device thread stays pinned): both threads on one core
    if hasattr(os, "sched_setaffinity"):
        core = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {core})
        PIN.append(core)
        for name, (forward, params) in cases.items():
            cot = torch.randn(forward().shape, device=dev)
            print(f"{name:26s} {'mt on, one core':28s} {timeline(forward, params, cot, calls)}",
                  flush=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[3:] == ["generic"]:
        from fastgnn.torch import _autograd
        _autograd.PLANS = False
    main(a[0] if a else "file:.data/soc-brightkite.txt", a[1] if len(a) > 1 else "SAGEConv_max",
         int(a[2]) if len(a) > 2 else 200)
