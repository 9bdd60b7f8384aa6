"""The CUDA launch plan path of the ops (`Op.cuda` in `_autograd.py`): each
op's cached launch plans (fastgnn/backends/cuda/plan.py) run on
torch-allocated buffers (`torch.empty`: PyTorch's caching allocator, so CUDA
graph capture records them) given by address, on PyTorch's current stream.

On small graphs a call is mostly host time, and the DLPack bridge (a device
scope, a DLPack exchange per tensor, CuPy arrays and allocations, the
core's validation of what the adapter made itself) is most of it. Here a
call looks its plan up on the graph (built once per (graph, request),
inside a device scope), allocates its buffers and launches: the kernels,
their arguments and so the results are the bridge's (GPU tests hold the two
bitwise equal).

A path serves a call when it can do so without the core's checks: CUDA
tensors of a supported dtype and shape on the graph's device, which is
torch's current one, and a request it has plans for. Anything else
returns None and takes the bridge, which validates and raises as it always
did, so errors are the core's. Validation that the plan path does itself
(the reductions' names, the deterministic switch) is the core's own
functions.
"""
from __future__ import annotations

import functools

import torch

from fastgnn._array import check_deterministic, is_cupy
from fastgnn.ops.segment import parse_reduce

from ._autograd import PlanResiduals, _torch_stream_ptr, device_scope

VTYPES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
          torch.bfloat16: "bfloat16"}
_seg = None          # fastgnn.backends.cuda.segment, imported on first use (needs CuPy)


def _segment():
    global _seg
    if _seg is None:
        from fastgnn.backends.cuda import segment
        _seg = segment
    return _seg


def _graph_device(graph):
    """CUDA device index of the graph's arrays, or None for a CPU graph (the
    backends' graph_device, cached under its key)."""
    return graph.cached("cuda_device_index",
                        lambda: graph.indices.device.id if is_cupy(graph.indices) else None)


def _device_index(graph, t: torch.Tensor):
    """t's CUDA device index when a plan may run there: the graph's device and
    torch's current one (the CUfunctions and the stream are that device's);
    else None."""
    idx = t.device.index
    if graph is None or _graph_device(graph) != idx or torch.cuda.current_device() != idx:
        return None
    return idx


def _scope(device):
    return lambda: device_scope(device)


def _dense(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return t if t.is_contiguous() else t.contiguous()


def _spans(*tensors):
    return [(t.data_ptr(), t.element_size()) for t in tensors if t is not None]


def _ptr(t) -> int:
    return 0 if t is None else t.data_ptr()


def _bytes(n: int, device) -> torch.Tensor | None:
    return torch.empty(n, dtype=torch.uint8, device=device) if n else None


# ------------------------------------------------------- segment reductions
@functools.lru_cache(maxsize=256)
def _codes_of(reduce):
    return parse_reduce(reduce)[0]


def _codes(reduce) -> tuple:
    """The reductions as a tuple (parse_reduce, memoised per hashable request)."""
    key = reduce if isinstance(reduce, str) else tuple(reduce) if isinstance(
        reduce, (list, tuple)) else reduce
    try:
        return _codes_of(key)
    except TypeError:               # unhashable entries: parse_reduce says what is wrong
        return parse_reduce(reduce)[0]


class SegmentResiduals(PlanResiduals):
    """What the backward needs from the forward: the request, the residual
    buffer (argmax, argmin, mean, std, mul's two, carved by the plan's
    residual_offsets; `addresses`) and x where var/std/mul read it."""
    __slots__ = ("codes", "vtype", "width", "buffer", "addresses", "x")

    def __init__(self, codes, vtype, width, buffer, addresses, x):
        self.codes, self.vtype, self.width = codes, vtype, width
        self.buffer, self.addresses, self.x = buffer, addresses, x
        self.aliased = () if x is None else (x,)


def segment_forward(graph, x: torch.Tensor, codes: tuple, residuals: bool):
    """(out [num_dst, R*F] in x's dtype, SegmentResiduals or None): the
    reductions `codes` of x [num_src, F] (contiguous, on the plan's device)
    over the graph; residuals for `segment_backward` when asked (training)."""
    seg = _segment()
    vtype = VTYPES[x.dtype]
    dev, F, n = x.device, x.shape[1], graph.num_dst
    out = torch.empty((n, len(codes) * F), dtype=x.dtype, device=dev)
    vec = seg.vec_for(vtype, F, *_spans(x, out))
    plan = seg.fwd_plan(graph, codes, F, vtype, residuals, vec, context=_scope(dev))
    buffer = _bytes(plan.residual_bytes, dev)
    addresses = seg.carve(_ptr(buffer), plan.residual_offsets)
    ws = _bytes(plan.workspace_bytes, dev)
    plan.run(_torch_stream_ptr(dev.index), (x.data_ptr(), out.data_ptr(), *addresses, _ptr(ws)))
    if not residuals:
        return out, None
    keep_x = x if any(c in ("var", "std", "mul") for c in codes) else None
    return out, SegmentResiduals(codes, vtype, F, buffer, addresses, keep_x)


def segment_backward(graph, res: SegmentResiduals, g: torch.Tensor,
                     addend: torch.Tensor | None = None,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """x's gradient [num_src, F] (plus `addend`, summed before the single
    rounding) from the cotangent g [num_dst, R*F] of `segment_forward`'s
    output. out: where to write it (may be addend itself, as in
    `fastgnn.segment_reduce_bwd`); a new tensor when None."""
    seg = _segment()
    vtype, F, dev = res.vtype, res.width, g.device
    g = _dense(g)
    if addend is not None:
        addend = _dense(addend)
        if vtype in ("float16", "bfloat16"):
            addend, out = addend.float(), None     # the walk adds acc_t (fp32) rows
    grad = out if out is not None else torch.empty((graph.num_src, F), dtype=g.dtype, device=dev)
    argmax, argmin, mean, std, mul_out, mul_zero = res.addresses
    walk_args = seg.arg_terms(res.codes)
    args = [argmax if c == "max" else argmin for c in walk_args] + [0] * (2 - len(walk_args))
    # (the residuals are carved _ALIGN-aligned out of one allocation)
    vec = seg.vec_for(vtype, F, *_spans(res.x, addend, grad))
    plan = seg.bwd_plan(graph, res.codes, F, vtype, walk_args, vec, context=_scope(dev))
    ws = _bytes(plan.workspace_bytes, dev)
    plan.run(_torch_stream_ptr(dev.index),
             (_ptr(res.x), g.data_ptr(), mean, std, mul_out, mul_zero, args[0], args[1],
              _ptr(addend), grad.data_ptr(), _ptr(ws)))
    return grad


_SEGMENT_STATIC = frozenset({"reduce", "deterministic"})


class SegmentReducePath:
    """`Op.cuda` of SEGMENT_REDUCE (static: reduce, deterministic). Takes a
    2-D x of a supported dtype with rows and features, on a graph with
    targets; a backward with float atomics (deterministic=False with max or
    min) stays on the bridge."""

    def forward(self, graph, static, tensors, needs):
        x, = tensors
        if (x is None or x.dim() != 2 or x.dtype not in VTYPES or graph is None
                or x.shape[0] != graph.num_src or x.shape[1] == 0 or graph.num_dst == 0
                or not _SEGMENT_STATIC.issuperset(static) or _device_index(graph, x) is None):
            return None
        codes = _codes(static.get("reduce", "sum"))
        det = check_deterministic(static.get("deterministic", True))
        train = bool(needs["x"])
        if train and not det and ("max" in codes or "min" in codes):
            return None
        out, res = segment_forward(graph, _dense(x), codes, train)
        return (out,), True, res

    def backward(self, graph, res, grad_outs, needs, tensor_kw):
        g, = grad_outs
        if g is None or not needs["x"]:
            return [None]
        return [segment_backward(graph, res, g, tensor_kw.get("addend"), tensor_kw.get("out"))]


SEGMENT_REDUCE = SegmentReducePath()
