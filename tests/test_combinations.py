"""Settings that compose: a few steps of the risky combinations on tiny towers, each proving from
what the run logged (its final metrics, the code paths it took, what it saved) that every setting
took effect. Issue 35's combination matrix, on BERT-family towers where issue 32 asks for them
(Matryoshka, task batches, prompts, GradCache, mining) and on T5 (distillation with teacher-guided
negatives, FSDP with scanned layers)."""

from __future__ import annotations

import hashlib
import json

import pytest
from conftest import tiny_bert_train_argv, tiny_train_argv

import samtone_jax
from samtone_jax.cli import main as cli
from samtone_jax.training import grad_cache

pytestmark = pytest.mark.slow


def _final(text: str) -> dict[str, float]:
    """The `final name value, ...` line a training run prints."""
    line = next(line for line in text.splitlines() if line.startswith("final "))
    return {k: float(v) for k, v in (item.rsplit(" ", 1) for item in line[len("final ") :].split(", "))}


def _counting(monkeypatch, module, name):
    calls = []
    original = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(1) or original(*a, **k))
    return calls


def test_bert_packing_gradcache_matryoshka_prompts(tiny_bert_import, wordnet_env, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    chunks = _counting(monkeypatch, grad_cache, "loss_and_grads")
    extra = [
        "--gin.step.grad_cache_chunk_size=4",
        "--gin.objective.matryoshka_dims=(8, 16)",
        "--gin.prompts.query='example: '",
        "--gin.prompts.document='definition: '",
    ]
    assert cli.main(tiny_bert_train_argv(run, tiny_bert_import, extra=extra)) == 0
    final = _final(capsys.readouterr().out)
    assert {"matryoshka/loss_8", "matryoshka/loss_16"} <= set(final)  # both truncations in the loss
    assert chunks  # the step was built through GradCache
    encoder = samtone_jax.load(str(run))
    assert (encoder.query_prompt, encoder.document_prompt) == ("example: ", "definition: ")


def test_bert_task_batches_over_a_mixture_with_per_task_prompts_then_mining(
    tiny_bert_import, wordnet_env, tmp_path, capsys
):
    pairs = tmp_path / "own.jsonl"
    pairs.write_text(
        "".join(json.dumps({"query": f"a dog {i}", "document": f"a canine {i}"}) + "\n" for i in range(40))
    )
    run = tmp_path / "run"
    extra = [
        f"--gin.local_tasks.tasks={{'own': {{'format': 'jsonl', 'path': '{pairs}'}}}}",
        "--gin.mixtures.declared={'mix': ['wordnet_definitions', 'own']}",
        "--gin.train.task='mix'",
        "--gin.inputs.task_batches=@TaskBatches()",
        "--gin.prompts.per_task={'own': ('dog: ', 'canine: ')}",
        "--gin.train.train_steps=6",
        "--gin.schedule.log_every=6",  # the final means cover every step
    ]
    assert cli.main(tiny_bert_train_argv(run, tiny_bert_import, extra=extra)) == 0
    final = _final(capsys.readouterr().out)
    assert {"task/own/loss", "task/wordnet_definitions/loss"} <= set(final)  # both tasks drawn, one a batch
    assert samtone_jax.load(str(run)).task_prompts == {"own": ("dog: ", "canine: ")}
    mined = tmp_path / "mined.tsv"
    own = [f"--gin.local_tasks.tasks={{'own': {{'format': 'jsonl', 'path': '{pairs}'}}}}"]
    argv = ["mine", *own, f"--checkpoint={run}", "--task=own", "--num_negatives=2", f"--out={mined}"]
    assert cli.main(argv) == 0  # dense mining with the BERT run
    rows = [line.split("\t") for line in mined.read_text().splitlines()]
    train = [i for i in range(40) if int(hashlib.md5(f"a dog {i}".encode()).hexdigest()[:8], 16) >= 0.1 * 16**8]
    assert len(rows) == len(train) and all(len(r[1].split(",")) == 2 for r in rows)  # the train split's queries


def test_t5_distillation_with_guided_negatives_fsdp_and_scanned_layers(wordnet_env, tmp_path, capsys):
    scores = tmp_path / "bm25.jsonl"
    argv = ["score", "--checkpoint=bm25", "--task=wordnet_definitions", "--split=all", f"--out={scores}", "--depth=8"]
    assert cli.main(argv) == 0
    extra = [
        f"--gin.hard_negatives_file.path='{scores}'",
        "--gin.inputs.num_negatives=2",
        "--gin.inputs.teacher_scores=True",
        "--gin.objective.distillation_weight=1.0",
        "--gin_file=losses/distill_margin_mse.gin",
        "--gin.inputs.teacher_guide=@FalseNegativeFilter()",
        "--gin.FalseNegativeFilter.margin=0.0",
        "--gin.logical_rules.fsdp=True",
        "--gin.T5Config.scan_layers=True",
    ]
    assert cli.main(tiny_train_argv(tmp_path / "run", wordnet_env[1], steps=2, extra=extra, devices=2)) == 0
    final = _final(capsys.readouterr().out)
    assert {"distill/margin_mse", "distill/teacher_agreement"} <= set(final)  # the teacher's term is in the loss
    assert 0 <= final["masked_fraction"] <= 1  # the guide's mask was computed
