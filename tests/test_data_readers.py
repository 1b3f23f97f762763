"""Readers of each official format, over fixtures written here in those formats, and over the
real shared files when present."""

from __future__ import annotations

import gzip
import json
import os

import pytest
from conftest import require_shared
from official_formats import LICENCE, write_msmarco, write_multireqa, write_wordnet

from samtone_jax.data import msmarco, multireqa, wordnet
from samtone_jax.data.collection import text_id
from samtone_jax.data.records import BadRecordError, ReadStats, read_jsonl


def test_multireqa_official_route(tmp_path):
    mrqa_path, cand_path = write_multireqa(tmp_path)
    c = multireqa.load_official(mrqa_path, cand_path)
    key = "SQuAD_q1/q2/q3"
    assert c.corpus == {
        f"{key}/_0": "Paris is the capital of France.",
        f"{key}/_1": "It lies on the Seine.",
        f"{key}/_2": "The Louvre is there.",
    }
    assert c.qrels == {
        "q1": {f"{key}/_0": 1},
        "q2": {f"{key}/_1": 1, f"{key}/_2": 1},
        "q3": {f"{key}/_0": 1, f"{key}/_1": 1},
    }
    assert set(c.queries) == {"q1", "q2", "q3"}  # q9 has no gold sentence
    assert c.stats["answers_crossing_sentences"] == 1
    assert c.stats["questions_without_gold_sentence"] == 1
    assert c.stats["candidates_without_context"] == 1
    assert multireqa.official_paths(str(tmp_path), "squad", "test") == (mrqa_path, cand_path)
    with pytest.raises(ValueError, match="no train split"):
        multireqa.official_paths(str(tmp_path), "bioasq", "train")


def test_multireqa_and_wordnet_follow_the_one_rule_for_duplicate_ids(tmp_path):
    """records.UniqueIds, as BEIR / MS MARCO / own files: an id repeated with its text is counted and
    read once; with another text it is refused naming both lines (before: the last one won)."""
    import gzip
    import json

    mrqa_path, cand_path = write_multireqa(tmp_path)
    with gzip.open(cand_path, "at") as f:  # candidate 0 again, the same span: counted
        f.write(json.dumps({"candidate_id": "SQuAD_q1/q2/q3/_0", "response_start": 0, "response_end": 31}) + "\n")
    c = multireqa.load_official(mrqa_path, cand_path)
    assert c.stats["duplicate_document_lines"] == 1 and len(c.corpus) == 3
    with gzip.open(cand_path, "at") as f:  # ... and another span under the same id: refused
        f.write(json.dumps({"candidate_id": "SQuAD_q1/q2/q3/_0", "response_start": 32, "response_end": 53}) + "\n")
    with pytest.raises(
        BadRecordError, match=r"candidates.json.gz:6: document id 'SQuAD_q1/q2/q3/_0' is also on line 1"
    ):
        multireqa.load_official(mrqa_path, cand_path)
    root = write_wordnet(tmp_path / "wn")
    with open(root / "data.noun") as f:
        line = next(row for row in f if row.startswith("00149262"))
    with open(root / "data.noun", "a") as f:
        f.write(line)
    c = wordnet.load_collection(str(root))
    assert c.stats["duplicate_document_lines"] == 1 and len(c.corpus) == 6 and len(c.pairs()) == 5
    with open(root / "data.noun", "a") as f:
        f.write(line.replace("loosening the ties", "tightening the ties"))
    with pytest.raises(BadRecordError, match=r"data.noun:\d+: document id 'n00149262' is also on line \d+"):
        wordnet.load_collection(str(root))


def test_malformed_line_names_file_and_line_or_is_counted(tmp_path):
    path = tmp_path / "queries.jsonl"
    path.write_text('{"_id": "1", "text": "a"}\n{"_id": "2", "text": "b"\n{"_id": "3"}\n')
    with pytest.raises(BadRecordError, match=r"queries.jsonl:2: JSONDecodeError"):
        list(read_jsonl(str(path), ReadStats(), require=("_id", "text")))
    stats = ReadStats()
    rows = list(read_jsonl(str(path), stats, skip_bad_records=True, require=("_id", "text")))
    assert [r["_id"] for r in rows] == ["1"] and stats["bad_records"] == 2


def test_real_squad_dev_counts_and_article_split(data_dir):
    require_shared("multireqa_squad_dev/questions.jsonl")
    squad = require_shared("squad_v1.1/dev-v1.1.json")
    directory = str(data_dir / "multireqa_squad_dev")
    everything = multireqa.load_squad_dev(directory, str(squad), "all")
    assert len(everything.corpus) == 10642 and len(everything.queries) == 10570
    assert all(len(g) >= 1 and all(d in everything.corpus for d in g) for g in everything.qrels.values())
    train = multireqa.load_squad_dev(directory, str(squad), "train")
    test = multireqa.load_squad_dev(directory, str(squad), "test")
    assert len(train.queries) == 8570 and len(test.queries) == 2000  # 38 / 10 articles
    assert set(train.queries).isdisjoint(test.queries)
    assert len(test.corpus) == 10642  # the test pool is every sentence
    # Article-level: no paragraph (hence no article) has questions on both sides.
    paragraph = {}
    for q in read_jsonl(os.path.join(directory, "questions.jsonl"), ReadStats()):
        paragraph[q["qid"]] = q["context_idx"]
    assert {paragraph[q] for q in train.queries}.isdisjoint({paragraph[q] for q in test.queries})


def test_real_squad_dev_paragraphs_share_documents_and_hold_the_gold_sentences(data_dir):
    require_shared("multireqa_squad_dev/questions.jsonl")
    squad = str(require_shared("squad_v1.1/dev-v1.1.json"))
    directory = str(data_dir / "multireqa_squad_dev")
    sentences = multireqa.load_squad_dev(directory, squad, "all")
    paragraphs = multireqa.load_squad_dev(directory, squad, "all", paragraphs=True)
    assert len(paragraphs.corpus) == 2067 and paragraphs.queries == sentences.queries
    assert all(len(g) == 1 for g in paragraphs.qrels.values())
    # Each question's paragraph contains its gold sentences (whitespace-normalised), found independently.
    squash = " ".join
    inside = [
        all(
            squash(sentences.corpus[c].split()) in squash(paragraphs.corpus[next(iter(paragraphs.qrels[q]))].split())
            for c in sentences.qrels[q]
        )
        for q in sentences.queries
    ]
    assert sum(inside) / len(inside) > 0.99
    per_document = len(paragraphs.pairs()) / len({d for _, d in paragraphs.pairs()})
    assert 4 < per_document < 6  # ~5 questions share a paragraph: the duplicate-heavy setting
    test = multireqa.load_squad_dev(directory, squad, "test", paragraphs=True)
    assert set(test.queries) == set(multireqa.load_squad_dev(directory, squad, "test").queries)


@pytest.mark.parametrize("negatives", ["tsv", "jsonl"])
def test_msmarco_official_files(tmp_path, negatives):
    d = write_msmarco(tmp_path, negatives)
    c = msmarco.load_msmarco(str(d), "train")
    assert c.corpus == {"0": "The sky is blue.", "1": "Grass is green.", "2": "Snow is white."}
    assert c.stats["empty_documents"] == 1
    assert c.pairs() == [("10", "0"), ("11", "1")]
    c.check("msmarco_passage/train")  # what catalogue.collection runs: counts the judgements it cannot use
    assert c.stats["qrels_with_missing_document"] == 1
    assert c.hard_negatives == {"10": ["1", "2"], "11": ["0", "2"]}
    assert c.stats["negatives_with_missing_document"] == (1 if negatives == "tsv" else 0)
    dev = msmarco.load_msmarco(str(d), "dev")
    assert dev.pairs() == [("20", "2")]


def test_beir_format(tmp_path):
    d = tmp_path / "scifact"
    (d / "qrels").mkdir(parents=True)
    (d / "corpus.jsonl").write_text(
        '{"_id": "d1", "title": "Cells", "text": "Cells divide."}\n{"_id": "d2", "title": "", "text": "Atoms bond."}\n'
    )
    (d / "queries.jsonl").write_text('{"_id": "q1", "text": "do cells divide"}\n')
    (d / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t0\n")
    c = msmarco.load_beir(str(d), "test")
    assert c.corpus == {"d1": "Cells Cells divide.", "d2": "Atoms bond."}
    assert c.qrels == {"q1": {"d1": 1, "d2": 0}} and c.pairs() == [("q1", "d1")]


def test_real_msmarco_and_trec_qrels_parse(data_dir):
    folder = require_shared("msmarco_trec_qrels")
    stats = ReadStats()
    dev = msmarco.read_qrels(str(folder / "qrels.msmarco-passage.dev-subset.txt"), stats)
    dl19 = msmarco.read_qrels(str(folder / "qrels.dl19-passage.txt"), stats)
    assert sum(map(len, dev.values())) == 7437 and len(dev) == 6980
    assert sum(map(len, dl19.values())) == 9260 and len(dl19) == 43
    assert {r for rels in dl19.values() for r in rels.values()} == {0, 1, 2, 3}  # graded
    assert not stats


def test_wordnet_database_format(tmp_path):
    root = write_wordnet(tmp_path / "wn")
    synsets = {s["id"]: s for s in wordnet.read_synsets(str(root))}
    assert set(synsets) == {"n00001740", "n00149262", "a00001740", "a00014358", "v00001740", "r00001740"}
    untying = synsets["n00149262"]
    assert untying["lemmas"] == ["untying", "undoing", "unfastening"]
    assert untying["definition"] == "loosening the ties that fasten something"
    assert untying["examples"] == ["the tying of bow ties is an art; the untying is easy"]
    assert synsets["a00014358"]["lemmas"] == ["abounding", "galore"]  # (ip) marker dropped
    assert synsets["v00001740"]["examples"] == ["I can breathe better"]
    c = wordnet.load_collection(str(root))
    assert c.queries["a00001740#1"] == "able: she was able to program"
    assert c.queries["n00149262#0"] == "untying: the tying of bow ties is an art; the untying is easy"
    assert len(c.corpus) == 6 and len(c.pairs()) == 5
    assert text_id(c.queries["a00001740#0"]) == text_id("ABLE:  able to swim ")  # normalised
    (root / "data.adv").write_text(LICENCE + "00001740 02 r 0x a_cappella 0 000 | broken\n")
    with pytest.raises(BadRecordError, match=r"data.adv:2: ValueError"):
        list(wordnet.read_synsets(str(root)))
    os.remove(root / "data.adv")
    with pytest.raises(FileNotFoundError, match="apt-get install wordnet-base"):
        list(wordnet.read_synsets(str(root)))


def test_real_wordnet_matches_the_shared_copy():
    if not os.path.exists(os.path.join(wordnet.DEFAULT_DIR, "data.noun")):
        pytest.skip(f"{wordnet.DEFAULT_DIR} absent: apt-get install wordnet-base")
    shared_path = require_shared("wordnet/synsets.jsonl.gz")
    ours = list(wordnet.read_synsets())
    with gzip.open(shared_path, "rt") as f:
        shared = {(s["pos"], s["id"][1:]): s for s in map(json.loads, f)}
    assert len(ours) == len(shared) == 117659
    assert sum(len(s["examples"]) for s in ours) == 48339
    for s in ours:
        theirs = shared[(s["pos"], s["id"][1:])]
        assert s["definition"] == theirs["definition"].strip().rstrip(";").strip() or theirs["definition"].startswith(
            s["definition"]
        ), s
        assert s["examples"] == [e.strip() for e in theirs["examples"]], s


def test_relevant_indices_are_positions_in_the_sorted_corpus_for_judged_queries_only():
    from samtone_jax.data.collection import RetrievalCollection

    corpus = {"d3": "c", "d1": "a", "d2": "b"}
    qrels = {"q2": {"d3": 1, "d1": 2, "gone": 1}, "q1": {"d2": 0}, "q3": {"d2": 1}}
    collection = RetrievalCollection("t", {"q1": "x", "q2": "y", "q3": "z"}, corpus, qrels)
    # q1's only judgement is not relevant and "gone" is not in the corpus: by hand, d1 d2 d3 -> 0 1 2.
    assert collection.relevant_indices() == (["d1", "d2", "d3"], [("q2", [0, 2]), ("q3", [1])])
