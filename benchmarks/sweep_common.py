"""What the developer sweeps (sweep_attention.py, sweep_segment.py) share:
variants are NVRTC define strings (FASTGNN_NVRTC_OPTIONS, "" = defaults) or
"maxvec=N", the defaults with the family's vectors capped at N values."""
import os

from fastgnn.backends.cuda import loader

MAXVEC = "maxvec="


def defines_to_prewarm(variants):
    """The define strings whose modules the sweep compiles up front ([""] if
    only maxvec variants: they compile the defaults in-process)."""
    return [v for v in variants if not v.startswith(MAXVEC)] or [""]


def enter_variant(variant, cap_vec):
    """Make `variant` current: cap_vec(N) for "maxvec=N" (cap_vec(0) for a
    define string, restoring the family's vectors), the NVRTC options, and
    no compiled module left from the previous variant."""
    cap = int(variant[len(MAXVEC):]) if variant.startswith(MAXVEC) else 0
    cap_vec(cap)
    os.environ["FASTGNN_NVRTC_OPTIONS"] = "" if cap else variant
    loader.clear_compiled()
