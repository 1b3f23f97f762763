"""`samtone score` and its teachers (BM25, samtone, sentence-transformers bi- and cross-encoders), the
scores file read back into the tasks' teacher features, and a training run that distils from it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import toy_collection

from samtone_jax.core.errors import BadValueError, MissingFileError
from samtone_jax.hard_negatives import scoring, teachers

WORDS = (
    "[PAD] [UNK] [CLS] [SEP] [MASK] the cat sat on mat a chased mouse cats and dogs are pets stock market fell".split()
)
WORDS += "dog barked at rivers flow to sea where did sit what on unrelated words only".split()


def _collection():
    return toy_collection("the cat and the dog", ("d3", "d5"))


def _rows(path) -> dict[str, dict]:
    return {r["qid"]: r for r in map(json.loads, open(path))}


def test_bm25_scores_are_bm25s_scores_and_candidates_its_top_without_positives(tmp_path):
    import bm25s

    collection = _collection()
    out = tmp_path / "scores.jsonl"
    summary = scoring.score(collection, str(out), teachers.BM25Teacher(), depth=3, shard_size=2)
    doc_ids = sorted(collection.corpus)
    index = bm25s.BM25()
    index.index(bm25s.tokenize([collection.corpus[d] for d in doc_ids], stopwords="en", show_progress=False))
    rows = _rows(out)
    assert sorted(rows) == ["q1", "q2", "q3"] and summary["shards"] == 2 and summary["queries"] == 3
    for qid, row in rows.items():
        tokens = bm25s.tokenize([collection.queries[qid]], stopwords="en", show_progress=False, return_ids=False)[0]
        full = dict(zip(doc_ids, index.get_scores(tokens), strict=True))
        relevant = set(collection.qrels[qid])
        assert set(row["positives"]) == relevant
        for d, s in [*row["positives"].items(), *zip(row["negatives"], row["scores"], strict=True)]:
            assert s == pytest.approx(full[d], rel=1e-6)
        # the best three of the others, best first, ties by document id
        others = sorted((d for d in doc_ids if d not in relevant), key=lambda d: (-full[d], d))
        assert row["negatives"] == others[:3]
    assert json.load(open(str(out) + ".json"))["mean_candidates"] == 3.0
    assert not (tmp_path / "scores.jsonl.parts").exists()


def test_scoring_in_blocks_of_queries_gives_the_same_file(tmp_path, monkeypatch):
    whole, blocks = tmp_path / "whole.jsonl", tmp_path / "blocks.jsonl"
    scoring.score(_collection(), str(whole), teachers.BM25Teacher(), depth=3)
    monkeypatch.setattr(teachers, "SCORE_BLOCK", 13)  # two queries of the 6-document corpus a block
    scoring.score(_collection(), str(blocks), teachers.BM25Teacher(), depth=3)
    assert blocks.read_bytes() == whole.read_bytes()


def test_a_killed_run_resumes_from_its_shards_and_writes_identical_scores(tmp_path, monkeypatch):
    clean = tmp_path / "clean.jsonl"
    scoring.score(_collection(), str(clean), teachers.BM25Teacher(), depth=2, shard_size=1)
    out = tmp_path / "resumed.jsonl"
    written, real_write = [], scoring.write_part

    def dies_on_the_second_shard(path, rows):
        if written:
            raise KeyboardInterrupt  # as a kill between shards; a kill inside one leaves no part (atomic)
        written.append(path)
        real_write(path, rows)

    monkeypatch.setattr(scoring, "write_part", dies_on_the_second_shard)
    with pytest.raises(KeyboardInterrupt):
        scoring.score(_collection(), str(out), teachers.BM25Teacher(), depth=2, shard_size=1)
    assert not out.exists() and len(list((tmp_path / "resumed.jsonl.parts").glob("part-*"))) == 1
    monkeypatch.setattr(scoring, "write_part", real_write)
    with pytest.raises(BadValueError, match="parts of another invocation"):  # other flags: refused, not mixed
        scoring.score(_collection(), str(out), teachers.BM25Teacher(), depth=3, shard_size=1)
    summary = scoring.score(_collection(), str(out), teachers.BM25Teacher(), depth=2, shard_size=1)
    assert summary["shards_reused"] == 1 and summary["shards"] == 3
    assert out.read_bytes() == clean.read_bytes()


def _bert_folders(root):
    """A random one-layer BERT cross-encoder and bi-encoder (sentence-transformers) over WORDS."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import BertConfig, BertForSequenceClassification, BertModel, BertTokenizer

    # transformers 5: BertTokenizer(vocab_file=...) reads only the special tokens; vocab= takes the words.
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(dict.fromkeys(WORDS))})
    config = dict(
        vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    cross, bert, bi = root / "cross_encoder", root / "bert", root / "bi_encoder"
    BertForSequenceClassification(BertConfig(**config, num_labels=1)).save_pretrained(cross)
    tokenizer.save_pretrained(cross)
    BertModel(BertConfig(**config)).save_pretrained(bert)
    tokenizer.save_pretrained(bert)
    transformer = Transformer(str(bert))
    SentenceTransformer(modules=[transformer, Pooling(16)], device="cpu").save(str(bi))
    return cross, bi


@pytest.fixture(scope="module")
def bert_folders(tmp_path_factory):
    pytest.importorskip("sentence_transformers")
    return _bert_folders(tmp_path_factory.mktemp("teachers"))


@pytest.mark.slow
def test_cross_encoder_teacher_scores_the_given_candidates_by_its_logit(bert_folders, tmp_path):
    import torch
    from transformers import BertForSequenceClassification, BertTokenizer

    cross, _ = bert_folders
    teacher = teachers.load_teacher(str(cross))
    assert teacher.kind == "cross-encoder"
    collection = _collection()
    with pytest.raises(BadValueError, match="cannot retrieve from the corpus; pass --candidates=FILE"):
        scoring.score(collection, str(tmp_path / "x.jsonl"), teacher)
    given = {"q1": ["d2", "d1", "d6"], "q2": ["d1", "missing"]}
    summary = scoring.score(collection, str(tmp_path / "ce.jsonl"), teacher, candidates=given)
    rows = _rows(tmp_path / "ce.jsonl")
    assert rows["q1"]["negatives"] == ["d2", "d6"] and rows["q2"]["negatives"] == ["d1"]  # positive d1 dropped
    assert rows["q3"]["negatives"] == [] and summary["candidates_missing_from_corpus"] == 1
    model, tokenizer = BertForSequenceClassification.from_pretrained(cross).eval(), BertTokenizer.from_pretrained(cross)
    for qid, row in rows.items():
        for d, s in [*row["positives"].items(), *zip(row["negatives"], row["scores"], strict=True)]:
            with torch.no_grad():
                logit = model(**tokenizer(collection.queries[qid], collection.corpus[d], return_tensors="pt")).logits
            assert s == pytest.approx(float(logit[0, 0]), abs=1e-5)


@pytest.mark.slow
def test_sentence_transformers_teacher_ranks_by_cosine(bert_folders, tmp_path):
    from sentence_transformers import SentenceTransformer

    _, bi = bert_folders
    teacher = teachers.load_teacher(str(bi), "sentence-transformers")
    collection = _collection()
    scoring.score(collection, str(tmp_path / "st.jsonl"), teacher, depth=2)
    model = SentenceTransformer(str(bi), device="cpu", local_files_only=True)
    doc_ids = sorted(collection.corpus)
    d = model.encode([collection.corpus[k] for k in doc_ids])
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    for qid, row in _rows(tmp_path / "st.jsonl").items():
        q = model.encode([collection.queries[qid]])[0]
        cosine = dict(zip(doc_ids, d @ (q / np.linalg.norm(q)), strict=True))
        others = sorted((k for k in doc_ids if k not in collection.qrels[qid]), key=lambda k: -cosine[k])
        assert row["negatives"] == others[:2]
        np.testing.assert_allclose(row["scores"], [cosine[k] for k in others[:2]], rtol=1e-4, atol=1e-5)


def test_a_teacher_folder_that_is_missing_or_of_the_wrong_kind_is_refused(tmp_path):
    cross, bi, empty = tmp_path / "cross", tmp_path / "bi", tmp_path / "empty"
    for folder in (cross, bi, empty):
        folder.mkdir()
    (cross / "config.json").write_text(json.dumps({"architectures": ["BertForSequenceClassification"]}))
    (bi / "modules.json").write_text("[]")
    with pytest.raises(MissingFileError, match="no such folder"):
        teachers.load_teacher(str(tmp_path / "absent"))
    with pytest.raises(BadValueError, match="is not a teacher folder"):
        teachers.load_teacher(str(empty))
    with pytest.raises(BadValueError, match="is a cross-encoder folder, not a sentence-transformers one"):
        teachers.load_teacher(str(cross), "sentence-transformers")
    with pytest.raises(BadValueError, match="is a sentence-transformers folder, not a samtone one"):
        teachers.load_teacher(str(bi), "samtone")
    with pytest.raises(BadValueError, match="--teacher_kind=bm25 takes --checkpoint=bm25"):
        teachers.load_teacher(str(bi), "bm25")
    with pytest.raises(BadValueError, match="--teacher_kind='bert' must be one of"):
        teachers.load_teacher("bm25", "bert")


@pytest.mark.slow
def test_samtone_teacher_ranks_by_the_models_cosine(trained_run, tmp_path):
    import samtone_jax

    teacher = teachers.load_teacher(str(trained_run))
    assert teacher.kind == "samtone"
    collection = _collection()
    scoring.score(collection, str(tmp_path / "dense.jsonl"), teacher, depth=4)
    model = samtone_jax.load(str(trained_run))
    doc_ids = sorted(collection.corpus)
    d = model.encode_documents([collection.corpus[k] for k in doc_ids])
    for qid, row in _rows(tmp_path / "dense.jsonl").items():
        cosine = dict(zip(doc_ids, d @ model.encode_queries([collection.queries[qid]])[0], strict=True))
        np.testing.assert_allclose(row["scores"], [cosine[k] for k in row["negatives"]], rtol=1e-4, atol=1e-5)
        assert row["scores"] == sorted(row["scores"], reverse=True)
        np.testing.assert_allclose(list(row["positives"].values()), [cosine[k] for k in row["positives"]], atol=1e-5)


# ----------------------------------------------------------------------------------------------
# The file read back: teacher features of the task examples, and training on them.
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def wordnet_scores(wordnet_env, tmp_path):
    """(the BM25 scores file of wordnet_definitions/all, its collection), attached through gin."""
    from samtone_jax.cli import gin_registry
    from samtone_jax.cli import main as cli
    from samtone_jax.tasks import catalogue

    out = tmp_path / "scores.jsonl"
    argv = ["score", "--checkpoint=bm25", "--task=wordnet_definitions", "--split=all", f"--out={out}", "--depth=4"]
    assert cli.main(argv) == 0
    gin_registry.parse([], [f"hard_negatives_file.path = '{out}'"])
    yield out, catalogue.collection("wordnet_definitions", "all")
    gin_registry.parse([], [])


def test_scores_file_gives_the_examples_their_teacher_scores_and_guide_ids(wordnet_scores):
    from samtone_jax.data.collection import text_id
    from samtone_jax.data.false_negatives import FalseNegativeFilter
    from samtone_jax.data.input_spec import InputSpec
    from samtone_jax.tasks.registration import examples

    out, collection = wordnet_scores
    rows = _rows(out)
    guide = FalseNegativeFilter(margin=0.5, max_ids=3)
    columns = examples("wordnet_definitions", "all", InputSpec(num_negatives=2, teacher_scores=True, guide=guide))
    by_text = {text_id(t): k for k, t in collection.corpus.items()}
    queries = {text_id(t): k for k, t in collection.queries.items()}
    flagged_any = False
    for i in range(len(columns["query"])):
        qid, did = queries[columns["query_id"][i]], by_text[columns["doc_id"][i]]
        row = rows[qid]
        scored = dict(zip(row["negatives"], row["scores"], strict=True)) | row["positives"]
        negatives = [by_text[n] for n in columns["negative_ids"][i]]
        assert negatives == row["negatives"][:2]
        np.testing.assert_allclose(
            columns["teacher_scores"][i], [scored[did]] + [scored[n] for n in negatives], rtol=1e-6
        )
        want = sorted((k for k in row["negatives"] if scored[k] > scored[did] - 0.5), key=lambda k: -scored[k])[:3]
        got = [by_text[g] for g in columns["guide_ids"][i]]
        assert got == want + [did] * (3 - len(want))  # padded with the pair's own document
        flagged_any |= bool(want)
    assert flagged_any
    assert collection.stats["guide_flagged_documents"] > 0


@pytest.mark.slow
def test_teacher_features_travel_through_the_pipeline_packing_and_model_features(wordnet_scores, wordnet_data):
    from samtone_jax.data import packing, pipeline
    from samtone_jax.data.false_negatives import FalseNegativeFilter
    from samtone_jax.data.input_spec import InputSpec
    from samtone_jax.tasks import registration
    from samtone_jax.training import train_batches

    guide = FalseNegativeFilter(margin=0.5, max_ids=3)
    spec = InputSpec(str(wordnet_data[1]), 8, 12, num_negatives=2, teacher_scores=True, guide=guide)
    registration.register(spec)
    try:
        columns = registration.examples("wordnet_definitions", "all", spec)
        by_pair = {(q, d): i for i, (q, d) in enumerate(zip(columns["query_id"], columns["doc_id"], strict=True))}
        ds = pipeline.train_dataset("wordnet_definitions", "all", spec, batch_size=8)
        batch = next(ds.as_numpy_iterator())
    finally:
        registration.register()
    rows = [by_pair[q, d] for q, d in zip(batch["query_id"], batch["doc_id"], strict=True)]
    np.testing.assert_array_equal(batch["teacher_scores"], columns["teacher_scores"][rows])
    np.testing.assert_array_equal(batch["guide_ids"], columns["guide_ids"][rows])
    features = train_batches.model_features(batch)
    np.testing.assert_array_equal(features["guide_ids"], train_batches.fold_ids(columns["guide_ids"][rows]))
    packed = packing.pack_batch(features, 2, 4)
    np.testing.assert_array_equal(packed["teacher_scores"], batch["teacher_scores"])  # per pair, as the ids


def test_a_mined_file_without_scores_cannot_feed_teacher_features(wordnet_env, tmp_path):
    from samtone_jax.cli import gin_registry
    from samtone_jax.data.input_spec import InputSpec
    from samtone_jax.tasks import catalogue
    from samtone_jax.tasks.registration import examples

    collection = catalogue.collection("wordnet_definitions", "all")
    qid = sorted(collection.queries)[0]
    path = tmp_path / "mined.tsv"
    path.write_text(f"{qid}\t{','.join(d for d in sorted(collection.corpus) if d not in collection.qrels[qid])}\n")
    gin_registry.parse([], [f"hard_negatives_file.path = '{path}'"])
    try:
        with pytest.raises(BadValueError, match="has none: point it at a `samtone score` file"):
            examples("wordnet_definitions", "all", InputSpec(num_negatives=1, teacher_scores=True))
    finally:
        gin_registry.parse([], [])


@pytest.mark.slow
@pytest.mark.parametrize("tower", ["t5", "bert"])
def test_training_distils_from_the_scores_and_guides_its_negatives(
    tower, wordnet_scores, wordnet_data, tmp_path, request
):
    from conftest import tiny_bert_train_argv, tiny_train_argv

    from samtone_jax.cli import main as cli

    out, _ = wordnet_scores
    model_dir = tmp_path / "run"
    extra = [
        "--gin_file=losses/distill_margin_mse.gin",
        f"--gin.hard_negatives_file.path='{out}'",
        "--gin.inputs.num_negatives=2",
        "--gin.inputs.teacher_guide=@FalseNegativeFilter()",
        "--gin.FalseNegativeFilter.margin=0.5",
    ]
    if tower == "bert":  # a BERT tower from an import, packed rows (the negatives packed with the documents)
        argv = tiny_bert_train_argv(model_dir, request.getfixturevalue("tiny_bert_import"), extra=extra)
    else:
        argv = tiny_train_argv(model_dir, wordnet_data[1], steps=2, extra=extra)
    assert cli.main(argv) == 0
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(model_dir / "train"))
    events.Reload()
    logged = {
        name: [float(tf.make_ndarray(e.tensor_proto)) for e in events.Tensors(name)]
        for name in events.Tags()["tensors"]
    }
    for name in ("distill/margin_mse", "contrastive_loss", "distillation_loss", "guided_fraction", "loss"):
        assert len(logged[name]) == 2 and np.isfinite(logged[name]).all(), name
    assert max(logged["guided_fraction"]) > 0


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--gin.inputs.teacher_guide=@FalseNegativeFilter()"], "FalseNegativeFilter with no cut"),
        (
            [
                "--gin_file=losses/distill_kl.gin",
                "--gin.inputs.num_negatives=2",
                "--gin.objective.contrastive_weight=0.0",
                "--gin.inputs.teacher_guide=@FalseNegativeFilter()",
                "--gin.FalseNegativeFilter.margin=0.0",
            ],
            "objective.contrastive_weight = 0",
        ),
        (["--gin.inputs.teacher_scores=True"], "only matter with objective.distillation_weight > 0"),
        (["--gin_file=losses/distill_margin_mse.gin"], "needs inputs.teacher_scores = True, inputs.num_negatives > 0"),
    ],
    ids=["guide-without-cut", "guide-without-contrastive", "scores-unused", "distill-without-negatives"],
)
def test_training_refuses_teacher_settings_it_would_ignore(extra, match, wordnet_env, tmp_path, capsys):
    from conftest import tiny_train_argv

    from samtone_jax.cli import main as cli

    assert cli.main(tiny_train_argv(tmp_path / "run", wordnet_env[1], extra=extra)) == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_score_refuses_flags_that_do_not_apply(wordnet_env, tmp_path, capsys):
    from samtone_jax.cli import main as cli

    base = ["score", "--task=wordnet_definitions", "--split=all", f"--out={tmp_path / 'out.jsonl'}"]
    mined = tmp_path / "mined.tsv"
    mined.write_text("q\td\n")
    cases = [
        (["--checkpoint=bm25", "--step=3"], "choose a samtone teacher's checkpoint"),
        (["--checkpoint=bm25", f"--candidates={mined}", "--depth=5"], "--depth is the number of top candidates"),
        (["--checkpoint=bm25", f"--candidates={tmp_path / 'absent.tsv'}"], "no such file"),
    ]
    for flags, match in cases:
        assert cli.main([*base, *flags]) == 2
        assert match in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()
