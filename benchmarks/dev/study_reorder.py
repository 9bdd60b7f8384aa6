"""Developer study: what each node order (fastgnn.reorder) buys each kernel
family on a suite of graphs, against the graph's own given order.

Per graph and order: the reordering cost (the host's `order(...).time_s`,
and the wall time of that plus building the reordered Graph on the device
and permuting the node features once), then per kernel family the median
time of `repeats` calls after a warm-up (CUDA events on the GPU, and
there at least 50 ms of calls: more repeats on small graphs; the given
order is timed first and again after the others, and the faster of its two
timings is the baseline):

    spmm_custom   fastgnn.spmm sum, F features fp32, path="custom" (the row kernel)
    spmm_cusparse the same with path="cusparse" (GPU only)
    segment_max   fastgnn.segment_reduce(..., "max"), F features fp32 (forward)
    gat_fwdbwd    edge_attention_fwd + _bwd, score="gat", H heads x C channels, fp32
    dot_fwdbwd    edge_attention_fwd + _bwd, score="dot", bf16, tensor_cores="auto"
                  (the path auto took is reported; fp32 on the CPU, which has
                  neither bf16 nor Tensor Cores)

with the speedup over the order "none" (the graph as given), the round
counts the attention's persistent grids took (`ROUNDS`), and the
break-even number of calls (cost / time saved per call; "never" where the
order is slower). A correctness check per graph and order: the SpMM output
of the reordered graph, moved back to the caller's order
(unpermute_nodes), against the un-reordered output (max relative error per
row element, and the norm-wise rel_err).

Graph specs are `fastgnn bench --graphs` names (fastgnn/bench/graphs.py);
a suffix "+shuffle" applies a seeded random relabelling first (the R-MAT
generator keeps its bit-structured ids, hubs at low ids; meshes come in
row-major order), so "none" is then the shuffled order. An order name with
the suffix "/visit" (`rcm/visit`) keeps the node ids and features as given
and only has the row kernels visit rows in the order
(`Graph.reorder(..., relabel=False)`).

    python benchmarks/dev/study_reorder.py [--graphs SPEC ...] [--orders ORDER ...]
        [--repeats 5] [--features 128] [--heads 4] [--channels 32]
        [--out DIR] [--quick]

Prints one markdown table per graph, a summary (median speedup per kernel
family and order across the graphs) and the best order per graph and
kernel with the median of those best speedups over the shuffled graphs
(the figure the reordering docs judge by); writes DIR/study_reorder.json
(all rows) and DIR/study_reorder.png (matplotlib, when installed). --quick
runs tiny graphs, on the CPU backend with NumPy arrays when no GPU is
there (CUDA events, cuSPARSE and Tensor Cores are then skipped).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

import fastgnn
from fastgnn import generators
from fastgnn.bench.graphs import GraphUnavailable, parse
from fastgnn.reorder import order, permute_nodes, unpermute_nodes
from fastgnn.testing import rel_err

DEFAULT_GRAPHS = ["rmat18+shuffle", "rmat18", "uniform18", "mesh3d64", "mesh3d64+shuffle",
                  "file:soc-brightkite.txt", "file:soc-brightkite.txt+shuffle"]
QUICK_GRAPHS = ["rmat12+shuffle", "uniform12", "mesh3d16", "mesh3d16+shuffle",
                "file:soc-wiki-Vote.txt", "file:soc-wiki-Vote.txt+shuffle"]
DEFAULT_ORDERS = ["none", "random", "degree", "rcm", "cluster", "metis"]
KERNELS = ["spmm_custom", "spmm_cusparse", "segment_max", "gat_fwdbwd", "dot_fwdbwd"]
SHUFFLE_SEED = 1
MIN_TIMED_MS = 50        # GPU: time at least this much of each kernel per order
MAX_REPEATS = 200


# ------------------------------------------------------------------ device


class Device:
    """The array module and the timer: CuPy + CUDA events, or NumPy + wall clock."""

    def __init__(self, want_gpu):
        self.gpu = False
        self.xp = np
        if want_gpu and fastgnn.gpu_available():
            import cupy
            self.gpu, self.xp, self.cp = True, cupy, cupy

    @property
    def name(self):
        if self.gpu:
            props = self.cp.cuda.runtime.getDeviceProperties(self.cp.cuda.Device().id)
            return props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"

    def sync(self):
        if self.gpu:
            self.cp.cuda.Device().synchronize()

    def median_ms(self, fn, repeats, warmup=2):
        """Median time of fn() in ms after `warmup` untimed calls (which
        compile kernels and build plans): CUDA events on the current stream
        on the GPU, perf_counter on the CPU. On the GPU at least MIN_TIMED_MS
        of calls are timed (up to MAX_REPEATS): a small graph's sub-ms calls
        vary from call to call by more than the orders change them."""
        for _ in range(warmup - 1):
            fn()
        if self.gpu:                    # one more warm-up call, then CUDA events
            from fastgnn.backends.cuda.spmm import median_ms
            once = median_ms(fn, 1)
            return median_ms(fn, max(repeats, min(MAX_REPEATS, int(MIN_TIMED_MS / max(once, 1e-3)))))
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return float(statistics.median(times))

    def host(self, a):
        return a.get() if self.gpu else np.asarray(a)

    def free(self):
        if self.gpu:
            self.cp.get_default_memory_pool().free_all_blocks()


def bf16_bits(xp, a):
    """float32 array -> bf16 as uint16 bits (truncation)."""
    return (xp.ascontiguousarray(a, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def bf16_values(xp, bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


# ------------------------------------------------------------------ graphs


def build_graph(spec, dev):
    """(display name, fastgnn.Graph in its given order, description)."""
    base, shuffle = (spec[:-len("+shuffle")], True) if spec.endswith("+shuffle") else (spec, False)
    name, desc, make = parse(base)
    xp = dev.xp if not base.startswith(("npz:", "file:")) else np
    made = make(xp, 0)
    ei, n = made[0], int(made[1])
    if len(made) > 2:
        name = made[2]
    ei = dev.xp.asarray(ei)
    if shuffle:
        inv = dev.xp.asarray(np.random.default_rng(SHUFFLE_SEED).permutation(n))
        ei = inv[ei]
        name, desc = f"{name}+shuffle", f"{desc}, ids shuffled (seed {SHUFFLE_SEED})"
    g = fastgnn.Graph.from_edge_index(ei, num_nodes=n)
    return name, g, desc


VISIT = "/visit"     # order suffix: the same ids, only the rows' visit order


def reordered(g, method, x, dev):
    """(graph in the new order, move, info): move(a) takes a node array of
    the caller's order to the graph's (permute_nodes, or nothing for
    METHOD/visit: the graph keeps its ids and only visits its rows in the
    order, Graph.reorder(..., relabel=False)); info holds order_s (the
    permutation's time_s on the host) and cost_s (wall: permutation + new
    Graph on the device + x moved)."""
    visit = method.endswith(VISIT)
    dev.sync()
    t0 = time.perf_counter()
    p = order(g, method.removesuffix(VISIT), seed=0)
    g2 = g.reorder(p, relabel=not visit)
    move = (lambda a: a) if visit else (lambda a: permute_nodes(a, g2))
    move(x)
    dev.sync()
    cost = time.perf_counter() - t0
    info = {"order_s": p.time_s, "cost_s": cost}
    info.update({k: v for k, v in p.info.items() if isinstance(v, (int, float, str))})
    return g2, move, info


# ------------------------------------------------------------------ kernels


class Inputs:
    """Node inputs in the caller's order, made once per graph (seeded)."""

    def __init__(self, n, F, H, C, dev):
        xp = dev.xp
        rng = xp.random.default_rng(0)          # on the device: no host -> device copies

        def r(*shape):
            return rng.standard_normal(shape, dtype=np.float32)
        self.x = r(n, F)
        self.a_src, self.a_dst = r(n, H), r(n, H)
        self.v = r(n, H, C)
        self.go = r(n, H, C)
        q, k, vd, god = r(n, H, C), r(n, H, C), r(n, H, C), r(n, H, C)
        if dev.gpu:
            self.dot = {"q": bf16_bits(xp, q), "k": bf16_bits(xp, k), "v": bf16_bits(xp, vd)}
            self.dot_go, self.dot_vtype = bf16_bits(xp, god), "bfloat16"
        else:
            self.dot, self.dot_go, self.dot_vtype = {"q": q, "k": k, "v": vd}, god, None

    def node_arrays(self):
        """name -> the node arrays (all [n, ...]) that move with the order."""
        d = {"x": self.x, "a_src": self.a_src, "a_dst": self.a_dst, "v": self.v, "go": self.go,
             "dot_go": self.dot_go}
        d.update({f"dot_{k}": a for k, a in self.dot.items()})
        return d


def measure(g, arrays, dev, repeats):
    """{kernel: ms} on graph g with node arrays already in g's order, plus
    the dot path taken and the SpMM output (for the check)."""
    x = arrays["x"]
    t = {}
    notes = {}
    out_spmm = fastgnn.spmm(g, x, path="custom")
    t["spmm_custom"] = dev.median_ms(lambda: fastgnn.spmm(g, x, path="custom"), repeats)
    if dev.gpu:
        t["spmm_cusparse"] = dev.median_ms(lambda: fastgnn.spmm(g, x, path="cusparse"), repeats)
    t["segment_max"] = dev.median_ms(lambda: fastgnn.segment_reduce(g, x, "max"), repeats)

    def gat():
        _, res = fastgnn.edge_attention_fwd(g, "gat", a_src=arrays["a_src"],
                                            a_dst=arrays["a_dst"], v=arrays["v"])
        fastgnn.edge_attention_bwd(g, res, arrays["go"])
    t["gat_fwdbwd"] = dev.median_ms(gat, repeats)

    dot_kw = {"q": arrays["dot_q"], "k": arrays["dot_k"], "v": arrays["dot_v"],
              "vtype": arrays["dot_vtype"], "tensor_cores": "auto"}

    def dot():
        _, res = fastgnn.edge_attention_fwd(g, "dot", **dot_kw)
        fastgnn.edge_attention_bwd(g, res, arrays["dot_go"])
        return res
    res = dot()
    notes["dot_path"] = "tensor cores" if getattr(res, "tensor_cores", False) else "CUDA cores" \
        if dev.gpu else "CPU"
    t["dot_fwdbwd"] = dev.median_ms(dot, repeats, warmup=1)   # plus the call above
    notes["rounds"] = rounds_taken(g)
    return t, notes, out_spmm


def rounds_taken(g):
    """The round counts the attention's persistent grids took on g and its
    transpose (attention.ROUNDS), "-" where none ran (the CPU, or grids
    small enough for one slot per task)."""
    got = set()
    for gg in (g, g.cache.get("transpose")):
        for key, val in ({} if gg is None else gg.cache).items():
            if isinstance(key, tuple) and key[0] == "attention_task_slots":
                got.add(int(key[3]))
    return "/".join(map(str, sorted(got))) or "-"


def check(out_new, out_ref, g2, dev):
    """SpMM in the new order moved back vs the un-reordered run:
    (max |a - b| / max |b|, norm-wise rel_err)."""
    back = out_new if g2.permutation is None else unpermute_nodes(out_new, g2)
    a = dev.host(back).astype(np.float64)
    b = dev.host(out_ref).astype(np.float64)
    den = np.abs(b).max() if b.size else 0.0
    mx = float(np.abs(a - b).max() / den) if den > 0 else float(np.abs(a - b).max(initial=0))
    return mx, rel_err(a, b)


# ------------------------------------------------------------------ the study


def study_graph(spec, orders, a, dev, t_start):
    t0 = time.perf_counter()
    try:
        name, g, desc = build_graph(spec, dev)
    except GraphUnavailable as exc:
        print(f"\n## {spec}: skipped ({exc})", flush=True)
        return []
    dev.sync()
    build_s = time.perf_counter() - t0
    n, E = g.num_dst, g.num_edges
    inp = Inputs(n, a.features, a.heads, a.channels, dev)
    base_arrays = dict(inp.node_arrays(), dot_vtype=inp.dot_vtype)
    print(f"\n## {name}: n={n:,} E={E:,} ({desc}; built in {build_s:.2f} s)", flush=True)
    timed = []                              # (order, times, notes, info, check)
    ref_out = None
    for o in orders:
        if o == "none":
            g2, arrays, info = g, base_arrays, {"order_s": 0.0, "cost_s": 0.0}
        else:
            g2, move, info = reordered(g, o, inp.x, dev)
            arrays = {k: move(v) for k, v in inp.node_arrays().items()}
            arrays["dot_vtype"] = inp.dot_vtype
        t, notes, out = measure(g2, arrays, dev, a.repeats)
        if o == "none":
            ref_out = out
            err = (0.0, 0.0)
        else:
            err = check(out, ref_out, g2, dev)
        timed.append((o, t, notes, info, err))
        print(f"  {o}: cost {info['cost_s']:.2f} s, check max rel {err[0]:.1e}, "
              f"dot path {notes['dot_path']}, attention rounds {notes['rounds']} "
              f"({time.perf_counter() - t_start:.0f} s elapsed)",
              flush=True)
        if g2 is not g:
            del g2, arrays
            dev.free()
    base = None
    if "none" in orders:
        # the given order again, after the others: the baseline is the faster
        # of its two timings (a graph's first timings can run slow)
        base = dict(next(t for o, t, *_ in timed if o == "none"))
        again = measure(g, base_arrays, dev, a.repeats)[0]
        base = {k: min(v, again.get(k, v)) for k, v in base.items()}
    rows = []
    for o, t, notes, info, err in timed:
        if o == "none":
            t = base
        for k in KERNELS:
            if k not in t:
                continue
            row = {"graph": name, "spec": spec, "num_nodes": n, "num_edges": E, "order": o,
                   "kernel": k, "ms": t[k], "order_s": info["order_s"], "cost_s": info["cost_s"],
                   "check_max_rel": err[0], "check_rel_err": err[1]}
            if k == "dot_fwdbwd":
                row["dot_path"] = notes["dot_path"]
            if k in ("gat_fwdbwd", "dot_fwdbwd"):
                row["attention_rounds"] = notes["rounds"]
            if "chosen" in info:
                row["auto_chosen"] = info["chosen"]
            if base is not None and k in base:
                row["speedup"] = base[k] / t[k] if t[k] > 0 else float("inf")
                saved_s = (base[k] - t[k]) / 1e3
                row["break_even_calls"] = (info["cost_s"] / saved_s) if (o != "none" and
                                                                         saved_s > 0) else None
            rows.append(row)
    print_graph_table(name, rows, orders)
    return rows


def fmt_calls(row):
    if row["order"] == "none":
        return "-"
    b = row.get("break_even_calls")
    if b is None:
        return "never"
    return f"{b:.0f}" if b >= 10 else f"{b:.1f}"


def print_graph_table(name, rows, orders):
    kernels = [k for k in KERNELS if any(r["kernel"] == k for r in rows)]
    head = ["order", "cost s"] + [f"{k} ms (speedup, break-even calls)" for k in kernels] + ["dot path", "check"]
    print(f"\n| {name} | " + " | ".join(head[1:]) + " |")
    print("|---" * len(head) + "|")
    for o in orders:
        rs = {r["kernel"]: r for r in rows if r["order"] == o}
        if not rs:
            continue
        any_r = next(iter(rs.values()))
        label = f"{o} ({any_r['auto_chosen']})" if "auto_chosen" in any_r else o
        cells = [label, f"{any_r['cost_s']:.2f}"]
        for k in kernels:
            r = rs.get(k)
            cells.append("n/a" if r is None else
                         f"{r['ms']:.3f} ({r.get('speedup', float('nan')):.2f}x, {fmt_calls(r)})")
        cells.append(rs.get("dot_fwdbwd", {}).get("dot_path", "-"))
        cells.append("-" if o == "none" else f"{any_r['check_max_rel']:.1e}")
        print("| " + " | ".join(cells) + " |")
    print(flush=True)


def print_summary(rows, orders):
    kernels = [k for k in KERNELS if any(r["kernel"] == k for r in rows)]
    graphs = sorted({r["graph"] for r in rows})
    print(f"\n## Summary: median speedup over the given order across {len(graphs)} graphs "
          "(min - max)\n")
    print("| order | " + " | ".join(kernels) + " | median cost s |")
    print("|---" * (len(kernels) + 2) + "|")
    for o in orders:
        if o == "none":
            continue
        cells = [o]
        for k in kernels:
            s = [r["speedup"] for r in rows if r["order"] == o and r["kernel"] == k
                 and "speedup" in r]
            cells.append(f"{statistics.median(s):.2f}x ({min(s):.2f}-{max(s):.2f})" if s else "n/a")
        costs = [r["cost_s"] for r in rows if r["order"] == o and r["kernel"] == "spmm_custom"]
        if not costs:
            continue
        cells.append(f"{statistics.median(costs):.2f}")
        print("| " + " | ".join(cells) + " |")
    print(flush=True)


def print_best(rows):
    """Per graph and kernel the fastest order (speedup, order); then, over
    the shuffled graphs ("+shuffle"), the median of those best speedups."""
    kernels = [k for k in KERNELS if any(r["kernel"] == k for r in rows)]
    graphs = list(dict.fromkeys(r["graph"] for r in rows))
    best = {}
    for g in graphs:
        for k in kernels:
            cand = [r for r in rows if r["graph"] == g and r["kernel"] == k and "speedup" in r]
            if cand:
                top = max(cand, key=lambda r: r["speedup"])
                best[g, k] = (top["speedup"], top["order"])
    print("\n## The best order per graph and kernel (speedup over the given order)\n")
    print("| graph | " + " | ".join(kernels) + " |")
    print("|---" * (len(kernels) + 1) + "|")
    for g in graphs:
        cells = [f"{best[g, k][0]:.2f}x {best[g, k][1]}" if (g, k) in best else "n/a"
                 for k in kernels]
        print(f"| {g} | " + " | ".join(cells) + " |")
    shuffled = [g for g in graphs if g.endswith("+shuffle")]
    if shuffled:
        cells = []
        for k in kernels:
            s = [best[g, k][0] for g in shuffled if (g, k) in best]
            cells.append(f"{statistics.median(s):.2f}x" if s else "n/a")
        print(f"| median over the {len(shuffled)} shuffled graphs | " + " | ".join(cells) + " |")
    print(flush=True)


def plot(rows, orders, path):
    if importlib.util.find_spec("matplotlib") is None:
        print("matplotlib is not installed: no plot")
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    graphs = list(dict.fromkeys(r["graph"] for r in rows))
    kernels = [k for k in KERNELS if any(r["kernel"] == k for r in rows)]
    shown = [o for o in orders if o != "none"]
    cols = min(3, len(graphs))
    nrows = (len(graphs) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.6 * nrows), squeeze=False)
    width = 0.8 / max(1, len(shown))
    for ax, gname in zip(axes.flat, graphs):
        for i, o in enumerate(shown):
            vals = []
            for k in kernels:
                r = [r for r in rows if r["graph"] == gname and r["order"] == o
                     and r["kernel"] == k and "speedup" in r]
                vals.append(r[0]["speedup"] if r else np.nan)
            ax.bar(np.arange(len(kernels)) + (i - (len(shown) - 1) / 2) * width, vals, width,
                   label=o)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_title(gname, fontsize=10)
        ax.set_xticks(np.arange(len(kernels)))
        ax.set_xticklabels([k.replace("_", "\n", 1) for k in kernels], fontsize=7)
        ax.set_ylabel("speedup vs given order", fontsize=8)
    for ax in list(axes.flat)[len(graphs):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def warm_up(dev, a):
    """Load the Numba label propagation and compile the kernels on a tiny
    graph, so that neither counts in the first graph's numbers."""
    t0 = time.perf_counter()
    order(np.array([[0, 1, 2], [1, 2, 0]]), "cluster")
    ei, n = generators.grid(16)
    g = fastgnn.Graph.from_edge_index(dev.xp.asarray(ei), num_nodes=n)
    inp = Inputs(n, a.features, a.heads, a.channels, dev)
    measure(g, dict(inp.node_arrays(), dot_vtype=inp.dot_vtype), dev, 1)
    dev.sync()
    return time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", nargs="+", default=None,
                    help="graph specs (fastgnn bench names; suffix +shuffle)")
    ap.add_argument("--orders", nargs="+", default=None,
                    help="orders: none random degree rcm cluster metis auto identity; "
                         "METHOD/visit keeps the ids and only visits rows in the order")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--channels", type=int, default=32)
    ap.add_argument("--out", default="./fastgnn-reorder-study")
    ap.add_argument("--quick", action="store_true", help="tiny graphs; runs on the CPU too")
    ap.add_argument("--cpu", action="store_true", help="the CPU backend even where a GPU is")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    dev = Device(want_gpu=not a.cpu)
    if not dev.gpu and not a.quick:
        sys.exit("study_reorder: no usable GPU (CuPy); run with --quick for the CPU backend")
    graphs = a.graphs or (QUICK_GRAPHS if a.quick else DEFAULT_GRAPHS)
    orders = list(a.orders or DEFAULT_ORDERS)
    if "none" not in orders:
        orders.insert(0, "none")
    orders.remove("none")
    orders.insert(0, "none")                        # the baseline first
    if (any(o.removesuffix(VISIT) == "metis" for o in orders)
            and importlib.util.find_spec("pymetis") is None):
        orders = [o for o in orders if o.removesuffix(VISIT) != "metis"]
        skipped = "metis: pymetis is not installed (pip install fastgnn[metis]), skipped"
    else:
        skipped = None
    print(f"# Reordering study on {dev.name}")
    print(f"graphs {graphs}; orders {orders}; repeats {a.repeats} (median after a warm-up); "
          f"F={a.features}, H={a.heads}, C={a.channels}")
    if skipped:
        print(skipped)
    if not dev.gpu:
        print("note: CPU backend with NumPy arrays: wall-clock medians instead of CUDA "
              "events, no cuSPARSE (spmm_cusparse skipped), dot attention in fp32 (the CPU "
              "has no bf16 kernels and no Tensor Core path); the numbers say nothing about a GPU")
    print(f"warm-up (Numba load, kernel compilation): {warm_up(dev, a):.2f} s", flush=True)
    rows = []
    for spec in graphs:
        rows += study_graph(spec, orders, a, dev, t_start)
        dev.free()
    if not rows:
        sys.exit("study_reorder: no graph could be built")
    print_summary(rows, orders)
    print_best(rows)
    os.makedirs(a.out, exist_ok=True)
    meta = {"device": dev.name, "gpu": dev.gpu, "graphs": graphs, "orders": orders,
            "repeats": a.repeats, "features": a.features, "heads": a.heads,
            "channels": a.channels, "fastgnn": getattr(fastgnn, "__version__", "?"),
            "total_s": time.perf_counter() - t_start}
    jpath = os.path.join(a.out, "study_reorder.json")
    with open(jpath, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    ppath = plot(rows, orders, os.path.join(a.out, "study_reorder.png"))
    print(f"wrote {jpath}" + (f" and {ppath}" if ppath else "")
          + f"; total {time.perf_counter() - t_start:.1f} s")


if __name__ == "__main__":
    main()
