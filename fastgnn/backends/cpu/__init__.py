"""Numba CPU backend (parallel over target rows)."""
from .spmm import sddmm, spmm  # noqa: F401
