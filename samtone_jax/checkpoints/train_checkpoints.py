"""Training checkpoints: orbax CheckpointManager over the full train state, preemption-safe.

MODEL_DIR/checkpoints/<step>/state  {step, params, opt_state, rng} (orbax, sharded, async)
MODEL_DIR/checkpoints/<step>/meta   {"step", "data_position"} (JSON)

Orbax writes each step to a temporary directory and renames it when complete, so a killed job
leaves the previous complete checkpoints and, at worst, an incomplete temporary that restore
ignores. The data position is the number of global batches consumed (= step): the pipeline
replays to it (samtone_jax/data/pipeline.py). All processes must call save/restore together.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import time

import jax
import orbax.checkpoint as ocp

from samtone_jax.core import paths, run_folders
from samtone_jax.core.errors import BadValueError, UserError, storage_reason

log = logging.getLogger(__name__)


class CheckpointSaveError(UserError, RuntimeError):
    """A checkpoint could not be written (storage unreachable, disk full, ...)."""


class CheckpointRestoreError(UserError, RuntimeError):
    """The latest checkpoint cannot be read."""


def _first_line(e: Exception) -> str:
    """The first line of `e`'s message, at most ~300 characters (its start, what failed, and its
    end), led by the OS's reason when the error chain names one anywhere (tensorstore puts it at
    the end, or, for a full disk, may only say RESOURCE_EXHAUSTED before a long spec)."""
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    short = line if len(line) <= 300 else f"{line[:140]} … {line[-150:]}"
    reason = storage_reason(e)
    return short if reason is None or reason in short else f"{reason}; {short}"


@contextlib.contextmanager
def _quiet_restore():
    """orbax and asyncio log every failed read of a broken checkpoint (hundreds of lines around
    the one cause); the caller reports the cause once."""
    loggers = [logging.getLogger(n) for n in ("absl", "asyncio")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


class _OrbaxSaveFailureEchoes(logging.Filter):
    """A failed asynchronous save is reported by TrainCheckpointer as one CheckpointSaveError that
    names its cause. Orbax's writer threads also log that cause: once per array from each thread
    (absl ERROR with a traceback) and again at exit for every task nobody awaited (asyncio's
    "exception was never retrieved"), hundreds of lines around the one that says what to do. From
    the first TrainCheckpointer on, this filter drops every ERROR record of orbax (its "[process=N]"
    prefix or a traceback through orbax) and asyncio's never-retrieved reports of orbax's
    coroutines: a failure orbax logs reaches the user as the checkpointer's own error (save or
    restore), with its cause."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        if record.name == "asyncio":
            return not ("never retrieved" in str(record.msg) and "orbax" in record.getMessage())
        return not (str(record.msg).startswith("[process=") or _through_orbax(record.exc_info))


def _through_orbax(exc_info) -> bool:
    tb = exc_info[2] if exc_info else None
    while tb is not None:
        if "/orbax/" in tb.tb_frame.f_code.co_filename.replace("\\", "/"):
            return True
        tb = tb.tb_next
    return False


@functools.cache
def _drop_orbax_save_failure_echoes() -> None:
    """Once per process: the log filter above, and the late-callback reports below."""
    echoes = _OrbaxSaveFailureEchoes()
    for name in ("absl", "asyncio"):
        logging.getLogger(name).addFilter(echoes)
    previous = sys.unraisablehook

    def unraisable(args) -> None:  # tensorstore completing a write for orbax's loop, closed by the failure
        if not _late_callback_of_a_closed_loop(args.exc_value, args.exc_traceback):
            previous(args)

    sys.unraisablehook = unraisable


def _late_callback_of_a_closed_loop(error, tb) -> bool:
    if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"):
        return False
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "call_soon_threadsafe":
            return True
        tb = tb.tb_next
    return False


def _set_aside_unmarked_steps(directory) -> None:
    """A local step folder without its commit marker (a copy of a gs:// run taken mid-save; orbax's
    local rule alone would restore it) is moved to `<step>.incomplete-<time>` before a run resumes
    (one process; on several, one line asks to move it). On gs:// orbax already requires the marker."""
    if paths.is_remote(directory) or not directory.is_dir():
        return
    unmarked = [p for p in directory.iterdir() if p.name.isdigit() and not (p / run_folders.COMMIT_MARKER).exists()]
    for step in sorted(unmarked, key=lambda p: int(p.name)):
        if jax.process_count() > 1:
            raise CheckpointRestoreError(
                f"checkpoint {step} has no {run_folders.COMMIT_MARKER} (a save cut off, or a copy taken while it "
                f"ran): move it aside (mv {step} {step}.incomplete) and rerun"
            )
        aside = f"{step}.incomplete-{int(time.time())}"
        log.warning("checkpoint %s has no %s: moved to %s", step, run_folders.COMMIT_MARKER, aside)
        paths.move(step, aside)


class TrainCheckpointer:
    def __init__(self, directory, every: int, keep: int):
        _drop_orbax_save_failure_echoes()
        self.directory, self.every = paths.as_path(directory), max(every, 1)
        self._pending: int | None = None  # the step of an asynchronous save not yet known complete
        self._failed = False
        _set_aside_unmarked_steps(self.directory)
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=max(every, 1), max_to_keep=keep, enable_async_checkpointing=True, create=True
        )
        self.manager = ocp.CheckpointManager(
            directory, options=options, item_names=(run_folders.STATE, run_folders.META)
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def _wait(self, step: int, complete: int | None) -> None:
        """Wait for the save of `step`; its failure as one CheckpointSaveError naming the step, the
        folder and the last complete checkpoint (the cause chained, printed once)."""
        try:
            self.manager.wait_until_finished()
        except Exception as e:
            raise self._error(step, complete, e) from e
        self._pending = None

    def _error(self, step: int, complete: int | None, e: Exception) -> CheckpointSaveError:
        self._failed = True
        cause = _first_line(e) or type(e).__name__
        return CheckpointSaveError(
            f"the checkpoint of step {step} in {self.directory} could not be written ({type(e).__name__}: "
            f"{cause}); last complete checkpoint: step {complete}. Once the storage is reachable (or has "
            "space) again, rerun the same command: it resumes from that checkpoint"
        )

    def restore_latest(self, state, on_corrupt: str = "fail"):
        """See _restore_latest; the state's FROZEN part (never saved) is kept as given."""
        frozen = {FROZEN: state[FROZEN]} if FROZEN in state else {}
        restored, step = self._restore_latest(saved(state), on_corrupt)
        return dict(restored) | frozen, step

    def _restore_latest(self, state, on_corrupt: str):
        """(restored state, its step) onto `state`'s shardings, or (state, 0) without a checkpoint.

        An unreadable latest checkpoint (a truncated array file, a missing metadata file) is one
        short paragraph. With on_corrupt='fallback' (one process only: on several, a host that
        cannot read its shard cannot agree with the others on where to resume) it is a warning:
        the step folder is moved aside to `<step>.unreadable-<time>` (kept for inspection; its step
        can be saved again) and the previous checkpoint restored. Only the latest is ever skipped,
        and never the only one, so a problem that is not the checkpoint's (a changed optimizer,
        memory) cannot consume a run's checkpoints. Otherwise a CheckpointRestoreError."""
        abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
        steps = sorted(self.manager.all_steps(), reverse=True)
        for attempt, step in enumerate(steps[:2]):
            try:
                return self._restore(step, abstract), step
            except Exception as e:  # noqa: BLE001  named below, with what to do
                cause, where = f"{type(e).__name__}: {_first_line(e)}", self.directory / str(step)
                can_fall_back = on_corrupt == "fallback" and attempt == 0 and len(steps) > 1
                if not can_fall_back or jax.process_count() > 1:
                    hint = "No older checkpoint is readable either"
                    if attempt == 0 and len(steps) > 1:
                        hint = (
                            f"Move {where} aside (mv {where} {where}.unreadable) to resume from step {steps[1]}, "
                            "or rerun with --gin.schedule.on_corrupt_checkpoint=\"'fallback'\" (one process)"
                        )
                    raise CheckpointRestoreError(f"checkpoint {where} cannot be restored ({cause}). {hint}") from e
                aside = f"{where}.unreadable-{int(time.time())}"
                log.warning(
                    "checkpoint %s cannot be restored (%s): moved to %s; resuming from step %d",
                    where,
                    cause,
                    aside,
                    steps[1],
                )
                paths.move(where, aside)
                self.manager.reload()
        return state, 0

    def _restore(self, step: int, abstract):
        with _quiet_restore():
            restored = self.manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore())
            )
        if restored.meta["data_position"] != step:
            raise BadValueError(f"its data position is {restored.meta['data_position']}, not {step}")
        return restored.state

    def _args(self, step, state):
        return ocp.args.Composite(
            state=ocp.args.StandardSave(saved(state)), meta=ocp.args.JsonSave({"step": step, "data_position": step})
        )

    def maybe_save(self, step: int, state) -> None:
        """Save (asynchronously) when `step` is a multiple of the interval. Decided here: orbax's
        own policy would also save the very first step it sees."""
        if step % self.every == 0:
            if self._pending is not None:  # the previous save's failure surfaces here, named
                self._wait(self._pending, self._complete_before(self._pending))
            try:
                self.manager.save(step, args=self._args(step, state))
            except Exception as e:
                raise self._error(step, self.manager.latest_step(), e) from e
            self._pending = step

    def _complete_before(self, step: int) -> int | None:
        earlier = [s for s in self.manager.all_steps() if s < step]
        return max(earlier) if earlier else None

    def save(self, step: int, state, force: bool = True) -> None:
        if self._pending is not None:
            self._wait(self._pending, self._complete_before(self._pending))
        if self.manager.latest_step() == step:
            return
        complete = self.manager.latest_step()
        try:
            self.manager.save(step, args=self._args(step, state), force=force)
        except Exception as e:
            raise self._error(step, complete, e) from e
        self._pending = step
        self._wait(step, complete)

    def close(self) -> None:
        try:
            if self._pending is not None and not self._failed:
                self._wait(self._pending, self._complete_before(self._pending))
        finally:
            try:
                self.manager.close()
            except Exception:
                if not self._failed:  # after a reported failure, the same cause again is noise
                    raise


def saved_tree(path):
    """The metadata tree of a saved tree (shapes and dtypes; nothing restored), or None when it
    cannot be read (a missing or damaged metadata file: restore_latest's to handle)."""
    path = paths.as_path(path)
    try:
        with _without_step_metadata_warning():
            metadata = ocp.StandardCheckpointer().metadata(path)
        tree = getattr(metadata, "item_metadata", metadata)
        tree = getattr(tree, "tree", tree)
    except Exception:  # noqa: BLE001  unreadable: the restore names it, with what to do
        return None
    return tree if isinstance(tree, dict) else None


def first_shape_difference(a, b) -> tuple[str, tuple | None, tuple | None] | None:
    """(parameter name, its shape in `a`, in `b`) of the first parameter whose shape differs between
    two trees (arrays or saved metadata; a missing one's shape is None), or None when all agree."""
    shapes_a, shapes_b = (
        {jax.tree_util.keystr(k): tuple(v.shape) for k, v in jax.tree_util.tree_leaves_with_path(t)} for t in (a, b)
    )
    for name in sorted(shapes_a.keys() | shapes_b.keys()):
        if shapes_a.get(name) != shapes_b.get(name):
            return name, shapes_a.get(name), shapes_b.get(name)
    return None


# A train state's parameters that it does not train (LoRA's base tower): held beside `params` for
# the step, never saved (the run's base.json names the checkpoint they come from).
FROZEN = "frozen"


def saved(state) -> dict:
    """What of a train state its checkpoints hold: all but the FROZEN parameters."""
    return {k: v for k, v in state.items() if k != FROZEN}


def full_params(state) -> dict:
    """Every parameter of a train state: the trained ones and the frozen ones."""
    return dict(state["params"]) | dict(state.get(FROZEN, {}))


def ema_params(state):
    """A train state's parameters with the trained ones replaced by their moving average (kept in
    float32), in the parameters' dtypes; the frozen ones as they are."""
    averaged = jax.tree_util.tree_map(lambda e, p: e.astype(p.dtype), state["ema"], state["params"])
    return dict(averaged) | dict(state.get(FROZEN, {}))


def restore_on_one_device(path):
    """A saved tree (e.g. MODEL_DIR/checkpoints/<step>/state, local or gs://) restored whole onto
    this process's first device, whatever topology saved it (for inspection, export and tests)."""
    path = paths.as_path(path)
    checkpointer = ocp.StandardCheckpointer()
    with _without_step_metadata_warning():
        metadata = checkpointer.metadata(path)
    tree = getattr(metadata, "item_metadata", metadata)
    tree = getattr(tree, "tree", tree)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), tree)
    with _without_step_metadata_warning():
        return checkpointer.restore(path, target)


class _StepMetadataFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Metadata file does not exist" not in record.getMessage()


@contextlib.contextmanager
def _without_step_metadata_warning():
    """Reading one item of a CheckpointManager step on its own (state/), orbax warns that the step's
    _CHECKPOINT_METADATA is not in that folder: it is one level up, as it should be."""
    absl = logging.getLogger("absl")
    only = _StepMetadataFilter()
    absl.addFilter(only)
    try:
        yield
    finally:
        absl.removeFilter(only)
