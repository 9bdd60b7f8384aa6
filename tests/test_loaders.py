"""fastgnn.torch's drop-in layers fed mini-batches exactly as users' data
loaders produce them, against PyG's own layers from the same weights (PyG's
model built first from the test's seed, ours loads its state_dict with
strict=True): the loss, the output and the gradients of the input features
and of every parameter, in float64 (float32 where named), batch after batch
with the same modules (an SGD step in between).

    graph batches      torch_geometric.loader.DataLoader over many small
                       graphs (isolated nodes, self-loops, duplicate edges),
                       two layers, then global mean/max/add pooling over
                       `batch.batch`; consecutive batches have the same
                       numbers of nodes and edges and another structure.
                       Also: ToSparseTensor's adj_t (CSR, COO) batched, an
                       edge_index buffer refilled in place, int32 edge_index
    neighbour batches  NeighborLoader's subgraphs, built by hand (2-hop
                       sampling, seeds first, edges sorted by target): layers
                       on the whole subgraph, trimmed bipartite layers
                       (x=(x_src, x_dst), size=(num_src, num_dst)), PyG
                       EdgeIndex inputs sorted by column, by row or unsorted,
                       batches with few or no sampled edges
    link batches       LinkNeighborLoader's batches: embeddings of a 2-layer
                       SAGE, dot-product scores of the label pairs, BCE loss
"""
import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg
from torch_geometric import EdgeIndex
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from torch_geometric.transforms import ToSparseTensor

import fastgnn.torch as ft
from fastgnn.testing import (assert_float32_results, assert_results_match, awkward_edge_index,
                             clipped_sgd_step, fresh_pyg_class)

# torch's and PyG's notes on sparse tensors (beta CSR, COO converted to CSR)
pytestmark = pytest.mark.filterwarnings("ignore:.*[Ss]parse:UserWarning")

# PyG's layer classes as fresh subclasses: PyG renders a class's propagate once,
# from its first instance, so other test files' instances cannot change these
PYG = SimpleNamespace(**{name: fresh_pyg_class(getattr(pyg, name)) for name in (
    "GCNConv", "GINConv", "SAGEConv", "GATConv", "GATv2Conv", "TransformerConv")})


def _mlp(a, b):
    return torch.nn.Sequential(torch.nn.Linear(a, b), torch.nn.Tanh(), torch.nn.Linear(b, b))


# name -> make(module, in_channels, out_channels) (heads concatenated: out = 2 x 2-wide heads)
LAYERS = {
    "gcn": lambda m, a, b: m.GCNConv(a, b),
    "gin": lambda m, a, b: m.GINConv(_mlp(a, b), eps=0.1, train_eps=True),
    "sage_max": lambda m, a, b: m.SAGEConv(a, b, aggr="max"),
    "sage_mean": lambda m, a, b: m.SAGEConv(a, b),
    "gat": lambda m, a, b: m.GATConv(a, b // 2, heads=2),
    "gatv2": lambda m, a, b: m.GATv2Conv(a, b // 2, heads=2),
    "transformer": lambda m, a, b: m.TransformerConv(a, b // 2, heads=2),
    # other options
    "sage_multi": lambda m, a, b: m.SAGEConv(a, b, aggr=["mean", "max", "std"]),
    "sage_std_project": lambda m, a, b: m.SAGEConv(a, b, aggr="std", project=True),
    "gcn_improved_no_bias": lambda m, a, b: m.GCNConv(a, b, improved=True, bias=False),
    "gat_mean_heads_residual": lambda m, a, b: m.GATConv(a, b, heads=2, concat=False,
                                                         residual=True),
    "gatv2_residual": lambda m, a, b: m.GATv2Conv(a, b // 2, heads=2, residual=True),
    "transformer_mean_heads_beta": lambda m, a, b: m.TransformerConv(a, b, heads=2,
                                                                     concat=False, beta=True),
}
F_IN, HIDDEN, F_OUT = 5, 8, 6


def _pair_of_models(make, seed, dtype=torch.float64):
    """(PyG's model in float64, ours in dtype): make(namespace) builds the
    model from PYG or from fastgnn.torch; PyG's is built first from `seed` and
    ours loads its state_dict (strict)."""
    torch.manual_seed(seed)
    ref = make(PYG).double()
    ours = make(ft)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours.to(dtype)


def _run(model, inputs, forward):
    """{name: float64 tensor or None}: forward(model, **leaves) -> (output,
    loss) on fresh leaf copies of `inputs`, then the loss's gradients of every
    input and every parameter (gradients reset first)."""
    model.zero_grad(set_to_none=True)
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in inputs.items()}
    out, loss = forward(model, **leaves)
    loss.backward()
    res = {"loss": loss.detach().reshape(1), "output": out.detach()}
    res.update({f"grad {k}": t.grad for k, t in leaves.items()})
    res.update({f"grad {k}": p.grad for k, p in model.named_parameters()})
    return {k: None if v is None else v.detach().double() for k, v in res.items()}


def _compare(ref, ours, inputs, forward, what, seed, dtype=torch.float64):
    """Run both models on the same inputs and compare the loss, the output and
    every gradient; a failure names `what` and the seed. In float64 relative
    errors are within 1e-10; gradients that are zero in exact arithmetic
    (TransformerConv's key bias: it shifts every score of a target alike)
    hold rounding noise on both sides and are compared against the largest
    gradient's norm. Below float64 ours runs in dtype, PyG's in float64 on
    ours' weights and inputs rounded to dtype (`fastgnn.testing.assert_float32_results`)."""
    base = None
    if dtype != torch.float64:
        ref.load_state_dict({k: v.double() for k, v in ours.state_dict().items()})
        base = _run(copy.deepcopy(ref).to(dtype), {k: v.to(dtype) for k, v in inputs.items()},
                    forward)
    r = _run(ref, {k: v.to(dtype).double() for k, v in inputs.items()}, forward)
    o = _run(ours, {k: v.to(dtype) for k, v in inputs.items()}, forward)
    scale = max(float(v.norm()) for k, v in r.items() if k.startswith("grad") and v is not None)
    try:
        if base is None:
            assert_results_match(o, r, "float64", noise_scale=scale)
        else:
            assert_float32_results(o, r, base, scale)
    except AssertionError as e:
        raise AssertionError(f"{what}, seed {seed}: {e}") from None
    return o, r


# ===================================================== graph batches (DataLoader)
def _small_graph(rng, n, e, duplicates=True):
    """A graph of n nodes and e edges (fewer where n is too small for e
    distinct edges): its last 1-2 nodes isolated (how many depends on n
    only), a few self-loops, duplicated edges (or none), edges in random
    order; features x [n, F_IN] and a target y [1] around 3 (away from the
    untrained model's outputs: the loss's gradient terms do not cancel)."""
    live = n - 1 - n % 2
    loops = int(rng.integers(1, 3))
    at = rng.choice(live, loops, replace=False)
    if duplicates:
        dups = int(rng.integers(1, 3))
        k = e - loops - dups
        src, dst = rng.integers(0, live, k), rng.integers(0, live, k)
        pick = rng.integers(0, k, dups)
        src, dst = np.concatenate([src, src[pick]]), np.concatenate([dst, dst[pick]])
    else:       # distinct pairs of distinct nodes
        k = min(e - loops, live * (live - 1))
        pairs = rng.choice(live * (live - 1), k, replace=False)
        src, dst = pairs // (live - 1), pairs % (live - 1)
        dst = dst + (dst >= src)
    src, dst = np.concatenate([src, at]), np.concatenate([dst, at])
    perm = rng.permutation(src.shape[0])
    ei = torch.from_numpy(np.stack([src[perm], dst[perm]]).astype(np.int64))
    x = torch.from_numpy(rng.standard_normal((n, F_IN)))
    return Data(x=x, edge_index=ei, y=torch.tensor([3 + float(rng.standard_normal())],
                                                   dtype=torch.float64))


def _graph_dataset(rng, batch_size=8, num_batches=4, duplicates=True):
    """num_batches x batch_size small graphs (5-30 nodes). Batches 2k and
    2k+1 hold graphs of the same sizes with other edges: the same numbers of
    nodes and edges and the same `batch` vector, another structure."""
    graphs = []
    for _ in range(num_batches // 2):
        sizes = [(int(n), int(rng.integers(n, 3 * n))) for n in rng.integers(5, 31, batch_size)]
        for _ in range(2):
            graphs += [_small_graph(rng, n, e, duplicates) for n, e in sizes]
    return graphs


def _as_adj_t(graphs, rng, layout, weighted):
    """The graphs as PyG's ToSparseTensor transform leaves them: a torch sparse
    adj_t in `layout` (duplicate edges merged, their values summed) holding
    float64 edge weights (random positive, or ones), no edge_index."""
    to_sparse = ToSparseTensor(attr="edge_weight", layout=layout)
    out = []
    for g in graphs:
        g = g.clone()
        g.edge_weight = (torch.from_numpy(rng.random(g.num_edges) + 0.5) if weighted
                         else torch.ones(g.num_edges, dtype=torch.float64))
        out.append(to_sparse(g))
    return out


class GraphNet(torch.nn.Module):
    """Two layers, then global mean, max and add pooling over `batch`, and a
    linear head: one prediction per graph."""

    def __init__(self, m, kind):
        super().__init__()
        self.conv1 = LAYERS[kind](m, F_IN, HIDDEN)
        self.conv2 = LAYERS[kind](m, HIDDEN, HIDDEN)
        self.head = torch.nn.Linear(3 * HIDDEN, 1)

    def forward(self, x, edge_index, batch, num_graphs):
        h = F.elu(self.conv1(x, edge_index))
        h = self.conv2(h, edge_index)
        g = torch.cat([pyg.global_mean_pool(h, batch, num_graphs),
                       pyg.global_max_pool(h, batch, num_graphs),
                       pyg.global_add_pool(h, batch, num_graphs)], dim=-1)
        return self.head(g).squeeze(-1)


def _graph_batches(kind, seed, dtype=torch.float64, layout=None, weighted=False):
    """PyG's DataLoader batches through GraphNet(kind), PyG's and ours reused
    step after step (an SGD step between batches), for two epochs. In the
    first each batch is dropped before the next is collated, so a new batch
    may land where the last one was (a cache keyed by addresses and shapes
    would answer for the previous graph); the second runs over a list of all
    the batches, alive together (a cache keyed by shapes would mix them up).
    layout: the batches' graph as edge_index (None) or as ToSparseTensor's
    adj_t in that layout, its values edge weights or ones (`weighted`; ones
    on graphs without duplicate edges)."""
    rng = np.random.default_rng(seed)
    graphs = _graph_dataset(rng, duplicates=layout is None or weighted)
    if layout is not None:
        graphs = _as_adj_t(graphs, rng, layout, weighted)
    loader = DataLoader(graphs, batch_size=8, shuffle=False)
    ref, ours = _pair_of_models(lambda m: GraphNet(m, kind), seed, dtype)

    def run(batch, what):
        graph = batch.edge_index if layout is None else batch.adj_t
        fixed = dict(edge_index=graph, batch=batch.batch, num_graphs=batch.num_graphs)

        def forward(model, x, y):
            out = model(x, **fixed)
            return out, F.mse_loss(out, y)
        _compare(ref, ours, dict(x=batch.x, y=batch.y), forward, f"{kind}: {what}", seed, dtype)
        clipped_sgd_step(ref, ours)
    it = iter(loader)
    for step in range(len(loader)):
        batch = next(it)
        run(batch, f"batch {step}")
        del batch
    kept = list(loader)
    for step, batch in enumerate(kept):
        run(batch, f"epoch 2, batch {step}")
    # the case the dataset was built for: the same sizes, another structure
    a, b = kept[0], kept[1]
    a, b = (a.edge_index, b.edge_index) if layout is None else (a.adj_t.to_dense(),
                                                                 b.adj_t.to_dense())
    assert a.shape == b.shape and not torch.equal(a, b)
    if layout is None:
        assert kept[0].num_edges == kept[1].num_edges


@pytest.mark.parametrize("kind", ["gcn", "gin", "sage_max", "sage_mean"])
def test_graph_batches_message_passing(kind, seed):
    """GCNConv, GINConv, SAGEConv(max), SAGEConv(mean) on DataLoader batches
    of small graphs with pooled readouts: loss, output and every gradient
    equal PyG's on each batch."""
    _graph_batches(kind, seed)


@pytest.mark.parametrize("kind", ["gat", "gatv2", "transformer"])
def test_graph_batches_attention(kind, seed):
    """GATConv, GATv2Conv, TransformerConv (2 heads) on DataLoader batches of
    small graphs with pooled readouts: loss, output and every gradient equal
    PyG's on each batch."""
    _graph_batches(kind, seed)


@pytest.mark.parametrize("kind", ["sage_max", "gat", "gcn"])
def test_graph_batches_float32(kind, seed):
    """The same with ours in float32, against PyG in float64 on the same
    rounded weights and inputs (float32 tolerances: `_compare`)."""
    _graph_batches(kind, seed, torch.float32)


@pytest.mark.parametrize("kind", ["sage_multi", "gat_mean_heads_residual",
                                  "transformer_mean_heads_beta", "sage_std_project",
                                  "gcn_improved_no_bias", "gatv2_residual"])
def test_graph_batches_layer_options(kind, seed):
    """Other constructor options on the same DataLoader batches (SAGEConv with
    several aggregations or std with project, GCNConv improved without bias,
    heads averaged with a residual or beta gate): equal to PyG's."""
    _graph_batches(kind, seed)


SPARSE_CASES = [  # (kind, layout, weighted)
    ("gcn", "csr", True), ("sage_mean", "coo", True), ("gat", "csr", False),
    ("gin", "csr", True), ("gcn", "coo", True), ("gin", "coo", True),
    ("sage_mean", "csr", True), ("sage_max", "csr", False), ("sage_max", "coo", False),
    ("gatv2", "csr", False), ("transformer", "csr", True),
]


@pytest.mark.parametrize("kind,layout,weighted", SPARSE_CASES,
                         ids=[f"{k}-{lay}-{'weighted' if w else 'ones'}"
                              for k, lay, w in SPARSE_CASES])
def test_graph_batches_sparse_adj_t(kind, layout, weighted, seed):
    """DataLoader batches of graphs transformed by ToSparseTensor (torch
    sparse CSR or COO adj_t, the batch's block-diagonal adj_t, values the
    edge weights): loss, output and every gradient equal PyG's on each batch.
    (The attention layers run on CSR only: PyG's own backward fails on a COO
    adj_t there, an index tensor it saved being edited in place.)"""
    _graph_batches(kind, seed, layout={"csr": torch.sparse_csr, "coo": torch.sparse_coo}[layout],
                   weighted=weighted)


def test_graph_batches_refilled_in_place(seed):
    """A pipeline that copies each batch's edge_index into a preallocated
    buffer (the same tensor every step, edited in place): every step is
    computed on the graph the buffer holds now."""
    rng = np.random.default_rng(seed)
    graphs = _graph_dataset(rng)
    batches = list(DataLoader(graphs, batch_size=8, shuffle=False))
    for kind in ("gcn", "sage_max", "gat", "transformer"):
        ref, ours = _pair_of_models(lambda m: GraphNet(m, kind), seed)
        for pair in ((0, 1), (2, 3)):      # each pair: the same sizes, another structure
            ei_buf = torch.empty_like(batches[pair[0]].edge_index)
            for step in pair:
                b = batches[step]
                ei_buf.copy_(b.edge_index)

                def forward(model, x, y):
                    out = model(x, ei_buf, b.batch, b.num_graphs)
                    return out, F.mse_loss(out, y)
                _compare(ref, ours, dict(x=b.x, y=b.y), forward,
                         f"{kind}: refilled buffer, batch {step}", seed)


@pytest.mark.parametrize("kind", ["sage_mean", "transformer", "gin", "gcn", "sage_max", "gat",
                                  "gatv2"])
def test_graph_batches_int32_edge_index(kind, seed):
    """Graphs whose edge_index is int32 (as read from int32 arrays), batched
    by DataLoader (which keeps int32): ours on the int32 batch equals PyG on
    the same edges in int64. (PyG's own layers take the int32 edge_index and,
    on torch 2.13's CPU, return wrong gradients of x for GINConv, SAGEConv
    and TransformerConv: the backward of its scatter is a torch.gather with
    an expanded int32 index, which reads wrong rows; so its int64 run is the
    reference.)"""
    rng = np.random.default_rng(seed)
    graphs = _graph_dataset(rng)
    for g in graphs:
        g.edge_index = g.edge_index.int()
    ref, ours = _pair_of_models(lambda m: GraphNet(m, kind), seed)
    for step, b in enumerate(DataLoader(graphs, batch_size=8, shuffle=False)):
        assert b.edge_index.dtype == torch.int32

        def forward(model, x, y):
            ei = b.edge_index if model is ours else b.edge_index.long()
            out = model(x, ei, b.batch, b.num_graphs)
            return out, F.mse_loss(out, y)
        _compare(ref, ours, dict(x=b.x, y=b.y), forward, f"{kind}: int32, batch {step}", seed)
        clipped_sgd_step(ref, ours)


# attention layers with edge features: name -> (make(module, in, out), forward takes size=)
EDGE_LAYERS = {
    "gat": (lambda m, a, b: m.GATConv(a, b // 2, heads=2, edge_dim=3), True),  # loops: mean
    "gatv2_min": (lambda m, a, b: m.GATv2Conv(a, b // 2, heads=2, edge_dim=3, fill_value="min"),
                  False),
    "transformer_beta": (lambda m, a, b: m.TransformerConv(a, b // 2, heads=2, edge_dim=3,
                                                           beta=True), False),
    "gat_add": (lambda m, a, b: m.GATConv(a, b // 2, heads=2, edge_dim=3, fill_value="add"),
                True),
    "gat_constant": (lambda m, a, b: m.GATConv(a, b // 2, heads=2, edge_dim=3, fill_value=0.5),
                     True),
    "gatv2_max_residual": (lambda m, a, b: m.GATv2Conv(a, b // 2, heads=2, edge_dim=3,
                                                       fill_value="max", residual=True), False),
    "gat_no_loops": (lambda m, a, b: m.GATConv(a, b // 2, heads=2, edge_dim=3,
                                               add_self_loops=False), True),
}


class EdgeGraphNet(torch.nn.Module):
    """GraphNet with edge features: two attention layers that read edge_attr,
    global mean pooling, a linear head."""

    def __init__(self, m, kind):
        super().__init__()
        make, _ = EDGE_LAYERS[kind]
        self.conv1, self.conv2 = make(m, F_IN, HIDDEN), make(m, HIDDEN, HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, 1)

    def forward(self, x, edge_index, edge_attr, batch, num_graphs):
        h = F.elu(self.conv1(x, edge_index, edge_attr))
        h = self.conv2(h, edge_index, edge_attr)
        return self.head(pyg.global_mean_pool(h, batch, num_graphs)).squeeze(-1)


@pytest.mark.parametrize("kind", list(EDGE_LAYERS))
def test_graph_batches_edge_attr(kind, seed):
    """DataLoader batches carrying edge features (batch.edge_attr [E, 3])
    through attention layers with edge_dim (self-loops' features filled by
    mean, min, add, max or a constant): loss, output and the gradients of x,
    of edge_attr and of every parameter equal PyG's on each batch."""
    rng = np.random.default_rng(seed)
    graphs = _graph_dataset(rng)
    for g in graphs:
        g.edge_attr = torch.from_numpy(rng.standard_normal((g.num_edges, 3)))
    ref, ours = _pair_of_models(lambda m: EdgeGraphNet(m, kind), seed)
    it = iter(DataLoader(graphs, batch_size=8, shuffle=False))
    for step in range(len(graphs) // 8):
        b = next(it)
        fixed = dict(edge_index=b.edge_index, batch=b.batch, num_graphs=b.num_graphs)

        def forward(model, x, edge_attr, y):
            out = model(x, edge_attr=edge_attr, **fixed)
            return out, F.mse_loss(out, y)
        _compare(ref, ours, dict(x=b.x, edge_attr=b.edge_attr, y=b.y), forward,
                 f"{kind}: edge_attr, batch {step}", seed)
        clipped_sgd_step(ref, ours)
        del b, fixed


# ============================================ neighbour batches (NeighborLoader)
def _big_graph(rng, n=240):
    """A random graph with duplicate edges, self-loops, a hub and nodes without
    in-edges (the last tenth)."""
    return awkward_edge_index(n, 5 * n, seed=int(rng.integers(2**31)))


def _sample(rng, ei, n, seeds, fanouts):
    """What NeighborLoader hands over for `seeds`: (node ids [N] with the seeds
    first, then each hop's new nodes in order of discovery; local edge_index
    [2, E] sorted by target; nodes per hop; edges per hop; the edges' ids in
    the graph [E]). Each hop samples up to `fanout` in-edges (without
    replacement) of every node the hop before discovered; duplicate edges of
    the graph may both be drawn."""
    src, dst = ei
    order = np.argsort(dst, kind="stable")
    ptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))])
    local = {int(v): i for i, v in enumerate(seeds)}
    nodes, frontier = [int(v) for v in seeds], [int(v) for v in seeds]
    rows, cols, eids, num_nodes, num_edges = [], [], [], [len(seeds)], []
    for fanout in fanouts:
        new, count = [], 0
        for v in frontier:
            edges = order[ptr[v]:ptr[v + 1]]
            for e in rng.choice(edges, min(fanout, edges.shape[0]), replace=False):
                u = int(src[e])
                if u not in local:
                    local[u] = len(nodes)
                    nodes.append(u)
                    new.append(u)
                rows.append(local[u])
                cols.append(local[v])
                eids.append(e)
                count += 1
        num_nodes.append(len(new))
        num_edges.append(count)
        frontier = new
    sub = np.stack([np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)])
    order = np.argsort(sub[1], kind="stable")
    return (np.asarray(nodes), torch.from_numpy(sub[:, order]), num_nodes, num_edges,
            torch.from_numpy(np.asarray(eids, dtype=np.int64)[order]))


def _neighbour_batches(rng, num_batches=3, batch_size=12, fanouts=(4, 3), n=240):
    """(x of the whole graph [n, F_IN], labels [n], the graph, [(node ids,
    edge_index, nodes per hop, edges per hop, edge ids), ...]) for
    consecutive seed batches; every batch has a seed without in-edges."""
    ei = _big_graph(rng, n)
    x = torch.from_numpy(rng.standard_normal((n, F_IN)))
    y = torch.from_numpy(rng.integers(0, F_OUT, n))
    perm = rng.permutation(n)
    batches = []
    for b in range(num_batches):
        seeds = perm[b * batch_size:(b + 1) * batch_size].copy()
        seeds[-1] = n - 1 - b               # the last tenth has no in-edges
        batches.append(_sample(rng, ei, n, seeds, fanouts))
    return x, y, ei, batches


class SubgraphNet(torch.nn.Module):
    """Two layers on the whole sampled subgraph (NeighborLoader's plain use)."""

    def __init__(self, m, kind):
        super().__init__()
        self.conv1 = LAYERS[kind](m, F_IN, HIDDEN)
        self.conv2 = LAYERS[kind](m, HIDDEN, F_OUT)

    def forward(self, x, edge_index):
        return self.conv2(F.elu(self.conv1(x, edge_index)), edge_index)


def _wrap(edge_index, sizes, form):
    """The edge_index as handed to the layers: the plain tensor, or a PyG
    EdgeIndex with sparse_size `sizes` sorted by column (the order the
    loader's edges are in), re-sorted by row, or shuffled (no sort order)."""
    if form == "tensor":
        return edge_index
    if form == "col":       # (an EdgeIndex takes contiguous storage only)
        return EdgeIndex(edge_index.contiguous(), sparse_size=sizes, sort_order="col")
    if form == "row":
        order = torch.argsort(edge_index[0], stable=True)
        return EdgeIndex(edge_index[:, order].contiguous(), sparse_size=sizes, sort_order="row")
    perm = torch.from_numpy(np.random.default_rng(edge_index.shape[1]).permutation(
        edge_index.shape[1]))
    return EdgeIndex(edge_index[:, perm].contiguous(), sparse_size=sizes)


def _subgraph_batches(kind, seed, form="tensor"):
    rng = np.random.default_rng(seed)
    x_all, y_all, _, batches = _neighbour_batches(rng)
    ref, ours = _pair_of_models(lambda m: SubgraphNet(m, kind), seed)
    for step, (nodes, ei, num_nodes, _, _) in enumerate(batches):
        bs, n = num_nodes[0], len(nodes)
        edge_index = _wrap(ei, (n, n), form)
        y = y_all[nodes[:bs]]

        def forward(model, x):
            out = model(x, edge_index)[:bs]
            return out, F.cross_entropy(out, y)
        _compare(ref, ours, dict(x=x_all[nodes]), forward, f"{kind}: {form}, batch {step}", seed)
        clipped_sgd_step(ref, ours)


@pytest.mark.parametrize("kind", ["sage_mean", "gat", "transformer", "gcn", "gin", "sage_max",
                                  "gatv2"])
def test_neighbour_batches_whole_subgraph(kind, seed):
    """NeighborLoader's subgraphs (seeds first, edges sorted by target): two
    layers on the whole subgraph, loss on the seeds' rows, three consecutive
    batches; loss, output and every gradient equal PyG's."""
    _subgraph_batches(kind, seed)


# bipartite layers: name -> (make(module, in, out), whether forward takes size=)
BIPARTITE = {
    "sage_mean": (lambda m, a, b: m.SAGEConv(a, b), True),
    "gat": (lambda m, a, b: m.GATConv(a, b // 2, heads=2, add_self_loops=False), True),
    "transformer": (lambda m, a, b: m.TransformerConv(a, b // 2, heads=2), False),
    "sage_max": (lambda m, a, b: m.SAGEConv(a, b, aggr="max"), True),
    "gatv2": (lambda m, a, b: m.GATv2Conv(a, b // 2, heads=2, add_self_loops=False), False),
    "gin": (lambda m, a, b: m.GINConv(_mlp(a, b), eps=0.1, train_eps=True), True),
    # separate source / target projections
    "gat_two_lins": (lambda m, a, b: m.GATConv((a, a), b // 2, heads=2, add_self_loops=False),
                     True),
    "gatv2_shared": (lambda m, a, b: m.GATv2Conv(a, b // 2, heads=2, add_self_loops=False,
                                                 share_weights=True), False),
    "sage_project": (lambda m, a, b: m.SAGEConv(a, b, project=True), True),
    # self-loops on the first min(num_src, num_dst) nodes: the targets, as they come first
    "gat_loops": (lambda m, a, b: m.GATConv(a, b // 2, heads=2), True),
    "gatv2_loops": (lambda m, a, b: m.GATv2Conv(a, b // 2, heads=2), False),
}


class TrimmedNet(torch.nn.Module):
    """Two bipartite layers, each with fewer targets than the one before
    (PyG's trim-to-layer): layer 1 from every sampled node to the seeds and
    hop-1 nodes, layer 2 from those to the seeds, x_dst = x[:num_dst]."""

    def __init__(self, m, kind):
        super().__init__()
        make, self.takes_size = BIPARTITE[kind]
        self.conv1 = make(m, F_IN, HIDDEN)
        self.conv2 = make(m, HIDDEN, F_OUT)

    def forward(self, x, graphs):
        for i, (conv, (edge_index, (num_src, num_dst))) in enumerate(zip((self.conv1, self.conv2),
                                                                          graphs)):
            assert x.shape[0] == num_src
            kw = dict(size=(num_src, num_dst)) if self.takes_size else {}
            x = conv((x, x[:num_dst]), edge_index, **kw)
            if i == 0:
                x = F.elu(x)
        return x


def _trimmed_graphs(ei, num_nodes, num_edges, form):
    """Per layer (edge_index, (num_src, num_dst)): layer 1 every edge (their
    targets are the seeds and hop-1 nodes), layer 2 hop 1's edges (a prefix:
    the edges are sorted by target)."""
    n0 = sum(num_nodes)
    n1 = num_nodes[0] + num_nodes[1]
    bs = num_nodes[0]
    assert bool((ei[1] < n1).all() and (ei[1, :num_edges[0]] < bs).all()
                and (ei[1, num_edges[0]:] >= bs).all())
    return [(_wrap(ei, (n0, n1), form), (n0, n1)),
            (_wrap(ei[:, :num_edges[0]], (n1, bs), form), (n1, bs))]


def _trimmed_batches(kind, seed, form="tensor", dtype=torch.float64):
    rng = np.random.default_rng(seed)
    x_all, y_all, _, batches = _neighbour_batches(rng)
    ref, ours = _pair_of_models(lambda m: TrimmedNet(m, kind), seed, dtype)
    for step, (nodes, ei, num_nodes, num_edges, _) in enumerate(batches):
        graphs = _trimmed_graphs(ei, num_nodes, num_edges, form)
        y = y_all[nodes[:num_nodes[0]]]

        def forward(model, x):
            out = model(x, graphs)
            return out, F.cross_entropy(out, y)
        _compare(ref, ours, dict(x=x_all[nodes]), forward,
                 f"{kind}: trimmed bipartite, {form}, batch {step}", seed, dtype)
        clipped_sgd_step(ref, ours)


@pytest.mark.parametrize("kind", list(BIPARTITE))
def test_neighbour_batches_trimmed_bipartite(kind, seed):
    """NeighborLoader's subgraphs through bipartite layers (x=(x_src, x_dst),
    size=(num_src, num_dst) where PyG takes it), each layer with fewer targets
    than the one before; loss, output and every gradient equal PyG's on three
    consecutive batches."""
    _trimmed_batches(kind, seed)


@pytest.mark.parametrize("kind", ["sage_max", "gatv2", "transformer"])
def test_neighbour_batches_trimmed_bipartite_float32(kind, seed):
    """The same with ours in float32, against PyG in float64 on the same
    rounded weights and inputs (float32 tolerances: `_compare`)."""
    _trimmed_batches(kind, seed, dtype=torch.float32)


class EdgeTrimmedNet(torch.nn.Module):
    """TrimmedNet with edge features: layer 1 reads the sampled edges'
    features, layer 2 those of hop 1's edges (their prefix)."""

    def __init__(self, m, kind):
        super().__init__()
        make, self.takes_size = EDGE_LAYERS[kind]
        self.conv1, self.conv2 = make(m, F_IN, HIDDEN), make(m, HIDDEN, F_OUT)

    def forward(self, x, edge_attr, graphs):
        for i, (conv, (edge_index, (num_src, num_dst))) in enumerate(zip((self.conv1, self.conv2),
                                                                          graphs)):
            kw = dict(size=(num_src, num_dst)) if self.takes_size else {}
            x = conv((x, x[:num_dst]), edge_index, edge_attr[:edge_index.shape[1]], **kw)
            if i == 0:
                x = F.elu(x)
        return x


@pytest.mark.parametrize("kind", ["gat", "transformer_beta", "gatv2_min", "gat_constant",
                                  "gat_no_loops"])
def test_neighbour_batches_trimmed_edge_attr(kind, seed):
    """NeighborLoader's subgraphs with the sampled edges' features
    (edge_attr[e_id]) through trimmed bipartite attention layers with
    edge_dim: loss, output and the gradients of x, of edge_attr and of every
    parameter equal PyG's on three consecutive batches."""
    rng = np.random.default_rng(seed)
    x_all, y_all, ei_all, batches = _neighbour_batches(rng)
    attr_all = torch.from_numpy(rng.standard_normal((ei_all.shape[1], 3)))
    ref, ours = _pair_of_models(lambda m: EdgeTrimmedNet(m, kind), seed)
    for step, (nodes, ei, num_nodes, num_edges, e_id) in enumerate(batches):
        graphs = _trimmed_graphs(ei, num_nodes, num_edges, "tensor")
        y = y_all[nodes[:num_nodes[0]]]

        def forward(model, x, edge_attr):
            out = model(x, edge_attr, graphs)
            return out, F.cross_entropy(out, y)
        _compare(ref, ours, dict(x=x_all[nodes], edge_attr=attr_all[e_id]), forward,
                 f"{kind}: trimmed with edge_attr, batch {step}", seed)
        clipped_sgd_step(ref, ours)


@pytest.mark.parametrize("kind", ["sage_max", "gat_loops", "transformer", "sage_mean", "gin",
                                  "gatv2"])
def test_neighbour_batches_without_sampled_edges(kind, seed):
    """Seed batches where little or nothing is sampled: seeds without
    in-edges only (no edges at all, one layer's edge_index [2, 0]), and
    seeds mixing those with a hub; trimmed bipartite layers on plain tensors
    and on EdgeIndex objects equal PyG's."""
    rng = np.random.default_rng(seed)
    n = 240
    ei = _big_graph(rng, n)
    x_all = torch.from_numpy(rng.standard_normal((n, F_IN)))
    ref, ours = _pair_of_models(lambda m: TrimmedNet(m, kind), seed)
    for seeds, empty in ((np.arange(n - 6, n), True), (np.array([n - 1, 0, n - 2]), False)):
        nodes, sub, num_nodes, num_edges, _ = _sample(rng, ei, n, seeds, (4, 3))
        assert (num_edges == [0, 0]) == empty
        # a random cotangent as the loss: without edges the attention layers'
        # output is their bias, whose cross-entropy gradient can vanish
        cot = torch.from_numpy(rng.standard_normal((num_nodes[0], F_OUT)))
        for form in ("tensor", "col", "unsorted"):
            graphs = _trimmed_graphs(sub, num_nodes, num_edges, form)

            def forward(model, x):
                out = model(x, graphs)
                return out, (out * cot).sum()
            _compare(ref, ours, dict(x=x_all[nodes]), forward,
                     f"{kind}: {num_edges} sampled edges, {form}", seed)


EDGE_INDEX_CASES = [(kind, form) for form in ("col", "row", "unsorted")
                    for kind in ("sage_mean", "gat", "transformer", "sage_max", "gatv2", "gin",
                                 "gat_loops")]


@pytest.mark.parametrize("kind,form", EDGE_INDEX_CASES,
                         ids=[f"{k}-{f}" for k, f in EDGE_INDEX_CASES])
def test_neighbour_batches_edge_index_bipartite(kind, form, seed):
    """The trimmed bipartite layers fed PyG EdgeIndex objects (sparse_size
    (num_src, num_dst); sorted by column, by row, or not sorted), the same
    objects to PyG and to ours: results and gradients equal PyG's."""
    _trimmed_batches(kind, seed, form)


@pytest.mark.parametrize("kind,form", [("sage_mean", "col"), ("gat", "row"),
                                       ("transformer", "unsorted"), ("gcn", "col"),
                                       ("gin", "row"), ("sage_max", "unsorted"),
                                       ("gatv2", "col")])
def test_neighbour_batches_edge_index_whole_subgraph(kind, form, seed):
    """Layers on the whole subgraph fed a square PyG EdgeIndex (sorted by
    column, by row, or not sorted): results and gradients equal PyG's."""
    _subgraph_batches(kind, seed, form)


# ============================================ link batches (LinkNeighborLoader)
class LinkNet(torch.nn.Module):
    """Embeddings from two SAGEConv layers; a score per label pair: the dot
    product of its two embeddings."""

    def __init__(self, m, aggr):
        super().__init__()
        self.conv1 = m.SAGEConv(F_IN, HIDDEN, aggr=aggr)
        self.conv2 = m.SAGEConv(HIDDEN, HIDDEN, aggr=aggr)

    def forward(self, x, edge_index, edge_label_index):
        h = self.conv2(F.elu(self.conv1(x, edge_index)), edge_index)
        return (h[edge_label_index[0]] * h[edge_label_index[1]]).sum(-1)


def _link_batches(rng, num_batches=3, num_pos=8, fanouts=(4, 3), n=240):
    """LinkNeighborLoader's batches: positive label edges drawn from the
    graph, as many random negative pairs; the subgraph sampled around their
    endpoints (seeds first), edge_label_index in local ids, edge_label 1 / 0."""
    ei = _big_graph(rng, n)
    x = torch.from_numpy(rng.standard_normal((n, F_IN)))
    batches = []
    for _ in range(num_batches):
        pos = ei[:, rng.choice(ei.shape[1], num_pos, replace=False)]
        neg = rng.integers(0, n, (2, num_pos))
        pairs = np.concatenate([pos, neg], axis=1)
        seeds, inverse = np.unique(pairs.reshape(-1), return_inverse=True)
        nodes, sub, _, _, _ = _sample(rng, ei, n, seeds, fanouts)
        label_index = torch.from_numpy(inverse.reshape(2, -1).astype(np.int64))
        label = torch.cat([torch.ones(num_pos), torch.zeros(num_pos)]).double()
        batches.append((nodes, sub, label_index, label))
    return x, batches


@pytest.mark.parametrize("aggr", ["mean", "max"])
def test_link_batches_dot_product_bce(aggr, seed):
    """LinkNeighborLoader's batches: a 2-layer SAGE's embeddings, dot-product
    scores of the label pairs, BCE loss; loss, scores and every gradient equal
    PyG's on three consecutive batches."""
    rng = np.random.default_rng(seed)
    x_all, batches = _link_batches(rng)
    ref, ours = _pair_of_models(lambda m: LinkNet(m, aggr), seed)
    for step, (nodes, ei, label_index, label) in enumerate(batches):
        def forward(model, x):
            score = model(x, ei, label_index)
            return score, F.binary_cross_entropy_with_logits(score, label)
        _compare(ref, ours, dict(x=x_all[nodes]), forward, f"link {aggr}: batch {step}", seed)
        clipped_sgd_step(ref, ours)
