"""Compile the CUDA kernel modules ahead of use, on every core, so that
CuPy's on-disk kernel cache (~/.cupy/kernel_cache, or CUPY_CACHE_DIR) serves
the processes that run them next: a test run with pytest-xdist workers, a
benchmark. Kernels otherwise compile lazily, one module per
(family, value type, index type) and process, on first use.

Needs a GPU (CuPy compiles for the current device's architecture); the
compile check (`compile_check`) is the GPU-free counterpart.

    python -m fastgnn.backends.cuda.prewarm                        # every module
    python -m fastgnn.backends.cuda.prewarm --family attention --vtypes float32 bfloat16
"""
from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import sys
import time

from .loader import C_INDEX, C_VALUE, KERNELS

__all__ = ["modules", "prewarm"]


def modules(families=None, vtypes=None, itypes=None):
    """Jobs [(family, vtype, itype)] for the named families, value and index
    types (None: all). ValueError for unknown names."""
    for given, known, what in ((families, KERNELS, "family"), (vtypes, C_VALUE, "vtype"),
                               (itypes, C_INDEX, "itype")):
        bad = sorted(set(given or ()) - set(known))
        if bad:
            raise ValueError(f"unknown {what} {bad}; choose from {sorted(known)}")
    return [(f, v, i) for f in (families or KERNELS)
            for v in (vtypes or C_VALUE) for i in (itypes or C_INDEX) if KERNELS[f](v, i)]


def compile_module(job):
    """Compile one module: (job, seconds)."""
    from .loader import get_function
    family, vtype, itype = job
    t0 = time.perf_counter()
    get_function(family, vtype, itype, KERNELS[family](vtype, itype)[0])
    return job, time.perf_counter() - t0


def prewarm(jobs, workers=None, compile_fn=compile_module):
    """Run compile_fn over jobs: in `workers` spawned processes (default: one
    per core, at most one per job), or in this process when workers <= 1.
    Returns [(job, seconds)] in job order."""
    workers = min(len(jobs), workers or os.cpu_count() or 1)
    if workers <= 1:
        return [compile_fn(j) for j in jobs]
    ctx = multiprocessing.get_context("spawn")      # CUDA state does not survive fork
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        return list(pool.map(compile_fn, jobs))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", nargs="+", help=f"families (default all: {sorted(KERNELS)})")
    ap.add_argument("--vtypes", nargs="+", help=f"value types (default all: {sorted(C_VALUE)})")
    ap.add_argument("--itypes", nargs="+", help=f"index types (default all: {sorted(C_INDEX)})")
    ap.add_argument("-j", "--workers", type=int, default=None,
                    help="worker processes (default: one per core)")
    args = ap.parse_args(argv)
    try:
        jobs = modules(args.family, args.vtypes, args.itypes)
    except ValueError as exc:
        ap.error(str(exc))
    t0 = time.perf_counter()
    done = prewarm(jobs, args.workers)
    for (family, vtype, itype), seconds in done:
        print(f"{family:9s} {vtype:9s} {itype:6s} {seconds:6.1f} s")
    print(f"compiled {len(done)} modules in {time.perf_counter() - t0:.1f} s "
          "(CuPy's kernel cache now serves them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
