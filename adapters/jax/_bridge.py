"""One generic bridge from fastgnn forward/backward pairs to `jax.custom_vjp`.

Every fastgnn op is a pure pair `out, res = fwd(graph, *arrays, **static)` /
`grads = bwd(graph, res, *cotangents)` on NumPy (CPU) or CuPy (GPU) arrays.
An `Op` record says how to call one pair and what shapes it returns;
`apply(op, graph, *arrays, **static)` runs it through the single custom_vjp
function `_bridge`, so no op has a hand-written JAX wrapper of its own.

How it runs:

- the forward and the backward are buffer callbacks
  (`jax.experimental.buffer_callback`): XLA hands the callback its input
  buffers and the output buffers it allocated, on the device the program
  runs on. On the CPU the Numba kernels run on NumPy views of them; on a
  GPU the CUDA kernels run on CuPy views of their memory (no copy; made
  from each buffer's address, `_cupy_view`) on XLA's own stream
  (`ctx.stream`), so the launches are ordered with the rest of the program
  without a synchronisation. Inputs are never
  written. Result shapes and dtypes come from the op's shape rule
  (`Op.outputs`), evaluated at trace time. JAX releases without
  buffer_callback run the CPU path through `jax.pure_callback`;
- results on a GPU: from a callback's second call on (its graph caches
  built by then), CuPy's allocations of exactly an output's byte size take
  that XLA output buffer (`_Claim`), so the kernels write their results
  where XLA wants them (`CLAIM_OUTPUTS = False` turns this off); results
  made elsewhere are copied in. Workspace and
  the first call's results come from CuPy's memory pool beside XLA's: JAX
  preallocates 75% of the device by default, so leave CuPy room
  (`XLA_PYTHON_CLIENT_MEM_FRACTION`) on large graphs. On the CPU the
  results are copied into XLA's buffers;
- replayed launches on a GPU: the op's host path (the core's validation,
  CuPy views and launchers) costs 0.2-0.5 ms a call, more than the kernels
  of a mid-sized graph. So after the first call of a call signature (op,
  shapes, options) on a graph and device, the next calls record the launch
  plans they run (`fastgnn.backends.cuda.plan.Replay`) until one, made on
  distinct buffers without building plans, teaches a replay: where the
  plans alone made its outputs (checked once by replaying them into fresh
  buffers and comparing bitwise), every later call with that signature,
  from any program, fills the XLA buffers' addresses into the recorded
  plans and launches them on XLA's stream without entering the op; its
  temporaries come from an arena kept per stream. `REPLAY = False` turns
  replays off (learned ones too); the backends' switches apply to
  signatures not yet recorded. Calls with a traced seed, buffers aligned
  less than the recording's, or work outside the plans (CuPy operations:
  16-bit conversions, ...) keep the host path;
- residuals: the forward callback also returns the arrays of the op's
  residuals (argmax positions, lse, ...) as outputs, and the backward
  callback takes them back, so the backward runs only the backward kernels.
  What they are is learned once per call signature at trace time
  (`_residual_layout`): the forward runs twice on zero inputs of the call's
  shapes, and each array of its residuals is classified as a view of an
  input or of an output (taken from those buffers again: no copy), a
  constant of the graph (the same array in both runs, e.g. cached degree
  scales: kept by reference) or a fresh array (a residual output of its
  shape and dtype); the rest of the residual record is kept as it is
  (fields that depend only on shapes and static arguments). A backward
  that runs on another device than the layout was learned on recomputes
  the forward (the constants are that device's).
  A call with a traced integer input (a dropout seed) keeps the seed out
  of the record, so its backward recomputes the forward inside its
  callback instead (one extra forward pass);
- `jax.vmap` runs through the callbacks' sequential rule: a batch of B
  calls the kernels B times, one example after the other (correct, not
  vectorised);
- integer inputs (a dropout seed) and absent inputs (None) get no cotangent;
- bfloat16 reaches the kernels as int16 bits with `vtype="bfloat16"` (CuPy
  has no bf16 dtype), float16 as itself; both on the GPU only.
"""
from __future__ import annotations

import dataclasses
import inspect
import itertools
import math
import mmap
from functools import partial
from typing import Callable, NamedTuple

import numpy as np
import jax
import jax.numpy as jnp

from fastgnn.backends.cuda import plan
from fastgnn.backends.cuda.streams import external_stream
from fastgnn.rng import check_seed

from ._graph import Graph

__all__ = ["Op", "apply", "as_array", "stand_in"]


class Op:
    """How to call one fastgnn forward/backward pair from JAX.

    fwd(core_graph, *arrays, **static, **scalars) -> (out | tuple of outs, residuals)
    bwd(core_graph, residuals, *cotangents) -> one gradient (or None) per array input

    inputs:   names of the array inputs, in call order
    features: inputs that carry the op's value type (all of one float dtype)
    scalars:  integer scalar inputs (a dropout seed): a Python int is passed
              to fwd as a static keyword, a (traced) integer array is sent to
              the callback and passed to fwd as int(value) under its name;
              they are not array arguments of fwd
    outputs:  the shape rule, outputs(core_graph, shapes, static) -> a tuple of
              (shape, dtype) per output, with shapes = {input name: (shape,
              dtype) or None}; it runs after `check`, on checked inputs
    check:    check(core_graph, stand_ins, static) runs the core's checks of
              fwd's arguments when a call is traced (`stand_in`: arrays of
              the inputs' shapes and dtypes, None where absent; static: the
              call's keywords, Python-int scalars included), so a bad
              argument raises its TypeError / ValueError at the call, not
              from inside a callback
    fwd_flags: {keyword: input name}: fwd's keyword is True when the call is
              differentiated and that input takes a gradient, False in a
              forward that no backward follows (which then may skip its
              residuals: e.g. the max/min positions)
    """

    def __init__(self, name: str, fwd: Callable, bwd: Callable, inputs, *, outputs: Callable,
                 check: Callable, features=(), scalars=(), fwd_flags=None):
        self.name = name
        self.fwd = fwd
        self.bwd = bwd
        self.inputs = tuple(inputs)
        self.features = tuple(features)
        self.scalars = tuple(scalars)
        self.outputs = outputs
        self.check = check
        self.fwd_flags = dict(fwd_flags or {})
        for n in (*self.features, *self.scalars, *self.fwd_flags.values()):
            if n not in self.inputs:
                raise ValueError(f"Op {name}: {n!r} is not one of its inputs {self.inputs}")

    def __repr__(self):
        return f"Op({self.name}, inputs={self.inputs})"


class _Call(NamedTuple):
    """Everything static about one call: hashable (op and graph by identity)."""
    op: Op
    graph: Graph
    static: tuple            # sorted (keyword, value) pairs
    outs: tuple              # ((shape, dtype), ...) from the shape rule
    present: tuple           # per input: given (an array) or not
    grads: tuple             # per input: takes a gradient (float array)
    ins: tuple = ()          # per given input: (shape, dtype) as the kernels get it
    traced_scalar: bool = False   # an integer input is traced (the backward recomputes)


try:
    from jax.experimental.buffer_callback import buffer_callback as _buffer_callback
except ImportError:                                 # JAX < 0.7: host callbacks only
    _buffer_callback = None

if "vmap_method" in inspect.signature(jax.pure_callback).parameters:
    _VMAP = {"vmap_method": "sequential"}
else:                                               # older JAX
    _VMAP = {"vectorized": False}

_CUDA_DLPACK = 2            # kDLCUDA, the DLPack device type of a CUDA buffer
_cupy = None                # the cupy module, imported on the first GPU call


def _cupy_view(cp, b, device):
    """A CuPy array on XLA buffer b's memory on `device` (no copy); bfloat16,
    which CuPy has no dtype for, as int16 bits (the core's
    `vtype="bfloat16"` form). Made from the buffer's address and shape, not
    by CuPy's import of its CUDA array interface, which synchronises the
    host with the stream the interface names where it names one: the
    callback runs on XLA's stream already, so its launches are ordered
    after the producers without a wait."""
    cai = b.__cuda_array_interface__
    shape = tuple(int(d) for d in b.shape)
    dtype = np.dtype(np.int16) if b.dtype == jnp.bfloat16 else np.dtype(b.dtype)
    strides = cai.get("strides")
    if strides is not None and tuple(strides) != _c_strides(shape, dtype.itemsize):
        return cp.asarray(b)                        # (not seen from XLA: dense buffers)
    nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    if nbytes == 0:
        return cp.empty(shape, dtype=dtype)
    mem = cp.cuda.UnownedMemory(int(cai["data"][0]), nbytes, b, device)
    return cp.ndarray(shape, dtype=dtype, memptr=cp.cuda.MemoryPointer(mem, 0))


def _c_strides(shape, itemsize):
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


# Off switch of the direct writes into XLA's output buffers (`_Claim`): with
# False every GPU result is copied into XLA's buffers, as on the first call.
CLAIM_OUTPUTS = True


class _Claim:
    """CuPy's allocator during one GPU callback: an allocation of exactly
    the byte size of one of XLA's output buffers not yet handed out gets
    that buffer's memory (first fit, in output order), so a kernel writes
    its result where XLA wants it; any other allocation comes from
    `fallback` (CuPy's allocator before the callback). `made` notes each
    allocation as (address, bytes)."""

    def __init__(self, cp, targets, fallback):
        self.cp, self.free, self.fallback = cp, list(targets), fallback
        self.made = []

    def malloc(self, size):
        for k, t in enumerate(self.free):
            if t is not None and size and t.nbytes == size:
                self.free[k] = None
                self.made.append(_span(t))
                mem = self.cp.cuda.UnownedMemory(t.data.ptr, size, t)
                return self.cp.cuda.MemoryPointer(mem, 0)
        got = self.fallback(size)
        self.made.append((int(got.ptr), int(size)))
        return got


# Off switch of the replayed launches (`_learn_replay`): with False every
# GPU call runs the op's host path, learned replays included.
REPLAY = True


def _address(b) -> int:
    return int(b.__cuda_array_interface__["data"][0])


_RETRY = object()    # a call that could not teach a replay, where a later one may


def _exact_results(results, temporaries) -> bool:
    """Whether each result was made as an allocation of its own (of exactly
    its span, overlapping no other allocation of the call): then an address
    inside it addresses that result, and the replay may send it to the
    output."""
    return all(r in temporaries and not any(t != r and _meet(t, r) for t in temporaries)
               for r in results)


def _learn_replay(cp, runs, temporaries, views, results, targets, keep):
    """The `Replay` of a callback's recorded plan runs, None where it has
    none, or _RETRY where a later call may teach one (this call's input
    buffers overlapped, or it built plans: warming up or tuning). views:
    its CuPy views of XLA's input buffers; results: (address, bytes) of the
    memory each result was made in (the output's own buffer, another
    output's, which the call then copied over, or a temporary), which the
    replay writes straight into the output instead; targets: its views of
    XLA's output buffers, holding the call's results; temporaries: what it
    allocated (XLA's output buffers it claimed included: with its input
    views, every XLA address it could pass to a kernel is a buffer or a
    temporary, so no slot is left pointing into them). The replay is checked
    by running it again on the same
    inputs, into fresh output buffers aligned as XLA's and an arena, all
    filled with 0xff bytes, and comparing them with the call's results
    bitwise (one wait for the stream, once per call signature and device):
    work on the device besides the recorded runs that changes the outputs
    (a CuPy conversion, a memset the kernels count on) shows there."""
    spans = [_span(b) for b in views] + list(results)
    if not runs or any(n == 0 for _, n in spans) or not _exact_results(results, temporaries):
        return None
    rep = plan.Replay.learn(runs, spans, temporaries, keep)
    if rep is None:
        return _RETRY if all(isinstance(p, int) for _, ptrs in runs for p in ptrs) else None
    try:
        fresh = []
        for t in targets:                   # same address modulo REPLAY_ALIGN as XLA's
            raw = cp.full(t.nbytes + 2 * plan.REPLAY_ALIGN, 0xff, dtype=cp.uint8)
            shift = (int(t.data.ptr) - int(raw.data.ptr)) % plan.REPLAY_ALIGN
            fresh.append(raw[shift:shift + t.nbytes])
        arena = cp.full(max(rep.arena_bytes, 1), 0xff, dtype=cp.uint8)
        rep.run(cp.cuda.get_current_stream().ptr,
                [int(b.data.ptr) for b in views] + [int(f.data.ptr) for f in fresh],
                int(arena.data.ptr))
        same = [cp.array_equal(f, t.reshape(-1).view(cp.uint8)) for f, t in zip(fresh, targets)]
        return rep if bool(cp.all(cp.stack(same))) else None
    except cp.cuda.memory.OutOfMemoryError:
        return None          # (this call's results are made; later calls keep the host path)


_ARENAS_PER_REPLAY = 8     # streams remembered per replay (XLA computes on one per device)


def _replay(rep, ctx, outs, bufs, device):
    """Run a learned Replay on this call's XLA buffers, on XLA's stream;
    False (nothing run) where the buffers are not aligned as it needs or
    no memory is left for its arena. The arena (the temporaries the
    recorded call's runs used, a few bytes to a few kilobytes for split
    rows' partial results) is allocated once per stream, on it, and kept
    with the replay (`rep.arenas`; past a few streams, one per call from
    CuPy's pool): calls on one stream are ordered, so they can share it."""
    bases = [_address(b) for b in bufs] + [_address(o) for o in outs]
    if not rep.serves(bases):
        return False
    stream = int(ctx.stream)
    cp = _cupy
    with cp.cuda.Device(device):
        mem = rep.arenas.get(stream) if rep.arena_bytes else None
        if mem is not None or not rep.arena_bytes:
            rep.run(stream, bases, 0 if mem is None else int(mem.ptr))
            return True
        try:
            with external_stream(cp, stream, device):     # (its pool block: ordered on it)
                mem = cp.cuda.alloc(rep.arena_bytes)
                if len(rep.arenas) < _ARENAS_PER_REPLAY:
                    mem = rep.arenas.setdefault(stream, mem)
                rep.run(stream, bases, int(mem.ptr))
        except cp.cuda.memory.OutOfMemoryError:
            return False
    return True


def _check_count(results, outs):
    if len(results) != len(outs):
        raise RuntimeError(f"fastgnn.jax: a callback made {len(results)} results for "
                           f"{len(outs)} outputs")


def _in_place(r, t) -> bool:
    return (r.data.ptr == t.data.ptr and r.shape == t.shape and r.dtype == t.dtype
            and r.flags.c_contiguous)


def _meet(a, b) -> bool:
    """Whether the (address, bytes) spans a and b share a byte."""
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def _overlaps(r, t) -> bool:
    return _meet(_span(r), _span(t))


def _run_on_gpu(fn, ctx, outs, bufs, device, claim, learn=None):
    """fn(cupy, *CuPy views of bufs) on XLA's stream, its results in outs.
    With `claim`, CuPy's allocations of the outputs' sizes take XLA's output
    buffers (`_Claim`), so results made there need no copy; the others are
    copied (those lying in another output's buffer first copied out of it).
    Only calls whose caches are built claim (see `_callback`): a cache made
    in XLA's memory would be overwritten by the program. With `learn` (what
    a replay keeps alive) on a claiming call, the plan runs are recorded
    and the call's `Replay` returned (None where it has none, _RETRY where
    a later call may teach one)."""
    global _cupy
    if _cupy is None:
        import cupy
        _cupy = cupy
    cp = _cupy
    built = plan.built
    with cp.cuda.Device(device), external_stream(cp, int(ctx.stream), device):
        targets = [_cupy_view(cp, o, device) for o in outs]
        views = [_cupy_view(cp, b, device) for b in bufs]
        claiming = claim and CLAIM_OUTPUTS
        learn = learn if claiming else None
        if claiming:
            alloc = _Claim(cp, targets, cp.cuda.get_allocator())
            with cp.cuda.using_allocator(alloc.malloc), plan.recording() as runs:
                results = fn(cp, *views)
        else:
            results = fn(cp, *views)
        _check_count(results, targets)
        made = None
        if learn is not None:                # where each result lies (see _learn_replay)
            made = [_span(r) if r.flags.c_contiguous and r.nbytes == t.nbytes else None
                    for r, t in zip(results, targets)]
        pending = [(t, r) for t, r in zip(targets, results) if not _in_place(r, t)]
        pending = [(t, r.copy() if any(u is not t and _overlaps(r, u) for u in targets) else r)
                   for t, r in pending]
        for t, r in pending:
            t[...] = r
        if made is None or None in made:
            return None
        if plan.built != built:
            return _RETRY                   # it built plans: warming up or tuning
        del results, pending
        return _learn_replay(cp, runs, alloc.made, views, made, targets, learn)


def _on_gpu(fn, ran, replay, ctx, outs, bufs, device):
    """One GPU call of a callback (see `_callback`). Its state per device,
    kept under ran's key: none before the first call, True once its caches
    are built (the next call claims XLA's output buffers and, with
    `replay`, records its launches, until one teaches a replay or shows
    there is none), then its Replay, or False where it has none (every
    later call takes the host path, claiming). The state lives on the graph
    per call signature, so every program making that call shares it."""
    key = None if ran is None else ran[1] + (device,)   # per device: its caches
    state = None if key is None else ran[0].get(key)
    if state is not None and state is not True and state is not False and REPLAY:
        if _replay(state, ctx, outs, bufs, device):
            return
    learn = (fn,) if state is True and REPLAY and replay else None
    rep = _run_on_gpu(fn, ctx, outs, bufs, device, state is not None, learn)
    if key is not None and state is None:
        ran[0][key] = True              # built its caches: the next call claims
    elif learn is not None and rep is not _RETRY:
        ran[0][key] = rep if rep is not None else False


def _callback(fn, specs, *args, ran=None, replay=True):
    """Run fn(xp, *arrays) -> tuple of arrays (xp: numpy on the CPU, cupy on
    a GPU) on the device the program runs on, results `specs`. ran: (dict,
    key) marking per device that fn has run once (its graph caches built),
    after which GPU calls write into XLA's output buffers directly
    (`_run_on_gpu`) and, with `replay` (the call's inputs are all data, no
    traced seed), record their plan runs until they teach a replay that
    later calls launch without running fn (`_on_gpu`)."""
    shapes = tuple(jax.ShapeDtypeStruct(s, d) for s, d in specs)
    if _buffer_callback is None:
        return jax.pure_callback(lambda *a: fn(np, *a), shapes, *args, **_VMAP)

    def run(ctx, outs, *bufs):
        first = bufs[0] if bufs else outs[0]
        kind, device = first.__dlpack_device__()
        if kind == _CUDA_DLPACK:
            _on_gpu(fn, ran, replay, ctx, outs, bufs, int(device))
            return
        results = fn(np, *(np.asarray(b) for b in bufs))
        _check_count(results, outs)
        for o, r in zip(outs, results):
            np.asarray(o)[...] = r

    return tuple(_buffer_callback(run, shapes, vmap_method="sequential")(*args))


def _ran(call: "_Call", kind: str):
    """The `ran` marker of `_callback` for call's forward or backward, kept
    in the core graph's cache (its caches live there too; the device the
    call runs on completes the key)."""
    return call.graph.core.cache, ("fastgnn.jax", "ran", kind, _signature(call))


def _signature(call: "_Call"):
    """The call without its graph: what a cache on that graph is keyed by."""
    return call._replace(graph=None)


def _core_graph(call: "_Call", xp):
    """The core graph on the arrays' device (a CUDA copy made once per graph)."""
    core = call.graph.core
    if xp is np:
        return core
    dev = xp.cuda.Device().id
    return core.cached(("fastgnn.jax", "cuda", dev), lambda: core.to(f"cuda:{dev}"))


def _forward(call: "_Call", graph, arrays, train=True):
    """op.fwd on arrays of one device (None where absent): (outs tuple,
    residuals); train: a backward follows (sets op.fwd_flags)."""
    op = call.op
    kw = dict(call.static)
    for key, name in op.fwd_flags.items():
        kw[key] = train and call.grads[op.inputs.index(name)]
    positional = []
    for name, a in zip(op.inputs, arrays):
        if name in op.scalars:
            if a is not None:
                kw[name] = int(a)
        else:
            positional.append(a)
    out, res = op.fwd(graph, *positional, **kw)
    return (out if isinstance(out, tuple) else (out,)), res


def _fill(call: _Call, given):
    it = iter(given)
    return [next(it) if p else None for p in call.present]


def _as_result(xp, a, spec, what):
    shape, dtype = spec
    if a.shape != tuple(shape):
        raise RuntimeError(f"{what}: the kernel returned shape {a.shape}, the shape rule "
                           f"says {tuple(shape)}")
    if dtype == jnp.bfloat16:               # the kernels' bf16 results are int16 bits
        if a.dtype.itemsize != 2 or a.dtype.kind not in "iu":
            raise RuntimeError(f"{what}: a bfloat16 result came back as {a.dtype}")
        return xp.ascontiguousarray(a)
    return xp.ascontiguousarray(a, dtype=dtype)


def _zeros(xp, shape, dtype):
    """A zero gradient (bfloat16 zeros as int16 bits: the same bytes)."""
    return xp.zeros(shape, np.int16 if dtype == jnp.bfloat16 else dtype)


# ------------------------------------------------------------ residuals
class _Leaf(NamedTuple):
    """Where an array of a residual record comes from in the backward: kind
    "in" / "out" (a view of given input / output `index` at byte `offset`),
    "res" (residual output `index`), "const" (`value` itself)."""
    kind: str
    index: int
    offset: int = 0
    shape: tuple = ()
    dtype: object = None
    strides: tuple = ()
    value: object = None


def _is_array(a) -> bool:
    return hasattr(a, "__array_interface__") or hasattr(a, "__cuda_array_interface__")


def _span(a):
    """(first byte address, bytes) of array a's memory."""
    if hasattr(a, "__cuda_array_interface__"):
        ptr = int(a.data.ptr)
    else:
        ptr = int(a.__array_interface__["data"][0])
    return ptr, int(a.nbytes)


def _arrays_of(obj, found):
    """Every array in a residual record (dataclasses, tuples, lists and
    dicts walked), in a fixed order, appended to `found`."""
    if _is_array(obj):
        found.append(obj)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _arrays_of(getattr(obj, f.name), found)
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            _arrays_of(v, found)
    elif isinstance(obj, dict):
        for v in obj.values():
            _arrays_of(v, found)
    return found


_HOLE = object()      # where a layout's template had an array


def _rebuild(obj, leaves):
    """The record `obj` with its arrays (or _HOLEs) replaced, in `_arrays_of`
    order, by the next items of the iterator `leaves`."""
    if _is_array(obj) or obj is _HOLE:
        return next(leaves)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: _rebuild(getattr(obj, f.name), leaves)
                                           for f in dataclasses.fields(obj) if f.init})
    if isinstance(obj, tuple):
        return type(obj)(*(_rebuild(v, leaves) for v in obj)) if hasattr(obj, "_fields") \
            else tuple(_rebuild(v, leaves) for v in obj)
    if isinstance(obj, list):
        return [_rebuild(v, leaves) for v in obj]
    if isinstance(obj, dict):
        return {k: _rebuild(v, leaves) for k, v in obj.items()}
    return obj


def _view_leaf(a, kind, buffers):
    """A _Leaf for array a when its memory lies inside one of `buffers`
    (C-contiguous a only), else None."""
    if not a.flags.c_contiguous:
        return None
    ptr, size = _span(a)
    for k, b in enumerate(buffers):
        if b is None:
            continue
        bptr, bsize = _span(b)
        if bptr <= ptr and ptr + size <= bptr + bsize:
            return _Leaf(kind, k, ptr - bptr, tuple(a.shape), a.dtype, tuple(a.strides))
    return None


class _Layout(NamedTuple):
    """A call's residual record without its arrays (`template`: its other
    fields as the zero run left them, which depend only on shapes and
    static arguments), one _Leaf per array, the residual outputs' (shape,
    dtype): each a flat uint8 buffer of the array's bytes (any dtype, 64-bit
    ones without x64), and where it was learned: "cpu" or ("gpu", device).
    A backward on another device recomputes the forward instead (its
    constants live on the device the layout was learned on)."""
    template: object
    leaves: tuple
    specs: tuple
    where: object


def _residual_layout(call: _Call, backend: str) -> _Layout:
    """The _Layout of `call`'s residuals, learned once per call signature
    (cached on the core graph) by running the forward twice on zeros of the
    call's input shapes (see the module docstring). backend: "gpu" or
    "cpu", where the program runs."""
    where = "cpu"
    if backend == "gpu":
        import cupy
        where = ("gpu", int(cupy.cuda.Device().id))     # CuPy's current device
    key = ("fastgnn.jax", "residual layout", _signature(call), where)
    return call.graph.core.cached(key, lambda: _learn_layout(call, where))


def _learn_layout(call: _Call, where) -> _Layout:
    xp = np
    if where != "cpu":
        import cupy as xp
    graph = _core_graph(call, xp)
    runs = []
    for _ in range(2):
        ins = [_zeros(xp, s, d) for s, d in call.ins]
        outs, res = _forward(call, graph, _fill(call, ins))
        outs = [_as_result(xp, o, sp, call.op.name) for o, sp in zip(outs, call.outs)]
        runs.append((ins, outs, res, _arrays_of(res, [])))
    (ins, outs, res, arrays), (_, _, _, again) = runs
    leaves, specs = [], []
    for a, b in zip(arrays, again):
        leaf = _view_leaf(a, "in", ins) or _view_leaf(a, "out", outs)
        if leaf is None and a is b:
            leaf = _Leaf("const", 0, value=a)
        if leaf is None:
            leaf = _Leaf("res", len(specs), shape=tuple(a.shape), dtype=a.dtype)
            specs.append(((int(a.nbytes),), jnp.dtype(jnp.uint8)))
        leaves.append(leaf)
    return _Layout(_rebuild(res, itertools.repeat(_HOLE)), tuple(leaves), tuple(specs), where)


def _from_leaf(xp, leaf, ins, outs, res_bufs):
    if leaf.kind == "const":
        return leaf.value
    if leaf.kind == "res":
        return res_bufs[leaf.index].view(leaf.dtype).reshape(leaf.shape)
    base = (ins if leaf.kind == "in" else outs)[leaf.index]
    if xp is np:
        return np.ndarray(leaf.shape, leaf.dtype, buffer=base, offset=leaf.offset,
                          strides=leaf.strides)
    return xp.ndarray(leaf.shape, leaf.dtype, memptr=base.data + leaf.offset,
                      strides=leaf.strides)


def _bytes_of(xp, a):
    """Array a's bytes as a flat uint8 array (a copy only where a is not contiguous)."""
    return xp.ascontiguousarray(a).reshape(-1).view(xp.uint8)


def _forward_callback(call: _Call, layout=None):
    """The forward callback: the op's outputs, then (with a layout) its
    residual outputs."""
    def fn(xp, *given):
        outs, res = _forward(call, _core_graph(call, xp), _fill(call, given),
                             train=layout is not None)
        results = [_as_result(xp, o, s, call.op.name) for o, s in zip(outs, call.outs)]
        if layout is not None:
            arrays = _arrays_of(res, [])
            if len(arrays) != len(layout.leaves):
                raise RuntimeError(f"{call.op.name}: the residuals hold {len(arrays)} arrays, "
                                   f"the layout learned {len(layout.leaves)}")
            for a, leaf in zip(arrays, layout.leaves):
                if leaf.kind == "res":
                    if tuple(a.shape) != leaf.shape or a.dtype != leaf.dtype:
                        raise RuntimeError(f"{call.op.name}: a residual of {tuple(a.shape)} "
                                           f"{a.dtype} where the layout learned {leaf.shape} "
                                           f"{leaf.dtype}")
                    results.append(_bytes_of(xp, a))
        return tuple(results)
    return fn


def _backward_callback(call: _Call, specs, layout=None):
    """The backward callback on (given inputs, then with a layout the
    forward's outputs and residual outputs, then the cotangents)."""
    n = sum(call.present)
    n_out = len(call.outs) if layout is not None else 0
    n_res = len(layout.specs) if layout is not None else 0

    def fn(xp, *given):
        graph = _core_graph(call, xp)
        ins = given[:n]
        here = "cpu" if xp is np else ("gpu", int(xp.cuda.Device().id))
        if layout is None or layout.where != here:
            _, res = _forward(call, graph, _fill(call, ins))    # recompute (module docstring)
        else:
            outs, res_bufs = given[n:n + n_out], given[n + n_out:n + n_out + n_res]
            res = _rebuild(layout.template, iter(
                [_from_leaf(xp, leaf, ins, outs, res_bufs) for leaf in layout.leaves]))
        grads = call.op.bwd(graph, res, *given[n + n_out + n_res:])
        grads = grads if isinstance(grads, tuple) else (grads,)
        if len(grads) != len(call.op.inputs):
            raise RuntimeError(f"{call.op.name}: bwd returned {len(grads)} gradients for "
                               f"{len(call.op.inputs)} inputs")
        wanted = [g for g, w in zip(grads, call.grads) if w]
        return tuple(_zeros(xp, s, d) if g is None else _as_result(xp, g, (s, d), call.op.name)
                     for g, (s, d) in zip(wanted, specs))
    return fn


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _bridge(call: _Call, arrays: tuple):
    given = [a for a in arrays if a is not None]
    return _callback(_forward_callback(call), call.outs, *given, ran=_ran(call, "forward"),
                     replay=not call.traced_scalar)


def _layout_for(call: _Call):
    """The call's residual layout, or None where its backward recomputes the
    forward (a traced integer input, or no gradient wanted)."""
    if call.traced_scalar or not any(call.grads):
        return None
    cpu = _buffer_callback is None or jax.default_backend() == "cpu"
    return _residual_layout(call, "cpu" if cpu else "gpu")


def _bridge_fwd(call, arrays):
    layout = _layout_for(call)
    if layout is None:
        return _bridge(call, arrays), (arrays, (), ())
    given = [a for a in arrays if a is not None]
    results = _callback(_forward_callback(call, layout), call.outs + layout.specs, *given,
                        ran=_ran(call, "forward with residuals"))
    outs, res = tuple(results[:len(call.outs)]), tuple(results[len(call.outs):])
    return outs, (arrays, outs, res)


def _bridge_bwd(call, saved, cts):
    arrays, outs, res = saved
    given = [a for a in arrays if a is not None]
    specs = [(a.shape, a.dtype) for a, w in zip(arrays, call.grads) if w]
    layout = _layout_for(call)
    grads = iter(_callback(_backward_callback(call, specs, layout), specs, *given, *outs,
                           *res, *cts, ran=_ran(call, "backward"),
                           replay=not call.traced_scalar) if specs else ())
    return (tuple(next(grads) if w else None for w in call.grads),)


_bridge.defvjp(_bridge_fwd, _bridge_bwd)


_HALF = (jnp.bfloat16, jnp.float16)


def as_array(a, name: str):
    """a (a JAX or NumPy array, a traced value, a scalar or a nested list)
    as a JAX array; TypeError naming `name` for anything else."""
    try:
        return jnp.asarray(a)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be an array (JAX or NumPy), got {type(a).__name__}") \
            from None


# stand-ins of this many bytes or more are read-only anonymous mappings
# (POSIX), which reserve no memory however large; smaller ones are np.empty
_MAPPED_FROM = 1 << 24 if hasattr(mmap, "MAP_ANONYMOUS") else None


def stand_in(v):
    """A NumPy array of JAX array v's shape and dtype (16-bit floats as
    float32, the dtype the CPU-side checks know) for the core's checks, which
    read shapes and dtypes only; v may be a traced value. Its memory is never
    read or written: uninitialised, or for a large v a read-only mapping of
    zero pages, so a stand-in of an accelerator array larger than the host's
    memory costs none of it."""
    dtype = np.dtype(np.float32 if v.dtype in _HALF else v.dtype)
    nbytes = math.prod(v.shape) * dtype.itemsize
    if _MAPPED_FROM is None or nbytes < _MAPPED_FROM:
        return np.empty(v.shape, dtype)
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                      prot=mmap.PROT_READ)
    return np.frombuffer(pages, dtype).reshape(v.shape)


def _scalar(name, a, static):
    """A scalar input: a Python int goes to `static` (checked by
    fastgnn.rng.check_seed) and None is returned; anything else must be an
    integer array of shape () (it may be traced) and is returned."""
    if isinstance(a, (int, np.integer)):
        static[name] = check_seed(a, name)
        return None
    v = as_array(a, name)
    if v.shape != () or not jnp.issubdtype(v.dtype, jnp.integer):
        raise TypeError(f"{name} must be a Python int or an integer array of shape (), got "
                        f"a {v.dtype} array of shape {tuple(v.shape)}")
    return v


def apply(op: Op, graph, *arrays, **static):
    """Run `op` on JAX (or NumPy) arrays, differentiable in every float array
    input: `op.fwd(graph.core, *arrays, **static)` forward, `op.bwd` backward.
    `arrays` are the op's inputs in order (None allowed); `static` its
    non-array keywords (hashable values). The arguments are checked here,
    when the call is traced (`Op.check`)."""
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a fastgnn.jax.Graph, got {type(graph).__name__}; "
                        "build one with fastgnn.jax.Graph.from_edge_index(edge_index)")
    if len(arrays) != len(op.inputs):
        raise TypeError(f"{op.name} takes {len(op.inputs)} array inputs {op.inputs}, "
                        f"got {len(arrays)}")
    vals = []
    for name, a in zip(op.inputs, arrays):
        if a is not None:
            a = _scalar(name, a, static) if name in op.scalars else as_array(a, name)
        vals.append(a)
    half = {n: v.dtype for n, v in zip(op.inputs, vals)
            if v is not None and n in op.features and v.dtype in _HALF}
    if half and jax.default_backend() == "cpu":
        raise TypeError(f"{op.name}: {'/'.join(sorted({d.name for d in half.values()}))} "
                        "inputs run on the GPU only (the CPU kernels take float32 and "
                        "float64); cast them with .astype(jnp.float32)")
    if half:
        # the stand-ins take 16-bit features as float32: the one dtype the
        # core wants of an op's features is checked here
        first = next(iter(half))
        for n, v in zip(op.inputs, vals):
            if v is not None and n in op.features and v.dtype != half[first]:
                raise TypeError(f"{op.name}: {n} has dtype {v.dtype} but {first} has "
                                f"{half[first]}; give the inputs one dtype")
    op.check(graph.core, {n: None if v is None else stand_in(v)
                          for n, v in zip(op.inputs, vals) if n not in op.scalars}, static)
    shapes = {n: None if v is None else (tuple(v.shape), v.dtype)
              for n, v in zip(op.inputs, vals)}
    outs = tuple((tuple(int(d) for d in s), jnp.dtype(dt))
                 for s, dt in op.outputs(graph.core, shapes, static))
    grads = tuple(v is not None and n not in op.scalars and jnp.issubdtype(v.dtype, jnp.inexact)
                  for n, v in zip(op.inputs, vals))
    # 16-bit float inputs that do not carry the value type (edge weights) go
    # to the kernels in float32, as the core takes them (JAX casts the
    # gradient back)
    vals = [v.astype(jnp.float32) if v is not None and n not in op.features
            and n not in op.scalars and v.dtype in _HALF else v
            for n, v in zip(op.inputs, vals)]
    if jnp.dtype(jnp.bfloat16) in half.values():
        static["vtype"] = "bfloat16"        # the core's name for int16-carried bf16
    call = _Call(op, graph, tuple(sorted(static.items())), outs,
                 tuple(v is not None for v in vals), grads,
                 tuple((tuple(int(d) for d in v.shape), jnp.dtype(v.dtype))
                       for v in vals if v is not None),
                 any(v is not None and n in op.scalars for n, v in zip(op.inputs, vals)))
    result = _bridge(call, tuple(vals))
    return result[0] if len(result) == 1 else tuple(result)
