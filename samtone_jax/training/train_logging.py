"""Training metrics: TensorBoard events (event_writer.py, through the path layer: MODEL_DIR/train
and MODEL_DIR/eval, written by process 0), a console progress line, and the non-finite-loss stop.

Per-step metrics stay on device and are fetched every `log_every` steps, so logging does not
synchronise the host with every step; the non-finite check therefore names a step *range*.
"""

from __future__ import annotations

import datetime
import logging
import time

import jax
import numpy as np

from samtone_jax.core import paths, run_folders
from samtone_jax.core.errors import UserError
from samtone_jax.core.event_writer import EventWriter

log = logging.getLogger(__name__)


class NonFiniteLossError(UserError, FloatingPointError):
    pass


class ProgressLogger:
    def __init__(
        self,
        model_dir: str,
        total_steps: int,
        global_batch: int,
        log_every: int,
        checkpointer,
        start_step: int = 0,
        flops=None,
        peak: tuple[float | None, str] = (None, ""),
    ):
        writes = jax.process_index() == 0  # one writer of summaries
        model_dir = paths.as_path(model_dir)
        self.train_writer = EventWriter(model_dir / run_folders.TRAIN_EVENTS, start_step) if writes else None
        self.eval_writer = EventWriter(model_dir / run_folders.EVAL, start_step) if writes else None
        self.total, self.batch, self.every = total_steps, global_batch, max(log_every, 1)
        self.checkpointer = checkpointer
        self.pending: list[tuple[int, dict]] = []
        self.last: dict = {}
        self.last_step, self.last_time = None, time.time()
        self.flops, (self.peak, how) = flops, peak
        if flops is not None and writes:
            log.debug(
                "MFU: model FLOPs (%s matrix parameters a token, %d layers, attention width %d) over %s FLOP/s (%s)",
                f"{flops.matmul_params:,}",
                flops.layers,
                flops.attention_width,
                "an unknown peak" if self.peak is None else f"{self.peak:.3g}",
                how,
            )

    def first_step(self, step: int, seconds: float) -> None:
        """The first step of this process done, `seconds` after the command started."""
        print(f"step {step} done {seconds:.1f} s after start (config, data, model, compilation)", flush=True)
        if self.train_writer:
            self.train_writer.write_scalars(step, {"time_to_first_step_seconds": seconds})

    def record(self, step: int, metrics) -> None:
        self.pending.append((step, metrics))
        if step % self.every == 0 or step == self.total:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        fetched = jax.device_get(self.pending)
        self.pending = []
        first = fetched[0][0]
        for step, metrics in fetched:
            # A non-finite gradient norm with a finite loss: clipping by it zeroes or NaNs the update,
            # so the run would go on without moving (a gradient overflowing float32 in its squares).
            for name in ("loss", "grad_norm"):
                if name in metrics and not np.isfinite(metrics[name]):
                    raise NonFiniteLossError(
                        f"{name} is {metrics[name]} at step {step} (checked steps {first}..{fetched[-1][0]}); last "
                        f"good checkpoint: step {self.checkpointer.latest_step()} in {self.checkpointer.directory}. "
                        "Lower LEARNING_RATE, raise the temperature, or check the data of those steps."
                    )
        step = fetched[-1][0]
        # Over the steps that report a metric (per-task metrics come only from that task's steps).
        names = dict.fromkeys(k for _, m in fetched for k in m)
        mean = {k: float(np.mean([m[k] for _, m in fetched if k in m])) for k in names}
        now = time.time()
        steps_done = step - (self.last_step if self.last_step is not None else first - 1)
        seconds = max(now - self.last_time, 1e-9)
        rate = steps_done * self.batch / seconds
        self.last_step, self.last_time = step, now
        mean["examples_per_second"] = rate
        shown = ""
        if self.flops is not None and "tokens" in mean:
            mean["tokens_per_second"] = mean["tokens"] * steps_done / seconds
            per_step = self.flops.per_step(mean["tokens"], mean["attended_tokens"])
            mean["model_flops_per_second"] = per_step * steps_done / seconds
            if self.peak:
                mean["mfu"] = mean["model_flops_per_second"] / self.peak
                shown = f" | MFU {mean['mfu']:.1%}"
        if self.train_writer:
            self.train_writer.write_scalars(step, mean)
            self.train_writer.flush()
        eta = datetime.timedelta(seconds=int((self.total - step) * self.batch / max(rate, 1e-9)))
        accuracy = f"acc {mean['accuracy']:.3f} | " if "accuracy" in mean else ""  # none in pure distillation
        print(
            f"step {step}/{self.total} | loss {mean['loss']:.4f} | {accuracy}{rate:.1f} ex/s{shown} | ETA {eta}",
            flush=True,
        )
        self.last = mean

    def write_eval(self, step: int, metrics: dict) -> None:
        if self.eval_writer:
            self.eval_writer.write_scalars(step, {f"eval/{k}": v for k, v in metrics.items()})
            self.eval_writer.flush()
        shown = [k for k in ("loss", "accuracy", "ema/loss", "ema/accuracy") if k in metrics] + sorted(
            k for k in metrics if k.startswith(("retrieval/", "ema/retrieval/"))
        )
        print(f"eval step {step} | " + " | ".join(f"{k} {metrics[k]:.4f}" for k in shown), flush=True)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            for writer in (self.train_writer, self.eval_writer):
                if writer:
                    writer.close()
