"""Launch plans: a CUDA op's kernel launches, prepared once and replayed on
the caller's buffers.

A `Launch` is one kernel launch with everything fixed that does not change
from call to call: the CUfunction (from the loader's compiled module), grid,
block, dynamic shared memory and the kernel's parameter block, packed once
as CUDA's `cuLaunchKernel` reads it: one 8-byte slot per parameter (a
pointer, a 64-bit integer, or a 4-byte int/float in the slot's low bytes,
the layout CuPy's RawKernel builds per call from the same NumPy scalars) and
an array of the slots' addresses. Per call only the buffer addresses are
written into their slots (`Slot`: the call's buffer `index` plus a byte
offset), then `cuLaunchKernel` runs on the caller's stream. No CuPy array,
no DLPack exchange and no device scope per call; the plan validates nothing
(what it depends on is in the key it is cached under, and the public
function validated the rest).

A `LaunchPlan` is an op's launches for one (graph, request): the
launchers (segment.py, ...) build one per key and cache it on the graph;
both the CuPy launchers and fastgnn.torch run them, on CuPy arrays' or
torch tensors' addresses. Its `buffers` say which per-call buffers
(outputs, residuals, workspace) the caller allocates, as (shape, dtype).
"""
from __future__ import annotations

import threading

import numpy as np

BLOCK = 256           # threads per block of every family's kernels
# byte size of each kernel scalar type the launchers pass (their C types:
# int, long long / i64, unsigned long long, float, double)
_SCALAR_BYTES = {np.dtype(np.int32): 4, np.dtype(np.int64): 8, np.dtype(np.uint64): 8,
                 np.dtype(np.float32): 4, np.dtype(np.float64): 8}


ALIGN = 256           # byte alignment of each buffer carved out of one allocation


def layout(sizes):
    """(byte offsets or None, total bytes) of buffers of `sizes` bytes (0:
    absent) laid out in one allocation (a workspace), each ALIGN-aligned."""
    offsets, total = [], 0
    for size in sizes:
        if not size:
            offsets.append(None)
            continue
        offsets.append(total)
        total += -(-size // ALIGN) * ALIGN
    return tuple(offsets), total


class Slot:
    """A pointer parameter given per call: the address of the call's buffer
    `index` plus `offset` bytes (null when that buffer is absent)."""
    __slots__ = ("index", "offset")

    def __init__(self, index: int, offset: int = 0):
        self.index, self.offset = int(index), int(offset)

    def __repr__(self):
        return f"Slot({self.index}, {self.offset})"


def address(a) -> int:
    """Address of a fixed pointer parameter: a CuPy array's first byte (a
    NumPy array's in CPU tests), or None (0: null)."""
    if a is None:
        return 0
    if isinstance(a, np.ndarray):
        return int(a.ctypes.data)
    return int(a.data.ptr)


class Word(Slot):
    """A scalar parameter given per call: call value `index` (an int: the
    scalar's bit pattern, zero-extended to 64 bits; see `word`) written into
    the slot as it is. kind: its C type as a NumPy dtype name ("uint64",
    "float64", "int32", ...)."""
    __slots__ = ("kind",)

    def __init__(self, index: int, kind: str):
        super().__init__(index, 0)
        self.kind = np.dtype(kind).name

    def __repr__(self):
        return f"Word({self.index}, {self.kind})"


def word(value) -> int:
    """The 64-bit slot pattern (an int) of a NumPy scalar, for a `Word`."""
    raw = np.zeros(8, dtype=np.uint8)
    b = np.frombuffer(value.tobytes(), dtype=np.uint8)
    raw[:b.shape[0]] = b
    return int(raw.view(np.uint64)[0])


PTR = "ptr"           # the kind of a pointer parameter (else its scalar's dtype name)


def pack(args):
    """(values, dynamic, keep, kinds) of a parameter list: values
    [len(args)] uint64, one slot per parameter, holding each fixed
    argument's bytes (scalars in their own width from the slot's first byte,
    pointers as 64-bit addresses, None as null); dynamic ((parameter, buffer
    index, offset) per Slot); keep (the fixed arrays, kept alive by the
    launch); kinds (PTR or the scalar's dtype name, per parameter). Python
    ints and floats are refused: their C width would be a guess."""
    values = np.zeros(max(1, len(args)), dtype=np.uint64)
    raw = values.view(np.uint8)
    dynamic, keep, kinds = [], [], []
    for i, a in enumerate(args):
        kinds.append(PTR)
        if isinstance(a, Slot):
            dynamic.append((i, a.index, a.offset))
            if isinstance(a, Word):
                kinds[-1] = a.kind
        elif a is None:
            continue
        elif isinstance(a, np.generic):
            size = _SCALAR_BYTES.get(a.dtype)
            if size is None:
                raise TypeError(f"kernel parameter {i}: unsupported scalar type {a.dtype}")
            raw[8 * i:8 * i + size] = np.frombuffer(a.tobytes(), dtype=np.uint8)
            kinds[-1] = a.dtype.name
        elif isinstance(a, (bool, int, float)):
            raise TypeError(f"kernel parameter {i}: a Python {type(a).__name__} has no C width; "
                            "pass a NumPy scalar (np.int32, np.int64, np.float32, ...)")
        else:
            values[i] = address(a)
            keep.append(a)
    return values, tuple(dynamic), keep, tuple(kinds)


class Launch:
    """One kernel launch of a plan (see the module docstring).

    kernel: the compiled kernel (a CuPy RawKernel: its `.kernel.ptr` is the
    CUfunction; kept so its module stays loaded), or an int CUfunction.
    args: the kernel's parameters in its C order: `Slot`s, NumPy scalars of
    the C types, arrays (fixed pointers) or None (null)."""
    __slots__ = ("kernel", "func", "grid", "block", "smem", "values", "params", "params_ptr",
                 "dynamic", "keep", "kinds", "name")

    def __init__(self, kernel, grid, args, block=(BLOCK,), smem=0, name=""):
        self.kernel = kernel
        self.func = kernel if isinstance(kernel, int) else int(kernel.kernel.ptr)
        self.grid = tuple(max(1, int(g)) for g in (tuple(grid) + (1, 1))[:3])
        self.block = tuple(max(1, int(b)) for b in (tuple(block) + (1, 1))[:3])
        self.smem = int(smem)
        self.name = name
        self.values, self.dynamic, self.keep, self.kinds = pack(args)
        base = self.values.ctypes.data
        # void *kernelParams[]: the address of each parameter's slot
        self.params = np.arange(len(args), dtype=np.uint64) * np.uint64(8) + np.uint64(base)
        self.params_ptr = int(self.params.ctypes.data)

    def fill(self, ptrs):
        """Write the call's buffer addresses (ptrs[index] + offset, 0 for an
        absent buffer) into the dynamic slots."""
        values = self.values
        for i, k, off in self.dynamic:
            p = ptrs[k]
            values[i] = p + off if p else 0

    def __repr__(self):
        return f"Launch({self.name or hex(self.func)}, grid={self.grid}, block={self.block})"


_launch_kernel = None          # cupy_backends' cuLaunchKernel, bound on first launch
_contexts = threading.local()  # devices whose context this thread has made current


def _driver():
    global _launch_kernel
    if _launch_kernel is None:
        from cupy_backends.cuda.api import driver
        _launch_kernel = driver.launchKernel
    return _launch_kernel


def ensure_context(device: int):
    """Make sure the calling thread has a current CUDA context (the
    driver-API launch needs one; a thread that only asked the runtime for
    its current device may have none yet, e.g. autograd's device threads):
    once per thread and device, as CuPy's launches do."""
    seen = getattr(_contexts, "devices", None)
    if seen is None:
        seen = _contexts.devices = set()
    if device in seen or device is None:
        return
    from cupy_backends.cuda.api import driver, runtime
    if not driver.ctxGetCurrent():
        runtime.memGetInfo()       # a runtime call binds the primary context
    seen.add(device)


class LaunchPlan:
    """An op's launches for one (graph, request), replayed per call by
    `run(stream, ptrs)`: ptrs holds the addresses (ints; 0: absent) of the
    call's buffers in the order the plan's builder documents; stream is a
    cudaStream_t as int (0: the legacy default stream).

    buffers: what the caller allocates per call, as {name: (shape, dtype)}
    (outputs, residuals, workspace; absent ones are not listed)."""
    __slots__ = ("launches", "buffers", "lock", "device")

    def __init__(self, launches, buffers=None, device=0):
        self.launches = tuple(launches)
        self.buffers = dict(buffers or {})
        self.device = device
        # the parameter blocks are shared: one call fills and launches at a time
        self.lock = threading.Lock()

    def run(self, stream: int, ptrs):
        """Launch every kernel in order on `stream` with the call's buffers."""
        if not self.launches:
            return
        launch = _launch_kernel or _driver()
        ensure_context(self.device)
        with self.lock:
            for l in self.launches:
                l.fill(ptrs)
                gx, gy, gz = l.grid
                bx, by, bz = l.block
                launch(l.func, gx, gy, gz, bx, by, bz, l.smem, stream, l.params_ptr, 0)

    def __repr__(self):
        return f"LaunchPlan({list(self.launches)})"
