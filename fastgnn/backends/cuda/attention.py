"""CUDA launchers of the attention family (kernels_cuda/attention.cu).

Implements the backend interface documented in fastgnn/ops/attention.py with
the task mapping of the SpMM family: a lane group per (task, head), hub rows
split into tasks whose partials are merged in slot order (attn_combine for
the forward's (m, l, acc) states, spmm_combine for backward sums), grad_att
summed by a fixed-order column sum from partial rows [H, C]: the target
pass's, one per thread block (summed in shared memory in a fixed order) or,
where that does not pay, one per task (_block_gatt), then the source pass's,
one per thread block (GATv2's xl_j terms). The forward and both backward
passes run on persistent grids (_persistent_grid). Per-edge arrays stay in
the caller's order. No float atomics by default: bitwise repeatable. With
params.deterministic False the backward's target pass of the scores where
that is faster (ATOMIC_SCORES: gatv2, unless its 16-bit target pass
scores on Tensor Cores, mma_scores) also scatters the source-side
gradients with float atomics into fp32/fp64 buffers and the source pass
over the transpose is skipped (faster, not repeatable).

The launches of one (graph, request) are launch plans (plan.py), cached on
the graph: SoftmaxPlan (edge_softmax, both directions), AttnFwdPlan (the
forward: attn_fwd, attn_combine, the alpha pass) and AttnBwdPlan (the
deterministic backward given a cotangent of out and none of alpha;
BACKWARD_PLANS switches it off). The launchers below run them on CuPy
arrays, fastgnn.torch (adapters/torch/plans.py) on torch tensors. The
dropout scalars are per-call values of the plans (`drop_values`), so a new
seed per step reuses the plan.
"""
from __future__ import annotations

import contextlib
import functools

import cupy as cp
import numpy as np
from cupy_backends.cuda.api import driver

from ...graph import Graph
from ..attention_spec import (SCORE_INPUTS, SLOT_NAMES, caller_ids, lse_dtype, score_slots,
                              transpose_caller_ids)
from . import graph_build
from .plan import (Launch, LaunchPlan, Slot, Word, current_stream, launch_fixed, launch_now,
                   layout, word)
from .segment import _cached_plan, graph_device
from .loader import (ATTENTION_SCORES, C_INDEX, C_VALUE, ON_CLEAR, VALUE_BYTES,
                     attention_groups, attention_nchs, attention_vecs, get_function)
from .spmm import (_ITYPE, BLOCK, DEFAULT_CHUNK, NULL, _arg, column_sum, column_sum_plan,
                   column_sums, from_acc, lane_group, spmm_custom, task_plan, to_acc)

KINDS = {score: kind for kind, score in enumerate(ATTENTION_SCORES)}   # KIND template value
# Rows per thread of the column sum over the grad_att partial rows (fewer,
# shorter rows than spmm's bias gradient, whose COLUMN_SUM_ROWS is 64; 1024
# keeps grad_att's summation order as it was before the sum was shared).
GATT_SUM_ROWS = 1024
# Shared memory a target-pass block may take for gatv2's grad_att slots
# (BLOCK // group slots of C acc values); every layout of _shape needs at
# most 16 KiB (256 lanes x VEC x NCH values), so this only guards new ones.
GATT_SMEM_BUDGET = 16 * 1024


def _drop_args(drop):
    return (np.uint64(drop.key), np.uint64(drop.offset), np.uint64(drop.threshold),
            np.float64(drop.scale), np.int32(1 if drop.active else 0))


def _acc(vtype):
    return np.float64 if vtype == "float64" else np.float32


def _shape(vtype, score, C, arrays, backward):
    """(VEC, NCH, GROUP, group, nch) of a launch over `arrays` (CuPy arrays or
    None): `shape_for` on their addresses."""
    heads = max(a.shape[1] for a in arrays if a is not None and a.ndim == 3)
    return shape_for(vtype, score, C, heads, [a.data.ptr for a in arrays if a is not None],
                     backward)


def shape_for(vtype, score, C, heads, ptrs, backward):
    """(VEC, NCH, GROUP, group, nch): vector width, register chunks, lanes per
    group as compiled in (0 = runtime), lanes per group, chunks used, for the
    forward or backward kernels of `score`'s heads of C channels over the
    arrays at addresses `ptrs` (rows of `heads` heads). Raises
    NotImplementedError for heads wider than the kernels hold."""
    vec = 1
    wide = attention_vecs(vtype, score, backward)[-1]
    if C % wide == 0 and all(p % (wide * VALUE_BYTES[vtype]) == 0 for p in ptrs):
        vec = wide
    lanes = -(-C // vec)
    group = lane_group(lanes)
    nch = -(-lanes // group)
    NCH = next((n for n in attention_nchs(vec) if n >= nch), None)
    if NCH is None:
        raise NotImplementedError(
            f"the CUDA attention kernels hold at most {attention_nchs(vec)[-1] * 32 * vec} channels "
            f"per head for this layout (got C={C}); use fewer channels per head")
    if C * heads * VALUE_BYTES[vtype] >= 2 ** 31:
        raise NotImplementedError("the CUDA attention kernels address one row of H x C values "
                                  "with 32-bit byte strides (under 2 GiB per row)")
    groups = attention_groups(vec, NCH)
    if groups == (0,):
        return vec, NCH, 0, group, nch
    group = next(g for g in groups if g >= group)   # narrow heads: idle lanes
    return vec, NCH, group, group, nch


def mma_scores(score, vtype, H, C, has_e, shape, ptrs):
    """Whether a launch of this `shape` (shape_for's) scores on Tensor Cores:
    attn_fwd_mma for the 16-bit gatv2 forward, attn_bwd_dst_mma for its
    deterministic backward's target pass (kernels_cuda/attention.cu):
    16-bit gatv2 without edge term, heads of 32 channels at 4 values per
    lane, a multiple of 4 heads (whole heads per warp), and the rows at
    `ptrs` (the forward's S, Dn, att, out, out_b; the target pass's S, Dn,
    att, g, out; 0 for an absent one) 16-byte aligned."""
    vec, NCH, GRP = shape[:3]
    return (score == "gatv2" and VALUE_BYTES[vtype] == 2 and not has_e and C == 32
            and (vec, NCH, GRP) == (4, 1, 8) and H % 4 == 0
            and all(p % 16 == 0 for p in ptrs))


def _grid(units, group):
    return (max(1, -(-units * group // BLOCK)),)


def edge_phases(vtype, vec, H, group):
    """Copies of a slot's H lane groups that walk its tasks' edges together
    (the edge phases of attention.cu, whose 16-bit kernels of 8 values per
    lane take them): 32 / (H group) where the H groups take fewer lanes than
    a warp and divide it, so a slot fills its warp; else 1."""
    lanes = H * group
    phased = VALUE_BYTES[vtype] == 2 and vec == 8
    return 32 // lanes if phased and lanes < 32 and 32 % lanes == 0 else 1


# attn_fwd, attn_bwd_dst and attn_bwd_src run on persistent grids: as many
# blocks as the device holds at once, each slot of H lane groups walking
# ranges of tasks of about equal work, one per round of a sweep of the whole
# grid over the task list (task_slots; FOR_EACH_GROUP_TASK in attention.cu).
# False: one lane group per (task, head) pair, one task each (slower where a
# block's short tasks wait for its hub task; tests run both).
PERSISTENT = True
# Rounds: the slots sweep the task list together, so neighbouring targets'
# source rows are read at about the same time and L2 serves them again; one
# range per slot (1 round) left each slot a contiguous stretch of the graph
# and L2 nothing to share (clustered20 in `cluster` order, fp32: 3-14% L2
# hits, DRAM at 47-86% of peak, by ncu; at 32 rounds of ranges of equal
# work the GAT passes hit 24-36%). task_slots cuts every round so that each
# slot's work stays within about one task of its share, so more rounds cost
# no balance. H200, 4 x 32,
# fwd+bwd ms at 1 / 8 / 32 rounds (benchmarks/results/attention_rounds_h200.md):
# fp32 GAT on clustered20 in cluster order 16.0 / - / 12.6, rmat20 7.75 /
# 7.17 / 6.97, shuffled rmat20 8.14 / 7.37 / 7.28, uniform20 10.8 / - / 10.5,
# mesh3d101 4.13 / 3.57 / 3.48 (equal-work ranges); 128 rounds ran slower
# than 32 on the clustered graph (12.5 -> 13.4) and no faster on the mesh.
ROUNDS = 32
# Tasks a slot's range holds at the least on average: fewer rounds where
# ROUNDS would leave ranges emptier (a graph of fewer tasks than slots x
# ROUNDS: most of its ranges would hold no task, and the cuts cost host time
# per graph, `slot_cuts`). Whether longer ranges pay on graphs that change
# every step is not measured; 1 keeps every graph with enough tasks at
# ROUNDS.
TASKS_PER_RANGE = 1           # (0: always ROUNDS)
ONE_SLOT_PER_TASK_LIMIT = 1 << 30
# The resident block count to assume instead of asking the device (tests set
# a few blocks, so that every group walks many tasks); None: the occupancy.
RESIDENT_BLOCKS = None
# Scores whose backward takes the atomic target pass when deterministic=False
# allows it: where it is faster than the two passes on persistent grids
# (rmat20, 4 x 32, fwd+bwd ms, deterministic / atomic: gatv2 fp32 11.2 / 8.2,
# bf16 14.4 / 10.9; dot fp32 11.5 / 13.8, bf16 12.9 / 19.1; gat fp32 7.68 /
# 7.53, bf16 7.63 / 10.4; H200).
# The others keep the deterministic passes (which deterministic=False allows).
ATOMIC_SCORES = frozenset({"gatv2"})
# A task's fixed work (its target rows, its stores) counted in edges when the
# slots' task ranges are cut to equal work.
TASK_COST_EDGES = 4
# False: edge_attention's backward runs its launches one by one (CuPy) and
# fastgnn.torch's plan path hands it to the bridge; True: the common case
# (plan_serves_backward) runs an AttnBwdPlan.
BACKWARD_PLANS = True
_resident: dict = {}
ON_CLEAR.append(_resident.clear)      # recompiled kernels get their own occupancy


def _resident_blocks(kern, smem):
    """Blocks of `kern` (BLOCK threads, `smem` bytes of dynamic shared memory)
    the device holds at once: its occupancy times the multiprocessors, cached
    per kernel (RESIDENT_BLOCKS if set)."""
    if RESIDENT_BLOCKS:
        return RESIDENT_BLOCKS
    key = (kern, smem)        # the kernel object (kept here), never a reusable address
    if key not in _resident:
        per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(kern.kernel.ptr, BLOCK, smem)
        sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        _resident[key] = max(1, per_sm) * sms
    return _resident[key]


def _task_work(graph, plan):
    """[num_tasks + 1] int64 prefix sums of the tasks' work (each task's
    edges plus TASK_COST_EDGES), cached per graph."""
    def build():
        xp = cp.get_array_module(plan.task_row)
        if xp is not np:
            return graph_build.task_work_prefix(plan.task_row, plan.task_begin, graph.indptr,
                                                plan.chunk, TASK_COST_EDGES)
        begin = plan.task_begin.astype(np.int64)
        row_end = graph.indptr[plan.task_row.astype(np.int64) + 1].astype(np.int64)
        work = xp.minimum(begin + plan.chunk, row_end) - begin + TASK_COST_EDGES
        prefix = xp.zeros(work.shape[0] + 1, dtype=np.int64)
        xp.cumsum(work, out=prefix[1:])
        return prefix
    return graph.cached(("attention_task_work", plan.chunk, TASK_COST_EDGES), build)


def task_slots(graph, plan, num_slots, rounds=1):
    """slot_begin [num_slots * rounds + 1] int64: range k = r * num_slots + s
    (slot s's range in round r) takes the tasks slot_begin[k] ..
    slot_begin[k + 1] - 1 of `plan` (graph's task plan). With W the total
    work (_task_work), each round is cut so that every slot's work so far
    comes nearest (r + 1) / rounds of its share W / num_slots, each cut on
    the task boundary nearest its goal: a slot that came out ahead in one
    round is given less in the next, so its total ends within about one task
    of its share for any round count. (Cutting num_slots * rounds ranges of
    equal work instead lets a slot's rounding add up over its rounds: rmat20,
    4224 slots, 32 rounds, worst slot 1.37x the mean.) Cached per graph,
    slot count and rounds; NumPy or CuPy arrays, as the plan's. The cuts are
    computed where the task plan lives: on the GPU by one block of one
    kernel (graph_build.slot_cuts: no copy to the host, so a new graph every
    step costs no synchronisation here), on the host by the sequential sweep
    `slot_cuts` (compiled by Numba; the kernel's reference)."""
    def build():
        prefix = _task_work(graph, plan)
        _check_cut_range(int(prefix.shape[0]) - 1, plan.chunk, num_slots, rounds)
        if isinstance(prefix, np.ndarray):
            return slot_cuts(prefix, int(num_slots), int(rounds))
        return graph_build.slot_cuts(prefix, int(num_slots), int(rounds))
    return graph.cached(("attention_task_slots", plan.chunk, num_slots, rounds, TASK_COST_EDGES),
                        build)


_slot_cuts = None


def slot_cuts(work_before, num_slots: int, rounds: int):
    """[num_slots * rounds + 1] int64 task cuts of `task_slots` from the
    work prefix work_before [num_tasks + 1] (int64, on the host).

    Round r's goal for slot s's end is the work before the round plus the
    sum over slots s' <= s of max(share (r + 1) / rounds - done_s', 0)
    (share = W / num_slots, done_s' the work slot s' took so far); each
    goal is cut at the nearest task boundary (the lower one on a tie), never
    before the previous round's last cut, and the last cut of the last round
    is the task count. All work is scaled by num_slots * rounds, so the
    sweep is exact integer arithmetic, as graph.cu's slot_cuts kernel (the
    GPU's form, which must give the same cuts)."""
    global _slot_cuts
    if _slot_cuts is None:
        import numba
        _slot_cuts = numba.njit(cache=True)(_slot_cuts_py)
    return _slot_cuts(work_before, num_slots, rounds)


def _slot_cuts_py(work_before, num_slots, rounds):
    num_tasks = work_before.shape[0] - 1
    SR = num_slots * rounds             # the scale: W (r + 1) is round r's target
    W = work_before[num_tasks]
    done = np.zeros(num_slots, dtype=np.int64)
    cuts = np.zeros(num_slots * rounds + 1, dtype=np.int64)
    start = 0
    last = 0
    for r in range(rounds):
        target = W * (r + 1)
        wanted = 0                      # the round's wanted work up to slot s
        before = start                  # the work before slot s's range
        hi = last                       # the goals rise within a round: one forward walk
        for s in range(num_slots):
            wanted += max(target - done[s], 0)
            goal = start + wanted
            while hi > 0 and work_before[hi - 1] * SR >= goal:
                hi -= 1
            while hi < num_tasks and work_before[hi] * SR < goal:
                hi += 1                 # (the first boundary at or past the goal)
            lo = max(hi - 1, 0)
            end = lo if goal - work_before[lo] * SR < work_before[hi] * SR - goal else hi
            end = max(end, last)
            if r == rounds - 1 and s == num_slots - 1:
                end = num_tasks
            cuts[1 + r * num_slots + s] = end
            done[s] += work_before[end] * SR - before
            before = work_before[end] * SR
        start = before
        last = cuts[(r + 1) * num_slots]
    return cuts


# the scaled work (total x slots x rounds) the integer cuts hold exactly
_CUT_RANGE = 2**62


def _check_cut_range(num_tasks, chunk, num_slots, rounds):
    """ValueError where the scaled work could overflow 64 bits: a task's work
    is at most chunk + TASK_COST_EDGES (a bound known without a copy of the
    work to the host)."""
    bound = num_tasks * (chunk + TASK_COST_EDGES)
    if bound * num_slots * rounds * 2 >= _CUT_RANGE:
        raise ValueError(f"{num_tasks} attention tasks on {num_slots} x {rounds} slot ranges "
                         "exceed the 64-bit range of the task cuts; lower "
                         "fastgnn.backends.cuda.attention.ROUNDS")


def _persistent_grid(kern, graph, plan, H, group, smem=0, phases=1):
    """(grid, slot_begin, rounds) of a launch of `kern` over `plan`'s tasks x
    H heads, lane groups of `group`, `phases` copies of a slot's H
    (edge_phases): the resident blocks, the slots' task ranges (task_slots)
    and ROUNDS (fewer where ranges would hold under TASKS_PER_RANGE tasks)
    where one group per (task, head) pair would need more blocks
    than that; else that grid, NULL (slot s = task s) and 1. The grid
    depends on the graph's task count, the device's multiprocessor count and
    the compiled kernel's occupancy, nothing else: which tasks a group takes,
    in which order, and every sum carried across them (gatv2's grad_att), is
    the same on every run of one machine and build (another GPU model or MIG
    slice may round grad_att differently)."""
    ntask = int(plan.task_row.shape[0])
    per_slot = H * phases                         # lane groups
    full = _grid(ntask * per_slot, group)[0]
    # the kernels count slots in 32 bits: a grid of one slot per task only
    # below ONE_SLOT_PER_TASK_LIMIT tasks (a persistent grid holds what the
    # device runs at once)
    if not PERSISTENT and ntask < ONE_SLOT_PER_TASK_LIMIT:
        return (full,), NULL, 1
    blocks = _resident_blocks(kern, smem)
    slots = blocks * (BLOCK // group) // per_slot
    if blocks >= full or slots == 0:
        if ntask >= ONE_SLOT_PER_TASK_LIMIT:      # slots == 0 on a graph that large
            raise ValueError(f"{H} heads need more lane groups than the GPU holds at once; "
                             "split the heads over several calls")
        return (full,), NULL, 1
    rounds = (max(1, min(ROUNDS, ntask // (slots * TASKS_PER_RANGE))) if TASKS_PER_RANGE
              else ROUNDS)
    return (blocks,), task_slots(graph, plan, slots, rounds), rounds


def _layout_words(H, C, nch, group, phases, rounds, acc, slope, scale=None):
    """The scalars the attention kernels take after num_tasks, up to the
    dropout spec: H, C, nch, chunk, group, launch_phases, rounds, slope, and
    scale where given (attn_bwd_src takes none: its per-edge weights come
    from the target pass, scale and dropout applied)."""
    words = (np.int32(H), np.int32(C), np.int32(nch), np.int32(DEFAULT_CHUNK), np.int32(group),
             np.int32(phases), np.int32(rounds), acc(slope))
    return words if scale is None else words + (acc(scale),)


def _names(graph, vtype):
    return _ITYPE[np.dtype(graph.index_dtype)], C_VALUE[vtype]


# ------------------------------------------------------------ launch plans
# Each launch of the family for one (graph, request) is part of a LaunchPlan
# (plan.py) cached on the graph, as in segment.py: the launchers below run
# the plans on CuPy arrays, fastgnn.torch (adapters/torch/plans.py) on torch
# tensors. The dropout scalars change from call to call (a fresh seed per
# step): they are `Word`s, the last five call values of every plan
# (`drop_values`).
def _drop_words(first):
    """The kernels' DROP_PARAMS as per-call words, call values first..first+4."""
    return (Word(first, "uint64"), Word(first + 1, "uint64"), Word(first + 2, "uint64"),
            Word(first + 3, "float64"), Word(first + 4, "int32"))


@functools.lru_cache(maxsize=64)
def _scale_word(scale):
    return word(np.float64(scale))


def drop_values(drop):
    """The call values of `_drop_words` for a DropoutSpec (as `_drop_args`)."""
    return (drop.key, drop.offset, drop.threshold, _scale_word(drop.scale),
            1 if drop.active else 0)


# ------------------------------------------------------------ edge_softmax
# the call values of a SoftmaxPlan, in `run`'s order (forward / backward)
SM_SCORES, SM_OUT, SM_LSE, SM_DROP = 0, 1, 2, 3
SMB_SCORES, SMB_LSE, SMB_GRAD, SMB_OUT, SMB_DROP = 0, 1, 2, 3, 4


class SoftmaxPlan(LaunchPlan):
    """edge_softmax's launch for one (graph, H, value type, direction).

    forward run(stream, (scores, out, lse, *drop_values)): scores, out [E, H]
    caller order, lse [num_dst, H] (lse_dtype).
    backward run(stream, (scores, lse, grad, grad_scores, *drop_values))."""

    def __init__(self, graph, H, vtype, backward):
        itype, T = _names(graph, vtype)
        n = graph.num_dst
        launches = []
        if n and H and not (backward and graph.num_edges == 0):
            name = f"softmax_{'bwd' if backward else 'fwd'}<{T}, {C_INDEX[itype]}>"
            bufs = ((Slot(SMB_SCORES), Slot(SMB_LSE), Slot(SMB_GRAD), Slot(SMB_OUT))
                    if backward else (Slot(SM_SCORES), Slot(SM_OUT), Slot(SM_LSE)))
            launches.append(Launch(get_function("attention", vtype, itype, name),
                                   _grid(n, 32), (graph.indptr, caller_ids(graph), *bufs,
                                                  np.int64(n), np.int32(H),
                                                  *_drop_words(len(bufs))), name=name))
        super().__init__(launches, device=graph_device(graph))


def softmax_plan(graph, H, vtype, backward, context=contextlib.nullcontext) -> SoftmaxPlan:
    """The cached SoftmaxPlan; `context` as in segment._cached_plan."""
    return _cached_plan(graph, ("cuda_softmax", H, vtype, bool(backward)),
                        lambda: SoftmaxPlan(graph, H, vtype, backward), context)


def edge_softmax_fwd(graph, scores, drop, vtype):
    """(out [E, H] caller order, lse [num_dst, H])."""
    E, H = scores.shape
    out = cp.empty_like(scores)
    lse = cp.empty((graph.num_dst, H), dtype=lse_dtype(vtype))
    if graph.num_dst == 0 or H == 0:
        return out, lse
    softmax_plan(graph, H, vtype, False).run(
        current_stream(), (scores.data.ptr, out.data.ptr, lse.data.ptr, *drop_values(drop)))
    return out, lse


def edge_softmax_bwd(graph, scores, lse, grad, drop, vtype):
    """grad_scores [E, H] caller order."""
    E, H = scores.shape
    out = cp.empty_like(scores)
    if graph.num_dst == 0 or H == 0 or E == 0:
        return out
    softmax_plan(graph, H, vtype, True).run(
        current_stream(), (scores.data.ptr, lse.data.ptr, grad.data.ptr, out.data.ptr,
                           *drop_values(drop)))
    return out


# ---------------------------------------------------------- edge_attention
def _kernel_name(kernel, score, vtype, itype, vec, nch, grp, has_e, *flags):
    T, I = C_VALUE[vtype], C_INDEX[itype]
    extra = "".join(f", {str(f).lower()}" for f in flags)
    return f"{kernel}<{KINDS[score]}, {T}, {I}, {vec}, {nch}, {grp}, {str(has_e).lower()}{extra}>"


def _kernel(kernel, score, vtype, itype, *args):
    return get_function("attention", vtype, itype,
                        _kernel_name(kernel, score, vtype, itype, *args))


def _mma_kernel_name(kernel, vtype, itype, grp, *flags):
    """The name of a Tensor Core score kernel (attn_fwd_mma, attn_bwd_dst_mma:
    16-bit gatv2, no score or shape parameters beyond the group size)."""
    extra = "".join(f", {str(f).lower()}" for f in flags)
    return f"{kernel}<{C_VALUE[vtype]}, {C_INDEX[itype]}, {grp}{extra}>"


# the call values of an AttnFwdPlan, in `run`'s order
(AF_S, AF_DN, AF_ED, AF_ATT, AF_V, AF_BIAS, AF_OUT, AF_OUT_B, AF_LSE, AF_ALPHA, AF_WORKSPACE,
 AF_DROP) = range(12)


class AttnFwdPlan(LaunchPlan):
    """The forward's launches for one (graph, score, value type, H, C, edge
    term?, bias?, alpha?, negative_slope, scale, launch shape): attn_fwd on
    its persistent grid, attn_combine over split rows, and with alpha the
    attn_fwd pass writing it.

    run(stream, (S, Dn, Ed, att, V, bias, out, out_b, lse, alpha, workspace,
    *drop_values)): the score slots (score_slots; 0: absent), out and out_b
    [num_dst, H, C], lse [num_dst, H] (acc type), alpha [E, H] and a
    workspace of `workspace_bytes` for the split rows' (m, l, acc) states."""

    def __init__(self, graph, score, vtype, H, C, has_e, has_bias, need_alpha, slope, scale,
                 shape, mma=False):
        itype = _ITYPE[np.dtype(graph.index_dtype)]
        acc = _acc(vtype)
        vec, NCH, GRP, group, nch = shape
        plan = task_plan(graph, DEFAULT_CHUNK, visit=False)
        ntask = int(plan.task_row.shape[0])
        slots = plan.num_slots
        a = np.dtype(acc).itemsize
        offsets, self.workspace_bytes = layout([slots * H * a, slots * H * a, slots * H * C * a])
        p_m, p_l, p_acc = (None if o is None else Slot(AF_WORKSPACE, o) for o in offsets)
        fwd = _kernel("attn_fwd", score, vtype, itype, vec, NCH, GRP, has_e)
        name = _kernel_name("attn_fwd", score, vtype, itype, vec, NCH, GRP, has_e)
        # the main pass on Tensor Cores (mma_scores); the alpha pass stays on attn_fwd
        main_name = _mma_kernel_name("attn_fwd_mma", vtype, itype, GRP) if mma else name
        main = get_function("attention", vtype, itype, main_name) if mma else fwd
        phases = edge_phases(vtype, vec, H, group)
        grid, slot_begin, rounds = _persistent_grid(main, graph, plan, H, group, phases=phases)
        slot_begin = None if slot_begin is NULL else slot_begin
        ins = [Slot(k) for k in (AF_S, AF_DN, AF_ED, AF_ATT, AF_V, AF_BIAS)]
        common = (plan.task_row, plan.task_begin, plan.task_slot, slot_begin, graph.indptr,
                  graph.indices, caller_ids(graph), *ins)
        scalars = (np.int64(ntask),
                   *_layout_words(H, C, nch, group, phases, rounds, acc, slope, scale),
                   *_drop_words(AF_DROP))
        launches = [Launch(main, grid, common + (Slot(AF_OUT), Slot(AF_OUT_B), Slot(AF_LSE), None,
                                                 p_m, p_l, p_acc) + scalars + (np.int32(0),),
                           name=main_name)]
        num_split = int(plan.split_row.shape[0])
        if num_split:
            g1 = lane_group(C)
            cname = f"attn_combine<{C_VALUE[vtype]}, {C_INDEX[itype]}>"
            launches.append(Launch(
                get_function("attention", vtype, itype, cname), _grid(num_split * H, g1),
                (plan.split_row, plan.slot_ptr, p_m, p_l, p_acc, Slot(AF_BIAS), Slot(AF_OUT),
                 Slot(AF_OUT_B), Slot(AF_LSE), np.int64(num_split), np.int32(H), np.int32(C),
                 np.int32(g1)), name=cname))
        if need_alpha and graph.num_edges:
            launches.append(Launch(fwd, grid, common + (Slot(AF_OUT), None, Slot(AF_LSE),
                                                        Slot(AF_ALPHA), None, None, None)
                                   + scalars + (np.int32(1),), name=name))
        super().__init__(launches, device=graph_device(graph))


def fwd_plan(graph, score, vtype, H, C, has_e, has_bias, need_alpha, params, shape, mma=False,
             context=contextlib.nullcontext) -> AttnFwdPlan:
    """The cached AttnFwdPlan of this request (shape: `shape_for`'s; mma:
    `mma_scores`'); `context` as in segment._cached_plan."""
    key = ("cuda_attention_fwd", score, vtype, H, C, bool(has_e), bool(has_bias),
           bool(need_alpha), params.negative_slope, params.scale, shape, bool(mma), PERSISTENT,
           RESIDENT_BLOCKS, ROUNDS)
    return _cached_plan(graph, key, lambda: AttnFwdPlan(
        graph, score, vtype, H, C, has_e, has_bias, need_alpha, params.negative_slope,
        params.scale, shape, mma), context)


def edge_attention_fwd(graph, score, arrays, params, need_alpha):
    """(out [num_dst, H, C], lse [num_dst, H], alpha [E, H] or None, out + bias
    or None): see fastgnn/ops/attention.py."""
    S, Dn, Ed, att, V = score_slots(score, arrays)
    vtype = _vtype(V, arrays)
    H, C = V.shape[1], V.shape[2]
    acc = _acc(vtype)
    out = cp.empty((graph.num_dst, H, C), dtype=V.dtype)
    lse = cp.empty((graph.num_dst, H), dtype=acc)
    alpha = cp.empty((graph.num_edges, H), dtype=V.dtype) if need_alpha else None
    bias = arrays.get("bias")
    out_b = cp.empty_like(out) if bias is not None else None
    if graph.num_dst == 0 or H == 0 or C == 0:
        return out, lse, alpha, out_b       # nothing to write
    # (the bias is read per value, so its alignment does not matter)
    shape = _shape(vtype, score, C, (S, Dn, Ed, att, V, out) if score != "gat" else (V, out),
                   False)
    mma = params.mma_scores and mma_scores(
        score, vtype, H, C, Ed is not None, shape,
        [_ptr(a) for a in (S, Dn, att, out, out_b)])
    plan = fwd_plan(graph, score, vtype, H, C, Ed is not None, bias is not None, need_alpha,
                    params, shape, mma)
    ws = cp.empty(plan.workspace_bytes, dtype=np.uint8) if plan.workspace_bytes else None
    bufs = (S, Dn, Ed, att, V, bias, out, out_b, lse, alpha, ws)
    plan.run(current_stream(), (*(_ptr(a) for a in bufs), *drop_values(params.drop)))
    return out, lse, alpha, out_b


def _ptr(a) -> int:
    return 0 if a is None else a.data.ptr


def _vtype(V, arrays):
    """The value type of the op (bf16 travels as 16-bit integers)."""
    if V.dtype.kind == "f":
        return V.dtype.name
    return "bfloat16"


def _delta(graph, score, arrays, out, lse, grad_out, grad_alpha, params, vtype):
    """D[i, h] = <g_i, out_i> + sum_{e in N(i)} p_e ga_e, [num_dst, H] in acc type.
    Only where the target pass does not compute D itself (see attn_bwd_dst):
    grad_alpha given or grad_out None."""
    acc = _acc(vtype)
    H, C = out.shape[1], out.shape[2]
    if grad_out is not None:
        d = cp.empty((graph.num_dst, H), dtype=acc)
        if graph.num_dst:
            itype = _ITYPE[np.dtype(graph.index_dtype)]
            fn = get_function("attention", vtype, itype, f"attn_delta<{C_VALUE[vtype]}>")
            group = lane_group(C)
            launch_now(fn, _grid(graph.num_dst * H, group),
                       (grad_out, out, d, np.int64(graph.num_dst), np.int32(H), np.int32(C),
                        np.int32(group)))
    else:
        d = cp.zeros((graph.num_dst, H), dtype=acc)
    if grad_alpha is not None and graph.num_edges:
        _, _, alpha, _ = edge_attention_fwd(graph, score, {**arrays, "bias": None}, params, True)
        prod = (to_acc(alpha, vtype, np.float64) * to_acc(grad_alpha, vtype, np.float64))
        # per-row sums of prod [E, H] (caller order; not E x H x C) in CSR order:
        # the SpMM kernel over a graph whose "sources" are the caller ids (a
        # prefix-sum difference would let one NaN/inf poison every later row)
        rows = graph.cached("attention_caller_id_graph", lambda: Graph(
            graph.indptr, caller_ids(graph), None, graph.num_edges, graph.num_dst))
        d += spmm_custom(rows, prod, None, "float64").astype(acc)
    return cp.ascontiguousarray(d, dtype=acc)


def _combine(plan, partial, out, width, vtype, itype):
    """Sum the split rows' partial rows (slot order) into out rows of `width`
    values, now (`_combine_launches` on these arrays)."""
    if out is not None:
        launch_fixed(_combine_launches(plan, partial, out, width, vtype, itype))


def _gatt_slots_bytes(group, C, acc):
    """Shared memory of a block's grad_att slots (gatt_slots in attention.cu):
    C acc values per lane group."""
    return (BLOCK // group) * C * np.dtype(acc).itemsize


def _block_gatt(ntask, H, C, group, acc, phases=1):
    """(block, shared_mem): whether gatv2's grad_att partials go one row per
    thread block of the target pass (attn_bwd_dst's BLOCK_GATT: BLOCK // group
    (task, head) slots of C values in shared memory, summed per block) and
    the bytes that takes. It does when the slots fit GATT_SMEM_BUDGET and a
    block holds more (task, head) pairs than there are heads (every head has
    slots in every block); otherwise each task writes its own row. On rmat20
    (H=4, C=32) a block holds 32 groups of 8 lanes, in fp32 and bf16."""
    smem = _gatt_slots_bytes(group, C, acc)
    if smem <= GATT_SMEM_BUDGET and _grid(ntask * H * phases, group)[0] < ntask:
        return True, smem
    return False, 0


# the call values of an AttnBwdPlan, in `run`'s order
(AB_S, AB_DN, AB_ED, AB_ATT, AB_V, AB_LSE, AB_G, AB_OUT, AB_GS, AB_GDN, AB_GED, AB_GV, AB_GATT,
 AB_WORKSPACE, AB_DROP) = range(15)


class AttnBwdPlan(LaunchPlan):
    """The deterministic backward's launches for one (graph, score, value
    type, H, C, edge term?, wanted gradients, negative_slope, scale, launch
    shape), given a cotangent of out and none of alpha: the target pass
    attn_bwd_dst over the CSR (delta from out; the per-edge (w, ds') of the
    source pass, wds [E, H, 2], where that pass runs), spmm_combine of its
    split rows, the source pass attn_bwd_src over the transpose and its
    combines, then gatv2's grad_att column sum (`gatt_sum`, a ColumnSumPlan
    run after the launches, over both passes' partial rows). The target pass
    runs for every request: the source pass takes its weights from it; the
    source pass runs where a source-side gradient or grad_att is wanted.
    wants: (gS, gDn, gEd, gV, gatt), the gradients of SLOT_NAMES' slots and att.

    run(stream, (S, Dn, Ed, att, V, lse, g, out, gS, gDn, gEd, gV, gatt,
    workspace, *drop_values)): the forward's inputs (score_slots), lse and
    out (without the bias), the cotangent g [num_dst, H, C], the wanted
    gradients (0: not wanted; gatt [H * C] in the acc type, which is the
    value type here) and a workspace of `workspace_bytes` (wds, the split
    rows' partial sums, grad_att's partial rows, the column sum's levels)."""

    def __init__(self, graph, score, vtype, H, C, has_e, wants, slope, scale, shape):
        need_gS, need_gDn, need_gEd, need_gV, need_gatt = wants
        itype = _ITYPE[np.dtype(graph.index_dtype)]
        acc = _acc(vtype)
        a = np.dtype(acc).itemsize
        Cs = 1 if score == "gat" else C
        vec, NCH, GRP, group, nch = shape
        gatv2 = score == "gatv2"
        src_pass = need_gS or need_gV or (gatv2 and need_gatt)   # grad_att's xl_j terms
        dplan = task_plan(graph, DEFAULT_CHUNK, visit=False)
        dtask = int(dplan.task_row.shape[0])
        phases = edge_phases(vtype, vec, H, group)
        block_gatt, smem = (_block_gatt(dtask, H, C, group, acc, phases) if need_gatt
                            else (False, 0))
        dst = _kernel("attn_bwd_dst", score, vtype, itype, vec, NCH, GRP, has_e, False,
                      block_gatt)
        dgrid, dslots, drounds = _persistent_grid(dst, graph, dplan, H, group, smem, phases)
        t = graph.transpose() if src_pass else None
        splan = task_plan(t, DEFAULT_CHUNK, visit=False) if src_pass else None
        s_slots = splan.num_slots if src_pass else 0
        ssmem = _gatt_slots_bytes(group, C, acc) if need_gatt else 0
        if src_pass:
            src = _kernel("attn_bwd_src", score, vtype, itype, vec, NCH, GRP, has_e)
            sgrid, sslots, srounds = _persistent_grid(src, t, splan, H, group, ssmem, phases)
        # grad_att's partial rows: the target pass's, then the source pass's (one per block)
        dst_rows = (dgrid[0] if block_gatt else dtask) if need_gatt else 0
        gatt_rows = dst_rows + (sgrid[0] if need_gatt else 0)
        self.gatt_sum = (column_sum_plan("attention", vtype, itype, gatt_rows, H * C, False,
                                         False, GATT_SUM_ROWS) if need_gatt else None)
        # wds, p_dn, grad_att's partial rows, p_s, p_v, the column sum's levels
        d_slots = dplan.num_slots
        offsets, self.workspace_bytes = layout(
            [graph.num_edges * H * 2 * a if src_pass else 0,
             d_slots * H * Cs * a if need_gDn else 0,
             gatt_rows * H * C * a, s_slots * H * Cs * a if need_gS else 0,
             s_slots * H * C * a if need_gV else 0,
             self.gatt_sum.workspace_bytes if need_gatt else 0])
        wds, p_dn, gatt_part, p_s, p_v, sum_ws = (None if o is None else Slot(AB_WORKSPACE, o)
                                                  for o in offsets)
        gatt_src = Slot(AB_WORKSPACE, offsets[2] + dst_rows * H * C * a) if need_gatt else None
        self.gatt_offsets = (offsets[2], offsets[5])
        S_, Dn_, Ed_, att_, V_, lse_, g_ = (Slot(k) for k in (AB_S, AB_DN, AB_ED, AB_ATT, AB_V,
                                                               AB_LSE, AB_G))
        # the fused case: the target pass computes delta from out itself
        launches = [Launch(
            dst, dgrid,
            (dplan.task_row, dplan.task_begin, dplan.task_slot,
             None if dslots is NULL else dslots, graph.indptr, graph.indices,
             caller_ids(graph), S_, Dn_, Ed_, att_, V_, lse_, g_, None, Slot(AB_OUT), None, wds,
             Slot(AB_GDN) if need_gDn else None, p_dn, Slot(AB_GED) if need_gEd else None,
             gatt_part, None, None, np.int64(dtask))
            + _layout_words(H, C, nch, group, phases, drounds, acc, slope, scale)
            + _drop_words(AB_DROP), smem=smem,
            name=_kernel_name("attn_bwd_dst", score, vtype, itype, vec, NCH, GRP, has_e,
                              False, block_gatt))]
        if need_gDn:
            launches += _combine_launches(dplan, p_dn, Slot(AB_GDN), H * Cs, vtype, itype)
        if src_pass:
            stask = int(splan.task_row.shape[0])
            launches.append(Launch(
                src, sgrid,
                (splan.task_row, splan.task_begin, splan.task_slot,
                 None if sslots is NULL else sslots, t.indptr, t.indices,
                 transpose_caller_ids(graph), S_, Dn_, Ed_, att_, wds, g_,
                 Slot(AB_GS) if need_gS else None, p_s, Slot(AB_GV) if need_gV else None, p_v,
                 gatt_src, np.int64(stask))
                + _layout_words(H, C, nch, group, phases, srounds, acc, slope), smem=ssmem,
                name=_kernel_name("attn_bwd_src", score, vtype, itype, vec, NCH, GRP, has_e)))
            if need_gS:
                launches += _combine_launches(splan, p_s, Slot(AB_GS), H * Cs, vtype, itype)
            if need_gV:
                launches += _combine_launches(splan, p_v, Slot(AB_GV), H * C, vtype, itype)
        super().__init__(launches, device=graph_device(graph))

    def run(self, stream, ptrs):
        super().run(stream, ptrs)
        if self.gatt_sum is not None:
            ws = ptrs[AB_WORKSPACE]
            part, sum_ws = (0 if o is None else ws + o for o in self.gatt_offsets)
            self.gatt_sum.run(stream, (part, ptrs[AB_GATT], sum_ws))


def _combine_launches(plan, partial, out, width, vtype, itype):
    """The spmm_combine launch that sums the split rows' partial rows (slot
    order) into out rows of `width` values: a plan's with Slots, `_combine`'s
    with arrays; none without split rows or partial rows."""
    num_split = int(plan.split_row.shape[0])
    if not num_split or partial is None:
        return []
    name = f"spmm_combine<{C_VALUE[vtype]}, {C_INDEX[itype]}, 1>"
    group = lane_group(width)
    return [Launch(get_function("spmm", vtype, itype, name), _grid(num_split, group),
                   (plan.split_row, plan.slot_ptr, partial, None, None, out,
                    np.int64(num_split), np.int32(width), np.int32(group)), name=name)]


def bwd_plan(graph, score, vtype, H, C, has_e, wants, params, shape,
             context=contextlib.nullcontext) -> AttnBwdPlan:
    """The cached AttnBwdPlan of this request (wants: a tuple of five bools);
    `context` as in segment._cached_plan."""
    key = ("cuda_attention_bwd", score, vtype, H, C, bool(has_e), tuple(wants),
           params.negative_slope, params.scale, shape, PERSISTENT, RESIDENT_BLOCKS,
           ROUNDS)
    return _cached_plan(graph, key, lambda: AttnBwdPlan(
        graph, score, vtype, H, C, has_e, wants, params.negative_slope, params.scale, shape),
        context)


def plan_serves_backward(score, vtype, grad_out, grad_alpha, params, wants):
    """Whether AttnBwdPlan serves a backward: fp32/fp64, a cotangent of out
    and none of alpha, no float atomics asked for (see edge_attention_bwd);
    never with BACKWARD_PLANS off."""
    need_gS, _, _, need_gV, _ = wants
    atomic = not params.deterministic and score in ATOMIC_SCORES and (need_gS or need_gV)
    return (BACKWARD_PLANS and vtype in ("float32", "float64") and grad_out is not None and grad_alpha is None
            and not atomic and any(wants))


def edge_attention_bwd(graph, score, arrays, out, lse, grad_out, grad_alpha, params, needs):
    """{input name: gradient or None} (see fastgnn/ops/attention.py)."""
    S, Dn, Ed, att, V = score_slots(score, arrays)
    vtype = _vtype(V, arrays)
    H, C = V.shape[1], V.shape[2]
    Cs = S.shape[2]
    acc = _acc(vtype)
    itype = _ITYPE[np.dtype(graph.index_dtype)]
    s_name, d_name, e_name, v_name = SLOT_NAMES[score]
    need_gS = bool(needs.get(s_name))
    need_gDn = bool(needs.get(d_name))
    need_gEd = Ed is not None and bool(needs.get(e_name))
    need_gV = score != "gatv2" and bool(needs.get(v_name))
    need_gatt = score == "gatv2" and bool(needs.get("att"))
    grads = {name: None for name in SCORE_INPUTS[score]}
    g = None if grad_out is None else cp.ascontiguousarray(grad_out)
    bias = arrays.get("bias")
    if bias is not None and needs.get("bias"):
        # the column sums of grad_out (a fixed order), 0 without a cotangent
        grads["bias"] = (cp.zeros_like(bias) if g is None or graph.num_dst == 0 else
                         column_sums(g.reshape(-1, H * C), vtype,
                                     graph.index_dtype).reshape(H, C))
    if not (need_gS or need_gDn or need_gEd or need_gV or need_gatt):
        return grads                    # the bias gradient at most: no pass over edges
    if graph.num_edges == 0 or H == 0 or C == 0:
        for name, want, like in ((s_name, need_gS, S), (d_name, need_gDn, Dn),
                                 (e_name, need_gEd, Ed), (v_name, need_gV, V)):
            if want:
                grads[name] = cp.zeros_like(like)
        if need_gatt:
            grads["att"] = cp.zeros_like(att)
        return grads
    out = cp.ascontiguousarray(out)
    ga = None if grad_alpha is None else cp.ascontiguousarray(grad_alpha)
    wants = (need_gS, need_gDn, need_gEd, need_gV, need_gatt)
    if plan_serves_backward(score, vtype, g, ga, params, wants):
        shape = _shape(vtype, score, C, (S, Dn, Ed, att, V, g, out) if score != "gat"
                       else (V, g, out), True)
        plan = bwd_plan(graph, score, vtype, H, C, Ed is not None, wants, params, shape)
        made = [cp.empty_like(like) if want else None
                for want, like in zip(wants, (S, Dn, Ed, V))]
        gatt = cp.empty(H * C, dtype=acc) if need_gatt else None
        ws = cp.empty(plan.workspace_bytes, dtype=np.uint8) if plan.workspace_bytes else None
        bufs = (S, Dn, Ed, att, V, lse, g, out, *made, gatt, ws)
        plan.run(current_stream(), (*(_ptr(x) for x in bufs), *drop_values(params.drop)))
        for name, grad in zip((s_name, d_name, e_name, v_name), made):
            if grad is not None:
                grads[name] = grad
        if need_gatt:
            grads["att"] = gatt.reshape(att.shape)
        return {name: grads[name] for name in SCORE_INPUTS[score]}
    # the target pass always runs (the source pass takes its per-edge (w, ds'),
    # wds); the common case: it computes delta = <g_i, out_i> itself
    fused = g is not None and ga is None
    vec, NCH, GRP, group, nch = _shape(vtype, score, C, (S, Dn, Ed, att, V, g, out)
                                       if score != "gat" else (V, g, out), True)
    phases = edge_phases(vtype, vec, H, group)
    # 16-bit gatv2's target pass scores on Tensor Cores where the forward's
    # layout holds (mma_scores; attn_bwd_dst_mma takes attn_bwd_dst's
    # arguments): deterministic and faster than the atomic backward, so it
    # serves deterministic=False too
    mma = (fused and params.mma_scores
           and mma_scores(score, vtype, H, C, Ed is not None, (vec, NCH, GRP),
                          [_ptr(x) for x in (S, Dn, att, g, out)]))
    # deterministic=False (for ATOMIC_SCORES): the target pass scatters the
    # source-side gradients too (float atomics) and the source pass does not run
    atomic = (not mma and not params.deterministic and score in ATOMIC_SCORES
              and (need_gS or need_gV))
    # gatv2's grad_att takes its xl_j terms from the source pass (not with atomics)
    src_pass = (need_gS or need_gV or need_gatt) and not atomic
    delta = None if fused else _delta(graph, score, arrays, out, lse, g, ga, params, vtype)
    wds = cp.empty((graph.num_edges, H, 2), dtype=acc) if src_pass else None

    # target pass over the CSR
    plan = task_plan(graph, DEFAULT_CHUNK, visit=False)
    ntask = int(plan.task_row.shape[0])
    gDn = cp.empty_like(Dn) if need_gDn else None
    p_dn = (cp.empty((plan.num_slots, H * Cs), dtype=acc)
            if need_gDn and plan.num_slots else None)
    gEd = cp.empty_like(Ed) if need_gEd else None
    # gatv2: grad_att partial rows per thread block (or per task)
    block_gatt, smem = (_block_gatt(ntask, H, C, group, acc, phases) if need_gatt
                        else (False, 0))
    # atomic: fp32/fp64 sums, zeroed (the gradients themselves for fp32/fp64)
    aS = cp.zeros(S.shape, dtype=acc) if atomic and need_gS else None
    aV = cp.zeros(V.shape, dtype=acc) if atomic and need_gV else None
    if mma:
        kern = get_function("attention", vtype, itype,
                            _mma_kernel_name("attn_bwd_dst_mma", vtype, itype, GRP, block_gatt))
    else:
        kern = _kernel("attn_bwd_dst", score, vtype, itype, vec, NCH, GRP, Ed is not None,
                       atomic, block_gatt)
    grid, slot_begin, rounds = _persistent_grid(kern, graph, plan, H, group, smem, phases)
    dst_rows = grid[0] if block_gatt else ntask
    if src_pass:
        t = graph.transpose()
        splan = task_plan(t, DEFAULT_CHUNK, visit=False)
        skern = _kernel("attn_bwd_src", score, vtype, itype, vec, NCH, GRP, Ed is not None)
        ssmem = _gatt_slots_bytes(group, C, acc) if need_gatt else 0
        sgrid, sslot_begin, srounds = _persistent_grid(skern, t, splan, H, group, ssmem, phases)
    # grad_att's partial rows: the target pass's, then (unless atomic) the source
    # pass's, one per block
    src_rows = sgrid[0] if need_gatt and src_pass else 0
    gatt_part = cp.empty((dst_rows + src_rows, H * C), dtype=acc) if need_gatt else None
    launch_now(kern, grid,
               (plan.task_row, plan.task_begin, plan.task_slot, slot_begin, graph.indptr,
                graph.indices, caller_ids(graph), S, Dn, _arg(Ed), _arg(att), V, lse, _arg(g),
                _arg(ga),
                out if fused else NULL, _arg(delta), _arg(wds), _arg(gDn), _arg(p_dn), _arg(gEd),
                _arg(gatt_part), _arg(aS), _arg(aV), np.int64(ntask))
               + _layout_words(H, C, nch, group, phases, rounds, acc, params.negative_slope,
                               params.scale) + _drop_args(params.drop),
               smem=smem)
    if aS is not None:
        grads[s_name] = from_acc(aS, S.dtype, "attention", vtype, itype)
    if aV is not None:
        grads[v_name] = from_acc(aV, V.dtype, "attention", vtype, itype)
    _combine(plan, p_dn, gDn, H * Cs, vtype, itype)
    if need_gDn:
        grads[d_name] = gDn
    if need_gEd:
        grads[e_name] = gEd

    # source pass over the transpose
    if src_pass:
        plan = splan
        ntask = int(plan.task_row.shape[0])
        gS = cp.empty_like(S) if need_gS else None
        gV = cp.empty_like(V) if need_gV else None
        p_s = (cp.empty((plan.num_slots, H * Cs), dtype=acc)
               if need_gS and plan.num_slots else None)
        p_v = (cp.empty((plan.num_slots, H * C), dtype=acc)
               if need_gV and plan.num_slots else None)
        launch_now(skern, sgrid,
                   (plan.task_row, plan.task_begin, plan.task_slot, sslot_begin, t.indptr,
                    t.indices, transpose_caller_ids(graph), S, Dn, _arg(Ed), _arg(att), wds,
                    _arg(g), _arg(gS), _arg(p_s), _arg(gV), _arg(p_v),
                    gatt_part[dst_rows:] if src_rows else NULL, np.int64(ntask))
                   + _layout_words(H, C, nch, group, phases, srounds, acc,
                                   params.negative_slope),
                   smem=ssmem)
        _combine(plan, p_s, gS, H * Cs, vtype, itype)
        _combine(plan, p_v, gV, H * C, vtype, itype)
        if need_gS:
            grads[s_name] = gS
        if need_gV:
            grads[v_name] = gV
    if need_gatt:
        grads["att"] = from_acc(column_sum(gatt_part, "attention", vtype, itype,
                                           GATT_SUM_ROWS).reshape(att.shape),
                                att.dtype, "attention", vtype, itype)
    return {name: grads[name] for name in SCORE_INPUTS[score]}
