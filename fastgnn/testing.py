"""Shared test builders and tolerance tables (used by tests and benchmarks)."""
from __future__ import annotations

import numpy as np

# relative-norm tolerances ||out - ref|| / ||ref|| by value type
TOLERANCES = {"float64": 1e-10, "float32": 1e-5, "tf32": 5e-4, "float16": 1e-2, "bfloat16": 1e-2}


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN anywhere gives inf)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        raise AssertionError(f"shape {out.shape} != reference shape {ref.shape}")
    if not np.isfinite(out).all():
        return float("inf")
    den = np.linalg.norm(ref)
    num = np.linalg.norm(out - ref)
    return float(num / den) if den > 0 else float(num)


def assert_close(out, ref, vtype="float32", what="output", tol=None):
    err = rel_err(out, ref)
    tol = TOLERANCES[vtype] if tol is None else tol
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.0e} ({vtype})"


def assert_results_match(ours, ref, vtype="float64", base=None, *, noise_scale=None, skip=()):
    """Compare {name: tensor or None} results (outputs and gradients, as
    float64 torch tensors) with a reference run: the same names; where the
    reference has None ours is None or zero; the same shapes; relative errors
    within TOLERANCES[vtype], or within twice the reference's own error in the
    same dtype (`base`: a run of the reference in that dtype) where larger.

    noise_scale: the largest gradient norm of the reference; an entry whose
    reference norm is below 1e-9 of it is zero in exact arithmetic, so both
    sides hold only rounding noise: ours must stay within 10 tolerances of
    noise_scale (or 4x the base run's norm). skip: names compared elsewhere."""
    assert sorted(ours) == sorted(ref), f"{sorted(ours)} != {sorted(ref)}"
    for what, r in ref.items():
        if what in skip:
            continue
        o = ours[what]
        if r is None:
            assert o is None or not o.any(), f"{what}: the reference has none, ours is nonzero"
            continue
        assert o is not None, f"{what}: missing"
        assert o.shape == r.shape, f"{what}: shape {tuple(o.shape)} != {tuple(r.shape)}"
        has_base = base is not None and base.get(what) is not None
        if noise_scale is not None and r.norm() <= 1e-9 * noise_scale:
            bound = 10 * TOLERANCES[vtype] * noise_scale
            if has_base:
                bound = max(bound, 4 * float(base[what].norm()))
            assert o.norm() <= bound, f"{what}: norm {o.norm():.2e} > {bound:.1e}, reference ~0"
            continue
        err = rel_err(o.numpy(), r.numpy())
        tol = TOLERANCES[vtype]
        if has_base:
            tol = max(tol, 2 * rel_err(base[what].numpy(), r.numpy()))
        assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e} ({vtype})"


def awkward_edge_index(num_nodes=300, num_edges=2000, *, hub_degree=None, seed=None,
                       num_src=None):
    """A random edge index [2, E] (int64, NumPy) with every awkward case in it:
    empty rows (the last tenth of the targets gets no in-edges), self-loops,
    duplicate edges and a hub target (node 0) with `hub_degree` in-edges.
    Pass num_src for a bipartite graph (no self-loops then)."""
    rng = np.random.default_rng(seed)
    n_dst = num_nodes
    n_src = num_nodes if num_src is None else num_src
    hub_degree = max(num_edges // 5, 1) if hub_degree is None else hub_degree
    live = max(n_dst - max(n_dst // 10, 1), 1)          # targets that may get edges
    src = rng.integers(0, n_src, num_edges)
    dst = rng.integers(0, live, num_edges)
    hub_src = rng.integers(0, n_src, hub_degree)
    parts_s, parts_d = [src, hub_src], [dst, np.zeros(hub_degree, dtype=np.int64)]
    if num_src is None:                                  # self-loops
        loops = rng.integers(0, live, max(num_edges // 50, 1))
        parts_s.append(loops)
        parts_d.append(loops)
    dup = rng.integers(0, num_edges, max(num_edges // 20, 1))   # duplicates
    parts_s.append(src[dup])
    parts_d.append(dst[dup])
    s, d = np.concatenate(parts_s), np.concatenate(parts_d)
    perm = rng.permutation(s.shape[0])                   # caller order != CSR order
    return np.stack([s[perm], d[perm]]).astype(np.int64)


def rmat_edge_index(scale, edge_factor=16, a=0.57, b=0.19, c=0.19, *, seed=0,
                    dedup=True, self_loops=False, xp=np):
    """R-MAT power-law graph with 2**scale nodes and about edge_factor * 2**scale
    edges, generated with `xp` (numpy, or cupy to build on the GPU): the draws
    of `fastgnn.generators.rmat_draws`."""
    from .generators import rmat_draws
    src, dst, n = rmat_draws(scale, edge_factor, a, b, c, seed=seed, xp=xp)
    if not self_loops:
        keep = src != dst
        src, dst = src[keep], dst[keep]
    if dedup:
        key = xp.unique(src * n + dst)
        src, dst = key // n, key % n
    return xp.stack([src, dst]), n


# ------------------------------------------------------------- devices
def devices():
    """pytest params for every device: "cpu", and "cuda" marked `gpu` (skipped
    unless CuPy sees a device)."""
    import pytest

    from ._array import gpu_available
    return ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not gpu_available(), reason="needs a CUDA device visible to CuPy")])]


def to_device(a, device):
    """NumPy array -> the backend array of `device` ("cpu" or "cuda")."""
    if device == "cpu" or a is None:
        return a
    import cupy
    return cupy.asarray(a)


def to_numpy(a):
    if a is None:
        return None
    return a.get() if hasattr(a, "get") else np.asarray(a)


def to_bf16_bits(x):
    """float array -> uint16 bfloat16 bit patterns (round to nearest even)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16)


def from_bf16_bits(b):
    """uint16 bfloat16 bit patterns -> float32."""
    return (np.asarray(b).astype(np.uint32) << 16).view(np.float32)


def fresh_pyg_class(cls):
    """A new subclass of a PyG MessagePassing layer, for reference layers in
    tests. PyG 2.8 renders a layer class's `propagate` once, from the first
    instance's `fuse` flag: after e.g. `SAGEConv(aggr=["mean", "max"])`
    (fuse off) every later `SAGEConv` fed a sparse adj_t raises "'message_and
    _aggregate' not implemented". A fresh subclass gets its own rendering, so
    test order cannot matter."""
    return type(cls.__name__, (cls,), {})


def shapes_seen():
    """A torch dispatch mode that records the shape of every tensor a torch
    op returns while it is active, in `.shapes` (to check that no tensor of
    some size is made, e.g. per edge)."""
    from torch import Tensor
    from torch.utils._python_dispatch import TorchDispatchMode

    class ShapesSeen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.shapes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, Tensor):
                    self.shapes.append(tuple(t.shape))
            return out
    return ShapesSeen()


def pyg_test_folder():
    """PyG's test/nn/conv (a checkout's: FASTGNN_PYG_TESTS, or beside an
    installed PyG source tree), or None where it is not found."""
    import os
    from pathlib import Path

    import torch_geometric
    candidates = [os.environ.get("FASTGNN_PYG_TESTS"),
                  Path(torch_geometric.__file__).resolve().parents[1] / "test" / "nn" / "conv"]
    for folder in candidates:
        if folder and (Path(folder) / "test_gen_conv.py").is_file():
            return Path(folder)
    return None


def _parametrized_cases(fn):
    """The keyword sets a pytest test function runs with (its parametrize marks)."""
    import itertools

    marks = [m for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"]
    grids = []
    for mark in marks:
        names = [n.strip() for n in mark.args[0].split(",")] if isinstance(mark.args[0], str) \
            else list(mark.args[0])
        values = [v if len(names) > 1 else (v,) for v in mark.args[1]]
        grids.append([dict(zip(names, v)) for v in values])
    return [dict(kv for part in combo for kv in part.items())
            for combo in itertools.product(*grids)] if grids else [{}]


def run_pyg_test_file(path, replacements: dict) -> int:
    """Run the test functions of PyG's test file `path` that name one of
    `replacements` ({name in the file: our class}) with ours bound in their
    place, every parametrized case; functions needing fixtures, or packages
    this environment lacks (ImportError), are left out. Returns how many
    cases ran; a failing one raises."""
    import importlib.util
    import inspect
    from pathlib import Path

    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"pyg_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, cls in replacements.items():
        setattr(module, name, cls)
    ran = 0
    for fn_name, fn in sorted(vars(module).items()):
        if not fn_name.startswith("test_") or not callable(fn):
            continue
        if not any(name in inspect.getsource(fn) for name in replacements):
            continue
        for kwargs in _parametrized_cases(fn):
            if set(inspect.signature(fn).parameters) - set(kwargs):
                continue                        # a fixture of PyG's conftest
            try:
                fn(**kwargs)
            except ImportError:
                continue                        # a package PyG's test needs, absent here
            ran += 1
    return ran


# ------------------------------------------------------ the fake CUDA world
class FakeKernel:
    """A compiled kernel as the CUDA loader returns it: .kernel.ptr is the CUfunction."""

    def __init__(self, ptr):
        self.kernel = type("Function", (), {"ptr": ptr})()


class NumpyAsCupy:
    """NumPy under CuPy's name, on device 0."""
    cuda = type("cuda", (), {"runtime": type("runtime", (), {"getDevice": staticmethod(
        lambda: 0)})})

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def asnumpy(a):
        return np.asarray(a)

    @staticmethod
    def get_array_module(*arrays):
        return np


def numpy_task_lists(indptr, order, chunk):
    """fastgnn.backends.cuda.graph_build.task_lists in NumPy (fake_cuda's
    plans on CPU graphs): each row, in visit order, ceil(deg / chunk) tasks
    (an empty row one); the split rows' tasks numbered as slots in task order."""
    deg = np.diff(indptr).astype(np.int64)
    rows = np.arange(deg.shape[0]) if order is None else np.asarray(order, dtype=np.int64)
    ntask = np.maximum(-(-deg[rows] // chunk), 1)
    split = ntask > 1
    row = np.repeat(rows, ntask)
    first = np.repeat(np.r_[0, np.cumsum(ntask)[:-1]], ntask).astype(np.int64)
    begin = indptr[row] + (np.arange(row.shape[0]) - first) * chunk
    split_task = np.repeat(split, ntask)
    slot = np.where(split_task, np.cumsum(split_task) - 1, -1)
    idx = indptr.dtype
    return (row.astype(idx), begin.astype(idx), slot.astype(idx), rows[split].astype(idx),
            np.r_[0, np.cumsum(ntask[split])].astype(idx), int(ntask[split].sum()))


class Launches(list):
    """The launches fake_cuda records, (func, grid, block, smem, stream,
    params) each; `timed` holds (kernel name, parameter values) of those
    made while a choice was being timed."""

    def __init__(self):
        super().__init__()
        self.timed = []
        self.native = []


def fake_cuda(monkeypatch, wide_walk_wins=True, native_node=False):
    """fastgnn.torch's CUDA plan path on CPU tensors, without a GPU (CuPy must
    import): plans build on CPU graphs (NumPy task lists, kernels that are
    addresses), their launches are recorded in the returned `Launches` as
    (func, grid, block, smem, stream, params) instead of made, and the torch
    bridge takes the plan path for CPU tensors (their device read as cuda:0,
    the stream as 0xabc). The segment backward's timed choice of walk runs
    each form once (their kernels' names and parameter values recorded in
    `Launches.timed`, not among the launches) and "measures" the wide
    form faster when `wide_walk_wins`, else the one-edge form. With
    `native_node`, the ops whose plans serve their backward attach the native
    backward node (fastgnn.torch.native, built for this torch), whose
    launches are recorded in `Launches.native` as (func, grid, block, smem,
    stream, parameter values); else they keep their Python nodes. `monkeypatch`
    is pytest's (or a pytest.MonkeyPatch); undoing it restores everything.
    Serves the plan tests (tests/test_launch_plans.py) and measuring the plan
    path's host cost on a CPU (benchmarks/dev/probe_plan_host_fake.py)."""
    import torch

    from fastgnn.backends.cuda import attention as cuda_attention
    from fastgnn.backends.cuda import decisions, plan, segment
    from fastgnn.backends.cuda import spmm as cuda_spmm
    from fastgnn.torch import _autograd, plans

    names = {}

    def get_function(family, vtype, itype, name):
        ptr = names.setdefault((family, vtype, itype, name), 0x10000 + 16 * len(names))
        return FakeKernel(ptr)

    launches = Launches()

    def launch_kernel(func, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        launches.append((func, (gx, gy, gz), (bx, by, bz), smem, stream, params))

    monkeypatch.setattr(cuda_spmm, "cp", NumpyAsCupy())   # task_plan with NumPy
    monkeypatch.setattr(cuda_spmm, "task_lists", numpy_task_lists)
    monkeypatch.setattr(decisions, "_decided", {})         # every size class timed anew
    monkeypatch.setattr(segment, "_scratch", lambda rows, F, vtype: np.empty((rows, F)))
    monkeypatch.setattr(segment, "_capturing", lambda stream: False)
    # the backward walk's two forms "timed" (one-edge first, then the wide
    # one): each runs once, its launches kept apart, and the clock says which won
    clock = iter(([2.0, 1.0] if wide_walk_wins else [1.0, 2.0]) * 1000)

    timing = []
    fill = plan.Launch.fill

    def recording_fill(self, ptrs):
        fill(self, ptrs)
        if timing:
            launches.timed.append((self.name, self.values[:len(self.kinds)].copy()))

    def median_ms(fn, **kw):
        n = len(launches)
        timing.append(True)
        try:
            fn()
        finally:
            timing.pop()
        del launches[n:]
        return next(clock)
    monkeypatch.setattr(plan.Launch, "fill", recording_fill)
    monkeypatch.setattr(segment, "median_ms", median_ms)
    monkeypatch.setattr(segment, "get_function", get_function)
    monkeypatch.setattr(cuda_spmm, "get_function", get_function)
    monkeypatch.setattr(cuda_attention, "get_function", get_function)
    monkeypatch.setattr(cuda_attention, "cp", NumpyAsCupy())   # task_slots with NumPy
    # a few resident blocks: the persistent grids walk slot ranges (slot_begin),
    # in three rounds
    monkeypatch.setattr(cuda_attention, "RESIDENT_BLOCKS", 2)
    monkeypatch.setattr(cuda_attention, "ROUNDS", 3)
    monkeypatch.setattr(cuda_attention, "TASKS_PER_RANGE", 0)
    monkeypatch.setattr(cuda_spmm, "_column_sum_plans", {})
    monkeypatch.setattr(plan, "_launch_kernel", launch_kernel)
    monkeypatch.setattr(plan, "ensure_context", lambda device: None)
    monkeypatch.setattr(plan, "current_device", lambda: 0)
    monkeypatch.setattr(plan, "current_stream", lambda: 0xabc)
    monkeypatch.setattr(plans, "_device_index", lambda graph, t: 0)
    monkeypatch.setattr(plans, "_torch_stream_ptr", lambda idx: 0xabc)
    monkeypatch.setattr(_autograd, "_torch_stream_ptr", lambda idx: 0xabc)
    monkeypatch.setattr(_autograd, "_device_of", lambda tensors: torch.device("cuda", 0))
    from fastgnn.torch import native
    monkeypatch.setattr(native, "ENABLED", bool(native_node))
    if native_node:
        _fake_native_launches(monkeypatch, native, launches)
    return launches


def _fake_native_launches(monkeypatch, native, launches):
    """The native node's cuLaunchKernel as a recording ctypes function: each
    launch's parameter values are read during the call (the node's
    parameter block lives only then), their count from the launch's kernel."""
    import ctypes
    counts = {}
    build = native.ProgramBuilder.build

    def counting_build(self, results, keep):
        for func, _grid, _block, _smem, values, _dynamic in self.launches:
            counts[func] = len(values)
        return build(self, results, keep)

    def record(func, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        n = counts[func]
        ptrs = (ctypes.c_uint64 * n).from_address(params)
        launches.native.append((func, (gx, gy, gz), (bx, by, bz), smem, stream,
                                [ctypes.c_uint64.from_address(p).value for p in ptrs]))
        return 0
    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, *[ctypes.c_uint] * 7,
                             ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p)
    fn = proto(record)
    launches.native_fn = fn          # (alive as long as the recorded world)
    monkeypatch.setattr(native.ProgramBuilder, "build", counting_build)
    monkeypatch.setattr(native, "launch_fn", lambda: ctypes.cast(fn, ctypes.c_void_p).value)


def assert_float32_results(ours, ref, base, scale, loose=()):
    """Results of a model run below float64 (`ours`: name -> tensor or None)
    against the float64 reference run (`ref`): each within 1e-5 of the
    reference's norm, or twice the reference model's own error in that
    dtype (`base`, its results from the same weights), or, for a gradient
    (a name starting "grad"), 1e-6 of the largest gradient's norm `scale` (a
    gradient summed from terms that cancel, as a trained bias's, loses
    float32 digits in any summation order). Names matching a regular
    expression in `loose` (gradients whose terms cancel by construction,
    e.g. attention vectors) may be off by 1e-4 of their norm or 1e-5 of
    `scale`. A result the reference lacks must be absent or zero in ours."""
    import re
    assert sorted(ours) == sorted(ref), f"{sorted(ours)} != {sorted(ref)}"
    for k, want in ref.items():
        if want is None:
            assert ours[k] is None or not ours[k].any(), \
                f"{k}: the reference has none, ours is nonzero"
            continue
        assert ours[k] is not None and ours[k].shape == want.shape, \
            f"{k}: missing or of another shape"
        diff = float((ours[k] - want).norm())
        bound = max(1e-5 * float(want.norm()), 2 * float((base[k] - want).norm()),
                    1e-6 * scale if k.startswith("grad") else 0.0)
        if any(re.search(p, k) for p in loose):
            bound = max(bound, 1e-4 * float(want.norm()), 1e-5 * scale)
        assert diff <= bound, f"{k}: difference {diff:.3e} > {bound:.1e} (below float64)"


def clipped_sgd_step(*models, lr=0.05):
    """One SGD step on each torch model with the gradients its last backward
    left, clipped to a total norm of 1: the weights change between the steps
    of a multi-step comparison while the training stays bounded."""
    import torch
    with torch.no_grad():
        for model in models:
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
            scale = lr / max(1.0, float(norm))
            for p in model.parameters():
                if p.grad is not None:
                    p.sub_(scale * p.grad)
