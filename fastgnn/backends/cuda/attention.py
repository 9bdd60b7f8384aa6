"""CUDA launchers of the attention family (kernels_cuda/attention.cu).

Implements the backend interface documented in fastgnn/ops/attention.py with
the task mapping of the SpMM family: a lane group per (task, head), hub rows
split into tasks whose partials are merged in slot order (attn_combine for
the forward's (m, l, acc) states, spmm_combine for backward sums), grad_att
summed by a fixed-order column sum from partial rows [H, C], one per thread
block of the target pass (summed in shared memory in a fixed order) or, where
that does not pay, one per task (_block_gatt). The forward and both backward
passes run on persistent grids (_persistent_grid). Per-edge arrays stay in
the caller's order. No float atomics by default: bitwise repeatable. With
params.deterministic False the backward's target pass of the scores where
that is faster (ATOMIC_SCORES: gatv2) also scatters the source-side
gradients with float atomics into fp32/fp64 buffers and the source pass
over the transpose is skipped (faster, not repeatable).

"""
from __future__ import annotations

import cupy as cp
import numpy as np
from cupy_backends.cuda.api import driver

from ...graph import Graph
from ..attention_spec import (SCORE_INPUTS, SLOT_NAMES, caller_ids, lse_dtype, score_slots,
                              transpose_caller_ids)
from .loader import (C_INDEX, C_VALUE, ON_CLEAR, VALUE_BYTES, attention_groups,
                     attention_nchs, attention_vecs, get_function)
from .spmm import (_ITYPE, BLOCK, DEFAULT_CHUNK, NULL, _arg, column_sum, column_sums, from_acc,
                   lane_group, spmm_custom, task_plan, to_acc)

KINDS = {"gat": 0, "gatv2": 1, "dot": 2}
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


def _shape(vtype, C, arrays):
    """(VEC, NCH, GROUP, group, nch): vector width, register chunks, lanes per
    group as compiled in (0 = runtime), lanes per group, chunks used. Raises
    NotImplementedError for heads wider than the kernels hold."""
    vec = 1
    wide = attention_vecs(vtype)[-1]
    if C % wide == 0 and all(a.data.ptr % (wide * VALUE_BYTES[vtype]) == 0
                             for a in arrays if a is not None):
        vec = wide
    lanes = -(-C // vec)
    group = lane_group(lanes)
    nch = -(-lanes // group)
    NCH = next((n for n in attention_nchs(vec) if n >= nch), None)
    if NCH is None:
        raise NotImplementedError(
            f"the CUDA attention kernels hold at most {attention_nchs(vec)[-1] * 32 * vec} channels "
            f"per head for this layout (got C={C}); use fewer channels per head")
    if C * max(a.shape[1] for a in arrays if a is not None and a.ndim == 3) \
            * VALUE_BYTES[vtype] >= 2 ** 31:
        raise NotImplementedError("the CUDA attention kernels address one row of H x C values "
                                  "with 32-bit byte strides (under 2 GiB per row)")
    groups = attention_groups(vec, NCH)
    if groups == (0,):
        return vec, NCH, 0, group, nch
    group = next(g for g in groups if g >= group)   # narrow heads: idle lanes
    return vec, NCH, group, group, nch


def _grid(units, group):
    return (max(1, -(-units * group // BLOCK)),)


# attn_fwd, attn_bwd_dst and attn_bwd_src run on persistent grids: as many
# blocks as the device holds at once, each slot of H lane groups walking a
# contiguous range of tasks of about equal work (task_slots; FOR_EACH_GROUP_TASK
# in attention.cu). False: one lane group per (task, head) pair, one task each
# (slower where a block's short tasks wait for its hub task; tests run both).
PERSISTENT = True
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


def task_slots(graph, plan, num_slots):
    """slot_begin [num_slots + 1] int64: slot s of a persistent grid takes the
    tasks slot_begin[s] .. slot_begin[s + 1] - 1 of `plan` (graph's task
    plan), the ranges cut where the running work (each task's edges plus
    TASK_COST_EDGES) crosses s / num_slots of the total. Cached per graph and
    slot count; NumPy or CuPy arrays, as the plan's."""
    def build():
        xp = cp.get_array_module(plan.task_row)
        begin = plan.task_begin.astype(np.int64)
        row_end = graph.indptr[plan.task_row.astype(np.int64) + 1].astype(np.int64)
        work = xp.minimum(begin + plan.chunk, row_end) - begin + TASK_COST_EDGES
        prefix = xp.zeros(work.shape[0] + 1, dtype=np.int64)
        xp.cumsum(work, out=prefix[1:])
        # the total stays on the device: no host sync per new graph
        cuts = xp.arange(num_slots + 1, dtype=np.int64) * prefix[-1:] // num_slots
        return xp.searchsorted(prefix, cuts, side="left").astype(np.int64)
    return graph.cached(("attention_task_slots", plan.chunk, num_slots, TASK_COST_EDGES), build)


def _persistent_grid(kern, graph, plan, H, group, smem=0):
    """(grid, slot_begin) of a launch of `kern` over `plan`'s tasks x H heads,
    lane groups of `group`: the resident blocks and the slots' task ranges
    (task_slots) where one group per (task, head) pair would need more
    blocks than that; else that grid and NULL (slot s = task s). The grid
    depends on the graph's task count, the device's multiprocessor count and
    the compiled kernel's occupancy, nothing else: which tasks a group takes,
    in which order, and every sum carried across them (gatv2's grad_att), is
    the same on every run of one machine and build (another GPU model or MIG
    slice may round grad_att differently)."""
    ntask = int(plan.task_row.shape[0])
    full = _grid(ntask * H, group)[0]
    if not PERSISTENT:
        return (full,), NULL
    blocks = _resident_blocks(kern, smem)
    slots = blocks * (BLOCK // group) // H
    if blocks >= full or slots == 0:
        return (full,), NULL
    return (blocks,), task_slots(graph, plan, slots)


def _names(graph, vtype):
    return _ITYPE[np.dtype(graph.index_dtype)], C_VALUE[vtype]


# ------------------------------------------------------------ edge_softmax
def edge_softmax_fwd(graph, scores, drop, vtype):
    """(out [E, H] caller order, lse [num_dst, H])."""
    E, H = scores.shape
    out = cp.empty_like(scores)
    lse = cp.empty((graph.num_dst, H), dtype=lse_dtype(vtype))
    if graph.num_dst == 0 or H == 0:
        return out, lse
    itype, T = _names(graph, vtype)
    fn = get_function("attention", vtype, itype, f"softmax_fwd<{T}, {C_INDEX[itype]}>")
    fn(_grid(graph.num_dst, 32), (BLOCK,),
       (graph.indptr, caller_ids(graph), scores, out, lse, np.int64(graph.num_dst),
        np.int32(H), *_drop_args(drop)))
    return out, lse


def edge_softmax_bwd(graph, scores, lse, grad, drop, vtype):
    """grad_scores [E, H] caller order."""
    E, H = scores.shape
    out = cp.empty_like(scores)
    if graph.num_dst == 0 or H == 0 or E == 0:
        return out
    itype, T = _names(graph, vtype)
    fn = get_function("attention", vtype, itype, f"softmax_bwd<{T}, {C_INDEX[itype]}>")
    fn(_grid(graph.num_dst, 32), (BLOCK,),
       (graph.indptr, caller_ids(graph), scores, lse, grad, out, np.int64(graph.num_dst),
        np.int32(H), *_drop_args(drop)))
    return out


# ---------------------------------------------------------- edge_attention
def _kernel(kernel, score, vtype, itype, vec, nch, grp, has_e, *flags):
    T, I = C_VALUE[vtype], C_INDEX[itype]
    extra = "".join(f", {str(f).lower()}" for f in flags)
    return get_function("attention", vtype, itype, f"{kernel}<{KINDS[score]}, {T}, {I}, {vec}, "
                        f"{nch}, {grp}, {str(has_e).lower()}{extra}>")


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
    itype = _ITYPE[np.dtype(graph.index_dtype)]
    # (the bias is read per value, so its alignment does not matter)
    vec, NCH, GRP, group, nch = _shape(vtype, C, (S, Dn, Ed, att, V, out) if score != "gat"
                                       else (V, out))
    plan = task_plan(graph, DEFAULT_CHUNK)
    ntask = int(plan.task_row.shape[0])
    slots = plan.num_slots
    p_m = cp.empty((slots, H), dtype=acc) if slots else None
    p_l = cp.empty((slots, H), dtype=acc) if slots else None
    p_acc = cp.empty((slots, H, C), dtype=acc) if slots else None
    fwd = _kernel("attn_fwd", score, vtype, itype, vec, NCH, GRP, Ed is not None)
    grid, slot_begin = _persistent_grid(fwd, graph, plan, H, group)
    common = (plan.task_row, plan.task_begin, plan.task_slot, slot_begin, graph.indptr,
              graph.indices, caller_ids(graph), S, Dn, _arg(Ed), _arg(att), V, _arg(bias))
    scalars = (np.int64(ntask), np.int32(H), np.int32(C), np.int32(nch),
               np.int32(DEFAULT_CHUNK), np.int32(group), acc(params.negative_slope), acc(params.scale), *_drop_args(params.drop))
    fwd(grid, (BLOCK,),
        common + (out, _arg(out_b), lse, NULL, _arg(p_m), _arg(p_l), _arg(p_acc)) + scalars
        + (np.int32(0),))
    num_split = int(plan.split_row.shape[0])
    if num_split:
        comb = get_function("attention", vtype, itype,
                            f"attn_combine<{C_VALUE[vtype]}, {C_INDEX[itype]}>")
        g1 = lane_group(C)
        comb(_grid(num_split * H, g1), (BLOCK,),
             (plan.split_row, plan.slot_ptr, p_m, p_l, p_acc, _arg(bias), out, _arg(out_b),
              lse, np.int64(num_split),
              np.int32(H), np.int32(C), np.int32(g1)))
    if need_alpha and graph.num_edges:
        fwd(grid, (BLOCK,),
            common + (out, NULL, lse, alpha, NULL, NULL, NULL) + scalars + (np.int32(1),))
    return out, lse, alpha, out_b


def _vtype(V, arrays):
    """The value type of the op (bf16 travels as 16-bit integers)."""
    if V.dtype.kind == "f":
        return V.dtype.name
    return "bfloat16"


def _delta(graph, score, arrays, out, lse, grad_out, grad_alpha, params, vtype):
    """D[i, h] = <g_i, out_i> + sum_{e in N(i)} p_e ga_e, [num_dst, H] in acc type.
    Only where the target pass does not compute D itself (see attn_bwd_dst):
    grad_alpha given, grad_out None, or no target-side gradient wanted."""
    acc = _acc(vtype)
    H, C = out.shape[1], out.shape[2]
    if grad_out is not None:
        d = cp.empty((graph.num_dst, H), dtype=acc)
        if graph.num_dst:
            itype = _ITYPE[np.dtype(graph.index_dtype)]
            fn = get_function("attention", vtype, itype, f"attn_delta<{C_VALUE[vtype]}>")
            group = lane_group(C)
            fn(_grid(graph.num_dst * H, group), (BLOCK,),
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
    """Sum the split rows' partial rows (slot order) into out rows of `width` values."""
    num_split = int(plan.split_row.shape[0])
    if not num_split or partial is None or out is None:
        return
    fn = get_function("spmm", vtype, itype, f"spmm_combine<{C_VALUE[vtype]}, {C_INDEX[itype]}, 1>")
    group = lane_group(width)
    fn(_grid(num_split, group), (BLOCK,),
       (plan.split_row, plan.slot_ptr, partial, NULL, NULL, out, np.int64(num_split),
        np.int32(width), np.int32(group)))


def _block_gatt(ntask, H, C, group, acc):
    """(block, shared_mem): whether gatv2's grad_att partials go one row per
    thread block of the target pass (attn_bwd_dst's BLOCK_GATT: BLOCK // group
    (task, head) slots of C values in shared memory, summed per block) and
    the bytes that takes. It does when the slots fit GATT_SMEM_BUDGET and a
    block holds more (task, head) pairs than there are heads (every head has
    slots in every block); otherwise each task writes its own row. On rmat20
    (H=4, C=32) a block holds 32 groups of 8 lanes, in fp32 and bf16."""
    smem = (BLOCK // group) * C * np.dtype(acc).itemsize
    if smem <= GATT_SMEM_BUDGET and _grid(ntask * H, group)[0] < ntask:
        return True, smem
    return False, 0


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
    # deterministic=False (for ATOMIC_SCORES): the target pass scatters the
    # source-side gradients too (float atomics) and the source pass does not run
    atomic = (not params.deterministic and score in ATOMIC_SCORES and (need_gS or need_gV))
    src_pass = (need_gS or need_gV) and not atomic
    dst_pass = need_gDn or need_gEd or need_gatt or atomic
    # the common case: the target pass computes delta = <g_i, out_i> itself
    fused = dst_pass and g is not None and ga is None
    if fused:
        delta = cp.empty((graph.num_dst, H), dtype=acc) if src_pass else None
    else:
        delta = _delta(graph, score, arrays, out, lse, g, ga, params, vtype)
    vec, NCH, GRP, group, nch = _shape(vtype, C, (S, Dn, Ed, att, V, g, out) if score != "gat"
                                       else (V, g, out))
    scalars = (np.int32(H), np.int32(C), np.int32(nch), np.int32(DEFAULT_CHUNK),
               np.int32(group), acc(params.negative_slope),
               acc(params.scale), *_drop_args(params.drop))

    # target pass over the CSR
    if dst_pass:
        plan = task_plan(graph, DEFAULT_CHUNK)
        ntask = int(plan.task_row.shape[0])
        gDn = cp.empty_like(Dn) if need_gDn else None
        p_dn = (cp.empty((plan.num_slots, H * Cs), dtype=acc)
                if need_gDn and plan.num_slots else None)
        gEd = cp.empty_like(Ed) if need_gEd else None
        # gatv2: grad_att partial rows per thread block (or per task)
        block_gatt, smem = _block_gatt(ntask, H, C, group, acc) if need_gatt else (False, 0)
        # atomic: fp32/fp64 sums, zeroed (the gradients themselves for fp32/fp64)
        aS = cp.zeros(S.shape, dtype=acc) if atomic and need_gS else None
        aV = cp.zeros(V.shape, dtype=acc) if atomic and need_gV else None
        kern = _kernel("attn_bwd_dst", score, vtype, itype, vec, NCH, GRP, Ed is not None,
                       atomic, block_gatt)
        grid, slot_begin = _persistent_grid(kern, graph, plan, H, group, smem)
        gatt_rows = grid[0] if block_gatt else ntask
        gatt_part = cp.empty((gatt_rows, H * C), dtype=acc) if need_gatt else None
        kern(grid, (BLOCK,),
             (plan.task_row, plan.task_begin, plan.task_slot, slot_begin, graph.indptr,
              graph.indices, caller_ids(graph), S, Dn, _arg(Ed), _arg(att), V, lse, _arg(g),
              _arg(ga),
              out if fused else NULL, _arg(delta), _arg(gDn), _arg(p_dn), _arg(gEd),
              _arg(gatt_part), _arg(aS), _arg(aV), np.int64(ntask)) + scalars,
             shared_mem=smem)
        if aS is not None:
            grads[s_name] = from_acc(aS, S.dtype, "attention", vtype, itype)
        if aV is not None:
            grads[v_name] = from_acc(aV, V.dtype, "attention", vtype, itype)
        _combine(plan, p_dn, gDn, H * Cs, vtype, itype)
        if need_gDn:
            grads[d_name] = gDn
        if need_gEd:
            grads[e_name] = gEd
        if need_gatt:
            grads["att"] = from_acc(column_sum(gatt_part, "attention", vtype, itype,
                                               GATT_SUM_ROWS).reshape(att.shape),
                                    att.dtype, "attention", vtype, itype)

    # source pass over the transpose
    if src_pass:
        t = graph.transpose()
        plan = task_plan(t, DEFAULT_CHUNK)
        ntask = int(plan.task_row.shape[0])
        gS = cp.empty_like(S) if need_gS else None
        gV = cp.empty_like(V) if need_gV else None
        p_s = (cp.empty((plan.num_slots, H * Cs), dtype=acc)
               if need_gS and plan.num_slots else None)
        p_v = (cp.empty((plan.num_slots, H * C), dtype=acc)
               if need_gV and plan.num_slots else None)
        kern = _kernel("attn_bwd_src", score, vtype, itype, vec, NCH, GRP, Ed is not None)
        grid, slot_begin = _persistent_grid(kern, t, plan, H, group)
        kern(grid, (BLOCK,),
             (plan.task_row, plan.task_begin, plan.task_slot, slot_begin, t.indptr, t.indices,
              transpose_caller_ids(graph), S, Dn, _arg(Ed), _arg(att), V, lse, _arg(g), _arg(ga),
              delta, _arg(gS), _arg(p_s), _arg(gV), _arg(p_v), np.int64(ntask)) + scalars)
        _combine(plan, p_s, gS, H * Cs, vtype, itype)
        _combine(plan, p_v, gV, H * C, vtype, itype)
        if need_gS:
            grads[s_name] = gS
        if need_gV:
            grads[v_name] = gV
    return {name: grads[name] for name in SCORE_INPUTS[score]}
