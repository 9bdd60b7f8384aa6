"""Kernel launches through the CUDA driver with the arguments packed into one
reused buffer: what a launch costs the host on small graphs.

CuPy's `RawKernel.__call__` converts each argument into a CuPy parameter
object before `cuLaunchKernel`: about 23 us for the ~25 arguments of a
segment or attention kernel on the H200's host
(benchmarks/results/probe_op_host_soc-brightkite_h200_session9.log), while
a forward+backward of one op on a 0.4 M-edge graph makes 4-6 launches and
costs ~350 us of host time in all. Here every argument becomes one 64-bit
word of a per-thread buffer (pointer, integer or float bits; a 32-bit
parameter reads the low half, which is where a little-endian store put it)
and `cupy_backends...driver.launchKernel` gets the address of a fixed array
of pointers to those words: one list comprehension and one driver call.

Kernel arguments are what the launchers pass: CuPy arrays, NumPy integer and
float scalars (np.int32, np.int64, np.uint64, np.float32, np.float64). Any
other argument type makes that launch go through CuPy's own call, which
handles everything.
"""
from __future__ import annotations

import threading

import numpy as np

_MASK64 = (1 << 64) - 1
MAX_ARGS = 64


def _to_word_table(cupy):
    return {
        cupy.ndarray: lambda a: a.data.ptr,
        np.int32: lambda a: int(a) & _MASK64,
        np.int64: lambda a: int(a) & _MASK64,
        np.uint64: int,
        np.uint32: int,
        np.float32: lambda a: int(a.view(np.uint32)),
        np.float64: lambda a: int(a.view(np.uint64)),
    }


class _Buffers(threading.local):
    """Per thread (autograd's device thread launches too): the words and the
    array of their addresses that cuLaunchKernel reads before it returns."""

    def __init__(self):
        self.words = np.zeros(MAX_ARGS, dtype=np.uint64)
        self.params = (np.arange(MAX_ARGS, dtype=np.uint64) * np.uint64(8)
                       + np.uint64(self.words.ctypes.data))
        self.params_ptr = self.params.ctypes.data


_buffers = _Buffers()


def _dims(d):
    if isinstance(d, int):
        return d, 1, 1
    d = tuple(d) + (1, 1)
    return int(d[0]), int(d[1]), int(d[2])


class Kernel:
    """A compiled kernel (CuPy RawKernel `raw`, for the current device),
    called as CuPy's: kernel(grid, block, args, shared_mem=0), on CuPy's
    current stream."""

    __slots__ = ("raw", "ptr", "_word", "_cupy", "_launch")

    def __init__(self, raw):
        import cupy
        from cupy_backends.cuda.api import driver
        self.raw = raw
        self.ptr = raw.kernel.ptr
        self._cupy = cupy
        self._word = _to_word_table(cupy)
        self._launch = driver.launchKernel

    def __call__(self, grid, block, args, shared_mem=0):
        word = self._word
        try:
            words = [word[type(a)](a) for a in args]
        except KeyError:                 # an argument type of CuPy's own
            return self.raw(grid, block, args, shared_mem=shared_mem)
        if len(words) > MAX_ARGS:
            return self.raw(grid, block, args, shared_mem=shared_mem)
        buf = _buffers
        buf.words[:len(words)] = words
        gx, gy, gz = _dims(grid)
        bx, by, bz = _dims(block)
        self._launch(self.ptr, gx, gy, gz, bx, by, bz, shared_mem,
                     self._cupy.cuda.get_current_stream().ptr, buf.params_ptr, 0)
