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

import contextlib
import functools
import struct
import threading

import numpy as np

BLOCK = 256           # threads per block of every family's kernels
# byte size of each kernel scalar type the launchers pass (their C types:
# int, long long / i64, unsigned long long, float, double)
_SCALAR_BYTES = {np.dtype(np.int32): 4, np.dtype(np.int64): 8, np.dtype(np.uint64): 8,
                 np.dtype(np.float32): 4, np.dtype(np.float64): 8}
# their names, looked up once (NumPy computes dtype.name in Python on every read)
_SCALAR_NAMES = {d: d.name for d in _SCALAR_BYTES}
# scalar type -> (its little-endian byte layout, its name); and a pointer's layout
_SCALARS = {d.type: (struct.Struct("<" + {("i", 4): "i", ("i", 8): "q", ("u", 8): "Q",
                                            ("f", 4): "f", ("f", 8): "d"}[d.kind, d.itemsize]),
                     _SCALAR_NAMES[d]) for d in _SCALAR_BYTES}
_POINTER = struct.Struct("<Q")


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


@functools.lru_cache(maxsize=None)
def _kind_name(kind) -> str:
    """A scalar kind's NumPy dtype name (NumPy builds it in Python per read)."""
    return np.dtype(kind).name


class Word(Slot):
    """A scalar parameter given per call: call value `index` (an int: the
    scalar's bit pattern, zero-extended to 64 bits; see `word`) written into
    the slot as it is. kind: its C type as a NumPy dtype name ("uint64",
    "float64", "int32", ...)."""
    __slots__ = ("kind",)

    def __init__(self, index: int, kind: str):
        super().__init__(index, 0)
        self.kind = _kind_name(kind)

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
    ints and floats are refused: their C width would be a guess. (Each slot
    is written with `struct` into one buffer: a NumPy slice assignment per
    parameter cost four times as much, and a new graph builds a few dozen
    launches.)"""
    buf = bytearray(8 * max(1, len(args)))
    dynamic, keep, kinds = [], [], []
    for i, a in enumerate(args):
        scalar = _SCALARS.get(type(a))
        if scalar is not None:
            scalar[0].pack_into(buf, 8 * i, a.item())
            kinds.append(scalar[1])
        elif a is None:
            kinds.append(PTR)
        elif isinstance(a, Slot):
            dynamic.append((i, a.index, a.offset))
            kinds.append(a.kind if isinstance(a, Word) else PTR)
        elif isinstance(a, np.generic):
            raise TypeError(f"kernel parameter {i}: unsupported scalar type {a.dtype}")
        elif isinstance(a, (bool, int, float)):
            raise TypeError(f"kernel parameter {i}: a Python {type(a).__name__} has no C width; "
                            "pass a NumPy scalar (np.int32, np.int64, np.float32, ...)")
        else:
            _POINTER.pack_into(buf, 8 * i, address(a))
            keep.append(a)
            kinds.append(PTR)
    return np.frombuffer(buf, dtype=np.uint64), tuple(dynamic), keep, tuple(kinds)


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
        global built
        built += 1
        self.launches = tuple(launches)
        self.buffers = dict(buffers or {})
        self.device = device
        # the parameter blocks are shared: one call fills and launches at a time
        self.lock = threading.Lock()

    def run(self, stream: int, ptrs):
        """Launch every kernel in order on `stream` with the call's buffers
        (noted by an active `recording()` on this thread). Subclasses that
        run further plans override this and call it first."""
        runs = _recording.runs
        if runs is not None:
            runs.append((self, tuple(ptrs)))
        self.launch(stream, ptrs)

    def launch(self, stream: int, ptrs):
        """This plan's own kernels, in order, on `stream` (what `run` records)."""
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


def current_stream() -> int:
    """CuPy's current stream on its current device, as a cudaStream_t int."""
    import cupy
    return cupy.cuda.get_current_stream().ptr


def current_device() -> int:
    """CuPy's current device."""
    import cupy
    return cupy.cuda.runtime.getDevice()


def launch_now(kernel, grid, args, block=(BLOCK,), smem=0):
    """Launch `kernel` once, now, on CuPy's current stream and device: the
    launchers' one-off launches (the 16-bit casts, the arg scatter, the
    attention backward's passes, the block-sparse kernels), packed and
    launched as a plan's are (args as a `Launch`'s, all fixed: no `Slot`),
    so that every kernel launch of the package goes through this module.
    Not a LaunchPlan: `built` and `recording()` do not see it."""
    launch_fixed([Launch(kernel, grid, args, block, smem)])


def launch_fixed(launches):
    """Launch prepared `Launch`es whose arguments are all fixed, in order,
    now, on CuPy's current stream and device (see `launch_now`)."""
    if any(l.dynamic for l in launches):
        raise TypeError("launch_now takes fixed arguments only (a Slot is a plan's)")
    if not launches:
        return
    launch = _launch_kernel or _driver()
    ensure_context(current_device())
    stream = current_stream()
    for l in launches:
        gx, gy, gz = l.grid
        bx, by, bz = l.block
        launch(l.func, gx, gy, gz, bx, by, bz, l.smem, stream, l.params_ptr, 0)


# ------------------------------------------------------------ recorded calls
built = 0     # LaunchPlans built so far (a call that builds one is tuning or warming up)


class _Recording(threading.local):
    runs = None           # the list an active recording() appends to


_recording = _Recording()


@contextlib.contextmanager
def recording():
    """Note every `LaunchPlan.run` made on this thread inside the block, as
    (plan, ptrs) in order, in the list it yields."""
    before = _recording.runs
    runs = _recording.runs = []
    try:
        yield runs
    finally:
        _recording.runs = before


REPLAY_ALIGN = 256     # the most alignment a replay asks of the caller's buffers
_ARENA_ALIGN = 512     # CuPy's pool hands out 512-byte aligned blocks


def _low_bit(x: int) -> int:
    return x & -x if x else 1 << 62


def _word_indices(plan) -> frozenset:
    """The indices of `plan.run`'s ptrs that its launches take as scalar
    values (`Word`s), not addresses."""
    return frozenset(k for l in plan.launches for i, k, _ in l.dynamic if l.kinds[i] != PTR)


def _used_indices(plan) -> frozenset:
    return frozenset(k for l in plan.launches for _, k, _ in l.dynamic)


def _merged(spans):
    """[start, end) ranges covering `spans` ((address, bytes) each), merged."""
    out = []
    for a, e in sorted((a, a + n) for a, n in spans if n):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([a, e])
    return out


class Replay:
    """The plan runs of one call of an op, recorded (`recording()`) and
    replayed on other buffers of the same shapes without the op's host
    path: no validation, no array objects, no allocation but one arena.

    Each address a recorded run was given becomes a slot: (1, b, offset)
    inside caller buffer b (the inputs and outputs the call was made on),
    (2, 0, offset) inside the arena (the memory the call allocated for
    itself and its runs used, the temporaries: their address ranges merged
    and laid out at the same offsets modulo 512 bytes, so aliasing and
    alignment are the recorded call's), or (0, 0, value) a value given as
    it was: a scalar word, null, or the address of memory that outlived the
    call (arrays cached on the graph; the owner keeps them alive).
    `run(stream, bases, arena)` fills the slots from the call's buffer
    addresses and an arena of `arena_bytes`, and launches each plan's own
    kernels (`launch`).

    A replay is valid for calls on the same graph, shapes and options whose
    buffers are each aligned at least as the recorded one was (`serves`:
    the kernels' vector widths were chosen for those), and only when the
    recorded call's buffers were distinct (`learn` refuses overlapping
    ones: a replay would read one for the other), each address is used
    within the buffer its base lies in, and the call did nothing on the
    device besides its plans' runs. Whoever learns one checks the last two
    as far as a test can: by replaying the recorded call on fresh buffers
    and comparing the outputs bitwise (fastgnn.jax does)."""
    __slots__ = ("runs", "arena_bytes", "masks", "keep", "arenas", "lock")

    def __init__(self, runs, arena_bytes, masks, keep=()):
        self.runs, self.arena_bytes, self.masks, self.keep = runs, arena_bytes, masks, keep
        self.arenas = {}        # the caller's arenas kept with it (e.g. one per stream)
        self.lock = threading.Lock()

    @classmethod
    def learn(cls, runs, buffers, temporaries, keep=()):
        """The Replay of recorded `runs` ((plan, ptrs) pairs) made on
        `buffers` (caller buffers, (address, bytes) each) with `temporaries`
        ((address, bytes) of each allocation the call made), or None where
        two buffers overlap or a run's ptrs are not plain ints."""
        spans = sorted((a, a + max(n, 1)) for a, n in buffers)
        if any(b[0] < a[1] for a, b in zip(spans, spans[1:])):
            return None
        arenas = _merged(temporaries)
        masks = [0] * len(buffers)
        classified, used = [], set()
        for plan, ptrs in runs:
            if not all(isinstance(p, int) for p in ptrs):
                return None
            words, indices = _word_indices(plan), _used_indices(plan)
            slots = []
            for k, p in enumerate(ptrs):
                if k not in indices or k in words or p == 0:
                    slots.append((0, 0, p if k in indices else 0))
                    continue
                slot = next(((1, b, p - a) for b, (a, n) in enumerate(buffers)
                             if a <= p < a + max(n, 1)), None)
                if slot is not None:
                    masks[slot[1]] = min(REPLAY_ALIGN, _low_bit(buffers[slot[1]][0])) - 1
                else:
                    where = next((r for r, (a, e) in enumerate(arenas) if a <= p < e), None)
                    slot = (0, 0, p) if where is None else (2, where, p)
                    if where is not None:
                        used.add(where)
                slots.append(slot)
            classified.append((plan, slots))
        placed, total = {}, 0              # the used arenas, at their offsets modulo 512
        for r in sorted(used):
            a, e = arenas[r]
            total += (a - total) % _ARENA_ALIGN
            placed[r] = total - a
            total += e - a
        out = tuple((plan, tuple((2, 0, v + placed[b]) if kind == 2 else (kind, b, v)
                                 for kind, b, v in slots)) for plan, slots in classified)
        return cls(out, total, tuple(masks), tuple(keep))

    def serves(self, bases) -> bool:
        """Whether buffers at `bases` (addresses) are aligned as this replay
        needs: each at least as its recorded buffer (up to REPLAY_ALIGN)."""
        for b, m in zip(bases, self.masks):
            if b & m:
                return False
        return True

    def run(self, stream: int, bases, arena: int = 0):
        """Launch the recorded plans on `stream` with the caller's buffer
        addresses `bases` (in the recorded order) and an arena of
        `arena_bytes` at address `arena`."""
        with self.lock:
            for plan, slots in self.runs:
                plan.launch(stream, [v if kind == 0 else (bases[b] if kind == 1 else arena) + v
                                     for kind, b, v in slots])
