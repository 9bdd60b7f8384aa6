// Graph build kernels: the device side of fastgnn.Graph's construction
// (fastgnn/backends/cuda/graph_build.py launches them). Each replaces a run
// of array operations of the NumPy build (fastgnn/graph.py,
// fastgnn/ops/spmm.py: the float64-free reference of every one) by one pass,
// so a new graph costs a few launches, not dozens.
//
//   edge_stats       min index, largest source, largest target, descents
//                    (dst[e+1] < dst[e]) and self-loops of an edge index
//   csr_from_order   CSR arrays of edges given in target order (or an order
//                    that sorts them): offsets, sources, edge ids
//   self_loop_mark   which CSR positions are self-loops (also in caller order)
//   self_loop_fill   the graph with one self-loop per node (PyG's
//                    add_remaining_self_loops), without a sort
//
// K is the index type of the input edges, I the graph's index type.
// Mapping: one thread per edge, per row, or per both (index t < max(E, n + 1)
// covers edge t and row t). The row of CSR position p is found by a binary
// search of the offsets (log2(n) reads of an L2-resident array), so no
// [E] row array is materialised.
//
// Memory traffic per edge: edge_stats reads the two indices once (and the
// next target); csr_from_order reads the order, gathers the key and value
// through it and writes two indices; the self-loop pair reads the CSR index,
// its id and its running loop count and writes index, id and kept id.

#include "common.cuh"

#define I64_MAX 0x7fffffffffffffffLL

__device__ __forceinline__ i64 thread_index() {
    return (i64)blockIdx.x * blockDim.x + threadIdx.x;
}

// the row r of CSR position p: indptr[r] <= p < indptr[r + 1] (p < E)
template <typename I>
__device__ __forceinline__ i64 row_of(const I* __restrict__ indptr, i64 n, i64 p) {
    i64 lo = 0, hi = n - 1;            // the largest r with indptr[r] <= p
    while (lo < hi) {
        const i64 mid = (lo + hi + 1) >> 1;
        if ((i64)indptr[mid] <= p) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// stats [5] int64, set by the caller to {I64_MAX, -1, -1, 0, 0}:
// min over both rows, max source, max target, descents, loops.
// Grid-stride over edges; a warp reduces its lanes' values, lane 0 adds
// them with one atomic each.
template <typename K>
__global__ void edge_stats(const K* __restrict__ src,   // [E], element stride src_stride
                           const K* __restrict__ dst,   // [E], element stride dst_stride
                           i64 src_stride, i64 dst_stride, i64 E,
                           long long* __restrict__ stats) {
    i64 lo = I64_MAX, max_src = -1, max_dst = -1;
    unsigned long long descents = 0, loops = 0;
    for (i64 e = thread_index(); e < E; e += (i64)gridDim.x * blockDim.x) {
        const i64 s = (i64)src[e * src_stride], d = (i64)dst[e * dst_stride];
        lo = min(lo, min(s, d));
        max_src = max(max_src, s);
        max_dst = max(max_dst, d);
        if (e + 1 < E && (i64)dst[(e + 1) * dst_stride] < d) ++descents;
        if (s == d) ++loops;
    }
    for (int o = 16; o > 0; o >>= 1) {
        lo = min(lo, (i64)__shfl_down_sync(0xffffffffu, lo, o));
        max_src = max(max_src, (i64)__shfl_down_sync(0xffffffffu, max_src, o));
        max_dst = max(max_dst, (i64)__shfl_down_sync(0xffffffffu, max_dst, o));
        descents += __shfl_down_sync(0xffffffffu, descents, o);
        loops += __shfl_down_sync(0xffffffffu, loops, o);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicMin(&stats[0], (long long)lo);
        atomicMax(&stats[1], (long long)max_src);
        atomicMax(&stats[2], (long long)max_dst);
        if (descents) atomicAdd((unsigned long long*)&stats[3], descents);
        if (loops) atomicAdd((unsigned long long*)&stats[4], loops);
    }
}

// CSR of E edges read in the order `order` (null: as they are), whose keys
// (targets) are then non-decreasing, all < num_rows:
//   thread t < E:         indices[t] = value of edge order[t] (its source:
//                         vals[e * val_stride], or, when vals is null, the row
//                         of CSR position e in val_indptr [val_rows + 1]: the
//                         transpose's targets), edge_ids[t] = order[t] (if
//                         edge_ids is given)
//   thread t <= num_rows: indptr[t] = the first k with key(order[k]) >= t
//                         (a binary search; rows past the last key get E)
template <typename K, typename I>
__global__ void csr_from_order(const K* __restrict__ keys, i64 key_stride,
                               const K* __restrict__ vals, i64 val_stride,
                               const I* __restrict__ val_indptr, i64 val_rows,
                               const long long* __restrict__ order,   // [E] or null
                               i64 E, i64 num_rows,
                               I* __restrict__ indptr,      // [num_rows + 1]
                               I* __restrict__ indices,     // [E]
                               I* __restrict__ edge_ids) {  // [E] or null
    const i64 t = thread_index();
    if (t < E) {
        const i64 e = order ? (i64)order[t] : t;
        indices[t] = (I)(vals ? (i64)vals[e * val_stride] : row_of(val_indptr, val_rows, e));
        if (edge_ids) edge_ids[t] = (I)e;
    }
    if (t <= num_rows) {
        i64 lo = 0, hi = E;            // the first k in [0, E] with key(k) >= t
        while (lo < hi) {
            const i64 mid = (lo + hi) >> 1;
            const i64 e = order ? (i64)order[mid] : mid;
            if ((i64)keys[e * key_stride] < t) lo = mid + 1; else hi = mid;
        }
        indptr[t] = (I)lo;
    }
}

// flags[p] = 1 where CSR position p is a self-loop (indices[p] == its row),
// and, when edge_ids is given, loop_caller[edge_ids[p]] = the same flag (the
// flags in caller order; edge_ids is a permutation, so every entry is set).
template <typename I>
__global__ void self_loop_mark(const I* __restrict__ indptr,     // [n + 1]
                               const I* __restrict__ indices,    // [E]
                               const I* __restrict__ edge_ids,   // [E] or null
                               i64 n, i64 E,
                               int* __restrict__ flags,          // [E]
                               int* __restrict__ loop_caller) {  // [E] or null
    const i64 p = thread_index();
    if (p >= E) return;
    const int loop = (i64)indices[p] == row_of(indptr, n, p);
    flags[p] = loop;
    if (loop_caller) loop_caller[(i64)edge_ids[p]] = loop;
}

// The graph with one self-loop per node: row i holds its non-loop edges in
// CSR order, then the loop (i -> i). With L(p) = loops_upto[p] (inclusive
// running count of loops over CSR positions; null: no loops), a non-loop
// edge at position p of row i moves to p - L(p) + i; its new id is its rank
// among the non-loop edges in caller order (c - loops among caller ids <= c,
// from loops_caller_upto, the inclusive running count in caller order; null
// when the ids are positions or there are no loops), and kept[rank] = c, its
// caller id. Loop i sits at new_indptr[i + 1] - 1 with id E_kept + i.
// last[i] = the caller id of row i's last existing loop, or -1.
template <typename I>
__global__ void self_loop_fill(const I* __restrict__ indptr,     // [n + 1]
                               const I* __restrict__ indices,    // [E]
                               const I* __restrict__ edge_ids,   // [E] or null (positions)
                               const long long* __restrict__ loops_upto,         // [E] or null
                               const long long* __restrict__ loops_caller_upto,  // [E] or null
                               i64 n, i64 E, i64 E_kept,
                               I* __restrict__ new_indptr,       // [n + 1]
                               I* __restrict__ new_indices,      // [E_kept + n]
                               I* __restrict__ new_ids,          // [E_kept + n]
                               long long* __restrict__ kept,     // [E_kept]
                               long long* __restrict__ last) {   // [n]
    const i64 t = thread_index();
    if (t < E) {
        const i64 p = t, i = row_of(indptr, n, p);
        const i64 c = edge_ids ? (i64)edge_ids[p] : p;
        const i64 L = loops_upto ? (i64)loops_upto[p] : 0;
        if ((i64)indices[p] != i) {
            const i64 at = p - L + i;
            const i64 rank = c - (edge_ids ? (loops_caller_upto ? (i64)loops_caller_upto[c] : 0)
                                           : L);
            new_indices[at] = indices[p];
            new_ids[at] = (I)rank;
            kept[rank] = c;
        } else if ((i64)loops_upto[(i64)indptr[i + 1] - 1] == L) {
            last[i] = c;                 // no loop after p in its row
        }
    }
    if (t <= n) {
        const i64 q = (i64)indptr[t];
        const i64 Lq = (loops_upto && q > 0) ? (i64)loops_upto[q - 1] : 0;
        new_indptr[t] = (I)(q - Lq + t);
        if (t < n) {
            const i64 q1 = (i64)indptr[t + 1];
            const i64 Lq1 = (loops_upto && q1 > 0) ? (i64)loops_upto[q1 - 1] : 0;
            const i64 at = q1 - Lq1 + t;  // new_indptr[t + 1] - 1
            new_indices[at] = (I)t;
            new_ids[at] = (I)(E_kept + t);
            if (Lq1 == Lq) last[t] = -1;
        }
    }
}

// Rows cut into tasks of <= chunk edges, in visit order (order [n]: the row
// at each visit position; null: row v at position v). A row of deg edges is
// ntask = max(1, ceil(deg / chunk)) tasks; rows of more than one are split
// rows, whose tasks get consecutive partial slots in task order.
// task_count: per position v, ntask[v] and split[v] (0/1), scanned by the
// caller into inclusive running counts.
template <typename I>
__global__ void task_count(const I* __restrict__ indptr, const I* __restrict__ order,
                           i64 n, int chunk,
                           long long* __restrict__ ntask,     // [n]
                           long long* __restrict__ split) {   // [n]
    const i64 v = thread_index();
    if (v >= n) return;
    const i64 r = order ? (i64)order[v] : v;
    const i64 deg = (i64)indptr[r + 1] - (i64)indptr[r];
    const i64 k = deg > chunk ? (deg + chunk - 1) / chunk : 1;
    ntask[v] = k;
    split[v] = k > 1;
}

// task_fill: position v writes its row's tasks from task_upto[v] - ntask
// (task_upto, split_upto: the inclusive running counts of task_count's
// values): task_row, task_begin (the row's start + k * chunk) and task_slot
// (-1 for a row of one task; else the split rows' tasks before it, which
// is the tasks before it less the unsplit rows before it, plus k); a split
// row also writes split_row and slot_ptr (slot_ptr[0] = 0 by position 0).
template <typename I>
__global__ void task_fill(const I* __restrict__ indptr, const I* __restrict__ order,
                          const long long* __restrict__ task_upto,    // [n]
                          const long long* __restrict__ split_upto,   // [n]
                          i64 n, int chunk,
                          I* __restrict__ task_row, I* __restrict__ task_begin,
                          I* __restrict__ task_slot,                  // [T]
                          I* __restrict__ split_row,                  // [S]
                          I* __restrict__ slot_ptr) {                 // [S + 1]
    const i64 v = thread_index();
    if (v >= n) return;
    const i64 r = order ? (i64)order[v] : v;
    const i64 begin = (i64)indptr[r];
    const i64 s_before = (i64)split_upto[v] - (v > 0 ? (i64)split_upto[v - 1] : 0) > 0
                         ? (i64)split_upto[v] - 1 : -1;        // this row's split index
    const i64 first = v > 0 ? (i64)task_upto[v - 1] : 0;
    const i64 k_end = (i64)task_upto[v] - first;
    const i64 slot0 = first - (v - (v > 0 ? (i64)split_upto[v - 1] : 0));
    if (v == 0) slot_ptr[0] = 0;
    for (i64 k = 0; k < k_end; ++k) {
        task_row[first + k] = (I)r;
        task_begin[first + k] = (I)(begin + k * chunk);
        task_slot[first + k] = (I)(s_before >= 0 ? slot0 + k : -1);
    }
    if (s_before >= 0) {
        split_row[s_before] = (I)r;
        slot_ptr[s_before + 1] = (I)(slot0 + k_end);
    }
}

// d_k = deg_k^-1/2 (0 for deg_k = 0) from the offsets, in double
template <typename I>
__device__ __forceinline__ double inv_sqrt_degree(const I* __restrict__ indptr, i64 k) {
    const i64 deg = (i64)indptr[k + 1] - (i64)indptr[k];
    return deg > 0 ? 1.0 / sqrt((double)deg) : 0.0;
}

// GCN's constant weights of a square graph, w_e = d_i * d_j for e = (j -> i),
// d over the in-degrees (computed in double, stored as W): thread p writes
// position p's weight in CSR order and, when the transpose (t_indptr,
// t_indices) is given, its weight in the transpose's order (transpose row
// = source j, its index = target i).
template <typename I, typename W>
__global__ void gcn_norm_weights(const I* __restrict__ indptr,     // [n + 1]
                                 const I* __restrict__ indices,    // [E]
                                 const I* __restrict__ t_indptr,   // [n + 1] or null
                                 const I* __restrict__ t_indices,  // [E] or null
                                 i64 n, i64 E,
                                 W* __restrict__ w_csr,            // [E]
                                 W* __restrict__ w_t) {            // [E] or null
    const i64 p = thread_index();
    if (p >= E) return;
    const i64 i = row_of(indptr, n, p), j = (i64)indices[p];
    w_csr[p] = (W)(inv_sqrt_degree(indptr, i) * inv_sqrt_degree(indptr, j));
    if (w_t) {
        const i64 tj = row_of(t_indptr, n, p), ti = (i64)t_indices[p];
        w_t[p] = (W)(inv_sqrt_degree(indptr, ti) * inv_sqrt_degree(indptr, tj));
    }
}

// The first k >= from in [0, T] with work_before[k] * SR >= goal (T if
// none), given that no k < from qualifies: a gallop up from `from`, then a
// bisection of the last step.
__device__ __forceinline__ i64 first_reaching(const long long* __restrict__ work_before, i64 T,
                                              i64 SR, i64 goal, i64 from) {
    if ((i64)work_before[from] * SR >= goal) return from;
    i64 lo = from, step = 1;             // work_before[lo] * SR < goal
    while (lo + step <= T && (i64)work_before[lo + step] * SR < goal) {
        lo += step;
        step <<= 1;
    }
    i64 hi = min(lo + step, T);          // the answer is in (lo, hi]
    while (hi - lo > 1) {
        const i64 mid = (lo + hi) >> 1;
        if ((i64)work_before[mid] * SR >= goal) hi = mid; else lo = mid;
    }
    return hi;
}

// The persistent attention grids' task cuts (fastgnn/backends/cuda/attention.py
// `slot_cuts`, whose host sweep is this kernel's reference, in the same
// integer arithmetic): S slots share T tasks of work work_before (prefix
// sums, [T + 1]) over R rounds. In round r, slot s's cut goes at the task
// boundary nearest (the lower on a tie) to the round's start plus the sum
// over s' <= s of max(W (r + 1) - done_s', 0), all work scaled by S * R so
// every quantity is an integer (W the total work, done_s' slot s' 's work
// so far), never before the previous round's last cut; the last cut is T.
// One block: thread k owns slots [k * per, (k + 1) * per); the running sum
// over slots is a block scan of the threads' sums; each thread then gallops
// from boundary to boundary over its slots' rising goals. Rounds run one
// after another (each needs the slots' work so far).
template <int THREADS>
__global__ void slot_cuts(const long long* __restrict__ work_before,   // [T + 1]
                          i64 T, i64 S, i64 R,
                          long long* __restrict__ done,                // [S], zeros
                          long long* __restrict__ cuts) {              // [S * R + 1]
    __shared__ long long scan[THREADS];
    const int tid = threadIdx.x;
    const i64 SR = S * R, W = (i64)work_before[T];
    const i64 per = (S + THREADS - 1) / THREADS;
    const i64 s0 = min((i64)tid * per, S), s1 = min(s0 + per, S);
    if (tid == 0) cuts[0] = 0;
    i64 last = 0;                        // the previous round's last cut
    for (i64 r = 0; r < R; ++r) {
        const i64 target = W * (r + 1);
        i64 sum = 0;
        for (i64 s = s0; s < s1; ++s) sum += max(target - (i64)done[s], 0LL);
        scan[tid] = sum;
        __syncthreads();
        for (int off = 1; off < THREADS; off <<= 1) {
            const long long v = tid >= off ? scan[tid - off] : 0;
            __syncthreads();
            scan[tid] += v;
            __syncthreads();
        }
        const i64 start = (i64)work_before[last] * SR;
        i64 wanted = (i64)scan[tid] - sum;
        i64 hi = 0;
        for (i64 s = s0; s < s1; ++s) {
            wanted += max(target - (i64)done[s], 0LL);
            const i64 goal = start + wanted;
            hi = first_reaching(work_before, T, SR, goal, hi);
            const i64 lo = max(hi - 1, 0LL);
            i64 end = goal - (i64)work_before[lo] * SR < (i64)work_before[hi] * SR - goal ? lo : hi;
            end = max(end, last);
            if (r == R - 1 && s == S - 1) end = T;
            cuts[1 + r * S + s] = end;
        }
        __syncthreads();
        for (i64 s = s0; s < s1; ++s) {
            const i64 prev = s > 0 ? (i64)cuts[r * S + s] : last;
            done[s] += ((i64)work_before[(i64)cuts[1 + r * S + s]] - (i64)work_before[prev]) * SR;
        }
        last = (i64)cuts[(r + 1) * S];
        __syncthreads();
    }
}

// The work of each task (its edges plus a fixed cost per task), into
// work[1 + t] with work[0] = 0, so that a running sum of `work` gives the
// prefix the slot cuts read (attention.py `_task_work`).
template <typename I>
__global__ void task_work(const I* __restrict__ task_row, const I* __restrict__ task_begin,
                          const I* __restrict__ indptr, i64 T, int chunk, int cost,
                          long long* __restrict__ work) {  // [T + 1]
    const i64 t = thread_index();
    if (t == 0) work[0] = 0;
    if (t >= T) return;
    i64 row, e0, e1;
    task_range(task_row, task_begin, indptr, t, chunk, row, e0, e1);
    work[t + 1] = e1 - e0 + cost;
}
