"""The general-retrieval guard (evaluation/guard.py): a run guarded on a task it does not train on
records the starting model's score once, before its first step, reports the score and its retention
at the end, and keeps the record when it is resumed."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from conftest import tiny_bert_train_argv

from samtone_jax.cli import gin_registry
from samtone_jax.cli import main as cli
from samtone_jax.core.errors import BadValueError
from samtone_jax.evaluation.guard import GuardSettings, guard_split


def _guard_task(tmp_path, wordnet_env):
    """A task the run does not train on: 120 WordNet pairs as your own JSONL file, half of them held out."""
    from samtone_jax.tasks import catalogue

    gin_registry.parse([], [])
    source = catalogue.collection("wordnet_definitions", "all")
    rows = [{"query": source.queries[q], "document": source.corpus[d]} for q, d in source.pairs()[:120]]
    data = tmp_path / "other.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    declared = tmp_path / "other.gin"
    declared.write_text(
        f"local_tasks.tasks = {{'other': {{'format': 'jsonl', 'path': '{data}', 'test_fraction': 0.5}}}}\n"
    )
    return declared


def test_guard_settings_refuse_what_cannot_be_measured(wordnet_env):
    with pytest.raises(BadValueError, match="guard.max_queries"):
        GuardSettings(tasks=("wordnet_definitions",), max_queries=0)
    gin_registry.parse([], [])
    assert guard_split("wordnet_definitions") == "test"
    with pytest.raises(BadValueError, match="unknown task 'nope'"):
        guard_split("nope")


def test_a_guarded_run_records_the_starting_score_and_reports_retention(
    tmp_path, tiny_bert_import, wordnet_env, capsys, caplog, monkeypatch
):
    from samtone_jax.checkpoints import pretrained

    monkeypatch.setattr(pretrained, "cache_dir", lambda: str(tmp_path / "cache"))
    declared = _guard_task(tmp_path, wordnet_env)
    imported = tmp_path / "import"  # a copy: eval writes into the model's folder
    shutil.copytree(tiny_bert_import[1], imported)
    bert = (tiny_bert_import[0], imported)
    run = tmp_path / "run"
    guard = ["--guard=other", "--gin.guard.max_queries=20", "--gin.guard.candidates=40"]
    # Evaluated at step 2 (the guard alone counts as an in-training evaluation) and at the end, step 3.
    argv = tiny_bert_train_argv(
        run, bert, steps=3, extra=[f"--gin_file={declared}", *guard, "--gin.schedule.eval_every=2"]
    )
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    record = json.loads((run / "guard.json").read_text())
    assert record["measure"] == "RR" and set(record["baseline"]) == {"other"}
    # The starting model's score, measured apart by `samtone eval` on the same sample at the same
    # (serving) lengths: the import's 64 tokens, not the run's training lengths 12 / 16.
    evaluate = ["eval", f"--gin_file={declared}", f"--checkpoint={imported}", "--task=other", "--split=test"]
    assert cli.main([*evaluate, "--max_queries=20", "--candidates=40"]) == 0
    measured = json.loads((imported / "eval" / "other_test_q20_c40.json").read_text())
    assert measured["lengths"] == {"query": 64, "document": 64}
    assert record["baseline"]["other"] == pytest.approx(measured["metrics"]["RR"], abs=1e-6)
    # The end of the run: the score, its retention, on the final line (and in TensorBoard's eval events).
    final = dict(re.findall(r"(guard/other/\w+) ([\d.e+-]+)", out.splitlines()[-1]))
    assert float(final["guard/other/retention"]) == pytest.approx(
        float(final["guard/other/RR"]) / record["baseline"]["other"], rel=1e-3
    )
    # Resumed (here: complete, trained further), the starting score is the recorded one, not re-measured.
    (run / "guard.json").write_text(json.dumps({**record, "baseline": {"other": 0.5}}))
    # (step 4 is evaluated by schedule.eval_every: the final line has its scores all the same)
    extra = [f"--gin_file={declared}", *guard, "--gin.schedule.eval_every=2"]
    assert cli.main(tiny_bert_train_argv(run, bert, steps=4, extra=extra)) == 0
    final = dict(re.findall(r"(guard/other/\w+) ([\d.e+-]+)", capsys.readouterr().out.splitlines()[-1]))
    assert float(final["guard/other/retention"]) == pytest.approx(float(final["guard/other/RR"]) / 0.5, rel=1e-3)
    # Another run from the same weights and guard (a new MODEL_DIR) reads the starting score from the
    # user's cache instead of encoding the guard's texts before its first step; another sample does not.
    (cached,) = (tmp_path / "cache" / "guard_baselines").iterdir()
    assert json.loads(cached.read_text())["baseline"] == record["baseline"]
    caplog.clear()
    with caplog.at_level("INFO", logger="samtone_jax.evaluation.guard"):
        assert cli.main(tiny_bert_train_argv(tmp_path / "run2", bert, steps=1, extra=extra)) == 0
    assert f"guard: the starting model's RR (recorded in {cached})" in caplog.text
    assert json.loads((tmp_path / "run2" / "guard.json").read_text())["baseline"] == record["baseline"]
    caplog.clear()
    other = [f"--gin_file={declared}", "--guard=other", "--gin.guard.max_queries=10", "--gin.guard.candidates=40"]
    with caplog.at_level("INFO", logger="samtone_jax.evaluation.guard"):
        assert cli.main(tiny_bert_train_argv(tmp_path / "run3", bert, steps=1, extra=other)) == 0
    assert "recorded in" not in caplog.text and len(list((tmp_path / "cache" / "guard_baselines").iterdir())) == 2


def test_a_guard_on_the_training_task_is_refused(tmp_path, tiny_bert_import, wordnet_env, capsys):
    argv = tiny_bert_train_argv(tmp_path / "run", tiny_bert_import, extra=["--guard=wordnet_definitions"])
    assert cli.main(argv) == 2
    assert "names 'wordnet_definitions', the task the run trains on" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before MODEL_DIR is written
