"""fastgnn.dgl against DGL itself: every module and op with identical
weights (a DGL state_dict loaded with strict=True), outputs and EVERY
gradient (features, edge weights, parameters) under a random cotangent, on
graphs with 0-in-degree nodes, self-loops, duplicate edges and a hub, on
bipartite blocks from `dgl.to_block` and on bipartite graphs with
(src, dst) feature pairs; `dgl.nn.HeteroGraphConv` over fastgnn.dgl's
modules against the same over DGL's, on a heterograph and its blocks;
state_dicts both ways; fastgnn.torch's ops on
DGLGraphs; the graph cache; a sampled mini-batch training loop with
`dgl.dataloading`; blocks and link-prediction batches from
`dgl.dataloading` through every layer, batch after batch. Needs dgl
(skipped where it is not installed: DGL's wheels support torch 2.0-2.2 and
numpy < 2, so CI runs this file in an environment of its own, `.venv-dgl`;
docs/testing.md)."""
import copy
import os
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("DGLBACKEND", "pytorch")
torch = pytest.importorskip("torch")
dgl = pytest.importorskip("dgl")

import dgl.nn as dnn                          # noqa: E402
import dgl.ops as dops                        # noqa: E402
from dgl.nn.functional import edge_softmax as dgl_edge_softmax  # noqa: E402

import fastgnn.dgl as fd                      # noqa: E402
import fastgnn.torch as ft                    # noqa: E402
from fastgnn.testing import (assert_float32_results, assert_results_match,  # noqa: E402
                             awkward_edge_index, clipped_sgd_step)

warnings.filterwarnings("ignore", module="dgl")

N = 40          # nodes of the homogeneous graphs
NS, ND = 37, 23  # source / destination nodes of the bipartite graphs
README = Path(__file__).resolve().parents[1] / "README.md"


# ------------------------------------------------------------------ graphs
def _homo(rng, n=N):
    """A homogeneous graph with 0-in-degree nodes (its last tenth), self-loops,
    duplicate edges and a hub (node 0), edge ids in shuffled order."""
    ei = awkward_edge_index(n, 4 * n, seed=int(rng.integers(2**31)))
    return dgl.graph((torch.from_numpy(ei[0]), torch.from_numpy(ei[1])), num_nodes=n)


def _block(rng, n=N):
    """A block (dgl.to_block of the in-edges of half the nodes of `_homo`, as
    a full-neighbour sampler makes it), the hub and a 0-in-degree node among
    its destinations."""
    g = _homo(rng, n)
    seeds = np.unique(np.concatenate([[0, n - 1], rng.choice(n, n // 2, replace=False)]))
    seeds = torch.from_numpy(rng.permutation(seeds))
    block = dgl.to_block(dgl.in_subgraph(g, seeds), seeds)
    assert block.is_block and block.num_src_nodes() > block.num_dst_nodes()
    assert (block.in_degrees() == 0).any()
    return block


def _bipartite(rng):
    """A unidirectional bipartite graph ("user" -> "item"), features as a pair."""
    ei = awkward_edge_index(ND, 4 * ND, seed=int(rng.integers(2**31)), num_src=NS)
    return dgl.heterograph({("user", "rates", "item"): (torch.from_numpy(ei[0]),
                                                        torch.from_numpy(ei[1]))},
                           {"user": NS, "item": ND})


def _looped(rng):
    """`_homo` with a self-loop added at every node: no 0-in-degree node."""
    return dgl.add_self_loop(_homo(rng))


GRAPHS = {"homo": _homo, "block": _block, "bipartite": _bipartite, "looped": _looped}


def _features(g, rng, width, pair=False, width_dst=None, prefix=()):
    """Source features [num_src, *prefix, width] (a block's leading rows are its
    destinations), or a (src, dst) pair."""
    src = torch.from_numpy(rng.standard_normal((g.num_src_nodes(), *prefix, width)))
    if not pair:
        return src
    dst = torch.from_numpy(rng.standard_normal((g.num_dst_nodes(), *prefix,
                                                width_dst or width)))
    return src, dst


def _weights(g, rng):
    return torch.from_numpy(rng.random(g.num_edges()) + 0.1)


# --------------------------------------------------------------- comparing
def _leaf(t):
    return t.detach().clone().requires_grad_(True)


def _run(module, graph, feat, edge_weight, kwargs, cot_seed, edge_arg="edge_weight"):
    """Outputs and every gradient of module(graph, feat, ...) under a random
    cotangent (the same for every run with cot_seed), as {name: float64 tensor};
    edge_weight is passed as the keyword edge_arg."""
    leaves = tuple(_leaf(f) for f in (feat if isinstance(feat, tuple) else (feat,)))
    kw = dict(kwargs)
    ew = None
    if edge_weight is not None:
        ew = kw[edge_arg] = _leaf(edge_weight)
    before = [t.detach().clone() for t in leaves + ((ew,) if ew is not None else ())]
    out = module(graph, leaves if isinstance(feat, tuple) else leaves[0], **kw)
    outs = out if isinstance(out, tuple) else (out,)
    gen = torch.Generator().manual_seed(cot_seed)
    loss = sum((o * torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype)).sum()
               for o in outs)
    loss.backward()
    after = [t.detach() for t in leaves + ((ew,) if ew is not None else ())]
    assert all(torch.equal(a, b) for a, b in zip(before, after)), "an input was modified"
    res = {f"output[{i}]": o.detach().double() for i, o in enumerate(outs)}
    for i, t in enumerate(leaves):
        res[f"grad feat[{i}]"] = None if t.grad is None else t.grad.double()
    if ew is not None:
        res[f"grad {edge_arg}"] = ew.grad.double()
    for name, p in module.named_parameters():
        res[f"grad {name}"] = None if p.grad is None else p.grad.double()
    return res


def compare(ref, ours, graph, feat, edge_weight=None, *, seed=0, dtype=torch.float64,
            torch_seed=None, edge_arg="edge_weight", **kwargs):
    """Load DGL's state_dict into ours (strict), run both on the same inputs
    (DGL in float64, ours in `dtype`) and compare outputs and every gradient.
    torch_seed: seed torch's generator with it before each run (the same
    dropout masks for both); edge_arg: the keyword that takes edge_weight (a
    per-edge tensor whose gradient is compared too)."""
    ref = ref.double()
    ours.load_state_dict(ref.state_dict(), strict=True)
    ours = ours.to(dtype)
    ref.load_state_dict({k: v.to(dtype).double() for k, v in ours.state_dict().items()})
    cast = (lambda t: t.to(dtype)) if dtype != torch.float64 else (lambda t: t)
    feat_ours = tuple(map(cast, feat)) if isinstance(feat, tuple) else cast(feat)
    feat_ref = (tuple(t.to(dtype).double() for t in feat) if isinstance(feat, tuple)
                else feat.to(dtype).double())
    ew_ours = None if edge_weight is None else cast(edge_weight)
    ew_ref = None if edge_weight is None else edge_weight.to(dtype).double()
    if torch_seed is not None:
        torch.manual_seed(torch_seed)
    r = _run(ref, graph, feat_ref, ew_ref, kwargs, seed, edge_arg)
    if torch_seed is not None:
        torch.manual_seed(torch_seed)
    o = _run(ours, graph, feat_ours, ew_ours, kwargs, seed, edge_arg)
    assert_results_match(o, r, "float64" if dtype == torch.float64 else "float32")
    return o, r


def _both(cls, *args, **kw):
    """(DGL's module, ours) from the same arguments; ours built from the same
    torch seed, so seeded construction is checked too."""
    torch.manual_seed(0)
    ref = getattr(dnn, cls)(*args, **kw)
    torch.manual_seed(0)
    ours = getattr(fd, cls)(*copy.deepcopy(args), **kw)
    return ref, ours


def _same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


# --------------------------------------------------------------- GraphConv
GRAPHCONV = [  # (options, graph, in, out, weighted, pair)
    (dict(norm="both"), "homo", 6, 4, True, False),
    (dict(norm="both"), "block", 4, 7, False, False),
    (dict(norm="right"), "bipartite", 6, 4, True, True),
    (dict(norm="none"), "block", 6, 4, True, False),
    (dict(norm="left"), "homo", 4, 7, True, False),
    (dict(norm="right", bias=False), "homo", 4, 7, False, False),
    (dict(norm="both", bias=False), "bipartite", 4, 7, True, True),
    (dict(norm="none", weight=False), "homo", 5, 5, True, False),
    (dict(norm="both", activation=torch.tanh), "block", 6, 4, True, False),
]


@pytest.mark.parametrize("opts,kind,fin,fout,weighted,pair", GRAPHCONV)
def test_graphconv_matches_dgl(opts, kind, fin, fout, weighted, pair, rng, seed):
    g = GRAPHS[kind](rng)
    ref, ours = _both("GraphConv", fin, fout, allow_zero_in_degree=True, **opts)
    _same_state(ref, ours)
    feat = _features(g, rng, fin, pair)
    compare(ref, ours, g, feat, _weights(g, rng) if weighted else None, seed=seed)


def test_graphconv_external_weight_and_batched_features(rng, seed):
    g = _homo(rng)
    ref, ours = _both("GraphConv", 6, 4, weight=False, allow_zero_in_degree=True)
    w = torch.from_numpy(rng.standard_normal((6, 4)))
    compare(ref, ours, g, _features(g, rng, 6), None, seed=seed, weight=w)
    # features with extra dimensions [N, *, in]
    for fin, fout in ((6, 4), (3, 5)):
        ref, ours = _both("GraphConv", fin, fout, allow_zero_in_degree=True)
        compare(ref, ours, g, _features(g, rng, fin, prefix=(2, 3)), _weights(g, rng),
                seed=seed)
    with pytest.raises(dgl.DGLError, match="weight"):
        ours = fd.GraphConv(6, 4, allow_zero_in_degree=True).double()
        ours(g, _features(g, rng, 6), weight=w)


def test_graphconv_float32(rng, seed):
    g = _block(rng)
    for fin, fout in ((6, 4), (4, 7)):
        ref, ours = _both("GraphConv", fin, fout, allow_zero_in_degree=True)
        compare(ref, ours, g, _features(g, rng, fin), _weights(g, rng), seed=seed,
                dtype=torch.float32)


# ---------------------------------------------------------------- SAGEConv
SAGE = [  # (aggregator, graph, in, out, weighted, pair)
    ("mean", "homo", 6, 4, True, False),
    ("gcn", "block", 4, 7, True, False),
    ("pool", "bipartite", 6, 4, False, True),
    ("mean", "block", 4, 7, False, False),
    ("mean", "bipartite", 6, 4, True, True),
    ("gcn", "homo", 6, 4, False, False),
    ("gcn", "bipartite", 4, 7, True, True),
    ("pool", "homo", 4, 7, True, False),
    ("pool", "block", 6, 4, False, False),
    ("pool", "block", 4, 7, True, False),
]


@pytest.mark.parametrize("aggr,kind,fin,fout,weighted,pair", SAGE)
def test_sageconv_matches_dgl(aggr, kind, fin, fout, weighted, pair, rng, seed):
    g = GRAPHS[kind](rng)
    ins = (fin, fin + 2) if pair and aggr != "gcn" else fin
    ref, ours = _both("SAGEConv", ins, fout, aggr, activation=torch.relu,
                      norm=torch.nn.LayerNorm(fout) if weighted else None)
    _same_state(ref, ours)
    feat = _features(g, rng, fin, pair, None if aggr == "gcn" else fin + 2)
    compare(ref, ours, g, feat, _weights(g, rng) if weighted else None, seed=seed)


def test_sageconv_options_and_feat_drop(rng, seed):
    g = _block(rng)
    for aggr in ("mean", "gcn", "pool"):
        ref, ours = _both("SAGEConv", 5, 3, aggr, bias=False)
        _same_state(ref, ours)
        compare(ref, ours, g, _features(g, rng, 5), _weights(g, rng), seed=seed)
    # feat_drop is torch's Dropout, called as DGL calls it: the same masks from the same seed
    ref, ours = _both("SAGEConv", 5, 3, "mean", feat_drop=0.5)
    ours.load_state_dict(ref.double().state_dict(), strict=True)
    ours.double()
    x = _features(g, rng, 5)
    torch.manual_seed(seed)
    a = ref(g, x)
    torch.manual_seed(seed)
    b = ours(g, x)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    with pytest.raises(NotImplementedError, match="lstm"):
        fd.SAGEConv(5, 3, "lstm")


# ----------------------------------------------------------------- GINConv
GIN = [  # (aggregator, learn_eps, graph, weighted, pair)
    ("sum", True, "homo", True, False),
    ("max", False, "block", True, False),
    ("mean", True, "bipartite", True, True),
    ("max", True, "homo", False, False),
    ("sum", False, "block", False, False),
    ("mean", False, "homo", True, False),
    ("max", True, "bipartite", False, True),
]


@pytest.mark.parametrize("aggr,learn_eps,kind,weighted,pair", GIN)
def test_ginconv_matches_dgl(aggr, learn_eps, kind, weighted, pair, rng, seed):
    g = GRAPHS[kind](rng)
    torch.manual_seed(1)
    mlp = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    ref = dnn.GINConv(copy.deepcopy(mlp), aggr, init_eps=0.3, learn_eps=learn_eps,
                      activation=torch.tanh)
    ours = fd.GINConv(copy.deepcopy(mlp), aggr, init_eps=0.3, learn_eps=learn_eps,
                      activation=torch.tanh)
    _same_state(ref, ours)
    compare(ref, ours, g, _features(g, rng, 5, pair), _weights(g, rng) if weighted else None,
            seed=seed)


def test_ginconv_without_apply_func(rng, seed):
    g = _block(rng)
    compare(dnn.GINConv(None, "sum", learn_eps=True), fd.GINConv(None, "sum", learn_eps=True),
            g, _features(g, rng, 4, prefix=(3,)), _weights(g, rng), seed=seed)
    with pytest.raises(KeyError):
        fd.GINConv(None, "min")


# ----------------------------------------------------------------- GATConv
GAT = [  # (options, graph, in_feats, weighted, get_attention, pair)
    (dict(), "homo", 6, False, True, False),
    (dict(residual=True), "block", 6, True, True, False),
    (dict(residual=True), "bipartite", (6, 8), False, True, True),
    (dict(residual=True, bias=False), "homo", 8, False, False, False),   # identity residual
    (dict(bias=False, negative_slope=0.1), "block", 6, False, True, False),
    (dict(activation=torch.relu), "bipartite", 6, True, True, True),
    (dict(residual=True), "homo", 6, True, False, False),
    (dict(attn_drop=0.4), "block", (6, 5), False, True, True),    # eval: no dropout
]


@pytest.mark.parametrize("opts,kind,fin,weighted,get_attention,pair", GAT)
def test_gatconv_matches_dgl(opts, kind, fin, weighted, get_attention, pair, rng, seed):
    g = GRAPHS[kind](rng)
    ref, ours = _both("GATConv", fin, 4, 2, allow_zero_in_degree=True, **opts)
    _same_state(ref, ours)
    if opts.get("attn_drop"):
        ref.eval(), ours.eval()
    fs, fdst = (fin, fin) if isinstance(fin, int) else fin
    feat = _features(g, rng, fs, pair, fdst)
    compare(ref, ours, g, feat, _weights(g, rng) if weighted else None, seed=seed,
            get_attention=get_attention)


def test_gatconv_extra_feature_dimensions_and_float32(rng, seed):
    g = _homo(rng)
    for residual in (False, True):      # (DGL's GATConv takes no edge_weight with extra dimensions)
        ref, ours = _both("GATConv", 6, 3, 2, residual=residual, allow_zero_in_degree=True)
        compare(ref, ours, g, _features(g, rng, 6, prefix=(2,)), seed=seed, get_attention=True)
    ref, ours = _both("GATConv", 6, 4, 3, allow_zero_in_degree=True)
    block = _block(rng)
    compare(ref, ours, block, _features(block, rng, 6), seed=seed, dtype=torch.float32,
            get_attention=True)


# --------------------------------------------------------------- GATv2Conv
GATV2 = [  # (options, graph, in_feats, get_attention, pair)
    (dict(), "homo", 6, True, False),
    (dict(residual=True, share_weights=True), "block", 6, True, False),
    (dict(residual=True), "bipartite", (6, 8), True, True),
    (dict(residual=True, bias=False), "homo", 8, False, False),      # identity residual
    (dict(share_weights=True), "homo", 6, True, False),
    (dict(negative_slope=0.05, activation=torch.relu), "block", 6, True, False),
    (dict(share_weights=True, bias=False), "bipartite", 6, True, True),
]


@pytest.mark.parametrize("opts,kind,fin,get_attention,pair", GATV2)
def test_gatv2conv_matches_dgl(opts, kind, fin, get_attention, pair, rng, seed):
    g = GRAPHS[kind](rng)
    ref, ours = _both("GATv2Conv", fin, 4, 2, allow_zero_in_degree=True, **opts)
    _same_state(ref, ours)
    fs, fdst = (fin, fin) if isinstance(fin, int) else fin
    compare(ref, ours, g, _features(g, rng, fs, pair, fdst), seed=seed,
            get_attention=get_attention)


def test_gatv2conv_float32(rng, seed):
    g = _block(rng)
    ref, ours = _both("GATv2Conv", 6, 4, 2, residual=True, allow_zero_in_degree=True)
    compare(ref, ours, g, _features(g, rng, 6), seed=seed, dtype=torch.float32,
            get_attention=True)


@pytest.mark.parametrize("cls", ["GATConv", "GATv2Conv"])
def test_attention_dropout_weights_are_what_the_output_sums(cls, rng):
    """In training, get_attention's weights (after dropout) are exactly the
    weights the output is the sum of: out[v] = sum_e a_e W h_u."""
    g = _homo(rng)
    conv = getattr(fd, cls)(6, 4, 2, attn_drop=0.5, allow_zero_in_degree=True).double()
    conv.train()
    x = _features(g, rng, 6)
    out, a = conv(g, x, get_attention=True)
    msgs = (conv.fc if cls == "GATConv" else conv.fc_src)(x).view(-1, 2, 4)
    torch.testing.assert_close(out, dops.u_mul_e_sum(g, msgs, a), rtol=1e-10, atol=1e-12)
    dropped = (a == 0).double().mean().item()
    assert 0.3 < dropped < 0.7, dropped
    # each kept weight is a softmax weight scaled by 1/(1-p)
    conv.eval()
    _, full = conv(g, x, get_attention=True)
    kept = a != 0
    torch.testing.assert_close(a[kept], 2 * full[kept], rtol=1e-10, atol=1e-12)


def test_gatconv_edge_weight_dropout_is_dgls(rng, seed):
    """With edge_weight the weights are dropped by the module's nn.Dropout, as
    DGL's: the same masks, so the same training-mode function, from one seed."""
    g = _homo(rng)
    ref, ours = _both("GATConv", 6, 4, 2, attn_drop=0.5, feat_drop=0.3,
                      allow_zero_in_degree=True)
    ref.train(), ours.train()
    o, r = compare(ref, ours, g, _features(g, rng, 6), _weights(g, rng), seed=seed,
                   torch_seed=seed, get_attention=True)
    assert (o["output[1]"] == 0).any()            # some weights were dropped


# ---------------------------------------------------------------- GINEConv
GINE = [  # (learn_eps, graph, pair, feature shape, with apply_func)
    (True, "homo", False, (5,), True),
    (False, "block", False, (5,), True),
    (True, "bipartite", True, (5,), True),
    (False, "homo", False, (2, 3), False),         # extra feature dimensions, no apply_func
    (True, "looped", False, (4,), False),
]


@pytest.mark.parametrize("learn_eps,kind,pair,shape,with_mlp", GINE)
def test_gineconv_matches_dgl(learn_eps, kind, pair, shape, with_mlp, rng, seed):
    g = GRAPHS[kind](rng)
    torch.manual_seed(1)
    mlp = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    ref = dnn.GINEConv(copy.deepcopy(mlp) if with_mlp else None, init_eps=0.3,
                       learn_eps=learn_eps)
    ours = fd.GINEConv(copy.deepcopy(mlp) if with_mlp else None, init_eps=0.3,
                       learn_eps=learn_eps)
    _same_state(ref, ours)
    feat = _features(g, rng, shape[-1], pair, prefix=shape[:-1])
    edge_feat = torch.from_numpy(rng.standard_normal((g.num_edges(), *shape)))
    compare(ref, ours, g, feat, edge_feat, seed=seed, edge_arg="edge_feat")


def test_gineconv_float32(rng, seed):
    g = _block(rng)
    ref = dnn.GINEConv(torch.nn.Linear(6, 4), learn_eps=True)
    ours = fd.GINEConv(copy.deepcopy(ref.apply_func), learn_eps=True)
    compare(ref, ours, g, _features(g, rng, 6),
            torch.from_numpy(rng.standard_normal((g.num_edges(), 6))), seed=seed,
            dtype=torch.float32, edge_arg="edge_feat")


# ------------------------------------------------------------ RelGraphConv
R = 4           # relations; etypes draw 0 .. R-2, so the last relation has no edge


def _etypes(g, rng):
    return torch.from_numpy(rng.integers(0, R - 1, g.num_edges()))


def _norm(g, rng):
    return torch.from_numpy(rng.random((g.num_edges(), 1)) + 0.1)


RGCN = [  # (options, graph, in, out, with norm); in > out: x W_r first, else aggregate first
    (dict(), "homo", 6, 4, True),
    (dict(), "block", 4, 7, False),
    (dict(regularizer="basis", num_bases=2, layer_norm=True), "block", 6, 4, True),
    (dict(regularizer="basis", activation=torch.tanh), "homo", 4, 7, True),
    (dict(regularizer="bdd", num_bases=2, bias=False), "homo", 6, 4, True),
    (dict(regularizer="bdd", num_bases=3, layer_norm=True), "block", 6, 9, False),
    (dict(self_loop=False, layer_norm=True), "bipartite", 6, 4, True),
    (dict(bias=False), "bipartite", 4, 7, True),      # DGL's self-loop: feat's first num_dst rows
]


@pytest.mark.parametrize("opts,kind,fin,fout,with_norm", RGCN)
def test_relgraphconv_matches_dgl(opts, kind, fin, fout, with_norm, rng, seed):
    g = GRAPHS[kind](rng)
    ref, ours = _both("RelGraphConv", fin, fout, R, **opts)
    _same_state(ref, ours)
    if opts.get("layer_norm"):       # DGL's LayerNorm starts as the identity affine map
        with torch.no_grad():
            for p in ref.layer_norm_weight.parameters():
                p.copy_(torch.from_numpy(rng.standard_normal(p.shape)))
    compare(ref, ours, g, _features(g, rng, fin), _norm(g, rng) if with_norm else None,
            seed=seed, edge_arg="norm", etypes=_etypes(g, rng))


def test_relgraphconv_etype_counts_dropout_and_float32(rng, seed):
    """etypes as per-relation edge counts (edges sorted by relation) give the
    function of the per-edge tensor; dropout is DGL's nn.Dropout (the same
    masks from one seed); float32 within its tolerance."""
    g = _homo(rng)
    etypes = _etypes(g, rng)
    order = torch.argsort(etypes, stable=True)
    src, dst = g.edges(order="eid")
    by_relation = dgl.graph((src[order], dst[order]), num_nodes=g.num_nodes())
    counts = torch.bincount(etypes[order], minlength=R).tolist()
    ref, ours = _both("RelGraphConv", 6, 4, R, regularizer="basis", num_bases=2)
    _same_state(ref, ours)
    x, norm = _features(g, rng, 6), _norm(g, rng)
    r = _run(ref.double(), by_relation, x, norm, dict(etypes=etypes[order]), seed, "norm")
    o = _run(ours.double(), by_relation, x, norm, dict(etypes=counts, presorted=True), seed,
             "norm")
    assert_results_match(o, r)
    ref, ours = _both("RelGraphConv", 6, 4, R, dropout=0.4)
    ref.train(), ours.train()
    o, _ = compare(ref, ours, g, x, norm, seed=seed, torch_seed=seed, edge_arg="norm",
                   etypes=etypes)
    assert (o["output[0]"] == 0).any()
    ref, ours = _both("RelGraphConv", 6, 4, R, regularizer="bdd", num_bases=2)
    block = _block(rng)
    compare(ref, ours, block, _features(block, rng, 6), _norm(block, rng), seed=seed,
            dtype=torch.float32, edge_arg="norm", etypes=_etypes(block, rng))


# ---------------------------------------------------------- HeteroGraphConv
NODES = {"user": 31, "item": 23, "tag": 11}
RELATIONS = [("user", "follows", "user"), ("user", "rates", "item"),
             ("item", "rated_by", "user"), ("item", "tagged", "tag")]


def _hetero(rng):
    """A heterograph with three node types and four relations, each with
    duplicate edges, a hub and destinations without in-edges (self-loops in
    the relation within one type); "tag" is only a destination."""
    data = {}
    for s, e, d in RELATIONS:
        ei = awkward_edge_index(NODES[d], 3 * NODES[d], seed=int(rng.integers(2**31)),
                                num_src=None if s == d else NODES[s])
        data[s, e, d] = (torch.from_numpy(ei[0]), torch.from_numpy(ei[1]))
    return dgl.heterograph(data, NODES)


def _hetero_block(rng):
    """A block of `_hetero` (dgl.to_block of the in-edges of about half of each type)."""
    g = _hetero(rng)
    seeds = {t: torch.from_numpy(np.unique(np.concatenate(
        [[0, n - 1], rng.choice(n, n // 2, replace=False)]))) for t, n in NODES.items()}
    return dgl.to_block(dgl.in_subgraph(g, seeds), seeds)


def _relation_modules(lib, kind):
    """{relation: module} of `lib` (dgl.nn or fastgnn.dgl), F = 5 input features."""
    if kind == "convs":
        return {"follows": lib.GraphConv(5, 4, allow_zero_in_degree=True),
                "rates": lib.SAGEConv((5, 5), 4, "mean"),
                "rated_by": lib.GINConv(torch.nn.Linear(5, 4), "max"),
                "tagged": lib.GraphConv(5, 4, norm="right", allow_zero_in_degree=True)}
    if kind == "attention":
        return {"follows": lib.GATConv(5, 3, 2, allow_zero_in_degree=True),
                "rates": lib.GATConv((5, 5), 3, 2, residual=True, allow_zero_in_degree=True),
                "rated_by": lib.GATv2Conv((5, 5), 3, 2, allow_zero_in_degree=True),
                "tagged": lib.GATv2Conv(5, 3, 2, residual=True, allow_zero_in_degree=True)}
    return {"follows": lib.GINEConv(torch.nn.Linear(5, 4), learn_eps=True),
            "rates": lib.GINEConv(torch.nn.Linear(5, 4)),
            "rated_by": lib.SAGEConv(5, 4, "pool"),
            "tagged": lib.SAGEConv((5, 5), 4, "gcn")}


def _edge_inputs(g, kind, rng):
    """mod_kwargs: per-edge tensors by relation (edge weights, edge features)."""
    def rows(e, *shape):
        return torch.from_numpy(rng.standard_normal((g.num_edges(e), *shape)))
    if kind == "convs":
        return {"follows": {"edge_weight": rows("follows").abs() + 0.1},
                "rates": {"edge_weight": rows("rates").abs() + 0.1}}
    if kind == "gine":
        return {"follows": {"edge_feat": rows("follows", 5)},
                "rates": {"edge_feat": rows("rates", 5)}}
    return {}


def _run_hetero(model, g, x, mod_kwargs, cot_seed):
    """model(g, x, mod_kwargs=...) and every gradient (inputs, per-edge
    tensors, parameters) under a random cotangent, as {name: tensor}."""
    xs = {t: _leaf(v) for t, v in x.items()}
    kw = {e: {k: _leaf(v) for k, v in a.items()} for e, a in mod_kwargs.items()}
    out = model(g, xs, mod_kwargs=kw)
    gen = torch.Generator().manual_seed(cot_seed)
    loss = sum((out[t] * torch.randn(out[t].shape, generator=gen, dtype=torch.float64)).sum()
               for t in sorted(out))
    loss.backward()
    res = {f"output {t}": out[t].detach() for t in out}
    res.update({f"grad x[{t}]": v.grad for t, v in xs.items()})
    res.update({f"grad {e}.{k}": v.grad for e, a in kw.items() for k, v in a.items()})
    res.update({f"grad {n}": p.grad for n, p in model.named_parameters()})
    return res


HETERO = [("convs", aggregate, "graph") for aggregate in ("sum", "mean", "max", "stack")]
HETERO += [("attention", "sum", "graph"), ("attention", "stack", "graph"),
           ("gine", "mean", "graph"), ("gine", "max", "graph"),
           ("convs", "sum", "block"), ("attention", "max", "block"), ("gine", "stack", "block")]


@pytest.mark.parametrize("kind,aggregate,form", HETERO)
def test_hetero_graph_conv_over_fastgnn_modules_matches_dgl(kind, aggregate, form, rng, seed):
    """dgl.nn.HeteroGraphConv over fastgnn.dgl's modules (one per relation,
    called on each relation's graph with (src, dst) feature pairs) equals
    the same HeteroGraphConv over DGL's modules from the same weights."""
    g = _hetero_block(rng) if form == "block" else _hetero(rng)
    torch.manual_seed(2)
    ref = dnn.HeteroGraphConv(_relation_modules(dnn, kind), aggregate=aggregate).double()
    torch.manual_seed(2)
    ours = dnn.HeteroGraphConv(_relation_modules(fd, kind), aggregate=aggregate).double()
    _same_state(ref, ours)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed),
                                     dtype=p.dtype))
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = {t: torch.from_numpy(rng.standard_normal((g.num_src_nodes(t), 5))) for t in g.srctypes}
    edge_inputs = _edge_inputs(g, kind, rng)
    r = _run_hetero(ref, g, x, edge_inputs, seed)
    o = _run_hetero(ours, g, x, edge_inputs, seed)
    assert sorted(k for k in r if k.startswith("output")) == [f"output {t}" for t in
                                                              ("item", "tag", "user")]
    assert_results_match(o, r)


# ---------------------------------------------------------- state dicts
def _all_modules():
    mlp = torch.nn.Linear(4, 3)
    return [("GraphConv", (4, 3), {}), ("GraphConv", (4, 3), dict(weight=False, bias=False)),
            ("SAGEConv", (4, 3, "mean"), {}), ("SAGEConv", ((4, 5), 3, "pool"), {}),
            ("SAGEConv", (4, 3, "gcn"), {}), ("SAGEConv", (4, 3, "gcn"), dict(bias=False)),
            ("GINConv", (mlp, "sum"), dict(learn_eps=True)), ("GINConv", (mlp, "max"), {}),
            ("GATConv", (4, 3, 2), dict(residual=True)), ("GATConv", ((4, 5), 3, 2), {}),
            ("GATConv", (6, 3, 2), dict(residual=True)),
            ("GATv2Conv", (4, 3, 2), dict(residual=True, share_weights=True)),
            ("GATv2Conv", ((4, 5), 3, 2), dict(bias=False)),
            ("GINEConv", (mlp,), dict(learn_eps=True)), ("GINEConv", (), dict(init_eps=0.5)),
            ("RelGraphConv", (4, 6, 3), dict(layer_norm=True)),
            ("RelGraphConv", (4, 6, 3), dict(regularizer="basis", num_bases=2)),
            ("RelGraphConv", (4, 6, 3), dict(regularizer="bdd", num_bases=2, self_loop=False,
                                             bias=False))]


@pytest.mark.parametrize("cls,args,kw", _all_modules(),
                         ids=lambda v: v if isinstance(v, str) else None)
def test_state_dicts_load_both_ways(cls, args, kw):
    ref, ours = _both(cls, *args, **kw)
    _same_state(ref, ours)                           # seeded construction: DGL's weights
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(torch.randn_like(p))
    ref.load_state_dict(ours.state_dict(), strict=True)      # ours -> DGL
    _same_state(ref, ours)
    with torch.no_grad():
        for p in ref.parameters():
            p.mul_(0.5)
    ours.load_state_dict(ref.state_dict(), strict=True)      # DGL -> ours
    _same_state(ref, ours)
    assert [n for n, _ in ref.named_parameters()] == [n for n, _ in ours.named_parameters()]


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("cls,args", [("GraphConv", (4, 3)), ("GATConv", (4, 3, 2)),
                                      ("GATv2Conv", (4, 3, 2))])
def test_zero_in_degree_error_is_dgls(cls, args, rng):
    g = _homo(rng)
    x = _features(g, rng, 4).float()
    for module in (getattr(dnn, cls)(*args), getattr(fd, cls)(*args)):
        with pytest.raises(dgl.DGLError, match="0-in-degree"):
            module(g, x)
        module.set_allow_zero_in_degree(True)
        module(g, x)
    looped = dgl.add_self_loop(g)
    ref, ours = _both(cls, *args)
    compare(ref, ours, looped, _features(looped, rng, 4))     # no 0-in-degree node: no error


def test_bad_arguments_are_refused():
    for make in (lambda: fd.GraphConv(4, 3, norm="sym"), lambda: fd.SAGEConv(4, 3, "max")):
        with pytest.raises(ValueError):
            make()
        with pytest.raises(dgl.DGLError):
            make()
    g = dgl.graph(([0, 1, 2], [1, 2, 2]))
    conv = fd.GraphConv(4, 3, allow_zero_in_degree=True)
    with pytest.raises(ValueError, match="edge_weight"):
        conv(g, torch.randn(3, 4), edge_weight=torch.ones(4))
    with pytest.raises(ValueError, match="rows"):
        fd.ops.copy_u_sum(g, torch.randn(4, 2))
    with pytest.raises(ValueError, match="reduce"):
        fd.ops.copy_u(g, torch.randn(3, 2), "prod")
    with pytest.raises(ValueError, match="broadcast"):
        fd.ops.u_mul_e_sum(g, torch.randn(3, 2), torch.randn(3, 3))
    with pytest.raises(ValueError, match="norm_by"):
        fd.edge_softmax(g, torch.randn(3), norm_by="both")
    with pytest.raises(TypeError, match="DGLGraph"):
        fd.to_graph(torch.zeros(2, 3, dtype=torch.long))
    hetero = dgl.heterograph({("a", "x", "b"): ([0], [0]), ("b", "y", "a"): ([0], [0])})
    with pytest.raises(ValueError, match="one edge type"):
        fd.to_graph(hetero)
    with pytest.raises(NotImplementedError, match="op="):
        fd.ops.gspmm(g, "add", "sum", torch.randn(3, 2), torch.randn(3, 2))


# ---------------------------------------------------------------------- ops
def _grads(fn, *tensors, seed=0, rows=None):
    """fn(*tensors) and the gradient of every tensor under a random cotangent
    (zero outside `rows`, a [num_dst] bool mask, when given)."""
    leaves = [_leaf(t) for t in tensors]
    out = fn(*leaves)
    gen = torch.Generator().manual_seed(seed)
    cot = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    if rows is not None:
        cot = cot * rows.view(-1, *(1,) * (out.dim() - 1))
    (out * cot).sum().backward()
    return {"output": out.detach(), **{f"grad {i}": t.grad for i, t in enumerate(leaves)}}


def _compare_fns(ours, ref, *tensors, seed=0, rows=None, zero_fill=False):
    """Outputs and gradients of two functions of the same tensors. rows: the
    output rows that get a cotangent (DGL's max/min backward sends the
    cotangent of a node without in-edges to node 0; those rows are left out).
    zero_fill: ours gives 0 where the reference gives +-inf (rows without
    in-edges of a max/min), else the same infinities are required there."""
    o, r = _grads(ours, *tensors, seed=seed, rows=rows), _grads(ref, *tensors, seed=seed, rows=rows)
    inf = torch.isinf(r["output"])
    if zero_fill:
        assert (o["output"][inf] == 0).all()
    else:
        assert torch.equal(o["output"][inf], r["output"][inf])
    o["output"], r["output"] = o["output"].masked_fill(inf, 0), r["output"].masked_fill(inf, 0)
    assert_results_match(o, r)


@pytest.mark.parametrize("kind", ["homo", "block", "bipartite"])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_message_passing_ops_match_dgl(kind, reduce, rng, seed):
    g = GRAPHS[kind](rng)
    ns, E = g.num_src_nodes(), g.num_edges()
    rows = g.in_degrees() > 0
    assert not rows.all()                        # nodes without in-edges are part of the test
    if reduce in ("sum", "mean"):
        rows = None
    x = torch.from_numpy(rng.standard_normal((ns, 2, 3)))
    ref = lambda name: getattr(dops, name)       # noqa: E731
    ours = lambda name: getattr(fd.ops, name)    # noqa: E731
    _compare_fns(lambda x: ours(f"copy_u_{reduce}")(g, x),
                 lambda x: ref(f"copy_u_{reduce}")(g, x), x, seed=seed, rows=rows)
    e = torch.from_numpy(rng.standard_normal((E, 2, 3)))
    _compare_fns(lambda e: ours(f"copy_e_{reduce}")(g, e),
                 lambda e: ref(f"copy_e_{reduce}")(g, e), e, seed=seed, rows=rows)
    # u_mul_e: a scalar per edge, per edge and head, per edge and feature, broadcast
    for xs, ys in (((6,), ()), ((6,), (1,)), ((3, 4), (3, 1)), ((3, 4), (3, 4)),
                   ((4,), (2, 1)), ((2, 1, 3), (2, 5, 1))):
        x = torch.from_numpy(rng.standard_normal((ns, *xs)))
        y = torch.from_numpy(rng.random((E, *ys)) + 0.1)
        _compare_fns(lambda x, y: ours(f"u_mul_e_{reduce}")(g, x, y),
                     lambda x, y: ref(f"u_mul_e_{reduce}")(g, x, y), x, y, seed=seed,
                     rows=rows)
        if xs == (3, 4):
            _compare_fns(lambda x, y: fd.ops.gspmm(g, "mul", reduce, x, y),
                         lambda x, y: dops.gspmm(g, "mul", reduce, x, y), x, y, seed=seed,
                         rows=rows)


def test_ops_and_modules_on_a_graph_without_edges(rng, seed):
    g = dgl.graph((torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)),
                  num_nodes=5)
    x = torch.from_numpy(rng.standard_normal((5, 4)))
    for reduce in ("sum", "mean", "max", "min"):
        # (DGL's edgeless max/min backward hands x a gradient of the constant 0 output)
        rows = torch.zeros(5, dtype=torch.bool) if reduce in ("max", "min") else None
        _compare_fns(lambda x: getattr(fd.ops, f"copy_u_{reduce}")(g, x),
                     lambda x: getattr(dops, f"copy_u_{reduce}")(g, x), x, seed=seed, rows=rows)
    for cls, args in (("GraphConv", (4, 3)), ("SAGEConv", (4, 3, "mean")), ("GINConv", (None, "sum")),
                      ("GATConv", (4, 3, 2)), ("GATv2Conv", (4, 3, 2))):
        kw = {} if cls in ("SAGEConv", "GINConv") else dict(allow_zero_in_degree=True)
        ref, ours = _both(cls, *args, **kw)
        compare(ref, ours, g, x, seed=seed)
    # max aggregations: the same output (DGL's backward leaks a gradient there, as above)
    for cls, args in (("SAGEConv", (4, 3, "pool")), ("GINConv", (None, "max"))):
        ref, ours = _both(cls, *args)
        ours.load_state_dict(ref.state_dict(), strict=True)
        with torch.no_grad():
            torch.testing.assert_close(ours.double()(g, x), ref.double()(g, x), rtol=1e-12, atol=0)


@pytest.mark.parametrize("kind", ["homo", "block", "bipartite"])
def test_edge_softmax_matches_dgl(kind, rng, seed):
    g = GRAPHS[kind](rng)
    E = g.num_edges()
    for shape in ((E,), (E, 3), (E, 2, 1)):
        s = torch.from_numpy(3 * rng.standard_normal(shape))
        for norm_by in ("dst", "src"):
            _compare_fns(lambda s: fd.edge_softmax(g, s, norm_by=norm_by),
                         lambda s: dgl_edge_softmax(g, s, norm_by=norm_by), s, seed=seed)
            _compare_fns(lambda s: fd.ops.edge_softmax(g, s, norm_by=norm_by),
                         lambda s: dops.edge_softmax(g, s, norm_by=norm_by), s, seed=seed)
    eids = torch.from_numpy(rng.permutation(E)[: E // 2])      # a subset, in shuffled order
    s = torch.from_numpy(rng.standard_normal((eids.shape[0], 2)))
    for norm_by in ("dst", "src"):
        _compare_fns(lambda s: fd.edge_softmax(g, s, eids, norm_by=norm_by),
                     lambda s: dgl_edge_softmax(g, s, eids, norm_by=norm_by), s, seed=seed)


@pytest.mark.parametrize("kind", ["homo", "block"])
def test_fastgnn_torch_ops_take_dgl_graphs(kind, rng, seed):
    """fastgnn.torch's functional ops read a DGLGraph in DGL's direction and
    edge order, with the same results as DGL's ops."""
    g = GRAPHS[kind](rng)
    ns, nd, E = g.num_src_nodes(), g.num_dst_nodes(), g.num_edges()
    x = torch.from_numpy(rng.standard_normal((ns, 5)))
    w = torch.from_numpy(rng.random(E) + 0.1)
    _compare_fns(lambda x, w: ft.spmm(g, x, w), lambda x, w: dops.u_mul_e_sum(g, x, w), x, w,
                 seed=seed)
    _compare_fns(lambda x: ft.spmm(g, x, reduce="mean"), lambda x: dops.copy_u_mean(g, x), x,
                 seed=seed)
    # fastgnn.torch's convention: 0 where a node has no in-edge (dgl.ops: -inf)
    _compare_fns(lambda x: ft.segment_reduce(g, x, ["max", "sum"]),
                 lambda x: torch.cat([dops.copy_u_max(g, x), dops.copy_u_sum(g, x)], 1), x,
                 seed=seed, rows=g.in_degrees() > 0, zero_fill=True)
    s = torch.from_numpy(rng.standard_normal((E, 2)))
    _compare_fns(lambda s: ft.edge_softmax(g, s), lambda s: dgl_edge_softmax(g, s), s,
                 seed=seed)
    a_src = torch.from_numpy(rng.standard_normal((ns, 2)))
    a_dst = torch.from_numpy(rng.standard_normal((nd, 2)))
    v = torch.from_numpy(rng.standard_normal((ns, 2, 3)))

    def dgl_gat(a_src, a_dst, v):
        src, dst = g.edges()
        p = dgl_edge_softmax(g, torch.nn.functional.leaky_relu(a_src[src] + a_dst[dst], 0.2))
        return dops.u_mul_e_sum(g, v, p.unsqueeze(-1))
    _compare_fns(lambda a, b, v: ft.edge_attention(g, "gat", a_src=a, a_dst=b, v=v), dgl_gat,
                 a_src, a_dst, v, seed=seed)
    with pytest.raises(ValueError, match="num_src"):
        ft.spmm(g, torch.randn(ns + 1, 5, dtype=torch.float64))


def test_graph_conversion_is_cached_per_structure(rng):
    g = _homo(rng)
    a = fd.to_graph(g)
    assert ft.to_graph(g) is a and fd.to_graph(g) is a
    src, dst = g.edges(order="eid")
    assert torch.equal(torch.from_numpy(np.asarray(a.edge_index())).long(),
                       torch.stack([src, dst]).long())       # DGL's edge ids kept
    assert (a.num_src, a.num_dst, a.num_edges) == (N, N, g.num_edges())
    with g.local_scope():
        g.ndata["h"] = torch.zeros(N)
        assert fd.to_graph(g) is a                           # same structure: same graph
    rev = fd.to_graph(g, reverse=True)
    assert rev is not a and rev is fd.to_graph(g, reverse=True)
    g.add_edges(torch.tensor([1]), torch.tensor([N - 1]))    # a new structure: converted anew
    b = fd.to_graph(g)
    assert b is not a and b.num_edges == a.num_edges + 1
    block = _block(rng)
    gb = fd.to_graph(block)
    assert (gb.num_src, gb.num_dst) == (block.num_src_nodes(), block.num_dst_nodes())


# ---------------------------------------------------------- mini-batches
class _Net(torch.nn.Module):
    """Two layers over sampled blocks: SAGEConv(mean), then GATConv (heads averaged)."""

    def __init__(self, mod):
        super().__init__()
        self.conv1 = mod.SAGEConv(8, 16, "mean")
        self.conv2 = mod.GATConv(16, 3, 2, allow_zero_in_degree=True)

    def forward(self, blocks, x):
        h = torch.relu(self.conv1(blocks[0], x))
        return self.conv2(blocks[1], h).mean(1)


@pytest.mark.filterwarnings("ignore:Dataloader CPU affinity")
def test_minibatch_training_with_dgl_dataloading(rng, seed):
    """A sampled mini-batch loop (dgl.dataloading.NeighborSampler + DataLoader)
    trains fastgnn's layers in lockstep with DGL's from the same weights on
    the same blocks: the same losses and parameters after every step, and the
    loss goes down."""
    n = 200
    ei = awkward_edge_index(n, 6 * n, seed=seed)
    g = dgl.graph((torch.from_numpy(ei[0]), torch.from_numpy(ei[1])), num_nodes=n)
    x = torch.from_numpy(rng.standard_normal((n, 8)))
    y = torch.from_numpy((x[:, 0] > 0).long().numpy() + (x[:, 1] > 0.5).long().numpy())
    torch.manual_seed(seed)
    ref = _Net(dnn).double()
    ours = _Net(fd).double()
    ours.load_state_dict(ref.state_dict(), strict=True)
    opts = [torch.optim.Adam(m.parameters(), lr=0.02) for m in (ref, ours)]
    sampler = dgl.dataloading.NeighborSampler([5, 5])
    loader = dgl.dataloading.DataLoader(g, torch.arange(150), sampler, batch_size=50,
                                        shuffle=True, drop_last=False)
    losses = []
    for epoch in range(4):
        for input_nodes, output_nodes, blocks in loader:
            step = []
            for model, opt in zip((ref, ours), opts):
                loss = torch.nn.functional.cross_entropy(model(blocks, x[input_nodes]),
                                                         y[output_nodes])
                opt.zero_grad()
                loss.backward()
                opt.step()
                step.append(loss.item())
            assert abs(step[0] - step[1]) <= 1e-9 * abs(step[0]), step
            losses.append(step[1])
    for (name, a), (_, b) in zip(ref.state_dict().items(), ours.state_dict().items()):
        torch.testing.assert_close(b, a, rtol=1e-8, atol=1e-10, msg=name)
    assert np.mean(losses[-3:]) < np.mean(losses[:3]), losses


# --------------------------------------------------- sampled blocks, per layer
def _block_layer(cls, **kw):
    """make(module, in, out) for one of BLOCK_LAYERS (attention: 2 heads of out // 2)."""
    def make(mod, fin, fout):
        if cls == "GINConv":
            return mod.GINConv(torch.nn.Linear(fin, fout), init_eps=0.2, **kw)
        if cls in ("GATConv", "GATv2Conv"):
            return getattr(mod, cls)(fin, fout // 2, 2, allow_zero_in_degree=True, **kw)
        if cls == "GraphConv":
            return mod.GraphConv(fin, fout, allow_zero_in_degree=True, **kw)
        return getattr(mod, cls)(fin, fout, **kw)
    return make


BLOCK_LAYERS = {  # name -> (make, takes edge_weight)
    "gat": (_block_layer("GATConv", residual=True), True),
    "sage_pool": (_block_layer("SAGEConv", aggregator_type="pool"), True),
    "graphconv_both": (_block_layer("GraphConv", norm="both"), True),
    "gatv2": (_block_layer("GATv2Conv", residual=True), False),
    "gatv2_shared": (_block_layer("GATv2Conv", share_weights=True), False),
    "sage_mean": (_block_layer("SAGEConv", aggregator_type="mean"), True),
    "sage_gcn": (_block_layer("SAGEConv", aggregator_type="gcn"), True),
    "graphconv_right": (_block_layer("GraphConv", norm="right"), True),
    "graphconv_left": (_block_layer("GraphConv", norm="left"), True),
    "gin_sum": (_block_layer("GINConv", aggregator_type="sum", learn_eps=True), True),
    "gin_max": (_block_layer("GINConv", aggregator_type="max"), True),
    "gin_mean": (_block_layer("GINConv", aggregator_type="mean", learn_eps=True), True),
}


class _BlockStack(torch.nn.Module):
    """Two layers of one kind over sampled blocks, heads flattened: features
    [N_src, 6] -> [N_dst, 4]. form "tensor": each block gets one feature
    tensor (DGL narrows it to the destinations); "pair": (h, h[:num_dst]),
    as DGL's sampling tutorials write it."""

    def __init__(self, mod, kind, form):
        super().__init__()
        make, _ = BLOCK_LAYERS[kind]
        self.form = form
        self.conv1, self.conv2 = make(mod, 6, 8), make(mod, 8, 4)

    def forward(self, blocks, x, weights):
        h = x
        for i, (conv, block, w) in enumerate(zip((self.conv1, self.conv2), blocks, weights)):
            feat = h if self.form == "tensor" else (h, h[:block.num_dst_nodes()])
            h = conv(block, feat, **({} if w is None else {"edge_weight": w}))
            h = h.reshape(h.shape[0], -1)
            if i == 0:
                h = torch.nn.functional.elu(h)
        return h


def _sampled_graph(rng, n=160):
    """A dgl.graph with node features "feat" [n, 6] and labels "label" (4
    classes), edge weights "w"; duplicate edges, self-loops, a hub, and
    nodes without in-edges (its last tenth)."""
    ei = awkward_edge_index(n, 5 * n, seed=int(rng.integers(2**31)))
    g = dgl.graph((torch.from_numpy(ei[0]), torch.from_numpy(ei[1])), num_nodes=n)
    g.ndata["feat"] = torch.from_numpy(rng.standard_normal((n, 6)))
    g.ndata["label"] = torch.from_numpy(rng.integers(0, 4, n))
    g.edata["w"] = torch.from_numpy(rng.random(g.num_edges()) + 0.2)
    return g


def _stack_results(model, blocks, x, weights, labels):
    """Loss (cross-entropy on the output nodes' labels), output and the
    gradients of x, of the edge weights and of every parameter, as float64."""
    model.zero_grad(set_to_none=True)
    x = _leaf(x)
    weights = [None if w is None else _leaf(w) for w in weights]
    out = model(blocks, x, weights)
    loss = torch.nn.functional.cross_entropy(out, labels)
    loss.backward()
    res = {"loss": loss.detach().reshape(1), "output": out.detach(), "grad x": x.grad}
    res.update({f"grad edge_weight[{i}]": w.grad for i, w in enumerate(weights) if w is not None})
    res.update({f"grad {k}": p.grad for k, p in model.named_parameters()})
    return {k: None if v is None else v.detach().double() for k, v in res.items()}


def _match_stacks(ref, ours, run, what, dtype):
    """run(model, dtype) -> results; DGL's model in float64 against ours in
    dtype. Gradients that are zero in exact arithmetic hold rounding noise on
    both sides and are compared against the largest gradient. Below float64
    DGL's model first loads ours' weights (rounded to dtype), and each result
    of ours may be off by 1e-5 of its norm, by twice DGL's own error in
    dtype, or, for a gradient, by 1e-6 of the largest gradient's norm (a
    gradient summed from terms that cancel loses float32 digits in any
    order); the attention vectors' gradients, sums over edges of the softmax
    backward whose terms cancel (attn_r's exactly, but for the LeakyReLU's
    kinks), by 1e-4 of their norm or 1e-5 of the largest gradient's."""
    base = None
    if dtype != torch.float64:
        ref.load_state_dict({k: v.double() for k, v in ours.state_dict().items()})
        base = run(copy.deepcopy(ref).to(dtype), dtype)
    r = run(ref, torch.float64)
    o = run(ours, dtype)
    scale = max(float(v.norm()) for k, v in r.items() if k.startswith("grad") and v is not None)
    try:
        if base is None:
            assert_results_match(o, r, noise_scale=scale)
            return
        assert_float32_results(o, r, base, scale, loose=(r"\.attn(_[lr])?$",))
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from None


def _sampled_blocks(kind, form, weighted, rng, seed, dtype=torch.float64):
    """_BlockStack(kind, form) of DGL (float64) and of ours (dtype) over the
    blocks of consecutive batches of dgl.dataloading's DataLoader, compared
    batch by batch (`_match_stacks`)."""
    g = _sampled_graph(rng)
    n = g.num_nodes()
    torch.manual_seed(seed)
    ref = _BlockStack(dnn, kind, form).double()
    ours = _BlockStack(fd, kind, form)
    ours.load_state_dict(ref.state_dict(), strict=True)
    ours.to(dtype)
    sampler = dgl.dataloading.NeighborSampler([4, 3], prefetch_node_feats=["feat"],
                                              prefetch_labels=["label"])
    seeds = torch.from_numpy(np.concatenate([rng.permutation(n - n // 10)[:40],
                                             np.arange(n - n // 10, n)[:4]]))
    loader = dgl.dataloading.DataLoader(g, seeds, sampler, batch_size=11, shuffle=True,
                                        drop_last=False)
    batches = 0
    zero_in_degree = False
    for input_nodes, output_nodes, blocks in loader:
        x = blocks[0].srcdata["feat"]
        assert torch.equal(x, g.ndata["feat"][input_nodes])
        labels = blocks[-1].dstdata["label"]
        weights = [g.edata["w"][b.edata[dgl.EID]] if weighted else None for b in blocks]
        zero_in_degree |= bool((blocks[-1].in_degrees() == 0).any())

        def run(model, dt):
            # DGL's float64 run sees the inputs rounded to dtype
            cast = (lambda t: t.to(dtype).to(dt))
            return _stack_results(model, blocks, cast(x),
                                  [None if w is None else cast(w) for w in weights], labels)
        _match_stacks(ref, ours, run, f"{kind}, {form}, batch {batches}, seed {seed}", dtype)
        clipped_sgd_step(ref, ours)
        batches += 1
    assert batches >= 4 and zero_in_degree


# every layer with one feature tensor per block, unweighted, and with (h, h[:num_dst])
# pairs, weighted where it takes edge weights; the two forms alternate along the list
BLOCK_CASES = [(kind, form, form == "pair" and BLOCK_LAYERS[kind][1])
               for first in (0, 1) for i, kind in enumerate(BLOCK_LAYERS)
               for form in [("pair", "tensor")[(i + first) % 2]]]


@pytest.mark.filterwarnings("ignore:Dataloader CPU affinity")
@pytest.mark.parametrize("kind,form,weighted", BLOCK_CASES,
                         ids=[f"{k}-{f}{'-weighted' if w else ''}" for k, f, w in BLOCK_CASES])
def test_sampled_blocks_match_dgl_per_batch(kind, form, weighted, rng, seed):
    """Blocks from dgl.dataloading (NeighborSampler([4, 3]), DataLoader, node
    features and labels prefetched into the blocks) through two layers of
    fastgnn.dgl and of dgl.nn from the same weights (DGL's built first from
    the seed, ours loads its state_dict strictly): the loss, the output and
    the gradients of the features, of the edge weights (the parent graph's,
    gathered by the blocks' edge ids) and of every parameter are equal on
    each of several consecutive batches, the modules reused (an SGD step in
    between). Destinations without in-edges are among the seeds."""
    _sampled_blocks(kind, form, weighted, rng, seed)


@pytest.mark.filterwarnings("ignore:Dataloader CPU affinity")
@pytest.mark.parametrize("kind,form,weighted", [("gat", "pair", True),
                                                ("sage_pool", "tensor", False),
                                                ("graphconv_both", "pair", True)],
                         ids=["gat-pair-weighted", "sage_pool-tensor",
                              "graphconv_both-pair-weighted"])
def test_sampled_blocks_float32(kind, form, weighted, rng, seed):
    """The same with ours in float32 (features, edge weights, parameters),
    against DGL in float64 on the same rounded values."""
    _sampled_blocks(kind, form, weighted, rng, seed, torch.float32)


class _LinkStack(torch.nn.Module):
    """Two SAGEConv layers over the blocks; a score per edge of a pair graph:
    the dot product of its endpoints' embeddings (DGL's u_dot_v)."""

    def __init__(self, mod, aggr):
        super().__init__()
        self.conv1 = mod.SAGEConv(6, 8, aggr)
        self.conv2 = mod.SAGEConv(8, 8, aggr)

    def forward(self, blocks, x, pair_graphs):
        h = torch.nn.functional.elu(self.conv1(blocks[0], x))
        h = self.conv2(blocks[1], h)
        scores = []
        for pg in pair_graphs:
            with pg.local_scope():
                pg.ndata["h"] = h
                pg.apply_edges(dgl.function.u_dot_v("h", "h", "s"))
                scores.append(pg.edata["s"].view(-1))
        return scores


@pytest.mark.filterwarnings("ignore:Dataloader CPU affinity")
@pytest.mark.parametrize("aggr", ["mean", "pool", "gcn"])
def test_edge_prediction_blocks_match_dgl(aggr, rng, seed):
    """Link-prediction batches from dgl.dataloading (as_edge_prediction_sampler
    with a uniform negative sampler, the batch's edges excluded from its
    blocks): SAGE embeddings on the blocks, dot-product scores of the positive
    and negative pair graphs, BCE loss; loss, scores and every gradient equal
    DGL's on each of several consecutive batches."""
    g = _sampled_graph(rng)
    torch.manual_seed(seed)
    ref = _LinkStack(dnn, aggr).double()
    ours = _LinkStack(fd, aggr).double()
    ours.load_state_dict(ref.state_dict(), strict=True)
    sampler = dgl.dataloading.as_edge_prediction_sampler(
        dgl.dataloading.NeighborSampler([4, 3], prefetch_node_feats=["feat"]),
        exclude="self", negative_sampler=dgl.dataloading.negative_sampler.Uniform(2))
    eids = torch.from_numpy(rng.permutation(g.num_edges())[:48])
    loader = dgl.dataloading.DataLoader(g, eids, sampler, batch_size=16, shuffle=True)
    batches = 0
    for _, pos, neg, blocks in loader:
        x = blocks[0].srcdata["feat"]

        def run(model, dt):       # (float64 only)
            model.zero_grad(set_to_none=True)
            leaf = _leaf(x)
            s_pos, s_neg = model(blocks, leaf, (pos, neg))
            scores = torch.cat([s_pos, s_neg])
            labels = torch.cat([torch.ones_like(s_pos), torch.zeros_like(s_neg)])
            loss = torch.nn.functional.binary_cross_entropy_with_logits(scores, labels)
            loss.backward()
            res = {"loss": loss.detach().reshape(1), "scores": scores.detach(),
                   "grad x": leaf.grad}
            res.update({f"grad {k}": p.grad for k, p in model.named_parameters()})
            return {k: None if v is None else v.detach().double() for k, v in res.items()}
        _match_stacks(ref, ours, run, f"link {aggr}, batch {batches}, seed {seed}",
                      torch.float64)
        clipped_sgd_step(ref, ours)
        batches += 1
    assert batches == 3


@pytest.mark.filterwarnings("ignore:Dataloader CPU affinity")
@pytest.mark.parametrize("cls", ["GraphConv", "GATConv", "GATv2Conv"])
def test_sampled_block_zero_in_degree_error_is_dgls(cls, rng):
    """A sampled block whose destinations include a node without in-edges:
    without allow_zero_in_degree both DGL's module and ours raise DGLError."""
    g = _sampled_graph(rng)
    n = g.num_nodes()
    sampler = dgl.dataloading.NeighborSampler([4])
    loader = dgl.dataloading.DataLoader(g, torch.tensor([0, 1, n - 1]), sampler, batch_size=3)
    (_, _, (block,)), = list(loader)
    assert (block.in_degrees() == 0).any()
    args = (6, 4) if cls == "GraphConv" else (6, 2, 2)
    x = g.ndata["feat"][block.srcdata[dgl.NID]]
    for module in (getattr(dnn, cls)(*args).double(), getattr(fd, cls)(*args).double()):
        with pytest.raises(dgl.DGLError, match="0-in-degree"):
            module(block, x)


# ------------------------------------------------------------------ README
def test_readme_dgl_example_runs():
    """README's DGL example, as written (test_packaging.py runs the README's
    other examples; this environment is where dgl is)."""
    text = README.read_text()
    blocks = [m.group(1) for m in re.finditer(
        r"<!-- test:[^>]*-->\s*```python\n(.*?)^```", text, re.M | re.S)]
    dgl_blocks = [b for b in blocks if "import dgl" in b]
    assert dgl_blocks, "README lost its tested DGL example"
    for body in dgl_blocks:
        exec(compile(body, "README.md DGL example", "exec"), {"__name__": "readme_example"})
