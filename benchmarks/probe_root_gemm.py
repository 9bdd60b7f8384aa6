"""Developer probe (GPU): forms of a SAGE layer's fp32 GEMMs at N = 2^20, F = 128
(TF32 off), CUDA events, median of 20, three rounds:

  root term   out += x W_r^T   (out [N, F] already holds the first linear):
              out.addmm_ (cuBLAS, beta = 1), the transposed problem
              out.t().addmm_(W_r, x.t()), cupy.cublas.gemm with beta = 1,
              and the plain product alone (x W_r^T, no accumulation) for scale
  weight grads  g^T a and g^T x as two mm calls, and as one bmm over a
              stacked [2, N, F] operand (what one buffer holding both would give)

    cd benchmarks && python probe_root_gemm.py
"""
import cupy
import torch

from profile_layer_host import event_ms

N, F = 1 << 20, 128
dev = "cuda"
x, a, g, out = (torch.randn(N, F, device=dev) for _ in range(4))
w = torch.randn(F, F, device=dev)
wt = w.t()
x_cp, w_cp, out_cp = (cupy.from_dlpack(t) for t in (x, w, out))
stacked = torch.stack([a, x])                      # [2, N, F]
g2 = g.expand(2, N, F)


def cupy_gemm():
    cupy.cublas.gemm("N", "T", x_cp, w_cp, out=out_cp, alpha=1.0, beta=1.0)   # x W^T + out


forms = {
    "root: out.addmm_(x, W^T)": lambda: out.addmm_(x, wt),
    "root: out.t().addmm_(W, x^T)": lambda: out.t().addmm_(w, x.t()),
    "root: cupy.cublas.gemm beta=1": cupy_gemm,
    "plain: F.linear(x, W)": lambda: torch.nn.functional.linear(x, w),
    "plain: F.linear(x, W, 0) (Lt)": lambda: torch.nn.functional.linear(x, w, x.new_zeros(F)),
    "wgrad: g^T a, g^T x (two mm)": lambda: (g.t().mm(a), g.t().mm(x)),
    "wgrad: bmm over [2, N, F]": lambda: torch.bmm(g2.transpose(1, 2), stacked),
    "wgrad: g^T [a|x] (one mm, cat'd)": None,
}
cat = torch.cat([a, x], 1)
forms["wgrad: g^T [a|x] (one mm, cat'd)"] = lambda: g.t().mm(cat)
with torch.no_grad():
    for rnd in range(3):
        for name, fn in forms.items():
            try:
                print(f"round {rnd}  {name:36s} {event_ms(fn, 20):.3f} ms", flush=True)
            except Exception as e:              # noqa: BLE001  (a probe: report and go on)
                print(f"round {rnd}  {name:36s} failed: {type(e).__name__}: {e}", flush=True)
