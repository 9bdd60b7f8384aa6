"""Mini-batch training cases (`fastgnn bench --suite minibatch`): ms per
training step of 3-layer models when every step brings a new graph, as
mini-batch training does, against steps that reuse one graph; fastgnn.torch
against PyG from the same weights on the same batches.

    python -m fastgnn.bench --suite minibatch --quick         # CPU: small sizes, 10-20 s
    python -m fastgnn.bench --suite minibatch                 # GPU: both workloads, every model
    python -m fastgnn.bench --suite minibatch --workloads sampled --mb-models GCN GAT \\
        --fanouts 10 5 --batch-size 512 --steps 50

Workloads

    sampled   node classification on sampled subgraphs of a large generated
              graph (default rmat21e50: 2 M nodes, ~98 M edges, --mb-graph),
              the batches PyG's NeighborLoader gives: --batch-size seed nodes,
              --fanouts in-neighbours per node and hop drawn uniformly, nodes
              relabelled with the seeds first, edges sorted by target, handed
              to both frameworks as a torch_geometric.EdgeIndex
              (sort_order="col"); cross-entropy on the seeds' outputs.
              Models GCN, SAGE-mean, SAGE-max, GAT, GATv2.
    small     graph classification on batches of many small molecule-like
              graphs (10-40 nodes, fastgnn.generators.molecules) collated by
              torch_geometric.loader.DataLoader (--graphs-per-batch, shuffled):
              3 convs -> global_mean_pool -> Linear; cross-entropy on random
              graph labels. Models GCN, GIN, SAGE-mean, GAT, GATv2, Transformer.

Models: 3 conv layers with ReLU between them (no dropout), hidden width
--mb-hidden; attention models --heads heads of hidden / heads channels,
concatenated, and one head in the last layer; GCNConv with its defaults
(normalised, not cached); GINConv over Linear-ReLU-Linear. The PyG model is
built first from --seed; its state_dict is loaded into the fastgnn.torch
model (the same class names and arguments) with strict=True.

One step = zero_grad, forward, cross-entropy, backward, Adam step (lr 0.01).
A pool of --pool batches is drawn and collated on the device before any
timing (sampling and collation are not timed). Three timings per (workload,
model, framework), the median ms per step after --mb-warmup untimed steps
(CUDA events on the GPU, time.perf_counter on the CPU):

    new       each step takes the next batch of the pool, cycling (at least
              16 distinct batches: more than fastgnn.torch's graph cache
              holds, so no step finds its graph cached from an earlier one);
              sampled batches get a new EdgeIndex object per step, as
              NeighborLoader hands out;
    same      every step trains on the pool's first batch (one EdgeIndex
              object): what per-graph caches save;
    overhead  new - same in ms, and the ratio new / same.

Both frameworks start from the same weights and see the same batches in the
same order, so their losses agree step by step; a fastgnn row records the
largest |loss_pyg - loss_fastgnn| over the steps of its `new` run. A
framework that raises gives a row with status "failed: <Type>: message" and
the run goes on.
"""
from __future__ import annotations

import functools
import math
import os
import statistics
import sys
from collections import OrderedDict
from dataclasses import dataclass, field

from . import core
from .cases_training import _names

WORKLOADS = ("sampled", "small")
MODELS = ("GCN", "SAGE-mean", "SAGE-max", "GIN", "GAT", "GATv2", "Transformer")
DEFAULT_MODELS = {"sampled": ("GCN", "SAGE-mean", "SAGE-max", "GAT", "GATv2"),
                  "small": ("GCN", "GIN", "SAGE-mean", "GAT", "GATv2", "Transformer")}
LAYERS = 3
LR = 0.01
CLASSES = 16
MIN_POOL = 16            # > fastgnn.torch's graph cache (8 entries): `new` never hits it


@dataclass
class Preset:
    """Sizes of one run (the GPU defaults, or --quick's CPU sizes)."""
    graph: str               # generated graph spec of the sampled workload
    features: int            # input feature width F
    hidden: int              # hidden width
    fanouts: tuple           # in-neighbours per node and hop
    batch_size: int          # seed nodes per sampled batch
    graphs_per_batch: int    # small graphs per batch
    graph_nodes: tuple       # (min, max) nodes of a small graph
    small_features: int      # F of the small-graph workload
    small_hidden: int        # hidden width of the small-graph workload
    pool: int
    steps: int
    warmup: int


GPU = Preset(graph="rmat21e50", features=128, hidden=256, fanouts=(15, 10, 5), batch_size=1024,
             graphs_per_batch=128, graph_nodes=(10, 40), small_features=64, small_hidden=128,
             pool=20, steps=30, warmup=5)
QUICK = Preset(graph="rmat12e8", features=16, hidden=32, fanouts=(5, 5), batch_size=64,
               graphs_per_batch=32, graph_nodes=(10, 40), small_features=16, small_hidden=32,
               pool=MIN_POOL, steps=20, warmup=3)


def add_arguments(p):
    """The mini-batch suite's options on the bench parser."""
    g = p.add_argument_group("mini-batch suite (--suite minibatch)")
    g.add_argument("--workloads", nargs="+", metavar="NAME",
                   help=f"{' '.join(WORKLOADS)} (default both): sampled subgraphs of a large "
                        "graph, batches of small graphs")
    g.add_argument("--mb-models", nargs="+", metavar="MODEL",
                   help=f"3-layer models, any of {' '.join(MODELS)} (default: per workload, "
                        f"sampled {' '.join(DEFAULT_MODELS['sampled'])}; small "
                        f"{' '.join(DEFAULT_MODELS['small'])})")
    g.add_argument("--steps", type=int,
                   help=f"timed steps per timing (default {GPU.steps}; --quick {QUICK.steps})")
    g.add_argument("--mb-warmup", type=int, metavar="STEPS",
                   help=f"untimed steps before each timing (default {GPU.warmup}; --quick "
                        f"{QUICK.warmup})")
    g.add_argument("--batch-size", type=int, metavar="SEEDS",
                   help=f"seed nodes per sampled batch (default {GPU.batch_size}; --quick "
                        f"{QUICK.batch_size})")
    g.add_argument("--graphs-per-batch", type=int, metavar="GRAPHS",
                   help=f"small graphs per batch (default {GPU.graphs_per_batch}; --quick "
                        f"{QUICK.graphs_per_batch})")
    g.add_argument("--fanouts", nargs="+", type=int, metavar="K",
                   help=f"in-neighbours sampled per node, one per hop (default "
                        f"{' '.join(map(str, GPU.fanouts))}; --quick "
                        f"{' '.join(map(str, QUICK.fanouts))})")
    g.add_argument("--pool", type=int, metavar="BATCHES",
                   help=f"batches drawn before timing, cycled by the `new` timing (default "
                        f"{GPU.pool}, at least {MIN_POOL})")
    g.add_argument("--mb-graph", metavar="GRAPH",
                   help=f"the graph the sampled workload draws from, a bench graph name (default "
                        f"{GPU.graph}: 2 M nodes, ~98 M edges; --quick {QUICK.graph})")
    g.add_argument("--mb-features", type=int, metavar="F",
                   help=f"input feature width (default {GPU.features} sampled, "
                        f"{GPU.small_features} small; --quick {QUICK.features})")
    g.add_argument("--mb-hidden", type=int, metavar="H",
                   help=f"hidden width (default {GPU.hidden} sampled, {GPU.small_hidden} small; "
                        f"--quick {QUICK.hidden})")


# ------------------------------------------------------------------ sampler


def csc_by_target(torch, edge_index, num_nodes):
    """(colptr [num_nodes + 1], row [E]) of edge_index [2, E] grouped by
    target: the sources of node v's in-edges are row[colptr[v]:colptr[v+1]],
    in edge order. Built on edge_index's device."""
    dst = edge_index[1]
    order = torch.sort(dst, stable=True).indices
    colptr = torch.zeros(num_nodes + 1, dtype=torch.int64, device=dst.device)
    colptr[1:] = torch.cumsum(torch.bincount(dst, minlength=num_nodes), 0)
    return colptr, edge_index[0][order].contiguous()


@dataclass
class Subgraph:
    """One sampled mini-batch, in NeighborLoader's layout."""
    n_id: object                 # int64 [n]: global id of each local node, seeds first
    edge_index: object           # int64 [2, E]: local (source, target), sorted by target (stable)
    batch_size: int              # seed nodes, local ids 0 .. batch_size - 1
    num_sampled_nodes: list      # per hop, seeds first: [batch_size, new nodes of hop 1, ...]
    num_sampled_edges: list      # per hop: edges into the nodes that hop expanded

    @property
    def num_nodes(self) -> int:
        return int(self.n_id.shape[0])


def sample_neighbors(torch, colptr, row, seeds, fanouts, generator=None):
    """Uniform neighbour sampling into the layout of PyG's NeighborLoader, in
    torch on the graph's device. colptr [N + 1], row [E]: the graph by target
    (`csc_by_target`); seeds: int64 [B] distinct node ids.

    Hop h expands the nodes first reached in hop h - 1 (the seeds for the
    first): a node with at most fanouts[h] in-neighbours keeps all its
    in-edges; a node with more draws fanouts[h] of them uniformly with
    replacement, repeated draws kept once. Sources not sampled before get the
    next local ids (in id order within a hop), so local ids run seeds, hop 1's
    new nodes, hop 2's, ...; edges point from the source to the expanded node.
    Returns a Subgraph."""
    device = colptr.device
    n = colptr.shape[0] - 1
    seeds = seeds.to(device=device, dtype=torch.int64)
    b = int(seeds.shape[0])
    local = torch.full((n,), -1, dtype=torch.int64, device=device)
    local[seeds] = torch.arange(b, device=device)
    nodes, srcs, dsts = [seeds], [], []
    hop_nodes, hop_edges = [b], []
    frontier, count = seeds, b
    for k in fanouts:
        m = int(frontier.shape[0])
        if m == 0 or k <= 0:
            hop_nodes.append(0)
            hop_edges.append(0)
            frontier = frontier[:0]
            continue
        start = colptr[frontier]
        deg = colptr[frontier + 1] - start
        # every in-edge of the nodes with deg <= k
        take = torch.where(deg <= k, deg, torch.zeros_like(deg))
        pos_all = torch.repeat_interleave(torch.arange(m, device=device), take)
        first = torch.cumsum(take, 0) - take
        eid_all = start[pos_all] + torch.arange(pos_all.shape[0], device=device) - first[pos_all]
        # k uniform draws (with replacement) for the others
        many = (deg > k).nonzero().flatten()
        draw = torch.rand((many.shape[0], k), generator=generator, device=device)
        off = (draw * deg[many].unsqueeze(1)).long()
        off = torch.minimum(off, (deg[many] - 1).unsqueeze(1))      # float rounding at deg
        eid_many = (start[many].unsqueeze(1) + off).flatten()
        pos = torch.cat([pos_all, many.repeat_interleave(k)])
        src = row[torch.cat([eid_all, eid_many])]
        # (expanded node, source) pairs once each, sorted by node then source
        key = torch.unique(pos * n + src)
        pos, src = key // n, key % n
        new = torch.unique(src[local[src] < 0])
        local[new] = torch.arange(count, count + new.shape[0], device=device)
        count += int(new.shape[0])
        srcs.append(local[src])
        dsts.append(local[frontier[pos]])
        nodes.append(new)
        hop_nodes.append(int(new.shape[0]))
        hop_edges.append(int(src.shape[0]))
        frontier = new
    src = torch.cat(srcs) if srcs else torch.zeros(0, dtype=torch.int64, device=device)
    dst = torch.cat(dsts) if dsts else torch.zeros(0, dtype=torch.int64, device=device)
    order = torch.sort(dst, stable=True).indices
    edge_index = torch.stack([src[order], dst[order]])
    return Subgraph(torch.cat(nodes), edge_index, b, hop_nodes, hop_edges)


# ------------------------------------------------------------------ workloads


@dataclass
class SampledBatch:
    """A pooled sampled batch on the bench device."""
    x: object                    # float32 [n, F]: the sampled nodes' features
    edge_index: object           # int64 [2, E]: local ids, sorted by target
    y: object                    # int64 [batch_size]: the seeds' labels
    batch_size: int

    def inputs(self):
        """(x, EdgeIndex, y, batch_size): a new EdgeIndex object over the same
        indices on every call, as NeighborLoader gives one per batch."""
        from torch_geometric import EdgeIndex
        n = self.x.shape[0]
        return self.x, EdgeIndex(self.edge_index, sparse_size=(n, n), sort_order="col"), \
            self.y, self.batch_size


@dataclass
class GraphsBatch:
    """A pooled batch of small graphs on the bench device (a collated Batch's tensors)."""
    x: object                    # float32 [n, F]
    edge_index: object           # int64 [2, E]
    batch: object                # int64 [n]: graph of each node
    y: object                    # int64 [num_graphs]
    num_graphs: int

    def inputs(self):
        """(x, edge_index, batch, num_graphs, y)."""
        return self.x, self.edge_index, self.batch, self.num_graphs, self.y


@dataclass
class Workload:
    """One workload's pool of batches and what its rows record about it."""
    name: str                    # "sampled" or "small"
    graph: str                   # the row's graph name
    pool: list                   # SampledBatch or GraphsBatch
    features: int
    hidden: int
    classes: int
    stats: dict                  # graph statistics (bench.graphs / generators.graph_stats)
    source: str                  # how the graph was made
    settings: dict = field(default_factory=dict)   # batch sizes, fanouts, mean nodes / edges

    @property
    def graph_level(self) -> bool:
        return self.name == "small"


def _batch_sizes(pool):
    """Mean, min and max nodes and edges per batch of the pool."""
    nodes = [int(b.x.shape[0]) for b in pool]
    edges = [int(b.edge_index.shape[1]) for b in pool]
    return {"mean_nodes": round(statistics.mean(nodes), 1), "min_nodes": min(nodes),
            "max_nodes": max(nodes), "mean_edges": round(statistics.mean(edges), 1),
            "min_edges": min(edges), "max_edges": max(edges)}


def sampled_workload(torch, device, *, graph, features, hidden, fanouts, batch_size, pool,
                     classes=CLASSES, seed=0):
    """The sampled workload: the named bench graph (fastgnn.bench.graphs) on
    `device`, N(0, 1) features [N, features] and random labels, and `pool`
    batches of `batch_size` random seeds each, sampled with `fanouts`."""
    from . import graphs as bgraphs
    g = bgraphs.make(graph, torch, device, seed)
    n = g.num_nodes
    if batch_size > n:
        raise ValueError(f"--batch-size {batch_size} is larger than {g.name}'s {n} nodes")
    colptr, row = csc_by_target(torch, g.edge_index, n)
    g.edge_index = None                        # the CSC copy is all the sampler reads
    gen = torch.Generator(device=device).manual_seed(seed + 11)
    x = torch.randn(n, features, generator=gen, device=device)
    y = torch.randint(0, classes, (n,), generator=gen, device=device)
    batches = []
    hops_nodes = []
    for _ in range(pool):
        seeds = torch.randperm(n, generator=gen, device=device)[:batch_size]
        sub = sample_neighbors(torch, colptr, row, seeds, fanouts, generator=gen)
        batches.append(SampledBatch(x[sub.n_id], sub.edge_index, y[sub.n_id[:batch_size]],
                                    batch_size))
        hops_nodes.append(sub.num_sampled_nodes)
    del colptr, row, x, y
    settings = {"batch_size": batch_size, "fanouts": list(fanouts), "pool": pool,
                "mean_nodes_per_hop": [round(statistics.mean(h[i] for h in hops_nodes), 1)
                                       for i in range(len(fanouts) + 1)]}
    settings.update(_batch_sizes(batches))
    return Workload("sampled", g.name, batches, features, hidden, classes, g.stats,
                    g.source + "; sampled with fastgnn.bench.cases_minibatch.sample_neighbors",
                    settings)


def small_graphs(torch, num_graphs, features, *, min_nodes, max_nodes, classes=CLASSES, seed=0):
    """(list of torch_geometric.data.Data, stats, source): `num_graphs`
    molecule-like graphs (fastgnn.generators.molecules) of min_nodes ..
    max_nodes nodes, N(0, 1) features [n_g, features], a random label each."""
    import numpy as np
    from torch_geometric.data import Data

    from .. import generators as gen
    ei, n, ptr = gen.molecules(num_graphs, min_nodes, max_nodes, seed=seed, return_ptr=True)
    stats = gen.graph_stats(ei, n, np)
    # edges are sorted by source: graph g's edges are one contiguous run
    eptr = np.searchsorted(ei[0], ptr)
    g = torch.Generator().manual_seed(seed + 13)
    x = torch.randn(n, features, generator=g)
    y = torch.randint(0, classes, (num_graphs,), generator=g)
    ei_t = torch.from_numpy(np.ascontiguousarray(ei))
    data = []
    for i in range(num_graphs):
        a, b = int(ptr[i]), int(ptr[i + 1])
        data.append(Data(x=x[a:b], edge_index=ei_t[:, eptr[i]:eptr[i + 1]] - a, y=y[i:i + 1],
                         num_nodes=b - a))
    source = (f"fastgnn.generators.molecules({num_graphs}, {min_nodes}, {max_nodes}, "
              f"seed={seed}), split into graphs")
    return data, stats, source


def small_workload(torch, device, *, features, hidden, graphs_per_batch, pool, graph_nodes,
                   classes=CLASSES, seed=0):
    """The small-graph workload: pool x graphs_per_batch small graphs,
    shuffled and collated by torch_geometric.loader.DataLoader into `pool`
    batches, moved to `device`."""
    from torch_geometric.loader import DataLoader
    lo, hi = graph_nodes
    data, stats, source = small_graphs(torch, pool * graphs_per_batch, features, min_nodes=lo,
                                       max_nodes=hi, classes=classes, seed=seed)
    loader = DataLoader(data, batch_size=graphs_per_batch, shuffle=True,
                        generator=torch.Generator().manual_seed(seed + 17))
    batches = []
    for b in loader:
        b = b.to(device)
        batches.append(GraphsBatch(b.x, b.edge_index, b.batch, b.y, int(b.num_graphs)))
    settings = {"graphs_per_batch": graphs_per_batch, "graph_nodes": [lo, hi], "pool": pool}
    settings.update(_batch_sizes(batches))
    return Workload("small", f"molecules {lo}-{hi} nodes", batches, features, hidden, classes,
                    stats, source + "; torch_geometric.loader.DataLoader(shuffle=True)", settings)


# ------------------------------------------------------------------ models


def _convs(lib, name, dims, heads):
    """The conv layers of model `name` from `lib` (torch_geometric.nn or
    fastgnn.torch), widths dims[0] -> dims[1] -> ... -> dims[-1]: the same
    constructors and arguments for both."""
    import torch
    pairs = list(zip(dims[:-1], dims[1:]))
    if name == "GCN":
        return [lib.GCNConv(i, o) for i, o in pairs]
    if name.startswith("SAGE-"):
        aggr = name.split("-", 1)[1]
        return [lib.SAGEConv(i, o, aggr=aggr) for i, o in pairs]
    if name == "GIN":
        def mlp(i, o):
            return torch.nn.Sequential(torch.nn.Linear(i, o), torch.nn.ReLU(),
                                       torch.nn.Linear(o, o))
        return [lib.GINConv(mlp(i, o)) for i, o in pairs]
    cls = {"GAT": "GATConv", "GATv2": "GATv2Conv", "Transformer": "TransformerConv"}.get(name)
    if cls is None:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    layer = getattr(lib, cls)
    out = []
    for j, (i, o) in enumerate(pairs):
        if j == len(pairs) - 1:
            out.append(layer(i, o, heads=1))
        else:
            if o % heads:
                raise ValueError(f"hidden width {o} is not divisible by --heads {heads}")
            out.append(layer(i, o // heads, heads=heads))
    return out


@functools.lru_cache(maxsize=None)
def node_net_class():
    """NodeNet(convs): the sampled workload's model around any conv layers
    (torch only; made on first use, since this module imports no torch)."""
    import torch

    class NodeNet(torch.nn.Module):
        """conv -> ReLU -> ... -> conv (3 convs in the benchmark): logits [n, classes]."""

        def __init__(self, convs):
            super().__init__()
            self.convs = torch.nn.ModuleList(convs)

        def forward(self, x, edge_index):
            for conv in self.convs[:-1]:
                x = conv(x, edge_index).relu()
            return self.convs[-1](x, edge_index)

    return NodeNet


def _net_classes():
    import torch
    from torch_geometric.nn import global_mean_pool

    class GraphNet(torch.nn.Module):
        """(conv -> ReLU) x 3 -> global_mean_pool -> Linear: logits [graphs, classes]."""

        def __init__(self, convs, hidden, classes):
            super().__init__()
            self.convs = torch.nn.ModuleList(convs)
            self.head = torch.nn.Linear(hidden, classes)

        def forward(self, x, edge_index, batch, num_graphs):
            for conv in self.convs:
                x = conv(x, edge_index).relu()
            return self.head(global_mean_pool(x, batch, num_graphs))

    return node_net_class(), GraphNet


def build_model(framework, workload, name, features, hidden, classes, heads):
    """An untrained 3-layer model of `workload` ("sampled": node logits,
    "small": graph logits); framework "pyg" or "fastgnn"."""
    if framework == "pyg":
        from torch_geometric import nn as lib
    else:
        import fastgnn.torch as lib
    node_net, graph_net = _net_classes()
    if workload == "small":
        return graph_net(_convs(lib, name, [features] + [hidden] * LAYERS, heads), hidden, classes)
    return node_net(_convs(lib, name, [features] + [hidden] * (LAYERS - 1) + [classes], heads))


def master_state(torch, workload, name, features, hidden, classes, heads, seed):
    """The PyG model's initial parameters (seeded), loaded by both frameworks' rows."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        m = build_model("pyg", workload, name, features, hidden, classes, heads)
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


# ------------------------------------------------------------------ one row


def _loss(torch, model, wl, inputs):
    import torch.nn.functional as F
    if wl.graph_level:
        x, ei, batch, num_graphs, y = inputs
        return F.cross_entropy(model(x, ei, batch, num_graphs), y)
    x, ei, y, b = inputs
    return F.cross_entropy(model(x, ei)[:b], y)


def run_phase(torch, model, state, wl, *, new, steps, warmup, cuda):
    """Train `model` from `state` with a fresh Adam for warmup + steps steps:
    new=True takes the pool's batches in turn, new=False the first batch
    every step. Returns (median ms, min ms, losses [warmup + steps] as floats,
    peak MiB on CUDA or None)."""
    model.load_state_dict(state, strict=True)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    model.train()
    losses = []
    fixed = None if new else wl.pool[0].inputs()
    counter = [0]

    def step():
        if new:
            inputs = wl.pool[counter[0] % len(wl.pool)].inputs()
            counter[0] += 1
        else:
            inputs = fixed
        opt.zero_grad(set_to_none=True)
        loss = _loss(torch, model, wl, inputs)
        loss.backward()
        opt.step()
        losses.append(loss.detach())

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    med, best = core.time_calls(torch, step, repeats=steps, warmup=warmup, cuda=cuda,
                                cpu_blocks=False)
    peak = round(torch.cuda.max_memory_allocated() / 2**20, 1) if cuda else None
    vals = torch.stack(losses).float().cpu().tolist()
    return med, best, vals, peak


def _clear_fastgnn_cache():
    from .cases_spmm import clear_fastgnn_cache
    try:
        import fastgnn.torch as fgt
        clear_fastgnn_cache(fgt)
    except Exception:  # noqa: BLE001
        pass


def run_row(torch, wl, model_name, framework, state, *, heads, steps, warmup, cuda):
    """One (workload, model, framework) record's measured fields; an exception
    anywhere gives status "failed: <Type>: message"."""
    rec = {"status": "ok", "error": None}
    model = None
    try:
        model = build_model(framework, wl.name, model_name, wl.features, wl.hidden, wl.classes,
                            heads)
        model.load_state_dict(state, strict=True)
        model.to(wl.pool[0].x.device)
        res = {}
        for phase in ("new", "same"):
            _clear_fastgnn_cache()
            med, best, losses, peak = run_phase(torch, model, state, wl, new=phase == "new",
                                                steps=steps, warmup=warmup, cuda=cuda)
            res[f"{phase}_ms"] = round(med, 4)
            res[f"{phase}_ms_min"] = round(best, 4)
            res[f"{phase}_peak_mib"] = peak
            res[f"losses_{phase}"] = losses
        res["overhead_ms"] = round(res["new_ms"] - res["same_ms"], 4)
        res["new_over_same"] = round(res["new_ms"] / res["same_ms"], 3) if res["same_ms"] else None
        vals = res["losses_new"]
        res.update({"loss_first": vals[0], "loss_last": vals[-1],
                    "losses_finite": all(math.isfinite(v) for v in vals + res["losses_same"])})
        rec.update(res)
    except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
        rec["status"] = f"failed: {core.describe(exc)}"
        rec["error"] = core.describe(exc)
        rec["failure"] = core.classify(exc)
    finally:
        del model
        if framework == "fastgnn":
            _clear_fastgnn_cache()
        core.free_memory(torch, full=rec["status"] != "ok")
    return rec


# ------------------------------------------------------------------ speedups


def add_speedups(records):
    """On fastgnn rows: speedup_new / speedup_same (PyG ms / fastgnn ms, same
    workload and model) and loss_max_diff, the largest |loss_pyg -
    loss_fastgnn| over the steps of the `new` runs (with loss_max_rel_diff,
    relative to |loss_pyg|)."""
    by = {(r.get("workload"), r.get("model"), r.get("framework")): r for r in records
          if r.get("kind") == "minibatch"}
    for r in records:
        if r.get("kind") != "minibatch" or r.get("framework") != "fastgnn":
            continue
        p = by.get((r.get("workload"), r.get("model"), "pyg")) or {}
        for phase in ("new", "same"):
            a, b = p.get(f"{phase}_ms"), r.get(f"{phase}_ms")
            r[f"speedup_{phase}"] = round(a / b, 3) if a and b else None
        lp, lf = p.get("losses_new"), r.get("losses_new")
        if lp and lf:
            pairs = list(zip(lp, lf))
            r["loss_max_diff"] = max(abs(a - b) for a, b in pairs)
            r["loss_max_rel_diff"] = max(abs(a - b) / max(abs(a), 1e-12) for a, b in pairs)
        else:
            r["loss_max_diff"] = r["loss_max_rel_diff"] = None


# ------------------------------------------------------------------ report


def _pairs(records):
    """OrderedDict (workload, model) -> {framework: record}."""
    out = OrderedDict()
    for r in records:
        if r.get("kind") == "minibatch" and r.get("model"):
            out.setdefault((r["workload"], r["model"]), {})[r["framework"]] = r
    return out


def _ms(r, key):
    if r is None:
        return "-"
    v = r.get(key)
    if v is None:
        return "failed" if str(r.get("status", "")).startswith("failed") else "-"
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"


def _overhead(r):
    if r is None or r.get("overhead_ms") is None:
        return _ms(r, "overhead_ms")
    ratio = r.get("new_over_same")
    return f"{_ms(r, 'overhead_ms')} ({ratio:.2f}x)" if ratio else _ms(r, "overhead_ms")


def table(records):
    """Markdown: one line per (workload, model), PyG and fastgnn side by side."""
    from .report import _fmt
    head = ["workload", "model", "PyG new", "PyG same", "PyG overhead", "fastgnn new",
            "fastgnn same", "fastgnn overhead", "x new", "x same", "loss first", "loss last",
            "max loss diff"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (wl, model), fw in _pairs(records).items():
        p, f = fw.get("pyg"), fw.get("fastgnn")
        lines.append("| " + " | ".join([
            wl, model, _ms(p, "new_ms"), _ms(p, "same_ms"), _overhead(p), _ms(f, "new_ms"),
            _ms(f, "same_ms"), _overhead(f), _fmt((f or {}).get("speedup_new"), ".2f"),
            _fmt((f or {}).get("speedup_same"), ".2f"),
            " / ".join(_fmt((r or {}).get("loss_first"), ".4f") for r in (p, f)),
            " / ".join(_fmt((r or {}).get("loss_last"), ".4f") for r in (p, f)),
            _fmt((f or {}).get("loss_max_diff"), ".1e")]) + " |")
    return "\n".join(lines)


def summary(records):
    """Markdown lines: per workload, the geometric-mean fastgnn speedup with a
    new graph every step and with the same graph, over the models."""
    from .report import speedup_summary
    per = OrderedDict()
    for (wl, _), fw in _pairs(records).items():
        f = fw.get("fastgnn") or {}
        per.setdefault(wl, []).append((f.get("speedup_new"), f.get("speedup_same")))
    return speedup_summary(per, ("workload", "models", "geomean x new graph",
                                 "min x new graph", "geomean x same graph"))


def _workload_line(r):
    s = r.get("batches") or {}
    if r["workload"] == "sampled":
        what = (f"{s.get('pool')} batches of {s.get('batch_size')} seed nodes, fanouts "
                f"{s.get('fanouts')}, nodes per hop {s.get('mean_nodes_per_hop')}")
    else:
        what = (f"{s.get('pool')} batches of {s.get('graphs_per_batch')} graphs of "
                f"{'-'.join(map(str, s.get('graph_nodes') or []))} nodes")
    return (f"- **{r['workload']}** ({r['graph']}): {what}; per batch {s.get('mean_nodes')} nodes "
            f"({s.get('min_nodes')}-{s.get('max_nodes')}), {s.get('mean_edges')} edges "
            f"({s.get('min_edges')}-{s.get('max_edges')}); F = {r.get('features')}, hidden "
            f"{r.get('hidden')}, {r.get('classes')} classes; {r.get('graph_source')}")


def markdown(records, meta):
    from .report import graphs_table
    out = [f"# fastgnn mini-batch training benchmark: {meta['gpu']}", "",
           f"Command: `{meta['command']}`  ",
           "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + "  ",
           f"Timing: {meta['timing']}  ",
           "ms per training step. new = a new batch every step (the pool in turn); same = the "
           "first batch every step; overhead = new - same (new / same); x = PyG ms / fastgnn ms "
           "(> 1: fastgnn is faster); losses PyG / fastgnn of the new run (same weights, same "
           "batches); max loss diff = max |loss PyG - loss fastgnn| over its steps.", ""]
    out += ["## Summary", ""] + summary(records) + ["", "## Steps", "", table(records), ""]
    wls = OrderedDict((r["workload"], r) for r in records
                      if r.get("kind") == "minibatch" and r.get("batches"))
    if wls:
        out += ["## Workloads", ""] + [_workload_line(r) for r in wls.values()] + [""]
    out += graphs_table(records)
    failed = [r for r in records if r.get("error")]
    if failed:
        out += ["## Failures", ""] + [
            f"- {r['workload']} {r.get('model') or '-'} {r.get('framework') or '-'}: {r['error']}"
            for r in failed] + [""]
    if meta.get("skipped"):
        out += ["## Skipped", ""] + [f"- {s}" for s in meta["skipped"]] + [""]
    return "\n".join(out)


# ------------------------------------------------------------------ the suite


def _settings(args, quick):
    """(Preset of this run, fanouts) from the preset and the options given."""
    base = QUICK if quick else GPU

    def pick(value, default):
        return default if value is None else value
    pre = Preset(graph=pick(args.mb_graph, base.graph),
                 features=pick(args.mb_features, base.features),
                 hidden=pick(args.mb_hidden, base.hidden),
                 fanouts=tuple(args.fanouts) if args.fanouts else base.fanouts,
                 batch_size=pick(args.batch_size, base.batch_size),
                 graphs_per_batch=pick(args.graphs_per_batch, base.graphs_per_batch),
                 graph_nodes=base.graph_nodes,
                 small_features=pick(args.mb_features, base.small_features),
                 small_hidden=pick(args.mb_hidden, base.small_hidden),
                 pool=pick(args.pool, base.pool), steps=pick(args.steps, base.steps),
                 warmup=pick(args.mb_warmup, base.warmup))
    if pre.pool < MIN_POOL:
        raise SystemExit(f"fastgnn bench: --pool {pre.pool}: the `new` timing needs at least "
                         f"{MIN_POOL} distinct batches (more than fastgnn.torch's graph cache "
                         "holds)")
    if pre.steps < 1 or pre.warmup < 0:
        raise SystemExit("fastgnn bench: --steps must be >= 1 and --mb-warmup >= 0")
    if min(pre.fanouts) < 1 or pre.batch_size < 1 or pre.graphs_per_batch < 1:
        raise SystemExit("fastgnn bench: --fanouts, --batch-size and --graphs-per-batch must be "
                         ">= 1")
    return pre


def build_workload(torch, device, name, pre, seed):
    """The named workload at the preset's sizes."""
    if name == "sampled":
        return sampled_workload(torch, device, graph=pre.graph, features=pre.features,
                                hidden=pre.hidden, fanouts=pre.fanouts,
                                batch_size=pre.batch_size, pool=pre.pool, seed=seed)
    return small_workload(torch, device, features=pre.small_features, hidden=pre.small_hidden,
                          graphs_per_batch=pre.graphs_per_batch, pool=pre.pool,
                          graph_nodes=pre.graph_nodes, seed=seed)


def run(args, argv, torch, device, cuda, quick):
    """The mini-batch suite (the bench CLI's entry for --suite minibatch)."""
    import shlex

    from . import runinfo
    if not cuda and not quick:
        quick = True
        print("fastgnn bench: --suite minibatch's default sizes (rmat21e50: 2 M nodes, ~98 M "
              "edges; F=128, hidden 256) are sized for a GPU and there is none here: running "
              "the --quick sizes; options given explicitly still apply", file=sys.stderr)
    workloads = _names(args.workloads, WORKLOADS, WORKLOADS, "workload")
    pre = _settings(args, quick)
    heads = getattr(args, "heads", 4) or 4
    models = {w: _names(args.mb_models, DEFAULT_MODELS[w], MODELS, "model") for w in workloads}
    if args.mb_graph:
        from . import graphs as bgraphs
        try:
            bgraphs.parse(args.mb_graph)
        except bgraphs.GraphUnavailable:
            pass
        except ValueError as exc:
            raise SystemExit(f"fastgnn bench: {exc}")

    gpu = runinfo.device_label(torch, device)
    out_path = runinfo.results_path(args.out, "minibatch-quick" if quick else "minibatch", gpu)
    command = "python -m fastgnn.bench " + shlex.join(argv)
    skipped = []
    meta = {"gpu": gpu, "command": command, "versions": runinfo.versions(torch, cuda),
            "skipped": skipped,
            "timing": (f"median ms of {pre.steps} steps after {pre.warmup} untimed ones, "
                       + ("CUDA events" if cuda else "time.perf_counter")
                       + f"; 3 conv layers, Adam lr {LR}, heads {heads}; pool of {pre.pool} "
                         "batches drawn before timing")}
    d = os.path.dirname(out_path)
    if d:
        os.makedirs(d, exist_ok=True)
    records = []
    bar = runinfo.progress(sum(len(m) for m in models.values()) * 2, args.no_progress)
    interrupted = False
    gate = runinfo.RowGate(args.budget_minutes, skipped)
    try:
        for wname in workloads:
            bar.set_description_str(f"building {wname}")
            base = {"gpu": gpu, "device": str(device), "versions": meta["versions"],
                    "kind": "minibatch", "family": "minibatch", "workload": wname,
                    "dtype": "fp32", "heads": heads, "steps": pre.steps, "warmup": pre.warmup,
                    "seed": args.seed, "command": command}
            try:
                wl = build_workload(torch, device, wname, pre, args.seed)
            except Exception as exc:  # noqa: BLE001 - e.g. out of memory: recorded
                records.append(dict(base, case=f"{wname} (build)", graph=wname, model=None,
                                    framework=None, impl="-", fastgnn=False,
                                    status=f"failed: {core.describe(exc)}",
                                    error=core.describe(exc), failure=core.classify(exc)))
                print(f"fastgnn bench: workload {wname} failed: {core.describe(exc)}",
                      file=sys.stderr)
                core.free_memory(torch, full=True)
                bar.update(len(models[wname]) * 2)
                continue
            base.update({"graph": wl.graph, "graph_stats": wl.stats, "graph_source": wl.source,
                         "features": wl.features, "hidden": wl.hidden, "width": wl.hidden,
                         "classes": wl.classes, "batches": wl.settings})
            for model_name in models[wname]:
                try:
                    state = master_state(torch, wname, model_name, wl.features, wl.hidden,
                                         wl.classes, heads, args.seed)
                except Exception as exc:  # noqa: BLE001 - e.g. hidden not divisible by heads
                    state, why = None, exc
                for framework in ("pyg", "fastgnn"):
                    bar.set_description_str(f"{wname} {model_name} {framework}")
                    row = f"{wname} {model_name} {framework}"
                    if gate.closed(row):
                        bar.update(1)
                        continue
                    rec = dict(base, case=f"{wname} {model_name}", model=model_name,
                               framework=framework, impl=framework,
                               fastgnn=framework == "fastgnn")
                    if state is None:
                        rec.update({"status": f"failed: {core.describe(why)}",
                                    "error": core.describe(why), "failure": core.classify(why)})
                    else:
                        rec.update(run_row(torch, wl, model_name, framework, state, heads=heads,
                                           steps=pre.steps, warmup=pre.warmup, cuda=cuda))
                        if rec["error"]:
                            gate.after_failure(torch, device, row, rec["error"])
                    records.append(rec)
                    bar.update(1)
                runinfo.write_json(out_path, records)      # a run cut short keeps what it measured
            del wl
            core.free_memory(torch)
    except KeyboardInterrupt:
        interrupted = True
        skipped.append("interrupted (Ctrl-C): the rows after the last one measured did not run")
    finally:
        bar.close()
    add_speedups(records)
    rc = runinfo.write_results(out_path, records, markdown(records, meta),
                               table(records) if records else "", summary(records),
                               skipped=skipped)
    return 130 if interrupted else rc
