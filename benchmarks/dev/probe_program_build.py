"""Developer probe (CUDA): where a native Program's build spends its time on
a new graph. Trains GCN on new batches of small graphs (probe_new_graph's
model and batches) with `ProgramBuilder.build`'s parts timed apart: the
Program's constructor, its add_buffer calls and its add_launch calls, as
is, with autograd's backward on the calling thread and with the cyclic
garbage collector off.

    python benchmarks/dev/probe_program_build.py
"""
import gc
import statistics
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import probe_new_graph as probe  # noqa: E402

from fastgnn.torch import native  # noqa: E402

parts = {"ctor": [], "buffers": [], "launches": [], "total": []}


def timed_build(self, results, keep):
    t0 = time.perf_counter()
    nat = native.module()
    first = self.num_addresses + len(self.out_shapes)
    res = [-1 if r is None else r.index - first for r in results]
    prog = nat.Program(self.name, native.launch_fn(), self.num_addresses, self.out_shapes, res,
                       keep)
    t1 = time.perf_counter()
    for shape, dtype in self.buffers:
        prog.add_buffer(shape, native._DTYPE_CODES[dtype])
    t2 = time.perf_counter()
    for func, grid, block, smem, values, dynamic in self.launches:
        prog.add_launch(func, list(grid), list(block), smem, values, dynamic)
    t3 = time.perf_counter()
    for k, v in (("ctor", t1 - t0), ("buffers", t2 - t1), ("launches", t3 - t2),
                 ("total", t3 - t0)):
        parts[k].append(v * 1e3)
    return prog


def run(label):
    for v in parts.values():
        v.clear()
    dev = torch.device("cuda")
    pool = [probe.batch(s, 128, dev) for s in range(40)]
    torch.manual_seed(0)
    convs = probe.model("GCN").to(dev)
    opt = torch.optim.Adam(convs.parameters(), lr=1e-3)
    for b in pool[:5]:
        probe.step(convs, opt, *b)
    for v in parts.values():
        v.clear()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for b in pool[5:]:
        probe.step(convs, opt, *b)
    torch.cuda.synchronize()
    step = (time.perf_counter() - t0) / 35 * 1e3
    med = {k: statistics.median(v) if v else 0.0 for k, v in parts.items()}
    print(f"{label:12s} step {step:6.2f} ms  builds {len(parts['total'])}  median ms: "
          + "  ".join(f"{k} {v:.3f}" for k, v in med.items())
          + f"  max total {max(parts['total'] or [0]):.3f}"
          + f"  over 0.5 ms {sum(t > 0.5 for t in parts['total'])}", flush=True)


native.ProgramBuilder.build = timed_build
run("as is")
import os  # noqa: E402
import threading  # noqa: E402
print("python threads:", [t.name for t in threading.enumerate()],
      " OS threads:", len(os.listdir("/proc/self/task")), flush=True)
sys.setswitchinterval(1e-4)
run("switch 0.1ms")
sys.setswitchinterval(5e-3)
gc.disable()
run("gc off")
gc.enable()
torch.autograd.set_multithreading_enabled(False)
run("one thread")
