"""`samtone eval`: a trained model's retrieval metrics on a task split, written to MODEL_DIR/eval/.

Encodes the split's queries and the whole corpus into resumable embedding shards (each process
its share, every local device busy), searches the top-k (exact on device by default), scores
with ir-measures, and writes under MODEL_DIR/eval/:

  <task>_<split>_step<N>.json   metrics, and per-query values for `samtone compare`
  <task>_<split>_step<N>.trec   the run (TREC format), for significance tests elsewhere
  embeddings/<task>_<split>_step<N>/{queries,documents}/   (kept unless evaluate.keep_embeddings=False)
(a folder with no training step, an import or an export: <task>_<split>.json, ...)

For BEIR tasks a document whose id equals the query id is dropped from the ranking, as BEIR does.
"""

from __future__ import annotations

import json

import gin
import numpy as np

from samtone_jax.compression import quantization
from samtone_jax.core import paths, run_folders
from samtone_jax.core.atomic_file import atomic_open, write_atomic
from samtone_jax.core.console_progress import Progress
from samtone_jax.core.errors import BadValueError
from samtone_jax.evaluation import compressed, metrics, search
from samtone_jax.evaluation.embedding_store import encode_to_shards, load_shards


def embed(
    encoder,
    texts: dict[str, str],
    side: str,
    out_dir: str | None = None,
    shard_size: int = 65536,
    precision: str = "float32",
    dim: int | None = None,
    stale: str = "recompute",
) -> tuple[list[str], np.ndarray]:
    """(sorted ids, [N, P] embeddings) of `texts` on `side`; through resumable shards in `out_dir`
    when given (every process encodes its share; all of them must call this). `precision` / `dim`:
    stored compressed as an index serves them (Encoder.encode_queries). Shards in `out_dir` of
    anything else (another model, training, vocabulary, prompt, length…: `model_fingerprint`) are
    recomputed (`stale` 'recompute') or refused ('refuse')."""
    import functools

    import jax

    ids = sorted(texts)
    encode = encoder.encode_queries if side == "query" else encoder.encode_documents
    encode = functools.partial(encode, precision=precision, dim=dim)
    what = "encoding queries" if side == "query" else "encoding documents"
    if out_dir is None:
        with Progress(len(ids), what, process_index=jax.process_index()) as progress:
            return ids, encode([texts[i] for i in ids], progress.update)
    fingerprint = {
        "source": encoder.source,
        "step": encoder.step,
        "side": side,
        "length": encoder.query_length if side == "query" else encoder.doc_length,
        **({"precision": precision} if precision != "float32" else {}),
        **({"dim": dim} if dim is not None else {}),
        **model_fingerprint(encoder, side, int8=precision == "int8"),
    }
    encode_to_shards(
        encode,
        ids,
        [texts[i] for i in ids],
        out_dir,
        shard_size=shard_size,
        fingerprint=fingerprint,
        stale=stale,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        description=what,
    )
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(f"embedded {out_dir}")
    stored_ids, embeddings = load_shards(out_dir)
    return stored_ids, embeddings


def model_fingerprint(encoder, side: str, int8: bool = False) -> dict:
    """What, beyond the texts and the length, decides the embeddings `encoder` gives on `side`: the
    parameters' checkpoint (its fingerprint, which changes when it is written again), the weights
    chosen, the vocabulary's bytes, the side's prompt, and for int8 codes the calibration's ranges."""
    import hashlib

    from samtone_jax.checkpoints import reader

    vocabulary = encoder.vocabulary
    data = getattr(vocabulary, "tokenizer_json", None) or getattr(vocabulary, "sp_model", None) or b""
    about = {
        "weights": encoder.weights,
        "vocabulary_sha256": hashlib.sha256(data).hexdigest()[:16],
        "prompt": encoder.query_prompt if side == "query" else encoder.document_prompt,
    }
    if encoder.source is not None and encoder.params_from_source:
        about["checkpoint"] = reader.fingerprint(encoder.source, encoder.step)
    else:  # weights set in memory (Encoder.with_params): their bytes
        import jax

        digest = hashlib.sha256()
        for leaf in jax.tree_util.tree_leaves(jax.device_get(encoder.params)):
            digest.update(np.ascontiguousarray(leaf).tobytes())
        about["parameters_sha256"] = digest.hexdigest()[:16]
    if int8 and encoder.calibration is not None:
        record = json.dumps(encoder.calibration.record, sort_keys=True).encode()
        about["calibration_sha256"] = hashlib.sha256(record).hexdigest()[:16]
    return about


def dense_embeddings(encoder, queries: dict[str, str], corpus: dict[str, str], embeddings_dir: str | None = None):
    """(query ids, [Q, P] query embeddings, document ids, [N, P] document embeddings)."""
    join = (lambda name: paths.join(embeddings_dir, name)) if embeddings_dir else (lambda name: None)
    query_ids, q = embed(encoder, queries, "query", join("queries"))
    doc_ids, d = embed(encoder, corpus, "document", join("documents"))
    return query_ids, q, doc_ids, d


def search_run(query_ids, q, doc_ids, d, *, k=100, mesh=None, exclude_self=False, backend="exact"):
    """{query id: {doc id: score}} of the top-k documents of every query by q · d."""
    scores, indices = search.top_k(q, d, k=k + int(exclude_self), backend=backend, mesh=mesh)
    return _as_run(query_ids, doc_ids, scores, indices, k, exclude_self)


def _as_run(query_ids, doc_ids, scores, indices, k: int, exclude_self: bool) -> dict[str, dict[str, float]]:
    run = metrics.run_from_top_k(query_ids, doc_ids, scores, indices)
    if exclude_self:
        run = {qid: dict(list(((d, s) for d, s in docs.items() if d != qid))[:k]) for qid, docs in run.items()}
    return run


def calibration_sample(d: np.ndarray, size: int) -> np.ndarray:
    """An evenly spaced sample of `size` document embeddings (all when fewer): int8's calibration."""
    if size < 2:
        raise BadValueError(f"evaluate.calibration_size must be >= 2, got {size}")
    return d[np.linspace(0, len(d) - 1, min(size, len(d))).astype(int)]


def dense_run(
    encoder,
    queries: dict[str, str],
    corpus: dict[str, str],
    *,
    k: int = 100,
    mesh=None,
    exclude_self: bool = False,
    backend: str = "exact",
    embeddings_dir: str | None = None,
) -> dict[str, dict[str, float]]:
    """{query id: {doc id: score}} of the top-k documents for every query (`encoder`: a
    samtone_jax.inference.encoder.Encoder)."""
    embedded = dense_embeddings(encoder, queries, corpus, embeddings_dir)
    return search_run(*embedded, k=k, mesh=mesh, exclude_self=exclude_self, backend=backend)


def write_trec(path, run: dict[str, dict[str, float]], tag: str) -> None:
    """The run in TREC format, scores with 9 significant digits (float32 exactly: rounding to fewer
    would turn near-equal scores into ties that trec_eval breaks by document id, not by our order)."""
    with atomic_open(path, "w") as f:
        for qid in sorted(run):
            ranked = sorted(run[qid].items(), key=lambda x: -x[1])
            for rank, (did, score) in enumerate(ranked, start=1):
                f.write(f"{qid} Q0 {did} {rank} {score:.9g} {tag}\n")


def _write_record(out, name, task, split, step, collection, run, measures, k, backend, about: dict) -> dict:
    """<name>.json (valid JSON or none): the metrics and per-query values of `run`, with `about` (dim,
    precision, rescore, trec, what the index costs); returns the metrics."""
    results = metrics.evaluate(collection.qrels, run, measures)
    record = {
        "task": task,
        "split": split,
        "step": step,
        **{key: value for key, value in about.items() if key in ("dim", "precision", "rescore", "weights")},
        "queries": len(run),
        "corpus": len(collection.corpus),
        "k": k,
        "backend": backend,
        "metrics": results,
        **{key: value for key, value in about.items() if key not in ("dim", "precision", "rescore", "weights")},
        "per_query": metrics.per_query(collection.qrels, run, measures),
    }
    write_atomic(out / f"{name}.json", json.dumps(record, indent=1, allow_nan=False))
    what = "".join(
        [
            f", first {about['dim']} dimensions" if "dim" in about else "",
            f", {about['precision']}" if about.get("precision", "float32") != "float32" else "",
            f" rescored from the top {about['rescore']}·k" if about.get("rescore") else "",
        ]
    )
    print(
        f"{task}/{split}{'' if step is None else f' step {step}'}{what}: {len(run):,} queries, "
        f"{len(collection.corpus):,} documents "
        f"-> {out}/{name}.json"
    )
    print(format_table(results))
    return results


def served_int8_ranges(encoder, d: np.ndarray, size: int) -> tuple[np.ndarray, dict]:
    """(ranges, where they came from) for documents d [N, D]: the model's calibration.json when it
    has this dimension, else an even sample of `size` of the documents."""
    shipped = encoder.calibration
    if shipped is not None and d.shape[1] in shipped.ranges:
        source = shipped.record.get("source", {})
        return shipped.ranges[d.shape[1]], {"source": f"the model's {run_folders.CALIBRATION}", **source}
    sample = calibration_sample(d, size)
    return quantization.int8_ranges(sample), {"source": "an even sample of the corpus", "documents": len(sample)}


def _compressed_run(query_ids, q, doc_ids, d, precision, factor, int8, *, k, mesh, exclude_self, backend):
    """(run, what it measured) of the index at `precision` (rescored from the top k·factor when
    factor > 0), int8 with int8 = (ranges, where they came from)."""
    ranges = int8[0] if precision == "int8" else None
    found = compressed.compressed_top_k(
        q, d, precision, k=k + int(exclude_self), ranges=ranges, rescore_factor=factor, mesh=mesh
    )
    about = {"precision": precision, **({"rescore": factor} if factor else {})}
    about |= {"bytes_per_document": found.bytes_per_document, "queries_per_second": round(found.queries_per_second, 1)}
    if precision == "int8":
        about["calibration"] = int8[1]
    return _as_run(query_ids, doc_ids, found.ranking_scores(), found.indices, k, exclude_self), about


def format_table(results: dict[str, float]) -> str:
    return "\n".join(f"  {measure:8s} {value:.4f}" for measure, value in results.items())


@gin.configurable
def evaluate(
    model_dir: str = gin.REQUIRED,
    task: str = gin.REQUIRED,
    split: str | None = None,
    vocabulary: str | None = None,
    query_length: int | None = None,
    doc_length: int | None = None,
    k: int = 100,
    step: int | None = None,
    backend: str = "exact",
    keep_embeddings: bool = True,
    shard_size: int = 65536,
    packing_max_segments: int | None = None,
    dims: tuple[int, ...] | None = None,
    max_queries: int | None = None,
    candidates: int | None = None,
    precisions: tuple[str, ...] = ("float32",),
    rescore: int = 0,
    calibration_size: int = 10000,
    weights: str = "params",
) -> dict[str, float]:
    """Evaluate the checkpoint at `step` (default: the latest) of MODEL_DIR on task/split (default:
    test, or dev for a task without a test split); lengths default to the model's serving lengths
    (inference/serving_lengths.py), and the record says which were used.

    backend: 'exact' (on device), 'approx' (lax.approx_max_k, TPU), 'faiss' (IndexFlatIP) or
    'faiss_ivfpq' (approximate); see samtone_jax/evaluation/search.py. `packing_max_segments` S:
    texts encoded packed, up to S a row (the same embeddings, less padding; samtone_jax.load).
    `dims` (k, ...; CLI `samtone eval --dims 64,128`): from the same embeddings, the metrics of each
    truncation to the first k dimensions re-normalised (a Matryoshka model's smaller indexes), each
    in its own <task>_<split>_step<N>_dim<k>.json beside the full one. `max_queries` / `candidates`
    (a quick look at a big corpus): an even sample of the judged queries ranked among their relevant
    documents and an even sample of the others, `candidates` in all (RetrievalCollection.sample);
    the record is then <task>_<split>_step<N>_q<max_queries>_c<candidates>.json.
    `precisions` (CLI --precisions float32,int8,binary): also the metrics of the index compressed
    as serving stores it (quantization.py; evaluation/compressed.py), queries compressed alike,
    each in <name>[_dim<k>]_<precision>.json, for every dimension of `dims` too, from one encoding
    pass; int8's per-dimension ranges are the model's (calibration.json, `samtone calibrate`), else
    from an even sample of `calibration_size` document embeddings (the record says which).
    `rescore` R > 0: int8 / binary also with the top k·R re-ranked by the float query
    (<name>..._<precision>_rescore<R>.json). Each record says the index's bytes a document and,
    for an exact search, its queries a second. `weights` 'ema': a run's moving average of its
    parameters (step.ema_decay), its records named <task>_<split>_step<N>_ema....
    """
    import jax

    from samtone_jax.inference import encoder as inference
    from samtone_jax.models import partitioning
    from samtone_jax.tasks import catalogue

    if split is None:  # test, or dev for a task without one (msmarco_passage)
        splits = catalogue.loaders()[task][1] if task in catalogue.loaders() else ("test",)
        split = "test" if "test" in splits or "dev" not in splits else "dev"
    collection = catalogue.collection(task, split)  # bad data fails here, before the model is loaded
    if max_queries or candidates:
        collection = collection.sample(max_queries, candidates)
    mesh = partitioning.create_mesh(devices=jax.local_devices())
    encoder = inference.load_encoder(
        model_dir,
        step=step,
        vocabulary=vocabulary,
        query_length=query_length,
        doc_length=doc_length,
        mesh=mesh,
        packing_max_segments=packing_max_segments,
        task=task,
        weights=weights,
    )
    # <task>_<split>_step<N>; a folder with no training step (an import, an export): <task>_<split>
    name = f"{task}_{split}" + (f"_step{encoder.step}" if encoder.step is not None else "")
    name += "_ema" if weights == "ema" else ""
    if max_queries or candidates:
        name += f"_q{max_queries or 'all'}_c{candidates or 'all'}"
    out = paths.as_path(model_dir) / run_folders.EVAL
    embeddings_dir = str(out / "embeddings" / name)
    if dims is not None:  # checked before the corpus is encoded
        width = encoder.encode_queries([""]).shape[1]
        if not dims or list(dims) != sorted(set(dims)) or dims[0] < 1 or dims[-1] > width:
            raise BadValueError(
                f"evaluate.dims (--dims) must be increasing dimensions in [1, {width}] (the model's embedding "
                f"dimension); got {tuple(dims)}"
            )
    variants = compressed.variants(
        precisions, rescore, ("evaluate.precisions (--precisions)", "evaluate.rescore (--rescore)")
    )  # checked before the corpus is encoded
    if variants != [("float32", 0)] and backend != "exact":
        raise BadValueError(f"evaluate.precisions / rescore search on device: use backend 'exact', not {backend!r}")
    query_ids, q, doc_ids, d = dense_embeddings(encoder, collection.queries, collection.corpus, embeddings_dir)
    exclude_self = task.startswith("beir_")
    search_args = dict(k=k, mesh=encoder.mesh, exclude_self=exclude_self, backend=backend)
    measures = metrics.measures_for_depth(k)
    full_run = results = None
    main = ("float32", 0) if ("float32", 0) in variants else variants[0]
    for dim in [*(dims or ()), None]:
        qd, dd = (q, d) if dim is None else (quantization.truncated(q, dim), quantization.truncated(d, dim))
        int8 = served_int8_ranges(encoder, dd, calibration_size) if any(p == "int8" for p, _ in variants) else None
        for precision, factor in variants:
            about = ({} if dim is None else {"dim": dim}) | ({"weights": weights} if weights != "params" else {})
            # The lengths it encoded at, and those it trained at (serving_lengths.py): a fine-tune is
            # served at its base model's lengths unless evaluate.query_length / doc_length say otherwise.
            about["lengths"] = {"query": encoder.query_length, "document": encoder.doc_length}
            about["training_lengths"] = dict(zip(("query", "document"), encoder.training_lengths, strict=True))
            if len(variants) == 1 and precision == "float32":
                run = search_run(query_ids, qd, doc_ids, dd, **search_args)
            else:
                run, measured = _compressed_run(query_ids, qd, doc_ids, dd, precision, factor, int8, **search_args)
                about |= measured
            if dim is None and (precision, factor) == main:
                full_run = run  # the .trec, the returned metrics: full float32 when asked for
            if jax.process_index() != 0:
                continue
            suffix = (f"_dim{dim}" if dim else "") + ("" if precision == "float32" else f"_{precision}")
            suffix += f"_rescore{factor}" if factor else ""
            if run is full_run:  # the record `compare` and significance tests elsewhere read
                tag = "samtone" + (f"_step{encoder.step}" if encoder.step is not None else "")
                write_trec(out / f"{name + suffix}.trec", run, tag)
                about["trec"] = f"{name + suffix}.trec"
            record = _write_record(
                out, name + suffix, task, split, encoder.step, collection, run, measures, k, backend, about
            )
            results = record if run is full_run else results
    if jax.process_index() != 0:
        return metrics.evaluate(collection.qrels, full_run, measures)
    if not keep_embeddings:
        paths.as_path(embeddings_dir).rmtree(missing_ok=True)
    return results
