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
  GPU the CUDA kernels run on CuPy views (`__cuda_array_interface__`, no
  copy) on XLA's own stream (`ctx.stream`), so the launches are ordered
  with the rest of the program without a synchronisation. The results are
  written into XLA's output buffers (a copy per output; inputs are never
  written). Result shapes and dtypes come from the op's shape rule
  (`Op.outputs`), evaluated at trace time. JAX releases without
  buffer_callback run the CPU path through `jax.pure_callback`;
- on a GPU the kernels' outputs and workspace come from CuPy's memory pool
  beside XLA's: JAX preallocates 75% of the device by default, so leave
  CuPy room (`XLA_PYTHON_CLIENT_MEM_FRACTION`) on large graphs;
- residuals: the backward recomputes the forward inside its callback (the
  custom_vjp keeps only the inputs). The cost is one extra forward pass per
  backward; in exchange nothing op-specific (argmax positions, lse, the
  CSR-ordered weights) has to be described to JAX, and no residual memory is
  held between the forward and the backward beyond the inputs;
- `jax.vmap` runs through the callbacks' sequential rule: a batch of B
  calls the kernels B times, one example after the other (correct, not
  vectorised);
- integer inputs (a dropout seed) and absent inputs (None) get no cotangent;
- bfloat16 reaches the kernels as int16 bits with `vtype="bfloat16"` (CuPy
  has no bf16 dtype), float16 as itself; both on the GPU only.
"""
from __future__ import annotations

import inspect
from functools import partial
from typing import Callable, NamedTuple

import numpy as np
import jax
import jax.numpy as jnp

from fastgnn.backends.cuda.streams import external_stream

from ._graph import Graph

__all__ = ["Op", "apply"]


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
              dtype) or None}
    """

    def __init__(self, name: str, fwd: Callable, bwd: Callable, inputs, *, outputs: Callable,
                 features=(), scalars=()):
        self.name = name
        self.fwd = fwd
        self.bwd = bwd
        self.inputs = tuple(inputs)
        self.features = tuple(features)
        self.scalars = tuple(scalars)
        self.outputs = outputs
        for n in (*self.features, *self.scalars):
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


def _cupy_view(cp, b):
    """A CuPy array on XLA buffer b's memory (no copy); bfloat16, which CuPy
    has no dtype for, as int16 bits (the core's `vtype="bfloat16"` form)."""
    if b.dtype != jnp.bfloat16:
        return cp.asarray(b)
    ptr = int(b.__cuda_array_interface__["data"][0])
    shape = tuple(b.shape)
    mem = cp.cuda.UnownedMemory(ptr, 2 * int(np.prod(shape, dtype=np.int64)), b)
    return cp.ndarray(shape, dtype=cp.int16, memptr=cp.cuda.MemoryPointer(mem, 0))


def _run_on_gpu(fn, ctx, outs, bufs, device):
    """fn(cupy, *CuPy views of bufs) on XLA's stream, written into outs."""
    global _cupy
    if _cupy is None:
        import cupy
        _cupy = cupy
    cp = _cupy
    with cp.cuda.Device(device), external_stream(cp, int(ctx.stream), device):
        results = fn(cp, *(_cupy_view(cp, b) for b in bufs))
        for o, r in zip(outs, results):
            _cupy_view(cp, o)[...] = r


def _callback(fn, specs, *args):
    """Run fn(xp, *arrays) -> tuple of arrays (xp: numpy on the CPU, cupy on
    a GPU) on the device the program runs on, results `specs`."""
    shapes = tuple(jax.ShapeDtypeStruct(s, d) for s, d in specs)
    if _buffer_callback is None:
        return jax.pure_callback(lambda *a: fn(np, *a), shapes, *args, **_VMAP)

    def run(ctx, outs, *bufs):
        first = bufs[0] if bufs else outs[0]
        kind, device = first.__dlpack_device__()
        if kind == _CUDA_DLPACK:
            _run_on_gpu(fn, ctx, outs, bufs, int(device))
            return
        results = fn(np, *(np.asarray(b) for b in bufs))
        for o, r in zip(outs, results):
            np.asarray(o)[...] = r

    return tuple(_buffer_callback(run, shapes, vmap_method="sequential")(*args))


def _core_graph(call: "_Call", xp):
    """The core graph on the arrays' device (a CUDA copy made once per graph)."""
    core = call.graph.core
    if xp is np:
        return core
    dev = xp.cuda.Device().id
    return core.cached(("fastgnn.jax", "cuda", dev), lambda: core.to(f"cuda:{dev}"))


def _forward(call: "_Call", graph, arrays):
    """op.fwd on arrays of one device (None where absent): (outs tuple, residuals)."""
    op = call.op
    kw = dict(call.static)
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


def _forward_callback(call: _Call):
    def fn(xp, *given):
        outs, _ = _forward(call, _core_graph(call, xp), _fill(call, given))
        return tuple(_as_result(xp, o, s, call.op.name) for o, s in zip(outs, call.outs))
    return fn


def _backward_callback(call: _Call, specs):
    n = sum(call.present)

    def fn(xp, *given):
        graph = _core_graph(call, xp)
        arrays = _fill(call, given[:n])
        _, res = _forward(call, graph, arrays)          # recompute (see module docstring)
        grads = call.op.bwd(graph, res, *given[n:])
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
    return _callback(_forward_callback(call), call.outs, *given)


def _bridge_fwd(call, arrays):
    return _bridge(call, arrays), arrays


def _bridge_bwd(call, arrays, cts):
    given = [a for a in arrays if a is not None]
    specs = [(a.shape, a.dtype) for a, w in zip(arrays, call.grads) if w]
    grads = iter(_callback(_backward_callback(call, specs), specs, *given, *cts)
                 if specs else ())
    return (tuple(next(grads) if w else None for w in call.grads),)


_bridge.defvjp(_bridge_fwd, _bridge_bwd)


def apply(op: Op, graph, *arrays, **static):
    """Run `op` on JAX (or NumPy) arrays, differentiable in every float array
    input: `op.fwd(graph.core, *arrays, **static)` forward, `op.bwd` backward.
    `arrays` are the op's inputs in order (None allowed); `static` its
    non-array keywords (hashable values)."""
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a fastgnn.jax.Graph, got {type(graph).__name__}; "
                        "build one with fastgnn.jax.Graph.from_edge_index(edge_index)")
    if len(arrays) != len(op.inputs):
        raise TypeError(f"{op.name} takes {len(op.inputs)} array inputs {op.inputs}, "
                        f"got {len(arrays)}")
    vals = []
    for name, a in zip(op.inputs, arrays):
        if name in op.scalars and isinstance(a, (int, np.integer)):
            static[name] = int(a)
            a = None
        vals.append(None if a is None else jnp.asarray(a))
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
            and n not in op.scalars and v.dtype in (jnp.bfloat16, jnp.float16) else v
            for n, v in zip(op.inputs, vals)]
    half = {v.dtype.name for n, v in zip(op.inputs, vals)
            if v is not None and n in op.features and v.dtype in (jnp.bfloat16, jnp.float16)}
    if half and jax.default_backend() == "cpu":
        raise TypeError(f"{op.name}: {'/'.join(sorted(half))} inputs run on the GPU only (the "
                        "CPU kernels take float32 and float64); cast them with .astype(jnp.float32)")
    if "bfloat16" in half:
        static["vtype"] = "bfloat16"        # the core's name for int16-carried bf16
    call = _Call(op, graph, tuple(sorted(static.items())), outs,
                 tuple(v is not None for v in vals), grads)
    result = _bridge(call, tuple(vals))
    return result[0] if len(result) == 1 else tuple(result)
