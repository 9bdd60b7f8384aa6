"""The native backward node (native.cpp): a C++ autograd node that replays a
prepared kernel program, so that an op's backward on CUDA never enters
Python on autograd's device thread.

On CUDA, autograd runs each node's backward on its device thread; a Python
node there (an autograd.Function) costs far more host time than its body
(docs/design.md, "Small graphs and autograd's device threads"). The ops whose
launch plans serve their backward (spmm and the segment reductions) give
their forward's outputs this node instead: `Program` (built once per graph,
request and wanted gradients, cached on the graph) holds the backward's
launches; `attach` makes the node per call.

The extension is compiled on first use with torch.utils.cpp_extension (a
C++ compiler and ninja; ~40 s once, then cached in torch's extension
directory; `python -m fastgnn.backends.cuda.prewarm` does it ahead). Where
it cannot be built, a warning says why once and the ops keep their Python
nodes. Off switch (tests compare both):

    fastgnn.torch.native.ENABLED = False      # or FASTGNN_NATIVE=0 in the environment
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import sys
import threading
import warnings

import torch

from fastgnn.backends.cuda.plan import PTR

ENABLED = os.environ.get("FASTGNN_NATIVE", "1") != "0"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native.cpp")

_module = None
_failed = None          # why the build failed (then never retried)
_lock = threading.Lock()
_launch_fn = None


def module():
    """The compiled extension, built on first call; None where it cannot be
    (the reason in a warning, once)."""
    global _module, _failed
    if _module is not None or _failed is not None:
        return _module
    with _lock:
        if _module is None and _failed is None:
            try:
                _module = _build()
            except Exception as exc:                       # noqa: BLE001 (any build failure)
                last = (str(exc).strip().splitlines() or [""])[-1]
                _failed = f"{type(exc).__name__}: {last}"
                warnings.warn("fastgnn.torch: the native backward node could not be built "
                              f"({_failed}); the ops keep their Python autograd nodes, which "
                              "cost more host time per backward on CUDA. Install a C++ "
                              "compiler and ninja (pip install ninja) to get it.",
                              RuntimeWarning, stacklevel=3)
    return _module


def _build():
    from torch.utils import cpp_extension
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha1(f.read() + torch.__version__.encode()).hexdigest()[:10]
    name = f"fastgnn_native_{digest}"
    build_dir = cpp_extension._get_build_directory(name, False)
    if not os.path.exists(os.path.join(build_dir, f"{name}.so")):
        print("fastgnn.torch: compiling the native backward node (once, ~40 s) ...",
              file=sys.stderr, flush=True)
    return cpp_extension.load(name, [SOURCE], extra_cflags=["-O2"], verbose=False)


def available() -> bool:
    """Whether ops attach native nodes (ENABLED and the extension built)."""
    return ENABLED and module() is not None


def launch_fn() -> int:
    """Address of the driver's cuLaunchKernel (fastgnn.testing's fake CUDA
    world replaces this with a recording function); resolving it also hands
    the extension the driver's context functions (native.cpp's
    ensure_context)."""
    global _launch_fn
    if _launch_fn is None:
        lib = ctypes.CDLL("libcuda.so.1")

        def addr(name):
            return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
        # (the functions that bind a context on a device thread that has none)
        module().set_context_functions(addr("cuCtxGetCurrent"), addr("cuCtxSetCurrent"),
                                       addr("cuDeviceGet"), addr("cuDevicePrimaryCtxRetain"))
        _launch_fn = addr("cuLaunchKernel")
    return _launch_fn


class Table:
    """A per-call address of a program: entry `index` of its table
    (forward addresses, then cotangents, then buffers)."""
    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index


class ProgramBuilder:
    """Builds a native Program. num_addresses: per-call forward addresses
    given to attach; out_shapes: per output, its cotangent's shape (which
    the node aligns to 16 bytes, native.cpp's kCotangentAlign, so the
    launches may read it at any VEC); num_inputs: the op's differentiable
    inputs."""

    def __init__(self, name, num_addresses, out_shapes, num_inputs):
        self.name, self.num_addresses = name, num_addresses
        self.out_shapes = [list(map(int, s)) for s in out_shapes]
        self.num_inputs = num_inputs
        self.buffers, self.launches = [], []

    def address(self, i) -> Table:
        return Table(i)

    def cotangent(self, k) -> Table:
        return Table(self.num_addresses + k)

    def buffer(self, shape, dtype: torch.dtype) -> Table:
        """A buffer allocated (uninitialised) per backward (torch's allocator,
        the cotangent's device): its table entry."""
        self.buffers.append((list(map(int, shape)), dtype))
        return Table(self.num_addresses + len(self.out_shapes) + len(self.buffers) - 1)

    def run(self, plan, refs):
        """Append a LaunchPlan's launches; refs[k]: the plan's call buffer k
        as a Table entry or a fixed address (int, 0: absent)."""
        for launch in plan.launches:
            values = [int(v) for v in launch.values[:len(launch.kinds)]]
            dynamic = []
            for i, k, off in launch.dynamic:
                ref = refs[k]
                if isinstance(ref, Table):
                    if launch.kinds[i] != PTR:
                        raise TypeError(f"{self.name}: a per-call scalar in slot {i}")
                    dynamic.append((i, ref.index, off))
                elif launch.kinds[i] != PTR:
                    values[i] = int(ref)
                else:
                    values[i] = int(ref) + off if ref else 0
            self.launches.append((launch.func, launch.grid, launch.block, launch.smem,
                                  values, dynamic))

    def build(self, results, keep):
        """The Program; results[i]: input i's gradient buffer (a Table entry
        of `buffer`) or None; keep: what its fixed addresses point into."""
        nat = module()
        first = self.num_addresses + len(self.out_shapes)
        res = [-1 if r is None else r.index - first for r in results]
        if len(res) != self.num_inputs:
            raise ValueError(f"{self.name}: {len(res)} results for {self.num_inputs} inputs")
        prog = nat.Program(self.name, launch_fn(), self.num_addresses, self.out_shapes, res,
                           keep)
        for shape, dtype in self.buffers:
            prog.add_buffer(shape, _DTYPE_CODES[dtype])
        for func, grid, block, smem, values, dynamic in self.launches:
            prog.add_launch(func, list(grid), list(block), smem, values, dynamic)
        return prog


# at::ScalarType codes (c10/core/ScalarType.h)
_DTYPE_CODES = {torch.uint8: 0, torch.int32: 3, torch.int64: 4, torch.float16: 5,
                torch.float32: 6, torch.float64: 7, torch.bfloat16: 15}


def attach(program, outputs, inputs, saved, held, addresses, stream):
    """The outputs (fresh tensors) with a native backward node over the op's
    differentiable `inputs`."""
    return module().attach(program, list(outputs), list(inputs), list(saved), list(held),
                           list(addresses), stream)


if __name__ == "__main__":
    # python -m fastgnn.torch.native: build (or find) the extension ahead of use
    if module() is None:
        raise SystemExit(f"fastgnn.torch.native: not built ({_failed})")
    print(f"fastgnn.torch.native: {module().__file__}")
