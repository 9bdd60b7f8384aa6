"""Data-parallel mini-batch training of a 3-layer GraphSAGE or GAT with
torch.nn.parallel.DistributedDataParallel: one process per GPU (or a few on
the CPU), each sampling its own mini-batches from its share of the seed
nodes; prints the training throughput in seed nodes per second.

    torchrun --nproc_per_node=2 examples/ddp_minibatch.py --steps 5         # CPU: gloo, seconds
    torchrun --nproc_per_node=4 examples/ddp_minibatch.py --model gat       # 4 GPUs: NCCL
    torchrun --nproc_per_node=4 examples/ddp_minibatch.py --layers pyg      # PyG's layers

Workload: the sampled one of the mini-batch benchmark (`fastgnn bench --suite
minibatch`, fastgnn/bench/cases_minibatch.py) with its sizes: a generated
graph (--graph; rmat21e50 on a GPU: 2 M nodes, ~98 M edges, rmat12e8 on the
CPU), N(0, 1) features and random labels, the same on every rank (built
from --seed). The nodes, shuffled alike on every rank, are split into
world-size shares; each rank draws batches of --batch-size seed nodes from
its own share and samples --fanouts in-neighbours per node and hop: with
PyG's NeighborLoader where pyg-lib or torch-sparse is installed, else with
the benchmark's sampler (the same layout, in torch on the rank's device;
--sampler picks). A rank samples --pool batches before the clock starts
and cycles through them, so the timing is the training's, as in the
benchmark; every step still meets a new graph (more batches than
fastgnn's graph cache holds).

Model: the benchmark's (3 layers, ReLU between, hidden width --hidden; GAT
with --heads heads concatenated and one head last), made from PyG's
seeded initialisation, so --layers fastgnn and --layers pyg train the same
weights. One step: zero_grad, forward, cross-entropy on the seed nodes,
backward (DDP averages the gradients over the ranks), Adam. Each rank
trains --batch-size seeds per step, so a step of N ranks trains N times as
many samples; samples/s = ranks x batch size x steps / wall time of the
timed steps (after --warmup untimed ones). --json PATH writes the figures
(`benchmarks/ddp_scaling.py` runs this on 1, 2, 4 GPUs and tabulates them).

Without torchrun it runs as one rank (a process group of one).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from fastgnn.bench import cases_minibatch as mb
from fastgnn.bench import graphs as bgraphs

MODELS = {"sage": "SAGE-mean", "gat": "GAT"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default="sage",
                   help="3-layer GraphSAGE (mean) or GAT (default sage)")
    p.add_argument("--layers", choices=("fastgnn", "pyg"), default="fastgnn",
                   help="fastgnn.torch's layers or torch_geometric.nn's (default fastgnn)")
    p.add_argument("--device", choices=("cuda", "cpu"),
                   help="default cuda when torch sees a GPU, else cpu")
    p.add_argument("--backend", choices=("nccl", "gloo"),
                   help="process group backend (default nccl on cuda, gloo on the cpu)")
    p.add_argument("--sampler", choices=("auto", "neighborloader", "bench"), default="auto",
                   help="PyG's NeighborLoader (needs pyg-lib or torch-sparse) or the "
                        "benchmark's sampler; auto takes NeighborLoader when it can")
    p.add_argument("--graph", help=f"a bench graph name (default {mb.GPU.graph} on cuda, "
                                   f"{mb.QUICK.graph} on the cpu)")
    p.add_argument("--features", type=int, help="input feature width")
    p.add_argument("--hidden", type=int, help="hidden width")
    p.add_argument("--heads", type=int, default=4, help="GAT heads (default 4)")
    p.add_argument("--fanouts", type=int, nargs="+", metavar="K",
                   help="in-neighbours sampled per node and hop")
    p.add_argument("--batch-size", type=int, help="seed nodes per batch and rank")
    p.add_argument("--pool", type=int, help="batches sampled per rank before timing")
    p.add_argument("--steps", type=int, help="timed steps")
    p.add_argument("--warmup", type=int, help="untimed steps before them")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="rank 0 writes its figures there")
    args = p.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.backend is None:
        args.backend = "nccl" if args.device == "cuda" else "gloo"
    preset = mb.GPU if args.device == "cuda" else mb.QUICK
    for name, value in (("graph", preset.graph), ("features", preset.features),
                        ("hidden", preset.hidden), ("fanouts", list(preset.fanouts)),
                        ("batch_size", preset.batch_size), ("pool", preset.pool),
                        ("steps", preset.steps), ("warmup", preset.warmup)):
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def init_distributed(args):
    """(rank, world size, device): the process group torchrun describes in
    the environment, or a group of one without torchrun."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT",
                                                                              "29500"))
    local_rank = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(args.backend, timeout=datetime.timedelta(minutes=10),
                            device_id=device if device.type == "cuda" else None)
    return dist.get_rank(), dist.get_world_size(), device


def use_neighborloader(choice):
    import torch_geometric.typing as pyg_typing
    available = pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE
    if choice == "neighborloader" and not available:
        raise SystemExit("--sampler neighborloader: PyG's NeighborLoader needs pyg-lib or "
                         "torch-sparse; install one, or pass --sampler bench")
    return choice == "neighborloader" or (choice == "auto" and available)


def sample_pool(args, rank, world, device):
    """(this rank's --pool batches, what sampled them): batches (x [n, F],
    edge_index [2, E], y [batch size] of the seed nodes, whether the edges
    are sorted by target) of seeds from the rank's share of the nodes. The
    graph, features, labels and the node order are the same on every rank
    (built from --seed)."""
    g = bgraphs.make(args.graph, torch, device, args.seed)
    n = g.num_nodes
    gen = torch.Generator(device=device).manual_seed(args.seed + 11)
    x = torch.randn(n, args.features, generator=gen, device=device)
    y = torch.randint(0, mb.CLASSES, (n,), generator=gen, device=device)
    share = torch.randperm(n, generator=gen, device=device).tensor_split(world)[rank]
    need = args.pool * args.batch_size
    if need > share.shape[0]:
        raise SystemExit(f"--pool {args.pool} x --batch-size {args.batch_size} seeds exceed this "
                         f"rank's share of {args.graph} ({share.shape[0]} of {n} nodes)")
    seeds = share[:need]
    if use_neighborloader(args.sampler):
        from torch_geometric.data import Data
        from torch_geometric.loader import NeighborLoader
        loader = NeighborLoader(Data(x=x.cpu(), edge_index=g.edge_index.cpu(), y=y.cpu()),
                                num_neighbors=list(args.fanouts), input_nodes=seeds.cpu(),
                                batch_size=args.batch_size)
        pool = [(b.x.to(device), b.edge_index.to(device), b.y[:args.batch_size].to(device),
                 False) for b in loader]
        return pool, "torch_geometric.loader.NeighborLoader"
    colptr, row = mb.csc_by_target(torch, g.edge_index, n)
    del g
    sampler = torch.Generator(device=device).manual_seed(args.seed + 1000 + rank)
    pool = []
    for batch in seeds.split(args.batch_size):
        sub = mb.sample_neighbors(torch, colptr, row, batch, args.fanouts, generator=sampler)
        pool.append((x[sub.n_id], sub.edge_index, y[sub.n_id[:args.batch_size]], True))
    return pool, "fastgnn.bench.cases_minibatch.sample_neighbors"


def build_model(args, device):
    """The benchmark's 3-layer model of --layers, with PyG's seeded initial
    weights (the same on every rank and for both --layers)."""
    name = MODELS[args.model]
    dims = (args.features, args.hidden, mb.CLASSES, args.heads)
    model = mb.build_model(args.layers, "sampled", name, *dims)
    model.load_state_dict(mb.master_state(torch, "sampled", name, *dims, args.seed), strict=True)
    return model.to(device)


def train(model, pool, args, device):
    """Warm-up, then the timed steps: (seconds of the timed steps, first and
    last loss)."""
    opt = torch.optim.Adam(model.parameters(), lr=mb.LR)
    losses = []

    def step(i):
        x, edge_index, y, by_target = pool[i % len(pool)]
        if by_target:       # a new EdgeIndex each step, as the benchmark hands both frameworks
            from torch_geometric import EdgeIndex
            n = x.shape[0]
            edge_index = EdgeIndex(edge_index, sparse_size=(n, n), sort_order="col")
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x, edge_index)[:y.shape[0]], y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())

    for i in range(args.warmup):
        step(i)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    start = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        step(i)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)   # the slowest rank's time
    return float(seconds), float(losses[0]), float(losses[-1])


def main(argv=None):
    args = parse_args(argv)
    rank, world, device = init_distributed(args)
    try:
        pool, sampler = sample_pool(args, rank, world, device)
        model = build_model(args, device)
        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda"
                                      else None)
        seconds, loss_first, loss_last = train(ddp, pool, args, device)
        samples = world * args.batch_size * args.steps
        result = {
            "model": MODELS[args.model], "layers": args.layers, "world_size": world,
            "backend": args.backend,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "graph": args.graph, "sampler": sampler, "batch_size_per_rank": args.batch_size,
            "fanouts": list(args.fanouts), "features": args.features, "hidden": args.hidden,
            "pool": args.pool, "warmup": args.warmup, "steps": args.steps,
            "seconds": round(seconds, 4), "samples_per_s": round(samples / seconds, 1),
            "ms_per_step": round(1e3 * seconds / args.steps, 3),
            "rank0_loss_first": round(loss_first, 5), "rank0_loss_last": round(loss_last, 5)}
        if rank == 0:
            print(f"{result['model']} with {args.layers} layers on {world} x {result['device']} "
                  f"({args.backend}): {result['samples_per_s']:.1f} samples/s, "
                  f"{result['ms_per_step']:.2f} ms/step, loss {loss_first:.4f} -> "
                  f"{loss_last:.4f}")
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(result, f, indent=1)
        return result
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
