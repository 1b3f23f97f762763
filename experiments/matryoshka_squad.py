"""Issue 21's Matryoshka experiment: does training on nested dimensions keep small truncations good?

On multireqa_squad_dev's article split, the loss comparison's mini SDE and budget (d_model 64, no
projection: 64-dimensional embeddings; 300 steps × batch 64, τ 0.05, query-side SamToNe, seeds 0-2):
  plain       the loss on the full 64 dimensions
  matryoshka  the same loss summed over the first 8, 16, 32 and 64 dimensions (weights 1)
Every run is evaluated on the 2,000 test questions against all 10,642 sentences at the full
dimension and truncated to 32, 16 and 8 (first k coordinates, re-normalised: `samtone eval
--dims`), from one encoding. Reported: MRR per dimension (mean ± std over seeds), the fraction of
full-dimension MRR each truncation keeps, and paired randomisation p-values of matryoshka against
plain at each dimension (seed-averaged per-query scores). Resumable.

  SAMTONE_DATA_DIR=../shared/data .venv/bin/python experiments/matryoshka_squad.py --out runs/matryoshka_squad
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from common import build_vocab, experiment_parser, parse_into_folder, samtone, seed_average, train_args

TASK = "multireqa_squad_dev"
DIMS = (8, 16, 32)  # and the full 64
ARMS = {"plain": [], "matryoshka": ["--gin.objective.matryoshka_dims=(8, 16, 32, 64)"]}


def eval_files(model_dir: str, steps: int) -> dict:
    """{dimension: eval JSON} of a finished run (None: not evaluated yet)."""
    base = f"{model_dir}/eval/{TASK}_test_step{steps}"
    files = {64: f"{base}.json", **{k: f"{base}_dim{k}.json" for k in DIMS}}
    return files if all(os.path.exists(f) for f in files.values()) else None


def main():
    from samtone_jax.evaluation.significance import compare

    parser = experiment_parser(__doc__, "runs/matryoshka_squad")
    args, out = parse_into_folder(parser)
    start = time.time()
    vocab = build_vocab(out, TASK)
    files = {}
    for seed in args.seeds:
        for arm, extra in ARMS.items():
            name, model_dir = f"sde_{arm}_seed{seed}", f"{out}/sde_{arm}_seed{seed}"
            if eval_files(model_dir, args.steps) is None:
                argv = train_args(
                    model_dir,
                    vocab,
                    TASK,
                    args.steps,
                    args.batch,
                    args.learning_rate,
                    "losses/samtone_query.gin",
                    [*extra, "--gin.adafactor.warmup_steps=50", f"--gin.train.seed={seed}"],
                    temperature=args.temperature,
                )
                samtone(*argv, log=f"{out}/{name}_train.log")
                flags = [f"--gin.evaluate.model_dir='{model_dir}'", f"--gin.evaluate.task='{TASK}'"]
                eval_args = [*flags, "--gin.evaluate.keep_embeddings=False", "--dims", "8,16,32"]
                samtone("eval", *eval_args, log=f"{out}/{name}_eval.log")
            files[arm, seed] = eval_files(model_dir, args.steps)
    table, summary = [], {"config": vars(args), "mrr": {}, "compare": {}}
    os.makedirs(f"{out}/averaged", exist_ok=True)
    for dim in (64, *reversed(DIMS)):
        row = {}
        for arm in ARMS:
            values = [json.load(open(files[arm, s][dim]))["metrics"]["RR"] for s in args.seeds]
            full = [json.load(open(files[arm, s][64]))["metrics"]["RR"] for s in args.seeds]
            row[arm] = {
                "mean": statistics.fmean(values),
                "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                "kept_of_full": statistics.fmean(values) / statistics.fmean(full),
            }
        averaged = [
            seed_average([files[arm, s][dim] for s in args.seeds], f"{out}/averaged/{arm}_dim{dim}.json")
            for arm in ARMS
        ]
        result = compare(averaged, measures=["RR"])
        cell = result["measures"]["RR"][1]  # matryoshka against plain
        summary["mrr"][dim], summary["compare"][dim] = row, {"diff": cell["diff"], "p": cell["p"]}
        cells = "  ".join(
            f"{a} {c['mean']:.4f} ± {c['std']:.4f} ({100 * c['kept_of_full']:.1f} % of full)" for a, c in row.items()
        )
        table.append(f"dim {dim:3d}: {cells}  matryoshka - plain {cell['diff']:+.4f} (p {cell['p']:.4f})")
    summary["table"], summary["minutes"] = "\n".join(table), (time.time() - start) / 60
    with open(f"{out}/summary.json", "w") as f:
        json.dump(summary, f, indent=2, default=str)
    print(summary["table"])
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    sys.exit(main())
