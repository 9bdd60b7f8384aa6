"""One loader for every CUDA source in kernels_cuda/.

Each family (`spmm`, ...) declares its kernel templates in KERNELS below; a
module is compiled lazily through `cupy.RawModule(name_expressions=...)` for
one (value type, index type) pair at a time, and memoised per device. Nothing
here compiles or touches the GPU at import time. `instantiations()` lists
every (family, value type, index type, name expressions) so the NVRTC compile
check (compile_check.py) builds exactly what the launchers can ask for.
"""
from __future__ import annotations

import functools
import importlib.resources
import itertools
import os

# fastgnn value type -> C storage type (see kernels_cuda/common.cuh)
C_VALUE = {"float32": "float", "float64": "double", "float16": "f16_t", "bfloat16": "bf16_t"}
C_INDEX = {"int32": "int", "int64": "long long"}
# position-within-row types of the max/min args (Graph.position_dtype): uint8,
# uint16 or the index type
C_POSITION = {"uint8": "unsigned char", "uint16": "unsigned short", **C_INDEX}
NARROW_POSITIONS = ("uint8", "uint16")
VALUE_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}
COMPILE_OPTIONS = ("-std=c++17",)


def vec_widths(vtype):
    """Vector widths (values per load) up to 16 bytes for this value type."""
    return [v for v in (1, 2, 4, 8) if v * VALUE_BYTES[vtype] <= 16]


def column_sum_names(vt):
    """column_sum instantiations (common.cuh) for value type vt: over the
    value type (a first level) and over its acc type (later levels)."""
    T, A = C_VALUE[vt], ("double" if vt == "float64" else "float")
    return [f"column_sum<{T}>"] + ([f"column_sum<{A}>"] if A != T else [])


def _spmm_names(vt, it):
    T, I = C_VALUE[vt], C_INDEX[it]
    names = column_sum_names(vt) + [f"cast_from_acc<{T}>"]
    for vec in vec_widths(vt):
        for has_w in ("false", "true"):
            names.append(f"spmm_fwd<{T}, {I}, {vec}, {has_w}>")
        names.append(f"spmm_combine<{T}, {I}, {vec}>")
        names.append(f"sddmm<{T}, {I}, {vec}>")
    return names


# Statistic sets (bits: 1 sum, 2 sum of squares, 4 max, 8 min, 32 product
# of the nonzero values + zero count) of the segment_fwd instantiations; a
# request runs the smallest superset (mul alone, or mul with anything: all).
# Those with max or min also run with bit 16 (STAT_NOARG: no positions
# tracked, P = uint16) when no positions are asked for.
SEGMENT_STATS = (1, 3, 4, 8, 12, 13, 15, 32, 47)
STAT_NOARG = 16
# (LIN, NARG) bounds of the segment_bwd instantiations (linear terms: 1 coef_a,
# 2 coef_a + coef_b, 3 those + mul's coef_c/coef_d; NARG argmax/argmin
# terms); a request runs the first cover.
SEGMENT_TERMS = ((1, 0), (2, 0), (0, 1), (0, 2), (2, 2), (3, 0), (3, 2))


# the walk instantiated with several edges in flight as well (SEG_BWD_WIDE_UNROLL
# of kernels_cuda/segment.cu), at the widest vector: the arg-only backward of
# max or min, timed against the one-edge walk per graph (segment.py, BwdPlan)
WIDE_WALK_TERMS = ((0, 1),)
WIDE_UNROLL = 4


def segment_bwd_kernel(T, I, vec, lin, narg, P, unroll=1):
    """Full name of segment_bwd's instantiation: several terms (lin + narg
    > 1) run `segment_bwd_capped` (launch bounds for occupancy where the
    types allow, SEG_CAPPED in kernels_cuda/segment.cu), one term
    `segment_bwd` with `unroll` edges in flight (1, or WIDE_UNROLL for
    WIDE_WALK_TERMS at the widest vector)."""
    if lin + narg > 1:
        return f"segment_bwd_capped<{T}, {I}, {vec}, {lin}, {narg}, {P}>"
    return f"segment_bwd<{T}, {I}, {vec}, {lin}, {narg}, {P}, {unroll}>"


def segment_position_type(itype, ptype, needed):
    """C type of the P template argument: the args' position type where the
    kernel has max/min args (`needed`), else the index type (P unused)."""
    return C_POSITION[ptype] if needed else C_INDEX[itype]


# Values per lane and load in the reduction kernels: at most 4, so 16-bit
# rows of F = 128 span 32 lanes of 8-byte loads instead of 16 lanes of 16
# bytes (H200, rmat20, bf16: max fwd 2.61 -> 1.92 ms, mean+max+min+std
# fwd 6.90 -> 3.92).
# fp32 and fp64 are unaffected (their widest vectors are 4 and 2).
SEGMENT_MAX_VEC = 4


def segment_widest_vec(vtype):
    """The widest VEC of the reduction kernels for this value type."""
    return max(v for v in vec_widths(vtype) if v <= SEGMENT_MAX_VEC)


def _segment_names(vt, it):
    T, I = C_VALUE[vt], C_INDEX[it]
    names = [f"segment_coef<{T}, {I}>", f"cast_from_acc<{T}>"]
    widest = segment_widest_vec(vt)
    for vec in (v for v in vec_widths(vt) if v <= SEGMENT_MAX_VEC):
        for pt in (*NARROW_POSITIONS, it):
            P = C_POSITION[pt]
            names.append(f"segment_combine<{T}, {I}, {vec}, {P}>")
            # the atomic max/min backward (deterministic=False)
            names.append(f"segment_arg_scatter<{T}, {I}, {vec}, {P}>")
            names += [f"segment_fwd<{T}, {I}, {vec}, {s}, {P}>" for s in SEGMENT_STATS
                      if s & 12 or pt == it]
            if pt == "uint16":
                names += [f"segment_fwd<{T}, {I}, {vec}, {s | STAT_NOARG}, {P}>"
                          for s in SEGMENT_STATS if s & 12]
            names += [segment_bwd_kernel(T, I, vec, lin, narg, P)
                      for lin, narg in SEGMENT_TERMS if narg or pt == it]
            if vec == widest and pt != it:
                names += [segment_bwd_kernel(T, I, vec, lin, narg, P, WIDE_UNROLL)
                          for lin, narg in WIDE_WALK_TERMS]
    return names


def attention_nchs(vec):
    """Channel chunks per lane held in registers (the NCH template values):
    1 and 4, or 1 and 2 with 8-wide vectors (to stay within 255 registers)."""
    return (1, 4) if vec <= 4 else (1, 2)


# Scores of the attention kernels, by their KIND template value.
ATTENTION_SCORES = ("gat", "gatv2", "dot")
# Widest vector of the attention kernels per score, (forward, backward), in
# values (16 bytes at most). GATv2 and dot take 4: 16-bit heads of 32 so run
# 8 lanes of 4 values, as fp32's, instead of 4 lanes of 8 (rmat20, 4 heads x
# 32, bf16, fwd + bwd ms on an H200, 8 / 4 values per lane: gatv2 12.23 /
# 10.49, dot 14.04 / 10.39, with edge phases for 8; without them, 4 values
# took gatv2 from 3.35 / 11.45 to 2.88 / 9.05 ms fwd / bwd): fewer
# registers per lane (occupancy) and shorter per-lane chains. GAT's
# backward, whose per-edge score is one value per head, takes 8 with the
# edge phases of attention.cu filling each warp (16-bit, rmat20, one probe
# run: 4.71 ms against 5.80 at 4 values); its forward keeps 4 (8: op 2.02 against
# 1.91 ms, the GATConv layer's 2.95 against 2.35). GAT's score needs no
# reduction over channels, so the backward recomputes the forward's scores
# bit for bit at either width.
ATTENTION_MAX_VEC = {"gat": (4, 8), "gatv2": (4, 4), "dot": (4, 4)}


def attention_vecs(vtype, score, backward):
    """Vector widths of the attention kernels of `score`'s forward or
    backward: 1 (any width) and the widest (at most ATTENTION_MAX_VEC)."""
    return [1, min(vec_widths(vtype)[-1], ATTENTION_MAX_VEC[score][int(backward)])]


# Lanes per (task, head) compiled in (the GROUP template values) for heads
# held in one register chunk with wide vectors: the shuffles of the per-edge
# reductions unroll. Narrower heads run GROUP=4 with idle lanes.
ATTENTION_GROUPS = (4, 8, 16, 32)


def attention_groups(vec, nch):
    """GROUP template values for (VEC, NCH): several chunks always use a full
    warp (32); one chunk of wide vectors ATTENTION_GROUPS; vec = 1 (odd or
    unaligned heads) keeps the runtime group size (0)."""
    if nch > 1:
        return (32,)
    return ATTENTION_GROUPS if vec > 1 else (0,)


def _attention_names(vt, it):
    T, I = C_VALUE[vt], C_INDEX[it]
    A = "double" if vt == "float64" else "float"
    names = [f"attn_combine<{T}, {I}>", f"softmax_fwd<{T}, {I}>", f"softmax_bwd<{T}, {I}>",
             f"column_sum<{A}>", f"attn_delta<{T}>", f"cast_from_acc<{T}>"]
    for kind, score in enumerate(ATTENTION_SCORES):
        for backward in (False, True):
            for vec in attention_vecs(vt, score, backward):
                for nch in attention_nchs(vec):
                    for grp in attention_groups(vec, nch):
                        for has_e in ("false", "true"):
                            args = f"{kind}, {T}, {I}, {vec}, {nch}, {grp}, {has_e}"
                            if not backward:
                                names.append(f"attn_fwd<{args}>")
                                continue
                            # the flags: the atomic backward (deterministic=False), and
                            # gatv2's grad_att partials per thread block (BLOCK_GATT)
                            names.append(f"attn_bwd_src<{args}>")
                            names += [f"attn_bwd_dst<{args}, {atomic}, {block}>"
                                      for atomic in ("false", "true")
                                      for block in (("false", "true") if kind == 1
                                                    else ("false",))]
    if vt in ("bfloat16", "float16"):      # gatv2's Tensor Core scores (heads of 32)
        names.append(f"attn_fwd_mma<{T}, {I}, 8>")
        names += [f"attn_bwd_dst_mma<{T}, {I}, 8, {block}>" for block in ("false", "true")]
    return names


# Channels per head (attention) and features per warp (SpMM: FC; 32 spills
# 4 bytes when weighted in 16 bits, so F = 32 runs as two chunks of 16) the
# Tensor Core kernels of kernels_cuda/blocksparse.cu are compiled for, per
# value type: bf16/fp16 (mma k16) and fp32 (TF32 mma k8, whose rows take
# twice the registers: its target pass spills at C = 128). The source pass
# holds two accumulators: for head rows of 256 bytes or more (bf16/fp16 C =
# 128, fp32 C = 64) it splits each head's channels over
# blocksparse_src_split warps (one warp would take 252 registers at fp32
# C = 64, and spill at 16-bit C = 128; split, 180 and 236). On clustered19
# (H200) the bf16 forward+backward at 1 x 128 takes 1.99 ms with the split
# pass, 4.00 with a CUDA-core source pass on the Tensor Core target pass's
# delta; TF32 at 2 x 64 4.65 and 5.97 (knn: 3.66 and 5.40, 8.10 and 7.97;
# benchmarks/results/blocksparse_wide_heads_h200.md).
BLOCKSPARSE_HEADS = {"float16": (16, 32, 64, 128), "bfloat16": (16, 32, 64, 128),
                     "float32": (16, 32, 64)}
BLOCKSPARSE_CHUNKS = (16, 64, 128)
BLOCKSPARSE_VTYPES = tuple(BLOCKSPARSE_HEADS)


def blocksparse_src_split(vtype, C) -> int:
    """Warps per (window, head) of the Tensor Core source pass."""
    return 2 if C * (4 if vtype == "float32" else 2) >= 256 else 1


def _blocksparse_names(vt, it):
    """The block-sparse builder (every module, templated on the index type)
    and, for the value types of BLOCKSPARSE_VTYPES, the mma kernels."""
    I = C_INDEX[it]
    names = [f"bsr_keys<{I}>", "bsr_heads", f"bsr_window_cols<{I}>", f"bsr_fill<{I}>", "bsr_pad"]
    if vt in BLOCKSPARSE_VTYPES:
        T = C_VALUE[vt]
        for c in BLOCKSPARSE_HEADS[vt]:
            names += [f"bsr_attn_fwd<{T}, {c}>", f"bsr_attn_bwd_dst<{T}, {c}>"]
        names += [f"bsr_attn_bwd_src<{T}, {c}, {blocksparse_src_split(vt, c)}>"
                  for c in BLOCKSPARSE_HEADS[vt]]
        names += [f"bsr_spmm<{T}, {fc}, {weighted}>" for fc in BLOCKSPARSE_CHUNKS
                  for weighted in ("false", "true")]
    return names


# The graph build kernels have no value type: their module is compiled under
# this one (an index type alone picks their instantiations).
GRAPH_VTYPE = "float32"
# threads of the one block that computes the persistent grids' task cuts
SLOT_CUT_THREADS = 1024


def _graph_names(vt, it):
    if vt != GRAPH_VTYPE:
        return []
    I = C_INDEX[it]
    return ([f"edge_stats<{I}>", f"self_loop_mark<{I}>", f"self_loop_fill<{I}>",
             f"task_count<{I}>", f"task_fill<{I}>", f"task_work<{I}>",
             f"slot_cuts<{SLOT_CUT_THREADS}>"]
            + [f"csr_from_order<{K}, {I}>" for K in C_INDEX.values()]
            + [f"gcn_norm_weights<{I}, {W}>" for W in ("float", "double")])


# family -> function (value type, index type) -> name expressions
KERNELS = {"spmm": _spmm_names, "segment": _segment_names, "attention": _attention_names,
           "blocksparse": _blocksparse_names, "graph": _graph_names}


@functools.lru_cache(maxsize=None)
def kernels_dir() -> str:
    """kernels_cuda/ as installed (package data fastgnn.kernels_cuda), or the
    source tree's copy when fastgnn runs from a checkout without install."""
    try:
        return str(importlib.resources.files("fastgnn.kernels_cuda"))
    except ModuleNotFoundError:
        here = os.path.dirname(os.path.abspath(__file__))
        return os.path.normpath(os.path.join(here, "..", "..", "..", "kernels_cuda"))


@functools.lru_cache(maxsize=None)
def source(family: str) -> str:
    with open(os.path.join(kernels_dir(), f"{family}.cu")) as f:
        return f.read()


def options():
    """NVRTC options of every module. They are fixed (the kernels' tuning
    constants live in kernels_cuda/*.cu), so the source alone decides what a
    module holds, and CuPy's kernel cache (keyed by source, options and
    architecture) never serves a module built another way."""
    return COMPILE_OPTIONS + (f"-I{kernels_dir()}",)


def instantiations():
    """[(family, vtype, itype, [name expressions])] for every launchable kernel."""
    return [(fam, vt, it, names(vt, it))
            for fam, names in KERNELS.items()
            for vt, it in itertools.product(C_VALUE, C_INDEX) if names(vt, it)]


_modules: dict = {}
_functions: dict = {}


# Callables clear_compiled also runs: caches keyed by compiled kernels
# (attention.py's resident-block counts).
ON_CLEAR: list = []


def clear_compiled():
    """Forget every compiled module in this process, and whatever was cached
    per compiled kernel (ON_CLEAR); the next launch loads its module again
    (from CuPy's disk cache when it holds it)."""
    _modules.clear()
    _functions.clear()
    for clear in ON_CLEAR:
        clear()


def get_function(family: str, vtype: str, itype: str, name: str):
    """The compiled kernel `name` (a name expression of KERNELS[family]) on
    the current device, compiling its (family, vtype, itype) module once."""
    import cupy
    dev = cupy.cuda.runtime.getDevice()
    fkey = (family, vtype, itype, dev, name)
    fn = _functions.get(fkey)       # launch path: one dict lookup per call
    if fn is not None:
        return fn
    key = fkey[:4]
    mod = _modules.get(key)
    if mod is None:
        names = KERNELS[family](vtype, itype)
        mod = cupy.RawModule(code=source(family), options=options(), name_expressions=names)
        _modules[key] = mod
    fn = _functions[fkey] = mod.get_function(name)
    return fn
