// Shared device helpers of fastgnn's kernels: value-type traits, packed
// vector loads, float atomics, the acc_t -> value type cast kernel of the
// atomic (deterministic=False) backwards, and one level of the fixed-order
// column sum (spmm's bias gradient, attention's grad_att). Self-contained (no CUDA headers),
// so NVRTC compiles it without include paths.
//
// Value types: float, double, and two 16-bit storage types (fp16, bf16)
// converted with PTX `cvt` instructions; arithmetic is done in `acc_t`
// (float, or double for double).
#pragma once

typedef long long i64;

struct f16_t { unsigned short bits; };
struct bf16_t { unsigned short bits; };

template <typename T> struct value_traits;

template <> struct value_traits<float> {
    typedef float acc_t;
    static __device__ __forceinline__ float to_acc(float v) { return v; }
    static __device__ __forceinline__ float from_acc(float v) { return v; }
};

template <> struct value_traits<double> {
    typedef double acc_t;
    static __device__ __forceinline__ double to_acc(double v) { return v; }
    static __device__ __forceinline__ double from_acc(double v) { return v; }
};

template <> struct value_traits<f16_t> {
    typedef float acc_t;
    static __device__ __forceinline__ float to_acc(f16_t v) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
        return f;
    }
    static __device__ __forceinline__ f16_t from_acc(float f) {
        f16_t v;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(v.bits) : "f"(f));
        return v;
    }
    // the value in the low (high = 0) or high half of a 32-bit word of two
    static __device__ __forceinline__ float half_of_word(unsigned w, int high) {
        f16_t v;
        v.bits = (unsigned short)(high ? w >> 16 : w);
        return to_acc(v);
    }
};

template <> struct value_traits<bf16_t> {
    typedef float acc_t;
    static __device__ __forceinline__ float to_acc(bf16_t v) {
        return __uint_as_float(((unsigned int)v.bits) << 16);
    }
    static __device__ __forceinline__ bf16_t from_acc(float f) {
        bf16_t v;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(v.bits) : "f"(f));
        return v;
    }
    // the value in the low (high = 0) or high half of a 32-bit word of two:
    // one instruction (the word with its low half cleared, or shifted up),
    // where to_acc of an extracted half takes two for the high one (16-bit
    // pairs loaded as words: attention.cu's Row)
    static __device__ __forceinline__ float half_of_word(unsigned w, int high) {
        return __uint_as_float(high ? (w & 0xffff0000u) : (w << 16));
    }
};

// VEC consecutive values moved as one aligned load/store (up to 16 bytes).
template <typename T, int VEC>
struct __align__(sizeof(T) * VEC) pack_t {
    T v[VEC];
};

template <typename T, int VEC>
__device__ __forceinline__ pack_t<T, VEC> load_pack(const T* __restrict__ p) {
    return *reinterpret_cast<const pack_t<T, VEC>*>(p);
}

template <typename T, int VEC>
__device__ __forceinline__ void store_pack(T* __restrict__ p, const pack_t<T, VEC>& v) {
    *reinterpret_cast<pack_t<T, VEC>*>(p) = v;
}

// Sum over the `group` lanes of a lane group (group is a power of two <= 32,
// groups aligned inside the warp); every lane of the group gets the total.
template <typename A>
__device__ __forceinline__ A group_sum(A v, int group) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned mask = (group == 32) ? 0xffffffffu
                                        : (((1u << group) - 1u) << (lane & ~(unsigned)(group - 1)));
    for (int offset = group >> 1; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(mask, v, offset, group);
    return v;
}

// group_sum with the group size known at compile time (GROUP > 0: the
// shuffles unroll and the mask is computed once); GROUP = 0 falls back to
// the runtime `group`.
template <int GROUP, typename A>
__device__ __forceinline__ A group_sum_fixed(A v, int group) {
    if (GROUP == 0) return group_sum(v, group);
    const unsigned lane = threadIdx.x & 31u;
    const unsigned mask = GROUP == 32 ? 0xffffffffu
                                      : (((1u << (GROUP & 31)) - 1u) << (lane & ~(unsigned)(GROUP - 1)));
#pragma unroll
    for (int offset = GROUP >> 1; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(mask, v, offset, GROUP);
    return v;
}

// Lane groups: `group` consecutive lanes (a power of two <= 32, aligned in the
// warp) own one work unit; these give the unit's index and the lane in it.
__device__ __forceinline__ i64 group_index(int group) {
    return ((i64)blockIdx.x * blockDim.x + threadIdx.x) / group;
}

__device__ __forceinline__ int group_lane(int group) { return threadIdx.x & (group - 1); }

// Feature slices: grid dimension y cuts a row's F features into slices of
// `fslice` features (a multiple of group * VEC; fslice >= F: one slice), so
// that few rows of wide features (Cora's 2708 x 1433) still give the GPU
// enough lane groups in flight. Lane l of a group walks
// f0 = slice_begin + l * VEC, step group * VEC, below slice_end.
__device__ __forceinline__ int slice_begin(int fslice) { return (int)blockIdx.y * fslice; }

__device__ __forceinline__ int slice_end(int fslice, int F) {
    const i64 end = ((i64)blockIdx.y + 1) * fslice;
    return end < F ? (int)end : F;
}

// The CSR edge range [e0, e1) of task t (tasks cut rows into <= chunk edges;
// see spmm.cu) and its row.
template <typename I>
__device__ __forceinline__ void task_range(const I* __restrict__ task_row,
                                           const I* __restrict__ task_begin,
                                           const I* __restrict__ indptr, i64 t, int chunk,
                                           i64& row, i64& e0, i64& e1) {
    row = (i64)task_row[t];
    e0 = (i64)task_begin[t];
    const i64 row_end = (i64)indptr[row + 1];
    e1 = e0 + chunk < row_end ? e0 + chunk : row_end;
}

// p[0, VEC) += v[0, VEC) with float atomics (the results unused: reductions):
// 16- and 8-byte vector atomics of float on sm_90, else one per value.
template <typename A, int VEC>
__device__ __forceinline__ void atomic_add_vec(A* __restrict__ p, const A* v) {
#if __CUDA_ARCH__ >= 900
    if constexpr (sizeof(A) == 4 && VEC % 4 == 0) {
#pragma unroll
        for (int q = 0; q < VEC; q += 4)
            atomicAdd(reinterpret_cast<float4*>(p + q), make_float4(v[q], v[q + 1], v[q + 2], v[q + 3]));
        return;
    }
    if constexpr (sizeof(A) == 4 && VEC % 2 == 0) {
#pragma unroll
        for (int q = 0; q < VEC; q += 2)
            atomicAdd(reinterpret_cast<float2*>(p + q), make_float2(v[q], v[q + 1]));
        return;
    }
#endif
#pragma unroll
    for (int q = 0; q < VEC; ++q) atomicAdd(p + q, v[q]);
}

// out[k] = in[k] in the value type (the atomic backwards' fp32 sums of 16-bit
// gradients). Thread per value.
template <typename T>
__global__ void cast_from_acc(const typename value_traits<T>::acc_t* __restrict__ in,
                              T* __restrict__ out, i64 n) {
    const i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n) out[k] = value_traits<T>::from_acc(in[k]);
}

// Tensor Core products (blocksparse.cu's tiles, attention.cu's 16-bit gatv2
// scores). Mma<T>: one k-step d += A B of the warp's product for value type T, A
// 16 x k (4 regs), B k x 8 (2 regs), d 16 x 8 fp32. Rows are read as 32-bit
// words of VPW values (2 for bf16/fp16, 1 for fp32), so a k-step takes 2
// words of a lane per A row and B column in every type:
//   16-bit: mma.m16n8k16, k = 16 (a word holds 2 consecutive k);
//   fp32:   mma.m16n8k8 with TF32 inputs, k = 8 (A reg0 = (g, t), reg1 =
//           (g + 8, t), reg2 = (g, t + 4), reg3 = (g + 8, t + 4); B reg0 =
//           (k t, n g), reg1 = (k t + 4, n g)); every operand rounded to
//           TF32 (10 mantissa bits, round to nearest with ties away
//           from zero: cvt.rna) by op().
// The accumulating products' A operand, 16 rows x 16 tile columns, takes
// A_REGS registers: one 16-bit k-step (4) or two TF32 k-steps (8).
#define MMA_K_STEP(SHAPE, TY)                                                          \
    asm("mma.sync.aligned." SHAPE ".row.col.f32." TY "." TY ".f32 {%0, %1, %2, %3}, " \
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"                              \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                             \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
// The 16-bit types' instructions, by value type (the PTX type name differs).
__device__ __forceinline__ void mma_k16(float* d, const unsigned* a, unsigned b0, unsigned b1,
                                        bf16_t*) { MMA_K_STEP("m16n8k16", "bf16"); }
__device__ __forceinline__ void mma_k16(float* d, const unsigned* a, unsigned b0, unsigned b1,
                                        f16_t*) { MMA_K_STEP("m16n8k16", "f16"); }
__device__ __forceinline__ unsigned pack2(float lo, float hi, bf16_t*) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ unsigned pack2(float lo, float hi, f16_t*) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// bf16 and fp16: m16n8k16 on the words as loaded; a word's values are
// value_traits<T>::half_of_word's.
template <typename T> struct Mma {
    static constexpr int VPW = 2, A_REGS = 4;
    static __device__ __forceinline__ void run(float* d, const unsigned* a, unsigned b0,
                                               unsigned b1) { mma_k16(d, a, b0, b1, (T*)nullptr); }
    static __device__ __forceinline__ unsigned op(unsigned w) { return w; }
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        return pack2(lo, hi, (T*)nullptr);
    }
};

template <> struct Mma<float> {
    static constexpr int VPW = 1, A_REGS = 8;
    static __device__ __forceinline__ void run(float* d, const unsigned* a, unsigned b0,
                                               unsigned b1) { MMA_K_STEP("m16n8k8", "tf32"); }
    static __device__ __forceinline__ unsigned tf32(float x) {
        unsigned r;
        asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
        return r;
    }
    static __device__ __forceinline__ unsigned op(unsigned w) { return tf32(__uint_as_float(w)); }
};

// out[b, c] = sum_{r in [b*R, min((b+1)*R, rows))} in[r, c], summed in order
// in acc_t: one level of a fixed-order column sum (no atomics: bitwise
// repeatable for a given shape and R). S is the type read: a value type
// (first level over a [rows, cols] gradient) or an acc_t (later levels over
// the partial sums). Thread per (b, c): a warp reads consecutive columns of
// one row (coalesced); the loop is unrolled so several rows are in flight
// (the adds stay in row order). Traffic: rows x cols x sizeof(S) read,
// ceil(rows / R) x cols x sizeof(acc_t) written.
template <typename S>
__global__ void column_sum(const S* __restrict__ in,                          // [rows, cols]
                           typename value_traits<S>::acc_t* __restrict__ out,  // [ceil(rows/R), cols]
                           i64 rows, int cols, int R) {
    typedef typename value_traits<S>::acc_t A;
    const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const i64 b = idx / cols;
    const int c = (int)(idx % cols);
    const i64 r0 = b * R;
    if (r0 >= rows) return;
    const i64 r1 = r0 + R < rows ? r0 + R : rows;
    A s = A(0);
#pragma unroll 8
    for (i64 r = r0; r < r1; ++r) s += value_traits<S>::to_acc(in[r * cols + c]);
    out[b * cols + c] = s;
}
