"""Developer probe (GPU): forms of a SAGE layer's fp32 GEMMs at N = 2^20, F = 128
(TF32 off), CUDA events, median of 20, three rounds:

  root term   out += x W_r^T   (out [N, F] already holds the first linear):
              out.addmm_ (cuBLAS, beta = 1), the transposed problem
              out.t().addmm_(W_r, x.t()), the rows in 2 or 4 chunks, out.addmm_
              with torch's preferred BLAS library set to cuBLASLt, and the
              plain product alone (x W_r^T, no accumulation) for scale
  weight grads  g^T a and g^T x as two mm calls, and as one mm over [a | x]
              (what one buffer holding both would give; a bmm over a stacked
              [2, N, F] operand took 33 ms in session 13's first run)

    cd benchmarks && python probe_root_gemm.py
"""
import torch

from profile_layer_host import event_ms

N, F = 1 << 20, 128
dev = "cuda"
x, a, g, out = (torch.randn(N, F, device=dev) for _ in range(4))
w = torch.randn(F, F, device=dev)
wt = w.t()


def chunked(k):
    def run():
        for o, xc in zip(out.chunk(k), x.chunk(k)):
            o.addmm_(xc, wt)
    return run


def with_lt():
    prev = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        out.addmm_(x, wt)
    finally:
        torch.backends.cuda.preferred_blas_library(prev)


forms = {
    "root: out.addmm_(x, W^T)": lambda: out.addmm_(x, wt),
    "root: out.t().addmm_(W, x^T)": lambda: out.t().addmm_(w, x.t()),
    "root: 2 row chunks": chunked(2),
    "root: 4 row chunks": chunked(4),
    "root: addmm_ with cuBLASLt preferred": with_lt,
    "plain: F.linear(x, W)": lambda: torch.nn.functional.linear(x, w),
    "plain: F.linear(x, W, 0) (Lt)": lambda: torch.nn.functional.linear(x, w, x.new_zeros(F)),
    "wgrad: g^T a, g^T x (two mm)": lambda: (g.t().mm(a), g.t().mm(x)),
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
