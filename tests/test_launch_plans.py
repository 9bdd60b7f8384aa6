"""Launch plans on the CPU (no GPU needed): the parameter blocks they pack,
checked against each kernel's C signature in kernels_cuda/, and the torch
adapter's plan path (bridge, plans.py, the backends' plan builders, the
launch loop) run end to end against fakes: task lists built with NumPy,
kernels that are addresses, a cuLaunchKernel that records its arguments.
"""
import ctypes
import re

import numpy as np
import pytest
import torch

import fastgnn
import fastgnn.torch as ft
from fastgnn import testing
from fastgnn.testing import awkward_edge_index

plan = pytest.importorskip("fastgnn.backends.cuda.plan")   # CuPy imports without a GPU
from fastgnn.backends.cuda import attention as cuda_attention  # noqa: E402
from fastgnn.backends.cuda import loader, segment, spmm as cuda_spmm  # noqa: E402
from fastgnn.torch import _autograd, plans  # noqa: E402


# ------------------------------------------------- kernel signatures (C)
def _split_params(text):
    """Top-level comma split of a parameter list."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur))
    return [p.strip() for p in out]


def _strip_comments(src):
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    return re.sub(r"//[^\n]*", " ", src)


def kernel_signatures():
    """{kernel name: [C parameter kind]} of every __global__ function in
    kernels_cuda/ (kinds: "ptr", "int64", "int32", "uint64", "float32",
    "float64", or "acc" for the value type's accumulation scalar)."""
    src = "".join(_strip_comments(loader.source(f)) for f in ("spmm", "segment", "attention"))
    with open(f"{loader.kernels_dir()}/common.cuh") as f:
        src += _strip_comments(f.read())
    macros = {m.group(1): m.group(2).replace("\\\n", " ")
              for m in re.finditer(r"#define\s+(\w+)\s+((?:[^\n]*\\\n)*[^\n]*)", src)}
    sigs = {}
    for m in re.finditer(r"__global__\s+void\s", src):
        i = m.end()
        while True:                  # skip launch bounds and macros to the kernel's name
            i = _skip_space(src, i)
            if src.startswith("__launch_bounds__", i):
                i = _balanced(src, src.index("(", i))
                continue
            word = re.match(r"\w+", src[i:]).group(0)
            i = _skip_space(src, i + len(word))
            if src[i] == "(":
                break
        name, end = word, _balanced(src, i)
        sigs[name] = [_kind(p) for p in _expand(src[i + 1:end - 1], macros)]
    return sigs


def _expand(params, macros):
    """The parameters of a list, macros (SEGMENT_BWD_PARAMS, ...) expanded."""
    out = []
    for p in _split_params(params):
        out += _expand(macros[p], macros) if p in macros else [p]
    return out


def _skip_space(src, i):
    while src[i].isspace():
        i += 1
    return i


def _balanced(src, i):
    """Index after the parenthesis group opening at src[i]."""
    depth = 0
    while True:
        depth += {"(": 1, ")": -1}.get(src[i], 0)
        i += 1
        if depth == 0:
            return i


def _kind(param):
    p = re.sub(r"__restrict__|const", " ", param)
    if "*" in p:
        return "ptr"
    words = p.split()[:-1]                       # the type, without the name
    t = " ".join(words)
    table = {"i64": "int64", "long long": "int64", "int": "int32", "unsigned long long": "uint64",
             "u64": "uint64", "float": "float32", "double": "float64", "A": "acc"}
    if t in table:
        return table[t]
    if "acc_t" in t:
        return "acc"
    raise AssertionError(f"unknown C parameter type {param!r}")


def _base(name):
    return name.split("<")[0]


def _acc_kind(launch_name):
    return "float64" if "<double" in launch_name or ", double" in launch_name else "float32"


def assert_matches_signature(launch, sigs):
    want = sigs[_base(launch.name)]
    got = launch.kinds
    assert len(got) == len(want), (launch.name, len(got), len(want))
    for i, (g, w) in enumerate(zip(got, want)):
        w = _acc_kind(launch.name) if w == "acc" else w
        assert g == w, f"{launch.name}: parameter {i} packed as {g}, the kernel takes {w}"


def test_signature_parser_reads_every_kernel():
    sigs = kernel_signatures()
    for name in ("spmm_fwd", "spmm_combine", "sddmm", "segment_fwd", "segment_combine",
                 "segment_coef", "segment_bwd", "segment_bwd_capped", "segment_arg_scatter",
                 "column_sum", "cast_from_acc", "attn_fwd", "attn_combine", "attn_bwd_dst",
                 "attn_bwd_src", "attn_delta", "softmax_fwd", "softmax_bwd"):
        assert name in sigs, name
    assert sigs["softmax_fwd"] == ["ptr"] * 5 + ["int64", "int32", "uint64", "uint64", "uint64",
                                                 "float64", "int32"]
    assert sigs["column_sum"] == ["ptr", "ptr", "int64", "int32", "int32"]
    assert sigs["segment_bwd"][-5:] == ["int64", "int32", "int64", "int32", "int32"]


# ------------------------------------------------------- argument packing
def test_pack_lays_each_parameter_in_its_own_slot():
    arr = np.arange(4, dtype=np.float32)
    args = (plan.Slot(0), arr, None, np.int32(-7), np.int64(1 << 40), np.uint64(2 ** 64 - 1),
            np.float32(1.5), np.float64(-2.25), plan.Slot(1, 256))
    values, dynamic, keep, kinds = plan.pack(args)
    raw = values.view(np.uint8)
    assert values.dtype == np.uint64 and values.shape == (len(args),)
    assert values[1] == arr.ctypes.data and values[2] == 0 and keep == [arr]
    assert raw[24:28].view(np.int32)[0] == -7 and not raw[28:32].any()
    assert raw[32:40].view(np.int64)[0] == 1 << 40
    assert values[5] == 2 ** 64 - 1
    assert raw[48:52].view(np.float32)[0] == 1.5 and not raw[52:56].any()
    assert raw[56:64].view(np.float64)[0] == -2.25
    assert dynamic == ((0, 0, 0), (8, 1, 256))
    assert kinds == ("ptr", "ptr", "ptr", "int32", "int64", "uint64", "float32", "float64",
                     "ptr")
    for bad in (3, 2.0, True):
        with pytest.raises(TypeError, match="C width"):
            plan.pack((bad,))
    with pytest.raises(TypeError, match="unsupported scalar"):
        plan.pack((np.int16(1),))


def test_launch_params_point_at_the_slots_and_fill_writes_addresses():
    launch = plan.Launch(0x1234, (3,), (plan.Slot(1), plan.Slot(0, 16), np.int32(5), None))
    assert launch.grid == (3, 1, 1) and launch.block == (plan.BLOCK, 1, 1)
    base = launch.values.ctypes.data
    assert list(launch.params) == [base + 8 * i for i in range(4)]
    launch.fill((0x1000, 0x2000))
    assert list(launch.values[:2]) == [0x2000, 0x1010]
    launch.fill((0, 0x3000))               # an absent buffer stays null, offset or not
    assert list(launch.values[:2]) == [0x3000, 0]
    assert launch.values.view(np.uint8)[16:20].view(np.int32)[0] == 5


def test_launch_now_launches_fixed_arguments_on_the_current_stream(monkeypatch):
    made = []

    def launch_kernel(func, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        # (read at once: the parameter block lives as long as the call)
        made.append((func, (gx, gy, gz), (bx, by, bz), smem, stream, _read_params(params, 3)))

    monkeypatch.setattr(plan, "_launch_kernel", launch_kernel)
    monkeypatch.setattr(plan, "ensure_context", lambda device: made.append(("context", device)))
    monkeypatch.setattr(plan, "current_device", lambda: 2)
    monkeypatch.setattr(plan, "current_stream", lambda: 0xabc)
    built = plan.built
    arr = np.arange(3, dtype=np.int64)
    plan.launch_now(0x1234, (5, 2), (arr, np.int32(7), None), block=(64,), smem=128)
    assert made == [("context", 2),
                    (0x1234, (5, 2, 1), (64, 1, 1), 128, 0xabc, [arr.ctypes.data, 7, 0])]
    assert plan.built == built             # not a plan: what JAX's replay learns ignores it
    with pytest.raises(TypeError, match="fixed arguments"):
        plan.launch_now(0x1234, (1,), (plan.Slot(0),))


# --------------------------------------------------- recorded and replayed
def _recording_launcher(monkeypatch, nparams):
    """plan's cuLaunchKernel replaced by one that notes (func, stream, the
    parameter values) per launch; nparams: {func: parameter count}."""
    made = []

    def launch(func, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        made.append((func, stream, _read_params(params, nparams[func])))
    monkeypatch.setattr(plan, "_launch_kernel", launch)
    monkeypatch.setattr(plan, "ensure_context", lambda device: None)
    return made


def test_replay_maps_recorded_addresses_onto_new_buffers(monkeypatch):
    """A recorded call's plan runs (a plan whose run also runs another, as
    the attention backward's does; scalar words; a constant; temporaries
    freed and reused within the call) replayed on other buffers and an
    arena: every address moves with its buffer, temporaries keep their
    relative layout, words, nulls and constants stay."""
    made = _recording_launcher(monkeypatch, {0x100: 5, 0x200: 2, 0x300: 3})
    inner = plan.LaunchPlan([plan.Launch(0x200, (1,), (plan.Slot(0), plan.Slot(1)))])

    class Outer(plan.LaunchPlan):
        def run(self, stream, ptrs):
            super().run(stream, ptrs)
            inner.run(stream, (ptrs[0] + 32, ptrs[3]))

    outer = Outer([plan.Launch(0x100, (2,), (plan.Slot(0), plan.Slot(1, 16),
                                             plan.Word(2, "uint64"), plan.Slot(3),
                                             np.int32(7)))])
    last = plan.LaunchPlan([plan.Launch(0x300, (1,), (plan.Slot(0), plan.Slot(1),
                                                      plan.Slot(2)))])
    with plan.recording() as runs:
        outer.run(0xabc, (0x10000, 0x20000, 12345, 0x50040))
        last.run(0xabc, (0x60210, 0x90000, 0))
    assert [p for p, _ in runs] == [outer, inner, last]
    del made[:]
    buffers = [(0x10000, 4096), (0x20000, 1024)]
    # temporaries: 600 bytes at 0x50000, freed, 100 bytes there again; 64 at 0x60200
    # temporaries: 600 bytes at 0x50000, freed, 100 bytes there again; 64 at
    # 0x60200; 4096 at 0x70000 that no run uses (no room in the arena)
    rep = plan.Replay.learn(runs, buffers, [(0x50000, 600), (0x50000, 100), (0x60200, 64),
                                            (0x70000, 4096)])
    assert rep.arena_bytes == 1024 + 64
    rep.run(0xdef, [0xA0000, 0xB0000], 0xC0000)
    assert made == [(0x100, 0xdef, [0xA0000, 0xB0010, 12345, 0xC0040, 7]),
                    (0x200, 0xdef, [0xA0020, 0xC0040]),
                    (0x300, 0xdef, [0xC0000 + 1024 + 0x10, 0x90000, 0])]
    assert rep.serves([0xA0000, 0xB0000]) and not rep.serves([0xA0000, 0xB0080])
    assert not rep.serves([0xA0040, 0xB0000])
    with plan.recording() as runs:
        last.run(0, (np.int64(5), 0, 0))
    assert plan.Replay.learn(runs, buffers, []) is None      # not plain addresses


def test_replay_alignment_is_per_buffer_and_overlapping_buffers_are_refused(monkeypatch):
    """Each buffer keeps the alignment it was recorded with (a buffer at 64
    bytes does not relax the one at 256); a call made on overlapping buffers
    (the same array as two inputs, a cotangent that is the forward's
    output) teaches nothing: its replay would read one for the other."""
    _recording_launcher(monkeypatch, {0x200: 2})
    p = plan.LaunchPlan([plan.Launch(0x200, (1,), (plan.Slot(0), plan.Slot(1)))])
    with plan.recording() as runs:
        p.run(0, (0x10040, 0x20000))
    rep = plan.Replay.learn(runs, [(0x10040, 64), (0x20000, 64)], [])
    assert rep.serves([0x30040, 0x40000]) and rep.serves([0x30000, 0x40100])
    assert not rep.serves([0x30020, 0x40000]) and not rep.serves([0x30040, 0x40080])
    with plan.recording() as runs:
        p.run(0, (0x10000, 0x10000))
    assert plan.Replay.learn(runs, [(0x10000, 64), (0x10000, 64)], []) is None
    assert plan.Replay.learn(runs, [(0x10000, 64), (0x10020, 64)], []) is None


def test_recording_is_off_outside_its_block(monkeypatch):
    made = _recording_launcher(monkeypatch, {0x200: 2})
    p = plan.LaunchPlan([plan.Launch(0x200, (1,), (plan.Slot(0), plan.Slot(1)))])
    with plan.recording() as outer:
        with plan.recording() as runs:
            p.run(0, (1, 2))
        p.run(0, (3, 4))
    p.run(0, (5, 6))
    assert [r for _, r in runs] == [(1, 2)] and [r for _, r in outer] == [(3, 4)]
    assert [m[2] for m in made] == [[1, 2], [3, 4], [5, 6]]


# ---------------------------------------------------- the fake CUDA world
def _read_params(params_ptr, n):
    """The n 8-byte parameter values cuLaunchKernel would read at kernelParams."""
    ptrs = (ctypes.c_uint64 * n).from_address(params_ptr)
    return [ctypes.c_uint64.from_address(p).value for p in ptrs]


@pytest.fixture
def fake_cuda(monkeypatch):
    """The plan path on CPU tensors, launches recorded (fastgnn.testing.fake_cuda)."""
    return testing.fake_cuda(monkeypatch)


def test_segment_backward_keeps_the_one_edge_walk_where_it_measures_faster(monkeypatch):
    testing.fake_cuda(monkeypatch, wide_walk_wins=False)
    n = 300
    ei = torch.from_numpy(awkward_edge_index(n, 3000, hub_degree=700, seed=1))
    g = ft.to_graph(ei, n)
    x = torch.randn(n, 16, dtype=torch.float64, requires_grad=True)
    torch.autograd.grad(ft.segment_reduce(g, x, "max").sum(), [x])
    bwd, = [p for p in _plans_of(g) if isinstance(p, segment.BwdPlan)]
    assert bwd.has_wide and bwd.unroll == 1


def _plans_of(graph):
    return [v for v in graph.cache.values() if isinstance(v, plan.LaunchPlan)]


def _check_launches(recorded, graph, sigs, extra=()):
    """Every recorded launch is one of the graph's plans' (or `extra` plans')
    launches, with its parameter block as packed, on the caller's stream."""
    by_func = {}
    for p in [*_plans_of(graph), *extra]:
        for l in p.launches:
            by_func.setdefault(l.params_ptr, l)
    for func, grid, block, smem, stream, params in recorded:
        l = by_func[params]
        assert (func, grid, block, smem, stream) == (l.func, l.grid, l.block, l.smem, 0xabc)
        assert _read_params(params, len(l.kinds)) == list(l.values[:len(l.kinds)])
        assert_matches_signature(l, sigs)


@pytest.mark.parametrize("reduce", ["max", ["mean", "max", "min", "std"], "mul", ["sum", "var"]],
                         ids=str)
def test_segment_plan_path_runs_end_to_end_against_fakes(fake_cuda, reduce):
    """ft.segment_reduce forward + backward through the bridge's plan path:
    the fwd and bwd plans are built (a split hub row: the forward's combine
    kernel too), every launch matches its kernel's signature, the x / out / grad
    slots hold those tensors' addresses, and nothing went through DLPack."""
    n = 300
    ei = torch.from_numpy(awkward_edge_index(n, 3000, hub_degree=700, seed=1))
    g = ft.to_graph(ei, n)
    x = torch.randn(n, 16, dtype=torch.float64, requires_grad=True)
    out = ft.segment_reduce(g, x, reduce)
    assert out.shape == (n, 16 * (1 if isinstance(reduce, str) else len(reduce)))
    fwd = [p for p in _plans_of(g) if isinstance(p, segment.FwdPlan)]
    assert len(fwd) == 1 and len(fwd[0].launches) == 2          # segment_fwd + segment_combine
    assert fwd[0].launches[0].values[5] == x.data_ptr()         # x (contiguous: no copy)
    assert fwd[0].launches[0].values[6] == out.data_ptr()
    assert type(out.grad_fn).__name__ == "FastgnnFunctionBackward"
    gx, = torch.autograd.grad(out, [x], torch.ones_like(out))
    bwd = [p for p in _plans_of(g) if isinstance(p, segment.BwdPlan)]
    assert len(bwd) == 1
    walk = next(l for l in bwd[0].launches if "segment_bwd" in l.name)
    assert walk.values[16] == gx.data_ptr()                     # grad_x
    # a max walk exists with several edges in flight, and measured faster here
    assert bwd[0].unroll == (loader.WIDE_UNROLL if reduce == "max" else 1)
    assert walk.name.endswith(f", {bwd[0].unroll}>") or "capped" in walk.name
    if reduce == "max":
        # both forms were timed on the call's buffers, but with a scratch gradient
        walks = [(name, v) for name, v in fake_cuda.timed if name.startswith("segment_bwd")]
        assert sorted(name[-2] for name, _ in walks) == ["1", str(loader.WIDE_UNROLL)]
        for _, v in walks:
            assert v[16] != gx.data_ptr() and v[4] == walk.values[4]   # grad_x; t_indices
    sigs = kernel_signatures()
    _check_launches(fake_cuda, g, sigs)
    assert len(fake_cuda) == 2 + len(bwd[0].launches)
    fake_cuda.clear()
    with torch.no_grad():                                       # inference: its own plan
        ft.segment_reduce(g, x, reduce)
    _check_launches(fake_cuda, g, sigs)


def test_segment_reduce_linear_backward_hands_its_addend_to_the_plan(fake_cuda):
    n, f, m = 200, 8, 5
    ei = torch.from_numpy(awkward_edge_index(n, 1500, hub_degree=400, seed=2))
    x = torch.randn(n, f, dtype=torch.float64, requires_grad=True)
    w = torch.randn(m, f, dtype=torch.float64, requires_grad=True)
    wr = torch.randn(m, f, dtype=torch.float64, requires_grad=True)
    out = ft.segment_reduce_linear(ei, x, "max", w, None, wr)
    out.sum().backward()
    g = ft.to_graph(ei, n)
    walk = next(l for p in _plans_of(g) if isinstance(p, segment.BwdPlan) for l in p.launches
                if "segment_bwd" in l.name)
    assert walk.values[15] == walk.values[16] == x.grad.data_ptr()   # addend is grad_x, in place
    _check_launches(fake_cuda, g, kernel_signatures())


def test_plan_path_falls_back_to_the_bridge(fake_cuda, monkeypatch):
    """Requests without a plan (the atomic max backward) and PLANS off take
    the bridge, which validates as the core does."""
    n = 50
    ei = torch.from_numpy(awkward_edge_index(n, 300, seed=3))
    g = ft.to_graph(ei, n)
    x = torch.randn(n, 4, dtype=torch.float64, requires_grad=True)
    assert plans.SEGMENT_REDUCE.forward(g, {"reduce": "max", "deterministic": False}, (x,),
                                        {"x": True}) is None
    assert plans.SEGMENT_REDUCE.forward(g, {"reduce": "max"}, (x[:10],), {"x": True}) is None
    with pytest.raises(ValueError, match="reduce must be one of"):
        plans.SEGMENT_REDUCE.forward(g, {"reduce": "median"}, (x,), {"x": True})
    monkeypatch.setattr(_autograd, "PLANS", False)
    monkeypatch.setattr(_autograd, "_device_of", lambda tensors: torch.device("cpu"))
    want = fastgnn.segment_reduce(g, x.detach().numpy(), "max")
    assert np.array_equal(ft.segment_reduce(g, x, "max").detach().numpy(), want)
    assert not fake_cuda


@pytest.mark.parametrize("num_tasks", [1, 300, 2708, 10**6])
@pytest.mark.parametrize("F,vec,group", [(1, 1, 1), (37, 1, 32), (128, 4, 32), (1433, 1, 32),
                                         (3704, 4, 32), (10**6, 1, 32), (12, 4, 4)])
def test_feature_slices_cover_every_feature_once(num_tasks, F, vec, group):
    """sliced_grid: slices of whole group passes (fslice a multiple of
    group * vec) that tile [0, F) with none empty; more than one only when
    the tasks alone put fewer than SLICE_TARGET_THREADS threads in flight;
    grid x covers the tasks."""
    (gx, gy), fslice = cuda_spmm.sliced_grid(num_tasks, F, vec, group)
    assert fslice % (group * vec) == 0 and gy <= 65535
    assert (gy - 1) * fslice < F <= gy * fslice
    assert gx * plan.BLOCK >= num_tasks * group
    if num_tasks * group >= cuda_spmm.SLICE_TARGET_THREADS or F <= group * vec:
        assert gy == 1
    else:
        assert gy > 1


def test_wide_feature_launches_carry_their_slices(fake_cuda):
    """spmm_fwd and segment_fwd on 1433 features of a 300-node graph: grid y
    is the slice count and the last parameter the slice width."""
    n, f = 300, 1433
    ei = torch.from_numpy(awkward_edge_index(n, 3000, hub_degree=700, seed=5))
    g = ft.to_graph(ei, n)
    x = torch.randn(n, f, dtype=torch.float32)
    ft.spmm(g, x, path="custom")
    ft.segment_reduce(g, x, "max")
    sigs = kernel_signatures()
    launches = [l for p in _plans_of(g) for l in getattr(p, "launches", ())
                if l.name.split("<")[0] in ("spmm_fwd", "segment_fwd")]
    assert sorted(l.name.split("<")[0] for l in launches) == ["segment_fwd", "spmm_fwd"]
    for l in launches:
        assert_matches_signature(l, sigs)
        fslice = int(l.values[len(l.kinds) - 1])
        assert fslice % 32 == 0 and l.grid[1] == -(-f // fslice) > 1


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_spmm_plan_path_runs_end_to_end_against_fakes(fake_cuda, reduce):
    """ft.spmm with a bias, forward + backward through the plan path: the
    custom kernel's plan on the graph and on its transpose (scales swapped),
    the bias gradient's column-sum plan (two levels), every launch matching
    its kernel's signature."""
    n, f = 300, 12
    ei = torch.from_numpy(awkward_edge_index(n, 3000, hub_degree=700, seed=5))
    g = ft.to_graph(ei, n)
    g.transpose()                              # (the bridge's first backward builds it)
    x = torch.randn(n, f, dtype=torch.float32, requires_grad=True)
    b = torch.randn(f, dtype=torch.float32, requires_grad=True)
    out = ft.spmm(g, x, reduce=reduce, bias=b, path="custom")
    assert type(out.grad_fn).__name__ == "FastgnnFunctionBackward"
    (fwd,) = [p for p in _plans_of(g) if isinstance(p, cuda_spmm.SpmmPlan)]
    assert [l.name.split("<")[0] for l in fwd.launches] == ["spmm_fwd", "spmm_combine"]
    l = fwd.launches[0]
    assert (l.values[8], l.values[9], l.values[10]) == (b.data_ptr(), x.data_ptr(),
                                                        out.data_ptr())
    assert (l.values[6] != 0) == (reduce == "mean") and l.values[5] == l.values[7] == 0
    gx, gb = torch.autograd.grad(out, [x, b], torch.ones_like(out))
    assert gx.shape == x.shape and gb.shape == b.shape
    (bwd,) = [p for p in _plans_of(g.transpose()) if isinstance(p, cuda_spmm.SpmmPlan)]
    lt = bwd.launches[0]
    assert lt.values[10] == gx.data_ptr() and lt.values[7] == l.values[6]   # scales swapped
    (sums,) = cuda_spmm._column_sum_plans.values()
    assert [x.name for x in sums.launches] == ["column_sum<float>"] * 2     # 300 rows: 2 levels
    assert sums.launches[-1].values[1] == gb.data_ptr()                     # into the output
    sigs = kernel_signatures()
    for p in (fwd, bwd, sums):
        for launch in p.launches:
            assert_matches_signature(launch, sigs)
    assert len(fake_cuda) == len(fwd.launches) + len(bwd.launches) + len(sums.launches)


# --------------------------------------------------------------- attention
def _by_name(graph, kind):
    return [p for p in _plans_of(graph) if isinstance(p, kind)]


@pytest.mark.parametrize("flat", [False, True], ids=["heads", "flat"])
def test_edge_softmax_plan_path_runs_end_to_end_against_fakes(fake_cuda, flat):
    """ft.edge_softmax with dropout, forward + backward on its plans: the
    scores / out / lse / grad slots hold those tensors' addresses, the
    dropout scalars are the call's (a new seed: the same plan), and every
    launch matches its kernel's signature."""
    n = 200
    ei = torch.from_numpy(awkward_edge_index(n, 1500, hub_degree=300, seed=4))
    g = ft.to_graph(ei, n)
    E = g.num_edges
    s = torch.randn((E,) if flat else (E, 3), dtype=torch.float64, requires_grad=True)
    out = ft.edge_softmax(g, s, dropout=0.25, seed=11, offset=5)
    assert out.shape == s.shape and type(out.grad_fn).__name__ == "FastgnnFunctionBackward"
    (fwd,) = [p for p in _by_name(g, cuda_attention.SoftmaxPlan) if len(p.launches)]
    l = fwd.launches[0]
    assert l.name == "softmax_fwd<double, int>"
    assert (l.values[2], l.values[3]) == (s.data_ptr(), out.data_ptr())
    spec = fastgnn.ops.attention.dropout_spec(0.25, 11, 5)
    assert list(l.values[7:10]) == [spec.key, 5, spec.threshold]
    assert l.values.view(np.float64)[10] == 1 / 0.75 and l.values[11] == 1
    gs, = torch.autograd.grad(out, [s], torch.ones_like(out))
    assert gs.shape == s.shape
    sigs = kernel_signatures()
    _check_launches(fake_cuda, g, sigs)
    assert len(fake_cuda) == 2
    plans_before = len(_plans_of(g))
    with torch.no_grad():
        ft.edge_softmax(g, s, dropout=0.25, seed=12)
    assert len(_plans_of(g)) == plans_before                     # the seed is a call value
    assert fwd.launches[0].values[7] == fastgnn.ops.attention.dropout_spec(0.25, 12, 0).key
    _check_launches(fake_cuda, g, sigs)


def _attention_case(score, n=300, H=2, C=8, dtype=torch.float64, seed=6):
    """(graph, tensors by name) of an attention call with its edge term and a bias."""
    ei = torch.from_numpy(awkward_edge_index(n, 3000, hub_degree=700, seed=seed))
    g = ft.to_graph(ei, n)
    E = g.num_edges
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, dtype=dtype, generator=gen).requires_grad_()
    if score == "gat":
        t = dict(a_src=r(n, H), a_dst=r(n, H), a_edge=r(E, H), v=r(n, H, C))
    elif score == "gatv2":
        t = dict(xl=r(n, H, C), xr=r(n, H, C), att=r(1, H, C), xe=r(E, H, C))
    else:
        t = dict(q=r(n, H, C), k=r(n, H, C), v=r(n, H, C), ee=r(E, H, C))
    t["bias"] = r(H * C)
    return g, t


# attn_fwd's parameters by position (kernels_cuda/attention.cu)
_F = {name: i for i, name in enumerate(
    "task_row task_begin task_slot slot_begin indptr indices cid S Dn Ed att V bias out out_b "
    "lse alpha p_m p_l p_acc num_tasks H C nch chunk group phases rounds slope scale dkey doffset "
    "dthreshold dscale don alpha_mode".split())}


@pytest.mark.parametrize("score", ["gat", "gatv2", "dot"])
def test_edge_attention_forward_plan_runs_end_to_end_against_fakes(fake_cuda, score):
    """ft.edge_attention with an edge term, a bias, dropout and the attention
    weights on its forward plan: attn_fwd on a persistent grid (slot ranges),
    attn_combine over the split hub row, the alpha pass; each tensor's
    address in its slot; every launch matching its kernel's signature; a new
    seed reuses the plan."""
    g, t = _attention_case(score)
    slots = cuda_attention.SLOT_NAMES[score]
    with torch.no_grad():
        out, alpha = ft.edge_attention(g, score, **t, dropout=0.3, seed=5,
                                       return_attention_weights=True)
    (fwd,) = _by_name(g, cuda_attention.AttnFwdPlan)
    assert [l.name.split("<")[0] for l in fwd.launches] == ["attn_fwd", "attn_combine",
                                                            "attn_fwd"]
    main, comb, walpha = fwd.launches
    assert main.values[_F["slot_begin"]] != 0                     # persistent: slot ranges
    for k, name in zip(("S", "Dn", "Ed", "V"), slots):
        assert main.values[_F[k]] == t[name].data_ptr(), k
    assert main.values[_F["att"]] == (t["att"].data_ptr() if score == "gatv2" else 0)
    assert main.values[_F["bias"]] == t["bias"].data_ptr()
    assert main.values[_F["out_b"]] == out.data_ptr() and main.values[_F["out"]] != 0
    assert main.values[_F["alpha"]] == 0 and walpha.values[_F["alpha"]] == alpha.data_ptr()
    assert walpha.values[_F["alpha_mode"]] == 1 and walpha.values[_F["out_b"]] == 0
    assert main.values[_F["dkey"]] == fastgnn.ops.attention.dropout_spec(0.3, 5, 0).key
    assert main.values[_F["don"]] == 1
    sigs = kernel_signatures()
    _check_launches(fake_cuda, g, sigs)
    assert len(fake_cuda) == 3
    with torch.no_grad():
        ft.edge_attention(g, score, **t, dropout=0.3, seed=6, return_attention_weights=True)
    assert len(_by_name(g, cuda_attention.AttnFwdPlan)) == 1
    assert main.values[_F["dkey"]] == fastgnn.ops.attention.dropout_spec(0.3, 6, 0).key


def test_gatv2_16bit_forward_plan_scores_on_tensor_cores_where_its_layout_allows(fake_cuda):
    """16-bit gatv2 of heads of 32 channels, a multiple of 4 heads, 16-byte
    aligned rows: the forward plan's main pass is attn_fwd_mma (attn_fwd's
    arguments, so the same slots), the alpha pass stays attn_fwd; an edge
    term, rows aligned to 8 bytes only, heads of 64 channels, 2 heads or
    fp32 keep attn_fwd."""
    from fastgnn.ops.attention import _attention_params
    n = 300
    ei = torch.from_numpy(awkward_edge_index(n, 3000, hub_degree=700, seed=3))
    g = ft.to_graph(ei, n)
    base = 1 << 20

    def launch_names(H=4, C=32, vtype="bfloat16", has_e=False, shift=0):
        # slot addresses (S, Dn, Ed, att, V, bias, out, out_b, lse, alpha, workspace)
        ptrs = [base * (k + 1) for k in range(11)]
        ptrs[0] += shift
        if not has_e:
            ptrs[2] = 0
        params = _attention_params("gatv2", 0.2, None, C, 0.2, 1, 0, True)
        shape = cuda_attention.shape_for(vtype, "gatv2", C, H,
                                         [p for p in ptrs[:5] + ptrs[6:7] if p], False)
        mma = cuda_attention.mma_scores("gatv2", vtype, H, C, has_e, shape,
                                        [ptrs[k] for k in (0, 1, 3, 6, 7)])
        plan = cuda_attention.fwd_plan(g, "gatv2", vtype, H, C, has_e, True, True, params,
                                       shape, mma)
        fake_cuda.clear()
        plan.run(0xabc, (*ptrs, *cuda_attention.drop_values(params.drop)))
        main = plan.launches[0]
        assert main.values[_F["S"]] == ptrs[0] and main.values[_F["out_b"]] == ptrs[7]
        assert main.values[_F["don"]] == 1 and main.values[_F["alpha_mode"]] == 0
        _check_launches(fake_cuda, g, kernel_signatures())
        return [l.name.split("<")[0] for l in plan.launches]

    mma = ["attn_fwd_mma", "attn_combine", "attn_fwd"]
    assert launch_names() == mma
    assert launch_names(H=8) == mma
    assert launch_names(vtype="float16") == mma
    assert launch_names(has_e=True)[0] == "attn_fwd"
    assert launch_names(shift=8)[0] == "attn_fwd"          # 8-byte aligned rows
    assert launch_names(H=2, C=64)[0] == "attn_fwd"
    assert launch_names(H=2)[0] == "attn_fwd"              # 2 heads do not fill a warp
    assert launch_names(vtype="float32")[0] == "attn_fwd"


# attn_bwd_dst's and attn_bwd_src's parameters by position (kernels_cuda/attention.cu)
_TASKS = "task_row task_begin task_slot slot_begin indptr indices cid S Dn Ed att "
_SCALARS = " num_tasks H C nch chunk group phases rounds slope"
_D = {name: i for i, name in enumerate(
    (_TASKS + "V lse g ga out delta wds gDn p_dn gEd gatt_part aS aV" + _SCALARS
     + " scale").split())}
_S = {name: i for i, name in enumerate((_TASKS + "wds g gS p_s gV p_v gatt_part"
                                         + _SCALARS).split())}


def _check_rounds(graph):
    """Every attention launch on the graph's plans passes the rounds of its
    own slot ranges: slot_begin holds slots x rounds + 1 cuts (slots from its
    grid and layout), 3 rounds as fake_cuda asks, or no ranges and 1 round.
    Returns how many launches had ranges."""
    ranges = {}
    for g in (graph, graph.cache.get("transpose")):
        for key, val in ({} if g is None else g.cache).items():
            if isinstance(key, tuple) and key[0] == "attention_task_slots":
                ranges[int(val.ctypes.data)] = len(val)
    with_ranges = 0
    for p in _plans_of(graph):
        for l in p.launches:
            pos = {"attn_fwd": _F, "attn_fwd_mma": _F, "attn_bwd_dst": _D,
                   "attn_bwd_src": _S}.get(l.name.split("<")[0])
            if pos is None:
                continue
            v = [int(x) for x in l.values]
            slots = l.grid[0] * (cuda_attention.BLOCK // v[pos["group"]]) // (
                v[pos["H"]] * v[pos["phases"]])
            if v[pos["slot_begin"]] == 0:
                assert v[pos["rounds"]] == 1, l.name
            else:
                assert v[pos["rounds"]] == 3, l.name
                assert ranges[v[pos["slot_begin"]]] == slots * 3 + 1, l.name
                with_ranges += 1
    return with_ranges


@pytest.mark.parametrize("score", ["gat", "gatv2", "dot"])
def test_edge_attention_backward_plan_runs_end_to_end_against_fakes(fake_cuda, score):
    """edge_attention forward + backward on plans (edge term, bias, dropout):
    the target pass (fused delta), the source pass over the transpose, the
    split rows' combines, gatv2's grad_att column sum; each gradient's
    address in its slot, the bias gradient's column sum, every launch
    matching its kernel's signature, nothing through DLPack."""
    g, t = _attention_case(score)
    s_name, d_name, e_name, v_name = cuda_attention.SLOT_NAMES[score]
    out = ft.edge_attention(g, score, **t, dropout=0.3, seed=5)
    names = list(t)
    grads = dict(zip(names, torch.autograd.grad(out, [t[n] for n in names],
                                                torch.ones_like(out))))
    assert all(grads[n].shape == t[n].shape for n in names)
    (bwd,) = _by_name(g, cuda_attention.AttnBwdPlan)
    kinds = [l.name.split("<")[0] for l in bwd.launches]
    assert kinds[:2] == ["attn_bwd_dst", "spmm_combine"] and "attn_bwd_src" in kinds
    dst = bwd.launches[0]
    src = bwd.launches[kinds.index("attn_bwd_src")]
    assert dst.values[_D["out"]] != 0 and dst.values[_D["ga"]] == 0    # fused delta
    assert dst.values[_D["delta"]] == 0
    assert dst.values[_D["wds"]] == src.values[_S["wds"]] != 0     # the source pass's weights
    assert dst.values[_D["gDn"]] == grads[d_name].data_ptr()
    assert dst.values[_D["gEd"]] == grads[e_name].data_ptr()
    assert dst.values[_D["aS"]] == dst.values[_D["aV"]] == 0
    assert src.values[_S["gS"]] == grads[s_name].data_ptr()
    if score == "gatv2":
        assert src.values[_S["gV"]] == 0 and dst.values[_D["gatt_part"]] != 0
        # grad_att's partial rows: the target pass's, then the source pass's (xl_j terms)
        assert src.values[_S["gatt_part"]] > dst.values[_D["gatt_part"]]
        assert src.smem == dst.smem > 0           # the groups' shared grad_att slots
        assert bwd.gatt_sum.launches[-1].values[1] == grads["att"].data_ptr()
    else:
        assert src.values[_S["gV"]] == grads[v_name].data_ptr()
        assert dst.values[_D["gatt_part"]] == src.values[_S["gatt_part"]] == 0
        assert bwd.gatt_sum is None
    sigs = kernel_signatures()
    _check_launches(fake_cuda, g, sigs, extra=cuda_spmm._column_sum_plans.values())
    sums = [bwd.gatt_sum] if bwd.gatt_sum else []
    n_fwd = len(_by_name(g, cuda_attention.AttnFwdPlan)[0].launches)
    n_bias = sum(len(p.launches) for p in cuda_spmm._column_sum_plans.values()
                 if p is not bwd.gatt_sum)
    assert len(fake_cuda) == n_fwd + len(bwd.launches) + len(sums and sums[0].launches) + n_bias
    assert _check_rounds(g) == 3               # forward, target pass, source pass


def _backward_plan_of_one_input(score, name):
    """(graph, its AttnBwdPlan, the plan's kernel names, the gradient) of an
    attention call where only input `name` wants a gradient."""
    g, t = _attention_case(score)
    x = t[name]
    fixed = {n: y.detach() for n, y in t.items() if n != name}
    out = ft.edge_attention(g, score, **fixed, **{name: x})
    grad, = torch.autograd.grad(out, [x], torch.ones_like(out))
    (bwd,) = _by_name(g, cuda_attention.AttnBwdPlan)
    return g, bwd, [l.name.split("<")[0] for l in bwd.launches], grad


def test_attention_backward_plan_of_the_source_side_alone_runs_the_target_pass_for_its_weights(
        fake_cuda):
    """Only v wants a gradient: the target pass still runs (no target-side
    gradient, only the per-edge weights wds), then the source pass; a
    cotangent of the weights or float atomics take the core instead (no
    backward plan)."""
    g, bwd, kinds, gv = _backward_plan_of_one_input("gat", "v")
    assert kinds[0] == "attn_bwd_dst" and "attn_delta" not in kinds
    dst, src = bwd.launches[0], bwd.launches[kinds.index("attn_bwd_src")]
    assert dst.values[_D["gDn"]] == dst.values[_D["gEd"]] == dst.values[_D["gatt_part"]] == 0
    assert dst.values[_D["wds"]] == src.values[_S["wds"]] != 0
    assert src.values[_S["gV"]] == gv.data_ptr()
    assert src.values[_S["gS"]] == 0
    _check_launches(fake_cuda, g, kernel_signatures())
    params = fastgnn.ops.attention._attention_params("gatv2", 0.2, None, 8, 0.0, 0, 0, False)
    serves = cuda_attention.plan_serves_backward
    assert not serves("gatv2", "float32", 1, None, params, (True,) * 5)    # atomics asked for
    assert serves("gatv2", "float32", 1, None, params, (False, True, False, False, True))
    assert not serves("gat", "float32", 1, 2, params, (True,) * 5)         # grad_alpha
    assert not serves("gat", "bfloat16", 1, None, params, (True,) * 5)


def test_gatv2_backward_plan_of_att_alone_runs_the_source_pass_for_its_xl_terms(fake_cuda):
    """Only att wants a gradient: grad_att's xl_j terms come from the source
    pass (its groups' shared slots, one partial row per block after the
    target pass's rows), so the plan runs both passes, the source pass with
    no gradient of its own, and one column sum over all the rows."""
    g, bwd, kinds, ga = _backward_plan_of_one_input("gatv2", "att")
    dst, src = bwd.launches[0], bwd.launches[kinds.index("attn_bwd_src")]
    assert dst.values[_D["gDn"]] == dst.values[_D["gEd"]] == 0
    assert src.values[_S["gS"]] == src.values[_S["gV"]] == 0
    assert dst.values[_D["wds"]] == src.values[_S["wds"]] != 0
    rows = src.values[_S["gatt_part"]] - dst.values[_D["gatt_part"]]
    assert rows > 0 and src.smem > 0
    assert bwd.gatt_sum.launches[-1].values[1] == ga.data_ptr()
    _check_launches(fake_cuda, g, kernel_signatures(), extra=cuda_spmm._column_sum_plans.values())


def test_attention_backward_without_a_plan_takes_the_core_on_the_residuals(fake_cuda,
                                                                           monkeypatch):
    """With BACKWARD_PLANS off, the plan forward's residuals go to the core's
    backward (here the CPU's, the tensors being CPU ones): a gradient per
    given input, in its shape."""
    monkeypatch.setattr(cuda_attention, "BACKWARD_PLANS", False)
    g, t = _attention_case("gat", n=60)
    out = ft.edge_attention(g, "gat", **t, dropout=0.2, seed=3)
    assert len(_by_name(g, cuda_attention.AttnFwdPlan)) == 1
    grads = torch.autograd.grad(out, list(t.values()), torch.ones_like(out))
    assert [x.shape for x in grads] == [x.shape for x in t.values()]
    assert not _by_name(g, cuda_attention.AttnBwdPlan)


def test_attention_plan_path_declines_what_it_does_not_serve(fake_cuda, monkeypatch):
    """Requests outside the plan path take the bridge: 16-bit inputs, a
    tensor_cores argument, inputs of another score, shapes the core refuses,
    the switch off."""
    g, t = _attention_case("gat")
    tensors = [t.get(n) for n in plans._ATTN_INPUTS]
    needs = dict.fromkeys(plans._ATTN_INPUTS, False)
    fwd = plans.EDGE_ATTENTION.forward
    assert fwd(g, {"score": "gat", "tensor_cores": "auto"}, tensors, needs) is None
    assert fwd(g, {"score": "dot"}, tensors, needs) is None
    half = [None if x is None else x.detach().half() for x in tensors]
    assert fwd(g, {"score": "gat"}, half, needs) is None
    bad = list(tensors)
    bad[1] = t["a_dst"][:10]
    assert fwd(g, {"score": "gat"}, bad, needs) is None
    assert plans.EDGE_SOFTMAX.forward(g, {}, (torch.randn(g.num_edges - 1),),
                                      {"scores": False}) is None
    with pytest.raises(ValueError, match="dropout"):             # the core's own check
        fwd(g, {"score": "gat", "dropout": 1.5}, tensors, needs)
    monkeypatch.setattr(plans, "ATTENTION_PLANS", False)
    assert fwd(g, {"score": "gat"}, tensors, needs) is None
    assert plans.EDGE_SOFTMAX.forward(g, {}, (torch.randn(g.num_edges),),
                                      {"scores": False}) is None
    assert not fake_cuda


# ------------------------------------------------------------------- GPU
_GPU_ATTENTION = ("gat", "gat_weights", "gatv2", "dot", "softmax")


def _gpu_attention_case(case, graph, gen, H=4, C=16):
    """(leaves, op(*leaves), cotangent makers per output) of an attention
    case on the GPU: edge terms, a bias, dropout with a fixed seed."""
    n, E = graph.num_dst, graph.num_edges

    def r(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)
    half = [lambda o: torch.ones_like(o) * 0.5]
    drop = dict(dropout=0.3, seed=123, offset=7)
    if case == "softmax":
        return [r(E, H)], lambda s: ft.edge_softmax(graph, s, **drop), half
    if case in ("gat", "gat_weights"):
        names, leaves = ("a_src", "a_dst", "a_edge", "v", "bias"), [r(n, H), r(n, H), r(E, H),
                                                                     r(n, H, C), r(H * C)]
    elif case == "gatv2":
        names, leaves = ("xl", "xr", "att", "xe", "bias"), [r(n, H, C), r(n, H, C), r(1, H, C),
                                                            r(E, H, C), r(H * C)]
    else:
        names, leaves = ("q", "k", "v", "ee", "bias"), [r(n, H, C), r(n, H, C), r(n, H, C),
                                                        r(E, H, C), r(H, C)]
    score = "gat" if case == "gat_weights" else case
    weights = case == "gat_weights"

    def op(*tensors):
        return ft.edge_attention(graph, score, **dict(zip(names, tensors)), **drop,
                                 return_attention_weights=weights)
    return leaves, op, half + ([lambda a: torch.ones_like(a) * 0.25] if weights else [])


@pytest.mark.gpu
@pytest.mark.skipif(not (fastgnn.gpu_available() and torch.cuda.is_available()),
                    reason="needs a CUDA device visible to CuPy and torch")
@pytest.mark.parametrize("case", ["gcn", "mean", "sum_auto", "max", "mean_max_std", "gat",
                                  "gat_weights", "gatv2", "dot", "softmax"])
def test_gpu_plan_path_matches_the_bridge_bitwise(case, monkeypatch):
    """The same kernels with the same arguments: outputs and gradients of
    the plan path equal the DLPack bridge's bit for bit, on PyTorch's
    current stream (a side stream too), and the plans served the calls."""
    n, f = 500, 40
    ei = torch.from_numpy(awkward_edge_index(n, 4000, hub_degree=600, seed=7)).cuda()
    gen = torch.Generator(device="cuda").manual_seed(0)
    x0 = torch.randn(n, f, device="cuda", generator=gen)
    b0 = torch.randn(f, device="cuda", generator=gen)
    leaves0, cotangents = None, None
    if case in _GPU_ATTENTION:
        graph = ft.to_graph(ei, n)
        leaves0, op, cotangents = _gpu_attention_case(case, graph, gen)
    elif case == "gcn":
        graph, cw = fastgnn.gcn_norm_weights(ft.to_graph(ei, n))

        def op(x, b):
            return ft.spmm(graph, x, bias=b, csr_weights=cw)
    elif case in ("mean", "sum_auto"):
        graph = ft.to_graph(ei, n)

        def op(x, b):
            return ft.spmm(graph, x, reduce="sum" if case == "sum_auto" else "mean", bias=b)
    else:
        graph = ft.to_graph(ei, n)
        reduce = "max" if case == "max" else ["mean", "max", "std"]

        def op(x, b):
            out = ft.segment_reduce(graph, x, reduce)
            return out + b.repeat(out.shape[1] // f)

    def step():
        if leaves0 is not None:          # attention: every input, its own cotangents
            leaves = [t.clone().requires_grad_() for t in leaves0]
            outs = op(*leaves)
            outs = outs if isinstance(outs, tuple) else (outs,)
            grads = torch.autograd.grad(outs, leaves, [c(o) for c, o in zip(cotangents, outs)])
            return (*(o.detach() for o in outs), *grads)
        x, b = x0.clone().requires_grad_(), b0.clone().requires_grad_()
        out = op(x * 1, b)
        gx, gb = torch.autograd.grad(out, [x, b], torch.ones_like(out) * 0.5)
        return out.detach(), gx, gb

    bridge_runs = []
    real_scope = _autograd.device_scope
    monkeypatch.setattr(_autograd, "device_scope",
                        lambda d: bridge_runs.append(1) or real_scope(d))
    monkeypatch.setattr(_autograd, "PLANS", False)
    want = step()
    monkeypatch.setattr(_autograd, "PLANS", True)
    step()                                  # the first plan call builds what is missing
    bridge_runs.clear()
    got = step()
    if case == "gat_weights":
        # a cotangent of the weights: the backward takes the core (on DLPack
        # views of the plan forward's residuals), the forward its plan
        assert bridge_runs
        bridge_runs.clear()
        with torch.no_grad():
            op(*leaves0)
    assert not bridge_runs                  # forward and backward on the plans
    for w, g in zip(want, got):
        assert torch.equal(w, g)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            for w, g in zip(want, step()):
                assert torch.equal(w, g)
    torch.cuda.current_stream().wait_stream(side)


# ------------------------------------------ graph build launches (graph.cu)
_C_DTYPES = {"int": np.int32, "long long": np.int64, "i64": np.int64, "float": np.float32,
             "double": np.float64}


def graph_kernel_params():
    """{kernel name: (template parameter names, [(C type, is const pointer,
    is pointer)])} of graph.cu's kernels."""
    src = _strip_comments(loader.source("graph"))
    out = {}
    for m in re.finditer(r"(template\s*<([^>]*)>\s*)?__global__\s+void\s+(\w+)\s*\(", src):
        tparams = [t.split()[-1] for t in _split_params(m.group(2) or "")]
        start = m.end() - 1
        params = []
        for p in _split_params(src[start + 1:_balanced(src, start) - 1]):
            const = "const" in p.split("*")[0]
            ctype = " ".join(re.sub(r"__restrict__|const", " ", p).replace("*", " * ").split()[:-1])
            params.append((ctype.replace(" *", "").strip(), const, "*" in p))
        out[m.group(3)] = (tparams, params)
    return out


def _graph_launch_recorder(monkeypatch):
    """graph_build on NumPy arrays with its launches checked instead of made:
    every argument's kind against the kernel's C parameter (pointer or scalar
    width) and every array's dtype against its C element type (the kernel's
    template arguments substituted); the kernel's writable pointers are
    zero-filled (so the launchers' sizes read from them stay small)."""
    from fastgnn.backends.cuda import graph_build, plan
    from fastgnn.testing import NumpyAsCupy
    params = graph_kernel_params()
    seen = []

    def kernel(itype, name):
        return name

    def launch_now(name, grid, args, block=(plan.BLOCK,), smem=0):
        base = name.split("<")[0]
        targs = _split_params(name[len(base) + 1:-1]) if "<" in name else []
        tparams, cparams = params[base]
        subst = dict(zip(tparams, targs))
        assert len(args) == len(cparams), (name, len(args), len(cparams))
        kinds = plan.pack(args)[3]
        for i, (a, (ctype, const, is_ptr), kind) in enumerate(zip(args, cparams, kinds)):
            ctype = subst.get(ctype, ctype)
            if is_ptr:
                assert kind == "ptr", f"{name} parameter {i}: a pointer, given {kind}"
                if a is not None:
                    assert a.dtype == _C_DTYPES[ctype], \
                        f"{name} parameter {i}: {ctype}*, given {a.dtype} array"
                    if not const:
                        a[...] = 0
            else:
                assert kind == np.dtype(_C_DTYPES[ctype]).name, \
                    f"{name} parameter {i}: {ctype}, given {kind}"
        seen.append(base)

    monkeypatch.setattr(graph_build, "cp", NumpyAsCupy())
    monkeypatch.setattr(graph_build, "_kernel", lambda itype, name: name)
    monkeypatch.setattr(graph_build, "launch_now", launch_now)
    return graph_build, seen


@pytest.mark.parametrize("itype", [np.int32, np.int64])
@pytest.mark.parametrize("ktype", [np.int32, np.int64])
def test_graph_build_launches_match_their_kernels(monkeypatch, itype, ktype):
    """Each graph build launcher passes its kernel (graph.cu) the arguments
    its C signature takes: count, pointer or scalar width, and each array's
    element type, for both index types of the graph and of the input edges."""
    gb, seen = _graph_launch_recorder(monkeypatch)
    E, n = 40, 9
    src, dst = np.arange(E, dtype=ktype) % n, np.arange(E, dtype=ktype)[::-1] % n
    gb.edge_stats(src, dst)
    order = np.arange(E, dtype=np.int64)
    gb.csr_from_order(dst, n, itype, vals=src, order=order)
    gb.csr_from_order(dst, n, itype, vals=src)
    indptr = np.linspace(0, E, n + 1).astype(itype)
    indices = (np.arange(E) % n).astype(itype)
    gb.csr_from_order(indices, n, itype, rows_of=indptr, order=order)
    for ids, loops in ((None, 0), (None, 3), (np.arange(E, dtype=itype), 3)):
        gb.self_loop_structure(indptr, indices, ids, loops)
    for visit in (None, np.arange(n, dtype=itype)):
        gb.task_lists(indptr, visit, 4)
    for w in (np.float32, np.float64):
        gb.gcn_norm_weights(indptr, indices, indptr, indices, w)
    gb.slot_cuts(np.arange(E + 1, dtype=np.int64), 5, 3)
    gb.task_work_prefix(np.arange(n, dtype=itype), indptr[:-1], indptr, 4, 4)
    assert set(seen) == set(graph_kernel_params()), sorted(set(graph_kernel_params()) - set(seen))
