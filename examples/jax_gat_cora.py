"""Train a 2-layer GAT on Cora with fastgnn.jax (CPU; about 90 s on 2 cores).

    FASTGNN_DATASETS=/path/to/datasets python examples/jax_gat_cora.py [--epochs 200]

The data set is read by fastgnn.datasets ("planetoid/cora", the public
split: 140 training, 500 validation, 1000 test nodes). The model is the
GAT of Velickovic et al.: 8 heads x 8 channels, ELU, then one head over the
7 classes; dropout 0.6 on the features and on the attention weights (a new
seed every step, passed as a traced integer: no recompilation), Adam with
lr 0.005 and weight decay 5e-4. Reports the test accuracy at the epoch of
the best validation accuracy (usually 80-83%).
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import fastgnn.jax as fj
from fastgnn import datasets


def init(key, in_dim, hidden, heads, classes):
    k1, k2 = jax.random.split(key)
    return {"conv1": fj.nn.gat_init(k1, in_dim, hidden, heads),
            "conv2": fj.nn.gat_init(k2, heads * hidden, classes, 1)}


def forward(params, graph, x, key, training):
    k1, k2, k3, k4 = jax.random.split(key, 4)

    def drop(k, h):
        if not training:
            return h
        keep = jax.random.bernoulli(k, 0.4, h.shape)
        return jnp.where(keep, h / 0.4, 0)

    def seed(k):
        return jax.random.bits(k, dtype=jnp.uint32)
    p = 0.6 if training else 0.0
    h = fj.nn.gat(params["conv1"], graph, drop(k1, x), dropout=p, seed=seed(k2))
    h = jax.nn.elu(h)
    return fj.nn.gat(params["conv2"], graph, drop(k3, h), dropout=p, seed=seed(k4))


def adam(lr=0.005, weight_decay=5e-4, b1=0.9, b2=0.999, eps=1e-8):
    """Adam with L2 weight decay added to the gradient (torch.optim.Adam's)."""
    def init_state(params):
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        return zeros, zeros, jnp.zeros((), jnp.int32)

    def update(params, grads, state):
        m, v, t = state
        t = t + 1
        grads = jax.tree_util.tree_map(lambda g, p: g + weight_decay * p, grads, params)
        m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
        v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t
        params = jax.tree_util.tree_map(
            lambda p, m, v: p - lr * (m / c1) / (jnp.sqrt(v / c2) + eps), params, m, v)
        return params, (m, v, t)
    return init_state, update


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    data = datasets.load("planetoid/cora")
    x = data.x.toarray() if hasattr(data.x, "toarray") else np.asarray(data.x)
    x = x / np.maximum(x.sum(1, keepdims=True), 1)          # row-normalised features
    x, y = jnp.asarray(x, jnp.float32), jnp.asarray(data.y)
    train, val, test = (jnp.asarray(m) for m in data.split(0))
    graph = fj.Graph.from_edge_index(data.edge_index, data.num_nodes)   # built once
    classes = int(data.y.max()) + 1

    key = jax.random.PRNGKey(args.seed)
    key, k0 = jax.random.split(key)
    params = init(k0, x.shape[1], 8, 8, classes)
    opt_init, opt_update = adam()
    state = opt_init(params)

    def loss_fn(params, key):
        logits = forward(params, graph, x, key, True)
        logp = jax.nn.log_softmax(logits)
        nll = -jnp.take_along_axis(logp, y[:, None], 1)[:, 0]
        return jnp.sum(jnp.where(train, nll, 0)) / jnp.sum(train)

    @jax.jit
    def step(params, state, key):
        loss, grads = jax.value_and_grad(loss_fn)(params, key)
        params, state = opt_update(params, grads, state)
        return params, state, loss

    @jax.jit
    def accuracies(params):
        pred = forward(params, graph, x, key, False).argmax(-1)
        ok = pred == y
        return tuple(jnp.sum(ok & m) / jnp.sum(m) for m in (train, val, test))

    best_val, test_at_best = -1.0, 0.0
    t0 = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        key, k = jax.random.split(key)
        params, state, loss = step(params, state, k)
        tr, va, te = (float(a) for a in accuracies(params))
        if va > best_val:
            best_val, test_at_best = va, te
        if epoch % 20 == 0 or epoch == 1:
            print(f"epoch {epoch:3d}  loss {float(loss):.4f}  train {tr:.3f}  val {va:.3f}  "
                  f"test {te:.3f}")
    print(f"{args.epochs} epochs in {time.perf_counter() - t0:.1f} s; best val {best_val:.3f}, "
          f"test at best val {test_at_best:.3f}")
    return test_at_best


if __name__ == "__main__":
    main()
