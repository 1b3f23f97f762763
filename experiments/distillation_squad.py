"""Issue 20's experiment: does a teacher's score (distillation) or its judgement (guided negatives) help?

On multireqa_squad_dev's article split, the loss comparison's mini SDE and budget (d_model 64, 3
layers, from scratch, 300 steps × batch 64, τ 0.05, seeds 0-2), every arm query-side SamToNe:
  baseline      in-batch negatives only (losses/samtone_query.gin)
  negatives     + the K = 2 best BM25 candidates of each query as hard negatives (STAR-style
                columns), no teacher score: what the next three add their teacher to
  margin_mse    + BM25-distilled MarginMSE (losses/distill_margin_mse.gin, weight 0.1)
  kl            + BM25-distilled listwise KL over the positive and the K candidates (distill_kl.gin)
  guided        + BM25-guided negatives: every in-batch and hard negative BM25 scores above the
                positive is removed from every term (FalseNegativeFilter margin 0)
  dense_kl      + KL from a bigger samtone teacher trained here (d_model 128, 3 layers, 600 steps),
                its own top-32 as the candidates
Every run is evaluated on the 2,000 test questions against all 10,642 sentences; BM25 and the
dense teacher are evaluated the same way (P@1, MRR). Paired randomisation p-values against the
baseline over seed-averaged per-query scores, as experiments/loss_comparison.py. Resumable.

  SAMTONE_DATA_DIR=../shared/data .venv/bin/python experiments/distillation_squad.py --out runs/distillation_squad
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
from common import build_vocab, experiment_parser, parse_into_folder, run_arm, samtone, summarize, train_args

TASK = "multireqa_squad_dev"
MEASURES = ("P@1", "RR")
K = 2
# A wider, longer-trained teacher than the mini student (same vocabulary and loss).
TEACHER_MODEL = ["--gin.T5Config.emb_dim=128", "--gin.T5Config.head_dim=32", "--gin.T5Config.mlp_dim=512"]


def _arm_args(name, bm25_scores, dense_scores):
    """(loss gin, extra gin bindings) of each arm."""
    negatives = [f"--gin.hard_negatives_file.path='{bm25_scores}'", f"--gin.inputs.num_negatives={K}"]
    return {
        "baseline": ("losses/samtone_query.gin", []),
        "negatives": ("losses/samtone_query.gin", negatives),
        "margin_mse": ("losses/samtone_query.gin", [*negatives, "--gin_file=losses/distill_margin_mse.gin"]),
        "kl": ("losses/samtone_query.gin", [*negatives, "--gin_file=losses/distill_kl.gin"]),
        "guided": (
            "losses/samtone_query.gin",
            [*negatives, "--gin.inputs.teacher_guide=@FalseNegativeFilter()", "--gin.FalseNegativeFilter.margin=0.0"],
        ),
        "dense_kl": (
            "losses/samtone_query.gin",
            [
                f"--gin.hard_negatives_file.path='{dense_scores}'",
                f"--gin.inputs.num_negatives={K}",
                "--gin_file=losses/distill_kl.gin",
                "--gin.distillation_loss.teacher_temperature=0.05",  # the teacher's cosines on its training scale
            ],
        ),
    }[name]


ARMS = ("baseline", "negatives", "margin_mse", "kl", "guided", "dense_kl")


def bm25_eval(out: str) -> dict:
    """BM25's P@1 and MRR on the test questions against the whole corpus (the teacher's level)."""
    path = f"{out}/bm25_test.json"
    if os.path.exists(path):
        return json.load(open(path))
    from samtone_jax.hard_negatives.teachers import BM25Teacher
    from samtone_jax.tasks import catalogue

    collection = catalogue.collection(TASK, "test")
    doc_ids = sorted(collection.corpus)
    teacher = BM25Teacher()
    teacher.index([collection.corpus[d] for d in doc_ids])
    queries = sorted(q for q in collection.queries if collection.qrels.get(q))
    p1, rr = [], []
    for start in range(0, len(queries), 256):
        batch = queries[start : start + 256]
        scores = teacher.full_scores([collection.queries[q] for q in batch])
        for q, row in zip(batch, scores, strict=True):
            relevant = [doc_ids.index(d) for d, r in collection.qrels[q].items() if r > 0 and d in collection.corpus]
            order = np.argsort(-row, kind="stable")
            ranks = np.flatnonzero(np.isin(order, relevant))
            p1.append(float(ranks[0] == 0))
            rr.append(1.0 / (ranks[0] + 1))
    result = {"P@1": float(np.mean(p1)), "RR": float(np.mean(rr)), "queries": len(queries)}
    json.dump(result, open(path, "w"), indent=2)
    return result


def removed_fraction(scores_file: str, k: int, margin: float = 0.0) -> dict:
    """Of the first k candidates of every query (the hard negatives trained on), the fraction the
    guide (score > positive − margin, against the pair's positive) removes."""
    flagged = total = 0
    for line in open(scores_file):
        row = json.loads(line)
        for positive in row["positives"].values():
            kept = row["scores"][:k]
            flagged += sum(s > positive - margin for s in kept)
            total += len(kept)
    return {"flagged": flagged, "candidates": total, "fraction": flagged / max(total, 1)}


def main():
    parser = experiment_parser(__doc__, "runs/distillation_squad")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--teacher_steps", type=int, default=600)
    args, out = parse_into_folder(parser)
    start = time.time()
    vocab = build_vocab(out, TASK)
    bm25_scores = f"{out}/bm25_scores.jsonl"
    if not os.path.exists(bm25_scores):
        samtone(
            "score",
            "--checkpoint=bm25",
            f"--task={TASK}",
            "--split=train",
            f"--out={bm25_scores}",
            "--depth=32",
            log=f"{out}/bm25_score.log",
        )
    teacher_dir = f"{out}/teacher"
    teacher_argv = train_args(
        teacher_dir,
        vocab,
        TASK,
        args.teacher_steps,
        args.batch,
        args.learning_rate,
        "losses/samtone_query.gin",
        [*TEACHER_MODEL, "--gin.adafactor.warmup_steps=50"],
        temperature=args.temperature,
    )
    teacher_eval = run_arm(out, "teacher", teacher_argv, TASK)
    dense_scores = f"{out}/dense_scores.jsonl"
    if not os.path.exists(dense_scores):
        samtone(
            "score",
            f"--checkpoint={teacher_dir}",
            f"--task={TASK}",
            "--split=train",
            f"--out={dense_scores}",
            "--depth=32",
            log=f"{out}/dense_score.log",
        )
    evals = {}
    for seed in args.seeds:
        for arm in args.arms:
            loss_gin, extra = _arm_args(arm, bm25_scores, dense_scores)
            name = f"sde_{arm}_seed{seed}"
            argv = train_args(
                f"{out}/{name}",
                vocab,
                TASK,
                args.steps,
                args.batch,
                args.learning_rate,
                loss_gin,
                [*extra, "--gin.adafactor.warmup_steps=50", f"--gin.train.seed={seed}"],
                temperature=args.temperature,
            )
            evals["sde", arm, seed] = run_arm(out, name, argv, TASK)
    summary = {"config": vars(args), **summarize(out, evals, ["sde"], args.arms, args.seeds, MEASURES)}
    summary["bm25_test"] = bm25_eval(out)
    summary["teacher_test"] = {m: json.load(open(teacher_eval))["metrics"][m] for m in MEASURES}
    summary["guide_removed_of_the_hard_negatives"] = removed_fraction(bm25_scores, K)
    summary["minutes"] = (time.time() - start) / 60
    with open(f"{out}/summary.json", "w") as f:
        json.dump(summary, f, indent=2)
    print(summary["table"])
    print(open(f"{out}/compare_sde.txt").read())
    print(json.dumps({k: summary[k] for k in ("bm25_test", "teacher_test", "guide_removed_of_the_hard_negatives")}))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    sys.exit(main())
