"""Developer probe (CUDA): what a new graph costs a training step.

A 3-layer model of fastgnn.torch's drop-in layers trains on batches of small
random graphs (a disjoint union of `graphs` graphs of 10-40 nodes, F = 64,
hidden 128), a new batch every step against the same batch repeated; prints
the median ms per step of both and, with `profile`, cProfile's top functions
(cumulative) over the new-graph steps, so that what remains of the per-graph
host work can be read off by name.

    python benchmarks/dev/probe_new_graph.py [MODEL ...] [--graphs 128] [--profile] [--gc-off] [--one-thread] [--phases]
    python benchmarks/dev/probe_new_graph.py GCN --sampled rmat19e50   # sampled batches instead

`--sampled GRAPH` trains on neighbour-sampled batches of a bench graph
(fastgnn.bench.graphs names; the mini-batch suite's fanouts 15, 10, 5 and
1024 seeds, F = 128, hidden 256) instead of small graphs, the loss on the
seeds only, as the mini-batch suite does.

`--phases` also prints the host time (no synchronisation) of the forward,
the backward call and the optimizer step, new graph against same graph, and
how long the GPU then takes to drain: host work shows in the first three,
waiting for the GPU inside a phase shows as a phase that grows while the
drain shrinks.

MODEL: GCN, SAGE-mean, SAGE-max, GIN, GAT, GATv2, Transformer (default GCN GAT).
"""
import argparse
import cProfile
import gc
import pstats
import time

import torch

import fastgnn.torch as ft

HIDDEN, F_IN, CLASSES, STEPS, POOL = 128, 64, 8, 30, 16
F_IN_SAMPLED = 128


def batch(rng_seed, graphs, device):
    """(x [N, F_IN], edge_index [2, E], y [N]) of a disjoint union of small graphs."""
    g = torch.Generator().manual_seed(rng_seed)
    eis, n = [], 0
    for _ in range(graphs):
        k = int(torch.randint(10, 41, (1,), generator=g))
        src = torch.randint(0, k, (2 * k,), generator=g)
        dst = torch.randint(0, k, (2 * k,), generator=g)
        eis.append(torch.stack([src, dst]) + n)
        n += k
    ei = torch.cat(eis, 1)
    return (torch.randn(n, F_IN, generator=g).to(device), ei.to(device),
            torch.randint(0, CLASSES, (n,), generator=g).to(device))


def sampled_pool(graph, device):
    """POOL (x, EdgeIndex, y) of neighbour-sampled batches of the bench graph,
    y [n] with the seeds' labels in front and -100 (ignored) elsewhere."""
    from fastgnn.bench import cases_minibatch as mb
    wl = mb.sampled_workload(torch, device, graph=graph, features=F_IN_SAMPLED,
                             hidden=HIDDEN, fanouts=(15, 10, 5), batch_size=1024, pool=POOL)
    out = []
    for b in wl.pool:
        x, ei, y_seeds, bs = b.inputs()
        y = torch.full((x.shape[0],), -100, dtype=torch.int64, device=device)
        y[:bs] = y_seeds % CLASSES
        out.append((x, ei, y))
    return out


def model(name, f_in=None):
    f_in = F_IN if f_in is None else f_in

    def conv(i, o, last):
        if name == "GCN":
            return ft.GCNConv(i, o)
        if name.startswith("SAGE-"):
            return ft.SAGEConv(i, o, aggr=name.split("-")[1])
        if name == "GIN":
            return ft.GINConv(torch.nn.Sequential(torch.nn.Linear(i, o), torch.nn.ReLU(),
                                                  torch.nn.Linear(o, o)))
        cls = {"GAT": ft.GATConv, "GATv2": ft.GATv2Conv, "Transformer": ft.TransformerConv}[name]
        return cls(i, o, heads=1) if last else cls(i, o // 4, heads=4)
    return torch.nn.ModuleList([conv(f_in, HIDDEN, False), conv(HIDDEN, HIDDEN, False),
                                conv(HIDDEN, CLASSES, True)])


def loss_of(convs, opt, x, ei, y):
    """The forward: gradients zeroed, the layers with ReLU between, the loss."""
    opt.zero_grad()
    h = x
    for i, c in enumerate(convs):
        h = c(h, ei)
        if i < len(convs) - 1:
            h = h.relu()
    return torch.nn.functional.cross_entropy(h, y)


def step(convs, opt, x, ei, y):
    loss_of(convs, opt, x, ei, y).backward()
    opt.step()


def phases(convs, opt, batches):
    """Median host ms of forward, backward, optimizer step and the drain after them."""
    rows = []
    for x, ei, y in batches:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = loss_of(convs, opt, x, ei, y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        torch.cuda.synchronize()
        t4 = time.perf_counter()
        rows.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3))
    return [sorted(c)[len(c) // 2] * 1e3 for c in zip(*rows)]


def timed(fn, steps):
    times = []
    for _ in range(steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("models", nargs="*", default=["GCN", "GAT"])
    p.add_argument("--graphs", type=int, default=128)
    p.add_argument("--sampled", metavar="GRAPH", default=None,
                   help="neighbour-sampled batches of this bench graph instead of small graphs")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--gc-off", action="store_true",
                   help="Python's cyclic garbage collector off while timing")
    p.add_argument("--phases", action="store_true",
                   help="host ms of forward, backward, optimizer step and the drain")
    p.add_argument("--one-thread", action="store_true",
                   help="autograd's backward on the calling thread (no device thread)")
    a = p.parse_args()
    if a.one_thread:
        torch.autograd.set_multithreading_enabled(False)
    if a.gc_off:
        gc.collect()
        gc.disable()
    dev = torch.device("cuda")
    if a.sampled:
        pool = sampled_pool(a.sampled, dev)
    else:
        pool = [batch(s, a.graphs, dev) for s in range(POOL)]
    f_in = pool[0][0].shape[1]
    for name in a.models:
        torch.manual_seed(0)
        convs = model(name, f_in).to(dev)
        opt = torch.optim.Adam(convs.parameters(), lr=1e-3)
        it = iter(range(10**9))
        for b in pool[:3]:
            step(convs, opt, *b)
        new = timed(lambda: step(convs, opt, *pool[next(it) % POOL]), STEPS)
        same = timed(lambda: step(convs, opt, *pool[0]), STEPS)
        n = sum(b[0].shape[0] for b in pool) / POOL
        e = sum(b[1].shape[1] for b in pool) / POOL
        print(f"{name:12s} {n:7.0f} nodes {e:7.0f} edges: new {new:7.3f} ms  same {same:7.3f} "
              f"ms  overhead {new - same:+7.3f} ms")
        if a.phases:
            for label, bs in (("new", [pool[k % POOL] for k in range(STEPS)]), ("same", [pool[0]] * STEPS)):
                f, b, o, d = phases(convs, opt, bs)
                print(f"  {label:4s} host ms: forward {f:6.2f}  backward {b:6.2f}  step {o:6.2f}"
                      f"  drain {d:6.2f}")
        if a.profile:
            # (autograd's backward on this thread: from Python 3.12 cProfile
            # sees every thread's calls in one profile and misattributes them)
            threaded = torch.autograd.is_multithreading_enabled()
            torch.autograd.set_multithreading_enabled(False)
            prof = cProfile.Profile()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            prof.enable()
            for k in range(POOL):
                step(convs, opt, *pool[k])
            torch.cuda.synchronize()
            prof.disable()
            print(f"  profiled {POOL} new-graph steps: {(time.perf_counter() - t0) * 1e3 / POOL:.2f}"
                  " ms each")
            pstats.Stats(prof).sort_stats("cumulative").print_stats(28)
            pstats.Stats(prof).sort_stats("tottime").print_stats(20)
            torch.autograd.set_multithreading_enabled(threaded)


if __name__ == "__main__":
    main()
