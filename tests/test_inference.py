"""samtone_jax.load, sharded text encoding, resumable embedding shards, and `samtone encode`."""

from __future__ import annotations

import json
import os
import re
import shutil

import jax
import numpy as np
import pytest

import samtone_jax
from samtone_jax.cli import main as cli
from samtone_jax.evaluation import embedding_store
from samtone_jax.inference.text_embedder import TextEmbedder
from samtone_jax.models import partitioning

TEXTS = [
    "a dog barked at the mailman",
    "the bank of the river was muddy",
    "",
    "x " * 40,  # longer than any length below: truncated
    "an animal that lives in water",
]


def _pipeline_tokens(vocab_path, extra_ids, texts, length):
    """[N, length] ids as the tasks' tf.data pipeline makes them: seqio's vocabulary, then the
    feature converter's trim-append-EOS-pad."""
    from samtone_jax.core.tensorflow_setup import tf
    from samtone_jax.data import features
    from samtone_jax.data import vocab as vocab_lib

    vocabulary = vocab_lib.vocabulary(str(vocab_path), extra_ids)
    return np.stack([features.trim_append_eos_pad(vocabulary.encode_tf(tf.constant(t)), length).numpy() for t in texts])


EDGE_TEXTS = ["", " ", "ÉCOLE naïve façade — “quotes” 東京 😀", "a\tb\nc", "<extra_id_1> fills", "x " * 300]


def _assert_light_ids_are_the_pipelines(vocab_path, texts, pieces, exact=True):
    """Light ids == seqio's Python `encode` (the same SentencePiece library) exactly, and == the
    tf.data route's (tf_text's own SentencePiece build) exactly, or with `exact` False on all but
    0.1 % of texts, where the two builds break a tie between equal-scored segmentations in another
    order (the same ids, permuted: seen on SQuAD's "USD 33 000" — seqio's own encode and encode_tf
    differ there too)."""
    from samtone_jax.data import vocab as vocab_lib

    for extra_ids in (0, 3):  # T5's vocabulary has 100
        light = vocab_lib.tokens(str(vocab_path), extra_ids)
        seqio_vocabulary = vocab_lib.vocabulary(str(vocab_path), extra_ids)
        assert [light.encode(t) for t in texts] == [list(seqio_vocabulary.encode(t)) for t in texts]
        for length in (5, 48):
            ours, truncated = light.tokenize_batch(texts, length)
            pipeline = _pipeline_tokens(vocab_path, extra_ids, texts, length)
            differ = [i for i in range(len(texts)) if not np.array_equal(ours[i], pipeline[i])]
            assert len(differ) <= (0 if exact else len(texts) // 1000), [texts[i] for i in differ[:3]]
            for i in differ:
                assert sorted(ours[i]) == sorted(pipeline[i]), texts[i]
            full = [len(light.encode(t)) for t in texts]
            np.testing.assert_array_equal(truncated, [int(n >= length) for n in full])
        assert light.vocab_size == pieces + extra_ids


def test_the_light_tokeniser_gives_the_training_pipelines_ids(wordnet_data):
    """The encoding route (SentencePiece alone) against the tasks' route (seqio in tf.data): every
    text of the WordNet fixture and edge cases, with and without extra ids."""
    from samtone_jax.data import wordnet

    collection = wordnet.load_collection(str(wordnet_data[0]))
    texts = [*collection.queries.values(), *collection.corpus.values(), *EDGE_TEXTS]
    _assert_light_ids_are_the_pipelines(wordnet_data[1], texts, 100)


@pytest.mark.slow
def test_the_light_tokeniser_gives_the_pipelines_ids_on_real_squad(squad_dev):
    from samtone_jax.tasks import catalogue

    squad = catalogue.collection("multireqa_squad_dev", "all")
    texts = [*list(squad.queries.values())[:1500], *list(squad.corpus.values())[:1500], *EDGE_TEXTS]
    _assert_light_ids_are_the_pipelines(squad_dev, texts, 2000, exact=False)


@pytest.mark.slow
def test_loading_and_encoding_imports_neither_tensorflow_nor_seqio(trained_run):
    import subprocess
    import sys

    code = (
        "import sys, numpy as np, samtone_jax\n"
        f"e = samtone_jax.load({str(trained_run)!r})\n"
        f"np.save(sys.argv[1], e.encode_queries({TEXTS!r}))\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'seqio', 'tensorflow_text'}))\n"
    )
    out = trained_run.parent / "light_queries.npy"
    done = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    tokens = _pipeline_tokens(trained_run / "vocab.model", 0, TEXTS, 8)
    encoder = samtone_jax.load(str(trained_run))
    by_pipeline = _encode_queries(encoder, tokens)
    np.testing.assert_allclose(np.load(out), np.asarray(by_pipeline), rtol=1e-5, atol=1e-6)


def _encode_queries(encoder, tokens):
    """The model applied to token ids directly, compiled as one program (not eagerly, op by op)."""
    model = encoder.model
    return jax.jit(lambda p, t: model.apply({"params": p}, t, method=model.encode_queries))(encoder.params, tokens)


def test_load_model_dir_step_dir_and_direct_apply_agree(trained_run):
    encoder = samtone_jax.load(str(trained_run))
    assert encoder.step == 2 and encoder.architecture == "sde"
    assert (encoder.query_length, encoder.doc_length) == (8, 12)  # the run's train.* lengths
    q, d = encoder.encode_queries(TEXTS), encoder.encode_documents(TEXTS)
    assert q.shape == d.shape == (5, 32) and q.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, rtol=1e-5)  # the empty text is [EOS]
    # The same numbers by hand: tokenise as the training pipeline does (seqio, TF), apply the model.
    tokens = _pipeline_tokens(trained_run / "vocab.model", 0, TEXTS, 8)
    by_hand = _encode_queries(encoder, tokens)
    np.testing.assert_allclose(q, np.asarray(by_hand), rtol=1e-5, atol=1e-6)
    step_dir = samtone_jax.load(str(trained_run / "checkpoints" / "2"))
    np.testing.assert_array_equal(step_dir.encode_documents(TEXTS), d)


def test_encoding_sharded_over_eight_devices_equals_one_device(trained_run):
    if jax.device_count() < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
    single = samtone_jax.load(str(trained_run), batch_size=3)
    sharded = samtone_jax.load(str(trained_run), batch_size=5, mesh=partitioning.create_mesh())
    assert sharded._encoder.batch_size == 8  # rounded up to the data devices
    texts = TEXTS * 4
    np.testing.assert_allclose(sharded.encode_queries(texts), single.encode_queries(texts), rtol=1e-5, atol=1e-6)


def test_length_buckets_give_the_full_length_embeddings_in_input_order(trained_run, monkeypatch):
    encoder = samtone_jax.load(str(trained_run))
    texts = TEXTS + ["dog", "a b c d e f g h i j k"]
    tokens, _ = encoder.vocabulary.tokenize_batch(texts, 12)
    full = TextEmbedder(encoder.model, encoder.params, encoder.vocabulary, batch_size=2, bucketed=False)
    bucketed = TextEmbedder(encoder.model, encoder.params, encoder.vocabulary, batch_size=4, tokens_per_batch=20)
    shapes = []
    encode_tokens = bucketed.encode_tokens
    monkeypatch.setattr(
        bucketed,
        "encode_tokens",
        lambda t, *a, **k: shapes.append((len(t), t.shape[1], k)) or encode_tokens(t, *a, **k),
    )
    expected = full.encode_all(tokens, "document")
    np.testing.assert_allclose(bucketed.encode_all(tokens, "document"), expected, rtol=1e-5, atol=1e-6)
    used = sorted(int(n) for n in (tokens != 0).sum(1))
    want, start = [], 0  # by hand: 8-token texts 2 a batch (20 // 8), 12-token ones 1 a batch
    while start < len(used):
        length = 8 if used[start] <= 8 else 12
        same = sum(1 for u in used[start:] if (u <= 8) == (length == 8))
        rows = 20 // length
        take = min(rows, same)
        want.append((take, length, {"rows": rows if same >= rows else 1 << (take - 1).bit_length()}))
        start += take
    assert shapes == want and shapes[0][1] == 8 and shapes[-1][1] == 12  # short texts first, never dragged to 12
    assert [bucketed.bucket_length(u, 64) for u in (0, 1, 9, 17, 33, 49, 64, 65)] == [8, 8, 16, 24, 48, 64, 64, 64]
    assert [bucketed.bucket_length(u, 1000) for u in (129, 385, 999)] == [192, 512, 1000]
    assert full.bucket_length(3, 12) == 12 and bucketed.rows_for(8) == 2 and bucketed.rows_for(8, texts=1) == 1


@pytest.mark.parametrize("devices", [1, 8])
def test_packed_encoding_gives_the_unpacked_embeddings_in_input_order(trained_run, monkeypatch, devices):
    if jax.device_count() < devices:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
    encoder = samtone_jax.load(str(trained_run))
    texts = TEXTS * 3 + ["", "dog", "a b c d e f g h i j k l m n o p q"]  # the last one fills its row
    tokens, _ = encoder.vocabulary.tokenize_batch(texts, 12)
    args = (encoder.model, encoder.params, encoder.vocabulary)
    full = TextEmbedder(*args, batch_size=4, bucketed=False)
    mesh = partitioning.create_mesh() if devices == 8 else None
    packed = TextEmbedder(*args, mesh, batch_size=2, packing_max_segments=3)
    rows = []
    encode_tokens = packed.encode_tokens
    monkeypatch.setattr(packed, "encode_tokens", lambda t, *a: rows.append(len(t)) or encode_tokens(t, *a))
    np.testing.assert_allclose(
        packed.encode_all(tokens, "document"), full.encode_all(tokens, "document"), rtol=1e-5, atol=1e-6
    )
    assert set(rows) == {packed.batch_size} and sum(rows) < len(texts)  # texts share rows


def test_next_fit_rows_by_hand():
    from samtone_jax.inference.text_embedder import next_fit_rows

    order, row, index = next_fit_rows(np.array([5, 3, 0, 7, 2]), 8, 2)
    assert order.tolist() == [2, 4, 1, 0, 3] and row.tolist() == [0, 0, 1, 1, 2] and index.tolist() == [0, 1, 0, 1, 0]


def test_load_errors_say_what_is_missing_and_where(trained_run, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        samtone_jax.load(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not a samtone checkpoint"):
        samtone_jax.load(str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match=r"no checkpoint for step 7 .*available: \[2\]"):
        samtone_jax.load(str(trained_run), step=7)
    copy = tmp_path / "copy"
    shutil.copytree(trained_run, copy)
    os.remove(copy / "vocab.model")
    config = (copy / "config.gin").read_text()
    (copy / "config.gin").write_text(re.sub(r"train.vocabulary = (\\\n\s*)?'", "train.vocabulary = '/missing", config))
    with pytest.raises(FileNotFoundError, match="vocab.model and for train.vocabulary='/missing"):
        samtone_jax.load(str(copy))


class _CountingEncoder:
    """Embeds text by a fixed hash; counts calls, and can die after `fail_after` calls."""

    def __init__(self, fail_after=None):
        self.calls, self.fail_after = 0, fail_after

    def __call__(self, texts, progress=lambda n: None):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt("simulated kill")
        self.calls += 1
        progress(len(texts))
        return np.stack([np.random.default_rng(sum(map(ord, t))).standard_normal(4) for t in texts]).astype(np.float32)


def test_encoding_resumes_after_a_kill_without_recomputing_finished_shards(tmp_path):
    ids = [f"d{i:03d}" for i in range(50)]
    texts = [f"text number {i}" for i in range(50)]
    out = str(tmp_path / "emb")
    killed = _CountingEncoder(fail_after=3)
    with pytest.raises(KeyboardInterrupt):
        embedding_store.encode_to_shards(killed, ids, texts, out, shard_size=8, fingerprint={"step": 1})
    assert sorted(f for f in os.listdir(out) if f.startswith("shard")) == [
        f"shard-{i:05d}-of-00007.npz" for i in range(3)
    ]  # three complete shards, no partial file
    with pytest.raises(FileNotFoundError, match="4 of 7 shards missing"):
        embedding_store.load_shards(out)
    resumed = _CountingEncoder()
    done = embedding_store.encode_to_shards(resumed, ids, texts, out, shard_size=8, fingerprint={"step": 1})
    assert done == [3, 4, 5, 6] and resumed.calls == 4
    got_ids, got = embedding_store.load_shards(out)
    assert got_ids == ids
    np.testing.assert_array_equal(got, _CountingEncoder()(texts))
    with pytest.raises(ValueError, match="differs in step"):
        embedding_store.encode_to_shards(resumed, ids, texts, out, shard_size=8, fingerprint={"step": 2})
    with pytest.raises(ValueError, match="differs in shard_size, shards"):
        embedding_store.encode_to_shards(resumed, ids, texts, out, shard_size=16, fingerprint={"step": 1})


def test_each_process_encodes_only_its_share(tmp_path):
    ids, texts = [str(i) for i in range(30)], [f"t{i}" for i in range(30)]
    shares = [
        embedding_store.encode_to_shards(
            _CountingEncoder(), ids, texts, str(tmp_path), shard_size=7, process_index=p, process_count=2
        )
        for p in range(2)
    ]
    assert shares == [[0, 2, 4], [1, 3]]
    assert embedding_store.load_shards(str(tmp_path))[0] == ids


def test_non_finite_embeddings_are_refused_and_nothing_is_written(tmp_path):
    def broken(texts, progress):
        return np.full((len(texts), 4), np.nan, np.float32)

    with pytest.raises(ValueError, match="shard 0 has non-finite"):
        embedding_store.encode_to_shards(broken, ["a"], ["x"], str(tmp_path), shard_size=4)
    assert not [f for f in os.listdir(tmp_path) if f.startswith("shard")]


def test_encode_command_writes_queries_and_documents_and_reruns_as_a_no_op(trained_run, wordnet_env):
    from samtone_jax.tasks import catalogue

    argv = ["encode", f"--checkpoint={trained_run}", "--task=wordnet_definitions", "--split=all", "--shard_size=5"]
    assert cli.main(argv) == 0
    out = trained_run / "embeddings" / "wordnet_definitions_all_step2"
    collection = catalogue.collection("wordnet_definitions", "all")
    ids, docs = embedding_store.load_shards(str(out / "documents"))
    assert ids == sorted(collection.corpus)
    expected = samtone_jax.load(str(trained_run)).encode_documents([collection.corpus[i] for i in ids])
    np.testing.assert_allclose(docs, expected, rtol=1e-5, atol=1e-6)
    manifest = json.loads((out / "queries" / "manifest.json").read_text())
    assert manifest["rows"] == len(collection.queries) and manifest["fingerprint"]["side"] == "query"
    stamps = {f: os.stat(out / "queries" / f).st_mtime_ns for f in os.listdir(out / "queries")}
    assert cli.main(argv) == 0
    assert {f: os.stat(out / "queries" / f).st_mtime_ns for f in os.listdir(out / "queries")} == stamps


def test_atomic_open_leaves_the_old_file_or_the_new_one_never_a_mix(tmp_path):
    from samtone_jax.core.atomic_file import atomic_open, write_atomic

    path = tmp_path / "out.txt"
    write_atomic(str(path), "old")
    with pytest.raises(RuntimeError), atomic_open(str(path), "w") as f:
        f.write("half of the new")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["out.txt"]
    write_atomic(str(path), b"new")
    assert path.read_text() == "new" and os.listdir(tmp_path) == ["out.txt"]


def test_a_killed_writers_staging_is_removed_by_the_next_write_a_live_ones_is_kept(tmp_path):
    """A SIGKILLed export / import leaves <dst>.tmp-<pid>-<random>; the next write of the same target
    removes staging folders and files whose process is gone, never those of a running writer."""
    import subprocess
    import sys

    from samtone_jax.core.atomic_file import atomic_directory, write_atomic

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    (tmp_path / f"export.tmp-{dead_pid}-0badc0de").mkdir()
    (tmp_path / f"export.tmp-{dead_pid}-0badc0de" / "model.safetensors").write_bytes(b"half")
    (tmp_path / f"export.tmp-{os.getppid()}-00000001").mkdir()  # a live writer's (our parent process)
    (tmp_path / f".out.txt.tmp-{dead_pid}-12345678").write_text("half")
    (tmp_path / "export.tmp-other").mkdir()  # not ours to judge: kept
    with atomic_directory(str(tmp_path / "export")) as staging:
        with open(os.path.join(staging, "a.txt"), "w") as f:
            f.write("x")
    write_atomic(str(tmp_path / "out.txt"), "done")
    assert sorted(os.listdir(tmp_path)) == [
        "export",
        f"export.tmp-{os.getppid()}-00000001",
        "export.tmp-other",
        "out.txt",
    ]


def test_a_killed_writers_local_staging_of_a_gs_write_is_removed_by_the_next_one(tmp_path, gcs, monkeypatch):
    """A gs:// write stages in <tmp>/samtone_jax-staging-<pid>-...; a SIGKILLed writer's copy (its
    process gone) is removed by the next gs:// write on the host, a running writer's kept, and a
    finished write leaves nothing there."""
    import subprocess
    import sys
    import tempfile

    from samtone_jax.core import paths
    from samtone_jax.core.atomic_file import atomic_directory, write_atomic

    local_tmp = tmp_path / "tmp"
    local_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(local_tmp))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (local_tmp / f"samtone_jax-staging-{int(dead.stdout)}-abc" / "model.safetensors").parent.mkdir()
    (local_tmp / f"samtone_jax-staging-{os.getppid()}-def").mkdir()  # a live writer's
    bucket = gcs.bucket()
    write_atomic(f"{bucket}/staging/out.txt", "done")
    assert sorted(os.listdir(local_tmp)) == [f"samtone_jax-staging-{os.getppid()}-def"]
    with atomic_directory(f"{bucket}/staging/export") as staging:
        assert os.path.basename(staging).startswith(f"samtone_jax-staging-{os.getpid()}-")
        with open(os.path.join(staging, "a.txt"), "w") as f:
            f.write("x")
    assert sorted(os.listdir(local_tmp)) == [f"samtone_jax-staging-{os.getppid()}-def"]
    assert paths.as_path(f"{bucket}/staging/out.txt").read_text() == "done"
    assert paths.as_path(f"{bucket}/staging/export/a.txt").read_text() == "x"


def test_init_checkpoint_may_be_a_model_dir_or_an_export(trained_run, tmp_path):
    """STAR / fine-tuning start from another run: its MODEL_DIR, a step directory, or an export."""
    from samtone_jax.checkpoints.train_checkpoints import restore_on_one_device
    from samtone_jax.cli import gin_registry
    from samtone_jax.config import gin_config
    from samtone_jax.training import optimizer, train

    expected = restore_on_one_device(str(trained_run / "checkpoints" / "2" / "state"))["params"]
    export = tmp_path / "export"
    assert cli.main(["export", f"--checkpoint={trained_run}", "--format=hf", f"--out={export}"]) == 0
    gin_registry.parse([str(trained_run / "config.gin")])
    model = gin_config.model()
    tx, _ = optimizer.adafactor(train_steps=2)
    mesh = partitioning.create_mesh()
    for source in (trained_run, trained_run / "checkpoints" / "2", export):
        state = train.initial_state(model, tx, mesh, seed=5, init_checkpoint=str(source))
        for a, b in zip(jax.tree_util.tree_leaves(state["params"]), jax.tree_util.tree_leaves(expected), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    gin_registry.parse(["models/t5_1_1_tiny.gin", "architectures/ade.gin"])
    with pytest.raises(ValueError, match="does not fit the gin model"):
        train.initial_state(gin_config.model(), tx, mesh, seed=5, init_checkpoint=str(trained_run))


def test_loading_a_checkpoint_leaves_the_jobs_gin_config_alone(trained_run):
    """ADORE / eval / mine load checkpoints inside a gin-configured job: the job's bindings stay."""
    import gin

    from samtone_jax.cli import gin_registry

    gin_registry.parse(["runs/adore.gin"], ["MODEL_DIR = '/x'", "INIT = '/y'", "TASK = 't'", "LEARNING_RATE = 0.123"])
    before = gin.config_str()
    encoder = samtone_jax.load(str(trained_run))
    assert gin.config_str() == before and gin.query_parameter("adafactor.learning_rate") is not None
    assert encoder.query_length == 8


def test_read_bindings_handles_macros_multiline_values_and_comments():
    from samtone_jax.config import gin_config

    text = (
        "# Macros:\nSIZE = 64\nNAME = 'a#b'  # a comment\n"
        "T5Config.emb_dim = %SIZE\nT5Config.mlp_activations = ('gelu',\n    'linear')\n"
        "train.vocabulary = %NAME\nDualEncoder.projection_dim = None\n"
        "train.model_dir = \\\n    'gs://a-long-bucket-name/and/a/long/path'\n"  # gin's wrapping of a long value
    )
    got = gin_config.read_bindings(text)
    assert got["train.model_dir"] == "gs://a-long-bucket-name/and/a/long/path"
    assert got["T5Config.emb_dim"] == 64 and got["T5Config.mlp_activations"] == ("gelu", "linear")
    assert got["train.vocabulary"] == "a#b" and got["DualEncoder.projection_dim"] is None
    with pytest.raises(ValueError, match="unknown model parameters"):
        gin_config.model_from_gin_text("T5Config.emb_dimm = 3\n")


def test_the_embedder_stops_between_batches_once_a_training_stop_is_requested(trained_run):
    from samtone_jax.core import stop_request

    encoder = samtone_jax.load(str(trained_run))
    tokens, _ = encoder.vocabulary.tokenize_batch(TEXTS * 3, 12)
    embedder = TextEmbedder(encoder.model, encoder.params, encoder.vocabulary, batch_size=2, bucketed=False)
    seen = []
    assert embedder.encode_all(tokens, "query", progress=seen.append).shape[0] == len(tokens) > 2
    stop_request.request()
    try:
        seen.clear()
        with pytest.raises(stop_request.StopRequested):
            embedder.encode_all(tokens, "query", progress=seen.append)
        assert seen == [2]  # one batch, then the stop
    finally:
        stop_request.clear()
