"""A stop asked of a training run (SIGTERM on a preempted host, Ctrl-C) that long work inside a step's
hooks honours between its units of work, not only at the loop's step boundary.

loop.install_stop_flag sets it in a single-process run; the in-training eval checks it after each
encoding batch (text_embedder.encode_all; the last check comes right before its search), and raises
StopRequested, which the loop turns into a checkpoint of the last completed step within seconds.
Nothing sets it outside a training loop, so `samtone eval` / `encode` never see it.

In a multi-process run the hosts must stop at the same point of their collective programs: a host
that leaves the eval while the others still encode waits forever in a collective. There the loop
installs an agreement instead of the flag (agree_with): every check, at a step boundary or between
encoding batches, counts one, and stops exactly when JAX's preemption service says the count is the
sync point it chose for all hosts (max of their counts + 1, reached_preemption_sync_point, T5X's
protocol with a finer counter). The in-training eval encodes the same batches on every host (one
global mesh), so the hosts make the same checks in the same order and stop at the same one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

_requested = threading.Event()
_agreed: Callable[[], bool] | None = None  # a multi-process run's agreement (loop.install_stop_flag)


class StopRequested(Exception):
    """Raised by check() once a stop is requested: the work in progress is abandoned."""


def request() -> None:
    _requested.set()


def clear() -> None:
    _requested.clear()


def requested() -> bool:
    return _requested.is_set()


def agree_with(agreed: Callable[[], bool] | None) -> None:
    """Decide stops by `agreed()` (called once a check, on every host in the same order) instead of
    the flag; None: back to the flag."""
    global _agreed
    _agreed = agreed


def should_stop() -> bool:
    """Whether to stop here: the flag (one process), or the hosts' agreement (counts one check)."""
    return _agreed() if _agreed is not None else _requested.is_set()


def check() -> None:
    """Raise StopRequested when the work in progress must stop (call between units of work)."""
    if should_stop():
        raise StopRequested
