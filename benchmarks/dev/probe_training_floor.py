"""Developer probe (GPU): how fast an eager training epoch could be if
fastgnn's graph ops cost nothing, against PyG's and fastgnn's epochs.

"floor": the fastgnn model with its SpMM calls (GCNConv, SAGEConv with a
sum/mean aggregation, GINConv) replaced by the identity (plus the bias add
where the SpMM would fuse it): what remains is torch's own work (linears,
activations, dropout, loss, their backward, Adam) and fastgnn's layer code
in Python. PyG ms / floor ms bounds the speedup over PyG that any SpMM
could give in eager mode. CUDA events around each epoch, median of 40
after 10 warm-up epochs, the training bench's models and data.

    python benchmarks/dev/probe_training_floor.py [data set ...]
"""
import sys

import torch

from fastgnn.bench import cases_training as tr
from fastgnn.bench.core import time_calls
from fastgnn.torch import nn as fnn

MODELS = ("GCN", "SAGE-mean", "GIN")


def epoch_ms(model, opt, data, epochs=40, warmup=10):
    return time_calls(torch, lambda: tr.train_step(model, opt, data), repeats=epochs,
                      warmup=warmup, cuda=True)[0]


def _free_spmm(graph, x, weight=None, bias=None, **kw):
    return x if bias is None else x + bias


def main(names=("Cora", "tolokers")):
    dev = torch.device("cuda")
    print("data set   model      PyG ms  fastgnn ms  floor ms  PyG/fastgnn  PyG/floor")
    for name in names:
        data = tr.load_data(torch, dev, name)
        for model_name in MODELS:
            state = tr.master_state(torch, model_name, data, tr.HIDDEN, 4, 0)
            ms = {}
            for kind in ("pyg", "fastgnn", "floor"):
                model = tr.build_model("pyg" if kind == "pyg" else "fastgnn", model_name,
                                       data.x.shape[1], tr.HIDDEN, data.classes, 4)
                model.load_state_dict(state, strict=True)
                model.to(dev).train()
                opt = torch.optim.Adam(model.parameters(), lr=tr.LR,
                                       weight_decay=tr.WEIGHT_DECAY)
                saved = fnn._spmm_bias, fnn.spmm
                if kind == "floor":
                    fnn._spmm_bias = lambda graph, x, weight, bias, **kw: _free_spmm(
                        graph, x, bias=bias)
                    fnn.spmm = lambda graph, x, weight=None, **kw: x
                try:
                    ms[kind] = epoch_ms(model, opt, data)
                finally:
                    fnn._spmm_bias, fnn.spmm = saved
            print(f"{name:10} {model_name:10} {ms['pyg']:7.3f} {ms['fastgnn']:10.3f} "
                  f"{ms['floor']:9.3f} {ms['pyg'] / ms['fastgnn']:11.2f} "
                  f"{ms['pyg'] / ms['floor']:10.2f}")


if __name__ == "__main__":
    main(tuple(sys.argv[1:]) or ("Cora", "tolokers"))
