"""`python -m fastgnn.bench` / `fastgnn bench`: benchmark fastgnn against its baselines.

Examples
    python -m fastgnn.bench                               # CUDA: the default graphs; CPU: --quick
    python -m fastgnn.bench --quick                       # CPU smoke run, 1-3 min on 2 cores
    python -m fastgnn.bench --graphs rmat20 clustered     # H200: SpMM ops + layers
    python -m fastgnn.bench --ops spmm_sum --layers none --dtypes fp32 --width 64 128
    python -m fastgnn.bench --family segment --graphs rmat20  # reductions + SAGEConv(max)
    python -m fastgnn.bench --family attention --graphs rmat20 clustered  # GAT/GATv2/Transformer
    python -m fastgnn.bench --ops none --layers GraphConv PNAConv RGCNConv_8rel  # opt-in layers
    python -m fastgnn.bench --graphs mesh3d64k26 molecules20 knn18 file:planetoid/cora \
        --datasets ~/graphs                               # real graphs by name under ~/graphs
    python -m fastgnn.bench --graphs rmat20 grid --reorder rcm   # node ids relabelled first (docs/reordering.md)
    python -m fastgnn.bench --list                        # the registered cases
    python -m fastgnn.bench --suite full --datasets DIR --out $OUT   # H200 suite, ~7 min
    python -m fastgnn.bench --suite minibatch --quick     # mini-batch training steps, CPU sizes
    python -m fastgnn.bench --graphs rmat17 --dtypes fp32 --compile   # + PyG under torch.compile

Writes a JSON list of records (one per graph x case x dtype x width x
implementation), a markdown report beside it (.md) with PNG plots in
<name>_plots/, then prints a compact table. They go to --out (a .json path,
or a folder), by default to fastgnn-bench/ in the working directory (never
into the installed package). A run that measures nothing (every graph
missing or failed) exits with status 1.

Without a CUDA device, a plain run (no --graphs, --suite or --quick) runs
the --quick preset: the default graphs (up to 16 M edges) are sized for a
GPU and would take hours on a CPU; `--suite full` there stops at once and
says what to run instead.

Real graphs (file:NAME, npz:NAME, the real graphs of --suite full) are
looked up by name under --datasets DIR and the folders in $FASTGNN_DATASETS
(fastgnn.datasets.find); a path is read as it is.

`python -m fastgnn.bench.report` rebuilds the report from JSON files. See
docs/benchmarks.md for the method and the baselines.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import textwrap

from . import core
from ..datasets import ENV_VAR as DATASETS_ENV
from .core import CASES
from .graphs import GRAPH_NAMES
from .runinfo import (OUT_DIR, RowGate, device_label, progress, results_path, versions,
                      write_json)

DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
          "fp16": "float16", "float16": "float16"}
SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}

FULL_GRAPHS = ["rmat20", "rmat16", "uniform20", "clustered", "grid"]
QUICK_GRAPHS = ["rmat10", "clustered10", "mesh3d10", "molecules10", "knn10"]
H200_BANDWIDTH_GBS = 4190.0     # an H200's measured copy bandwidth, read + write

# Named presets (--suite). `full` is the H200 suite of docs/benchmarks.md: the
# three families, default ops and default layers, fp32 + bf16, generated graphs
# of four kinds at ~2 M and ~16 M edges plus the largest real graphs (found
# by name under --datasets DIR / $FASTGNN_DATASETS; absent ones are skipped
# and listed). Budget: under ~8 minutes on an H200:
# 10 timed calls after 1 warm-up (the agreement call warms too); on graphs
# above 1.5 M edges the per-edge baselines (PyG's gather/scatter forms, which
# take ~250 ms a fwd+bwd call at 16 M edges) run in fp32 only; no case starts
# after 7 minutes (cheap graphs first, so a cut drops the last large one).
SUITES = {
    "full": {"graphs": ["npz:tolokers", "file:github", "file:soc-brightkite",
                        "rmat17", "clustered16", "uniform17", "mesh3d44k26",
                        "rmat20", "clustered19", "uniform20", "mesh3d88k26"],
             "dtypes": ["fp32", "bf16"], "width": [128], "repeats": 10, "warmup": 1,
             "lean_above": 1_500_000, "budget_minutes": 7.0},
    "training": {},     # end-to-end training epochs, its own options (cases_training.py)
    "minibatch": {},    # mini-batch training steps, its own options (cases_minibatch.py)
}
# Rough H200 cost model for the estimate (seconds), calibrated on PyG's H200
# timings: per (graph, dtype, case) a fixed part plus a part per million
# edges, smaller when the per-edge baselines are skipped; plus start-up.
EST_CASE_S, EST_PER_MEDGE_S, EST_PER_MEDGE_LEAN_S, EST_START_S = 0.4, 0.22, 0.06, 40.0
EST_FILE_EDGES = 1_000_000       # a real graph of unknown size (the shared ones are <= 1 M)
# Without CUDA, naming large graphs gets a warning. Measured on 2 cores: the
# default settings (F=128, 20 timed calls) on rmat14 + clustered14 (250 k +
# 440 k edges) took ~14 minutes at F=64, --quick's (F=32, 3 calls, 1 thread)
# ~2 minutes; above 2 M edges (rmat20: 16 M) a single case takes minutes.
CPU_DEFAULT_SETTINGS_EDGES = 100_000
CPU_LARGE_EDGES = 2_000_000


def _load_cases():
    from . import (cases_attention, cases_layers, cases_layers_extended,  # noqa: F401
                   cases_segment, cases_spmm)                            # (register on import)


EPILOG = textwrap.fill(f"graph names: {GRAPH_NAMES} (see docs/benchmarks.md)", 79) + f"""

without a CUDA device a plain run is --quick (small graphs, F=32, a progress
bar; 1-3 minutes on 2 cores, the first run the longest as it compiles the
CPU kernels); --suite full needs a GPU and says so.

results: --out PATH.json or --out DIR; default ./{OUT_DIR}/ (in the working
directory). Exit status 1 when nothing was measured.

data sets: file:NAME and npz:NAME (and --suite full's real graphs) are found
by name under --datasets DIR and under $FASTGNN_DATASETS (folders joined
with '{os.pathsep}'), e.g. `export FASTGNN_DATASETS=$HOME/graphs`; a path is
read as it is. Missing ones are skipped and listed in the report.
"""


def build_parser():
    p = argparse.ArgumentParser(prog="fastgnn bench", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=EPILOG)
    p.add_argument("--suite", choices=sorted(SUITES),
                   help="a named preset: 'full' = the H200 suite (docs/benchmarks.md: 11 graphs, "
                        "every family, fp32 + bf16, ~7 min), 'training' = ms per training epoch of 2-layer "
                        "models on real data sets, 'minibatch' = ms per training step of 3-layer "
                        "models on a new sampled subgraph / batch of small graphs every step "
                        "against the same one; options given explicitly override it")
    p.add_argument("--graphs", nargs="+", help=f"graphs (default {' '.join(FULL_GRAPHS)}; "
                   f"--quick: {' '.join(QUICK_GRAPHS)})")
    p.add_argument("--width", nargs="+", type=int, help="feature widths F (default 128; --quick: 32)")
    p.add_argument("--dtypes", nargs="+", help="fp32 bf16 fp16 (default fp32 bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--ops", nargs="+", help="op cases, 'all' or 'none' (default: the default ops)")
    p.add_argument("--layers", nargs="+",
                   help="layer cases, 'all' or 'none' (default: the default layers, marked in "
                        "--list; the opt-in ones, e.g. GraphConv or RGCNConv_8rel, run when "
                        "named or with 'all')")
    p.add_argument("--family", default="all", choices=["spmm", "segment", "attention", "all"],
                   help="case family for the default / 'all' op and layer sets (default all); "
                        "cases named in --ops / --layers run whatever their family")
    p.add_argument("--heads", type=int, default=4,
                   help="attention heads H for the attention family (C = F / H; default 4)")
    p.add_argument("--impls", nargs="+", help="only implementations whose name contains one of these")
    p.add_argument("--repeats", type=int, help="timed calls per measurement, median reported "
                   "(default 20; --quick 3)")
    p.add_argument("--warmup", type=int, help="untimed calls first (default 3; --quick 1)")
    p.add_argument("--quick", action="store_true",
                   help="CPU-friendly smoke run: five small graphs (one of each generator kind), F=32, few repeats")
    p.add_argument("--compile", nargs="?", const="default", metavar="MODE",
                   help="add PyG under torch.compile(mode=MODE, default 'default') to the layer "
                        "cases (opt-in: ~20-60 s of compilation per layer, graph and dtype, "
                        "outside timing); a layer that does not compile is recorded unsupported")
    p.add_argument("--compile-dynamic", action="store_true",
                   help="with --compile: dynamic=True (default False: shapes are fixed per graph)")
    p.add_argument("--lean-above", type=int, metavar="EDGES",
                   help="on graphs with more edges, baselines that materialise per-edge tensors "
                        "run in fp32 only (time budget; --suite full: 4000000)")
    p.add_argument("--budget-minutes", type=float,
                   help="start no graph or case after this many minutes (the rest is listed as "
                        "skipped; --suite full: 7)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--threads", type=int, help="CPU threads for torch and numba (default: their "
                   "own defaults; --quick: 1, which is robust on small, shared machines)")
    p.add_argument("--autograd-threads", choices=["on", "off"],
                   help="off: torch.autograd.set_multithreading_enabled(False) for every "
                        "implementation, so backward runs on the calling thread instead of "
                        "autograd's CUDA device thread (default: torch's own setting; see "
                        "docs/benchmarks.md, 'Small graphs and autograd's device threads')")
    from ..reorder import METHODS as _ORDERS
    p.add_argument("--reorder", metavar="METHOD", choices=sorted(_ORDERS),
                   help="relabel each graph's nodes by this fastgnn.reorder method before timing "
                        f"({', '.join(sorted(_ORDERS))}; docs/reordering.md)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bandwidth", type=float, default=None,
                   help=f"GB/s for the bytes floor (default {H200_BANDWIDTH_GBS:g} on CUDA, "
                        "the H200's measured copy bandwidth; none on CPU)")
    p.add_argument("--out", metavar="PATH.json|DIR",
                   help=f"where the results go: a .json path (the markdown report and plots go "
                        f"beside it) or a folder for them under automatic names (default "
                        f"./{OUT_DIR}/ in the working directory)")
    p.add_argument("--datasets", action="append", metavar="DIR",
                   help="a folder holding the real data sets that file:NAME / npz:NAME name "
                        "(repeatable; searched before $FASTGNN_DATASETS, which is searched too)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    p.add_argument("--no-plots", action="store_true", help="markdown tables only, no PNG plots")
    p.add_argument("--list", action="store_true", help="list the registered cases and exit")
    from .cases_training import add_arguments
    add_arguments(p)
    from .cases_minibatch import add_arguments as add_minibatch_arguments
    add_minibatch_arguments(p)
    return p


def _select(names, kind, family="all"):
    every = [c for c in CASES.values() if c.kind == kind]
    pool = [c for c in every if family == "all" or c.family == family]
    if names is None:
        return [c for c in pool if c.default]
    if names == ["none"]:
        return []
    if names == ["all"]:
        return pool
    pool = every
    by = {c.name.lower(): c for c in pool}
    out = []
    for n in names:
        if n.lower() not in by:
            raise SystemExit(f"fastgnn bench: unknown {kind} {n!r}; known: {', '.join(c.name for c in pool)}")
        out.append(by[n.lower()])
    return out


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    _load_cases()
    if args.list:
        for c in CASES.values():
            print(f"{c.kind:5} {c.family:7} {c.name:18} {'(default)' if c.default else '         '} "
                  f"{c.description}")
        return 0

    import torch


    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise SystemExit("fastgnn bench: --device cuda but torch sees no CUDA device")
    cuda = device.type == "cuda"
    if cuda:
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        _plan_for_the_cpu(args)

    if args.suite:
        for key, val in SUITES[args.suite].items():
            if getattr(args, key) is None:
                setattr(args, key, val)
    quick = args.quick
    threads = args.threads or (1 if quick and not cuda else None)
    restore = _set_threads(torch, threads) if threads else None
    autograd_mt = torch.autograd.is_multithreading_enabled()
    if args.autograd_threads:
        torch.autograd.set_multithreading_enabled(args.autograd_threads == "on")
    datasets_env = os.environ.get(DATASETS_ENV)
    if args.datasets:
        os.environ[DATASETS_ENV] = os.pathsep.join(args.datasets + [datasets_env or ""]).rstrip(
            os.pathsep)
    try:
        if args.suite == "training":
            from .cases_training import run
            return run(args, argv, torch, device, cuda, quick)
        if args.suite == "minibatch":
            from .cases_minibatch import run as run_minibatch
            return run_minibatch(args, argv, torch, device, cuda, quick)
        return _run(args, argv, torch, device, cuda, quick)
    finally:
        if restore:
            _set_threads(torch, *restore)
        torch.autograd.set_multithreading_enabled(autograd_mt)
        if args.datasets:
            if datasets_env is None:
                os.environ.pop(DATASETS_ENV, None)
            else:
                os.environ[DATASETS_ENV] = datasets_env


def _plan_for_the_cpu(args):
    """Without CUDA: a plain run becomes --quick (the default graphs are
    GPU-sized); --suite full without --graphs stops at once, saying what to
    run instead."""
    where = "torch sees no CUDA device" if args.device == "auto" else "--device cpu asks for the CPU"
    if args.suite == "full" and not args.graphs:
        raise SystemExit(
            f"fastgnn bench: --suite full is sized for an H200 (graphs up to 16 M edges, ~7 "
            f"minutes there; hours on a CPU), and {where}. On this machine run\n"
            f"    fastgnn bench --quick                 (five small graphs, 1-3 minutes on 2 "
            f"cores)\n"
            f"    fastgnn bench --quick --graphs rmat14 clustered14   (larger graphs, ~2 "
            f"minutes)\n"
            f"or run --suite full on a CUDA machine.")
    if not (args.graphs or args.suite or args.quick):
        args.quick = True
        print(f"fastgnn bench: {where}: running the CPU preset --quick ({' '.join(QUICK_GRAPHS)}, "
              f"F=32). The default graphs ({' '.join(FULL_GRAPHS)}) are sized for a GPU; choose "
              "sizes with --graphs.", file=sys.stderr)


def _warn_cpu_size(spec, edges, quick, args):
    """Say when a graph named for a CPU run will take long (see CPU_*_EDGES)."""
    if not edges:
        return
    if edges > CPU_LARGE_EDGES:
        print(f"fastgnn bench: {spec} has ~{edges / 1e6:.0f} M edges: on the CPU a single case "
              "takes minutes; graphs up to a few 100 k edges (rmat14, clustered14) with --quick "
              "take ~2 minutes in all", file=sys.stderr)
    elif edges > CPU_DEFAULT_SETTINGS_EDGES and not quick and not (args.width or args.repeats):
        print(f"fastgnn bench: {spec} has ~{edges / 1e3:.0f} k edges: at the default settings "
              "(F=128, 20 timed calls) a CPU run takes many minutes per graph; --quick (F=32, 3 "
              "calls) takes ~1 minute per graph of this size", file=sys.stderr)


def _set_threads(torch, n, n_numba=None):
    """Set torch's and numba's CPU threads; returns the previous values."""
    prev = (torch.get_num_threads(), None)
    torch.set_num_threads(n)
    try:
        import numba
        prev = (prev[0], numba.get_num_threads())
        numba.set_num_threads(min(n_numba or n, numba.config.NUMBA_NUM_THREADS))
    except Exception:  # noqa: BLE001
        pass
    torch.set_num_threads(n)      # numba's OpenMP layer can reset torch's count: set it last
    return prev


def _run(args, argv, torch, device, cuda, quick):
    import warnings

    from . import graphs as bgraphs
    # torch's notices about sparse CSR tensors (raised inside PyG too) say nothing here
    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
    # turbo-gnn's reduction_aggr warns on every call that it lowers its block size at F=128
    warnings.filterwarnings("ignore", message="Number of threads involved for ReductionAggr")

    graph_specs = args.graphs or (QUICK_GRAPHS if quick else FULL_GRAPHS)
    widths = args.width or ([32] if quick else [128])
    repeats = args.repeats or (3 if quick else 20)
    warmup = args.warmup if args.warmup is not None else (1 if quick else 3)
    skipped = []
    dtype_names = []
    for d in (args.dtypes or (["fp32", "bf16"] if cuda else ["fp32"])):
        if d.lower() not in DTYPES:
            raise SystemExit(f"fastgnn bench: unknown dtype {d!r} (fp32, bf16, fp16)")
        full = DTYPES[d.lower()]
        if not cuda and full != "float32":
            skipped.append(f"dtype {d}: the CPU backend runs float32 only")
            continue
        if full not in dtype_names:
            dtype_names.append(full)
    cases = (_select(args.ops, "op", family=args.family)
             + _select(args.layers, "layer", family=args.family))
    bandwidth = args.bandwidth if args.bandwidth is not None else (H200_BANDWIDTH_GBS if cuda else None)

    command = "python -m fastgnn.bench " + shlex.join(argv)
    gpu = device_label(torch, device)
    prefix = "quick" if quick else (args.suite or ("bench" if args.family == "all" else args.family))
    out_path = results_path(args.out, prefix, gpu)
    meta = {"gpu": gpu, "command": command, "versions": versions(torch, cuda),
            "bandwidth_gbs": bandwidth, "skipped": skipped,
            "timing": (f"median of {repeats} calls after {warmup} warm-up calls, "
                       + ("CUDA events" if cuda else
                          f"time.perf_counter over blocks of calls of ~{core.CPU_BLOCK_MS:g} ms")
                       + "; fwd under torch.no_grad, fwd+bwd = forward + torch.autograd.grad"
                       + (f"; autograd device threads {args.autograd_threads} (every "
                          "implementation)" if args.autograd_threads else ""))}

    for spec in graph_specs:                    # a typo fails now, not after an hour
        try:
            bgraphs.parse(spec)
        except bgraphs.GraphUnavailable:
            pass                                # recorded as skipped below
        except ValueError as exc:
            raise SystemExit(f"fastgnn bench: {exc}")
        if not cuda:
            _warn_cpu_size(spec, bgraphs.nominal_edges(spec), quick, args)

    records = []
    est = {spec: [_estimate_case_s(spec, d, args.lean_above) for d in dtype_names]
           for spec in graph_specs}
    if cuda:
        total_s = EST_START_S + sum(len(widths) * len(cases) * sum(v) * max(widths) / 128
                                    for v in est.values())
        print(f"fastgnn bench: {len(graph_specs)} graphs x {len(dtype_names)} dtypes x "
              f"{len(widths)} widths x {len(cases)} cases; rough H200 estimate "
              f"{total_s / 60:.1f} min (docs/benchmarks.md, 'Run time')", file=sys.stderr)
    bar = progress(sum(len(widths) * len(cases) * sum(v) for v in est.values()),
                    args.no_progress)
    # (no graph or case starts once --budget-minutes is spent or a failed case
    # lost the CUDA context)
    gate = RowGate(args.budget_minutes, skipped)
    d = os.path.dirname(out_path)
    if d:
        os.makedirs(d, exist_ok=True)
    try:
        for spec in graph_specs:
            bar.set_description_str(f"building {spec}")
            if gate.closed(f"graph {spec}"):
                bar.update(len(widths) * len(cases) * sum(est[spec]))
                continue
            try:
                g = bgraphs.make(spec, torch, device, args.seed, reorder=args.reorder)
            except bgraphs.GraphUnavailable as exc:
                skipped.append(f"graph {spec}: {exc}")
                print(f"fastgnn bench: skipping graph {spec}: {exc}", file=sys.stderr)
                bar.update(len(widths) * len(cases) * sum(est[spec]))
                continue
            except Exception as exc:  # noqa: BLE001 - out of memory building it, a bad file
                records.append(failure_record(meta, device, spec, "(graph build)", exc))
                print(f"fastgnn bench: graph {spec} failed: {core.describe(exc)}", file=sys.stderr)
                core.free_memory(torch, full=True)
                bar.update(len(widths) * len(cases) * sum(est[spec]))
                continue
            for width in widths:
                for dname, case_s in zip(dtype_names, est[spec]):
                    for case in cases:
                        row = f"{g.name} {case.name} {SHORT[dname]} F={width}"
                        bar.set_description_str(row)
                        if gate.closed(row):
                            bar.update(case_s)
                            continue
                        before = len(records)
                        try:
                            records += run_case(torch, device, g, case, dname, width, args,
                                                repeats, warmup, bandwidth, meta, skipped)
                        except Exception as exc:  # noqa: BLE001 - e.g. OOM drawing the inputs
                            records.append(failure_record(meta, device, g.name, case.name, exc,
                                                          g=g, case=case, dtype=SHORT[dname],
                                                          width=width))
                            core.free_memory(torch, full=True)
                        errors = [core.reason(r.get("errors")) for r in records[before:]
                                  if "error" in (r.get("status") or {}).values()]
                        if errors:
                            gate.after_failure(torch, device, row, errors[0])
                        bar.update(case_s)
            del g
            core.free_memory(torch)
            write_json(out_path, records)      # a run cut short keeps what it measured
    finally:
        bar.close()

    from . import report
    report.add_speedups(records)
    write_json(out_path, records)
    md_path = os.path.splitext(out_path)[0] + ".md"
    report.render(records, md_path, meta, with_plots=not args.no_plots)
    print(report.table(records, compact=True) if records else "(no measurements)")
    print(f"\n{len(records)} records -> {out_path}")
    print("\n".join(report.terminal_summary(
        records, md_path, None if args.no_plots else report.plots_dir(md_path))))
    if not any(r.get("fwd_ms") is not None or r.get("fwd_bwd_ms") is not None for r in records):
        print(nothing_measured(skipped, records, md_path), file=sys.stderr)
        return 1
    return 0


def nothing_measured(skipped, records, md_path):
    """Why a run measured nothing, and what to do about it."""
    lines = [f"fastgnn bench: nothing was measured (the report {md_path} lists it all):"]
    lines += list(dict.fromkeys(
        f"  {r['graph']} {r['case']}: {r.get('reason') or r['status']['fwd']}" for r in records))
    lines += [f"  {note}" for note in skipped if note.startswith("graph ")]
    if any("not found" in note for note in skipped):
        lines.append(f"  real graphs are looked up by name under --datasets DIR and "
                     f"${DATASETS_ENV}; generated ones (rmat12, clustered12, ...) need no files")
    elif len(lines) == 1:
        lines.append("  no case ran: check --ops, --layers, --impls and --budget-minutes")
    return "\n".join(lines)


def _estimate_case_s(spec, dtype_name, lean_above):
    """Rough H200 seconds of one case on graph `spec` in one dtype at F=128."""
    from .graphs import nominal_edges
    edges = nominal_edges(spec) or EST_FILE_EDGES
    lean = lean_above is not None and dtype_name != "float32" and edges > lean_above
    return EST_CASE_S + (EST_PER_MEDGE_LEAN_S if lean else EST_PER_MEDGE_S) * edges / 1e6


def failure_record(meta, device, graph, case_name, exc, *, g=None, case=None, dtype=None,
                   width=None):
    """A record for something that failed outside an implementation (building
    the graph, drawing a case's inputs): status oom / unsupported / error."""
    status = core.classify(exc)
    return {"gpu": meta["gpu"], "device": str(device), "versions": meta["versions"],
            "graph": graph, "graph_stats": g.stats if g is not None else None,
            "graph_source": g.source if g is not None else None,
            "case": case_name, "kind": "setup" if case is not None else "graph",
            "family": case.family if case is not None else None,
            "op": None, "layer": None, "impl": "-", "fastgnn": False, "settings": None,
            "dtype": dtype, "width": width, "fwd_ms": None, "fwd_bwd_ms": None,
            "peak_mib": None, "rel_err": None, "path": None, "floor_ms": None,
            "status": {"fwd": status, "fwd_bwd": status},
            "errors": {"setup": core.describe(exc)}, "reason": core.reason({"setup": core.describe(exc)}),
            "command": meta["command"]}


def run_case(torch, device, g, case, dname, width, args, repeats, warmup, bandwidth, meta, skipped):
    """All implementations of one case on one graph, dtype and width -> records."""
    dtype = getattr(torch, dname)
    gen = torch.Generator(device=device).manual_seed(args.seed + 1)
    x = torch.randn(g.num_nodes, width, generator=gen, device=device).to(dtype)
    grad_out = torch.randn(g.num_nodes, width, generator=gen, device=device).to(dtype)
    ctx = core.Ctx(torch, device, dtype, SHORT[dname], width, g, x, x.float(), grad_out, args.seed)
    ctx.heads = getattr(args, "heads", 4)              # attention family: H heads x F/H
    ctx.compile = getattr(args, "compile", None)       # layer cases: + PyG under torch.compile
    ctx.compile_dynamic = getattr(args, "compile_dynamic", False)
    lean = getattr(args, "lean_above", None)
    lean = lean is not None and dname != "float32" and g.stats["num_edges"] > lean

    ref_out, ref_grad, ref_err = core.run_reference(torch, ctx, case)
    ctx.x_ref = None                                   # not held while timing
    impls = []
    for impl in case.impls(ctx):
        if device.type not in impl.devices:
            continue
        if args.impls and not any(s in impl.name for s in args.impls):
            continue
        if lean and impl.per_edge and not impl.fastgnn:
            note = (f"{g.name} {SHORT[dname]}: baselines that materialise per-edge tensors "
                    f"skipped (--lean-above {args.lean_above:,}: fp32 only on larger graphs)")
            if note not in skipped:
                skipped.append(note)
            continue
        why = impl.available()
        if why:
            note = f"{case.name} / {impl.name}: {why}"
            if note not in skipped:
                skipped.append(note)
            continue
        impls.append(impl)

    floor = case.floor_bytes(ctx) if case.floor_bytes else None
    records = []
    for impl in impls:
        res = core.measure(torch, ctx, impl, ref_out, ref_grad, repeats=repeats, warmup=warmup)
        rec = {"gpu": meta["gpu"], "device": str(device), "versions": meta["versions"],
               "graph": g.name, "graph_stats": g.stats, "graph_source": g.source,
               "case": case.name, "kind": case.kind, "family": case.family,
               "op": case.name if case.kind == "op" else None,
               "layer": case.name if case.kind == "layer" else None,
               "impl": impl.name, "fastgnn": impl.fastgnn, "settings": impl.settings,
               "dtype": SHORT[dname], "width": width}
        rec.update(res)
        rec["bytes_fwd"], rec["bytes_fwd_bwd"] = floor if floor else (None, None)
        rec["floor_ms"] = rec["floor_fwd_bwd_ms"] = rec["floor_frac"] = rec["floor_frac_fwd_bwd"] = None
        if floor and bandwidth:
            rec["floor_ms"] = floor[0] / (bandwidth * 1e9) * 1e3
            rec["floor_fwd_bwd_ms"] = floor[1] / (bandwidth * 1e9) * 1e3
            if rec["fwd_ms"]:
                rec["floor_frac"] = round(rec["floor_ms"] / rec["fwd_ms"], 4)
            if rec["fwd_bwd_ms"]:
                rec["floor_frac_fwd_bwd"] = round(rec["floor_fwd_bwd_ms"] / rec["fwd_bwd_ms"], 4)
        rec["bandwidth_gbs"] = bandwidth
        rec["reference"] = ("float32 " + ("chunked gather/index_add_" if case.kind == "op"
                                          else "PyG layer on edge_index")
                            + " on the dtype-rounded inputs")
        if ref_err:
            rec["errors"]["reference"] = ref_err
        rec.setdefault("path", None)
        rec.update({"repeats": repeats, "warmup": warmup, "seed": args.seed,
                    "command": meta["command"]})
        records.append(rec)
    del ctx, x, grad_out, ref_out, ref_grad
    core.free_memory(torch)
    return records


if __name__ == "__main__":
    sys.exit(main())
