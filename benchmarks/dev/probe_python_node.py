"""Developer probe (GPU): what one Python autograd node costs a training
step on CUDA, where autograd runs its backward on the device thread.

1. A chain of C++ ops (x * 2, summed) with and without an identity Python
   autograd.Function in it: host us per fwd+bwd, autograd multithreading on
   and off.
2. The training bench's 2-layer models on a small data set, eager epochs,
   host ms per epoch (perf_counter over back-to-back epochs, then a sync):
   PyG, PyG with an identity Python node after each conv, and fastgnn, each
   with multithreading on and off.

    python benchmarks/dev/probe_python_node.py [data set] [model ...]
"""
import statistics
import sys
import time

import torch

from fastgnn.bench import cases_training as tr


class Ident(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def host_us(fn, calls, blocks=7):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(best)


def both(fn, calls):
    out = []
    for mt in (True, False):
        torch.autograd.set_multithreading_enabled(mt)
        out.append(host_us(fn, calls))
    torch.autograd.set_multithreading_enabled(True)
    return out


def chain(n_nodes, python):
    x = torch.randn(1024, 64, device="cuda", requires_grad=True)

    def step():
        y = x
        for _ in range(n_nodes):
            y = y * 2
            if python:
                y = Ident.apply(y)
        y.sum().backward()
    return step


def main(name="Cora", models=("GCN", "SAGE-mean", "GIN")):
    print("chain of C++ ops, host us per fwd+bwd: multithreading on / off")
    for n in (1, 2, 4):
        for py in (False, True):
            on, off = both(chain(n, py), 200)
            print(f"  {n} x (mul{' + Python identity' if py else ''}): {on:8.1f} / {off:8.1f}")
    dev = torch.device("cuda")
    data = tr.load_data(torch, dev, name)
    print(f"data set {name}; host ms per epoch: multithreading on / off")
    for model_name in models:
        state = tr.master_state(torch, model_name, data, tr.HIDDEN, 4, 0)
        for framework, hook in (("pyg", False), ("pyg", True), ("fastgnn", False)):
            model = tr.build_model(framework, model_name, data.x.shape[1], tr.HIDDEN,
                                   data.classes, 4)
            model.load_state_dict(state, strict=True)
            model.to(dev).train()
            if hook:
                for m in model.modules():
                    if m is not model and hasattr(m, "propagate"):
                        m.register_forward_hook(lambda _m, _i, out: Ident.apply(out))
            opt = torch.optim.Adam(model.parameters(), lr=tr.LR, weight_decay=tr.WEIGHT_DECAY)
            on, off = both(lambda: tr.train_step(model, opt, data), 30)
            tag = framework + (" + Python identity per conv" if hook else "")
            print(f"  {model_name:10s} {tag:34s} {on / 1e3:7.3f} / {off / 1e3:7.3f}")


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0] if a else "Cora", tuple(a[1:]) or ("GCN", "SAGE-mean", "GIN"))
