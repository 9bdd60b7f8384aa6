"""Developer probe (GPU): how far the CUDA backend's fp32 gradient of gatv2's
attention vector (grad att = sum over all edges of ds_e lrelu(t_e)) is from
the float64 reference, against the rounding bound the tests use
(tests/test_attention.py `_att_bound`), over random awkward graphs of the
shapes test_attention_matches_reference draws, for `seconds`.

    python benchmarks/dev/probe_gatv2_att_rounding.py [seconds]
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
import test_attention as ta   # noqa: E402  (tests/: the graphs, inputs and the bound)
from fastgnn import edge_attention_bwd, edge_attention_fwd   # noqa: E402
from fastgnn.ops.attention import SCORE_INPUTS   # noqa: E402
from fastgnn.testing import rel_err, to_device, to_numpy   # noqa: E402


def main(seconds=100.0):
    rows, seed, t0 = [], 0, time.time()
    while time.time() - t0 < seconds:
        seed += 1
        rng = np.random.default_rng(seed)
        heads, channels, slope = ta.SHAPES[seed % len(ta.SHAPES)]
        ei, g = ta._graph("cuda", hub=300, seed=seed)
        x = ta._inputs("gatv2", g, heads, channels, seed % 2 == 0, rng, "float32")
        kw = dict(negative_slope=slope, scale=None, dropout=0.0, seed=0, offset=0)
        out, res = edge_attention_fwd(g, "gatv2", **{k: to_device(v, "cuda") for k, v in x.items()},
                                      **kw)
        go = rng.standard_normal(out.shape).astype("float32")
        grads = dict(zip(SCORE_INPUTS["gatv2"], edge_attention_bwd(g, res, to_device(go, "cuda"))))
        r_att = ta.ref.edge_attention_vjp(ei, "gatv2", g.num_dst, x, go, None, **kw)["att"]
        err = rel_err(to_numpy(grads["att"]), r_att)
        rows.append((err, ta._att_bound(ei, g.num_dst, x, go, None, r_att, **kw), heads, channels))
    e = np.array([r[0] for r in rows])
    b = np.array([r[1] for r in rows])
    print(f"{len(rows)} graphs: error median {np.median(e):.2e}, max {e.max():.2e} "
          f"(> 1e-5: {(e > 1e-5).sum()}); bound median {np.median(b):.2e}; error / bound median "
          f"{np.median(e / b):.3f}, max {(e / b).max():.3f}")
    worst = sorted(rows, key=lambda r: -r[0])[:5]
    print("largest errors (error, bound, heads, channels):",
          [(f"{a:.2e}", f"{c:.2e}", h, w) for a, c, h, w in worst])


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 100.0)
