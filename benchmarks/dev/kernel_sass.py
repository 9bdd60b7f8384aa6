"""Developer probe (no GPU): registers, spills and machine instructions of
chosen kernel instantiations, built for sm_90 by the local nvcc and
disassembled by nvdisasm (`pip install nvidia-cuda-nvdisasm`), so that a
kernel change can be weighed on a machine without a GPU. Prints one
line per kernel: registers, spill bytes, instructions and the commonest
opcodes; writes each kernel's SASS under --out.

    python benchmarks/dev/kernel_sass.py attention "attn_fwd<1, bf16_t, int, 4, 1, 8, false>" ...
    python benchmarks/dev/kernel_sass.py attention --source OTHER.cu NAME ...   # a variant

Static counts: a loop body counts once, so compare variants of one kernel,
not kernels of different shapes. The device's NVRTC may allocate a few
registers differently (attention_registers.py asks the device).
"""
import argparse
import collections
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile

from fastgnn.backends.cuda.loader import kernels_dir

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_REGS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores")
_OPCODE = re.compile(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def nvdisasm():
    """The nvdisasm binary: on PATH, or the nvidia-cuda-nvdisasm wheel's."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for sub in ("cu13", "cu12", "cuda_nvdisasm"):
            path = os.path.join(root, sub, "bin", "nvdisasm")
            if os.path.exists(path):
                return path
    sys.exit("nvdisasm not found: pip install nvidia-cuda-nvdisasm")


def build(source, names, workdir, arch="sm_90"):
    """{mangled name: (registers, spill store bytes)} and the cubin path of
    `names` instantiated from `source` (a .cu path)."""
    unit = os.path.join(workdir, "unit.cu")
    with open(unit, "w") as f:
        f.write(f'#include "{os.path.abspath(source)}"\n')
        f.write("void* kept_kernels[] = {%s};\n" % ", ".join(f"(void*)&{n}" for n in names))
    cubin = os.path.join(workdir, "unit.cubin")
    run = subprocess.run(["nvcc", "-std=c++17", "-cubin", f"-arch={arch}", f"-I{kernels_dir()}",
                          "-Xptxas", "-v", "-o", cubin, unit], capture_output=True, text=True)
    if run.returncode:
        sys.exit(run.stderr[-4000:])
    info, current, spill = {}, None, 0
    for line in run.stderr.splitlines():
        m = _ENTRY.search(line)
        if m:
            current, spill = m.group(1), 0
            continue
        m = _SPILL.search(line)
        if m:
            spill = int(m.group(1))
        m = _REGS.search(line)
        if m and current:
            info[current] = (int(m.group(1)), spill)
            current = None
    return info, cubin


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return out.stdout.splitlines() if out.returncode == 0 else list(names)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("family", help="kernels_cuda/<family>.cu (attention, spmm, segment, ...)")
    p.add_argument("names", nargs="+", help="name expressions, as loader.py instantiates them")
    p.add_argument("--source", help="compile this file instead of the family's")
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "fastgnn-sass"))
    args = p.parse_args(argv)
    source = args.source or os.path.join(kernels_dir(), f"{args.family}.cu")
    os.makedirs(args.out, exist_ok=True)
    info, cubin = build(source, args.names, args.out)
    sass = subprocess.run([nvdisasm(), "-c", cubin], capture_output=True, text=True, check=True)
    bodies = {}
    for chunk in re.split(r"\n\s*\.text\.", sass.stdout)[1:]:
        bodies[chunk.split(":", 1)[0]] = chunk
    mangled = sorted(info)
    for name, readable in zip(mangled, demangle(mangled)):
        regs, spill = info[name]
        ops = collections.Counter(_OPCODE.findall(bodies.get(name, "")))
        path = os.path.join(args.out, re.sub(r"[^A-Za-z0-9]+", "_", readable)[:120] + ".sass")
        with open(path, "w") as f:
            f.write(bodies.get(name, ""))
        top = " ".join(f"{op}:{k}" for op, k in ops.most_common(8))
        print(f"{regs:4d} regs {spill:4d} B spill {sum(ops.values()):6d} instr  "
              f"{readable.split('(')[0]}  [{top}]")
    print(f"SASS under {args.out}")


if __name__ == "__main__":
    main()
