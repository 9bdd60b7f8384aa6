"""Developer probe (GPU): fastgnn.jax against the same op written in plain JAX
(`jax.ops.segment_*` over a gathered edge list, what a JAX GNN without
fastgnn runs), both jitted, forward and forward+backward, on one graph.

Times are medians of `repeats` calls after a warm-up, each call waited for
with `block_until_ready` (host time included: what a training step sees).

    python benchmarks/dev/probe_jax.py [graph spec] [features] [repeats]
    python benchmarks/dev/probe_jax.py npz:tolokers 128 30
"""
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import fastgnn.jax as fj  # noqa: E402
from fastgnn.bench.graphs import parse  # noqa: E402


def _median_ms(fn, args, repeats):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _plain_spmm(src, dst, n):
    return lambda x: jax.ops.segment_sum(x[src], dst, num_segments=n)


def _plain_max(src, dst, n):
    def f(x):
        out = jax.ops.segment_max(x[src], dst, num_segments=n)
        return jnp.where(jnp.isfinite(out), out, 0.0)
    return f


def _plain_gat(src, dst, n):
    def f(a_src, a_dst, v):
        s = jax.nn.leaky_relu(a_src[src] + a_dst[dst], 0.2)            # [E, H]
        m = jax.ops.segment_max(s, dst, num_segments=n)
        p = jnp.exp(s - m[dst])
        p = p / jax.ops.segment_sum(p, dst, num_segments=n)[dst]
        return jax.ops.segment_sum(p[..., None] * v[src], dst, num_segments=n)
    return f


def main(spec="npz:tolokers", F=128, repeats=30):
    name, _desc, build = parse(spec)
    ei, n = build(np, 0)[:2]
    ei = np.asarray(ei)
    g = fj.Graph.from_edge_index(ei, n)
    src, dst = jnp.asarray(ei[0]), jnp.asarray(ei[1])
    rng = np.random.default_rng(0)
    H, C = 4, F // 4
    x = jnp.asarray(rng.standard_normal((n, F)), jnp.float32)
    a_src = jnp.asarray(rng.standard_normal((n, H)), jnp.float32)
    a_dst = jnp.asarray(rng.standard_normal((n, H)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((n, H, C)), jnp.float32)
    print(f"graph {name}: {n} nodes, {ei.shape[1]} edges, F={F}, H={H}; {jax.devices()[0]}")
    cases = {
        "spmm sum": (lambda x: fj.spmm(g, x), _plain_spmm(src, dst, n), (x,)),
        "segment max": (lambda x: fj.segment_reduce(g, x, "max"), _plain_max(src, dst, n), (x,)),
        "gat attention": (lambda a, b, c: fj.edge_attention(g, "gat", a_src=a, a_dst=b, v=c),
                          _plain_gat(src, dst, n), (a_src, a_dst, v)),
    }
    for case, (ours, plain, args) in cases.items():
        row = []
        for fn in (ours, plain):
            fwd = jax.jit(fn)
            both = jax.jit(jax.grad(lambda *a, f=fn: jnp.sum(f(*a) ** 2),
                                    argnums=tuple(range(len(args)))))
            row.append((_median_ms(fwd, args, repeats), _median_ms(both, args, repeats)))
        (of, ob), (pf, pb) = row
        print(f"{case:14s} fwd: fastgnn.jax {of:7.3f} ms, plain JAX {pf:7.3f} ms ({pf / of:4.2f}x)"
              f" | fwd+bwd: fastgnn.jax {ob:7.3f} ms, plain JAX {pb:7.3f} ms ({pb / ob:4.2f}x)")


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0] if a else "npz:tolokers", int(a[1]) if len(a) > 1 else 128,
         int(a[2]) if len(a) > 2 else 30)
