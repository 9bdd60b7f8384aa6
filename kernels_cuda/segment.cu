// Reduction family kernels: several neighbour reductions in one pass
// (sum, mean, max, min, var, std, any subset), and one fused backward pass.
//
// Forward mapping: the task list of spmm.cu (rows cut into tasks of at most
// `chunk` edges; hubs split, their partial states merged in slot order by
// segment_combine: deterministic, no atomics). A group of `group` lanes per
// task; lane l owns features [f0, f0 + VEC), f0 = l*VEC + k*group*VEC.
// Each neighbour row slice is read ONCE and feeds every requested statistic
// (sum, sum of squares, max + arg, min + arg), four gathers in flight; the
// epilogue writes every requested reduction into its block of the
// [num_rows, R*F] output.
//
// Forward traffic per task of n edges: n*sizeof(I) + n*F*sizeof(T) gathered,
// R*F*sizeof(T) written (+ F*sizeof(I) per arg array); split rows write
// their partial states (up to 4 x F x 4 B + 2 x F x sizeof(I)) once.
//
// Reductions are coded 0 sum, 1 mean, 2 max, 3 min, 4 var, 5 std, packed 3
// bits each in `codes` (reduction r at bits 3r..3r+2). Semantics follow PyG:
// empty rows give 0; var = mean(x^2) - mean(x)^2; std = sqrt(max(var, 1e-5)),
// 0 where that is <= sqrt(1e-5); max/min ties go to the first CSR position,
// NaN propagates.

#include "common.cuh"

#define STAT_SUM 1
#define STAT_SQ 2
#define STAT_MAX 4
#define STAT_MIN 8

template <typename A>
__device__ __forceinline__ bool takes_max(A v, A m, i64 arg) {
    return arg < 0 || v > m || (v != v && m == m);
}

template <typename A>
__device__ __forceinline__ bool takes_min(A v, A m, i64 arg) {
    return arg < 0 || v < m || (v != v && m == m);
}

// Fold one neighbour value (CSR position e) into the running statistics.
template <typename A>
__device__ __forceinline__ void accumulate(A val, i64 e, int stats, A& s, A& sq, A& mx, A& mn,
                                           i64& amx, i64& amn) {
    s += val;
    if (stats & STAT_SQ) sq += val * val;
    if ((stats & STAT_MAX) && takes_max(val, mx, amx)) { mx = val; amx = e; }
    if ((stats & STAT_MIN) && takes_min(val, mn, amn)) { mn = val; amn = e; }
}

// Final values of every requested reduction for one (row, feature).
template <typename T, typename I>
__device__ __forceinline__ void write_reductions(T* __restrict__ out, i64 row, int f, int F,
                                                 int num_codes, int codes, i64 deg,
                                                 typename value_traits<T>::acc_t s,
                                                 typename value_traits<T>::acc_t sq,
                                                 typename value_traits<T>::acc_t mx,
                                                 typename value_traits<T>::acc_t mn) {
    typedef typename value_traits<T>::acc_t A;
    const A inv = deg > 0 ? A(1) / A(deg) : A(0);
    const i64 base = row * (i64)num_codes * F + f;
    for (int r = 0; r < num_codes; ++r) {
        const int code = (codes >> (3 * r)) & 7;
        A v;
        if (code == 0) v = s;
        else if (code == 1) v = s * inv;
        else if (code == 2) v = deg > 0 ? mx : A(0);
        else if (code == 3) v = deg > 0 ? mn : A(0);
        else {
            const A mean = s * inv;
            v = sq * inv - mean * mean;
            if (code == 5) {
                const A eps = A(1e-5);
                v = sqrt(v > eps ? v : eps);
                if (v <= sqrt(eps)) v = A(0);
            }
        }
        out[base + (i64)r * F] = value_traits<T>::from_acc(v);
    }
}

template <typename T, typename I, int VEC>
__global__ void segment_fwd(const I* __restrict__ task_row, const I* __restrict__ task_begin,
                            const I* __restrict__ task_slot, const I* __restrict__ indptr,
                            const I* __restrict__ indices,
                            const T* __restrict__ x,          // [num_cols, F]
                            T* __restrict__ out,              // [num_rows, R*F]
                            I* __restrict__ argmax,           // [num_rows, F] or null
                            I* __restrict__ argmin,           // [num_rows, F] or null
                            typename value_traits<T>::acc_t* __restrict__ p_sum,  // [slots, F] x4
                            typename value_traits<T>::acc_t* __restrict__ p_sq,
                            typename value_traits<T>::acc_t* __restrict__ p_max,
                            typename value_traits<T>::acc_t* __restrict__ p_min,
                            I* __restrict__ p_argmax, I* __restrict__ p_argmin,   // [slots, F]
                            i64 num_tasks, int F, int chunk, int group, int stats,
                            int num_codes, int codes) {
    typedef typename value_traits<T>::acc_t A;
    const i64 t = group_index(group);
    if (t >= num_tasks) return;
    const int lane = group_lane(group);
    i64 row, e0, e1;
    task_range(task_row, task_begin, indptr, t, chunk, row, e0, e1);
    const i64 slot = (i64)task_slot[t];

    for (int f0 = lane * VEC; f0 < F; f0 += group * VEC) {
        A s[VEC], sq[VEC], mx[VEC], mn[VEC];
        i64 amx[VEC], amn[VEC];
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            s[v] = sq[v] = mx[v] = mn[v] = A(0);
            amx[v] = amn[v] = -1;
        }
        // four gathers in flight, then the updates in edge order (ties keep
        // the first CSR position)
        i64 e = e0;
        for (; e + 4 <= e1; e += 4) {
            i64 j[4];
            pack_t<T, VEC> p[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) j[u] = (i64)indices[e + u];
#pragma unroll
            for (int u = 0; u < 4; ++u) p[u] = load_pack<T, VEC>(x + j[u] * F + f0);
#pragma unroll
            for (int u = 0; u < 4; ++u)
#pragma unroll
                for (int v = 0; v < VEC; ++v)
                    accumulate(value_traits<T>::to_acc(p[u].v[v]), e + u, stats,
                               s[v], sq[v], mx[v], mn[v], amx[v], amn[v]);
        }
        for (; e < e1; ++e) {
            const i64 j = (i64)indices[e];
            const pack_t<T, VEC> p = load_pack<T, VEC>(x + j * F + f0);
#pragma unroll
            for (int v = 0; v < VEC; ++v)
                accumulate(value_traits<T>::to_acc(p.v[v]), e, stats,
                           s[v], sq[v], mx[v], mn[v], amx[v], amn[v]);
        }
        if (slot < 0) {
            const i64 deg = (i64)indptr[row + 1] - (i64)indptr[row];
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                write_reductions<T, I>(out, row, f0 + v, F, num_codes, codes, deg,
                                       s[v], sq[v], mx[v], mn[v]);
                if (stats & STAT_MAX) argmax[row * F + f0 + v] = (I)amx[v];
                if (stats & STAT_MIN) argmin[row * F + f0 + v] = (I)amn[v];
            }
        } else {
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                const i64 k = slot * F + f0 + v;
                p_sum[k] = s[v];
                if (stats & STAT_SQ) p_sq[k] = sq[v];
                if (stats & STAT_MAX) { p_max[k] = mx[v]; p_argmax[k] = (I)amx[v]; }
                if (stats & STAT_MIN) { p_min[k] = mn[v]; p_argmin[k] = (I)amn[v]; }
            }
        }
    }
}

// Merge the partial states of each split row in slot order, then write its
// reductions. Mapping: a lane group per split row, one feature per lane step.
template <typename T, typename I>
__global__ void segment_combine(const I* __restrict__ split_row, const I* __restrict__ slot_ptr,
                                const I* __restrict__ indptr,
                                const typename value_traits<T>::acc_t* __restrict__ p_sum,
                                const typename value_traits<T>::acc_t* __restrict__ p_sq,
                                const typename value_traits<T>::acc_t* __restrict__ p_max,
                                const typename value_traits<T>::acc_t* __restrict__ p_min,
                                const I* __restrict__ p_argmax, const I* __restrict__ p_argmin,
                                T* __restrict__ out, I* __restrict__ argmax,
                                I* __restrict__ argmin, i64 num_split, int F, int group,
                                int stats, int num_codes, int codes) {
    typedef typename value_traits<T>::acc_t A;
    const i64 sidx = group_index(group);
    if (sidx >= num_split) return;
    const int lane = group_lane(group);
    const i64 row = (i64)split_row[sidx];
    const i64 k0 = (i64)slot_ptr[sidx], k1 = (i64)slot_ptr[sidx + 1];
    const i64 deg = (i64)indptr[row + 1] - (i64)indptr[row];
    for (int f = lane; f < F; f += group) {
        A s = 0, sq = 0, mx = 0, mn = 0;
        i64 amx = -1, amn = -1;
        for (i64 k = k0; k < k1; ++k) {
            const i64 q = k * F + f;
            s += p_sum[q];
            if (stats & STAT_SQ) sq += p_sq[q];
            if ((stats & STAT_MAX) && p_argmax[q] >= 0 && takes_max(p_max[q], mx, amx)) {
                mx = p_max[q];
                amx = (i64)p_argmax[q];
            }
            if ((stats & STAT_MIN) && p_argmin[q] >= 0 && takes_min(p_min[q], mn, amn)) {
                mn = p_min[q];
                amn = (i64)p_argmin[q];
            }
        }
        write_reductions<T, I>(out, row, f, F, num_codes, codes, deg, s, sq, mx, mn);
        if (stats & STAT_MAX) argmax[row * F + f] = (I)amx;
        if (stats & STAT_MIN) argmin[row * F + f] = (I)amn;
    }
}

// grad_x[j,f] = sum_{e=(j->i)} coef_a[i,f] + coef_b[i,f]*x[j,f]
//               + [argmax[i,f] == e] gmax[i,f] + [argmin[i,f] == e] gmin[i,f]
// Walks the transpose: tasks over source rows j, `t_indices` = targets i,
// `t_edge` = forward CSR position e. Split source rows write fp32 partials
// (combined by spmm_combine). Traffic per edge: up to 4 gathered rows of F
// (coef_a, coef_b, gmax/argmax, gmin/argmin) as the requested terms need.
template <typename T, typename I, int VEC>
__global__ void segment_bwd(const I* __restrict__ task_row, const I* __restrict__ task_begin,
                            const I* __restrict__ task_slot, const I* __restrict__ t_indptr,
                            const I* __restrict__ t_indices, const I* __restrict__ t_edge,
                            const T* __restrict__ x,                                   // [num_cols_fwd, F]
                            const typename value_traits<T>::acc_t* __restrict__ coef_a,  // [num_rows_fwd, F]
                            const typename value_traits<T>::acc_t* __restrict__ coef_b,
                            const I* __restrict__ argmax,
                            const typename value_traits<T>::acc_t* __restrict__ gmax,
                            const I* __restrict__ argmin,
                            const typename value_traits<T>::acc_t* __restrict__ gmin,
                            T* __restrict__ grad_x,                                     // [num_cols_fwd, F]
                            typename value_traits<T>::acc_t* __restrict__ partial,      // [slots, F]
                            i64 num_tasks, int F, int chunk, int group, int terms) {
    typedef typename value_traits<T>::acc_t A;
    const i64 t = group_index(group);
    if (t >= num_tasks) return;
    const int lane = group_lane(group);
    i64 j, e0, e1;
    task_range(task_row, task_begin, t_indptr, t, chunk, j, e0, e1);
    const i64 slot = (i64)task_slot[t];
    const bool has_a = terms & 1, has_b = terms & 2, has_max = terms & 4, has_min = terms & 8;

    for (int f0 = lane * VEC; f0 < F; f0 += group * VEC) {
        A acc_a[VEC], acc_b[VEC];
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc_a[v] = acc_b[v] = A(0);
        for (i64 e = e0; e < e1; ++e) {
            const i64 i = (i64)t_indices[e];
            const i64 fe = (i64)t_edge[e];
            const i64 base = i * F + f0;
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                if (has_a) acc_a[v] += coef_a[base + v];
                if (has_b) acc_b[v] += coef_b[base + v];
                if (has_max && (i64)argmax[base + v] == fe) acc_a[v] += gmax[base + v];
                if (has_min && (i64)argmin[base + v] == fe) acc_a[v] += gmin[base + v];
            }
        }
        A res[VEC];
        if (has_b) {
            const pack_t<T, VEC> xj = load_pack<T, VEC>(x + j * F + f0);
#pragma unroll
            for (int v = 0; v < VEC; ++v)
                res[v] = acc_a[v] + acc_b[v] * value_traits<T>::to_acc(xj.v[v]);
        } else {
#pragma unroll
            for (int v = 0; v < VEC; ++v) res[v] = acc_a[v];
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
