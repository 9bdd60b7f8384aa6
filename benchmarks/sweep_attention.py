"""Developer sweep (H200): the attention kernels' compile-time tuning knobs
against each other in one process, on one rmat graph, 4 heads x 32.

For each set of NVRTC defines (FASTGNN_NVRTC_OPTIONS, see
kernels_cuda/attention.cu: ATTN_FWD_MIN_BLOCKS, ATTN_MIN_BLOCKS,
ATTN_BWD_UNROLL, ATTN_FWD_UNROLL, ATTN_BWD_ATOMIC_UNROLL) the compiled
modules are dropped and rebuilt, then the forward, the backward and the
atomic backward (deterministic=False) of the three scores are timed (CUDA
events, median of 10) in fp32 and bf16. One line per (defines, dtype).

    python benchmarks/sweep_attention.py [scale] ["-DATTN_BWD_UNROLL=4" ...]

A variant "grid=full" (not a define) runs the defaults on the grid of one
lane group per (task, head) pair instead of the persistent grid
(fastgnn.backends.cuda.attention.PERSISTENT). A variant "maxvec=N" (not a
define) runs the defaults with the kernels' widest vector at N values
(loader.ATTENTION_MAX_VEC, 4 by default; e.g. 8: bf16 heads of 32 on 4 lanes
of 16 bytes instead of 8 lanes of 8, as before session 10); its modules
compile in this process on first use.
"""
import sys

import cupy as cp

import fastgnn
from fastgnn.backends.cuda import attention as cuda_attention
from fastgnn.backends.cuda import loader
from fastgnn.backends.cuda.prewarm import modules, prewarm
from fastgnn.backends.cuda.spmm import median_ms
from fastgnn.testing import rmat_edge_index
from probe_attention import attention_inputs   # benchmarks/ (the script's directory)
from sweep_common import defines_to_prewarm, enter_variant

FULL_GRID = "grid=full"
DEFAULT_VARIANTS = ["", FULL_GRID, "-DATTN_BWD_UNROLL=1", "-DATTN_BWD_UNROLL=2", "-DATTN_FWD_UNROLL=2",
                    "-DATTN_FWD_UNROLL=1", "-DATTN_MIN_BLOCKS=2",
                    "-DATTN_BWD_ATOMIC_UNROLL=4", "-DATTN_BWD_ATOMIC_UNROLL=1"]
VTYPES = ("float32", "bfloat16")


def _cap_vec(cap, default=loader.ATTENTION_MAX_VEC):
    """Make the attention kernels' widest vector `cap` values (0: the
    default); the instantiation list and the launcher both ask
    loader.attention_vecs, which reads loader.ATTENTION_MAX_VEC."""
    loader.ATTENTION_MAX_VEC = cap or default


def main(scale=20, variants=None):
    variants = variants or DEFAULT_VARIANTS
    # NVRTC is the slow part: compile every variant's modules on every core
    # first; CuPy's disk cache then serves the timing loop below
    prewarm(modules(["attention"], list(VTYPES), ["int32"],
                    defines_to_prewarm([v for v in variants if v != FULL_GRID])))
    ei, n = rmat_edge_index(scale, xp=cp)
    g = fastgnn.Graph.from_edge_index(ei, num_nodes=n)
    rng = cp.random.default_rng(0)
    H, C = 4, 32
    data = {vt: attention_inputs(rng, n, H, C, vt) for vt in VTYPES}
    print(f"rmat{scale}: n={n} E={g.num_edges}, H={H} C={C}; fwd / bwd / bwd with "
          "deterministic=False, ms (median of 10)")
    for defines in variants:
        cuda_attention.PERSISTENT = defines != FULL_GRID
        enter_variant("" if defines == FULL_GRID else defines, _cap_vec)
        for vt, (inputs, grad) in data.items():
            cells = []
            for kind, kw in inputs.items():
                tf = median_ms(lambda: fastgnn.edge_attention(g, kind, vtype=vt, **kw), 10)
                _, res = fastgnn.edge_attention_fwd(g, kind, vtype=vt, **kw)
                tb = median_ms(lambda: fastgnn.edge_attention_bwd(g, res, grad), 10)
                _, res_a = fastgnn.edge_attention_fwd(g, kind, vtype=vt, deterministic=False, **kw)
                ta = median_ms(lambda: fastgnn.edge_attention_bwd(g, res_a, grad), 10)
                cells.append(f"{kind} {tf:.2f}/{tb:.2f}/{ta:.2f}")
            print(f"[{defines or 'defaults'}] {vt:8s} " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20, sys.argv[2:] or None)
