"""Benchmark reports: markdown tables, a headline summary and PNG plots.

`python -m fastgnn.bench` writes one beside its JSON. To rebuild a report from
JSON files that exist already (nothing is run, no GPU needed):

    python -m fastgnn.bench.report benchmarks/results/suite_full_h200.json \\
        --out benchmarks/results/suite_full_h200.md

writes that report and its plots in benchmarks/results/suite_full_h200_plots/
(speedup.png, time_vs_edges.png, peak_memory.png, floor_efficiency.png).
Records that appear in several files (same graph, case, dtype, width and
implementation) are taken from the last file. Plots need matplotlib (Agg,
no display); without it the report says so and has tables only.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import Counter, OrderedDict

# family-specific summaries: functions records -> markdown lines, appended by
# the case modules on import and written after the headline tables
SUMMARIES: list = []
# README tables of other record kinds: kind -> function(records, models) ->
# markdown, registered by their suite's module on import ("training")
README_TABLES: dict = {}

PLOT_DPI = 72


def _fmt_ms(rec, key, phase):
    v = rec.get(key)
    if v is not None:
        return f"{v:.3f}" if v < 10 else f"{v:.1f}"
    st = (rec.get("status") or {}).get(phase)
    return st or "-"


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def _s(v):
    return "-" if v is None else str(v)


def groups(records):
    """OrderedDict (graph, case, dtype, width) -> records, in run order."""
    out = OrderedDict()
    for r in records:
        out.setdefault((r["graph"], r["case"], r.get("dtype"), r.get("width")), []).append(r)
    return out


def add_speedups(records):
    """Set speedup_fwd / speedup_fwd_bwd on every record: best baseline time
    (fastest non-fastgnn implementation of the same group) / this time."""
    for recs in groups(records).values():
        for key, out in (("fwd_ms", "speedup_fwd"), ("fwd_bwd_ms", "speedup_fwd_bwd")):
            base = [r[key] for r in recs if not r.get("fastgnn") and r.get(key) is not None]
            best = min(base) if base else None
            best_impl = next((r["impl"] for r in recs if not r.get("fastgnn") and r.get(key) == best),
                             None) if base else None
            for r in recs:
                r[out] = (round(best / r[key], 3) if best is not None and r.get(key) else None)
                r[f"best_baseline_{key.replace('_ms', '')}"] = best_impl


def _reason(rec, limit=None):
    """Why a record failed (its `reason`, else its errors), '' when it did not."""
    text = rec.get("reason")
    if text is None and rec.get("errors"):
        text = "; ".join(dict.fromkeys(str(m) for m in rec["errors"].values()))
    text = (text or "").replace("|", "/")
    return text if limit is None or len(text) <= limit else text[:limit - 3] + "..."


def table(records, compact=False):
    """One markdown table; compact drops the settings-independent detail columns.
    A last column gives the reason of any failure (cut short when compact)."""
    head = ["graph", "case", "dtype", "F", "impl", "fwd ms", "fwd+bwd ms", "peak MiB",
            "x fwd", "x fwd+bwd"]
    if not compact:
        head += ["floor ms (fwd)", "floor frac fwd", "rel err", "rel err grad", "path"]
    why = any(_reason(r) for r in records)
    if why:
        head.append("failure reason")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        row = [r["graph"], r["case"], _s(r.get("dtype")), _s(r.get("width")), _s(r.get("impl")),
               _fmt_ms(r, "fwd_ms", "fwd"), _fmt_ms(r, "fwd_bwd_ms", "fwd_bwd"),
               _fmt(r.get("peak_mib"), ".0f"),
               _fmt(r.get("speedup_fwd"), ".2f"), _fmt(r.get("speedup_fwd_bwd"), ".2f")]
        if not compact:
            row += [_fmt(r.get("floor_ms"), ".3f"), _fmt(r.get("floor_frac"), ".2f"),
                    _fmt(r.get("rel_err"), ".1e"), _fmt(r.get("rel_err_grad"), ".1e"),
                    str(r.get("path") or "")]
        if why:
            row.append(_reason(r, 70 if compact else None))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------ headline


def measured(records):
    """Records of real measurements (not graph-build / case-setup failures)."""
    return [r for r in records if r.get("kind") in ("op", "layer")]


def headline_rows(records):
    """[(group key, fastgnn record, {phase: best baseline record})] per group with
    a fastgnn row: the first fastgnn implementation in run order (the default
    one: fastgnn[auto] / fastgnn[edge_index] / fastgnn), never the best of
    several forced paths."""
    rows = []
    for key, recs in groups(measured(records)).items():
        fg = next((r for r in recs if r.get("fastgnn")), None)
        if fg is None:
            continue
        best = {}
        for k in ("fwd_ms", "fwd_bwd_ms"):
            base = [r for r in recs if not r.get("fastgnn") and r.get(k) is not None]
            best[k] = min(base, key=lambda r: r[k]) if base else None
        rows.append((key, fg, best))
    return rows


def _geomean(vals):
    vals = [v for v in vals if v]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def headline(records):
    """Markdown lines (summary, details): the geometric-mean speedups per case,
    dtype and width, and per graph fastgnn's default implementation against
    the fastest baseline."""
    rows = headline_rows(records)
    if not rows:
        return [], []
    out = ["## Headline: fastgnn against the fastest baseline", "",
           "Per case, dtype and width: fastgnn's default implementation against the fastest "
           "baseline of the same graph (chosen per phase), times in ms; x = baseline time / "
           "fastgnn time (> 1: fastgnn is faster); peak = peak device MiB of fastgnn / of the "
           "fastest fwd+bwd baseline (GPU runs only).", ""]
    by_case = OrderedDict()
    for key, fg, best in rows:
        by_case.setdefault((key[1], key[2], key[3]), []).append((key, fg, best))
    summary = ["| case | dtype | F | graphs | geomean x fwd | geomean x fwd+bwd | min x fwd+bwd |",
               "|---|---|---|---|---|---|---|"]
    for (case, dtype, width), items in by_case.items():
        out += [f"### {case}, {dtype}, F = {width}", "",
                "| graph | edges | fastgnn | fwd | fwd+bwd | fastest baseline fwd | fwd+bwd "
                "| x fwd | x fwd+bwd | peak MiB |", "|---|---|---|---|---|---|---|---|---|---|"]
        sf, sb = [], []
        for key, fg, best in items:
            bf, bb = best["fwd_ms"], best["fwd_bwd_ms"]
            edges = (fg.get("graph_stats") or {}).get("num_edges")
            peak = "-"
            if fg.get("peak_mib") is not None:
                peak = f"{fg['peak_mib']:.0f} / {_fmt(bb.get('peak_mib') if bb else None, '.0f')}"
            out.append(
                f"| {key[0]} | {_fmt(edges, ',')} | {fg['impl']} | {_fmt_ms(fg, 'fwd_ms', 'fwd')} | "
                f"{_fmt_ms(fg, 'fwd_bwd_ms', 'fwd_bwd')} | "
                + (f"{_fmt_ms(bf, 'fwd_ms', 'fwd')} {bf['impl']}" if bf else "-") + " | "
                + (f"{_fmt_ms(bb, 'fwd_bwd_ms', 'fwd_bwd')} {bb['impl']}" if bb else "-") + " | "
                f"{_fmt(fg.get('speedup_fwd'), '.2f')} | {_fmt(fg.get('speedup_fwd_bwd'), '.2f')} | "
                f"{peak} |")
            sf.append(fg.get("speedup_fwd"))
            sb.append(fg.get("speedup_fwd_bwd"))
        out.append("")
        got_b = [v for v in sb if v]
        summary.append(f"| {case} | {dtype} | {width} | {len(items)} | {_fmt(_geomean(sf), '.2f')} | "
                       f"{_fmt(_geomean(sb), '.2f')} | {_fmt(min(got_b) if got_b else None, '.2f')} |")
    return ["## Summary: geometric mean speedup over graphs", "",
            "fastgnn's default implementation against the fastest baseline, per case, dtype and "
            "width (details in the headline tables below).", ""] + summary + [""], out


# a row's repeats disagree when its median is this many times its best
NOISY_MEDIAN_OVER_BEST = 1.5


def row_flags(rec):
    """Why a measurement looks wrong (empty when it does not): a forward+
    backward faster than the forward alone (it contains the forward), or
    repeats whose median is over NOISY_MEDIAN_OVER_BEST times their best
    (warm-up, another process, clock changes)."""
    flags = []
    fwd, both = rec.get("fwd_ms"), rec.get("fwd_bwd_ms")
    if fwd and both and both < 0.95 * fwd:
        flags.append(f"fwd+bwd {both:.3g} ms < fwd {fwd:.3g} ms")
    for key, label in (("fwd_ms", "fwd"), ("fwd_bwd_ms", "fwd+bwd")):
        med, best = rec.get(key), rec.get(f"{key}_min")
        if med and best and med > NOISY_MEDIAN_OVER_BEST * best:
            flags.append(f"{label} repeats disagree (median {med:.3g} ms, best {best:.3g} ms)")
    return flags


def flagged_section(records):
    """Markdown lines listing the flagged measurements (`row_flags`)."""
    rows = [(r, row_flags(r)) for r in measured(records)]
    rows = [(r, f) for r, f in rows if f]
    if not rows:
        return []
    out = ["## Flagged measurements", "",
           "Rows whose timings contradict themselves; rerun them before trusting their x.", "",
           "| graph | case | dtype | F | impl | why |", "|---|---|---|---|---|---|"]
    out += [f"| {r['graph']} | {r['case']} | {r.get('dtype')} | {r.get('width')} | {r['impl']} | "
            f"{'; '.join(f)} |" for r, f in rows]
    return out + [""]


def terminal_summary(records, md_path, plots=None):
    """The lines a run ends with in the terminal: per op family and per
    layer, fastgnn's default implementation against the fastest baseline of
    each row (graph, case, dtype, width): rows, geometric-mean speedup
    forward and forward+backward, and the worst forward+backward row; what
    x means; where the full report (and the plots) are."""
    per = OrderedDict()
    for (graph, case, dtype, width), fg, _ in headline_rows(records):
        name = fg.get("layer") or fg.get("family") or case
        what = "layer" if fg.get("kind") == "layer" else "ops"
        per.setdefault((what, name), []).append(((graph, case, dtype, width), fg))
    lines = ["", "fastgnn against the fastest baseline, per row (x = baseline ms / fastgnn ms; "
             "> 1: fastgnn is faster):"]
    if not per:
        lines.append("  (no row has both fastgnn and a baseline)")
    else:
        lines.append(f"  {'':26s} {'rows':>4s} {'x fwd':>7s} {'x fwd+bwd':>9s}   worst x fwd+bwd")
    for (what, name), rows in per.items():
        sf = [fg.get("speedup_fwd") for _, fg in rows]
        sb = [(fg.get("speedup_fwd_bwd"), key) for key, fg in rows if fg.get("speedup_fwd_bwd")]
        worst = "-"
        if sb:
            x, (graph, case, dtype, width) = min(sb, key=lambda t: t[0])
            worst = f"{x:.2f} ({case} on {graph}, {dtype}, F={width})"
        gb = _geomean([x for x, _ in sb])
        lines.append(f"  {what + ' ' + str(name):26s} {len(rows):4d} {_fmt(_geomean(sf), '.2f'):>7s} "
                     f"{_fmt(gb, '.2f'):>9s}   {worst}")
    flagged = sum(1 for r in measured(records) if row_flags(r))
    if flagged:
        lines.append(f"{flagged} measurement(s) flagged as contradicting themselves: see "
                     "\"Flagged measurements\" in the report")
    lines.append(f"full report: {md_path}" + (f" (plots in {plots})" if plots else ""))
    return lines


# ------------------------------------------------------------------ README table

# baseline columns of the README table: label -> implementation name prefixes
README_BASELINES = (("PyG", ("pyg", "torch.sparse")), ("turbo-gnn", ("turbo-gnn",)),
                    ("DGL", ("dgl",)))


def _fastest(recs, prefixes):
    got = [r for r in recs if not r.get("fastgnn") and r.get("fwd_bwd_ms") is not None
           and str(r.get("impl", "")).startswith(prefixes)]
    return min(got, key=lambda r: r["fwd_bwd_ms"]) if got else None


def _cell(rec, form=False):
    if rec is None:
        return "-"
    ms = rec["fwd_bwd_ms"]
    text = f"{ms:.3g} ms" if ms < 100 else f"{ms:.0f} ms"
    peak = rec.get("peak_mib")
    if peak is not None:
        text += f", {peak / 1024:.2f} GiB" if peak >= 1024 else f", {peak:.0f} MiB"
    if form:
        text += f" `{rec['impl']}`"
    return text


def _ratio_x(base, fg):
    if base is None or fg is None or not fg.get("fwd_bwd_ms"):
        return None
    return base["fwd_bwd_ms"] / fg["fwd_bwd_ms"]


def readme_table(records, dtype="fp32", graph=None):
    """Markdown for the README: per level (op, layer) one row per case with
    fwd+bwd time and peak memory on one graph (default: the largest measured)
    for fastgnn's default implementation, the fastest PyG form (PyG layers /
    PyG-style ops / torch.sparse.mm), turbo-gnn and DGL (columns only where
    measured), fastgnn's speedup over each on that graph, and the geometric
    mean of its speedup over PyG across every graph measured."""
    recs = [r for r in measured(records) if r.get("dtype") == dtype]
    if not recs:
        return f"(no {dtype} measurements)"
    widths = Counter(r.get("width") for r in recs)
    width = widths.most_common(1)[0][0]
    recs = [r for r in recs if r.get("width") == width]
    edges = {r["graph"]: (r.get("graph_stats") or {}).get("num_edges") or 0 for r in recs}
    graph = graph or max(edges, key=edges.get)
    if graph not in edges:
        return f"(graph {graph!r} has no {dtype} measurements; have {', '.join(edges)})"
    by = groups(recs)
    cols = [(label, pre) for label, pre in README_BASELINES
            if any(str(r.get("impl", "")).startswith(pre) and r.get("fwd_bwd_ms") is not None
                   for r in recs)]
    out = [f"fwd+bwd time and peak device memory on {graph} ({edges[graph]:,} edges), {dtype}, "
           f"F = {width}; x = baseline time / fastgnn time; geomean over the graphs where both "
           "ran. GPU: " + ", ".join(dict.fromkeys(str(r.get("gpu")) for r in recs)) + ".", ""]
    for kind, title in (("op", "op"), ("layer", "layer")):
        cases = list(OrderedDict.fromkeys(r["case"] for r in recs if r.get("kind") == kind))
        if not cases:
            continue
        head = [title, "fastgnn"] + [f"{label} (fastest form)" if label == "PyG" else label
                                     for label, _ in cols]
        head += [f"x vs {label}" for label, _ in cols] + ["x vs PyG, geomean (graphs)"]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for case in cases:
            here = by.get((graph, case, dtype, width), [])
            fg = next((r for r in here if r.get("fastgnn") and r.get("fwd_bwd_ms") is not None),
                      None)
            bases = [_fastest(here, pre) for _, pre in cols]
            sp = []
            for (g, c, _, _), rs in by.items():
                if c == case:
                    f = next((r for r in rs if r.get("fastgnn")), None)
                    sp.append(_ratio_x(_fastest(rs, ("pyg", "torch.sparse")), f))
            got = [v for v in sp if v]
            row = [case, _cell(fg)] + [_cell(b, form=label == "PyG")
                                       for b, (label, _) in zip(bases, cols)]
            row += [_fmt(_ratio_x(b, fg), ".2f") + ("x" if _ratio_x(b, fg) else "")
                    for b in bases]
            row.append(f"{_geomean(got):.2f}x ({len(got)})" if got else "-")
            out.append("| " + " | ".join(row) + " |")
        out.append("")
    return "\n".join(out)


# ------------------------------------------------------------------ graphs


def graphs_table(records):
    graphs = OrderedDict()
    for r in records:
        if r.get("graph_stats") and r["graph"] not in graphs:
            graphs[r["graph"]] = r
    if not graphs:
        return []
    out = ["## Graphs", "",
           "skew = max / mean in-degree; Gini of the in-degrees (0 = regular, -> 1 = all edges "
           "into a few nodes); span = mean |src - dst| / n (small = neighbours have nearby ids); "
           "isolated = nodes without any edge.", "",
           "| graph | nodes | edges | max in-deg | mean in-deg | skew | Gini | span | isolated | source |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in graphs.items():
        s = r["graph_stats"]
        skew = s.get("in_degree_skew")
        if skew is None and s.get("mean_in_degree"):
            skew = round(s["max_in_degree"] / s["mean_in_degree"], 1)
        out.append(f"| {name} | {s['num_nodes']:,} | {s['num_edges']:,} | {s['max_in_degree']:,} | "
                   f"{s['mean_in_degree']} | {_fmt(skew, '.4g')} | "
                   f"{_fmt(s.get('in_degree_gini'), '.3f')} | {_fmt(s.get('edge_span_mean'), '.2g')} | "
                   f"{_fmt(s.get('isolated_nodes'), ',')} | {r.get('graph_source', '')} |")
    if any("in_degree_gini" not in r["graph_stats"] for r in graphs.values()):
        out += ["", "(-: not recorded by the fastgnn version that made these records; current "
                "versions record every column.)"]
    out.append("")
    return out


# ------------------------------------------------------------------ plots


def _matplotlib():
    """(Figure, FigureCanvasAgg) without touching pyplot's global backend, or None."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except Exception:  # noqa: BLE001
        return None
    return Figure, FigureCanvasAgg


def _save(fig, canvas_cls, path):
    canvas_cls(fig)
    fig.savefig(path, dpi=PLOT_DPI, pil_kwargs={"optimize": True})


def _colours(names):
    import matplotlib
    if len(names) <= 10:
        cmap = matplotlib.colormaps["tab10"]
        return {n: cmap(i) for i, n in enumerate(names)}
    cmap = matplotlib.colormaps["tab20"]        # dark shades first, then the light ones
    order = list(range(0, 20, 2)) + list(range(1, 20, 2))
    return {n: cmap(order[i % 20]) for i, n in enumerate(names)}


def _plain_log_ticks(ax, axis="y"):
    """Log axis with plain numbers (0.5, 1, 2, 10) instead of 10^x labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    a = ax.yaxis if axis == "y" else ax.xaxis
    a.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    a.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    a.set_minor_formatter(NullFormatter())


def _main_setting(recs):
    """(dtype, width) most plots use: fp32 when present, the most common width."""
    dtypes = [r.get("dtype") for r in recs]
    dtype = "fp32" if "fp32" in dtypes else Counter(dtypes).most_common(1)[0][0]
    widths = Counter(r.get("width") for r in recs if r.get("dtype") == dtype)
    return dtype, widths.most_common(1)[0][0]


def _panels(n, ncols):
    ncols = max(1, min(ncols, n))
    return math.ceil(n / ncols), ncols


def _bars(ax, graphs, series, values, colours, log=False):
    """Grouped bars: graphs on x, one bar per series (values[(graph, s)])."""
    k = max(1, len(series))
    w = 0.8 / k
    for j, s in enumerate(series):
        xs = [i + (j - (k - 1) / 2) * w for i in range(len(graphs))]
        ys = [values.get((g, s)) for g in graphs]
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None and y > 0]
        if pts:
            ax.bar([p[0] for p in pts], [p[1] for p in pts], w, color=colours[s], label=str(s))
    ax.set_xticks(range(len(graphs)))
    ax.set_xticklabels(graphs, rotation=30, ha="right", fontsize=8)
    if log:
        ax.set_yscale("log")
        _plain_log_ticks(ax)
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(axis="y", alpha=0.3)


def _layout(fig, nrows, ncols, *, bottom, top=0.6, left=0.75, right=0.15, gap_h=1.0, gap_w=0.65):
    """Fixed margins in inches (tight_layout measures every label: slow)."""
    w, h = fig.get_figwidth(), fig.get_figheight()
    ax_h = max(0.5, (h - top - bottom - (nrows - 1) * gap_h) / nrows)
    ax_w = max(0.5, (w - left - right - (ncols - 1) * gap_w) / ncols)
    fig.subplots_adjust(left=left / w, right=1 - right / w, bottom=bottom / h, top=1 - top / h,
                        hspace=gap_h / ax_h, wspace=gap_w / ax_w)


def _legend(fig, axes, ncol=4):
    handles, labels = {}, []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    if handles:
        fig.legend([handles[lab] for lab in labels], labels, loc="lower center",
                   ncol=min(ncol, len(labels)), fontsize=8, frameon=False)
    return len(labels)


def plot_speedup(records, path, mpl):
    rows = headline_rows(records)
    if not rows:
        return None
    Figure, Canvas = mpl
    graphs = list(OrderedDict.fromkeys(k[0] for k, _, _ in rows))
    settings = list(OrderedDict.fromkeys((k[2], k[3]) for k, _, _ in rows))
    many_w = len({w for _, w in settings}) > 1
    cases = list(OrderedDict.fromkeys(k[1] for k, _, _ in rows))
    colours = _colours(cases)
    fig = Figure(figsize=(11, 2.3 * len(settings) + 1.7))
    axes = []
    for i, (dtype, width) in enumerate(settings):
        for j, (phase, label) in enumerate((("speedup_fwd", "forward"),
                                            ("speedup_fwd_bwd", "forward + backward"))):
            ax = fig.add_subplot(len(settings), 2, 2 * i + j + 1)
            vals = {(k[0], k[1]): fg.get(phase) for k, fg, _ in rows
                    if (k[2], k[3]) == (dtype, width)}
            here = [g for g in graphs if any(g == k[0] for k in vals)]
            _bars(ax, here, [c for c in cases if any(c == k[1] for k in vals)], vals, colours,
                  log=True)
            ax.axhline(1.0, color="black", lw=0.8)
            ax.set_title(f"{label}, {dtype}" + (f", F={width}" if many_w else ""), fontsize=9)
            if j == 0:
                ax.set_ylabel("speedup vs fastest baseline", fontsize=8)
            axes.append(ax)
    nl = _legend(fig, axes, ncol=7)
    fig.suptitle("fastgnn speedup over the fastest baseline (log scale, > 1 = faster)", fontsize=10)
    _layout(fig, len(settings), 2, bottom=0.95 + 0.17 * math.ceil(nl / 7), gap_h=1.1)
    _save(fig, Canvas, path)
    return "speedup per graph and case (fastgnn's default implementation / fastest baseline)"


def _case_panels(records, value, path, mpl, title, ylabel, *, kind=None, log=True, line=False,
                 ylim=None, ncols=4):
    recs = [r for r in measured(records) if kind is None or r.get("kind") == kind]
    if not recs:
        return None
    dtype, width = _main_setting(recs)
    recs = [r for r in recs if r.get("dtype") == dtype and r.get("width") == width]
    vals = [(r, value(r)) for r in recs]
    vals = [(r, v) for r, v in vals if v is not None and v > 0]
    if not vals:
        return None
    Figure, Canvas = mpl
    cases = list(OrderedDict.fromkeys(r["case"] for r, _ in vals))
    impls = list(OrderedDict.fromkeys(r["impl"] for r, _ in vals if r.get("fastgnn")))
    impls += list(OrderedDict.fromkeys(r["impl"] for r, _ in vals if not r.get("fastgnn")))
    colours = _colours(impls)
    nr, nc = _panels(len(cases), ncols)
    fig = Figure(figsize=(3.4 * nc + 0.6, 2.4 * nr + 1.9))
    axes = []
    for i, case in enumerate(cases):
        ax = fig.add_subplot(nr, nc, i + 1)
        cv = [(r, v) for r, v in vals if r["case"] == case]
        if line:
            for impl in impls:
                pts = sorted(((r.get("graph_stats") or {}).get("num_edges"), v, r["graph"])
                             for r, v in cv if r["impl"] == impl)
                pts = [p for p in pts if p[0]]
                fg = any(r.get("fastgnn") for r, _ in cv if r["impl"] == impl)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-" if fg else "s--",
                            ms=3.5, lw=1.4 if fg else 1, color=colours[impl], label=impl)
            ax.set_xscale("log")
            ax.set_yscale("log")
            _plain_log_ticks(ax)
            ax.tick_params(labelsize=8)
            ax.grid(alpha=0.3)
            ax.set_xlabel("edges", fontsize=8)
        else:
            graphs = list(OrderedDict.fromkeys(r["graph"] for r, _ in cv))
            _bars(ax, graphs, [i_ for i_ in impls if any(r["impl"] == i_ for r, _ in cv)],
                  {(r["graph"], r["impl"]): v for r, v in cv}, colours, log=log)
            if ylim:
                ax.set_ylim(*ylim)
        ax.set_title(case, fontsize=9)
        if i % nc == 0:
            ax.set_ylabel(ylabel, fontsize=8)
        axes.append(ax)
    nl = _legend(fig, axes, ncol=4)
    fig.suptitle(f"{title} ({dtype}, F={width})", fontsize=10)
    _layout(fig, nr, nc, bottom=(0.75 if line else 0.95) + 0.17 * math.ceil(nl / 4),
            gap_h=0.95 if line else 1.1)
    _save(fig, Canvas, path)
    return f"{title.lower()} ({dtype}, F = {width})"


def plots(records, outdir):
    """Write the PNG plots into outdir; returns ([(caption, file name)], notes)."""
    mpl = _matplotlib()
    if mpl is None:
        return [], ["(no plots: matplotlib is not installed; `pip install matplotlib`)"]
    os.makedirs(outdir, exist_ok=True)
    made, notes = [], []

    def t(r):
        return r.get("fwd_bwd_ms") if r.get("fwd_bwd_ms") is not None else r.get("fwd_ms")

    jobs = [
        ("speedup.png", lambda p: plot_speedup(records, p, mpl), "no fastgnn rows with a baseline"),
        ("time_vs_edges.png",
         lambda p: _case_panels(records, t, p, mpl, "Time vs edges", "fwd+bwd ms (fwd if none)",
                                line=True), "no timings"),
        ("peak_memory.png",
         lambda p: _case_panels(records, lambda r: r.get("peak_mib"), p, mpl,
                                "Peak device memory", "peak MiB (fwd+bwd)", log=True),
         "no peak device memory recorded (CPU run)"),
        ("floor_efficiency.png",
         lambda p: _case_panels(records, lambda r: r.get("floor_frac_fwd_bwd") or r.get("floor_frac"),
                                p, mpl, "Efficiency vs the bytes floor", "floor / measured (fwd+bwd)",
                                kind="op", log=False, ylim=(0, 1)),
         "no bytes-floor fractions (CPU run, or no --bandwidth)"),
    ]
    for fname, job, why in jobs:
        path = os.path.join(outdir, fname)
        try:
            caption = job(path)
        except Exception as exc:  # noqa: BLE001 - a plot never loses the report
            notes.append(f"({fname} failed: {type(exc).__name__}: {exc})")
            continue
        if caption is None:
            if os.path.exists(path):
                os.remove(path)
            notes.append(f"({fname}: {why})")
        else:
            made.append((caption, fname))
    return made, notes


# ------------------------------------------------------------------ report


def _as_list(v):
    return v if isinstance(v, list) else [v]


def markdown(records, meta, plot_links=None, plot_notes=None):
    """The full report: header, summary and headline tables, plots, family
    summaries, graphs, every measurement, settings, failures, skips."""
    cmds = _as_list(meta.get("command"))
    title = meta.get("title") or f"fastgnn benchmark: {meta['gpu']}"
    out = [f"# {title}", ""]
    if meta.get("generated"):
        out += [meta["generated"], ""]
    out += [("Command: " if len(cmds) == 1 else "Commands:") + (
                f" `{cmds[0]}`  " if len(cmds) == 1 else "")]
    if len(cmds) > 1:
        out += [""] + [f"- `{c}`" for c in cmds] + [""]
    versions = meta.get("versions") or {}
    out += [f"Versions: {', '.join(f'{k} {v}' for k, v in versions.items())}  ",
            f"Timing: {meta['timing']}  ",
            "Speedup columns (x): fastest baseline's time / this row's time, per graph, case, "
            "dtype and width (>1 = faster than every baseline). Floor (ops): bytes the op must "
            "move (x read once, out written once, CSR read once; twice for fwd+bwd) "
            + (f"at {meta['bandwidth_gbs']:g} GB/s; frac = floor / measured."
               if meta.get("bandwidth_gbs") else "(not converted to time on the CPU)."), ""]
    if not records:
        out += ["(no measurements)", ""]
    summary, details = headline(records)
    out += summary
    out += flagged_section(records)
    if plot_links or plot_notes:
        out += ["## Plots", ""]
        for caption, rel in plot_links or []:
            out += [f"![{caption}]({rel})", "", f"*{caption}*", ""]
        out += list(plot_notes or []) + ([""] if plot_notes else [])
    out += details
    for summary in SUMMARIES:
        try:
            out += summary(measured(records))
        except Exception as exc:  # noqa: BLE001 - a summary never loses the results
            out += [f"(summary {getattr(summary, '__name__', summary)} failed: {exc!r})", ""]
    out += graphs_table(records)
    if records:
        out += ["## All measurements", "", table(records), ""]
    settings = OrderedDict(((r["case"], r["impl"]), r.get("settings"))
                           for r in measured(records))
    if settings:
        out += ["## Implementations and their settings", ""]
        out += [f"- **{c} / {i}**: {s}" for (c, i), s in settings.items()]
        out.append("")
    failures = [r for r in records if r.get("errors")]
    if failures:
        out += ["## Failures", ""]
        for r in failures:
            for phase, msg in r["errors"].items():
                out.append(f"- {r['graph']} {r['case']} {_s(r.get('dtype'))} F={_s(r.get('width'))} "
                           f"{_s(r.get('impl'))} [{phase}: "
                           f"{(r.get('status') or {}).get(phase, 'error')}]: {msg}")
        out.append("")
    if meta.get("skipped"):
        out += ["## Skipped", ""] + [f"- {s}" for s in meta["skipped"]] + [""]
    return "\n".join(out)


def plots_dir(md_path):
    return os.path.splitext(md_path)[0] + "_plots"


def render(records, md_path, meta=None, with_plots=True):
    """Write the markdown report to md_path and (with_plots) its PNGs into
    <md stem>_plots/ beside it, linked relatively. Returns md_path."""
    meta = meta or meta_from_records(records)
    links, notes = [], []
    if with_plots and measured(records):
        pdir = plots_dir(md_path)
        made, notes = plots(records, pdir)
        rel = os.path.basename(pdir)
        links = [(c, f"{rel}/{f}") for c, f in made]
    d = os.path.dirname(md_path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(md_path, "w") as f:
        f.write(markdown(records, meta, links, notes))
    return md_path


def meta_from_records(records, sources=()):
    """The report header rebuilt from the records themselves."""
    gpus = list(OrderedDict.fromkeys(r.get("gpu") for r in records if r.get("gpu")))
    cmds = list(OrderedDict.fromkeys(r.get("command") for r in records if r.get("command")))
    versions = next((r["versions"] for r in records if r.get("versions")), {})
    timing = sorted({(r.get("repeats"), r.get("warmup")) for r in records
                     if r.get("repeats") is not None}, key=str)
    cuda = any(str(r.get("device", "")).startswith("cuda") for r in records)
    tim = "; ".join(f"median of {rp} calls after {w} warm-up calls" for rp, w in timing) or "-"
    tim += (", CUDA events" if cuda else ", time.perf_counter over blocks of calls") + \
        "; fwd under torch.no_grad, fwd+bwd = forward + torch.autograd.grad"
    bws = {r.get("bandwidth_gbs") for r in records if r.get("bandwidth_gbs")}
    meta = {"gpu": ", ".join(gpus) or "unknown device", "command": cmds or ["-"],
            "versions": versions, "timing": tim,
            "bandwidth_gbs": bws.pop() if len(bws) == 1 else None, "skipped": []}
    if sources:
        meta["generated"] = ("Generated by `python -m fastgnn.bench.report` from "
                             + ", ".join(f"`{s}` ({n} records)" for s, n in sources)
                             + " (nothing re-run).")
    return meta


def load_records(paths):
    """Records of several JSON files, later files replacing identical
    (graph, case, dtype, width, impl) records; [(path, count)] too."""
    merged, sources = OrderedDict(), []
    for p in paths:
        with open(p) as f:
            recs = json.load(f)
        if not isinstance(recs, list):
            raise ValueError(f"{p}: expected a JSON list of benchmark records")
        sources.append((p, len(recs)))
        for i, r in enumerate(recs):
            key = (r.get("graph"), r.get("case"), r.get("dtype"), r.get("width"), r.get("impl"))
            if r.get("kind") not in ("op", "layer"):
                key = key + (p, i)
            merged[key] = r                     # a replacement keeps the first position
    return list(merged.values()), sources


def _load_case_summaries():
    """Import the case modules so their report summaries register (no torch needed)."""
    import importlib
    for m in ("cases_spmm", "cases_layers", "cases_segment", "cases_attention", "cases_training"):
        try:
            importlib.import_module(f"fastgnn.bench.{m}")
        except Exception:  # noqa: BLE001 - a broken case module loses its summary only
            pass


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fastgnn.bench.report",
                                description="Rebuild a benchmark report (markdown + PNG plots) "
                                            "from JSON records; runs nothing.")
    p.add_argument("json", nargs="+", help="JSON files written by python -m fastgnn.bench")
    p.add_argument("--out",
                   help="markdown path (PATH.md; plots go to PATH_plots/), or a folder "
                        "(then FOLDER/report.md and FOLDER/report_plots/)")
    p.add_argument("--title", help="report title (default: the device)")
    p.add_argument("--no-plots", action="store_true", help="tables only")
    p.add_argument("--readme-table", action="store_true",
                   help="print the compact README table (op and layer level: fastgnn vs PyG's "
                        "fastest form vs turbo-gnn, fwd+bwd time, peak memory, speedups; "
                        "training records: ms per epoch of PyG eager, fastgnn eager and "
                        "captured) instead of writing a report")
    p.add_argument("--dtype", default="fp32", help="--readme-table: dtype (default fp32)")
    p.add_argument("--graph", help="--readme-table: graph whose times are shown (default: the "
                                   "largest measured)")
    p.add_argument("--models", nargs="+", help="--readme-table of training records: the models "
                                               "shown (default: all)")
    args = p.parse_args(argv)
    if not args.readme_table and not args.out:
        p.error("--out is required (or --readme-table)")
    mod = sys.modules.get("fastgnn.bench.report")
    if mod is None:
        import importlib
        mod = importlib.import_module("fastgnn.bench.report")
    mod._load_case_summaries()
    records, sources = mod.load_records(args.json)
    kinds = {r.get("kind") for r in records}
    tables = mod.README_TABLES          # (the imported module's: registrations land there)
    if args.readme_table and len(kinds) == 1 and next(iter(kinds)) in tables:
        print(tables[next(iter(kinds))](records, args.models))
        return 0
    mod.add_speedups(records)
    if args.readme_table:
        print(mod.readme_table(records, args.dtype, args.graph))
        return 0
    out = args.out
    if not out.endswith(".md"):
        out = os.path.join(out, "report.md")
    meta = mod.meta_from_records(records, sources)
    if args.title:
        meta["title"] = args.title
    mod.render(records, out, meta, with_plots=not args.no_plots)
    print(f"{len(records)} records -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def speedup_summary(groups, header):
    """Markdown lines of a suite's summary: `groups` maps a row label to the
    (a, b) fastgnn speedups of its rows (None where missing); each line
    gives the label, the row count, the geometric mean and minimum of the
    a's and the geometric mean of the b's, under `header` (the column
    names). No groups, no lines."""
    if not groups:
        return []
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, vals in groups.items():
        a = [x for x, _ in vals if x]
        out.append(f"| {label} | {len(vals)} | {_fmt(_geomean(a), '.2f')} | "
                   f"{_fmt(min(a) if a else None, '.2f')} | "
                   f"{_fmt(_geomean([y for _, y in vals if y]), '.2f')} |")
    return out
