"""A NaN or inf stays in the rows it reaches, as in PyG: each op of the
array API with one bad feature and (where it takes them) one bad edge
weight or score, against PyG's own function on the same edge list
(`torch_geometric.utils.scatter` / `softmax`, the aggregation modules):
the same entries non-finite, the others equal. (The layers: test_torch_layers's
test_a_bad_feature_reaches_the_rows_pyg_gives; gcn_norm: test_spmm.)"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch_geometric")
from torch_geometric.nn import aggr  # noqa: E402
from torch_geometric.utils import scatter, softmax  # noqa: E402

import fastgnn as f  # noqa: E402
from fastgnn import Graph  # noqa: E402
from fastgnn.testing import awkward_edge_index, devices, to_device, to_numpy  # noqa: E402

N, F = 40, 5
BAD = [float("nan"), float("inf"), float("-inf")]


def _case(seed):
    rng = np.random.default_rng(seed)
    ei = awkward_edge_index(N, 200, seed=int(rng.integers(1 << 30)))
    x = rng.standard_normal((N, F))
    w = rng.uniform(0.5, 2.0, ei.shape[1])
    return ei, x, w, rng


def _same(ours, theirs, what):
    ours, theirs = to_numpy(ours), theirs.detach().numpy()
    bad = ~np.isfinite(theirs)
    np.testing.assert_array_equal(~np.isfinite(ours), bad, err_msg=f"{what}: non-finite entries")
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs), err_msg=f"{what}: NaN entries")
    np.testing.assert_allclose(ours[~bad], theirs[~bad], rtol=1e-10, atol=1e-12, err_msg=what)


def _pyg_reduce(x, ei, reduce):
    src, dst = torch.from_numpy(ei)
    msg = torch.from_numpy(x)[src]
    if reduce in ("var", "std"):
        agg = aggr.VarAggregation() if reduce == "var" else aggr.StdAggregation()
        return agg(msg, dst, dim_size=N)
    return scatter(msg, dst, 0, N, reduce=reduce)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "mul"])
def test_segment_reduce_bad_feature_stays_in_its_rows(device, bad, reduce, seed):
    ei, x, _, rng = _case(seed)
    x[rng.integers(N), rng.integers(F)] = bad
    g = Graph.from_edge_index(to_device(ei, device), num_nodes=N)
    _same(f.segment_reduce(g, to_device(x, device), reduce), _pyg_reduce(x, ei, reduce),
          f"{reduce} with {bad} (seed {seed})")


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("where", ["x", "edge_weight"])
def test_spmm_bad_value_stays_in_its_rows(device, bad, reduce, where, seed):
    ei, x, w, rng = _case(seed)
    if where == "x":
        x[rng.integers(N), rng.integers(F)] = bad
    else:
        w[rng.integers(w.shape[0])] = bad
    g = Graph.from_edge_index(to_device(ei, device), num_nodes=N)
    src, dst = torch.from_numpy(ei)
    theirs = scatter(torch.from_numpy(x)[src] * torch.from_numpy(w)[:, None], dst, 0, N,
                     reduce=reduce)
    ours = f.spmm(g, to_device(x, device), to_device(w, device), reduce=reduce)
    _same(ours, theirs, f"{where} {bad} {reduce} (seed {seed})")


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("bad", BAD)
def test_edge_softmax_bad_score_stays_in_its_row(device, bad, seed):
    """The target (and head) of the bad score is the only one with non-finite
    weights, in both; the others are equal. Within it they differ for +inf:
    PyG's max subtraction gives inf - inf, NaN for every edge of the target,
    where fastgnn's online softmax gives NaN for the inf edge and 0 for the
    others."""
    ei, _, _, rng = _case(seed)
    s = rng.standard_normal((ei.shape[1], 2))
    s[rng.integers(ei.shape[1]), rng.integers(2)] = bad
    g = Graph.from_edge_index(to_device(ei, device), num_nodes=N)
    ours = to_numpy(f.edge_softmax(g, to_device(s, device)))
    theirs = softmax(torch.from_numpy(s), torch.from_numpy(ei[1]), num_nodes=N).numpy()

    def bad_targets(p):             # [N, 2]: a non-finite weight in the target's head
        out = np.zeros((N, 2), dtype=bool)
        np.logical_or.at(out, ei[1], ~np.isfinite(p))
        return out
    np.testing.assert_array_equal(bad_targets(ours), bad_targets(theirs),
                                  err_msg=f"score {bad} (seed {seed})")
    fine = ~bad_targets(theirs)[ei[1]]
    np.testing.assert_allclose(ours[fine], theirs[fine], rtol=1e-10, atol=1e-12,
                               err_msg=f"score {bad} (seed {seed})")
