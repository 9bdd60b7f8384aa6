"""The CUDA fast path of `segment_reduce_linear`'s reduction (forward,
inference forward and backward), for the fused node of
`functional._SegmentReduceLinear`.

On graphs of ~10^5 nodes a SAGEConv(aggr="max") call is mostly host time,
and the generic bridge (`_autograd._forward` / `_backward`: a device scope,
a DLPack exchange per tensor, the core's validation of what the node made
itself, CuPy allocations) is half of it: 0.29 of the backward's 0.58 ms on
uniform17 on an H200 (benchmarks/dev/probe_backward_handoff.py). Here the node hands the backend's cached
launch plans (fastgnn/backends/cuda/segment.py: FwdPlan, BwdPlan) the
addresses of torch-allocated buffers, on PyTorch's current stream: no DLPack,
no CuPy array, no scope (except while a plan is built, once per graph and
request). The kernels, their arguments and the numbers are the generic
path's; only the host work around them differs.

Taken when `usable` says so: a CUDA tensor x of a supported dtype on the
device CuPy has current (the compiled kernels are per device) and the
graph's, a deterministic backward or one without max/min terms (the atomic
path stays generic), and no empty side. The public function has validated
the rest (shapes, dtypes, reduce).
"""
from __future__ import annotations

import torch

from fastgnn._array import is_cupy

from ._autograd import _cupy_module, _cupy_stream, device_scope

VTYPES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
          torch.bfloat16: "bfloat16"}
_seg = None          # fastgnn.backends.cuda.segment, imported on first use (needs CuPy)


def _backend():
    global _seg
    if _seg is None:
        from fastgnn.backends.cuda import segment
        _seg = segment
    return _seg


def _graph_device(graph):
    """CUDA device index of the graph's arrays, or None for a CPU graph (cached)."""
    return graph.cached("cuda_device_index",
                        lambda: graph.indices.device.id if is_cupy(graph.indices) else None)


def usable(graph, x: torch.Tensor, codes: tuple, deterministic: bool) -> bool:
    """Whether this call takes the fast path (see the module docstring)."""
    if not x.is_cuda or x.dtype not in VTYPES or x.dim() != 2:
        return False
    if not deterministic and ("max" in codes or "min" in codes):
        return False
    if x.shape[1] == 0 or x.shape[0] != graph.num_src or graph.num_dst == 0:
        return False
    idx = x.device.index
    return _graph_device(graph) == idx and _cupy_module().cuda.runtime.getDevice() == idx


def _scope(device):
    return lambda: device_scope(device)


def _spans(*tensors):
    return [(t.data_ptr(), t.element_size()) for t in tensors if t is not None]


class Residuals:
    """What `backward` needs from `forward`: the request, the residual
    buffer (argmax, argmin, mean, std, mul's two, carved by the plan's
    residual_offsets) and x where var/std/mul read it."""
    __slots__ = ("codes", "vtype", "width", "buffer", "addresses", "x")

    def __init__(self, codes, vtype, width, buffer, addresses, x):
        self.codes, self.vtype, self.width = codes, vtype, width
        self.buffer, self.addresses, self.x = buffer, addresses, x


def forward(graph, x: torch.Tensor, codes: tuple, residuals: bool):
    """(out [num_dst, R*F] in x's dtype, Residuals or None): the reductions
    `codes` of x [num_src, F] over the graph; residuals for `backward` when
    asked (training)."""
    seg = _backend()
    vtype = VTYPES[x.dtype]
    x = x.detach()
    if not x.is_contiguous():
        x = x.contiguous()
    dev, F, n = x.device, x.shape[1], graph.num_dst
    out = torch.empty((n, len(codes) * F), dtype=x.dtype, device=dev)
    vec = seg.vec_for(vtype, F, *_spans(x, out))
    plan = seg.fwd_plan(graph, codes, F, vtype, residuals, vec, context=_scope(dev))
    buffer = (torch.empty(plan.residual_bytes, dtype=torch.uint8, device=dev)
              if plan.residual_bytes else None)
    addresses = seg.carve(None if buffer is None else buffer.data_ptr(), plan.residual_offsets)
    ws = (torch.empty(plan.workspace_bytes, dtype=torch.uint8, device=dev)
          if plan.workspace_bytes else None)
    plan.launch(x.data_ptr(), out.data_ptr(), addresses, None if ws is None else ws.data_ptr(),
                stream=_cupy_stream(_cupy_module(), dev.index))
    if not residuals:
        return out, None
    keep_x = x if any(c in ("var", "std", "mul") for c in codes) else None
    return out, Residuals(codes, vtype, F, buffer, addresses, keep_x)


def backward(graph, res: Residuals, g: torch.Tensor, addend: torch.Tensor | None = None,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """x's gradient [num_src, F] (plus `addend`, summed before the single
    rounding) from the cotangent g [num_dst, R*F] of `forward`'s output.
    out: where to write it (may be addend itself, as in
    `fastgnn.segment_reduce_bwd`); a new tensor when None."""
    seg = _backend()
    vtype, F, dev = res.vtype, res.width, g.device
    g = g.detach()
    if not g.is_contiguous():
        g = g.contiguous()
    if addend is not None and vtype in ("float16", "bfloat16"):
        addend, out = addend.float(), None     # the walk adds acc_t (fp32) rows
    grad = out if out is not None else torch.empty((graph.num_src, F), dtype=g.dtype, device=dev)
    argmax, argmin, mean, std, mul_out, mul_zero = res.addresses
    walk_args = seg.arg_terms(res.codes)
    args = [argmax if c == "max" else argmin for c in walk_args]
    # (the residuals are carved _ALIGN-aligned out of one allocation)
    vec = seg.vec_for(vtype, F, *_spans(res.x, addend, grad))
    plan = seg.bwd_plan(graph, res.codes, F, vtype, walk_args, vec, context=_scope(dev))
    ws = (torch.empty(plan.workspace_bytes, dtype=torch.uint8, device=dev)
          if plan.workspace_bytes else None)
    plan.launch(None if res.x is None else res.x.data_ptr(), g.data_ptr(), mean, std,
                (mul_out, mul_zero), args, None if addend is None else addend.data_ptr(),
                grad.data_ptr(), None if ws is None else ws.data_ptr(),
                stream=_cupy_stream(_cupy_module(), dev.index))
    return grad
