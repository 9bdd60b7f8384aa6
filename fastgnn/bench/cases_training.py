"""End-to-end training cases (`fastgnn bench --suite training`): ms per epoch of
real 2-layer node-classification models on real data sets, fastgnn.torch
against PyG from the same weights, and the test metric both reach.

    python -m fastgnn.bench --suite training --quick          # CPU: Cora + minesweeper, ~1 min
    python -m fastgnn.bench --suite training                  # every model, data set and mode
    python -m fastgnn.bench --suite training --models GCN GAT --datasets-names Cora tolokers \\
        --epochs 200 --modes eager,compile,cudagraph

Models (hidden width --width, default 64; attention models --heads heads of
width / heads channels in the first layer, one head in the second):

    GCN          GCNConv(cached=True) x 2
    SAGE-mean    SAGEConv(aggr="mean") x 2
    SAGE-max     SAGEConv(aggr="max") x 2
    GIN          GINConv(Linear-ReLU-Linear) x 2
    GAT          GATConv x 2            GATv2        GATv2Conv x 2
    Transformer  TransformerConv x 2

    x -> conv1 -> ReLU -> dropout -> conv2 -> logits [n, classes]

(no dropout on the input features: on the CPU, drawing Cora's 2708 x 1433
mask alone takes longer than the rest of a GCN epoch, the same in both
frameworks).

The PyG model is built first from the seed; its state_dict is loaded into the
fastgnn model with strict=True (a name or shape mismatch fails that row).
Every (model, data set, mode) trains both from those weights, on the same
edge_index, with the same dropout seed, for the same number of epochs. One
epoch = forward, cross-entropy on the train mask, backward, Adam step
(lr 0.01, weight decay 5e-4). The first `--warmup` epochs (at least one
under compile, three under CUDA graphs) are not timed; the row's time is the
median of the others (CUDA events on the GPU, time.perf_counter on the CPU;
`core.time_calls`), the first epoch's extra time is `first_epoch_s`
(compilation, caches). After the last epoch the eager module (which shares
its parameters with a compiled one) is evaluated on the val and test masks:
accuracy, or ROC-AUC for the binary sets tolokers, minesweeper and questions
(as their paper reports them).

Modes: eager; compile = torch.compile(model); cudagraph (CUDA only) =
torch.compile(model, mode="reduce-overhead"). Whatever raises (building,
loading, compiling, training) gives a row with status "failed: <type>" and
the message; the run goes on.

Splits: the data set's own train/val/test masks when fastgnn.datasets
provides them (the first split of several), else a seeded random 60/20/20
split of the labelled nodes; the row's `split` says which. Data sets
without node features here (github; PubMed, whose allx file is missing) get
seeded N(0, 1) features, noted in `features`. Names of generated bench
graphs (rmat9, clustered10, ...) train on that graph with random features
and learnable labels (`generated_data`).
"""
from __future__ import annotations

import math
import os
import sys
import time
from collections import OrderedDict

from . import core, report

MODELS = ("GCN", "SAGE-mean", "SAGE-max", "GIN", "GAT", "GATv2", "Transformer")

# name -> (path under the datasets folder, test metric, width of random
# features when the files carry none)
DATASETS = OrderedDict([
    ("Cora", ("planetoid/cora", "accuracy", 1433)),
    ("CiteSeer", ("planetoid/citeseer", "accuracy", 3703)),
    ("PubMed", ("planetoid/pubmed", "accuracy", 500)),
    ("github", ("karateclub/node_level/github", "accuracy", 128)),
    ("tolokers", ("heterophilous/tolokers.npz", "roc_auc", 10)),
    ("minesweeper", ("heterophilous/minesweeper.npz", "roc_auc", 7)),
    ("amazon-ratings", ("heterophilous/amazon_ratings.npz", "accuracy", 300)),
    ("roman-empire", ("heterophilous/roman_empire.npz", "accuracy", 300)),
    ("questions", ("heterophilous/questions.npz", "roc_auc", 301)),
])
QUICK_DATASETS = ("Cora", "minesweeper")
RANDOM_FEATURES = 128          # width of random features for other data sets without any
GENERATED_CLASSES = 4          # label classes on generated graphs (tests, smoke runs)
MODES = ("eager", "compile", "cudagraph", "capture")
MIN_WARMUP = {"eager": 0, "compile": 1, "cudagraph": 3, "capture": 1}
CUDA_ONLY = ("cudagraph", "capture")

HIDDEN, EPOCHS, WARMUP = 64, 100, 5
QUICK_EPOCHS, QUICK_WARMUP = 8, 2
# --budget-minutes on the CPU when none is given (not with --quick): the full
# data sets train for over 30 minutes on a 2-core machine
CPU_BUDGET_MINUTES = 8
LR, WEIGHT_DECAY, DROPOUT = 0.01, 5e-4, 0.5
SPLIT_FRACTIONS = (0.6, 0.2)   # train, val; the rest is test (rows say "random 60/20/20")


def add_arguments(p):
    """The training suite's options on the bench parser."""
    g = p.add_argument_group("training suite (--suite training)")
    g.add_argument("--models", nargs="+", metavar="MODEL",
                   help=f"2-layer models (default all: {' '.join(MODELS)})")
    g.add_argument("--datasets-names", nargs="+", metavar="NAME",
                   help=f"real data sets (default {' '.join(DATASETS)}, those present; --quick: "
                        f"{' '.join(QUICK_DATASETS)}); other names are looked up by "
                        "fastgnn.datasets.find, generated graph names (rmat9, ...) get random "
                        "features and labels")
    g.add_argument("--epochs", type=int,
                   help=f"training epochs per row, warm-up included (default {EPOCHS}; "
                        f"--quick {QUICK_EPOCHS})")
    g.add_argument("--modes", nargs="+", metavar="MODE",
                   help="eager, compile, cudagraph (torch.compile mode='reduce-overhead'), "
                        "capture (the whole step, optimizer included, captured once in a "
                        "torch.cuda.CUDAGraph and replayed); comma or space separated; default "
                        "eager, compile, cudagraph on CUDA, eager, compile on the CPU; --quick: "
                        "eager")
    g.add_argument("--pyg-modes", nargs="+", metavar="MODE",
                   help="the modes PyG's rows run in (default: every --modes entry); e.g. "
                        "'--modes eager capture --pyg-modes eager' compares fastgnn captured "
                        "with PyG eager without paying for PyG's compilation")


# ------------------------------------------------------------------ models


def _convs(lib, name, fin, hidden, classes, heads):
    """The two conv layers of model `name` from `lib` (torch_geometric.nn or
    fastgnn.torch): the same constructors and arguments for both."""
    import torch
    if name == "GCN":
        return lib.GCNConv(fin, hidden, cached=True), lib.GCNConv(hidden, classes, cached=True)
    if name.startswith("SAGE-"):
        aggr = name.split("-", 1)[1]
        return lib.SAGEConv(fin, hidden, aggr=aggr), lib.SAGEConv(hidden, classes, aggr=aggr)
    if name == "GIN":
        def mlp(i, o):
            return torch.nn.Sequential(torch.nn.Linear(i, o), torch.nn.ReLU(), torch.nn.Linear(o, o))
        return lib.GINConv(mlp(fin, hidden)), lib.GINConv(mlp(hidden, classes))
    cls = {"GAT": "GATConv", "GATv2": "GATv2Conv", "Transformer": "TransformerConv"}.get(name)
    if cls is None:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    if hidden % heads:
        raise ValueError(f"hidden width {hidden} is not divisible by --heads {heads}")
    layer = getattr(lib, cls)
    return layer(fin, hidden // heads, heads=heads), layer(hidden, classes, heads=1)


def _net_class():
    import torch
    import torch.nn.functional as F

    class Net(torch.nn.Module):
        """conv1 -> ReLU -> dropout -> conv2."""

        def __init__(self, conv1, conv2, dropout):
            super().__init__()
            self.conv1, self.conv2, self.dropout = conv1, conv2, dropout

        def forward(self, x, edge_index):
            x = self.conv1(x, edge_index).relu()
            x = F.dropout(x, self.dropout, self.training)
            return self.conv2(x, edge_index)
    return Net


def build_model(framework, name, fin, hidden, classes, heads, dropout=DROPOUT):
    """An untrained 2-layer model; framework 'pyg' or 'fastgnn'."""
    if framework == "pyg":
        from torch_geometric import nn as lib
    else:
        import fastgnn.torch as lib
    return _net_class()(*_convs(lib, name, fin, hidden, classes, heads), dropout)


# ------------------------------------------------------------------ data


class TrainData:
    """One data set on the bench device: x, y, edge_index, masks and notes."""

    def __init__(self, name, x, y, edge_index, masks, *, classes, metric, split, features,
                 stats, source):
        self.name, self.x, self.y, self.edge_index = name, x, y, edge_index
        self.train, self.val, self.test = masks
        # the loss gathers by index: boolean indexing would sync the host every epoch
        self.train_idx = self.train.nonzero().flatten()
        self.train_y = self.y[self.train_idx]
        self.classes, self.metric, self.split, self.features = classes, metric, split, features
        self.stats, self.source = stats, source


def _given_masks(g, n):
    """((train, val, test) 1-D bool arrays, how many splits) from the GraphData
    when it carries a split (the first of several), else None."""
    import numpy as np
    if getattr(g, "train_mask", None) is None:
        return None
    masks = [np.asarray(m).astype(bool) for m in g.split(0)]
    if not all(m.shape == (n,) for m in masks):
        return None
    return masks, int(getattr(g, "num_splits", 1))


def random_split(labelled, seed, fractions=SPLIT_FRACTIONS):
    """Seeded random train/val/test masks over the labelled nodes."""
    import numpy as np
    idx = np.flatnonzero(labelled)
    # a stream of its own: minesweeper's mines are the first 20% of default_rng(0)'s
    # permutation, so a plain default_rng(seed) split would put them all in train
    np.random.default_rng([seed, 0x7EA1]).shuffle(idx)
    a = int(round(fractions[0] * idx.size))
    b = a + int(round(fractions[1] * idx.size))
    masks = [np.zeros(labelled.shape[0], bool) for _ in range(3)]
    for m, part in zip(masks, (idx[:a], idx[a:b], idx[b:])):
        m[part] = True
    return masks


def generated_data(torch, device, spec, seed=0, classes=GENERATED_CLASSES,
                   width=RANDOM_FEATURES):
    """TrainData on a generated bench graph (`rmat9`, `clustered10`, ... as
    fastgnn.bench.graphs names them): N(0, 1) features and labels that a model
    can learn, the argmax of a fixed random projection of the mean of each
    node's and its neighbours' features; a random 60/20/20 split."""
    import numpy as np

    from . import graphs as bgraphs
    g = bgraphs.make(spec, torch, torch.device("cpu"), seed)
    gen = torch.Generator().manual_seed(seed + 7)
    x = torch.randn(g.num_nodes, width, generator=gen)
    proj = torch.randn(width, classes, generator=gen)
    src, dst = g.edge_index
    agg = torch.zeros_like(x).index_add_(0, dst, x[src]) + x
    agg /= (torch.bincount(dst, minlength=g.num_nodes) + 1).unsqueeze(1)
    y = (agg @ proj).argmax(1)
    masks = random_split(np.ones(g.num_nodes, bool), seed)
    stats = dict(g.stats, feature_width=width, classes=classes)
    return TrainData(spec, x.to(device), y.to(device), g.edge_index.to(device),
                     [torch.from_numpy(m).to(device) for m in masks], classes=classes,
                     metric="accuracy", split=f"random 60/20/20 (seed {seed})",
                     features=f"random N(0, 1) [{g.num_nodes}, {width}]; labels from "
                              "their neighbourhood means", stats=stats, source=g.source)


def _generated(name):
    """True when `name` is a generated bench graph, not a data set."""
    from . import graphs as bgraphs
    if name in DATASETS or name.startswith(("file:", "npz:")):
        return False
    try:
        bgraphs.parse(name)
    except Exception:  # noqa: BLE001 - not a generator name
        return False
    return True


def load_data(torch, device, name, seed=0):
    """TrainData of a data set by name (DATASETS, else fastgnn.datasets.find;
    a generated bench graph name gives `generated_data`). FileNotFoundError
    when it is not here."""
    import numpy as np

    from .. import datasets as ds
    if _generated(name):
        return generated_data(torch, device, name, seed)
    spec, metric, rand_width = DATASETS.get(name, (name, "accuracy", RANDOM_FEATURES))
    try:
        path = ds.find(spec)
    except FileNotFoundError:
        if os.path.basename(spec) == spec:
            raise
        path = ds.find(os.path.basename(spec))   # a flat copy, e.g. .data/tolokers.npz
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # PubMed's missing allx is noted below
        g = ds.load(path)
    if g.y is None:
        raise ValueError(f"{name}: {path} has no node labels")
    n = g.num_nodes
    y = np.asarray(g.y, dtype=np.int64)
    labelled = y >= 0
    if g.x is not None:
        x = g.x.toarray() if hasattr(g.x, "toarray") else np.asarray(g.x)
        x = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        features = f"the data set's [{n}, {x.shape[1]}]"
    else:
        gen = torch.Generator().manual_seed(seed + 7)
        x = torch.randn(n, rand_width, generator=gen)
        features = f"random N(0, 1) [{n}, {rand_width}] (none in the files here)"
    given = _given_masks(g, n)
    if given is not None:
        masks, splits = given
        split = "standard" + (f" (split 0 of {splits})" if splits > 1 else "")
        masks = [m & labelled for m in masks]
    else:
        split = f"random 60/20/20 (seed {seed})"
        masks = random_split(labelled, seed)
    classes = int(y.max()) + 1
    stats = g.stats()
    stats["feature_width"] = int(x.shape[1])
    stats["classes"] = classes
    return TrainData(
        name, x.to(device), torch.from_numpy(y).to(device),
        torch.from_numpy(g.edge_index).to(device),
        [torch.from_numpy(m).to(device) for m in masks], classes=classes,
        metric="roc_auc" if metric == "roc_auc" and classes == 2 else "accuracy", split=split,
        features=features, stats=stats, source=f"fastgnn.datasets.load({path!r})")


# ------------------------------------------------------------------ metrics


def roc_auc(scores, labels):
    """ROC-AUC of binary labels from scores (the rank statistic, ties averaged);
    None unless both classes occur."""
    import numpy as np
    from scipy.stats import rankdata
    scores, labels = np.asarray(scores, np.float64), np.asarray(labels).astype(bool)
    pos, neg = int(labels.sum()), int((~labels).sum())
    if not pos or not neg:
        return None
    ranks = rankdata(scores)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


def evaluate(torch, model, data):
    """{'val': metric, 'test': metric} of the module in eval mode."""
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(data.x, data.edge_index).float()
    finally:
        model.train(was)
    res = {}
    for split, mask in (("val", data.val), ("test", data.test)):
        o, y = out[mask], data.y[mask]
        if not y.numel():
            res[split] = None
        elif data.metric == "roc_auc":
            res[split] = roc_auc((o[:, 1] - o[:, 0]).cpu().numpy(), y.cpu().numpy())
        else:
            res[split] = float((o.argmax(1) == y).float().mean().item())
    return res


# ------------------------------------------------------------------ one row


def train_step(runner, opt, data, *, set_to_none=True):
    """One training step: the gradients zeroed (set to None, or to 0 in place
    for a captured step's static buffers), runner(x, edge_index), the cross
    entropy on the training nodes, backward, the optimizer's step. Returns
    the loss, detached."""
    import torch.nn.functional as F
    opt.zero_grad(set_to_none=set_to_none)
    out = runner(data.x, data.edge_index)
    # (the loss gathers by index: boolean indexing would sync the host every step)
    loss = F.cross_entropy(out.index_select(0, data.train_idx), data.train_y)
    loss.backward()
    opt.step()
    return loss.detach()


def train(torch, model, data, *, mode, epochs, warmup, seed, cuda):
    """Train `model` (its eager module; compiled per mode) for `epochs` epochs;
    returns the measurements. Raises whatever the framework raises."""
    if mode == "capture":
        return train_captured(torch, model, data, epochs=epochs, warmup=warmup, seed=seed)
    runner = model
    if mode == "compile":
        runner = torch.compile(model)
    elif mode == "cudagraph":
        # fastgnn's per-graph caches built eagerly, outside the CUDA graph
        # trees' memory pool (docs/compile.md)
        _warm_up(model, data)
        # the graph is the same tensor in every replay: not copied into the
        # trees' static inputs (where fastgnn's cache would not know it)
        torch._dynamo.mark_static_address(data.edge_index)
        runner = torch.compile(model, mode="reduce-overhead")
    mark = torch.compiler.cudagraph_mark_step_begin if mode == "cudagraph" else None
    opt = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    losses = []
    model.train()

    def epoch():
        if mark is not None:
            mark()
        losses.append(train_step(runner, opt, data))

    torch.manual_seed(seed + 1)                 # the same dropout masks for both frameworks
    if cuda:
        torch.cuda.manual_seed_all(seed + 1)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    epoch()                                     # compiles, fills the layers' caches
    if cuda:
        torch.cuda.synchronize()
    first_ms = (time.perf_counter() - t0) * 1e3
    med, best = core.time_calls(torch, epoch, repeats=epochs - warmup, warmup=warmup - 1, cuda=cuda)
    return _measurements(torch, model, data, med, best, first_ms, losses, cuda)


def _measurements(torch, model, data, med, best, first_ms, losses, cuda):
    """A row's fields: epoch times, first-epoch overhead, peak memory, losses
    and the val/test metric of the trained model."""
    res = {"ms_per_epoch": round(med, 4), "ms_per_epoch_min": round(best, 4),
           "first_epoch_s": round(max(first_ms - med, 0.0) / 1e3, 3)}
    if cuda:
        res["peak_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    vals = torch.stack(losses).float().cpu().tolist()
    res.update({"loss_first": vals[0], "loss_last": vals[-1],
                "losses_finite": all(math.isfinite(v) for v in vals)})
    metric = evaluate(torch, model, data)
    res.update({"val_metric": metric["val"], "test_metric": metric["test"]})
    return res


def _warm_up(model, data):
    """fastgnn.torch.warm_up for fastgnn models; PyG's have nothing to build."""
    if any(type(m).__module__.startswith("fastgnn.") for m in model.modules()):
        import fastgnn.torch as fgt
        fgt.warm_up(model, data.x, data.edge_index)


def train_captured(torch, model, data, *, epochs, warmup, seed):
    """Mode "capture": one training step (forward, loss, backward, capturable
    Adam) recorded once in a torch.cuda.CUDAGraph after `warmup` eager steps
    on a side stream, then replayed per epoch: no host work per epoch at all."""
    opt = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY,
                           capturable=True)
    model.train()

    def step():
        return train_step(model, opt, data, set_to_none=False)

    torch.manual_seed(seed + 1)
    torch.cuda.manual_seed_all(seed + 1)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    losses = []
    t0 = time.perf_counter()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 1)):         # fills the layers' caches before capture
            losses.append(step().clone())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step()
    torch.cuda.synchronize()
    first_ms = (time.perf_counter() - t0) * 1e3

    def epoch():
        graph.replay()
        losses.append(static_loss.clone())
    med, best = core.time_calls(torch, epoch, repeats=epochs - max(warmup, 1), warmup=0,
                                cuda=True)
    res = _measurements(torch, model, data, med, best, first_ms, losses, True)
    del graph
    return res


def run_row(torch, data, model_name, framework, mode, state, *, hidden, heads, epochs, warmup,
            seed, cuda):
    """One (model, data set, framework, mode) record fields; failures recorded."""
    rec = {"status": "ok", "error": None}
    model = None
    try:
        model = build_model(framework, model_name, data.x.shape[1], hidden, data.classes, heads)
        model.load_state_dict(state, strict=True)
        model.to(data.x.device)
        rec.update(train(torch, model, data, mode=mode, epochs=epochs, warmup=warmup, seed=seed,
                         cuda=cuda))
    except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
        rec["status"] = f"failed: {type(exc).__name__}"
        rec["error"] = core.describe(exc)
        rec["failure"] = core.classify(exc)
    finally:
        del model
        if mode != "eager":
            torch._dynamo.reset()
        if framework == "fastgnn":
            from .cases_spmm import clear_fastgnn_cache
            try:
                import fastgnn.torch as fgt
                clear_fastgnn_cache(fgt)
            except Exception:  # noqa: BLE001
                pass
        core.free_memory(torch, full=rec["status"] != "ok")
    return rec


def master_state(torch, name, data, hidden, heads, seed):
    """The PyG model's initial parameters (seeded), shared by every row."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        m = build_model("pyg", name, data.x.shape[1], hidden, data.classes, heads)
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


# ------------------------------------------------------------------ speedups


def add_speedups(records):
    """speedup (PyG time / this time, same model, data set and mode),
    speedup_vs_pyg_eager, and on fastgnn rows the first-epoch loss and test
    metric differences from the PyG row of the same mode."""
    by = {}
    for r in records:
        by[(r.get("graph"), r.get("model"), r.get("framework"), r.get("mode"))] = r
    for r in records:
        key = (r.get("graph"), r.get("model"))
        pyg = by.get(key + ("pyg", r.get("mode")))
        eager = by.get(key + ("pyg", "eager"))
        ms = r.get("ms_per_epoch")
        r["speedup"] = (round(pyg["ms_per_epoch"] / ms, 3)
                        if ms and pyg and pyg.get("ms_per_epoch") else None)
        r["speedup_vs_pyg_eager"] = (round(eager["ms_per_epoch"] / ms, 3)
                                     if ms and eager and eager.get("ms_per_epoch") else None)
        if r.get("framework") == "fastgnn" and pyg:
            for k in ("loss_first", "test_metric"):
                a, b = r.get(k), pyg.get(k)
                r[f"{k}_diff"] = None if a is None or b is None else a - b


# ------------------------------------------------------------------ report


def _pairs(records):
    """OrderedDict (data set, model, mode) -> {framework: record}."""
    out = OrderedDict()
    for r in records:
        if r.get("kind") == "training":
            out.setdefault((r["graph"], r["model"], r["mode"]), {})[r["framework"]] = r
    return out


def _ms(r):
    from .report import _fmt_ms
    if r is None:
        return "-"
    return _fmt_ms(r, "ms_per_epoch", None) if r.get("ms_per_epoch") is not None \
        else (r.get("status") or "-")


def _metric(r):
    v = None if r is None else r.get("test_metric")
    return "-" if v is None else f"{v:.4f}"


def table(records):
    """Markdown: one line per (data set, model, mode), PyG and fastgnn side by side."""
    from .report import _fmt
    head = ["data set", "model", "mode", "PyG ms/epoch", "fastgnn ms/epoch", "x", "x vs PyG eager",
            "metric", "PyG test", "fastgnn test", "loss[0] PyG", "loss[0] diff", "split"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (ds, model, mode), fw in _pairs(records).items():
        p, f = fw.get("pyg"), fw.get("fastgnn")
        any_r = f or p
        lines.append("| " + " | ".join([
            ds, model, mode, _ms(p), _ms(f), _fmt((f or {}).get("speedup"), ".2f"),
            _fmt((f or {}).get("speedup_vs_pyg_eager"), ".2f"),
            "ROC-AUC" if any_r.get("metric") == "roc_auc" else "accuracy",
            _metric(p), _metric(f), _fmt((p or {}).get("loss_first"), ".5f"),
            _fmt((f or {}).get("loss_first_diff"), ".1e"), str(any_r.get("split") or "-")]) + " |")
    return "\n".join(lines)


def readme_table(records, models=None):
    """Markdown for the README: per (data set, model), PyG eager, fastgnn
    eager and fastgnn's captured step (mode "capture") in ms per epoch,
    and the two speedups over PyG eager. models: the models shown (None: all)."""
    from .report import _fmt
    rows = OrderedDict()
    for (ds, model, mode), fw in _pairs(records).items():
        if models is None or model in models:
            rows.setdefault((ds, model), {})[mode] = fw
    head = ["data set", "model", "PyG eager", "fastgnn eager", "fastgnn captured step",
            "x eager", "x captured"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (ds, model), by_mode in rows.items():
        eager, cap = by_mode.get("eager", {}), by_mode.get("capture", {})
        p, f, c = eager.get("pyg"), eager.get("fastgnn"), cap.get("fastgnn")
        lines.append("| " + " | ".join([
            ds, model, _ms(p) + " ms", _ms(f) + " ms", _ms(c) + " ms",
            _fmt((f or {}).get("speedup_vs_pyg_eager"), ".2f") + "x",
            _fmt((c or {}).get("speedup_vs_pyg_eager"), ".2f") + "x"]) + " |")
    return "\n".join(lines)


report.README_TABLES["training"] = readme_table


def summary(records):
    """Markdown lines: per mode, the geomean / min fastgnn speedup over the rows."""
    from .report import speedup_summary
    modes = OrderedDict()
    for (_, _, mode), fw in _pairs(records).items():
        f = fw.get("fastgnn") or {}
        modes.setdefault(mode, []).append((f.get("speedup"), f.get("speedup_vs_pyg_eager")))
    return speedup_summary(modes, ("mode", "rows", "geomean x (same mode)", "min x",
                                   "geomean x vs PyG eager"))


def markdown(records, meta):
    from .report import graphs_table
    out = [f"# fastgnn training benchmark: {meta['gpu']}", "", f"Command: `{meta['command']}`  ",
           "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + "  ",
           f"Timing: {meta['timing']}  ",
           "x = PyG ms / fastgnn ms (> 1: fastgnn is faster); loss[0] diff = fastgnn - PyG "
           "first-epoch training loss (same weights, same dropout seed).", ""]
    out += ["## Summary", ""] + summary(records) + ["", "## Epochs", "", table(records), ""]
    data = OrderedDict((r["graph"], r) for r in records if r.get("kind") == "training")
    if data:
        out += ["## Data", ""] + [
            f"- **{name}**: features {r.get('features')}; split {r.get('split')}; test metric "
            f"{'ROC-AUC' if r.get('metric') == 'roc_auc' else 'accuracy'}"
            for name, r in data.items()] + [""]
    out += graphs_table(records)
    failed = [r for r in records if r.get("error")]
    if failed:
        out += ["## Failures", ""] + [
            f"- {r['graph']} {r['model']} {r['framework']} {r['mode']} [{r['status']}]: {r['error']}"
            for r in failed] + [""]
    if meta.get("skipped"):
        out += ["## Skipped", ""] + [f"- {s}" for s in meta["skipped"]] + [""]
    return "\n".join(out)


# ------------------------------------------------------------------ the suite


def _names(given, default, known, what):
    names = [s for item in (given or default) for s in str(item).split(",") if s]
    if known is not None:
        lower = {k.lower(): k for k in known}
        bad = [n for n in names if n.lower() not in lower]
        if bad:
            raise SystemExit(f"fastgnn bench: unknown {what} {', '.join(bad)}; "
                             f"known: {', '.join(known)}")
        names = [lower[n.lower()] for n in names]
    return list(dict.fromkeys(names))


def run(args, argv, torch, device, cuda, quick):
    """The training suite (the bench CLI's entry for --suite training)."""
    import shlex

    from . import runinfo
    models = _names(args.models, MODELS, MODELS, "model")
    dnames = _names(args.datasets_names, QUICK_DATASETS if quick else DATASETS, None, "data set")
    dnames = [next((k for k in DATASETS if k.lower() == n.lower()), n) for n in dnames]
    modes = _names(args.modes, ["eager"] if quick else (MODES if cuda else MODES[:2]), MODES,
                   "mode")
    epochs = args.epochs or (QUICK_EPOCHS if quick else EPOCHS)
    warmup = args.warmup if args.warmup is not None else (QUICK_WARMUP if quick else WARMUP)
    hidden = (args.width or [HIDDEN])[0]
    heads = getattr(args, "heads", 4) or 4
    pyg_modes = set(_names(args.pyg_modes, modes, MODES, "mode") if args.pyg_modes else modes)
    skipped = []
    for m in CUDA_ONLY:
        if not cuda and m in modes:
            modes.remove(m)
            skipped.append(f"mode {m}: CUDA only")
    steps = {m: max(warmup, MIN_WARMUP[m], 1) for m in modes}
    if epochs <= max(steps.values()):
        raise SystemExit(f"fastgnn bench: --epochs {epochs} leaves no timed epoch after "
                         f"{max(steps.values())} warm-up epochs")

    budget = args.budget_minutes
    if budget is None and not cuda and not quick:
        # the full data sets train for over 30 minutes on a small CPU machine
        budget = CPU_BUDGET_MINUTES
        print(f"fastgnn bench: the training suite on the CPU runs {len(dnames)} data sets x "
              f"{len(models)} models x {len(modes)} modes x 2 frameworks for {epochs} epochs "
              f"each; it stops starting rows after {budget:g} minutes (--budget-minutes N "
              "changes that; --quick runs Cora and minesweeper, eager, in about 20 s)",
              file=sys.stderr)
    gpu = runinfo.device_label(torch, device)
    out_path = runinfo.results_path(args.out, "training-quick" if quick else "training", gpu)
    command = "python -m fastgnn.bench " + shlex.join(argv)
    meta = {"gpu": gpu, "command": command, "versions": runinfo.versions(torch, cuda),
            "skipped": skipped,
            "timing": (f"{epochs} epochs per row; median ms of the epochs after the first "
                       f"{warmup} (compile >= 1, cudagraph >= 3), "
                       + ("CUDA events" if cuda else "time.perf_counter")
                       + f"; hidden {hidden}, heads {heads}, dropout {DROPOUT}, Adam lr {LR}, "
                         f"weight decay {WEIGHT_DECAY}; fastgnn and PyG on edge_index")}
    d = os.path.dirname(out_path)
    if d:
        os.makedirs(d, exist_ok=True)
    records = []
    bar = runinfo.progress(len(dnames) * len(models) * len(modes) * 2, args.no_progress)
    interrupted = False
    gate = runinfo.RowGate(budget, skipped)
    try:
        for dname in dnames:
            bar.set_description_str(f"loading {dname}")
            try:
                data = load_data(torch, device, dname, args.seed)
            except FileNotFoundError as exc:
                skipped.append(f"data set {dname}: {str(exc).splitlines()[0]}")
                print(f"fastgnn bench: skipping {dname}: not found", file=sys.stderr)
                bar.update(len(models) * len(modes) * 2)
                continue
            for model_name in models:
                state = master_state(torch, model_name, data, hidden, heads, args.seed)
                for mode in modes:
                    for framework in ("pyg", "fastgnn"):
                        if framework == "pyg" and mode not in pyg_modes:
                            bar.update(1)
                            continue
                        bar.set_description_str(f"{dname} {model_name} {mode} {framework}")
                        row = f"{dname} {model_name} {mode} {framework}"
                        if gate.closed(row):
                            bar.update(1)
                            continue
                        rec = {"gpu": gpu, "device": str(device), "versions": meta["versions"],
                               "kind": "training", "family": "training", "case": f"train {model_name}",
                               "graph": dname, "graph_stats": data.stats, "graph_source": data.source,
                               "model": model_name, "framework": framework,
                               "impl": f"{framework}[{mode}]", "fastgnn": framework == "fastgnn",
                               "mode": mode, "dtype": "fp32", "width": hidden, "heads": heads,
                               "metric": data.metric, "split": data.split,
                               "features": data.features, "epochs": epochs,
                               "warmup": steps[mode], "timed_epochs": epochs - steps[mode],
                               "seed": args.seed, "command": command}
                        rec.update(run_row(torch, data, model_name, framework, mode, state,
                                           hidden=hidden, heads=heads, epochs=epochs,
                                           warmup=steps[mode], seed=args.seed, cuda=cuda))
                        if rec["error"]:
                            gate.after_failure(torch, device, row, rec["error"])
                        records.append(rec)
                        bar.update(1)
                runinfo.write_json(out_path, records)      # a run cut short keeps what it measured
            del data
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

