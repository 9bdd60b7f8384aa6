// Reduction family kernels: several neighbour reductions in one pass
// (sum, mean, max, min, var, std, any subset), one fused pass building the
// backward coefficients, and one fused backward pass (no atomics); opt-in
// (deterministic=False), the max/min backward terms by float atomics over the
// targets instead (segment_arg_scatter).
//
// Forward mapping: the task list of spmm.cu (rows cut into tasks of at most
// `chunk` edges; hubs split, their partial states merged in slot order by
// segment_combine: deterministic, no atomics). A group of `group` lanes per
// (task, feature slice) (grid y over slices of `fslice` features, as in
// spmm.cu); lane l owns features [f0, f0 + VEC), f0 = slice start + l*VEC +
// k*group*VEC.
// Each neighbour row slice is read ONCE (one VEC-wide load, four gathers in
// flight) and feeds the statistics of the compile-time set STATS (sum, sum
// of squares, max + arg, min + arg, product of the nonzero values + zero
// count for mul). An arg is the position of the winning
// edge within its row (e - indptr[row]), stored in the position type P:
// uint8 when every row has fewer than 256 edges, uint16 below 65536 (all
// ones: empty row), else the index type I (-1: empty row); registers hold
// it in I. The
// launcher picks the smallest instantiated STATS covering the
// request (SEGMENT_STATS in loader.py), plus STAT_NOARG when no args are
// asked for (inference: no positions tracked, fp32 VEC 4 max 46 -> 40
// registers, mean+max+min+std 64 -> 56; H200 rmat20 F=128 inference forward
// max fp32 1.62 -> 1.41 ms, mean+max+min+std 2.87 -> 2.50, bf16 1.48 -> 1.28
// and 3.00 -> 2.42; max/min by max.NaN / min.NaN where faster, SEG_NAN_OP
// below); the epilogue
// writes only the requested reductions (`codes`) as VEC-wide stores into their blocks of the
// [num_rows, R*F] output, the args when asked (training), and the mean / std
// residuals of the backward (acc_t) when asked.
//
// Forward traffic per task of n edges: n*sizeof(I) + n*F*sizeof(T) gathered,
// R*F*sizeof(T) written, + F*sizeof(P) per arg array and F*sizeof(acc_t) per
// residual when training; split rows write their partial states (only the
// statistics of STATS, args as P) once.
//
// Reductions are coded 0 sum, 1 mean, 2 max, 3 min, 4 var, 5 std, 6 mul,
// packed 3 bits each in `codes` (reduction r at bits 3r..3r+2). Semantics
// follow PyG: empty rows give 0 (mul 1); var = mean(x^2) - mean(x)^2; std =
// sqrt(max(var, 1e-5)), 0 where that is <= sqrt(1e-5); max/min ties go to the
// first CSR position, NaN propagates; mul = the nonzero product times 0 after
// a zero (a -0.0 input gives +0.0 where a running product would keep its sign).
//
// rmat20 (1M rows, 16.1M edges, max in-degree 39764), F=128, fp32, max with
// args: P = uint16 halves the arg bytes: 256 MB written by the forward
// instead of 512 MB, and 256 B read per edge by the backward instead of 512 B;
// uniform20 (max in-degree 40): P = uint8, 128 MB and 128 B.

#include "common.cuh"

#define STAT_SUM 1
#define STAT_SQ 2
#define STAT_MAX 4
#define STAT_MIN 8
// Flag on top of the statistic bits: the forward tracks no max/min positions
// (inference: no args asked for). The values and the merge of split rows are
// the same; split rows store position 0 as their partials' "has a value" mark.
#define STAT_NOARG 16
// product of the nonzero values and the count of zeros (mul)
#define STAT_PROD 32
#define STAT_BITS(STATS) ((STATS) & ~STAT_NOARG)

// Occupancy and edges in flight: fixed at the values that were fastest on an
// H200 (rmat20, F = 128; fwd / bwd ms against the alternatives):
//   segment_fwd of several statistics asks for SEG_FWD_MIN_BLOCKS = 4 blocks
//     of 256 threads per multiprocessor (<= 64 registers, spill-free) with
//     4-byte accumulators and indices and VEC <= 4 (mean+max+min+std fp32
//     4.40 -> 4.00; bf16's 8-wide vectors would spill); one statistic at
//     VEC = 4 asks for SEG_FWD_MIN_BLOCKS_ONE = 5 (max fp32 1.78 -> 1.66),
//     at narrower vectors for 4 (5 would spill); __launch_bounds__(256, 1)
//     where SEG_CAPPED does not hold;
//   segment_fwd starts each task's statistics from its first edge
//     (seg_state::add<true>), so later edges need no "no value yet" test
//     (beats_max/beats_min: two compares): mean+max+min+std fp32 fwd 4.10
//     -> 2.90 ms, bf16 3.78 -> 3.02, max 1.85 -> 1.78;
//   segment_fwd keeps SEG_FWD_UNROLL = 4 row gathers in flight per lane
//     (max fp32 fwd 5.0 -> 3.8 ms against one at a time);
//   segment_bwd steps one edge at a time (UNROLL = 1, against 2-4
//     edges in flight as registers allowed): max fp32 2.81 -> 2.07,
//     bf16 2.70 -> 1.93, the 4-reduction backward fp32 11.9 -> 7.7. On a
//     graph whose rows stay in L2 the walk waits on latency instead, and
//     keeping SEG_BWD_WIDE_UNROLL edges in flight may pay: the arg-only
//     walk (LIN = 0, NARG = 1) is also instantiated so, and the launcher
//     times the two on the first call (segment.py, BwdPlan); its
//     several-term instantiations (LIN + NARG > 1) run as
//     segment_bwd_capped, which asks for SEG_BWD_MIN_BLOCKS = 4 blocks where
//     SEG_CAPPED holds (fp32 4-reduction 7.70 -> 7.63), while a single term
//     stays without launch bounds (with them max fp32 is 2.44).
#define SEG_FWD_MIN_BLOCKS 4
#define SEG_BWD_MIN_BLOCKS 4
#define SEG_FWD_UNROLL 4
#define SEG_BWD_WIDE_UNROLL 4
// (the cap only where it fits without spills: 4-byte accumulators and
// indices, VEC <= 4; the compile check guards it)
#define SEG_CAPPED(T, I, VEC) \
    (sizeof(typename value_traits<T>::acc_t) == 4 && sizeof(I) == 4 && VEC <= 4)
#define SEG_FWD_MIN_BLOCKS_ONE 5
// STATS holds a single statistic (one bit of sum, sum of squares, max, min)
#define SEG_ONE_STAT(STATS) ((STAT_BITS(STATS) & (STAT_BITS(STATS) - 1)) == 0)
#define SEG_FWD_BOUNDS                                                                      \
    __launch_bounds__(256, !SEG_CAPPED(T, I, VEC) || ((STATS) & STAT_PROD) ? 1                  \
                           : (VEC == 4 && SEG_ONE_STAT(STATS) && !SEG_NAN_OP(T, STATS))    \
                               ? SEG_FWD_MIN_BLOCKS_ONE : SEG_FWD_MIN_BLOCKS)

// A stored position (P) back in the index type: P's all-ones value (-1 for a
// signed P) is "no edge".
template <typename I, typename P>
__device__ __forceinline__ I from_pos(P p) {
    return p == (P)-1 ? I(-1) : I(p);
}

// v replaces the running max m (PyG: NaN wins and stays; ties keep the
// first): !(v <= m) is v > m or a NaN on either side, and m == m keeps a NaN
// m. Two compares (one predicate-chained) where the spelled-out
// v > m || (v != v && m == m) took more.
template <typename A>
__device__ __forceinline__ bool beats_max(A v, A m) {
    return !(v <= m) && m == m;
}

template <typename A>
__device__ __forceinline__ bool beats_min(A v, A m) {
    return !(v >= m) && m == m;
}

// The inference forward (no positions) keeps only the running max/min
// value, with PyG's NaN rule (a NaN wins and stays): one PTX max.NaN /
// min.NaN instruction (sm_80+) for fp32 accumulators, where beats_max and a
// select take three; a NaN result is the canonical NaN. Ties need no rule
// without positions. Used where it is faster (SEG_NAN_OP; H200 rmat20 F=128
// inference forward, compares -> max.NaN): mean+max+min+std fp32 2.68 ->
// 2.24 ms, bf16 2.59 -> 2.06, max bf16 1.36 -> 1.22 (those at 4 blocks per
// SM); a single statistic of fp32 values keeps the compares, which fit 40
// registers and 5 blocks where the max.NaN form takes 59 and 4 (max fp32
// 1.51 against 1.64 ms).
#define SEG_NAN_OP(T, STATS)                                                             \
    (((STATS) & STAT_NOARG) && (!SEG_ONE_STAT(STATS) || sizeof(T) < 4))
template <typename A>
__device__ __forceinline__ A max_nan(A m, A v) { return beats_max(v, m) ? v : m; }
template <typename A>
__device__ __forceinline__ A min_nan(A m, A v) { return beats_min(v, m) ? v : m; }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
template <>
__device__ __forceinline__ float max_nan<float>(float m, float v) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(v));
    return r;
}
template <>
__device__ __forceinline__ float min_nan<float>(float m, float v) {
    float r;
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(v));
    return r;
}
#endif

// the same with "no value yet" (arg < 0) taking any v: merging partial states
template <typename A, typename I>
__device__ __forceinline__ bool takes_max(A v, A m, I arg) {
    return arg < 0 || beats_max(v, m);
}

template <typename A, typename I>
__device__ __forceinline__ bool takes_min(A v, A m, I arg) {
    return arg < 0 || beats_min(v, m);
}

// Running statistics of VEC features (only those of STATS are touched; with
// STAT_NOARG no positions).
template <typename A, typename I, int VEC, int STATS>
struct seg_state {
    static constexpr bool ARGS = !(STATS & STAT_NOARG);
    A s[VEC], sq[VEC], mx[VEC], mn[VEC], pr[VEC];
    I amx[VEC], amn[VEC];
    int zc[VEC];

    __device__ __forceinline__ void init() {
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            s[v] = sq[v] = mx[v] = mn[v] = A(0);
            pr[v] = A(1);
            zc[v] = 0;
            amx[v] = amn[v] = I(-1);
        }
    }

    // statistic K (0 sum, 1 sum of squares, 2 max, 3 min, 4 product of the
    // nonzero values, 5 zero count) of the VEC features, for one store
    template <int K>
    __device__ __forceinline__ pack_t<A, VEC> pack() const {
        pack_t<A, VEC> p;
#pragma unroll
        for (int v = 0; v < VEC; ++v)
            p.v[v] = K == 0 ? s[v] : K == 1 ? sq[v] : K == 2 ? mx[v] : K == 3 ? mn[v]
                   : K == 4 ? pr[v] : A(zc[v]);
        return p;
    }

    // mul's value of feature v: the nonzero product, times 0 after a zero
    // (so NaN when that product is inf or NaN, as a product through 0 would be)
    __device__ __forceinline__ A product(int v) const { return zc[v] > 0 ? pr[v] * A(0) : pr[v]; }

    // the positions of statistic K (2 max, 3 min) in the stored type P (-1:
    // all ones); STAT_NOARG: 0, a split row's "has a value" mark
    template <typename P, int K>
    __device__ __forceinline__ pack_t<P, VEC> arg_pack() const {
        pack_t<P, VEC> p;
#pragma unroll
        for (int v = 0; v < VEC; ++v) p.v[v] = ARGS ? (P)(K == 2 ? amx[v] : amn[v]) : P(0);
        return p;
    }

    // fold one value (position e within the row) of feature v; FIRST: the
    // task's first edge, which starts the statistics of STATS (so later
    // edges need no "no value yet" test; the sum as 0 + val, so a row of
    // -0.0 sums to +0.0 as from a zeroed accumulator)
    template <bool FIRST, bool NAN_OP = false>
    __device__ __forceinline__ void add(int v, A val, I e) {
        if (FIRST) {
            if (STATS & STAT_SUM) s[v] = A(0) + val;
            if (STATS & STAT_SQ) sq[v] = val * val;
            if (STATS & STAT_MAX) { mx[v] = val; if (ARGS) amx[v] = e; }
            if (STATS & STAT_MIN) { mn[v] = val; if (ARGS) amn[v] = e; }
            if (STATS & STAT_PROD) { pr[v] = val != A(0) ? val : A(1); zc[v] = val == A(0); }
            return;
        }
        if (STATS & STAT_SUM) s[v] += val;
        if (STATS & STAT_SQ) sq[v] += val * val;
        if (STATS & STAT_PROD) {
            if (val == A(0)) ++zc[v];
            else pr[v] *= val;                  // a NaN stays
        }
        if (NAN_OP) {
            if (STATS & STAT_MAX) mx[v] = max_nan(mx[v], val);
            if (STATS & STAT_MIN) mn[v] = min_nan(mn[v], val);
            return;
        }
        if ((STATS & STAT_MAX) && beats_max(val, mx[v])) { mx[v] = val; if (ARGS) amx[v] = e; }
        if ((STATS & STAT_MIN) && beats_min(val, mn[v])) { mn[v] = val; if (ARGS) amn[v] = e; }
    }

    // U consecutive edges from CSR position e of the row starting at rb: U
    // gathers in flight, then the updates in edge order (ties keep the
    // first); FIRST (U = 1): the task's first edge
    template <typename T, int U, bool FIRST = false>
    __device__ __forceinline__ void gather(const I* __restrict__ indices, const T* __restrict__ x,
                                           int F, int f0, i64 e, i64 rb) {
        i64 j[U];
        pack_t<T, VEC> p[U];
#pragma unroll
        for (int u = 0; u < U; ++u) j[u] = (i64)indices[e + u];
#pragma unroll
        for (int u = 0; u < U; ++u) p[u] = load_pack<T, VEC>(x + j[u] * F + f0);
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int v = 0; v < VEC; ++v)
                add<FIRST, SEG_NAN_OP(T, STATS)>(v, value_traits<T>::to_acc(p[u].v[v]),
                                                 (I)(e + u - rb));
    }
};

// Final values of the requested reductions for features [f0, f0 + VEC) of
// one row, as VEC-wide stores; plus the backward's residuals (acc_t,
// [num_rows, F]) where those pointers are set: mean / std, and for mul the
// product and what a zero input's gradient is scaled by (the product of
// the others for the row's only zero, else the product again).
template <typename T, typename I, int VEC, int STATS>
__device__ __forceinline__ void write_reductions(
        const seg_state<typename value_traits<T>::acc_t, I, VEC, STATS>& st,
        T* __restrict__ out, typename value_traits<T>::acc_t* __restrict__ res_mean,
        typename value_traits<T>::acc_t* __restrict__ res_std,
        typename value_traits<T>::acc_t* __restrict__ res_mul,
        typename value_traits<T>::acc_t* __restrict__ res_mul_zero,
        i64 row, int f0, int F, int num_codes, int codes, i64 deg) {
    typedef typename value_traits<T>::acc_t A;
    const A inv = deg > 0 ? A(1) / A(deg) : A(0);
    const A eps = A(1e-5);
    pack_t<A, VEC> mean, var, sd;
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
        mean.v[v] = st.s[v] * inv;
        var.v[v] = sd.v[v] = A(0);
        if (STATS & STAT_SQ) {
            var.v[v] = st.sq[v] * inv - mean.v[v] * mean.v[v];
            sd.v[v] = sqrt(var.v[v] < eps ? eps : var.v[v]);   // NaN stays NaN, as torch.clamp
            if (sd.v[v] <= sqrt(eps)) sd.v[v] = A(0);
        }
    }
    const i64 base = row * (i64)num_codes * F + f0;
    for (int r = 0; r < num_codes; ++r) {
        const int code = (codes >> (3 * r)) & 7;
        pack_t<T, VEC> o;
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            A val;
            if (code == 0) val = st.s[v];
            else if (code == 1) val = mean.v[v];
            else if (code == 2) val = deg > 0 ? st.mx[v] : A(0);
            else if (code == 3) val = deg > 0 ? st.mn[v] : A(0);
            else if (code == 4) val = var.v[v];
            else if (code == 5) val = sd.v[v];
            else val = deg > 0 ? st.product(v) : A(1);       // mul: PyG starts from ones
            o.v[v] = value_traits<T>::from_acc(val);
        }
        store_pack<T, VEC>(out + base + (i64)r * F, o);
    }
    if (STATS & STAT_SQ) {
        if (res_mean != nullptr) store_pack<A, VEC>(res_mean + row * F + f0, mean);
        if (res_std != nullptr) store_pack<A, VEC>(res_std + row * F + f0, sd);
    }
    if ((STATS & STAT_PROD) && res_mul != nullptr) {
        pack_t<A, VEC> p, pz;
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            p.v[v] = st.product(v);
            pz.v[v] = st.zc[v] == 1 ? st.pr[v] : p.v[v];
        }
        store_pack<A, VEC>(res_mul + row * F + f0, p);
        store_pack<A, VEC>(res_mul_zero + row * F + f0, pz);
    }
}

template <typename T, typename I, int VEC, int STATS, typename P>
__global__ void SEG_FWD_BOUNDS segment_fwd(const I* __restrict__ task_row, const I* __restrict__ task_begin,
                            const I* __restrict__ task_slot, const I* __restrict__ indptr,
                            const I* __restrict__ indices,
                            const T* __restrict__ x,          // [num_cols, F]
                            T* __restrict__ out,              // [num_rows, R*F]
                            P* __restrict__ argmax,           // [num_rows, F] or null
                            P* __restrict__ argmin,           // [num_rows, F] or null
                            typename value_traits<T>::acc_t* __restrict__ res_mean,  // [num_rows, F] or null
                            typename value_traits<T>::acc_t* __restrict__ res_std,   // [num_rows, F] or null
                            typename value_traits<T>::acc_t* __restrict__ res_mul,   // [num_rows, F] or null
                            typename value_traits<T>::acc_t* __restrict__ res_mul_zero,
                            typename value_traits<T>::acc_t* __restrict__ p_sum,  // [slots, F] x6
                            typename value_traits<T>::acc_t* __restrict__ p_sq,   // (those of STATS)
                            typename value_traits<T>::acc_t* __restrict__ p_max,
                            typename value_traits<T>::acc_t* __restrict__ p_min,
                            typename value_traits<T>::acc_t* __restrict__ p_prod,
                            typename value_traits<T>::acc_t* __restrict__ p_zc,
                            P* __restrict__ p_argmax, P* __restrict__ p_argmin,   // [slots, F]
                            i64 num_tasks, int F, int chunk, int group, int num_codes,
                            int codes, int fslice) {
    typedef typename value_traits<T>::acc_t A;
    const i64 t = group_index(group);
    if (t >= num_tasks) return;
    const int lane = group_lane(group);
    i64 row, e0, e1;
    task_range(task_row, task_begin, indptr, t, chunk, row, e0, e1);
    const i64 slot = (i64)task_slot[t];
    const i64 rb = (i64)indptr[row];
    const int f_end = slice_end(fslice, F);

    for (int f0 = slice_begin(fslice) + lane * VEC; f0 < f_end; f0 += group * VEC) {
        seg_state<A, I, VEC, STATS> st;
        st.init();                      // what an empty task keeps (args -1)
        i64 e = e0;
        // max/min: the first edge starts the statistics (sums start from 0 anyway)
        if ((STATS & (STAT_MAX | STAT_MIN)) && e < e1)
            st.template gather<T, 1, true>(indices, x, F, f0, e++, rb);
        for (; e + SEG_FWD_UNROLL <= e1; e += SEG_FWD_UNROLL)
            st.template gather<T, SEG_FWD_UNROLL>(indices, x, F, f0, e, rb);
        for (; e < e1; ++e) st.template gather<T, 1>(indices, x, F, f0, e, rb);
        if (slot < 0) {
            const i64 deg = (i64)indptr[row + 1] - rb;
            write_reductions<T, I, VEC, STATS>(st, out, res_mean, res_std, res_mul, res_mul_zero,
                                               row, f0, F, num_codes, codes, deg);
            const i64 k = row * F + f0;
            if ((STATS & STAT_MAX) && argmax != nullptr) store_pack<P, VEC>(argmax + k, st.template arg_pack<P, 2>());
            if ((STATS & STAT_MIN) && argmin != nullptr) store_pack<P, VEC>(argmin + k, st.template arg_pack<P, 3>());
        } else {
            const i64 k = slot * F + f0;
            if (STATS & STAT_SUM) store_pack<A, VEC>(p_sum + k, st.template pack<0>());
            if (STATS & STAT_SQ) store_pack<A, VEC>(p_sq + k, st.template pack<1>());
            if (STATS & STAT_MAX) {
                store_pack<A, VEC>(p_max + k, st.template pack<2>());
                store_pack<P, VEC>(p_argmax + k, st.template arg_pack<P, 2>());
            }
            if (STATS & STAT_MIN) {
                store_pack<A, VEC>(p_min + k, st.template pack<3>());
                store_pack<P, VEC>(p_argmin + k, st.template arg_pack<P, 3>());
            }
            if (STATS & STAT_PROD) {
                store_pack<A, VEC>(p_prod + k, st.template pack<4>());
                store_pack<A, VEC>(p_zc + k, st.template pack<5>());
            }
        }
    }
}

// Merge the partial states of each split row in slot order, then write its
// reductions. Mapping: a lane group per split row, lane l owns features
// [f0, f0 + VEC) as in segment_fwd (same VEC and group). The partial states
// of U slots are loaded (VEC-wide, every statistic) before they are folded
// in slot order, so the critical path, the largest hub, is slots/U rounds of
// dependent loads instead of slots x F/group x 2 (rmat20: 156 slots).
// `stats` is the STATS of the segment_fwd instantiation that wrote them.
// Traffic per split row: slots x F x (sizeof(acc_t) per statistic + sizeof(I)
// per arg) read; R*F*sizeof(T), the args and the residuals written.
template <typename T, typename I, int VEC, typename P>
__global__ void segment_combine(const I* __restrict__ split_row, const I* __restrict__ slot_ptr,
                                const I* __restrict__ indptr,
                                const typename value_traits<T>::acc_t* __restrict__ p_sum,  // [slots, F]
                                const typename value_traits<T>::acc_t* __restrict__ p_sq,
                                const typename value_traits<T>::acc_t* __restrict__ p_max,
                                const typename value_traits<T>::acc_t* __restrict__ p_min,
                                const typename value_traits<T>::acc_t* __restrict__ p_prod,
                                const typename value_traits<T>::acc_t* __restrict__ p_zc,
                                const P* __restrict__ p_argmax, const P* __restrict__ p_argmin,
                                T* __restrict__ out,                                       // [num_rows, R*F]
                                P* __restrict__ argmax, P* __restrict__ argmin,            // [num_rows, F] or null
                                typename value_traits<T>::acc_t* __restrict__ res_mean,
                                typename value_traits<T>::acc_t* __restrict__ res_std,
                                typename value_traits<T>::acc_t* __restrict__ res_mul,
                                typename value_traits<T>::acc_t* __restrict__ res_mul_zero,
                                i64 num_split, int F, int group, int stats, int num_codes,
                                int codes) {
    typedef typename value_traits<T>::acc_t A;
    // slots in flight: about 100 registers of loaded partial state per lane
    constexpr int U = VEC * (int)sizeof(A) <= 16 ? 4 : 2;
    const i64 sidx = group_index(group);
    if (sidx >= num_split) return;
    const int lane = group_lane(group);
    const i64 row = (i64)split_row[sidx];
    const i64 k0 = (i64)slot_ptr[sidx], k1 = (i64)slot_ptr[sidx + 1];
    const i64 deg = (i64)indptr[row + 1] - (i64)indptr[row];
    const bool has_sum = stats & STAT_SUM, has_sq = stats & STAT_SQ;
    const bool has_max = stats & STAT_MAX, has_min = stats & STAT_MIN;
    const bool has_prod = stats & STAT_PROD;
    for (int f0 = lane * VEC; f0 < F; f0 += group * VEC) {
        seg_state<A, I, VEC, STAT_SUM | STAT_SQ | STAT_MAX | STAT_MIN | STAT_PROD> st;
        st.init();
        i64 k = k0;
        while (k < k1) {
            const int n = k + U <= k1 ? U : 1;   // full steps, then one slot at a time
            pack_t<A, VEC> ps[U], pq[U], pmx[U], pmn[U], ppr[U], pzc[U];
            pack_t<P, VEC> pax[U], pan[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (u < n) {
                    const i64 q = (k + u) * F + f0;
                    if (has_sum) ps[u] = load_pack<A, VEC>(p_sum + q);
                    if (has_sq) pq[u] = load_pack<A, VEC>(p_sq + q);
                    if (has_max) { pmx[u] = load_pack<A, VEC>(p_max + q); pax[u] = load_pack<P, VEC>(p_argmax + q); }
                    if (has_min) { pmn[u] = load_pack<A, VEC>(p_min + q); pan[u] = load_pack<P, VEC>(p_argmin + q); }
                    if (has_prod) { ppr[u] = load_pack<A, VEC>(p_prod + q); pzc[u] = load_pack<A, VEC>(p_zc + q); }
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (u < n) {
#pragma unroll
                    for (int v = 0; v < VEC; ++v) {
                        if (has_sum) st.s[v] += ps[u].v[v];
                        if (has_sq) st.sq[v] += pq[u].v[v];
                        if (has_prod) {
                            st.pr[v] *= ppr[u].v[v];
                            st.zc[v] += (int)pzc[u].v[v];
                        }
                        // a later slot wins only by a strictly larger value (or the first
                        // NaN): ties keep the earlier CSR position
                        const I ax = from_pos<I>(pax[u].v[v]), an = from_pos<I>(pan[u].v[v]);
                        if (has_max && ax >= 0 && takes_max(pmx[u].v[v], st.mx[v], st.amx[v])) {
                            st.mx[v] = pmx[u].v[v];
                            st.amx[v] = ax;
                        }
                        if (has_min && an >= 0 && takes_min(pmn[u].v[v], st.mn[v], st.amn[v])) {
                            st.mn[v] = pmn[u].v[v];
                            st.amn[v] = an;
                        }
                    }
                }
            }
            k += n;
        }
        write_reductions<T, I, VEC>(st, out, res_mean, res_std, res_mul, res_mul_zero, row, f0, F,
                                    num_codes, codes, deg);
        if (argmax != nullptr) store_pack<P, VEC>(argmax + row * F + f0, st.template arg_pack<P, 2>());
        if (argmin != nullptr) store_pack<P, VEC>(argmin + row * F + f0, st.template arg_pack<P, 3>());
    }
}

// Backward coefficients of the linear reductions, one pass over the cotangent
// (see fastgnn/ops/segment.py): for each (row i, feature f), from the block
// g_r of every requested reduction r, d_i = deg_in(i), m = mean, s = std:
//   sum: a += g   mean: a += g/d   var: a += -2 g m/d, b += 2 g/d
//   std: as var with g * 0.5/s (0 where s == 0)
//   mul: c = g * mul_out, d = g * mul_zero (the forward's mul residuals)
// Mapping: one thread per (row, feature). Traffic per element: R reads of T,
// the mean/std/mul residuals (acc_t) when var/std/mul are requested, 1-4
// acc_t writes.
template <typename T, typename I>
__global__ void segment_coef(const I* __restrict__ indptr,
                             const T* __restrict__ g,          // [num_rows, R*F]
                             const typename value_traits<T>::acc_t* __restrict__ mean,  // [num_rows, F] or null
                             const typename value_traits<T>::acc_t* __restrict__ sd,    // [num_rows, F] or null
                             const typename value_traits<T>::acc_t* __restrict__ mul_out,   // [num_rows, F] or null
                             const typename value_traits<T>::acc_t* __restrict__ mul_zero,  // [num_rows, F] or null
                             typename value_traits<T>::acc_t* __restrict__ coef_a,     // [num_rows, F] or null
                             typename value_traits<T>::acc_t* __restrict__ coef_b,     // [num_rows, F] or null
                             typename value_traits<T>::acc_t* __restrict__ coef_c,     // [num_rows, F] or null
                             typename value_traits<T>::acc_t* __restrict__ coef_d,     // [num_rows, F] or null
                             i64 num_rows, int F, int num_codes, int codes) {
    typedef typename value_traits<T>::acc_t A;
    const i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= num_rows * F) return;
    const i64 row = k / F;
    const int f = (int)(k - row * F);
    const i64 deg = (i64)indptr[row + 1] - (i64)indptr[row];
    const A inv = deg > 0 ? A(1) / A(deg) : A(0);
    A a = A(0), b = A(0);
    for (int r = 0; r < num_codes; ++r) {
        const int code = (codes >> (3 * r)) & 7;
        if (code == 2 || code == 3) continue;     // max/min: read by segment_bwd itself
        A gv = value_traits<T>::to_acc(g[row * (i64)num_codes * F + (i64)r * F + f]);
        if (code == 6) {
            coef_c[k] = gv * mul_out[k];
            coef_d[k] = gv * mul_zero[k];
        } else if (code == 0) a += gv;
        else if (code == 1) a += gv * inv;
        else {
            if (code == 5) {
                const A s = sd[k];
                gv = s != A(0) ? gv * A(0.5) / s : A(0);   // NaN std keeps its NaN gradient
            }
            const A gi = gv * inv;
            a += A(-2) * gi * mean[k];
            b += A(2) * gi;
        }
    }
    if (coef_a != nullptr) coef_a[k] = a;
    if (coef_b != nullptr) coef_b[k] = b;
}

// grad_x[j,f] = sum_{e=(j->i)} coef_a[i,f] + coef_b[i,f]*x[j,f]
//               + [arg0[i,f] == p_e] g0[i,f] + [arg1[i,f] == p_e] g1[i,f]
//               + (coef_c[i,f] / x[j,f] where x[j,f] != 0, else coef_d[i,f])
// (arg0/g0, arg1/g1: the argmax / argmin positions and the max / min blocks
// of the cotangent, row stride ldg; p_e = e - indptr[i], the position of e
// in its forward row). Walks the transpose: tasks over source rows j,
// `t_indices` = targets i, `t_pos` = p_e (type P as the args, cached per
// graph, read only with arg terms); same lane mapping as the forward. LIN (0: no linear term, 1: coef_a, 2: coef_a
// and coef_b, 3: those and mul's coef_c / coef_d, summed apart and divided
// by x[j] once at the end; coef_d is read only by lanes holding a zero of
// x[j]) and NARG (arg terms, 0-2) are compile-time upper bounds; a null
// pointer switches a term off at run time (uniform branch). Split source rows
// write fp32 partials (combined by spmm_combine). `addend` (acc_t, [num_cols_fwd,
// F], or null): sums added to row j before the single rounding to T, by the
// row's first task only (e0 == t_indptr[j]): the deterministic=False backward
// of a 16-bit multi-reduction passes the max/min terms scattered by
// segment_arg_scatter there (NARG = 0), a caller's addend (segment_reduce_bwd)
// arrives there, 1 acc_t row read per source row. For float/double addend may
// be grad_x itself (no __restrict__ on either): each element is read once, by
// the thread that later stores it (or, for a split row, before spmm_combine
// runs), and nothing else writes it.
//
// Traffic per edge: sizeof(I) (+ sizeof(P) with arg terms) + F*(LIN*sizeof(acc_t)
// + NARG*sizeof(P)) gathered as VEC-wide loads, UNROLL edges in flight;
// g0/g1 are read only for the features whose arg matches the edge (~1/deg
// of them), so a max backward moves one gathered row of P per edge: with
// P = uint16 half the bytes of the SpMM backward's fp32 row (rmat20, F=128:
// 256 B per edge, 4.1 GB without cache reuse), with uint8 a quarter.
#define SEGMENT_BWD_PARAMS                                                                   \
    const I* __restrict__ task_row, const I* __restrict__ task_begin,                        \
    const I* __restrict__ task_slot, const I* __restrict__ t_indptr,                         \
    const I* __restrict__ t_indices, const P* __restrict__ t_pos,                            \
    const T* __restrict__ x,                                      /* [num_cols_fwd, F] */    \
    const typename value_traits<T>::acc_t* __restrict__ coef_a,   /* [num_rows_fwd, F] */    \
    const typename value_traits<T>::acc_t* __restrict__ coef_b,                              \
    const typename value_traits<T>::acc_t* __restrict__ coef_c,                              \
    const typename value_traits<T>::acc_t* __restrict__ coef_d,                              \
    const P* __restrict__ arg0, const T* __restrict__ g0,   /* [num_rows_fwd, F] / ldg */    \
    const P* __restrict__ arg1, const T* __restrict__ g1,                                    \
    const typename value_traits<T>::acc_t* addend,   /* [num_cols_fwd, F], null, or grad_x */ \
    T* grad_x,                                       /* [num_cols_fwd, F] */                 \
    typename value_traits<T>::acc_t* __restrict__ partial,        /* [slots, F] */           \
    i64 num_tasks, int F, i64 ldg, int chunk, int group
#define SEGMENT_BWD_ARGS                                                                     \
    task_row, task_begin, task_slot, t_indptr, t_indices, t_pos, x, coef_a, coef_b, coef_c,   \
    coef_d, arg0, g0,                                                                         \
    arg1, g1, addend, grad_x, partial, num_tasks, F, ldg, chunk, group

template <typename T, typename I, int VEC, int LIN, int NARG, typename P, int UNROLL>
__device__ __forceinline__ void segment_bwd_body(SEGMENT_BWD_PARAMS) {
    typedef typename value_traits<T>::acc_t A;
    // UNROLL: edges in flight per lane (1, or SEG_BWD_WIDE_UNROLL; see the top)
    const i64 t = group_index(group);
    if (t >= num_tasks) return;
    const int lane = group_lane(group);
    i64 j, e0, e1;
    task_range(task_row, task_begin, t_indptr, t, chunk, j, e0, e1);
    const i64 slot = (i64)task_slot[t];
    const bool has_a = LIN >= 1 && coef_a != nullptr;
    const bool has_b = LIN >= 2 && coef_b != nullptr;
    const bool has_c = LIN >= 3 && coef_c != nullptr;
    const bool has_0 = NARG >= 1 && arg0 != nullptr;
    const bool has_1 = NARG >= 2 && arg1 != nullptr;

    for (int f0 = lane * VEC; f0 < F; f0 += group * VEC) {
        A acc_a[VEC], acc_b[VEC], acc_c[VEC], xv[VEC];
        bool zero_x = false;            // some x[j, f0 + v] is 0: coef_d rows are read
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc_a[v] = acc_b[v] = acc_c[v] = xv[v] = A(0);
        if (LIN >= 3 && (has_b || has_c)) {    // mul instantiations: x[j] before the walk
            const pack_t<T, VEC> xj = load_pack<T, VEC>(x + j * F + f0);
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                xv[v] = value_traits<T>::to_acc(xj.v[v]);
                zero_x = zero_x || (has_c && xv[v] == A(0));
            }
        }
        i64 e = e0;
        while (e < e1) {
            const int n = e + UNROLL <= e1 ? UNROLL : 1;   // full steps, then one edge at a time
            i64 i[UNROLL];
            P pe[UNROLL];
            pack_t<A, VEC> ca[UNROLL], cb[UNROLL], cc[UNROLL], cd[UNROLL];
            pack_t<P, VEC> a0[UNROLL], a1[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (u < n) {
                    i[u] = (i64)t_indices[e + u];
                    if (has_0 || has_1) pe[u] = t_pos[e + u];
                }
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (u < n) {
                    const i64 base = i[u] * F + f0;
                    if (has_a) ca[u] = load_pack<A, VEC>(coef_a + base);
                    if (has_b) cb[u] = load_pack<A, VEC>(coef_b + base);
                    if (has_c) cc[u] = load_pack<A, VEC>(coef_c + base);
                    if (zero_x) cd[u] = load_pack<A, VEC>(coef_d + base);
                    if (has_0) a0[u] = load_pack<P, VEC>(arg0 + base);
                    if (has_1) a1[u] = load_pack<P, VEC>(arg1 + base);
                }
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (u < n) {
#pragma unroll
                    for (int v = 0; v < VEC; ++v) {
                        if (has_a) acc_a[v] += ca[u].v[v];
                        if (has_b) acc_b[v] += cb[u].v[v];
                        if (has_c) acc_c[v] += zero_x && xv[v] == A(0) ? cd[u].v[v] : cc[u].v[v];
                        if (has_0 && a0[u].v[v] == pe[u])
                            acc_a[v] += value_traits<T>::to_acc(g0[i[u] * ldg + f0 + v]);
                        if (has_1 && a1[u].v[v] == pe[u])
                            acc_a[v] += value_traits<T>::to_acc(g1[i[u] * ldg + f0 + v]);
                    }
                }
            }
            e += n;
        }
        A res[VEC];
        if (has_b) {
            if (LIN < 3) {
                const pack_t<T, VEC> xj = load_pack<T, VEC>(x + j * F + f0);
#pragma unroll
                for (int v = 0; v < VEC; ++v) xv[v] = value_traits<T>::to_acc(xj.v[v]);
            }
#pragma unroll
            for (int v = 0; v < VEC; ++v) res[v] = acc_a[v] + acc_b[v] * xv[v];
        } else {
#pragma unroll
            for (int v = 0; v < VEC; ++v) res[v] = acc_a[v];
        }
        if (has_c) {
#pragma unroll
            for (int v = 0; v < VEC; ++v) res[v] += xv[v] != A(0) ? acc_c[v] / xv[v] : acc_c[v];
        }
        if (addend != nullptr && e0 == (i64)t_indptr[j]) {
            const pack_t<A, VEC> ad = load_pack<A, VEC>(addend + j * F + f0);
#pragma unroll
            for (int v = 0; v < VEC; ++v) res[v] += ad.v[v];
        }
        if (slot < 0) {
            pack_t<T, VEC> o;
#pragma unroll
            for (int v = 0; v < VEC; ++v) o.v[v] = value_traits<T>::from_acc(res[v]);
            store_pack<T, VEC>(grad_x + j * F + f0, o);
        } else {
#pragma unroll
            for (int v = 0; v < VEC; ++v) partial[slot * F + f0 + v] = res[v];
        }
    }
}

// The entries: one term without launch bounds, several terms (LIN + NARG >
// 1, loader.segment_bwd_kernel) capped to SEG_BWD_MIN_BLOCKS blocks per
// multiprocessor where SEG_CAPPED holds (__launch_bounds__(256, 1) elsewhere).
template <typename T, typename I, int VEC, int LIN, int NARG, typename P, int UNROLL = 1>
__global__ void segment_bwd(SEGMENT_BWD_PARAMS) {
    segment_bwd_body<T, I, VEC, LIN, NARG, P, UNROLL>(SEGMENT_BWD_ARGS);
}

template <typename T, typename I, int VEC, int LIN, int NARG, typename P>
__global__ void __launch_bounds__(256, SEG_CAPPED(T, I, VEC) && LIN < 3 ? SEG_BWD_MIN_BLOCKS : 1)
segment_bwd_capped(SEGMENT_BWD_PARAMS) {
    segment_bwd_body<T, I, VEC, LIN, NARG, P, 1>(SEGMENT_BWD_ARGS);
}

// The max/min terms of the backward with float atomics (deterministic=False,
// opt-in; segment_bwd's transpose walk is the default): for each target row i
// with edges and feature f,
//   grad[indices[indptr[i] + arg0[i,f]], f] += g0[i,f]     (and arg1 / g1)
// into a zeroed acc_t accumulator (for float/double it may be grad_x holding
// segment_bwd's linear terms already; 16-bit types are cast once afterwards,
// by cast_from_acc or by segment_bwd's addend). args are positions within the
// row in P (uint8, uint16 or I; all ones = no edge, skipped), decoded by from_pos.
// Mapping: one thread per (row, VEC features), rows in order; VEC-wide loads
// of the args and of the cotangent block (row stride ldg); when the VEC
// winners are one source (always for a degree-1 row) one vector atomic (sm_90)
// adds them, else one atomic per feature. Empty rows return before any load.
// No transpose, no per-edge positions.
// Traffic per row of degree > 0 and arg term: F*(sizeof(P) + sizeof(T)) read,
// up to F/VEC indices (the row's own, cached), F atomic adds of acc_t
// (read-modify-write in L2, scattered over the row's sources). rmat20, F=128,
// fp32 max: 256 MB of args and 512 MB of cotangent read, 128M atomic adds,
// instead of segment_bwd's 16.1M x 256 B = 4.1 GB of gathered arg rows.
template <typename T, typename I, int VEC, typename P>
__global__ void segment_arg_scatter(const I* __restrict__ indptr,     // [num_rows + 1]
                                    const I* __restrict__ indices,    // [E] source of each edge
                                    const P* __restrict__ arg0, const T* __restrict__ g0,  // [num_rows, F] / ldg
                                    const P* __restrict__ arg1, const T* __restrict__ g1,  // or null
                                    typename value_traits<T>::acc_t* __restrict__ grad,    // [num_cols, F]
                                    i64 num_rows, int F, i64 ldg) {
    typedef typename value_traits<T>::acc_t A;
    const int per_row = F / VEC;
    const i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= num_rows * per_row) return;
    const i64 row = k / per_row;
    const int f0 = (int)(k - row * per_row) * VEC;
    const i64 rb = (i64)indptr[row];
    if ((i64)indptr[row + 1] == rb) return;            // empty row: contributes nothing
    for (int term = 0; term < 2; ++term) {
        const P* __restrict__ arg = term == 0 ? arg0 : arg1;
        const T* __restrict__ g = term == 0 ? g0 : g1;
        if (arg == nullptr) continue;
        const pack_t<P, VEC> a = load_pack<P, VEC>(arg + row * F + f0);
        const pack_t<T, VEC> gv = load_pack<T, VEC>(g + row * ldg + f0);
        A val[VEC];
        bool one_source = true;
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            val[v] = value_traits<T>::to_acc(gv.v[v]);
            one_source = one_source && a.v[v] == a.v[0];
        }
        if (one_source) {
            const I p = from_pos<I>(a.v[0]);
            if (p >= 0) atomic_add_vec<A, VEC>(grad + (i64)indices[rb + p] * F + f0, val);
        } else {
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                const I p = from_pos<I>(a.v[v]);
                if (p >= 0) atomicAdd(grad + (i64)indices[rb + p] * F + f0 + v, val[v]);
            }
        }
    }
}
