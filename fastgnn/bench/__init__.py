"""Benchmarks (installed as fastgnn.bench)."""
