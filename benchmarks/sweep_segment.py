"""Developer sweep (H200): the reduction kernels' compile-time tuning knobs
against each other in one process, on one rmat graph, F = 128.

For each set of NVRTC defines (FASTGNN_NVRTC_OPTIONS, see
kernels_cuda/segment.cu: SEG_FWD_MIN_BLOCKS, SEG_BWD_MIN_BLOCKS,
SEG_FWD_UNROLL, SEG_BWD_UNROLL) the compiled modules are dropped and
rebuilt, then max and the PNA set mean+max+min+std are timed (CUDA events,
median of 10): the forward without residuals (inference), the forward with
them (training), the backward, and the backward with deterministic=False.
One line per (defines, dtype); multi/max is the ratio of the forwards and
of training (forward with residuals + backward). A variant "maxvec=N" (not
a define, sweep_common.py) runs the defaults with the launchers' vector
width capped at N values (below loader.SEGMENT_MAX_VEC, 4); "args-always"
runs the defaults with the inference forward tracking max/min positions as
the training one does (no STAT_NOARG).

    python benchmarks/sweep_segment.py [scale] ["-DSEG_FWD_MIN_BLOCKS=4" ...]
"""
import sys

import cupy as cp

import fastgnn
from fastgnn.backends.cuda import loader
from fastgnn.backends.cuda import segment as cuda_segment
from fastgnn.backends.cuda.prewarm import modules, prewarm
from fastgnn.backends.cuda.spmm import median_ms
from fastgnn.testing import rmat_edge_index
from sweep_common import defines_to_prewarm, enter_variant   # benchmarks/ (this folder)

DEFAULT_VARIANTS = ["", "-DSEG_FWD_MIN_BLOCKS=4", "-DSEG_FWD_UNROLL=2", "-DSEG_FWD_UNROLL=8",
                    "-DSEG_BWD_UNROLL=1", "-DSEG_BWD_UNROLL=1 -DSEG_BWD_MIN_BLOCKS=4",
                    "-DSEG_FWD_MIN_BLOCKS=4 -DSEG_BWD_UNROLL=1"]
VTYPES = ("float32", "bfloat16")
REDUCES = {"max": "max", "multi": ["mean", "max", "min", "std"]}


def _inputs(rng, n, F, vtype):
    x = rng.standard_normal((n, F), dtype=cp.float32)
    return x if vtype == "float32" else (x.view(cp.uint32) >> 16).astype(cp.uint16)


def _times(g, x, reduce, grad, vt):
    """(fwd inference, fwd training, bwd, bwd with deterministic=False) ms."""
    infer = median_ms(lambda: fastgnn.segment_reduce_fwd(g, x, reduce, vtype=vt,
                                                         needs_x_grad=False), 10)
    train = median_ms(lambda: fastgnn.segment_reduce_fwd(g, x, reduce, vtype=vt), 10)
    _, res = fastgnn.segment_reduce_fwd(g, x, reduce, vtype=vt)
    bwd = median_ms(lambda: fastgnn.segment_reduce_bwd(g, res, grad), 10)
    _, res_a = fastgnn.segment_reduce_fwd(g, x, reduce, vtype=vt, deterministic=False)
    bwd_a = median_ms(lambda: fastgnn.segment_reduce_bwd(g, res_a, grad), 10)
    return infer, train, bwd, bwd_a


def _cap_vec(cap, default=cuda_segment.SEGMENT_MAX_VEC):
    """Make the segment launchers use vectors of at most `cap` values (0:
    their default cap)."""
    cuda_segment.SEGMENT_MAX_VEC = min(cap, default) if cap else default


ARGS_ALWAYS = "args-always"


def _enter(variant):
    """enter_variant, plus "args-always": STAT_NOARG off in the launcher."""
    cuda_segment.STAT_NOARG = 0 if variant == ARGS_ALWAYS else loader.STAT_NOARG
    enter_variant("" if variant == ARGS_ALWAYS else variant, _cap_vec)


def main(scale=20, variants=None):
    variants = variants or DEFAULT_VARIANTS
    # NVRTC is the slow part: compile every variant's modules on every core
    # first; CuPy's disk cache then serves the timing loop below
    prewarm(modules(["segment"], list(VTYPES), ["int32"],
                    defines_to_prewarm([v for v in variants if v != ARGS_ALWAYS])))
    ei, n = rmat_edge_index(scale, xp=cp)
    g = fastgnn.Graph.from_edge_index(ei, num_nodes=n)
    rng = cp.random.default_rng(0)
    F = 128
    data = {vt: _inputs(rng, n, F, vt) for vt in VTYPES}
    grads = {(vt, name): _inputs(rng, n, F * (1 if isinstance(r, str) else len(r)), vt)
             for vt in VTYPES for name, r in REDUCES.items()}
    print(f"rmat{scale}: n={n} E={g.num_edges}, F={F}; per reduction: fwd (inference) / fwd "
          "(training) / bwd / bwd deterministic=False, ms (median of 10)")
    for defines in variants:
        _enter(defines)
        for vt, x in data.items():
            t = {name: _times(g, x, r, grads[vt, name], vt) for name, r in REDUCES.items()}
            cells = [f"{name} " + "/".join(f"{v:.2f}" for v in t[name]) for name in REDUCES]
            mx, mu = t["max"], t["multi"]
            ratio = f"multi/max fwd {mu[0] / mx[0]:.2f}x train {(mu[1] + mu[2]) / (mx[1] + mx[2]):.2f}x"
            print(f"[{defines or 'defaults'}] {vt:8s} " + "  ".join(cells) + "  " + ratio,
                  flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20, sys.argv[2:] or None)
