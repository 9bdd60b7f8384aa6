"""Aggregation modules usable wherever PyG 2.8 expects an `Aggregation`.

    SumAggregation  MeanAggregation  MaxAggregation  MinAggregation
    VarAggregation  StdAggregation   MulAggregation   MultiAggregation(aggrs, mode="cat")

They subclass `torch_geometric.nn.aggr.Aggregation` when PyG is importable
(so PyG's isinstance checks pass; importing this module imports PyG, which is
why `fastgnn.torch` loads it only on first use), else `torch.nn.Module`. None
holds parameters or buffers, like PyG's, so state_dicts load both ways with
strict=True.

Two ways in:

- `aggr(x, index=None, ptr=None, dim_size=None, dim=-2)`, PyG's call: x holds
  one row per element (per edge message), reduced along `dim` into dim_size
  groups. With `ptr` (CSR offsets, rows grouped) it runs
  `fastgnn.torch.segment_csr`; with `index` (the group of each row, any
  order) a stable sort of index gives the offsets and `x[index order]` is
  reduced (a torch gather, so autograd routes the gradient back to x).
- `aggr.neighbour(graph, x_src)`: the fused path, `fastgnn.torch.segment_reduce`
  on a graph: out[i] = reduce_{j -> i} x_src[j] without any per-edge tensor.

Semantics are PyG's (empty groups give 0, 1 for mul; var = E[x^2] - E[x]^2;
std clamps at 1e-5 and zeroes tiny values; mul's gradient is torch's prod
gradient), except that max/min send the gradient to one winner where PyG
splits it among exact ties, and that MulAggregation also takes `ptr` (PyG's
asks for `index`).

Every module takes fastgnn's keyword `deterministic` (default True: bitwise
repeatable backward). With deterministic=False the GPU backward of max/min
(alone or inside a MultiAggregation) adds its gradient with float atomics,
one per (group, feature), instead of walking the transpose: faster, last bits
vary. It changes nothing on the CPU, in the forward, or for sum/mean/var/std.
A MultiAggregation opts in when it or any of its aggregations says False.
"""
from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from fastgnn._array import check_deterministic

from . import custom_ops
from .functional import segment_csr, segment_reduce

try:                                      # PyG is optional
    from torch_geometric.nn import aggr as _pyg_aggr
    _Base = _pyg_aggr.Aggregation
except ImportError:                       # pragma: no cover - PyG is in the test env
    _pyg_aggr = None
    _Base = torch.nn.Module

__all__ = ["SumAggregation", "MeanAggregation", "MaxAggregation", "MinAggregation",
           "VarAggregation", "StdAggregation", "MulAggregation", "MultiAggregation",
           "resolve_aggregation"]

_CODES = ("sum", "mean", "max", "min", "var", "std", "mul")
_ALIASES = {"add": "sum"}


class _SegmentAggregation(_Base):
    """Shared body: `self._codes` names the reduction(s) in output block order."""
    _codes: tuple = ()
    _single = True                        # a str reduce: [S, F] (else [S, R*F])

    def __init__(self, *, deterministic: bool = True):
        super().__init__()
        self.deterministic = check_deterministic(deterministic, f"{type(self).__name__}: ")

    def _deterministic_backward(self) -> bool:
        """False when this module opts into the atomic max/min backward."""
        return self.deterministic

    def reset_parameters(self):
        """Nothing to reset: these aggregations have no parameters."""

    # ------------------------------------------------------------- PyG call
    def forward(self, x: Tensor, index: Tensor | None = None, ptr: Tensor | None = None,
                dim_size: int | None = None, dim: int = -2,
                max_num_elements: int | None = None) -> Tensor:
        r"""Reduce the rows of x along `dim` into groups.

        x:        [..., E, ...] float tensor (E at position `dim`).
        index:    [E] integer tensor, the group of each row (any order).
        ptr:      [S + 1] CSR offsets of groups of consecutive rows (used when given).
        dim_size: S, the number of groups (default: len(ptr) - 1, else max(index) + 1).
        dim:      the reduced dimension (default -2).
        max_num_elements: accepted for PyG compatibility, unused.
        Returns x's shape with E replaced by S (with, for MultiAggregation,
        the R results concatenated along the last dimension), in x's dtype.
        Without index and ptr, all rows form one group.
        """
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if custom_ops.compiling():
            # the group offsets and checks read index's values: inside the op
            return custom_ops.call("aggregation", None, x, index, ptr, codes=list(self._codes),
                                   single=self._single, dim_size=dim_size, dim=dim,
                                   deterministic=self._deterministic_backward())
        if x.dim() < 1:
            raise ValueError(f"x must have at least one dimension, got shape {tuple(x.shape)}")
        if not -x.dim() <= dim < x.dim():
            raise ValueError(f"dim={dim} is out of range for x with {x.dim()} dimensions")
        dim = dim % x.dim()
        e = int(x.shape[dim])
        if ptr is not None:
            ptr = _check_index(ptr, "ptr", x.device)
            if dim_size is not None and int(dim_size) != ptr.numel() - 1:
                raise ValueError(f"dim_size={dim_size} disagrees with ptr, which has "
                                 f"{ptr.numel() - 1} groups")
            perm = None
        else:
            if index is None:
                index = torch.zeros(e, dtype=torch.long, device=x.device)
            index = _check_index(index, "index", x.device)
            if index.numel() != e:
                raise ValueError(f"index has {index.numel()} entries but x has {e} rows "
                                 f"along dim={dim}")
            lo = int(index.min()) if e else 0
            hi = int(index.max()) if e else -1
            if lo < 0:
                raise ValueError(f"index holds a negative group ({lo})")
            if dim_size is None:
                dim_size = hi + 1
            dim_size = int(dim_size)
            if hi >= dim_size:
                raise ValueError(f"index holds group {hi}, but dim_size={dim_size}")
            perm = torch.sort(index, stable=True).indices
            counts = torch.bincount(index, minlength=dim_size)
            ptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        rest = x.shape[:dim] + x.shape[dim + 1:]
        rows = x.movedim(dim, 0).reshape(e, math.prod(rest))
        if perm is not None:
            rows = rows[perm]              # a differentiable gather into group order
        det = self._deterministic_backward()
        out = self._run(lambda r: segment_csr(ptr, rows, r, deterministic=det))   # [S, R*M]
        s, nr = out.shape[0], len(self._codes)
        if nr == 1:
            return out.reshape(s, *rest).movedim(0, dim)
        blocks = out.reshape(s, nr, *rest).unbind(1)
        return torch.cat([b.movedim(0, dim) for b in blocks], dim=-1)

    # ---------------------------------------------------------- fused path
    def neighbour(self, graph, x_src: Tensor, num_nodes=None, *,
                  deterministic: bool = True) -> Tensor:
        """out[i] = reduce_{e=(j->i)} x_src[j] by `fastgnn.torch.segment_reduce`
        (gather fused; no per-edge tensor). graph: edge_index, EdgeIndex,
        unweighted adj_t or fastgnn.Graph; x_src [num_src, F]; num_nodes as in
        segment_reduce; deterministic=False (here or on the module) opts into
        the atomic max/min backward (SAGEConv passes its own keyword).
        Returns [num_dst, F] ([num_dst, R*F] for MultiAggregation)."""
        det = check_deterministic(deterministic) and self._deterministic_backward()
        return self._run(lambda r: segment_reduce(graph, x_src, r, num_nodes,
                                                  deterministic=det))

    def single_pass_reduce(self):
        """The `reduce` argument of one segment_reduce call whose output is
        this module's blocks in order, or None when the codes repeat (then
        `_run` reorders the blocks of the distinct ones)."""
        codes = self._codes
        if len(set(codes)) != len(codes):
            return None
        return codes[0] if self._single else list(codes)

    def _run(self, fn):
        """fn(reduce) once over the distinct reductions, blocks reordered into
        self._codes (which may repeat a reduction, as PyG allows)."""
        reduce = self.single_pass_reduce()
        if reduce is not None:
            return fn(reduce)
        codes = self._codes
        uniq = tuple(dict.fromkeys(codes))
        out = fn(list(uniq))
        f = out.shape[1] // len(uniq)
        return torch.cat([out[:, uniq.index(c) * f:(uniq.index(c) + 1) * f] for c in codes], 1)

    def __repr__(self):
        return f"{type(self).__name__}({'' if self.deterministic else 'deterministic=False'})"


def _check_index(t, name, device):
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {tuple(t.shape)}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} must hold integers, got dtype {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but x on {device}")
    return t


def _no_semi_grad(cls, semi_grad):
    if semi_grad:
        raise NotImplementedError(f"{cls}(semi_grad=True) is not supported by fastgnn.torch; "
                                  "the full gradient (semi_grad=False) costs no extra memory here")


class SumAggregation(_SegmentAggregation):
    r"""out[g] = sum_{e in g} x[e] (PyG's SumAggregation)."""
    _codes = ("sum",)


class MeanAggregation(_SegmentAggregation):
    r"""out[g] = (1/|g|) sum_{e in g} x[e], 0 for an empty group (PyG's MeanAggregation)."""
    _codes = ("mean",)


class MaxAggregation(_SegmentAggregation):
    r"""out[g] = max_{e in g} x[e] per feature, 0 for an empty group (PyG's MaxAggregation)."""
    _codes = ("max",)


class MinAggregation(_SegmentAggregation):
    r"""out[g] = min_{e in g} x[e] per feature, 0 for an empty group (PyG's MinAggregation)."""
    _codes = ("min",)


class VarAggregation(_SegmentAggregation):
    r"""out[g] = mean_{e in g} x[e]^2 - (mean_{e in g} x[e])^2 (PyG's VarAggregation;
    semi_grad=True is not supported)."""
    _codes = ("var",)

    def __init__(self, semi_grad: bool = False, *, deterministic: bool = True):
        _no_semi_grad(type(self).__name__, semi_grad)
        super().__init__(deterministic=deterministic)
        self.semi_grad = False


class StdAggregation(_SegmentAggregation):
    r"""out[g] = sqrt(max(var_g, 1e-5)), then 0 where that is <= sqrt(1e-5)
    (PyG's StdAggregation; semi_grad=True is not supported)."""
    _codes = ("std",)

    def __init__(self, semi_grad: bool = False, *, deterministic: bool = True):
        _no_semi_grad(type(self).__name__, semi_grad)
        super().__init__(deterministic=deterministic)
        self.semi_grad = False


class MulAggregation(_SegmentAggregation):
    r"""out[g] = prod_{e in g} x[e] per feature, 1 for an empty group (PyG's
    MulAggregation). Gradient as torch's prod: out[g] / x[e] for x[e] != 0,
    the product of the others for a group's only zero, else out[g] (0)."""
    _codes = ("mul",)


_CLASSES = {"sum": SumAggregation, "mean": MeanAggregation, "max": MaxAggregation,
            "min": MinAggregation, "var": VarAggregation, "std": StdAggregation,
            "mul": MulAggregation}


# with PyG, also a subclass of its MultiAggregation, so PyG layers given ours
# (SAGEConv sizing lin_l by get_out_channels, ...) treat it as one
_MULTI_BASES = ((_SegmentAggregation,) if _pyg_aggr is None
                else (_SegmentAggregation, _pyg_aggr.MultiAggregation))


class MultiAggregation(*_MULTI_BASES):
    r"""Several aggregations concatenated along the last dimension (PyG's
    MultiAggregation with mode="cat"), all computed in ONE pass over each group:

        out[g] = [ aggr_1(x_g) || aggr_2(x_g) || ... || aggr_R(x_g) ]      [S, R*F]

    aggrs:        list of names ("sum"/"add", "mean", "max", "min", "var", "std",
                  "mul", or PyG class names such as "MaxAggregation") or Aggregation
                  instances of those kinds (ours or PyG's).
    aggrs_kwargs: optional list of per-aggregation kwargs (semi_grad=False,
                  deterministic).
    mode:         "cat" only; PyG's other combine modes raise NotImplementedError.
    mode_kwargs:  must be empty (it configures the proj/attn modes only).
    deterministic: fastgnn's keyword; False (here or on any of the aggrs) lets
                  the GPU backward add the max/min blocks' gradients with float
                  atomics (one pass computes every block, so one switch).
    Sub-modules sit in `aggrs` (a ModuleList), as in PyG. With PyG installed this
    is also a `torch_geometric.nn.aggr.MultiAggregation`.
    """
    _single = False

    def __init__(self, aggrs, aggrs_kwargs=None, mode: str | None = "cat", mode_kwargs=None,
                 *, deterministic: bool = True):
        _Base.__init__(self)              # not PyG MultiAggregation's (it builds its own aggrs)
        self.deterministic = check_deterministic(deterministic, f"{type(self).__name__}: ")
        if mode != "cat":
            raise NotImplementedError(
                f"MultiAggregation(mode={mode!r}) is not supported by fastgnn.torch: only "
                "mode='cat' is (use torch_geometric.nn.aggr.MultiAggregation for "
                "proj/attn/sum/mean/max/min/logsumexp/std/var combine modes)")
        if mode_kwargs:
            raise NotImplementedError(f"MultiAggregation(mode='cat') takes no mode_kwargs, "
                                      f"got {sorted(mode_kwargs)}")
        if not isinstance(aggrs, (list, tuple)):
            raise ValueError(f"'aggrs' of MultiAggregation should be a list or tuple "
                             f"(got '{type(aggrs).__name__}')")
        if len(aggrs) == 0:
            raise ValueError("'aggrs' of MultiAggregation should not be empty")
        if aggrs_kwargs is None:
            aggrs_kwargs = [{}] * len(aggrs)
        elif len(aggrs_kwargs) != len(aggrs):
            raise ValueError(f"'aggrs_kwargs' has {len(aggrs_kwargs)} entries for "
                             f"{len(aggrs)} aggregations")
        self.aggrs = torch.nn.ModuleList([resolve_aggregation(a, **(kw or {}))
                                          for a, kw in zip(aggrs, aggrs_kwargs)])
        for a in self.aggrs:
            if isinstance(a, MultiAggregation):
                raise NotImplementedError("a MultiAggregation inside a MultiAggregation is "
                                          "not supported")
        self._codes = tuple(a._codes[0] for a in self.aggrs)
        self.mode = "cat"
        self.in_channels = self.out_channels = None

    def _deterministic_backward(self) -> bool:
        return self.deterministic and all(a.deterministic for a in self.aggrs)

    def get_out_channels(self, in_channels: int) -> int:
        """Output width for `in_channels` input features: R * in_channels (cat)."""
        return in_channels * len(self.aggrs)

    def reset_parameters(self):
        for a in self.aggrs:
            a.reset_parameters()

    def __repr__(self):
        aggrs = ",\n".join(f"  {a}" for a in self.aggrs) + ",\n"
        det = "" if self.deterministic else ", deterministic=False"
        return f"{type(self).__name__}([\n{aggrs}], mode={self.mode}{det})"


def _code_of_name(name: str):
    key = name.lower().replace("_", "")
    if key.endswith("aggregation") and key != "aggregation":
        key = key[:-len("aggregation")]
    key = _ALIASES.get(key, key)
    return key if key in _CODES else None


def _code_of_pyg(obj):
    """The reduction of a PyG basic Aggregation instance (exact class), else None."""
    if _pyg_aggr is None:
        return None
    for code, cls in _CLASSES.items():
        if type(obj) is getattr(_pyg_aggr, cls.__name__, None):
            if code == "var" and obj.semi_grad:
                return "semi_grad"
            if code == "std" and obj.var_aggr.semi_grad:
                return "semi_grad"
            return code
    return None


def resolve_aggregation(aggr, **kwargs):
    """One of our Aggregation modules for `aggr`: a name ("sum"/"add", "mean",
    "max", "min", "var", "std", "mul" or PyG's class name), a list of names or
    instances (MultiAggregation, mode "cat"), one of our instances (returned
    as is) or a PyG instance of a basic kind (translated). kwargs: only
    semi_grad=False and deterministic (or, for a list, MultiAggregation's own
    arguments).
    Anything else raises NotImplementedError naming what is supported."""
    if isinstance(aggr, _SegmentAggregation):
        if kwargs:
            raise TypeError(f"got kwargs {sorted(kwargs)} for an Aggregation instance")
        return aggr
    if isinstance(aggr, (list, tuple)):
        return MultiAggregation(list(aggr), **kwargs)
    if set(kwargs) - {"semi_grad", "deterministic"}:
        raise NotImplementedError(f"aggregation arguments {sorted(kwargs)} are not supported "
                                  "by fastgnn.torch (only semi_grad=False and deterministic)")
    det = {k: v for k, v in kwargs.items() if k == "deterministic"}
    if isinstance(aggr, str):
        code = _code_of_name(aggr)
        if code is not None:
            cls = _CLASSES[code]
            return cls(**kwargs) if code in ("var", "std") else cls(**det)
    elif _pyg_aggr is not None and isinstance(aggr, _pyg_aggr.MultiAggregation):
        if aggr.mode != "cat" or aggr.out_channels is not None:
            raise NotImplementedError(f"PyG MultiAggregation(mode={aggr.mode!r}) is not "
                                      "supported by fastgnn.torch (only mode='cat')")
        return MultiAggregation(list(aggr.aggrs), **det)
    else:
        code = _code_of_pyg(aggr)
        if code == "semi_grad":
            _no_semi_grad(type(aggr).__name__, True)
        if code is not None:
            return _CLASSES[code](**det)
    raise NotImplementedError(
        f"aggregation {aggr!r} is not supported by fastgnn.torch (supported: "
        f"{', '.join(('add',) + _CODES)}, a list of them, or their Aggregation modules)")


# ------------------------------------------------ compiled graph function
class _Reduction(_SegmentAggregation):
    """The aggregation behind fastgnn::aggregation: given codes, no module state."""

    def __init__(self, codes, single, deterministic):
        super().__init__(deterministic=deterministic)
        self._codes, self._single = tuple(codes), single


@functools.lru_cache(maxsize=64)
def _reduction(codes: tuple, single: bool, deterministic: bool):
    return _Reduction(codes, single, deterministic)


def _aggregation_fake(_graph, x, index, ptr, *, codes, single, dim_size, dim, deterministic):
    dim = dim % x.dim()
    if dim_size is not None:
        groups = dim_size
    elif ptr is not None:
        groups = ptr.shape[0] - 1
    else:
        groups = torch.library.get_ctx().new_dynamic_size()
    shape = list(x.shape)
    shape[dim] = groups
    if len(codes) > 1:
        shape[-1] = shape[-1] * len(codes)
    return [x.new_empty(shape)]


@custom_ops.graph_op("aggregation", ("x", "index", "ptr"), _aggregation_fake)
def _aggregation_op(_graph, x, index, ptr, *, codes, single, dim_size, dim, deterministic):
    return _reduction(tuple(codes), single, deterministic)(x, index, ptr, dim_size, dim)
