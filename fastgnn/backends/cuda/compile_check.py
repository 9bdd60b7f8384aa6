"""Compile every CUDA kernel instantiation for sm_90 with NVRTC, without a GPU,
and fail on register spills.

Uses CuPy's low-level NVRTC binding (works with the nvidia-cuda-nvrtc wheel on
a machine with no device). `--ptxas-options=-v` makes ptxas report registers,
stack frame and spills per kernel in the program log.

    python -m fastgnn.backends.cuda.compile_check [--arch sm_90] [--verbose] [--family segment] [--quick]

`--quick` compiles two modules per family instead of every (value type,
index type) pair: float32 with int32 indices and bfloat16 with int64 indices,
so every kernel template is built once at 32 and once at 16 bits, with each
index width (CI's check: about a quarter of the full check's time, which runs
on the GPU machine in benchmarks/dev/gpu_check.sh).

Modules compile in parallel, one per process (all cores, `--jobs N` for
fewer); each prints one line when it is done (module, kernels, seconds,
modules done / total), so a CI log shows the run moving: a full check takes
minutes on a small machine.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import sys
import time

from .loader import instantiations, options, source

# the (value type, index type) modules --quick compiles per family
QUICK = (("float32", "int32"), ("bfloat16", "int64"))

_FUNC = re.compile(r"Compiling entry function '([^']+)'")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


def compile_family(family, vtype, itype, names, arch="sm_90"):
    """Compile one module; returns a list of (kernel, registers, spill_store, spill_load)."""
    from cupy_backends.cuda.libs import nvrtc
    prog = nvrtc.createProgram(source(family), f"{family}.cu", [], [])
    try:
        for n in names:
            nvrtc.addNameExpression(prog, n)
        opts = options() + (f"--gpu-architecture={arch}", "--ptxas-options=-v")
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as e:
            raise RuntimeError(f"{family}.cu ({vtype}, {itype}) failed to compile:\n"
                               f"{nvrtc.getProgramLog(prog)}") from e
        log = nvrtc.getProgramLog(prog)
        nvrtc.getCUBIN(prog)  # make sure machine code was produced
    finally:
        nvrtc.destroyProgram(prog)
    report, current, regs = [], None, None
    for line in log.splitlines():
        m = _FUNC.search(line)
        if m:
            current = m.group(1)
            continue
        m = _REGS.search(line)
        if m:
            regs = int(m.group(1))
            report.append([current, regs, 0, 0])
            continue
        m = _SPILL.search(line)
        if m and current is not None:
            report.append([current, None, int(m.group(1)), int(m.group(2))])
    # merge spill lines into the register lines of the same kernel
    merged = {}
    for name, r, ss, sl in report:
        entry = merged.setdefault(name, [None, 0, 0])
        if r is not None:
            entry[0] = r
        entry[1] += ss
        entry[2] += sl
    return [(k, *v) for k, v in merged.items()], len(names)


def _timed_compile(family, vtype, itype, names, arch):
    """compile_family and its wall time in seconds."""
    t0 = time.perf_counter()
    rows, n = compile_family(family, vtype, itype, names, arch)
    return rows, n, time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--family", action="append",
                    help="only this kernel family (spmm, segment, attention, blocksparse; repeatable)")
    ap.add_argument("--quick", action="store_true",
                    help="per family only the modules " + ", ".join(f"{v}/{i}" for v, i in QUICK))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="modules compiled at once (default: one per core)")
    args = ap.parse_args(argv)
    t0 = time.time()
    failures, total = [], 0
    jobs = [j for j in instantiations() if not args.family or j[0] in args.family]
    if args.quick:
        jobs = [j for j in jobs if (j[1], j[2]) in QUICK]
    # modules are independent: compile them on every core, the largest first
    # (so the last ones to finish are small and no core idles long at the end)
    jobs.sort(key=lambda j: -len(j[3]))
    workers = max(1, min(args.jobs, len(jobs)))
    print(f"compiling {len(jobs)} modules ({sum(len(j[3]) for j in jobs)} kernel "
          f"instantiations) for {args.arch} on {workers} processes", flush=True)
    results = {}
    width = len(str(len(jobs)))
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
        pending = {pool.submit(_timed_compile, *job, args.arch): k for k, job in enumerate(jobs)}
        for fut in concurrent.futures.as_completed(pending):
            k = pending[fut]
            family, vt, it, _ = jobs[k]
            rows, n, secs = results[k] = fut.result()
            print(f"[{len(results):{width}d}/{len(jobs)}] {family} {vt} {it}: {n} kernels in "
                  f"{secs:.1f} s ({time.time() - t0:.0f} s so far)", flush=True)
    for k, (family, vt, it, _) in enumerate(jobs):
        rows, n, _secs = results[k]
        total += n
        for kernel, regs, ss, sl in rows:
            if args.verbose:
                print(f"{family:8s} {vt:9s} {it:6s} regs={regs} spill={ss}/{sl} {kernel}")
            if ss or sl:
                failures.append(f"{family} {vt} {it}: {kernel} spills {ss} B stores / {sl} B loads")
    print(f"compiled {total} kernel instantiations for {args.arch} in {time.time() - t0:.1f} s")
    if failures:
        print("register spills:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
