"""Numba kernel of fastgnn.reorder's cluster order.

label_propagation_round: one parallel task per node that moves this round;
each gathers its neighbours' labels and its own, sorts them (O(d log d)) and
takes the most frequent, ties broken by a hash of (label, round salt, node)
so that no label is favoured. Returns how many labels changed.
"""
import numba
import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


@numba.njit(inline="always")
def _mix(a, b):
    z = a ^ (b * _GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@numba.njit(parallel=True, cache=True)
def label_propagation_round(indptr, indices, labels, move, salt, out):
    n = labels.shape[0]
    changed = 0
    for i in numba.prange(n):
        cur = labels[i]
        if not move[i]:
            out[i] = cur
            continue
        s = indptr[i]
        m = indptr[i + 1] - s + 1
        buf = np.empty(m, np.int64)
        for k in range(m - 1):
            buf[k] = labels[indices[s + k]]
        buf[m - 1] = cur
        buf.sort()
        key = np.uint64(salt) ^ np.uint64(i)
        best = cur
        best_count = 0
        best_tie = np.uint64(0)
        k = 0
        while k < m:
            lab = buf[k]
            j = k + 1
            while j < m and buf[j] == lab:
                j += 1
            tie = _mix(np.uint64(lab), key)
            if j - k > best_count or (j - k == best_count and tie > best_tie):
                best = lab
                best_count = j - k
                best_tie = tie
            k = j
        out[i] = best
        if best != cur:
            changed += 1
    return changed
