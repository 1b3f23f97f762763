"""Register every task of tasks/catalogue.py as a seqio Task (and its mixtures).

`register(spec)` (re)registers all tasks with an InputSpec (data/input_spec.py: the vocabulary and
the example columns); it runs with the defaults (T5's public vocabulary) on import of
`samtone_jax.tasks.registration`, and again from a run with its own. The source of each task is
a `seqio.FunctionDataSource` over the collection's relevant (query, document) pairs, in a stable
order; `shuffle_files=True` with a seed permutes them (a full, deterministic shuffle, not a
buffer).
"""

from __future__ import annotations

import functools

import numpy as np
import seqio

from samtone_jax.core.errors import BadValueError
from samtone_jax.core.tensorflow_setup import tf
from samtone_jax.data import vocab as vocab_lib
from samtone_jax.data.collection import text_id
from samtone_jax.data.false_negatives import FalseNegativeFilter
from samtone_jax.data.input_spec import InputSpec
from samtone_jax.tasks import catalogue, declared, prompts


def examples(
    name: str, split: str, spec: InputSpec = InputSpec(), skip_bad_records: bool | None = None
) -> dict[str, np.ndarray]:
    """Column arrays of the task's training examples with the columns `spec` asks for (cached per
    data root); see `_examples`. skip_bad_records None: gin's `skip_bad_records.enabled`."""
    skip = catalogue.skip_bad_records() if skip_bad_records is None else skip_bad_records
    negatives_file, prompt = catalogue.hard_negatives_file(), prompts.prompt_of(name)
    root = catalogue.root_of(name)
    return _examples(
        name,
        split,
        spec.num_negatives,
        skip,
        root,
        negatives_file,
        spec.teacher_scores,
        spec.guide,
        prompt,
        spec.negatives_fallback,
    )


@functools.lru_cache(maxsize=16)
def _examples(
    name: str,
    split: str,
    num_negatives: int,
    skip_bad_records: bool,
    root: str,
    negatives_file: str | None,
    teacher_scores: bool,
    guide: FalseNegativeFilter | None,
    prompt: tuple[str, str] = ("", ""),
    negatives_fallback: bool = False,
) -> dict[str, np.ndarray]:
    """Column arrays of the task's training examples: one row per relevant (query, document) pair.

    With num_negatives = K, only queries with ≥ K hard negatives are kept (the count of those
    dropped is logged), and each row carries its first K negatives; with `negatives_fallback` every
    query is kept, its missing negatives padded with its own positive (counted), which the loss
    removes (objectives/losses.py: in-batch negatives only for it). `prompt` (query, document):
    put before every text (tasks.prompts); the ids stay those of the texts themselves.
    """
    collection = catalogue.collection(name, split, skip_bad_records)
    pairs = collection.pairs()
    if num_negatives:
        short = sum(len(collection.hard_negatives.get(q, [])) < num_negatives for q, _ in pairs)
        if negatives_fallback and not any(collection.hard_negatives.get(q) for q, _ in pairs):
            raise BadValueError(
                f"task {name}/{split}: no query has a hard negative (hard_negatives_file.path: another split's or "
                "another task's file?); inputs.negatives_fallback pads queries that have fewer than K, not all"
            )
        if short and negatives_fallback:
            collection.stats["pairs_with_negatives_padded_by_their_positive"] += short
            collection.stats.report(f"{name}/{split}")
        elif short == len(pairs):
            raise BadValueError(f"task {name}/{split}: no query has {num_negatives} hard negatives (NUM_NEGATIVES)")
        elif short:
            collection.stats["pairs_without_enough_negatives"] += short
            collection.stats.report(f"{name}/{split}")
            pairs = [(q, d) for q, d in pairs if len(collection.hard_negatives.get(q, [])) >= num_negatives]
    queries = [collection.queries[q] for q, _ in pairs]
    documents = [collection.corpus[d] for _, d in pairs]
    query_prompt, doc_prompt = prompt
    columns = {
        "query": np.array([query_prompt + t for t in queries], dtype=object),
        "document": np.array([doc_prompt + t for t in documents], dtype=object),
        "query_id": np.array([text_id(t) for t in queries], np.int64),
        "doc_id": np.array([text_id(t) for t in documents], np.int64),
    }
    if num_negatives:
        negatives = [
            [collection.corpus[n] for n in collection.hard_negatives.get(q, [])[:num_negatives]] for q, _ in pairs
        ]
        negatives = [
            row + [collection.corpus[d]] * (num_negatives - len(row))
            for row, (_, d) in zip(negatives, pairs, strict=True)
        ]
        prompted = [[doc_prompt + t for t in row] for row in negatives]
        columns["negatives"] = np.array(prompted, dtype=object).reshape(len(pairs), num_negatives)
        columns["negative_ids"] = np.array([[text_id(t) for t in row] for row in negatives], np.int64)
    if teacher_scores or guide is not None:
        what = f"{name}/{split}"
        columns.update(_teacher_columns(collection, pairs, num_negatives, teacher_scores, guide, what, negatives_file))
    return columns


def _teacher_columns(collection, pairs, num_negatives: int, teacher_scores: bool, guide, what: str, path) -> dict:
    """teacher_scores [N, 1 + K] float32 and / or guide_ids [N, G] int64 of the pairs (InputSpec)."""
    scores = collection.teacher_scores
    if not scores:
        raise BadValueError(
            f"task {what}: inputs.teacher_scores / inputs.teacher_guide need teacher scores, and "
            f"hard_negatives_file.path={path!r} has none: point it at a `samtone score` file (JSON lines with "
            "'scores')"
        )

    def score(q: str, d: str) -> float:
        if d not in scores.get(q, {}):
            raise BadValueError(
                f"task {what}: {path} has no teacher score for query {q!r} and document {d!r}: score this task "
                "and split with `samtone score --task=... --split=...` (with train_eval.split too, score "
                "--split=all: one file serves both)"
            )
        return scores[q][d]

    out = {}
    if teacher_scores:
        out["teacher_scores"] = np.array(
            [[score(q, d)] + [score(q, n) for n in collection.hard_negatives[q][:num_negatives]] for q, d in pairs],
            np.float32,
        ).reshape(len(pairs), 1 + num_negatives)
    if guide is not None:
        width = guide.max_ids
        rows, flagged_total, over, unknown = [], 0, 0, 0
        for q, d in pairs:
            relevant = {r for r, rel in collection.qrels.get(q, {}).items() if rel > 0}
            candidates = sorted(  # best first; a scored document this corpus lacks is counted, not used
                (-s, c) for c, s in scores.get(q, {}).items() if c not in relevant and c in collection.corpus
            )
            unknown += sum(c not in collection.corpus for c in scores.get(q, {}))
            flags = guide.flags([-s for s, _ in candidates], score(q, d))
            flagged = [text_id(collection.corpus[c]) for (_, c), f in zip(candidates, flags, strict=True) if f]
            flagged_total += len(flagged)
            over += len(flagged) > width
            own = text_id(collection.corpus[d])
            rows.append((flagged + [own] * width)[:width])
        out["guide_ids"] = np.array(rows, np.int64).reshape(len(pairs), width)
        collection.stats["guide_flagged_documents"] += flagged_total
        collection.stats["pairs_with_more_flagged_than_guide_max_ids"] += over
        collection.stats["teacher_scores_of_documents_not_in_the_corpus"] += unknown
        collection.stats.report(what)
    return out


def _dataset_fn(name: str, spec: InputSpec, split: str, shuffle_files: bool, seed: int | None = None):
    columns = examples(name, split, spec)
    order = None
    if shuffle_files:
        order = np.random.RandomState(0 if seed is None else seed).permutation(len(columns["query"]))
    if vocab_lib.is_wordpiece(spec.vocabulary):  # tokenised here, all texts at once (see register)
        tokenized = _tokenized_columns(columns, spec.vocabulary)
        if order is not None:
            tokenized = {
                k: tf.gather(v, order) if isinstance(v, tf.RaggedTensor) else v[order] for k, v in tokenized.items()
            }
        return tf.data.Dataset.from_tensor_slices(tokenized)
    if order is not None:
        columns = {k: v[order] for k, v in columns.items()}
    return tf.data.Dataset.from_tensor_slices(
        {k: tf.constant(v.tolist()) if v.dtype == object else v for k, v in columns.items()}
    )


# (id of an `examples` result, vocabulary) -> (that result, its columns tokenised): every data shard
# and every dataset of the process built from one tokenisation of the task (a few tasks kept).
_TOKENIZED: dict[tuple[int, str], tuple[dict, dict]] = {}


def _tokenized_columns(columns: dict, vocabulary: str) -> dict:
    key = (id(columns), vocabulary)
    hit = _TOKENIZED.get(key)
    if hit is None or hit[0] is not columns:
        tokens = vocab_lib.vocabulary(vocabulary).tokens
        hit = _TOKENIZED[key] = (columns, {k: _tokenized(tokens, v) for k, v in columns.items()})
        while len(_TOKENIZED) > 8:
            _TOKENIZED.pop(next(iter(_TOKENIZED)))
    return hit[1]


def _tokenized(tokens, column: np.ndarray):
    """A text column [N] (or [N, K]) as ragged int32 ids [N, None] ([N, K, None]); others as they are."""
    if column.dtype != object:
        return column
    values, lengths = tokens.encode_batch(column.reshape(-1).tolist())
    ids = tf.RaggedTensor.from_row_lengths(values, lengths)
    return ids if column.ndim == 1 else tf.RaggedTensor.from_uniform_row_length(ids, column.shape[1])


def _tokenize_negatives(ds: tf.data.Dataset, output_features) -> tf.data.Dataset:
    vocabulary = output_features["document"].vocabulary

    def tokenize(ex):
        if "negatives" in ex:
            ex = dict(ex, negatives=vocabulary.encode_tf(ex["negatives"]))
        return ex

    return ds.map(tokenize, num_parallel_calls=tf.data.AUTOTUNE)


# What the registry holds now (register's key): a run with the same inputs leaves it as it is.
_registered: tuple | None = None
_names: set[str] = set()  # the task and mixture names it registered (a later gin may declare fewer)


def register(spec: InputSpec = InputSpec()) -> None:
    """(Re)register every task and mixture with `spec`'s vocabulary and example columns (hard
    negatives, teacher features); nothing changes when the registry already holds exactly these."""
    global _registered
    every = catalogue.loaders()
    every_mixture = catalogue.mixtures()
    gin_declared = repr((declared.tfds_tasks(), declared.local_tasks(), every_mixture))
    key = (spec.vocabulary, spec.columns, gin_declared, tuple(sorted(every)))
    if key == _registered and all(name in seqio.TaskRegistry.names() for name in every):
        return
    vocabulary = vocab_lib.vocabulary(spec.vocabulary)
    # A tokenizer.json's texts are tokenised by the source, every text of the task in one call of the
    # Rust library (a text at a time through tf.numpy_function cost 18 s of a MiniLM run's 30 s start
    # on WordNet); a SentencePiece model's by seqio's TensorFlow op, as T5X does.
    pretokenized = vocab_lib.is_wordpiece(spec.vocabulary)
    # EOS is appended by the feature converter after truncation, as T5's append_eos_after_trim.
    output_features = {
        "query": seqio.Feature(vocabulary, add_eos=False),
        "document": seqio.Feature(vocabulary, add_eos=False),
    }
    for name in _names | set(every) | set(every_mixture):  # what we registered before: none of it left over
        seqio.TaskRegistry.remove(name)
        seqio.MixtureRegistry.remove(name)
    for name, (_, splits) in every.items():
        seqio.TaskRegistry.add(
            name,
            source=seqio.FunctionDataSource(functools.partial(_dataset_fn, name, spec), splits=splits),
            output_features=output_features,
            preprocessors=[] if pretokenized else [seqio.preprocessors.tokenize, _tokenize_negatives],
        )
    for mixture, rates in every_mixture.items():  # named in the TF-free catalogue
        seqio.MixtureRegistry.add(mixture, list(rates.items()))
    _registered = key
    _names.clear()
    _names.update(every, every_mixture)


register()
