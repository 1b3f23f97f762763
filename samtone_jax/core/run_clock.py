"""When this command started: the reference of the training log's time to first step.

Set when samtone_jax is imported (a new process: its imports are counted), and again when a `samtone`
mode starts in a process that runs several (experiments call cli.main in one process), so the time
to first step always covers reading the config, the data and the model and compiling the step.
"""

from __future__ import annotations

import time

_started = time.time()


def restart() -> None:
    global _started
    _started = time.time()


def seconds() -> float:
    """Seconds since the command started."""
    return time.time() - _started
