"""`samtone eval`: a trained model's retrieval metrics on a task split, written to MODEL_DIR/eval/.

Encodes the split's queries and the whole corpus, runs exact top-k (sharded over the local
devices' 'data' axis), scores with ir-measures, and writes `<task>_<split>_step<N>.json` (metrics)
and `.trec` (the run, for significance tests) under MODEL_DIR/eval/, printing a table. For BEIR
tasks a document whose id equals the query id is dropped from the ranking, as BEIR does.
"""

from __future__ import annotations

import json
import os

import gin

from samtone_jax.evaluation import metrics, search
from samtone_jax.evaluation.encode import encode_texts


def dense_run(
    model,
    params,
    vocabulary,
    queries: dict[str, str],
    corpus: dict[str, str],
    *,
    query_length: int,
    doc_length: int,
    k: int = 100,
    mesh=None,
    exclude_self: bool = False,
) -> dict[str, dict[str, float]]:
    """{query id: {doc id: score}} of the top-k documents for every query."""
    query_ids, doc_ids = sorted(queries), sorted(corpus)
    q = encode_texts(model, params, vocabulary, [queries[i] for i in query_ids], query_length, "query")
    d = encode_texts(model, params, vocabulary, [corpus[i] for i in doc_ids], doc_length, "document")
    scores, indices = search.exact_top_k(q, d, k=k + int(exclude_self), mesh=mesh)
    run = metrics.run_from_top_k(query_ids, doc_ids, scores, indices)
    if exclude_self:
        run = {qid: dict(list(((d, s) for d, s in docs.items() if d != qid))[:k]) for qid, docs in run.items()}
    return run


def write_trec(path: str, run: dict[str, dict[str, float]], tag: str) -> None:
    with open(path, "w") as f:
        for qid in sorted(run):
            ranked = sorted(run[qid].items(), key=lambda x: -x[1])
            for rank, (did, score) in enumerate(ranked, start=1):
                f.write(f"{qid} Q0 {did} {rank} {score:.6f} {tag}\n")


@gin.configurable
def evaluate(model_dir: str = gin.REQUIRED, task: str = gin.REQUIRED, split: str = "test",
             vocabulary: str | None = None, query_length: int = 64, doc_length: int = 128, k: int = 100,
             step: int | None = None) -> dict[str, float]:  # fmt: skip
    """Evaluate the checkpoint at `step` (default: the latest) of MODEL_DIR on task/split."""
    import jax

    from samtone_jax import gin_utils, partitioning, tasks
    from samtone_jax.checkpoints.train_checkpoints import restore_on_one_device
    from samtone_jax.data import vocab as vocab_lib

    model = gin_utils.model()
    checkpoints = os.path.join(model_dir, "checkpoints")
    steps = sorted(int(d) for d in os.listdir(checkpoints) if d.isdigit()) if os.path.isdir(checkpoints) else []
    if not steps:
        raise FileNotFoundError(f"no checkpoint in {checkpoints}: train first (samtone train) or fix MODEL_DIR")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise FileNotFoundError(f"no checkpoint for step {step} in {checkpoints}; available: {steps}")
    params = restore_on_one_device(os.path.join(checkpoints, str(step), "state"))["params"]
    collection = tasks.load(task, split)
    mesh = partitioning.create_mesh(devices=jax.local_devices())
    run = dense_run(model, params, vocab_lib.vocabulary(vocabulary), collection.queries, collection.corpus,
                    query_length=query_length, doc_length=doc_length, k=k, mesh=mesh,
                    exclude_self=task.startswith("beir_"))  # fmt: skip
    results = metrics.evaluate(collection.qrels, run)
    out = os.path.join(model_dir, "eval")
    os.makedirs(out, exist_ok=True)
    name = f"{task}_{split}_step{step}"
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump({"task": task, "split": split, "step": step, "queries": len(run), "corpus": len(collection.corpus),
                   "metrics": results}, f, indent=2)  # fmt: skip
    write_trec(os.path.join(out, name + ".trec"), run, f"samtone_step{step}")
    print(f"{task}/{split} step {step}: {len(run):,} queries, {len(collection.corpus):,} documents")
    for measure, value in results.items():
        print(f"  {measure:8s} {value:.4f}")
    return results
