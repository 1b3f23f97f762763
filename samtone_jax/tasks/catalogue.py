"""The task catalogue: every task by name, its splits and the loader of its RetrievalCollection.

  multireqa_<squad|nq|triviaqa|searchqa|hotpotqa|bioasq|relationextraction|textbookqa|duorc>
                       official MRQA + MultiReQA files (train / test)
  multireqa_squad_dev  the rebuilt SQuAD dev task with an article-level train / test split
  multireqa_squad_dev_paragraphs  the same questions and split, SQuAD paragraphs as documents
                       (~5 questions per document: the duplicate-heavy setting)
  msmarco_passage      official MS MARCO passage files (train / dev), hard negatives if present
  beir_<name>          BEIR datasets (test, and dev / train where BEIR has them)
  wordnet_definitions  WordNet 3.0 example sentence -> definition (train / test), the demo data
  <any name>           declared in gin (tasks/declared.py): a TensorFlow Datasets dataset
                       (`tfds_tasks.tasks`) or your own files, JSONL pairs / a BEIR folder / an MS
                       MARCO-style folder at any local or gs:// path (`local_tasks.tasks`)
Mixtures: the built-in MIXTURES and gin's `mixtures.declared` (any tasks, with rates).
`samtone tasks` lists every task with its splits and the files it reads.

Each task yields, per relevant (query, document) pair: `query`, `document` (tokenised),
`query_id`, `doc_id` (int64 hashes of the normalised texts: duplicates share ids) and, with
`NUM_NEGATIVES > 0` on a task that has hard negatives, `negatives` / `negative_ids`.

Data root: gin `data_dir.path` (macro DATA_DIR in runs), else $SAMTONE_DATA_DIR. The vocabulary
is the InputSpec's given to tasks/registration.register (gin VOCABULARY), the public T5 one by default.
"""

from __future__ import annotations

import functools
import logging
import math
import os

import gin

from samtone_jax.core import paths
from samtone_jax.core.errors import BadValueError
from samtone_jax.data import msmarco, multireqa, wordnet
from samtone_jax.data.collection import RetrievalCollection
from samtone_jax.tasks import declared

log = logging.getLogger(__name__)

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
def hard_negatives_file(path: str | None = None, refreshed: bool = False) -> str | None:
    """A mined negatives file (`samtone mine`: 'qid \\t did,did,...' or JSON lines) that replaces the
    hard negatives of every task loaded (gin: hard_negatives_file.path = %HARD_NEGATIVES); a
    `samtone score` file (JSON lines with scores) brings the teacher's scores too. `refreshed`: the
    run's negatives are mined again as it trains (`samtone finetune --refresh_negatives`), so a resume
    may name another file (a run's batches stay the same; only their negatives change)."""
    del refreshed  # read from the run's config.gin by training/loop.py's resume check
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


# name -> (loader(split, skip_bad_records), splits)
LOADERS: dict[str, tuple] = {
    "wordnet_definitions": (_wordnet, ("train", "test", "all")),
    "multireqa_squad_dev": (_squad_dev, ("train", "test", "all")),
    "multireqa_squad_dev_paragraphs": (functools.partial(_squad_dev, paragraphs=True), ("train", "test", "all")),
    "msmarco_passage": (_msmarco, ("train", "dev")),
}
for _suffix, (_, _has_train) in multireqa.DATASETS.items():
    LOADERS[f"multireqa_{_suffix}"] = (
        functools.partial(_multireqa, _suffix),
        ("train", "test") if _has_train else ("test",),
    )
for _name in BEIR_DATASETS:
    LOADERS[f"beir_{_name.replace('-', '_')}"] = (functools.partial(_beir, _name), ("test", "dev", "train"))


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
def mixtures(declared: dict | None = None) -> dict[str, dict[str, float]]:
    """Every mixture as {name: {task: rate}}: the built-in MIXTURES (equal rates) and gin's
    `mixtures.declared = {NAME: {TASK: RATE, ...}}` (or NAME: [TASK, ...] for equal rates) over any
    tasks, built-in, TFDS or local (inputs.task_batches draws one task a batch by these rates)."""
    out = {name: dict.fromkeys(members, 1.0) for name, members in MIXTURES.items()}
    tasks = loaders()
    for name, members in dict(declared or {}).items():
        where = f"mixtures.declared[{name!r}]"
        if name in out or name in tasks:
            raise BadValueError(f"{where}: {name!r} is already a task's or a mixture's name; choose another")
        rates = dict.fromkeys(members, 1.0) if isinstance(members, (list, tuple)) else members
        if not isinstance(rates, dict) or not rates:
            raise BadValueError(f"{where} must be {{TASK: RATE, ...}} or [TASK, ...]; got {members!r}")
        unknown = sorted(set(rates) - set(tasks))
        if unknown:
            raise BadValueError(f"{where}: unknown task(s) {unknown}; tasks: {', '.join(sorted(tasks))}")
        bad = {
            t: r
            for t, r in rates.items()
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or r < 0
        }
        if bad or not any(rates.values()):
            raise BadValueError(f"{where}: rates must be finite numbers >= 0, not all 0; got {rates!r}")
        out[name] = {t: float(r) for t, r in rates.items()}
    return out


def loaders() -> dict[str, tuple]:
    """Every task, name -> (loader(split, skip_bad_records), splits): the built-in ones (LOADERS)
    and those declared in gin (tasks/declared.py: tfds_tasks, local_tasks)."""
    extra = declared.tasks()
    taken = sorted(set(extra) & set(LOADERS))
    if taken:
        raise BadValueError(f"gin declares task(s) {taken}, which are built-in tasks' names; choose others")
    return {**LOADERS, **extra}


def task_names() -> list[str]:
    return sorted(loaders())


@functools.lru_cache(maxsize=8)
def _load_cached(name: str, split: str, skip_bad_records: bool, root_key: str, negatives: str | None):
    loader, _ = loaders()[name]
    collection = loader(split, skip_bad_records)
    if negatives:
        from samtone_jax.data import teacher_scores

        mined, scores = teacher_scores.read(negatives, collection.stats, skip_bad_records)
        ours = {q: ds for q, ds in mined.items() if q in collection.queries}
        if mined and not ours:  # another task's file (a guard or an eval beside the training task): not this one's
            log.info(
                "%s/%s: none of the %s queries of %s is this task's: not used here", name, split, len(mined), negatives
            )
        else:
            missing = sum(d not in collection.corpus for ds in ours.values() for d in ds)
            if missing:
                collection.stats["negatives_with_missing_document"] += missing
            # rows of queries this task does not have (another split's, a mixture's other task's): counted
            collection.stats["negatives_rows_of_other_queries"] += len(mined) - len(ours)
        collection.hard_negatives = {q: [d for d in ds if d in collection.corpus] for q, ds in ours.items()}
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
    _, splits = every[name]
    if split not in splits:
        raise BadValueError(f"task {name!r} has splits {splits}; got {split!r}")
    return _load_cached(name, split, skip_bad, root_of(name), hard_negatives_file())


def root_of(name: str) -> str:
    """The folder task `name` reads from now (part of every cache key)."""
    source = declared.source_of(name)
    if source is not None:
        return source
    return wordnet_dir() if name == "wordnet_definitions" else data_dir()


def input_paths(name: str) -> list[str]:
    """The files and data folders task `name` reads, with the hard negatives file that replaces its
    negatives (for refusing an output over them; an output beside them in DATA_DIR is fine)."""
    negatives = [hard_negatives_file()] if hard_negatives_file() else []
    return _data_paths(name) + negatives


def _data_paths(name: str) -> list[str]:
    declared_paths = declared.paths_of(name)
    if declared_paths is not None:
        return declared_paths
    if declared.source_of(name) is not None or name not in LOADERS:  # TFDS: its own cache
        return []
    try:
        if name == "wordnet_definitions":
            return [paths.join(wordnet_dir(), f"data.{pos}") for pos in ("noun", "verb", "adj", "adv")]
        root = data_dir()
    except BadValueError:  # no data root configured: the task's load names it
        return []
    if name.startswith("multireqa_squad_dev"):
        return [*_entries(paths.join(root, "multireqa_squad_dev")), paths.join(root, "squad_v1.1", "dev-v1.1.json")]
    if name == "msmarco_passage":
        return _entries(paths.join(root, "msmarco_passage"))
    loader, splits = LOADERS[name]
    if name.startswith("beir_"):
        return _entries(paths.join(root, "beir", loader.args[0]))
    return [f for split in splits for f in multireqa.official_paths(root, loader.args[0], split)]


def _entries(folder: str) -> list[str]:
    """A data folder's files and sub-folders (a new file beside them is fine), or [folder] when it
    cannot be listed."""
    try:
        return [paths.join(folder, p.name) for p in paths.as_path(folder).iterdir()]
    except OSError:
        return [folder]


def files_of(name: str) -> str:
    """The files task `name` reads, for a person (`samtone tasks`); DATA_DIR where no data root is set."""
    found = declared.files_of(name)
    if found:
        return found
    try:
        root = data_dir().rstrip("/")
    except BadValueError:
        root = "DATA_DIR"
    if name == "wordnet_definitions":
        return f"{wordnet_dir()}/data.{{noun,verb,adj,adv}} (Debian wordnet-base; gin wordnet_dir.path)"
    if name.startswith("multireqa_squad_dev"):
        return f"{root}/multireqa_squad_dev/, {root}/squad_v1.1/dev-v1.1.json"
    if name == "msmarco_passage":
        return f"{root}/msmarco_passage/: collection.tsv, queries.<split>.tsv, qrels.<split>.tsv"
    loader = LOADERS[name][0]
    if name.startswith("beir_"):
        return f"{root}/beir/{loader.args[0]}/: corpus.jsonl, queries.jsonl, qrels/<split>.tsv"
    split = LOADERS[name][1][0]
    files = multireqa.official_paths("/", loader.args[0], split)  # relative to the root
    return f"{split}: " + ", ".join(f"{root}{f}" for f in files)


def describe() -> str:
    """Every task with its splits and files, then every mixture with its rates."""
    every = loaders()
    lines = ["tasks (train.task / evaluate.task / --task):"]
    for name in sorted(every):
        lines += [f"  {name}", f"      splits: {', '.join(every[name][1])}", f"      reads:  {files_of(name)}"]
    lines.append("mixtures (train.task; inputs.task_batches draws one task a batch):")
    for name, rates in sorted(mixtures().items()):
        lines.append(f"  {name}: " + ", ".join(f"{task} {rate:g}" for task, rate in rates.items()))
    lines.append("your own data: gin local_tasks.tasks (tasks/declared.py; README 'Train on your own data')")
    return "\n".join(lines)
