"""Developer probe (GPU): the bias gradient sum_i g[i] of a [N, F] cotangent
in the forms torch and fastgnn offer, GPU time (CUDA events, median of 20
after a warm-up) and host time per call (200 calls enqueued back to back,
one synchronisation), per N, F = 128, fp32 and bf16. One line per form.

    python benchmarks/dev/probe_bias_grad.py [F]
"""
import sys

import torch

import fastgnn
from fastgnn.torch import functional as tf
from profile_layer_host import event_ms, host_ms   # benchmarks/dev/ (this folder)


def column_sum(g):
    """fastgnn.column_sum on a torch tensor (bias_grad's form where the GEMV does not apply)."""
    bf16 = g.dtype == torch.bfloat16
    with tf.device_scope(g.device):
        return tf.to_tensor(fastgnn.column_sum(tf.to_array(g), vtype="bfloat16" if bf16 else None),
                            bf16)


def main(F=128):
    dev = torch.device("cuda")
    forms = {
        "torch g.sum(0)": lambda g, ones: g.sum(0),
        "torch mv(g.t(), ones)": lambda g, ones: torch.mv(g.t(), ones),
        "torch ones @ g": lambda g, ones: ones @ g,
        "fastgnn column_sum": lambda g, ones: column_sum(g),
        "adapter bias_grad": lambda g, ones: tf.bias_grad(g),
    }
    print(f"bias gradient of g [N, {F}]: GPU ms (median of 20) / host us per call")
    for dtype in (torch.float32, torch.bfloat16):
        for log_n in (15, 16, 17, 18, 20):
            n = 1 << log_n
            g = torch.randn(n, F, device=dev, dtype=dtype)
            ones = torch.ones(n, device=dev, dtype=dtype)
            ref = g.double().sum(0)
            cells = []
            for name, fn in forms.items():
                err = (fn(g, ones).double() - ref).abs().max().item()
                def step():
                    fn(g, ones)
                step()
                cells.append(f"{name} {event_ms(step, 20):.4f} ms "
                             f"{host_ms(step, 200)[0] * 1e3:.1f} us err {err:.1e}")
            print(f"{str(dtype)[6:]:8s} N=2^{log_n}: " + " | ".join(cells))


if __name__ == "__main__":
    main(*map(int, sys.argv[1:2]))
