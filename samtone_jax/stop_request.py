"""A stop asked of a training run (SIGTERM on a preempted host, Ctrl-C) that long work inside a step's
hooks honours between its units of work, not only at the loop's step boundary.

loop.install_stop_flag sets it in a single-process run; the in-training eval checks it after each
encoding batch (text_embedder.encode_all; the last check comes right before its search), and raises
StopRequested, which the loop turns into a checkpoint of the last completed step within seconds.
Nothing sets it outside a training loop, so `samtone eval` / `encode` never see it. In a
multi-process run the hosts must stop at the same point of a collective program, so there the stop
stays at the step boundary that JAX's preemption service agrees on (loop.install_stop_flag).
"""

from __future__ import annotations

import threading

_requested = threading.Event()


class StopRequested(Exception):
    """Raised by check() once a stop is requested: the work in progress is abandoned."""


def request() -> None:
    _requested.set()


def clear() -> None:
    _requested.clear()


def requested() -> bool:
    return _requested.is_set()


def check() -> None:
    """Raise StopRequested when a stop has been requested (call between units of work)."""
    if _requested.is_set():
        raise StopRequested
