"""The task catalogue: every task by name, its splits and the loader of its RetrievalCollection.

  multireqa_<squad|nq|triviaqa|searchqa|hotpotqa|bioasq|relationextraction|textbookqa|duorc>
                       official MRQA + MultiReQA files (train / test)
  multireqa_squad_dev  the rebuilt SQuAD dev task with an article-level train / test split
  multireqa_squad_dev_paragraphs  the same questions and split, SQuAD paragraphs as documents
                       (~5 questions per document: the duplicate-heavy setting)
  msmarco_passage      official MS MARCO passage files (train / dev), hard negatives if present
  beir_<name>          BEIR datasets (test, and dev / train where BEIR has them), eval only
  wordnet_definitions  WordNet 3.0 example sentence -> definition (train / test), the demo data
  <any name>           a TensorFlow Datasets dataset, declared in gin `tfds_tasks.tasks` (its query and
                       document features), read through seqio.TfdsDataSource

Each task yields, per relevant (query, document) pair: `query`, `document` (tokenised),
`query_id`, `doc_id` (int64 hashes of the normalised texts: duplicates share ids) and, with
`NUM_NEGATIVES > 0` on a task that has hard negatives, `negatives` / `negative_ids`.

Data root: gin `data_dir.path` (macro DATA_DIR in runs), else $SAMTONE_DATA_DIR. The vocabulary
is the InputSpec's given to tasks/registration.register (gin VOCABULARY), the public T5 one by default.
"""

from __future__ import annotations

import functools
import os

import gin

from samtone_jax import paths
from samtone_jax.data import msmarco, multireqa, wordnet
from samtone_jax.data.collection import RetrievalCollection
from samtone_jax.errors import BadValueError

BEIR_DATASETS = (
    "arguana",
    "climate-fever",
    "cqadupstack",
    "dbpedia-entity",
    "fever",
    "fiqa",
    "hotpotqa",
    "msmarco",
    "nfcorpus",
    "nq",
    "quora",
    "scidocs",
    "scifact",
    "trec-covid",
    "webis-touche2020",
)


@gin.configurable
def data_dir(path: str | None = None) -> str:
    """The data root: gin `data_dir.path`, else $SAMTONE_DATA_DIR."""
    path = path or os.environ.get("SAMTONE_DATA_DIR")
    if not path:
        raise BadValueError("no data root: set DATA_DIR in gin (data_dir.path = %DATA_DIR) or $SAMTONE_DATA_DIR")
    return path


@gin.configurable
def wordnet_dir(path: str | None = None) -> str:
    return path or os.environ.get("WORDNET_DIR") or wordnet.DEFAULT_DIR


@gin.configurable
def hard_negatives_file(path: str | None = None) -> str | None:
    """A mined negatives file (`samtone mine`: 'qid \\t did,did,...' or JSON lines) that replaces the
    hard negatives of every task loaded (gin: hard_negatives_file.path = %HARD_NEGATIVES); a
    `samtone score` file (JSON lines with scores) brings the teacher's scores too."""
    return path


@gin.configurable
def skip_bad_records(enabled: bool = False) -> bool:
    """Skip (and count) malformed lines in every task's files instead of stopping at the first one
    (gin `skip_bad_records.enabled = True`: train, eval, train-adore; CLI: --skip_bad_records)."""
    return enabled


TEST_FRACTION_WORDNET = 0.1


def _wordnet(split: str, skip_bad_records: bool = False) -> RetrievalCollection:
    import hashlib

    collection = wordnet.load_collection(wordnet_dir(), skip_bad_records)
    if split == "all":
        return collection

    def is_test(qid: str) -> bool:  # by sense, so a sense's examples never straddle the split
        synset = qid.split("#")[0]
        return int(hashlib.md5(synset.encode()).hexdigest()[:8], 16) < TEST_FRACTION_WORDNET * 16**8

    return collection.restrict_queries(lambda qid: is_test(qid) == (split == "test"))


def _squad_dev(split: str, skip_bad_records: bool = False, paragraphs: bool = False) -> RetrievalCollection:
    root = data_dir()
    return multireqa.load_squad_dev(
        paths.join(root, "multireqa_squad_dev"),
        paths.join(root, "squad_v1.1", "dev-v1.1.json"),
        split,
        skip_bad_records,
        paragraphs=paragraphs,
    )


def _multireqa(suffix: str, split: str, skip_bad_records: bool = False) -> RetrievalCollection:
    mrqa, candidates = multireqa.official_paths(data_dir(), suffix, split)
    return multireqa.load_official(mrqa, candidates, skip_bad_records, name=f"multireqa_{suffix}")


def _msmarco(split: str, skip_bad_records: bool = False) -> RetrievalCollection:
    return msmarco.load_msmarco(paths.join(data_dir(), "msmarco_passage"), split, skip_bad_records)


def _beir(name: str, split: str, skip_bad_records: bool = False) -> RetrievalCollection:
    return msmarco.load_beir(paths.join(data_dir(), "beir", name), split, skip_bad_records, name=f"beir_{name}")


# name -> (loader(split, skip_bad_records), splits, trainable)
LOADERS: dict[str, tuple] = {
    "wordnet_definitions": (_wordnet, ("train", "test", "all"), True),
    "multireqa_squad_dev": (_squad_dev, ("train", "test", "all"), True),
    "multireqa_squad_dev_paragraphs": (functools.partial(_squad_dev, paragraphs=True), ("train", "test", "all"), True),
    "msmarco_passage": (_msmarco, ("train", "dev"), True),
}
for _suffix, (_, _has_train) in multireqa.DATASETS.items():
    LOADERS[f"multireqa_{_suffix}"] = (
        functools.partial(_multireqa, _suffix),
        ("train", "test") if _has_train else ("test",),
        _has_train,
    )
for _name in BEIR_DATASETS:
    LOADERS[f"beir_{_name.replace('-', '_')}"] = (functools.partial(_beir, _name), ("test", "dev", "train"), False)


# Mixtures (registered by tasks/registration.py with equal rates): name -> member tasks.
MIXTURES: dict[str, tuple[str, ...]] = {
    # The five MultiReQA datasets with training data, equally weighted (MultiReQA's "all" model).
    "multireqa_train_mixture": (
        "multireqa_squad",
        "multireqa_nq",
        "multireqa_triviaqa",
        "multireqa_searchqa",
        "multireqa_hotpotqa",
    ),
    # Both offline-available tasks: WordNet from Debian, SQuAD dev from ../shared/data.
    "offline_mixture": ("wordnet_definitions", "multireqa_squad_dev"),
}


@gin.configurable
def tfds_tasks(tasks: dict | None = None) -> dict:
    """Tasks over TensorFlow Datasets, as gin `tfds_tasks.tasks = {NAME: SPEC}`; SPEC:

      tfds_name   'dataset/config:version' (as tfds.load names it)
      query, document   the features holding the two texts ('a/b' reaches into a nested feature)
      splits      the TFDS splits the task has (default ('train',))
      data_dir    the TFDS data directory (default: TFDS's own, $TFDS_DATA_DIR)

    Read through seqio.TfdsDataSource (TFDS's versioning and data_dir, local or gs://); each example
    is one relevant (query, document) pair, ids by text (duplicates share them), so the task trains,
    mines, scores, evaluates and mixes like any other."""
    out = dict(tasks or {})
    for name, spec in out.items():
        missing = {"tfds_name", "query", "document"} - set(spec)
        if missing or name in LOADERS:
            raise BadValueError(
                f"tfds_tasks.tasks[{name!r}]: "
                + (f"missing {sorted(missing)}" if missing else "a built-in task's name")
            )
    return out


def _tfds(spec: dict, split: str, skip_bad_records: bool = False) -> RetrievalCollection:
    import seqio

    from samtone_jax.data.collection import text_id
    from samtone_jax.data.records import ReadStats

    source = seqio.TfdsDataSource(spec["tfds_name"], tfds_data_dir=spec.get("data_dir"))

    def text(example, feature: str) -> str:
        value = example
        for key in feature.split("/"):
            if key not in value:
                raise BadValueError(
                    f"TFDS dataset {spec['tfds_name']} has no feature {feature!r} (features: {sorted(example)}): "
                    "fix tfds_tasks.tasks' query / document"
                )
            value = value[key]
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)

    stats, queries, corpus, qrels = ReadStats(), {}, {}, {}
    for example in source.get_dataset(split, shuffle=False).as_numpy_iterator():
        query, document = text(example, spec["query"]), text(example, spec["document"])
        if not query.strip() or not document.strip():
            stats["pairs_with_an_empty_text"] += 1
            continue
        qid, did = f"q{text_id(query)}", f"d{text_id(document)}"
        queries[qid], corpus[did] = query, document
        qrels.setdefault(qid, {})[did] = 1
    return RetrievalCollection(spec["tfds_name"], queries, corpus, qrels, stats=stats)


def loaders() -> dict[str, tuple]:
    """Every task: the built-in ones (LOADERS) and gin's tfds_tasks."""
    extra = {
        name: (functools.partial(_tfds, spec), tuple(spec.get("splits", ("train",))), True)
        for name, spec in tfds_tasks().items()
    }
    return {**LOADERS, **extra}


def task_names() -> list[str]:
    return sorted(loaders())


@functools.lru_cache(maxsize=8)
def _load_cached(name: str, split: str, skip_bad_records: bool, root_key: str, negatives: str | None):
    loader, _, _ = loaders()[name]
    collection = loader(split, skip_bad_records)
    if negatives:
        from samtone_jax.data import teacher_scores

        mined, scores = teacher_scores.read(negatives, collection.stats, skip_bad_records)
        missing = sum(d not in collection.corpus for ds in mined.values() for d in ds)
        if missing:
            collection.stats["negatives_with_missing_document"] += missing
        collection.hard_negatives = {
            q: [d for d in ds if d in collection.corpus] for q, ds in mined.items() if q in collection.queries
        }
        collection.teacher_scores = {q: t for q, t in scores.items() if q in collection.queries}
    collection.check(f"{name}/{split}")
    collection.stats.report(f"{name}/{split}")
    return collection


def collection(name: str, split: str, skip_bad: bool | None = None) -> RetrievalCollection:
    """The RetrievalCollection behind task `name` (cached per process and data root); `skip_bad`
    None: gin's `skip_bad_records.enabled`."""
    skip_bad = skip_bad_records() if skip_bad is None else skip_bad
    every = loaders()
    if name not in every:
        raise BadValueError(f"unknown task {name!r}; registered tasks: {', '.join(task_names())}")
    _, splits, _ = every[name]
    if split not in splits:
        raise BadValueError(f"task {name!r} has splits {splits}; got {split!r}")
    return _load_cached(name, split, skip_bad, root_of(name), hard_negatives_file())


def root_of(name: str) -> str:
    """The folder task `name` reads from now (part of every cache key)."""
    spec = tfds_tasks().get(name)
    if spec is not None:
        return f"tfds:{spec['tfds_name']}@{spec.get('data_dir') or os.environ.get('TFDS_DATA_DIR', '')}"
    return wordnet_dir() if name == "wordnet_definitions" else data_dir()
