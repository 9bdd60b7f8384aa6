// Attention family kernels: edge softmax, and fused edge attention (GAT,
// GATv2, Graph Transformer "dot") with an online softmax. Nothing of size
// edges x heads x channels is read or written beyond the caller's optional
// edge term; the backward passes recompute scores from lse[i, h].
//
// Math and the backend contract: fastgnn/ops/attention.py. Slots, per head h
// (Cs = C except "gat", whose score inputs have Cs = 1):
//   S  [num_src, H, Cs]  source-side score input   gat: a_src  gatv2: xl  dot: k
//   Dn [num_dst, H, Cs]  target-side score input   gat: a_dst  gatv2: xr  dot: q
//   Ed [E, H, Cs]        edge term, CALLER order   gat: a_edge gatv2: xe  dot: ee
//   V  [num_src, H, C]   message                   gat: v      gatv2: xl  dot: v (+ ee)
//   att [H, C]           gatv2's attention vector
// Per-edge arrays are indexed by the caller's edge id `ce` (cid[] maps CSR or
// transpose positions to it), so nothing per edge is ever permuted.
//
// Mapping: the task list of spmm.cu (rows cut into <= chunk edges); a lane
// group per (task, head) at a time, on a persistent grid where each group
// keeps one head and walks ranges of tasks (FOR_EACH_GROUP_TASK below).
// Lane l owns channels c = l*VEC + k*G*VEC,
// k < nch (<= NCH, a template parameter: 1 when one pass of the group
// covers the head, else 4), so a head of up to NCH*32*VEC channels sits in
// registers. The edges of a task go in steps of U (Unroll: 4 rows of VEC
// <= 4 values, 2 rows of 8, 1 with several chunks): the U edges' rows are
// gathered first (U loads in flight per lane; kept as loaded, a Row, and
// converted to fp32 where read, so 16-bit rows in flight take half the
// registers), then their scores (a shuffle
// reduction per edge for gatv2/dot), then the running max m moves once per
// step and the sum l and accumulator take the U weighted messages. The
// 16-bit kernels of 8 values per lane (GAT's backward) copy a slot's groups
// across the warp as edge phases that walk interleaved edges of one task
// and merge by shuffles at its end (see "Edge phases" below). Hub
// rows are split; their (m, l, acc) partials are merged in slot order
// (attn_combine), source-side backward partials by spmm_combine: no atomics.
// The 16-bit gatv2 forward and backward target pass of heads of 32 channels
// filling warps score on Tensor Cores instead (attn_fwd_mma,
// attn_bwd_dst_mma: their own mapping, the same task walk).
//
// Templated (loader.py's _attention_names instantiates what the launcher
// can ask for): KIND, value and index type, VEC, NCH, GROUP = G (lanes per
// group: 4, 8, 16 or 32 for one chunk of wide vectors, so the per-edge
// reductions unroll with constant masks; 32 with several chunks; 0 = the
// runtime `group` for VEC = 1), HAS_E (edge term), and for attn_bwd_dst
// ATOMIC (the opt-in atomic backward) and BLOCK_GATT (gatv2's grad_att
// partials per thread block through shared memory: only that variant has a
// barrier and shared memory, the others keep their registers and
// occupancy). Edge positions inside a task are 32-bit; a gather address is
// one wide multiply-add from a per-lane base pointer (Rows). Dropout and the
// alpha pass stay runtime switches: the alpha pass runs its own loop, the
// dropout factors of a step are drawn before its rows are gathered.
//
// An optional bias [H, C] (the layers' output bias): attn_fwd and
// attn_combine then store each output row twice, as it is in `out` (what the
// backward reads for delta) and plus the bias in `out_b` (what the caller
// gets, free to edit in place): one more write of [num_dst, H, C] instead of a
// read-read-write pass of its own.
//
// Traffic per edge and head (forward): the source rows S[j] and V[j] slices
// (C values each; one row for gatv2, whose S and V are both xl), the edge term
// if any, the index (and the caller id with an edge term or dropout); Dn[i]
// and att are loaded once per task.
// The backward target pass adds g[i] and out[i] (once per task; delta_i =
// <g_i, out_i> is computed there, no separate pass over g and out) and writes
// per-edge gradients and, per edge and head, the two acc values (w, ds') the
// source pass needs (wds [E, H, 2]: E x H, never E x H x C); the source pass
// gathers g[i] and Dn[i] (not for gat) and reads the pair per edge, with no
// score recomputed and no reduction across lanes. So per edge and head:
// forward 1 row (gatv2) or 2 (dot: k, v); backward 1-2 rows (target pass) +
// 1-2 (source pass) + the pair written once and read once; per target and
// head 3 rows (Dn, g, out).
// gatv2's grad_att (its xr_i and edge terms from the target pass, its xl_j
// terms from the source pass): per thread block of the target pass one row
// [H, C] of acc values (BLOCK_GATT; the sums of its blockDim / group groups
// over all their tasks: on a persistent grid about num_tasks / blocks tasks
// per row), else one row [H, C] per task, then one row per block of the
// source pass; all summed by one column_sum.

#include "common.cuh"

// Blocks per multiprocessor (of 256 threads) the one-chunk kernels without
// an edge term ask ptxas to fit (__launch_bounds__; 1 = no register cap;
// the edge-term, several-chunk and fp64 variants keep no cap). The compile
// check fails on any spill, so a cap that does not fit shows there. Figures:
// H200, rmat20, 4 heads x 32, probe_attention.py (fwd + bwd ms).
// - The forward of 32- and 16-bit types: ATTN_FWD_MIN_BLOCKS = 3 (<= 80
//   registers, spill-free).
// - The source pass (attn_bwd_src), which reads the target pass's per-edge
//   weights and recomputes nothing: ATTN_SRC_MIN_BLOCKS = 4 (<= 64
//   registers) for 16-bit types and fp32 gatv2, ATTN_SRC32_MIN_BLOCKS = 3
//   (<= 80) for fp32 dot and gat (dot spills 52 bytes under 64), with
//   32-bit indices (64-bit ones spill 20-56 bytes under these). Against
//   no cap, in one run: bf16 dot backward 5.74 -> 5.02 ms (4 blocks), fp32
//   gatv2 7.81 -> 7.03 (4 blocks).
// - The target pass (attn_bwd_dst, ATTN_DST_BOUNDS): the atomic variants
//   keep no cap; the BLOCK_GATT variants of one chunk ask for at least 2
//   blocks (<= 128 registers, what their per-task twins take), so the
//   shared-slot write costs them no occupancy; with 32-bit indices 16-bit
//   dot (all variants) and gatv2 of 16- and 32-bit types (BLOCK_GATT, the
//   one large graphs take) ask for ATTN_DST_MIN_BLOCKS = 3: 16-bit rows in
//   flight (Row) and gatv2's split LeakyReLU (score_of) leave them 87-107
//   registers uncapped, 2 blocks, and they fit 80 spill-free (64-bit
//   indices spill): bf16 gatv2 backward 6.74 -> 5.92 ms in one run (with
//   the source pass's 4 blocks), bf16 dot 6.90 -> 6.39 and 6.97 -> 6.67 in
//   two, fp32 gatv2 forward + backward 10.03-10.13 -> 8.97-9.00 in two.
// - 16-bit GAT at 8 values per lane (PHASED, below; ATTN_GAT16_MIN_BLOCKS =
//   3 for its target pass): 82 registers uncapped, 2 blocks, backward 6.09 ms
//   against 4.71 capped.
// - The fp32 dot and GAT target passes keep no cap: on persistent grids a
//   cap of 3 gained nothing (fp32 backward: dot 9.01 vs 8.99 ms without,
//   gat 7.30 vs 5.99).
#define ATTN_FWD_MIN_BLOCKS 3
#define ATTN_SRC_MIN_BLOCKS 4
#define ATTN_SRC32_MIN_BLOCKS 3
#define ATTN_DST_MIN_BLOCKS 3
#define ATTN_GAT16_MIN_BLOCKS 3
#define ATTN_ONE_CHUNK (NCH == 1 && !HAS_E && sizeof(T) <= 4)
#define ATTN_FWD_BOUNDS __launch_bounds__(256, ATTN_ONE_CHUNK ? ATTN_FWD_MIN_BLOCKS : 1)
#define ATTN_SRC_BOUNDS                                                                 \
    __launch_bounds__(256, !ATTN_ONE_CHUNK ? 1                                          \
                           : sizeof(I) == 8 ? (PHASED && KIND == KIND_GAT ? ATTN_GAT16_MIN_BLOCKS : 1) \
                           : (sizeof(T) == 2 || KIND == KIND_GATV2) ? ATTN_SRC_MIN_BLOCKS \
                           : ATTN_SRC32_MIN_BLOCKS)
#define ATTN_DST_BOUNDS                                                                 \
    __launch_bounds__(256, ATOMIC ? 1                                                   \
                           : (ATTN_ONE_CHUNK && sizeof(I) == 4                          \
                              && ((KIND == KIND_DOT && sizeof(T) == 2)                  \
                                  || (KIND == KIND_GATV2 && BLOCK_GATT)))               \
                               ? ATTN_DST_MIN_BLOCKS                                    \
                           : (ATTN_ONE_CHUNK && PHASED && KIND == KIND_GAT)             \
                               ? ATTN_GAT16_MIN_BLOCKS                                  \
                           : (BLOCK_GATT && NCH == 1) ? 2 : 1)
#define KIND_GAT 0
#define KIND_GATV2 1
#define KIND_DOT 2

// SplitMix64 counter-based generator (fastgnn/rng.py): keep (e, h) iff
// (bits(seed, offset + ce*H + h) >> 11) >= threshold.
__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

struct Dropout {
    unsigned long long key, offset, threshold;
    double scale;  // 1/(1-p) (double, as the CPU backend); `on` is read before any draw
    int on;
};

// Kernels take the dropout spec as five scalars (CuPy passes no structs).
#define DROP_PARAMS unsigned long long dkey, unsigned long long doffset, \
                    unsigned long long dthreshold, double dscale, int don
#define DROP_MAKE const Dropout drop = {dkey, doffset, dthreshold, dscale, don};

template <typename A> __device__ __forceinline__ A neg_inf();
template <> __device__ __forceinline__ float neg_inf<float>() { return -__int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double neg_inf<double>() {
    return -__longlong_as_double(0x7ff0000000000000ll);
}

__device__ __forceinline__ double drop_factor(const Dropout& d, i64 ce, int H, int h) {
    if (!d.on) return 1.0;
    const unsigned long long n = d.offset + (unsigned long long)ce * (unsigned long long)H
                                 + (unsigned long long)h;
    const unsigned long long bits = mix64(d.key + (n + 1ull) * 0x9E3779B97F4A7C15ull);
    return (bits >> 11) >= d.threshold ? d.scale : 0.0;
}

// e^x of the scores (the online softmax's weights and rescales, the
// backward's probabilities). 16-bit value types take ex2.approx.ftz of
// x log2(e): 2 instructions against expf's 8, relative
// error about 2^-21 for |x| < 64 (e^x under 2^-126 flushes to 0), far below
// their 2^-8 rounding; fp32 and fp64 keep exp.
template <typename T>
__device__ __forceinline__ typename value_traits<T>::acc_t score_exp(typename value_traits<T>::acc_t x) {
    if constexpr (sizeof(T) == 2) {
        float y;
        asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
        return y;
    } else {
        return exp(x);
    }
}


template <typename A>
__device__ __forceinline__ A lrelu(A u, A slope) { return u > A(0) ? u : slope * u; }

template <typename A>
__device__ __forceinline__ A lrelu_grad(A u, A slope) { return u > A(0) ? A(1) : slope; }

// Per-(task, head) lane layout: lane l of a group of G lanes (G = GROUP, or
// the runtime `group` when GROUP = 0) owns channels chan(k) = (l + k G) VEC,
// k < nch.
template <int VEC, int GROUP>
struct Lanes {
    int lane, group, nch, C;
    __device__ __forceinline__ int grp() const { return GROUP ? GROUP : group; }
    __device__ __forceinline__ int chan(int k) const { return (lane + k * grp()) * VEC; }
    __device__ __forceinline__ bool has(int k) const { return k < nch && chan(k) < C; }
};

template <typename P> struct std_match_char;
template <typename T> struct std_match_char<const T*> { typedef const char* type; };
template <typename T> struct std_match_char<T*> { typedef char* type; };

// r * b as a 64-bit product: one wide multiply for 32-bit indices.
__device__ __forceinline__ i64 wide_mul(int r, int b) {
    i64 x;
    asm("mul.wide.s32 %0, %1, %2;" : "=l"(x) : "r"(r), "r"(b));
    return x;
}
__device__ __forceinline__ i64 wide_mul(long long r, int b) { return r * (i64)b; }

// One head of the rows of a [rows, H, Cs] array as one lane sees it: p
// points at (row 0, head h, the lane's first channel; Cs = 1 and no channel
// offset when SCALAR) and row r starts r * stride bytes further, so a gather
// address is one wide multiply-add (row x width stays 64-bit; the launcher
// checks that one row of H * Cs values is under 2 GiB).
template <typename P>
struct Rows {
    P p;
    int stride;   // bytes
    template <typename R>
    __device__ __forceinline__ P at(R r) const {
        typedef typename std_match_char<P>::type C8;
        return reinterpret_cast<P>(reinterpret_cast<C8>(p) + wide_mul(r, stride));
    }
};

template <bool SCALAR, int VEC, int GROUP, typename P>
__device__ __forceinline__ Rows<P> rows_of(const Lanes<VEC, GROUP>& L, P base, int H, int h) {
    const int cs = SCALAR ? 1 : L.C;
    Rows<P> r;
    r.p = base + (h * cs + (SCALAR ? 0 : L.chan(0)));
    r.stride = H * cs * (int)sizeof(*base);
    return r;
}

// Head h of the target pass's per-edge (w, ds') pairs, wds [E, H, 2]
// (attn_bwd_dst writes them, attn_bwd_src reads them): edge ce's pair at
// .at(ce), one wide multiply-add.
template <typename P>
__device__ __forceinline__ Rows<P> pairs_of(P wds, int H, int h) {
    Rows<P> r;
    r.p = wds + 2 * h;
    r.stride = H * 2 * (int)sizeof(*wds);
    return r;
}

// Write one lane's VEC values of a gradient row: to the output (direct rows)
// or, for a split row, to its fp32/fp64 partial slot (summed by spmm_combine).
template <typename T, int VEC>
__device__ __forceinline__ void store_row(T* __restrict__ direct,
                                          typename value_traits<T>::acc_t* __restrict__ partial,
                                          i64 slot, i64 direct_off, i64 partial_off,
                                          const typename value_traits<T>::acc_t* vals) {
    if (slot < 0) {
        pack_t<T, VEC> o;
#pragma unroll
        for (int q = 0; q < VEC; ++q) o.v[q] = value_traits<T>::from_acc(vals[q]);
        store_pack<T, VEC>(direct + direct_off, o);
    } else {
#pragma unroll
        for (int q = 0; q < VEC; ++q) partial[partial_off + q] = vals[q];
    }
}

// Persistent grids: the launcher sizes the grid to what the device holds at
// once (fastgnn/backends/cuda/attention.py, _persistent_grid), and each run
// of H consecutive lane groups (a "slot": group q has head h = q mod H, slot
// q / H, S slots) walks `rounds` ranges of tasks: the task list is cut into
// S x rounds ranges, slot_begin[r] .. slot_begin[r + 1], and slot s takes
// ranges s, s + S, s + 2S, ..., each slot's ranges together about 1 / S of
// the work (edges plus TASK_COST_EDGES per task; task_slots there, cached
// per graph). So the
// slots sweep the task list together, a round at a time: the source rows of
// neighbouring targets are read by slots running at the same time, and L2
// keeps them for each other. A group that ends a short task so
// starts its next one at once, where a grid of one group per (task, head)
// left it idle until its block's longest task ended (rmat20: 47% of the
// gatv2 target pass's warp cycles waited at the block's grad_att barrier,
// and the source pass ran at 23% achieved occupancy of a possible 37.5%,
// by ncu on an H200). A group's
// head and tasks are fixed by the launch shape, so sums carried across its
// tasks (gatv2's block grad_att) are bitwise repeatable for one grid size;
// the grid follows the device's multiprocessor count and the kernel's
// occupancy, so another GPU model (or MIG slice, or build) may round
// grad_att differently. H200, rmat20, 4 heads x 32, fp32, forward / backward
// ms, kernels of one group per (task, head) without the loop -> persistent:
// gatv2 3.15 / 11.55 -> 2.97 / 8.44, dot 3.19 / 9.78 -> 2.84 / 9.00, gat
// 2.47 / 6.91 -> 1.99 / 5.91 (the looped kernels on a grid of one group per
// pair, the launcher's PERSISTENT = False, are slower still). slot_begin null:
// slot s holds task s alone (the grid has a slot for every task; rounds =
// 1). Groups past the last whole slot have no task.
// FOR_EACH_GROUP_TASK opens the loop over the group's tasks t (lane layout L
// and head h fixed); TASK_PROLOGUE gives task t's row and its n edges (eidx,
// ecid: their indices and caller ids, n <= chunk so edge positions are
// 32-bit).
#define FOR_EACH_GROUP_TASK                                                         \
    const int phases = PHASED ? launch_phases : 1;                                  \
    const int grp_ = GROUP ? GROUP : group;                                         \
    Lanes<VEC, GROUP> L;                                                            \
    L.lane = group_lane(grp_);                                                      \
    L.group = grp_;                                                                 \
    L.nch = nch;                                                                    \
    L.C = C;                                                                        \
    const i64 q_ = group_index(grp_);                                               \
    const i64 slot_ = q_ / (H * phases);                                            \
    const int phase_ = PHASED ? (int)(q_ - slot_ * H * phases) / H : 0;             \
    const int phase_shift_ = PHASED ? __ffs(phases) - 1 : 0;   /* a power of two */ \
    const int h = (int)(q_ - slot_ * H * phases) - phase_ * H;                      \
    /* 32-bit slots and ranges (fewer registers): a persistent grid holds what */ \
    /* the device runs at once, a one-task-per-slot grid < 2^30 tasks (launcher) */ \
    const int slots_ = (int)((i64)gridDim.x * (blockDim.x / grp_) / (H * phases));  \
    const int ranges_ = slots_ * rounds;                                            \
    for (int r_ = slot_ < slots_ ? (int)slot_ : ranges_; r_ < ranges_; r_ += slots_) \
        for (i64 t = slot_begin != nullptr ? (i64)slot_begin[r_] : r_,              \
                 t_end_ = min(slot_begin != nullptr ? (i64)slot_begin[r_ + 1] : r_ + 1, \
                              num_tasks);                                           \
             t < t_end_; ++t)
#define TASK_PROLOGUE                                                               \
    i64 row, e0, e1;                                                                \
    task_range(task_row, task_begin, indptr, t, chunk, row, e0, e1);                \
    const I* __restrict__ eidx = indices + e0;                                      \
    const I* __restrict__ ecid = cid + e0;                                          \
    const int n = (int)(e1 - e0);

// Edge phases (the 16-bit kernels of 8 values per lane: PHASED). Where a
// slot's H groups take fewer lanes than a warp and divide it (16-bit heads
// of 32 take 4 lanes, 4 heads 16), the launcher gives every slot `phases` =
// 32 / (H G) copies of its groups, a whole warp (else phases = 1;
// attention.py's edge_phases): group q of the grid has slot q / (H phases),
// phase (q mod H phases) / H, head q mod H. Phase p takes the task's edges
// p, p + phases, p + 2 phases, ... (edge positions (b + u) phases + p of the
// steps b of FOR_EACH_STEP, masked past n), so every lane of a warp walks
// the same tasks with the same trip count (two slots per warp diverged at
// every task of another length) and a step has phases x U rows in flight;
// the loop's stride stays the constant U. At the task's end the phases'
// partial results (sums; attn_fwd's softmax state) merge by shuffles across
// the warp (phase_sum, phase_max) and phase 0 stores them. The other kernels
// compile with phases = 1, where all of it folds away: with a runtime phase
// count (and a 4-block register cap) fp32 GAT at 8 lanes of 4 values
// ran 12% (forward) and 14% (backward) slower on rmat20 with 4 heads x 32.
// The launcher takes 8 values per lane for 16-bit GAT backward passes only
// (loader.ATTENTION_MAX_VEC says why).
#define PHASED (sizeof(T) == 2 && VEC == 8)
#define FOR_EACH_STEP                                                               \
    const int steps_ = (n + phases - 1) >> phase_shift_;                            \
    const int n_own_ = n - phase_;       /* positions from the phase's first edge */ \
    const I* __restrict__ pidx_ = eidx + phase_;                                    \
    const I* __restrict__ pcid_ = ecid + phase_;                                    \
    for (int b = 0; b < steps_; b += U)

// v summed (phase_sum) or maxed (phase_max) over the phases of the lane's
// slot: lanes lane ^ (32 / phases) 2^k of the warp, every lane gets the
// result (the same bits: each add pairs the same two values). The whole warp
// calls them; phases = 1 returns v.
template <typename A>
__device__ __forceinline__ A phase_sum(A v, int phases) {
    for (int off = 32 / phases; off < 32; off <<= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

template <typename A>
__device__ __forceinline__ A phase_max(A v, int phases) {
    for (int off = 32 / phases; off < 32; off <<= 1) {
        const A o = __shfl_xor_sync(0xffffffffu, v, off);
        v = o > v ? o : v;
    }
    return v;
}

// Edges handled per step of a task's loop: U edges' gathers are issued
// before any of their arithmetic, so U rows per lane are in flight. Several
// channel chunks per lane: U = 1 (registers). One chunk: U per score, pass
// and type, each the fastest measured on an H200 (rmat20, 4 heads x 32,
// persistent grids, every type at VEC = 4: loader.ATTENTION_MAX_VEC; ms):
//   forward   gat U = 1 (4: fp32 1.98 -> 2.03), gatv2 and dot U = 4 (gatv2
//             fp32 2.98 -> 2.50, bf16 2.90 -> 2.44 against U = 2; 8 gains
//             nothing: 2.92, 2.88);
//   backward  gat U = 1 (4: fp32 5.90 -> 6.20), dot U = 4 (fp32 8.91 ->
//             8.41, bf16 8.48 -> 7.58 against 2), gatv2 U = 4 for 16-bit
//             types (bf16 9.09 -> 8.61) and 2 for fp32 (4: 8.46 -> 8.72).
// Rows of 16-bit types are half as many bytes, so more of them in flight pay
// where fp32's do not; the backward holds more state per row than the
// forward. The VEC = 8 choices (U = 2) and those below VEC 4 apply only to
// other vector widths (a cap above 4 values, odd or unaligned heads) and are
// not tuned on persistent grids.
// The atomic target pass (deterministic=False; only gatv2 takes it,
// ATOMIC_SCORES) runs U = 4 at VEC = 4 for every type: fp32 10.17 -> 8.57 ms
// against U = 2 on rmat20, H = 4 x 32. 16-bit gatv2 with an edge term gathers
// two rows per edge and runs U = 2 (at 4 its target pass spills under the
// 2-block cap of BLOCK_GATT).
template <int KIND, int VEC, int NCH>
struct Unroll {
    static constexpr int tuned = KIND == KIND_GAT ? (VEC >= 4 ? 1 : 2)
                               : (VEC >= 8 ? 2 : 4);     // gatv2 and dot
    static constexpr int U = NCH > 1 ? 1 : tuned;
};

template <int KIND, typename T, int VEC, int NCH, bool HAS_E, bool ATOMIC = false>
struct BwdUnroll {
    static constexpr int tuned = KIND == KIND_GAT ? (VEC >= 4 ? 1 : 2)
                               : VEC != 4 ? 2
                               : KIND == KIND_DOT || ATOMIC || (sizeof(T) == 2 && !HAS_E) ? 4 : 2;
    static constexpr int U = NCH > 1 ? 1 : tuned;
};

// One lane's values of one head of one row: NCH chunks of VEC channels
// (zeros where the lane has no channel); a scalar in v[0][0] for gat's
// per-head score inputs.
template <typename T, int VEC, int NCH>
struct Slice {
    typename value_traits<T>::acc_t v[NCH][VEC];
};

template <typename T, int VEC, int NCH>
__device__ __forceinline__ void zero_slice(Slice<T, VEC, NCH>& s) {
#pragma unroll
    for (int k = 0; k < NCH; ++k)
#pragma unroll
        for (int q = 0; q < VEC; ++q) s.v[k][q] = 0;
}

// s (scaled by f first) summed over the phases (phase_sum).
template <typename T, int VEC, int NCH>
__device__ __forceinline__ void phase_sum_slice(Slice<T, VEC, NCH>& s, int phases,
                                                typename value_traits<T>::acc_t f = 1) {
#pragma unroll
    for (int k = 0; k < NCH; ++k)
#pragma unroll
        for (int q = 0; q < VEC; ++q) s.v[k][q] = phase_sum(s.v[k][q] * f, phases);
}

// One lane's values of one head of a gathered row, kept as loaded and
// converted where read (operator()(k, q)): 16-bit rows of an even VEC sit in
// 32-bit words, half the registers of Slice's acc_t values, so U rows in
// flight cost what U / 2 would converted. A scalar (gat's per-head score
// inputs) is value (0, 0).
template <typename T, int VEC, int NCH, bool WORDS = sizeof(T) == 2 && VEC % 2 == 0>
struct Row {
    pack_t<T, VEC> raw[NCH];
    __device__ __forceinline__ typename value_traits<T>::acc_t operator()(int k, int q) const {
        return value_traits<T>::to_acc(raw[k].v[q]);
    }
    __device__ __forceinline__ void zero(int k) {
#pragma unroll
        for (int q = 0; q < VEC; ++q) raw[k].v[q] = value_traits<T>::from_acc(0);
    }
    __device__ __forceinline__ void load(int k, const T* __restrict__ p) { raw[k] = load_pack<T, VEC>(p); }
    __device__ __forceinline__ void load_scalar(const T* __restrict__ p) { raw[0].v[0] = *p; }
};

template <typename T, int VEC, int NCH>
struct Row<T, VEC, NCH, true> {
    unsigned w[NCH][VEC / 2];   // values 2i (low half) and 2i + 1 (high half)
    __device__ __forceinline__ float operator()(int k, int q) const {
        return value_traits<T>::half_of_word(w[k][q / 2], q % 2);
    }
    __device__ __forceinline__ void zero(int k) {
#pragma unroll
        for (int i = 0; i < VEC / 2; ++i) w[k][i] = 0u;   // +0.0 in both halves
    }
    __device__ __forceinline__ void load(int k, const T* __restrict__ p) {
        const pack_t<unsigned, VEC / 2> x = load_pack<unsigned, VEC / 2>(reinterpret_cast<const unsigned*>(p));
#pragma unroll
        for (int i = 0; i < VEC / 2; ++i) w[k][i] = x.v[i];
    }
    __device__ __forceinline__ void load_scalar(const T* __restrict__ p) { w[0][0] = p->bits; }
};

template <typename T, int VEC, int NCH, bool W>
__device__ __forceinline__ void zero_row(Row<T, VEC, NCH, W>& s) {
#pragma unroll
    for (int k = 0; k < NCH; ++k) s.zero(k);
}

// Row r of `rows` as loaded (zeros where the lane has no channel).
template <bool SCALAR, typename T, int VEC, int NCH, int GROUP, typename R, bool W>
__device__ __forceinline__ void load_row(const Lanes<VEC, GROUP>& L, const Rows<const T*>& rows,
                                         R r, Row<T, VEC, NCH, W>& s) {
    const T* p = rows.at(r);
    if (SCALAR) {
        s.load_scalar(p);
        return;
    }
#pragma unroll
    for (int k = 0; k < NCH; ++k) {
        if (L.has(k)) s.load(k, p + k * L.grp() * VEC);
        else s.zero(k);
    }
}

// Row r of `rows` converted to acc_t (SCALAR: one value per (row, head)).
template <bool SCALAR, typename T, int VEC, int NCH, int GROUP, typename R>
__device__ __forceinline__ void load_slice(const Lanes<VEC, GROUP>& L, const Rows<const T*>& rows,
                                           R r, Slice<T, VEC, NCH>& s) {
    Row<T, VEC, NCH> raw;
    load_row<SCALAR>(L, rows, r, raw);
#pragma unroll
    for (int k = 0; k < (SCALAR ? 1 : NCH); ++k)
#pragma unroll
        for (int q = 0; q < (SCALAR ? 1 : VEC); ++q) s.v[k][q] = raw(k, q);
}

// Value (k, q) of a Slice or a Row.
template <typename T, int VEC, int NCH>
__device__ __forceinline__ typename value_traits<T>::acc_t val(const Slice<T, VEC, NCH>& s, int k, int q) {
    return s.v[k][q];
}
template <typename T, int VEC, int NCH, bool W>
__device__ __forceinline__ typename value_traits<T>::acc_t val(const Row<T, VEC, NCH, W>& s, int k, int q) {
    return s(k, q);
}

// A gatv2 row held negated as 16-bit pairs (each half's sign bit flipped):
// the 16-bit passes without an edge term hold their task's row (the target
// pass -xr_i, the source pass -xl_j) this way, half the registers of acc
// values, and compare gathered rows against it in pairs (add_where_greater);
// val() gives the row's own values back and neg_val() the negated ones as
// held (exact either way, so both forms of a row score alike).
template <typename T, int VEC, int NCH>
struct NegPairs {
    Row<T, VEC, NCH, true> r;
};

template <typename T, int VEC, int NCH>
__device__ __forceinline__ float val(const NegPairs<T, VEC, NCH>& n, int k, int q) {
    return -n.r(k, q);
}
template <typename T, int VEC, int NCH>
__device__ __forceinline__ float neg_val(const NegPairs<T, VEC, NCH>& n, int k, int q) {
    return n.r(k, q);
}
template <typename T, int VEC, int NCH>
__device__ __forceinline__ typename value_traits<T>::acc_t neg_val(const Slice<T, VEC, NCH>& s, int k,
                                                                  int q) {
    return -s.v[k][q];
}

template <bool B, typename X, typename Y> struct pick_type { typedef X type; };
template <typename X, typename Y> struct pick_type<false, X, Y> { typedef Y type; };

// Score of one edge and head from the lane's slices (s: S[j], d: Dn[i],
// e: Ed[ce] when HAS_E, a: att), reduced over the group:
//   gat   lrelu(s + d (+ e))                (scalars)
//   gatv2 sum_c a_c lrelu(s_c + d_c (+ e_c))
//   dot   scale * sum_c d_c (s_c (+ e_c))
// gatv2 splits the LeakyReLU, lrelu(t) = slope t + (1 - slope) relu(t), and
// with x = s (+ e), t = x + d, relu(t) = max(x, -d) + d:
//   score = db_i + sum_c a_c (slope x_c + (1 - slope) max(x_c, -d_c)),
// db_i = <a, d_i> once per task (gatv2_target_dot): per edge and channel a
// max and two multiply-adds, about what the add, the LeakyReLU and the
// multiply-add cost; what it buys is the backward's, which needs lrelu'(t)
// only as the comparison x > -d (attn_bwd_dst). NaN and inf inputs reach
// the score as through t (x in the first sum, d in db_i).
// Every lane-group kernel scores through this one function, so the backward
// passes recompute the forward's scores bit for bit (attn_fwd_mma and
// attn_bwd_dst_mma, 16-bit gatv2 on Tensor Cores, sum in another order:
// see there).
template <int KIND, int GROUP, bool HAS_E, typename T, int VEC, int NCH, typename SS, typename DD>
__device__ __forceinline__ typename value_traits<T>::acc_t score_of(
        const SS& s, const DD& d, const Row<T, VEC, NCH>& e,
        const Slice<T, VEC, NCH>& a, typename value_traits<T>::acc_t db_i,
        typename value_traits<T>::acc_t slope, typename value_traits<T>::acc_t scale, int group) {
    typedef typename value_traits<T>::acc_t A;
    if constexpr (KIND == KIND_GAT) {
        A u = val(s, 0, 0) + val(d, 0, 0);
        if (HAS_E) u += e(0, 0);
        return lrelu(u, slope);
    }
    A part = A(0), px = A(0);
#pragma unroll
    for (int k = 0; k < NCH; ++k)
#pragma unroll
        for (int q = 0; q < VEC; ++q) {
            A x = val(s, k, q);
            if (HAS_E) x += e(k, q);
            if constexpr (KIND == KIND_GATV2) {
                px += a.v[k][q] * x;
                part += a.v[k][q] * fmax(x, neg_val(d, k, q));
            } else {
                part += val(d, k, q) * x;
            }
        }
    if (KIND == KIND_GATV2) part = slope * px + (A(1) - slope) * part;
    part = group_sum_fixed<GROUP>(part, group);
    return KIND == KIND_DOT ? part * scale : KIND == KIND_GATV2 ? db_i + part : part;
}

// gatv2's db_i = <att, xr_i> of one head (score_of), reduced over the group.
template <int GROUP, typename T, int VEC, int NCH>
__device__ __forceinline__ typename value_traits<T>::acc_t gatv2_target_dot(
        const Slice<T, VEC, NCH>& a, const Slice<T, VEC, NCH>& d, int group) {
    typename value_traits<T>::acc_t part = 0;
#pragma unroll
    for (int k = 0; k < NCH; ++k)
#pragma unroll
        for (int q = 0; q < VEC; ++q) part += a.v[k][q] * d.v[k][q];
    return group_sum_fixed<GROUP>(part, group);
}

// gatv2's x = s (+ e) of channel (k, q): the LeakyReLU's argument is t = x +
// d, positive iff x > -d (the comparison every pass makes, so that the
// passes agree on each edge's side of the kink).
template <bool HAS_E, typename T, int VEC, int NCH, typename SS>
__device__ __forceinline__ typename value_traits<T>::acc_t gatv2_x(
        const SS& s, const Row<T, VEC, NCH>& e, int k, int q) {
    typename value_traits<T>::acc_t x = val(s, k, q);
    if (HAS_E) x += e(k, q);
    return x;
}

// (s0, s1) += ds where the low (s0) / high (s1) half of the 16-bit pair x is
// greater than that of y: both comparisons in one instruction (setp on
// bf16x2 / f16x2: exact, as in fp32; false for NaN), each add predicated.
// gatv2's passes compare their 16-bit rows this way (t > 0 iff xl > -xr, the
// negation a sign-bit flip), not converting them first.
template <typename T>
__device__ __forceinline__ void add_where_greater(unsigned x, unsigned y, float ds, float& s0, float& s1);
template <>
__device__ __forceinline__ void add_where_greater<bf16_t>(unsigned x, unsigned y, float ds, float& s0,
                                                          float& s1) {
    asm("{\n .reg .pred p, q;\n setp.gt.bf16x2 p|q, %2, %3;\n @p add.f32 %0, %0, %4;\n"
        " @q add.f32 %1, %1, %4;\n}" : "+f"(s0), "+f"(s1) : "r"(x), "r"(y), "f"(ds));
}
template <>
__device__ __forceinline__ void add_where_greater<f16_t>(unsigned x, unsigned y, float ds, float& s0,
                                                         float& s1) {
    asm("{\n .reg .pred p, q;\n setp.gt.f16x2 p|q, %2, %3;\n @p add.f32 %0, %0, %4;\n"
        " @q add.f32 %1, %1, %4;\n}" : "+f"(s0), "+f"(s1) : "r"(x), "r"(y), "f"(ds));
}

// Row r of `rows` held negated (NegPairs).
template <typename T, int VEC, int NCH, int GROUP, typename R>
__device__ __forceinline__ void load_negated(const Lanes<VEC, GROUP>& L, const Rows<const T*>& rows,
                                             R r, NegPairs<T, VEC, NCH>& n) {
    load_row<false>(L, rows, r, n.r);
#pragma unroll
    for (int k = 0; k < NCH; ++k)
#pragma unroll
        for (int i = 0; i < VEC / 2; ++i) n.r.w[k][i] ^= 0x80008000u;
}

// Message value (k, q) of an edge: gatv2 xl[j] (= s); dot v[j] (+ e); gat v[j].
template <int KIND, bool HAS_E, typename T, int VEC, int NCH, typename SS, typename VV>
__device__ __forceinline__ typename value_traits<T>::acc_t msg_of(
        const SS& s, const VV& v, const Row<T, VEC, NCH>& e, int k, int q) {
    if (KIND == KIND_GATV2) return val(s, k, q);
    if (KIND == KIND_DOT && HAS_E) return val(v, k, q) + e(k, q);
    return val(v, k, q);
}

// <g, message> of an edge, reduced over the group.
template <int KIND, int GROUP, bool HAS_E, typename T, int VEC, int NCH, typename GG, typename SS,
          typename VV>
__device__ __forceinline__ typename value_traits<T>::acc_t grad_dot_msg(
        const GG& g, const SS& s, const VV& v, const Row<T, VEC, NCH>& e, int group) {
    typedef typename value_traits<T>::acc_t A;
    A part = A(0);
#pragma unroll
    for (int k = 0; k < NCH; ++k)
#pragma unroll
        for (int q = 0; q < VEC; ++q) part += val(g, k, q) * msg_of<KIND, HAS_E, T, VEC, NCH>(s, v, e, k, q);
    return group_sum_fixed<GROUP>(part, group);
}

// The U edges of step b of the lane's phase: positions (b + u) phases +
// phase of the task's n; EDGE_OK(u) says which are edges (positions past n
// repeat the last edge, so their loads stay in bounds; callers mask them).
// Caller ids are read only when NEED_CE (edge term, dropout, per-edge I/O).
// (Reading them with Rows::at's one wide multiply-add from a 32-bit
// position issued fewer instructions but made fp32 dot 3-4% slower on
// rmat20, forward+backward 9.87 -> 10.19-10.27 ms in two runs.)
#define EDGE_BATCH(NEED_CE)                                                         \
    I nb_[U], ce[U];                                                                \
    _Pragma("unroll") for (int u = 0; u < U; ++u) {                                  \
        const int ep = (b + u) << phase_shift_;                                     \
        nb_[u] = pidx_[EDGE_OK(u) ? ep : n_own_ - 1];                               \
        ce[u] = (NEED_CE) ? pcid_[EDGE_OK(u) ? ep : n_own_ - 1] : I(0);             \
    }
// Whether edge u of the step is one of the task's (recomputed where used: a
// flag per edge kept across the step costs registers).
#define EDGE_OK(u) ((((b) + (u)) << phase_shift_) < n_own_)

// The online softmax of the forward kernels, one step: the running max m
// moving to M (where M > m) scales the sum l and the accumulator by
// e^(m - M); then each score s of the step gets its weight e^(s - m)
// (online_weight: exp(0) = 1 exactly where s is the max, also for +inf; 0
// for -inf scores and the masked tail; one exp per edge without a branch),
// added to l (a NaN score makes the row NaN, as torch).
template <typename T, typename A, int VEC, int NCH>
__device__ __forceinline__ void raise_running_max(A& m, A M, A& l, Slice<T, VEC, NCH>& acc) {
    if (M > m) {
        const A corr = score_exp<T>(m - M);
        l *= corr;
#pragma unroll
        for (int k = 0; k < NCH; ++k)
#pragma unroll
            for (int q = 0; q < VEC; ++q) acc.v[k][q] *= corr;
        m = M;
    }
}

template <typename T, typename A>
__device__ __forceinline__ A online_weight(A s, A m, A& l) {
    A w = score_exp<T>(s == m ? A(0) : s - m);
    w = s > neg_inf<A>() ? w : A(0);
    l += w;
    if (s != s) l = s;
    return w;
}

// A forward row's N accumulated values (one lane's chunk) divided by l (0
// for a row without edges) stored: to out, and plus the bias to out_b where
// given, or as they are to the split row's partial slot.
template <typename T, int N, typename A>
__device__ __forceinline__ void store_forward_row(T* __restrict__ out, T* __restrict__ out_b,
                                                  const T* __restrict__ bias, A* __restrict__ p_acc,
                                                  i64 slot, i64 off, int bias_off, i64 part_off,
                                                  const A* vals, bool empty, A l) {
    if (slot >= 0) {
#pragma unroll
        for (int q = 0; q < N; ++q) p_acc[part_off + q] = vals[q];
        return;
    }
    const A inv = empty ? A(0) : A(1) / l;
    pack_t<T, N> o;
#pragma unroll
    for (int q = 0; q < N; ++q) o.v[q] = value_traits<T>::from_acc(vals[q] * inv);
    store_pack<T, N>(out + off, o);
    if (out_b != nullptr) {
#pragma unroll
        for (int q = 0; q < N; ++q)
            o.v[q] = value_traits<T>::from_acc(vals[q] * inv + value_traits<T>::to_acc(bias[bias_off + q]));
        store_pack<T, N>(out_b + off, o);
    }
}

// A forward row's softmax state (one lane per (task, head)): lse of a direct
// row (-inf without edges), (m, l) of a split row's slot.
template <typename A>
__device__ __forceinline__ void store_forward_state(A* __restrict__ lse, A* __restrict__ p_m,
                                                    A* __restrict__ p_l, i64 at, i64 slot_at,
                                                    i64 slot, A m, A l, bool empty) {
    if (slot < 0) {
        lse[at] = empty ? neg_inf<A>() : m + log(l);
    } else {
        p_m[slot_at] = m;
        p_l[slot_at] = l;
    }
}

// ---------------------------------------------------------------------------
// attn_fwd_mma: the 16-bit gatv2 forward with Tensor Core scores. Where a
// warp holds HW whole heads of one task -- 16-bit gatv2 without edge term,
// heads of C = 32 channels at 4 values per lane (lane groups of GROUP = C /
// 4 = 8, HW = 4; the mapping below is written for C = 32 KB), H a multiple
// of 4, rows 16-byte aligned (the launcher's mma_scores) -- the forward
// scores a task's edges with mma.sync products instead of per-lane
// multiply-adds and a reduction across the head's lanes per edge; the same
// persistent grid and task walk as attn_fwd, whose alpha pass stays as it
// is. score_of's split,
//   score = db_i + slope <att, x_j> + (1 - slope) <att, max(x_j, -xr_i)>,
// takes its two channel sums from products over a step of ES = 16 / HW
// edges x HW heads = 16 rows:
//   A (16 x C) row (edge, head h) = x_j[h], then max(x_j[h], -xr_i[h]) (16-bit
//              pair maxima: exact);
//   B (C x 8)  column n = att of the warp's head n (zero columns past HW);
//   D[r][head of r] = the row's sum: products exact in fp32, fp32 sums.
// Thread t (quad g = t / 4, m = t mod 4) holds rows g and g + 8: edges q
// and QPH + q of its own group's head t / GROUP (q = g mod QPH, QPH = 8 /
// HW quads per head), each as one 16-byte load per 32-channel block kb <
// KB = C / 32, channels 32 kb + 8 m .. + 7. Those fill A's k positions 2m,
// 2m + 1 (channels +0, +1, then +4, +5) and 2m + 8, 2m + 9 (+2, +3, then
// +6, +7) of the block's two k-steps, in the order B's att words take (a
// sum does not care where a channel sits). A row's score is in its quad's
// thread m = (head in warp) / 2: one shuffle per row to the quad, log2 QPH
// for the running max over the head's quads. Each thread adds its two
// rows' weighted messages to its 8 KB channels in fp32; at the task's end
// the head's quads sum (l, acc) by shuffles and quad 0 stores.
// Traffic: the lane-group path's bytes (one 16-byte load per row and 8
// channels). Per step of 16 (edge, head) rows a thread issues 4 KB mma and
// 4 KB pair maxima where the lane-group path takes a conversion, a max and
// two multiply-adds per channel and value plus a reduction across the
// head's lanes per edge: H200, rmat20, 4 heads x 32, bf16 forward kernel
// 1.95 -> 1.63 ms (ncu), then waiting on its gathers (long scoreboard).
// The backward's target pass recomputes the scores with the same products
// (attn_bwd_dst_mma); where it runs on the lane groups instead (a cotangent
// of the attention weights) it scores through score_of (fp32 multiply-adds
// in another order), so its probabilities exp(s - lse) differ from the
// forward's by fp32 rounding of a score (about 1e-6 relative), far under
// 16-bit rounding.

// Both halves' maxima of two 16-bit pairs (max.bf16x2 / f16x2: exact; a
// NaN half gives the other operand's, as fmax).
template <typename T> __device__ __forceinline__ unsigned pair_max(unsigned a, unsigned b);
template <> __device__ __forceinline__ unsigned pair_max<bf16_t>(unsigned a, unsigned b) {
    unsigned r;
    asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
template <> __device__ __forceinline__ unsigned pair_max<f16_t>(unsigned a, unsigned b) {
    unsigned r;
    asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

// The split score's two channel sums over chunk kb (16 channels) on Tensor
// Cores, attn_fwd_mma's mapping: A's rows are the quad's gathered rows x0
// (edge q) and x1 (edge QPH + q) of its head, B the 8 columns in b (att of
// the warp's heads; the target pass adds g_i in the other four). dx += A B,
// dm += max(A, -xr_i) B, with -xr_i in nx (16-bit pair maxima: exact).
template <typename T, int KB>
__device__ __forceinline__ void split_score_products(const Row<T, 8, KB>& x0, const Row<T, 8, KB>& x1,
                                                     const Row<T, 8, KB>& nx, const Row<T, 8, KB>& b,
                                                     int kb, float (&dx)[4], float (&dm)[4]) {
#pragma unroll
    for (int kc = 0; kc < 2; ++kc) {
        const unsigned b0 = b.w[kb][2 * kc], b1 = b.w[kb][2 * kc + 1];
        const unsigned n0 = nx.w[kb][2 * kc], n1 = nx.w[kb][2 * kc + 1];
        const unsigned a[4] = {x0.w[kb][2 * kc], x1.w[kb][2 * kc], x0.w[kb][2 * kc + 1],
                               x1.w[kb][2 * kc + 1]};
        const unsigned am[4] = {pair_max<T>(a[0], n0), pair_max<T>(a[1], n0),
                                pair_max<T>(a[2], n1), pair_max<T>(a[3], n1)};
        Mma<T>::run(dx, a, b0, b1);
        Mma<T>::run(dm, am, b0, b1);
    }
}

// Row r's (0: x0, 1: x1) split score from split_score_products' sums, in
// the quad threads holding column hj of their pair: base (db_i, or db_i -
// lse) + slope <att, x_j> + (1 - slope) <att, max(x_j, -xr_i)>.
__device__ __forceinline__ float split_score(float base, const float (&dx)[4], const float (&dm)[4],
                                             int hj, int r, float slope) {
    return base + (slope * (hj ? dx[2 * r + 1] : dx[2 * r])
                   + (1.f - slope) * (hj ? dm[2 * r + 1] : dm[2 * r]));
}

// The task's target row for the Tensor Core scores (attn_fwd_mma and
// attn_bwd_dst_mma): -xr_i of head h as 16-bit pairs in nx (the pair_max /
// add_where_greater operand; the thread's 8 KB channels 32 kb + 8 m .. + 7)
// and db_i = <att, xr_i> of head h, summed over the quad.
template <typename T, int KB>
__device__ __forceinline__ float mma_target_row(const T* __restrict__ att, const T* __restrict__ Dn,
                                                i64 row, int h, int H, int m, Row<T, 8, KB>& nx) {
    constexpr int C = 32 * KB;
    float db = 0.f;
#pragma unroll
    for (int kb = 0; kb < KB; ++kb) {
        const int c = 32 * kb + 8 * m;
        nx.load(kb, Dn + (row * H + h) * (i64)C + c);
        Row<T, 8, KB> own;
        own.load(kb, att + h * C + c);
#pragma unroll
        for (int v = 0; v < 8; ++v) db += own(kb, v) * nx(kb, v);
#pragma unroll
        for (int i = 0; i < 4; ++i) nx.w[kb][i] ^= 0x80008000u;
    }
    db += __shfl_xor_sync(0xffffffffu, db, 1);
    db += __shfl_xor_sync(0xffffffffu, db, 2);
    return db;
}

// acc += w x: a row's values (a Row, as loaded) weighted into the accumulator.
template <typename T, int VEC, int NCH>
__device__ __forceinline__ void add_weighted(Slice<T, VEC, NCH>& acc, float w, const Row<T, VEC, NCH>& x) {
#pragma unroll
    for (int k = 0; k < NCH; ++k)
#pragma unroll
        for (int q = 0; q < VEC; ++q) acc.v[k][q] += w * x(k, q);
}

// One task of attn_fwd_mma: row's n edges (eidx, caller ids ecid), head h
// of H; S = xl [num_src, H, C], Dn = xr [num_dst, H, C], att [H, C];
// writes out / out_b / lse (slot < 0) or the slot's partials. The thread's
// 8 KB values of a row sit in a Row of 8 values x KB chunks (16-bit pairs
// as loaded: the mma operands' words).
template <typename T, typename I, int GROUP>
__device__ __forceinline__ void gatv2_fwd_mma_task(
        const I* __restrict__ eidx, const I* __restrict__ ecid, int n, i64 row, int h, int H,
        const T* __restrict__ S, const T* __restrict__ Dn, const T* __restrict__ att, float slope,
        const Dropout& drop, i64 slot, bool empty,
        const T* __restrict__ bias, T* __restrict__ out, T* __restrict__ out_b,
        float* __restrict__ lse, float* __restrict__ p_m, float* __restrict__ p_l,
        float* __restrict__ p_acc) {
    constexpr int HW = 32 / GROUP, QPH = 8 / HW, ES = 16 / HW, KB = GROUP / 8, C = 32 * KB;
    typedef Row<T, 8, KB> Rw;
    const int t = threadIdx.x & 31, g = t >> 2, m = t & 3, q = g % QPH, hw = t / GROUP;
    Rw ab, nx;                       // B words (att of the warp's head g); -xr_i
#pragma unroll
    for (int kb = 0; kb < KB; ++kb) {
        if (g < HW) ab.load(kb, att + (h - hw + g) * C + 32 * kb + 8 * m);
        else ab.zero(kb);
    }
    const float db = mma_target_row<T, KB>(att, Dn, row, h, H, m, nx);   // <att, xr_i>
    Slice<T, 8, KB> acc;
    zero_slice(acc);
    float mx = neg_inf<float>(), l = 0.f;
    const T* __restrict__ Sh = S + h * C + 8 * m;
    const int stride = H * C * (int)sizeof(T);   // bytes per source row
    const int src = (t & ~3) | (hw >> 1), hj = hw & 1;
    for (int b = 0; b < n; b += ES) {
        const int p0 = b + q, p1 = b + QPH + q;
        const bool ok0 = p0 < n, ok1 = p1 < n;
        const int e0 = ok0 ? p0 : n - 1, e1 = ok1 ? p1 : n - 1;
        const I j0 = eidx[e0], j1 = eidx[e1];
        // dropout factors, before the rows are live
        const float z0 = drop.on ? (float)drop_factor(drop, ecid[e0], H, h) : 1.f;
        const float z1 = drop.on ? (float)drop_factor(drop, ecid[e1], H, h) : 1.f;
        Rw x0, x1;
        const Rows<const T*> Sr = {Sh, stride};      // a gather address: one wide multiply-add
#pragma unroll
        for (int kb = 0; kb < KB; ++kb) {
            x0.load(kb, Sr.at(j0) + 32 * kb);
            x1.load(kb, Sr.at(j1) + 32 * kb);
        }
        float dx[4] = {0.f, 0.f, 0.f, 0.f}, dm[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int kb = 0; kb < KB; ++kb) split_score_products<T, KB>(x0, x1, nx, ab, kb, dx, dm);
        float s0 = split_score(db, dx, dm, hj, 0, slope);
        float s1 = split_score(db, dx, dm, hj, 1, slope);
        s0 = __shfl_sync(0xffffffffu, s0, src);
        s1 = __shfl_sync(0xffffffffu, s1, src);
        if (!ok0) s0 = neg_inf<float>();
        if (!ok1) s1 = neg_inf<float>();
        float M = s0 > mx ? s0 : mx;
        M = s1 > M ? s1 : M;
#pragma unroll
        for (int off = 4; off < 4 * QPH; off <<= 1) {
            const float o = __shfl_xor_sync(0xffffffffu, M, off);
            M = o > M ? o : M;
        }
        raise_running_max<T>(mx, M, l, acc);
        const float w0 = online_weight<T>(s0, mx, l) * z0;
        const float w1 = online_weight<T>(s1, mx, l) * z1;
        if (w0 != 0.f) add_weighted(acc, w0, x0);
        if (w1 != 0.f) add_weighted(acc, w1, x1);
    }
#pragma unroll
    for (int off = 4; off < 4 * QPH; off <<= 1) {
        l += __shfl_xor_sync(0xffffffffu, l, off);
#pragma unroll
        for (int kb = 0; kb < KB; ++kb)
#pragma unroll
            for (int v = 0; v < 8; ++v) acc.v[kb][v] += __shfl_xor_sync(0xffffffffu, acc.v[kb][v], off);
    }
    if (q != 0) return;
#pragma unroll
    for (int kb = 0; kb < KB; ++kb) {
        const int c0 = 32 * kb + 8 * m;
        store_forward_row<T, 8>(out, out_b, bias, p_acc, slot, (row * H + h) * (i64)C + c0,
                                h * C + c0, (slot * H + h) * C + c0, acc.v[kb], empty, l);
    }
    if (m == 0) store_forward_state(lse, p_m, p_l, row * H + h, slot * H + h, slot, mx, l, empty);
}

// Heads of 32 channels (GROUP = 8) fit 80 registers spill-free at 3 blocks,
// as attn_fwd; heads of 64 (GROUP = 16) would take 105-115 on this mapping
// (twice the rows and accumulators) and stay on attn_fwd.
template <typename T, typename I, int GROUP>
__global__ void __launch_bounds__(256, ATTN_FWD_MIN_BLOCKS)
attn_fwd_mma(const I* __restrict__ task_row, const I* __restrict__ task_begin,
             const I* __restrict__ task_slot, const long long* __restrict__ slot_begin,
             const I* __restrict__ indptr, const I* __restrict__ indices, const I* __restrict__ cid,
             const T* __restrict__ S, const T* __restrict__ Dn, const T* __restrict__ Ed,
             const T* __restrict__ att, const T* __restrict__ V,
             const T* __restrict__ bias,                 // [H, C] or null
             T* __restrict__ out,                        // [num_dst, H, C]
             T* __restrict__ out_b,                      // out + bias, or null
             float* __restrict__ lse,                    // [num_dst, H]
             T* __restrict__ alpha,                      // unused (attn_fwd's alpha pass)
             float* __restrict__ p_m, float* __restrict__ p_l, float* __restrict__ p_acc,
             i64 num_tasks, int H, int C, int nch, int chunk, int group, int launch_phases,
             int rounds, float slope, float scale, DROP_PARAMS, int alpha_mode) {
    constexpr int VEC = 4;                     // FOR_EACH_GROUP_TASK's lane layout
    DROP_MAKE
    FOR_EACH_GROUP_TASK {
        TASK_PROLOGUE
        const i64 slot = (i64)task_slot[t];
        gatv2_fwd_mma_task<T, I, GROUP>(eidx, ecid, n, row, h, H, S, Dn, att, slope, drop, slot,
                                        slot < 0 && indptr[row] == indptr[row + 1], bias, out,
                                        out_b, lse, p_m, p_l, p_acc);
    }
}

// Forward. alpha_mode = 0: online softmax; direct rows write out[i] and
// lse[i], split rows their (m, l, acc) partials. alpha_mode = 1: with lse
// known, write alpha[ce, h] = exp(s - lse[i, h]). U edges per step: their
// rows are gathered first, then the running max moves once per step.
template <int KIND, typename T, typename I, int VEC, int NCH, int GROUP, bool HAS_E>
__global__ void ATTN_FWD_BOUNDS attn_fwd(const I* __restrict__ task_row, const I* __restrict__ task_begin,
                         const I* __restrict__ task_slot, const long long* __restrict__ slot_begin,
                         const I* __restrict__ indptr,
                         const I* __restrict__ indices, const I* __restrict__ cid,
                         const T* __restrict__ S, const T* __restrict__ Dn,
                         const T* __restrict__ Ed, const T* __restrict__ att,
                         const T* __restrict__ V,
                         const T* __restrict__ bias,                            // [H, C] or null
                         T* __restrict__ out,                                   // [num_dst, H, C]
                         T* __restrict__ out_b,                                 // out + bias, or null
                         typename value_traits<T>::acc_t* __restrict__ lse,     // [num_dst, H]
                         T* __restrict__ alpha,                                 // [E, H] or null
                         typename value_traits<T>::acc_t* __restrict__ p_m,     // [slots, H]
                         typename value_traits<T>::acc_t* __restrict__ p_l,     // [slots, H]
                         typename value_traits<T>::acc_t* __restrict__ p_acc,   // [slots, H, C]
                         i64 num_tasks, int H, int C, int nch, int chunk, int group, int launch_phases, int rounds,
                         typename value_traits<T>::acc_t slope,
                         typename value_traits<T>::acc_t scale, DROP_PARAMS, int alpha_mode) {
    DROP_MAKE
    typedef typename value_traits<T>::acc_t A;
    typedef Slice<T, VEC, NCH> Sl;
    typedef Row<T, VEC, NCH> Rw;
    constexpr int U = Unroll<KIND, VEC, NCH>::U;
    constexpr bool GAT = KIND == KIND_GAT;
    FOR_EACH_GROUP_TASK {
        TASK_PROLOGUE
        const Rows<const T*> Sr = rows_of<GAT>(L, S, H, h), Er = rows_of<GAT>(L, Ed, H, h),
                             Vr = rows_of<false>(L, V, H, h);
        Sl d, a, acc;
        load_slice<GAT>(L, rows_of<GAT>(L, Dn, H, h), row, d);
        A db = A(0);                           // gatv2's <att, xr_i>
        if (KIND == KIND_GATV2) {
            load_slice<false>(L, rows_of<false>(L, att, H, h), 0, a);
            db = gatv2_target_dot<GROUP>(a, d, group);
        }
        if (alpha_mode) {                      // its own loop: no softmax state is live
            const A row_lse = lse[row * H + h];
            FOR_EACH_STEP {
                EDGE_BATCH(true)
                Rw s[U], e[U];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    load_row<GAT>(L, Sr, nb_[u], s[u]);
                    if (HAS_E) load_row<GAT>(L, Er, ce[u], e[u]);
                }
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const A sc = score_of<KIND, GROUP, HAS_E>(s[u], d, e[u], a, db, slope, scale, group);
                    if (EDGE_OK(u) && L.lane == 0)
                        alpha[(i64)ce[u] * H + h] = value_traits<T>::from_acc(score_exp<T>(sc - row_lse));
                }
            }
            continue;
        }
        zero_slice(acc);
        const bool need_ce = HAS_E || drop.on;
        A m = neg_inf<A>(), l = A(0);
        FOR_EACH_STEP {
            EDGE_BATCH(need_ce)
            A z[U];                            // dropout factors, before the rows are live
#pragma unroll
            for (int u = 0; u < U; ++u) z[u] = drop.on ? (A)drop_factor(drop, ce[u], H, h) : A(1);
            Rw s[U], e[U], v[U];
            A sc[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                load_row<GAT>(L, Sr, nb_[u], s[u]);
                if (HAS_E) load_row<GAT>(L, Er, ce[u], e[u]);
                if (KIND != KIND_GATV2) load_row<false>(L, Vr, nb_[u], v[u]);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                sc[u] = score_of<KIND, GROUP, HAS_E>(s[u], d, e[u], a, db, slope, scale, group);
                if (!EDGE_OK(u)) sc[u] = neg_inf<A>();
            }
            A M = m;
#pragma unroll
            for (int u = 0; u < U; ++u) M = sc[u] > M ? sc[u] : M;
            raise_running_max<T>(m, M, l, acc);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                A w = online_weight<T>(sc[u], m, l);
                if (drop.on) w *= z[u];
                if (w != A(0)) {
#pragma unroll
                    for (int k = 0; k < NCH; ++k)
#pragma unroll
                        for (int q = 0; q < VEC; ++q)
                            acc.v[k][q] += w * msg_of<KIND, HAS_E, T, VEC, NCH>(s[u], v[u], e[u], k, q);
                }
            }
        }
        if (phases > 1) {                      // merge the phases' (m, l, acc)
            const A M = phase_max(m, phases);
            const A corr = m == M ? A(1) : score_exp<T>(m - M);   // 0 for a phase without edges
            l = phase_sum(l * corr, phases);             // NaN stays NaN
            phase_sum_slice(acc, phases, corr);
            m = M;
            if (phase_ != 0) continue;
        }
        const i64 slot = (i64)task_slot[t];
        const bool empty = slot < 0 && indptr[row] == indptr[row + 1];
#pragma unroll
        for (int k = 0; k < NCH; ++k)
            if (L.has(k))
                store_forward_row<T, VEC>(out, out_b, bias, p_acc, slot,
                                          (row * H + h) * (i64)C + L.chan(k), h * C + L.chan(k),
                                          (slot * H + h) * C + L.chan(k), acc.v[k], empty, l);
        if (L.lane == 0) store_forward_state(lse, p_m, p_l, row * H + h, slot * H + h, slot, m, l, empty);
    }
}

// Merge the (m, l, acc) partials of each split row in slot order.
// Mapping: a lane group per (split row, head), lanes over channels.
template <typename T, typename I>
__global__ void attn_combine(const I* __restrict__ split_row, const I* __restrict__ slot_ptr,
                             const typename value_traits<T>::acc_t* __restrict__ p_m,
                             const typename value_traits<T>::acc_t* __restrict__ p_l,
                             const typename value_traits<T>::acc_t* __restrict__ p_acc,
                             const T* __restrict__ bias,    // [H, C] or null
                             T* __restrict__ out,
                             T* __restrict__ out_b,         // out + bias, or null
                             typename value_traits<T>::acc_t* __restrict__ lse,
                             i64 num_split, int H, int C, int group) {
    typedef typename value_traits<T>::acc_t A;
    const i64 gid = group_index(group);
    const i64 sidx = gid / H;
    const int h = (int)(gid % H);
    if (sidx >= num_split) return;
    const int lane = group_lane(group);
    const i64 row = (i64)split_row[sidx];
    const i64 k0 = (i64)slot_ptr[sidx], k1 = (i64)slot_ptr[sidx + 1];
    A M = neg_inf<A>();
    for (i64 k = k0; k < k1; ++k) M = p_m[k * H + h] > M ? p_m[k * H + h] : M;
    A Lsum = A(0);
    for (i64 k = k0; k < k1; ++k) {
        const A lk = p_l[k * H + h];
        if (lk != lk) Lsum = lk;                                  // NaN row stays NaN
        else if (lk > A(0)) Lsum += lk * exp(p_m[k * H + h] - M);
    }
    for (int c = lane; c < C; c += group) {
        A a = A(0);
        for (i64 k = k0; k < k1; ++k) {
            const A lk = p_l[k * H + h];
            if (lk > A(0)) a += p_acc[(k * H + h) * C + c] * exp(p_m[k * H + h] - M);
        }
        out[(row * H + h) * (i64)C + c] = value_traits<T>::from_acc(a / Lsum);
        if (out_b != nullptr)
            out_b[(row * H + h) * (i64)C + c] =
                value_traits<T>::from_acc(a / Lsum + value_traits<T>::to_acc(bias[h * C + c]));
    }
    if (lane == 0) lse[row * H + h] = M + log(Lsum);
}

// gatv2's grad_att partials per thread block (attn_bwd_dst with BLOCK_GATT,
// attn_bwd_src): group q = q0 + s of the block (q0 = blockIdx.x * blockDim /
// group, s < blockDim / group; head q mod H) leaves the C terms of all its
// tasks (zeros if it had none) in shared slot s (dynamic shared memory of
// (blockDim / group) * C acc values, sized by the launcher); after the
// barrier, thread x of the block sums column (h, c) = x, x + blockDim, ... of
// the block's row part[b, H, C] over the slots s == h - q0 (mod H), in slot
// order: a fixed order for a launch shape, so the same bits every run; no
// atomics (a head without a group in the block gets zeros). The target pass
// runs it only where blockDim / group > H (_block_gatt), so every head has
// groups in every block. Every thread of the block calls it (the barrier).
template <typename A>
__device__ __forceinline__ A* gatt_slots() {
    extern __shared__ __align__(16) unsigned char gatt_smem[];
    return reinterpret_cast<A*>(gatt_smem);
}

// The block's grad_att slots set to zero before any group adds to its own
// (every thread of the block calls it: a barrier).
template <typename A>
__device__ __forceinline__ void gatt_slots_zero(int C, int group) {
    A* __restrict__ slots = gatt_slots<A>();
    for (int x = threadIdx.x; x < (int)(blockDim.x / group) * C; x += blockDim.x) slots[x] = A(0);
    __syncthreads();
}

template <typename A>
__device__ __forceinline__ void gatt_block_sum(A* __restrict__ part,   // [blocks, H, C]
                                               int H, int C, int group) {
    __syncthreads();
    const A* __restrict__ slots = gatt_slots<A>();
    const int per_block = blockDim.x / group;
    const int h0 = (int)(((i64)blockIdx.x * per_block) % H);
    A* __restrict__ row = part + (i64)blockIdx.x * H * C;
    for (int x = threadIdx.x; x < H * C; x += blockDim.x) {
        const int h = x / C;
        const int c = x - h * C;
        A sum = A(0);
        for (int s = h >= h0 ? h - h0 : h - h0 + H; s < per_block; s += H) sum += slots[s * C + c];
        row[x] = sum;
    }
}

// Backward, target pass over the CSR: per edge ds_e = p (z <g_i, m_e> + ga_e
// - delta_i); the target-side gradient summed over the task (direct rows
// write gDn[i], split rows a partial slot), the per-edge gradient written at
// the caller's id, the source pass's (w, ds') at the caller's id in wds
// (when not null; see attn_bwd_src), and gatv2's grad_att terms: one partial
// row [H, C] per thread block (BLOCK_GATT, gatt_block_sum) or, where the
// launcher finds the slots too big or the blocks no fewer than the tasks,
// one per task (C values per (task, head)). U edges per step, their source
// rows gathered before any arithmetic.
// gatv2: with dl = ds lrelu'(t) = ds (slope + (1 - slope) [t > 0]), the
// task's sum_e dl_c = slope sum_e ds + (1 - slope) sum_{e: t_c > 0} ds: per
// edge and channel a comparison and an add (x > -d, gatv2_x; 16-bit rows
// without an edge term hold -xr_i as pairs, NegPairs, and compare two
// channels at once, add_where_greater); at the task's end gDn[i] = att (.)
// sum_e dl and grad_att's xr term xr_i (.) sum_e dl.
// grad_att = sum_e dl (.) t_e, t = xl_j + xr_i (+ xe_e): its xl_j terms are
// the source pass's (per source, the same way), the xe_e terms (edge term)
// are added here per edge.
// ATOMIC (the opt-in deterministic=False backward): the pass also adds each
// edge's source-side gradients (gS; gV for gat and dot) to fp32/fp64
// zero-initialised [num_src, H, Cs | C] buffers aS, aV with float atomics
// (vector atomics on sm_90), and the source pass is not run: no transpose
// walk and no second gather of Dn[i], g[i], but the sums' order varies
// (gatv2's dl and every grad_att term per edge and channel).
// delta: with `out` given (grad_out given, no grad_alpha) every task computes
// delta_i = <g_i, out_i> itself from out_i (same lanes and vector loads as
// g_i, fp32/fp64 sums; the same bits in every task of a split row); without
// `out`, delta is read (attn_delta and the grad_alpha term).
template <int KIND, typename T, typename I, int VEC, int NCH, int GROUP, bool HAS_E, bool ATOMIC,
          bool BLOCK_GATT>
__global__ void ATTN_DST_BOUNDS attn_bwd_dst(const I* __restrict__ task_row, const I* __restrict__ task_begin,
                             const I* __restrict__ task_slot, const long long* __restrict__ slot_begin,
                             const I* __restrict__ indptr,
                             const I* __restrict__ indices, const I* __restrict__ cid,
                             const T* __restrict__ S, const T* __restrict__ Dn,
                             const T* __restrict__ Ed, const T* __restrict__ att,
                             const T* __restrict__ V,
                             const typename value_traits<T>::acc_t* __restrict__ lse,
                             const T* __restrict__ g,          // [num_dst, H, C] or null
                             const T* __restrict__ ga,         // [E, H] or null
                             const T* __restrict__ out,        // [num_dst, H, C] or null
                             const typename value_traits<T>::acc_t* __restrict__ delta,  // [num_dst, H]
                             typename value_traits<T>::acc_t* __restrict__ wds,  // [E, H, 2] or null
                             T* __restrict__ gDn,              // [num_dst, H, Cs] or null
                             typename value_traits<T>::acc_t* __restrict__ p_dn,  // [slots, H, Cs]
                             T* __restrict__ gEd,              // [E, H, Cs] or null
                             typename value_traits<T>::acc_t* __restrict__ gatt_part,  // [tasks | blocks, H, C] or null
                             typename value_traits<T>::acc_t* __restrict__ aS,  // ATOMIC: [num_src, H, Cs] or null
                             typename value_traits<T>::acc_t* __restrict__ aV,  // ATOMIC: [num_src, H, C] or null
                             i64 num_tasks, int H, int C, int nch, int chunk, int group, int launch_phases, int rounds,
                             typename value_traits<T>::acc_t slope,
                             typename value_traits<T>::acc_t scale, DROP_PARAMS) {
    DROP_MAKE
    typedef typename value_traits<T>::acc_t A;
    typedef Slice<T, VEC, NCH> Sl;
    typedef Row<T, VEC, NCH> Rw;
    constexpr int U = BwdUnroll<KIND, T, VEC, NCH, HAS_E, ATOMIC>::U;
    constexpr bool GAT = KIND == KIND_GAT;
    static_assert(!BLOCK_GATT || KIND == KIND_GATV2, "block grad_att partials are gatv2's");
    // gatv2's grad_att terms of a task: a row of gatt_part per task, or
    // (BLOCK_GATT) added to the group's shared slot at the task's end (a
    // group's head h = q mod H never changes across its tasks; nothing held
    // in registers across tasks) and summed per block after the loop. The
    // loop has no `return`: every thread of the block, also those without a
    // task, reaches gatt_block_sum's barrier after it.
    constexpr bool EDGE_GATT = KIND == KIND_GATV2 && (ATOMIC || HAS_E);   // terms per edge
    // gatv2 of 16-bit pairs without an edge term or atomics: d held as -d in
    // pairs, t > 0 tested in pairs (add_where_greater)
    constexpr bool PAIRS = KIND == KIND_GATV2 && !HAS_E && !ATOMIC && sizeof(T) == 2 && VEC % 2 == 0;
    typedef typename pick_type<PAIRS, NegPairs<T, VEC, NCH>, Sl>::type DT;
    if (BLOCK_GATT && gatt_part != nullptr) gatt_slots_zero<A>(C, GROUP ? GROUP : group);   // uniform
    FOR_EACH_GROUP_TASK {
        TASK_PROLOGUE
        const Rows<const T*> Sr = rows_of<GAT>(L, S, H, h), Er = rows_of<GAT>(L, Ed, H, h),
                             Vr = rows_of<false>(L, V, H, h);
        const Rows<T*> gEr = rows_of<false>(L, gEd, H, h);   // not gat (scalar, written by lane 0)
        const Rows<A*> Wr = pairs_of(wds, H, h);
        const bool has_g = g != nullptr;
        Sl a, gr, dacc;
        DT d;                                  // Dn[i] (PAIRS: -xr_i in pairs)
        A db = A(0);                           // gatv2's <att, xr_i>
        if (KIND == KIND_GATV2) load_slice<false>(L, rows_of<false>(L, att, H, h), 0, a);
        if constexpr (PAIRS) {
            // db from a converted load of its own: from -xr_i's pairs the
            // compiler keeps xr_i's words and negates them at every use
            // in the edge loop (12 more instructions per step of 4 edges)
            Sl df;
            load_slice<false>(L, rows_of<false>(L, Dn, H, h), row, df);
            db = gatv2_target_dot<GROUP>(a, df, group);
            load_negated(L, rows_of<false>(L, Dn, H, h), row, d);
        } else {
            load_slice<GAT>(L, rows_of<GAT>(L, Dn, H, h), row, d);
            if (KIND == KIND_GATV2) db = gatv2_target_dot<GROUP>(a, d, group);
        }
        if (has_g) load_slice<false>(L, rows_of<false>(L, g, H, h), row, gr);
        else zero_slice(gr);
        zero_slice(dacc);
        Sl patt;                               // EDGE_GATT: the task's per-edge terms
        zero_slice(patt);
        const A row_lse = lse[row * H + h];
        A D;
        if (out != nullptr) {              // delta = <g_i, out_i>, computed by every task of the row
            Sl o;
            load_slice<false>(L, rows_of<false>(L, out, H, h), row, o);
            A part = A(0);
#pragma unroll
            for (int k = 0; k < NCH; ++k)
#pragma unroll
                for (int q = 0; q < VEC; ++q) part += gr.v[k][q] * o.v[k][q];
            D = group_sum_fixed<GROUP>(part, group);
        } else {
            D = delta[row * H + h];
        }
        const bool need_ce = HAS_E || drop.on || ga != nullptr || gEd != nullptr || wds != nullptr;
        A dgat = A(0);                                  // gat's scalar target-side gradient
        A dsum = A(0);                                  // gatv2: sum_e ds
        FOR_EACH_STEP {
            EDGE_BATCH(need_ce)
            Rw s[U], e[U], v[U];
            A sc[U], gm[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                load_row<GAT>(L, Sr, nb_[u], s[u]);
                if (HAS_E) load_row<GAT>(L, Er, ce[u], e[u]);
                if (KIND != KIND_GATV2 && has_g) load_row<false>(L, Vr, nb_[u], v[u]);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                sc[u] = score_of<KIND, GROUP, HAS_E>(s[u], d, e[u], a, db, slope, scale, group);
                gm[u] = has_g ? grad_dot_msg<KIND, GROUP, HAS_E>(gr, s[u], v[u], e[u], group) : A(0);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (!EDGE_OK(u)) continue;
                const A p = score_exp<T>(sc[u] - row_lse);
                const A z = (A)drop_factor(drop, ce[u], H, h);
                A dp = z != A(0) ? z * gm[u] : A(0);
                if (ga != nullptr) dp += value_traits<T>::to_acc(ga[(i64)ce[u] * H + h]);
                const A ds = p * (dp - D);
                const A w = p * z;                            // the message's weight
                const i64 jrow = ((i64)nb_[u] * H + h) * (GAT ? 1 : C);   // ATOMIC: source row
                A du = ds;                                    // gat: ds lrelu'(x)
                if constexpr (KIND == KIND_GAT) {
                    A x = s[u](0, 0) + d.v[0][0];
                    if (HAS_E) x += e[u](0, 0);
                    du = ds * lrelu_grad(x, slope);
                }
                if (wds != nullptr && L.lane == 0) {          // for the source pass
                    pack_t<A, 2> o;
                    o.v[0] = w;
                    o.v[1] = KIND == KIND_DOT ? scale * ds : du;
                    store_pack<A, 2>(Wr.at(ce[u]), o);
                }
                if (KIND == KIND_GAT) {
                    dgat += du;
                    if (gEd != nullptr && L.lane == 0) gEd[(i64)ce[u] * H + h] = value_traits<T>::from_acc(du);
                    if (ATOMIC && aS != nullptr && L.lane == 0) atomicAdd(aS + jrow, du);
                    if (ATOMIC && aV != nullptr && w != A(0)) {
#pragma unroll
                        for (int k = 0; k < NCH; ++k) {
                            A vv[VEC];
#pragma unroll
                            for (int q = 0; q < VEC; ++q) vv[q] = w * gr.v[k][q];
                            if (L.has(k)) atomic_add_vec<A, VEC>(aV + jrow * C + L.chan(k), vv);
                        }
                    }
                    continue;
                }
                if (KIND == KIND_GATV2) dsum += ds;
                if constexpr (PAIRS) {                        // dacc: sum_{t > 0} ds
#pragma unroll
                    for (int k = 0; k < NCH; ++k)
#pragma unroll
                        for (int i = 0; i < VEC / 2; ++i)
                            add_where_greater<T>(s[u].w[k][i], d.r.w[k][i], ds, dacc.v[k][2 * i],
                                                 dacc.v[k][2 * i + 1]);
                    continue;
                }
                T* __restrict__ ge_row = gEr.at(ce[u]);
#pragma unroll
                for (int k = 0; k < NCH; ++k) {
                    pack_t<T, VEC> ge;
                    A sv[VEC], vv[VEC];                       // ATOMIC: gS, gV terms
#pragma unroll
                    for (int q = 0; q < VEC; ++q) {
                        A dv = A(0);
                        if constexpr (KIND == KIND_GATV2 && !PAIRS) {
                            // dacc: sum_{t > 0} ds, or with ATOMIC sum dl;
                            // att multiplies it once, at the task's end
                            const A x = gatv2_x<HAS_E>(s[u], e[u], k, q);
                            const bool pos = x > -d.v[k][q];
                            const A dl = pos ? ds : slope * ds;
                            if (ATOMIC) {
                                patt.v[k][q] += dl * (x + d.v[k][q]);
                                dacc.v[k][q] += dl;
                            } else {
                                if (pos) dacc.v[k][q] += ds;
                                if (HAS_E) patt.v[k][q] += dl * e[u](k, q);
                            }
                            dv = dl * a.v[k][q];
                            if (ATOMIC) sv[q] = dv + w * gr.v[k][q];
                        } else if constexpr (KIND == KIND_DOT) {
                            A x = s[u](k, q);
                            if (HAS_E) x += e[u](k, q);
                            dacc.v[k][q] += scale * ds * x;
                            dv = scale * ds * d.v[k][q] + p * z * gr.v[k][q];
                            if (ATOMIC) {
                                sv[q] = scale * ds * d.v[k][q];
                                vv[q] = w * gr.v[k][q];
                            }
                        }
                        ge.v[q] = value_traits<T>::from_acc(dv);
                    }
                    if (HAS_E && gEd != nullptr && L.has(k)) store_pack<T, VEC>(ge_row + k * L.grp() * VEC, ge);
                    if (ATOMIC && L.has(k)) {
                        if (aS != nullptr) atomic_add_vec<A, VEC>(aS + jrow + L.chan(k), sv);
                        if (KIND == KIND_DOT && aV != nullptr && w != A(0))
                            atomic_add_vec<A, VEC>(aV + jrow + L.chan(k), vv);
                    }
                }
            }
        }
        if (phases > 1) {                      // merge the phases' sums
            if (KIND == KIND_GAT) {
                dgat = phase_sum(dgat, phases);
            } else {
                if (KIND == KIND_GATV2) dsum = phase_sum(dsum, phases);
                phase_sum_slice(dacc, phases);
                if (EDGE_GATT) phase_sum_slice(patt, phases);
            }
            if (phase_ != 0) continue;
        }
        const i64 slot = (i64)task_slot[t];
        if (KIND == KIND_GAT) {
            if (L.lane == 0) {
                if (gDn != nullptr && slot < 0) gDn[row * H + h] = value_traits<T>::from_acc(dgat);
                if (gDn != nullptr && slot >= 0) p_dn[slot * H + h] = dgat;
            }
            continue;
        }
#pragma unroll
        for (int k = 0; k < NCH; ++k) {
            if (!L.has(k)) continue;
            const int c0 = L.chan(k);
            if (KIND == KIND_GATV2) {
                A* __restrict__ pa = BLOCK_GATT ? gatt_slots<A>() + (threadIdx.x / grp_) * C + c0
                                                : gatt_part + (t * H + h) * C + c0;   // the task's row
#pragma unroll
                for (int q = 0; q < VEC; ++q) {
                    A term = EDGE_GATT ? patt.v[k][q] : A(0);           // grad_att's terms
                    if (!ATOMIC) {                    // sum_e dl, and grad_att's xr_i term
                        dacc.v[k][q] = slope * dsum + (A(1) - slope) * dacc.v[k][q];
                        const A dk = val(d, k, q);
                        term = EDGE_GATT ? term + dk * dacc.v[k][q] : dk * dacc.v[k][q];
                    }
                    if (gatt_part != nullptr) {
                        if (BLOCK_GATT) pa[q] += term;
                        else pa[q] = term;
                    }
                    dacc.v[k][q] *= a.v[k][q];
                }
            }
            if (gDn != nullptr)
                store_row<T, VEC>(gDn, p_dn, slot, (row * H + h) * (i64)C + c0,
                                  (slot * H + h) * C + c0, dacc.v[k]);
        }
    }
    if (BLOCK_GATT && gatt_part != nullptr)     // uniform: no divergent barrier
        gatt_block_sum(gatt_part, H, C, grp_);
}

// attn_bwd_dst_mma: the 16-bit gatv2 target pass with Tensor Core scores,
// where attn_fwd_mma's layout holds (the same conditions; it also serves
// deterministic=False, faster than the atomic pass). attn_fwd_mma's mapping and products, B's other four columns
// holding g_i of the warp's heads, so one product gives a row's <att, x_j>
// (column = its head in the warp) and <g_i, x_j> (column 4 + that head),
// the second product <att, max(x_j, -xr_i)>. Per edge and head then as
// attn_bwd_dst's PAIRS path: p = e^(s - lse), ds = p (z <g_i, x_j> (+ ga) -
// D), the pair (w, ds) stored by the row's quad thread m = 0, dsum += ds and
// the pair comparisons x_j > -xr_i adding ds per channel (add_where_greater)
// over the thread's 8 channels and two rows; at the task's end the head's
// quads sum (dsum, dacc) by shuffles, and quad 0 forms sum_e dl = slope dsum
// + (1 - slope) dacc per channel, gDn[i] = att (.) sum_e dl and grad_att's
// xr_i term as attn_bwd_dst does. D = <g_i, out_i> from the thread's 8
// channels, summed over the quad: the launcher takes this kernel only with
// a cotangent g and without one of the weights (attn_bwd_dst's fused case),
// so g and out are always given.
// 2 blocks (<= 128 registers; it takes 95-99). Under the 3-block cap of
// attn_bwd_dst's 16-bit gatv2 variants (80 registers) NVRTC spills 8-20
// bytes of the BLOCK_GATT variants (FOR_EACH_GROUP_TASK's slot count and
// range state, reloaded once per slot range or task) and 28-32 of the
// others, and even so that build's backward ran 4.05 ms against 4.46 at 2
// blocks on the H200 (rmat20, 4 x 32 bf16, probe_attention.py fwdbwd, one
// run each): a layout in 80 registers would pay.
template <typename T, typename I, int GROUP, bool BLOCK_GATT>
__global__ void __launch_bounds__(256, 2)
attn_bwd_dst_mma(const I* __restrict__ task_row, const I* __restrict__ task_begin,
                 const I* __restrict__ task_slot, const long long* __restrict__ slot_begin,
                 const I* __restrict__ indptr, const I* __restrict__ indices,
                 const I* __restrict__ cid, const T* __restrict__ S, const T* __restrict__ Dn,
                 const T* __restrict__ Ed, const T* __restrict__ att, const T* __restrict__ V,
                 const float* __restrict__ lse,
                 const T* __restrict__ g,          // [num_dst, H, C]
                 const T* __restrict__ ga,         // unused (no grad_alpha: attn_bwd_dst)
                 const T* __restrict__ out,        // [num_dst, H, C]
                 const float* __restrict__ delta,  // unused (D from g and out)
                 float* __restrict__ wds,          // [E, H, 2] or null
                 T* __restrict__ gDn,              // [num_dst, H, C] or null
                 float* __restrict__ p_dn,         // [slots, H, C]
                 T* __restrict__ gEd,              // unused (no edge term)
                 float* __restrict__ gatt_part,    // [tasks | blocks, H, C] or null
                 float* __restrict__ aS, float* __restrict__ aV,   // unused (not atomic)
                 i64 num_tasks, int H, int C, int nch, int chunk, int group, int launch_phases,
                 int rounds, float slope, float scale, DROP_PARAMS) {
    constexpr int VEC = 4;                     // FOR_EACH_GROUP_TASK's lane layout
    constexpr int HW = 32 / GROUP, QPH = 8 / HW, ES = 16 / HW;
    static_assert(GROUP == 8, "heads of 32 channels");
    typedef Row<T, 8, 1> Rw;                   // a thread's 8 channels of a row, as loaded
    DROP_MAKE
    if (BLOCK_GATT && gatt_part != nullptr) gatt_slots_zero<float>(C, GROUP);   // uniform
    const int tl = threadIdx.x & 31, gq = tl >> 2, m = tl & 3, q = gq % QPH, hw = tl / GROUP;
    const int hj = hw & 1, src_s = (tl & ~3) | (hw >> 1);   // <g_i, x_j> at src_s + 2
    const int stride = H * C * (int)sizeof(T);   // bytes per source row
    FOR_EACH_GROUP_TASK {
        TASK_PROLOGUE
        const int c = 8 * m;
        const i64 rowc = (row * H + h) * (i64)C + c;
        // B: att of the warp's head gq (columns 0..3), g_i of head gq - 4 (4..7)
        const int hb = h - hw;                 // the warp's first head
        Rw bw, nx;                             // B words; -xr_i
        if (gq < HW) bw.load(0, att + (hb + gq) * C + c);
        else if (gq >= 4 && gq < 4 + HW) bw.load(0, g + (row * H + hb + gq - 4) * (i64)C + c);
        else bw.zero(0);
        // a score's p = e^(its sums + db - lse)
        const float db_lse = mma_target_row<T, 1>(att, Dn, row, h, H, m, nx) - lse[row * H + h];
        float D = 0.f;                         // <g_i, out_i>
        {
            Rw gi, oi;
            gi.load(0, g + rowc);
            oi.load(0, out + rowc);
#pragma unroll
            for (int v = 0; v < 8; ++v) D += gi(0, v) * oi(0, v);
        }
        D += __shfl_xor_sync(0xffffffffu, D, 1);
        D += __shfl_xor_sync(0xffffffffu, D, 2);
        float dacc[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) dacc[k] = 0.f;
        float dsum = 0.f;
        const Rows<const T*> Sr = {S + h * C + c, stride};
        for (int b = 0; b < n; b += ES) {
            const int p0 = b + q, p1 = b + QPH + q;
            const bool ok0 = p0 < n, ok1 = p1 < n;
            const int e0 = ok0 ? p0 : n - 1, e1 = ok1 ? p1 : n - 1;
            const I j0 = eidx[e0], j1 = eidx[e1];
            const I ce0 = ecid[e0], ce1 = ecid[e1];
            Rw x0, x1;
            x0.load(0, Sr.at(j0));
            x1.load(0, Sr.at(j1));
            float dx[4] = {0.f, 0.f, 0.f, 0.f}, dm[4] = {0.f, 0.f, 0.f, 0.f};
            split_score_products<T, 1>(x0, x1, nx, bw, 0, dx, dm);
            // the score in the quad's thread m = hw / 2, <g_i, x_j> in m = 2 + hw / 2
            float s0 = split_score(db_lse, dx, dm, hj, 0, slope);
            float s1 = split_score(db_lse, dx, dm, hj, 1, slope);
            float g0 = hj ? dx[1] : dx[0], g1 = hj ? dx[3] : dx[2];
            s0 = __shfl_sync(0xffffffffu, s0, src_s);
            s1 = __shfl_sync(0xffffffffu, s1, src_s);
            g0 = __shfl_sync(0xffffffffu, g0, src_s + 2);
            g1 = __shfl_sync(0xffffffffu, g1, src_s + 2);
            float ds[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float s = r ? s1 : s0, gm = r ? g1 : g0;
                const I ce = r ? ce1 : ce0;
                const float p = score_exp<T>(s);
                const float z = (float)drop_factor(drop, ce, H, h);
                const float dp = z != 0.f ? z * gm : 0.f;
                const bool ok = r ? ok1 : ok0;
                ds[r] = ok ? p * (dp - D) : 0.f;
                if (ok && wds != nullptr && m == 0) {
                    pack_t<float, 2> o;
                    o.v[0] = p * z;                   // the message's weight
                    o.v[1] = ds[r];
                    // (pairs_of's base pointer here: 16 more instructions, 2 more
                    // registers with 64-bit indices)
                    store_pack<float, 2>(wds + ((i64)ce * H + h) * 2, o);
                }
            }
            dsum += ds[0];
            dsum += ds[1];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                add_where_greater<T>(x0.w[0][i], nx.w[0][i], ds[0], dacc[2 * i], dacc[2 * i + 1]);
                add_where_greater<T>(x1.w[0][i], nx.w[0][i], ds[1], dacc[2 * i], dacc[2 * i + 1]);
            }
        }
#pragma unroll
        for (int off = 4; off < 4 * QPH; off <<= 1) {
            dsum += __shfl_xor_sync(0xffffffffu, dsum, off);
#pragma unroll
            for (int k = 0; k < 8; ++k) dacc[k] += __shfl_xor_sync(0xffffffffu, dacc[k], off);
        }
        if (q != 0) continue;
        const i64 slot = (i64)task_slot[t];
        Rw own;
        own.load(0, att + h * C + c);
        float* __restrict__ pa = BLOCK_GATT ? gatt_slots<float>() + (threadIdx.x / GROUP) * C + c
                                            : gatt_part + (t * H + h) * C + c;   // the task's row
        float gd[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const float dl = slope * dsum + (1.f - slope) * dacc[k];   // sum_e dl
            const float term = -nx(0, k) * dl;                        // xr_i's term
            if (gatt_part != nullptr) {
                if (BLOCK_GATT) pa[k] += term;
                else pa[k] = term;
            }
            gd[k] = own(0, k) * dl;
        }
        if (gDn != nullptr) store_row<T, 8>(gDn, p_dn, slot, rowc, (slot * H + h) * C + c, gd);
    }
    if (BLOCK_GATT && gatt_part != nullptr)     // uniform: no divergent barrier
        gatt_block_sum(gatt_part, H, C, GROUP);
}

// Backward, source pass over the transpose (task rows are sources j, t_indices
// targets i, t_cid caller ids): grad of the source-side score input and of
// the message (gatv2: both are xl, summed into gS), from the target pass's
// per-edge (w, ds') in wds [E, H, 2] (w = p z the message's weight; ds' =
// d loss / d(score input): gat ds lrelu'(x), dot scale ds, gatv2 ds):
//   gat   gS[j] = sum_e ds'_e                 gV[j] = sum_e w_e g_i
//   dot   gS[j] = sum_e ds'_e q_i             gV[j] = sum_e w_e g_i
//   gatv2 gS[j] = att (.) sum_e ds'_e lrelu'(t_e) + sum_e w_e g_i,
//         t_e = xl_j + xr_i (+ xe_e)
// gatv2 sums ds' over the edges and over those with t_c > 0 (x > -d as in
// attn_bwd_dst: a comparison and an add per edge and channel; 16-bit rows
// without an edge term compare xr_i with -xl_j two channels at once,
// add_where_greater) and forms
// sum_e dl = slope sum_e ds' + (1 - slope) sum_{t > 0} ds' at the task's
// end, with grad_att's xl_j term xl_j (.) sum_e dl (the target pass has the
// others), added to the group's shared slot (gatt_slots: a task's C terms
// added once, no registers held across tasks) and summed per thread block
// at the end (gatt_block_sum; gatt_part [blocks, H, C], summed with the
// target pass's rows by column_sum).
// No score is recomputed and nothing is reduced across lanes: per edge the
// target rows g[i] (and Dn[i]: dot's q_i, gatv2's xr_i for the sign of t;
// U edges in flight), gatv2's edge term, and the 2 values of wds (8 bytes
// for 32-bit types; the H heads of an edge are one 32-byte sector for
// H = 4, read by the H groups of a slot together).
template <int KIND, typename T, typename I, int VEC, int NCH, int GROUP, bool HAS_E>
__global__ void ATTN_SRC_BOUNDS attn_bwd_src(const I* __restrict__ task_row, const I* __restrict__ task_begin,
                             const I* __restrict__ task_slot, const long long* __restrict__ slot_begin,
                             const I* __restrict__ indptr,
                             const I* __restrict__ indices, const I* __restrict__ cid,
                             const T* __restrict__ S, const T* __restrict__ Dn,
                             const T* __restrict__ Ed, const T* __restrict__ att,
                             const typename value_traits<T>::acc_t* __restrict__ wds,  // [E, H, 2]
                             const T* __restrict__ g,           // [num_dst, H, C] or null
                             T* __restrict__ gS,                // [num_src, H, Cs] or null
                             typename value_traits<T>::acc_t* __restrict__ p_s,   // [slots, H, Cs]
                             T* __restrict__ gV,                // [num_src, H, C] or null
                             typename value_traits<T>::acc_t* __restrict__ p_v,   // [slots, H, C]
                             typename value_traits<T>::acc_t* __restrict__ gatt_part,  // gatv2: [blocks, H, C] or null
                             i64 num_tasks, int H, int C, int nch, int chunk, int group, int launch_phases, int rounds,
                             typename value_traits<T>::acc_t slope) {
    typedef typename value_traits<T>::acc_t A;
    typedef Slice<T, VEC, NCH> Sl;
    typedef Row<T, VEC, NCH> Rw;
    constexpr int U = BwdUnroll<KIND, T, VEC, NCH, HAS_E>::U;
    const bool gatt = KIND == KIND_GATV2 && gatt_part != nullptr;   // uniform
    if (gatt) gatt_slots_zero<A>(C, GROUP ? GROUP : group);                 // uniform
    FOR_EACH_GROUP_TASK {
        TASK_PROLOGUE
        const i64 j = row;
        const Rows<const T*> Dr = rows_of<false>(L, Dn, H, h), Er = rows_of<false>(L, Ed, H, h),
                             Gr = rows_of<false>(L, g, H, h);
        const Rows<const A*> Wr = pairs_of(wds, H, h);
        const bool has_g = g != nullptr;
        // gatv2's xl_j: acc values, or 16-bit pairs held negated without an
        // edge term (NegPairs, for add_where_greater)
        constexpr bool PAIRS = KIND == KIND_GATV2 && !HAS_E && sizeof(T) == 2 && VEC % 2 == 0;
        typename pick_type<PAIRS, NegPairs<T, VEC, NCH>, Sl>::type sj;
        Sl sacc, vacc;
        if constexpr (PAIRS) load_negated(L, rows_of<false>(L, S, H, h), j, sj);
        else if (KIND == KIND_GATV2) load_slice<false>(L, rows_of<false>(L, S, H, h), j, sj);
        zero_slice(sacc);
        zero_slice(vacc);
        A sgat = A(0);                         // gat's sum, gatv2's sum_e ds'
        FOR_EACH_STEP {
            EDGE_BATCH(true)
            Rw dv[U], gv[U], e[U];
            pack_t<A, 2> x[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (KIND != KIND_GAT) load_row<false>(L, Dr, nb_[u], dv[u]);
                if (KIND == KIND_GATV2 && HAS_E) load_row<false>(L, Er, ce[u], e[u]);
                if (has_g) load_row<false>(L, Gr, nb_[u], gv[u]);
                else zero_row(gv[u]);
                x[u] = load_pack<A, 2>(Wr.at(ce[u]));
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (!EDGE_OK(u)) continue;
                const A w = x[u].v[0], ds = x[u].v[1];
                if (KIND != KIND_DOT) sgat += ds;
#pragma unroll
                for (int k = 0; k < NCH; ++k) {
                    if constexpr (PAIRS) {             // t > 0 iff xr_i > -xl_j
#pragma unroll
                        for (int i = 0; i < VEC / 2; ++i)
                            add_where_greater<T>(dv[u].w[k][i], sj.r.w[k][i], ds, sacc.v[k][2 * i],
                                                 sacc.v[k][2 * i + 1]);
                    }
#pragma unroll
                    for (int q = 0; q < VEC; ++q) {
                        if (KIND == KIND_GATV2 && !PAIRS
                            && gatv2_x<HAS_E>(sj, e[u], k, q) > -dv[u](k, q))
                            sacc.v[k][q] += ds;
                        if (KIND == KIND_DOT) sacc.v[k][q] += ds * dv[u](k, q);
                        vacc.v[k][q] += w * gv[u](k, q);
                    }
                }
            }
        }
        if (phases > 1) {                      // merge the phases' sums
            if (KIND != KIND_DOT) sgat = phase_sum(sgat, phases);
            if (KIND != KIND_GAT) phase_sum_slice(sacc, phases);
            phase_sum_slice(vacc, phases);
            if (phase_ != 0) continue;
        }
        const i64 slot = (i64)task_slot[t];
        if (KIND == KIND_GAT && gS != nullptr && L.lane == 0) {
            if (slot < 0) gS[j * H + h] = value_traits<T>::from_acc(sgat);
            else p_s[slot * H + h] = sgat;
        }
#pragma unroll
        for (int k = 0; k < NCH; ++k) {
            if (!L.has(k)) continue;
            const int c0 = L.chan(k);
            if (KIND == KIND_GATV2) {                  // att read here: no registers held
                const T* __restrict__ ak = att + h * C + c0;
                A* __restrict__ pa = gatt_slots<A>() + (threadIdx.x / grp_) * C + c0;
#pragma unroll
                for (int q = 0; q < VEC; ++q) {
                    const A dl = slope * sgat + (A(1) - slope) * sacc.v[k][q];   // sum_e dl
                    if (gatt) pa[q] += val(sj, k, q) * dl;
                    sacc.v[k][q] = value_traits<T>::to_acc(ak[q]) * dl + vacc.v[k][q];
                }
            }
            if (KIND != KIND_GAT && gS != nullptr)
                store_row<T, VEC>(gS, p_s, slot, (j * H + h) * (i64)C + c0, (slot * H + h) * C + c0,
                                  sacc.v[k]);
            if (KIND != KIND_GATV2 && gV != nullptr)
                store_row<T, VEC>(gV, p_v, slot, (j * H + h) * (i64)C + c0, (slot * H + h) * C + c0,
                                  vacc.v[k]);
        }
    }
    if (gatt) gatt_block_sum(gatt_part, H, C, grp_);
}

// delta[i, h] = <g[i, h], out[i, h]> (fp32/fp64 sums) where the target pass
// does not compute it (grad_alpha given, or no cotangent of out).
// A lane group per (row, head), lanes over channels; reads g and out once.
template <typename T>
__global__ void attn_delta(const T* __restrict__ g, const T* __restrict__ out,
                           typename value_traits<T>::acc_t* __restrict__ delta,  // [rows, H]
                           i64 num_rows, int H, int C, int group) {
    typedef typename value_traits<T>::acc_t A;
    const i64 gid = group_index(group);
    const i64 row = gid / H;
    const int h = (int)(gid - row * H);
    if (row >= num_rows) return;
    const int lane = group_lane(group);
    const i64 base = (row * H + h) * (i64)C;
    A s = A(0);
    for (int c = lane; c < C; c += group)
        s += value_traits<T>::to_acc(g[base + c]) * value_traits<T>::to_acc(out[base + c]);
    s = group_sum(s, group);
    if (lane == 0) delta[row * H + h] = s;
}

// Edge softmax over each target's in-edges, per head (warp per row, lanes
// over edges; a lane-local online (max, sum) merged across the warp).
// Traffic: scores read twice, out written once (E x H each).
template <typename T, typename I>
__global__ void softmax_fwd(const I* __restrict__ indptr, const I* __restrict__ cid,
                            const T* __restrict__ scores,   // [E, H] caller order
                            T* __restrict__ out,            // [E, H] caller order
                            typename value_traits<T>::acc_t* __restrict__ lse,  // [num_dst, H]
                            i64 num_rows, int H, DROP_PARAMS) {
    DROP_MAKE
    typedef typename value_traits<T>::acc_t A;
    const i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (row >= num_rows) return;
    const int lane = threadIdx.x & 31;
    const i64 e0 = (i64)indptr[row], e1 = (i64)indptr[row + 1];
    for (int h = 0; h < H; ++h) {
        A m = neg_inf<A>(), l = A(0);
        for (i64 e = e0 + lane; e < e1; e += 32) {
            const A s = value_traits<T>::to_acc(scores[(i64)cid[e] * H + h]);
            if (s > m) { l = l * exp(m - s) + A(1); m = s; }
            else if (s > neg_inf<A>()) l += exp(s - m);
            else if (s != s) l = s;
        }
        for (int off = 16; off > 0; off >>= 1) {          // merge (m, l) across the warp
            const A m2 = __shfl_xor_sync(0xffffffffu, m, off);
            const A l2 = __shfl_xor_sync(0xffffffffu, l, off);
            const A M = m2 > m ? m2 : m;
            A nl = (M == neg_inf<A>()) ? A(0) : l * exp(m - M) + l2 * exp(m2 - M);
            if (l != l || l2 != l2) nl = l != l ? l : l2;
            m = M;
            l = nl;
        }
        const A row_lse = e1 > e0 ? m + log(l) : neg_inf<A>();
        if (lane == 0) lse[row * H + h] = row_lse;
        for (i64 e = e0 + lane; e < e1; e += 32) {
            const i64 ce = (i64)cid[e];
            const A s = value_traits<T>::to_acc(scores[ce * H + h]);
            out[ce * H + h] = value_traits<T>::from_acc(exp(s - row_lse) *
                                                        (A)drop_factor(drop, ce, H, h));
        }
    }
}

// grad_s = p (g z - sum_row p g z), p = exp(s - lse) (warp per row).
template <typename T, typename I>
__global__ void softmax_bwd(const I* __restrict__ indptr, const I* __restrict__ cid,
                            const T* __restrict__ scores,
                            const typename value_traits<T>::acc_t* __restrict__ lse,
                            const T* __restrict__ grad, T* __restrict__ grad_scores,
                            i64 num_rows, int H, DROP_PARAMS) {
    DROP_MAKE
    typedef typename value_traits<T>::acc_t A;
    const i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (row >= num_rows) return;
    const int lane = threadIdx.x & 31;
    const i64 e0 = (i64)indptr[row], e1 = (i64)indptr[row + 1];
    for (int h = 0; h < H; ++h) {
        const A row_lse = lse[row * H + h];
        A dot = A(0);
        for (i64 e = e0 + lane; e < e1; e += 32) {
            const i64 ce = (i64)cid[e];
            const A p = exp(value_traits<T>::to_acc(scores[ce * H + h]) - row_lse);
            dot += p * value_traits<T>::to_acc(grad[ce * H + h]) * (A)drop_factor(drop, ce, H, h);
        }
        dot = group_sum(dot, 32);
        for (i64 e = e0 + lane; e < e1; e += 32) {
            const i64 ce = (i64)cid[e];
            const A p = exp(value_traits<T>::to_acc(scores[ce * H + h]) - row_lse);
            const A gz = value_traits<T>::to_acc(grad[ce * H + h]) * (A)drop_factor(drop, ce, H, h);
            grad_scores[ce * H + h] = value_traits<T>::from_acc(p * (gz - dot));
        }
    }
}
