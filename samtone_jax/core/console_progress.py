"""Progress of long work on the console: done / total, rate and ETA, on stderr of process 0.

`samtone eval`, `encode` and `mine` spend minutes encoding a corpus. On a terminal the line is a
tqdm bar redrawn in place; anywhere else (a pod's log, `nohup`, CI) it is a plain line every
`every_s` seconds and one at the end, so the log shows that work is moving without flooding it:

    encoding documents: 40,960/117,659 texts (34.8%), 412 texts/s, ETA 3m06s
"""

from __future__ import annotations

import sys
import time


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """`with Progress(total, "encoding documents") as p: ... p.update(n)`. Silent on processes
    other than 0 and for total 0. `stream` (stderr), `clock` (time.monotonic) and `every_s` are
    for tests and quiet logs."""

    def __init__(
        self,
        total: int,
        description: str,
        unit: str = "texts",
        *,
        every_s: float = 30.0,
        stream=None,
        clock=time.monotonic,
        process_index: int | None = None,
    ):
        if process_index is None:
            import jax

            process_index = jax.process_index()
        self.total, self.description, self.unit = int(total), description, unit
        self.stream = sys.stderr if stream is None else stream
        self.every_s, self.clock = every_s, clock
        self.enabled = process_index == 0 and self.total > 0
        self.done = 0
        self._bar = None
        self._start = self._last = clock()
        if self.enabled and _is_terminal(self.stream):
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.total,
                desc=description,
                unit=unit.rstrip("s") or unit,
                file=self.stream,
                mininterval=1,
                dynamic_ncols=True,
            )

    def line(self) -> str:
        elapsed = max(self.clock() - self._start, 1e-9)
        rate = self.done / elapsed
        text = f"{self.description}: {self.done:,}/{self.total:,} {self.unit} ({100 * self.done / self.total:.1f}%)"
        if self.done >= self.total:
            return f"{text}, {rate:,.0f} {self.unit}/s, took {format_duration(elapsed)}"
        if self.done == 0:
            return text
        return f"{text}, {rate:,.0f} {self.unit}/s, ETA {format_duration((self.total - self.done) / rate)}"

    def update(self, n: int) -> None:
        self.done += int(n)
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
        elif self.clock() - self._last >= self.every_s and self.done < self.total:
            self._emit()

    def _emit(self) -> None:
        self._last = self.clock()
        print(self.line(), file=self.stream, flush=True)

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        elif self.done > 0:
            self._emit()
        self.enabled = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
