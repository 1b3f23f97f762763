"""SamToNe's stated limitation: same-tower negatives on the document side when documents repeat.

Task multireqa_squad_dev_paragraphs: SQuAD dev questions with their *paragraph* as the document
(2,067 paragraphs, ~5 questions each), the article split of multireqa_squad_dev. Batches are made
duplicate-heavy by shuffling runs of `--block` consecutive examples (questions of one paragraph
are consecutive), so most rows of a batch share their document with another row; the script
measures the fraction of unique documents per batch. A mini SDE from scratch, same budget and
seeds for every arm:
  baseline                bidirectional in-batch softmax, ids mask duplicates
  baseline_unmasked       the same without ids (a duplicate document is a negative of its twin's query)
  samtone_query           SamToNe on the query side, ids masked
  samtone_both            SamToNe on both towers, ids masked
  samtone_both_unmasked   SamToNe on both towers without ids: duplicate documents are pushed apart
                          from themselves (identical texts: s = 1, the largest possible negative)
Evaluated on the test questions against all 2,067 paragraphs; mean ± std over seeds and paired
randomisation tests on the seed-averaged per-query scores against the baseline. Resumable.

  .venv/bin/python experiments/duplicate_documents.py --out runs/duplicate_documents   # ~30 min
"""

from __future__ import annotations

import json
import sys
import time

from common import build_vocab, experiment_parser, parse_into_folder, run_arm, summarize, train_args

TASK = "multireqa_squad_dev_paragraphs"
ARMS = {
    "baseline": ("losses/bidirectional.gin", True),
    "baseline_unmasked": ("losses/bidirectional.gin", False),
    "samtone_query": ("losses/samtone_query.gin", True),
    "samtone_both": ("losses/samtone_both.gin", True),
    "samtone_both_unmasked": ("losses/samtone_both.gin", False),
}
MEASURES = ("P@1", "RR", "R@5")


def unique_document_fraction(vocab: str, batch: int, block: int, batches: int = 50) -> float:
    """Mean fraction of distinct documents in a training batch of the experiment's pipeline."""
    from samtone_jax.data import pipeline
    from samtone_jax.data.input_spec import InputSpec
    from samtone_jax.tasks import registration

    spec = InputSpec(vocab, query_length=8, doc_length=8)
    registration.register(spec)
    ds = pipeline.train_dataset(TASK, "train", spec, batch_size=batch, shuffle_block_size=block)
    fractions = [
        len(set(b["doc_id"].tolist())) / batch for _, b in zip(range(batches), ds.as_numpy_iterator(), strict=False)
    ]
    return sum(fractions) / len(fractions)


def main():
    parser = experiment_parser(__doc__, "runs/duplicate_documents")
    default_arms = [a for a in ARMS if a != "baseline_unmasked"]  # the ablation of interest; add it with --arms
    parser.add_argument("--arms", nargs="+", default=default_arms, choices=list(ARMS))
    parser.add_argument("--block", type=int, default=16, help="consecutive examples kept together by the shuffle")
    parser.add_argument("--doc_length", type=int, default=128)
    args, out = parse_into_folder(parser)
    start = time.time()
    vocab = build_vocab(out, TASK)
    unique = unique_document_fraction(vocab, args.batch, args.block)
    print(f"unique documents per training batch: {unique:.1%} (block {args.block}, batch {args.batch})", flush=True)
    evals = {}
    for seed in args.seeds:
        for arm in args.arms:
            loss_gin, masked = ARMS[arm]
            name = f"sde_{arm}_seed{seed}"
            extra = [
                "--gin.adafactor.warmup_steps=50",
                f"--gin.train.seed={seed}",
                f"--gin.inputs.shuffle_block_size={args.block}",
                f"--gin.inputs.id_masking={masked}",
            ]
            argv = train_args(
                f"{out}/{name}",
                vocab,
                TASK,
                args.steps,
                args.batch,
                args.learning_rate,
                loss_gin,
                extra,
                doc_length=args.doc_length,
                temperature=args.temperature,
            )
            evals["sde", arm, seed] = run_arm(out, name, argv, TASK)
    summary = {
        "config": vars(args),
        "unique_document_fraction": unique,
        **summarize(out, evals, ["sde"], args.arms, args.seeds, MEASURES),
    }
    summary["total_seconds"] = time.time() - start
    with open(f"{out}/summary.json", "w") as f:
        json.dump(summary, f, indent=2)
    print(summary["table"])
    print(open(f"{out}/compare_sde.txt").read())
    print(f"total {time.time() - start:.0f}s; {out}/summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
