// SpMM family kernels: weighted neighbour sum over a CSR-by-destination graph
//
//     out[i] = r_i * sum_{e=(j->i)} w_e * c_j * x[j]  (+ b)
//
// with optional edge weights w, target-side row scale r, source-side column
// scale c (mean: r = 1/deg; GCN: r = c = deg^-1/2, or the per-edge products
// d_i d_j precomputed in CSR order) and a bias row b [F] added in the store
// (so an empty row gets b, as `spmm(...) + b` would). The backward pass runs
// the same kernel on the cached transpose with r and c swapped (weights in
// the transpose's order, no bias); the bias gradient is a column sum of
// grad_out (column_sum in common.cuh). Plus the SDDMM giving the gradient of
// edge weights.
//
// Work unit: a *task* = up to `chunk` consecutive CSR edges of one row. Rows
// of degree <= chunk are one task; hub rows are split into several, whose
// fp32 partial rows are summed in a fixed order by spmm_combine (no atomics:
// bitwise repeatable), which then applies r and b. Empty rows are one empty
// task, so every output row is written (with 0, or b).
//
// Mapping: a group of `group` lanes (power of two <= 32) per (task, feature
// slice): grid x over tasks, grid y over slices of `fslice` features (one
// slice unless the tasks alone are too few to fill the GPU; common.cuh);
// lane l owns features [f0, f0 + VEC) with f0 = slice start + l*VEC +
// k*group*VEC, k = 0, 1, ...
// Each feature slice is moved as one VEC-wide aligned load (16 bytes for
// float4 / 8 x bf16). Edges are unrolled by 4 so four gathers are in flight.
//
// Memory traffic (T = value type, I = index type, per task of n edges):
//   read  n * (sizeof(I) + sizeof(acc_t) if weighted) + n * F * sizeof(T) gathered
//         (+ n * sizeof(acc_t) gathered c[j], a random 4-byte read per edge,
//          + F * sizeof(T) of b, shared by all tasks: served from L2)
//   write F * sizeof(T) (or F * sizeof(acc_t) partial for split rows)
// The gather term dominates: rmat20, F=128, fp32: 16.1M x 512 B = 8.2 GB
// without cache reuse, 1.2 GB if every source row were read once.

#include "common.cuh"

// out[row] = r * sum_{e in task} w_e * c_j * x[j] (+ b), or partial[slot] = the sum
template <typename T, typename I, int VEC, bool HAS_W>
__global__ void spmm_fwd(const I* __restrict__ task_row,    // [num_tasks] row of each task
                         const I* __restrict__ task_begin,  // [num_tasks] first CSR edge
                         const I* __restrict__ task_slot,   // [num_tasks] partial slot, -1 = direct
                         const I* __restrict__ indptr,      // [num_rows + 1]
                         const I* __restrict__ indices,     // [E] source of each edge
                         const typename value_traits<T>::acc_t* __restrict__ weights,  // [E] or null
                         const typename value_traits<T>::acc_t* __restrict__ row_scale,  // [num_rows] or null
                         const typename value_traits<T>::acc_t* __restrict__ col_scale,  // [num_cols] or null
                         const T* __restrict__ bias,        // [F] or null (direct rows only)
                         const T* __restrict__ x,           // [num_cols, F]
                         T* __restrict__ out,               // [num_rows, F]
                         typename value_traits<T>::acc_t* __restrict__ partial,  // [slots, F]
                         i64 num_tasks, int F, int chunk, int group, int fslice) {
    typedef typename value_traits<T>::acc_t A;
    const i64 t = group_index(group);
    if (t >= num_tasks) return;
    const int lane = group_lane(group);
    i64 row, e0, e1;
    task_range(task_row, task_begin, indptr, t, chunk, row, e0, e1);
    const i64 slot = (i64)task_slot[t];
    const int f_end = slice_end(fslice, F);

    for (int f0 = slice_begin(fslice) + lane * VEC; f0 < f_end; f0 += group * VEC) {
        A acc[VEC];
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[v] = A(0);
        i64 e = e0;
        for (; e + 4 <= e1; e += 4) {
            i64 j[4];
            A w[4];
            pack_t<T, VEC> p[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                j[u] = (i64)indices[e + u];
                w[u] = HAS_W ? weights[e + u] : A(1);
            }
            if (col_scale != nullptr) {
#pragma unroll
                for (int u = 0; u < 4; ++u) w[u] *= col_scale[j[u]];
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) p[u] = load_pack<T, VEC>(x + j[u] * F + f0);
#pragma unroll
            for (int u = 0; u < 4; ++u)
#pragma unroll
                for (int v = 0; v < VEC; ++v)
                    acc[v] += w[u] * value_traits<T>::to_acc(p[u].v[v]);
        }
        for (; e < e1; ++e) {
            const i64 j = (i64)indices[e];
            A w = HAS_W ? weights[e] : A(1);
            if (col_scale != nullptr) w *= col_scale[j];
            const pack_t<T, VEC> p = load_pack<T, VEC>(x + j * F + f0);
#pragma unroll
            for (int v = 0; v < VEC; ++v) acc[v] += w * value_traits<T>::to_acc(p.v[v]);
        }
        if (slot < 0) {
            const A r = row_scale != nullptr ? row_scale[row] : A(1);
            pack_t<T, VEC> o, b;
            if (bias != nullptr) b = load_pack<T, VEC>(bias + f0);
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                const A y = r * acc[v];
                o.v[v] = value_traits<T>::from_acc(bias != nullptr ? y + value_traits<T>::to_acc(b.v[v]) : y);
            }
            store_pack<T, VEC>(out + row * F + f0, o);
        } else {
#pragma unroll
            for (int v = 0; v < VEC; ++v) partial[slot * F + f0 + v] = acc[v];
        }
    }
}

// out[split_row[s]] = r * sum_{k in slot_ptr[s]..slot_ptr[s+1]} partial[k] (+ b), in slot order.
// Mapping: a lane group per split row; traffic: slots x F x sizeof(acc_t) read
// (+ F x sizeof(T) of b per split row, from L2), F x sizeof(T) written per split row.
template <typename T, typename I, int VEC>
__global__ void spmm_combine(const I* __restrict__ split_row,  // [num_split]
                             const I* __restrict__ slot_ptr,   // [num_split + 1]
                             const typename value_traits<T>::acc_t* __restrict__ partial,
                             const typename value_traits<T>::acc_t* __restrict__ row_scale,  // or null
                             const T* __restrict__ bias,       // [F] or null
                             T* __restrict__ out, i64 num_split, int F, int group) {
    typedef typename value_traits<T>::acc_t A;
    const i64 s = group_index(group);
    if (s >= num_split) return;
    const int lane = group_lane(group);
    const i64 row = (i64)split_row[s];
    const A r = row_scale != nullptr ? row_scale[row] : A(1);
    const i64 k0 = (i64)slot_ptr[s], k1 = (i64)slot_ptr[s + 1];
    for (int f0 = lane * VEC; f0 < F; f0 += group * VEC) {
        pack_t<T, VEC> o, b;
        if (bias != nullptr) b = load_pack<T, VEC>(bias + f0);
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            A acc = A(0);
            for (i64 k = k0; k < k1; ++k) acc += partial[k * F + f0 + v];
            const A y = r * acc;
            o.v[v] = value_traits<T>::from_acc(bias != nullptr ? y + value_traits<T>::to_acc(b.v[v]) : y);
        }
        store_pack<T, VEC>(out + row * F + f0, o);
    }
}

// out[e] = <a[row_e], b[indices[e]]> for every edge of the task (CSR order).
// Mapping: a lane group per task, lanes split the features, a shuffle
// reduction per edge. Traffic per task: F x sizeof(T) for a[row] (re-read
// from L1), n x F x sizeof(T) gathered from b, n x sizeof(acc_t) written.
template <typename T, typename I, int VEC>
__global__ void sddmm(const I* __restrict__ task_row, const I* __restrict__ task_begin,
                      const I* __restrict__ indptr, const I* __restrict__ indices,
                      const T* __restrict__ a,       // [num_rows, F]
                      const T* __restrict__ b,       // [num_cols, F]
                      typename value_traits<T>::acc_t* __restrict__ out,  // [E]
                      i64 num_tasks, int F, int chunk, int group) {
    typedef typename value_traits<T>::acc_t A;
    const i64 t = group_index(group);
    if (t >= num_tasks) return;
    const int lane = group_lane(group);
    i64 row, e0, e1;
    task_range(task_row, task_begin, indptr, t, chunk, row, e0, e1);
    for (i64 e = e0; e < e1; ++e) {
        const i64 j = (i64)indices[e];
        A dot = A(0);
        for (int f0 = lane * VEC; f0 < F; f0 += group * VEC) {
            const pack_t<T, VEC> pa = load_pack<T, VEC>(a + row * F + f0);
            const pack_t<T, VEC> pb = load_pack<T, VEC>(b + j * F + f0);
#pragma unroll
            for (int v = 0; v < VEC; ++v)
                dot += value_traits<T>::to_acc(pa.v[v]) * value_traits<T>::to_acc(pb.v[v]);
        }
        dot = group_sum(dot, group);
        if (lane == 0) out[e] = dot;
    }
}
