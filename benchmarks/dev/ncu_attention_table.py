"""Developer tool (no GPU): the attention kernels' hardware counters as a
markdown table, from the CSV of an Nsight Compute run over
`probe_attention.py 20 bwd-once` (one launch of each CUDA-core attention
kernel per score and type):

    ncu --clock-control none -k regex:"attn_(fwd|bwd)" --csv --page details \
        --section SpeedOfLight --section WarpStateStats --section Occupancy \
        --section LaunchStats --section SchedulerStats \
        --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
        python benchmarks/dev/probe_attention.py 20 bwd-once > ncu.csv
    python benchmarks/dev/ncu_attention_table.py ncu.csv

One row per kernel launch: duration (ms), DRAM throughput (% of peak), L2
hit rate, issue slots busy (%), eligible warps per scheduler, warp cycles
per issued instruction, registers per thread, achieved occupancy (%).
"""
import csv
import re
import sys

from fastgnn.backends.cuda.loader import ATTENTION_SCORES

COLUMNS = [("Duration", "ms"), ("DRAM Throughput", "DRAM %"), ("L2 Hit Rate", "L2 hit %"),
           ("Issue Slots Busy", "issue busy %"),
           ("Eligible Warps Per Scheduler", "eligible warps/sched"),
           ("Warp Cycles Per Issued Instruction", "cycles/issue"),
           ("Registers Per Thread", "regs"), ("Achieved Occupancy", "occupancy %")]
_TO_MS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0,
          "s": 1e3, "second": 1e3}
_KERNEL = re.compile(r"(attn_fwd|attn_bwd_dst|attn_bwd_src)<(\d+), (\w+),")
_MMA_KERNEL = re.compile(r"(attn_fwd_mma)<(\w+),")      # gatv2's forward on Tensor Cores
_TYPES = {"float": "fp32", "bf16_t": "bf16", "f16_t": "fp16", "double": "fp64"}


def launches(path):
    """[(score, kernel, type, {metric name: (value, unit)})] in launch order."""
    rows = {}
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]     # drop ncu's log lines
    for rec in csv.DictReader(lines):
        m = _KERNEL.search(rec["Kernel Name"])
        mma = None if m else _MMA_KERNEL.search(rec["Kernel Name"])
        if m is None and mma is None:
            continue
        key = rec["ID"]
        if key not in rows:
            rows[key] = ((ATTENTION_SCORES[int(m.group(2))], m.group(1),
                          _TYPES.get(m.group(3), m.group(3)), {}) if m else
                         ("gatv2", mma.group(1), _TYPES.get(mma.group(2), mma.group(2)), {}))
        value = rec["Metric Value"].replace(",", "")
        try:
            rows[key][3][rec["Metric Name"]] = (float(value), rec["Metric Unit"])
        except ValueError:
            pass
    return [rows[k] for k in sorted(rows, key=int)]


def cell(metrics, name):
    if name not in metrics:
        return "-"
    value, unit = metrics[name]
    if name == "Duration":
        return f"{value * _TO_MS.get(unit, float('nan')):.2f}"
    if name == "Registers Per Thread":
        return f"{value:.0f}"
    return f"{value:.2f}"


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "ncu.csv"
    print("| score | kernel | type | " + " | ".join(label for _, label in COLUMNS) + " |")
    print("|---" * (3 + len(COLUMNS)) + "|")
    for score, kernel, vtype, metrics in launches(path):
        print(f"| {score} | {kernel} | {vtype} | "
              + " | ".join(cell(metrics, name) for name, _ in COLUMNS) + " |")


if __name__ == "__main__":
    main()
