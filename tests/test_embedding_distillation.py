"""Embedding-level distillation: the term against a float64 hand computation, sharded over 8 devices
equal to one device, the teacher's `samtone encode` folder read back by text id (and refused when
stale), "text" lines of a JSONL file (label-free pairs), and a run whose teacher is its own starting
model: the term is 0 at the first step, so every text met its own teacher row."""

from __future__ import annotations

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from samtone_jax.core.errors import BadValueError
from samtone_jax.objectives.embedding_distillation import embedding_distillation, matched
from samtone_jax.objectives.losses import contrastive_loss


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _batch(seed=0, b=16, ds=8, dt=12):
    rng = np.random.RandomState(seed)
    q, d = _unit(rng.normal(size=(b, ds))), _unit(rng.normal(size=(b, ds)))
    tq, td = rng.normal(size=(b, dt)) * 3, rng.normal(size=(b, dt)) * 3  # any scale: normalised inside
    return q, d, tq, td


def _reference_similarity(q, d, tq, td) -> float:
    """Mean over (qd, qq, dd) of the mean squared gap between the student's and teacher's cosines, by loops."""
    tq, td = _unit(tq), _unit(td)
    student, teacher = {"q": q, "d": d}, {"q": tq, "d": td}
    parts = []
    for a, b in ("qd", "qq", "dd"):
        n = len(q)
        gaps = [
            (student[a][i] @ student[b][j] - teacher[a][i] @ teacher[b][j]) ** 2 for i in range(n) for j in range(n)
        ]
        parts.append(np.mean(gaps))
    return float(np.mean(parts))


def _reference_softmax(q, d, tq, td, temperature) -> float:
    """Mean over (q→d, d→q) of each row's KL(teacher's softmax ‖ student's) over the batch, by loops."""
    tq, td = _unit(tq), _unit(td)
    student, teacher = {"q": q, "d": d}, {"q": tq, "d": td}
    parts = []
    for a, b in ("qd", "dq"):
        kls = []
        for i in range(len(q)):
            s = np.array([student[a][i] @ student[b][j] for j in range(len(q))]) / temperature
            t = np.array([teacher[a][i] @ teacher[b][j] for j in range(len(q))]) / temperature
            p_s, p_t = np.exp(s) / np.exp(s).sum(), np.exp(t) / np.exp(t).sum()
            kls.append(sum(p_t[j] * np.log(p_t[j] / p_s[j]) for j in range(len(q))))
        parts.append(np.mean(kls))
    return float(np.mean(parts))


def test_similarity_and_cosine_match_float64_hand_computations():
    q, d, tq, td = _batch()
    got, metrics = embedding_distillation(*(jnp.asarray(x, jnp.float32) for x in (q, d, tq, td)))
    np.testing.assert_allclose(float(got), _reference_similarity(q, d, tq, td), rtol=1e-5)
    assert set(metrics) == {"embedding_distillation/similarity"} | {
        f"embedding_distillation/gap_{m}" for m in ("qd", "qq", "dd")
    }
    q2, d2, tq2, td2 = _batch(1, dt=8)
    got, _ = embedding_distillation(*(jnp.asarray(x, jnp.float32) for x in (q2, d2, tq2, td2)), mode="cosine")
    want = np.mean([(2 - q2[i] @ _unit(tq2[i]) - d2[i] @ _unit(td2[i])) / 2 for i in range(len(q2))])
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    got, metrics = embedding_distillation(
        *(jnp.asarray(x, jnp.float32) for x in (q, d, tq, td)), mode="softmax", temperature=0.1
    )
    np.testing.assert_allclose(float(got), _reference_softmax(q, d, tq, td, 0.1), rtol=1e-4)
    assert set(metrics) == {"embedding_distillation/softmax", "embedding_distillation/top1_agreement"}
    assert 0 <= float(metrics["embedding_distillation/top1_agreement"]) < 1  # random towers disagree somewhere
    # A student that is its teacher (up to scale) pays nothing, in any mode, and agrees on every top-1.
    _, agree = embedding_distillation(*(jnp.asarray(x, jnp.float32) for x in (q2, d2, 5 * q2, 2 * d2)), mode="softmax")
    assert float(agree["embedding_distillation/top1_agreement"]) == 1.0
    for mode in ("similarity", "cosine", "softmax"):
        zero, _ = embedding_distillation(*(jnp.asarray(x, jnp.float32) for x in (q2, d2, 5 * q2, 2 * d2)), mode=mode)
        assert abs(float(zero)) < 1e-6, mode


@pytest.mark.parametrize("mode", ["similarity", "softmax"])
def test_sharded_over_8_devices_equals_one_device_value_and_gradient(mode):
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices: XLA_FLAGS=--xla_force_host_platform_device_count=8 before jax is imported")
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    q, d, tq, td = (jnp.asarray(x, jnp.float32) for x in _batch(2, b=32))
    temperature = 0.1 if mode == "softmax" else None  # not the contrastive loss's τ: a τ dropped is seen
    loss = matched(functools.partial(contrastive_loss, temperature=0.05), 0.5, mode, temperature=temperature)

    def one(q, d):
        return loss(q, d, teacher_query=tq, teacher_doc=td)

    def local(q, d, tq, td):
        return loss(q, d, teacher_query=tq, teacher_doc=td, axis_name="data")

    spec = P("data")
    sharded = jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 4, out_specs=(P(), P()), check_vma=False)
    (v1, m1), g1 = jax.jit(jax.value_and_grad(one, argnums=(0, 1), has_aux=True))(q, d)
    (v8, m8), g8 = jax.jit(jax.value_and_grad(lambda q, d: sharded(q, d, tq, td), argnums=(0, 1), has_aux=True))(q, d)
    np.testing.assert_allclose(float(v8), float(v1), rtol=1e-5)
    for a, b in zip(g8, g1, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    for name in m1:
        np.testing.assert_allclose(float(m8[name]), float(m1[name]), rtol=1e-5, atol=1e-7, err_msg=name)
    plain, _ = contrastive_loss(q, d, temperature=0.05)
    float64 = [np.asarray(x, np.float64) for x in (q, d, tq, td)]
    term = _reference_similarity(*float64) if mode == "similarity" else _reference_softmax(*float64, temperature)
    np.testing.assert_allclose(float(v1), float(plain) + 0.5 * term, rtol=1e-5)


def test_label_free_loss_is_the_term_alone_and_bad_settings_are_refused():
    q, d, tq, td = (jnp.asarray(x, jnp.float32) for x in _batch(3))
    value, metrics = matched(None, 2.0)(q, d, teacher_query=tq, teacher_doc=td, negatives=None, query_ids=None)
    np.testing.assert_allclose(float(value), 2 * _reference_similarity(q, d, tq, td), rtol=1e-5)
    assert "contrastive_loss" not in metrics and float(metrics["loss"]) == float(value)
    with pytest.raises(BadValueError, match="widths must be equal: the student's is 8, the teacher's 12"):
        matched(None, 1.0, "cosine")(q, d, teacher_query=tq, teacher_doc=td)
    with pytest.raises(BadValueError, match="needs the teacher's embeddings"):
        matched(None, 1.0)(q, d)
    with pytest.raises(BadValueError, match="must be one of"):
        matched(None, 1.0, "l2")
    with pytest.raises(BadValueError, match="must be a number > 0"):
        matched(None, 0.0)
    for temperature in (0.0, -0.05, "0.05", True):
        with pytest.raises(BadValueError, match=r"embedding_distillation_temperature must be a number in \(0, 1000\)"):
            matched(None, 1.0, "softmax", temperature)


def test_the_objective_settings_reach_the_term_and_a_temperature_it_would_ignore_is_refused():
    from samtone_jax.data.input_spec import InputSpec
    from samtone_jax.training.objective import training_loss
    from samtone_jax.training.settings import ObjectiveSettings

    q, d, tq, td = (jnp.asarray(x, jnp.float32) for x in _batch(4))
    spec = InputSpec(query_length=8, doc_length=8)
    contrastive = functools.partial(contrastive_loss, temperature=0.05)
    terms = ObjectiveSettings(
        embedding_distillation_weight=2.0, embedding_distillation_mode="softmax", embedding_distillation_temperature=0.2
    )
    value, metrics = training_loss(contrastive, None, spec, terms, teacher_embeddings="folder")(
        q, d, teacher_query=tq, teacher_doc=td
    )
    plain, _ = contrastive_loss(q, d, temperature=0.05)
    want = float(plain) + 2.0 * _reference_softmax(*(np.asarray(x, np.float64) for x in (q, d, tq, td)), 0.2)
    np.testing.assert_allclose(float(value), want, rtol=1e-5)
    unset = dataclasses.replace(terms, embedding_distillation_temperature=None)  # the default τ, 0.05
    value, _ = training_loss(contrastive, None, spec, unset, teacher_embeddings="folder")(
        q, d, teacher_query=tq, teacher_doc=td
    )
    want = float(plain) + 2.0 * _reference_softmax(*(np.asarray(x, np.float64) for x in (q, d, tq, td)), 0.05)
    np.testing.assert_allclose(float(value), want, rtol=1e-5)
    cosines = dataclasses.replace(terms, embedding_distillation_mode="similarity")
    with pytest.raises(BadValueError, match="is the 'softmax' mode's τ, and objective.embedding_distillation_mode"):
        training_loss(contrastive, None, spec, cosines, teacher_embeddings="folder")


def test_text_lines_are_pairs_of_a_text_with_itself_and_mixed_fields_are_refused(tmp_path):
    from samtone_jax.data import jsonl_pairs

    path = tmp_path / "texts.jsonl"
    lines = [{"text": "The cat sat."}, {"text": "A dog barked."}, {"query": "who sat", "document": "The cat sat."}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    collection = jsonl_pairs.load(str(path), "texts")
    by_text = {t: i for i, t in collection.queries.items()}
    assert set(by_text) == {"The cat sat.", "A dog barked.", "who sat"}
    assert sorted(collection.corpus.values()) == ["A dog barked.", "The cat sat."]
    for text in ("The cat sat.", "A dog barked."):
        assert [collection.corpus[d] for d in collection.qrels[by_text[text]]] == [text]
    path.write_text(json.dumps({"text": "a", "document": "b"}) + "\n")
    with pytest.raises(BadValueError, match=r"texts.jsonl:1: .*a 'text' line .* has no other field"):
        jsonl_pairs.load(str(path), "texts")
    path.write_text(json.dumps({"document": "b"}) + "\n")
    with pytest.raises(BadValueError, match=r"texts.jsonl:1: .*missing field\(s\) \['query'\]"):
        jsonl_pairs.load(str(path), "texts")


def _encode(checkpoint, out, lengths=(12, 16)):
    from samtone_jax.cli import main as cli

    argv = ["encode", f"--checkpoint={checkpoint}", "--task=wordnet_definitions", "--split=all", "--side=both"]
    argv += [f"--out={out}", f"--query_length={lengths[0]}", f"--doc_length={lengths[1]}", "--shard_size=7"]
    assert cli.main(argv) == 0


@pytest.fixture(scope="module")
def teacher_folder(tiny_bert_import, wordnet_data, tmp_path_factory):
    """The tiny BERT import's own embeddings of the WordNet fixture (its training lengths, 12 / 16)."""
    out = tmp_path_factory.mktemp("teacher") / "embeddings"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WORDNET_DIR", str(wordnet_data[0]))
        _encode(tiny_bert_import[1], out)
    return out


def test_the_teacher_folder_is_read_back_by_text_id_and_refused_when_stale(teacher_folder, wordnet_env, tmp_path):
    import shutil

    from samtone_jax.data.collection import text_id
    from samtone_jax.evaluation.embedding_store import load_shards
    from samtone_jax.tasks import catalogue
    from samtone_jax.training import teacher_embeddings

    collection = catalogue.collection("wordnet_definitions", "all")
    teacher = teacher_embeddings.load(str(teacher_folder), ("wordnet_definitions",), "all")
    ids, vectors = load_shards(str(teacher_folder / "documents"))
    row = {text_id(collection.corpus[i]): v for i, v in zip(ids, vectors, strict=True)}
    pairs = collection.pairs()[:5]
    batch = {
        "query_id": np.array([text_id(collection.queries[q]) for q, _ in pairs], np.int64),
        "doc_id": np.array([text_id(collection.corpus[d]) for _, d in pairs], np.int64),
    }
    attached = teacher.attach(batch)
    np.testing.assert_array_equal(attached["teacher_doc_embedding"], np.stack([row[i] for i in batch["doc_id"]]))
    assert attached["teacher_query_embedding"].shape == (5, teacher.width)
    with pytest.raises(BadValueError, match="has no query embedding for 1 of this batch's texts"):
        teacher.attach(dict(batch, query_id=np.concatenate([batch["query_id"][:4], [12345]])))
    with pytest.raises(BadValueError, match="names 1 folder"):
        teacher_embeddings.load(str(teacher_folder), ("wordnet_definitions", "other"), "all")
    # A folder of other texts (here: one manifest edited as if the data had changed) is refused, not used.
    stale = tmp_path / "stale"
    shutil.copytree(teacher_folder, stale)
    manifest = json.loads((stale / "queries" / "manifest.json").read_text())
    (stale / "queries" / "manifest.json").write_text(json.dumps(dict(manifest, texts_sha1="0" * 40)))
    with pytest.raises(BadValueError, match=r"queries was encoded from other texts than task wordnet_definitions/all"):
        teacher_embeddings.load(str(stale), ("wordnet_definitions",), "all")


def _logged(model_dir) -> dict[str, list[float]]:
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(model_dir / "train"))
    events.Reload()
    return {n: [float(tf.make_ndarray(e.tensor_proto)) for e in events.Tensors(n)] for n in events.Tags()["tensors"]}


def test_the_teacher_soft_labels_peak_is_measured_on_its_pairs():
    # How much of each query's in-batch softmax a teacher puts on its own document (finetune warns when
    # it is near 1: the teacher learnt the pairs). Four pairs, τ 0.5.
    from samtone_jax.training.teacher_embeddings import TeacherEmbeddings

    eye = np.eye(4, dtype=np.float32)
    ids = np.arange(10, 14, dtype=np.int64)
    pairs = [(int(i), int(i)) for i in ids]
    # q_i = d_i = e_i, batches of all four: each query at cosine 1 from its own document and 0 from the
    # others, logits 2, 0, 0, 0: e^2 / (e^2 + 3)
    same = TeacherEmbeddings({"query_id": ids, "doc_id": ids}, {"query_id": eye, "doc_id": eye}, "hand")
    assert same.positive_probability(pairs, batch_size=8, temperature=0.5, batches=3) == pytest.approx(
        0.711235, abs=1e-6
    )
    # d_i = (e_i + e_{i+1}) / √2 (given unnormalised): query i is at cosine 1/√2 from its own document and
    # from document i − 1, 0 from the rest; logits √2, √2, 0, 0: e^√2 / (2 e^√2 + 2)
    shifted = 3 * (eye + np.roll(eye, 1, axis=1))
    near = TeacherEmbeddings({"query_id": ids, "doc_id": ids}, {"query_id": eye, "doc_id": shifted}, "hand")
    assert near.positive_probability(pairs, batch_size=4, temperature=0.5, batches=2) == pytest.approx(
        0.402215, abs=1e-6
    )
    # batches of 2 drawn from the 4: one other document a batch, e^2 / (e^2 + 1)
    assert same.positive_probability(pairs, batch_size=2, temperature=0.5) == pytest.approx(0.880797, abs=1e-6)
    # Queries 10 and 11 share document 20 (= e0): each leaves the other copy out, as id masking does.
    # Logits (τ 0.5) over the batch's documents [20, 20, 22, 23]: query 10 [2, −, 0, 0]: e^2 / (e^2 + 2);
    # query 11 (e1, far from its document) [−, 0, 0, 0]: 1/3; queries 12, 13 [0, 0, 2, 0]: e^2 / (e^2 + 3)
    shared = TeacherEmbeddings(
        {"query_id": ids, "doc_id": np.array([20, 22, 23], np.int64)},
        {"query_id": eye, "doc_id": eye[[0, 2, 3]]},
        "hand",
    )
    duplicated = [(10, 20), (11, 20), (12, 22), (13, 23)]
    assert shared.positive_probability(duplicated, batch_size=4, temperature=0.5, batches=2) == pytest.approx(
        0.635697, abs=1e-6
    )
    # The cosines it is made from (also the in-batch top-1 of experiments/teacher_soft_labels.py): one
    # matrix a batch, each query's own document on the diagonal (cosine 1, query 11's 0), and exactly one
    # left-out document in the rows of queries 10 and 11 (the other copy of document 20), none in the others.
    matrices = list(shared.in_batch_cosines(duplicated, batch_size=4, batches=2))
    assert len(matrices) == 2
    for cosines in matrices:
        assert sorted(np.diag(cosines)) == pytest.approx([0.0, 1.0, 1.0, 1.0])
        assert sorted(np.isneginf(cosines).sum(axis=1)) == [0, 0, 1, 1]
        assert np.isfinite(np.diag(cosines)).all()
    with pytest.raises(BadValueError, match="no query embedding for 1"):
        same.positive_probability([(99, 10)], batch_size=4, temperature=0.5)
    with pytest.raises(BadValueError, match="no pairs"):
        same.positive_probability([], batch_size=4, temperature=0.5)


@pytest.mark.parametrize("mode", ["cosine", "similarity", "softmax"])
def test_a_run_distilled_from_its_own_start_pays_nothing_at_its_first_step(
    mode, teacher_folder, tiny_bert_import, wordnet_env, tmp_path
):
    from conftest import tiny_bert_train_argv

    from samtone_jax.cli import main as cli

    model_dir = tmp_path / "run"
    contrastive = 0.5 if mode == "cosine" else 0.0  # beside a weighted contrastive term, or alone (label-free)
    extra = [
        f"--gin.inputs.teacher_embeddings='{teacher_folder}'",
        "--gin.objective.embedding_distillation_weight=1.0",
        f"--gin.objective.embedding_distillation_mode='{mode}'",
        *(["--gin.objective.embedding_distillation_temperature=0.05"] if mode == "softmax" else []),
        f"--gin.objective.contrastive_weight={contrastive}",
        "--gin.BertConfig.dropout_rate=0.0",
        "--gin.BertConfig.attention_dropout_rate=0.0",
    ]
    assert cli.main(tiny_bert_train_argv(model_dir, tiny_bert_import, steps=3, extra=extra)) == 0
    logged = _logged(model_dir)
    term = logged["embedding_distillation/loss"]
    assert len(term) == 3
    # Step 1 scores the starting weights against their own embeddings (packed rows vs encode's batches):
    # every pair met its own teacher rows, or the term would be far from 0.
    assert term[0] < 1e-5, term
    if contrastive:
        want = [contrastive * c + t for c, t in zip(logged["contrastive_loss"], term, strict=True)]
        np.testing.assert_allclose(logged["loss"], want, rtol=1e-5)
    else:
        assert "contrastive_loss" not in logged and logged["loss"] == term


def test_settings_that_cannot_work_are_refused_before_training(
    teacher_folder, tiny_bert_import, wordnet_env, tmp_path, capsys
):
    from conftest import tiny_bert_train_argv

    from samtone_jax.cli import main as cli

    cases = [
        (["--gin.objective.embedding_distillation_weight=1.0"], "needs inputs.teacher_embeddings"),
        ([f"--gin.inputs.teacher_embeddings='{teacher_folder}'"], "embedding_distillation_weight is 0"),
        (
            [
                f"--gin.inputs.teacher_embeddings='{teacher_folder}'",
                "--gin.objective.embedding_distillation_weight=1.0",
                "--gin.schedule.eval_every=1",
                "--gin.train_eval.split='all'",
            ],
            "train_eval.split",
        ),
        (
            [
                f"--gin.inputs.teacher_embeddings='{teacher_folder}'",
                "--gin.objective.embedding_distillation_weight=1.0",
                "--gin.objective.contrastive_weight=0.0",
                "--gin.objective.matryoshka_dims=(8,)",
            ],
            "objective.matryoshka_dims shape the contrastive loss",
        ),
    ]
    for extra, match in cases:
        model_dir = tmp_path / "run"
        assert cli.main(tiny_bert_train_argv(model_dir, tiny_bert_import, steps=1, extra=extra)) == 2
        assert match in capsys.readouterr().err
        assert not model_dir.exists(), match  # refused before anything is written
