"""What every bench run shares: where its results go, its device and
version stamp, its progress bar and its JSON writer (the op / layer suite in
__main__ and the training suite in cases_training)."""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import sys
import time

OUT_DIR = "fastgnn-bench"        # default results folder, in the working directory


def results_path(out, prefix, device):
    """The JSON path of a run: `out` itself when it ends in .json, else
    <out or ./fastgnn-bench>/<prefix>-<device>-<date-time>.json. Refuses a
    path inside the installed fastgnn package."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = f"{prefix}-{slug(device)}-{stamp}.json"
    if out is None:
        path = os.path.join(OUT_DIR, name)
    elif out.lower().endswith(".json"):
        path = out
    else:
        path = os.path.join(out, name)
    package = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    where = os.path.realpath(os.path.abspath(path))
    if os.path.commonpath([package, where]) == package:
        raise SystemExit(f"fastgnn bench: {path} is inside the fastgnn package ({package}); "
                         "run from another folder or pass --out DIR")
    return path


def versions(torch, cuda):
    """Versions of Python, torch, PyG, CuPy, fastgnn (and CUDA, turbo-gnn on a GPU)."""
    v = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import torch_geometric
        v["pyg"] = torch_geometric.__version__
    except Exception:  # noqa: BLE001
        v["pyg"] = None
    try:
        import cupy
        v["cupy"] = cupy.__version__
    except Exception:  # noqa: BLE001
        v["cupy"] = None
    import fastgnn
    v["fastgnn"] = fastgnn.__version__
    if cuda:
        v["cuda"] = torch.version.cuda
        try:
            import turbo_gnn
            v["turbo_gnn"] = getattr(turbo_gnn, "__version__", "installed")
        except Exception:  # noqa: BLE001
            pass
    return v


def device_label(torch, device):
    """The GPU's name, or the CPU with its cores and torch threads."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, " \
           f"{torch.get_num_threads()} torch threads)"


def slug(text):
    """A file-name-safe short form of a device label."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "device"


def progress(total, disable):
    """A tqdm bar on stderr (percent and time left), or a silent stand-in
    without tqdm."""
    try:
        from tqdm import tqdm
        return tqdm(total=total, disable=disable, file=sys.stderr, mininterval=0.5,
                    dynamic_ncols=True, leave=False,
                    bar_format="{desc} {percentage:3.0f}%|{bar}| {elapsed} elapsed, "
                               "~{remaining} left")
    except Exception:  # noqa: BLE001
        class _Null:
            def update(self, n=1): pass
            def set_description_str(self, s): pass
            def close(self): pass
        return _Null()


def write_json(path, records):
    """Write the records atomically (a run cut short keeps a readable file)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(records, f, indent=1, default=str)
    os.replace(tmp, path)


def write_results(path, records, markdown, table, summary, skipped=()):
    """A suite's end: the records as JSON at `path`, the markdown report
    beside it (.md), then the table, the summary lines and both paths
    printed. Returns the CLI's exit status: 0, or 1 when no record measured
    anything (status "ok"), after saying why (`skipped`, the failures)."""
    write_json(path, records)
    md_path = os.path.splitext(path)[0] + ".md"
    with open(md_path, "w") as f:
        f.write(markdown)
    print(table if records else "(no measurements)")
    print("\n" + "\n".join(summary))
    print(f"\n{len(records)} records -> {path}\nreport -> {md_path}")
    if any(r.get("status") == "ok" for r in records):
        return 0
    why = list(skipped) + list(dict.fromkeys(
        f"{r.get('case', '?')} {r.get('framework') or ''}: {r.get('status')}".replace("  ", " ")
        for r in records))
    print("fastgnn bench: nothing was measured:\n" + "\n".join(f"  {w}" for w in why[:20]),
          file=sys.stderr)
    return 1


class RowGate:
    """Whether a suite starts its next row: not once its --budget-minutes
    (None: no limit) is spent, nor once a failed row has left the device's
    CUDA context unusable (`after_failure`). `closed(what)` says so before
    row `what` and, the first time, notes in `skipped` that nothing ran
    from that row on, and why."""

    def __init__(self, minutes, skipped):
        self.minutes, self.skipped = minutes, skipped
        self.start, self.over = time.perf_counter(), False
        self.lost = None            # (the failed row, its error) once the context is lost

    def closed(self, what) -> bool:
        if self.lost is not None:
            why = (f"the CUDA context was lost when {self.lost[0]} failed ({self.lost[1]}): a "
                   "sticky CUDA error leaves the process unusable; run the remaining rows "
                   "in a new process")
        elif self.minutes is not None and time.perf_counter() - self.start > 60 * self.minutes:
            why = f"time budget used up: --budget-minutes {self.minutes:g} was spent"
        else:
            return False
        if not self.over:
            self.over = True
            self.skipped.append(f"from {what} on: not run, {why}")
            print(f"fastgnn bench: stopping before {what}: {why}", file=sys.stderr)
        return True

    def after_failure(self, torch, device, what, error):
        """After row `what` failed with `error` (its description): on CUDA,
        whether the context still runs a kernel and synchronises; if not,
        later rows would all fail for that reason, so the gate closes."""
        if device.type != "cuda" or self.lost is not None:
            return
        try:
            torch.ones(1, device=device).add_(1).cpu()
            torch.cuda.synchronize(device)
        except Exception:  # noqa: BLE001 - any failure here means the context is gone
            self.lost = (what, error)
