"""Developer probe (GPU): where one eager training epoch of the training
bench's 2-layer models goes, fastgnn against PyG from the same weights.

Per (data set, model, framework) it prints the epoch's host ms (perf_counter
over back-to-back epochs, no sync), CUDA-event ms (what the training bench
reports), GPU kernel ms (torch.profiler, sum of device time), the per-epoch
counts of CUDA runtime calls that block or cost, the top kernels and, for
fastgnn, cProfile's top functions by own time. An
epoch whose event time is close to its host time and far above its kernel
time is host-bound.

    python benchmarks/dev/profile_training.py [data set] [model ...]
    python benchmarks/dev/profile_training.py tolokers GCN SAGE-mean GIN
"""
import cProfile
import pstats
import sys

import torch
from profile_layer_host import print_times   # benchmarks/dev/ (this folder)

from fastgnn.bench import cases_training as tr

HEADS = 4            # the training bench's default --heads
TOP = 25             # cProfile rows printed for the fastgnn epochs


def main(name="tolokers", models=("GCN", "SAGE-mean", "GIN")):
    dev = torch.device("cuda")
    data = tr.load_data(torch, dev, name)
    print(f"data set {name}: {data.x.shape[0]} nodes, {data.edge_index.shape[1]} edges, "
          f"{data.x.shape[1]} features, {data.classes} classes")
    for model_name in models:
        state = tr.master_state(torch, model_name, data, tr.HIDDEN, HEADS, 0)
        for framework in ("pyg", "fastgnn"):
            model = tr.build_model(framework, model_name, data.x.shape[1], tr.HIDDEN,
                                   data.classes, HEADS)
            model.load_state_dict(state, strict=True)
            model.to(dev).train()
            opt = torch.optim.Adam(model.parameters(), lr=tr.LR, weight_decay=tr.WEIGHT_DECAY)

            def epoch(model=model, opt=opt):
                tr.train_step(model, opt, data)

            for _ in range(5):
                epoch()
            print_times(f"{model_name} {framework}", epoch, 50, "epoch", top=8, profiled=10)
            if framework == "fastgnn":
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(50):
                    epoch()
                prof.disable()
                torch.cuda.synchronize()
                st = pstats.Stats(prof)
                print(f"   python function calls per epoch: {st.total_calls / 50:.0f}")
                st.sort_stats("tottime").print_stats(TOP)
            del model, opt


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0] if a else "tolokers", tuple(a[1:]) or ("GCN", "SAGE-mean", "GIN"))
