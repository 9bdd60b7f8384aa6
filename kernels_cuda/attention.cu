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
// group per (task, head). Lane l owns channels c = l*VEC + k*group*VEC,
// k < nch (<= NCH, a template parameter: 1 when one pass of the group
// covers the head, else 4), so a head of up to NCH*32*VEC channels sits in
// registers. Per edge the group computes its score (a shuffle reduction for
// gatv2/dot), then updates the running max m, sum l and accumulator. Hub
// rows are split; their (m, l, acc) partials are merged in slot order
// (attn_combine), source-side backward partials by spmm_combine: no atomics.
//
// Traffic per edge and head (forward): the source rows S[j] and V[j] slices
// (C values each; one row for gatv2, whose S and V are both xl), the edge term
// if any, the index and caller id; Dn[i] and att are loaded once per task.
// The backward target pass adds g[i] (once per task) and writes per-edge
// gradients; the source pass gathers Dn[i], g[i], lse and delta per edge.

#include "common.cuh"

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

template <typename A>
__device__ __forceinline__ A lrelu(A u, A slope) { return u > A(0) ? u : slope * u; }

template <typename A>
__device__ __forceinline__ A lrelu_grad(A u, A slope) { return u > A(0) ? A(1) : slope; }

template <typename T, int VEC>
__device__ __forceinline__ void load_acc(const T* __restrict__ p, typename value_traits<T>::acc_t* r) {
    const pack_t<T, VEC> v = load_pack<T, VEC>(p);
#pragma unroll
    for (int q = 0; q < VEC; ++q) r[q] = value_traits<T>::to_acc(v.v[q]);
}

// Per-(task, head) register state shared by every kernel: where the lane's
// channels are and the target-side values cached for the task.
template <typename T, int VEC>
struct Lanes {
    typedef typename value_traits<T>::acc_t A;
    int lane, group, nch, C;
    __device__ __forceinline__ int chan(int k) const { return (lane + k * group) * VEC; }
    __device__ __forceinline__ bool has(int k) const { return k < nch && chan(k) < C; }
};

// Score of edge (j -> i, caller id ce), head h. dreg: Dn[i] slice (gatv2/dot)
// or Dn[i, h, 0] in dreg[0][0] (gat); areg: att slice (gatv2).
template <int KIND, typename T, int VEC, int NCH>
__device__ __forceinline__ typename value_traits<T>::acc_t edge_score(
        const Lanes<T, VEC>& L, const T* __restrict__ S, const T* __restrict__ Ed, bool has_e,
        i64 j, i64 ce, int h, int H, const typename value_traits<T>::acc_t (*dreg)[VEC],
        const typename value_traits<T>::acc_t (*areg)[VEC], typename value_traits<T>::acc_t slope,
        typename value_traits<T>::acc_t scale) {
    typedef typename value_traits<T>::acc_t A;
    if (KIND == KIND_GAT) {
        A u = value_traits<T>::to_acc(S[j * H + h]) + dreg[0][0];
        if (has_e) u += value_traits<T>::to_acc(Ed[ce * H + h]);
        return lrelu(u, slope);
    }
    A part = A(0);
#pragma unroll
    for (int k = 0; k < NCH; ++k) {
        if (!L.has(k)) continue;
        const int c0 = L.chan(k);
        A sv[VEC], ev[VEC];
        load_acc<T, VEC>(S + (j * H + h) * (i64)L.C + c0, sv);
        if (has_e) load_acc<T, VEC>(Ed + (ce * H + h) * (i64)L.C + c0, ev);
#pragma unroll
        for (int q = 0; q < VEC; ++q) {
            const A e = has_e ? ev[q] : A(0);
            if (KIND == KIND_GATV2) part += areg[k][q] * lrelu(sv[q] + dreg[k][q] + e, slope);
            else part += dreg[k][q] * (sv[q] + e);
        }
    }
    part = group_sum(part, L.group);
    return KIND == KIND_DOT ? part * scale : part;
}

// Message slice of edge (j, ce): V[j] (+ Ed[ce] for "dot").
template <int KIND, typename T, int VEC>
__device__ __forceinline__ void edge_message(const Lanes<T, VEC>& L, const T* __restrict__ V,
                                             const T* __restrict__ Ed, bool has_e, i64 j, i64 ce,
                                             int h, int H, int k,
                                             typename value_traits<T>::acc_t* m) {
    typedef typename value_traits<T>::acc_t A;
    const int c0 = L.chan(k);
    load_acc<T, VEC>(V + (j * H + h) * (i64)L.C + c0, m);
    if (KIND == KIND_DOT && has_e) {
        A ev[VEC];
        load_acc<T, VEC>(Ed + (ce * H + h) * (i64)L.C + c0, ev);
#pragma unroll
        for (int q = 0; q < VEC; ++q) m[q] += ev[q];
    }
}

// Target-side registers of task row i: Dn slice (or scalar) and att slice.
template <int KIND, typename T, int VEC, int NCH>
__device__ __forceinline__ void load_target(const Lanes<T, VEC>& L, const T* __restrict__ Dn,
                                            const T* __restrict__ att, i64 i, int h, int H,
                                            typename value_traits<T>::acc_t (*dreg)[VEC],
                                            typename value_traits<T>::acc_t (*areg)[VEC]) {
    typedef typename value_traits<T>::acc_t A;
    if (KIND == KIND_GAT) {
        dreg[0][0] = value_traits<T>::to_acc(Dn[i * H + h]);
        return;
    }
#pragma unroll
    for (int k = 0; k < NCH; ++k) {
        if (!L.has(k)) continue;
        load_acc<T, VEC>(Dn + (i * H + h) * (i64)L.C + L.chan(k), dreg[k]);
        if (KIND == KIND_GATV2) load_acc<T, VEC>(att + (i64)h * L.C + L.chan(k), areg[k]);
    }
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

#define GROUP_PROLOGUE                                                              \
    const i64 gid = group_index(group);                                             \
    const i64 t = gid / H;                                                          \
    const int h = (int)(gid % H);                                                   \
    if (t >= num_tasks) return;                                                     \
    Lanes<T, VEC> L;                                                                \
    L.lane = group_lane(group);                                                     \
    L.group = group;                                                                \
    L.nch = nch;                                                                    \
    L.C = C;                                                                        \
    i64 row, e0, e1;                                                                \
    task_range(task_row, task_begin, indptr, t, chunk, row, e0, e1);

// Forward. alpha_mode = 0: online softmax; direct rows write out[i] and
// lse[i], split rows their (m, l, acc) partials. alpha_mode = 1: with lse
// known, write alpha[ce, h] = exp(s - lse[i, h]).
template <int KIND, typename T, typename I, int VEC, int NCH>
__global__ void attn_fwd(const I* __restrict__ task_row, const I* __restrict__ task_begin,
                         const I* __restrict__ task_slot, const I* __restrict__ indptr,
                         const I* __restrict__ indices, const I* __restrict__ cid,
                         const T* __restrict__ S, const T* __restrict__ Dn,
                         const T* __restrict__ Ed, const T* __restrict__ att,
                         const T* __restrict__ V,
                         T* __restrict__ out,                                   // [num_dst, H, C]
                         typename value_traits<T>::acc_t* __restrict__ lse,     // [num_dst, H]
                         T* __restrict__ alpha,                                 // [E, H] or null
                         typename value_traits<T>::acc_t* __restrict__ p_m,     // [slots, H]
                         typename value_traits<T>::acc_t* __restrict__ p_l,     // [slots, H]
                         typename value_traits<T>::acc_t* __restrict__ p_acc,   // [slots, H, C]
                         i64 num_tasks, int H, int C, int nch, int chunk, int group, int has_e,
                         typename value_traits<T>::acc_t slope,
                         typename value_traits<T>::acc_t scale, DROP_PARAMS, int alpha_mode) {
    DROP_MAKE
    typedef typename value_traits<T>::acc_t A;
    GROUP_PROLOGUE
    A dreg[NCH][VEC], areg[NCH][VEC], acc[NCH][VEC];
    load_target<KIND, T, VEC, NCH>(L, Dn, att, row, h, H, dreg, areg);
#pragma unroll
    for (int k = 0; k < NCH; ++k)
#pragma unroll
        for (int q = 0; q < VEC; ++q) acc[k][q] = A(0);
    const A row_lse = alpha_mode ? lse[row * H + h] : A(0);
    A m = neg_inf<A>(), l = A(0);
    for (i64 e = e0; e < e1; ++e) {
        const i64 j = (i64)indices[e];
        const i64 ce = (i64)cid[e];
        const A s = edge_score<KIND, T, VEC, NCH>(L, S, Ed, has_e, j, ce, h, H, dreg, areg, slope,
                                             scale);
        if (alpha_mode) {
            if (L.lane == 0) alpha[ce * H + h] = value_traits<T>::from_acc(exp(s - row_lse));
            continue;
        }
        A w;
        if (s > m) {                       // new running max: rescale what we have
            const A corr = exp(m - s);
            l = l * corr + A(1);
#pragma unroll
            for (int k = 0; k < NCH; ++k)
#pragma unroll
                for (int q = 0; q < VEC; ++q) acc[k][q] *= corr;
            m = s;
            w = A(1);
        } else if (s > neg_inf<A>()) {
            w = exp(s - m);
            l += w;
        } else {
            if (s != s) l = s;             // a NaN score makes the row NaN, as torch
            w = A(0);
        }
        w *= (A)drop_factor(drop, ce, H, h);
        if (w != A(0)) {
#pragma unroll
            for (int k = 0; k < NCH; ++k) {
                if (!L.has(k)) continue;
                A msg[VEC];
                edge_message<KIND, T, VEC>(L, V, Ed, has_e, j, ce, h, H, k, msg);
#pragma unroll
                for (int q = 0; q < VEC; ++q) acc[k][q] += w * msg[q];
            }
        }
    }
    if (alpha_mode) return;
    const i64 slot = (i64)task_slot[t];
    if (slot < 0) {
        const bool empty = indptr[row] == indptr[row + 1];
        const A inv = empty ? A(0) : A(1) / l;
#pragma unroll
        for (int k = 0; k < NCH; ++k) {
            if (!L.has(k)) continue;
            pack_t<T, VEC> o;
#pragma unroll
            for (int q = 0; q < VEC; ++q) o.v[q] = value_traits<T>::from_acc(acc[k][q] * inv);
            store_pack<T, VEC>(out + (row * H + h) * (i64)C + L.chan(k), o);
        }
        if (L.lane == 0) lse[row * H + h] = empty ? neg_inf<A>() : m + log(l);
    } else {
#pragma unroll
        for (int k = 0; k < NCH; ++k) {
            if (!L.has(k)) continue;
#pragma unroll
            for (int q = 0; q < VEC; ++q) p_acc[(slot * H + h) * C + L.chan(k) + q] = acc[k][q];
        }
        if (L.lane == 0) {
            p_m[slot * H + h] = m;
            p_l[slot * H + h] = l;
        }
    }
}

// Merge the (m, l, acc) partials of each split row in slot order.
// Mapping: a lane group per (split row, head), lanes over channels.
template <typename T, typename I>
__global__ void attn_combine(const I* __restrict__ split_row, const I* __restrict__ slot_ptr,
                             const typename value_traits<T>::acc_t* __restrict__ p_m,
                             const typename value_traits<T>::acc_t* __restrict__ p_l,
                             const typename value_traits<T>::acc_t* __restrict__ p_acc,
                             T* __restrict__ out, typename value_traits<T>::acc_t* __restrict__ lse,
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
    }
    if (lane == 0) lse[row * H + h] = M + log(Lsum);
}

// Backward, target pass over the CSR: per edge ds_e = p (z <g_i, m_e> + ga_e
// - delta_i); the target-side gradient summed over the task (direct rows
// write gDn[i], split rows a partial slot), the per-edge gradient written at
// the caller's id, and gatv2's grad_att as one partial row per task.
template <int KIND, typename T, typename I, int VEC, int NCH>
__global__ void attn_bwd_dst(const I* __restrict__ task_row, const I* __restrict__ task_begin,
                             const I* __restrict__ task_slot, const I* __restrict__ indptr,
                             const I* __restrict__ indices, const I* __restrict__ cid,
                             const T* __restrict__ S, const T* __restrict__ Dn,
                             const T* __restrict__ Ed, const T* __restrict__ att,
                             const T* __restrict__ V,
                             const typename value_traits<T>::acc_t* __restrict__ lse,
                             const T* __restrict__ g,          // [num_dst, H, C] or null
                             const T* __restrict__ ga,         // [E, H] or null
                             const typename value_traits<T>::acc_t* __restrict__ delta,  // [num_dst, H]
                             T* __restrict__ gDn,              // [num_dst, H, Cs] or null
                             typename value_traits<T>::acc_t* __restrict__ p_dn,  // [slots, H, Cs]
                             T* __restrict__ gEd,              // [E, H, Cs] or null
                             typename value_traits<T>::acc_t* __restrict__ gatt_part,  // [tasks, H, C] or null
                             i64 num_tasks, int H, int C, int nch, int chunk, int group, int has_e,
                             typename value_traits<T>::acc_t slope,
                             typename value_traits<T>::acc_t scale, DROP_PARAMS) {
    DROP_MAKE
    typedef typename value_traits<T>::acc_t A;
    GROUP_PROLOGUE
    A dreg[NCH][VEC], areg[NCH][VEC], greg[NCH][VEC], dacc[NCH][VEC], patt[NCH][VEC];
    load_target<KIND, T, VEC, NCH>(L, Dn, att, row, h, H, dreg, areg);
#pragma unroll
    for (int k = 0; k < NCH; ++k) {
#pragma unroll
        for (int q = 0; q < VEC; ++q) greg[k][q] = dacc[k][q] = patt[k][q] = A(0);
        if (g != nullptr && L.has(k)) load_acc<T, VEC>(g + (row * H + h) * (i64)C + L.chan(k), greg[k]);
    }
    const A row_lse = lse[row * H + h];
    const A D = delta[row * H + h];
    A dgat = A(0);                                  // gat's scalar target-side gradient
    for (i64 e = e0; e < e1; ++e) {
        const i64 j = (i64)indices[e];
        const i64 ce = (i64)cid[e];
        const A s = edge_score<KIND, T, VEC, NCH>(L, S, Ed, has_e, j, ce, h, H, dreg, areg, slope,
                                             scale);
        const A p = exp(s - row_lse);
        const A z = (A)drop_factor(drop, ce, H, h);
        A gm = A(0);
        if (g != nullptr && z != A(0)) {
#pragma unroll
            for (int k = 0; k < NCH; ++k) {
                if (!L.has(k)) continue;
                A msg[VEC];
                edge_message<KIND, T, VEC>(L, V, Ed, has_e, j, ce, h, H, k, msg);
#pragma unroll
                for (int q = 0; q < VEC; ++q) gm += greg[k][q] * msg[q];
            }
            gm = group_sum(gm, L.group);
        }
        A dp = z * gm;
        if (ga != nullptr) dp += value_traits<T>::to_acc(ga[ce * H + h]);
        const A ds = p * (dp - D);
        if (KIND == KIND_GAT) {
            A u = value_traits<T>::to_acc(S[j * H + h]) + dreg[0][0];
            if (has_e) u += value_traits<T>::to_acc(Ed[ce * H + h]);
            const A du = ds * lrelu_grad(u, slope);
            dgat += du;
            if (gEd != nullptr && L.lane == 0) gEd[ce * H + h] = value_traits<T>::from_acc(du);
            continue;
        }
#pragma unroll
        for (int k = 0; k < NCH; ++k) {
            if (!L.has(k)) continue;
            const int c0 = L.chan(k);
            A sv[VEC], ev[VEC];
            load_acc<T, VEC>(S + (j * H + h) * (i64)C + c0, sv);
            if (has_e) load_acc<T, VEC>(Ed + (ce * H + h) * (i64)C + c0, ev);
            pack_t<T, VEC> ge;
#pragma unroll
            for (int q = 0; q < VEC; ++q) {
                const A ed = has_e ? ev[q] : A(0);
                A d;
                if (KIND == KIND_GATV2) {
                    const A tt = sv[q] + dreg[k][q] + ed;
                    d = ds * areg[k][q] * lrelu_grad(tt, slope);
                    patt[k][q] += ds * lrelu(tt, slope);
                    dacc[k][q] += d;
                } else {                              // dot
                    dacc[k][q] += scale * ds * (sv[q] + ed);
                    d = scale * ds * dreg[k][q] + p * z * greg[k][q];
                }
                ge.v[q] = value_traits<T>::from_acc(d);
            }
            if (gEd != nullptr) store_pack<T, VEC>(gEd + (ce * H + h) * (i64)C + c0, ge);
        }
    }
    const i64 slot = (i64)task_slot[t];
    if (KIND == KIND_GAT) {
        if (L.lane == 0) {
            if (gDn != nullptr && slot < 0) gDn[row * H + h] = value_traits<T>::from_acc(dgat);
            if (gDn != nullptr && slot >= 0) p_dn[slot * H + h] = dgat;
        }
        return;
    }
#pragma unroll
    for (int k = 0; k < NCH; ++k) {
        if (!L.has(k)) continue;
        const int c0 = L.chan(k);
        if (gDn != nullptr)
            store_row<T, VEC>(gDn, p_dn, slot, (row * H + h) * (i64)C + c0,
                              (slot * H + h) * C + c0, dacc[k]);
        if (KIND == KIND_GATV2 && gatt_part != nullptr) {
#pragma unroll
            for (int q = 0; q < VEC; ++q) gatt_part[(t * H + h) * C + c0 + q] = patt[k][q];
        }
    }
}

// Backward, source pass over the transpose (task rows are sources j, t_indices
// targets i, t_cid caller ids): grad of the source-side score input and of
// the message (gatv2: both are xl, summed into gS).
template <int KIND, typename T, typename I, int VEC, int NCH>
__global__ void attn_bwd_src(const I* __restrict__ task_row, const I* __restrict__ task_begin,
                             const I* __restrict__ task_slot, const I* __restrict__ indptr,
                             const I* __restrict__ indices, const I* __restrict__ cid,
                             const T* __restrict__ S, const T* __restrict__ Dn,
                             const T* __restrict__ Ed, const T* __restrict__ att,
                             const T* __restrict__ V,
                             const typename value_traits<T>::acc_t* __restrict__ lse,
                             const T* __restrict__ g, const T* __restrict__ ga,
                             const typename value_traits<T>::acc_t* __restrict__ delta,
                             T* __restrict__ gS,                // [num_src, H, Cs] or null
                             typename value_traits<T>::acc_t* __restrict__ p_s,   // [slots, H, Cs]
                             T* __restrict__ gV,                // [num_src, H, C] or null
                             typename value_traits<T>::acc_t* __restrict__ p_v,   // [slots, H, C]
                             i64 num_tasks, int H, int C, int nch, int chunk, int group, int has_e,
                             typename value_traits<T>::acc_t slope,
                             typename value_traits<T>::acc_t scale, DROP_PARAMS) {
    DROP_MAKE
    typedef typename value_traits<T>::acc_t A;
    GROUP_PROLOGUE
    const i64 j = row;
    A dreg[NCH][VEC], areg[NCH][VEC], sacc[NCH][VEC], vacc[NCH][VEC];
#pragma unroll
    for (int k = 0; k < NCH; ++k)
#pragma unroll
        for (int q = 0; q < VEC; ++q) sacc[k][q] = vacc[k][q] = areg[k][q] = A(0);
    if (KIND == KIND_GATV2) {
#pragma unroll
        for (int k = 0; k < NCH; ++k)
            if (L.has(k)) load_acc<T, VEC>(att + (i64)h * C + L.chan(k), areg[k]);
    }
    A sgat = A(0);
    for (i64 e = e0; e < e1; ++e) {
        const i64 i = (i64)indices[e];
        const i64 ce = (i64)cid[e];
        if (KIND == KIND_GAT) {
            dreg[0][0] = value_traits<T>::to_acc(Dn[i * H + h]);
        } else {
#pragma unroll
            for (int k = 0; k < NCH; ++k)
                if (L.has(k)) load_acc<T, VEC>(Dn + (i * H + h) * (i64)C + L.chan(k), dreg[k]);
        }
        const A s = edge_score<KIND, T, VEC, NCH>(L, S, Ed, has_e, j, ce, h, H, dreg, areg, slope,
                                             scale);
        const A p = exp(s - lse[i * H + h]);
        const A z = (A)drop_factor(drop, ce, H, h);
        A greg[NCH][VEC];
        A gm = A(0);
#pragma unroll
        for (int k = 0; k < NCH; ++k) {
#pragma unroll
            for (int q = 0; q < VEC; ++q) greg[k][q] = A(0);
            if (g == nullptr || !L.has(k)) continue;
            load_acc<T, VEC>(g + (i * H + h) * (i64)C + L.chan(k), greg[k]);
            if (z != A(0)) {
                A msg[VEC];
                edge_message<KIND, T, VEC>(L, V, Ed, has_e, j, ce, h, H, k, msg);
#pragma unroll
                for (int q = 0; q < VEC; ++q) gm += greg[k][q] * msg[q];
            }
        }
        if (g != nullptr) gm = group_sum(gm, L.group);
        A dp = z * gm;
        if (ga != nullptr) dp += value_traits<T>::to_acc(ga[ce * H + h]);
        const A ds = p * (dp - delta[i * H + h]);
        const A w = p * z;
        if (KIND == KIND_GAT) {
            A u = value_traits<T>::to_acc(S[j * H + h]) + dreg[0][0];
            if (has_e) u += value_traits<T>::to_acc(Ed[ce * H + h]);
            sgat += ds * lrelu_grad(u, slope);
        }
#pragma unroll
        for (int k = 0; k < NCH; ++k) {
            if (!L.has(k)) continue;
            if (KIND == KIND_GATV2) {
                A sv[VEC], ev[VEC];
                load_acc<T, VEC>(S + (j * H + h) * (i64)C + L.chan(k), sv);
                if (has_e) load_acc<T, VEC>(Ed + (ce * H + h) * (i64)C + L.chan(k), ev);
#pragma unroll
                for (int q = 0; q < VEC; ++q) {
                    const A tt = sv[q] + dreg[k][q] + (has_e ? ev[q] : A(0));
                    sacc[k][q] += ds * areg[k][q] * lrelu_grad(tt, slope) + w * greg[k][q];
                }
            } else {
#pragma unroll
                for (int q = 0; q < VEC; ++q) {
                    if (KIND == KIND_DOT) sacc[k][q] += scale * ds * dreg[k][q];
                    vacc[k][q] += w * greg[k][q];
                }
            }
        }
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
        if (KIND != KIND_GAT && gS != nullptr)
            store_row<T, VEC>(gS, p_s, slot, (j * H + h) * (i64)C + c0, (slot * H + h) * C + c0,
                              sacc[k]);
        if (KIND != KIND_GATV2 && gV != nullptr)
            store_row<T, VEC>(gV, p_v, slot, (j * H + h) * (i64)C + c0, (slot * H + h) * C + c0,
                              vacc[k]);
    }
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

// out[b, c] = sum_{r in [b*R, min((b+1)*R, rows))} in[r, c]: one level of a
// fixed-order column sum (grad_att's per-task partials). Thread per (b, c).
template <typename A>
__global__ void column_sum(const A* __restrict__ in, A* __restrict__ out, i64 rows, int cols,
                           int R) {
    const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const i64 b = idx / cols;
    const int c = (int)(idx % cols);
    const i64 r0 = b * R;
    if (r0 >= rows) return;
    const i64 r1 = r0 + R < rows ? r0 + R : rows;
    A s = A(0);
    for (i64 r = r0; r < r1; ++r) s += in[r * cols + c];
    out[b * cols + c] = s;
}
