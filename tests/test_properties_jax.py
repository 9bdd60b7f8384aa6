"""Property tests of fastgnn.jax: spmm, segment_reduce and edge_attention on
drawn graphs against the float64 reference (`fastgnn.backends.reference`),
outputs and gradients (`jax.vjp` under a random cotangent), and a jitted
forward+backward run twice bitwise equal.

The graphs, widths and value types are tests/test_properties.py's
strategies (square or bipartite, zero to 200 edges, empty rows, a hub,
self-loops, duplicates, int32 or int64 indices; widths 1-257; float32 and
float64, the latter with jax_enable_x64 on for this file). Each example
also checks that two backward runs of one `jax.vjp` are bitwise equal.
Runs are derandomised (the same examples every run); a failure prints the
drawn example, whose `seed` rebuilds the arrays. FASTGNN_PROPERTY_EXAMPLES
sets the examples per test, as for tests/test_properties.py; the default
here is 20 (each example is a few eager JAX calls through the kernel
callbacks: the file takes about half a minute on 2 CPU cores).
"""
import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("hypothesis")
import jax.numpy as jnp  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fastgnn.jax as fj  # noqa: E402
from fastgnn.backends import reference as ref  # noqa: E402
from fastgnn.testing import assert_close  # noqa: E402
from test_properties import (REDUCES, VTYPES, WIDTHS, _bitwise_equal,  # noqa: E402
                             attention_case, check_attention, check_segment, graphs,
                             segment_case)

EXAMPLES = int(os.environ.get("FASTGNN_PROPERTY_EXAMPLES", "20"))
PROPERTY = settings(max_examples=EXAMPLES, derandomize=True, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


@pytest.fixture(autouse=True, scope="module")
def x64():
    """float64 inputs stay float64 (float32 ones stay float32)."""
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)


def _graph(case):
    ei, num_src, num_dst, itype, _ = case
    return fj.Graph.from_edge_index(ei.astype(itype), num_src=num_src, num_dst=num_dst)


def _vjp(fn, inputs, cotangent):
    """(outputs, gradients) of fn(inputs) under `cotangent`, the backward run
    twice and checked bitwise equal."""
    out, vjp = jax.vjp(fn, inputs)
    (grads,) = vjp(cotangent)
    (again,) = vjp(cotangent)
    for name in grads:
        _bitwise_equal(grads[name], again[name], f"grad {name}")
    return out, grads


@PROPERTY
@given(case=graphs(), width=WIDTHS, vtype=VTYPES, reduce=st.sampled_from(["sum", "mean"]),
       weighted=st.booleans(), with_bias=st.booleans())
def test_spmm_against_reference(case, width, vtype, reduce, weighted, with_bias):
    ei, num_src, num_dst, _, seed = case
    rng = np.random.default_rng(seed + 1)
    g = _graph(case)
    a = {"x": rng.standard_normal((num_src, width)).astype(vtype)}
    if weighted:
        a["edge_weight"] = rng.standard_normal(ei.shape[1]).astype(vtype)
    if with_bias:
        a["bias"] = rng.standard_normal(width).astype(vtype)
    go = rng.standard_normal((num_dst, width)).astype(vtype)
    out, grads = _vjp(lambda a: fj.spmm(g, a["x"], a.get("edge_weight"), reduce,
                                        bias=a.get("bias")),
                      {k: jnp.asarray(v) for k, v in a.items()}, jnp.asarray(go))
    assert out.dtype == jnp.dtype(vtype)
    w, b = a.get("edge_weight"), a.get("bias")
    assert_close(np.asarray(out), ref.spmm(ei, a["x"], w, reduce, num_dst, bias=b), vtype, "out")
    rgx, rgw = ref.spmm_vjp(ei, a["x"], w, reduce, go)
    assert_close(np.asarray(grads["x"]), rgx, vtype, "grad_x")
    if weighted:
        assert_close(np.asarray(grads["edge_weight"]), rgw, vtype, "grad_edge_weight")
    if with_bias:
        # a column sum can nearly cancel: its rounding scales with sum |g|, not |sum g|
        want = ref.column_sum(go)
        cond = (np.linalg.norm(np.abs(go).sum(0)) / max(np.linalg.norm(want), 1e-300)
                if num_dst else 1.0)
        assert_close(np.asarray(grads["bias"]), want, vtype, "grad_bias",
                     tol=1e-5 * max(1.0, cond) if vtype == "float32" else None)


# var and std cancel: drawn in float64 (tests/test_properties.py says why)
@PROPERTY
@given(case=graphs(), width=WIDTHS, vtype=VTYPES, reduce=REDUCES)
def test_segment_reduce_against_reference(case, width, vtype, reduce):
    reduce, vtype, x, go = segment_case(case, width, vtype, reduce)
    g = _graph(case)
    out, grads = _vjp(lambda a: fj.segment_reduce(g, a["x"], reduce), {"x": jnp.asarray(x)},
                      jnp.asarray(go))
    assert out.dtype == jnp.dtype(vtype)
    check_segment(case, x, reduce, go, np.asarray(out), np.asarray(grads["x"]), vtype)


@PROPERTY
@given(case=graphs(), score=st.sampled_from(["gat", "gatv2", "dot"]), heads=st.integers(1, 8),
       channels=st.sampled_from([1, 2, 3, 7, 16, 33]), edge_term=st.booleans(),
       with_alpha=st.booleans(), slope=st.sampled_from([0.2, 0.0, -0.5, 1.5]), vtype=VTYPES)
def test_edge_attention_against_reference(case, score, heads, channels, edge_term, with_alpha,
                                          slope, vtype):
    """Output, weights and every gradient, held to tests/test_properties.py's
    rule: TOLERANCES, or for float32 where larger 16 x (eps32 / eps64) times
    the same call's float64 error on the same inputs (small graphs make some
    attention gradients cancel), and a gradient that is zero in exact
    arithmetic to 10 tolerances of the largest gradient's norm."""
    g = _graph(case)
    x, go, ga, want = attention_case(case, g.core, score, heads, channels, edge_term,
                                     with_alpha, slope, vtype)

    def run(dtype):
        def fn(a):
            return fj.edge_attention(g, score, **a, negative_slope=slope,
                                     return_attention_weights=with_alpha)
        ct = (jnp.asarray(go, dtype), jnp.asarray(ga, dtype)) if with_alpha \
            else jnp.asarray(go, dtype)
        out, grads = _vjp(fn, {k: jnp.asarray(v, dtype) for k, v in x.items()}, ct)
        out, alpha = out if with_alpha else (out, None)
        return {"out": out, "alpha": alpha, **grads}

    ours = run(vtype)
    base = run("float64") if vtype == "float32" else None
    check_attention(score, vtype, want, ours, base, np.asarray)


@PROPERTY
@given(case=graphs(), op=st.sampled_from(["spmm", "segment_reduce", "edge_attention"]),
       width=st.sampled_from([1, 3, 16, 33]), vtype=VTYPES)
def test_jitted_backward_is_bitwise_repeatable(case, op, width, vtype):
    """One jitted forward+backward, run twice on the same inputs: every
    gradient bitwise equal (the kernels' fixed-order sums, the residuals
    the forward hands the backward)."""
    ei, num_src, num_dst, _, seed = case
    rng = np.random.default_rng(seed + 8)
    g = _graph(case)

    def arr(*shape):
        return jnp.asarray(rng.standard_normal(shape).astype(vtype))
    if op == "spmm":
        a = {"x": arr(num_src, width), "edge_weight": arr(ei.shape[1]), "bias": arr(width)}

        def fn(a):
            return fj.spmm(g, a["x"], a["edge_weight"], "mean", bias=a["bias"])
    elif op == "segment_reduce":
        a = {"x": arr(num_src, width)}

        def fn(a):
            return fj.segment_reduce(g, a["x"], ["max", "mean", "mul"])
    else:
        a = {"q": arr(num_dst, 2, width), "k": arr(num_src, 2, width),
             "v": arr(num_src, 2, width), "ee": arr(ei.shape[1], 2, width)}

        def fn(a):
            return fj.edge_attention(g, "dot", **a)
    ct = arr(*jax.eval_shape(fn, a).shape)
    step = jax.jit(jax.grad(lambda a: jnp.sum(fn(a) * ct)))
    first, second = step(a), step(a)
    for name in a:
        _bitwise_equal(first[name], second[name], f"{op} grad {name}")
