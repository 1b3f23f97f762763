"""Tasks and their sources declared in gin rather than in code: TensorFlow Datasets datasets
(`tfds_tasks.tasks`) and your own files (`local_tasks.tasks`: JSON lines of pairs, a BEIR folder,
an MS MARCO-style folder), at any local or gs:// path. tasks/catalogue.py adds them to the
built-in tasks; they train, mine, score, evaluate and mix like those.

  local_tasks.tasks = {
      'my_pairs': {'format': 'jsonl', 'path': 'gs://bucket/pairs.jsonl.gz', 'test_fraction': 0.05},
      'my_split': {'format': 'jsonl', 'files': {'train': 'train.jsonl', 'test': 'test.jsonl'}},
      'my_beir': {'format': 'beir', 'path': '/data/my_beir'},
  }
"""

from __future__ import annotations

import functools
import os

import gin

from samtone_jax.core.errors import BadValueError
from samtone_jax.data import msmarco
from samtone_jax.data.collection import RetrievalCollection


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
        if missing:
            raise BadValueError(f"tfds_tasks.tasks[{name!r}]: missing {sorted(missing)}")
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


LOCAL_FORMATS = {  # format -> (its files, the default splits)
    "jsonl": ("JSON lines of pairs (data/jsonl_pairs.py): one file (path) or one a split (files)", ("train", "test")),
    "beir": ("a BEIR folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv", ("train", "dev", "test")),
    "msmarco": (
        "an MS MARCO-style folder: collection.tsv, queries.<split>.tsv, qrels.<split>.tsv "
        "(optional: negatives.<split>.tsv)",
        ("train", "dev"),
    ),
}
LOCAL_KEYS = {"format", "path", "files", "splits", "test_fraction", "dev_fraction"}


@gin.configurable
def local_tasks(tasks: dict | None = None) -> dict:
    """Tasks over your own files, local or gs://, as gin `local_tasks.tasks = {NAME: SPEC}`; SPEC:

      format     'jsonl' (pairs / triplets: data/jsonl_pairs.py), 'beir' (a BEIR folder) or
                 'msmarco' (an MS MARCO-style TSV folder)
      path       jsonl: one file, split by rule into 'train' / 'test' (and 'all'); beir, msmarco: the folder
      files      jsonl instead of path: {split: file}, the splits taken from files
      splits     beir, msmarco: the splits the folder has (default ('train', 'dev', 'test') / ('train', 'dev'))
      test_fraction  jsonl with one path: the share of queries in 'test' (default 0.1): by the md5 of
                 the normalised query text (data/jsonl_pairs.split_of), so a query's pairs stay together
      dev_fraction   jsonl with one path: the share in 'dev' (default 0: none), the next part of the
                 md5 range (a validation split: WiSE-FT's coefficient is picked on it)

    They train, mine, score, evaluate and mix (gin mixtures.declared) like the built-in tasks; `samtone
    tasks` lists them with their splits and files."""
    out = {}
    for name, spec in dict(tasks or {}).items():
        where = f"local_tasks.tasks[{name!r}]"
        if not isinstance(spec, dict):
            raise BadValueError(f"{where} must be a dict with 'format' and 'path' (or 'files'); got {spec!r}")
        unknown = sorted(set(spec) - LOCAL_KEYS)
        if unknown:
            raise BadValueError(f"{where}: unknown key(s) {unknown}; known: {', '.join(sorted(LOCAL_KEYS))}")
        kind = spec.get("format")
        if kind not in LOCAL_FORMATS:
            raise BadValueError(f"{where}: 'format' must be one of {', '.join(LOCAL_FORMATS)}; got {kind!r}")
        files = spec.get("files")
        if kind == "jsonl" and ("path" in spec) == (files is not None):
            raise BadValueError(f"{where}: give 'path' (one file, split by rule) or 'files' ({{split: file}}): one")
        fractions = {"test_fraction", "dev_fraction"} & set(spec)
        if kind != "jsonl" and ("path" not in spec or files is not None or fractions):
            raise BadValueError(f"{where}: a {kind} task takes 'path' (its folder) and optionally 'splits'")
        if kind == "jsonl" and "splits" in spec:
            raise BadValueError(f"{where}: a jsonl task's splits are train / test / all (path) or the keys of 'files'")
        if files is not None and fractions:
            raise BadValueError(
                f"{where}: {' / '.join(sorted(fractions))} split one 'path'; with 'files' the files are the splits"
            )
        strings = lambda v: isinstance(v, str) and v  # noqa: E731
        if "path" in spec and not strings(spec["path"]):
            raise BadValueError(f"{where}: 'path' must be a file or folder name; got {spec['path']!r}")
        splits = spec.get("splits", ("train",))
        if not isinstance(splits, (list, tuple)) or not splits or not all(map(strings, splits)):
            raise BadValueError(f"{where}: 'splits' must list split names, e.g. ('train', 'dev'); got {splits!r}")
        if files is not None and (not isinstance(files, dict) or not files or not all(map(strings, files.values()))):
            raise BadValueError(f"{where}: 'files' must map split names to files; got {files!r}")
        for key, default, what in (("test_fraction", 0.1, "test"), ("dev_fraction", 0.0, "dev")):
            fraction = spec.get(key, default)
            if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
                raise BadValueError(f"{where}: {key!r} must be in [0, 1) (0: no {what} split); got {fraction!r}")
        if spec.get("test_fraction", 0.1) + spec.get("dev_fraction", 0.0) >= 1:
            raise BadValueError(f"{where}: 'test_fraction' + 'dev_fraction' must leave queries to train on (< 1)")
        out[name] = dict(spec)
    return out


def local_splits(spec: dict) -> tuple[str, ...]:
    if spec["format"] == "jsonl":
        if "files" in spec:
            return tuple(spec["files"])
        held_out = (("dev",) if spec.get("dev_fraction") else ()) + (
            ("test",) if spec.get("test_fraction", 0.1) else ()
        )
        return ("train", *held_out, "all")
    return tuple(spec.get("splits", LOCAL_FORMATS[spec["format"]][1]))


def _local(name: str, spec: dict, split: str, skip_bad_records: bool = False) -> RetrievalCollection:
    from samtone_jax.data import jsonl_pairs

    if spec["format"] == "beir":
        return msmarco.load_beir(spec["path"], split, skip_bad_records, name=name)
    if spec["format"] == "msmarco":
        return msmarco.load_msmarco(spec["path"], split, skip_bad_records, name=name)
    if "files" in spec:
        return jsonl_pairs.load(spec["files"][split], name, skip_bad_records=skip_bad_records)
    fraction, dev = spec.get("test_fraction", 0.1), spec.get("dev_fraction", 0.0)
    if split == "all":
        keep = lambda query: True  # noqa: E731
    else:
        keep = lambda query: jsonl_pairs.split_of(query, fraction, dev) == split  # noqa: E731
    loaded = jsonl_pairs.load(spec["path"], name, keep, skip_bad_records)
    if split != "all" and not (loaded.queries and loaded.corpus):
        share = {
            "test": f"the first {fraction:g}",
            "dev": f"the {dev:g} after the first {fraction:g}",
            "train": f"all but the first {fraction + dev:g}",
        }[split]
        rule = f"local_tasks.tasks[{name!r}]['test_fraction'] = {fraction:g}" + (
            f", ['dev_fraction'] = {dev:g}" if dev else ""
        )
        raise BadValueError(
            f"{name}/{split} is empty: the split rule ({rule}) puts in '{split}' the queries whose md5 falls in "
            f"{share} of the range, and none of {spec['path']}'s does; change the fractions, give the splits as "
            "'files', or use split 'all'"
        )
    return loaded


def paths_of(name: str) -> list[str] | None:
    """The files or folders a declared local task reads (None: not a local task)."""
    spec = local_tasks().get(name)
    if spec is None:
        return None
    return list(spec["files"].values()) if "files" in spec else [spec["path"]]


def tasks() -> dict[str, tuple]:
    """name -> (loader(split, skip_bad_records), splits) of every task declared in gin."""
    out = {
        name: (functools.partial(_tfds, spec), tuple(spec.get("splits", ("train",))))
        for name, spec in tfds_tasks().items()
    }
    for name, spec in local_tasks().items():
        if name in out:
            raise BadValueError(f"local_tasks.tasks[{name!r}]: a tfds_tasks.tasks name too; choose another")
        out[name] = (functools.partial(_local, name, spec), local_splits(spec))
    return out


def source_of(name: str) -> str | None:
    """What a declared task reads (a cache key), None for a task not declared here."""
    if name in local_tasks():
        return f"local:{sorted(local_tasks()[name].items())}"
    spec = tfds_tasks().get(name)
    if spec is not None:
        return f"tfds:{spec['tfds_name']}@{spec.get('data_dir') or os.environ.get('TFDS_DATA_DIR', '')}"
    return None


def files_of(name: str) -> str | None:
    """What a declared task reads, for a person (`samtone tasks`)."""
    if name in local_tasks():
        spec = local_tasks()[name]
        if spec["format"] != "jsonl":
            return f"{spec['path']}/: {LOCAL_FORMATS[spec['format']][0].split(': ', 1)[1]}"
        if "files" in spec:
            return "JSON lines of pairs, " + ", ".join(f"{k}: {v}" for k, v in spec["files"].items())
        fraction, dev = spec.get("test_fraction", 0.1), spec.get("dev_fraction", 0.0)
        rule = f"test: the queries whose md5 falls in the first {fraction:g} of the range"
        rule += f", dev: the next {dev:g}" if dev else ""
        return f"JSON lines of pairs, {spec['path']} ({rule})"
    if name in tfds_tasks():
        spec = tfds_tasks()[name]
        return f"TFDS {spec['tfds_name']} (features {spec['query']} -> {spec['document']})"
    return None
