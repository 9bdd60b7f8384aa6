"""Array plumbing shared by every module: which namespace an array lives in,
DLPack conversion, and the value types fastgnn understands.

NumPy arrays select the CPU backend, CuPy arrays the CUDA backend. Anything
else that speaks DLPack (torch, jax) is converted once, without a copy, at the
public boundary. Nothing here touches the GPU at import time.
"""
from __future__ import annotations

import numpy as np

# Value types by name. CuPy has no bfloat16 dtype: bf16 data travels as raw
# 16-bit buffers (uint16/int16 views) with vtype="bfloat16" said explicitly.
VALUE_TYPES = ("float32", "float64", "float16", "bfloat16")
CPU_VALUE_TYPES = ("float32", "float64")
_VTYPE_OF_DTYPE = {np.dtype(n): n for n in ("float32", "float64", "float16")}


def cupy_or_none():
    """The cupy module if it imports, else None (never raises)."""
    try:
        import cupy  # noqa: F401
    except Exception:  # ImportError, or a broken CUDA install
        return None
    return cupy


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    cp = cupy_or_none()
    if cp is None:
        return False
    try:
        return bool(cp.cuda.is_available())
    except Exception:
        return False


def is_cupy(a) -> bool:
    return type(a).__module__.startswith("cupy")


def is_numpy(a) -> bool:
    return isinstance(a, np.ndarray)


def xp_of(a):
    """The array namespace (numpy or cupy) of a backend array."""
    if is_cupy(a):
        import cupy
        return cupy
    return np


def host_ints(*values):
    """The values of 0-d integer arrays of one backend as Python ints, in one
    copy to the host (on a GPU, one synchronisation for all of them)."""
    xp = next((xp_of(v) for v in values if is_cupy(v)), np)
    stacked = xp.stack([xp.asarray(v).astype(np.int64, copy=False) for v in values])
    return tuple(int(v) for v in (stacked.get() if is_cupy(stacked) else stacked))


def as_backend_array(a, name: str):
    """Return `a` as a NumPy or CuPy array, converting DLPack producers
    (torch, jax, ...) without a copy. Raises TypeError naming `name`."""
    if a is None:
        return None
    if is_numpy(a) or is_cupy(a):
        return a
    if hasattr(a, "__dlpack__") and hasattr(a, "__dlpack_device__"):
        dev_type, _ = a.__dlpack_device__()
        if int(dev_type) == 1:  # kDLCPU
            return np.from_dlpack(a)
        if int(dev_type) in (2, 3):  # kDLCUDA, kDLCUDAHost
            cp = cupy_or_none()
            if cp is None:
                raise TypeError(f"{name} is a CUDA array but CuPy is not installed; "
                                "install fastgnn[cuda13] or fastgnn[cuda12]")
            return cp.from_dlpack(a)
        raise TypeError(f"{name} lives on DLPack device type {int(dev_type)}; "
                        "fastgnn supports CPU and CUDA arrays")
    if isinstance(a, (list, tuple)):
        return np.asarray(a)
    raise TypeError(f"{name} must be a NumPy, CuPy or DLPack array, got {type(a).__name__}")


def data_ptr(a):
    """Address of a NumPy/CuPy array's first byte, or None for anything else."""
    if isinstance(a, np.ndarray):
        return a.__array_interface__["data"][0]
    data = getattr(a, "data", None)
    return getattr(data, "ptr", None)


def same_device(a, b) -> bool:
    if is_cupy(a) != is_cupy(b):
        return False
    if is_cupy(a):
        return a.device.id == b.device.id
    return True


def device_name(a) -> str:
    return f"cuda:{a.device.id}" if is_cupy(a) else "cpu"


def vtype_of(a, vtype: str | None, name: str) -> str:
    """The value type of a feature array: its dtype's name, or `vtype` when
    given (needed for bfloat16, which travels as 16-bit integers)."""
    if vtype is not None:
        if vtype not in VALUE_TYPES:
            raise ValueError(f"vtype must be one of {VALUE_TYPES}, got {vtype!r}")
        expected = np.dtype(np.uint16).itemsize if vtype == "bfloat16" else np.dtype(vtype).itemsize
        if a.dtype.itemsize != expected:
            raise TypeError(f"{name} has dtype {a.dtype} but vtype={vtype!r} needs "
                            f"{expected}-byte elements")
        if vtype != "bfloat16" and a.dtype != np.dtype(vtype):
            raise TypeError(f"{name} has dtype {a.dtype}, vtype says {vtype}")
        return vtype
    name_ = _VTYPE_OF_DTYPE.get(a.dtype)
    if name_ is None:
        raise TypeError(f"{name} must be a floating-point array (float32, float64, float16, "
                        f"or 16-bit data with vtype='bfloat16'), got dtype {a.dtype}")
    return name_


def backend_vtype(a, vtype: str | None, name: str) -> str:
    """`vtype_of`, refusing value types the CPU backend cannot run on NumPy
    arrays (TypeError naming `name`)."""
    vt = vtype_of(a, vtype, name)
    if not is_cupy(a) and vt not in CPU_VALUE_TYPES:
        raise TypeError(f"{name}: the CPU backend supports {CPU_VALUE_TYPES}, got {vt}; "
                        "cast to float32 or run on the GPU")
    return vt


def check_deterministic(value, where=""):
    """The `deterministic` switch of the attention and reduction families as a
    bool; TypeError naming it otherwise (`where`: a prefix for the message,
    e.g. the layer's name)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{where}deterministic must be a bool, got {type(value).__name__}")
    return bool(value)
