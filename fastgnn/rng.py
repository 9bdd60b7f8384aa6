"""Counter-based random numbers: the same bits from NumPy, Numba and CUDA.

Dropout in fastgnn stores no mask. Every random decision is a pure function
of (seed, counter), so the backward pass (and any backend, and any number of
threads) regenerates exactly the forward's mask. The function is integer-only
and uses nothing but 64-bit unsigned add, multiply (mod 2^64), xor and shift,
so C, CUDA, NumPy and Numba compute it bit for bit alike. It is SplitMix64
(Steele, Lea & Flood 2014; the seeding generator of java.util.SplittableRandom
and of xoshiro) used as a counter-based generator:

    G  = 0x9E3779B97F4A7C15                     (the golden-ratio increment)
    mix64(z):  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
               z = (z ^ (z >> 27)) * 0x94D049BB133111EB
               return z ^ (z >> 31)                            (all mod 2^64)

    key(seed)        = mix64(seed + G)                         (computed once, on the host)
    bits(seed, n)    = mix64(key(seed) + (n + 1) * G)          (64 random bits)
    uniform(seed, n) = (bits(seed, n) >> 11) * 2^-53           (a double in [0, 1))

Dropout with probability p keeps an element iff uniform >= p, which is the
integer test `(bits >> 11) >= threshold(p)` with threshold(p) = ceil(p * 2^53)
(exact: p * 2^53 is exact in float64), and scales kept elements by 1/(1 - p).
The counter of attention weight (e, h) of an op with H heads is

    n = offset + e * H + h          (mod 2^64; e = the caller's edge id)

so a layer that calls an op repeatedly with one seed advances `offset` by
E * H per call (as PyTorch's Philox seed/offset pairs do), and the mask does
not depend on how the graph is stored.

Known answers (tests pin them; a CUDA twin must reproduce `KNOWN_ANSWERS`):
key(0) = 0xE220A8397B1DCDAF (SplitMix64's first output from state 0),
bits(0, 0) = 0xA706DD2F4D197E6F, bits(1, 0) = 0x5E41AB087439611E.
"""
from __future__ import annotations

import math

import numba
import numpy as np

GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
MASK64 = (1 << 64) - 1
TWO53 = 1 << 53

# (seed, n) -> bits(seed, n)
KNOWN_ANSWERS = {
    (0, 0): 0xA706DD2F4D197E6F,
    (0, 1): 0xB382A305F4414F5E,
    (1, 0): 0x5E41AB087439611E,
    (12345, 1 << 40): 0x06A3C5E36FD625B6,
    ((1 << 64) - 1, (1 << 64) - 1): 0x445018E305810B78,
}


# --------------------------------------------------------- host (Python int)
def mix64_int(z: int) -> int:
    """SplitMix64's finaliser on a Python int (mod 2^64)."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return z ^ (z >> 31)


def check_seed(value, name: str) -> int:
    """A seed or offset as a Python int in [0, 2^64); TypeError/ValueError naming `name`."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    value = int(value)
    if not 0 <= value <= MASK64:
        raise ValueError(f"{name} must be in [0, 2^64), got {value}")
    return value


def seed_key(seed: int) -> int:
    """key(seed) = mix64(seed + G): the per-seed constant kernels receive."""
    return mix64_int(check_seed(seed, "seed") + GOLDEN)


def drop_threshold(p: float) -> int:
    """ceil(p * 2^53): an element is kept iff (bits >> 11) >= this (p in [0, 1))."""
    return int(math.ceil(float(p) * TWO53))


def bits_int(seed: int, n: int) -> int:
    """bits(seed, n) on Python ints (the specification, for tests and docs)."""
    return mix64_int(seed_key(seed) + ((n + 1) * GOLDEN & MASK64))


# ------------------------------------------------------ NumPy (vectorised)
def _mix64_np(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX2)
    return z ^ (z >> np.uint64(31))


def random_bits(seed, counters):
    """bits(seed, n) for an integer array of counters n (uint64 array out)."""
    key = np.uint64(seed_key(seed))
    n = np.asarray(counters).astype(np.uint64)
    with np.errstate(over="ignore"):
        return _mix64_np(key + (n + np.uint64(1)) * np.uint64(GOLDEN))


def uniform(seed, counters):
    """uniform(seed, n) in [0, 1) (float64) for an integer array of counters."""
    return (random_bits(seed, counters) >> np.uint64(11)).astype(np.float64) * (1.0 / TWO53)


def attention_counters(num_edges: int, heads: int, offset: int = 0):
    """[E, H] uint64 counters offset + e * H + h (mod 2^64)."""
    offset = check_seed(offset, "offset")
    e = np.arange(num_edges, dtype=np.uint64)[:, None]
    h = np.arange(heads, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        return np.uint64(offset) + e * np.uint64(heads) + h


def keep_mask(seed, offset, num_edges: int, heads: int, p: float):
    """[E, H] bool dropout keep mask of attention weight (e, h), e the caller's
    edge id: what `edge_attention`/`edge_softmax` apply with these arguments
    (kept weights are then scaled by 1/(1-p)). All True for p = 0."""
    if p == 0:
        return np.ones((num_edges, heads), dtype=bool)
    b = random_bits(seed, attention_counters(num_edges, heads, offset))
    return (b >> np.uint64(11)) >= np.uint64(drop_threshold(p))


# ------------------------------------------------------------- Numba (CPU)
@numba.njit(inline="always")
def mix64_nb(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX2)
    return z ^ (z >> np.uint64(31))


@numba.njit(inline="always")
def keep_nb(key, offset, e, heads, h, threshold):
    """Numba twin of the keep test for weight (e, h); key, offset, threshold
    are uint64, e/heads/h any integers (cast to uint64 here: mixing signed
    and unsigned 64-bit integers in Numba would promote to float)."""
    n = np.uint64(offset) + np.uint64(e) * np.uint64(heads) + np.uint64(h)
    b = mix64_nb(np.uint64(key) + (n + np.uint64(1)) * np.uint64(GOLDEN))
    return (b >> np.uint64(11)) >= np.uint64(threshold)


@numba.njit(cache=True)
def _random_bits_nb(key, counters, out):
    for t in range(counters.shape[0]):
        out[t] = mix64_nb(np.uint64(key) + (np.uint64(counters[t]) + np.uint64(1))
                          * np.uint64(GOLDEN))


def random_bits_numba(seed, counters):
    """`random_bits` computed by the Numba twin (tests check they agree bitwise)."""
    c = np.ascontiguousarray(np.asarray(counters).astype(np.uint64).ravel())
    out = np.empty_like(c)
    _random_bits_nb(np.uint64(seed_key(seed)), c, out)
    return out.reshape(np.shape(counters))
