"""The training loop every mode shares. A mode (`samtone train`, `samtone train-adore`, the ones to
come) is a step function and a batch source; everything else is written here, once:

  run_directory()   refuse a MODEL_DIR this config cannot continue (another model, or a run past
                    its steps) before anything is written -> hold its lock (run_lock.py) -> write
                    config.gin (process 0)
  run()             state: fresh, or the newest readable checkpoint -> batches from that step ->
                    per step: logging and the non-finite stop (train_logging.py), checkpoints,
                    eval hooks, SIGTERM / Ctrl-C at the step boundary or inside the eval
                    (stop_request.py) -> final checkpoint ->
                    operative_config.gin (what the run used, as T5X writes it)
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import signal
from collections.abc import Callable, Iterator

import gin
import jax

from samtone_jax.checkpoints.train_checkpoints import TrainCheckpointer
from samtone_jax.config import gin_config
from samtone_jax.core import paths, run_clock, run_folders, run_lock, stop_request
from samtone_jax.core.atomic_file import write_atomic
from samtone_jax.core.errors import BadValueError, UserError
from samtone_jax.training.train_logging import ProgressLogger

log = logging.getLogger(__name__)

State = dict
Metrics = dict


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How long a run is and how often it logs, evaluates and checkpoints. `global_batch` is for
    the examples/s figure; `on_corrupt_checkpoint` 'fallback' resumes from the newest readable
    checkpoint when the latest is unreadable (it is moved aside), 'fail' stops instead."""

    train_steps: int
    global_batch: int
    checkpoint_every: int = 1000
    keep_checkpoints: int = 3
    log_every: int = 100
    eval_every: int = 0
    on_corrupt_checkpoint: str = "fallback"
    gin_name: str = "train"  # the configurable of train_steps / batch_size / model_dir (named in errors)
    cadence_name: str | None = None  # the configurable of the rest, when another (train's: schedule)
    pause_at: int = 0  # a step to save at and stop, as a preemption (0: never; see settings.ScheduleSettings)

    def setting(self, field: str) -> str:
        """The gin name of a field, as errors name it."""
        if field in ("train_steps", "global_batch"):
            return f"{self.gin_name}.{'batch_size' if field == 'global_batch' else field}"
        return f"{self.cadence_name or self.gin_name}.{field}"

    def __post_init__(self):
        if self.on_corrupt_checkpoint not in ("fallback", "fail"):
            raise BadValueError(
                f"{self.setting('on_corrupt_checkpoint')} = {self.on_corrupt_checkpoint!r}: use 'fallback' or 'fail'"
            )
        for name in ("train_steps", "global_batch", "checkpoint_every", "keep_checkpoints", "log_every"):
            if getattr(self, name) < 1:
                raise BadValueError(f"{self.setting(name)} = {getattr(self, name)}: must be ≥ 1")
        if self.eval_every < 0:
            raise BadValueError(f"{self.setting('eval_every')} = {self.eval_every}: must be ≥ 0 (0: no evaluation)")
        if not 0 <= self.pause_at < self.train_steps:
            raise BadValueError(
                f"{self.setting('pause_at')} = {self.pause_at}: must be a step before "
                f"{self.setting('train_steps')} = {self.train_steps} (0: never pause)"
            )


@contextlib.contextmanager
def run_directory(model_dir: str, model, schedule: Schedule, config_text: str) -> Iterator:
    """MODEL_DIR (an epath: local absolute, or gs://) held by this run for the `with` body."""
    paths.check_bucket(model_dir, f"{schedule.gin_name}.model_dir")
    model_dir = paths.as_path(model_dir)  # local: absolute (orbax needs it); gs://: as given
    if model_dir.exists() and not model_dir.is_dir():
        raise BadValueError(f"{schedule.gin_name}.model_dir = {model_dir} is a file, not a folder: choose a MODEL_DIR")
    check_existing_run(model_dir, model, schedule.train_steps, schedule.gin_name, config_text)
    host = jax.process_index()
    with run_lock.held_by_process_0(model_dir, host, jax.process_count()):
        if host == 0:
            _keep_earlier_config(model_dir, config_text)
            write_atomic(model_dir / run_folders.CONFIG_GIN, config_text)
        yield model_dir


def _keep_earlier_config(model_dir, config_text: str) -> None:
    """A run resumed with other settings (a learning rate, eval settings: what may change) keeps
    the config.gin it had as config_history/config.step<N>.gin and logs what changed."""
    path = model_dir / run_folders.CONFIG_GIN
    if not path.exists() or path.read_text() == config_text:
        return
    old, new = gin_config.read_bindings(path.read_text()), gin_config.read_bindings(config_text)
    steps = run_folders.complete_steps(model_dir)
    folder, number = model_dir / run_folders.CONFIG_HISTORY, 0
    while (keep := folder / f"config.step{steps[-1] if steps else 0}{f'.{number}' if number else ''}.gin").exists():
        number += 1
    write_atomic(keep, path.read_text())
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    log.warning("resuming with changed settings (%s); the earlier config.gin is kept as %s", ", ".join(changed), keep)


def run(
    model_dir,
    schedule: Schedule,
    *,
    init_state: Callable[[bool], State],
    batches: Callable[[int], Iterator],
    step: Callable[[State, object], tuple[State, Metrics]],
    evaluate: Callable[[State], Metrics] | None = None,
    on_start: Callable[[State, int], None] | None = None,
    on_finish: Callable[[State, bool], Metrics | None] | None = None,
    flops=None,
    peak: tuple[float | None, str] = (None, ""),
) -> Metrics:
    """Train from the latest checkpoint in MODEL_DIR/checkpoints to `schedule.train_steps`; returns
    the last logged metrics (means over the last `log_every` steps).

    init_state(fresh): the state to start from, or (fresh False) the abstract target a checkpoint is
    restored into; fresh is True when MODEL_DIR has no checkpoint yet (use INIT_CHECKPOINT then).
    batches(start): an iterator of the batches of steps start, start + 1, ... (resumable: it must
    give the batches the uninterrupted run would have seen). step(state, batch) -> (state, metrics
    with at least 'loss' and 'accuracy', left on device). evaluate(state) -> metrics, every
    `eval_every` steps. on_start(state, start step) runs once before the first step (the guard's
    starting scores); on_finish(state, evaluated) once the last step is done (evaluated: whether the
    last step's evaluation already ran), its metrics logged at the last step and returned with the rest.
    `flops` (a model_flops.ModelFlops) and `peak` (FLOP/s, how known): the log's model FLOP/s and MFU,
    from the steps' `tokens` / `attended_tokens` metrics.
    """
    final: Metrics = {}
    with contextlib.ExitStack() as cleanup:
        should_stop, restore_signal_handlers = install_stop_flag()
        cleanup.callback(restore_signal_handlers)
        checkpointer = TrainCheckpointer(
            run_folders.checkpoints(model_dir), schedule.checkpoint_every, schedule.keep_checkpoints
        )
        cleanup.callback(checkpointer.close)  # after the progress logger: waits for a save in flight
        state = init_state(checkpointer.latest_step() is None)
        state, start = checkpointer.restore_latest(state, on_corrupt=schedule.on_corrupt_checkpoint)
        if start:
            log.info("resumed from step %d in %s", start, checkpointer.directory)
        if on_start is not None and start < schedule.train_steps:
            on_start(state, start)
        source = batches(start)
        progress = ProgressLogger(
            model_dir,
            schedule.train_steps,
            schedule.global_batch,
            schedule.log_every,
            checkpointer,
            start_step=start,
            flops=flops,
            peak=peak,
        )
        cleanup.callback(progress.close)  # flushes the metrics still on device
        cleanup.enter_context(_out_of_memory_explained(schedule))
        for number in range(start + 1, schedule.train_steps + 1):
            state, metrics = step(state, next(source))
            if number == start + 1:  # reading the config, data and model, and compiling the step
                jax.block_until_ready(metrics["loss"])
                progress.first_step(number, run_clock.seconds())
            progress.record(number, metrics)  # raises on a non-finite loss, naming the last good checkpoint
            pause = number == schedule.pause_at and number < schedule.train_steps
            stop = should_stop() and number < schedule.train_steps
            if stop or pause or number % schedule.checkpoint_every == 0:
                progress.flush()  # the loss checked finite before its state is saved
            checkpointer.maybe_save(number, state)
            if stop:  # before any eval: a preempted host has seconds, not minutes
                checkpointer.save(number, state, force=True)
                log.warning("preempted: saved step %d; rerun the same command to resume", number)
                break
            if evaluate and schedule.eval_every and number % schedule.eval_every == 0:
                log.info("evaluating step %d", number)
                try:
                    progress.write_eval(number, evaluate(state))
                except stop_request.StopRequested:  # a stop during the eval: save now, not after it
                    progress.flush()  # the loss checked finite before its state is saved
                    checkpointer.save(number, state, force=True)
                    rerun = (
                        "rerun the same command to resume"
                        if number < schedule.train_steps
                        else "training is complete; `samtone eval` evaluates it"
                    )
                    log.warning("stopped during the eval at step %d: saved it; %s", number, rerun)
                    break
            if pause:  # after the step's eval (a resume does not run it again)
                checkpointer.save(number, state, force=True)
                log.info("paused at step %d (%s): rerun without it to go on", number, schedule.setting("pause_at"))
                break
        else:
            checkpointer.save(schedule.train_steps, state, force=True)
            if on_finish is not None:
                evaluated = bool(evaluate and schedule.eval_every and schedule.train_steps % schedule.eval_every == 0)
                evaluated = evaluated and start < schedule.train_steps  # this process ran the last step's eval
                finished = on_finish(state, evaluated)
                if finished:
                    if not evaluated:
                        progress.write_eval(schedule.train_steps, finished)
                    final = finished
        if jax.process_index() == 0:
            write_atomic(paths.as_path(model_dir) / run_folders.OPERATIVE_CONFIG_GIN, gin.operative_config_str())
    return {**progress.last, **final}


class OutOfMemoryError(UserError, MemoryError):
    """The device ran out of memory for the step (XLA's RESOURCE_EXHAUSTED)."""


@contextlib.contextmanager
def _out_of_memory_explained(schedule: Schedule):
    try:
        yield
    except Exception as e:
        if "RESOURCE_EXHAUSTED" not in str(e) or isinstance(e, UserError):
            raise
        first = next((line for line in str(e).splitlines() if "RESOURCE_EXHAUSTED" in line), "")[:300]
        raise OutOfMemoryError(
            f"the step does not fit in device memory at batch {schedule.global_batch} ({first.strip()}): lower "
            "BATCH_SIZE, or keep it with GradCache (step.grad_cache_chunk_size), rematerialisation "
            "(T5Config.remat / BertConfig.remat = True), bf16, shorter lengths or FSDP (logical_rules.fsdp = True)"
        ) from e


def install_stop_flag():
    """SIGTERM (TPU preemption) and Ctrl-C (SIGINT) stop the run at the next step boundary or between
    two encoding batches of the in-training eval (stop_request.py): it checkpoints the last completed
    step and exits 0. A second Ctrl-C interrupts at once. Returns (should_stop(), restore).

    One process: a flag the handlers set. Several (jax.distributed): every process must stop at the
    same point, or the collective checkpoint waits for the ones still training (or still encoding).
    SIGTERM is left to JAX's preemption service, which hears it on any host, tells the others and
    agrees on the first check all of them can reach (stop_request.agree_with); a Ctrl-C is turned
    into a SIGTERM of this process so it takes the same route."""
    flag = {"set": False}
    several = jax.process_count() > 1

    def handler(signum, frame):
        name = signal.Signals(signum).name
        if flag["set"] and signum == signal.SIGINT:
            raise KeyboardInterrupt
        log.warning(
            "%s received: checkpointing at the next step boundary, then exiting%s",
            name,
            " (Ctrl-C again to stop now, without a checkpoint)" if signum == signal.SIGINT else "",
        )
        flag["set"] = True
        if several:
            os.kill(os.getpid(), signal.SIGTERM)  # JAX's preemption notifier tells every process
        else:
            stop_request.request()

    signals = (signal.SIGINT,) if several else (signal.SIGTERM, signal.SIGINT)
    previous = {s: signal.signal(s, handler) for s in signals}
    if several:
        from jax.experimental import multihost_utils

        checks = itertools.count(1)  # the same sequence on every host: steps and eval batches alike
        stop_request.agree_with(lambda: multihost_utils.reached_preemption_sync_point(next(checks)))

    def restore() -> None:
        stop_request.agree_with(None)
        stop_request.clear()
        for s, h in previous.items():
            signal.signal(s, h)

    return stop_request.should_stop, restore


# What fixes a run's data position (the data resumes by batch index): changed on resume, examples
# would be skipped or repeated, so these are refused; anything else (a learning rate, eval settings)
# may change and is recorded (config_history/).
DATA_POSITION = (
    "task",
    "split",
    "batch_size",
    "seed",
    "data_shards",
    "shuffle_block_size",
    "num_negatives",
    "negatives_fallback",
)
# Where a mode's DATA_POSITION settings are bound beside its own gin name (train's: inputs.*).
DATA_GROUPS = {"train": ("inputs",)}
# ... and, elsewhere, what draws the batches' tasks and their negatives.
DATA_POSITION_ELSEWHERE = (
    "inputs.task_batches",
    "TaskBatches.rates",
    "TaskBatches.temperature",
    "TaskBatches.batch_sizes",
    "mixtures.declared",
    "hard_negatives_file.path",
)


def check_existing_run(
    model_dir, model, train_steps: int, gin_name: str = "train", config_text: str | None = None
) -> None:
    """Refuse, before anything is written, to continue a run in MODEL_DIR that this config cannot
    continue: another model (its config.gin says), other data settings (DATA_POSITION), or a run
    already past `train_steps`."""
    steps = run_folders.complete_steps(model_dir)
    config = model_dir / run_folders.CONFIG_GIN
    if not steps:
        return
    if config.exists():
        saved = gin_config.model_from_gin_text(config.read_text())
        if type(saved.config) is not type(model.config):
            family = type(saved.config).__name__.removesuffix("Config")
            raise BadValueError(
                f"{model_dir} holds a {family} run (step {steps[-1]}), and this config builds a "
                f"{type(model.config).__name__.removesuffix('Config')} model: delete it or choose another MODEL_DIR"
            )
        ours, theirs = gin_config.model_gin(model).splitlines(), gin_config.model_gin(saved).splitlines()
        differ = [
            f"{a.split(' = ')[0]}: {b.split(' = ', 1)[1]} in its config.gin, {a.split(' = ', 1)[1]} here"
            for a, b in zip(ours, theirs, strict=True)
            if a != b
        ]
        if differ:
            raise BadValueError(
                f"{model_dir} holds a run of another model ({'; '.join(differ)}): resume it with its own gin "
                "files (MODEL_DIR/config.gin), or train this model in another MODEL_DIR"
            )
        if config_text is not None:
            _check_data_position(model_dir, config.read_text(), config_text, gin_name)
    if steps[-1] > train_steps:
        raise BadValueError(
            f"{model_dir} already holds step {steps[-1]}, past {gin_name}.train_steps = {train_steps}: nothing to "
            "train (raise TRAIN_STEPS to continue it, or use another MODEL_DIR)"
        )


def _check_data_position(model_dir, saved: str, now: str, gin_name: str) -> None:
    import inspect

    defaults = {}  # 'configurable.parameter' -> its default, the mode's own name first
    for holder in (*DATA_GROUPS.get(gin_name, ()), gin_name):
        signature = inspect.signature(gin.get_configurable(holder))
        defaults |= {name: (f"{holder}.{name}", p.default) for name, p in signature.parameters.items()}
    old, new = gin_config.read_bindings(saved), gin_config.read_bindings(now)
    differ = []
    for key, default in (defaults[n] for n in DATA_POSITION if n in defaults):
        then, here = old.get(key, default), new.get(key, default)
        if then != here:
            differ.append(f"{key}: {then!r} in its config.gin, {here!r} here")
    task = new.get(f"{gin_name}.task")
    for key in DATA_POSITION_ELSEWHERE:
        then, here = old.get(key), new.get(key)
        if key.startswith("TaskBatches.") and not (old.get("inputs.task_batches") or new.get("inputs.task_batches")):
            continue  # not drawing one task a batch: these do not reach the data
        if key == "mixtures.declared":  # only the run's own mixture matters
            then, here = (x.get(task) if isinstance(x, dict) else x for x in (then, here))
        refreshed = ("hard_negatives_file.refreshed", f"{DATA_GROUPS.get(gin_name, (gin_name,))[0]}.negatives_fallback")
        if key == "hard_negatives_file.path" and all(x.get(k) for x in (old, new) for k in refreshed):
            continue  # mined again as the run trains, every query kept (fallback): each resume names the newest file
        if then != here:
            differ.append(f"{key}: {then!r} in its config.gin, {here!r} here")
    if differ:
        raise BadValueError(
            f"{model_dir} was trained with other data settings ({'; '.join(differ)}): its data resumes by batch "
            "index, so examples would be skipped or repeated. Resume with its own values (MODEL_DIR/config.gin), "
            "or start another MODEL_DIR (train.init_checkpoint = this run to continue from its weights)"
        )
