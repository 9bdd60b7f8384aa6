"""Multi-GPU scaling of data-parallel mini-batch training: runs
examples/ddp_minibatch.py under torchrun on 1, 2 and 4 GPUs (those this
machine has), for GraphSAGE and GAT, with fastgnn's layers and PyG's, and
writes samples per second, the speedup over one GPU and fastgnn's speedup
over PyG to benchmarks/results/ddp_scaling_<machine>.json and .md.

    python benchmarks/ddp_scaling.py                          # every GPU count up to 4
    python benchmarks/ddp_scaling.py --gpus 1 2 --models sage --layers fastgnn
    python benchmarks/ddp_scaling.py --device cpu --gpus 1 2 -- --steps 3   # a dry run on the CPU

Arguments after `--` go to the example unchanged (--steps, --batch-size,
--graph, --fanouts, ...); each run uses its defaults otherwise (the
mini-batch benchmark's GPU sizes: rmat21e50, 1024 seeds per rank, fanouts
15 10 5). Each rank trains its own batch size per step, so N GPUs train N
times the samples of one per step (weak scaling); the speedup is the
samples/s of N GPUs over those of 1 with the same layers. <machine> is the
GPU's short name and count (h100x4), or cpu<cores> on the CPU; --out
names another folder.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "ddp_minibatch.py")
RESULTS = os.path.join(ROOT, "benchmarks", "results")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, nargs="+", metavar="N",
                   help="process counts (default 1 2 4, those the machine has)")
    p.add_argument("--models", nargs="+", choices=("sage", "gat"), default=["sage", "gat"])
    p.add_argument("--layers", nargs="+", choices=("fastgnn", "pyg"),
                   default=["fastgnn", "pyg"])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda (NCCL), or cpu (gloo) for a dry run")
    p.add_argument("--out", default=RESULTS, help=f"results folder (default {RESULTS})")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per run (default 1800)")
    p.add_argument("example_args", nargs=argparse.REMAINDER,
                   help="after --: arguments for examples/ddp_minibatch.py")
    args = p.parse_args(argv)
    if args.example_args[:1] == ["--"]:
        args.example_args = args.example_args[1:]
    return args


def machine_name(device, gpus):
    """h100x4 for four H100s (the GPU's model number, else its name), cpu<cores> on the CPU."""
    if device == "cpu":
        return f"cpu{os.cpu_count()}"
    import torch
    name = torch.cuda.get_device_name(0)
    model = re.search(r"\b([A-Z]{1,2}\d{2,4})\b", name)
    short = model.group(1).lower() if model else re.sub(r"[^a-z0-9]+", "-", name.lower())
    return f"{short}x{gpus}"


def run_one(nproc, model, layers, args):
    """One torchrun of the example: its JSON record, or a record with status
    "failed: ..." and the tail of its output."""
    example = ["--model", model, "--layers", layers, "--device", args.device,
               *args.example_args]
    command = " ".join(["torchrun --standalone", f"--nproc_per_node={nproc}",
                        os.path.relpath(EXAMPLE, ROOT), *example])
    print(command, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={nproc}", EXAMPLE, *example, "--json", out]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            return {"status": f"failed: no result within {args.timeout} s"}
        if run.returncode != 0 or not os.path.exists(out):
            return {"status": f"failed: exit status {run.returncode}",
                    "output_tail": (run.stdout + run.stderr)[-3000:]}
        with open(out) as f:
            record = json.load(f)
    record.update(status="ok", command=command)
    return record


def add_speedups(records):
    """speedup_vs_1: samples/s over the one-process run of the same model and
    layers; fastgnn_over_pyg: fastgnn's samples/s over PyG's at the same
    process count (on fastgnn's records)."""
    ok = {(r["model"], r["layers"], r["world_size"]): r for r in records
          if r.get("status") == "ok"}
    for (model, layers, world), r in ok.items():
        one = ok.get((model, layers, 1))
        r["speedup_vs_1"] = round(r["samples_per_s"] / one["samples_per_s"], 3) if one else None
        pyg = ok.get((model, "pyg", world))
        r["fastgnn_over_pyg"] = (round(r["samples_per_s"] / pyg["samples_per_s"], 3)
                                 if layers == "fastgnn" and pyg else None)


def markdown(records, machine):
    """The report: one line per run."""
    def fmt(v, spec):
        return "-" if v is None else format(v, spec)
    head = ["model", "layers", "processes", "samples/s", "ms/step", "speedup vs 1",
            "fastgnn / PyG", "loss first -> last (rank 0)"]
    lines = [f"# Data-parallel mini-batch training on {machine}", "",
             "`python benchmarks/ddp_scaling.py` (examples/ddp_minibatch.py under torchrun; "
             "each process trains its own batch per step).", ""]
    first = next((r for r in records if r.get("status") == "ok"), None)
    if first:
        lines += [f"Device {first['device']}, backend {first['backend']}, graph {first['graph']}, "
                  f"{first['batch_size_per_rank']} seeds per process and step, fanouts "
                  f"{first['fanouts']}, features {first['features']}, hidden {first['hidden']}, "
                  f"{first['steps']} timed steps after {first['warmup']}; sampler "
                  f"{first['sampler']}.", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        if r.get("status") != "ok":
            lines.append(f"| {r['model']} | {r['layers']} | {r['world_size']} | "
                         f"{r['status']} | | | | |")
            continue
        lines.append("| " + " | ".join([
            r["model"], r["layers"], str(r["world_size"]), fmt(r["samples_per_s"], ".1f"),
            fmt(r["ms_per_step"], ".2f"), fmt(r.get("speedup_vs_1"), ".2f"),
            fmt(r.get("fastgnn_over_pyg"), ".2f"),
            f"{r['rank0_loss_first']:.4f} -> {r['rank0_loss_last']:.4f}"]) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda":
        import torch
        have = torch.cuda.device_count()
        if have == 0:
            raise SystemExit("no CUDA device: pass --device cpu for a dry run")
        counts = args.gpus or [n for n in (1, 2, 4) if n <= have]
        if max(counts) > have:
            raise SystemExit(f"--gpus {max(counts)}: this machine has {have} GPUs")
    else:
        counts = args.gpus or [1, 2]
    names = {"sage": "SAGE-mean", "gat": "GAT"}
    records = []
    for model in args.models:
        for layers in args.layers:
            for n in counts:
                r = run_one(n, model, layers, args)
                r.update(model=names[model], layers=layers, world_size=n)
                records.append(r)
                print(f"  -> {r.get('samples_per_s', r['status'])}", flush=True)
    add_speedups(records)
    machine = machine_name(args.device, max(counts))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"ddp_scaling_{machine}")
    with open(path + ".json", "w") as f:
        json.dump(records, f, indent=1)
    report = markdown(records, machine)
    with open(path + ".md", "w") as f:
        f.write(report)
    print("\n" + report + f"\n-> {path}.json, {path}.md")
    return 0 if all(r.get("status") == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
