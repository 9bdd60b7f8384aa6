"""Operators, one module per kernel family; each op is a forward/backward pair."""
from .spmm import gcn_norm, spmm, spmm_bwd, spmm_fwd  # noqa: F401
