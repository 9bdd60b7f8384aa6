"""CUDA launchers of the block-sparse Tensor Core family
(kernels_cuda/blocksparse.cu): the GPU build of the block-sparse form
(fastgnn/backends/blocksparse.py describes it), the dot-product attention
forward and backward over its tiles, and the SpMM.

`block_sparse(graph)` builds the form once and caches it on the graph
(under "blocksparse"); the attention backward also builds it for
`graph.transpose()` (the source pass walks windows of sources), cached on
the transpose. `attention_unsupported` / `spmm_unsupported` say why a call
cannot run here (None where it can); the dispatcher (fastgnn/blocksparse.py)
asks them first.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from ..blocksparse import TILE, WINDOW, BlockSparse, check_size, fill_stats, num_windows
from .loader import (BLOCKSPARSE_CHUNKS, BLOCKSPARSE_HEADS, BLOCKSPARSE_VTYPES, C_INDEX,
                     C_VALUE, blocksparse_src_split, get_function)
from .plan import launch_now
from .spmm import _ITYPE, NULL, _arg, column_sums, from_acc

BUILD_BLOCK = 256
WARPS = 4                       # BSR_WARPS in blocksparse.cu
CACHE_KEY = "blocksparse"
ALIGN = 16                      # bytes: the kernels' widest vector loads


def _itype(graph):
    return _ITYPE[np.dtype(graph.index_dtype)]


def _builder(graph, name):
    """A builder kernel (compiled into every module; the float32 one is used)."""
    it = _itype(graph)
    templated = {"bsr_keys", "bsr_window_cols", "bsr_fill"}
    full = f"{name}<{C_INDEX[it]}>" if name in templated else name
    return get_function("blocksparse", "float32", it, full)


def _grid1(n):
    return (max(1, -(-int(n) // BUILD_BLOCK)),)


def _sorted_keys(graph, order=False):
    """The build's keys (fastgnn/backends/blocksparse.py: sort_keys), sorted;
    with order, also the sorting permutation (argsort: slower than a sort)."""
    E = graph.num_edges
    keys = cp.empty(E, dtype=np.int64)
    _builder(graph, "bsr_keys")(_grid1(E), (BUILD_BLOCK,),
                                (graph.csr_rows, graph.indices, np.int64(E),
                                 np.int64(max(graph.num_src, 1)), keys))
    if not order:
        return cp.sort(keys), None
    perm = cp.argsort(keys)
    return keys[perm], perm.astype(np.int64, copy=False)


def _unique_count(graph, skey):
    """(head flags' inclusive prefix sum ucount [E] int32, duplicate count on the device)."""
    E = graph.num_edges
    head = cp.empty(E, dtype=np.int32)
    dups = cp.zeros(1, dtype=np.uint64)
    _builder(graph, "bsr_heads")(_grid1(E), (BUILD_BLOCK,), (skey, np.int64(E), head, dups))
    return cp.cumsum(head, dtype=np.int32), dups


def build(graph) -> BlockSparse:
    """The block-sparse form of a CuPy graph (one host sync, for the tile
    count and the statistics)."""
    E, nr, nc = graph.num_edges, graph.num_dst, graph.num_src
    check_size(E, nr, nc)
    nwin = num_windows(nr)
    if E == 0:
        return BlockSparse(nr, nc, 0, 0, cp.zeros(nwin + 1, dtype=np.int32),
                           cp.zeros((0, TILE), dtype=np.int32),
                           cp.zeros((0, WINDOW), dtype=np.uint16), 0,
                           fill_stats(0, 0, 0, 0, nwin))
    skey, _ = _sorted_keys(graph)
    ucount, dups = _unique_count(graph, skey)
    ncol = cp.empty(nwin, dtype=np.int32)
    _builder(graph, "bsr_window_cols")(_grid1(nwin), (BUILD_BLOCK,),
                                       (graph.indptr, ucount, np.int64(nwin), np.int64(nr), ncol))
    ntile = (ncol + (TILE - 1)) // TILE
    window_ptr = cp.zeros(nwin + 1, dtype=np.int32)
    cp.cumsum(ntile, out=window_ptr[1:])
    host = cp.stack([window_ptr[-1].astype(np.int64), dups[0].astype(np.int64), cp.count_nonzero(ntile).astype(np.int64),
                     ntile.max().astype(np.int64)]).get()
    T, ndup, nonempty, max_t = (int(v) for v in host)
    tile_cols = cp.empty((T, TILE), dtype=np.int32)
    mask = cp.zeros((T, WINDOW // 2), dtype=np.uint32)
    _builder(graph, "bsr_fill")(_grid1(E), (BUILD_BLOCK,),
                                (skey, ucount, graph.indptr, window_ptr, np.int64(E),
                                 np.int64(max(nc, 1)), tile_cols, mask, NULL, NULL))
    _builder(graph, "bsr_pad")(_grid1(nwin), (BUILD_BLOCK,),
                               (window_ptr, ncol, np.int64(nwin), tile_cols))
    return BlockSparse(nr, nc, E, ndup, window_ptr, tile_cols,
                       mask.view(np.uint16).reshape(T, WINDOW), max_t,
                       fill_stats(E - ndup, T, nonempty, max_t, nwin))


def block_sparse(graph) -> BlockSparse:
    """The graph's block-sparse form, built once and cached on it."""
    return graph.cached(CACHE_KEY, lambda: build(graph))


def edge_slots(graph, bs: BlockSparse):
    """[E] int32: each CSR edge's entry tile * 256 + row * 16 + column in `bs`
    (duplicates share one), cached on `bs`."""
    def make():
        E = graph.num_edges
        slot = cp.empty(E, dtype=np.int32)
        if E == 0:
            return slot
        skey, order = _sorted_keys(graph, order=True)
        ucount, _ = _unique_count(graph, skey)
        _builder(graph, "bsr_fill")(_grid1(E), (BUILD_BLOCK,),
                                    (skey, ucount, graph.indptr, bs.window_ptr, np.int64(E),
                                     np.int64(max(graph.num_src, 1)), NULL, NULL, order, slot))
        return slot
    if "edge_slot" not in bs.cache:
        bs.cache["edge_slot"] = make()
    return bs.cache["edge_slot"]


def _aligned(a):
    """a (None) as a C-contiguous array whose data is aligned to ALIGN bytes
    (the kernels' vector loads): itself, or a copy (a view into a larger
    buffer may start anywhere)."""
    if a is None:
        return None
    a = cp.ascontiguousarray(a)
    return a if a.data.ptr % ALIGN == 0 else a.copy()


def _mask_words(bs):
    return bs.tile_mask.view(np.uint32)


def _launch(name, vtype, itype, warps):
    fn = get_function("blocksparse", vtype, itype, name)
    return fn, (max(1, -(-warps // WARPS)),), (32 * WARPS,)


# ---------------------------------------------------------------- attention
def attention_unsupported(graph, score, arrays, params, need_alpha, vtype):
    """Why the Tensor Core attention cannot serve this call (a short reason),
    or None where it can."""
    if score != "dot":
        return (f"score={score!r}: its scores are not a product of per-node matrices "
                "(only 'dot' is)")
    if vtype not in BLOCKSPARSE_VTYPES:
        return f"{vtype} inputs (float16, bfloat16 and float32 as TF32 only)"
    q = arrays["q"]
    H, C = int(q.shape[1]), int(q.shape[2])
    widths = BLOCKSPARSE_HEADS[vtype]
    if C not in widths:
        return f"C={C} channels per head in {vtype} (compiled for {widths})"
    if arrays.get("ee") is not None:
        return "an edge term ee (per-edge data the tiles do not carry)"
    if params.drop.active:
        return "attention dropout"
    if need_alpha:
        return "return_attention_weights (per-edge output)"
    if H * C >= 2**31 or max(graph.num_src, graph.num_dst) * H * C >= 2**62:
        return "rows too wide"
    if block_sparse(graph).num_duplicates:
        return "duplicate edges (a mask bit is one edge; each copy weighs in the softmax)"
    return None


def attention_fwd(graph, arrays, params, vtype):
    """(out [num_dst, H, C], lse [num_dst, H] fp32, out + bias or None) of the
    dot score, by bsr_attn_fwd."""
    q, k, v, bias = (_aligned(arrays.get(n)) for n in ("q", "k", "v", "bias"))
    H, C = int(q.shape[1]), int(q.shape[2])
    out = cp.empty((graph.num_dst, H, C), dtype=q.dtype)
    out_b = cp.empty_like(out) if bias is not None else None
    lse = cp.empty((graph.num_dst, H), dtype=np.float32)
    bs = block_sparse(graph)
    nwin = bs.num_windows
    if nwin == 0 or H == 0:
        return out, lse, out_b
    fn, grid, block = _launch(f"bsr_attn_fwd<{C_VALUE[vtype]}, {C}>", vtype, _itype(graph),
                              nwin * H)
    launch_now(fn, grid, (bs.window_ptr, bs.tile_cols, _mask_words(bs), q, k, v, _arg(bias), out,
                          _arg(out_b), lse, np.int64(nwin), np.int32(graph.num_dst), np.int32(H),
                          np.float32(params.scale * np.log2(np.e))), block=block)
    return out, lse, out_b


def attention_bwd(graph, arrays, out, lse, grad_out, params, needs, vtype):
    """{q, k, v, ee, bias: gradient or None} of the dot score: the target pass
    (bsr_attn_bwd_dst: delta and grad_q) over the graph's form, the source
    pass (bsr_attn_bwd_src: grad_k, grad_v) over the transpose's, its heads
    split over blocksparse_src_split warps."""
    q, k, v, bias = arrays["q"], arrays["k"], arrays["v"], arrays.get("bias")
    H, C = int(q.shape[1]), int(q.shape[2])
    grads = {"q": None, "k": None, "v": None, "ee": None, "bias": None}
    if bias is not None and needs.get("bias"):
        grads["bias"] = (cp.zeros_like(bias) if grad_out is None or graph.num_dst == 0 else
                         column_sums(grad_out.reshape(-1, H * C), vtype,
                                     graph.index_dtype).reshape(H, C))
    want_q, want_k, want_v = (bool(needs.get(n)) for n in ("q", "k", "v"))
    if grad_out is None or graph.num_edges == 0 or H == 0:
        for n, want, like in (("q", want_q, q), ("k", want_k, k), ("v", want_v, v)):
            if want:
                grads[n] = cp.zeros_like(like)
        return grads
    if not (want_q or want_k or want_v):
        return grads
    q, k, v, g, out = (_aligned(a) for a in (q, k, v, grad_out, out))
    itype, T = _itype(graph), C_VALUE[vtype]
    sl2, scale = np.float32(params.scale * np.log2(np.e)), np.float32(params.scale)
    bs = block_sparse(graph)
    gq = cp.empty_like(q)
    delta = cp.empty((graph.num_dst, H), dtype=np.float32)
    fn, grid, block = _launch(f"bsr_attn_bwd_dst<{T}, {C}>", vtype, itype, bs.num_windows * H)
    launch_now(fn, grid, (bs.window_ptr, bs.tile_cols, _mask_words(bs), q, k, v, out, g, lse, gq,
                          delta, np.int64(bs.num_windows), np.int32(graph.num_dst), np.int32(H),
                          sl2, scale), block=block)
    if want_q:
        grads["q"] = gq
    if want_k or want_v:
        t = graph.transpose()
        bt = block_sparse(t)
        gk, gv = cp.empty_like(k), cp.empty_like(v)
        if bt.num_windows:
            split = blocksparse_src_split(vtype, C)
            fn, grid, block = _launch(f"bsr_attn_bwd_src<{T}, {C}, {split}>", vtype, itype,
                                      bt.num_windows * H * split)
            launch_now(fn, grid, (bt.window_ptr, bt.tile_cols, _mask_words(bt), q, k, v, g, lse,
                                  delta, gk, gv, np.int64(bt.num_windows),
                                  np.int32(graph.num_src), np.int32(H), sl2, scale), block=block)
        grads["k"] = gk if want_k else None
        grads["v"] = gv if want_v else None
    return grads


# --------------------------------------------------------------------- SpMM
def spmm_chunk(F):
    """Features per warp for width F: the widest compiled chunk dividing F, or None."""
    return next((fc for fc in sorted(BLOCKSPARSE_CHUNKS, reverse=True) if F % fc == 0), None)


def spmm_unsupported(graph, x, vtype):
    if vtype not in BLOCKSPARSE_VTYPES:
        return f"{vtype} features (float16, bfloat16 and float32 as TF32 only)"
    F = int(x.shape[1])
    if spmm_chunk(F) is None:
        return f"F={F} features (a multiple of {min(BLOCKSPARSE_CHUNKS)} needed)"
    if F >= 2**31 or max(graph.num_src, graph.num_dst) * F >= 2**62:
        return "rows too wide"
    return None


def tile_values(graph, bs, weight_csr, vtype):
    """[num_tiles, 16, 16] in the value type: the CSR-order weights [E] placed
    at their tile entries, those of duplicate edges summed (in fp32), 0 off
    the mask. Built per call (weights may change between calls)."""
    import cupyx
    acc = cp.zeros(bs.num_tiles * TILE * WINDOW, dtype=np.float32)
    if graph.num_edges:
        cupyx.scatter_add(acc, edge_slots(graph, bs), weight_csr.astype(np.float32, copy=False))
    if vtype == "float32":
        return acc.reshape(bs.num_tiles, TILE, WINDOW)
    dt = np.uint16 if vtype == "bfloat16" else np.float16
    return from_acc(acc, dt, "spmm", vtype, _itype(graph)).reshape(bs.num_tiles, TILE, WINDOW)


def spmm(graph, x, vtype, weight_csr=None, row_scale=None, col_scale=None, bias=None,
         tile_vals=None):
    """[num_dst, F] = r_i sum_j a_ij c_j x[j] (+ bias) by bsr_spmm over the
    graph's form; a_ij the edge pattern, or weight_csr [E] (CSR order) summed
    per entry (tile_vals: those already placed, tile_values). Scales fp32."""
    F = int(x.shape[1])
    out = cp.empty((graph.num_dst, F), dtype=x.dtype)
    bs = block_sparse(graph)
    if bs.num_windows == 0 or F == 0:
        return out
    fc = spmm_chunk(F)
    if weight_csr is None and tile_vals is None and bs.num_duplicates:
        # a mask bit is one edge: duplicates count through summed unit weights
        weight_csr = cp.ones(graph.num_edges, dtype=np.float32)
    weighted = weight_csr is not None or tile_vals is not None
    if weight_csr is not None and tile_vals is None:
        tile_vals = tile_values(graph, bs, weight_csr, vtype)
    rs = None if row_scale is None else row_scale.astype(np.float32, copy=False)
    cs = None if col_scale is None else col_scale.astype(np.float32, copy=False)
    fn, grid, block = _launch(f"bsr_spmm<{C_VALUE[vtype]}, {fc}, {str(weighted).lower()}>", vtype,
                              _itype(graph), bs.num_windows * (F // fc))
    launch_now(fn, grid, (bs.window_ptr, bs.tile_cols, _mask_words(bs), _arg(tile_vals), _arg(rs),
                          _arg(cs), _arg(_aligned(bias)), _aligned(x), out,
                          np.int64(bs.num_windows), np.int32(graph.num_dst), np.int32(F // fc)),
               block=block)
    return out
