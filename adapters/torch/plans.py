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

Attention (edge_softmax, edge_attention, fp32/fp64): one line turns its
plan path off and sends those ops back to the bridge:

    fastgnn.torch.plans.ATTENTION_PLANS = False

(`_autograd.PLANS = False` turns every op's plans off). The attention
backward runs its plan where fastgnn/backends/cuda/attention.py's
`plan_serves_backward` says (its BACKWARD_PLANS switch off: never), else the
core's backward on the plan forward's residuals.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from fastgnn._array import check_deterministic, is_cupy
from fastgnn.backends.cuda.plan import address
from fastgnn.ops.segment import parse_reduce

from . import custom_ops
from ._autograd import PlanResiduals, _torch_stream_ptr, device_scope
from .gemm import tf32_allowed

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


# torch's current CUDA device index without torch.cuda.current_device()'s
# Python wrapper (the call it makes); CPU builds of torch lack it
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def _device_index(graph, t: torch.Tensor):
    """t's CUDA device index when a plan may run there: the graph's device and
    torch's current one (the CUfunctions and the stream are that device's);
    else None."""
    idx = t.get_device()          # (an int: no torch.device built)
    if graph is None or _graph_device(graph) != idx or _current_device() != idx:
        return None
    return idx


def _scope(t: torch.Tensor):
    """A device scope for t's device, built only when called (plan builds)."""
    return lambda: device_scope(t.device)


def _dense(t: torch.Tensor) -> torch.Tensor:
    """t contiguous and outside autograd (detached only where it needs it:
    a cotangent or a no-grad input already is)."""
    if t.requires_grad:
        t = t.detach()
    return t if t.is_contiguous() else t.contiguous()


def _spans(*tensors):
    return [(t.data_ptr(), t.element_size()) for t in tensors if t is not None]


def _ptr(t) -> int:
    return 0 if t is None else t.data_ptr()


def _bytes(n: int, like: torch.Tensor) -> torch.Tensor | None:
    """n uninitialised bytes on like's device (None for 0)."""
    return like.new_empty(n, dtype=torch.uint8) if n else None


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
    F, n = x.shape[1], graph.num_dst
    out = x.new_empty((n, len(codes) * F))
    vec = seg.vec_for(vtype, F, (x.data_ptr(), x.element_size()),
                      (out.data_ptr(), out.element_size()))
    plan = seg.fwd_plan(graph, codes, F, vtype, residuals, vec, context=_scope(x))
    # the residuals and the workspace in one allocation (one allocator call
    # less per call; the workspace, the split rows' partial states, is small)
    buffer = _bytes(plan.residual_bytes + plan.workspace_bytes, x)
    base = _ptr(buffer)
    addresses = seg.carve(base, plan.residual_offsets)
    ws = base + plan.residual_bytes if plan.workspace_bytes else 0
    plan.run(_torch_stream_ptr(x.get_device()), (x.data_ptr(), out.data_ptr(), *addresses, ws))
    if not residuals:
        return out, None
    return out, SegmentResiduals(codes, vtype, F, buffer, addresses,
                                 x if seg.reads_x(codes) else None)


def _bwd_ptrs(codes, x, residuals, g, addend, grad, ws):
    """BwdPlan.run's buffers of a backward of `codes`: x, the cotangent g,
    the residuals (SegmentResiduals.addresses' order), the walk's positions
    (argmax or argmin per arg term), addend, grad and workspace. Each an
    address (int, 0: absent) or a native program's table entry
    (`native.ProgramBuilder.run` takes either)."""
    argmax, argmin, mean, std, mul_out, mul_zero = residuals
    args = [argmax if c == "max" else argmin for c in _segment().arg_terms(codes)]
    args += [0] * (2 - len(args))
    return (x, g, mean, std, mul_out, mul_zero, args[0], args[1], addend, grad, ws)


def _bwd_plan(graph, res: SegmentResiduals, vec, g: torch.Tensor, addend, grad):
    """The cached BwdPlan of `res`'s request; its first call times the walk's
    forms on these buffers (g, addend, grad: tensors; grad None: a fresh one)."""
    seg = _segment()

    def buffers(plan):
        gr = grad if grad is not None else g.new_empty((graph.num_src, res.width))
        ws = _bytes(plan.workspace_bytes, g)
        return _bwd_ptrs(res.codes, _ptr(res.x), res.addresses, g.data_ptr(), _ptr(addend),
                         gr.data_ptr(), _ptr(ws)), (gr, ws)
    return seg.bwd_plan(graph, res.codes, res.width, res.vtype, seg.arg_terms(res.codes), vec,
                        context=_scope(g), stream=_torch_stream_ptr(g.get_device()),
                        buffers=buffers)


def segment_backward(graph, res: SegmentResiduals, g: torch.Tensor,
                     addend: torch.Tensor | None = None,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """x's gradient [num_src, F] (plus `addend`, summed before the single
    rounding) from the cotangent g [num_dst, R*F] of `segment_forward`'s
    output. out: where to write it (may be addend itself, as in
    `fastgnn.segment_reduce_bwd`); a new tensor when None."""
    seg = _segment()
    vtype, F = res.vtype, res.width
    g = _dense(g)
    if addend is not None:
        addend = _dense(addend)
        if vtype in ("float16", "bfloat16"):
            addend, out = addend.float(), None     # the walk adds acc_t (fp32) rows
    grad = out if out is not None else g.new_empty((graph.num_src, F))
    # (the residuals are carved ALIGN-aligned out of one allocation)
    vec = seg.vec_for(vtype, F, *_spans(res.x, addend, grad))
    plan = _bwd_plan(graph, res, vec, g, addend, grad)
    ws = _bytes(plan.workspace_bytes, g)     # (alive through the launches)
    plan.run(_torch_stream_ptr(g.get_device()),
             _bwd_ptrs(res.codes, _ptr(res.x), res.addresses, g.data_ptr(), _ptr(addend),
                       grad.data_ptr(), _ptr(ws)))
    return grad


def segment_native(graph, res: SegmentResiduals, out: torch.Tensor):
    """(Program, saved, held, addresses) of the native backward of a
    `segment_forward` call with residuals (see native.py): the BwdPlan that
    `segment_backward` runs (built now if new, the forward's output standing
    in for the cotangent while its walk is timed), on a fresh gradient."""
    from . import native
    seg = _segment()
    vec = seg.vec_for(res.vtype, res.width, *_spans(res.x), (0, out.element_size()))
    key = ("native_segment", res.codes, res.width, res.vtype, vec)
    program = graph.cache.get(key)
    if program is None:
        plan = _bwd_plan(graph, res, vec, out, None, None)
        # the call's addresses (table entries 0..6): x, then res.addresses
        b = native.ProgramBuilder("segment_reduce", 7, [out.shape], 1)
        grad = b.buffer((graph.num_src, res.width), out.dtype)
        ws = b.buffer((plan.workspace_bytes,), torch.uint8) if plan.workspace_bytes else 0
        b.run(plan, _bwd_ptrs(res.codes, b.address(0), [b.address(i) for i in range(1, 7)],
                              b.cotangent(0), 0, grad, ws))
        program = graph.cache.setdefault(key, b.build([grad], (plan,)))
    held = () if res.buffer is None else (res.buffer,)
    return program, res.aliased, held, (_ptr(res.x), *res.addresses)


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

    def native(self, graph, res, outs, needs):
        return segment_native(graph, res, outs[0])


SEGMENT_REDUCE = SegmentReducePath()


# ------------------------------------------------------------------- spmm
_spmm_be = None      # fastgnn.backends.cuda.spmm, imported on first use (needs CuPy)
# value types of the SpMM plan path: fp32/fp64 (16-bit features may take the
# block-sparse Tensor Core kernel, whose choice the bridge makes)
SPMM_VTYPES = {torch.float32: "float32", torch.float64: "float64"}
_SPMM_STATIC = frozenset({"reduce", "path", "row_scale", "col_scale", "csr_weights"})


def _spmm_backend():
    global _spmm_be
    if _spmm_be is None:
        from fastgnn.backends.cuda import spmm
        _spmm_be = spmm
    return _spmm_be


def _chunk(be, graph, F, vtype, weighted, scaled, bias, path):
    """The custom kernel's chunk size the backend's dispatch picks for this
    request (be.spmm), or None when that is cuSPARSE or not chosen yet
    ("auto" times the candidates on the bridge's first call on a graph of a
    new size class; every other graph of the class takes its choice)."""
    if scaled:
        return be.DEFAULT_CHUNK
    if path == "cusparse" and not bias and be.cusparse_supports(graph, vtype):
        return None
    if path != "auto" or graph.num_edges == 0 or F == 0:
        return be.DEFAULT_CHUNK
    choice = be.known_choice(graph, F, vtype, weighted, "bias" if bias else True)
    if choice is None or choice.path != "custom":
        return None
    return choice.option


def _acc_vector(t, n, acc, device):
    """A constant [n] scale (a tensor, detached by the caller) usable as the
    kernel's acc-type vector as it is, else None."""
    return (isinstance(t, torch.Tensor) and t.device == device and t.dtype == acc
            and t.dim() == 1 and t.shape[0] == n and t.is_contiguous())


def _weights_ok(cw, graph, acc: torch.dtype):
    """Whether constant CsrWeights serve the kernels as they are: CuPy
    arrays [E] in the acc type on the graph's device."""
    from fastgnn.ops.spmm import CsrWeights
    want = np.float64 if acc == torch.float64 else np.float32
    return (isinstance(cw, CsrWeights) and is_cupy(cw.csr) and is_cupy(cw.transposed)
            and cw.csr.dtype == cw.transposed.dtype == want
            and cw.csr.shape == cw.transposed.shape == (graph.num_edges,)
            and cw.csr.device.id == cw.transposed.device.id == graph.indices.device.id)


class SpmmResiduals(PlanResiduals):
    """What the SpMM backward needs: the transpose's weights and the scales
    (swapped for it), the chunk its dispatch picked, and whether there is a
    bias (its gradient: the column sums of the cotangent)."""
    __slots__ = ("vtype", "weights_t", "row_scale", "col_scale", "chunk_t", "has_bias")

    def __init__(self, vtype, weights_t, row_scale, col_scale, chunk_t, has_bias):
        self.vtype, self.weights_t, self.chunk_t = vtype, weights_t, chunk_t
        self.row_scale, self.col_scale, self.has_bias = row_scale, col_scale, has_bias
        self.aliased = ()


def _spmm_plan(be, graph, F, vtype, weighted, chunk, vec, device):
    """The custom kernel's cached SpmmPlan of this request (built inside a
    device scope the first time)."""
    plan = graph.cache.get(("cuda_spmm", F, vtype, weighted, chunk, vec))
    if plan is None:
        with device_scope(device):
            plan = be.spmm_plan(graph, F, vtype, weighted, chunk, vec)
    return plan


def _column_sum_plan(be, vtype, index_dtype, rows, cols):
    """The fixed-order column sums' plan of a [rows, cols] input."""
    return be.column_sum_plan("spmm", vtype, be._ITYPE[np.dtype(index_dtype)], rows, cols,
                              True, False)


def _run_spmm(be, graph, x, weights, row_scale, col_scale, bias, chunk, vtype):
    """out [num_dst, F] = the custom kernel's SpMM of x on torch buffers (the
    scales and weights given by address, 0: none)."""
    F = x.shape[1]
    out = x.new_empty((graph.num_dst, F))
    vec = be.spmm_vec(vtype, F, *_spans(x, out, bias))
    plan = _spmm_plan(be, graph, F, vtype, bool(weights), chunk, vec, x.device)
    ws = _bytes(plan.workspace_bytes, x)
    plan.run(_torch_stream_ptr(x.device.index),
             (x.data_ptr(), weights, row_scale, col_scale, _ptr(bias), out.data_ptr(), _ptr(ws)))
    return out


def column_sums(g: torch.Tensor, vtype: str, index_dtype) -> torch.Tensor:
    """[F] fixed-order column sums of g [N, F] (contiguous fp32/fp64, N, F >
    0) in g's dtype: the backend's ColumnSumPlan on torch buffers."""
    be = _spmm_backend()
    rows, cols = g.shape
    plan = _column_sum_plan(be, vtype, index_dtype, rows, cols)
    out = torch.empty(cols, dtype=g.dtype, device=g.device)
    ws = _bytes(plan.workspace_bytes, g)
    plan.run(_torch_stream_ptr(g.device.index), (g.data_ptr(), out.data_ptr(), _ptr(ws)))
    return out


def _inv_in_degree(graph, vtype, device):
    """[num_dst] 1/deg_in (the mean's row scale) in the acc type, cached on
    the graph by the core (built inside a device scope the first time)."""
    from fastgnn.ops.spmm import _inv_in_degree as build
    dtype = np.float64 if vtype == "float64" else np.float32
    inv = graph.cache.get(("inv_in_degree", np.dtype(dtype).name))
    if inv is None:
        with device_scope(device):
            inv = build(graph, dtype)
    return inv


def _tf32_tensor_cores(dtype) -> bool:
    """Whether an fp32 call may take the core's Tensor Core path as TF32
    (torch lets fp32 matmuls use TF32); the plans then ask the core's own
    rule (fastgnn.blocksparse.spmm_path / attention_path) and leave the calls
    it takes to the bridge."""
    return dtype == torch.float32 and tf32_allowed()


class SpmmPath:
    """`Op.cuda` of SPMM (inputs x, edge_weight, bias; static reduce, path,
    row_scale, col_scale, csr_weights). Takes fp32/fp64 x without
    edge_weight (constant CsrWeights, scales and a bias of x's dtype are
    fine) when the backend's dispatch runs the custom kernel both ways
    (its choices made, see `_chunk`); a mean with a caller's row_scale, fp32
    x that the Tensor Core rule takes as TF32 (`_tf32_tensor_cores`) and
    anything else take the bridge."""

    def forward(self, graph, static, tensors, needs):
        x, edge_weight, bias = tensors
        if (x is None or edge_weight is not None or x.dim() != 2 or x.dtype not in SPMM_VTYPES
                or graph is None or x.shape[0] != graph.num_src or x.shape[1] == 0
                or graph.num_dst == 0 or graph.num_src == 0
                or not _SPMM_STATIC.issuperset(static)):
            return None
        reduce, path = static.get("reduce", "sum"), static.get("path", "auto")
        if reduce not in ("sum", "mean") or path not in ("auto", "custom", "cusparse"):
            return None
        F, dev = x.shape[1], x.device
        if bias is not None and (bias.dtype != x.dtype or bias.dim() != 1 or bias.shape[0] != F
                                 or bias.device != dev):
            return None
        if _device_index(graph, x) is None:
            return None
        if path == "auto" and _tf32_tensor_cores(x.dtype):
            from fastgnn import blocksparse as tc
            if tc.spmm_path(graph, x, "float32", "auto", tf32=True):
                return None
        vtype = SPMM_VTYPES[x.dtype]
        acc = torch.float64 if vtype == "float64" else torch.float32
        r, c = static.get("row_scale"), static.get("col_scale")
        if ((r is not None and not _acc_vector(r, graph.num_dst, acc, dev))
                or (c is not None and not _acc_vector(c, graph.num_src, acc, dev))):
            return None
        be = _spmm_backend()
        if reduce == "mean":
            if r is not None:
                return None
            r = _inv_in_degree(graph, vtype, dev)
        cw = static.get("csr_weights")
        if cw is not None and not _weights_ok(cw, graph, acc):
            return None
        weighted = cw is not None
        scaled = r is not None or c is not None
        chunk = _chunk(be, graph, F, vtype, weighted, scaled, bias is not None, path)
        train = bool(needs["x"]) or (bias is not None and bool(needs["bias"]))
        chunk_t = None
        if needs["x"]:
            with device_scope(dev):
                t = graph.transpose()               # (device work, built once per graph)
            chunk_t = _chunk(be, t, F, vtype, weighted, scaled, False, path)
            if chunk_t is None:
                return None
        if chunk is None:
            return None
        out = _run_spmm(be, graph, _dense(x), _addr(None if cw is None else cw.csr), _addr(r),
                        _addr(c), None if bias is None else _dense(bias), chunk, vtype)
        res = (SpmmResiduals(vtype, None if cw is None else cw.transposed, r, c, chunk_t,
                             bias is not None) if train else None)
        return (out,), True, res

    def backward(self, graph, res, grad_outs, needs, tensor_kw):
        g, = grad_outs
        if g is None:
            return [None, None, None]
        g = _dense(g)
        gx = gb = None
        if needs["x"]:
            # x's gradient: the forward's kernel over the transpose, scales swapped
            be = _spmm_backend()
            t = graph.cache["transpose"]            # (the forward found it)
            gx = _run_spmm(be, t, g, _addr(res.weights_t), _addr(res.col_scale),
                           _addr(res.row_scale), None, res.chunk_t, res.vtype)
        if needs["bias"] and res.has_bias:
            gb = column_sums(g, res.vtype, graph.index_dtype)
        return [gx, None, gb]

    def native(self, graph, res, outs, needs):
        """(Program, saved, held, addresses) of the native backward (see
        native.py): the transpose's SpMM and the bias's column sums that
        `backward` runs; None where a scale is a caller's tensor (its
        address would be baked into the program)."""
        if isinstance(res.row_scale, torch.Tensor) or isinstance(res.col_scale, torch.Tensor):
            return None
        from . import native
        out, = outs
        F, vtype = out.shape[1], res.vtype
        want_x, want_bias = bool(needs["x"]), bool(needs["bias"]) and res.has_bias
        wt, rs, cs = _addr(res.weights_t), _addr(res.row_scale), _addr(res.col_scale)
        key = ("native_spmm", F, vtype, wt, rs, cs, res.chunk_t, want_x, want_bias)
        program = graph.cache.get(key)
        if program is None:
            be = _spmm_backend()
            b = native.ProgramBuilder("spmm", 0, [out.shape], 3)
            results, keep = [None, None, None], [res.weights_t, res.row_scale, res.col_scale]
            if want_x:
                t = graph.cache["transpose"]            # (the forward found it)
                # (a fresh gradient and a cotangent the node aligns to 16 bytes)
                vec = be.spmm_vec(vtype, F, (0, out.element_size()), (0, out.element_size()))
                plan = _spmm_plan(be, t, F, vtype, bool(wt), res.chunk_t, vec, out.device)
                gx = b.buffer((graph.num_src, F), out.dtype)
                ws = b.buffer((plan.workspace_bytes,), torch.uint8) if plan.workspace_bytes else 0
                # the forward's kernel over the transpose, scales swapped
                b.run(plan, (b.cotangent(0), wt, cs, rs, 0, gx, ws))
                results[0] = gx
                keep.append(plan)
            if want_bias:
                plan = _column_sum_plan(be, vtype, graph.index_dtype, graph.num_dst, F)
                gb = b.buffer((F,), out.dtype)
                ws = b.buffer((plan.workspace_bytes,), torch.uint8) if plan.workspace_bytes else 0
                b.run(plan, (b.cotangent(0), gb, ws))
                results[2] = gb
                keep.append(plan)
            program = graph.cache.setdefault(key, b.build(results, tuple(keep)))
        return program, (), (), ()


def _addr(a) -> int:
    """Address of a tensor, a backend array or None (0)."""
    return a.data_ptr() if isinstance(a, torch.Tensor) else address(a)


SPMM = SpmmPath()


# --------------------------------------------------------------- attention
# ATTENTION_PLANS = False sends edge_softmax and edge_attention back to the
# DLPack bridge (the other ops keep their plans; _autograd.PLANS turns all off).
ATTENTION_PLANS = True
_attn_be = None      # fastgnn.backends.cuda.attention, imported on first use (needs CuPy)
# value types of the attention plan path: fp32/fp64 (16-bit dot attention may
# take the block-sparse Tensor Core kernels, whose choice the bridge makes)
ATTN_VTYPES = SPMM_VTYPES
_ACC = {"float32": torch.float32, "float64": torch.float64}


def _attention_backend():
    global _attn_be
    if _attn_be is None:
        from fastgnn.backends.cuda import attention
        _attn_be = attention
    return _attn_be


def _drop(static):
    """The call's DropoutSpec (the core's validation: its errors)."""
    from fastgnn.backends.attention_spec import dropout_spec
    return dropout_spec(static.get("dropout", 0.0), static.get("seed", 0),
                        static.get("offset", 0))


class SoftmaxResiduals(PlanResiduals):
    """What the edge_softmax backward needs: the scores (a reference), lse,
    the dropout values of the forward."""
    __slots__ = ("scores", "lse", "drop", "vtype")

    def __init__(self, scores, lse, drop, vtype):
        self.scores, self.lse, self.drop, self.vtype = scores, lse, drop, vtype
        self.aliased = (scores,)


_SOFTMAX_STATIC = frozenset({"dropout", "seed", "offset"})


# _COMPILED: inside a torch.compile program (a custom op's kernel) the
# attention ops take the DLPack bridge, not their plans: under CUDA graph
# trees (mode="reduce-overhead") the plan path's TransformerConv program
# failed the trees' check that every output lies in their pool (H200), while
# the bridge passes it; a captured or compiled program pays host time once
# per replay or not at all, so the plans' saving matters in eager mode.
class EdgeSoftmaxPath:
    """`Op.cuda` of EDGE_SOFTMAX (static: dropout, seed, offset). Takes fp32/
    fp64 scores [E] or [E, H] on a graph with edges and targets."""

    def forward(self, graph, static, tensors, needs):
        if custom_ops.in_kernel():
            return None         # compiled programs take the bridge (see _COMPILED)
        s, = tensors
        if (not ATTENTION_PLANS or s is None or s.dtype not in ATTN_VTYPES
                or s.dim() not in (1, 2) or graph is None or graph.num_edges == 0
                or graph.num_dst == 0 or s.shape[0] != graph.num_edges
                or (s.dim() == 2 and s.shape[1] == 0)
                or not _SOFTMAX_STATIC.issuperset(static) or _device_index(graph, s) is None):
            return None
        drop = _drop(static)
        be = _attention_backend()
        x, vtype, dev = _dense(s), ATTN_VTYPES[s.dtype], s.device
        H = 1 if x.dim() == 1 else x.shape[1]
        out = torch.empty(x.shape, dtype=x.dtype, device=dev)
        lse = torch.empty((graph.num_dst, H), dtype=_ACC[vtype], device=dev)
        plan = be.softmax_plan(graph, H, vtype, False, context=_scope(x))
        plan.run(_torch_stream_ptr(dev.index),
                 (x.data_ptr(), out.data_ptr(), lse.data_ptr(), *be.drop_values(drop)))
        return (out,), True, (SoftmaxResiduals(x, lse, drop, vtype) if needs["scores"] else None)

    def backward(self, graph, res, grad_outs, needs, tensor_kw):
        g, = grad_outs
        if g is None or not needs["scores"]:
            return [None]
        be = _attention_backend()
        g, x = _dense(g), res.scores
        H = 1 if x.dim() == 1 else x.shape[1]
        gs = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        plan = be.softmax_plan(graph, H, res.vtype, True, context=_scope(x))
        plan.run(_torch_stream_ptr(x.device.index),
                 (x.data_ptr(), res.lse.data_ptr(), g.data_ptr(), gs.data_ptr(),
                  *be.drop_values(res.drop)))
        return [gs]


EDGE_SOFTMAX = EdgeSoftmaxPath()


_ATTN_INPUTS = ("a_src", "a_dst", "a_edge", "v", "xl", "xr", "att", "xe", "q", "k", "ee", "bias")
_ATTN_STATIC = frozenset({"score", "negative_slope", "scale", "dropout", "seed", "offset",
                          "return_attention_weights", "deterministic"})


class AttentionPlanResiduals(PlanResiduals):
    """What the edge_attention backward needs: the inputs (dense tensors by
    name), their caller shapes, the attention output without the bias, lse,
    the core's AttentionParams, and the inputs' dtypes."""
    __slots__ = ("score", "inputs", "shapes", "out", "lse", "params", "vtype", "in_dtypes")

    def __init__(self, score, inputs, shapes, out, lse, params, vtype, in_dtypes, returned):
        self.score, self.inputs, self.shapes, self.out, self.lse = score, inputs, shapes, out, lse
        self.params, self.vtype, self.in_dtypes = params, vtype, in_dtypes
        self.aliased = tuple(inputs.values()) + ((out,) if returned else ())

    def backend_view(self, name):
        """Input `name` in the backend's shape (fastgnn/ops/attention.py)."""
        return _backend_view(self.score, name, self.inputs.get(name), self.out.shape)

    def core(self, graph):
        """The core's AttentionResiduals on DLPack views of these tensors
        (inside a device scope)."""
        from fastgnn.ops.attention import AttentionResiduals
        from ._autograd import to_array
        arrays = {n: None for n in self.shapes_all()}
        for n in self.inputs:
            arrays[n] = to_array(self.backend_view(n))
        return AttentionResiduals(self.score, arrays, dict(self.shapes), to_array(self.out),
                                  to_array(self.lse), self.params, self.vtype, graph.num_src,
                                  graph.num_dst, graph.num_edges, False)

    def shapes_all(self):
        from fastgnn.backends.attention_spec import SCORE_INPUTS
        return SCORE_INPUTS[self.score]


def _backend_view(score, name, t, out_shape):
    if t is None:
        return None
    H, C = out_shape[1], out_shape[2]
    if name in ("att", "bias"):
        return t.reshape(H, C)
    if score == "gat" and name != "v":
        return t.reshape(t.shape[0], H, 1)
    return t


def _attention_inputs(graph, static, tensors):
    """(score, {name: tensor}, H, C, dtype) when the plan path may take this
    call's inputs (the shapes and dtypes the core accepts, on the plan's
    device), else None."""
    from fastgnn.backends.attention_spec import OPTIONAL_INPUTS, SCORE_INPUTS
    from fastgnn.graph import Graph
    from fastgnn.ops.attention import _ANCHOR, _shape_specs
    score = static.get("score")
    if (not ATTENTION_PLANS or not isinstance(score, str) or score not in SCORE_INPUTS
            or not isinstance(graph, Graph) or not _ATTN_STATIC.issuperset(static)
            or graph.num_edges == 0 or graph.num_dst == 0):
        return None
    names = SCORE_INPUTS[score]
    given = {}
    for n, t in zip(_ATTN_INPUTS, tensors):
        if t is None:
            if n in names and n not in OPTIONAL_INPUTS:
                return None
        elif n not in names:
            return None
        else:
            given[n] = t
    anchor = given[_ANCHOR[score]]
    if anchor.dim() != 3 or anchor.dtype not in ATTN_VTYPES:
        return None
    H, C = int(anchor.shape[1]), int(anchor.shape[2])
    if H < 1 or C < 1 or _device_index(graph, anchor) is None:
        return None
    specs = _shape_specs(score, graph, H, C)
    for n, t in given.items():
        want = specs[n][0]
        shape = tuple(t.shape)
        if not (shape == want or (n == "att" and shape == (1,) + want)
                or (n == "bias" and shape == (H * C,))):
            return None
        if t.dtype != anchor.dtype or t.device != anchor.device:
            return None
    return score, given, H, C, anchor.dtype


class EdgeAttentionPath:
    """`Op.cuda` of EDGE_ATTENTION (static: score, negative_slope, scale,
    dropout, seed, offset, return_attention_weights, deterministic). Takes
    fp32/fp64 inputs in the shapes the core accepts on a graph with edges
    and targets (no tensor_cores argument: 16-bit dot attention, and fp32
    dot attention that the Tensor Core rule may take as TF32 where torch
    allows TF32 (`_tf32_tensor_cores`), stay on the bridge). The backward takes the
    bridge (the core's backward on DLPack views of the residuals) where
    its plan does not serve."""

    op = None    # the torch Op it serves (set by attention.py: its bridge backward)

    def forward(self, graph, static, tensors, needs):
        if custom_ops.in_kernel():
            return None         # compiled programs take the bridge (see _COMPILED)
        got = _attention_inputs(graph, static, tensors)
        if got is None:
            return None
        score, given, H, C, dtype = got
        from fastgnn.backends.attention_spec import SLOT_NAMES
        from fastgnn.ops.attention import _attention_params
        params = _attention_params(score, static.get("negative_slope", 0.2),
                                   static.get("scale"), C, static.get("dropout", 0.0),
                                   static.get("seed", 0), static.get("offset", 0),
                                   static.get("deterministic", True))
        if score == "dot" and _tf32_tensor_cores(dtype):
            from fastgnn import blocksparse as tc
            if tc.attention_path(graph, score, given, params,
                                 bool(static.get("return_attention_weights")), "float32", "auto",
                                 tf32=True):
                return None
        be = _attention_backend()
        vtype, dev = ATTN_VTYPES[dtype], given[next(iter(given))].device
        nd, E = graph.num_dst, graph.num_edges
        inputs = {n: _dense(t) for n, t in given.items()}
        views = {n: _backend_view(score, n, t, (nd, H, C)) for n, t in inputs.items()}
        s_name, d_name, e_name, v_name = SLOT_NAMES[score]
        S, Dn, Ed, att, V = (views.get(n) for n in (s_name, d_name, e_name, "att", v_name))
        bias = views.get("bias")
        out = torch.empty((nd, H, C), dtype=dtype, device=dev)
        try:
            shape = be.shape_for(vtype, score, C, H, [t.data_ptr() for t in (
                (S, Dn, Ed, att, V, out) if score != "gat" else (V, out)) if t is not None],
                False)
        except NotImplementedError:
            return None                   # the bridge raises it
        want = bool(static.get("return_attention_weights", False))
        lse = torch.empty((nd, H), dtype=_ACC[vtype], device=dev)
        alpha = torch.empty((E, H), dtype=dtype, device=dev) if want else None
        out_b = torch.empty((nd, H, C), dtype=dtype, device=dev) if bias is not None else None
        plan = be.fwd_plan(graph, score, vtype, H, C, Ed is not None, bias is not None, want,
                           params, shape, context=_scope(out))
        ws = _bytes(plan.workspace_bytes, out)
        plan.run(_torch_stream_ptr(dev.index),
                 (*(_ptr(t) for t in (S, Dn, Ed, att, V, bias, out, out_b, lse, alpha, ws)),
                  *be.drop_values(params.drop)))
        ret = out if out_b is None else out_b
        res = None
        if any(needs.values()):
            shapes = {n: tuple(t.shape) for n, t in given.items()}
            res = AttentionPlanResiduals(score, inputs, shapes, out, lse, params, vtype,
                                         [None if t is None else t.dtype for t in tensors],
                                         out_b is None)
        return ((ret, alpha) if want else (ret,)), not want, res

    def backward(self, graph, res, grad_outs, needs, tensor_kw):
        from fastgnn.backends.attention_spec import SLOT_NAMES
        g = grad_outs[0]
        ga = grad_outs[1] if len(grad_outs) > 1 else None
        score, be, has = res.score, _attention_backend(), res.inputs
        s_name, d_name, e_name, v_name = SLOT_NAMES[score]
        wants = (bool(needs[s_name]), bool(needs[d_name]), e_name in has and bool(needs[e_name]),
                 score != "gatv2" and bool(needs[v_name]), score == "gatv2" and bool(needs["att"]))
        if tensor_kw or not be.plan_serves_backward(score, res.vtype, g, ga, res.params, wants):
            return _attention_bridge_backward(self.op, graph, res, grad_outs, needs, tensor_kw)
        g, out, dev = _dense(g), res.out, res.out.device
        H, C = out.shape[1], out.shape[2]
        S, Dn, Ed, att, V = (res.backend_view(n) for n in (s_name, d_name, e_name, "att", v_name))
        try:
            shape = be.shape_for(res.vtype, score, C, H, [t.data_ptr() for t in (
                (S, Dn, Ed, att, V, g, out) if score != "gat" else (V, g, out)) if t is not None],
                True)
        except NotImplementedError:
            return _attention_bridge_backward(self.op, graph, res, grad_outs, needs, tensor_kw)
        plan = be.bwd_plan(graph, score, res.vtype, H, C, Ed is not None, wants, res.params,
                           shape, context=_scope(out))
        made = [torch.empty(like.shape, dtype=like.dtype, device=dev) if want else None
                for want, like in zip(wants, (S, Dn, Ed, V))]
        gatt = torch.empty(H * C, dtype=out.dtype, device=dev) if wants[4] else None
        ws = _bytes(plan.workspace_bytes, g)
        plan.run(_torch_stream_ptr(dev.index),
                 (*(_ptr(t) for t in (S, Dn, Ed, att, V, res.lse, g, out, *made, gatt, ws)),
                  *be.drop_values(res.params.drop)))
        grads = {n: t for n, t in zip((s_name, d_name, e_name, v_name), made) if t is not None}
        if gatt is not None:
            grads["att"] = gatt
        if "bias" in has and needs["bias"]:
            grads["bias"] = column_sums(g.reshape(-1, H * C), res.vtype, graph.index_dtype)
        return [None if n not in grads else grads[n].reshape(res.shapes[n])
                for n in _ATTN_INPUTS]


def _attention_bridge_backward(op, graph, res, grad_outs, needs, tensor_kw):
    """The core's backward (the bridge) of `op` on the plan forward's residuals."""
    from ._autograd import _backward
    dev = res.out.device
    with device_scope(dev):
        core = res.core(graph)
        return _backward(op, graph, core, dev, False, res.in_dtypes, needs, grad_outs,
                         tensor_kw)


EDGE_ATTENTION = EdgeAttentionPath()
