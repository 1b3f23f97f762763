"""run_folders.py: the one owner of the names inside the folders we write, and of which steps of a
run are complete (orbax's rule, asked of orbax, and the commit marker)."""

from __future__ import annotations

from samtone_jax.core import run_folders


def _step(root, name, marker=True):
    (root / "checkpoints" / name / "state").mkdir(parents=True)
    if marker:
        (root / "checkpoints" / name / run_folders.COMMIT_MARKER).write_text("done")


def test_complete_steps_are_the_finished_numeric_steps_only(tmp_path):
    assert run_folders.complete_steps(tmp_path) == []  # no checkpoints/ yet
    for name in ("3", "12", "5", "7.orbax-checkpoint-tmp-1700000000", "5.unreadable-1700000000", "backup_9"):
        _step(tmp_path, name)
    _step(tmp_path, "20", marker=False)  # a local copy of a gs:// run taken while step 20 was saved
    # By hand: an orbax temporary (still being written), a step moved aside as unreadable, a folder
    # that only looks like orbax's prefixed format and a step without its marker are not steps of ours.
    assert run_folders.complete_steps(tmp_path) == [3, 5, 12]
    assert not run_folders.is_complete_step(tmp_path / "checkpoints" / "20")
    assert run_folders.state(tmp_path, 5) == tmp_path / "checkpoints" / "5" / "state"
    assert run_folders.is_complete_step(tmp_path / "checkpoints" / "5")
    assert not run_folders.is_complete_step(tmp_path / "checkpoints" / "7.orbax-checkpoint-tmp-1700000000")


def test_kind_tells_a_run_a_step_a_parameter_checkpoint_and_an_export_apart(tmp_path):
    run, params, export, other = (tmp_path / n for n in ("run", "params_ckpt", "export", "other"))
    _step(run, "4")
    (params / "params").mkdir(parents=True)
    export.mkdir()
    (export / "samtone.json").write_text("{}")
    other.mkdir()
    (other / "checkpoints").write_text("a file, not a folder")
    assert run_folders.kind(run) == "run"
    assert run_folders.kind(run / "checkpoints" / "4") == "step"
    assert run_folders.kind(params) == "params"
    assert run_folders.kind(export) == "export"
    assert run_folders.kind(other) is None
