"""Issue 7's experiment: does ADORE (and STAR) improve a model trained with the in-batch loss?

On multireqa_squad_dev's article split (../shared/data or $SAMTONE_DATA_DIR): a T5.1.1-shaped mini
SDE (d_model 64, 3 layers) trained from scratch with the bidirectional in-batch softmax (base),
then, for the same further budget (steps × batch) from the base checkpoint:
  continue   the in-batch loss;
  adore      ADORE: query tower only, top-200 retrieved on device every step, ΔMRR@10 RankNet;
  star       STAR: static dense-mined hard negatives (ranks 0–100, positives and near-positives
             dropped) as extra softmax columns next to the in-batch negatives;
  star_adore ADORE from the STAR model (twice the further budget: say so when comparing).
Every arm is evaluated on the 2,000 test questions against all 10,642 sentences; `samtone
compare` gives paired randomisation p-values against `continue`. One command, ~15 min on 2 cores:

  .venv/bin/python experiments/hard_negatives_squad.py --out runs/hard_negatives_squad
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from common import build_vocab, experiment_parser, parse_into_folder, run_arm, samtone, train_args

TASK = "multireqa_squad_dev"


def main():
    parser = experiment_parser(__doc__, "runs/hard_negatives_squad", budget=False)
    parser.add_argument("--base_steps", type=int, default=800)
    parser.add_argument("--steps", type=int, default=300, help="the further budget of every arm")
    parser.add_argument("--batch", type=int, default=64)
    args, out = parse_into_folder(parser)
    timings = {}
    start = time.time()
    vocab = build_vocab(out, TASK)
    runs = {}

    def arm(name, argv):
        t = time.time()
        runs[name] = run_arm(out, name, argv, TASK)
        timings[name] = time.time() - t

    base = f"{out}/base"
    arm(
        "base",
        train_args(
            base,
            vocab,
            TASK,
            args.base_steps,
            args.batch,
            1e-2,
            "losses/bidirectional.gin",
            ["--gin.adafactor.warmup_steps=50"],
        ),
    )
    arm(
        "continue",
        train_args(
            f"{out}/continue",
            vocab,
            TASK,
            args.steps,
            args.batch,
            1e-3,
            "losses/bidirectional.gin",
            [f"--gin.train.init_checkpoint='{base}'"],
        ),
    )

    def adore(init, name):
        arm(
            name,
            [
                "train-adore",
                "--gin_file=runs/adore.gin",
                f"--gin.INIT='{init}'",
                f"--gin.TASK='{TASK}'",
                f"--gin.MODEL_DIR='{out}/{name}'",
                f"--gin.TRAIN_STEPS={args.steps}",
                f"--gin.BATCH_SIZE={args.batch}",
                "--gin.LEARNING_RATE=1e-3",
            ],
        )

    adore(base, "adore")

    negatives = f"{out}/negatives.tsv"
    if not os.path.exists(negatives):
        samtone(
            "mine",
            f"--checkpoint={base}",
            f"--task={TASK}",
            "--split=train",
            f"--out={negatives}",
            "--num_negatives=4",
            "--range_min=0",
            "--range_max=100",
            "--relative_margin=0.05",
            log=f"{out}/mine.log",
        )
    star = f"{out}/star"
    arm(
        "star",
        train_args(
            star,
            vocab,
            TASK,
            args.steps,
            args.batch,
            1e-3,
            "losses/star_listwise.gin",
            [
                f"--gin.train.init_checkpoint='{base}'",
                "--gin.inputs.num_negatives=2",
                f"--gin.hard_negatives_file.path='{negatives}'",
            ],
        ),
    )
    adore(star, "star_adore")

    names = ["continue", "base", "adore", "star", "star_adore"]
    with open(f"{out}/compare.txt", "w") as f:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "samtone_jax.cli.main",
                "compare",
                *[runs[n] for n in names],
                "--measures",
                "P@1",
                "RR",
                "RR@10",
                "R@10",
                "R@100",
            ],
            stdout=f,
            check=True,
        )
    results = {n: json.load(open(runs[n]))["metrics"] for n in names}
    summary = {
        "runs": runs,
        "metrics": results,
        "seconds": timings,
        "total_seconds": time.time() - start,
        "config": vars(args),
    }
    json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
    print(open(f"{out}/compare.txt").read())
    print(f"{'arm':12s} {'P@1':>7s} {'MRR':>7s} {'R@10':>7s}")
    for n in names:
        m = results[n]
        print(f"{n:12s} {m['P@1']:7.4f} {m['RR']:7.4f} {m['R@10']:7.4f}")
    print(f"total {time.time() - start:.0f}s; {out}/summary.json")


if __name__ == "__main__":
    main()
