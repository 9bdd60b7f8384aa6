"""What the attention family's op layer hands its backends: the score tables,
the dropout and option records, and the caller-edge-id maps of a graph.

Shared by fastgnn/ops/attention.py (which validates the public arguments into
these) and the backends (fastgnn/backends/cpu/attention.py,
fastgnn/backends/cuda/attention.py, which read them). It sits below both, so
neither layer imports the other's modules for them. The math and the backend
interface are documented in fastgnn/ops/attention.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import rng
from ..graph import Graph

SCORES = ("gat", "gatv2", "dot")
SCORE_INPUTS = {"gat": ("a_src", "a_dst", "a_edge", "v", "bias"),
                "gatv2": ("xl", "xr", "att", "xe", "bias"),
                "dot": ("q", "k", "v", "ee", "bias")}
# The generic slots every backend kernel works with (see the backend interface
# in fastgnn/ops/attention.py):
#   S (source-side score input), Dn (target-side score input), Ed (edge term,
#   caller order), V (message); gatv2's S and V are both xl.
SLOT_NAMES = {"gat": ("a_src", "a_dst", "a_edge", "v"), "gatv2": ("xl", "xr", "xe", "xl"),
              "dot": ("k", "q", "ee", "v")}
OPTIONAL_INPUTS = ("a_edge", "xe", "ee", "bias")


def score_slots(score, arrays):
    """(S, Dn, Ed or None, att or None, V) of a score's input arrays."""
    s_name, d_name, e_name, v_name = SLOT_NAMES[score]
    return arrays[s_name], arrays[d_name], arrays.get(e_name), arrays.get("att"), arrays[v_name]


@dataclass(frozen=True)
class DropoutSpec:
    """Attention dropout as host scalars (see `fastgnn.rng`): keep weight (e, h)
    iff (bits(seed, offset + e*H + h) >> 11) >= threshold; kept weights times scale."""
    p: float                 # probability of dropping, in [0, 1); 0 = off
    seed: int
    offset: int              # uint64
    key: int                 # rng.seed_key(seed), uint64
    threshold: int           # rng.drop_threshold(p), uint64 (0 when p = 0)
    scale: float             # 1 / (1 - p)

    @property
    def active(self) -> bool:
        return self.p > 0


def dropout_spec(dropout, seed, offset) -> DropoutSpec:
    """Validate the dropout arguments of a public function."""
    if isinstance(dropout, (bool, np.bool_)) or not isinstance(dropout, (int, float, np.number)):
        raise TypeError(f"dropout must be a float in [0, 1), got {type(dropout).__name__}")
    p = float(dropout)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
    seed = rng.check_seed(seed, "seed")
    offset = rng.check_seed(offset, "offset")
    return DropoutSpec(p, seed, offset, rng.seed_key(seed), rng.drop_threshold(p), 1.0 / (1.0 - p))


@dataclass(frozen=True)
class AttentionParams:
    """Static options of `edge_attention`, as the backends receive them."""
    negative_slope: float    # LeakyReLU slope ("gat", "gatv2")
    scale: float             # score scale ("dot"; 1 otherwise)
    drop: DropoutSpec
    deterministic: bool = True   # False: GPU backward may use float atomics
    mma_scores: bool = True      # False (tensor_cores=False): no Tensor Core scores on
                                 # the CUDA-core path (the 16-bit gatv2 forward's)


def lse_dtype(vtype):
    return np.float64 if vtype == "float64" else np.float32


def caller_ids(graph: Graph):
    """[E] caller edge id of each CSR position (graph.edge_ids, or arange)."""
    if graph.edge_ids is not None:
        return graph.edge_ids
    return graph.cached("caller_ids", lambda: graph.xp.arange(graph.num_edges,
                                                              dtype=graph.index_dtype))


def transpose_caller_ids(graph: Graph):
    """[E] caller edge id of each position of graph.transpose() (cached)."""
    def build():
        t = graph.transpose()
        return t.edge_ids if graph.edge_ids is None else graph.edge_ids[t.edge_ids]
    return graph.cached("transpose_caller_ids", build)
