"""fastgnn.jax: every op's outputs and gradients against the float64 NumPy
reference (fastgnn/backends/reference.py) eagerly, under jit, grad and vmap,
on seeded awkward graphs (empty rows, self-loops, duplicates, a hub), odd
widths, float32 and float64; check_grads in float64; the graph argument,
scan, traced dropout seeds and the layers."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import fastgnn.jax as fj  # noqa: E402
from fastgnn.backends import reference as ref  # noqa: E402
from fastgnn.testing import assert_close, awkward_edge_index  # noqa: E402

N, E_BASE, F, H, C = 37, 150, 5, 3, 3
MODES = ("eager", "jit", "vmap")


def _value_type(name):
    """The value type `name`; float64 runs with jax_enable_x64 on (restored after)."""
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", name == "float64")
    yield name
    jax.config.update("jax_enable_x64", before)


@pytest.fixture(params=["float32", "float64"])
def vtype(request):
    yield from _value_type(request.param)


@pytest.fixture
def op_vtype(mode):
    """float32 eagerly, float64 (tight tolerances) under jit and vmap. Each
    XLA compilation costs about a quarter of a second on 2 CPU cores, so the
    matrix is kept to what adds coverage."""
    yield from _value_type("float32" if mode == "eager" else "float64")


@pytest.fixture
def x64():
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)


@pytest.fixture
def graph_ei(seed):
    ei = awkward_edge_index(N, E_BASE, seed=seed)
    return fj.Graph.from_edge_index(ei, N), ei


def _arr(rng, shape, vtype):
    return jnp.asarray(rng.standard_normal(shape), dtype=vtype)


# ---------------------------------------------------------------- cases
# A case: (inputs {name: array}, fn(graph, **inputs) -> tuple of outputs,
# reference(ei, inputs, cotangents) -> (outputs tuple, {name: gradient})).
def _spmm_case(rng, ei, vtype, reduce):
    E = ei.shape[1]
    inputs = {"x": _arr(rng, (N, F), vtype), "edge_weight": _arr(rng, (E,), vtype),
              "bias": _arr(rng, (F,), vtype)}

    def fn(g, x, edge_weight, bias):
        return (fj.spmm(g, x, edge_weight, reduce, bias=bias),)

    def reference(ei, a, cts):
        out = ref.spmm(ei, a["x"], a["edge_weight"], reduce, N, bias=a["bias"])
        gx, gw = ref.spmm_vjp(ei, a["x"], a["edge_weight"], reduce, cts[0])
        return (out,), {"x": gx, "edge_weight": gw, "bias": ref.column_sum(cts[0])}
    return inputs, fn, reference


def _segment_case(rng, ei, vtype, reduce):
    inputs = {"x": _arr(rng, (N, F), vtype)}

    def fn(g, x):
        return (fj.segment_reduce(g, x, reduce),)

    def reference(ei, a, cts):
        out = ref.segment_reduce(ei, a["x"], reduce, N)
        return (out,), {"x": ref.segment_reduce_vjp(ei, a["x"], reduce, N, cts[0])}
    return inputs, fn, reference


DROP = dict(dropout=0.25, seed=1234, offset=7)


def _softmax_case(rng, ei, vtype):
    inputs = {"scores": _arr(rng, (ei.shape[1], H), vtype)}

    def fn(g, scores):
        return (fj.edge_softmax(g, scores, **DROP),)

    def reference(ei, a, cts):
        out = ref.edge_softmax(ei, a["scores"], N, **DROP)
        return (out,), {"scores": ref.edge_softmax_vjp(ei, a["scores"], N, cts[0], **DROP)}
    return inputs, fn, reference


def _attention_inputs(rng, E, score, vtype):
    if score == "gat":
        shapes = {"a_src": (N, H), "a_dst": (N, H), "a_edge": (E, H), "v": (N, H, C)}
    elif score == "gatv2":
        shapes = {"xl": (N, H, C), "xr": (N, H, C), "att": (H, C), "xe": (E, H, C)}
    else:
        shapes = {"q": (N, H, C), "k": (N, H, C), "v": (N, H, C), "ee": (E, H, C)}
    shapes["bias"] = (H, C)
    return {n: _arr(rng, s, vtype) for n, s in shapes.items()}


def _attention_case(rng, ei, vtype, score):
    inputs = _attention_inputs(rng, ei.shape[1], score, vtype)

    def fn(g, **a):
        return fj.edge_attention(g, score, **a, return_attention_weights=True, **DROP)

    def reference(ei, a, cts):
        out, alpha = ref.edge_attention(ei, score, N, a, **DROP)
        grads = ref.edge_attention_vjp(ei, score, N, a, cts[0], cts[1], **DROP)
        return (out, alpha), grads
    return inputs, fn, reference


CASES = {
    **{f"spmm-{r}": (_spmm_case, r) for r in ("sum", "mean")},
    **{f"segment-{r}": (_segment_case, r)
       for r in ("sum", "mean", "max", "min", "var", "std", "mul")},
    "segment-list": (_segment_case, ["min", "std", "sum"]),
    "edge_softmax": (_softmax_case, None),
    **{f"attention-{s}": (_attention_case, s) for s in ("gat", "gatv2", "dot")},
}


def _build(name, rng, ei, vtype):
    make, arg = CASES[name]
    return make(rng, ei, vtype) if arg is None else make(rng, ei, vtype, arg)


def _loss(fn, g, cts):
    """inputs -> (sum_k <out_k, ct_k>, outs): its gradient is the VJP with
    cotangents cts, and the outputs come along (value_and_grad, has_aux)."""
    def loss(inputs):
        outs = fn(g, **inputs)
        return sum(jnp.sum(o * c) for o, c in zip(outs, cts)), outs
    return jax.value_and_grad(loss, has_aux=True)


def _check(outs, grads, ref_outs, ref_grads, vtype, what):
    for k, (o, r) in enumerate(zip(outs, ref_outs)):
        assert o.dtype == jnp.dtype(vtype), f"{what}: output {k} has dtype {o.dtype}"
        assert_close(np.asarray(o), r, vtype, f"{what}: output {k}")
    for n, r in ref_grads.items():
        assert grads[n].dtype == jnp.dtype(vtype)
        assert_close(np.asarray(grads[n]), r, vtype, f"{what}: grad of {n}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(CASES))
def test_op_matches_reference(name, mode, op_vtype, graph_ei, rng):
    g, ei = graph_ei
    vtype = op_vtype
    inputs, fn, reference = _build(name, rng, ei, vtype)
    outs0 = fn(g, **inputs)
    cts = tuple(_arr(rng, o.shape, vtype) for o in outs0)
    both = _loss(fn, g, cts)

    if mode == "eager":
        (_, outs), grads = both(inputs)
        ref_outs, ref_grads = reference(ei, inputs, cts)
        _check(fn(g, **inputs), grads, ref_outs, ref_grads, vtype, "eager")
        _check(outs, grads, ref_outs, ref_grads, vtype, "eager, under grad")
    elif mode == "jit":
        # the graph as a plain (leafless pytree) argument of the jitted function
        (_, outs), grads = jax.jit(lambda a, g: _loss(fn, g, cts)(a))(inputs, g)
        ref_outs, ref_grads = reference(ei, inputs, cts)
        _check(outs, grads, ref_outs, ref_grads, vtype, "jit")
    else:
        # a batch of two: the inputs and a rescaled copy, outputs and gradients
        batch = {n: jnp.stack([a, 0.5 * a]) for n, a in inputs.items()}
        (_, outs), grads = jax.jit(jax.vmap(both))(batch)
        for b in range(2):
            one = {n: a[b] for n, a in batch.items()}
            ref_outs, ref_grads = reference(ei, one, cts)
            _check(tuple(o[b] for o in outs), {n: v[b] for n, v in grads.items()},
                   ref_outs, ref_grads, vtype, f"vmap[{b}]")


def _gpu():
    """JAX's first GPU (skips without a GPU that both JAX and CuPy see)."""
    import fastgnn
    try:
        dev = jax.devices("gpu")[0]
    except RuntimeError:
        dev = None
    if dev is None or not fastgnn.gpu_available():
        pytest.skip("needs a GPU that both JAX and CuPy see")
    return dev


def _gpu_run(name, dtype, graph_ei, rng, again=None):
    """One case on JAX's first GPU under jit and grad (skips without a GPU
    that both JAX and CuPy see): (eager outputs, jitted outputs, gradients,
    inputs, cotangents, reference). again(inputs -> inputs), or a list of
    them: run the eager forward and the jitted program again on those
    inputs, once per function (calls after the first write into XLA's
    buffers directly; from the third on, they replay the recorded launches
    where those qualify)."""
    dev = _gpu()
    g, ei = graph_ei
    inputs, fn, reference = _build(name, rng, ei, dtype)
    inputs = jax.device_put(inputs, dev)
    outs0 = fn(g, **inputs)
    assert all(o.devices() == {dev} for o in outs0), "outputs left the GPU"
    cts = jax.device_put(tuple(_arr(rng, o.shape, dtype) for o in outs0), dev)
    program = jax.jit(lambda a: _loss(fn, g, cts)(a))
    (_, outs), grads = program(inputs)
    for change in (() if again is None else again if isinstance(again, (list, tuple))
                   else (again,)):
        inputs = jax.device_put(change(inputs), dev)
        outs0 = fn(g, **inputs)
        (_, outs), grads = program(inputs)
    return outs0, outs, grads, jax.device_get(inputs), jax.device_get(cts), reference


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_op_on_gpu_matches_reference(name, vtype, graph_ei, rng):
    """On a GPU the kernels run on XLA's buffers and stream: outputs stay on
    the device and equal the reference, under jit and grad."""
    outs0, outs, grads, inputs, cts, reference = _gpu_run(name, vtype, graph_ei, rng)
    ref_outs, ref_grads = reference(graph_ei[1], inputs, cts)
    _check(outs, grads, ref_outs, ref_grads, vtype, "gpu, jit")
    _check(outs0, grads, ref_outs, ref_grads, vtype, "gpu, eager")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_op_on_gpu_second_call_matches_reference(name, graph_ei, rng):
    """The second call of a program (eager and jitted), whose kernels write
    their results into XLA's output buffers directly, on new inputs: still
    the reference's outputs and gradients."""
    vtype = "float32"
    # (half the first inputs: new values, the same conditioning, e.g. of std's gradient)
    outs0, outs, grads, inputs, cts, reference = _gpu_run(
        name, vtype, graph_ei, rng, again=lambda a: {n: 0.5 * v for n, v in a.items()})
    ref_outs, ref_grads = reference(graph_ei[1], inputs, cts)
    _check(outs, grads, ref_outs, ref_grads, vtype, "gpu, jit, second call")
    _check(outs0, grads, ref_outs, ref_grads, vtype, "gpu, eager, second call")


def _halve(a):
    return {n: 0.5 * v for n, v in a.items()}


def _negate(a):
    return {n: -v for n, v in a.items()}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_op_on_gpu_replayed_calls_match_reference(name, graph_ei, rng):
    """Calls three to five of a program (eager and jitted) replay the
    launches their second call recorded, on new buffers and new values
    (negated: other arg-max edges): still the reference's outputs and
    gradients."""
    vtype = "float32"
    outs0, outs, grads, inputs, cts, reference = _gpu_run(
        name, vtype, graph_ei, rng, again=[_halve, _negate, _halve, _negate])
    ref_outs, ref_grads = reference(graph_ei[1], inputs, cts)
    _check(outs, grads, ref_outs, ref_grads, vtype, "gpu, jit, replayed")
    _check(outs0, grads, ref_outs, ref_grads, vtype, "gpu, eager, replayed")


@pytest.mark.gpu
def test_a_replay_learned_on_aliased_buffers_is_refused(graph_ei, rng):
    """A call whose cotangent is the forward's own output (one XLA buffer
    for two inputs of the backward) teaches no replay; a later call with a
    cotangent of its own still gets its gradient, not one computed from
    the output."""
    dev = _gpu()
    g, ei = graph_ei
    x = jax.device_put(_arr(rng, (N, F), "float32"), dev)
    for _ in range(3):
        out, vjp = jax.vjp(lambda a: fj.spmm(g, a), x)
        jax.block_until_ready(vjp(out))
    c = jax.device_put(_arr(rng, (N, F), "float32"), dev)
    got, = vjp(c)
    want = ref.spmm_vjp(ei, np.asarray(x), None, "sum", np.asarray(c))[0]
    assert_close(np.asarray(got), want, "float32", "gradient after aliased calls")


def _replays(graph):
    """{(op name, callback kind): whether its calls replay} of the calls made on graph."""
    from fastgnn.backends.cuda.plan import Replay
    return {(k[3].op.name, k[2]): isinstance(v, Replay) for k, v in graph.core.cache.items()
            if isinstance(k, tuple) and k[:2] == ("fastgnn.jax", "ran")}


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["spmm", "max", "gat", "dot"])
def test_common_calls_replay_on_gpu(name, graph_ei, rng):
    """The forward, the forward with residuals and the backward of spmm,
    segment max and attention without edge terms replay their recorded
    launches from the third call on (their host path would cost more than
    the kernels of a mid-sized graph); dot attention's backward makes its
    three same-sized gradients in each other's output buffers (the first
    fit of `_Claim`), which its replay writes in place."""
    dev = _gpu()
    g, _ = graph_ei
    if name in ("spmm", "max"):
        inputs = {"x": _arr(rng, (N, F), "float32")}
        fn = (lambda x: fj.spmm(g, x)) if name == "spmm" else (
            lambda x: fj.segment_reduce(g, x, "max"))
    else:
        inputs = {n: v for n, v in _attention_inputs(rng, 0, name, "float32").items()
                  if n in ("a_src", "a_dst", "v", "q", "k")}
        fn = (lambda **a: fj.edge_attention(g, name, **a))
    inputs = jax.device_put(inputs, dev)
    fwd = jax.jit(lambda a: fn(**a))
    both = jax.jit(jax.grad(lambda a: jnp.sum(fn(**a) ** 2)))
    for _ in range(3):
        jax.block_until_ready((fwd(inputs), both(inputs)))
    op = {"spmm": "spmm", "max": "segment_reduce"}.get(name, "edge_attention")
    assert _replays(g) == {(op, "forward"): True, (op, "forward with residuals"): True,
                           (op, "backward"): True}


GPU_16BIT = ["spmm-sum", "segment-mean", "segment-max", "edge_softmax", "attention-gat",
             "attention-gatv2", "attention-dot"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", GPU_16BIT)
def test_op_on_gpu_16bit_matches_reference(name, dtype, graph_ei, rng):
    """bfloat16 (carried to the kernels as int16 bits) and float16 on the
    GPU: outputs within the dtype's tolerance of the float64 reference on
    the same (rounded) inputs, gradients within 3e-2, dtypes kept."""
    _, outs, grads, inputs, cts, reference = _gpu_run(name, dtype, graph_ei, rng)
    wide = {k: np.asarray(v, np.float64) for k, v in inputs.items()}
    ref_outs, ref_grads = reference(graph_ei[1], wide, [np.asarray(c, np.float64) for c in cts])
    for k, (o, r) in enumerate(zip(outs, ref_outs)):
        assert o.dtype == jnp.dtype(dtype), f"output {k} has dtype {o.dtype}"
        assert_close(np.asarray(o, np.float64), r, dtype, f"gpu {dtype}: output {k}")
    for n, r in ref_grads.items():
        assert grads[n].dtype == jnp.dtype(dtype)
        assert_close(np.asarray(grads[n], np.float64), r, dtype, f"gpu {dtype}: grad of {n}",
                     tol=3e-2)


def test_16bit_on_the_cpu_is_refused(graph_ei):
    if jax.default_backend() != "cpu":
        pytest.skip("the refusal is the CPU's")
    g, _ = graph_ei
    for dt in (jnp.bfloat16, jnp.float16):
        with pytest.raises(TypeError, match="GPU only"):
            fj.spmm(g, jnp.ones((N, F), dt))


# ------------------------------------------------------------- gcn_norm
def test_gcn_norm(vtype, graph_ei, rng):
    g, ei = graph_ei
    g2, w2 = fj.gcn_norm(g)
    ei_ref, w_ref = ref.gcn_norm(ei, N)
    np.testing.assert_array_equal(np.asarray(g2.edge_index), ei_ref)
    assert_close(np.asarray(w2), w_ref, "float32")
    assert fj.gcn_norm(g)[0] is g2                         # cached: one graph object
    w = jnp.asarray(rng.uniform(0.5, 2.0, ei.shape[1]), dtype=vtype)
    for improved in (False, True):
        g3, w3 = jax.jit(lambda w: fj.gcn_norm(g, w, improved=improved))(w)
        _, w3_ref = ref.gcn_norm(ei, N, np.asarray(w), improved=improved)
        assert g3 is g2 and w3.dtype == jnp.dtype(vtype)
        assert_close(np.asarray(w3), w3_ref, vtype)


def test_check_grads_float64(x64, graph_ei, rng):
    g, ei = graph_ei
    E = ei.shape[1]
    x, w, b = (_arr(rng, s, "float64") for s in ((N, F), (E,), (F,)))
    # jitted: one compilation each instead of one per eager operation
    check_grads(jax.jit(lambda x, w, b: fj.spmm(g, x, w, "mean", bias=b)), (x, w, b), order=1,
                modes=["rev"])
    a = _attention_inputs(rng, E, "dot", "float64")     # smooth (no LeakyReLU kinks)
    check_grads(jax.jit(lambda *v: fj.edge_attention(g, "dot", **dict(zip(a, v)), dropout=0.2,
                                                     seed=3)),
                tuple(a.values()), order=1, modes=["rev"])
    check_grads(jax.jit(lambda x: fj.segment_reduce(g, x, ["mean", "var"])), (x,), order=1,
                modes=["rev"])
    w_pos = jnp.asarray(rng.uniform(0.5, 2.0, E))
    check_grads(jax.jit(lambda w: fj.gcn_norm(g, w)[1]), (w_pos,), order=1, modes=["rev"])


# --------------------------------------------------- graph, jit, scan, seeds
def test_graph_is_built_once_and_jit_reuses_it(graph_ei, rng):
    g, ei = graph_ei
    traces = []

    def f(g, x):
        traces.append(1)
        return fj.spmm(g, x, reduce="mean")
    x = _arr(rng, (N, F), "float32")
    jf = jax.jit(f)
    first = jf(g, x)
    jf(g, x + 1)
    assert len(traces) == 1                       # one trace for one graph object
    static = jax.jit(f, static_argnums=0)
    np.testing.assert_array_equal(static(g, x), first)
    np.testing.assert_array_equal(jax.jit(lambda x: fj.spmm(g, x, reduce="mean"))(x), first)
    assert {g: 1}[g] == 1 and fj.Graph(g.core) != g       # hashed and compared by identity
    assert jax.tree_util.tree_leaves(g) == []
    # CSR built from JAX arrays gives the same aggregation (edges in CSR order)
    core = g.core
    g_csr = fj.Graph.from_csr(jnp.asarray(core.indptr), jnp.asarray(core.indices), N)
    np.testing.assert_allclose(fj.spmm(g_csr, x, reduce="mean"), first, rtol=1e-6)
    with pytest.raises(TypeError, match="traced"):
        jax.jit(lambda e: fj.Graph.from_edge_index(e, N))(jnp.asarray(ei))


def test_scan_and_grad_through_scan(graph_ei, rng):
    g, ei = graph_ei
    x = _arr(rng, (N, F), "float32")

    def run(x):
        def body(h, _):
            return jnp.tanh(fj.spmm(g, h, reduce="mean") + h), None
        return jax.lax.scan(body, x, None, length=3)[0].sum()

    def run_ref(x):
        h = np.asarray(x, np.float64)
        for _ in range(3):
            h = np.tanh(ref.spmm(ei, h, reduce="mean") + h)
        return h.sum()
    val, grad = jax.jit(jax.value_and_grad(run))(x)
    assert_close(float(val), run_ref(x), "float32")
    eps = 1e-3
    d = rng.standard_normal((N, F)).astype(np.float32)
    fd = (run_ref(x + eps * d) - run_ref(x - eps * d)) / (2 * eps)
    assert abs(float(jnp.sum(grad * d)) - fd) <= 1e-3 * max(1.0, abs(fd))


def test_traced_seed_matches_int_seed_without_recompiling(graph_ei, rng):
    g, ei = graph_ei
    s = _arr(rng, (ei.shape[1], H), "float32")
    traces = []

    def f(s, seed):
        traces.append(1)
        return fj.edge_softmax(g, s, dropout=0.5, seed=seed)
    jf = jax.jit(f)
    for seed in (3, 4, 2**32 - 1):
        out = jf(s, jnp.uint32(seed))
        assert_close(np.asarray(out), ref.edge_softmax(ei, s, N, dropout=0.5, seed=seed))
        np.testing.assert_array_equal(out, fj.edge_softmax(g, s, dropout=0.5, seed=seed))
    assert len(traces) == 1
    # integer inputs get a zero (float0) cotangent
    _, vjp = jax.vjp(lambda s, seed: fj.edge_softmax(g, s, dropout=0.5, seed=seed), s,
                     jnp.uint32(3))
    gs, gseed = vjp(jnp.ones_like(s))
    assert gs.shape == s.shape and gseed.dtype == jax.dtypes.float0


def test_core_validation_reaches_the_caller(graph_ei, rng):
    g, _ = graph_ei
    with pytest.raises(ValueError, match="rows but the graph has"):
        fj.spmm(g, _arr(rng, (N + 1, F), "float32"))     # at the call, not in a callback
    with pytest.raises(ValueError, match="reduce must be one of"):
        fj.segment_reduce(g, _arr(rng, (N, F), "float32"), "median")
    with pytest.raises(TypeError, match="fastgnn.jax.Graph"):
        fj.spmm(g.core, _arr(rng, (N, F), "float32"))


# ------------------------------------------------------------------ TF32
TF32_PRECISIONS = {None: True, "bfloat16": True, "tensorfloat32": True, "high": True,
                   "TF32_TF32_F32": True, "BF16_BF16_F32": True, "float32": False,
                   "highest": False, "F32_F32_F32": False, "TF32_TF32_F32_X3": False,
                   "BF16_BF16_F32_X6": False}


def test_tf32_follows_jax_matmul_precision(graph_ei, rng, monkeypatch):
    """spmm and edge_attention hand the core tf32=True exactly where JAX's
    matmul precision lets float32 products be TF32 (or coarser), eagerly and
    under jit (a new precision retraces)."""
    import fastgnn.jax.ops as ops
    g, _ = graph_ei
    seen = []
    for name in ("spmm_fwd", "edge_attention_fwd"):
        real = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *a, real=real, **k: (seen.append(k["tf32"]),
                                                                   real(*a, **k))[1])
    x = _arr(rng, (N, F), "float32")
    q, k, v = (_arr(rng, (N, H, C), "float32") for _ in range(3))
    run = jax.jit(lambda x, q, k, v: (fj.spmm(g, x), fj.edge_attention(g, "dot", q=q, k=k, v=v)))
    for precision, want in TF32_PRECISIONS.items():
        with jax.default_matmul_precision(precision):
            assert fj.ops.tf32_allowed() is want, precision
            for fn in (lambda: (fj.spmm(g, x), fj.edge_attention(g, "dot", q=q, k=k, v=v)),
                       lambda: run(x, q, k, v)):
                seen.clear()
                jax.block_until_ready(fn())
                assert seen and set(seen) == {want}, (precision, seen)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tensorfloat32", "float32"])
def test_gpu_fp32_attention_and_spmm_take_tf32_tensor_cores_where_jax_allows(precision,
                                                                              monkeypatch):
    """On a locally dense graph fp32 dot attention and SpMM run the Tensor
    Core kernels as TF32 exactly when JAX's matmul precision allows TF32
    (forward and backward), within TF32's tolerance of float64 either way."""
    from fastgnn import blocksparse as tc
    from fastgnn.generators import clustered
    from fastgnn.testing import TOLERANCES, rel_err
    dev = _gpu()
    ei, n = clustered(2048, block=32, random_per_node=1, seed=3)    # deduplicated
    Hh, Cc = 2, 32
    calls = []
    for name in ("attention_fwd", "attention_bwd", "spmm"):
        monkeypatch.setattr(tc, name, (lambda f, name: lambda *a, **k: (calls.append(name),
                                                                         f(*a, **k))[1])(
            getattr(tc, name), name))
    r = np.random.default_rng(4)
    q, k, v, go = (r.standard_normal((n, Hh, Cc)) for _ in range(4))
    x, gx = r.standard_normal((n, 64)), r.standard_normal((n, 64))
    g = fj.Graph.from_edge_index(ei, n)

    def loss(q, k, v, x):
        return (jnp.sum(fj.edge_attention(g, "dot", q=q, k=k, v=v) * go.astype(np.float32))
                + jnp.sum(fj.spmm(g, x) * gx.astype(np.float32)))

    q32, k32, v32, x32 = jax.device_put(tuple(np.float32(a) for a in (q, k, v, x)), dev)
    with jax.default_matmul_precision(precision):
        grads = jax.grad(loss, argnums=(0, 1, 2, 3))(q32, k32, v32, x32)
        out = fj.edge_attention(g, "dot", q=q32, k=k32, v=v32)
        jax.block_until_ready((grads, out))
    tf32 = precision == "tensorfloat32"
    assert {"attention_fwd", "attention_bwd", "spmm"} <= set(calls) if tf32 else not calls, calls
    want, _ = ref.edge_attention(ei, "dot", n, dict(q=q, k=k, v=v))
    vjp = ref.edge_attention_vjp(ei, "dot", n, dict(q=q, k=k, v=v), go)
    gq, gk, gv = vjp["q"], vjp["k"], vjp["v"]
    gxx = ref.spmm_vjp(ei, x, None, "sum", gx)[0]
    tol = TOLERANCES["tf32"] if tf32 else TOLERANCES["float32"]
    for what, a, b in (("out", out, want), ("grad q", grads[0], gq), ("grad k", grads[1], gk),
                       ("grad v", grads[2], gv), ("grad x", grads[3], gxx)):
        err = rel_err(np.asarray(a, np.float64), b)
        assert err < 16 * tol, f"{what}: rel err {err:.2e} ({precision})"


# ---------------------------------------------------------------- layers
def test_layers(graph_ei, rng):
    """Every layer's forward and gradient in one jitted program (one
    compilation); GCN and mean-SAGE against the reference."""
    g, ei = graph_ei
    nn = fj.nn
    x = _arr(rng, (N, 6), "float32")
    layers = [  # (init, apply, output width)
        (lambda k: nn.gcn_init(k, 6, 4), lambda p, x: nn.gcn(p, g, x), 4),
        (lambda k: nn.sage_init(k, 6, 4), lambda p, x: nn.sage(p, g, x), 4),
        (lambda k: nn.sage_init(k, 6, 4), lambda p, x: nn.sage(p, g, x, aggr="max"), 4),
        (lambda k: nn.gin_init(k, 6, 4, hidden=7), lambda p, x: nn.gin(p, g, x), 4),
        (lambda k: nn.gat_init(k, 6, 4, heads=3),
         lambda p, x: nn.gat(p, g, x, dropout=0.1, seed=5), 12),
        (lambda k: nn.gat_init(k, 6, 4, heads=3, concat=False),
         lambda p, x: nn.gat(p, g, x, concat=False), 4),
        (lambda k: nn.gatv2_init(k, 6, 4, heads=2), lambda p, x: nn.gatv2(p, g, x), 8),
        (lambda k: nn.gatv2_init(k, 6, 4, heads=2, share_weights=True),
         lambda p, x: nn.gatv2(p, g, x), 8),
        (lambda k: nn.transformer_init(k, 6, 4, heads=2),
         lambda p, x: nn.transformer(p, g, x, heads=2), 8)]
    params = jax.jit(lambda k: [init(k) for init, _, _ in layers])(jax.random.PRNGKey(0))

    def loss(params):
        outs = [f(p, x) for p, (_, f, _) in zip(params, layers)]
        return sum((o ** 2).sum() for o in outs), outs
    (_, outs), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    for out, (_, _, width) in zip(outs, layers):
        assert out.shape == (N, width) and bool(jnp.isfinite(out).all())
    assert all(bool(jnp.isfinite(v).all()) for v in jax.tree_util.tree_leaves(grads))

    xd = np.asarray(x, np.float64)
    p = {k: np.asarray(v, np.float64) for k, v in params[0].items()}
    ei2, w2 = ref.gcn_norm(ei, N)
    assert_close(np.asarray(outs[0]), ref.spmm(ei2, xd @ p["weight"], w2, num_dst=N) + p["bias"],
                 "float32")
    p = {k: np.asarray(v, np.float64) for k, v in params[1].items()}
    want = ref.spmm(ei, xd, reduce="mean") @ p["lin_l"] + p["bias"] + xd @ p["lin_r"]
    assert_close(np.asarray(outs[1]), want, "float32")


def test_flax_nnx_modules(graph_ei, rng):
    """The NNX modules call the functional layers with their Params; attention
    dropout draws a new seed per call, none after eval()."""
    nnx = pytest.importorskip("flax.nnx")
    from fastgnn.jax import nnx as fnnx
    g, _ = graph_ei
    x = _arr(rng, (N, 6), "float32")

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.c1 = fnnx.GATv2Conv(6, 4, heads=2, dropout=0.3, rngs=rngs)
            self.c2 = fnnx.SAGEConv(8, 3, aggr="max", rngs=rngs)

        def __call__(self, g, x):
            return self.c2(g, jax.nn.relu(self.c1(g, x)))

    net = Net(nnx.Rngs(params=0, dropout=1))

    @nnx.jit
    def step(net, x):
        return nnx.value_and_grad(lambda n: (n(g, x) ** 2).mean())(net)
    (l1, grads), (l2, _) = step(net, x), step(net, x)
    assert float(l1) != float(l2)                         # a fresh dropout seed per call
    assert jax.tree_util.tree_leaves(nnx.state(grads))
    net.eval()
    p1 = {k: getattr(net.c1, k)[...] for k in net.c1.names}
    p2 = {k: getattr(net.c2, k)[...] for k in net.c2.names}
    want = fj.nn.sage(p2, g, jax.nn.relu(fj.nn.gatv2(p1, g, x)), aggr="max")
    np.testing.assert_allclose(net(g, x), want, rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match="takes no"):
        fnnx.GCNConv(6, 4, heads=2, rngs=nnx.Rngs(0))


def test_backward_takes_the_forwards_residuals(graph_ei, rng, monkeypatch):
    """Under jit and grad the backward reads the residuals the forward
    returned (argmax positions here) instead of running the forward again;
    with a traced dropout seed it recomputes the forward (the seed is not a
    residual). Both against the reference."""
    from fastgnn.jax import ops
    g, ei = graph_ei
    calls = []
    for op in (ops.SEGMENT_REDUCE, ops.EDGE_SOFTMAX):
        fwd = op.fwd
        monkeypatch.setattr(op, "fwd", lambda *a, _f=fwd, **k: (calls.append(1), _f(*a, **k))[1])
    x = _arr(rng, (N, F), "float32")
    grad = jax.jit(jax.grad(lambda x: jnp.sum(fj.segment_reduce(g, x, "max") ** 2)))
    grad(x).block_until_ready()
    before = len(calls)
    got = grad(2 * x)
    assert len(calls) - before == 1, "the backward ran the forward again"
    out = ref.segment_reduce(ei, np.asarray(2 * x), "max", N)
    assert_close(np.asarray(got), ref.segment_reduce_vjp(ei, np.asarray(2 * x), "max", N,
                                                         2 * out), "float32")
    s = _arr(rng, (ei.shape[1], H), "float32")
    sgrad = jax.jit(jax.grad(lambda s, seed: jnp.sum(fj.edge_softmax(g, s, dropout=0.25,
                                                                     seed=seed) ** 2)))
    sgrad(s, jnp.uint32(5)).block_until_ready()
    before = len(calls)
    sgrad(s, jnp.uint32(6)).block_until_ready()
    assert len(calls) - before == 2, "a traced seed's backward recomputes the forward"


def test_a_forward_without_backward_skips_the_residuals(graph_ei, rng, monkeypatch):
    """A forward no backward follows runs the core's fwd with its gradient
    flags off (segment_reduce's needs_x_grad: no max positions kept);
    differentiated, with them on."""
    from fastgnn.jax import ops
    g, _ = graph_ei
    seen = []
    fwd = ops.SEGMENT_REDUCE.fwd
    monkeypatch.setattr(ops.SEGMENT_REDUCE, "fwd",
                        lambda *a, **k: (seen.append(k.get("needs_x_grad")), fwd(*a, **k))[1])
    x = _arr(rng, (N, F), "float32")
    plain = fj.segment_reduce(g, x, "max")
    jax.jit(lambda x: fj.segment_reduce(g, x, "max"))(x).block_until_ready()
    assert seen and not any(seen), seen
    seen.clear()
    jax.grad(lambda x: jnp.sum(fj.segment_reduce(g, x, "max")))(x).block_until_ready()
    assert seen and all(seen), seen
    np.testing.assert_array_equal(np.asarray(plain), np.asarray(fj.segment_reduce(g, x, "max")))


def test_a_backward_away_from_the_layouts_device_recomputes(graph_ei, rng, monkeypatch):
    """A residual layout learned elsewhere than the backward runs (another
    GPU, or the GPU for a CPU computation) is not used: the backward
    recomputes the forward, with the reference's gradient."""
    from fastgnn.jax import _bridge, ops
    g, ei = graph_ei
    learn = _bridge._learn_layout
    monkeypatch.setattr(_bridge, "_learn_layout",
                        lambda call, where: learn(call, where)._replace(where=("gpu", 7)))
    calls = []
    fwd = ops.SEGMENT_REDUCE.fwd
    monkeypatch.setattr(ops.SEGMENT_REDUCE, "fwd",
                        lambda *a, **k: (calls.append(1), fwd(*a, **k))[1])
    x = _arr(rng, (N, F), "float32")
    grad = jax.jit(jax.grad(lambda x: jnp.sum(fj.segment_reduce(g, x, "mean") ** 2)))
    grad(x).block_until_ready()
    before = len(calls)
    got = grad(x)
    assert len(calls) - before == 2, "the backward used a layout from another device"
    out = ref.segment_reduce(ei, np.asarray(x), "mean", N)
    assert_close(np.asarray(got), ref.segment_reduce_vjp(ei, np.asarray(x), "mean", N, 2 * out),
                 "float32")


@pytest.mark.parametrize("replay", [True, False])
def test_gpu_calls_claim_then_record_then_replay(monkeypatch, replay):
    """A GPU callback's calls per device (`_bridge._on_gpu`, with stand-ins
    for the host path and the replay): the first builds caches without
    claiming XLA's buffers, the second claims and records its launches
    (not with a traced seed, `replay=False`), later ones replay what it
    learned, and take the host path again where the replay does not serve
    their buffers or none was learned."""
    from fastgnn.jax import _bridge
    host, replays = [], []
    learned = ["replay", _bridge._RETRY]      # (popped from the end: a retry first)

    def run_on_gpu(fn, ctx, outs, bufs, device, claim, learn=None):
        host.append((device, claim, learn is not None))
        return learned.pop() if learn is not None and learned else None

    def replay_call(rep, ctx, outs, bufs, device):
        replays.append((rep, device))
        return bufs != ("misaligned",)

    monkeypatch.setattr(_bridge, "_run_on_gpu", run_on_gpu)
    monkeypatch.setattr(_bridge, "_replay", replay_call)
    cache, fn = {}, object()
    ran = (cache, ("fastgnn.jax", "ran", "forward", "signature"))

    def call(device=0, bufs=("buf",)):
        _bridge._on_gpu(fn, ran, replay, None, ("out",), bufs, device)

    call(), call(), call(), call(), call(bufs=("misaligned",)), call(device=1)
    if replay:
        assert host == [(0, False, False), (0, True, True), (0, True, True), (0, True, False),
                        (1, False, False)]
        assert replays == [("replay", 0), ("replay", 0)]
        assert cache == {ran[1] + (0,): "replay", ran[1] + (1,): True}
    else:
        assert host == [(0, False, False)] + [(0, True, False)] * 4 + [(1, False, False)]
        assert replays == [] and cache == {ran[1] + (0,): True, ran[1] + (1,): True}
    monkeypatch.setattr(_bridge, "REPLAY", False)   # the off switch: learned replays too
    host.clear()
    replays.clear()
    call()
    assert replays == [] and host == [(0, True, False)]
    cache.clear()
    call(), call(), call()
    assert host == [(0, True, False), (0, False, False), (0, True, False), (0, True, False)]


def test_a_replay_sends_only_results_made_on_their_own_to_the_outputs():
    """Only a result made as an allocation of exactly its span, overlapping
    no other allocation of the call, is taken as the output (an address in
    a larger or reused block may reach past it)."""
    from fastgnn.jax._bridge import _exact_results
    assert _exact_results([(0x1000, 256)], [(0x1000, 256), (0x2000, 64)])
    assert not _exact_results([(0x1000, 256)], [(0x1000, 512)])      # a view of a larger one
    assert not _exact_results([(0x1000, 256)], [(0x1000, 1024), (0x1000, 256)])    # reused
    assert not _exact_results([(0x1000, 256)], [(0x2000, 256)])      # not allocated by the call


def test_gpu_buffer_views_are_built_from_the_address():
    """_cupy_view makes a CuPy array on an XLA buffer's memory from its
    address, shape and dtype (bfloat16 as int16, the device given, no
    import of its CUDA array interface, which synchronises the host with a
    stream the interface names); a strided buffer falls back to that import. Checked
    with a stand-in CuPy that records the calls."""
    from fastgnn.jax import _bridge

    class Buf:
        def __init__(self, shape, dtype, strides=None):
            self.shape, self.dtype = shape, np.dtype(dtype) if dtype != "bf16" else jnp.bfloat16
            self.__cuda_array_interface__ = {"data": (4096, False), "shape": shape,
                                             "strides": strides}

    class FakeCuPy:
        def __init__(self):
            self.calls = []
            fake = self

            class cuda:
                @staticmethod
                def UnownedMemory(ptr, size, owner, device):
                    fake.calls.append(("memory", ptr, size, device))
                    return ("mem", ptr)

                @staticmethod
                def MemoryPointer(mem, offset):
                    return (mem, offset)
            self.cuda = cuda

        def ndarray(self, shape, dtype, memptr):
            self.calls.append(("ndarray", shape, np.dtype(dtype), memptr))

        def empty(self, shape, dtype):
            self.calls.append(("empty", shape, np.dtype(dtype)))

        def asarray(self, b):
            self.calls.append(("asarray",))

    cp = FakeCuPy()
    _bridge._cupy_view(cp, Buf((3, 5), np.float32), 2)
    _bridge._cupy_view(cp, Buf((7,), "bf16"), 0)
    _bridge._cupy_view(cp, Buf((0, 4), np.float32), 0)
    _bridge._cupy_view(cp, Buf((3, 5), np.float32, strides=(20, 4)), 1)    # dense, given
    _bridge._cupy_view(cp, Buf((3, 5), np.float32, strides=(40, 4)), 1)    # strided
    assert cp.calls == [
        ("memory", 4096, 60, 2), ("ndarray", (3, 5), np.dtype(np.float32), (("mem", 4096), 0)),
        ("memory", 4096, 14, 0), ("ndarray", (7,), np.dtype(np.int16), (("mem", 4096), 0)),
        ("empty", (0, 4), np.dtype(np.float32)),
        ("memory", 4096, 60, 1), ("ndarray", (3, 5), np.dtype(np.float32), (("mem", 4096), 0)),
        ("asarray",)]
