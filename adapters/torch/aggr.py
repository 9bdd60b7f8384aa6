"""Aggregation modules usable wherever PyG 2.8 expects an `Aggregation`.

    SumAggregation  MeanAggregation  MaxAggregation  MinAggregation
    VarAggregation  StdAggregation   MulAggregation
    SoftmaxAggregation  PowerMeanAggregation
    MultiAggregation(aggrs, mode="cat" | "proj" | "attn" | "sum" | "mean" | "max"
                     | "min" | "logsumexp" | "std" | "var")

They subclass `torch_geometric.nn.aggr.Aggregation` when PyG is importable
(so PyG's isinstance checks pass; importing this module imports PyG, which is
why `fastgnn.torch` loads it only on first use), else `torch.nn.Module`.
Their parameters carry PyG's names (a learnable `t` or `p`; the combine
step's `lin`, `lin_heads.lins.<r>` and `multihead_attn` of a
MultiAggregation in "proj" / "attn" mode), so state_dicts load both ways with
strict=True; the basic aggregations hold none, like PyG's.

Two ways in:

- `aggr(x, index=None, ptr=None, dim_size=None, dim=-2)`, PyG's call: x holds
  one row per element (per edge message), reduced along `dim` into dim_size
  groups. With `ptr` (CSR offsets, rows grouped) it runs
  `fastgnn.torch.segment_csr`; with `index` (the group of each row, any
  order) a stable sort of index gives the offsets and `x[index order]` is
  reduced (a torch gather, so autograd routes the gradient back to x).
- `aggr.neighbour(graph, x_src)`: the fused path, `fastgnn.torch.segment_reduce`
  on a graph: out[i] = reduce_{j -> i} x_src[j] without any per-edge tensor,
  except for softmax, whose weights depend on each edge: it gathers the
  per-edge rows x_src[j] in CSR order ([E, F], as PyG's message), and
  reduces them as in PyG's call.

Every segment reduction is fastgnn's: the basic statistics of a module, or
of a MultiAggregation's basic members, in one fused pass; softmax and power
mean around their own terms (see their classes). Only a MultiAggregation's
combine step (concatenation, PyG's Linear, stacking and a torch reduction,
PyG's per-aggregation Linears and torch's MultiheadAttention) is plain torch.

Semantics are PyG's (empty groups give 0, 1 for mul; var = E[x^2] - E[x]^2;
std clamps at 1e-5 and zeroes tiny values; mul's gradient is torch's prod
gradient), except that max/min send the gradient to one winner where PyG
splits it among exact ties, and that MulAggregation also takes `ptr` (PyG's
asks for `index`).

Every module takes fastgnn's keyword `deterministic` (default True: bitwise
repeatable backward). With deterministic=False the GPU backward of max/min
(alone or inside a MultiAggregation) adds its gradient with float atomics,
one per (group, feature), instead of walking the transpose: faster, last bits
vary. It changes nothing on the CPU, in the forward, or for sum/mean/var/std,
softmax (its max takes no gradient) and power mean. A MultiAggregation opts
in when it or any of its aggregations says False.
"""
from __future__ import annotations

import functools
import math
import numbers

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from fastgnn._array import check_deterministic

from . import custom_ops
from .functional import _csr_tensors, _node_sizes, _resolve_for, segment_csr, segment_reduce
from .graph_cache import graph_input

try:                                      # PyG is optional
    from torch_geometric.nn import aggr as _pyg_aggr
    from torch_geometric.nn.dense.linear import Linear as _HeadLinear
    _Base = _pyg_aggr.Aggregation
except ImportError:                       # pragma: no cover - PyG is in the test env
    _pyg_aggr = None
    _HeadLinear = torch.nn.Linear
    _Base = torch.nn.Module

__all__ = ["SumAggregation", "MeanAggregation", "MaxAggregation", "MinAggregation",
           "VarAggregation", "StdAggregation", "MulAggregation", "SoftmaxAggregation",
           "PowerMeanAggregation", "MultiAggregation", "resolve_aggregation"]

_ALIASES = {"add": "sum"}
# MultiAggregation's combine modes: the dense ones reduce the stacked outputs
# with the torch function of that name over the new first dimension
_DENSE_MODES = ("sum", "mean", "max", "min", "logsumexp", "std", "var")
_MODES = ("cat", "proj", "attn") + _DENSE_MODES


# ----------------------------------------------------- what is aggregated
class _Grouped:
    """PyG's call form, validated once: x's rows in group order.

    rows: [E, M] x with `dim` moved first and the other dimensions flattened
          into M (gathered into group order when `index` was given);
    ptr:  [S + 1] offsets of the S groups in rows."""

    def __init__(self, x, index, ptr, dim_size, dim, deterministic):
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
        self.rest = x.shape[:dim] + x.shape[dim + 1:]
        rows = x.movedim(dim, 0).reshape(e, math.prod(self.rest))
        if perm is not None:
            rows = rows[perm]              # a differentiable gather into group order
        self.x, self.ptr, self.det = rows, ptr, deterministic
        self.ndim, self.dim = x.dim(), dim

    def reduce(self, reduce, values=None):
        """segment_csr of rows (or of `values`, rows transformed elementwise) -> [S, R*M]."""
        return segment_csr(self.ptr, self.x if values is None else values, reduce,
                           deterministic=self.det)

    def edge_rows(self):
        """(rows [E, M], ptr [S + 1]): one row per element, grouped."""
        return self.x, self.ptr

    def two_dimensional(self) -> bool:
        return self.ndim == 2 and self.dim == 0

    def restore(self, out):
        """[S, M] -> x's shape with E replaced by S."""
        return out.reshape(out.shape[0], *self.rest).movedim(0, self.dim)

    def restore_cat(self, out, nr):
        """[S, nr*M] (block r = reduction r) -> the nr restored blocks
        concatenated along the last dimension."""
        if nr == 1:
            return self.restore(out)
        if self.two_dimensional():
            return out                     # already [S, nr*F] in block order
        blocks = out.reshape(out.shape[0], nr, *self.rest).unbind(1)
        return torch.cat([b.movedim(0, self.dim) for b in blocks], dim=-1)


class _Neighbours:
    """The fused form: x_src [num_src, F] on a graph; out[i] reduces the
    x_src[j] of the edges j -> i."""

    def __init__(self, graph, x_src, num_nodes, deterministic):
        self.graph, self.x, self.num_nodes, self.det = graph, x_src, num_nodes, deterministic
        self._edges = None

    def reduce(self, reduce, values=None):
        """segment_reduce of x_src (or of `values`, x_src transformed elementwise)
        -> [num_dst, R*F]."""
        return segment_reduce(self.graph, self.x if values is None else values, reduce,
                              self.num_nodes, deterministic=self.det)

    def edge_rows(self):
        """(x_src[j] per edge in CSR order [E, F], the graph's indptr [num_dst + 1])."""
        if self._edges is None:
            graph, adj_w = _resolve_for(self.graph, self.x, self.num_nodes)
            if adj_w is not None:
                raise ValueError("the aggregation takes no edge weights, but the sparse adj_t "
                                 "has values other than 1; pass an edge_index, a fastgnn.Graph "
                                 "or an adj_t of ones")
            if self.x.dim() != 2 or self.x.shape[0] != graph.num_src:
                raise ValueError(f"x_src must have shape [num_src, F] = [{graph.num_src}, F], "
                                 f"got {tuple(self.x.shape)}")
            indptr, sources, _ = _csr_tensors(graph)
            self._edges = self.x[sources], indptr
        return self._edges

    def two_dimensional(self) -> bool:
        return self.x.dim() == 2

    def restore(self, out):
        return out

    def restore_cat(self, out, nr):
        return out


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


def _split_last(out, k):
    """The k equal blocks of out's last dimension."""
    w = out.shape[-1] // k
    return [out[..., i * w:(i + 1) * w] for i in range(k)]


# ------------------------------------------------------------------ modules
class _SegmentAggregation(_Base):
    """Shared body. `_codes` names the basic reductions of the output blocks
    in order (empty for softmax and power mean, which reduce their own terms)."""
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

    @classmethod
    def _from_pyg(cls, theirs, **det):
        """Ours for PyG's instance of the same kind (its parameters shared)."""
        return cls(**det)

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
        Returns x's shape with E replaced by S (for a MultiAggregation, the
        R results combined by its mode: "cat" concatenates them along the
        last dimension), in x's dtype (promoted with a learnable t or p's).
        Without index and ptr, all rows form one group.
        """
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if custom_ops.compiling():
            # the group offsets and checks read index's values: inside the ops
            return self._compiled(x, index, ptr, dim_size, dim)
        return self._aggregate_from(_Grouped(x, index, ptr, dim_size, dim,
                                             self._deterministic_backward()))

    # ---------------------------------------------------------- fused path
    def neighbour(self, graph, x_src: Tensor, num_nodes=None, *,
                  deterministic: bool = True) -> Tensor:
        """out[i] = reduce_{e=(j->i)} x_src[j] by `fastgnn.torch.segment_reduce`
        (gather fused; no per-edge tensor but softmax's per-edge rows). graph:
        edge_index, EdgeIndex, unweighted adj_t or fastgnn.Graph; x_src
        [num_src, F]; num_nodes as in segment_reduce; deterministic=False
        (here or on the module) opts into the atomic max/min backward
        (SAGEConv passes its own keyword).
        Returns [num_dst, F] (for a MultiAggregation: its mode's combination,
        [num_dst, R*F] for "cat")."""
        det = check_deterministic(deterministic) and self._deterministic_backward()
        if custom_ops.compiling() and self._per_edge():
            # softmax weighs each edge: its messages, grouped inside the compiled op
            ei, sizes = graph_input(graph, _node_sizes(graph, x_src, num_nodes))
            return self.forward(x_src[ei[0]], ei[1], dim_size=sizes[1])
        return self._aggregate_from(_Neighbours(graph, x_src, num_nodes, det))

    def _aggregate_from(self, source):
        if self._fused_cat():
            return source.restore_cat(self._run(source.reduce), len(self._codes))
        return self.combine([source.restore(o) for o in self._outputs(source)])

    def _fused_cat(self) -> bool:
        """True when the output is the basic reductions' blocks concatenated."""
        return bool(self._codes)

    def _per_edge(self) -> bool:
        """True when the fused path needs per-edge rows (softmax)."""
        return False

    def _outputs(self, source):
        """The aggregations' outputs [S, M] on source's rows, in order."""
        raise NotImplementedError

    def combine(self, inputs: list) -> Tensor:
        return inputs[0] if len(inputs) == 1 else torch.cat(inputs, dim=-1)

    def _compiled(self, x, index, ptr, dim_size, dim):
        return custom_ops.call("aggregation", None, x, index, ptr, codes=list(self._codes),
                               single=self._single, dim_size=dim_size, dim=dim,
                               deterministic=self._deterministic_backward())

    def single_pass_reduce(self):
        """The `reduce` argument of one segment_reduce call whose output is
        this module's output, or None when there is none (softmax, power mean,
        a combine mode other than "cat") or the codes repeat (then `_run`
        reorders the blocks of the distinct ones)."""
        codes = self._codes
        if not self._fused_cat() or len(set(codes)) != len(codes):
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
        blocks = dict(zip(uniq, _split_last(fn(list(uniq)), len(uniq))))
        return torch.cat([blocks[c] for c in codes], 1)

    def __repr__(self):
        return f"{type(self).__name__}({'' if self.deterministic else 'deterministic=False'})"


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

    @classmethod
    def _from_pyg(cls, theirs, **det):
        return cls(theirs.semi_grad, **det)


class StdAggregation(_SegmentAggregation):
    r"""out[g] = sqrt(max(var_g, 1e-5)), then 0 where that is <= sqrt(1e-5)
    (PyG's StdAggregation; semi_grad=True is not supported)."""
    _codes = ("std",)

    def __init__(self, semi_grad: bool = False, *, deterministic: bool = True):
        _no_semi_grad(type(self).__name__, semi_grad)
        super().__init__(deterministic=deterministic)
        self.semi_grad = False

    @classmethod
    def _from_pyg(cls, theirs, **det):
        return cls(theirs.var_aggr.semi_grad, **det)


class MulAggregation(_SegmentAggregation):
    r"""out[g] = prod_{e in g} x[e] per feature, 1 for an empty group (PyG's
    MulAggregation). Gradient as torch's prod: out[g] / x[e] for x[e] != 0,
    the product of the others for a group's only zero, else out[g] (0)."""
    _codes = ("mul",)


# ------------------------------------------------- softmax and power mean
def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _check_bool(v, name, owner):
    if not isinstance(v, bool):
        raise TypeError(f"{owner}: {name} must be a bool, got {type(v).__name__}")
    return v


def _check_channels(source, param, name):
    """A per-channel parameter [C] needs x [E, C] reduced along dim 0 (PyG's
    rule), or x_src [num_src, C] on the fused path."""
    if not isinstance(param, Tensor) or param.numel() == 1:
        return
    c = param.numel()
    if not source.two_dimensional():
        raise ValueError(f"{name} has channels={c}: x must be two-dimensional and reduced "
                         "along dim 0")
    if source.x.shape[1] != c:
        raise ValueError(f"{name} has channels={c}, but x has {source.x.shape[1]} features")


class _ParametricAggregation(_SegmentAggregation):
    """An aggregation with one scalar or per-channel parameter (`_param`:
    "t" or "p"), fixed (a float) or learnable (a Parameter [channels])."""
    _param = ""

    def _init_param(self, value, learn, channels):
        owner = type(self).__name__
        if not _is_number(value):
            raise TypeError(f"{owner}: {self._param} must be a real number, "
                            f"got {type(value).__name__}")
        self.learn = _check_bool(learn, "learn", owner)
        if not isinstance(channels, int) or isinstance(channels, bool):
            raise TypeError(f"{owner}: channels must be an int, got {type(channels).__name__}")
        if channels < 1:
            raise ValueError(f"{owner}: channels must be >= 1, got {channels}")
        if not learn and channels != 1:
            raise ValueError(f"{owner}: channels={channels} needs learn=True (a fixed "
                             f"{self._param} is one number)")
        self.channels = channels
        setattr(self, f"_init_{self._param}", value)
        setattr(self, self._param,
                torch.nn.Parameter(torch.empty(channels)) if learn else value)
        self.reset_parameters()

    def reset_parameters(self):
        value = getattr(self, self._param)
        if isinstance(value, Tensor):
            with torch.no_grad():
                value.fill_(getattr(self, f"_init_{self._param}"))

    def _share(self, theirs):
        """Use PyG's learnable parameter itself (trained together)."""
        if self.learn:
            setattr(self, self._param, getattr(theirs, self._param))
        return self

    def _outputs(self, source):
        return [self._reduce(source, getattr(self, self._param), **self._options())]

    def _options(self) -> dict:
        return {}

    def _compiled(self, x, index, ptr, dim_size, dim):
        param = getattr(self, self._param)
        tensor = param if isinstance(param, Tensor) else None
        options = {"semi_grad": False, "clamp_min": None, "clamp_max": None,
                   **self._options()}
        return custom_ops.call("parametric_aggregation", None, x, index, ptr, tensor,
                               kind=self._param, value=None if tensor is not None else param,
                               dim_size=dim_size, dim=dim,
                               deterministic=self._deterministic_backward(), **options)

    def __repr__(self):
        det = "" if self.deterministic else ", deterministic=False"
        return f"{type(self).__name__}(learn={self.learn}{det})"


class _SoftmaxSum(torch.autograd.Function):
    r"""out [S, M] = sum_{e in g} w_e rows_e per column over the segments of
    rows [E, M] (ptr [S + 1]), w_e = exp(t rows_e - lse_g),
    lse_g = m_g + log(sum_{e in g} exp(t rows_e - m_g) + 1e-16), m_g the
    segment max of t rows. It keeps rows, lse and out ([S, M] each) and
    recomputes w in the backward:

        grad rows_e = g_g w_e (1 + t (rows_e - out_g))   (g_g w_e with semi_grad)
        grad t      = sum_{g, e in g} g_g w_e (rows_e - out_g) rows_e
                      (per column for t [M], summed for a scalar t)."""

    @staticmethod
    def forward(ctx, rows, t, ptr, semi_grad, deterministic):
        z = rows * t
        lse = segment_csr(ptr, z, "max", deterministic=deterministic)          # m_g (checks ptr)
        counts = (ptr[1:] - ptr[:-1]).long()
        seg = _segment_ids(counts, rows.shape[0])
        z -= lse[seg]
        z.exp_()                                                              # exp(t x_e - m_g)
        norm = segment_csr(ptr, z, "sum") + 1e-16
        z *= rows
        out = segment_csr(ptr, z, "sum") / norm
        lse += norm.log()
        ctx.save_for_backward(rows, t if isinstance(t, Tensor) else None, lse, out, counts)
        ctx.t = None if isinstance(t, Tensor) else t
        ctx.semi_grad = semi_grad
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        rows, t_saved, lse, out, counts = ctx.saved_tensors
        t = ctx.t if t_saved is None else t_saved
        need_rows, need_t = ctx.needs_input_grad[:2]
        seg = _segment_ids(counts, rows.shape[0])
        gw = rows * t
        gw -= lse[seg]
        gw.exp_()                                                             # w_e
        gw *= grad_out[seg]                                                   # g_g w_e
        grad_rows = grad_t = None
        if need_t or (need_rows and not ctx.semi_grad):
            d = rows - out[seg]                                               # x_e - out_g
            if need_t:
                per_column = (gw * d).mul_(rows).sum(0)
                grad_t = (per_column.sum() if t.numel() == 1 else per_column)
                grad_t = grad_t.reshape(t.shape).to(t.dtype)
            if need_rows and not ctx.semi_grad:
                grad_rows = d.mul_(t).add_(1).mul_(gw)
        if need_rows and grad_rows is None:
            grad_rows = gw
        if grad_rows is not None:
            grad_rows = grad_rows.to(rows.dtype)
        return grad_rows, grad_t, None, None, None


def _segment_ids(counts, e):
    """[E] segment of each row, from the segments' row counts [S]."""
    return torch.repeat_interleave(counts, output_size=e)


class SoftmaxAggregation(_ParametricAggregation):
    r"""Softmax aggregation (DeeperGCN; PyG's SoftmaxAggregation), per group g
    and feature:

        out[g] = sum_{e in g} w_e x[e],
        w_e    = exp(t x[e] - m_g) / (sum_{e' in g} exp(t x[e'] - m_g) + 1e-16)

    m_g = max_{e in g} t x[e] (fastgnn's max reduction) keeps the exponents
    <= 0; it cancels in w_e, so it takes no gradient (as in PyG). An empty
    group gives 0. The normaliser and the weighted sum are fastgnn's sum
    reductions; nothing larger than x is made (w is recomputed in the
    backward from x and two [S, F] statistics).

    t:         initial inverse temperature (a real number).
    learn:     learn t (Parameter `t` [channels]).
    semi_grad: w_e is a constant of the backward (grad x[e] = w_e g_g; only
               with learn=False).
    channels:  one t per feature (needs learn=True; x then [E, channels],
               reduced along dim 0).
    deterministic: fastgnn's keyword, accepted for uniformity (no effect).
    """
    _param = "t"

    def __init__(self, t: float = 1.0, learn: bool = False, semi_grad: bool = False,
                 channels: int = 1, *, deterministic: bool = True):
        super().__init__(deterministic=deterministic)
        _check_bool(learn, "learn", type(self).__name__)
        self.semi_grad = _check_bool(semi_grad, "semi_grad", type(self).__name__)
        if learn and semi_grad:
            raise ValueError(f"{type(self).__name__}: semi_grad=True needs learn=False "
                             "(a learnable t takes its gradient through the weights)")
        self._init_param(t, learn, channels)

    @classmethod
    def _from_pyg(cls, theirs, **det):
        return cls(theirs._init_t, theirs.learn, theirs.semi_grad, theirs.channels,
                   **det)._share(theirs)

    def _per_edge(self) -> bool:
        return True

    def _options(self) -> dict:
        return dict(semi_grad=self.semi_grad)

    @staticmethod
    def _reduce(source, t, semi_grad=False, **_):
        """out [S, M] on source's rows (see the class)."""
        _check_channels(source, t, "t")
        rows, ptr = source.edge_rows()
        return _SoftmaxSum.apply(rows, t, ptr, semi_grad, source.det)


def _clamp(t, lo, hi):
    return t if lo is None and hi is None else t.clamp(min=lo, max=hi)


class PowerMeanAggregation(_ParametricAggregation):
    r"""Power mean aggregation (DeeperGCN; PyG's PowerMeanAggregation), per
    group g and feature:

        out[g] = c( (1/|g|) sum_{e in g} c(x[e])^p )^(1/p),   c = clamp to
                                                               [clamp_min, clamp_max]

    An empty group's mean is 0, so it gives c(0)^(1/p) (clamp_min^(1/p)). For
    a fixed p = 1 it is the plain mean, unclamped (0 for an empty group), as
    in PyG. The mean is fastgnn's
    mean reduction of c(x)^p, a tensor of x's size (on the fused path of
    x_src's: no per-edge tensor); the gradient (x and a learnable p) is
    autograd's through torch's clamp and pow.

    p:         initial power (a real number).
    learn:     learn p (Parameter `p` [channels]).
    channels:  one p per feature (needs learn=True; x then [E, channels],
               reduced along dim 0).
    clamp_min, clamp_max: the clamp's bounds (None: unbounded on that side).
    deterministic: fastgnn's keyword, accepted for uniformity (no effect).
    """
    _param = "p"

    def __init__(self, p: float = 1.0, learn: bool = False, channels: int = 1,
                 clamp_min: float | None = 1e-4, clamp_max: float | None = 100.0, *,
                 deterministic: bool = True):
        super().__init__(deterministic=deterministic)
        owner = type(self).__name__
        for name, v in (("clamp_min", clamp_min), ("clamp_max", clamp_max)):
            if v is not None and not _is_number(v):
                raise TypeError(f"{owner}: {name} must be a real number or None, "
                                f"got {type(v).__name__}")
        if clamp_min is not None and clamp_max is not None and clamp_min > clamp_max:
            raise ValueError(f"{owner}: clamp_min={clamp_min} exceeds clamp_max={clamp_max}")
        self._init_param(p, learn, channels)
        self.min_value, self.max_value = clamp_min, clamp_max

    @classmethod
    def _from_pyg(cls, theirs, **det):
        return cls(theirs._init_p, theirs.learn, theirs.channels, theirs.min_value,
                   theirs.max_value, **det)._share(theirs)

    def _options(self) -> dict:
        return dict(clamp_min=self.min_value, clamp_max=self.max_value)

    @staticmethod
    def _reduce(source, p, clamp_min=None, clamp_max=None, **_):
        """out [S, M] on source's rows (see the class)."""
        _check_channels(source, p, "p")
        if not isinstance(p, Tensor) and p == 1:
            return source.reduce("mean")
        powered = _clamp(source.x, clamp_min, clamp_max).pow(p)
        return _clamp(source.reduce("mean", powered), clamp_min, clamp_max).pow(1.0 / p)


# ------------------------------------------------------------ several at once
class _HeadLinears(torch.nn.Module):
    """One Linear per aggregation output, as PyG's HeteroDictLinear of
    MultiAggregation's "attn" mode: lins[str(r)] maps [*, in_r] -> [*, out]
    (PyG's Linear: F.linear with PyG's initialisation, drawn twice as
    HeteroDictLinear draws it)."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.lins = torch.nn.ModuleDict({str(r): _HeadLinear(c, out_channels)
                                         for r, c in enumerate(in_channels)})
        self.reset_parameters()

    def reset_parameters(self):
        for lin in self.lins.values():
            lin.reset_parameters()


def _positive_int(v, name):
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"MultiAggregation: {name} must be an int, got {type(v).__name__}")
    if v < 1:
        raise ValueError(f"MultiAggregation: {name} must be >= 1, got {v}")
    return v


# with PyG, also a subclass of its MultiAggregation, so PyG layers given ours
# (SAGEConv sizing lin_l by get_out_channels, ...) treat it as one
_MULTI_BASES = ((_SegmentAggregation,) if _pyg_aggr is None
                else (_SegmentAggregation, _pyg_aggr.MultiAggregation))


class MultiAggregation(*_MULTI_BASES):
    r"""Several aggregations of the same rows, combined (PyG's MultiAggregation):

        o_r = aggr_r(x)                                  [S, F] each, r = 1..R
        cat:       out = [o_1 || ... || o_R]                               [S, R*F]
        proj:      out = lin([o_1 || ... || o_R])                          [S, out]
        sum, mean, max, min, logsumexp, std, var:
                   out = torch.<mode>(stack(o_1..o_R), dim=0)              [S, F]
                   (std and var with torch's default correction of 1)
        attn:      h_r = lin_heads.lins[r](o_r) [S, out];  H = stack(h_1..h_R)
                   out = mean_r multihead_attn(H, H, H)[r]                 [S, out]

    The basic aggregations (sum, mean, max, min, var, std, mul) among them are
    computed in ONE fused pass over each group; softmax and power mean each
    run their own reductions.

    aggrs:        list of names ("sum"/"add", "mean", "max", "min", "var", "std",
                  "mul", "softmax", "powermean", or PyG class names such as
                  "MaxAggregation") or Aggregation instances of those kinds
                  (ours or PyG's; a PyG instance's learnable parameter is shared).
    aggrs_kwargs: optional list of per-aggregation kwargs (e.g. t/learn for
                  softmax, p for power mean; semi_grad=False and deterministic
                  for the basic ones).
    mode:         one of the combine modes above (default "cat").
    mode_kwargs:  "proj": in_channels (int, or one per aggregation) and
                  out_channels, the rest to torch.nn.Linear (bias, ...);
                  "attn": in_channels, out_channels, num_heads (default 1), the
                  rest to torch.nn.MultiheadAttention (dropout, bias, ...).
                  The other modes take only in_channels / out_channels, kept
                  as attributes (a given out_channels is get_out_channels', as
                  in PyG).
    deterministic: fastgnn's keyword; False (here or on any of the aggrs) lets
                  the GPU backward add the max/min blocks' gradients with float
                  atomics (one pass computes every block, so one switch).
    Sub-modules sit in `aggrs` (a ModuleList), the combine's in `lin`
    ("proj"), `lin_heads` and `multihead_attn` ("attn"), as in PyG. With PyG
    installed this is also a `torch_geometric.nn.aggr.MultiAggregation`.
    """
    _single = False

    def __init__(self, aggrs, aggrs_kwargs=None, mode: str | None = "cat", mode_kwargs=None,
                 *, deterministic: bool = True):
        _Base.__init__(self)              # not PyG MultiAggregation's (it builds its own aggrs)
        self.deterministic = check_deterministic(deterministic, f"{type(self).__name__}: ")
        if mode not in _MODES:
            raise ValueError(f"MultiAggregation: mode must be one of {', '.join(_MODES)}; "
                             f"got {mode!r}")
        if mode_kwargs is not None and not isinstance(mode_kwargs, dict):
            raise TypeError(f"MultiAggregation: mode_kwargs must be a dict or None, "
                            f"got {type(mode_kwargs).__name__}")
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
        basic = all(a._codes for a in self.aggrs)
        self._codes = tuple(a._codes[0] for a in self.aggrs) if basic else ()
        self.mode = mode
        self._build_combine(dict(mode_kwargs or {}))

    def _build_combine(self, kw):
        """lin ("proj") or lin_heads and multihead_attn ("attn"), as PyG's."""
        self.in_channels = kw.pop("in_channels", None)
        self.out_channels = kw.pop("out_channels", None)
        if self.mode not in ("proj", "attn"):
            if kw:
                raise TypeError(f"MultiAggregation(mode={self.mode!r}) takes only in_channels "
                                f"and out_channels in mode_kwargs, got {sorted(kw)}")
            return
        r = len(self.aggrs)
        if r == 1:
            raise ValueError(f"MultiAggregation(mode={self.mode!r}) needs at least two "
                             "aggregations")
        if self.in_channels is None or self.out_channels is None:
            raise ValueError(f"MultiAggregation(mode={self.mode!r}) needs in_channels and "
                             "out_channels in mode_kwargs")
        ins = self.in_channels
        ins = [ins] * r if isinstance(ins, int) and not isinstance(ins, bool) else ins
        if not isinstance(ins, (list, tuple)) or len(ins) != r:
            raise ValueError(f"MultiAggregation: in_channels must be an int or {r} ints (one "
                             f"per aggregation), got {self.in_channels!r}")
        self.in_channels = [_positive_int(c, "in_channels") for c in ins]
        out = _positive_int(self.out_channels, "out_channels")
        if self.mode == "proj":
            self.lin = torch.nn.Linear(sum(self.in_channels), out, **kw)
        else:
            self.lin_heads = _HeadLinears(self.in_channels, out)
            heads = _positive_int(kw.pop("num_heads", 1), "num_heads")
            if out % heads:
                raise ValueError(f"MultiAggregation: out_channels={out} is not divisible by "
                                 f"num_heads={heads}")
            self.multihead_attn = torch.nn.MultiheadAttention(out, heads, **kw)

    @classmethod
    def _from_pyg(cls, theirs, **det):
        if theirs.mode not in _MODES:
            raise NotImplementedError(f"PyG MultiAggregation(mode={theirs.mode!r}) is not "
                                      f"supported by fastgnn.torch (modes: {', '.join(_MODES)})")
        ours = cls(list(theirs.aggrs), **det)
        ours.mode, ours.in_channels, ours.out_channels = (theirs.mode, theirs.in_channels,
                                                          theirs.out_channels)
        for name in {"proj": ("lin",), "attn": ("lin_heads", "multihead_attn")}.get(ours.mode,
                                                                                    ()):
            setattr(ours, name, getattr(theirs, name))      # the same weights, shared
        return ours

    def _deterministic_backward(self) -> bool:
        return self.deterministic and all(a.deterministic for a in self.aggrs)

    def _fused_cat(self) -> bool:
        return bool(self._codes) and self.mode == "cat"

    def _per_edge(self) -> bool:
        return any(a._per_edge() for a in self.aggrs)

    def _member_outputs(self, fused, each):
        """The aggregations' outputs in order: the basic ones' from ONE call
        fused(distinct codes) -> their blocks, the others' from each(aggr)."""
        codes = [a._codes[0] if a._codes else None for a in self.aggrs]
        uniq = tuple(dict.fromkeys(c for c in codes if c is not None))
        blocks = dict(zip(uniq, fused(uniq))) if uniq else {}
        return [each(a) if c is None else blocks[c] for a, c in zip(self.aggrs, codes)]

    def _outputs(self, source):
        return self._member_outputs(
            lambda uniq: _split_last(source.reduce(list(uniq)), len(uniq)),
            lambda a: a._outputs(source)[0])

    def _compiled(self, x, index, ptr, dim_size, dim):
        if self._fused_cat():
            return super()._compiled(x, index, ptr, dim_size, dim)
        det = self._deterministic_backward()

        def fused(uniq):
            out = custom_ops.call("aggregation", None, x, index, ptr, codes=list(uniq),
                                  single=False, dim_size=dim_size, dim=dim, deterministic=det)
            return _split_last(out, len(uniq))
        return self.combine(self._member_outputs(
            fused, lambda a: a._compiled(x, index, ptr, dim_size, dim)))

    def combine(self, inputs: list) -> Tensor:
        """The mode's combination of the R outputs (see the class)."""
        if len(inputs) == 1:
            return inputs[0]
        if self.mode == "cat":
            return torch.cat(inputs, dim=-1)
        if self.mode == "proj":
            return self.lin(torch.cat(inputs, dim=-1))
        if self.mode == "attn":
            lins = self.lin_heads.lins
            h = torch.stack([lins[str(r)](o) for r, o in enumerate(inputs)], dim=0)
            return self.multihead_attn(h, h, h)[0].mean(dim=0)
        out = getattr(torch, self.mode)(torch.stack(inputs, dim=0), dim=0)
        return out if isinstance(out, Tensor) else out[0]      # max/min: (values, indices)

    def get_out_channels(self, in_channels: int) -> int:
        """Output width for `in_channels` input features: out_channels when
        given, R * in_channels for "cat", else in_channels."""
        if self.out_channels is not None:
            return self.out_channels
        return in_channels * len(self.aggrs) if self.mode == "cat" else in_channels

    def reset_parameters(self):
        for a in self.aggrs:
            a.reset_parameters()
        if self.mode == "proj":
            self.lin.reset_parameters()
        elif self.mode == "attn":
            self.lin_heads.reset_parameters()
            self.multihead_attn._reset_parameters()

    def __repr__(self):
        aggrs = ",\n".join(f"  {a}" for a in self.aggrs) + ",\n"
        det = "" if self.deterministic else ", deterministic=False"
        return f"{type(self).__name__}([\n{aggrs}], mode={self.mode}{det})"


# ------------------------------------------------------------ name lookup
_CLASSES = {"sum": SumAggregation, "mean": MeanAggregation, "max": MaxAggregation,
            "min": MinAggregation, "var": VarAggregation, "std": StdAggregation,
            "mul": MulAggregation, "softmax": SoftmaxAggregation,
            "powermean": PowerMeanAggregation}


def _class_of_name(name: str):
    """Our class for an aggregation name as PyG's resolver reads it (case,
    '-', '_' and ' ' ignored; "Aggregation" suffix optional; "add" = "sum")."""
    key = name.lower()
    for ch in "-_ ":
        key = key.replace(ch, "")
    if key.endswith("aggregation") and key != "aggregation":
        key = key[:-len("aggregation")]
    return _CLASSES.get(_ALIASES.get(key, key))


def _from_pyg_instance(obj, det):
    """Ours for a PyG aggregation instance of a supported kind (exact class), else None."""
    if _pyg_aggr is None:
        return None
    if isinstance(obj, _pyg_aggr.MultiAggregation):
        return MultiAggregation._from_pyg(obj, **det)
    for cls in _CLASSES.values():
        if type(obj) is getattr(_pyg_aggr, cls.__name__, None):
            return cls._from_pyg(obj, **det)
    return None


def resolve_aggregation(aggr, **kwargs):
    """One of our Aggregation modules for `aggr`: a name ("sum"/"add", "mean",
    "max", "min", "var", "std", "mul", "softmax", "powermean" or PyG's class
    name), a list of names or instances (MultiAggregation; kwargs are its own
    arguments), one of our instances (returned as is) or a PyG instance of a
    supported kind (translated; a learnable parameter and a combine step's
    weights are shared with it). kwargs: the constructor's for softmax and
    power mean; for the basic kinds and PyG instances only semi_grad=False
    and deterministic. Anything else raises NotImplementedError naming what
    is supported."""
    if isinstance(aggr, _SegmentAggregation):
        if kwargs:
            raise TypeError(f"got kwargs {sorted(kwargs)} for an Aggregation instance")
        return aggr
    if isinstance(aggr, (list, tuple)):
        return MultiAggregation(list(aggr), **kwargs)
    cls = _class_of_name(aggr) if isinstance(aggr, str) else None
    if isinstance(cls, type) and issubclass(cls, _ParametricAggregation):
        return cls(**kwargs)
    if set(kwargs) - {"semi_grad", "deterministic"}:
        raise NotImplementedError(f"aggregation arguments {sorted(kwargs)} are not supported "
                                  "by fastgnn.torch (only semi_grad=False and deterministic)")
    det = {k: v for k, v in kwargs.items() if k == "deterministic"}
    if cls is not None:
        return cls(**kwargs) if cls in (VarAggregation, StdAggregation) else cls(**det)
    if not isinstance(aggr, str):
        ours = _from_pyg_instance(aggr, det)
        if ours is not None:
            return ours
    raise NotImplementedError(
        f"aggregation {aggr!r} is not supported by fastgnn.torch (supported: "
        f"add, {', '.join(_CLASSES)}, a list of them, or their Aggregation modules)")


# ------------------------------------------------ compiled graph function
class _Reduction(_SegmentAggregation):
    """The aggregation behind fastgnn::aggregation: given codes, no module state."""

    def __init__(self, codes, single, deterministic):
        super().__init__(deterministic=deterministic)
        self._codes, self._single = tuple(codes), single


@functools.lru_cache(maxsize=64)
def _reduction(codes: tuple, single: bool, deterministic: bool):
    return _Reduction(codes, single, deterministic)


def _grouped_shape(x, ptr, dim_size, dim, blocks):
    """x's shape with the reduced dimension replaced by the group count (an
    unbacked size when only index's values know it) and the last one times
    `blocks`."""
    dim = dim % x.dim()
    if dim_size is not None:
        groups = dim_size
    elif ptr is not None:
        groups = ptr.shape[0] - 1
    else:
        groups = torch.library.get_ctx().new_dynamic_size()
    shape = list(x.shape)
    shape[dim] = groups
    shape[-1] = shape[-1] * blocks
    return shape


def _aggregation_fake(_graph, x, index, ptr, *, codes, single, dim_size, dim, deterministic):
    return [x.new_empty(_grouped_shape(x, ptr, dim_size, dim, len(codes)))]


@custom_ops.graph_op("aggregation", ("x", "index", "ptr"), _aggregation_fake,
                     sizes=("dim_size",))
def _aggregation_op(_graph, x, index, ptr, *, codes, single, dim_size, dim, deterministic):
    return _reduction(tuple(codes), single, deterministic)(x, index, ptr, dim_size, dim)


_PARAMETRIC_KINDS = {"t": SoftmaxAggregation, "p": PowerMeanAggregation}


def _parametric_fake(_graph, x, index, ptr, param, *, dim_size, dim, **_):
    dtype = x.dtype if param is None else torch.result_type(x, param)
    return [x.new_empty(_grouped_shape(x, ptr, dim_size, dim, 1), dtype=dtype)]


@custom_ops.graph_op("parametric_aggregation", ("x", "index", "ptr", "param"),
                     _parametric_fake, sizes=("dim_size",))
def _parametric_op(_graph, x, index, ptr, param, *, kind, value, dim_size, dim, deterministic,
                   **options):
    grouped = _Grouped(x, index, ptr, dim_size, dim, deterministic)
    out = _PARAMETRIC_KINDS[kind]._reduce(grouped, value if param is None else param, **options)
    return grouped.restore(out)
