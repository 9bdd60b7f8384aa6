"""Developer probe (GPU): every fastgnn op called from JAX (jitted) against
the same op called from PyTorch, in one run on one graph, forward and
forward+backward; then a training step of a 2-layer GATv2 (SGD) in both.

Each time is the median of `repeats` measurements after a warm-up, wall
clock with the device waited for (`block_until_ready` /
`torch.cuda.synchronize`), the same method for both frameworks: first each
call waited for (its latency included: dispatch, callback, launch, wait),
then PIPELINE calls queued back to back per wait (the per-call cost in a
loop that does not wait for each op).

    python benchmarks/dev/probe_jax_vs_torch.py [graph spec] [repeats]
    python benchmarks/dev/probe_jax_vs_torch.py rmat20 20
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

import fastgnn.jax as fj  # noqa: E402
import fastgnn.jax.nn as fjn  # noqa: E402
import fastgnn.torch as ft  # noqa: E402
from fastgnn.bench.graphs import parse  # noqa: E402

F, H, C = 128, 4, 32


def _median_ms(fn, wait, repeats, block=1):
    """Median ms per call of `repeats` measurements, each `block` calls
    followed by one wait (block=1: every call waited for, its latency
    included; block>1: calls queued back to back, the per-call cost a loop
    of them sees)."""
    wait(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(block):
            out = fn()
        wait(out)
        times.append((time.perf_counter() - t0) * 1e3 / block)
    return statistics.median(times)


PIPELINE = 10       # calls per measurement of the pipelined columns


def _jax_wait(out):
    jax.block_until_ready(out)


def _torch_wait(_out):
    torch.cuda.synchronize()


def _cases(rng, n, E):
    """name -> (score or op, {input: shape})."""
    return {
        "spmm sum": ("spmm", {"x": (n, F)}),
        "segment max": ("max", {"x": (n, F)}),
        "edge_softmax": ("softmax", {"scores": (E, H)}),
        "attention gat": ("gat", {"a_src": (n, H), "a_dst": (n, H), "v": (n, H, C)}),
        "attention gatv2": ("gatv2", {"xl": (n, H, C), "xr": (n, H, C), "att": (H, C)}),
        "attention dot": ("dot", {"q": (n, H, C), "k": (n, H, C), "v": (n, H, C)}),
    }


def _call(lib, graph, kind, a):
    if kind == "spmm":
        return lib.spmm(graph, a["x"])
    if kind == "max":
        return lib.segment_reduce(graph, a["x"], "max")
    if kind == "softmax":
        return lib.edge_softmax(graph, a["scores"])
    return lib.edge_attention(graph, kind, **a)


def _op_rows(ei, n, repeats):
    rng = np.random.default_rng(0)
    gj = fj.Graph.from_edge_index(ei, n)
    gt = ft.to_graph(torch.from_numpy(ei).cuda(), n)
    for name, (kind, shapes) in _cases(rng, n, ei.shape[1]).items():
        host = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
        aj = {k: jnp.asarray(v) for k, v in host.items()}
        at = {k: torch.from_numpy(v).cuda().requires_grad_() for k, v in host.items()}
        names = list(aj)
        fwd_j = jax.jit(lambda a: _call(fj, gj, kind, a))
        both_j = jax.jit(jax.grad(lambda a: jnp.sum(_call(fj, gj, kind, a) ** 2)))

        def fwd_t():
            with torch.no_grad():
                return _call(ft, gt, kind, at)

        def both_t():
            out = _call(ft, gt, kind, at)
            return torch.autograd.grad((out ** 2).sum(), [at[k] for k in names])

        cells = []
        for block in (1, PIPELINE):
            jf = _median_ms(lambda: fwd_j(aj), _jax_wait, repeats, block)
            tf = _median_ms(fwd_t, _torch_wait, repeats, block)
            jb = _median_ms(lambda: both_j(aj), _jax_wait, repeats, block)
            tb = _median_ms(both_t, _torch_wait, repeats, block)
            cells += [f"{jf:.3f} / {tf:.3f} | {jf / tf:.2f}", f"{jb:.3f} / {tb:.3f} | {jb / tb:.2f}"]
        print(f"| {name} | {' | '.join(cells)} |", flush=True)


def _gatv2_step_rows(ei, n, repeats, hidden=32, classes=8, lr=0.01):
    rng = np.random.default_rng(1)
    x_np = rng.standard_normal((n, F)).astype(np.float32)
    y_np = rng.integers(0, classes, n)
    # JAX: the functional layers and plain SGD
    gj = fj.Graph.from_edge_index(ei, n)
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    params = {"l1": fjn.gatv2_init(k1, F, hidden, heads=H), "l2": fjn.gatv2_init(k2, hidden * H,
                                                                                 classes)}
    x, y = jnp.asarray(x_np), jnp.asarray(y_np)

    def loss(p):
        h = jax.nn.relu(fjn.gatv2(p["l1"], gj, x))
        logits = fjn.gatv2(p["l2"], gj, h)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

    @jax.jit
    def step(p):
        g = jax.grad(loss)(p)
        return jax.tree.map(lambda a, b: a - lr * b, p, g)

    state = [params]

    def jax_step():
        state[0] = step(state[0])
        return state[0]
    js = _median_ms(jax_step, _jax_wait, repeats)
    # PyTorch: the drop-in layers and torch's SGD
    eit = torch.from_numpy(ei).cuda()
    c1, c2 = ft.GATv2Conv(F, hidden, heads=H).cuda(), ft.GATv2Conv(hidden * H, classes).cuda()
    opt = torch.optim.SGD([*c1.parameters(), *c2.parameters()], lr=lr)
    xt, yt = torch.from_numpy(x_np).cuda(), torch.from_numpy(y_np).cuda()

    def torch_step():
        opt.zero_grad()
        out = c2(c1(xt, eit).relu(), eit)
        torch.nn.functional.cross_entropy(out, yt).backward()
        opt.step()
    ts = _median_ms(torch_step, _torch_wait, repeats)
    print(f"| GATv2 2-layer training step (SGD) | - | - | {js:.3f} / {ts:.3f} | {js / ts:.2f} "
          "| - | - | - | - |")


def main(spec="rmat20", repeats=20):
    name, desc, build = parse(spec)
    ei, n = build(np, 0)[:2]
    ei = np.asarray(ei)
    print(f"graph {name}: {desc}; {n} nodes, {ei.shape[1]} edges; F={F}, {H} x {C} heads; "
          f"{jax.devices()[0]}, {torch.cuda.get_device_name()}")
    print("| op | fwd ms, JAX / torch | x | fwd+bwd ms, JAX / torch | x | "
          f"fwd ms, {PIPELINE} queued | x | fwd+bwd ms, {PIPELINE} queued | x |")
    print("|---|---|---|---|---|---|---|---|---|")
    _op_rows(ei, n, repeats)
    _gatv2_step_rows(ei, n, max(5, repeats // 2))


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0] if a else "rmat20", int(a[1]) if len(a) > 1 else 20)
