"""Property tests: the ops on random graphs against the float64 reference,
and the drop-in layers against PyG.

Hypothesis draws the graph (square or bipartite, zero to 200 edges, empty
rows, a hub target, self-loops, duplicate edges, int32 or int64 indices;
segment_csr: the segment sizes), the feature width (1-257), the heads
(1-8), the value type and a random cotangent; each example checks outputs
and gradients against `fastgnn.backends.reference` and that two backward
runs are bitwise equal (spmm with and without its bias, gcn_norm, the
reductions, edge_softmax, edge_attention with gat, gatv2 and dot scores,
with and without an edge term and the attention weights); the layers are
compared with PyG's from the same weights in float64.
Runs are derandomised (the same examples every run); a failure prints the
drawn example, whose `seed` rebuilds the arrays. FASTGNN_PROPERTY_EXAMPLES
sets the examples per test (default 100).
"""
import os

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fastgnn import (Graph, edge_softmax_bwd, edge_softmax_fwd, segment_reduce_bwd,  # noqa: E402
                     segment_reduce_fwd, spmm_bwd, spmm_fwd)
from fastgnn.backends import reference as ref  # noqa: E402
from fastgnn.testing import (TOLERANCES, assert_close, devices, rel_err, to_device,  # noqa: E402
                             to_numpy)

EXAMPLES = int(os.environ.get("FASTGNN_PROPERTY_EXAMPLES", "100"))
PROPERTY = settings(max_examples=EXAMPLES, derandomize=True, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])
WIDTHS = st.sampled_from([1, 2, 3, 7, 16, 33, 64, 129, 257])
VTYPES = st.sampled_from(["float32", "float64"])


@st.composite
def graphs(draw):
    """(edge_index [2, E] int64, num_src, num_dst, index dtype, seed)."""
    square = draw(st.booleans())
    num_dst = draw(st.integers(0, 40))
    num_src = num_dst if square else draw(st.integers(0, 40))
    E = draw(st.integers(0, 200)) if num_src and num_dst else 0
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    src = rng.integers(0, max(num_src, 1), E)
    # targets from the first half of the rows only: the rest stay empty
    dst = rng.integers(0, max(1, (num_dst + 1) // 2), E)
    if E and draw(st.booleans()):                          # a hub target
        dst[:E // 2] = rng.integers(0, num_dst)
    if E and square and draw(st.booleans()):               # self-loops
        dst[:E // 4] = src[:E // 4]
    if E > 1 and draw(st.booleans()):                      # duplicate edges
        k = E // 3
        src[E - k:], dst[E - k:] = src[:k], dst[:k]
    order = rng.permutation(E)
    ei = np.stack([src[order], dst[order]]).astype(np.int64)
    itype = draw(st.sampled_from([np.int32, np.int64]))
    return ei, num_src, num_dst, itype, seed


def _graph(case, device):
    ei, num_src, num_dst, itype, _ = case
    return Graph.from_edge_index(to_device(ei, device), num_src=num_src, num_dst=num_dst,
                                 index_dtype=itype)


def _bitwise_equal(a, b, what):
    np.testing.assert_array_equal(to_numpy(a), to_numpy(b), err_msg=f"{what}: two runs differ")


@pytest.mark.parametrize("device", devices())
@PROPERTY
@given(case=graphs(), width=WIDTHS, vtype=VTYPES, reduce=st.sampled_from(["sum", "mean"]),
       weighted=st.booleans())
def test_spmm_against_reference(device, case, width, vtype, reduce, weighted):
    ei, num_src, num_dst, _, seed = case
    rng = np.random.default_rng(seed + 1)
    g = _graph(case, device)
    x = rng.standard_normal((num_src, width)).astype(vtype)
    w = rng.standard_normal(ei.shape[1]).astype(vtype) if weighted else None
    go = rng.standard_normal((num_dst, width)).astype(vtype)
    x_before = x.copy()
    out, res = spmm_fwd(g, to_device(x, device), to_device(w, device), reduce)
    assert_close(to_numpy(out), ref.spmm(ei, x, w, reduce, num_dst), vtype, "out")
    grads = spmm_bwd(g, res, to_device(go, device))
    again = spmm_bwd(g, res, to_device(go, device))
    rgx, rgw = ref.spmm_vjp(ei, x, w, reduce, go)
    assert_close(to_numpy(grads[0]), rgx, vtype, "grad_x")
    _bitwise_equal(grads[0], again[0], "grad_x")
    if weighted:
        assert_close(to_numpy(grads[1]), rgw, vtype, "grad_edge_weight")
        _bitwise_equal(grads[1], again[1], "grad_edge_weight")
    np.testing.assert_array_equal(x, x_before)


@pytest.mark.parametrize("device", devices())
@PROPERTY
@given(case=graphs().filter(lambda c: c[1] == c[2]), width=WIDTHS, weighted=st.booleans(),
       loops=st.booleans(), improved=st.booleans())
def test_gcn_norm_against_reference(device, case, width, weighted, loops, improved):
    """gcn_norm's graph and weights (PyG's semantics: a node's last existing
    loop keeps its weight) applied by spmm, against the reference's edge list."""
    from fastgnn import gcn_norm, spmm
    ei, n, _, _, seed = case
    rng = np.random.default_rng(seed + 6)
    w = rng.uniform(0.5, 2.0, ei.shape[1]) if weighted else None
    g2, w2 = gcn_norm(_graph(case, device), to_device(w, device), add_self_loops=loops,
                      improved=improved)
    rei, rw = ref.gcn_norm(ei, n, w, add_self_loops=loops, improved=improved)
    x = rng.standard_normal((n, width))
    out = spmm(g2, to_device(x, device), w2)
    # (unweighted, the normalisation is stored in float32)
    assert_close(to_numpy(out), ref.spmm(rei, x, rw, "sum", n),
                 "float64" if weighted else "float32", "out")


@pytest.mark.parametrize("device", devices())
@PROPERTY
@given(case=graphs(), width=WIDTHS, vtype=VTYPES, reduce=st.sampled_from(["sum", "mean"]))
def test_spmm_bias_against_reference(device, case, width, vtype, reduce):
    """The bias fused into spmm's store: every row gets it (empty ones too),
    its gradient is the cotangent's column sum."""
    ei, num_src, num_dst, _, seed = case
    rng = np.random.default_rng(seed + 7)
    g = _graph(case, device)
    x = rng.standard_normal((num_src, width)).astype(vtype)
    b = rng.standard_normal(width).astype(vtype)
    go = rng.standard_normal((num_dst, width)).astype(vtype)
    out, res = spmm_fwd(g, to_device(x, device), None, reduce, bias=to_device(b, device))
    assert_close(to_numpy(out), ref.spmm(ei, x, None, reduce, num_dst, bias=b), vtype, "out")
    gx, _, gb = spmm_bwd(g, res, to_device(go, device))
    assert_close(to_numpy(gx), ref.spmm_vjp(ei, x, None, reduce, go)[0], vtype, "grad_x")
    # a column sum can nearly cancel: its rounding scales with sum |g|, not |sum g|
    want = ref.column_sum(go)
    cond = (np.linalg.norm(np.abs(go).sum(0)) / max(np.linalg.norm(want), 1e-300)
            if num_dst else 1.0)
    assert_close(to_numpy(gb), want, vtype, "grad_bias",
                 tol=1e-5 * max(1.0, cond) if vtype == "float32" else None)


# var and std cancel (E[x^2] - E[x]^2, as PyG): their float32 error follows
# each row's conditioning, which random rows do not bound, so they are drawn
# in float64 here (tests/test_segment.py bounds their float32 error)
REDUCES = st.sampled_from(["sum", "mean", "max", "min", "mul", "var", "std",
                           ("mean", "max", "min", "std")])


def segment_case(case, width, vtype, reduce):
    """(reduce, vtype, x [num_src, width], grad out [num_dst, R * width]) of
    one drawn segment_reduce example; var and std are drawn in float64."""
    _, num_src, num_dst, _, seed = case
    cancelling = {"var", "std"} & set([reduce] if isinstance(reduce, str) else reduce)
    vtype = "float64" if cancelling else vtype
    reduce = reduce if isinstance(reduce, str) else list(reduce)
    R = 1 if isinstance(reduce, str) else len(reduce)
    rng = np.random.default_rng(seed + 2)
    x = rng.standard_normal((num_src, width)).astype(vtype)
    go = rng.standard_normal((num_dst, R * width)).astype(vtype)
    return reduce, vtype, x, go


def check_segment(case, x, reduce, go, out, grad_x, vtype):
    """Hold segment_reduce's out and grad_x (NumPy) to the float64 reference.
    var's mean(x^2) - mean(x)^2 of a row of equal values is rounding noise
    on both sides, of the size eps * mean(x^2): its error is measured
    against that scale where the reference itself is smaller."""
    ei, _, num_dst, _, _ = case
    want = ref.segment_reduce(ei, x, reduce, num_dst)
    tol = None
    if "var" in ([reduce] if isinstance(reduce, str) else reduce):
        scale = np.linalg.norm(ref.segment_reduce(ei, x * x, "mean", num_dst))
        tol = TOLERANCES[vtype] * max(1.0, scale / max(np.linalg.norm(want), 1e-300))
    assert_close(out, want, vtype, "out", tol=tol)
    assert_close(grad_x, ref.segment_reduce_vjp(ei, x, reduce, num_dst, go), vtype, "grad_x")


@pytest.mark.parametrize("device", devices())
@PROPERTY
@given(case=graphs(), width=WIDTHS, vtype=VTYPES, reduce=REDUCES)
def test_segment_reduce_against_reference(device, case, width, vtype, reduce):
    reduce, vtype, x, go = segment_case(case, width, vtype, reduce)
    g = _graph(case, device)
    out, res = segment_reduce_fwd(g, to_device(x, device), reduce)
    gx = segment_reduce_bwd(g, res, to_device(go, device))
    check_segment(case, x, reduce, go, to_numpy(out), to_numpy(gx), vtype)
    _bitwise_equal(gx, segment_reduce_bwd(g, res, to_device(go, device)), "grad_x")


@pytest.mark.parametrize("device", devices())
@PROPERTY
@given(sizes=st.lists(st.integers(0, 12), min_size=1, max_size=30), width=WIDTHS, vtype=VTYPES,
       reduce=st.sampled_from(["sum", "mean", "max", "min", "mul"]),
       seed=st.integers(0, 2**31 - 1))
def test_segment_csr_against_reference(device, sizes, width, vtype, reduce, seed):
    """segment_csr over drawn segment sizes (empty ones included): value e in
    segment i is the edge e -> i of the reference."""
    from fastgnn import segment_csr_bwd, segment_csr_fwd
    indptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    E, n = int(indptr[-1]), len(sizes)
    ei = np.stack([np.arange(E), np.repeat(np.arange(n), sizes)])
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((E, width)).astype(vtype)
    go = rng.standard_normal((n, width)).astype(vtype)
    out, res = segment_csr_fwd(to_device(indptr, device), to_device(values, device), reduce)
    assert_close(to_numpy(out), ref.segment_reduce(ei, values, reduce, n), vtype, "out")
    gv = segment_csr_bwd(to_device(indptr, device), res, to_device(go, device))
    assert_close(to_numpy(gv), ref.segment_reduce_vjp(ei, values, reduce, n, go), vtype,
                 "grad_values")


@pytest.mark.parametrize("device", devices())
@PROPERTY
@given(case=graphs(), heads=st.integers(1, 8), vtype=VTYPES)
def test_edge_softmax_against_reference(device, case, heads, vtype):
    ei, _, num_dst, _, seed = case
    rng = np.random.default_rng(seed + 3)
    g = _graph(case, device)
    s = (3 * rng.standard_normal((ei.shape[1], heads))).astype(vtype)
    go = rng.standard_normal((ei.shape[1], heads)).astype(vtype)
    out, res = edge_softmax_fwd(g, to_device(s, device))
    assert_close(to_numpy(out), ref.edge_softmax(ei, s, num_dst), vtype, "out")
    gs = edge_softmax_bwd(g, res, to_device(go, device))
    assert_close(to_numpy(gs), ref.edge_softmax_vjp(ei, s, num_dst, go), vtype, "grad_scores")
    _bitwise_equal(gs, edge_softmax_bwd(g, res, to_device(go, device)), "grad_scores")


def attention_case(case, g, score, heads, channels, edge_term, with_alpha, slope, vtype):
    """Inputs of one drawn edge_attention example on graph g (core Graph):
    (x {name: array}, grad out, grad alpha or None, want {out, alpha, grads}
    from the float64 reference)."""
    from test_attention import _inputs, _off_kink      # (the attention tests' inputs)
    ei, _, num_dst, _, seed = case
    rng = np.random.default_rng(seed + 4)
    x = _off_kink(ei, score, _inputs(score, g, heads, channels, edge_term, rng))
    x = {k: v.astype(vtype) for k, v in x.items()}
    r_out, r_alpha = ref.edge_attention(ei, score, num_dst, x, negative_slope=slope)
    go = rng.standard_normal(r_out.shape).astype(vtype)
    ga = rng.standard_normal(r_alpha.shape).astype(vtype) if with_alpha else None
    want = {"out": r_out, "alpha": r_alpha if with_alpha else None,
            **ref.edge_attention_vjp(ei, score, num_dst, x, go, ga, negative_slope=slope)}
    return x, go, ga, want


def check_attention(score, vtype, want, ours, base, as_numpy):
    """Hold ours {name: array} (as_numpy makes it a NumPy array) to want (the float64 reference). On small
    graphs some gradients cancel (a target's softmax ignores a shift common
    to its scores), so an fp32 result is held to TOLERANCES or, where larger,
    16 x (eps32 / eps64) times base's error (the same call in float64 on the
    same inputs): the rounding the computation itself amplifies, measured
    rather than bounded. A gradient that is zero in exact arithmetic holds
    rounding noise on both sides: ours stays within 10 tolerances of the
    largest gradient's norm (fastgnn.testing's rule)."""
    scale = max(np.linalg.norm(r) for r in want.values() if r is not None)
    for name, r in want.items():
        if r is None or name not in ours:
            continue
        o = as_numpy(ours[name])
        assert o.shape == r.shape and o.dtype == np.dtype(vtype), name
        if np.linalg.norm(r) <= 1e-9 * scale:
            assert np.linalg.norm(o.astype(np.float64)) <= 10 * TOLERANCES[vtype] * scale, \
                f"{score} {name}: not ~0 as the reference"
            continue
        tol = TOLERANCES[vtype]
        if base is not None:
            amplified = rel_err(as_numpy(base[name]), r)
            tol = max(tol, 16 * float(np.finfo(np.float32).eps / np.finfo(np.float64).eps)
                      * amplified)
        err = rel_err(o, r)
        assert err <= tol, f"{score} {name}: relative error {err:.3e} > {tol:.1e} ({vtype})"


@pytest.mark.parametrize("device", devices())
@PROPERTY
@given(case=graphs(), score=st.sampled_from(["gat", "gatv2", "dot"]), heads=st.integers(1, 8),
       channels=st.sampled_from([1, 2, 3, 7, 16, 33]), edge_term=st.booleans(),
       with_alpha=st.booleans(), slope=st.sampled_from([0.2, 0.0, -0.5, 1.5]), vtype=VTYPES)
def test_edge_attention_against_reference(device, case, score, heads, channels, edge_term,
                                          with_alpha, slope, vtype):
    """Output, weights and every gradient. On small graphs some gradients
    cancel (a target's softmax ignores a shift common to its scores: gat's
    a_dst where a target's edges share a side of LeakyReLU's kink, dot's q
    where they share a source, gatv2's att), so an fp32 result is held to
    TOLERANCES or, where larger, 16 x (eps32 / eps64) times the same op's
    float64 error on the same inputs: the rounding the computation itself
    amplifies, measured rather than bounded."""
    from fastgnn import edge_attention_bwd, edge_attention_fwd
    from fastgnn.ops.attention import SCORE_INPUTS
    g = _graph(case, device)
    x, go, ga, want = attention_case(case, g, score, heads, channels, edge_term, with_alpha,
                                     slope, vtype)

    def run(dtype):
        xd = {k: to_device(v.astype(dtype), device) for k, v in x.items()}
        out, res = edge_attention_fwd(g, score, **xd, negative_slope=slope,
                                      return_attention_weights=with_alpha)
        out, alpha = out if with_alpha else (out, None)
        cot = [to_device(None if c is None else c.astype(dtype), device) for c in (go, ga)]
        grads = edge_attention_bwd(g, res, *cot)
        for name, a, b in zip(SCORE_INPUTS[score], grads, edge_attention_bwd(g, res, *cot)):
            if a is not None:
                _bitwise_equal(a, b, f"grad {name}")
        return {"out": out, "alpha": alpha,
                **{n: gr for n, gr in zip(SCORE_INPUTS[score], grads) if n in x}}

    ours = run(vtype)
    base = run("float64") if vtype == "float32" else None
    check_attention(score, vtype, want, ours, base, to_numpy)


def _layers():
    """(name, PyG layer, ours, takes an edge weight) makers, in_channels 5."""
    import torch
    import torch_geometric.nn as pyg

    import fastgnn.torch as ft
    from fastgnn.testing import fresh_pyg_class

    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    return {
        "gcn": (lambda: pyg.GCNConv(5, 4), lambda: ft.GCNConv(5, 4), True),
        "sage_mean": (lambda: fresh_pyg_class(pyg.SAGEConv)(5, 4),
                      lambda: ft.SAGEConv(5, 4), False),
        "sage_max": (lambda: fresh_pyg_class(pyg.SAGEConv)(5, 4, aggr="max"),
                     lambda: ft.SAGEConv(5, 4, aggr="max"), False),
        "gin": (lambda: pyg.GINConv(mlp(), train_eps=True),
                lambda: ft.GINConv(mlp(), train_eps=True), False),
        "gat": (lambda: pyg.GATConv(5, 3, heads=2), lambda: ft.GATConv(5, 3, heads=2), False),
        "gatv2": (lambda: pyg.GATv2Conv(5, 3, heads=2), lambda: ft.GATv2Conv(5, 3, heads=2),
                  False),
        "transformer": (lambda: pyg.TransformerConv(5, 3, heads=2),
                        lambda: ft.TransformerConv(5, 3, heads=2), False),
    }


@PROPERTY
@given(case=graphs().filter(lambda c: c[1] == c[2] and c[1] > 0),
       layer=st.sampled_from(["gcn", "sage_mean", "sage_max", "gin", "gat", "gatv2",
                              "transformer"]),
       weighted=st.booleans())
def test_layers_against_pyg(case, layer, weighted):
    """The drop-in layers on drawn square graphs against PyG (float64, CPU):
    output and every gradient (input, edge weight, parameters) under a random
    cotangent (tests/test_torch_layers.py's comparison)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    from test_torch_layers import _overwritten_loops, run_and_compare
    ei, n, _, _, seed = case
    make_ref, make_ours, takes_weight = _layers()[layer]
    rng = np.random.default_rng(seed + 5)
    ei_t = torch.from_numpy(ei)
    x = torch.from_numpy(rng.standard_normal((n, 5)))
    w = torch.from_numpy(rng.random(ei.shape[1]) + 0.1) if weighted and takes_weight else None
    torch.manual_seed(seed)
    run_and_compare(make_ref(), make_ours(), x, ei_t, w, seed=seed, exact_zeros=True,
                    overwritten_loops=_overwritten_loops(ei_t) if layer == "gcn" else None)
