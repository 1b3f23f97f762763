"""`samtone finetune`: import -> train (guarded) -> before / after on the held-out pairs and the guard
-> export, in one command, each step skipped when a rerun finds it done."""

from __future__ import annotations

import json
import logging

import pytest
from conftest import tiny_wordpiece_bert

from samtone_jax.cli import gin_registry
from samtone_jax.cli import main as cli
from samtone_jax.config import gin_config
from samtone_jax.core import stop_request


@pytest.mark.slow
def test_finetune_runs_every_step_prints_the_table_and_resumes(tmp_path, wordnet_env, capsys, monkeypatch, caplog):
    from samtone_jax.tasks import catalogue

    gin_registry.parse([], [])
    source = catalogue.collection("wordnet_definitions", "all")
    pairs = source.pairs()
    rows = [{"query": source.queries[q], "document": source.corpus[d]} for q, d in pairs]
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    other = [{"query": source.corpus[d], "document": source.queries[q]} for q, d in pairs]  # the other way round
    (tmp_path / "other.jsonl").write_text("".join(json.dumps(r) + "\n" for r in other))
    declared = tmp_path / "other.gin"
    spec = {"format": "jsonl", "path": str(tmp_path / "other.jsonl"), "test_fraction": 0.5}
    declared.write_text(f"local_tasks.tasks = {{'other': {spec!r}}}\n")
    base = tiny_wordpiece_bert(tmp_path / "hf", source.texts())  # a Hugging Face BERT folder: imported first
    out = tmp_path / "ft"
    argv = [
        "finetune",
        f"--data={data}",
        f"--base={base}",
        f"--out={out}",
        "--steps=2",
        "--test_fraction=0.5",
        f"--gin_file={declared}",
        "--guard",
        "other",
        "--guard_queries=20",
        "--guard_candidates=40",
        "--gin.BATCH_SIZE=8",
        "--gin.create_mesh.num_devices=1",
    ]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    for folder in ("base", "run", "export"):
        assert (out / folder / "commit_success.txt").exists() or (out / folder / "checkpoints").exists(), folder
    assert (out / "run" / "guard.json").exists()
    table = (out / "finetune.txt").read_text()
    assert table in printed
    lines = table.splitlines()
    in_domain = [line for line in lines if line.startswith("finetune_data/test ")]
    guard = [line for line in lines if line.startswith("other/test (guard)")]
    assert [line.split()[1] for line in in_domain] == ["P@1", "RR"] and len(guard) == 2
    for line in in_domain + guard:  # before, after, their difference; a p-value; after / before
        cells = line.split()[-5:]
        before, after, diff, p = map(float, cells[:4])
        assert diff == pytest.approx(after - before, abs=2e-4) and 0 <= p <= 1
        assert float(cells[4].rstrip("%")) / 100 == pytest.approx(after / before, abs=2e-3)
    before_file = json.loads((out / "base" / "eval" / "finetune_data_test_q2000_call.json").read_text())
    assert before_file["lengths"] == {"query": 64, "document": 64}  # served at the base's lengths
    # Rerun: every step is found done; the same table, nothing recomputed.
    stamps = {p: p.stat().st_mtime_ns for p in (out / "base" / "eval").glob("*.json")}
    assert cli.main(argv) == 0
    assert capsys.readouterr().out.count(table) == 1
    assert {p: p.stat().st_mtime_ns for p in (out / "base" / "eval").glob("*.json")} == stamps
    # A rerun that asks for another recipe is refused, not served this one's outputs.
    assert cli.main([*argv, "--steps=3"]) == 2
    assert "holds a fine-tune made with other settings (steps: 2 then, 3 now)" in capsys.readouterr().err
    # Another fine-tune's run/ (a bigger model that learnt the data) is read as it is as --teacher (the
    # teacher's encode reads a run), not sent to the Hugging Face importer.
    from samtone_jax.cli import finetune

    assert finetune._imported(str(out / "run"), str(tmp_path / "never"), "--teacher") == str(out / "run")
    assert not (tmp_path / "never").exists()
    # Mined, filtered hard negatives: the base ranks each training query's corpus; those above
    # (1 - margin) x the positive's score are dropped, one kept a query, and the run trains on them.
    # (A tiny random tower scores most documents near the positive: margin 0 and a batch of 4 here.)
    # Refreshed every step (--refresh_negatives=1 of 2 steps): mined by the base, the run paused at
    # step 1 (schedule.pause_at) and mined again by its own weights, then trained on to the end.
    # With a teacher (here a second tiny BERT of another width): its embeddings of the training texts,
    # computed once, matched by the run.
    argv[argv.index(f"--out={out}")] = f"--out={tmp_path / 'hard'}"
    argv[argv.index("--gin.BATCH_SIZE=8")] = "--gin.BATCH_SIZE=4"
    teacher = tiny_wordpiece_bert(tmp_path / "teacher", source.texts(), hidden_size=48)
    extra = ["--hard_negatives=1", "--negative_margin=0", "--refresh_negatives=1", "--guard", "none"]
    extra += [f"--teacher={teacher}", "--teacher_mode=softmax"]
    monkeypatch.setattr(finetune, "TEACHER_PEAK", 0.0)  # every teacher told apart as one that learnt the pairs
    with caplog.at_level(logging.INFO, logger="samtone_jax.cli.finetune"):
        assert cli.main([*argv, *extra, "--teacher_weight=0.5"]) == 0
    (peak,) = [r for r in caplog.records if "of a training query's in-batch softmax" in r.getMessage()]
    assert peak.levelno == logging.WARNING and "(batches of 4, τ 0.05)" in peak.getMessage()  # --gin.BATCH_SIZE=4
    assert "it has learnt these pairs" in peak.getMessage()
    assert 0 < float(peak.getMessage().split("on average ")[1].split()[0]) < 1
    for step in (0, 1):
        mined = tmp_path / "hard" / f"negatives_k1_m0_step{step}.tsv"
        counts = json.loads(mined.with_name(mined.name + ".json").read_text())
        assert counts["with_enough_negatives"] > 0
        assert mined.read_text().count("\n") == counts["with_enough_negatives"]
    method = json.loads((tmp_path / "hard" / "negatives_k1_m0_step1.tsv.json").read_text())["method"]
    assert method.startswith(f"dense:{tmp_path / 'hard' / 'run'}") and method.endswith("@1")  # the run's own step 1
    config = gin_config.read_bindings((tmp_path / "hard" / "run" / "config.gin").read_text())
    assert config["inputs.num_negatives"] == 1 and config["hard_negatives_file.path"] == str(mined)
    assert config["hard_negatives_file.refreshed"] and "schedule.pause_at" not in config  # the last stage: no pause
    (earlier,) = (tmp_path / "hard" / "run" / "config_history").iterdir()  # the first stage's, step 0's file
    assert gin_config.read_bindings(earlier.read_text())["schedule.pause_at"] == 1
    assert str(mined).replace("step1", "step0") in earlier.read_text()
    # Rerun: every stage found done (the run past each pause), nothing mined or trained again.
    done = {p: p.stat().st_mtime_ns for p in [mined, *(tmp_path / "hard" / "run" / "checkpoints").iterdir()]}
    assert cli.main([*argv, *extra, "--teacher_weight=0.5"]) == 0
    assert {p: p.stat().st_mtime_ns for p in [mined, *(tmp_path / "hard" / "run" / "checkpoints").iterdir()]} == done
    assert config["inputs.teacher_embeddings"] == str(tmp_path / "hard" / "teacher_embeddings")
    assert config["objective.embedding_distillation_weight"] == 0.5
    assert config["objective.embedding_distillation_mode"] == "softmax"
    taught = json.loads((tmp_path / "hard" / "teacher_embeddings" / "documents" / "manifest.json").read_text())
    assert taught["fingerprint"]["source"] == str(tmp_path / "hard" / "teacher")  # the teacher's, imported
    assert cli.main([*argv, *extra, "--teacher_weight=0.25"]) == 2  # another weight: another recipe
    assert "teacher_weight: 0.5 then, 0.25 now" in capsys.readouterr().err
    assert cli.main([*argv, *extra[:-1], "--teacher_weight=0.5"]) == 2  # the default mode: another recipe
    assert "teacher_mode: 'softmax' then, None now" in capsys.readouterr().err
    # WiSE-FT: a dev split held out of training, the run mixed with its base at the α picked on it
    # (the best dev score: no guard constraint at min_retention 0), that mix evaluated and exported.
    wise = tmp_path / "wise"
    argv[argv.index(f"--out={tmp_path / 'hard'}")] = f"--out={wise}"
    assert cli.main([*argv, "--wise_ft", "--min_retention=0", "--dev_fraction=0.2"]) == 0
    info = json.loads((wise / "wise_ft" / "info.json").read_text())
    best = max(info["grid"], key=lambda m: (m["score"], -m["alpha"]))
    assert info["method"] == "wise-ft" and info["alpha"] == best["alpha"] and len(info["grid"]) == 6
    assert set(info["grid"][0]["guards"]) == {"other/train"}  # picked on the guard's train split, reported on test
    table = (wise / "finetune.txt").read_text()
    assert table.startswith(f"after: WiSE-FT α = {info['alpha']:g}")
    assert list((wise / "wise_ft" / "eval").glob("finetune_data_test_q2000_call.json"))  # the mix is what is measured
    assert json.loads((wise / "export" / "samtone.json").read_text())  # and what is shipped
    config = gin_config.read_bindings((wise / "run" / "config.gin").read_text())
    dev = {"format": "jsonl", "path": str(data), "test_fraction": 0.5, "dev_fraction": 0.2}
    assert config["local_tasks.tasks"]["finetune_data"] == dev  # trained without the dev queries
    assert cli.main(argv) == 2  # the same --out without --wise_ft: another recipe
    assert "wise_ft: True then, None now" in capsys.readouterr().err
    # A stop request (SIGTERM, Ctrl-C) during training: the loop saves its step and returns; finetune
    # stops there too (exit 2), never evaluating or exporting the half-trained run ...
    stopped = tmp_path / "stopped"
    argv[argv.index(f"--out={wise}")] = f"--out={stopped}"
    with monkeypatch.context() as m:
        m.setattr(stop_request, "should_stop", lambda: True)
        assert cli.main([*argv, "--guard", "none"]) == 2
    assert "trained to step 1 of 2 (a stop request" in capsys.readouterr().err
    assert not (stopped / "run" / "eval").exists() and not (stopped / "export").exists()
    # ... and a rerun goes on to the end, then evaluates and exports the last step, not an earlier
    # step's evaluation or export left in the folder (an earlier release made them after a stop).
    run = str(stopped / "run")
    sample = ["--task=finetune_data", "--split=test", "--max_queries=2000", "--gin.create_mesh.num_devices=1"]
    declared_data = {"finetune_data": {"format": "jsonl", "path": str(data), "test_fraction": 0.5}}
    sample += [f"--gin_bindings=local_tasks.tasks = {declared_data!r}"]
    assert cli.main(["eval", f"--checkpoint={run}", *sample]) == 0
    export = ["export", f"--checkpoint={run}", "--format=sentence-transformers", f"--out={stopped / 'export'}"]
    assert cli.main(export) == 0
    assert list((stopped / "run" / "eval").glob("finetune_data_test_step1_*.json"))
    assert cli.main([*argv, "--guard", "none"]) == 0
    assert list((stopped / "run" / "eval").glob("finetune_data_test_step2_*.json"))
    assert json.loads((stopped / "export" / "samtone.json").read_text())["source"]["step"] == 2


def test_finetune_refuses_what_it_cannot_measure_before_training(tmp_path, wordnet_env, capsys):
    assert cli.main(["finetune", f"--out={tmp_path / 'a'}"]) == 2
    assert "samtone finetune needs --data" in capsys.readouterr().err
    data = tmp_path / "two.jsonl"
    data.write_text('{"query": "a dog", "document": "a canine"}\n{"query": "a cat", "document": "a feline"}\n')
    out = tmp_path / "ft"
    argv = ["finetune", f"--data={data}", "--base=nowhere", f"--out={out}", "--test_fraction=0.0001", "--guard=none"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "finetune_data/test is empty" in err and len(err.strip().splitlines()) == 1
    assert not (out / "run").exists()  # refused before anything trained
    argv[argv.index("--test_fraction=0.0001")] = "--test_fraction=0.99"
    assert cli.main(argv) == 2
    assert "--base=nowhere: no such folder" in capsys.readouterr().err
    out = tmp_path / "w"
    wordnet = ["finetune", "--data=wordnet_definitions", "--base=nowhere", f"--out={out}", "--guard=none", "--wise_ft"]
    assert cli.main(wordnet) == 2
    assert (
        "--wise_ft picks the mix on held-out dev queries, and wordnet_definitions has no dev" in capsys.readouterr().err
    )
    assert not out.exists()
    two = ["finetune", f"--data={data}", "--base=nowhere", f"--out={out}", "--guard=none", "--wise_ft"]
    assert cli.main([*two, "--test_fraction=0.5", "--dev_fraction=0"]) == 2
    assert "--dev_fraction=0.0: --wise_ft needs dev queries" in capsys.readouterr().err
    assert cli.main([*two, "--test_fraction=0.3", "--dev_fraction=0.3", "--gin.DualEncoder.lora_rank=4"]) == 2
    assert "a LoRA fine-tune (DualEncoder.lora_rank) scales its adapters instead" in capsys.readouterr().err
    assert not out.exists()
    argv[argv.index(f"--out={tmp_path / 'ft'}")] = f"--out={tmp_path / 't'}"
    assert cli.main([*argv, "--teacher=all-mpnet-base-v2", "--teacher_weight=0"]) == 2
    assert "--teacher_weight=0.0: must be > 0" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()
    assert cli.main([*argv, "--refresh_negatives=100"]) == 2  # nothing mined to refresh
    assert "--refresh_negatives=100: the steps between minings of --hard_negatives" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


def test_the_teacher_diagnostic_never_stops_a_fine_tune(tmp_path, caplog):
    # The soft-label figure is a diagnostic: a teacher folder it cannot read is logged, not raised.
    from samtone_jax.cli import finetune

    with caplog.at_level(logging.INFO, logger="samtone_jax.cli.finetune"):
        finetune._report_teacher_peak(str(tmp_path / "absent"), "no_such_task", [], [], "softmax")
    (record,) = [r for r in caplog.records if "soft labels were not measured" in r.getMessage()]
    assert record.levelno == logging.WARNING and "training goes on" in record.getMessage()
