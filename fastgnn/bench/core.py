"""Benchmark machinery: the case registry, timing, memory and failure capture.

A *case* is one thing to measure (an op such as `spmm_sum`, or a layer such
as `GCNConv`) on one graph, dtype and width. It lists *implementations*
(fastgnn and the baselines); each builds a `Prepared` callable once (graph
structures, caches, modules: outside timing) and is then run the same way:

    1. agreement: one forward and one forward+backward, compared with the
       case's float32 reference on the same (dtype-rounded) inputs;
    2. timing: `warmup` calls, then the median of `repeats` calls, forward
       (under torch.no_grad) and forward+backward (torch.autograd.grad with a
       fixed upstream gradient) separately; CUDA events on the GPU,
       time.perf_counter over blocks of calls of about CPU_BLOCK_MS on the
       CPU;
    3. memory (GPU): peak torch.cuda.max_memory_allocated over one
       steady-state forward+backward, plus CuPy's pool if it holds anything;
       and `needed_mib`, what must exist anyway: the memory allocated before
       the call (inputs, parameters, cotangent, graph and its caches) plus the
       output and gradients it returns (`peak_over_needed` = peak / needed).

Any exception is caught per phase and recorded ("oom", "unsupported" or
"error" with its message); nothing a baseline does stops the run.

New families register cases with `register(Case(...))`.
"""
from __future__ import annotations

import gc
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

# ------------------------------------------------------------------ registry


@dataclass
class Prepared:
    """A built implementation, ready to call."""
    forward: Callable[[], object]          # () -> output tensor [num_dst, F_out]
    inputs: list                           # tensors to differentiate; inputs[0] is x
    info: Callable[[], dict] | None = None  # extra record fields after running (path chosen)
    backward: bool = True                  # False: forward only
    cleanup: Callable[[], None] | None = None   # drop caches this build made (module-level ones)


@dataclass
class Impl:
    """One implementation of a case (fastgnn or a baseline)."""
    name: str                               # e.g. "fastgnn[auto]", "torch.sparse.mm[csr]"
    settings: str                           # how it was run, for the report
    build: Callable[["Ctx"], Prepared]      # may raise: recorded, never fatal
    fastgnn: bool = False                   # True for fastgnn's own implementations
    devices: tuple = ("cpu", "cuda")
    available: Callable[[], str | None] = lambda: None   # reason it cannot run, or None
    per_edge: bool = False                  # materialises per-edge [E, ...] tensors: slow at
                                            # scale (--lean-above may skip it in 16-bit dtypes)


@dataclass
class Case:
    name: str                               # "spmm_sum", "GCNConv"
    kind: str                               # "op" or "layer"
    family: str                             # "spmm"
    description: str
    impls: Callable[["Ctx"], list]          # ctx -> [Impl]
    reference: Callable[["Ctx"], Prepared]  # float32 reference on ctx.x_ref
    floor_bytes: Callable[["Ctx"], tuple] | None = None   # ctx -> (fwd bytes, fwd+bwd bytes)
    default: bool = True                    # part of the default suite


CASES: dict[str, Case] = {}


def register(case: Case) -> Case:
    if case.name in CASES:
        raise ValueError(f"benchmark case {case.name!r} registered twice")
    CASES[case.name] = case
    return case


@dataclass
class Ctx:
    """Inputs shared by every implementation of one (graph, case, dtype, width)."""
    torch: object
    device: object            # torch.device
    dtype: object             # torch dtype of features / parameters
    dtype_name: str           # "fp32", "bf16"
    width: int
    graph: object             # bench.graphs.BenchGraph
    x: object                 # [n, width] features in dtype (no grad)
    x_ref: object             # x rounded to dtype, as float32
    grad_out: object          # [n, width_out] upstream gradient in dtype
    seed: int = 0
    state: dict = field(default_factory=dict)   # per-case shared data (e.g. layer weights)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def leaf(self, t=None):
        """A fresh leaf tensor sharing x's storage, requiring grad."""
        return (self.x if t is None else t).detach().requires_grad_(True)


# ------------------------------------------------------------------ failures


def classify(exc: BaseException) -> str:
    """'oom', 'unsupported' or 'error' for an exception from a baseline."""
    name = type(exc).__name__
    msg = str(exc).lower()
    if "outofmemory" in name.lower() or "out of memory" in msg:
        return "oom"
    if isinstance(exc, NotImplementedError) or any(
            s in msg for s in ("not supported", "not implemented", "unsupported",
                               "does not support", "no kernel", "not yet supported")):
        return "unsupported"
    return "error"


def describe(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."


def reason(errors: dict, limit: int = 160) -> str | None:
    """One short line from a record's `errors` ({phase: "Type: message"}):
    the distinct messages, in phase order, cut to `limit` characters."""
    msgs = list(dict.fromkeys(m for m in (errors or {}).values() if m))
    if not msgs:
        return None
    text = " | ".join(msgs)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def free_memory(torch, full=False):
    """Return freed memory to the device. A full gc pass (slow with torch and
    PyG loaded: ~0.4 s) only after failures, whose tracebacks hold cycles."""
    gc.collect(2 if full else 0)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    cp = sys.modules.get("cupy")
    if cp is not None:
        try:
            cp.get_default_memory_pool().free_all_blocks()
        except Exception:
            pass


def cupy_pool_mib():
    """MiB in use in CuPy's default pool (0 if CuPy is not loaded)."""
    cp = sys.modules.get("cupy")
    if cp is None:
        return 0.0
    try:
        return cp.get_default_memory_pool().used_bytes() / 2**20
    except Exception:
        return 0.0


# ------------------------------------------------------------------ timing


# On the CPU each measurement times a block of back-to-back calls lasting
# about this long (at least one call) and divides by its calls: a single call
# of tens of microseconds, timed alone, measures the caches and allocator
# state the previous implementation left (the quick bench's spmm forward on
# rmat10, 12k edges, F = 32: 0.087 ms per single call, 0.033 ms in a block).
CPU_BLOCK_MS = 5.0


def cpu_block_calls(first_ms: float) -> int:
    """Calls per timed CPU block, from one call's time (ms)."""
    return max(1, min(1000, int(CPU_BLOCK_MS / max(first_ms, 1e-3))))


def time_calls(torch, fn, *, repeats: int, warmup: int, cuda: bool, cpu_blocks: bool = True):
    """(median ms, min ms) per call of fn over `repeats` measurements after
    `warmup` calls: one call per measurement between CUDA events on the GPU,
    a block of `cpu_block_calls` calls (about CPU_BLOCK_MS) on the CPU, or
    with cpu_blocks=False one call there too (fn then runs exactly warmup +
    repeats times: a training step of milliseconds that must not be run
    more often than asked)."""
    for _ in range(warmup):
        fn()
    times = []
    if cuda:
        torch.cuda.synchronize()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(repeats)]
        for start, end in ev:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) for s, e in ev]
    else:
        calls = 1
        if cpu_blocks:
            t0 = time.perf_counter()
            fn()
            calls = cpu_block_calls((time.perf_counter() - t0) * 1e3)
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - t0) * 1e3 / calls)
    return statistics.median(times), min(times)


def rel_err(torch, out, ref_cpu) -> float:
    """||out - ref|| / ||ref|| with ref kept on the host (moved over for the check)."""
    if tuple(out.shape) != tuple(ref_cpu.shape):
        raise ValueError(f"output shape {tuple(out.shape)} != reference {tuple(ref_cpu.shape)}")
    ref = ref_cpu.to(out.device)
    o = out.detach().float()
    if not torch.isfinite(o).all():
        return float("inf")
    den = torch.linalg.vector_norm(ref).item()
    num = torch.linalg.vector_norm(o - ref).item()
    return num / den if den > 0 else num


def run_reference(torch, ctx: Ctx, case: Case):
    """(out, grad_x) of the case's float32 reference, on the host; either may be
    None when it fails (the failure text is returned third)."""
    prep, failed = None, False
    try:
        prep = case.reference(ctx)
        out = prep.forward()
        grad = None
        if prep.backward:
            g = ctx.grad_out.float()
            grad = torch.autograd.grad(out, prep.inputs[0], g, allow_unused=True)[0]
            grad = None if grad is None else grad.detach().float().cpu()
        out = out.detach().float().cpu()
        return out, grad, None
    except Exception as exc:  # noqa: BLE001 - recorded
        failed = True
        return None, None, describe(exc)
    finally:
        if prep is not None and prep.cleanup is not None:
            prep.cleanup()
        del prep
        free_memory(torch, full=failed)


def measure(torch, ctx: Ctx, impl: Impl, ref_out, ref_grad, *, repeats: int, warmup: int):
    """Build, check and time one implementation; returns the record fields."""
    rec = {"fwd_ms": None, "fwd_bwd_ms": None, "fwd_ms_min": None, "fwd_bwd_ms_min": None,
           "peak_mib": None, "peak_fwd_mib": None, "rel_err": None, "rel_err_grad": None,
           "status": {}, "errors": {}}

    def fail(phase, exc):
        rec["status"][phase] = classify(exc)
        rec["errors"][phase] = describe(exc)

    cuda = ctx.cuda
    try:
        prep = impl.build(ctx)
    except Exception as exc:  # noqa: BLE001
        fail("fwd", exc)
        fail("fwd_bwd", exc)
        free_memory(torch, full=True)
        rec["reason"] = reason(rec["errors"])
        return rec

    try:
        # -------- forward: agreement, then time (inference: no autograd graph)
        try:
            with torch.no_grad():
                out = prep.forward()
                if ref_out is not None:
                    rec["rel_err"] = rel_err(torch, out, ref_out)
                del out
                rec["fwd_ms"], rec["fwd_ms_min"] = time_calls(
                    torch, prep.forward, repeats=repeats, warmup=warmup, cuda=cuda)
            rec["status"]["fwd"] = "ok"
        except Exception as exc:  # noqa: BLE001
            fail("fwd", exc)
            free_memory(torch, full=True)

        # -------- forward + backward
        def fwd_bwd():
            out = prep.forward()
            return torch.autograd.grad(out, prep.inputs, ctx.grad_out, allow_unused=True)

        if not prep.backward:
            rec["status"]["fwd_bwd"] = "unsupported"
            rec["errors"]["fwd_bwd"] = "no backward for this implementation"
        else:
            try:
                grads = fwd_bwd()
                if ref_grad is not None and grads[0] is not None:
                    rec["rel_err_grad"] = rel_err(torch, grads[0], ref_grad)
                del grads
                rec["fwd_bwd_ms"], rec["fwd_bwd_ms_min"] = time_calls(
                    torch, fwd_bwd, repeats=repeats, warmup=warmup, cuda=cuda)
                rec["status"]["fwd_bwd"] = "ok"
            except Exception as exc:  # noqa: BLE001
                fail("fwd_bwd", exc)
                free_memory(torch, full=True)

        # -------- peak memory over one steady-state call
        if cuda:
            rec["peak_fwd_mib"] = _peak(torch, lambda: _no_grad_call(torch, prep.forward))[0] \
                if rec["status"].get("fwd") == "ok" else None
            if rec["status"].get("fwd_bwd") == "ok":
                def fwd_bwd_out():
                    out = prep.forward()
                    grads = torch.autograd.grad(out, prep.inputs, ctx.grad_out, allow_unused=True)
                    return (out.detach(),) + tuple(grads)
                rec["peak_mib"], resident, produced = _peak(torch, fwd_bwd_out)
                if resident is not None:
                    # what must exist anyway: everything live before the call
                    # (inputs, parameters, cotangent, graph and its caches)
                    # plus the output and the gradients the call returns
                    rec["resident_mib"] = resident
                    rec["needed_mib"] = round(resident + produced, 1)
                    rec["peak_over_needed"] = round(rec["peak_mib"] / rec["needed_mib"], 3) \
                        if rec["needed_mib"] else None
            else:
                rec["peak_mib"] = rec["peak_fwd_mib"]
            pool = cupy_pool_mib()
            if pool > 0:
                rec["cupy_pool_mib"] = round(pool, 1)
        if prep.info is not None:
            try:
                rec.update(prep.info())
            except Exception as exc:  # noqa: BLE001
                rec["errors"]["info"] = describe(exc)
    finally:
        if prep.cleanup is not None:
            try:
                prep.cleanup()
            except Exception:  # noqa: BLE001
                pass
        del prep
        free_memory(torch)
    rec["reason"] = reason(rec["errors"])
    return rec


def _no_grad_call(torch, fn):
    with torch.no_grad():
        return fn()


def _peak(torch, fn):
    """(peak MiB over one call of fn, MiB allocated before it, MiB of the
    tensors it returns); Nones if the call fails."""
    try:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        resident = torch.cuda.memory_allocated()
        res = fn()
        torch.cuda.synchronize()
        items = res if isinstance(res, (tuple, list)) else (res,)
        produced = sum(t.numel() * t.element_size() for t in items
                       if isinstance(t, torch.Tensor))
        del res, items
        return (round(torch.cuda.max_memory_allocated() / 2**20, 1),
                round(resident / 2**20, 1), round(produced / 2**20, 1))
    except Exception:  # noqa: BLE001 - a failure here was already seen while timing
        return None, None, None
