"""MultiReQA (Guo et al. 2020): sentence-level retrieval QA built from MRQA contexts.

Official route: an MRQA file (`<Dataset>.jsonl.gz`: a header line `{"header": {"dataset": ...}}`,
then one context per line with `context` and `qas` [{`qid`, `question`, `detected_answers`
[{`char_spans`: [[start, end_inclusive], ...]}]}]) joined with MultiReQA's sentence boundaries
(`candidates.json.gz`: `candidate_id` = `<Dataset>_<qid>/<qid>/.../_<k>` — the dataset name and
the context's question ids — and `response_start` / `response_end`, end exclusive). A question's
gold sentences are those containing one of its answer spans (an answer crossing a sentence
boundary makes every sentence it overlaps gold, and is counted).

Rebuilt SQuAD dev (`../shared/data/multireqa_squad_dev`): the same task for SQuAD v1.1 dev,
already joined (`candidates.jsonl`, `questions.jsonl`), plus a deterministic article-level
train/test split for in-domain experiments on the CPU.
"""

from __future__ import annotations

import hashlib
import json

from samtone_jax.core import paths
from samtone_jax.core.errors import BadValueError
from samtone_jax.data.collection import RetrievalCollection
from samtone_jax.data.records import BadRecordError, ReadStats, UniqueIds, open_text, read_jsonl, unique_ids

# Task suffix -> MRQA / MultiReQA dataset name, and whether MultiReQA has a training split.
DATASETS = {
    "squad": ("SQuAD", True),
    "nq": ("NaturalQuestions", True),
    "triviaqa": ("TriviaQA", True),
    "searchqa": ("SearchQA", True),
    "hotpotqa": ("HotpotQA", True),
    "bioasq": ("BioASQ", False),
    "relationextraction": ("RelationExtraction", False),
    "textbookqa": ("TextbookQA", False),
    "duorc": ("DuoRC", False),
}


def _context_key(dataset: str, context: dict) -> str:
    return f"{dataset}_" + "/".join(qa["qid"] for qa in context["qas"])


def read_mrqa(path: str, stats: ReadStats, skip_bad_records: bool = False) -> tuple[str, dict[str, dict]]:
    """(dataset name from the header, {context key: context, with its `line`}) of an MRQA jsonl(.gz) file."""
    dataset, contexts = None, {}
    for line, record in read_jsonl(path, stats, skip_bad_records, numbered=True):
        if "header" in record:
            dataset = record["header"].get("dataset")
            continue
        if dataset is None:
            raise BadRecordError(
                f"{path}:1: no MRQA header line ({{'header': {{'dataset': ...}}}}) before the contexts"
            )
        if "context" not in record or "qas" not in record:
            if not skip_bad_records:
                raise BadRecordError(f"{path}: a context line lacks 'context' or 'qas'")
            stats["bad_records"] += 1
            continue
        contexts[_context_key(dataset, record)] = dict(record, line=line)
    if dataset is None:
        raise BadRecordError(f"{path}: empty MRQA file (no header line)")
    return dataset, contexts


def load_official(mrqa_path: str, candidates_path: str, skip_bad_records: bool = False, name: str = "multireqa"):
    """A MultiReQA task from an MRQA file and its MultiReQA `candidates.json.gz`."""
    stats = ReadStats()
    _, contexts = read_mrqa(mrqa_path, stats, skip_bad_records)
    sentences: dict[str, list[tuple[str, int, int]]] = {}  # context key -> [(cid, start, end)]
    corpus = UniqueIds(candidates_path, "document", stats)
    for line, record in read_jsonl(
        candidates_path,
        stats,
        skip_bad_records,
        require=("candidate_id", "response_start", "response_end"),
        numbered=True,
    ):
        key, sep, _ = record["candidate_id"].rpartition("/_")
        context = contexts.get(key)
        if not sep or context is None:
            stats["candidates_without_context"] += 1
            continue
        start, end = int(record["response_start"]), int(record["response_end"])
        if corpus.add(line, record["candidate_id"], context["context"][start:end]):
            sentences.setdefault(key, []).append((record["candidate_id"], start, end))
    questions = UniqueIds(mrqa_path, "query", stats)
    qrels = {}
    for key, context in contexts.items():
        spans = sentences.get(key, [])
        for qa in context["qas"]:
            gold = set()
            for answer in qa.get("detected_answers", []):
                for span_start, span_end in answer.get("char_spans", []):
                    inside = [cid for cid, s, e in spans if s <= span_start and span_end < e]
                    if not inside:
                        inside = [cid for cid, s, e in spans if s <= span_end and span_start < e]
                        stats["answers_crossing_sentences"] += bool(inside)
                    gold.update(inside)
            if not gold:
                stats["questions_without_gold_sentence"] += 1
                continue
            if questions.add(context["line"], qa["qid"], qa["question"]):
                qrels[qa["qid"]] = {cid: 1 for cid in sorted(gold)}
    return RetrievalCollection(name, questions.table, corpus.table, qrels, stats=stats).drop_empty()


def official_paths(data_dir: str, suffix: str, split: str) -> tuple[str, str]:
    """(MRQA file, candidates file) under DATA_DIR for multireqa_<suffix> and split train|test.

    Layout: DATA_DIR/mrqa/{train,dev}/<Dataset>.jsonl.gz (as the MRQA download script writes)
    and DATA_DIR/multireqa/data/{train,dev,test}/<Dataset>/candidates.json.gz (the MultiReQA
    repository). MultiReQA's test split is MRQA's dev split.
    """
    dataset, has_train = DATASETS[suffix]
    if split == "train":
        if not has_train:
            raise BadValueError(f"multireqa_{suffix} has no train split (MultiReQA ships it as test only)")
        mrqa, annotations = "train", "train"
    else:
        mrqa, annotations = "dev", ("dev" if has_train else "test")
    return (
        paths.join(data_dir, "mrqa", mrqa, f"{dataset}.jsonl.gz"),
        paths.join(data_dir, "multireqa", "data", annotations, dataset, "candidates.json.gz"),
    )


# ----------------------------------------------------------------------------------------------
# The rebuilt SQuAD dev task and its article-level split.
# ----------------------------------------------------------------------------------------------
TEST_ARTICLES = 10  # of SQuAD dev's 48 articles (~20 %)


def article_of_paragraph(squad_dev_json: str) -> tuple[list[int], list[str], list[str]]:
    """(article index of each paragraph, article titles, paragraph texts), in dev-v1.1.json order."""
    with open_text(squad_dev_json) as f:
        articles = json.load(f)["data"]
    paragraph_article = [a for a, article in enumerate(articles) for _ in article["paragraphs"]]
    contexts = [p["context"] for article in articles for p in article["paragraphs"]]
    return paragraph_article, [article["title"] for article in articles], contexts


def test_articles(titles: list[str]) -> set[str]:
    """Deterministic and order-independent: the TEST_ARTICLES titles with the smallest md5."""
    return set(sorted(titles, key=lambda t: hashlib.md5(t.encode("utf-8")).hexdigest())[:TEST_ARTICLES])


def load_squad_dev(
    directory: str, squad_dev_json: str, split: str, skip_bad_records: bool = False, paragraphs: bool = False
):
    """The rebuilt MultiReQA-SQuAD dev task; split 'train' | 'test' (by article) | 'all'.

    The corpus is always all 10,642 sentences (the test candidate pool); the split only chooses
    the questions. Training pairs come from train articles only, so no test question's sentence
    is seen with its question in training.

    paragraphs=True: the same questions and split, but the documents are SQuAD's 2,067 paragraphs
    (id `p<index>`, the question's own paragraph relevant): ~5 questions share each document, the
    duplicate-heavy setting of SamToNe's stated limitation (document-document negatives).
    """
    if split not in ("train", "test", "all"):
        raise BadValueError(f"multireqa_squad_dev has splits train, test, all; got {split!r}")
    stats = ReadStats()
    corpus, queries, qrels, question_paragraph = {}, {}, {}, {}
    if not paragraphs:
        candidates = paths.join(directory, "candidates.jsonl")
        rows = read_jsonl(candidates, stats, skip_bad_records, require=("cid", "text"), numbered=True)
        corpus = unique_ids(((line, (c["cid"], c["text"])) for line, c in rows), candidates, "document", stats)
    questions = paths.join(directory, "questions.jsonl")
    unique = UniqueIds(questions, "query", stats)
    for line, q in read_jsonl(
        questions, stats, skip_bad_records, require=("qid", "question", "gold", "context_idx"), numbered=True
    ):
        if not unique.add(line, q["qid"], q["question"]):
            continue
        queries[q["qid"]] = q["question"]
        question_paragraph[q["qid"]] = int(q["context_idx"])
        qrels[q["qid"]] = {f"p{int(q['context_idx'])}": 1} if paragraphs else {cid: 1 for cid in q["gold"]}
    paragraph_article, titles, contexts = article_of_paragraph(squad_dev_json)
    if paragraphs:
        corpus = {f"p{i}": text for i, text in enumerate(contexts)}
        bad = sorted({p for p in question_paragraph.values() if not 0 <= p < len(contexts)})
        if bad:
            raise BadValueError(
                f"{questions}: context_idx {bad[:5]} outside {squad_dev_json}'s {len(contexts)} paragraphs "
                "(the two files are from different SQuAD releases)"
            )
    name = "multireqa_squad_dev_paragraphs" if paragraphs else "multireqa_squad_dev"
    collection = RetrievalCollection(name, queries, corpus, qrels, stats=stats).drop_empty()
    if split == "all":
        return collection
    held_out = test_articles(titles)
    test = {qid for qid, p in question_paragraph.items() if titles[paragraph_article[p]] in held_out}
    return collection.restrict_queries(lambda qid: (qid in test) == (split == "test"))
