"""Markdown tables from benchmark records (speedups against the best baseline)."""
from __future__ import annotations

from collections import OrderedDict

# family-specific summaries: functions records -> markdown lines, appended by
# the case modules on import and written after the results table
SUMMARIES: list = []


def _fmt_ms(rec, key, phase):
    v = rec.get(key)
    if v is not None:
        return f"{v:.3f}" if v < 10 else f"{v:.1f}"
    st = rec.get("status", {}).get(phase)
    return st or "-"


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def groups(records):
    """OrderedDict (graph, case, dtype, width) -> records, in run order."""
    out = OrderedDict()
    for r in records:
        out.setdefault((r["graph"], r["case"], r["dtype"], r["width"]), []).append(r)
    return out


def add_speedups(records):
    """Set speedup_fwd / speedup_fwd_bwd on every record: best baseline time
    (fastest non-fastgnn implementation of the same group) / this time."""
    for recs in groups(records).values():
        for key, out in (("fwd_ms", "speedup_fwd"), ("fwd_bwd_ms", "speedup_fwd_bwd")):
            base = [r[key] for r in recs if not r["fastgnn"] and r.get(key) is not None]
            best = min(base) if base else None
            best_impl = next((r["impl"] for r in recs if not r["fastgnn"] and r.get(key) == best),
                             None) if base else None
            for r in recs:
                r[out] = (round(best / r[key], 3) if best is not None and r.get(key) else None)
                r[f"best_baseline_{key.replace('_ms', '')}"] = best_impl


def table(records, compact=False):
    """One markdown table; compact drops the settings-independent detail columns."""
    head = ["graph", "case", "dtype", "F", "impl", "fwd ms", "fwd+bwd ms", "peak MiB",
            "x fwd", "x fwd+bwd"]
    if not compact:
        head += ["floor ms (fwd)", "floor frac fwd", "rel err", "rel err grad", "path"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        row = [r["graph"], r["case"], r["dtype"], str(r["width"]), r["impl"],
               _fmt_ms(r, "fwd_ms", "fwd"), _fmt_ms(r, "fwd_bwd_ms", "fwd_bwd"),
               _fmt(r.get("peak_mib"), ".0f"),
               _fmt(r.get("speedup_fwd"), ".2f"), _fmt(r.get("speedup_fwd_bwd"), ".2f")]
        if not compact:
            row += [_fmt(r.get("floor_ms"), ".3f"), _fmt(r.get("floor_frac"), ".2f"),
                    _fmt(r.get("rel_err"), ".1e"), _fmt(r.get("rel_err_grad"), ".1e"),
                    str(r.get("path") or "")]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def markdown(records, meta):
    """The full report: header, results table, graphs, settings, failures."""
    out = [f"# fastgnn benchmark: {meta['gpu']}", "",
           f"Command: `{meta['command']}`  ",
           f"Versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}  ",
           f"Timing: {meta['timing']}  ",
           "Speedup columns (x): fastest baseline's time / this row's time, per graph, case, "
           "dtype and width (>1 = faster than every baseline). Floor (ops): bytes the op must "
           "move (x read once, out written once, CSR read once; twice for fwd+bwd) "
           + (f"at {meta['bandwidth_gbs']:g} GB/s; frac = floor / measured."
              if meta.get("bandwidth_gbs") else "(not converted to time on the CPU)."), ""]
    if records:
        out += [table(records), ""]
        for summary in SUMMARIES:
            try:
                out += summary(records)
            except Exception as exc:  # noqa: BLE001 - a summary never loses the results
                out += [f"(summary {getattr(summary, '__name__', summary)} failed: {exc!r})", ""]
    else:
        out += ["(no measurements)", ""]
    graphs = OrderedDict((r["graph"], r) for r in records)
    if graphs:
        out += ["## Graphs", "", "| graph | nodes | edges | max in-deg | mean in-deg | source |",
                "|---|---|---|---|---|---|"]
        for name, r in graphs.items():
            s = r["graph_stats"]
            out.append(f"| {name} | {s['num_nodes']:,} | {s['num_edges']:,} | "
                       f"{s['max_in_degree']:,} | {s['mean_in_degree']} | {r['graph_source']} |")
        out.append("")
    settings = OrderedDict(((r["case"], r["impl"]), r["settings"]) for r in records)
    if settings:
        out += ["## Implementations and their settings", ""]
        out += [f"- **{c} / {i}**: {s}" for (c, i), s in settings.items()]
        out.append("")
    failures = [r for r in records if r.get("errors")]
    if failures:
        out += ["## Failures", ""]
        for r in failures:
            for phase, msg in r["errors"].items():
                out.append(f"- {r['graph']} {r['case']} {r['dtype']} F={r['width']} {r['impl']} "
                           f"[{phase}: {r['status'].get(phase, 'error')}]: {msg}")
        out.append("")
    if meta.get("skipped"):
        out += ["## Skipped", ""] + [f"- {s}" for s in meta["skipped"]] + [""]
    return "\n".join(out)
