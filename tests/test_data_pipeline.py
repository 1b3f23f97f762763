"""seqio tasks, the feature converter and the training input pipeline, over fixture files."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import seqio
from official_formats import MORE_SENSES, write_msmarco, write_wordnet

from samtone_jax.cli import main as cli
from samtone_jax.data import pipeline, sentencepiece_tokens
from samtone_jax.data import vocab as vocab_lib
from samtone_jax.data.input_spec import InputSpec
from samtone_jax.tasks import catalogue, prompts, registration

SHORT = InputSpec(query_length=8, doc_length=12)  # the batches' lengths (the vocabulary is the registered one)


@pytest.fixture
def fixture_tasks(tmp_path, monkeypatch):
    """A data root (MS MARCO with hard negatives) and a WordNet folder, registered with a
    SentencePiece vocabulary trained on their text."""
    write_msmarco(tmp_path)
    wn = write_wordnet(tmp_path / "wordnet")
    with open(wn / "data.noun", "a") as f:
        f.write(MORE_SENSES)
    monkeypatch.setenv("SAMTONE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("WORDNET_DIR", str(wn))
    texts = [
        t
        for n in ("wordnet_definitions", "msmarco_passage")
        for c in [catalogue.collection(n, catalogue.LOADERS[n][1][0])]
        for t in list(c.queries.values()) + list(c.corpus.values())
    ]
    vocab_path = tmp_path / "fixture.model"
    vocab_lib.train_sentencepiece(texts, 100, str(vocab_path))
    registration.register(InputSpec(str(vocab_path)))
    yield vocab_path
    registration.register()  # back to the default vocabulary


def _batches(n, **kw):
    args = dict(batch_size=4, seed=3)
    args.update(kw)
    ds = pipeline.train_dataset("wordnet_definitions", "all", InputSpec(query_length=8, doc_length=12), **args)
    return [b for _, b in zip(range(n), ds.as_numpy_iterator(), strict=False)]


def test_features_are_truncated_with_eos_and_padded(fixture_tasks):
    vocabulary = vocab_lib.vocabulary(str(fixture_tasks))
    batch = _batches(1)[0]
    assert batch["query_tokens"].shape == (4, 8) and batch["doc_tokens"].shape == (4, 12)
    assert batch["query_id"].dtype == np.int64
    for (
        row,
        truncated,
    ) in zip(batch["doc_tokens"], batch["doc_truncated"], strict=True):
        ids = [int(t) for t in row if t != 0]
        assert ids[-1] == 1 and 1 not in ids[:-1]  # exactly one EOS, at the end of the text
        assert bool(truncated) == (len(ids) == 12)
    long_text = "definition number 7 of a thing"
    tokens, truncated = sentencepiece_tokens.tokenize_texts(vocabulary, [long_text, "thing"], 5)  # seqio -> light
    full = vocabulary.encode(long_text)
    assert list(tokens[0]) == full[:4] + [1] and truncated[0] == 1
    short = vocabulary.encode("thing")
    assert list(tokens[1]) == short + [1] + [0] * (4 - len(short)) and truncated[1] == 0


def test_order_is_deterministic_resumable_and_split_between_hosts(fixture_tasks):
    first, again = _batches(4), _batches(4)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a["query_tokens"], b["query_tokens"])
    other_seed = _batches(1, seed=4)[0]
    assert not np.array_equal(other_seed["query_id"], first[0]["query_id"])
    resumed = _batches(2, start_batch=2)
    np.testing.assert_array_equal(resumed[0]["query_id"], first[2]["query_id"])
    np.testing.assert_array_equal(resumed[1]["query_id"], first[3]["query_id"])
    # With data_shards V fixed, two hosts with batch 2 each see exactly the batch one host sees.
    single = _batches(3, data_shards=2)
    hosts = [_batches(3, batch_size=2, num_shards=2, shard_index=h) for h in (0, 1)]
    for step in range(3):
        joined = np.concatenate([hosts[0][step]["query_id"], hosts[1][step]["query_id"]])
        np.testing.assert_array_equal(joined, single[step]["query_id"])
    # Each host reads only its shard: host h's examples are the task's rows i with i mod 2 == h.
    order = registration.examples("wordnet_definitions", "all")["query_id"]
    for h in (0, 1):
        seen = np.concatenate([b["query_id"] for b in _batches(12, batch_size=2, num_shards=2, shard_index=h)])
        assert set(seen.tolist()) == set(order[h::2].tolist())
    with pytest.raises(ValueError, match="data_shards=3 must be a multiple of the 2 host"):
        _batches(1, batch_size=2, num_shards=2, data_shards=3)
    # Over an epoch every example appears once.
    epoch = _batches(11, batch_size=4)  # 45 examples: 11 full batches
    ids = np.concatenate([b["query_id"] for b in epoch])
    assert len(set(ids.tolist())) == 44


def test_shuffle_blocks_keep_consecutive_examples_together(fixture_tasks):
    order = registration.examples("wordnet_definitions", "all")["query_id"].tolist()
    position = {q: i for i, q in enumerate(order)}
    batches = _batches(6, batch_size=8, shuffle_block_size=4)
    for b in batches:
        rows = [position[q] for q in b["query_id"].tolist()]
        for start in range(0, 8, 4):  # a batch of 8 is two whole blocks of 4 consecutive examples
            block = rows[start : start + 4]
            assert block == list(range(block[0], block[0] + 4)) and block[0] % 4 == 0
    starts = [position[q] for b in batches for q in b["query_id"][::4].tolist()]
    assert starts[:11] != sorted(starts[:11])  # the blocks themselves are shuffled
    with pytest.raises(ValueError, match="shuffle_block_size=4 must be >= 1, and > 1 needs inputs.data_shards=1"):
        _batches(1, shuffle_block_size=4, data_shards=2)


def test_hard_negatives_flow_into_features(fixture_tasks):
    spec = InputSpec(str(fixture_tasks), query_length=8, doc_length=10, num_negatives=2)
    registration.register(spec)  # one spec for the examples' columns and the batches' features
    ds = pipeline.train_dataset("msmarco_passage", "train", spec, batch_size=2)
    batch = next(ds.as_numpy_iterator())
    assert batch["negative_tokens"].shape == (2, 2, 10) and batch["negative_ids"].shape == (2, 2)
    columns = registration.examples("msmarco_passage", "train", spec)
    by_query = {q: set(n) for q, n in zip(columns["query_id"], columns["negative_ids"].tolist(), strict=True)}
    for q, negatives in zip(batch["query_id"], batch["negative_ids"], strict=True):
        assert set(negatives.tolist()) == by_query[q]
    assert all(row[row != 0][-1] == 1 for row in batch["negative_tokens"].reshape(-1, 10))
    with pytest.raises(ValueError, match="no query has 5 hard negatives"):
        registration.examples("msmarco_passage", "train", InputSpec(num_negatives=5))


def test_mixture_of_tasks(fixture_tasks):
    seqio.MixtureRegistry.remove("fixture_mixture")
    seqio.MixtureRegistry.add("fixture_mixture", [("wordnet_definitions", 1.0), ("msmarco_passage", 1.0)])
    ds = pipeline.train_dataset("fixture_mixture", "train", SHORT, batch_size=8, seed=0)
    ids = np.concatenate([b["doc_id"] for _, b in zip(range(6), ds.as_numpy_iterator(), strict=False)])
    msmarco_docs = set(registration.examples("msmarco_passage", "train")["doc_id"].tolist())
    assert 0 < sum(i in msmarco_docs for i in ids.tolist()) < len(ids)  # both tasks contribute


def test_unknown_task_lists_the_registered_names():
    with pytest.raises(ValueError, match="unknown task 'wordnet'.*wordnet_definitions"):
        catalogue.collection("wordnet", "train")
    with pytest.raises(ValueError, match="has splits"):
        catalogue.collection("wordnet_definitions", "validation")


def test_build_vocab_is_deterministic_and_data_stats_reports_duplicates(fixture_tasks, tmp_path, capsys):
    outs = [tmp_path / "a" / "v.model", tmp_path / "b" / "v.model"]
    for out in outs:
        assert cli.main(["build-vocab", "--task=wordnet_definitions", "--vocab_size=60", f"--out={out}"]) == 0
    assert outs[0].read_bytes() == outs[1].read_bytes()
    assert sorted(p.name for p in outs[0].parent.iterdir()) == ["v.model"]  # no temporary left
    capsys.readouterr()
    assert cli.main(["data-stats", "--task=msmarco_passage", f"--vocabulary={fixture_tasks}", "--doc_length=4"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["examples"] == 2 and stats["unique_documents"] == 2
    assert stats["problems"] == {
        "empty_documents": 1,
        "qrels_with_missing_document": 1,
        "negatives_with_missing_document": 1,
    }
    assert stats["document_truncation_rate"] == 1.0  # 'The sky is blue.' needs more than 3 pieces + EOS
    assert cli.main(["data-stats", "--task=nope"]) == 2


def test_build_vocab_over_several_tasks_or_a_mixture(fixture_tasks, tmp_path, capsys):
    from samtone_jax.cli import build_vocab

    both, alone = tmp_path / "both.model", tmp_path / "alone.model"
    argv = ["build-vocab", "--task=wordnet_definitions, msmarco_passage", "--vocab_size=60", f"--out={both}"]
    assert cli.main(argv) == 0
    assert "wordnet_definitions/train + msmarco_passage/train" in capsys.readouterr().out
    texts = (
        catalogue.collection("wordnet_definitions", "train").texts()
        + catalogue.collection("msmarco_passage", "train").texts()
    )
    vocab_lib.train_sentencepiece(texts, 60, str(alone))  # the same texts in the same order, by hand
    assert both.read_bytes() == alone.read_bytes()
    assert cli.main(["build-vocab", "--task=wordnet_definitions", "--vocab_size=60", f"--out={alone}"]) == 0
    assert both.read_bytes() != alone.read_bytes()
    assert build_vocab.vocab_tasks("offline_mixture") == ["wordnet_definitions", "multireqa_squad_dev"]
    assert build_vocab.vocab_tasks("msmarco_passage,offline_mixture") == [
        "msmarco_passage",
        "wordnet_definitions",
        "multireqa_squad_dev",
    ]
    with pytest.raises(ValueError, match="unknown task or mixture 'nope'.*mixtures: multireqa_train_mixture"):
        build_vocab.vocab_tasks("wordnet_definitions, nope")
    with pytest.raises(ValueError, match="names wordnet_definitions more than once"):
        build_vocab.vocab_tasks("offline_mixture,wordnet_definitions")
    with pytest.raises(ValueError, match="names no task"):
        build_vocab.vocab_tasks(" , ")
    assert cli.main(["build-vocab", "--task=wordnet_definitions,nope", "--vocab_size=60", f"--out={alone}"]) == 2


def test_prompts_go_before_every_text_and_leave_the_ids_alone(fixture_tasks):
    from samtone_jax.cli import gin_registry

    plain = registration.examples("wordnet_definitions", "all")
    gin_registry.parse([], ["prompts.query = 'query: '", "prompts.document = 'passage: '"])
    try:
        prompted = registration.examples("wordnet_definitions", "all")
        assert prompts.prompt_of("wordnet_definitions") == ("query: ", "passage: ")
        gin_registry.parse([], ["prompts.per_task = {'wordnet_definitions': ('define: ', '')}"])
        per_task = registration.examples("wordnet_definitions", "all")
        gin_registry.parse([], ["prompts.per_task = {'wordnet_definitions': 'define: '}"])
        with pytest.raises(ValueError, match=r"prompts.per_task\['wordnet_definitions'\] must be a \(query prompt"):
            prompts.prompt_of("wordnet_definitions")
    finally:
        gin_registry.parse([], [])
    assert list(prompted["query"]) == ["query: " + t for t in plain["query"]]
    assert list(prompted["document"]) == ["passage: " + t for t in plain["document"]]
    assert list(per_task["query"]) == ["define: " + t for t in plain["query"]]
    assert list(per_task["document"]) == list(plain["document"])
    for ids in ("query_id", "doc_id"):  # duplicates are the same texts, prompted or not
        np.testing.assert_array_equal(prompted[ids], plain[ids])


def _mixture(rates=(3.0, 1.0)):
    import seqio

    seqio.MixtureRegistry.remove("test_two_tasks")
    seqio.MixtureRegistry.add(
        "test_two_tasks", list(zip(("wordnet_definitions", "msmarco_passage"), rates, strict=True))
    )
    return seqio.get_mixture_or_task("test_two_tasks")


def _task_batches(config, steps, start=0, seed=5, hosts=1, host=0):
    from samtone_jax.tasks import task_batches

    dataset = functools.partial(pipeline.train_dataset, spec=SHORT, seed=seed, shard_index=host, num_shards=hosts)
    source = task_batches.batches(
        _mixture(),
        "train",
        config,
        dataset=dataset,
        global_batch=4,
        hosts=hosts,
        seed=seed,
        start=start,
        count_examples=lambda name, split: len(registration.examples(name, split)["query_id"]),
    )
    return [b for _, b in zip(range(steps), source, strict=False)]


def test_task_homogeneous_batches_come_from_one_task_at_the_rates_and_resume_exactly(fixture_tasks):
    from samtone_jax.tasks.task_batches import TaskBatches, one_example_id, probabilities, task_sequence

    ids = {
        n: set(registration.examples(n, "train")["query_id"].tolist())
        for n in ("wordnet_definitions", "msmarco_passage")
    }
    config = TaskBatches(batch_sizes={"msmarco_passage": 2}, no_in_batch_negatives=("msmarco_passage",))
    drawn = _task_batches(config, 40)
    for name, batch in drawn:
        if name == "msmarco_passage":  # its own batch size; one shared query id: no in-batch negatives
            assert batch["query_id"].shape == (2,) and set(batch["query_id"].tolist()) == {one_example_id(name)}
        else:
            assert batch["query_id"].shape == (4,) and set(batch["query_id"].tolist()) <= ids[name]
    # The sequence follows the rates 3 : 1 within sampling error (a binomial over 20,000 steps).
    names, p = probabilities(_mixture(), "train", config, None)
    np.testing.assert_allclose(p, [{"wordnet_definitions": 0.75, "msmarco_passage": 0.25}[n] for n in names])
    sequence = task_sequence(5, p, 0, 20_000)
    share = np.mean([names[t] == "wordnet_definitions" for t in sequence])
    assert abs(share - 0.75) < 4 * np.sqrt(0.75 * 0.25 / 20_000)
    assert [names[t] for t in sequence[:40]] == [n for n, _ in drawn]
    # Resumed at step 25: the same task and the same batch as the uninterrupted run, bit for bit.
    for (n1, b1), (n2, b2) in zip(drawn[25:], _task_batches(config, 15, start=25), strict=True):
        assert n1 == n2 and all(np.array_equal(b1[k], b2[k]) for k in b1)
    # Two hosts draw the same task every step; each feeds its half of that task's batch.
    two = TaskBatches(batch_sizes={"msmarco_passage": 2})  # MS MARCO's fixture has 2 pairs: 1 a host
    hosts = [_task_batches(two, 12, hosts=2, host=h) for h in (0, 1)]
    assert [n for n, _ in hosts[0]] == [n for n, _ in hosts[1]] == [n for n, _ in drawn[:12]]
    assert all(b["query_id"].shape == ({"msmarco_passage": 1}.get(n, 2),) for n, b in hosts[0])


def test_task_batches_refuse_unknown_tasks_and_bad_rates(fixture_tasks):
    from samtone_jax.tasks.task_batches import TaskBatches, probabilities

    with pytest.raises(ValueError, match="rates='uniform' must be one of"):
        TaskBatches(rates="uniform")
    with pytest.raises(ValueError, match=r"names \['nope'\], which are not tasks of mixture test_two_tasks"):
        probabilities(_mixture(), "train", TaskBatches(batch_sizes={"nope": 8}), lambda n, s: 1)
    names, p = probabilities(
        _mixture(),
        "train",
        TaskBatches(rates="temperature", temperature=2.0),
        lambda n, s: {"wordnet_definitions": 9, "msmarco_passage": 1}[n],
    )
    # counts 9 : 1 at T = 2 -> 3 : 1
    np.testing.assert_allclose(p, [{"wordnet_definitions": 3 / 4, "msmarco_passage": 1 / 4}[n] for n in names])


@pytest.mark.slow
def test_training_on_task_homogeneous_batches_logs_each_tasks_loss(fixture_tasks, tmp_path):
    import tensorflow as tf
    from conftest import tiny_train_argv
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _mixture()
    extra = [
        "--gin.train.task='test_two_tasks'",
        "--gin.inputs.split='train'",
        "--gin.train.train_steps=8",
        "--gin.inputs.task_batches=@TaskBatches()",
        "--gin.TaskBatches.batch_sizes={'msmarco_passage': 2}",
    ]
    # 8 data-parallel devices cannot split MS MARCO's 2 pairs: said at the first batch, before any step
    assert cli.main(tiny_train_argv(tmp_path / "run8", fixture_tasks, extra=extra, devices=None)) == 2
    assert cli.main(tiny_train_argv(tmp_path / "run", fixture_tasks, extra=extra, devices=2)) == 0  # 1 pair each
    events = EventAccumulator(str(tmp_path / "run" / "train"))
    events.Reload()
    tags = set(events.Tags()["tensors"])
    assert {"task/wordnet_definitions/loss", "task/msmarco_passage/accuracy"} <= tags, tags
    for tag in ("task/wordnet_definitions/loss", "task/msmarco_passage/loss", "loss"):
        assert all(np.isfinite(float(tf.make_ndarray(e.tensor_proto))) for e in events.Tensors(tag))


def test_the_task_draw_is_splitmix64_of_seed_and_step():
    """Pinned to the published splitmix64 (Steele et al. 2014), written here in plain Python, so the
    task of a step cannot change with a NumPy version (hosts and resumed runs must agree)."""
    from samtone_jax.tasks.task_batches import _uniform

    def splitmix64(x):
        mask, z = (1 << 64) - 1, (x + 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    seed, steps = 5, [0, 1, 2, 1_000_003]
    want = [(splitmix64((s + seed * 0x9E3779B97F4A7C15) & ((1 << 64) - 1)) >> 11) / 2**53 for s in steps]
    np.testing.assert_array_equal(_uniform(seed, np.array(steps)), want)


TFDS_PAIRS = [
    ("where did the cat sit", "the cat sat on the mat"),
    ("what fell on the market", "the stock market fell"),
    ("who chased the mouse", "a cat chased a mouse"),
    ("what do rivers do", "rivers flow to the sea"),
    ("which animals are pets", "cats and dogs are pets"),
    ("what did the dog do", "a dog barked at the cat"),
    ("where is the moon", "the moon is in the sky"),
    ("what is green", "the grass is green"),
]


@pytest.fixture
def tfds_task(tmp_path, fixture_tasks):
    """A TFDS dataset prepared here (a builder over TFDS_PAIRS, a nested document feature), named as
    task 'toy_tfds' through gin."""
    import tensorflow_datasets as tfds

    from samtone_jax.cli import gin_registry

    class ToyRetrievalPairs(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            features = {"question": tfds.features.Text(), "context": {"sentence": tfds.features.Text()}}
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(features))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(TFDS_PAIRS[:6]), "test": self._generate_examples(TFDS_PAIRS[6:])}

        def _generate_examples(self, pairs):
            for i, (q, d) in enumerate(pairs):
                yield i, {"question": q, "context": {"sentence": d}}

    data_dir = tmp_path / "tfds"
    ToyRetrievalPairs(data_dir=str(data_dir)).download_and_prepare()
    spec = {"tfds_name": "toy_retrieval_pairs:1.0.0", "query": "question", "document": "context/sentence"}
    spec |= {"splits": ("train", "test"), "data_dir": str(data_dir)}
    gin_registry.parse([], [f"tfds_tasks.tasks = {{'toy_tfds': {spec!r}}}"])
    registration.register(InputSpec(str(fixture_tasks)))
    yield spec
    gin_registry.parse([], [])
    registration.register(InputSpec(str(fixture_tasks)))


def test_a_tfds_dataset_is_a_task_like_any_other(tfds_task):
    import seqio

    from samtone_jax.cli import gin_registry

    collection = catalogue.collection("toy_tfds", "train")
    pairs = sorted((collection.queries[q], collection.corpus[d]) for q, d in collection.pairs())
    assert pairs == sorted(TFDS_PAIRS[:6]) and len(catalogue.collection("toy_tfds", "test").queries) == 2
    batch = next(pipeline.train_dataset("toy_tfds", "train", SHORT, batch_size=3).as_numpy_iterator())
    assert batch["query_tokens"].shape == (3, 8) and len(set(batch["doc_id"].tolist())) == 3
    seqio.MixtureRegistry.remove("toy_mixture")
    seqio.MixtureRegistry.add("toy_mixture", [("toy_tfds", 1.0), ("wordnet_definitions", 1.0)])
    mixed = next(pipeline.train_dataset("toy_mixture", "train", SHORT, batch_size=4).as_numpy_iterator())
    assert mixed["query_tokens"].shape == (4, 8)
    bad = dict(tfds_task, document="context/text")
    gin_registry.parse([], [f"tfds_tasks.tasks = {{'toy_tfds_bad': {bad!r}}}"])
    with pytest.raises(ValueError, match=r"has no feature 'context/text'.*fix tfds_tasks.tasks"):
        catalogue.collection("toy_tfds_bad", "train")


def test_registering_the_same_spec_again_leaves_the_registry_as_it_is(fixture_tasks):
    spec = InputSpec(str(fixture_tasks))
    registration.register(spec)
    task = seqio.get_mixture_or_task("wordnet_definitions")
    registration.register(InputSpec(str(fixture_tasks), query_length=16))  # lengths do not change the examples
    assert seqio.get_mixture_or_task("wordnet_definitions") is task
    registration.register(InputSpec(str(fixture_tasks), num_negatives=2))  # other columns: registered anew
    assert seqio.get_mixture_or_task("wordnet_definitions") is not task
    seqio.TaskRegistry.remove("wordnet_definitions")  # the registry changed behind register's back
    registration.register(InputSpec(str(fixture_tasks), num_negatives=2))
    assert "wordnet_definitions" in seqio.TaskRegistry.names()
