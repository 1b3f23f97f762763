"""What a `samtone finetune` folder already holds, read so that a rerun goes on from its last step and
never serves an output made from another: the settings its outputs were made from, the run's trained
step, the stages between hard-negative refreshes, the eval records and the export of the model as it is
now."""

from __future__ import annotations

import json
import re

SETTINGS = "finetune.json"


def same_settings(out, now: dict) -> None:
    """Record `now` in OUT/finetune.json, or refuse a rerun whose settings differ from those recorded: a
    done step is skipped by its output alone, which must not be another recipe's."""
    from samtone_jax.core import paths
    from samtone_jax.core.atomic_file import write_atomic
    from samtone_jax.core.errors import BadValueError

    record = paths.as_path(out) / SETTINGS
    if not record.exists():
        write_atomic(record, json.dumps(now, indent=1) + "\n")
        return
    then = json.loads(record.read_text())
    keys = [*now, *(k for k in then if k not in now)]  # a setting given then and not now differs too
    differ = [f"{k}: {then.get(k)!r} then, {now.get(k)!r} now" for k in keys if then.get(k) != now.get(k)]
    if differ:
        raise BadValueError(
            f"{paths.as_str(out)} holds a fine-tune made with other settings ({'; '.join(differ)}): choose another "
            "--out, or rerun with the same settings to go on from its last step"
        )


def stages(total: int, every: int) -> list[tuple[int, int]]:
    """(first step, step to pause at or 0 for the end) of each stage between negative refreshes."""
    if not every:
        return [(0, 0)]
    starts = list(range(0, total, every))
    return [(start, start + every if start + every < total else 0) for start in starts]


def complete(run_dir: str, steps: int) -> bool:
    """Whether the run has a complete checkpoint at `steps` or later (a preempted or paused run has
    its operative config too, so the checkpoint decides)."""
    done = run_step(run_dir)
    return done is not None and done >= steps


def trained_to(run_dir: str, steps: int) -> None:
    """Refuse to go on from a train step that stopped before `steps` (a stop request: the loop saved
    its last step and returned): evaluating or exporting that run would serve a half-trained model."""
    from samtone_jax.core.errors import StoppedError

    if not complete(run_dir, steps):
        raise StoppedError(
            f"finetune stopped: {run_dir} was trained to step {run_step(run_dir) or 0} of {steps} (a stop request: "
            "SIGTERM or Ctrl-C); its checkpoint is saved: rerun the same command to go on from there"
        )


def run_step(model: str) -> int | None:
    """The step a run's evaluation and export read (its latest complete checkpoint); None for a model
    with no training checkpoints (an import, an export, a mix)."""
    from samtone_jax.core import paths, run_folders

    done = run_folders.complete_steps(paths.as_path(model)) if paths.as_path(model).exists() else []
    return done[-1] if done else None


def exported(export: str, model: str) -> bool:
    """Whether `export` is complete and made from `model` as it is now (a run: from its latest step;
    an export of an earlier step, left by a stopped run, is stale)."""
    from samtone_jax.core import paths, run_folders

    folder = paths.as_path(export)
    if not (folder / run_folders.COMMIT_MARKER).exists():
        return False
    step = run_step(model)
    return step is None or json.loads((folder / run_folders.EXPORT_JSON).read_text())["source"].get("step") == step


def eval_record(model: str, task: str, split: str, queries: int | None, candidates: int | None) -> str | None:
    """The eval JSON of `model` on task/split at this sample (evaluation/run.py's name: a run's at its
    latest step, never an earlier step's), float32 at every dimension; None when there is none yet."""
    from samtone_jax.core import paths

    sample = f"_q{queries or 'all'}_c{candidates or 'all'}" if queries or candidates else ""
    plain = re.compile(rf"{re.escape(task)}_{re.escape(split)}(?:_step(\d+))?{re.escape(sample)}")
    step = run_step(model)
    for f in paths.as_path(model).glob(f"eval/{task}_{split}*.json"):
        m = plain.fullmatch(f.stem)
        if m and (m.group(1) is None if step is None else m.group(1) == str(step)):
            return str(f)
    return None
