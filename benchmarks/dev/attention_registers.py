"""Developer probe (GPU): registers and local memory (spills) of the attention
kernels rmat20's 4 heads x 32 runs, as the device's own NVRTC/ptxas build
them (the compile check builds with the local NVRTC, which may differ).

    python benchmarks/dev/attention_registers.py
"""
from fastgnn.backends.cuda.loader import get_function

# heads of 32 at the widest vector (loader.ATTENTION_MAX_VEC: 8 lanes of 4
# values, or 4 lanes of 8 for 16-bit GAT backward passes)
NAMES = [f"{k}<{kind}, {t}, int, {vec}, 1, {grp}, false{extra}>"
         for t in ("float", "bf16_t")
         for kind in (0, 1, 2)
         for k, extra in (("attn_fwd", ""), ("attn_bwd_src", ""),
                          ("attn_bwd_dst", ", false, true" if kind == 1 else ", false, false"))
         for vec, grp in ([(8, 4)] if t == "bf16_t" and kind == 0 and k != "attn_fwd"
                          else [(4, 8)])]

if __name__ == "__main__":
    for name in NAMES:
        vtype = "float32" if ", float," in name else "bfloat16"
        fn = get_function("attention", vtype, "int32", name)
        print(f"{fn.num_regs:4d} regs {fn.local_size_bytes:4d} B local  {name}")
