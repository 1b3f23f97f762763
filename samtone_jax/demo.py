"""`make demo`: train a tiny T5.1.1 SDE with SamToNe on WordNet and measure retrieval, on the CPU.

  1. a SentencePiece vocabulary built from WordNet's training text (runs/demo/vocab.model);
  2. `samtone train` with gin_configs/runs/demo_cpu.gin (bidirectional query-side SamToNe);
  3. held-out example sentences (senses never seen in training) retrieve their definition among
     all 117,659 WordNet definitions: P@1 and MRR of the trained model, the same model untrained,
     and BM25 (bm25s), written to runs/demo/eval.json.

Everything lands in runs/demo/ (TensorBoard events in train/, checkpoints/, config.gin). A second
`make demo` resumes the finished run and only re-evaluates; delete runs/demo to start again.
"""

from __future__ import annotations

import json
import logging
import os
import time

import flax.linen as nn
import jax

DEMO_GIN = "runs/demo_cpu.gin"
MODEL_DIR = os.environ.get("SAMTONE_DEMO_DIR", "runs/demo")
EVAL_QUERIES = 2000
VOCAB_SIZE = 8000  # pieces of the vocabulary the demo builds (runs/demo_cpu.gin's VOCAB_SIZE)


def _held_out_queries(collection, count: int) -> list[str]:
    """A fixed, evenly spaced sample of the test split's query ids."""
    ids = sorted(collection.queries)
    step = max(1, len(ids) // count)
    return ids[::step][:count]


def _bm25_run(query_ids, queries, doc_ids, corpus, k):
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)
    results, scores = retriever.retrieve(
        bm25s.tokenize(queries, stopwords="en", show_progress=False), k=k, show_progress=False, n_threads=1
    )
    return {
        q: {doc_ids[j]: float(s) for j, s in zip(row, srow, strict=True)}
        for q, row, srow in zip(query_ids, results, scores, strict=True)
    }


def main(
    gin_files=(),
    bindings=(),
    eval_queries: int = EVAL_QUERIES,
    corpus_limit: int | None = None,
    vocab_size: int = VOCAB_SIZE,
    vocab_texts: int | None = None,
) -> int:
    """The demo; `eval_queries` / `corpus_limit` shrink the evaluation (the gold definitions of the
    evaluated queries always stay in the corpus), `vocab_size` the vocabulary it builds (VOCAB_SIZE
    is bound to match) and `vocab_texts` the texts it is built from (an even sample; tests)."""
    from samtone_jax import configurables, gin_utils, paths, run_folders
    from samtone_jax.atomic_file import write_atomic
    from samtone_jax.checkpoints.train_checkpoints import restore_on_one_device
    from samtone_jax.data import vocab as vocab_lib
    from samtone_jax.evaluation import metrics
    from samtone_jax.evaluation.run import dense_run
    from samtone_jax.inference import Encoder
    from samtone_jax.models import init_params
    from samtone_jax.tasks import catalogue

    start = time.time()
    model_dir = paths.as_str(MODEL_DIR)
    vocab_path = paths.join(model_dir, run_folders.VOCABULARY)
    run_bindings = [
        f"MODEL_DIR = '{model_dir}'",
        f"VOCABULARY = '{vocab_path}'",
        f"VOCAB_SIZE = {vocab_size}",
        *bindings,
    ]
    configurables.parse([DEMO_GIN, *gin_files], run_bindings)  # fail on a bad binding before any work
    if not paths.as_path(vocab_path).exists():
        texts = catalogue.collection("wordnet_definitions", "train").texts()
        if vocab_texts is not None:
            texts = texts[:: max(1, len(texts) // vocab_texts)]
        vocab_lib.train_sentencepiece(texts, vocab_size, vocab_path)
        print(f"[{time.time() - start:5.0f}s] built {vocab_path} from {len(texts):,} WordNet texts")
    print(f"[{time.time() - start:5.0f}s] training (TensorBoard: {model_dir}/train)")
    configurables.train_program()

    # Evaluation: held-out example sentences against every definition.
    model = gin_utils.model()
    last = max(run_folders.complete_steps(model_dir))
    trained = restore_on_one_device(run_folders.state(model_dir, last))["params"]
    untrained = nn.unbox(init_params(model, jax.random.PRNGKey(0)))
    test = catalogue.collection("wordnet_definitions", "test")
    query_ids = _held_out_queries(test, eval_queries)
    doc_ids = sorted(test.corpus)
    if corpus_limit is not None:
        gold = {d for q in query_ids for d in test.qrels[q]}
        doc_ids = sorted(gold | set(doc_ids[:corpus_limit]))
    queries = {q: test.queries[q] for q in query_ids}
    corpus = {d: test.corpus[d] for d in doc_ids}
    vocabulary = vocab_lib.vocabulary(vocab_path)
    results = {}
    for name, params in (("trained", trained), ("untrained", untrained)):
        run = dense_run(Encoder(model, params, vocabulary, query_length=32, doc_length=48), queries, corpus, k=100)
        results[f"T5.1.1 mini SDE, {name}"] = metrics.evaluate(test.qrels, run)
        print(f"[{time.time() - start:5.0f}s] evaluated the {name} model")
    bm25 = _bm25_run(query_ids, [queries[q] for q in query_ids], doc_ids, [corpus[d] for d in doc_ids], 100)
    results["BM25 (bm25s)"] = metrics.evaluate(test.qrels, bm25)

    print(f"\nheld-out WordNet examples -> definition among {len(corpus):,} definitions ({len(queries):,} queries)")
    print(f"{'system':34s} {'P@1':>7s} {'MRR':>7s} {'R@10':>7s}")
    for name, m in results.items():
        print(f"{name:34s} {m['P@1']:7.3f} {m['RR']:7.3f} {m['R@10']:7.3f}")
    record = {"queries": len(queries), "corpus": len(corpus), "step": last, "results": results}
    write_atomic(paths.join(model_dir, run_folders.DEMO_RESULTS), json.dumps(record, indent=2))
    print(f"\ndone in {time.time() - start:.0f}s; results in {model_dir}/eval.json")
    return 0
