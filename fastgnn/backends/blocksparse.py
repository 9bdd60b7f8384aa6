"""Block-sparse form of a graph for Tensor Core kernels: the record, its
fill statistics, and the NumPy builder (the CPU twin and test oracle of the
GPU builder in fastgnn/backends/cuda/blocksparse.py).

The CSR-by-destination rows are cut into *windows* of WINDOW = 16
consecutive target rows (the M of mma.m16n8k16). A window's columns are the
sorted unique sources of its edges, compacted and cut into *tiles* of
TILE = 16 columns (the K of the P.V product, twice the N of the score
product); per tile a 16 x 16 bit mask says which (row, column) pairs are
edges:

    window_ptr [num_windows + 1] int32   window w owns tiles window_ptr[w] .. window_ptr[w+1]-1
    tile_cols  [num_tiles, 16]   int32   the source node of each tile column; the columns
                                         past a window's last source (its last tile only)
                                         repeat the tile's column 0 and have no mask bit
    tile_mask  [num_tiles, 16]   uint16  bit c of tile_mask[t, r] = edge tile_cols[t, c]
                                         -> target 16 w + r (row r of the window)

Windows without edges own no tile. Row r of the last window exists only
where 16 w + r < num_dst. In memory a tile's mask is 32 bytes; kernels read
it as 8 little-endian 32-bit words (word q: rows 2q in the low, 2q + 1 in
the high 16 bits).

Duplicate edges (the same source -> target pair more than once) set one
mask bit: the mask records the pattern, not a count. `num_duplicates`
counts the extra copies; the attention dispatcher keeps the CUDA-core path
for such graphs (each copy weighs in its softmax there), SpMM may use the
tiles with the copies' weights summed (`edge_slot` maps every CSR edge to
its tile entry).

Fill statistics (host scalars, computed once at build):

    fill              = unique edges / (num_tiles * 256): the share of the tiles'
                        products that are edges (1 = dense tiles)
    tiles_per_window  = num_tiles / windows with tiles
    max_tiles_window  = the longest window (one warp walks it: hubs make it long)

The build sorts the key ((row // 16) * num_src + src) * 16 + row % 16 once:
equal windows and sources become adjacent (the unique columns, in source
order), the low 4 bits keep the row, so equal keys are exactly the
duplicate edges.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

WINDOW = 16
TILE = 16
INT32_MAX = 2**31 - 1


@dataclass
class BlockSparse:
    """One graph's block-sparse form (see the module docstring). Arrays are
    NumPy or CuPy, as the graph's."""
    num_rows: int              # the graph's num_dst
    num_cols: int              # the graph's num_src
    num_edges: int             # the graph's edges (duplicates included)
    num_duplicates: int        # edges repeating an earlier (source, target) pair
    window_ptr: object         # [num_windows + 1] int32
    tile_cols: object          # [num_tiles, 16] int32
    tile_mask: object          # [num_tiles, 16] uint16
    max_tiles_window: int
    stats: dict = field(default_factory=dict)
    cache: dict = field(default_factory=dict)   # per-use data (tile weights, ...)

    @property
    def num_windows(self) -> int:
        return int(self.window_ptr.shape[0]) - 1

    @property
    def num_tiles(self) -> int:
        return int(self.tile_cols.shape[0])

    @property
    def fill(self) -> float:
        return self.stats["fill"]


def num_windows(num_rows: int) -> int:
    return -(-num_rows // WINDOW)


def check_size(num_edges, num_rows, num_cols):
    """Raise NotImplementedError where the int32 tile arrays cannot hold the
    graph (a tile per edge at worst, 16 columns each)."""
    if max(num_edges * TILE, num_rows, num_cols) > INT32_MAX:
        raise NotImplementedError("the block-sparse form holds graphs of fewer than 2^27 edges "
                                  "and 2^31 nodes (int32 tile arrays)")


def fill_stats(num_unique, num_tiles, nonempty_windows, max_tiles_window, num_windows_):
    """The statistics dict of a build (see the module docstring)."""
    return {"fill": float(num_unique) / (num_tiles * TILE * WINDOW) if num_tiles else 0.0,
            "tiles_per_window": float(num_tiles) / nonempty_windows if nonempty_windows else 0.0,
            "max_tiles_window": int(max_tiles_window),
            "num_tiles": int(num_tiles), "num_windows": int(num_windows_),
            "empty_windows": int(num_windows_ - nonempty_windows),
            "unique_edges": int(num_unique)}


def sort_keys(xp, rows, src, num_cols):
    """The build's int64 keys ((row // 16) * num_cols + src) * 16 + row % 16."""
    rows = rows.astype(np.int64)
    return ((rows >> 4) * max(num_cols, 1) + src.astype(np.int64)) * WINDOW + (rows & 15)


def _layout(skey, nwin, num_cols):
    """The tile entry of every sorted key: (head: first of its (window,
    source) pair, source, row in window, tile, column in tile, columns per
    window, window_ptr), all int64 NumPy arrays."""
    E = skey.shape[0]
    pair = skey >> 4
    head = np.ones(E, dtype=bool)
    head[1:] = pair[1:] != pair[:-1]
    ncols = max(num_cols, 1)
    win, src, r = pair // ncols, pair % ncols, skey & 15
    ncol = np.bincount(win[head], minlength=nwin).astype(np.int64)
    window_ptr = np.zeros(nwin + 1, dtype=np.int64)
    np.cumsum((ncol + TILE - 1) // TILE, out=window_ptr[1:])
    first_u = np.zeros(nwin + 1, dtype=np.int64)
    np.cumsum(ncol, out=first_u[1:])
    col = np.cumsum(head) - 1 - first_u[win]
    return head, src, r, window_ptr[win] + col // TILE, col % TILE, ncol, window_ptr


def _rows(indptr):
    return np.repeat(np.arange(indptr.shape[0] - 1, dtype=np.int64), np.diff(indptr))


def build_numpy(indptr, indices, num_cols) -> BlockSparse:
    """The block-sparse form of a CSR-by-destination graph, on the host
    (indptr [num_rows + 1], indices [E] NumPy integer arrays)."""
    indptr = np.asarray(indptr, dtype=np.int64)
    indices = np.asarray(indices, dtype=np.int64)
    num_rows, E = indptr.shape[0] - 1, int(indices.shape[0])
    check_size(E, num_rows, num_cols)
    nwin = num_windows(num_rows)
    skey = np.sort(sort_keys(np, _rows(indptr), indices, num_cols))
    dups = int(np.count_nonzero(skey[1:] == skey[:-1])) if E else 0
    head, src, r, tile, c, ncol, window_ptr = _layout(skey, nwin, num_cols)
    T = int(window_ptr[-1])
    tile_cols = np.zeros((T, TILE), dtype=np.int32)
    tile_cols[tile[head], c[head]] = src[head]
    last = window_ptr[1:] - 1
    for w in np.nonzero(ncol % TILE)[0]:   # the padded columns of each window's last tile
        tile_cols[last[w], ncol[w] % TILE:] = tile_cols[last[w], 0]
    tile_mask = np.zeros((T, WINDOW), dtype=np.uint16)
    np.bitwise_or.at(tile_mask, (tile, r), (1 << c).astype(np.uint16))
    ntile = np.diff(window_ptr)
    max_t = int(ntile.max()) if nwin else 0
    stats = fill_stats(E - dups, T, int(np.count_nonzero(ntile)), max_t, nwin)
    return BlockSparse(num_rows, int(num_cols), E, dups, window_ptr.astype(np.int32), tile_cols,
                       tile_mask, max_t, stats)


def edge_slot_numpy(indptr, indices, num_cols):
    """[E] int64: each CSR edge's entry tile * 256 + row * 16 + column in the
    form build_numpy makes of the same graph (duplicate edges share one)."""
    indptr = np.asarray(indptr, dtype=np.int64)
    indices = np.asarray(indices, dtype=np.int64)
    key = sort_keys(np, _rows(indptr), indices, num_cols)
    order = np.argsort(key, kind="stable")
    _, _, r, tile, c, _, _ = _layout(key[order], num_windows(indptr.shape[0] - 1), num_cols)
    slot = np.empty(key.shape[0], dtype=np.int64)
    slot[order] = tile * (TILE * WINDOW) + r * TILE + c
    return slot


def dense_tiles(bs: BlockSparse):
    """[num_tiles, 16, 16] float64 0/1 pattern of `bs` (NumPy; tests)."""
    mask = np.asarray(bs.tile_mask).astype(np.int64)
    bits = (mask[:, :, None] >> np.arange(TILE)[None, None, :]) & 1
    return bits.astype(np.float64)
