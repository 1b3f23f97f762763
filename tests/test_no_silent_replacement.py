"""Nothing a user wrote is silently replaced or silently stale: outputs that cannot replace their
inputs or another writer's output, overwrites that always leave one complete version, soups, LoRA
bases, cached embeddings, model caches and calibrations that check what they read, and one-line
errors where a traceback was. The races and the kill are injected at a named point (a hook, a
patched function in a child process), never timed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import small_disk, tiny_train_argv, tiny_wordpiece_bert

from samtone_jax.cli import main as cli
from samtone_jax.core import atomic_file
from samtone_jax.core.errors import BadValueError, ExistingFileError, MissingFileError


def _fill(staging, text):
    with open(os.path.join(staging, "content.txt"), "w") as f:
        f.write(text)


def _content(folder):
    with open(os.path.join(folder, "content.txt")) as f:
        return f.read()


def _ended_pid():
    """The id of a process that has ended (not pid + 1 of one: that may be alive, e.g. a test worker)."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(dead.stdout)


def _one_line(capsys, code, *said):
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for s in said:
        assert s in err, err
    return err


# -- two writers, one output ------------------------------------------------------------------------


@pytest.mark.parametrize("exchange", [True, False], ids=["rename_exchange", "rename_aside"])
def test_a_second_writer_that_commits_first_is_never_replaced(tmp_path, monkeypatch, exchange):
    """Writer A starts; writer B (started later) commits inside A's body; A's commit is refused and B's
    output stays, whether A was told to overwrite or not (an overwrite replaces only what it saw)."""
    swaps, real_exchange = [], atomic_file._exchange

    def counted(a, b):
        if not exchange:  # the fall-back where the file system has no RENAME_EXCHANGE
            raise atomic_file._NoExchange()
        real_exchange(a, b)
        swaps.append(b)

    monkeypatch.setattr(atomic_file, "_exchange", counted)
    target = tmp_path / "out"
    with pytest.raises(ExistingFileError, match="written by another process while this one ran"):
        with atomic_file.atomic_directory(target) as a:
            _fill(a, "A")
            with atomic_file.atomic_directory(target) as b:
                _fill(b, "B")
    assert _content(target) == "B" and atomic_file.is_complete(target)
    # Both overwrite: A saw B's folder at its start; C replaces it meanwhile; A must not replace C's.
    with pytest.raises(ExistingFileError, match="written by another process"):
        with atomic_file.atomic_directory(target, overwrite=True) as a:
            _fill(a, "A2")
            with atomic_file.atomic_directory(target, overwrite=True) as c:
                _fill(c, "C")
    assert _content(target) == "C" and atomic_file.is_complete(target)
    # Alone, an overwrite replaces what it saw; no staging or aside folder is left behind.
    with atomic_file.atomic_directory(target, overwrite=True) as d:
        _fill(d, "D")
    assert _content(target) == "D" and sorted(os.listdir(tmp_path)) == ["out"]
    # the overwrites swapped (C's and D's commits, and A's swap and swap back) where the swap exists
    assert len(swaps) == (4 if exchange else 0)


def test_two_exports_to_one_new_out_the_second_to_commit_is_refused(trained_run, tmp_path, monkeypatch, capsys):
    """The CLI's export: a second `samtone export` run inside the first's staging (the hook: the first's
    model-card write) commits first; the first then exits 2 and the folder is the second's."""
    from samtone_jax.export import model_card

    out = tmp_path / "export"
    second = ["export", f"--checkpoint={trained_run}", "--format=hf", f"--out={out}"]
    real_card, calls = model_card.model_card, []

    def card_then_second_writer(**kwargs):
        calls.append(1)
        if len(calls) == 1:
            assert cli.main(second) == 0
        return real_card(**kwargs)

    monkeypatch.setattr(model_card, "model_card", card_then_second_writer)
    capsys.readouterr()
    code = cli.main(["export", f"--checkpoint={trained_run}", "--format=sentence-transformers", f"--out={out}"])
    _one_line(capsys, code, "written by another process while this one ran")
    assert json.loads((out / "samtone.json").read_text())["format"] == "hf"


def test_a_second_writer_on_a_bucket_is_refused(gcs):
    target = f"{gcs.bucket()}/out"
    with pytest.raises(ExistingFileError, match="written by another process"):
        with atomic_file.atomic_directory(target) as a:
            _fill(a, "A")
            with atomic_file.atomic_directory(target) as b:
                _fill(b, "B")
    from samtone_jax.core import paths

    assert (paths.as_path(target) / "content.txt").read_text() == "B" and atomic_file.is_complete(target)
    assert not paths.as_path(f"{target}.writing").exists()  # the claim is released


def test_a_bucket_writer_waits_for_no_one_another_live_claim_is_refused_a_dead_ones_taken_over(gcs):
    import json as json_module
    import socket

    from samtone_jax.core import paths

    target = f"{gcs.bucket()}/out"
    with atomic_file._remote_claim(paths.as_path(target)):  # another live writer of this host (us) holds it
        with pytest.raises(ExistingFileError, match=r"is being written by another process \(host"):
            with atomic_file.atomic_directory(target) as a:
                _fill(a, "A")
    assert not paths.as_path(target).exists()
    record = {"host": socket.gethostname(), "pid": _ended_pid(), "started": 0}
    paths.as_path(f"{target}.writing").write_text(json_module.dumps(record))  # a killed writer's claim
    with atomic_file.atomic_directory(target) as a:
        _fill(a, "A")
    assert (paths.as_path(target) / "content.txt").read_text() == "A"
    assert not paths.as_path(f"{target}.writing").exists()


# -- an output naming an input -----------------------------------------------------------------------


def test_an_out_that_is_inside_or_contains_an_input_is_refused_in_every_mode(
    trained_run, wordnet_env, tmp_path, capsys
):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    capsys.readouterr()
    cases = [
        (["average", "--checkpoint", str(run), str(trained_run), f"--out={run}", "--overwrite"], "is --checkpoint"),
        (["export", f"--checkpoint={run}", f"--out={run}", "--format=hf", "--overwrite"], "is --checkpoint"),
        (["export", f"--checkpoint={run}", f"--out={run}/checkpoints", "--format=hf", "--overwrite"], "is inside"),
        (["export", f"--checkpoint={run}/checkpoints/2", f"--out={run}", "--format=hf", "--overwrite"], "contains"),
        (["export", f"--checkpoint={run}", f"--out={run}/x", "--format=adapter", "--overwrite"], "is inside"),
        (["import-checkpoint", "--format=hf", f"--checkpoint={run}", f"--out={run}", "--overwrite"], "is --checkpoint"),
        (["analyze", f"--checkpoint={run}", "--task=wordnet_definitions", f"--out={run}"], "is --checkpoint"),
        (
            ["mine", "--bm25", "--task=wordnet_definitions", f"--out={wordnet_env[0]}/data.noun", "--overwrite"],
            "is --task=wordnet_definitions's data",
        ),
        (["score", f"--checkpoint={run}", "--task=wordnet_definitions", f"--out={run}"], "is --checkpoint"),
        (["encode", f"--checkpoint={run}/checkpoints/2", "--task=wordnet_definitions", f"--out={run}"], "contains"),
    ]
    for argv, said in cases:
        _one_line(capsys, cli.main(argv), said, "which this command reads")
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # nothing written or removed


def test_check_not_input_on_a_bucket_and_through_a_symbolic_link(tmp_path):
    from samtone_jax.core import paths

    with pytest.raises(BadValueError, match="is inside --checkpoint"):
        paths.check_not_input("gs://b/run/export", [("--checkpoint", "gs://b/run/")])
    with pytest.raises(BadValueError, match="contains --checkpoint"):
        paths.check_not_input("gs://b/run", [("--checkpoint", "gs://b/run/checkpoints/4")])
    paths.check_not_input("gs://b/run2", [("--checkpoint", "gs://b/run")])  # a sibling with a longer name
    (tmp_path / "run").mkdir()
    os.symlink(tmp_path / "run", tmp_path / "link")
    with pytest.raises(BadValueError, match="is --checkpoint"):
        paths.check_not_input(tmp_path / "link", [("--checkpoint", tmp_path / "run")])
    paths.check_not_input(tmp_path / "run" / "emb", [("--checkpoint", tmp_path / "run")], refuse=paths.NEW_FILES)


# -- a kill during an overwrite -------------------------------------------------------------------------

_KILLED_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from samtone_jax.core import atomic_file

    target, where = sys.argv[1], sys.argv[2]

    def die(*args):
        os.kill(os.getpid(), signal.SIGKILL)

    if where == "between_renames":  # the fall-back: old folder moved aside, new one not yet in place
        def no_exchange(a, b):
            raise atomic_file._NoExchange()
        atomic_file._exchange = no_exchange
        atomic_file._rename_into_place = die
    else:  # after the swap, before the old folder (now at the staging name) is removed
        swap = atomic_file._exchange
        def swapped_then_die(a, b):
            swap(a, b)
            die()
        atomic_file._exchange = swapped_then_die
    with atomic_file.atomic_directory(target, overwrite=True) as staging:
        open(os.path.join(staging, "content.txt"), "w").write("new")
    """
)


@pytest.mark.parametrize("where", ["between_renames", "after_exchange"])
def test_a_writer_killed_during_an_overwrite_leaves_a_version_the_next_write_recovers(tmp_path, where):
    target = tmp_path / "out"
    with atomic_file.atomic_directory(target) as staging:
        _fill(staging, "old")
    done = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(target), where], capture_output=True, text=True)
    assert done.returncode == -9, done.stderr  # SIGKILL: no cleanup ran
    leftovers = sorted(n for n in os.listdir(tmp_path) if n != "out")
    assert leftovers  # the killed writer's folders are still there
    if where == "between_renames":
        assert not target.exists()  # the window: both versions complete, under the names DESIGN.md gives
        assert {n.split("-")[0] for n in leftovers} == {"out.old", "out.tmp"}
    else:
        assert _content(target) == "new"  # the swap is one call: the target never lacked a version
        assert [_content(tmp_path / n) for n in leftovers] == ["old"]  # swapped out, not yet removed
    # The next write of the target puts the complete new version back (it is refused: the target exists).
    with pytest.raises(ExistingFileError, match="already exists"):
        with atomic_file.atomic_directory(target):
            pass
    assert _content(target) == "new" and atomic_file.is_complete(target)
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_only_a_killed_fall_back_overwrites_pair_is_put_back_never_a_lone_or_half_removed_folder(tmp_path):
    """After a swap the staging name holds the old version: if the writer died there and the user then
    deleted the target, the next write must not bring the old version back; nor a folder whose
    removal was cut short (its marker goes first); nor another dead writer's pair than its own."""
    pid, other = (_ended_pid() for _ in range(2))  # two processes that have ended (pid + 1 may be alive)
    target = tmp_path / "out"
    for name, text in ((f"out.tmp-{pid}-aaaa", "old, swapped out"), (f"out.old-{other}-bbbb", "another's old")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "content.txt").write_text(text)
        (tmp_path / name / atomic_file.MARKER).write_text("complete")
    with atomic_file.atomic_directory(target) as staging:
        _fill(staging, "mine")
    assert _content(target) == "mine" and sorted(os.listdir(tmp_path)) == ["out"]
    atomic_file._remove(str(target))  # (a removal: the marker first)
    assert not target.exists()


def test_an_interrupted_overwrite_on_a_bucket_is_finished_by_the_next_write(gcs, monkeypatch):
    from samtone_jax.core import paths

    target = f"{gcs.bucket()}/out"
    with atomic_file.atomic_directory(target) as staging:
        _fill(staging, "old")
    real, calls = atomic_file._finish_remote_move, []

    def killed_as_the_move_began(where):
        calls.append(1)
        if len(calls) == 2:  # the new version is uploaded whole to <target>.staged; the move begins
            (where / atomic_file.MARKER).unlink()  # (its first act: the old version's marker removed)
            raise KeyboardInterrupt  # as a kill here
        return real(where)

    monkeypatch.setattr(atomic_file, "_finish_remote_move", killed_as_the_move_began)
    with pytest.raises(KeyboardInterrupt), atomic_file.atomic_directory(target, overwrite=True) as staging:
        _fill(staging, "new")
    monkeypatch.setattr(atomic_file, "_finish_remote_move", real)
    staged = atomic_file._remote_staged(paths.as_path(target))
    assert atomic_file.is_complete(staged) and not atomic_file.is_complete(target)
    with pytest.raises(MissingFileError, match="complete new version waits in"):
        atomic_file.require_complete(target)
    with pytest.raises(ExistingFileError, match="already exists"):  # the next write finishes the move first
        with atomic_file.atomic_directory(target, overwrite=False):
            pass
    assert (paths.as_path(target) / "content.txt").read_text() == "new" and atomic_file.is_complete(target)
    assert not staged.exists()
    with atomic_file.atomic_directory(target, overwrite=True) as staging:
        _fill(staging, "newer")
    assert (paths.as_path(target) / "content.txt").read_text() == "newer" and not staged.exists()


def test_sharded_parameter_writes_replace_only_what_they_saw_locally_and_on_a_bucket(tmp_path, gcs):
    import jax.numpy as jnp

    from samtone_jax.checkpoints.params_io import load_params, save_sharded_params
    from samtone_jax.core import paths

    for target in (str(tmp_path / "soup"), f"{gcs.bucket()}/soup"):
        save_sharded_params(target, {"w": jnp.ones(3)}, "# gin", {"n": 1})
        with pytest.raises(ExistingFileError, match="already exists"):
            save_sharded_params(target, {"w": jnp.zeros(3)}, "# gin")
        paths.as_path(f"{target}.staged").mkdir(parents=True, exist_ok=True)  # a killed writer's leftover
        (paths.as_path(f"{target}.staged") / "junk").write_text("x")
        save_sharded_params(target, {"w": jnp.full(3, 2.0)}, "# gin", {"n": 2}, overwrite=True)
        np.testing.assert_array_equal(load_params(target)["w"], np.full(3, 2.0))
        assert not paths.as_path(f"{target}.staged").exists()
        assert json.loads((paths.as_path(target) / "info.json").read_text()) == {"n": 2}


# -- soups ------------------------------------------------------------------------------------------


def test_a_soup_of_runs_with_other_vocabularies_prompts_or_tower_families_is_refused(
    trained_run, wordnet_env, tiny_bert_import, tmp_path, capsys
):
    from samtone_jax.data import vocab
    from samtone_jax.tasks import catalogue

    other = tmp_path / "other"
    shutil.copytree(trained_run, other)
    texts = [t.upper() for t in catalogue.collection("wordnet_definitions", "all").texts()[:300]]
    vocab.train_sentencepiece(texts, 100, str(tmp_path / "other.model"))  # the same size, other pieces
    assert (tmp_path / "other.model").read_bytes() != (trained_run / "vocab.model").read_bytes()
    shutil.copy(tmp_path / "other.model", other / "vocab.model")
    capsys.readouterr()
    code = cli.main(["average", "--checkpoint", str(trained_run), str(other), f"--out={tmp_path / 'soup'}"])
    _one_line(capsys, code, "differ in", "vocabulary: vocab.model sha256")
    shutil.copy(trained_run / "vocab.model", other / "vocab.model")
    with open(other / "config.gin", "a") as f:
        f.write("\nprompts.query = 'query: '\n")
    code = cli.main(["average", "--checkpoint", str(trained_run), str(other), f"--out={tmp_path / 'soup'}"])
    _one_line(capsys, code, "prompts: ", "'query: '")
    code = cli.main(["average", "--checkpoint", str(trained_run), str(tiny_bert_import[1]), f"--out={tmp_path / 's'}"])
    _one_line(capsys, code, "tower family: T5Config in", "BertConfig in")
    assert not (tmp_path / "soup").exists() and not (tmp_path / "s").exists()


# -- a LoRA run's base ----------------------------------------------------------------------------------


def test_a_lora_runs_replaced_or_deleted_base_is_refused_naming_both(wordnet_env, tiny_bert_import, tmp_path, capsys):
    from conftest import tiny_bert_train_argv

    import samtone_jax

    base = tmp_path / "base"
    shutil.copytree(tiny_bert_import[1], base)
    run = tmp_path / "lora"
    extra = ["--gin.DualEncoder.architecture='ade_lora'", "--gin.DualEncoder.lora_rank=2"]
    assert cli.main(tiny_bert_train_argv(run, (tiny_bert_import[0], base), steps=1, extra=extra)) == 0
    samtone_jax.load(str(run)).encode_queries(["a dog"])  # loads as trained
    # Another model written at the base's path (an import again: new parameters' checkpoint).
    hf = tiny_bert_import[1].parent / "hf"
    assert cli.main(["import-checkpoint", "--format=hf", f"--checkpoint={hf}", f"--out={base}", "--overwrite"]) == 0
    capsys.readouterr()
    with pytest.raises(BadValueError, match=r"the frozen tower of .* was replaced: .*base.json names .* fingerprint"):
        samtone_jax.load(str(run))
    code = cli.main(["export", f"--checkpoint={run}", "--format=hf", f"--out={tmp_path / 'x'}"])
    _one_line(capsys, code, "was replaced")
    shutil.rmtree(base)
    code = cli.main(["export", f"--checkpoint={run}", "--format=hf", f"--out={tmp_path / 'x'}"])
    _one_line(capsys, code, "the frozen tower of", f"{base}, named in {run}/base.json, does not exist")


# -- cached embeddings ----------------------------------------------------------------------------------


def test_cached_embeddings_of_another_vocabulary_or_training_are_recomputed(trained_run, wordnet_env, tmp_path, caplog):
    import samtone_jax
    from samtone_jax.data import vocab
    from samtone_jax.evaluation.run import embed
    from samtone_jax.inference import encoder as inference

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    texts = {f"d{i}": t for i, t in enumerate(["a small dog", "the act of running", "a large body of water"])}
    out = str(tmp_path / "cache")
    _, first = embed(inference.load_encoder(str(run)), texts, "document", out)
    vocab.train_sentencepiece([t.upper() for t in texts.values()] * 50, 100, str(tmp_path / "v.model"))
    other = inference.load_encoder(str(run), vocabulary=str(tmp_path / "v.model"))
    with caplog.at_level("WARNING"):
        _, again = embed(other, texts, "document", out)
    assert "vocabulary_sha256" in caplog.text and "encoding again" in caplog.text
    np.testing.assert_allclose(again, other.encode_documents(list(texts.values())), atol=1e-6)
    assert np.abs(again - first).max() > 1e-3  # (the stale ones would have been `first`)
    # Retrained to the same step in the same folder (another learning rate): recomputed again.
    shutil.rmtree(run / "checkpoints")
    argv = tiny_train_argv(run, wordnet_env[1], extra=["--gin.adafactor.learning_rate=0.5"])
    assert cli.main(argv) == 0
    retrained = samtone_jax.load(str(run))
    caplog.clear()
    with caplog.at_level("WARNING"):
        _, third = embed(retrained, texts, "document", out)
    assert "checkpoint" in caplog.text and "encoding again" in caplog.text
    np.testing.assert_allclose(third, retrained.encode_documents(list(texts.values())), atol=1e-6)
    # The same model again: reused (nothing encoded, no warning).
    caplog.clear()
    with caplog.at_level("WARNING"):
        embed(retrained, texts, "document", out)
    assert "encoding again" not in caplog.text


def test_encode_into_a_named_folder_of_other_embeddings_is_refused(trained_run, wordnet_env, tmp_path, capsys):
    from samtone_jax.data import vocab
    from samtone_jax.tasks import catalogue

    out = tmp_path / "emb"
    argv = ["encode", f"--checkpoint={trained_run}", "--task=wordnet_definitions", "--split=all", f"--out={out}"]
    assert cli.main([*argv, "--side=query"]) == 0
    texts = [t.upper() for t in catalogue.collection("wordnet_definitions", "all").texts()[:300]]
    vocab.train_sentencepiece(texts, 100, str(tmp_path / "v.model"))
    capsys.readouterr()
    code = cli.main([*argv, "--side=query", f"--vocabulary={tmp_path / 'v.model'}"])
    _one_line(capsys, code, "holds embeddings of something else (differs in vocabulary_sha256)")


# -- the pretrained model's cache -------------------------------------------------------------------------


@pytest.mark.slow
def test_a_damaged_model_cache_is_noticed_and_extracted_again(tmp_path, monkeypatch):
    from samtone_jax.checkpoints import pretrained

    monkeypatch.setenv("SAMTONE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SAMTONE_MINILM_DIR", raising=False)
    folder = pretrained.minilm_folder()
    weights = os.path.join(folder, pretrained.WEIGHTS)
    hashed = []
    real = pretrained._sha256
    monkeypatch.setattr(pretrained, "_sha256", lambda p: hashed.append(p) or real(p))
    assert pretrained.minilm_folder() == folder and hashed == []  # unchanged since hashed: the stamp says so
    size = os.path.getsize(weights)
    with open(weights, "r+b") as f:  # 4 KB overwritten in place: the same size
        f.seek(size // 2)
        f.write(b"\xff" * 4096)
    assert os.path.getsize(weights) == size
    assert pretrained.minilm_folder() == folder
    assert real(weights) == pretrained.WEIGHTS_SHA256  # extracted again
    assert not [n for n in os.listdir(tmp_path) if "damaged" in n]


# -- calibrations -----------------------------------------------------------------------------------------


def test_a_calibration_with_nan_or_reversed_ranges_or_no_dimension_is_refused(
    trained_run, wordnet_env, tmp_path, capsys
):
    from samtone_jax.compression import calibration

    record = calibration.Calibration.from_sample(np.random.default_rng(0).normal(size=(50, 8)), None).record
    bad = json.loads(json.dumps(record))
    bad["int8_ranges"]["8"][0][3] = float("nan")
    with pytest.raises(BadValueError, match="1 of 8 dimensions have a non-finite or reversed .* dimension 3"):
        calibration.Calibration(bad)
    reversed_ = json.loads(json.dumps(record))
    reversed_["int8_ranges"]["8"][0][5] = 10.0
    with pytest.raises(BadValueError, match="dimension 5"):
        calibration.Calibration(reversed_)
    del record["dimension"]
    with pytest.raises(BadValueError, match="is damaged \\(no 'dimension'\\)"):
        calibration.Calibration(record, "x/calibration.json")
    # Through eval: a run's calibration.json with NaN ranges is one line, before any search.
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    assert cli.main(["calibrate", f"--checkpoint={run}", "--task=wordnet_definitions", "--split=all"]) == 0
    path = run / "calibration.json"
    saved = json.loads(path.read_text())
    for ranges in saved["int8_ranges"].values():
        ranges[1][0] = float("nan")
    path.write_text(json.dumps(saved))
    capsys.readouterr()
    code = cli.main(["eval", f"--checkpoint={run}", "--task=wordnet_definitions", "--split=all", "--precisions=int8"])
    _one_line(capsys, code, "calibration.json's int8 ranges", "non-finite")


# -- steps without their commit marker --------------------------------------------------------------------


def test_a_step_without_its_commit_marker_is_not_averaged_loaded_or_resumed(trained_run, wordnet_env, tmp_path, capsys):
    import samtone_jax

    copy = tmp_path / "copy"
    shutil.copytree(trained_run, copy)
    (copy / "checkpoints" / "2" / "commit_success.txt").unlink()  # a copy taken while step 2 was saved
    capsys.readouterr()
    code = cli.main(["average", "--checkpoint", f"{copy}/checkpoints/2", str(trained_run), f"--out={tmp_path / 's'}"])
    _one_line(capsys, code, "is an incomplete checkpoint: it has no commit_success.txt")
    with pytest.raises(MissingFileError, match="no checkpoint in"):
        samtone_jax.load(str(copy))
    # Training in the copy does not resume from it: it is moved aside, and the run starts over.
    assert cli.main(tiny_train_argv(copy, wordnet_env[1], steps=1)) == 0
    names = sorted(p.name for p in (copy / "checkpoints").iterdir())
    assert names[0] == "1" and names[1].startswith("2.incomplete-"), names
    assert "step 1/1" in capsys.readouterr().out


# -- one line, not a traceback ------------------------------------------------------------------------------


def test_a_truncated_safetensors_import_is_one_line(wordnet_env, tmp_path, capsys):
    hf = tiny_wordpiece_bert(tmp_path / "hf", ["a small dog", "the act of running"] * 20)
    weights = hf / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    capsys.readouterr()
    code = cli.main(["import-checkpoint", "--format=hf", f"--checkpoint={hf}", f"--out={tmp_path / 'out'}"])
    _one_line(capsys, code, f"{weights} is damaged or truncated")


def test_an_export_onto_a_full_disk_is_one_line_and_leaves_nothing(trained_run, tmp_path):
    with small_disk(tmp_path / "small", "64k", "a disk an export fills") as small:
        argv = ["export", f"--checkpoint={trained_run}", "--format=sentence-transformers", f"--out={small}/export"]
        done = subprocess.run(
            [sys.executable, "-m", "samtone_jax.cli.main", *argv], capture_output=True, text=True, timeout=300
        )
        left = os.listdir(small)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "No space left on device" in lines[0] and "nothing was written there" in lines[0], lines[0]
    assert left == []


def test_a_teacher_folder_with_a_code_pickle_is_refused_in_one_line_without_advice_to_disable_the_check(
    wordnet_env, tmp_path, capsys
):
    import pickle

    import torch

    class Code:
        def __reduce__(self):
            return (print, ("this would run",))

    teacher = tmp_path / "teacher"
    teacher.mkdir()
    (teacher / "modules.json").write_text(
        json.dumps([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}])
    )
    (teacher / "config.json").write_text('{"model_type": "bert"}')
    torch.save({"w": Code()}, teacher / "pytorch_model.bin", pickle_module=pickle)
    capsys.readouterr()
    code = cli.main(["score", f"--checkpoint={teacher}", "--task=wordnet_definitions", f"--out={tmp_path / 's.jsonl'}"])
    err = _one_line(capsys, code, "holds more than tensors (a pickle that would run code), so it is not loaded")
    assert "weights_only=False" not in err and "this would run" not in capsys.readouterr().out


# -- messages that said the wrong thing ----------------------------------------------------------------


def test_an_hf_import_of_an_unsupported_model_type_names_it(tmp_path, capsys):
    folder = tmp_path / "xlnet"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "xlnet"}')
    capsys.readouterr()
    code = cli.main(["import-checkpoint", "--format=hf", f"--checkpoint={folder}", f"--out={tmp_path / 'o'}"])
    _one_line(capsys, code, "model_type 'xlnet', which no tower family here loads; supported: t5", "bert (")
    from samtone_jax.checkpoints import hf

    (folder / "config.json").write_text("{}")  # no model_type: the T5 route, as before
    assert hf.configured_folder("hf", str(folder)) is None


def test_a_run_of_another_tower_family_in_model_dir_is_named_by_family(trained_run, tiny_bert_import):
    from samtone_jax.config import gin_config
    from samtone_jax.training import loop

    bert = gin_config.model_from_gin_text((tiny_bert_import[1] / "model.gin").read_text())
    with pytest.raises(BadValueError, match=r"holds a T5 run \(step 2\), and this config builds a Bert model: delete"):
        loop.check_existing_run(trained_run, bert, 10)


def test_an_empty_split_of_your_own_pairs_names_the_split_rule(tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"query": f"q{i}", "document": f"d{i}"}) + "\n" for i in range(3)))
    tasks = {"mine": {"format": "jsonl", "path": str(pairs), "test_fraction": 1e-6}}
    capsys.readouterr()
    code = cli.main(["data-stats", "--task=mine", "--split=test", f"--gin.local_tasks.tasks={tasks!r}"])
    _one_line(capsys, code, "mine/test is empty: the split rule (local_tasks.tasks['mine']['test_fraction'] = 1e-06)")
