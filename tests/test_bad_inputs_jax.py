"""fastgnn.jax's bad-input catalogue in one table (tests/test_bad_inputs.py's,
for the JAX adapter): every public op, layer, layer init and Flax NNX module
refuses an input of the wrong rank, dtype, shape, row count or kind, a bad
reduce / score / heads / width / dropout / seed, and a graph of the wrong
kind with a TypeError / ValueError whose message names the argument. The
error comes from the call itself, eagerly and under `jax.jit` alike (the
arguments are checked when the call is traced): never from inside a kernel
callback, and never a JAX tracer error from deep inside."""
import functools

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import fastgnn.jax as fj  # noqa: E402
from fastgnn.jax import _bridge  # noqa: E402
from test_jax import _gpu  # noqa: E402      (JAX's first GPU, or a skip)

EI = np.array([[0, 1, 2], [1, 2, 0]])
LAYERS = ("gcn", "sage", "gin", "gat", "gatv2", "transformer")
MODES = ("eager", "jit")


def _ones(shape, dtype=jnp.float32):
    return jnp.ones(shape, dtype)


def _layer_params():
    """{layer: params} for in_dim 4, out_dim 2 (2 heads where a layer has them)."""
    nn, key = fj.nn, jax.random.PRNGKey(0)
    return {"gcn": nn.gcn_init(key, 4, 2), "sage": nn.sage_init(key, 4, 2),
            "gin": nn.gin_init(key, 4, 2), "gat": nn.gat_init(key, 4, 2, heads=2),
            "gatv2": nn.gatv2_init(key, 4, 2, heads=2),
            "transformer": nn.transformer_init(key, 4, 2, heads=2)}


def _layer_cases(g, params):
    """Every layer refuses a bad x or graph (the torch layers' catalogue,
    tests/test_torch_layers.py's _BAD_X, for fastgnn.jax.nn)."""
    def layer(name, graph=None, **kw):
        if name == "transformer":
            kw.setdefault("heads", 2)
        return lambda x: getattr(fj.nn, name)(params[name], g if graph is None else graph,
                                              x, **kw)
    cases = {}
    for name in LAYERS:
        cases.update({
            f"{name} x 1-D": (layer(name), (_ones(3),), ValueError, "x must have shape"),
            f"{name} x integer": (layer(name), (_ones((3, 4), jnp.int32),), TypeError,
                                  "x must be a floating-point"),
            f"{name} x rows": (layer(name), (_ones((2, 4)),), ValueError, "x has 2 rows"),
            f"{name} x width": (layer(name), (_ones((3, 5)),), ValueError,
                                r"x must have shape \[num_src, in_dim\] = \[3, 4\]"),
            f"{name} x not an array": (lambda name=name: layer(name)("x"), (), TypeError,
                                       "x must be an array"),
            f"{name} graph": (layer(name, graph=EI), (_ones((3, 4)),), TypeError,
                              "graph must be a fastgnn.jax.Graph"),
        })
    bip = fj.Graph.from_edge_index(np.array([[0, 1], [1, 2]]), num_src=2, num_dst=3)
    cases.update({
        "sage aggr": (layer("sage", aggr="sum"), (_ones((3, 4)),), ValueError,
                      "aggr must be 'mean' or 'max'"),
        "transformer heads not dividing": (layer("transformer", heads=3), (_ones((3, 4)),),
                                           ValueError, "heads=3 does not divide"),
        "transformer heads 0": (layer("transformer", heads=0), (_ones((3, 4)),), ValueError,
                                "heads must be a positive int"),
        "gat dropout": (layer("gat", dropout=1.0), (_ones((3, 4)),), ValueError,
                        r"dropout must be in \[0, 1\)"),
        "gatv2 seed": (layer("gatv2", dropout=0.5, seed=-3), (_ones((3, 4)),), ValueError,
                       "seed must be in"),
        "gat more targets than sources": (layer("gat", graph=bip), (_ones((2, 4)),),
                                          ValueError, "num_dst <= num_src"),
        "sage more targets than sources": (layer("sage", graph=bip), (_ones((2, 4)),),
                                           ValueError, "num_dst <= num_src"),
    })
    return cases


def _init_cases():
    nn, key = fj.nn, jax.random.PRNGKey(0)
    return {
        "gcn_init in_dim 0": (lambda: nn.gcn_init(key, 0, 2), (), ValueError,
                              "in_dim must be a positive int"),
        "gcn_init out_dim negative": (lambda: nn.gcn_init(key, 4, -1), (), ValueError,
                                      "out_dim must be a positive int"),
        "sage_init in_dim float": (lambda: nn.sage_init(key, 4.0, 2), (), TypeError,
                                   "in_dim must be a positive int"),
        "gin_init hidden 0": (lambda: nn.gin_init(key, 4, 2, hidden=0), (), ValueError,
                              "hidden must be a positive int"),
        "gat_init heads 0": (lambda: nn.gat_init(key, 4, 2, heads=0), (), ValueError,
                             "heads must be a positive int"),
        "gatv2_init heads float": (lambda: nn.gatv2_init(key, 4, 2, heads=1.5), (), TypeError,
                                   "heads must be a positive int"),
        "transformer_init out_dim 0": (lambda: nn.transformer_init(key, 4, 0), (), ValueError,
                                       "out_dim must be a positive int"),
    }


def _nnx_cases(g):
    nnx = pytest.importorskip("flax.nnx")
    from fastgnn.jax import nnx as fnnx
    return {
        "nnx GATConv dropout not a number": (
            lambda: fnnx.GATConv(4, 2, dropout="a", rngs=nnx.Rngs(0)), (), TypeError,
            "dropout must be a float"),
        "nnx GATv2Conv dropout 1.5": (
            lambda: fnnx.GATv2Conv(4, 2, dropout=1.5, rngs=nnx.Rngs(0)), (), ValueError,
            r"dropout must be in \[0, 1\)"),
        "nnx GATConv heads 0": (lambda: fnnx.GATConv(4, 2, heads=0, rngs=nnx.Rngs(0)), (),
                                ValueError, "heads must be a positive int"),
        "nnx GCNConv unknown keyword": (lambda: fnnx.GCNConv(4, 2, heads=2, rngs=nnx.Rngs(0)),
                                        (), TypeError, r"takes no \['heads'\]"),
        "nnx SAGEConv dropout": (lambda: fnnx.SAGEConv(4, 2, dropout=0.5, rngs=nnx.Rngs(0)),
                                 (), TypeError, r"takes no \['dropout'\]"),
        "nnx GCNConv x width": (lambda x: fnnx.GCNConv(4, 2, rngs=nnx.Rngs(0))(g, x),
                                (_ones((3, 5)),), ValueError, r"x must have shape \[num_src"),
        "nnx GINConv hidden 0": (lambda: fnnx.GINConv(4, 2, hidden=0, rngs=nnx.Rngs(0)), (),
                                 ValueError, "hidden must be a positive int"),
        "nnx TransformerConv x rows": (
            lambda x: fnnx.TransformerConv(4, 2, heads=2, rngs=nnx.Rngs(0))(g, x),
            (_ones((2, 4)),), ValueError, "x has 2 rows"),
    }


def _catalogue():
    """{case: (fn, args, error type, words the message holds)}: fn(*args)
    raises; args are the arrays it takes (traced under jit), everything
    else is closed over. Arrays are made on JAX's default device."""
    g = fj.Graph.from_edge_index(EI, 3)
    bip = fj.Graph.from_edge_index(EI, num_src=3, num_dst=4)
    x = _ones((3, 4))
    float_ei = jnp.zeros((2, 2))

    def spmm(**kw):
        return lambda x, *a: fj.spmm(g, x, *a, **kw)

    def seg(reduce="sum", graph=g):
        return lambda x: fj.segment_reduce(graph, x, reduce)

    def softmax(**kw):
        return lambda s, *a: fj.edge_softmax(g, s, *a, **kw)

    def softmax_seed(**kw):
        return lambda s, seed: fj.edge_softmax(g, s, dropout=0.5, seed=seed, **kw)

    def attention(score, **kw):
        return lambda **a: fj.edge_attention(g, score, **a, **kw)

    def dot(**a):
        q = dict(q=_ones((3, 1, 2)), k=_ones((3, 1, 2)), v=_ones((3, 1, 2)))
        q.update(a)
        return q

    def gat(**a):
        q = dict(a_src=_ones((3, 1)), a_dst=_ones((3, 1)), v=_ones((3, 1, 2)))
        q.update(a)
        return q

    def kw_case(fn, inputs, error, words):
        """An attention case: its inputs are passed (and traced) by keyword."""
        names = sorted(k for k, v in inputs.items() if v is not None)
        return (lambda *a: fn(**dict(zip(names, a))), tuple(inputs[n] for n in names),
                error, words)

    cases = {
        # the graph
        "from_edge_index shape": (lambda: fj.Graph.from_edge_index(np.zeros((3, 2), np.int64)),
                                  (), ValueError, "edge_index must have shape"),
        "from_edge_index 1-D": (lambda: fj.Graph.from_edge_index(np.array([0, 1])), (),
                                ValueError, "edge_index must have shape"),
        "from_edge_index float": (lambda: fj.Graph.from_edge_index(np.zeros((2, 2))), (),
                                  TypeError, "edge_index must hold integers"),
        "from_edge_index float jax": (lambda: fj.Graph.from_edge_index(float_ei), (),
                                      TypeError, "edge_index must hold integers"),
        "from_edge_index negative": (lambda: fj.Graph.from_edge_index(np.array([[-1], [0]])),
                                     (), ValueError, "edge_index holds a negative index"),
        "from_edge_index past num_nodes": (lambda: fj.Graph.from_edge_index(EI, 2), (),
                                           ValueError, "there are only 2"),
        "from_edge_index num_nodes negative": (lambda: fj.Graph.from_edge_index(EI, -1), (),
                                               ValueError, "num_nodes/num_src/num_dst"),
        "from_csr indptr order": (lambda: fj.Graph.from_csr(np.array([0, 2, 1, 3]),
                                                            np.array([0, 1, 2])), (),
                                  ValueError, "indptr must be non-decreasing"),
        "from_csr indices range": (lambda: fj.Graph.from_csr(np.array([0, 1, 2]),
                                                             np.array([0, 5]), 3), (),
                                   ValueError, "indices holds 5"),
        "Graph of an edge index": (lambda: fj.Graph(EI), (), TypeError,
                                   "Graph wraps a fastgnn.Graph"),
        "num_nodes of a bipartite graph": (lambda: bip.num_nodes, (), ValueError,
                                           "bipartite graph has num_src and num_dst"),
        "with_self_loops more targets": (lambda: bip.with_self_loops(), (), ValueError,
                                         "with_self_loops needs num_dst <= num_src"),
        # spmm
        "spmm x 1-D": (spmm(), (_ones(3),), ValueError, "x must have shape"),
        "spmm x 3-D": (spmm(), (_ones((3, 4, 2)),), ValueError, "x must have shape"),
        "spmm x integer": (spmm(), (_ones((3, 4), jnp.int32),), TypeError,
                           "x must be a floating-point"),
        "spmm x rows": (spmm(), (_ones((2, 4)),), ValueError, "x has 2 rows"),
        "spmm x not an array": (lambda: fj.spmm(g, "x"), (), TypeError, "x must be an array"),
        "spmm graph edge index": (lambda x: fj.spmm(EI, x), (x,), TypeError,
                                  "graph must be a fastgnn.jax.Graph"),
        "spmm graph core": (lambda x: fj.spmm(g.core, x), (x,), TypeError,
                            "graph must be a fastgnn.jax.Graph"),
        "spmm edge_weight shape": (spmm(), (x, _ones(2)), ValueError,
                                   "edge_weight must have shape"),
        "spmm edge_weight 2-D": (spmm(), (x, _ones((3, 2))), ValueError,
                                 "edge_weight must have shape"),
        "spmm edge_weight integer": (spmm(), (x, _ones(3, jnp.int32)), TypeError,
                                     "edge_weight must be floating point"),
        "spmm reduce": (spmm(reduce="max"), (x,), ValueError, "reduce must be one of"),
        "spmm bias shape": (lambda x, b: fj.spmm(g, x, bias=b), (x, _ones(3)), ValueError,
                            "bias must have shape"),
        "spmm bias integer": (lambda x, b: fj.spmm(g, x, bias=b), (x, _ones(4, jnp.int32)),
                              TypeError, "bias must have x's dtype"),
        # segment_reduce
        "segment_reduce x 1-D": (seg(), (_ones(3),), ValueError, "x must have shape"),
        "segment_reduce x integer": (seg("max"), (_ones((3, 4), jnp.int32),), TypeError,
                                     "x must be a floating-point"),
        "segment_reduce x rows": (seg(), (_ones((5, 4)),), ValueError, "x has 5 rows"),
        "segment_reduce reduce": (seg("median"), (x,), ValueError, "reduce must be one of"),
        "segment_reduce reduce twice": (seg(["sum", "sum"]), (x,), ValueError,
                                        "reduce lists"),
        "segment_reduce reduce empty": (seg([]), (x,), ValueError,
                                        "reduce must name at least one"),
        "segment_reduce reduce integer": (seg(3), (x,), TypeError, "reduce must be a str"),
        "segment_reduce graph": (seg(graph="g"), (x,), TypeError,
                                 "graph must be a fastgnn.jax.Graph"),
        # edge_softmax
        "edge_softmax scores length": (softmax(), (_ones(5),), ValueError,
                                       "scores must have shape"),
        "edge_softmax scores integer": (softmax(), (_ones(3, jnp.int32),), TypeError,
                                        "scores must be a floating-point"),
        "edge_softmax scores 3-D": (softmax(), (_ones((3, 2, 2)),), ValueError,
                                    "scores must have shape"),
        "edge_softmax dropout 1.5": (softmax(dropout=1.5), (_ones(3),), ValueError,
                                     r"dropout must be in \[0, 1\)"),
        "edge_softmax dropout not a number": (softmax(dropout="a"), (_ones(3),), TypeError,
                                              "dropout must be a float"),
        "edge_softmax seed negative": (softmax(dropout=0.5, seed=-1), (_ones(3),), ValueError,
                                       "seed must be in"),
        "edge_softmax seed bool": (softmax(dropout=0.5, seed=True), (_ones(3),), TypeError,
                                   "seed must be an integer"),
        "edge_softmax seed float array": (softmax_seed(), (_ones(3), jnp.float32(2)),
                                          TypeError, "seed must be a Python int or an integer"),
        "edge_softmax seed vector": (softmax_seed(), (_ones(3), jnp.arange(2)), TypeError,
                                     "seed must be a Python int or an integer"),
        "edge_softmax offset float": (softmax(offset=1.5), (_ones(3),), TypeError,
                                      "offset must be an integer"),
        # edge_attention
        "edge_attention score": kw_case(attention("foo"), dot(), ValueError,
                                        "score must be one of"),
        "edge_attention missing input": kw_case(attention("gat"), gat(a_dst=None, v=None),
                                                TypeError, "needs a_dst, v"),
        "edge_attention input of another score": kw_case(
            attention("dot"), dot(a_src=_ones((3, 1))), ValueError, "takes q, k, v"),
        "edge_attention k heads": kw_case(attention("dot"), dot(k=_ones((3, 2, 2))),
                                          ValueError, "k must have shape"),
        "edge_attention k rows": kw_case(attention("dot"),
                                         dot(k=_ones((2, 1, 2)), v=_ones((2, 1, 2))),
                                         ValueError, "k must have shape"),
        "edge_attention q 2-D": kw_case(attention("dot"), dot(q=_ones((3, 2))), ValueError,
                                        "q must have shape"),
        "edge_attention v 2-D": kw_case(attention("gat"), gat(v=_ones((3, 2))), ValueError,
                                        "v must have shape"),
        "edge_attention a_src integer": kw_case(attention("gat"),
                                                gat(a_src=_ones((3, 1), jnp.int32)),
                                                TypeError, "a_src must be a floating-point"),
        "edge_attention a_edge rows": kw_case(attention("gat"), gat(a_edge=_ones((4, 1))),
                                              ValueError, "a_edge must have shape"),
        "edge_attention att shape": kw_case(
            attention("gatv2"), dict(xl=_ones((3, 1, 2)), xr=_ones((3, 1, 2)),
                                     att=_ones((2, 1))), ValueError, "att must have shape"),
        "edge_attention bias shape": kw_case(attention("dot"), dot(bias=_ones(5)), ValueError,
                                             "bias must have shape"),
        "edge_attention scale with gat": kw_case(attention("gat", scale=2.0), gat(),
                                                 ValueError, "scale applies to score='dot'"),
        "edge_attention negative_slope": kw_case(attention("gat", negative_slope=float("nan")),
                                                 gat(), TypeError, "negative_slope must be"),
        "edge_attention dropout": kw_case(attention("dot", dropout=1.0), dot(), ValueError,
                                          r"dropout must be in \[0, 1\)"),
        # gcn_norm
        "gcn_norm bipartite": (lambda: fj.gcn_norm(bip), (), ValueError, "square graph"),
        "gcn_norm edge_weight shape": (lambda w: fj.gcn_norm(g, w), (_ones(2),), ValueError,
                                       "edge_weight must have shape"),
        "gcn_norm edge_weight integer": (lambda w: fj.gcn_norm(g, w), (_ones(3, jnp.int32),),
                                         TypeError, "edge_weight must be floating point"),
        "gcn_norm graph": (lambda: fj.gcn_norm(EI), (), TypeError,
                           "graph must be a fastgnn.jax.Graph"),
    }
    if jax.default_backend() == "cpu":
        cases["spmm x float16 on the CPU"] = (spmm(), (_ones((3, 4), jnp.float16),), TypeError,
                                              "GPU only")
    cases.update(_layer_cases(g, _layer_params()))
    cases.update(_init_cases())
    cases.update(_nnx_cases(g))
    return cases


@functools.lru_cache(maxsize=None)
def _catalogue_on(device):
    """The catalogue with its arrays on `device` (made once per device)."""
    with jax.default_device(jax.devices("cpu")[0] if device == "cpu" else _gpu()):
        return _catalogue()


DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]
CASES = sorted(_catalogue_on("cpu"))


@pytest.fixture
def no_callbacks(monkeypatch):
    """Fails a test in which an op's kernel callback runs."""
    def refuse(*a, **k):
        raise AssertionError("a kernel callback ran: the argument was not checked at the call")
    monkeypatch.setattr(_bridge, "_callback", refuse)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_refused_naming_the_argument(case, device, mode, no_callbacks):
    dev = jax.devices("cpu")[0] if device == "cpu" else _gpu()
    with jax.default_device(dev):
        fn, args, error, words = _catalogue_on(device)[case]
        with pytest.raises(error, match=words):
            jax.block_until_ready(jax.jit(fn)(*args) if mode == "jit" else fn(*args))


def test_a_graph_is_built_outside_jit():
    """A Graph built from a traced edge index says where to build it."""
    with pytest.raises(TypeError, match="edge_index is a traced value; build"):
        jax.jit(lambda ei: fj.Graph.from_edge_index(ei, 3))(jnp.asarray(EI))


def test_the_catalogue_covers_every_public_function():
    """Each public op, layer, init and NNX module has a case."""
    pytest.importorskip("flax.nnx")
    from fastgnn.jax import nnx as fnnx
    names = set(fj.ops.__all__) - {"tf32_allowed", "SPMM", "SEGMENT_REDUCE", "EDGE_SOFTMAX",
                                   "EDGE_ATTENTION"}
    names |= set(fj.nn.__all__) - {"glorot"}
    names |= {f"nnx {n}" for n in fnnx.__all__}
    covered = {n for n in names if any(c == n or c.startswith(n + " ") for c in CASES)}
    assert names - covered == set(), sorted(names - covered)
