"""fastgnn.backends.cuda.launch.Kernel packs each argument into one 64-bit
word (the GPU tests launch every kernel through it); here the packing and the
fall-back to CuPy's call, with the driver call replaced by a recorder."""
import ctypes
import struct

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
pytest.importorskip("cupy_backends.cuda.api.driver")

from fastgnn.backends.cuda import launch  # noqa: E402


class _FakeRaw:
    """Stands in for a CuPy RawKernel: a kernel pointer and a call that records."""

    class kernel:
        ptr = 1234

    def __init__(self):
        self.calls = []

    def __call__(self, grid, block, args, shared_mem=0):
        self.calls.append((grid, block, args, shared_mem))


def _kernel_with_recorder(monkeypatch):
    k = launch.Kernel(_FakeRaw())
    seen = []

    def fake_launch(ptr, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        n = 6
        addrs = (ctypes.c_uint64 * n).from_address(params)          # the pointer array
        words = [ctypes.c_uint64.from_address(a).value for a in addrs]
        seen.append(((ptr, gx, gy, gz, bx, by, bz, smem, extra), words))
    k._launch = fake_launch
    monkeypatch.setattr(cupy.cuda, "get_current_stream",
                        lambda: type("S", (), {"ptr": 0})())
    return k, seen


def test_scalars_are_packed_as_the_kernel_reads_them(monkeypatch):
    k, seen = _kernel_with_recorder(monkeypatch)
    args = (np.int32(-7), np.int64(-2), np.uint64(2 ** 63 + 5), np.float32(1.5),
            np.float64(-2.25), np.int32(3))
    k((5, 2), 256, args, shared_mem=64)
    (meta, words), = seen
    assert meta == (1234, 5, 2, 1, 256, 1, 1, 64, 0)
    assert k.raw.calls == []
    as_i32 = lambda w: struct.unpack("<i", struct.pack("<Q", w)[:4])[0]   # noqa: E731
    assert as_i32(words[0]) == -7 and as_i32(words[5]) == 3
    assert struct.unpack("<q", struct.pack("<Q", words[1]))[0] == -2
    assert words[2] == 2 ** 63 + 5
    assert struct.unpack("<f", struct.pack("<Q", words[3])[:4])[0] == 1.5
    assert struct.unpack("<d", struct.pack("<Q", words[4]))[0] == -2.25


def test_other_argument_types_go_through_cupys_call(monkeypatch):
    k, seen = _kernel_with_recorder(monkeypatch)
    k(1, 32, (np.int32(1), 7, np.bool_(True)))           # a Python int
    assert seen == [] and len(k.raw.calls) == 1
