"""fastgnn's graph functions as `torch.library` custom ops, for torch.compile and CUDA graphs.

Eager calls run the autograd bridge of `_autograd.py` directly (residuals
saved, no recomputation). Inside a compiled program (`torch.compile`, with or
without `mode="reduce-overhead"`), Dynamo cannot follow that bridge: it builds
graphs on the host, caches them by tensor address and exchanges buffers with
CuPy. So the layers and functional ops hand the compiler one opaque op per
graph function instead, registered here as

    fastgnn::<name>(Tensor[] graph, Tensor[] inputs, SymInt[] sizes,
                    str static) -> Tensor[]
    fastgnn::<name>_backward(Tensor[] graph, Tensor[] inputs, Tensor[] grads,
                             SymInt[] sizes, str static, bool[] needs) -> Tensor[]

graph:  the graph input's tensors: [edge_index [2, E] integer] (or [] for ops
        whose graph is one of `inputs`, as segment_csr's offsets);
inputs: the function's tensor arguments that are given, in its declared
        order;
sizes:  the values of its size arguments (node counts, group counts), which
        a compiled program with dynamic shapes holds as symbols: a new graph
        with other sizes runs the same compiled program;
static: its other arguments as a JSON object (options, which tensor
        arguments are given, and each size argument's slots in `sizes`), a
        compile-time constant;
needs:  which inputs want a gradient.

`<name>` runs the eager function under `torch.no_grad()` (the inference
path: no residuals). `<name>_backward` runs it again with autograd on the
inputs that need a gradient and returns `torch.autograd.grad` of the given
cotangents: the forward is recomputed in the backward instead of keeping
residuals alive between two opaque ops, which costs one more forward pass per
training step and keeps the op boundary free of backend objects. Dropout
seeds travel as tensors (drawn inside the program), so the recomputed forward
drops the same weights.

Fake (meta) implementations give every output's shape from the input shapes,
`sizes` and `static`, computing with symbolic sizes without reading them as
ints (no guard on a value, so no recompile for a new graph); outputs whose
size depends on the graph's contents (attention weights and edge features
over PyG's self-loops, E minus the loops removed plus those added, and
group counts known only to an index's values) get an unbacked size from
`ctx.new_dynamic_size()`. The options in `static` are read as constants at
trace time: a module's float attributes, which Dynamo holds as symbols
under dynamic shapes, are read with a guard on their value.

CUDA graphs. A captured step replays kernels on the addresses seen at
capture. Every cache that depends on the graph (the CSR sort, the transpose,
GPU plans, normalised weights) is built on the first eager or warm-up call, so
run one step before capturing (`mode="reduce-overhead"` does that itself); a
graph first met during capture raises, as building it needs the host. Graphs
used during a capture are kept alive for the life of the process (their
buffers are what the recorded kernels read), and the graph tensors must be
the same tensors, unmodified, in every replay.
"""
from __future__ import annotations

import contextlib
import functools
import json
import operator
import threading
from typing import Callable, Optional

import torch

__all__ = ["graph_op", "call", "op_arguments", "compiling", "in_kernel", "registered",
           "warm_up"]

_OPS: dict = {}          # name -> _GraphOp


# torch.library.custom_op and the compiler hooks below came with torch 2.4;
# on older torch fastgnn runs eagerly only (nothing is registered)
_SUPPORTED = hasattr(torch.library, "custom_op") and hasattr(torch.compiler, "is_compiling")


def compiling() -> bool:
    """True while Dynamo traces (the layers then call the custom ops)."""
    return _SUPPORTED and torch.compiler.is_compiling()


def _constant_result(fn):
    return torch.compiler.assume_constant_result(fn) if _SUPPORTED else fn


@_constant_result
def _encode(items: tuple) -> str:
    # a constant at trace time: Dynamo folds the call instead of tracing json
    return json.dumps(dict(items), sort_keys=True)


@functools.lru_cache(maxsize=256)
def _decode(static: str):
    """static -> (which tensor arguments are given, the other keyword arguments)."""
    kw = json.loads(static)
    return tuple(kw.pop("given")), kw


_SIZES_KEY = "sizes"      # in static: [[size argument name, its slots in `sizes`], ...]


def _pack_size(value, sizes: list):
    """A size argument (an int, None, or a list of them) -> its slots in
    `sizes` (the same structure, each int replaced by its index there), the
    ints appended to `sizes`. Symbolic ints (torch.SymInt) stay symbols."""
    if isinstance(value, (tuple, list)):
        return [_pack_size(v, sizes) for v in value]
    if value is None:
        return None
    sizes.append(value)
    return len(sizes) - 1


def _constant(value):
    """An option as a plain Python value. Under dynamic shapes Dynamo holds
    a module's float attributes (GATConv's negative_slope, dropout) as
    symbols; an option is read at trace time instead, with a guard on its
    value (it does not change from step to step, so nothing recompiles)."""
    if isinstance(value, (tuple, list)):
        return [_constant(v) for v in value]
    if isinstance(value, bool):
        return value
    # what Dynamo reads as a number (float(s) and int(s) keep a symbol)
    if isinstance(value, float):
        return value.__float__()
    if isinstance(value, int):
        return operator.index(value)
    return value


def _unpack_size(slots, sizes):
    """The inverse of `_pack_size`: slots -> the size argument."""
    if isinstance(slots, list):
        return [_unpack_size(s, sizes) for s in slots]
    return None if slots is None else sizes[slots]


def _arguments(static: str, sizes):
    """(which tensor arguments are given, the other keyword arguments with
    the size arguments filled in from `sizes`)."""
    given, kw = _decode(static)
    kw = dict(kw)
    kw.update((k, _unpack_size(slots, sizes)) for k, slots in kw.pop(_SIZES_KEY))
    return given, kw


def _expand(given, tensors):
    """The given tensors back in their argument slots, None in the others."""
    it = iter(tensors)
    return [next(it) if g else None for g in given]


_kernels = threading.local()   # depth of custom-op kernels running on this thread


def in_kernel() -> bool:
    """True while a fastgnn custom op's kernel runs on this thread: its
    memory may belong to a CUDA graph tree's pool (the trees run a
    compiled program eagerly in their pool before recording it), so
    nothing allocated there may outlive the call in a cache."""
    return getattr(_kernels, "depth", 0) > 0


@contextlib.contextmanager
def _kernel():
    _kernels.depth = getattr(_kernels, "depth", 0) + 1
    try:
        yield
    finally:
        _kernels.depth -= 1


def _autograd_inside_kernel():
    """A custom op's kernel runs below the autograd dispatch keys, so torch
    ops inside it record no graph; the recomputing backward needs one, so
    the kernel lets autograd back in (torch's private TLS guard, the one
    public ops use for the same purpose)."""
    return torch._C._SetExcludeDispatchKeyGuard(torch._C.DispatchKey.AutogradFunctionality, False)


def _no_alias(outs, inputs):
    """A custom op's outputs must not alias its inputs: copy any that does."""
    ptrs = {t.data_ptr() for t in inputs if t.numel()}
    return [o.clone() if o.numel() and o.data_ptr() in ptrs else o for o in outs]


class _GraphOp:
    """One graph function registered as fastgnn::<name> and its backward."""

    def __init__(self, name: str, inputs: tuple, sizes: tuple, eager: Callable,
                 fake: Callable):
        self.name, self.inputs, self.sizes = name, inputs, sizes
        self.eager, self.fake = eager, fake
        self.forward = self._register_forward()
        self.backward = self._register_backward()
        self.forward.register_autograd(self._autograd_backward, setup_context=_setup_context)

    def run(self, graph, tensors, sizes, static):
        """The eager function on the given tensors -> list of outputs."""
        given, kw = _arguments(static, sizes)
        out = self.eager(graph[0] if graph else None, *_expand(given, tensors), **kw)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def _register_forward(self):
        op = self

        @torch.library.custom_op(f"fastgnn::{self.name}", mutates_args=())
        def forward(graph: list[torch.Tensor], inputs: list[torch.Tensor], sizes: list[int],
                    static: str) -> list[torch.Tensor]:
            with torch.no_grad(), _kernel():
                return _no_alias(op.run(graph, inputs, sizes, static), (*graph, *inputs))

        @forward.register_fake
        def _(graph, inputs, sizes, static):
            given, kw = _arguments(static, sizes)
            return list(op.fake(graph[0] if graph else None, *_expand(given, inputs), **kw))

        return forward

    def _register_backward(self):
        op = self

        @torch.library.custom_op(f"fastgnn::{self.name}_backward", mutates_args=())
        def backward(graph: list[torch.Tensor], inputs: list[torch.Tensor],
                     grads: list[torch.Tensor], sizes: list[int], static: str,
                     needs: list[bool]) -> list[torch.Tensor]:
            # recompute the forward with autograd on the inputs that need a
            # gradient, then differentiate it (see the module docstring)
            with torch.enable_grad(), _autograd_inside_kernel(), _kernel():
                leaves = [t.detach().requires_grad_(n) for t, n in zip(inputs, needs)]
                outs = op.run(graph, leaves, sizes, static)
                pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad and g.numel()]
                wanted = [t for t, n in zip(leaves, needs) if n]
                got = (torch.autograd.grad([o for o, _ in pairs], wanted,
                                           [g for _, g in pairs], allow_unused=True)
                       if pairs and wanted else [None] * len(wanted))
            it = iter(got)
            result = []
            for t, n in zip(inputs, needs):
                g = next(it) if n else None
                result.append(g if g is not None else
                              torch.zeros_like(t) if n else t.new_empty(0))
            return result

        @backward.register_fake
        def _(graph, inputs, grads, sizes, static, needs):
            return [torch.empty_like(t) if n else t.new_empty(0) for t, n in zip(inputs, needs)]

        return backward

    def _autograd_backward(self, ctx, grads):
        """fastgnn::<name>'s autograd formula: fastgnn::<name>_backward on the
        saved inputs; no gradient for the graph tensors, the sizes and the static
        string."""
        saved = ctx.saved_tensors
        graph, inputs = list(saved[:ctx.n_graph]), list(saved[ctx.n_graph:])
        needs = [bool(n) for n in ctx.needs_input_grad[1]]
        if not any(needs):
            return [None] * len(graph), [None] * len(inputs), _no_gradient(ctx.sizes), None
        # outputs that got no cotangent (unused) pass an empty tensor
        grads = [g if g is not None else inputs[0].new_empty(0) for g in grads]
        got = self.backward(graph, inputs, grads, ctx.sizes, ctx.static, needs)
        return ([None] * len(graph), [g if n else None for g, n in zip(got, needs)],
                _no_gradient(ctx.sizes), None)


def _no_gradient(sizes):
    """The sizes' gradient in the structure torch.library expects: None for
    a list of ints (one leaf), [] for an empty list (a list of no tensors)."""
    return None if sizes else []


def _setup_context(ctx, inputs, output):
    graph, tensors, sizes, static = inputs
    ctx.save_for_backward(*graph, *tensors)
    ctx.n_graph = len(graph)
    ctx.sizes, ctx.static = sizes, static


def graph_op(name: str, inputs, fake: Callable, sizes=()):
    """Register `eager(graph, *inputs, **static)` as the custom ops
    fastgnn::<name> and fastgnn::<name>_backward (see the module docstring).

    inputs: the names of its tensor arguments, in order (each may be None).
    fake:   fake(graph, *inputs, **static) -> list of empty tensors with the
            outputs' shapes, dtypes and devices (it reads no data); under
            dynamic shapes the size arguments are symbols, so it computes
            with them and never reads them as ints.
    sizes:  the names of its size arguments (each an int, None, or a list
            of them): they travel as the op's SymInt[] argument, the rest of
            `static` as a constant.
    The eager function returns a tensor or a tuple of tensors."""
    def register(eager):
        if _SUPPORTED:
            _OPS[name] = _GraphOp(name, tuple(inputs), tuple(sizes), eager, fake)
        return eager
    return register


def registered() -> dict:
    """name -> the registered graph function (for tests and introspection)."""
    return dict(_OPS)


def op_arguments(name: str, graph: Optional[torch.Tensor], *inputs, **static) -> tuple:
    """The arguments (graph, inputs, sizes, static) of the custom op
    fastgnn::<name> for a call of graph function `name`: graph is the
    edge_index tensor (or None), inputs its tensor arguments in order (None
    allowed), static its other arguments (JSON values; its size arguments,
    symbolic or not, go into `sizes`)."""
    op = _OPS[name]
    if len(inputs) != len(op.inputs):
        raise TypeError(f"fastgnn::{name} takes {len(op.inputs)} tensor inputs {op.inputs}, "
                        f"got {len(inputs)}")
    for arg, t in zip(op.inputs, inputs):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{arg} must be a torch.Tensor, got {type(t).__name__}")
    given = tuple(t is not None for t in inputs)
    sizes: list = []
    slots = tuple((k, _pack_size(static.pop(k), sizes)) for k in op.sizes if k in static)
    static = tuple(sorted((k, _constant(v)) for k, v in static.items()))
    static += (("given", given), (_SIZES_KEY, slots))
    return ([] if graph is None else [graph], [t for t in inputs if t is not None], sizes,
            _encode(static))


def call(name: str, graph: Optional[torch.Tensor], *inputs, **static):
    """Run graph function `name` as its custom op (arguments as in
    `op_arguments`). Returns a tensor, or a tuple when the function returns
    several."""
    outs = _OPS[name].forward(*op_arguments(name, graph, *inputs, **static))
    return outs[0] if len(outs) == 1 else tuple(outs)


def warm_up(model: torch.nn.Module, *args, **kwargs) -> None:
    """Build, eagerly, every fastgnn cache that a compiled or captured run of
    `model(*args, **kwargs)` will read: one forward under torch.no_grad (what
    the compiled forward ops run) and one forward and backward (what the
    recomputing backward ops run); the gradients are cleared afterwards and
    no parameter changes. Call it before the first call of
    torch.compile(model, mode="reduce-overhead") or a CUDA graph capture:
    caches first built inside a CUDA graph's memory pool would be
    allocations the graph does not own (docs/compile.md)."""
    with torch.no_grad():
        model(*args, **kwargs)
    out = model(*args, **kwargs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    loss = sum(o.float().sum() for o in outs
               if isinstance(o, torch.Tensor) and o.requires_grad)
    if isinstance(loss, torch.Tensor):
        loss.backward()
    model.zero_grad(set_to_none=True)
