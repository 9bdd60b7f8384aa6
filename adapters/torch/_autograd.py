"""One generic bridge from fastgnn forward/backward pairs to `torch.autograd`.

Every fastgnn op is a pure pair `out, res = fwd(graph, *arrays, **static)` /
`grads = bwd(graph, res, *grad_outs, **flags)` on NumPy (CPU) or CuPy (GPU)
arrays. An `Op` record says how to call one pair; `apply(op, graph, *tensors,
**static)` runs it under autograd through the single `FastgnnFunction`.

On CUDA an op with a launch plan path (`Op.cuda`, adapters/torch/plans.py)
runs its kernels' cached launch plans (fastgnn/backends/cuda/plan.py)
directly on torch-allocated buffers on PyTorch's current stream: no DLPack
exchange, no CuPy array and no device scope per call. The conversions below
serve the other calls (CPU tensors, ops or requests without a plan).

Conversion rules (the adapter converts, the core validates):

- tensors reach the backend by DLPack without a copy (`numpy.from_dlpack` on
  CPU, `cupy.from_dlpack` on CUDA) and results come back by `torch.from_dlpack`;
  non-contiguous inputs are made contiguous (a copy; inputs are never mutated);
- bfloat16 travels as int16 with `vtype="bfloat16"` (CuPy has no bf16 dtype);
  16-bit integer results of a bf16 op are viewed back as bfloat16;
- on CUDA the op runs on PyTorch's current stream and CuPy allocates from
  PyTorch's caching allocator, so `torch.cuda.max_memory_allocated` sees every
  output and workspace and the two libraries never hold separate pools.
"""
from __future__ import annotations

import threading
from typing import Callable, Mapping

import numpy as np
import torch
from torch.autograd.function import once_differentiable
from torch.utils.dlpack import from_dlpack as _from_capsule
from torch.utils.dlpack import to_dlpack as _to_dlpack

from fastgnn._array import data_ptr, is_cupy
from fastgnn.backends.cuda.streams import external_stream

from . import native as _native

__all__ = ["Op", "FastgnnFunction", "PlanResiduals", "apply", "device_scope", "to_array",
           "to_tensor"]

# False: every op takes the DLPack bridge, none its launch plans (tests and
# probes compare the two paths)
PLANS = True


class Op:
    """How to call one fastgnn forward/backward pair from PyTorch.

    fwd(graph, *arrays, **static, **fwd_flags[, vtype=...]) -> (out | tuple of outs, residuals)
    bwd(graph, residuals, *grad_outs, **bwd_flags) -> one gradient (or None) per input

    inputs:    names of the array inputs, in call order (used in error messages)
    features:  inputs that carry the op's value type (bf16 -> int16 + vtype)
    fwd_flags: {keyword: input name}: the keyword is True when that input needs a gradient
    bwd_flags: the same for bwd
    vtype_arg: fwd's value-type keyword, passed only for bfloat16 (None: the op has none)
    cuda:      the op's launch plan path on CUDA tensors, or None: an object with
               forward(graph, static, tensors, needs) -> None (this call takes
               the bridge) or (outputs tuple, single, PlanResiduals), and
               backward(graph, res, grad_outs, needs, tensor_kw) -> one
               gradient tensor or None per input (see adapters/torch/plans.py)
    cpu:       the op's CPU plan path, or None: forward as cuda's, serving only
               calls that need no gradient (adapters/torch/cpu_plans.py)
    """

    def __init__(self, name: str, fwd: Callable, bwd: Callable, inputs, *, features=(),
                 fwd_flags: Mapping[str, str] | None = None,
                 bwd_flags: Mapping[str, str] | None = None, vtype_arg: str | None = "vtype",
                 cuda=None, cpu=None):
        self.name = name
        self.fwd = fwd
        self.bwd = bwd
        self.inputs = tuple(inputs)
        self.features = tuple(features)
        self.fwd_flags = dict(fwd_flags or {})
        self.bwd_flags = dict(bwd_flags or {})
        self.vtype_arg = vtype_arg
        self.cuda = cuda
        self.cpu = cpu
        for name_ in (*self.features, *self.fwd_flags.values(), *self.bwd_flags.values()):
            if name_ not in self.inputs:
                raise ValueError(f"Op {name}: {name_!r} is not one of its inputs {self.inputs}")

    def __repr__(self):
        return f"Op({self.name}, inputs={self.inputs})"


# ---------------------------------------------------------------- CUDA context
# Host cost matters here: on small graphs a call is mostly Python, so the
# scope below enters only what is not already current, reads the stream as a
# raw pointer, and caches CuPy's stream wrappers and the allocator per device.
_local = threading.local()
_mallocs: dict = {}       # device -> allocator function
_cupy = None              # the cupy module, imported on first CUDA use
# cudaStream_t of PyTorch's current stream on a device, without building a
# torch.cuda.Stream (what torch.cuda.current_stream(d).cuda_stream returns;
# torch._inductor uses the same call); CPU builds lack it, hence the fallback.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _cupy_module():
    global _cupy
    if _cupy is None:
        import cupy
        _cupy = cupy
    return _cupy


def _torch_stream_ptr(device: int) -> int:
    """cudaStream_t (as int; 0 = legacy default) of PyTorch's current stream on `device`."""
    if _raw_stream is not None:
        return _raw_stream(device)
    return torch.cuda.current_stream(device).cuda_stream


def _cupy_stream(cupy, device: int):
    """CuPy's view of PyTorch's current stream on `device` (cached per handle)."""
    return external_stream(cupy, _torch_stream_ptr(device), device)


def _torch_malloc(cupy, device: int):
    """A CuPy allocator that takes its memory from PyTorch's caching allocator:
    each buffer is a uint8 tensor kept alive by the CuPy memory object."""
    fn = _mallocs.get(device)
    if fn is None:
        dev = torch.device("cuda", device)

        def fn(size):
            buf = torch.empty((size,), dtype=torch.uint8, device=dev)
            mem = cupy.cuda.UnownedMemory(buf.data_ptr(), size, buf, device)
            return cupy.cuda.MemoryPointer(mem, 0)
        _mallocs[device] = fn
    return fn


def _shares_stream(cupy, device: int) -> bool:
    """True when `device` is current for torch and CuPy and CuPy's current
    stream is PyTorch's current stream there. Then a DLPack exchange between
    the two needs no stream handshake: producer and consumer are one stream
    (the handshake would order a stream after itself)."""
    return (cupy.cuda.runtime.getDevice() == device
            and torch.cuda.current_device() == device
            and cupy.cuda.get_current_stream().ptr == _torch_stream_ptr(device))


def _shared_device(device):
    """The CUDA device index whose torch and CuPy current streams are one
    (see `_shares_stream`), or None (CPU, or they differ). Check it once per
    scope: nothing inside a fastgnn call changes the current stream."""
    if device.type != "cuda":
        return None
    idx = device.index if device.index is not None else torch.cuda.current_device()
    return idx if _shares_stream(_cupy_module(), idx) else None


class _Scope:
    """The context manager behind `device_scope`. Enters, in this order, only
    what is not already in place: torch's current device, CuPy's current
    device, PyTorch's current stream as CuPy's current stream, PyTorch's
    allocator as CuPy's; exits them in reverse order."""

    __slots__ = ("device", "entered", "prev")

    def __init__(self, device):
        self.device = device
        self.entered = None

    def __enter__(self):
        device = self.device
        if not isinstance(device, torch.device):
            device = torch.device(device)
        if device.type != "cuda":
            return None
        idx = device.index if device.index is not None else torch.cuda.current_device()
        prev = getattr(_local, "device", None)
        if prev == idx:                     # already inside a scope for it
            return None
        cupy = _cupy_module()
        entered = []
        try:
            if torch.cuda.current_device() != idx:
                _enter(entered, torch.cuda.device(idx))
            if cupy.cuda.runtime.getDevice() != idx:
                _enter(entered, cupy.cuda.Device(idx))
            _enter(entered, _cupy_stream(cupy, idx))
            _enter(entered, cupy.cuda.using_allocator(_torch_malloc(cupy, idx)))
        except BaseException:
            _unwind(entered, None, None, None)
            raise
        self.entered, self.prev = entered, prev
        _local.device = idx
        return None

    def __exit__(self, exc_type, exc, tb):
        entered, self.entered = self.entered, None
        if entered is not None:
            _local.device = self.prev
            _unwind(entered, exc_type, exc, tb)
            oom = _device_oom(exc, self.device)
            if oom is not None:
                raise oom from exc
        return False


def _device_oom(exc, device):
    """torch's OutOfMemoryError for a device allocation that failed inside a
    CUDA scope but reached here as another library's error: Thrust's
    temporary storage (CuPy's sorts, scans) turns the allocator's failure into
    `MemoryError: std::bad_alloc`, and CuPy's own pool raises its
    OutOfMemoryError. None for any other exception (torch's own OOM passes as
    it is)."""
    if exc is None or isinstance(exc, torch.OutOfMemoryError):
        return None
    cupy_oom = type(exc).__name__ == "OutOfMemoryError" and type(exc).__module__.startswith("cupy")
    if not (cupy_oom or (isinstance(exc, MemoryError) and "bad_alloc" in str(exc))):
        return None
    return torch.OutOfMemoryError(
        f"CUDA out of memory in fastgnn on {device} ({type(exc).__name__}: {exc}). Free memory "
        "(smaller batches, fewer cached graphs: fastgnn.torch.clear_graph_cache()) or use a "
        "device with more memory.")


def _enter(entered: list, cm):
    cm.__enter__()
    entered.append(cm)      # only once entered: _unwind exits exactly these


def _unwind(entered: list, exc_type, exc, tb):
    """Exit the entered context managers in reverse order, as nested `with`
    blocks would; all are exited even if one raises (the first error is re-raised)."""
    error = None
    while entered:
        try:
            entered.pop().__exit__(exc_type, exc, tb)
        except BaseException as e:  # noqa: BLE001  (re-raised below)
            if error is None:
                error = e
    if error is not None:
        raise error


def device_scope(device):
    """Run fastgnn calls for tensors on `device`: on CUDA, make it current for
    torch and CuPy, launch on PyTorch's current stream and allocate from
    PyTorch's caching allocator. A no-op on CPU. Re-entrant."""
    return _Scope(device)


# ------------------------------------------------------------- conversions
_INT16_FOR_BF16 = torch.int16


def _plain(t: torch.Tensor) -> torch.Tensor:
    """t detached and contiguous, bf16 viewed as int16."""
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(_INT16_FOR_BF16)
    return t


def _to_array(t: torch.Tensor, shared):
    """to_array; `shared` is `_shared_device(...)` when the caller knows it."""
    t = _plain(t)
    if t.device.type == "cuda":
        cupy = _cupy_module()
        if shared == t.device.index and not t.is_complex():
            # producer and consumer on one stream: the capsule without the
            # handshake of Tensor.__dlpack__ (torch's to_dlpack does none)
            return cupy.from_dlpack(_to_dlpack(t))
        return cupy.from_dlpack(t)          # the full protocol (orders the streams)
    if t.device.type != "cpu":
        raise TypeError(f"fastgnn supports CPU and CUDA tensors, got device {t.device}")
    return np.from_dlpack(t)


def to_array(t: torch.Tensor):
    """Tensor -> NumPy/CuPy array sharing its memory (contiguous; bf16 as int16).
    On CUDA call it inside `device_scope` so the producer and consumer streams agree."""
    return _to_array(t, _shared_device(t.device))


_TORCH_DTYPES = {np.dtype(k): getattr(torch, v) for k, v in (
    (np.float32, "float32"), (np.float64, "float64"), (np.float16, "float16"),
    (np.int16, "int16"), (np.uint16, "uint16"), (np.int32, "int32"), (np.int64, "int64"),
    (np.uint8, "uint8"), (np.int8, "int8"), (np.bool_, "bool")) if hasattr(torch, v)}


def _owner_view(a):
    """The C-contiguous CuPy array `a` as a tensor on the storage of the
    PyTorch buffer it was allocated in (`_torch_malloc`), or None when it was
    not. Such a tensor has PyTorch's own storage and deleter, which CUDA
    graph trees (torch.compile mode="reduce-overhead") need to manage their
    memory pool; a DLPack tensor carries a foreign deleter. It is set on the
    storage rather than sliced from the buffer, so autograd does not see a
    view (callers may edit results in place, as with DLPack tensors)."""
    data = a.data
    owner = getattr(data.mem, "_owner", None)
    dtype = _TORCH_DTYPES.get(a.dtype)
    if not isinstance(owner, torch.Tensor) or dtype is None or not a.flags.c_contiguous:
        return None
    offset = data.ptr - owner.data_ptr()
    if offset % a.itemsize or offset < 0 or offset + a.nbytes > owner.numel():
        return None
    t = torch.empty((0,), dtype=dtype, device=owner.device)
    return t.set_(owner.untyped_storage(), offset // a.itemsize, a.shape,
                  tuple(s // a.itemsize for s in a.strides))


def _to_tensor(a, bf16: bool, shared):
    """to_tensor; `shared` is `_shared_device(...)` when the caller knows it."""
    t = _owner_view(a) if is_cupy(a) and a.size else None
    if t is None and shared is not None and is_cupy(a) and a.device.id == shared:
        # one stream on both sides: stream=-1 asks CuPy for no handshake
        t = _from_capsule(a.__dlpack__(stream=-1))
    elif t is None:
        t = torch.from_dlpack(a)
    if bf16 and t.dtype in (torch.int16, torch.uint16):
        t = t.view(torch.bfloat16)
    return t


def to_tensor(a, bf16: bool = False) -> torch.Tensor:
    """NumPy/CuPy array -> tensor sharing its memory; 16-bit integer results of
    a bf16 op are viewed as bfloat16."""
    shared = None
    if is_cupy(a):
        idx = a.device.id
        shared = idx if _shares_stream(_cupy_module(), idx) else None
    return _to_tensor(a, bf16, shared)


_LEAVES = (str, bytes, int, float, complex, type(None), np.generic, np.dtype)


def _arrays_in(obj, depth=0, found=None):
    """Backend arrays held by a residuals object (dataclass, tuple, dict, ...),
    as a list (one accumulator through the recursion: no generator chain)."""
    found = [] if found is None else found
    if depth > 3 or isinstance(obj, _LEAVES):   # scalars, names, shapes' entries
        return found
    if isinstance(obj, np.ndarray) or type(obj).__module__.startswith("cupy"):
        found.append(obj)
        return found
    if isinstance(obj, (tuple, list)):
        items = obj
    elif isinstance(obj, dict):
        items = obj.values()
    elif hasattr(obj, "__dict__"):
        items = vars(obj).values()
    else:
        return found
    for o in items:
        if o is not None:
            _arrays_in(o, depth + 1, found)
    return found


_CPU = torch.device("cpu")


def _device_of(tensors):
    for t in tensors:
        if t is not None and t.is_cuda:        # (an attribute read: no torch.device built)
            return t.device
    return _CPU


# ---------------------------------------------------------------- autograd
class PlanResiduals:
    """Base of what an op's launch plan path keeps for its backward (torch
    tensors and addresses). `aliased`: the input and output tensors whose
    memory the residuals read, saved so that autograd's version check
    catches in-place edits between forward and backward."""
    __slots__ = ("aliased",)


def _forward(op: Op, graph, static: dict, tensors, needs: dict, done=None):
    """op.fwd on the tensors' arrays, with each fwd flag set from `needs`
    (input name -> gradient wanted): (outputs as tensors, single output?,
    residuals, bf16?, device). On CUDA, the op's launch plan path when it
    serves the call."""
    device = _device_of(tensors)
    plan = op.cuda if device.type == "cuda" else op.cpu
    if done is None and plan is not None and PLANS:
        done = plan.forward(graph, static, tensors, needs)
    if done:
        outs, single, res = done
        return outs, single, res, False, device
    bf16 = any(t is not None and t.dtype == torch.bfloat16
               for name, t in zip(op.inputs, tensors) if name in op.features)
    with device_scope(device):
        shared = _shared_device(device)
        arrays = [None if t is None else _to_array(t, shared) for t in tensors]
        kw = dict(static)
        if bf16 and op.vtype_arg:
            kw[op.vtype_arg] = "bfloat16"
        for key, name in op.fwd_flags.items():
            kw[key] = needs[name]
        out, res = op.fwd(graph, *arrays, **kw)
        single = not isinstance(out, tuple)
        outs = tuple(_to_tensor(a, bf16, shared) for a in ((out,) if single else out))
    return outs, single, res, bf16, device


class FastgnnFunction(torch.autograd.Function):
    """The one autograd.Function for every fastgnn op: forward(ctx, op, graph,
    static, *tensors). Use `apply` rather than calling it directly."""

    @staticmethod
    def forward(ctx, op: Op, graph, static: dict, done, *tensors):
        # done: the plan path's forward when `apply` already ran it (False:
        # it does not serve the call; None: not asked yet)
        needs = dict(zip(op.inputs, ctx.needs_input_grad[4:]))
        outs, single, res, bf16, device = _forward(op, graph, static, tensors, needs, done)
        ctx.op, ctx.graph, ctx.bf16, ctx.device = op, graph, bf16, device
        if any(needs.values()) and isinstance(res, PlanResiduals):
            ctx.res = res
            ctx.save_for_backward(*res.aliased)
        elif any(needs.values()):
            ctx.res = res
            ctx.in_dtypes = [None if t is None else t.dtype for t in tensors]
            # Residuals may alias input memory (DLPack views). Saving those
            # inputs makes autograd's version check catch in-place edits
            # between forward and backward instead of giving wrong gradients.
            # The same holds for outputs the residuals share (attention keeps `out`).
            ptrs = {data_ptr(a) for a in _arrays_in(res)} - {None}
            ctx.save_for_backward(*[t for t in (*tensors, *outs)
                                    if t is not None and t.numel() and t.data_ptr() in ptrs])
        else:
            ctx.res = None
        nondiff = [o for o in outs if not (o.is_floating_point() or o.is_complex())]
        if nondiff:
            ctx.mark_non_differentiable(*nondiff)
        return outs[0] if single else outs

    @staticmethod
    @once_differentiable
    def backward(ctx, *grad_outs):
        op = ctx.op
        n_in = len(op.inputs)
        if ctx.res is None:
            return (None, None, None, None) + (None,) * n_in
        ctx.saved_tensors  # noqa: B018  (raises if a saved input was modified in place)
        needs = dict(zip(op.inputs, ctx.needs_input_grad[4:]))
        out = _backward(op, ctx.graph, ctx.res, ctx.device, ctx.bf16,
                        getattr(ctx, "in_dtypes", None), needs, grad_outs)
        return (None, None, None, None, *out)


def _backward(op: Op, graph, res, device, bf16: bool, in_dtypes, needs: dict, grad_outs,
              tensor_kw: Mapping | None = None):
    """op.bwd(graph, res, *cotangent arrays, **bwd flags, **tensor_kw as
    arrays) -> one gradient tensor (in its input's dtype) or None per input;
    the other half of `_forward`. A tensor given under several keywords is
    converted once (one array object: the op may rely on their identity).
    Residuals of the op's launch plan path go back to that path."""
    if isinstance(res, PlanResiduals):
        return op.cuda.backward(graph, res, grad_outs, needs, tensor_kw or {})
    with device_scope(device):
        shared = _shared_device(device)
        garrs = [None if g is None else _to_array(g, shared) for g in grad_outs]
        kw = {key: needs[name] for key, name in op.bwd_flags.items()}
        converted = {}
        for key, t in (tensor_kw or {}).items():
            if t is not None and id(t) not in converted:
                converted[id(t)] = _to_array(t, shared)
            kw[key] = None if t is None else converted[id(t)]
        grads = op.bwd(graph, res, *garrs, **kw)
        if len(grads) != len(op.inputs):
            raise RuntimeError(f"{op.name}_bwd returned {len(grads)} gradients "
                               f"for {len(op.inputs)} inputs")
        out = []
        for name, g, dt in zip(op.inputs, grads, in_dtypes):
            if g is None or not needs[name]:
                out.append(None)
                continue
            t = _to_tensor(g, bf16 and name in op.features, shared)
            out.append(t if t.dtype == dt else t.to(dt))
    return out


def apply(op: Op, graph, *tensors, **static):
    """Run `op` on torch tensors with autograd: `op.fwd(graph, *arrays, **static)`
    forward, `op.bwd` backward. `tensors` are the op's array inputs in order
    (None allowed); `static` are its non-array keywords."""
    if len(tensors) != len(op.inputs):
        raise TypeError(f"{op.name} takes {len(op.inputs)} array inputs {op.inputs}, "
                        f"got {len(tensors)}")
    first = None                        # (name, dtype) of the first feature input
    for name, t in zip(op.inputs, tensors):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t is not None and t.layout != torch.strided:
            raise TypeError(f"{name} must be a dense tensor, got layout {t.layout}")
        if t is not None and name in op.features:
            # one value type per call (bf16 travels as int16 for all of them)
            if first is None:
                first = (name, t.dtype)
            elif t.dtype != first[1]:
                raise TypeError(f"{name} must have {first[0]}'s dtype {first[1]}, got {t.dtype} "
                                f"({op.name} takes its inputs in one dtype)")
    if not (torch.is_grad_enabled()
            and any(t is not None and t.requires_grad for t in tensors)):
        # nothing to differentiate (torch.no_grad, or no input requires grad):
        # the forward alone, told that no gradient is wanted (no residuals, no
        # max/min positions), without an autograd node. Inside
        # autograd.Function.forward, ctx.needs_input_grad follows requires_grad
        # even under no_grad, so this is where inference is recognised.
        outs, single, _, _, _ = _forward(op, graph, static, tensors,
                                         dict.fromkeys(op.inputs, False))
        return outs[0] if single else outs
    cuda = op.cuda
    if cuda is not None and PLANS and hasattr(cuda, "native"):
        device = _device_of(tensors)
        if device.type == "cuda" and _native.available():
            needs = {name: t is not None and t.requires_grad for name, t in zip(op.inputs, tensors)}
            done = cuda.forward(graph, static, tensors, needs)
            if done is None:                    # the bridge serves it
                return FastgnnFunction.apply(op, graph, static, False, *tensors)
            outs, single, res = done
            spec = cuda.native(graph, res, outs, needs)
            if spec is None:
                return FastgnnFunction.apply(op, graph, static, done, *tensors)
            program, saved, held, addresses = spec
            outs = _native.attach(program, outs, tensors, saved, held, addresses,
                                  _torch_stream_ptr(device.index))
            return outs[0] if single else tuple(outs)
    return FastgnnFunction.apply(op, graph, static, None, *tensors)

