"""Choices measured once per size class and reused by every graph of the class.

Some launch choices have no rule that is right on every graph: SpMM's task
size or cuSPARSE algorithm (`spmm.choose`), the segment backward's walk
(`segment._timed_bwd_plan`). They are timed on the first graph that needs
them, and the answer is kept for its *size class*, not for that graph
object: training on sampled mini-batches or batches of small graphs brings
a new graph every step, and timing candidates per graph cost milliseconds a
step. A graph of a known class takes the class's answer with no timing.

The class of a graph is the octave (bit length) of its edge count and of
its mean in-degree: the two sizes the candidates' speed follows (how many
tasks there are, how long a row is). Sampled batches from one loader differ
by a few per cent in size and fall in one or two classes. Each request key
(the op, its feature width, value type and options) is kept per class and
CUDA device.
"""
from __future__ import annotations

import threading

_decided: dict = {}
_lock = threading.Lock()
# decisions kept at most (a process meets few classes; this only bounds a
# pathological stream of widths)
MAX_DECISIONS = 4096


def size_class(graph) -> tuple:
    """(octave of the edge count, octave of the mean in-degree) of `graph`."""
    E = int(graph.num_edges)
    return E.bit_length(), (E // max(1, int(graph.num_dst))).bit_length()


def decided(key: tuple, graph, device):
    """The decision kept for request `key` on `graph`'s size class and
    `device`, or None when none was made yet."""
    return _decided.get((key, size_class(graph), device))


def decide(key: tuple, graph, device, value):
    """Keep `value` as the decision for request `key` on `graph`'s size
    class and `device`; returns it."""
    with _lock:
        if len(_decided) >= MAX_DECISIONS:
            _decided.clear()
        _decided[(key, size_class(graph), device)] = value
    return value


def clear():
    """Forget every decision (they are measured again on the next graph)."""
    with _lock:
        _decided.clear()
