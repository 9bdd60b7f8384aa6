"""Entry checks shared by fastgnn.dgl's modules (nn.py, nn_relational.py):
the graph argument, constructor sizes and feature inputs, refused with a
TypeError / ValueError naming the argument (feature rows that are not the
graph's nodes also raise the DGLError DGL raises)."""
from __future__ import annotations

import numpy as np
import torch

from dgl import DGLError

from fastgnn.torch.graph_cache import is_dgl_graph

from .ops import to_graph

__all__ = ["_check_feat", "_dgl_graph", "_positive_sizes"]


class _BadFeatureRows(DGLError, ValueError):
    """Features whose rows are not the graph's nodes: a ValueError, and the
    DGLError DGL raises for it."""


def _positive_sizes(layer, **sizes):
    """Constructor sizes, each a positive int (in_feats: or a (src, dst)
    pair of them); TypeError / ValueError naming the argument."""
    for name, value in sizes.items():
        for v in (value if isinstance(value, tuple) and name == "in_feats" else (value,)):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"{layer}: {name} must be a positive int"
                                f"{' or a (src, dst) pair of them' if name == 'in_feats' else ''}"
                                f", got {value!r}")
            if v < 1:
                raise ValueError(f"{layer}: {name} must be a positive int, got {value!r}")


def _check_feat(module, g, feat, widths=(None, None), min_dim=2, reads_dst=True,
                arg="feat"):
    """A module's feature input checked at its entry, naming it (arg): one
    floating-point tensor [num_src, ..., in_src] (on a block, its first
    num_dst rows are the destinations'), or a pair (src [num_src, ..., in_src],
    dst [num_dst, ..., in_dst]). widths: (in_src, in_dst), None where the
    module takes any; min_dim: the fewest dimensions it takes; reads_dst:
    whether it reads a pair's dst tensor. g: the converted graph; arg: the
    argument's name in the messages."""
    layer = type(module).__name__
    if isinstance(feat, tuple):
        if len(feat) != 2:
            raise TypeError(f"{layer}: {arg} must be a tensor or a pair (src, dst), got a tuple "
                            f"of {len(feat)}")
        parts = [(f"{arg}[0]", feat[0], g.num_src, "source", widths[0], "")]
        if reads_dst:
            parts.append((f"{arg}[1]", feat[1], g.num_dst, "destination", widths[1], ""))
    else:
        parts = [(arg, feat, g.num_src, "source", widths[0],
                  " (on a block, its first num_dst_nodes() rows are the destinations')")]
    for name, t, rows, side, width, hint in parts:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{layer}: {arg} must be a tensor or a pair (src, dst) of tensors, "
                            f"got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{layer}: {name} must be a floating-point tensor, got {t.dtype} "
                            f"(cast it, e.g. {name}.float())")
        if t.dim() < min_dim:
            raise ValueError(f"{layer}: {name} must have shape [num_nodes, ..., in_feats] "
                             f"(at least {min_dim} dimensions), got {tuple(t.shape)} (a single "
                             "feature per node: unsqueeze(-1))")
        if t.shape[0] != rows:
            raise _BadFeatureRows(f"{layer}: {name} has {t.shape[0]} rows but the graph has "
                                  f"{rows} {side} nodes; give one row per {side} node{hint}")
        if width is not None and t.shape[-1] != width:
            raise ValueError(f"{layer}: {name} must have {width} features (in_feats) in its "
                             f"last dimension, got shape {tuple(t.shape)}")


def _dgl_graph(graph):
    """The converted graph of a module's graph argument (TypeError naming it)."""
    if not is_dgl_graph(graph):
        raise TypeError(f"graph must be a DGLGraph (homogeneous or a block), got "
                        f"{type(graph).__name__}")
    return to_graph(graph)
