"""The array API's bad-input catalogue in one table: every public op refuses
an input of the wrong rank, dtype, shape, row count or kind with a
TypeError / ValueError whose message names the argument, before any kernel
runs, on the CPU and on CUDA alike. (The layers' catalogue is
tests/test_torch_layers.py's test_layers_refuse_bad_features_naming_x.)"""
import numpy as np
import pytest

import fastgnn as f
from fastgnn import Graph
from fastgnn.testing import devices, to_device

EI = np.array([[0, 1, 2], [1, 2, 0]])


def _catalogue(d):
    """{case: (call, error type, words the message holds)}; d(array) puts an
    array on the device under test."""
    g = Graph.from_edge_index(d(EI), num_nodes=3)
    x = d(np.ones((3, 4)))

    def ones(shape, dtype=np.float64):
        return d(np.ones(shape, dtype=dtype))
    return {
        "spmm x 1-D": (lambda: f.spmm(g, ones(3)), ValueError, "x must have shape"),
        "spmm x integer": (lambda: f.spmm(g, ones((3, 4), np.int64)), TypeError,
                           "x must be a floating-point"),
        "spmm x rows": (lambda: f.spmm(g, ones((2, 4))), ValueError, "x has 2 rows"),
        "spmm graph": (lambda: f.spmm(d(EI), x), TypeError, "graph must be a fastgnn.Graph"),
        "spmm edge_weight shape": (lambda: f.spmm(g, x, ones(2)), ValueError,
                                   "edge_weight must have shape"),
        "spmm edge_weight integer": (lambda: f.spmm(g, x, ones(3, np.int64)), TypeError,
                                     "edge_weight must be floating point"),
        "spmm reduce": (lambda: f.spmm(g, x, reduce="max"), ValueError, "reduce must be one of"),
        "spmm bias shape": (lambda: f.spmm(g, x, bias=ones(3)), ValueError,
                            "bias must have shape"),
        "segment_reduce x 1-D": (lambda: f.segment_reduce(g, ones(3), "sum"), ValueError,
                                 "x must have shape"),
        "segment_reduce x integer": (lambda: f.segment_reduce(g, ones((3, 4), np.int32), "max"),
                                     TypeError, "x must be a floating-point"),
        "segment_reduce x rows": (lambda: f.segment_reduce(g, ones((5, 4)), "sum"), ValueError,
                                  "x has 5 rows"),
        "segment_reduce reduce": (lambda: f.segment_reduce(g, x, "median"), ValueError,
                                  "reduce must be one of"),
        "segment_reduce graph": (lambda: f.segment_reduce("g", x, "sum"), TypeError,
                                 "graph must be a fastgnn.Graph"),
        "segment_csr indptr order": (lambda: f.segment_csr(d(np.array([0, 2, 1, 3])), x),
                                     ValueError, "indptr must be non-decreasing"),
        "segment_csr indptr end": (lambda: f.segment_csr(d(np.array([0, 1, 5])), x),
                                   ValueError, "indptr ends at 5"),
        "segment_csr indptr start": (lambda: f.segment_csr(d(np.array([1, 2, 3])), x),
                                     ValueError, "indptr must start at 0, got 1"),
        "segment_csr indptr float": (lambda: f.segment_csr(d(np.array([0., 1., 3.])), x),
                                     TypeError, "indptr must hold integers"),
        "segment_csr indptr 2-D": (lambda: f.segment_csr(d(np.array([[0, 1, 3]])), x),
                                   ValueError, "indptr must have shape"),
        "segment_csr values 1-D": (lambda: f.segment_csr(d(np.array([0, 1, 3])), ones(3)),
                                   ValueError, "values must have shape"),
        "edge_softmax scores length": (lambda: f.edge_softmax(g, ones(5)), ValueError,
                                       "scores must have shape"),
        "edge_softmax scores integer": (lambda: f.edge_softmax(g, ones(3, np.int64)), TypeError,
                                        "scores must be a floating-point"),
        "edge_softmax scores 3-D": (lambda: f.edge_softmax(g, ones((3, 2, 2))), ValueError,
                                    "scores must have shape"),
        "edge_attention score": (lambda: f.edge_attention(g, "foo", q=ones((3, 1, 2))),
                                 ValueError, "score must be one of"),
        "edge_attention missing input": (lambda: f.edge_attention(g, "gat", a_src=ones((3, 1))),
                                         TypeError, "needs a_dst, v"),
        "edge_attention k heads": (lambda: f.edge_attention(
            g, "dot", q=ones((3, 1, 2)), k=ones((3, 2, 2)), v=ones((3, 1, 2))),
            ValueError, "k must have shape"),
        "edge_attention k rows": (lambda: f.edge_attention(
            g, "dot", q=ones((3, 1, 2)), k=ones((2, 1, 2)), v=ones((2, 1, 2))),
            ValueError, "k must have shape"),
        "edge_attention a_src integer": (lambda: f.edge_attention(
            g, "gat", a_src=ones((3, 1), np.int64), a_dst=ones((3, 1)), v=ones((3, 1, 2))),
            TypeError, "a_src must be a floating-point"),
        "gcn_norm bipartite": (lambda: f.gcn_norm(
            Graph.from_edge_index(d(EI), num_src=3, num_dst=4), None), ValueError,
            "square graph"),
        "gcn_norm edge_weight shape": (lambda: f.gcn_norm(g, ones(2)), ValueError,
                                       "edge_weight must have shape"),
        "column_sum x 1-D": (lambda: f.column_sum(ones(3)), ValueError, "x must have shape"),
        "column_sum x integer": (lambda: f.column_sum(ones((3, 2), np.int64)), TypeError,
                                 "x must be a floating-point"),
        "from_edge_index shape": (lambda: Graph.from_edge_index(d(np.zeros((3, 2), np.int64))),
                                  ValueError, "edge_index must have shape"),
        "from_edge_index float": (lambda: Graph.from_edge_index(d(np.zeros((2, 2)))), TypeError,
                                  "edge_index must hold integers"),
        "from_edge_index negative": (lambda: Graph.from_edge_index(d(np.array([[-1], [0]]))),
                                     ValueError, "negative index"),
        "from_edge_index past num_nodes": (lambda: Graph.from_edge_index(d(EI), num_nodes=2),
                                           ValueError, "there are only 2"),
    }


CASES = sorted(_catalogue(lambda a: a))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_refused_naming_the_argument(device, case):
    call, error, words = _catalogue(lambda a: to_device(a, device))[case]
    with pytest.raises(error, match=words):
        call()
