"""Opt-in layer cases: the rest of fastgnn.torch's PyG 2.8 drop-ins against
PyG's layers, F -> F features at the bench width.

    spmm family      GraphConv, SGConv, APPNP, TAGConv, LEConv, ClusterGCNConv,
                     ChebConv (nn_propagation.py); RGCNConv_8rel,
                     FastRGCNConv_8rel (nn_hetero.py)
    segment family   GINEConv, ResGatedGraphConv, GENConv, PNAConv
                     (nn_messages.py); SAGEConv_softmax, SAGEConv_powermean
                     (aggr.py's aggregations)
    attention family HGTConv (nn_hgt.py) on the bench graph made heterogeneous
                     (below)

They are not in the default suite (`Case.default` False): name them with
--layers (or --layers all). Each runs as cases_layers.py's cases do
(`drop_in_impls`): one set of float32 parameters, PyG's layer built with the
bench seed and loaded by name into fastgnn's; fastgnn on edge_index against
PyG on edge_index, on a CSR adj_t where PyG fuses message_and_aggregate
there, and on a sorted EdgeIndex where that is PyG's fused or segment path
(GraphConv; SAGEConv's softmax and power mean); the float32 reference is
PyG's layer on edge_index. A form PyG lacks for a layer (a CSR adj_t PyG
rejects, or runs through the edge_index path again) is listed as skipped
with the reason.

Further forward inputs, drawn once per (graph, dtype, width) from the bench
seed, in the graph's edge order:
    edge_attr [E, EDGE_DIM]  normal, in the bench dtype, no gradient
                             (GINEConv, GENConv, PNAConv: edge_dim=EDGE_DIM)
    edge_type [E]            uniform in 0 .. RELATIONS - 1 (the RGCN cases;
                             both are timed against PyG's RGCNConv and
                             FastRGCNConv, which share parameters)

HGTConv takes typed inputs: the bench graph's first half of the nodes is
node type "a", the rest "b", and edge e = (j -> i) has edge type
(type of j, f"r{edge_type[e] % HGT_RELATIONS}", type of i) (8 edge types);
x_dict holds views of x, edge_index_dict is made once per ctx, and the
output is the node types' outputs concatenated back into [N, F] (a wrapper
module, the same for both libraries).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .cases_layers import PYG_EDGE_INDEX, drop_in_impls, layer_reference
from .core import Case, register

EDGE_DIM = 16
RELATIONS = 8


def _drawn(ctx, what, draw):
    """draw(torch.Generator) once per ctx (seeded), kept in ctx.state."""
    key = ("layer_input", what)
    if key not in ctx.state:
        torch = ctx.torch
        gen = torch.Generator(device=ctx.device).manual_seed(ctx.seed + 5)
        ctx.state[key] = draw(gen)
    return ctx.state[key]


def edge_attr(ctx):
    """(edge_attr [E, EDGE_DIM] in the bench dtype,)"""
    torch = ctx.torch
    E = ctx.graph.edge_index.shape[1]
    return (_drawn(ctx, "edge_attr", lambda gen: torch.randn(
        E, EDGE_DIM, generator=gen, device=ctx.device).to(ctx.dtype)),)


def edge_type(ctx):
    """(edge_type [E] int64 in 0 .. RELATIONS - 1,)"""
    torch = ctx.torch
    E = ctx.graph.edge_index.shape[1]
    return (_drawn(ctx, "edge_type", lambda gen: torch.randint(
        0, RELATIONS, (E,), generator=gen, device=ctx.device)),)


HGT_NODE_TYPES = ("a", "b")
HGT_RELATIONS = 2
HGT_EDGE_TYPES = tuple((src, f"r{r}", dst) for src in HGT_NODE_TYPES for dst in HGT_NODE_TYPES
                       for r in range(HGT_RELATIONS))
HGT_METADATA = (list(HGT_NODE_TYPES), list(HGT_EDGE_TYPES))


def typed_graph(ctx):
    """(rows of node type "a", {edge type: edge_index [2, E_type]}) of the
    bench graph with `edge_type`, made once per ctx (see the module docstring)."""
    key = ("layer_input", "typed_graph")
    if key not in ctx.state:
        torch = ctx.torch
        ei, (relation,) = ctx.graph.edge_index, edge_type(ctx)
        half = ctx.graph.num_nodes // 2
        src_b, dst_b = (ei[0] >= half).long(), (ei[1] >= half).long()
        local = ei - half * torch.stack([src_b, dst_b])
        code = (src_b * 2 + dst_b) * HGT_RELATIONS + relation % HGT_RELATIONS
        ctx.state[key] = half, {et: local[:, code == c].contiguous()
                                for c, et in enumerate(HGT_EDGE_TYPES)}
    return ctx.state[key]


def _on_typed_graph(ctx, conv):
    """conv (an HGTConv) called as a homogeneous layer: forward(x [N, F],
    edge_index, edge_type) -> [N, out], on `typed_graph(ctx)`."""
    torch = ctx.torch
    half, edge_index_dict = typed_graph(ctx)

    class OnTypedGraph(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x, edge_index, relation):
            out = self.conv({"a": x[:half], "b": x[half:]}, edge_index_dict)
            return torch.cat([out["a"], out["b"]])
    return OnTypedGraph()


def _hgt(cls, ctx):
    heads = int(getattr(ctx, "heads", 4) or 4)
    return _on_typed_graph(ctx, cls(ctx.width, ctx.width, HGT_METADATA, heads=heads))


def in_degree_histogram(ctx):
    """PNAConv's `deg`: the bench graph's in-degree histogram, on the host."""
    torch = ctx.torch
    deg = torch.bincount(ctx.graph.edge_index[1], minlength=ctx.graph.num_nodes)
    return torch.bincount(deg).cpu()


def _mlp(torch, width):
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, width))


EDGE_ATTR_NOTE = f" + edge_attr [E, {EDGE_DIM}]"
EDGE_TYPE_NOTE = f" + edge_type [E] ({RELATIONS} relations)"
NOT_FUSED = ("PyG's {layer} has no fused message_and_aggregate: on a CSR adj_t it runs its "
             "edge_index path again")
AGGR_NOT_FUSED = ("PyG fuses message_and_aggregate for add/sum/mean/min/max only: on a CSR adj_t "
                  "SAGEConv(aggr={aggr!r}) runs its edge_index path again")
# how PyG's layer runs on edge_index, where not by PYG_EDGE_INDEX's message passing
PYG_ON_EDGE_INDEX = {
    "RGCNConv": "a propagate over each relation's masked edge_index, then h @ Theta_r (pyg_lib's "
                "segment_matmul instead where installed and its heuristic picks it)",
    "FastRGCNConv": "per-edge messages x_j Theta_(r_e): bmm with a gathered [E, F, F] weight, "
                    "scatter mean",
    "HGTConv": "k_rel/v_rel (HeteroLinear) on every edge type's source rows, one concatenated "
               "edge_index, per-edge scores q_i . k_j, softmax over each destination's in-edges, "
               "[E, heads, D] messages, scatter add"}
HGT_NO_CSR = ("HGTConv takes a graph input per edge type; PyG's turns each sparse adj_t into an "
              "edge_index (to_edge_index) and runs its edge_index path, so it has no fused path")
RGCN_NO_CSR = ("PyG 2.8's RGCNConv takes no torch.sparse adj_t (masking it by relation raises "
               "IndexError), and FastRGCNConv's messages depend on each edge's relation, so it "
               "has no fused path there")


@dataclass(frozen=True)
class LayerCase:
    """One opt-in layer case."""
    name: str                      # the case
    layer: str                     # class in torch_geometric.nn and fastgnn.torch
    family: str                    # "spmm", "segment" or "attention": the family carrying it
    settings: str                  # the constructor arguments as the report shows them
    description: str
    make: Callable                 # (class, ctx) -> the layer
    args: Callable | None = None   # ctx -> forward arguments after (x, edge_index)
    args_note: str = ""
    csr_skip: str | None = None    # why PyG's CSR adj_t form is not timed (None: it is)
    csc: str | None = None         # sorted EdgeIndex form ("fused" / "segment"), or None
    pyg_also: tuple = ()           # further PyG classes of the same function and parameters


def _relational(layer, other, description):
    """The case f"{layer}_{RELATIONS}rel": the relational layer on edge_type,
    PyG's `other` class (the same function and parameters) timed too."""
    return LayerCase(f"{layer}_{RELATIONS}rel", layer, "spmm",
                     f"F, F, num_relations={RELATIONS} (aggr='mean')", description,
                     lambda cls, ctx: cls(ctx.width, ctx.width, num_relations=RELATIONS),
                     args=edge_type, args_note=EDGE_TYPE_NOTE, csr_skip=RGCN_NO_CSR,
                     pyg_also=(other,))


LAYER_CASES = (
    LayerCase("GraphConv", "GraphConv", "spmm", "F, F (aggr='add')",
              "GraphConv: W_1 x_i + W_2 sum of neighbours",
              lambda cls, ctx: cls(ctx.width, ctx.width), csc="fused"),
    LayerCase("SGConv", "SGConv", "spmm", "F, F, K=2",
              "SGC: (D^-1/2 (A + I) D^-1/2)^2 X Theta",
              lambda cls, ctx: cls(ctx.width, ctx.width, K=2)),
    LayerCase("APPNP", "APPNP", "spmm", "K=10, alpha=0.1",
              "APPNP propagation: 10 steps of (1 - alpha) A_hat X + alpha X0 (no parameters)",
              lambda cls, ctx: cls(K=10, alpha=0.1)),
    LayerCase("TAGConv", "TAGConv", "spmm", "F, F, K=3",
              "TAGConv: sum_k (D^-1/2 A D^-1/2)^k X Theta_k, k = 0..3",
              lambda cls, ctx: cls(ctx.width, ctx.width, K=3)),
    LayerCase("LEConv", "LEConv", "spmm", "F, F",
              "LEConv: sum of neighbours (a_j - b_i) + W_3 x_i",
              lambda cls, ctx: cls(ctx.width, ctx.width),
              csr_skip=NOT_FUSED.format(layer="LEConv")),
    LayerCase("ClusterGCNConv", "ClusterGCNConv", "spmm", "F, F (diag_lambda=0)",
              "ClusterGCN: D^-1 (A + I) X W_1 + X W_2",
              lambda cls, ctx: cls(ctx.width, ctx.width)),
    LayerCase("ChebConv", "ChebConv", "spmm", "F, F, K=3",
              "Chebyshev filter: sum_k T_k(L_hat) X Theta_k, k = 0..2",
              lambda cls, ctx: cls(ctx.width, ctx.width, K=3),
              csr_skip="PyG 2.8's ChebConv takes no torch.sparse adj_t (it builds its "
                       "Laplacian from edge_index: NotImplementedError on a sparse tensor)"),
    _relational("RGCNConv", "FastRGCNConv",
                f"R-GCN, {RELATIONS} seeded relations: root + per-relation mean of x_j Theta_r"),
    _relational("FastRGCNConv", "RGCNConv",
                f"FastRGCNConv (RGCNConv's function), {RELATIONS} seeded relations"),
    LayerCase("GINEConv", "GINEConv", "segment",
              f"nn=Linear-ReLU-Linear (F, F), edge_dim={EDGE_DIM}",
              "GINE: MLP((1 + eps) x_i + sum of relu(x_j + W_e e_ji))",
              lambda cls, ctx: cls(_mlp(ctx.torch, ctx.width), edge_dim=EDGE_DIM),
              args=edge_attr, args_note=EDGE_ATTR_NOTE,
              csr_skip=NOT_FUSED.format(layer="GINEConv")),
    LayerCase("ResGatedGraphConv", "ResGatedGraphConv", "segment", "F, F",
              "Residual gated graph conv: W_1 x_i + sum of sigmoid(W_3 x_i + W_4 x_j) W_2 x_j",
              lambda cls, ctx: cls(ctx.width, ctx.width),
              csr_skip=NOT_FUSED.format(layer="ResGatedGraphConv")),
    LayerCase("GENConv", "GENConv", "segment",
              f"F, F, edge_dim={EDGE_DIM} (aggr='softmax', MLP with batch norm: PyG's defaults)",
              "GENConv (DeeperGCN): MLP(x_i + softmax-aggregated relu(x_j + W_e e_ji) + eps)",
              lambda cls, ctx: cls(ctx.width, ctx.width, edge_dim=EDGE_DIM),
              args=edge_attr, args_note=EDGE_ATTR_NOTE,
              csr_skip=NOT_FUSED.format(layer="GENConv")),
    LayerCase("PNAConv", "PNAConv", "segment",
              "F, F, aggregators=[mean, min, max, std], scalers=[identity, amplification, "
              f"attenuation], deg=the graph's in-degree histogram, edge_dim={EDGE_DIM}",
              "PNA: 4 aggregators x 3 degree scalers over Linear([x_i, x_j, W_e e_ji])",
              lambda cls, ctx: cls(ctx.width, ctx.width, ["mean", "min", "max", "std"],
                                   ["identity", "amplification", "attenuation"],
                                   in_degree_histogram(ctx), edge_dim=EDGE_DIM),
              args=edge_attr, args_note=EDGE_ATTR_NOTE,
              csr_skip=NOT_FUSED.format(layer="PNAConv")),
    LayerCase("HGTConv", "HGTConv", "attention",
              f"F, F, metadata=({len(HGT_NODE_TYPES)} node types, {len(HGT_EDGE_TYPES)} edge "
              "types), heads=H",
              f"HGT: typed K/Q/V, per-edge-type k_rel/v_rel/p_rel, softmax over all "
              f"{len(HGT_EDGE_TYPES)} edge types into a node, gelu + out_lin + skip gate",
              _hgt, args=edge_type, args_note=" as typed inputs (x_dict, edge_index_dict)",
              csr_skip=HGT_NO_CSR),
    LayerCase("SAGEConv_softmax", "SAGEConv", "segment", "F, F, aggr='softmax'",
              "GraphSAGE layer with softmax aggregation (t = 1) + root weight",
              lambda cls, ctx: cls(ctx.width, ctx.width, aggr="softmax"),
              csr_skip=AGGR_NOT_FUSED.format(aggr="softmax"), csc="segment"),
    LayerCase("SAGEConv_powermean", "SAGEConv", "segment",
              "F, F, aggr='powermean', aggr_kwargs={'learn': True}",
              "GraphSAGE layer with power-mean aggregation (learnt p) + root weight",
              lambda cls, ctx: cls(ctx.width, ctx.width, aggr="powermean",
                                   aggr_kwargs={"learn": True}),
              csr_skip=AGGR_NOT_FUSED.format(aggr="powermean"), csc="segment"),
)


def _maker(make, library, cls_name):
    """ctx -> make(<library>.<cls_name>, ctx); library "pyg" or "fastgnn"."""
    def build(ctx):
        if library == "pyg":
            from torch_geometric import nn as lib
        else:
            import fastgnn.torch as lib
        cls = getattr(lib, cls_name, None)
        if cls is None:
            raise NotImplementedError(f"{lib.__name__}.{cls_name} is not available")
        return make(cls, ctx)
    return build


def _pyg_note(cls_name):
    return PYG_ON_EDGE_INDEX.get(cls_name, PYG_EDGE_INDEX)


def register_layer_case(spec: LayerCase) -> Case:
    pyg_make = _maker(spec.make, "pyg", spec.layer)
    impls = drop_in_impls(
        spec.name, spec.settings, pyg_make, _maker(spec.make, "fastgnn", spec.layer),
        layer=spec.layer, args=spec.args, args_note=spec.args_note,
        pyg_note=_pyg_note(spec.layer), csr_skip=spec.csr_skip, csc=spec.csc,
        pyg_also=[(cls, _maker(spec.make, "pyg", cls), _pyg_note(cls)) for cls in spec.pyg_also])
    return register(Case(spec.name, "layer", spec.family, spec.description, impls,
                         layer_reference(spec.name, pyg_make, spec.args), default=False))


for _spec in LAYER_CASES:
    register_layer_case(_spec)
