"""Developer tool (GPU): where a jitted fastgnn.jax forward's time goes,
against the same op from fastgnn.torch, on one graph.

For each op: the wall-clock median of the forward from JAX (jitted, waited
for with block_until_ready) and from torch (no_grad, synchronised); the
host time spent inside the buffer callback (`_bridge._run_on_gpu`, or
`_bridge._replay` for calls that replay their recorded launches), how many
calls replayed and how many results were copied rather than written in
place (`REPLAY=0` in the environment turns the replays off); then
torch.profiler's CUDA kernels per call for both (CUPTI sees every kernel of
the process, XLA's and CuPy's included), so the kernel sums can be read
against the wall times.

    python benchmarks/dev/profile_jax_op.py [graph spec] [repeats] [op ...]
    python benchmarks/dev/profile_jax_op.py rmat20 10 spmm max gat dot
"""
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import fastgnn.jax as fj  # noqa: E402
import fastgnn.torch as ft  # noqa: E402
from fastgnn.bench.graphs import parse  # noqa: E402
from fastgnn.jax import _bridge  # noqa: E402
# the ops, their inputs and the timing of the JAX-against-torch probe beside this one
from probe_jax_vs_torch import F, _call, _cases, _median_ms  # noqa: E402

_stats = {"host": [], "copied": 0, "calls": 0, "replayed": 0}
_run_on_gpu = _bridge._run_on_gpu
_replay = _bridge._replay
_in_place = _bridge._in_place


def _timed_run(*a, **k):
    t0 = time.perf_counter()
    try:
        return _run_on_gpu(*a, **k)
    finally:
        _stats["host"].append((time.perf_counter() - t0) * 1e3)
        _stats["calls"] += 1


def _timed_replay(*a, **k):
    t0 = time.perf_counter()
    done = _replay(*a, **k)
    if done:
        _stats["host"].append((time.perf_counter() - t0) * 1e3)
        _stats["calls"] += 1
        _stats["replayed"] += 1
    return done


def _counted_in_place(r, t):
    ok = _in_place(r, t)
    _stats["copied"] += not ok
    return ok


_bridge.REPLAY = os.environ.get("REPLAY", "1") != "0"
_bridge._run_on_gpu = _timed_run
_bridge._replay = _timed_replay
_bridge._in_place = _counted_in_place


def _kernels(fn, wait, calls=5):
    wait(fn())
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            wait(fn())
    rows = [(e.key, e.device_time_total / calls / 1e3, e.count / calls)
            for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    return rows


def _print_kernels(label, rows):
    print(f"  {label}: {sum(r[1] for r in rows):.4f} ms of kernels per call")
    for key, ms, calls in rows[:8]:
        print(f"    {ms:8.4f}  ({calls:g})  {key[:100]}")


def _floor(n, repeats, jwait, twait):
    """What JAX costs around a callback: a jitted program of one buffer
    callback that does nothing, on an [n, F] input and output, and a jitted
    elementwise op of that size against the same op from torch."""
    from jax.experimental.buffer_callback import buffer_callback
    x = jnp.ones((n, F), jnp.float32)
    xt = torch.ones((n, F), device="cuda")
    empty = jax.jit(buffer_callback(lambda ctx, out, a: None, jax.ShapeDtypeStruct((n, F),
                                                                                  jnp.float32)))
    scale = jax.jit(lambda a: a * 2.0)
    e = _median_ms(lambda: empty(x), jwait, repeats)
    sj = _median_ms(lambda: scale(x), jwait, repeats)
    st = _median_ms(lambda: xt * 2.0, twait, repeats)
    print(f"floor: JAX empty buffer callback {e:.3f} ms; x * 2 JAX {sj:.3f} ms, torch "
          f"{st:.3f} ms")


def main(spec="rmat20", repeats=10, ops=("spmm", "max", "gat", "dot")):
    name, desc, build = parse(spec)
    ei, n = build(np, 0)[:2]
    ei = np.asarray(ei)
    print(f"graph {name}: {desc}; {n} nodes, {ei.shape[1]} edges; {jax.devices()[0]}")
    gj = fj.Graph.from_edge_index(ei, n)
    gt = ft.to_graph(torch.from_numpy(ei).cuda(), n)
    rng = np.random.default_rng(0)
    jwait = jax.block_until_ready

    def twait(_):
        torch.cuda.synchronize()

    _floor(n, repeats, jwait, twait)
    shapes = {kind: sh for kind, sh in _cases(rng, n, ei.shape[1]).values()}
    for kind in ops:
        host = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes[kind].items()}
        aj = {k: jnp.asarray(v) for k, v in host.items()}
        at = {k: torch.from_numpy(v).cuda() for k, v in host.items()}
        fwd_j = jax.jit(lambda a, kind=kind: _call(fj, gj, kind, a))

        def fwd_t(kind=kind):
            with torch.no_grad():
                return _call(ft, gt, kind, at)

        jax.block_until_ready(fwd_j(aj))
        jax.block_until_ready(fwd_j(aj))         # (the second call records its launches)
        _stats.update(host=[], copied=0, calls=0, replayed=0)
        jms = _median_ms(lambda: fwd_j(aj), jwait, repeats)
        host_ms = statistics.median(_stats["host"])
        copied, calls, replayed = _stats["copied"], _stats["calls"], _stats["replayed"]
        tms = _median_ms(fwd_t, twait, repeats)
        print(f"{kind}: forward JAX {jms:.3f} ms, torch {tms:.3f} ms ({jms / tms:.2f}x); "
              f"callback host {host_ms:.3f} ms/call, {replayed} of {calls} calls replayed, "
              f"{copied} copied results")
        _print_kernels("JAX", _kernels(lambda: fwd_j(aj), jwait))
        _print_kernels("torch", _kernels(fwd_t, twait))


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0] if a else "rmat20", int(a[1]) if len(a) > 1 else 10,
         tuple(a[2:]) or ("spmm", "max", "gat", "dot"))
