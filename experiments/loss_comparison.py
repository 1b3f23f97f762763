"""The SamToNe paper's main comparison at CPU scale: which contrastive loss trains the better retriever?

On multireqa_squad_dev's article split (or wordnet_definitions), a T5.1.1-shaped mini SDE and
ADE-SPL (d_model 64, 3 layers) trained from scratch, the same budget and seeds for every arm:
  baseline       bidirectional in-batch softmax (losses/bidirectional.gin)
  samtone_query  SamToNe, query-query negatives (losses/samtone_query.gin; the paper's default)
  samtone_both   SamToNe on both towers (losses/samtone_both.gin; ids mask duplicates)
  pair           PAIR, α 0.1 (losses/pair.gin)
  gte            GTE's improved contrastive loss (losses/gte_icl.gin)
Every run is evaluated on the test questions against the whole corpus. Per architecture and arm:
mean ± std over seeds of P@1 and MRR, and a paired randomisation test against the baseline over
queries of the seed-averaged per-query scores (so a p-value says: across these test questions, is
the arm's average over seeds better than the baseline's). Then the paper's embedding-space figures
(`samtone analyze`) for baseline vs SamToNe (SDE, seed 0). Resumable: rerunning skips finished runs.

  .venv/bin/python experiments/loss_comparison.py --out runs/loss_comparison   # ~50 min on 2 cores
  .venv/bin/python experiments/loss_comparison.py --task wordnet_definitions --out runs/loss_comparison_wordnet # 46 min
"""

from __future__ import annotations

import json
import os
import sys
import time

from common import build_vocab, experiment_parser, parse_into_folder, run_arm, samtone, summarize, train_args

ARMS = {
    "baseline": "losses/bidirectional.gin",
    "samtone_query": "losses/samtone_query.gin",
    "samtone_both": "losses/samtone_both.gin",
    "pair": "losses/pair.gin",
    "gte": "losses/gte_icl.gin",
}
MEASURES = ("P@1", "RR")


def main():
    parser = experiment_parser(__doc__, "runs/loss_comparison")
    parser.add_argument("--task", default="multireqa_squad_dev")
    parser.add_argument("--architectures", nargs="+", default=["sde", "ade_spl"])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    args, out = parse_into_folder(parser)
    start = time.time()
    vocab = build_vocab(out, args.task)
    evals = {}
    for seed in args.seeds:  # seed-major: after one seed every arm has a result to look at
        for arch in args.architectures:
            for arm in args.arms:
                name = f"{arch}_{arm}_seed{seed}"
                extra = ["--gin.adafactor.warmup_steps=50", f"--gin.train.seed={seed}"]
                argv = train_args(
                    f"{out}/{name}",
                    vocab,
                    args.task,
                    args.steps,
                    args.batch,
                    args.learning_rate,
                    ARMS[arm],
                    extra,
                    architecture=arch,
                    temperature=args.temperature,
                )
                evals[arch, arm, seed] = run_arm(out, name, argv, args.task)
    summary = {"config": vars(args), **summarize(out, evals, args.architectures, args.arms, args.seeds, MEASURES)}
    figures = f"{out}/figures"
    if not os.path.exists(f"{figures}/report.md") and "baseline" in args.arms and "samtone_query" in args.arms:
        arch, seed = args.architectures[0], args.seeds[0]
        samtone(
            "analyze",
            f"--checkpoint={out}/{arch}_baseline_seed{seed}",
            "--name=baseline",
            f"--checkpoint={out}/{arch}_samtone_query_seed{seed}",
            "--name=samtone_query",
            f"--task={args.task}",
            "--split=test",
            f"--out={figures}",
            log=f"{out}/analyze.log",
        )
    summary["total_seconds"] = time.time() - start
    with open(f"{out}/summary.json", "w") as f:
        json.dump(summary, f, indent=2)
    print(summary["table"])
    for arch in args.architectures:
        print(open(f"{out}/compare_{arch}.txt").read())
    print(f"total {time.time() - start:.0f}s; {out}/summary.json, {figures}/report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
