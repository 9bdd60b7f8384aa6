"""Block-sparse Tensor Core path: the graph's block-sparse form, its fill
statistics, and the rule that decides where the Tensor Core kernels serve
an op (`tensor_cores="auto"|True|False` on `edge_attention` and `spmm`).

The form (fastgnn/backends/blocksparse.py has the layout): windows of 16
consecutive target rows, each with its sorted unique sources cut into tiles
of 16 columns and a 16 x 16 bit mask of the real edges per tile. Built once
per graph (on the GPU for CuPy graphs, by the NumPy twin otherwise) and
cached on it; `block_sparse(graph)` returns it, `.stats` its statistics.

Where it serves (kernels_cuda/blocksparse.cu; bf16/fp16 inputs, and fp32
inputs as TF32 where the caller passes tf32=True; fp32 accumulation):

- `edge_attention(score="dot")` forward and backward (the graph
  transformer), without an edge term, dropout or returned attention weights,
  on graphs without duplicate edges (a mask bit is one edge), C in 16, 32,
  64, 128 channels per head in 16 bits, 16, 32, 64 in TF32;
- `spmm` (sum, mean, row/column scales, edge weights summed per (source,
  target) pair, bias), F a multiple of 16.

GAT and GATv2 keep the CUDA-core path: GATv2's score applies a LeakyReLU
per channel to xl_j + xr_i before the contraction with att, so it is no
product of per-node matrices; GAT's score LeakyReLU(a_j + b_i) is a scalar
per edge with no product to gain (its P.V product could use the tiles, but
the scores would be built elementwise per tile: not implemented).
fp32 inputs take the path only with tf32=True: TF32 keeps 10 of fp32's 23
mantissa bits in every product's inputs (relative error about 2^-11, as a
16-bit float), so an fp32 caller opts in, as torch's
`torch.backends.cuda.matmul.allow_tf32` does for matmuls.

The automatic rule (`tensor_cores="auto"`): the Tensor Core kernel gathers
16 rows per tile where the CUDA-core kernels gather one per edge, so it
moves fewer rows when fill > 1/16 and pays for locally dense graphs. A warp
walks one window, so a window far longer than the mean (a hub row) stalls
the grid, and long windows of scattered sources (uniform random graphs,
16 tiles per window at fill 1/16) lose the tile reuse. It is taken where

    fill >= MIN_FILL  and  tiles_per_window <= MAX_TILES_PER_WINDOW
    and  max_tiles_window <= MAX_WINDOW_SKEW * tiles_per_window

The constants come from `benchmarks/dev/probe_blocksparse.py` on the H200
(bf16, dot attention H=4 x C=32, SpMM F=128; speedups of the Tensor Core
path over the CUDA-core path; benchmarks/results/blocksparse_h200.md):

    graph        fill   tiles/window  skew   attn fwd  attn fwd+bwd  spmm
    clustered19  0.279   6.0           1.0   3.91x     4.86x         1.82x
    knn          0.162   6.2           1.6   2.50x     3.38x         1.29x
    molecules    0.072   2.0           1.0   2.05x     2.30x         1.69x
    mesh3d       0.062   6.0           1.0   1.84x     2.13x         1.05x
    grid         0.062   4.0           1.0   1.63x     1.98x         1.09x
    uniform20    0.061  16.5           1.3   0.98x     1.24x         0.95x
    rmat20       0.067  15.7         331     0.40x     0.56x         0.15x

so every graph the rule takes is faster on both ops, and the two random
graphs keep the CUDA-core path. In fp32 as TF32 (`--dtype tf32`, same
graphs; benchmarks/results/blocksparse_tf32_h200.md) rows are twice the
bytes on both paths:

    graph        fill   attn fwd  attn fwd+bwd  spmm
    clustered19  0.279  5.12x     3.50x         1.32x
    knn          0.162  3.72x     2.40x         1.04x
    molecules    0.072  1.36x     1.23x         1.07x
    mesh3d       0.062  1.38x     1.18x         0.83x
    grid         0.062  1.44x     1.26x         0.83x
    uniform20    0.061  1.05x     0.78x         0.96x
    rmat20       0.067  0.43x     0.36x         0.18x

The attention keeps the rule; the TF32 SpMM loses to the CUDA-core kernel
at fill 0.062 and gains from 0.072, so it also needs fill >=
TF32_SPMM_MIN_FILL.
`tensor_cores=True` forces the path (ValueError naming the reason where it
cannot serve the call), False keeps the CUDA-core path.
"""
from __future__ import annotations

from ._array import is_cupy
from .backends.blocksparse import BlockSparse, build_numpy

OPTIONS = ("auto", True, False)
# measured thresholds (see the module docstring)
MIN_FILL = 0.05
MAX_TILES_PER_WINDOW = 12.0
MAX_WINDOW_SKEW = 32.0
TF32_SPMM_MIN_FILL = 0.07


def check_option(tensor_cores):
    """Validate a `tensor_cores` argument."""
    if isinstance(tensor_cores, str):
        if tensor_cores != "auto":
            raise ValueError(f"tensor_cores must be 'auto', True or False, got {tensor_cores!r}")
        return tensor_cores
    if not isinstance(tensor_cores, bool):
        raise TypeError(f"tensor_cores must be 'auto', True or False, got "
                        f"{type(tensor_cores).__name__}")
    return tensor_cores


def check_tf32(tf32):
    """Validate a `tf32` argument."""
    if not isinstance(tf32, bool):
        raise TypeError(f"tf32 must be True or False, got {type(tf32).__name__}")
    return tf32


def block_sparse(graph) -> BlockSparse:
    """The graph's block-sparse form (cached on it; see the module docstring)."""
    if is_cupy(graph.indices):
        from .backends.cuda.blocksparse import block_sparse as build_gpu
        return build_gpu(graph)
    return graph.cached("blocksparse",
                        lambda: build_numpy(graph.indptr, graph.indices, graph.num_src))


def pays(stats, op="attention", vtype="bfloat16") -> bool:
    """The automatic rule on a form's statistics, for op ("attention" or
    "spmm") in value type vtype."""
    if stats["num_tiles"] == 0:
        return False
    min_fill = TF32_SPMM_MIN_FILL if (op == "spmm" and vtype == "float32") else MIN_FILL
    return (stats["fill"] >= min_fill
            and stats["tiles_per_window"] <= MAX_TILES_PER_WINDOW
            and stats["max_tiles_window"] <= MAX_WINDOW_SKEW * stats["tiles_per_window"])


def _decide(graph, option, reason, op, vtype):
    """Whether the Tensor Core path serves: `reason` () -> why it cannot (or
    None); option True raises with it, "auto" asks the rule (`pays`) for op
    ("attention", "spmm") in vtype."""
    option = check_option(option)
    name = "SpMM" if op == "spmm" else op
    if option is False:
        return False
    if not is_cupy(graph.indices):
        if option is True:
            raise ValueError(f"tensor_cores=True: {name} runs on Tensor Cores only for GPU (CuPy) "
                             "graphs and arrays")
        return False
    why = reason()
    if why is not None:
        if option is True:
            raise ValueError(f"tensor_cores=True: the Tensor Core {name} cannot serve {why}")
        return False
    return True if option is True else pays(block_sparse(graph).stats, op, vtype)


def _fp32_reason(vtype, tf32):
    if vtype == "float32" and not tf32:
        return ("float32 inputs without tf32=True (the Tensor Cores take fp32 as TF32, "
                "10 mantissa bits)")
    return None


def attention_path(graph, score, arrays, params, need_alpha, vtype, option,
                   tf32=False) -> bool:
    """Whether edge_attention's forward takes the Tensor Core path."""
    def reason():
        from .backends.cuda.blocksparse import attention_unsupported
        return (_fp32_reason(vtype, tf32)
                or attention_unsupported(graph, score, arrays, params, need_alpha, vtype))
    return _decide(graph, option, reason, "attention", vtype)


def spmm_path(graph, x, vtype, option, tf32=False) -> bool:
    """Whether spmm takes the Tensor Core path."""
    def reason():
        from .backends.cuda.blocksparse import spmm_unsupported
        return _fp32_reason(vtype, tf32) or spmm_unsupported(graph, x, vtype)
    return _decide(graph, option, reason, "spmm", vtype)


def attention_backward_path(graph, score, arrays, params, vtype) -> bool:
    """Whether the backward of a forward that took the Tensor Core path takes
    it too (else the CUDA-core backward, from the same out and lse): the
    forward's conditions, which both backward passes share; an fp32 forward
    there had tf32=True."""
    from .backends.cuda.blocksparse import attention_unsupported
    return attention_unsupported(graph, score, arrays, params, False, vtype) is None


# The launchers, for the ops (fastgnn/backends/cuda/blocksparse.py documents them)
def attention_fwd(graph, arrays, params, vtype):
    from .backends.cuda.blocksparse import attention_fwd as run
    return run(graph, arrays, params, vtype)


def attention_bwd(graph, arrays, out, lse, grad_out, params, needs, vtype):
    from .backends.cuda.blocksparse import attention_bwd as run
    return run(graph, arrays, out, lse, grad_out, params, needs, vtype)


def spmm(graph, x, vtype, weight_csr=None, row_scale=None, col_scale=None, bias=None):
    from .backends.cuda.blocksparse import spmm as run
    return run(graph, x, vtype, weight_csr, row_scale, col_scale, bias)
