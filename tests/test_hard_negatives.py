"""Hard negatives: mining (positives excluded, false-negative filter, ranks, strategies, BM25 and
dense, the file the tasks read back)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from conftest import toy_collection

from samtone_jax.core.errors import BadValueError
from samtone_jax.data.false_negatives import FalseNegativeFilter
from samtone_jax.hard_negatives import mining


def test_select_excludes_positives_and_honours_ranks_and_the_false_negative_filter():
    ranked = np.array([[4, 7, 1, 9, 3, 5]])
    scores = np.array([[0.95, 0.85, 0.75, 0.70, 0.60, 0.50]])
    positives = [{7, 3}]
    gold = np.array([0.8])

    def select(cut=FalseNegativeFilter(), **kw):
        return mining.select_negatives(ranked, scores, positives, gold, false_negatives=cut, **kw)

    assert select(num_negatives=3) == ([[4, 1, 9]], 0)  # 7 is a positive; best-ranked first
    # above 0.9 x 0.8 = 0.72 dropped (4 at 0.95, 1 at 0.75); 3 is a positive
    assert select(FalseNegativeFilter(relative_margin=0.1), num_negatives=3) == ([[9, 5]], 2)
    assert select(FalseNegativeFilter(margin=0.0), num_negatives=3) == ([[1, 9, 5]], 1)  # above the positive: 4
    assert select(FalseNegativeFilter(margin=0.1), num_negatives=3) == ([[9, 5]], 2)  # above 0.7: 4 and 1
    assert select(FalseNegativeFilter(max_score=0.72), num_negatives=1) == ([[9]], 2)
    assert select(num_negatives=5, range_min=2, range_max=5) == ([[1, 9]], 0)  # ranks 2-4 = 1, 9, 3 (a positive)


def test_false_negative_filter_rejects_bad_cuts():
    with pytest.raises(ValueError, match=r"FalseNegativeFilter.relative_margin\) must be in \[0, 1\)"):
        FalseNegativeFilter(relative_margin=1.5)
    with pytest.raises(ValueError, match="max_ids must be >= 1"):
        FalseNegativeFilter(margin=0.0, max_ids=0)
    assert not FalseNegativeFilter().active and FalseNegativeFilter(max_score=3.0).active


def test_sample_strategy_is_a_seeded_subset_of_the_eligible():
    ranked = np.arange(30)[None, :]
    scores = -np.arange(30, dtype=float)[None, :]
    positives = [{0, 5}]
    first, _ = mining.select_negatives(ranked, scores, positives, np.array([1.0]), num_negatives=4, strategy="sample")
    again, _ = mining.select_negatives(ranked, scores, positives, np.array([1.0]), num_negatives=4, strategy="sample")
    other, _ = mining.select_negatives(
        ranked, scores, positives, np.array([1.0]), num_negatives=4, strategy="sample", seed=1
    )
    assert first == again != other
    assert len(first[0]) == 4 and not set(first[0]) & {0, 5} and first[0] == sorted(first[0])
    with pytest.raises(ValueError, match="strategy"):
        mining.select_negatives(ranked, scores, positives, np.array([1.0]), num_negatives=4, strategy="best")


def test_bm25_mining_writes_the_file_the_tasks_read(tmp_path):
    out = str(tmp_path / "negatives.tsv")
    summary = mining.mine(toy_collection(), out, num_negatives=2, range_max=6)
    assert summary["dropped_as_false_negatives"] == 0
    lines = dict(line.rstrip("\n").split("\t") for line in open(out))
    assert set(lines["q1"].split(",")) <= {"d2", "d3", "d5"}  # cat documents, never d1 (the positive)
    assert lines["q1"].split(",")[0] in {"d2", "d5"}
    assert all(qid not in lines or gold not in lines[qid] for qid, gold in (("q1", "d1"), ("q2", "d4"), ("q3", "d6")))
    assert summary["queries"] == 3 and json.load(open(out + ".json"))["num_negatives"] == 2
    assert summary["with_enough_negatives"] + summary["without_enough_negatives"] == 3
    # A cut below every BM25 score drops each query's 5 non-relevant documents of the 6 retrieved.
    summary = mining.mine(
        toy_collection(), out, num_negatives=2, range_max=6, false_negatives=FalseNegativeFilter(max_score=-1)
    )
    assert summary["dropped_as_false_negatives"] == 15 and summary["without_any_negative"] == 3
    assert json.load(open(out + ".json"))["false_negative_filter"]["max_score"] == -1


def test_mined_file_attaches_to_a_task_through_gin(tmp_path, wordnet_env, caplog):
    from samtone_jax.cli import gin_registry
    from samtone_jax.data.input_spec import InputSpec
    from samtone_jax.tasks import catalogue, registration

    collection = catalogue.collection("wordnet_definitions", "all")
    qid = sorted(collection.queries)[0]
    docs = [d for d in sorted(collection.corpus) if d not in collection.qrels[qid]][:2]
    path = tmp_path / "mined.tsv"
    path.write_text(f"{qid}\t{docs[0]},{docs[1]},not_a_document\nnot_a_query\t{docs[0]}\n")
    gin_registry.parse([], [f"hard_negatives_file.path = '{path}'"])
    try:
        with_negatives = catalogue.collection("wordnet_definitions", "all")
        assert with_negatives.hard_negatives == {qid: docs}  # the unknown id is dropped and counted
        assert with_negatives.stats["negatives_with_missing_document"] == 1
        assert with_negatives.stats["negatives_rows_of_other_queries"] == 1  # counted like unknown documents
        columns = registration.examples("wordnet_definitions", "all", InputSpec(num_negatives=2))
        assert len(columns["negatives"]) == sum(1 for q, _ in with_negatives.pairs() if q == qid)
        # inputs.negatives_fallback: every pair kept; a query with fewer than K negatives gets its own
        # positive (text and id) in the missing slots, which the loss removes (test_losses.py).
        padded = registration.examples(
            "wordnet_definitions", "all", InputSpec(num_negatives=3, negatives_fallback=True)
        )
        pairs = with_negatives.pairs()
        assert len(padded["negatives"]) == len(pairs)
        for i, (q, d) in enumerate(pairs):
            own = [with_negatives.corpus[n] for n in with_negatives.hard_negatives.get(q, [])]
            want = own + [with_negatives.corpus[d]] * (3 - len(own))
            assert padded["negatives"][i].tolist() == want
            assert (padded["negative_ids"][i][len(own) :] == padded["doc_id"][i]).all()
        assert with_negatives.stats["pairs_with_negatives_padded_by_their_positive"] == len(pairs)
        other = tmp_path / "other.tsv"  # a file of another task: no query of this one has any
        other.write_text(f"not_a_query\t{docs[0]}\n")
        gin_registry.parse([], [f"hard_negatives_file.path = '{other}'"])
        caplog.clear()
        with caplog.at_level(logging.WARNING):  # read by a guard or an eval beside its task: not warned about
            unrelated = catalogue.collection("wordnet_definitions", "all")
        assert unrelated.hard_negatives == {} and "negatives" not in caplog.text
        assert unrelated.stats["negatives_rows_of_other_queries"] == 0
        with pytest.raises(BadValueError, match="no query has a hard negative"):
            registration.examples("wordnet_definitions", "all", InputSpec(num_negatives=1, negatives_fallback=True))
    finally:
        gin_registry.parse([], [])
    with pytest.raises(BadValueError, match="negatives_fallback .* needs inputs.num_negatives > 0"):
        InputSpec(negatives_fallback=True)


def test_dense_mining_command_excludes_positives(trained_run, wordnet_env, tmp_path, capsys):
    from samtone_jax.cli import main as cli
    from samtone_jax.tasks import catalogue

    out = tmp_path / "dense.tsv"
    argv = [
        "mine",
        f"--checkpoint={trained_run}",
        "--task=wordnet_definitions",
        "--split=all",
        f"--out={out}",
        "--num_negatives=3",
        "--range_max=10",
    ]
    assert cli.main(argv) == 0
    collection = catalogue.collection("wordnet_definitions", "all")
    rows = dict(line.rstrip("\n").split("\t") for line in open(out))
    assert rows and all(not set(d.split(",")) & set(collection.qrels[q]) for q, d in rows.items())
    assert all(len(d.split(",")) <= 3 for d in rows.values())
    assert "with 3 negatives" in capsys.readouterr().out
    assert cli.main(["mine", "--task=wordnet_definitions", f"--out={out}"]) == 2  # neither a model nor --bm25
