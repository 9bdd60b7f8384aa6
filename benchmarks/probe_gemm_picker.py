"""Developer probe (GPU): does gemm.py's one-time choice between cuBLAS and
cuBLASLt forms of the layers' products (x W^T, g W) come out the same on
every fresh timing, and does it agree with a longer timing of both forms
(CUDA events, median of 20, three times)? 2^20 x 128 fp32.

    cd benchmarks && python probe_gemm_picker.py
"""
import torch, statistics
from fastgnn.torch import gemm
from profile_layer_host import event_ms
N, F = 1 << 20, 128
g = torch.randn(N, F, device="cuda"); w = torch.randn(F, F, device="cuda"); x = torch.randn(N, F, device="cuda")
for trial in range(6):
    gemm._lt_wins.clear()
    gemm.g_w(g, w); gemm.x_wt(x, w)
    print("trial", trial, {k[-1]: v for k, v in gemm._lt_wins.items()}, flush=True)
blas = lambda: g.mm(w)
lt = lambda: torch.nn.functional.linear(g, w.t().contiguous(), g.new_zeros(F))
for _ in range(3):
    print("g_w blas %.3f lt %.3f ms" % (event_ms(blas, 20), event_ms(lt, 20)))
blas = lambda: torch.nn.functional.linear(x, w)
lt = lambda: torch.nn.functional.linear(x, w, x.new_zeros(F))
for _ in range(3):
    print("x_wt blas %.3f lt %.3f ms" % (event_ms(blas, 20), event_ms(lt, 20)))
