// Block-sparse Tensor Core kernels: the GPU build of the block-sparse form
// (fastgnn/backends/blocksparse.py describes it: windows of 16 target rows,
// tiles of 16 compacted source columns, a 16 x 16 bit mask per tile), and
// over its tiles the dot-product (graph transformer) attention forward and
// backward and the SpMM, as warp-level mma.sync products with fp32
// accumulation: m16n8k16 for bf16 or fp16 inputs, m16n8k8 with TF32 inputs
// for fp32 (Mma<T> in common.cuh; the fragment layouts here are the 16-bit ones, and
// Mma<T> says how the TF32 k-steps map to the same words). Math of the attention: the "dot"
// score of fastgnn/ops/attention.py (s = scale <q_i, k_j>, m = v_j), without
// edge term or dropout; of the SpMM: fastgnn/ops/spmm.py.
//
// Mapping (every product kernel): one warp per (window, head) -- for the
// SpMM per (window, chunk of FC features), for the source pass of wide
// heads per (window, head, part of the channels) -- walking its window's
// tiles in order; 4 warps per block, consecutive warps take the heads of one window
// (its tile columns and masks are read once from L2, then from L1). With
// lane = 4 g + t (g = groupID, t = threadID_in_group of the PTX ISA's
// fragment tables), a lane holds window rows g and g + 8.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16/.f16 A and B, .f32 C):
//   A (16 x 16, row): reg0 = (row g, k 2t..2t+1), reg1 = (g+8, 2t..), reg2 =
//     (g, 2t+8..), reg3 = (g+8, 2t+8..); the lower k in the low 16 bits.
//   B (16 x 8, col):  reg0 = (k 2t..2t+1, n g), reg1 = (k 2t+8..2t+9, n g).
//   C (16 x 8, f32):  c0, c1 = (row g, n 2t, 2t+1), c2, c3 = (row g+8, ...).
// The contraction order is free, so the kernels permute it to make every
// gather a contiguous vector load:
//   * score products (S = Q K^T, dP = G V^T; the source pass's S^T = K Q^T,
//     dP^T = V G^T): the head's channel k of the mma ("logical") is channel
//     t C/4 + 4 kc + 2 hf + i of the row (kc the k-step, hf = 0 for k
//     2t+i, 1 for 2t+8+i), so lane t loads channels [t C/4, (t+1) C/4) of a
//     row as one vector: the "score pattern" (rows g and g + 8 of the window
//     for A, tile columns g and g + 8 for B).
//   * accumulating products (O += P V, dQ += dS K, dV += P^T G, dK += dS^T Q,
//     out += A X): the output channel n of n-tile nt is channel NT n + nt
//     (NT = C / 8 n-tiles), so a lane's B operand for all NT n-tiles is NT
//     consecutive channels [NT g, NT g + NT) of the tile columns 2t, 2t+1,
//     2t+8, 2t+9 (the "value pattern", four vector loads, repacked in
//     registers with byte permutes), and its accumulator holds channels
//     [2 t NT, 2 t NT + 2 NT) of rows g and g + 8: one vector store each.
//   * The score accumulator (C layout) becomes the A operand of the
//     accumulating product in registers (as FlashAttention-2), so S, P, dS
//     never leave registers. tests/test_blocksparse.py emulates these
//     index maps on the CPU.
//
// Attention forward: per tile S = Q K^T (2 n-tiles x C/16 k-steps; C/8 in
// TF32), masked to -inf off the tile's mask bits, online softmax in fp32 in
// the log2 domain (running max per row, per-lane partial sums reduced
// across the 4 lanes of a row at the end), P rounded to the input type (to
// TF32 for fp32), O += P V;
// lse[i, h] (natural log, -inf for rows without edges) is stored for the
// backward. Backward (recompute, FlashAttention-2 order, no atomics, no
// per-edge buffer): the target pass per (window, head) computes D_i =
// <g_i, out_i>, recomputes P = exp(S - lse), dP = G V^T, dS = P (dP - D) and
// dQ = scale dS K; the source pass walks the block-sparse form of the
// transpose (windows of 16 sources, tiles of their targets) and computes
// dV = P^T G and dK = scale dS^T Q from the same recomputation, reading
// lse_i and D_i per tile column. Both passes write every gradient row once:
// bitwise repeatable.
//
// Traffic per (tile, head): forward 16 K rows and 16 V rows of C values
// (2 x 16 x C x 2 bytes in 16 bits; 2 KB at C = 32; twice that in fp32), 64 + 32 bytes of columns and mask
// (served by L1 across the window's heads); per (window, head) Q, out and
// lse once. Target pass: K twice (two patterns; the second from L1) and V;
// source pass: Q and G twice each plus lse and D per column (each warp of
// a split head reads the score patterns whole, the value patterns' part).
// SpMM: per tile 16 X rows of FC values (4 KB at F = 128, bf16) + the mask
// (or 512 bytes of dense tile weights when weighted; fp32: twice both). The gathers of a window's tiles hit L2
// where windows share sources (locally dense graphs: the point of the form).
//
// Builder (fastgnn/backends/cuda/blocksparse.py): keys sorted by CuPy, then
// bsr_heads (first of each (window, source) pair, duplicate count), a CuPy
// cumsum, bsr_window_cols (unique columns per window), a cumsum of tile
// counts, bsr_fill (tile columns, mask bits by atomicOr, or edge slots) and
// bsr_pad (the last tile's padded columns): a few passes over E keys.

#include "common.cuh"

#define BSR_WINDOW 16
#define BSR_WARPS 4          // warps per block of the product kernels

// ------------------------------------------------------------------ builder
// keys[e] = ((row_e >> 4) * ncols + src_e) * 16 + (row_e & 15)
template <typename I>
__global__ void bsr_keys(const I* __restrict__ rows, const I* __restrict__ indices, i64 E,
                         i64 ncols, i64* __restrict__ keys) {
    const i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= E) return;
    const i64 r = (i64)rows[e];
    keys[e] = ((r >> 4) * ncols + (i64)indices[e]) * BSR_WINDOW + (r & 15);
}

// head[i] = 1 where sorted key i starts a new (window, source) pair; dups
// counts keys equal to their predecessor (duplicate edges).
__global__ void bsr_heads(const i64* __restrict__ skey, i64 E, int* __restrict__ head,
                          unsigned long long* __restrict__ dups) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= E) return;
    const i64 k = skey[i];
    const i64 prev = i ? skey[i - 1] : -1;
    head[i] = (i == 0 || (k >> 4) != (prev >> 4)) ? 1 : 0;
    if (i && k == prev) atomicAdd(dups, 1ull);
}

// ncol[w] = unique sources of window w: the sorted keys of window w sit at
// the CSR positions of its rows; ucount is the inclusive prefix sum of head.
template <typename I>
__global__ void bsr_window_cols(const I* __restrict__ indptr, const int* __restrict__ ucount,
                                i64 nwin, i64 nrows, int* __restrict__ ncol) {
    const i64 w = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (w >= nwin) return;
    const i64 r0 = w * BSR_WINDOW, r1 = r0 + BSR_WINDOW < nrows ? r0 + BSR_WINDOW : nrows;
    const i64 s = (i64)indptr[r0], e = (i64)indptr[r1];
    const int base = s > 0 ? ucount[s - 1] : 0;
    ncol[w] = e > s ? ucount[e - 1] - base : 0;
}

// Each sorted key's tile entry: with tile_cols/mask given, the first key of
// a pair writes its source into tile_cols and every key sets its mask bit
// (atomicOr: a row pair shares a 32-bit word); with slot given, key i (the
// CSR edge order[i]) writes slot[order[i]] = tile * 256 + row * 16 + col.
template <typename I>
__global__ void bsr_fill(const i64* __restrict__ skey, const int* __restrict__ ucount,
                         const I* __restrict__ indptr, const int* __restrict__ window_ptr,
                         i64 E, i64 ncols, int* __restrict__ tile_cols,
                         unsigned* __restrict__ mask, const i64* __restrict__ order,
                         int* __restrict__ slot) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= E) return;
    const i64 k = skey[i];
    const i64 pair = k >> 4;
    const i64 w = pair / ncols;
    const int r = (int)(k & 15);
    const i64 s = (i64)indptr[w * BSR_WINDOW];
    const int first = s > 0 ? ucount[s - 1] : 0;
    const int col = ucount[i] - 1 - first;
    const int tile = window_ptr[w] + (col >> 4);
    const int c = col & 15;
    if (slot != nullptr) {
        slot[order[i]] = tile * 256 + r * 16 + c;
        return;
    }
    const bool head = ucount[i] != (i ? ucount[i - 1] : 0);
    if (head) tile_cols[(i64)tile * 16 + c] = (int)(pair - w * ncols);
    atomicOr(mask + (i64)tile * 8 + (r >> 1), 1u << ((r & 1) * 16 + c));
}

// The columns past a window's last source (its last tile) repeat column 0.
__global__ void bsr_pad(const int* __restrict__ window_ptr, const int* __restrict__ ncol, i64 nwin,
                        int* __restrict__ tile_cols) {
    const i64 w = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (w >= nwin) return;
    const int n = ncol[w] & 15;
    if (n == 0) return;
    int* row = tile_cols + (i64)(window_ptr[w + 1] - 1) * 16;
    const int c0 = row[0];
    for (int c = n; c < 16; ++c) row[c] = c0;
}

// ------------------------------------------------------------------ mma helpers
// Mma<T> (common.cuh): one k-step of the warp's product per value type.

// Value i of the words w (VPW per word, the lower index in the low half)
template <typename T>
__device__ __forceinline__ float word_value(const unsigned* w, int i) {
    if constexpr (Mma<T>::VPW == 1) return __uint_as_float(w[i]);
    else return value_traits<T>::half_of_word(w[i >> 1], i & 1);
}

// N values as N / VPW words of T
template <typename T, int N>
__device__ __forceinline__ void pack_words(const float* val, unsigned* w) {
#pragma unroll
    for (int q = 0; q < N / Mma<T>::VPW; ++q) {
        if constexpr (Mma<T>::VPW == 1) w[q] = __float_as_uint(val[q]);
        else w[q] = Mma<T>::pack(val[2 * q], val[2 * q + 1]);
    }
}

// The mma operand form of N words (in place; TF32 rounding for fp32)
template <typename T, int N>
__device__ __forceinline__ void to_operand(unsigned* w) {
#pragma unroll
    for (int q = 0; q < N; ++q) w[q] = Mma<T>::op(w[q]);
}

// N consecutive 32-bit words as the widest aligned vectors
template <int N>
__device__ __forceinline__ void load_words(const unsigned* __restrict__ p, unsigned* w) {
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int q = 0; q < N / 4; ++q) {
            const uint4 v = reinterpret_cast<const uint4*>(p)[q];
            w[4 * q] = v.x; w[4 * q + 1] = v.y; w[4 * q + 2] = v.z; w[4 * q + 3] = v.w;
        }
    } else if constexpr (N == 2) {
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        w[0] = v.x; w[1] = v.y;
    } else {
#pragma unroll
        for (int q = 0; q < N; ++q) w[q] = p[q];
    }
}

template <int N>
__device__ __forceinline__ void store_words(unsigned* __restrict__ p, const unsigned* w) {
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int q = 0; q < N / 4; ++q)
            reinterpret_cast<uint4*>(p)[q] = make_uint4(w[4 * q], w[4 * q + 1], w[4 * q + 2],
                                                        w[4 * q + 3]);
    } else if constexpr (N == 2) {
        *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
    } else {
#pragma unroll
        for (int q = 0; q < N; ++q) p[q] = w[q];
    }
}

template <int N>
__device__ __forceinline__ void zero_words(unsigned* w) {
#pragma unroll
    for (int q = 0; q < N; ++q) w[q] = 0u;
}

// The 16-bit value `half` (0 low, 1 high) of a and of b as one register
// (a's in the low half): the value pattern's B operand of one n-tile.
template <int HALF>
__device__ __forceinline__ unsigned pair_halves(unsigned a, unsigned b) {
    return __byte_perm(a, b, HALF ? 0x7632 : 0x5410);
}

// r * b words as a 64-bit offset (one wide multiply)
__device__ __forceinline__ i64 wide_mul_bs(int r, int b) {
    i64 x;
    asm("mul.wide.s32 %0, %1, %2;" : "=l"(x) : "r"(r), "r"(b));
    return x;
}

// Per-window state shared by the kernels: the lane's rows and its tile walk
struct Lane16 {
    int lane, g, t;
    __device__ __forceinline__ Lane16() {
        lane = threadIdx.x & 31;
        g = lane >> 2;
        t = lane & 3;
    }
};

#define BSR_NEG_INF (-__int_as_float(0x7f800000))

// The sources a lane needs of one tile, from one column index per lane
// (lane & 15) by shuffles: score pattern (columns g, g + 8) and value
// pattern (columns 2t, 2t + 1, 2t + 8, 2t + 9).
struct TileCols {
    int sk[2], vk[4];
    __device__ __forceinline__ void get(int cidx, const Lane16& L) {
        sk[0] = __shfl_sync(0xffffffffu, cidx, L.g);
        sk[1] = __shfl_sync(0xffffffffu, cidx, L.g + 8);
        vk[0] = __shfl_sync(0xffffffffu, cidx, 2 * L.t);
        vk[1] = __shfl_sync(0xffffffffu, cidx, 2 * L.t + 1);
        vk[2] = __shfl_sync(0xffffffffu, cidx, 2 * L.t + 8);
        vk[3] = __shfl_sync(0xffffffffu, cidx, 2 * L.t + 9);
    }
};

// The warp's work unit: window `win` and head (SpMM: feature chunk) h of
// `per` per window, the row stride rw and head offset hw in words (of vpw
// values) of rows of per * width values, and the lane's rows g and g + 8 of
// the window.
struct WarpUnit {
    bool valid;
    int win, h, rw, hw, row[2];
    __device__ __forceinline__ WarpUnit(i64 num_windows, int per, int width, int vpw) {
        const i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
        valid = warp < num_windows * per;
        win = (int)(warp / per);
        h = (int)(warp % per);
        rw = per * width / vpw;
        hw = h * width / vpw;
        const int g = (threadIdx.x & 31) >> 2;
        row[0] = win * BSR_WINDOW + g;
        row[1] = row[0] + 8;
    }
};

// A window's tiles t0 .. t1 - 1 in order; each lane holds one column index
// (lane & 15) of the current tile and prefetches the next tile's.
struct TileWalk {
    int t0, t1, cnext;
    __device__ __forceinline__ TileWalk(const int* __restrict__ window_ptr,
                                        const int* __restrict__ tile_cols, int win,
                                        const Lane16& L) {
        t0 = window_ptr[win];
        t1 = window_ptr[win + 1];
        cnext = t0 < t1 ? tile_cols[(i64)t0 * 16 + (L.lane & 15)] : 0;
    }
    __device__ __forceinline__ TileCols at(int tile, const int* __restrict__ tile_cols,
                                           const Lane16& L) {
        const int ccur = cnext;
        if (tile + 1 < t1) cnext = tile_cols[(i64)(tile + 1) * 16 + (L.lane & 15)];
        TileCols tc;
        tc.get(ccur, L);
        return tc;
    }
};

template <int NT>
__device__ __forceinline__ void zero_acc(float acc[NT][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
}

// The mask rows g and g + 8 of a tile (16 bits each, bit c = column c)
__device__ __forceinline__ void tile_rows(const unsigned* __restrict__ mask, int tile,
                                          const Lane16& L, unsigned* mr) {
    const unsigned w0 = mask[(i64)tile * 8 + (L.g >> 1)];
    const unsigned w1 = mask[(i64)tile * 8 + 4 + (L.g >> 1)];
    const int sh = (L.g & 1) * 16;
    mr[0] = (w0 >> sh) & 0xffffu;
    mr[1] = (w1 >> sh) & 0xffffu;
}

// S (2 n-tiles of the C layout) += A (score pattern rows, [2][QW] words) B^T
// (score pattern columns, [2][QW] words), over C / 16 k-steps.
template <typename T, int QW>
__device__ __forceinline__ void score_product(float s[2][4], const unsigned a[2][QW],
                                              const unsigned b[2][QW]) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int kc = 0; kc < QW / 2; ++kc) {
            const unsigned af[4] = {a[0][2 * kc], a[1][2 * kc], a[0][2 * kc + 1],
                                    a[1][2 * kc + 1]};
            Mma<T>::run(s[j], af, Mma<T>::op(b[j][2 * kc]), Mma<T>::op(b[j][2 * kc + 1]));
        }
}

// The score accumulator (two n-tiles of C layout, fp32) as the A operand of
// the next product (16 rows x 16 tile columns, Mma<T>::A_REGS registers).
// 16-bit: one k16 step, tile column k. TF32: k-step hf takes tile columns
// 8 hf + 2t (as k = t) and 8 hf + 2t + 1 (as k = t + 4), which the value
// pattern's columns vk[2 hf], vk[2 hf + 1] match in value_product.
template <typename T>
__device__ __forceinline__ void acc_to_a(const float s[2][4], unsigned* a) {
    if constexpr (Mma<T>::VPW == 1) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            a[4 * hf] = Mma<T>::tf32(s[hf][0]);
            a[4 * hf + 1] = Mma<T>::tf32(s[hf][2]);
            a[4 * hf + 2] = Mma<T>::tf32(s[hf][1]);
            a[4 * hf + 3] = Mma<T>::tf32(s[hf][3]);
        }
    } else {
        a[0] = Mma<T>::pack(s[0][0], s[0][1]);
        a[1] = Mma<T>::pack(s[0][2], s[0][3]);
        a[2] = Mma<T>::pack(s[1][0], s[1][1]);
        a[3] = Mma<T>::pack(s[1][2], s[1][3]);
    }
}

// acc (NT n-tiles) += A (A_REGS regs) B, B the value pattern [4][NT / VPW]
// words (n-tile nt: value nt of each column's words)
template <typename T, int NT>
__device__ __forceinline__ void value_product(float acc[NT][4], const unsigned* a,
                                              const unsigned v[4][NT / Mma<T>::VPW]) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        if constexpr (Mma<T>::VPW == 1) {
            Mma<T>::run(acc[nt], a, Mma<T>::op(v[0][nt]), Mma<T>::op(v[1][nt]));
            Mma<T>::run(acc[nt], a + 4, Mma<T>::op(v[2][nt]), Mma<T>::op(v[3][nt]));
        } else {
            const unsigned b0 = (nt & 1) ? pair_halves<1>(v[0][nt >> 1], v[1][nt >> 1])
                                         : pair_halves<0>(v[0][nt >> 1], v[1][nt >> 1]);
            const unsigned b1 = (nt & 1) ? pair_halves<1>(v[2][nt >> 1], v[3][nt >> 1])
                                         : pair_halves<0>(v[2][nt >> 1], v[3][nt >> 1]);
            Mma<T>::run(acc[nt], a, b0, b1);
        }
    }
}

// Store the accumulator's row rr (0: row g, 1: g + 8) times `mul`: its NT
// n-tiles' values of C-layout columns 2t and 2t + 1 as two runs of NT / VPW
// words, the second GAP words after the first (GAP = NT / VPW: channels
// [2 t NT, 2 t NT + 2 NT) of the row, one vector; a split head's part leaves
// a gap), to dst (if not null) and, with the bias words of the same channels
// added, to dst_b (if bias).
template <typename T, int NT, int GAP = NT / Mma<T>::VPW>
__device__ __forceinline__ void store_acc_row(const float acc[NT][4], int rr, float mul,
                                              unsigned* __restrict__ dst,
                                              const unsigned* __restrict__ bias,
                                              unsigned* __restrict__ dst_b) {
    constexpr int RW = NT / Mma<T>::VPW;     // words of a run
    constexpr bool JOINED = GAP == RW;
    float val[2 * NT];
#pragma unroll
    for (int x = 0; x < NT; ++x) {
        val[x] = acc[x][2 * rr] * mul;
        val[NT + x] = acc[x][2 * rr + 1] * mul;
    }
    unsigned w[2 * RW];
    auto put = [&](unsigned* __restrict__ p) {
        pack_words<T, 2 * NT>(val, w);
        if constexpr (JOINED) {
            store_words<2 * RW>(p, w);
        } else {
            store_words<RW>(p, w);
            store_words<RW>(p + GAP, w + RW);
        }
    };
    if (dst != nullptr) put(dst);
    if (bias != nullptr) {
        unsigned bw[2 * RW];
        if constexpr (JOINED) {
            load_words<2 * RW>(bias, bw);
        } else {
            load_words<RW>(bias, bw);
            load_words<RW>(bias + GAP, bw + RW);
        }
#pragma unroll
        for (int x = 0; x < 2 * NT; ++x) val[x] += word_value<T>(bw, x);
        put(dst_b);
    }
}

// Score-pattern words of row r (rows past `rows` read as zeros)
template <int QW>
__device__ __forceinline__ void load_score_row(const void* base, int r, int rows, int rw,
                                               int hw, const Lane16& L, unsigned* w) {
    if (r < rows)
        load_words<QW>(reinterpret_cast<const unsigned*>(base) + wide_mul_bs(r, rw) + hw
                       + L.t * QW, w);
    else
        zero_words<QW>(w);
}

template <int QW>
__device__ __forceinline__ void load_score_cols(const void* base, const TileCols& tc, int rw,
                                                int hw, const Lane16& L, unsigned w[2][QW]) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
        load_words<QW>(reinterpret_cast<const unsigned*>(base) + wide_mul_bs(tc.sk[j], rw) + hw
                       + L.t * QW, w[j]);
}

// VW value-pattern words of each of the lane's 4 columns, lane g's at
// word hw + g * stride of the row (stride: VW, or a whole head's words per
// lane where a warp takes a part of the head's channels)
template <int VW>
__device__ __forceinline__ void load_value_cols(const void* base, const TileCols& tc, int rw,
                                                int hw, const Lane16& L, unsigned w[4][VW],
                                                int stride = VW) {
#pragma unroll
    for (int u = 0; u < 4; ++u)
        load_words<VW>(reinterpret_cast<const unsigned*>(base) + wide_mul_bs(tc.vk[u], rw) + hw
                       + L.g * stride, w[u]);
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

#define BSR_LOG2E 1.4426950408889634f
#define BSR_LN2 0.6931471805599453f

// ------------------------------------------------------------ attention forward
// out[i, h] = sum_j p_ij v[j, h], p = softmax_j(scale <q_i, k_j>) over the
// window row's mask bits; lse[i, h]. scale_log2 = scale * log2(e). Rows of
// [rows, H, C]; rw = H C / VPW words per row, hw = h C / VPW.
template <typename T, int C>
__global__ void __launch_bounds__(32 * BSR_WARPS)
bsr_attn_fwd(const int* __restrict__ window_ptr, const int* __restrict__ tile_cols,
             const unsigned* __restrict__ tile_mask, const T* __restrict__ q,
             const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ bias,
             T* __restrict__ out, T* __restrict__ out_b, float* __restrict__ lse,
             i64 num_windows, int num_rows, int H, float scale_log2) {
    constexpr int VPW = Mma<T>::VPW;
    constexpr int QW = C / 4 / VPW;  // score-pattern words per lane and row
    constexpr int NT = C / 8;        // n-tiles of the value product
    constexpr int VW = NT / VPW;     // value-pattern words per lane and column
    constexpr int SW = 2 * NT / VPW; // words of a lane's stored row part
    const WarpUnit U(num_windows, H, C, VPW);
    if (!U.valid) return;
    const Lane16 L;
    const int h = U.h, rw = U.rw, hw = U.hw;
    const int row[2] = {U.row[0], U.row[1]};
    unsigned qa[2][QW];
    load_score_row<QW>(q, row[0], num_rows, rw, hw, L, qa[0]);
    load_score_row<QW>(q, row[1], num_rows, rw, hw, L, qa[1]);
    to_operand<T, QW>(qa[0]);
    to_operand<T, QW>(qa[1]);
    float o[NT][4];
    zero_acc<NT>(o);
    float m[2] = {BSR_NEG_INF, BSR_NEG_INF}, l[2] = {0.f, 0.f};
    TileWalk walk(window_ptr, tile_cols, U.win, L);
    for (int tile = walk.t0; tile < walk.t1; ++tile) {
        const TileCols tc = walk.at(tile, tile_cols, L);
        unsigned mr[2];
        tile_rows(tile_mask, tile, L, mr);
        unsigned kb[2][QW], vb[4][VW];
        load_score_cols<QW>(k, tc, rw, hw, L, kb);
        load_value_cols<VW>(v, tc, rw, hw, L, vb);
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        score_product<T, QW>(s, qa, kb);
        float mx[2] = {BSR_NEG_INF, BSR_NEG_INF};
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = 8 * j + 2 * L.t + (e & 1);
                const float x = ((mr[e >> 1] >> col) & 1u) ? s[j][e] * scale_log2 : BSR_NEG_INF;
                s[j][e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
        float mu[2];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            const float mnew = fmaxf(m[rr], quad_max(mx[rr]));
            mu[rr] = mnew == BSR_NEG_INF ? 0.f : mnew;
            const float corr = exp2f(m[rr] - mu[rr]);
            m[rr] = mnew;
            l[rr] *= corr;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                o[nt][2 * rr] *= corr;
                o[nt][2 * rr + 1] *= corr;
            }
        }
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = exp2f(s[j][e] - mu[e >> 1]);
                s[j][e] = p;
                l[e >> 1] += p;
            }
        unsigned pa[Mma<T>::A_REGS];
        acc_to_a<T>(s, pa);
        value_product<T, NT>(o, pa, vb);
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const float lt = quad_sum(l[rr]);
        if (row[rr] >= num_rows) continue;
        const i64 off = wide_mul_bs(row[rr], rw) + hw + L.t * SW;
        store_acc_row<T, NT>(o, rr, lt > 0.f ? 1.f / lt : 0.f,
                             reinterpret_cast<unsigned*>(out) + off,
                             bias ? reinterpret_cast<const unsigned*>(bias) + hw + L.t * SW
                                  : nullptr,
                             out_b ? reinterpret_cast<unsigned*>(out_b) + off : nullptr);
        if (L.t == 0)
            lse[(i64)row[rr] * H + h] = lt > 0.f ? (m[rr] + log2f(lt)) * BSR_LN2 : BSR_NEG_INF;
    }
}

// ------------------------------------------------------- attention backward
// Target pass: delta[i, h] = <g_i, out_i>; grad_q[i] = scale sum_j ds_ij k_j,
// ds = p (dp - delta), dp_ij = <g_i, v_j>, p = exp(scale <q_i, k_j> - lse_i).
template <typename T, int C>
__global__ void __launch_bounds__(32 * BSR_WARPS)
bsr_attn_bwd_dst(const int* __restrict__ window_ptr, const int* __restrict__ tile_cols,
                 const unsigned* __restrict__ tile_mask, const T* __restrict__ q,
                 const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ out,
                 const T* __restrict__ grad, const float* __restrict__ lse,
                 T* __restrict__ grad_q, float* __restrict__ delta, i64 num_windows,
                 int num_rows, int H, float scale_log2, float scale) {
    constexpr int VPW = Mma<T>::VPW;
    constexpr int QW = C / 4 / VPW, NT = C / 8, VW = NT / VPW, SW = 2 * NT / VPW;
    const WarpUnit U(num_windows, H, C, VPW);
    if (!U.valid) return;
    const Lane16 L;
    const int h = U.h, rw = U.rw, hw = U.hw;
    const int row[2] = {U.row[0], U.row[1]};
    unsigned qa[2][QW], ga[2][QW];
    float D[2], l2[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        unsigned oa[QW];
        load_score_row<QW>(q, row[rr], num_rows, rw, hw, L, qa[rr]);
        load_score_row<QW>(grad, row[rr], num_rows, rw, hw, L, ga[rr]);
        load_score_row<QW>(out, row[rr], num_rows, rw, hw, L, oa);
        float d = 0.f;
#pragma unroll
        for (int x = 0; x < QW * VPW; ++x) d += word_value<T>(ga[rr], x) * word_value<T>(oa, x);
        D[rr] = quad_sum(d);
        to_operand<T, QW>(qa[rr]);
        to_operand<T, QW>(ga[rr]);
        const float ls = row[rr] < num_rows ? lse[(i64)row[rr] * H + h] : 0.f;
        l2[rr] = ls == BSR_NEG_INF ? 0.f : ls * BSR_LOG2E;
        if (L.t == 0 && row[rr] < num_rows) delta[(i64)row[rr] * H + h] = D[rr];
    }
    float dq[NT][4];
    zero_acc<NT>(dq);
    TileWalk walk(window_ptr, tile_cols, U.win, L);
    for (int tile = walk.t0; tile < walk.t1; ++tile) {
        const TileCols tc = walk.at(tile, tile_cols, L);
        unsigned mr[2];
        tile_rows(tile_mask, tile, L, mr);
        unsigned kb[2][QW], vbs[2][QW], kv[4][VW];
        load_score_cols<QW>(k, tc, rw, hw, L, kb);
        load_score_cols<QW>(v, tc, rw, hw, L, vbs);
        load_value_cols<VW>(k, tc, rw, hw, L, kv);
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        float dp[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        score_product<T, QW>(s, qa, kb);
        score_product<T, QW>(dp, ga, vbs);
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = 8 * j + 2 * L.t + (e & 1);
                const int rr = e >> 1;
                const float p = ((mr[rr] >> col) & 1u) ? exp2f(s[j][e] * scale_log2 - l2[rr]) : 0.f;
                s[j][e] = p * (dp[j][e] - D[rr]);
            }
        unsigned da[Mma<T>::A_REGS];
        acc_to_a<T>(s, da);
        value_product<T, NT>(dq, da, kv);
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        if (row[rr] >= num_rows) continue;
        const i64 off = wide_mul_bs(row[rr], rw) + hw + L.t * SW;
        store_acc_row<T, NT>(dq, rr, scale, reinterpret_cast<unsigned*>(grad_q) + off, nullptr,
                             nullptr);
    }
}

// Source pass over the block-sparse form of the transpose (windows of 16
// sources j, tile columns their targets i): grad_v[j] = sum_i p_ij g_i,
// grad_k[j] = scale sum_i ds_ij q_i. SPLIT warps per (window, head) (the
// launcher's: 2 for head rows of 256 bytes or more, else 1), each with the
// n-tiles [part NT / SPLIT, (part + 1) NT / SPLIT) of the accumulating
// products and so its own channels of grad_k and grad_v (two accumulators
// of a whole 256-byte head would spill); every part recomputes the tile's
// full S and dP.
template <typename T, int C, int SPLIT>
__global__ void __launch_bounds__(32 * BSR_WARPS)
bsr_attn_bwd_src(const int* __restrict__ window_ptr, const int* __restrict__ tile_cols,
                 const unsigned* __restrict__ tile_mask, const T* __restrict__ q,
                 const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ grad,
                 const float* __restrict__ lse, const float* __restrict__ delta,
                 T* __restrict__ grad_k, T* __restrict__ grad_v, i64 num_windows, int num_src,
                 int H, float scale_log2, float scale) {
    constexpr int VPW = Mma<T>::VPW;
    constexpr int QW = C / 4 / VPW, NT = C / 8, VW = NT / VPW;
    constexpr int NTP = NT / SPLIT, VWP = NTP / VPW;   // n-tiles and value words of the part
    static_assert(NT % SPLIT == 0 && NTP % VPW == 0 && VWP > 0 && QW % 2 == 0,
                  "a part takes whole value words and whole k-steps");
    const WarpUnit U(num_windows, H * SPLIT, C / SPLIT, VPW);
    if (!U.valid) return;
    const Lane16 L;
    const int h = U.h / SPLIT, part = U.h % SPLIT, rw = U.rw, hw = h * C / VPW;
    const int row[2] = {U.row[0], U.row[1]};
    unsigned ka[2][QW], va[2][QW];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        load_score_row<QW>(k, row[rr], num_src, rw, hw, L, ka[rr]);
        load_score_row<QW>(v, row[rr], num_src, rw, hw, L, va[rr]);
        to_operand<T, QW>(ka[rr]);
        to_operand<T, QW>(va[rr]);
    }
    float dk[NTP][4], dv[NTP][4];
    zero_acc<NTP>(dk);
    zero_acc<NTP>(dv);
    TileWalk walk(window_ptr, tile_cols, U.win, L);
    for (int tile = walk.t0; tile < walk.t1; ++tile) {
        const TileCols tc = walk.at(tile, tile_cols, L);
        unsigned mr[2];
        tile_rows(tile_mask, tile, L, mr);
        unsigned qb[2][QW], gb[2][QW], qv[4][VWP], gv[4][VWP];
        load_score_cols<QW>(q, tc, rw, hw, L, qb);
        load_score_cols<QW>(grad, tc, rw, hw, L, gb);
        load_value_cols<VWP>(q, tc, rw, hw + part * VWP, L, qv, VW);
        load_value_cols<VWP>(grad, tc, rw, hw + part * VWP, L, gv, VW);
        // the lane's score columns 8j + 2t + i are the value pattern's vk[2j + i]
        float lc[4], dc[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const float ls = lse[(i64)tc.vk[u] * H + h];
            lc[u] = ls == BSR_NEG_INF ? 0.f : ls * BSR_LOG2E;
            dc[u] = delta[(i64)tc.vk[u] * H + h];
        }
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        float dp[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        score_product<T, QW>(s, ka, qb);
        score_product<T, QW>(dp, va, gb);
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = 8 * j + 2 * L.t + (e & 1);
                const int u = 2 * j + (e & 1);
                const float p = ((mr[e >> 1] >> col) & 1u) ? exp2f(s[j][e] * scale_log2 - lc[u])
                                                           : 0.f;
                s[j][e] = p;
                dp[j][e] = p * (dp[j][e] - dc[u]);
            }
        unsigned pa[Mma<T>::A_REGS], da[Mma<T>::A_REGS];
        acc_to_a<T>(s, pa);
        acc_to_a<T>(dp, da);
        value_product<T, NTP>(dv, pa, gv);
        value_product<T, NTP>(dk, da, qv);
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        if (row[rr] >= num_src) continue;
        // the part's channels of the lane's rows: runs [2t NT + part NTP, + NTP) and
        // [2t NT + NT + part NTP, + NTP), NT / VPW words apart
        const i64 off = wide_mul_bs(row[rr], rw) + hw + (2 * L.t * NT + part * NTP) / VPW;
        store_acc_row<T, NTP, NT / VPW>(dk, rr, scale, reinterpret_cast<unsigned*>(grad_k) + off,
                                        nullptr, nullptr);
        store_acc_row<T, NTP, NT / VPW>(dv, rr, 1.f, reinterpret_cast<unsigned*>(grad_v) + off,
                                        nullptr, nullptr);
    }
}

// ------------------------------------------------------------------ SpMM
// The SpMM's A operand of one tile (16 rows x 16 tile columns, Mma<T>'s
// register order as acc_to_a): a(r, c) = the weight (WEIGHTED: vals of the
// tile, [16][16] values) or the mask bit, times col_scale of column c.
template <typename T, bool WEIGHTED>
__device__ __forceinline__ void spmm_tile_a(const T* __restrict__ vals,
                                            const unsigned* __restrict__ tile_mask,
                                            const float* __restrict__ col_scale, int tile,
                                            const TileCols& tc, const Lane16& L, unsigned* a) {
    // the lane's entries: rows g + 8 rr, columns 2t + 8 hf + i (value pattern vk[2 hf + i])
    float x[2][2][2];   // [rr][hf][i]
    if (WEIGHTED) {
        const T* tv = vals + (i64)tile * 256;
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const unsigned* w = reinterpret_cast<const unsigned*>(
                    tv + (L.g + 8 * rr) * 16 + 2 * L.t + 8 * hf);
                if constexpr (Mma<T>::VPW == 1) {
                    x[rr][hf][0] = __uint_as_float(w[0]);
                    x[rr][hf][1] = __uint_as_float(w[1]);
                } else {
                    x[rr][hf][0] = value_traits<T>::half_of_word(w[0], 0);
                    x[rr][hf][1] = value_traits<T>::half_of_word(w[0], 1);
                }
            }
    } else {
        unsigned mr[2];
        tile_rows(tile_mask, tile, L, mr);
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf)
#pragma unroll
                for (int i = 0; i < 2; ++i)
                    x[rr][hf][i] = ((mr[rr] >> (2 * L.t + 8 * hf + i)) & 1u) ? 1.f : 0.f;
    }
    if (col_scale != nullptr) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const float cs = col_scale[tc.vk[2 * hf + i]];
                x[0][hf][i] *= cs;
                x[1][hf][i] *= cs;
            }
    }
    // as the score accumulator's C layout: s[hf][2 rr + i]
    float sc[2][4];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
#pragma unroll
            for (int i = 0; i < 2; ++i) sc[hf][2 * rr + i] = x[rr][hf][i];
    acc_to_a<T>(sc, a);
}

// out[i] = r_i sum_j a_ij c_j x[j] (+ bias), a_ij = the mask bit (1) or, with
// WEIGHTED, the dense tile weights vals [num_tiles, 16, 16] (the summed
// weights of duplicate edges; 0 off the mask). One warp per (window, chunk
// of FC features); x, out [rows, F], F = nchunk * FC; row_scale [num_rows],
// col_scale [num_cols] fp32 or null; bias [F] or null.
template <typename T, int FC, bool WEIGHTED>
__global__ void __launch_bounds__(32 * BSR_WARPS)
bsr_spmm(const int* __restrict__ window_ptr, const int* __restrict__ tile_cols,
         const unsigned* __restrict__ tile_mask, const T* __restrict__ vals,
         const float* __restrict__ row_scale, const float* __restrict__ col_scale,
         const T* __restrict__ bias, const T* __restrict__ x, T* __restrict__ out,
         i64 num_windows, int num_rows, int nchunk) {
    constexpr int VPW = Mma<T>::VPW;
    constexpr int NT = FC / 8, VW = NT / VPW, SW = 2 * NT / VPW;
    const WarpUnit U(num_windows, nchunk, FC, VPW);
    if (!U.valid) return;
    const Lane16 L;
    const int rw = U.rw, hw = U.hw;
    const int row[2] = {U.row[0], U.row[1]};
    float acc[NT][4];
    zero_acc<NT>(acc);
    TileWalk walk(window_ptr, tile_cols, U.win, L);
    for (int tile = walk.t0; tile < walk.t1; ++tile) {
        const TileCols tc = walk.at(tile, tile_cols, L);
        unsigned xv[4][VW];
        load_value_cols<VW>(x, tc, rw, hw, L, xv);
        unsigned a[Mma<T>::A_REGS];
        spmm_tile_a<T, WEIGHTED>(vals, tile_mask, col_scale, tile, tc, L, a);
        value_product<T, NT>(acc, a, xv);
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        if (row[rr] >= num_rows) continue;
        const i64 off = wide_mul_bs(row[rr], rw) + hw + L.t * SW;
        const float r = row_scale != nullptr ? row_scale[row[rr]] : 1.f;
        unsigned* dst = reinterpret_cast<unsigned*>(out) + off;
        if (bias != nullptr)   // one store, with the bias
            store_acc_row<T, NT>(acc, rr, r, nullptr,
                                 reinterpret_cast<const unsigned*>(bias) + hw + L.t * SW, dst);
        else
            store_acc_row<T, NT>(acc, rr, r, dst, nullptr, nullptr);
    }
}
