"""Your own data as tasks: JSON lines of pairs / triplets (data/jsonl_pairs.py), a BEIR folder and an
MS MARCO-style folder at any path, declared in gin (tasks/declared.py: local_tasks, mixtures), read
by every mode (--gin on mine / encode / score / data-stats / build-vocab / tasks), and eval's plain
flags; GUIDE's step-by-step fine-tune commands at tiny size."""

from __future__ import annotations

import gzip
import hashlib
import json

import pytest

from samtone_jax.cli import evaluate, flags, gin_registry
from samtone_jax.cli import main as cli
from samtone_jax.core.errors import BadValueError
from samtone_jax.data import jsonl_pairs, msmarco
from samtone_jax.tasks import catalogue


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def local(name, spec) -> str:
    return f"local_tasks.tasks = {{{name!r}: {spec!r}}}"


def test_jsonl_pairs_triplets_ids_and_scores(tmp_path):
    path = write_jsonl(
        tmp_path / "pairs.jsonl",
        [
            {"query": "what is a cat", "document": "A small feline."},
            {"query": "what is a cat", "document": "A pet that purrs.", "negative": "A large dog."},
            {"query": "big dog", "document": "A large dog.", "negatives": ["A small feline.", "A fish."]},
            {"query": "q3", "document": "D", "query_id": "Q3", "document_id": 7, "negative_ids": ["N"]}
            | {"negatives": ["not d"], "document_score": 9.5, "negative_scores": [1.25]},
        ],
    )
    c = jsonl_pairs.load(str(path), "mine")
    cat, dog = (f"q{jsonl_pairs.text_id(t)}" for t in ("what is a cat", "big dog"))
    feline, purrs, large, fish = (
        f"d{jsonl_pairs.text_id(t)}" for t in ("a small feline.", "A pet that purrs.", "A large dog.", "A fish.")
    )
    assert c.qrels[cat] == {feline: 1, purrs: 1} and c.qrels[dog] == {large: 1} and c.qrels["Q3"] == {"7": 1}
    assert c.corpus[feline] == "A small feline." and c.corpus["7"] == "D" and c.corpus["N"] == "not d"
    # the cat's negative is relevant to the dog query, not to the cat: kept; none is its own positive
    assert c.hard_negatives[cat] == [large] and c.hard_negatives[dog] == [feline, fish]
    assert c.teacher_scores == {"Q3": {"7": 9.5, "N": 1.25}}
    assert len(c.pairs()) == 4


@pytest.mark.parametrize(
    "row, message",
    [
        ({"query": "a"}, "missing field"),
        ({"query": "a", "document": 3}, "'document' must be a string"),
        ({"query": "a", "document": "b", "negativs": []}, r"unknown field\(s\) \['negativs'\]"),
        ({"query": "a", "document": "b", "negative": "c", "negatives": ["d"]}, "not both"),
        ({"query": "a", "document": "b", "negatives": ["c"], "negative_ids": []}, "as long as the negatives"),
        ({"query": "a", "document": "b", "document_score": 1.0}, "need 'document_score' and 'negative_scores'"),
        ({"query": "a", "document": "b", "negatives": ["c"], "document_score": 1, "negative_scores": [None]}, "finite"),
    ],
)
def test_jsonl_pairs_bad_line_names_file_and_line(tmp_path, row, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"query": "ok", "document": "fine"}, row])
    with pytest.raises(BadValueError, match=rf"bad.jsonl:2: .*{message}"):
        jsonl_pairs.load(str(path), "bad")
    assert len(jsonl_pairs.load(str(path), "bad", skip_bad_records=True).pairs()) == 1


def test_an_id_with_two_texts_is_refused_naming_both_lines(tmp_path):
    rows = [{"query": "a", "document": "x", "document_id": "d1"}, {"query": "b", "document": "y", "document_id": "d1"}]
    with pytest.raises(BadValueError, match=r"dup.jsonl:2: document id 'd1' has another text on line 1"):
        jsonl_pairs.load(str(write_jsonl(tmp_path / "dup.jsonl", rows)), "dup")
    rows[1]["document"] = "x"  # the same text again is the same document
    assert len(jsonl_pairs.load(str(write_jsonl(tmp_path / "same.jsonl", rows)), "same").corpus) == 1


def test_one_file_splits_by_the_stated_rule(tmp_path):
    rows = [{"query": f"question {i % 300}", "document": f"answer {i}"} for i in range(900)]
    gin_registry.parse(
        [], [local("split_rule", {"format": "jsonl", "path": str(write_jsonl(tmp_path / "p.jsonl", rows))})]
    )
    train, test, every = (catalogue.collection("split_rule", s) for s in ("train", "test", "all"))

    def expected_test(text):  # the rule as the docstring states it, computed here
        return int(hashlib.md5(text.lower().encode()).hexdigest()[:8], 16) < 0.1 * 16**8

    assert {t for t in test.queries.values()} == {f"question {i}" for i in range(300) if expected_test(f"question {i}")}
    assert set(train.queries.values()) | set(test.queries.values()) == set(every.queries.values())
    assert not set(train.queries) & set(test.queries) and 10 <= len(test.queries) <= 50
    assert all(len(r) == 3 for r in test.qrels.values())  # every pair of a test query is in test


def test_local_task_declarations_are_checked():
    for spec, message in [
        ({"format": "csv", "path": "x"}, "'format' must be one of jsonl, beir, msmarco"),
        ({"format": "jsonl"}, "give 'path'"),
        ({"format": "jsonl", "path": "a", "files": {"train": "b"}}, "give 'path'"),
        ({"format": "jsonl", "path": "a", "test_fraction": 1.5}, r"'test_fraction' must be in \[0, 1\)"),
        ({"format": "beir", "path": "a", "test_fraction": 0.1}, "a beir task takes 'path'"),
        ({"format": "jsonl", "path": "a", "pth": "b"}, r"unknown key\(s\) \['pth'\]"),
    ]:
        gin_registry.parse([], [local("t", spec)])
        with pytest.raises(BadValueError, match=message):
            catalogue.loaders()
    gin_registry.parse([], [local("wordnet_definitions", {"format": "jsonl", "path": "a"})])
    with pytest.raises(BadValueError, match="built-in tasks' names"):
        catalogue.loaders()


def test_local_beir_and_msmarco_folders_and_their_duplicate_ids(tmp_path):
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    write_jsonl(beir / "corpus.jsonl", [{"_id": "d1", "title": "T", "text": "one"}, {"_id": "d2", "text": "two"}])
    write_jsonl(beir / "queries.jsonl", [{"_id": "q1", "text": "first"}])
    (beir / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td2\t1\n")
    ms = tmp_path / "ms"
    ms.mkdir()
    (ms / "collection.tsv").write_text("p1\tpassage one\np2\tpassage two\np1\tpassage one\n")
    (ms / "queries.train.tsv").write_text("7\ta question\n")
    (ms / "qrels.train.tsv").write_text("7\t0\tp2\t1\n")
    gin_registry.parse(
        [],
        [
            "local_tasks.tasks = "
            + repr(
                {
                    "b": {"format": "beir", "path": str(beir), "splits": ("train",)},
                    "m": {"format": "msmarco", "path": str(ms)},
                }
            )
        ],
    )
    b, m = catalogue.collection("b", "train"), catalogue.collection("m", "train")
    assert b.name == "b" and b.corpus == {"d1": "T one", "d2": "two"} and b.pairs() == [("q1", "d2")]
    assert m.name == "m" and m.pairs() == [("7", "p2")] and m.stats["duplicate_document_lines"] == 1
    (ms / "collection.tsv").write_text("p1\tpassage one\np2\tpassage two\np2\tanother passage\n")
    with pytest.raises(BadValueError, match=r"collection.tsv:3: document id 'p2' is also on line 2 with another text"):
        msmarco.load_msmarco(str(ms), "train")
    write_jsonl(beir / "corpus.jsonl", [{"_id": "d1", "text": "one"}, {"_id": "d1", "text": "uno"}])
    with pytest.raises(BadValueError, match=r"corpus.jsonl:2: document id 'd1' is also on line 1"):
        msmarco.load_beir(str(beir), "train")


def test_a_truncated_gz_names_the_file(tmp_path):
    data = gzip.compress(
        "".join(json.dumps({"query": f"q{i}", "document": f"d{i}"}) + "\n" for i in range(500)).encode()
    )
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(BadValueError, match=r"cut.jsonl.gz: unreadable after line \d+ .*truncated or corrupt"):
        jsonl_pairs.load(str(path), "cut")
    with pytest.raises(BadValueError, match="cut.jsonl.gz"):  # skip_bad_records does not hide a cut file
        jsonl_pairs.load(str(path), "cut", skip_bad_records=True)


def test_declared_mixtures_register_with_their_rates(tmp_path):
    import seqio

    from samtone_jax.tasks import registration

    path = write_jsonl(tmp_path / "p.jsonl", [{"query": "a", "document": "b"}])
    gin_registry.parse(
        [],
        [
            local("own", {"format": "jsonl", "path": str(path)}),
            "mixtures.declared = {'mix': {'own': 3, 'wordnet_definitions': 1}}",
        ],
    )
    registration.register()
    mixture = seqio.get_mixture_or_task("mix")
    assert {t.name: mixture.get_rate(t) for t in mixture.tasks} == {"own": 3.0, "wordnet_definitions": 1.0}
    for bad, message in [
        ("{'mix2': {'nope': 1}}", r"unknown task\(s\) \['nope'\]"),
        ("{'mix2': {'own': 0}}", "not all 0"),
        ("{'own': ['wordnet_definitions']}", "already a task's or a mixture's name"),
    ]:
        gin_registry.parse([], [local("own", {"format": "jsonl", "path": str(path)}), f"mixtures.declared = {bad}"])
        with pytest.raises(BadValueError, match=message):
            catalogue.mixtures()


def test_eval_plain_flags_become_its_gin_names():
    args = cli.build_parser().parse_args(
        ["eval", "--checkpoint=runs/a", "--task=own", "--split=all", "--step=0", "--data_dir=/d", "--dims=8,16"]
    )
    assert flags.table_bindings(args, evaluate.FLAGS) == [
        "evaluate.model_dir = 'runs/a'",
        "evaluate.task = 'own'",
        "evaluate.split = 'all'",
        "data_dir.path = '/d'",
        "evaluate.step = 0",
        "evaluate.dims = (8, 16)",
    ]
    spaced = cli.build_parser().parse_args(["eval", "--dims", "8", "16"])  # lists: spaces or commas
    assert flags.table_bindings(spaced, evaluate.FLAGS) == ["evaluate.dims = (8, 16)"]


def test_modes_without_gin_refuse_it(capsys):
    assert cli.main(["compare", "a.json", "b.json", "--gin.x=1"]) == 2
    assert "samtone compare: error: this mode takes no gin settings (got --gin.x=1)" in capsys.readouterr().err


def test_own_jsonl_from_the_command_line_train_eval_mine_export(tmp_path, tiny_bert_import, wordnet_data, capsys):
    """docs/GUIDE.md's "Fine-tune step by step" commands, at tiny size, through the CLI: one gin file
    declares the task, and train, tasks, data-stats, eval (plain flags), mine and export read it."""
    tokenizer, imported = tiny_bert_import
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WORDNET_DIR", str(wordnet_data[0]))
        gin_registry.parse([], [])
        source = catalogue.collection("wordnet_definitions", "all")
        rows = [{"query": source.queries[q], "document": source.corpus[d]} for q, d in source.pairs()[:200]]
    data = write_jsonl(tmp_path / "my_pairs.jsonl", rows)
    gin_file = tmp_path / "my_data.gin"
    gin_file.write_text(f"local_tasks.tasks = {{'my_pairs': {{'format': 'jsonl', 'path': '{data}'}}}}\n")
    run, own = tmp_path / "run", [f"--gin_file={gin_file}"]
    argv = [
        "train",
        f"--gin_file={imported}/model.gin",
        "--gin_file=runs/finetune_minilm.gin",
        *own,
        "--task=my_pairs",  # the plain flags of the GUIDE's block, each over the gin file's value
        f"--out={run}",
        f"--checkpoint={imported}",
        f"--vocabulary={tokenizer}",
        "--steps=2",
        "--batch_size=8",
        "--query_length=12",
        "--doc_length=16",
        "--learning_rate=2e-3",
        "--gin.schedule.log_every=1",
        "--gin.create_mesh.num_devices=1",
    ]
    assert cli.main(argv) == 0
    settings = (run / "config.gin").read_text()  # the flags won over runs/finetune_minilm.gin's values
    for binding in ("train.train_steps = 2", "train.batch_size = 8", "train.doc_length = 16", "learning_rate = 0.002"):
        assert binding in settings, binding
    # Trained at 12 / 16 tokens, served at the import's 64 (its config.json's positions; serving_lengths.py).
    assert "serving.query_length = 64" in settings and "serving.doc_length = 64" in settings
    assert cli.main(["tasks", *own]) == 0
    listed = capsys.readouterr().out
    assert f"  my_pairs\n      splits: train, test, all\n      reads:  JSON lines of pairs, {data} (test: " in listed
    assert cli.main(["data-stats", *own, "--task=my_pairs", "--split=test"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["task"] == "my_pairs" and 0 < stats["examples"] < 200
    assert cli.main(["eval", *own, f"--checkpoint={run}", "--task=my_pairs", "--split=test"]) == 0
    record = json.loads((run / "eval" / "my_pairs_test_step2.json").read_text())
    assert 0 < record["metrics"]["RR"] <= 1 and len(record["per_query"]["RR"]) == stats["queries"]
    assert record["lengths"] == {"query": 64, "document": 64}
    assert record["training_lengths"] == {"query": 12, "document": 16}
    mined = tmp_path / "negatives.tsv"
    assert cli.main(["mine", *own, "--bm25", "--task=my_pairs", "--num_negatives=2", f"--out={mined}"]) == 0
    assert len(mined.read_text().splitlines()) > 20  # the train split's queries
    assert cli.main(["mine", "--bm25", "--task=my_pairs", f"--out={tmp_path / 'x.tsv'}"]) == 2  # without the gin
    assert "unknown task 'my_pairs'" in capsys.readouterr().err
    assert (
        cli.main(["export", f"--checkpoint={run}", "--format=sentence-transformers", f"--out={tmp_path / 'st'}"]) == 0
    )
    exported = json.loads((tmp_path / "st" / "samtone.json").read_text())
    assert (exported["query_length"], exported["doc_length"], exported["training_lengths"]) == (64, 64, [12, 16])
    assert "trained at 12 / 16 tokens" in (tmp_path / "st" / "README.md").read_text()


def test_every_flag_has_help_and_every_mode_an_example(capsys):
    parser = cli.build_parser()
    modes = next(a for a in parser._actions if isinstance(a, cli.argparse._SubParsersAction)).choices
    assert set(modes) == {mode.NAME for mode in cli.MODES}
    for mode, sub in modes.items():
        silent = [a.option_strings[0] for a in sub._actions if a.option_strings and not a.help]
        assert not silent, f"samtone {mode}: flags without help {silent}"
        text = sub.format_help()
        assert f"example:\n  samtone {mode}" in text
    assert "--num_negatives NUM_NEGATIVES\n                        negatives kept a query (default: 8)" in (
        modes["mine"].format_help()
    )


def test_old_spellings_still_work_and_say_the_new_one(capsys):
    args = cli.build_parser().parse_args(["export", "--checkpoint=a", "--format=hf", "--dst=b"])
    assert args.out == "b" and "samtone: --dst is deprecated; use --out" in capsys.readouterr().err
    args = cli.build_parser().parse_args(["data-stats", "--task=t", "--vocab=v.model"])
    assert args.vocabulary == "v.model" and "--vocab is deprecated; use --vocabulary" in capsys.readouterr().err
    assert cli.main(["export", "--checkpoint=a", "--format=hf"]) == 2
    assert "samtone export: error: samtone export needs --out" in capsys.readouterr().err
    # A model is always --checkpoint (several: repeated or listed); one spelling of --dims / --precisions.
    for argv, dest, value, old in (
        (["import-checkpoint", "--format=hf", "--src=a"], "src", "a", "--src"),
        (["score", "--teacher=bm25", "--task=t", "--out=o"], "teacher", "bm25", "--teacher"),
        (["average", "--checkpoints", "a", "b"], "checkpoints", ["a", "b"], "--checkpoints"),
        (["encode", "--checkpoint=a", "--task=t", "--dim=8"], "dim", 8, "--dim"),
        (["encode", "--checkpoint=a", "--task=t", "--precision=int8"], "precision", "int8", "--precision"),
    ):
        assert getattr(cli.build_parser().parse_args(argv), dest) == value
        assert f"samtone: {old} is deprecated; use --" in capsys.readouterr().err
    args = cli.build_parser().parse_args(["average", "--checkpoint", "a", "b", "--checkpoint", "c"])
    assert args.checkpoints == ["a", "b", "c"]


def test_made_up_ids_join_spellings_given_ids_conflict_in_any_split(tmp_path):
    rows = [{"query": "What is a cat", "document": "A cat."}, {"query": "what is  a CAT ", "document": "a cat."}]
    c = jsonl_pairs.load(str(write_jsonl(tmp_path / "case.jsonl", rows)), "case")
    assert list(c.queries.values()) == ["What is a cat"] and list(c.corpus.values()) == ["A cat."]  # first spelling
    test_query = next(f"q {i}" for i in range(1000) if jsonl_pairs.in_test_split(f"q {i}", 0.1))
    train_query = next(f"q {i}" for i in range(1000) if not jsonl_pairs.in_test_split(f"q {i}", 0.1))
    rows = [
        {"query": train_query, "document": "X", "document_id": "d1"},
        {"query": test_query, "document": "Y", "document_id": "d1"},
    ]
    path = str(write_jsonl(tmp_path / "split.jsonl", rows))
    for split in ("train", "test"):  # each split alone holds one text of d1: still refused
        keep = lambda q, s=split: jsonl_pairs.in_test_split(q, 0.1) == (s == "test")
        with pytest.raises(BadValueError, match=r"split.jsonl:2: document id 'd1' has another text on line 1"):
            jsonl_pairs.load(path, "split", keep)


def test_bad_declarations_of_splits_files_and_rates(tmp_path):
    for spec, message in [
        ({"format": "beir", "path": "b", "splits": "test"}, "'splits' must list split names"),
        ({"format": "jsonl", "files": {"train": 3}}, "'files' must map split names to files"),
        ({"format": "jsonl", "files": {"train": "a"}, "test_fraction": 0.2}, "with 'files' the files are the splits"),
        ({"format": "jsonl", "path": 5}, "'path' must be a file or folder name"),
    ]:
        gin_registry.parse([], [local("t", spec)])
        with pytest.raises(BadValueError, match=message):
            catalogue.loaders()
    gin_registry.parse([], [local("t", {"format": "jsonl", "path": "a", "test_fraction": 0})])
    assert catalogue.loaders()["t"][1] == ("train", "all")  # no empty test split offered
    gin_registry.parse([], ["mixtures.declared = {'m': {'wordnet_definitions': 1e999}}"])
    with pytest.raises(BadValueError, match="finite numbers"):
        catalogue.mixtures()


def test_a_dev_split_takes_the_next_part_of_the_md5_range_and_moves_no_test_query(tmp_path):
    """dev_fraction: a query is in dev when md5's first 8 hex digits / 16^8 fall in [test, test + dev)."""
    queries = [f"query number {i}" for i in range(400)]
    path = write_jsonl(tmp_path / "p.jsonl", [{"query": q, "document": f"doc {i}"} for i, q in enumerate(queries)])
    where = {q: int(hashlib.md5(q.encode()).hexdigest()[:8], 16) / 16**8 for q in queries}  # lower-case: normalised
    expected = {
        "test": {q for q in queries if where[q] < 0.1},
        "dev": {q for q in queries if 0.1 <= where[q] < 0.3},
        "train": {q for q in queries if where[q] >= 0.3},
    }
    assert all(20 < len(v) for v in expected.values())
    gin_registry.parse([], [local("p", {"format": "jsonl", "path": str(path), "dev_fraction": 0.2})])
    assert catalogue.loaders()["p"][1] == ("train", "dev", "test", "all")
    for split, wanted in expected.items():
        assert set(catalogue.collection("p", split).queries.values()) == wanted, split
    gin_registry.parse([], [local("p", {"format": "jsonl", "path": str(path)})])
    assert set(catalogue.collection("p", "test").queries.values()) == expected["test"]  # no dev: test unmoved
    for spec, message in [
        ({"format": "jsonl", "path": "a", "dev_fraction": 1.5}, r"'dev_fraction' must be in \[0, 1\)"),
        ({"format": "jsonl", "path": "a", "test_fraction": 0.5, "dev_fraction": 0.5}, "must leave queries to train"),
        ({"format": "jsonl", "files": {"train": "a"}, "dev_fraction": 0.2}, "with 'files' the files are the splits"),
        ({"format": "beir", "path": "b", "dev_fraction": 0.2}, "a beir task takes 'path'"),
    ]:
        gin_registry.parse([], [local("t", spec)])
        with pytest.raises(BadValueError, match=message):
            catalogue.loaders()
    tiny = write_jsonl(tmp_path / "one.jsonl", [{"query": next(q for q in queries if where[q] > 0.3), "document": "d"}])
    gin_registry.parse([], [local("one", {"format": "jsonl", "path": str(tiny), "dev_fraction": 0.2})])
    with pytest.raises(
        BadValueError, match=r"one/dev is empty: .*\['dev_fraction'\] = 0.2.* the 0.2 after the first 0.1"
    ):
        catalogue.collection("one", "dev")


def test_a_name_declared_again_replaces_what_seqio_held(tmp_path):
    import seqio

    from samtone_jax.tasks import registration

    path = write_jsonl(tmp_path / "p.jsonl", [{"query": "a", "document": "b"}])
    gin_registry.parse([], ["mixtures.declared = {'x': ['wordnet_definitions']}"])
    registration.register()
    assert isinstance(seqio.get_mixture_or_task("x"), seqio.Mixture)
    gin_registry.parse([], [local("x", {"format": "jsonl", "path": str(path)})])
    registration.register()
    assert isinstance(seqio.get_mixture_or_task("x"), seqio.Task)
    gin_registry.parse([], [])
    registration.register()
    assert "x" not in seqio.TaskRegistry.names() and "x" not in seqio.MixtureRegistry.names()


def test_the_data_dir_flag_wins_over_gin_in_every_mode(capsys):
    assert cli.main(["tasks", "--data_dir=/from_flag", "--gin.data_dir.path='/from_gin'"]) == 0
    out = capsys.readouterr().out
    assert "/from_flag/msmarco_passage/" in out and "/from_gin" not in out
    assert cli.main(["import-checkpoint", "--format=hf", "--checkpoint=/nowhere"]) == 2
    assert "needs --out" in capsys.readouterr().err
