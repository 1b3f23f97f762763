"""gs:// end to end against a real local GCS emulator (fake-gcs-server, started by the `gcs`
fixture): the path layer, complete-or-absent writes, data, checkpoint imports, eval / encode /
export / mine / analyze / compare and `samtone_jax.load` on a bucket; plus local relative paths.

Training on gs:// (SIGKILL + bit-exact resume, two processes) is in test_train_loop.py."""

from __future__ import annotations

import gzip
import json
import os

import fsspec
import numpy as np
import pytest
from conftest import require_shared

import samtone_jax
from samtone_jax.cli import main as cli
from samtone_jax.core import paths
from samtone_jax.core.atomic_file import MARKER, atomic_directory, atomic_open, write_atomic

TEXTS = ["a dog barked at the mailman", "the bank of the river was muddy", "an animal that lives in water"]


def _objects(url: str) -> list[str]:
    return sorted(p.split("/", 1)[1] for p in fsspec.filesystem("gs").find(url))


def test_local_paths_are_normalised_and_absolute_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert str(paths.as_path("a/../b")) == str(tmp_path / "b")
    assert paths.join("x/..", "y", "z.txt") == str(tmp_path / "y" / "z.txt")
    assert str(paths.as_path("gs://bucket/run/x")) == "gs://bucket/run/x"
    with pytest.raises(ValueError, match="unsupported URL scheme"):
        paths.as_path("ftp://host/x")


def test_import_of_a_t5x_checkpoint_given_by_a_relative_path_with_dotdot(tmp_path, monkeypatch):
    """tensorstore refuses `..` in file paths: the importer normalises the path first."""
    directory = require_shared("checkpoints/t5x_retrieval_de_t5_tiny_checkpoint_1000")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    relative = os.path.relpath(directory, work)  # ../../.../checkpoints/...
    assert relative.startswith("..")
    argv = [
        "import-checkpoint",
        "--format=t5x",
        f"--checkpoint={relative}",
        "--out=../imported",
        "--gin_file=models/t5_1_1_tiny.gin",
        "--gin_file=architectures/sde.gin",
        "--gin.VOCAB_SIZE=32128",
        "--gin.T5Config.emb_dim=4",
        "--gin.T5Config.num_heads=2",
        "--gin.T5Config.head_dim=2",
        "--gin.T5Config.mlp_dim=8",
        "--gin.T5Config.mlp_activations=('relu',)",
        "--gin.T5Config.relative_attention_num_buckets=4",
        "--gin.PROJECTION_DIM=768",
    ]
    assert cli.main(argv) == 0
    assert (tmp_path / "imported" / MARKER).exists()


def test_whole_file_writes_on_a_bucket_are_complete_or_absent(gcs):
    bucket = gcs.bucket()
    write_atomic(f"{bucket}/a/b.txt", "hello")
    assert paths.as_path(f"{bucket}/a/b.txt").read_text() == "hello"
    with pytest.raises(RuntimeError), atomic_open(f"{bucket}/a/partial.bin") as f:
        f.write(b"x" * 100_000)
        raise RuntimeError("killed mid-write")
    with pytest.raises(RuntimeError), atomic_open(f"{bucket}/a/b.txt", "w") as f:
        f.write("half of the new")
        raise RuntimeError("killed mid-write")
    assert _objects(bucket) == ["a/b.txt"] and paths.as_path(f"{bucket}/a/b.txt").read_text() == "hello"


def test_a_folder_on_a_bucket_gets_its_marker_last_and_readers_require_it(gcs, trained_run, tmp_path):
    bucket = gcs.bucket()
    with pytest.raises(RuntimeError), atomic_directory(f"{bucket}/folder") as staging:
        (paths.as_path(staging) / "x.txt").write_text("x")
        raise RuntimeError("killed before the end")
    assert _objects(bucket) == []
    with atomic_directory(f"{bucket}/folder") as staging:
        (paths.as_path(staging) / "sub").mkdir()
        (paths.as_path(staging) / "sub" / "y.txt").write_text("y")
    assert _objects(bucket) == [f"folder/{MARKER}", "folder/sub/y.txt"]
    with pytest.raises(FileExistsError):
        with atomic_directory(f"{bucket}/folder"):
            pass
    # An export whose upload was cut off before its marker is refused by every reader.
    export = tmp_path / "export"
    assert cli.main(["export", f"--checkpoint={trained_run}", "--format=hf", f"--out={export}"]) == 0
    (export / MARKER).unlink()
    gcs.upload(export, f"{bucket}/cut_off")
    with pytest.raises(FileNotFoundError, match="incomplete export"):
        samtone_jax.load(f"{bucket}/cut_off")


def test_a_missing_bucket_names_the_path_and_what_to_do(gcs, trained_run, capsys):
    with pytest.raises(FileNotFoundError, match=r"train.model_dir='gs://no-such-bucket/run'.*does not exist"):
        paths.check_bucket("gs://no-such-bucket/run", "train.model_dir")
    assert cli.main(["export", f"--checkpoint={trained_run}", "--format=hf", "--out=gs://no-such-bucket/x"]) == 2
    assert "gs://no-such-bucket does not exist; create it" in capsys.readouterr().err


def test_data_readers_read_a_bucket_gzip_included(gcs, wordnet_data):
    from samtone_jax.data import records, wordnet

    bucket = gcs.bucket()
    wn = wordnet_data[0]
    remote = gcs.upload(wn, f"{bucket}/wordnet")
    local, from_bucket = wordnet.load_collection(str(wn)), wordnet.load_collection(remote)
    assert from_bucket.queries == local.queries and from_bucket.corpus == local.corpus
    assert from_bucket.qrels == local.qrels
    lines = [{"id": i, "text": f"ünïcode {i}"} for i in range(3)]
    raw = gzip.compress("".join(json.dumps(x) + "\n" for x in lines).encode())
    write_atomic(f"{bucket}/x.jsonl.gz", raw)
    assert list(records.read_jsonl(f"{bucket}/x.jsonl.gz", records.ReadStats())) == lines
    with pytest.raises(FileNotFoundError, match="nope.jsonl not found"):
        list(records.read_jsonl(f"{bucket}/nope.jsonl", records.ReadStats()))


def test_checkpoint_imports_read_t5x_and_mesh_tf_from_a_bucket(gcs):
    from test_checkpoints_real import RETRIEVAL_TINY

    from samtone_jax.checkpoints import import_params
    from samtone_jax.checkpoints import mtf as mtf_format
    from samtone_jax.models import DualEncoder

    t5x_dir = require_shared("checkpoints/t5x_retrieval_de_t5_tiny_checkpoint_1000")
    mtf_dir = require_shared("checkpoints/mtf_tiny_t5_index_only")
    bucket = gcs.bucket()
    remote = gcs.upload(t5x_dir, f"{bucket}/t5x/checkpoint_1000")
    model = DualEncoder(RETRIEVAL_TINY, architecture="sde", projection_dim=768)
    local_params, _ = import_params("t5x", str(t5x_dir), model)
    remote_params, info = import_params("t5x", remote, model)
    assert info["projection_from_source"] and info["source"] == remote
    import jax

    for a, b in zip(jax.tree_util.tree_leaves(local_params), jax.tree_util.tree_leaves(remote_params), strict=True):
        np.testing.assert_array_equal(a, b)
    # Mesh-TF: the index-only fixture lists its variables (values need the absent data shards).
    remote_mtf = gcs.upload(mtf_dir, f"{bucket}/mtf")
    for prefix in (remote_mtf, f"{remote_mtf}/model.ckpt-0"):
        assert mtf_format.open_source(prefix).names == mtf_format.open_source(str(mtf_dir / "model.ckpt-0")).names


@pytest.mark.slow
def test_eval_encode_export_mine_analyze_compare_and_load_on_a_bucket(gcs, trained_run, wordnet_env):
    """A run in the bucket (as `samtone train` writes it: see test_train_loop.py) evaluated, encoded,
    exported and loaded there, with every output in the bucket and nothing written locally."""
    bucket = gcs.bucket()
    run = gcs.upload(trained_run, f"{bucket}/run", skip=("eval", "embeddings"))  # what `samtone train` writes
    local = samtone_jax.load(str(trained_run))
    np.testing.assert_array_equal(samtone_jax.load(run).encode_queries(TEXTS), local.encode_queries(TEXTS))
    np.testing.assert_array_equal(
        samtone_jax.load(f"{run}/checkpoints/2").encode_documents(TEXTS), local.encode_documents(TEXTS)
    )

    task = ["--gin.evaluate.task='wordnet_definitions'", "--gin.evaluate.split='all'", "--gin.evaluate.k=10"]
    assert cli.main(["eval", f"--gin.evaluate.model_dir='{run}'", *task]) == 0
    record = json.loads(paths.as_path(f"{run}/eval/wordnet_definitions_all_step2.json").read_text())
    assert record["step"] == 2 and 0 <= record["metrics"]["P@1"] <= 1
    assert paths.as_path(f"{run}/eval/wordnet_definitions_all_step2.trec").read_text().count("\n") > 0
    shards = f"{run}/eval/embeddings/wordnet_definitions_all_step2/documents"
    assert MARKER not in _objects(shards) and any(o.endswith(".npz") for o in _objects(shards))

    flags = ["--task=wordnet_definitions", "--split=all"]
    assert cli.main(["encode", f"--checkpoint={run}", *flags, "--side=query", f"--out={bucket}/emb"]) == 0
    from samtone_jax.evaluation import embedding_store

    ids, q = embedding_store.load_shards(f"{bucket}/emb/queries")
    from samtone_jax.tasks import catalogue

    queries = catalogue.collection("wordnet_definitions", "all").queries
    np.testing.assert_allclose(q, local.encode_queries([queries[i] for i in ids]), rtol=1e-5, atol=1e-6)

    assert cli.main(["export", f"--checkpoint={run}", "--format=hf", f"--out={bucket}/export"]) == 0
    assert f"export/{MARKER}" in _objects(bucket)
    exported = samtone_jax.load(f"{bucket}/export")
    np.testing.assert_allclose(exported.encode_queries(TEXTS), local.encode_queries(TEXTS), rtol=1e-5, atol=1e-6)
    # A plain Hugging Face T5 folder in a bucket (the export's config + weights alone) imports too.
    fs = fsspec.filesystem("gs")
    for name in ("config.json", "model.safetensors"):
        fs.copy(f"{bucket}/export/{name}", f"{bucket}/plain_hf/{name}")
    from samtone_jax.checkpoints import import_params

    hf_params, info = import_params("hf", f"{bucket}/plain_hf", local.model)
    np.testing.assert_array_equal(hf_params["encoder"]["token_embedder"], local.params["encoder"]["token_embedder"])

    assert cli.main(["mine", "--bm25", *flags, "--num_negatives=2", f"--out={bucket}/negatives.tsv"]) == 0
    mined = paths.as_path(f"{bucket}/negatives.tsv").read_text().splitlines()
    assert mined and all(len(line.split("\t")) == 2 for line in mined)
    assert json.loads(paths.as_path(f"{bucket}/negatives.tsv.json").read_text())["queries"] > 0

    argv = [
        "analyze",
        f"--checkpoint={run}",
        "--name=run",
        *flags,
        f"--out={bucket}/analysis",
        "--tsne_sample=8",
        "--ratio_pairs=50",
    ]
    assert cli.main(argv) == 0
    assert {"tsne.png", "summary.json", "report.md"} <= {o.rsplit("/", 1)[-1] for o in _objects(f"{bucket}/analysis")}

    result = f"{run}/eval/wordnet_definitions_all_step2.json"
    assert cli.main(["compare", result, result, "--trials=10"]) == 0


@pytest.mark.slow
def test_storage_lost_during_a_checkpoint_save_fails_clearly_and_the_last_checkpoint_resumes(tmp_path):
    """The bucket's server goes away after checkpoint 3 (an emulator of the test's own, stopped):
    saving step 6 fails after the client's retries with an error naming the step, the folder and
    the last complete checkpoint; once the server is back, checkpoint 3 restores bit for bit.
    (The end-to-end resume of a killed gs:// run is test_train_loop's SIGKILL test.)"""
    import time

    import jax
    import jax.numpy as jnp
    from conftest import GCSEmulator

    from samtone_jax.checkpoints.train_checkpoints import CheckpointSaveError, TrainCheckpointer

    emulator = GCSEmulator(tmp_path / "gcs_root")
    emulator.start()
    try:
        with emulator.clients_pointed_here():
            directory = f"{emulator.bucket()}/run/checkpoints"
            state = {"step": jnp.int32(3), "params": {"w": jnp.arange(6.0).reshape(2, 3)}}
            checkpointer = TrainCheckpointer(directory, every=3, keep=3)
            checkpointer.maybe_save(3, state)
            checkpointer.save(3, state)  # waits for the asynchronous save of step 3
            emulator.stop()
            later = jax.tree_util.tree_map(lambda x: x + 1, state)
            start = time.time()
            with pytest.raises(
                CheckpointSaveError, match=r"checkpoint of step 6 in gs://.*last complete checkpoint: step 3"
            ):
                checkpointer.save(6, later)
            print(f"gave up after {time.time() - start:.0f} s of the client's retries")
            checkpointer.close()
            emulator.start()
            restored, step = TrainCheckpointer(directory, every=3, keep=3).restore_latest(later)
            assert step == 3
            for a, b in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(state), strict=True):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    finally:
        emulator.stop()
