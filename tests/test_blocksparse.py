"""The block-sparse form and its Tensor Core kernels (fastgnn.blocksparse,
kernels_cuda/blocksparse.cu).

CPU: the NumPy twin of the form against a brute-force rebuild of the
adjacency (empty windows, a partial last window, isolated nodes, a hub row,
duplicates, self-loops, bipartite), its edge slots, the dispatcher's
argument checks, and an emulation of the kernels' mma fragment index maps
(the PTX ISA's m16n8k16 tables, the kernels' channel permutations, the
online softmax per tile) against dense float64 math.

GPU (marked gpu): the GPU build equals the twin; the attention forward and
backward and the SpMM against the float64 references in bf16 and fp16
(max errors printed), and against the CUDA-core path; the automatic rule
keeps the CUDA-core path on a uniform random graph.
"""
import numpy as np
import pytest

import fastgnn
from fastgnn import blocksparse as tc
from fastgnn.backends import reference as ref
from fastgnn.backends.blocksparse import (TILE, WINDOW, build_numpy, dense_tiles,
                                          edge_slot_numpy)
from fastgnn.testing import (TOLERANCES, assert_close, awkward_edge_index, from_bf16_bits,
                             rel_err, to_bf16_bits, to_numpy)

gpu = pytest.mark.gpu


def _needs_gpu():
    from fastgnn._array import gpu_available
    return pytest.mark.skipif(not gpu_available(), reason="needs a CUDA device visible to CuPy")


needs_gpu = _needs_gpu()


# ---------------------------------------------------------------- graphs
def _dedup(ei):
    key = np.unique(ei[0] * (ei.max() + 1) + ei[1])
    n = ei.max() + 1
    return np.stack([key // n, key % n]).astype(np.int64)


def _clustered(n=256, block=32, per=200, extra=1, seed=0):
    """Locally dense: blocks of `block` nodes with `per` random in-block
    pairs each, plus `extra` random edges per node; deduplicated."""
    rng = np.random.default_rng(seed)
    base = np.repeat(np.arange(n // block) * block, per)
    src = np.concatenate([base + rng.integers(0, block, base.size), rng.integers(0, n, n * extra)])
    dst = np.concatenate([base + rng.integers(0, block, base.size), np.repeat(np.arange(n), extra)])
    return _dedup(np.stack([src, dst]))


GRAPHS = {
    # empty rows (last tenth), self-loops, duplicates, a hub target (node 0)
    "awkward": lambda: (awkward_edge_index(203, 1500, hub_degree=400, seed=3), 203, None),
    # partial last window (203 rows), isolated nodes, no duplicates
    "awkward_dedup": lambda: (_dedup(awkward_edge_index(203, 1500, hub_degree=400, seed=4)),
                              203, None),
    "clustered": lambda: (_clustered(), 256, None),
    "bipartite": lambda: (awkward_edge_index(70, 600, num_src=45, seed=5), 70, 45),
    # the attention path refuses duplicate edges: the same graph deduplicated
    "bipartite_dedup": lambda: (_dedup(awkward_edge_index(70, 600, num_src=45, seed=5)),
                                70, 45),
    "tiny": lambda: (np.array([[3], [17]]), 20, None),      # one edge, windows 0 and 1
    "empty": lambda: (np.zeros((2, 0), dtype=np.int64), 37, None),
}


def _graph(name, device="cpu"):
    ei, n, ns = GRAPHS[name]()
    kw = {"num_nodes": n} if ns is None else {"num_src": ns, "num_dst": n}
    g = fastgnn.Graph.from_edge_index(ei if device == "cpu" else _cp().asarray(ei), **kw)
    return ei, g


def _cp():
    import cupy
    return cupy


def _rebuild(bs):
    """The 0/1 adjacency [num_rows, num_cols] the form describes, and checks
    of its invariants (sorted unique columns per window, padding)."""
    d = dense_tiles(bs)
    A = np.zeros((bs.num_rows, max(bs.num_cols, 1)))
    wp = np.asarray(bs.window_ptr)
    cols = np.asarray(bs.tile_cols)
    for w in range(bs.num_windows):
        t0, t1 = wp[w], wp[w + 1]
        wc = cols[t0:t1].reshape(-1)
        used = d[t0:t1].any(axis=1).reshape(-1)          # columns with an edge
        n = int(used.sum())
        assert used[:n].all() and not used[n:].any(), "real columns first"
        assert n > (t1 - t0 - 1) * TILE or t0 == t1, "no empty tile"
        assert np.all(np.diff(wc[:n]) > 0), "sorted unique sources"
        if t1 > t0:
            assert np.all(wc[n:] == cols[t1 - 1, 0]), "padding repeats the tile's column 0"
        for t in range(t0, t1):
            r, c = np.nonzero(d[t])
            assert np.all(WINDOW * w + r < bs.num_rows), "mask rows past the last row"
            A[WINDOW * w + r, cols[t, c]] = 1
    return A[:, :bs.num_cols]


@pytest.mark.parametrize("name", list(GRAPHS))
def test_twin_describes_the_graph(name):
    ei, g = _graph(name)
    bs = build_numpy(g.indptr, g.indices, g.num_src)
    A = np.zeros((g.num_dst, g.num_src))
    A[ei[1], ei[0]] = 1
    assert np.array_equal(_rebuild(bs), A)
    E = ei.shape[1]
    unique = int(A.sum())
    assert bs.num_edges == E and bs.num_duplicates == E - unique
    assert bs.num_windows == -(-g.num_dst // WINDOW)
    st = bs.stats
    assert st["unique_edges"] == unique and st["num_tiles"] == bs.num_tiles
    if bs.num_tiles:
        assert st["fill"] == pytest.approx(unique / (bs.num_tiles * 256))
        wp = np.diff(bs.window_ptr)
        assert st["max_tiles_window"] == wp.max() and st["empty_windows"] == (wp == 0).sum()
    else:
        assert st["fill"] == 0 and st["max_tiles_window"] == 0
    assert bs.tile_cols.dtype == np.int32 and bs.tile_mask.dtype == np.uint16
    assert bs.window_ptr.dtype == np.int32


@pytest.mark.parametrize("name", ["awkward", "bipartite", "clustered"])
def test_twin_edge_slots(name):
    ei, g = _graph(name)
    bs = build_numpy(g.indptr, g.indices, g.num_src)
    slot = edge_slot_numpy(g.indptr, g.indices, g.num_src)
    t, r, c = slot // 256, (slot // 16) % 16, slot % 16
    win = np.searchsorted(np.asarray(bs.window_ptr), t, side="right") - 1
    rows = np.repeat(np.arange(g.num_dst), np.diff(g.indptr))
    assert np.array_equal(bs.tile_cols[t, c], g.indices)
    assert np.array_equal(WINDOW * win + r, rows)
    assert np.all(dense_tiles(bs)[t, r, c] == 1)


def test_twin_hub_window_is_long_and_cached_on_the_graph():
    ei, g = _graph("awkward")
    bs = tc.block_sparse(g)
    assert tc.block_sparse(g) is bs                        # cached
    # window 0 holds the hub (node 0): the longest window
    assert bs.stats["max_tiles_window"] == np.diff(bs.window_ptr)[0]
    assert bs.stats["max_tiles_window"] > bs.stats["tiles_per_window"]
    assert not tc.pays(bs.stats) or bs.stats["fill"] >= tc.MIN_FILL


def test_options_are_checked_and_cpu_keeps_the_cuda_core_path():
    ei, g = _graph("clustered")
    x = np.ones((g.num_src, 16), np.float32)
    with pytest.raises(ValueError, match="tensor_cores"):
        fastgnn.spmm(g, x, tensor_cores="yes")
    with pytest.raises(TypeError, match="tensor_cores"):
        fastgnn.spmm(g, x, tensor_cores=1)
    with pytest.raises(ValueError, match="GPU"):
        fastgnn.spmm(g, x, tensor_cores=True)
    q = np.ones((g.num_dst, 2, 16), np.float32)
    with pytest.raises(ValueError, match="GPU"):
        fastgnn.edge_attention(g, "dot", q=q, k=q, v=q, tensor_cores=True)
    out = fastgnn.edge_attention(g, "dot", q=q, k=q, v=q)     # "auto": the CPU kernels
    assert out.shape == q.shape
    with pytest.raises(TypeError, match="tf32"):
        fastgnn.spmm(g, x, tf32="yes")
    with pytest.raises(TypeError, match="tf32"):
        fastgnn.edge_attention(g, "dot", q=q, k=q, v=q, tf32=1)
    out = fastgnn.spmm(g, x, tf32=True)                      # no GPU: the CPU kernels
    assert out.shape == (g.num_dst, 16)


# ------------------------------------------------- fragment emulation (CPU)
# The PTX ISA's m16n8k16 tables (.bf16/.f16 A and B, .f32 C/D), per lane
# (g = lane >> 2, t = lane & 3) and element index i.
def _a_pos(lane, i):
    g, t = lane >> 2, lane & 3
    return g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >= 4)


def _b_pos(lane, i):
    g, t = lane >> 2, lane & 3
    return 2 * t + (i & 1) + 8 * (i >= 2), g


def _c_pos(lane, i):
    g, t = lane >> 2, lane & 3
    return g + 8 * (i >= 2), 2 * t + (i & 1)


# m16n8k8 with .tf32 A and B (the fp32 inputs' kernels): A 16 x 8, B 8 x 8
def _a_pos_k8(lane, i):
    g, t = lane >> 2, lane & 3
    return g + 8 * (i & 1), t + 4 * (i >> 1)


def _b_pos_k8(lane, i):
    g, t = lane >> 2, lane & 3
    return t + 4 * i, g


def _mma(a, b, c):
    """d = A B + C from per-lane fragments: a [32, 8], b [32, 4] (m16n8k16)
    or a [32, 4], b [32, 2] (m16n8k8, TF32), c [32, 4] element values (as
    the tables place them)."""
    k = 2 * a.shape[1]
    a_pos, b_pos = (_a_pos, _b_pos) if k == 16 else (_a_pos_k8, _b_pos_k8)
    A, B = np.full((16, k), np.nan), np.full((k, 8), np.nan)
    for lane in range(32):
        for i in range(a.shape[1]):
            A[a_pos(lane, i)] = a[lane, i]
        for i in range(b.shape[1]):
            B[b_pos(lane, i)] = b[lane, i]
    assert not np.isnan(A).any() and not np.isnan(B).any(), "every element placed once"
    D = A @ B
    return np.array([[c[lane, i] + D[_c_pos(lane, i)] for i in range(4)] for lane in range(32)])


def test_ptx_tables_cover_each_element_once():
    for pos, n, shape in ((_a_pos, 8, (16, 16)), (_b_pos, 4, (16, 8)), (_c_pos, 4, (16, 8)),
                          (_a_pos_k8, 4, (16, 8)), (_b_pos_k8, 2, (8, 8))):
        seen = {pos(lane, i) for lane in range(32) for i in range(n)}
        assert len(seen) == shape[0] * shape[1]


def _score_product(rows, cols_rows, tile_cols, vpw):
    """score_product of one tile, lane by lane: A the window's rows [16, C]
    (rows g, g + 8 of a lane), B the rows of the tile's columns (cols_rows
    [num_cols, C] at tile_cols [16]); the score pattern (lane t holds
    channels [t C/4, (t + 1) C/4) as words of vpw values). Returns the C
    layout [32, 2 n-tiles, 4]."""
    C = rows.shape[1]
    QW = C // 4 // vpw

    def score_words(row_vals, t):         # channel t C/4 + vpw w + i  -> word w, value i
        return row_vals[t * C // 4:(t + 1) * C // 4].reshape(QW, vpw)

    s = np.zeros((32, 2, 4))
    for j in range(2):
        for kc in range(QW // 2):
            a = np.zeros((32, 4 * vpw))
            b = np.zeros((32, 2 * vpw))
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                r0, r1 = score_words(rows[g], t), score_words(rows[g + 8], t)
                a[lane] = np.concatenate([r0[2 * kc], r1[2 * kc], r0[2 * kc + 1], r1[2 * kc + 1]])
                bw = score_words(cols_rows[tile_cols[8 * j + g]], t)
                b[lane] = np.concatenate([bw[2 * kc], bw[2 * kc + 1]])
            s[:, j] = _mma(a, b, s[:, j])
    return s


def _value_steps(a16, vpw):
    """(A fragment, tile-column offsets from 2t) per k-step of an accumulating
    product whose A is the score accumulator a16 [32, 2, 4] (acc_to_a)."""
    if vpw == 2:
        return [(np.concatenate([a16[:, 0, 0:2], a16[:, 0, 2:4], a16[:, 1, 0:2], a16[:, 1, 2:4]],
                                axis=1), (0, 1, 8, 9))]
    return [(a16[:, hf][:, [0, 2, 1, 3]], (8 * hf, 8 * hf + 1)) for hf in range(2)]


def _tile_entries(masks, tile):
    """(lane, n-tile j, element e, tile column c, whether the mask has the
    edge) of every C-layout entry of a tile: row g + 8 (e >> 1) of lane
    4 g + t, column c = 8 j + 2 t + (e & 1)."""
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        mr = (int(masks[tile, g]), int(masks[tile, g + 8]))
        for j in range(2):
            for e in range(4):
                c = 8 * j + 2 * t + (e & 1)
                yield lane, j, e, c, bool((mr[e >> 1] >> c) & 1)


def _emulate_window_fwd(Q, K, V, cols, masks, scale, vpw=2):
    """bsr_attn_fwd's arithmetic for one (window, head), lane by lane: Q
    [16, C] (the window's rows), K, V [num_src, C], cols [T, 16], masks
    [T, 16] (row bits); vpw values per word (2: 16-bit types, m16n8k16; 1:
    fp32 as TF32, m16n8k8). Returns (out [16, C], lse [16])."""
    C = Q.shape[1]
    NT = C // 8
    sl2 = scale * np.log2(np.e)
    o = np.zeros((32, NT, 4))
    m = np.full((32, 2), -np.inf)
    lsum = np.zeros((32, 2))
    for tile in range(cols.shape[0]):
        s = _score_product(Q, K, cols[tile], vpw)
        for lane, j, e, _, edge in _tile_entries(masks, tile):
            s[lane, j, e] = s[lane, j, e] * sl2 if edge else -np.inf
        mu = np.zeros((32, 2))
        for lane in range(32):
            quad = range(lane & ~3, (lane & ~3) + 4)
            for rr in range(2):
                mx = max(s[ql, j, e] for ql in quad for j in range(2) for e in (2 * rr, 2 * rr + 1))
                mnew = max(m[lane, rr], mx)
                mu[lane, rr] = 0 if mnew == -np.inf else mnew
        for lane in range(32):
            for rr in range(2):
                corr = np.exp2(m[lane, rr] - mu[lane, rr])
                mx = max(s[ql, j, e] for ql in range(lane & ~3, (lane & ~3) + 4)
                         for j in range(2) for e in (2 * rr, 2 * rr + 1))
                m[lane, rr] = max(m[lane, rr], mx)
                lsum[lane, rr] *= corr
                o[lane, :, 2 * rr:2 * rr + 2] *= corr
        p = np.exp2(s - mu[:, None, [0, 0, 1, 1]])
        lsum += p.reshape(32, 2, 2, 2).sum(axis=(1, 3))
        for nt in range(NT):
            for a, offs in _value_steps(p, vpw):
                b = np.zeros((32, len(offs)))
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    for i, off in enumerate(offs):
                        b[lane, i] = V[cols[tile, 2 * t + off], NT * g:NT * g + NT][nt]
                o[:, nt] = _mma(a, b, o[:, nt])
    out = np.zeros((16, C))
    lse = np.full(16, -np.inf)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        quad = range(lane & ~3, (lane & ~3) + 4)
        for rr in range(2):
            lt = sum(lsum[ql, rr] for ql in quad)
            vals = np.concatenate([o[lane, :, 2 * rr], o[lane, :, 2 * rr + 1]])
            out[g + 8 * rr, 2 * t * NT:2 * t * NT + 2 * NT] = vals / lt if lt > 0 else 0
            if t == 0 and lt > 0:
                lse[g + 8 * rr] = (m[lane, rr] + np.log2(lt)) * np.log(2)
    return out, lse


@pytest.mark.parametrize("vpw", [2, 1], ids=["16bit", "tf32"])
@pytest.mark.parametrize("C", [16, 32])
def test_fragment_emulation_of_the_forward_matches_dense_math(C, vpw):
    """The kernel's index maps (channel permutations, score -> A operand,
    value pattern, store) reproduce dense attention on one window."""
    ei, g = _graph("clustered")
    bs = build_numpy(g.indptr, g.indices, g.num_src)
    rng = np.random.default_rng(0)
    Q, K, V = (rng.standard_normal((g.num_dst, C)) for _ in range(3))
    A = np.zeros((g.num_dst, g.num_src), bool)
    A[ei[1], ei[0]] = True
    scale = 1 / np.sqrt(C)
    for w in (0, 5):
        t0, t1 = bs.window_ptr[w], bs.window_ptr[w + 1]
        out, lse = _emulate_window_fwd(Q[16 * w:16 * w + 16], K, V, bs.tile_cols[t0:t1],
                                       bs.tile_mask[t0:t1], scale, vpw)
        for r in range(16):
            i = 16 * w + r
            s = np.where(A[i], scale * K @ Q[i], -np.inf)
            if not A[i].any():
                assert not out[r].any() and lse[r] == -np.inf
                continue
            p = np.exp(s - s.max())
            np.testing.assert_allclose(out[r], (p / p.sum()) @ V, rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(lse[r], s.max() + np.log(p.sum()), rtol=1e-12)


def _emulate_window_src(Kr, Vr, Q, G, lse, delta, cols, masks, scale, vpw, split):
    """bsr_attn_bwd_src's arithmetic for one window, lane by lane and part by
    part: Kr, Vr [16, C] the window's rows, Q, G [num_cols, C] the rows of the
    tile columns, lse, delta [num_cols]; cols [T, 16], masks [T, 16] (row
    bits); vpw values per word, split warps per head, each with n-tiles
    [part NT/split, (part + 1) NT/split). Returns (grad_k, grad_v) [16, C]
    as the parts' two-run stores leave them."""
    C = Kr.shape[1]
    NT = C // 8
    NTP = NT // split
    sl2 = scale * np.log2(np.e)
    gk, gv = np.full((16, C), np.nan), np.full((16, C), np.nan)
    for part in range(split):
        dk, dv = np.zeros((32, NTP, 4)), np.zeros((32, NTP, 4))
        for tile in range(cols.shape[0]):
            s = _score_product(Kr, Q, cols[tile], vpw)
            dp = _score_product(Vr, G, cols[tile], vpw)
            for lane, j, e, c, edge in _tile_entries(masks, tile):
                col = cols[tile, c]
                p = np.exp2(s[lane, j, e] * sl2 - lse[col] * np.log2(np.e)) if edge else 0.0
                s[lane, j, e] = p
                dp[lane, j, e] = p * (dp[lane, j, e] - delta[col])
            for acc, a16, rows in ((dv, s, G), (dk, dp, Q)):
                for ntl in range(NTP):
                    nt = part * NTP + ntl
                    for a, offs in _value_steps(a16, vpw):
                        b = np.zeros((32, len(offs)))
                        for lane in range(32):
                            g, t = lane >> 2, lane & 3
                            for i, off in enumerate(offs):
                                b[lane, i] = rows[cols[tile, 2 * t + off], NT * g + nt]
                        acc[:, ntl] = _mma(a, b, acc[:, ntl])
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            for rr in range(2):
                for run in range(2):
                    at = 2 * t * NT + run * NT + part * NTP
                    gk[g + 8 * rr, at:at + NTP] = dk[lane, :, 2 * rr + run] * scale
                    gv[g + 8 * rr, at:at + NTP] = dv[lane, :, 2 * rr + run]
    return gk, gv


@pytest.mark.parametrize("vpw,split", [(2, 1), (2, 2), (1, 1), (1, 2)],
                         ids=["16bit", "16bit-split", "tf32", "tf32-split"])
def test_fragment_emulation_of_the_source_pass_matches_dense_math(vpw, split):
    """The source pass's index maps (recomputed S and dP, the value products
    of P^T G and dS^T Q, a split head's parts and their two-run stores)
    reproduce dense gradients on one window; every channel is stored once."""
    C = 32
    ei, g = _graph("clustered")
    bs = build_numpy(g.indptr, g.indices, g.num_src)
    rng = np.random.default_rng(5)
    K, V = (rng.standard_normal((g.num_dst, C)) for _ in range(2))   # the window's rows
    Q, G = (rng.standard_normal((g.num_src, C)) for _ in range(2))   # the tile columns' rows
    lse, delta = rng.standard_normal(g.num_src), rng.standard_normal(g.num_src)
    A = np.zeros((g.num_dst, g.num_src), bool)
    A[ei[1], ei[0]] = True
    scale = 1 / np.sqrt(C)
    for w in (0, 5):
        t0, t1 = bs.window_ptr[w], bs.window_ptr[w + 1]
        rows = slice(16 * w, 16 * w + 16)
        gk, gv = _emulate_window_src(K[rows], V[rows], Q, G, lse, delta, bs.tile_cols[t0:t1],
                                     bs.tile_mask[t0:t1], scale, vpw, split)
        assert not np.isnan(gk).any() and not np.isnan(gv).any(), "every channel stored"
        for r in range(16):
            j = 16 * w + r
            p = np.where(A[j], np.exp(scale * Q @ K[j] - lse), 0.0)
            ds = p * (G @ V[j] - delta)
            np.testing.assert_allclose(gv[r], p @ G, rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(gk[r], scale * ds @ Q, rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------- GPU
VTYPES = ["bfloat16", "float16", "float32"]     # float32: as TF32 (tf32=True)
# Tolerances (relative error of the whole output): 16-bit outputs are rounded
# to the type (TOLERANCES); TF32 rounds every product's inputs to 10 mantissa
# bits (unit roundoff 2^-11) and keeps fp32 sums: 4 units.
FWD_TOL = {"bfloat16": TOLERANCES["bfloat16"], "float16": TOLERANCES["float16"],
           "float32": 4 * 2.0**-11}
# gradients: delta from the rounded out, P and dS rounded for the products,
# and dS = P (dP - delta) subtracts nearly equal terms: in TF32 16 units
# (the largest on the H200: tiny graph, C = 64, grad q, 6.8 units)
GRAD_TOL = {"bfloat16": 3e-2, "float16": 3e-2, "float32": 16 * 2.0**-11}


def _tf32(vtype):
    """The keyword that lets fp32 inputs take the Tensor Core kernels."""
    return {"tf32": True} if vtype == "float32" else {}


def _compiled(vtype, C):
    from fastgnn.backends.cuda.loader import BLOCKSPARSE_HEADS
    return C in BLOCKSPARSE_HEADS[vtype]


def _cast(a, vtype):
    """float64 NumPy -> (CuPy array of vtype (bf16 as uint16 bits), the values it holds)."""
    cp = _cp()
    if vtype == "bfloat16":
        bits = to_bf16_bits(a)
        return cp.asarray(bits), from_bf16_bits(bits).astype(np.float64)
    h = a.astype(np.float16 if vtype == "float16" else np.float32)
    return cp.asarray(h), h.astype(np.float64)


def _values(a, vtype):
    a = to_numpy(a)
    return from_bf16_bits(a).astype(np.float64) if vtype == "bfloat16" else a.astype(np.float64)


@gpu
@needs_gpu
@pytest.mark.parametrize("name", list(GRAPHS))
def test_gpu_build_equals_the_twin(name):
    ei, g = _graph(name, "cuda")
    from fastgnn.backends.cuda.blocksparse import build, edge_slots
    bs = build(g)
    tw = build_numpy(to_numpy(g.indptr), to_numpy(g.indices), g.num_src)
    for f in ("window_ptr", "tile_cols", "tile_mask"):
        assert np.array_equal(to_numpy(getattr(bs, f)), getattr(tw, f)), f
    assert bs.num_duplicates == tw.num_duplicates and bs.stats == tw.stats
    slot = to_numpy(edge_slots(g, bs))
    assert np.array_equal(slot, edge_slot_numpy(to_numpy(g.indptr), to_numpy(g.indices),
                                                g.num_src))


ATTN_GRAPHS = ["awkward_dedup", "clustered", "bipartite_dedup", "tiny", "empty"]


def _attention_case(name, vtype, H, C, bias, rng):
    ei, g = _graph(name, "cuda")
    nd, ns = g.num_dst, g.num_src
    arrs, vals = {}, {}
    for key, n in (("q", nd), ("k", ns), ("v", ns)):
        arrs[key], vals[key] = _cast(rng.standard_normal((n, H, C)), vtype)
    if bias:
        arrs["bias"], vals["bias"] = _cast(rng.standard_normal((H, C)), vtype)
    return ei, g, arrs, vals


@gpu
@needs_gpu
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("H,C", [(1, 16), (3, 32), (2, 64), (2, 128)])
@pytest.mark.parametrize("vtype", VTYPES)
@pytest.mark.parametrize("name", ATTN_GRAPHS)
def test_gpu_attention_forward_matches_reference(name, vtype, H, C, bias):
    if not _compiled(vtype, C):
        pytest.skip(f"the Tensor Core attention is not compiled for C={C} in {vtype}")
    rng = np.random.default_rng(1)
    ei, g, arrs, vals = _attention_case(name, vtype, H, C, bias, rng)
    vt = {"vtype": vtype, **_tf32(vtype)}
    out, res = fastgnn.edge_attention_fwd(g, "dot", **arrs, tensor_cores=True, **vt)
    assert res.tensor_cores
    r_out, _ = ref.edge_attention(ei, "dot", g.num_dst, vals)
    got = _values(out, vtype)
    err = rel_err(got, r_out)
    print(f"tc attention fwd {name} {vtype} H={H} C={C} bias={bias}: rel err {err:.2e}, "
          f"max abs err {np.abs(got - r_out).max() if got.size else 0:.2e}")
    assert_close(got, r_out, vtype, "out", tol=FWD_TOL[vtype])
    # lse: natural log of the row sums, -inf for rows without edges
    lse = to_numpy(res.lse)
    deg = np.bincount(ei[1], minlength=g.num_dst)
    assert np.all(np.isneginf(lse[deg == 0]))
    assert np.all(np.isfinite(lse[deg > 0]))
    # the CUDA-core path agrees
    out_cc, res_cc = fastgnn.edge_attention_fwd(g, "dot", **arrs, tensor_cores=False, **vt)
    assert not res_cc.tensor_cores
    assert_close(got, _values(out_cc, vtype), vtype, "out vs the CUDA-core path",
                 tol=FWD_TOL[vtype])
    if g.num_edges:
        np.testing.assert_allclose(lse[deg > 0], to_numpy(res_cc.lse)[deg > 0], rtol=2e-2,
                                   atol=2e-2)


@gpu
@needs_gpu
@pytest.mark.parametrize("H,C", [(1, 16), (3, 32), (2, 64), (2, 128)])
@pytest.mark.parametrize("vtype", VTYPES)
@pytest.mark.parametrize("name", ATTN_GRAPHS)
def test_gpu_attention_backward_matches_reference(name, vtype, H, C):
    if not _compiled(vtype, C):
        pytest.skip(f"the Tensor Core attention is not compiled for C={C} in {vtype}")
    rng = np.random.default_rng(2)
    ei, g, arrs, vals = _attention_case(name, vtype, H, C, True, rng)
    go_d, go = _cast(rng.standard_normal((g.num_dst, H, C)), vtype)
    out, res = fastgnn.edge_attention_fwd(g, "dot", **arrs, tensor_cores=True, vtype=vtype,
                                          **_tf32(vtype))
    grads = dict(zip(("q", "k", "v", "ee", "bias"), fastgnn.edge_attention_bwd(g, res, go_d)))
    r = ref.edge_attention_vjp(ei, "dot", g.num_dst, vals, go)
    for n in ("q", "k", "v", "bias"):
        got = _values(grads[n], vtype)
        err = rel_err(got, r[n])
        print(f"tc attention bwd {name} {vtype} H={H} C={C} grad {n}: rel err {err:.2e}")
        assert_close(got, r[n], vtype, f"grad {n}", tol=GRAD_TOL[vtype])


@gpu
@needs_gpu
def test_gpu_attention_refuses_what_it_cannot_serve():
    cp = _cp()
    ei, g = _graph("awkward", "cuda")                      # duplicates
    q = cp.zeros((g.num_dst, 2, 32), dtype=cp.float16)
    with pytest.raises(ValueError, match="duplicate"):
        fastgnn.edge_attention(g, "dot", q=q, k=q, v=q, tensor_cores=True)
    out = fastgnn.edge_attention(g, "dot", q=q, k=q, v=q)  # auto: the CUDA-core path
    assert out.shape == q.shape
    ei, g = _graph("clustered", "cuda")
    q32 = cp.zeros((g.num_dst, 2, 32), dtype=cp.float32)
    with pytest.raises(ValueError, match="tf32=True"):
        fastgnn.edge_attention(g, "dot", q=q32, k=q32, v=q32, tensor_cores=True)
    _, res = fastgnn.edge_attention_fwd(g, "dot", q=q32, k=q32, v=q32)   # auto, no tf32
    assert not res.tensor_cores
    assert tc.pays(tc.block_sparse(g).stats)
    _, res = fastgnn.edge_attention_fwd(g, "dot", q=q32, k=q32, v=q32, tf32=True)
    assert res.tensor_cores
    x32 = cp.zeros((g.num_src, 32), dtype=cp.float32)
    with pytest.raises(ValueError, match="tf32=True"):
        fastgnn.spmm(g, x32, tensor_cores=True)
    q128 = cp.zeros((g.num_dst, 1, 128), dtype=cp.float32)
    with pytest.raises(ValueError, match="C=128"):
        fastgnn.edge_attention(g, "dot", q=q128, k=q128, v=q128, tensor_cores=True, tf32=True)
    with pytest.raises(TypeError, match="tf32"):
        fastgnn.edge_attention(g, "dot", q=q32, k=q32, v=q32, tf32="yes")
    q = cp.zeros((g.num_dst, 2, 32), dtype=cp.float16)
    with pytest.raises(ValueError, match="dropout"):
        fastgnn.edge_attention(g, "dot", q=q, k=q, v=q, dropout=0.5, tensor_cores=True)
    with pytest.raises(ValueError, match="gatv2"):
        fastgnn.edge_attention(g, "gatv2", xl=q, xr=q, att=q[0], tensor_cores=True)


@gpu
@needs_gpu
def test_gpu_auto_keeps_the_cuda_core_path_on_random_graphs():
    cp = _cp()
    rng = np.random.default_rng(3)
    n = 1 << 14
    ei = _dedup(np.stack([rng.integers(0, n, 16 * n), rng.integers(0, n, 16 * n)]))
    g = fastgnn.Graph.from_edge_index(cp.asarray(ei), num_nodes=n)
    q = cp.zeros((n, 4, 32), dtype=cp.float16)
    _, res = fastgnn.edge_attention_fwd(g, "dot", q=q, k=q, v=q)
    st = tc.block_sparse(g).stats
    print(f"uniform 2^14 x 16: fill {st['fill']:.3f}, tiles/window {st['tiles_per_window']:.1f}")
    assert not res.tensor_cores and not tc.pays(st)
    assert st["tiles_per_window"] > tc.MAX_TILES_PER_WINDOW


# (fill, tiles per window, max tiles per window) of the H200 probe's graphs
# (fastgnn/blocksparse.py) and the path that was faster on them
MEASURED = {"clustered19": (0.279, 6.0, 6, True), "knn": (0.162, 6.19, 10, True),
            "molecules": (0.072, 2.0, 2, True), "mesh3d": (0.062, 5.97, 6, True),
            "grid": (0.062, 4.0, 4, True), "uniform20": (0.061, 16.47, 21, False),
            "rmat20": (0.067, 15.66, 5186, False)}


@pytest.mark.parametrize("name", list(MEASURED))
def test_auto_rule_picks_the_measured_faster_path(name):
    fill, per_window, most, faster = MEASURED[name]
    stats = {"num_tiles": 1000, "fill": fill, "tiles_per_window": per_window,
             "max_tiles_window": most}
    assert tc.pays(stats) == faster


# the TF32 SpMM on the same graphs (fastgnn/blocksparse.py): faster where
# the Tensor Core path was faster in fp32
TF32_SPMM_FASTER = {"clustered19": True, "knn": True, "molecules": True, "mesh3d": False,
                    "grid": False, "uniform20": False, "rmat20": False}


@pytest.mark.parametrize("name", list(MEASURED))
def test_auto_rule_picks_the_measured_faster_tf32_spmm(name):
    fill, per_window, most, _ = MEASURED[name]
    stats = {"num_tiles": 1000, "fill": fill, "tiles_per_window": per_window,
             "max_tiles_window": most}
    assert tc.pays(stats, "spmm", "float32") == TF32_SPMM_FASTER[name]
    assert tc.pays(stats, "attention", "float32") == tc.pays(stats)


SPMM_CASES = {   # name: (graph, reduce, weighted, scales, bias)
    "sum": ("clustered", "sum", False, False, False),
    "mean_dups": ("awkward", "mean", False, False, False),      # duplicates count twice
    "weighted_dups": ("awkward", "sum", True, False, True),
    "scaled": ("bipartite", "sum", False, True, False),
    "tiny": ("tiny", "sum", True, True, True),
    "empty": ("empty", "sum", False, False, True),
}


@gpu
@needs_gpu
@pytest.mark.parametrize("F", [16, 32, 64, 128, 192])
@pytest.mark.parametrize("vtype", VTYPES)
@pytest.mark.parametrize("case", list(SPMM_CASES))
def test_gpu_spmm_matches_reference(case, vtype, F):
    cp = _cp()
    name, reduce, weighted, scales, bias = SPMM_CASES[case]
    ei, g = _graph(name, "cuda")
    rng = np.random.default_rng(4)
    x_d, x = _cast(rng.standard_normal((g.num_src, F)), vtype)
    w = rng.uniform(0.5, 1.5, ei.shape[1]) if weighted else None
    b_d, b = _cast(rng.standard_normal(F), vtype) if bias else (None, None)
    r = rng.uniform(0.5, 1.5, g.num_dst) if scales else None
    c = rng.uniform(0.5, 1.5, g.num_src) if scales else None
    kw = dict(reduce=reduce, vtype=vtype,
              edge_weight=None if w is None else cp.asarray(w, dtype=cp.float32),
              bias=b_d, row_scale=None if r is None else cp.asarray(r, dtype=cp.float32),
              col_scale=None if c is None else cp.asarray(c, dtype=cp.float32))
    out, res = fastgnn.spmm_fwd(g, x_d, tensor_cores=True, **kw, **_tf32(vtype))
    assert res.tensor_cores
    # the reference: scales folded into the weights
    we = np.ones(ei.shape[1]) if w is None else w.copy()
    if scales:
        we = we * r[ei[1]] * c[ei[0]]
    want = ref.spmm(ei, x, we, reduce, num_dst=g.num_dst, bias=b)
    got = _values(out, vtype)
    print(f"tc spmm {case} {vtype} F={F}: rel err {rel_err(got, want):.2e}")
    assert_close(got, want, vtype, "out", tol=FWD_TOL[vtype])
    go_d, go = _cast(rng.standard_normal((g.num_dst, F)), vtype)
    gx, _, _ = fastgnn.spmm_bwd(g, res, go_d, needs_weight_grad=False)
    # grad_x = A^T (s * g) with the reference's weights
    deg = np.bincount(ei[1], minlength=g.num_dst).astype(np.float64)
    s = np.where(deg > 0, 1 / np.maximum(deg, 1), 0) if reduce == "mean" else np.ones(g.num_dst)
    want_gx = np.zeros((g.num_src, F))
    np.add.at(want_gx, ei[0], (we * s[ei[1]])[:, None] * go[ei[1]])
    got_gx = _values(gx, vtype)
    print(f"tc spmm {case} {vtype} F={F} grad x: rel err {rel_err(got_gx, want_gx):.2e}")
    assert_close(got_gx, want_gx, vtype, "grad x", tol=FWD_TOL[vtype] * 2)
