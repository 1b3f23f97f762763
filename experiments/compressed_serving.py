"""Issue 33's experiment: all-MiniLM-L6-v2 fine-tuned on WordNet with SamToNe (query side), served
compressed: post-hoc quantization of the plain fine-tune vs quantization-aware training, at each
(dimension, precision), with and without rescoring; 3 seeds, paired tests on seed-averaged
per-query scores.

  posthoc     the plain fine-tune (pretrained_peer.py's samtone_query arm, the same budget)
  qat_binary  + objective.quantized_precisions = ('float32', 'binary')
  qat_all     + objective.quantized_precisions = ('float32', 'int8', 'binary')
  spread_out  + objective.spread_out_weight = 1 (objectives/spread_out.py: each tower's embeddings
              pushed apart on the sphere; sentence-transformers' GOR default weights)
  spread_qat_binary  qat_binary + the spread-out term
  spread_out_10  the spread-out term at weight 10 (at 1 it ended at 0.024 beside a contrastive loss of 1.4)

Every arm is then calibrated (`samtone calibrate`: int8 ranges from 10,000 training documents, for
the full and a truncated dimension) and evaluated with `samtone eval --precisions float32,int8,binary
--rescore 4 --dims <truncated>`. Goals (issue 33): binary rescored ≥ 97 % of float32 MRR after QAT
and significantly above post-hoc binary; int8 ≥ 99.5 %. Resumable.

--tower minilm (the default): the pretrained experiment's protocol (200 steps, AdamW 5e-5; 2,000
held-out queries among 20,000 definitions), 384 dimensions, truncated to 128; `--posthoc_from
runs/peer_wordnet` reuses pretrained_peer.py's samtone_query runs (copied) instead of training them.

--tower t5: the T5 mini SDE on MultiReQA-SQuAD dev (2,000 test questions against all 10,642
sentences), 64 dimensions, truncated to 32. As MiniLM's arms fine-tune a pretrained model, T5's
fine-tune a float32 run: per seed, `float_seed<S>` trains from scratch with the Matryoshka
experiment's budget (d_model 64, no projection, 300 steps × 64, Adafactor 1e-2, warm-up 50), and
every arm (posthoc included: the same steps, float32 only) continues from its last checkpoint for
--steps (default 150) more. int8-aware training from a random initialisation collapses the
embeddings (quantization_aware.py; refused by `samtone train`).

  export SAMTONE_DATA_DIR=../shared/data
  .venv/bin/python experiments/compressed_serving.py --out runs/compressed_serving --posthoc_from runs/peer_wordnet
  .venv/bin/python experiments/compressed_serving.py --tower t5 --out runs/compressed_serving_t5
  .venv/bin/python experiments/compressed_serving.py --out runs/spread_out \
      --arms posthoc spread_out spread_qat_binary spread_out_10
"""

from __future__ import annotations

import json
import os
import shutil
import sys

from common import build_vocab, experiment_parser, parse_into_folder, samtone, summarize, train_args
from pretrained_peer import TASKS, import_base, train_ours

ARMS = {
    "posthoc": [],
    "qat_binary": ["--gin.objective.quantized_precisions=('float32', 'binary')"],
    "qat_all": ["--gin.objective.quantized_precisions=('float32', 'int8', 'binary')"],
    "spread_out": ["--gin.objective.spread_out_weight=1.0"],
    "spread_out_10": ["--gin.objective.spread_out_weight=10.0"],
    "spread_qat_binary": [
        "--gin.objective.quantized_precisions=('float32', 'binary')",
        "--gin.objective.spread_out_weight=1.0",
    ],
}
TOWERS = {  # tower -> (task, eval split, full dimension, truncated dimension, budget: steps, learning rate)
    "minilm": ("wordnet_definitions", TASKS["wordnet_definitions"][2], 384, 128, 200, 5e-5),
    "t5": ("multireqa_squad_dev", "test", 64, 32, 150, 1e-2),
}
T5_BASE_STEPS = 300  # the float32 run each T5 arm fine-tunes
PRECISIONS = ("", "_int8", "_int8_rescore4", "_binary", "_binary_rescore4")  # eval record suffixes


def variants(truncated: int) -> list[str]:
    """Record suffixes of `samtone eval --precisions float32,int8,binary --rescore 4 --dims <truncated>`."""
    return [f"{dim}{precision}" for dim in ("", f"_dim{truncated}") for precision in PRECISIONS]


MEASURES = ("RR", "P@1", "nDCG@10")


def train_t5(out, name, vocab, task, steps, seed, args, extra=()) -> str:
    """`samtone train` of the T5 mini SDE `name` (skipped when its last checkpoint exists); its folder."""
    model_dir = f"{out}/{name}"
    if not os.path.isdir(f"{model_dir}/checkpoints/{steps}"):
        budget = [*extra, "--gin.adafactor.warmup_steps=50", f"--gin.train.seed={seed}"]
        loss = "losses/samtone_query.gin"
        argv = train_args(
            model_dir, vocab, task, steps, args.batch, args.learning_rate, loss, budget, temperature=args.temperature
        )
        samtone(*argv, log=f"{out}/{name}_train.log")
    return model_dir


def main():
    parser = experiment_parser(__doc__, "runs/compressed_serving")
    parser.set_defaults(steps=None, learning_rate=None)
    parser.add_argument("--tower", choices=list(TOWERS), default="minilm")
    parser.add_argument("--posthoc_from", default=None, help="a pretrained_peer.py folder with samtone_query runs")
    parser.add_argument(
        "--arms",
        nargs="+",
        choices=list(ARMS),
        default=list(ARMS),
        help="the first is the baseline every arm is tested against",
    )
    args, out = parse_into_folder(parser)
    arms = {arm: ARMS[arm] for arm in args.arms}
    task, split, full, truncated, steps, learning_rate = TOWERS[args.tower]
    args.task, args.steps, args.learning_rate = task, args.steps or steps, args.learning_rate or learning_rate
    if args.tower == "minilm":
        init, sample, suffix = import_base(out, "all-MiniLM-L6-v2"), TASKS[task][3], "_q2000_c20000"
    else:
        vocab, sample, suffix = build_vocab(out, task), [], ""
    evals = {}
    for seed in args.seeds:
        for arm, extra in arms.items():
            name = f"{arm}_seed{seed}"
            model_dir = f"{out}/{name}"
            if not os.path.isdir(f"{model_dir}/checkpoints/{args.steps}"):
                earlier = f"{args.posthoc_from}/samtone_query_seed{seed}" if args.posthoc_from else None
                if arm == "posthoc" and earlier and os.path.isdir(f"{earlier}/checkpoints/{args.steps}"):
                    shutil.copytree(earlier, model_dir, ignore=shutil.ignore_patterns("eval"), dirs_exist_ok=True)
                elif args.tower == "minilm":
                    train_ours(out, name, init, args, seed, "losses/samtone_query.gin", extra)
                else:
                    float_run = train_t5(out, f"float_seed{seed}", vocab, task, T5_BASE_STEPS, seed, args)
                    train_t5(
                        out,
                        name,
                        vocab,
                        task,
                        args.steps,
                        seed,
                        args,
                        [*extra, f"--gin.train.init_checkpoint='{float_run}'"],
                    )
            base = f"{model_dir}/eval/{task}_{split}_step{args.steps}{suffix}"
            if not os.path.exists(f"{base}_dim{truncated}_binary_rescore4.json"):
                calibration = [f"--task={task}", "--split=train", "--documents=10000", "--dims", f"{truncated},{full}"]
                samtone("calibrate", f"--checkpoint={model_dir}", *calibration, log=f"{out}/{name}_calibrate.log")
                samtone(
                    "eval",
                    f"--checkpoint={model_dir}",
                    f"--task={task}",
                    f"--split={split}",
                    "--precisions",
                    "float32,int8,binary",
                    "--rescore",
                    "4",
                    "--dims",
                    str(truncated),
                    "--gin.evaluate.keep_embeddings=False",
                    *sample,
                    log=f"{out}/{name}_eval.log",
                )
            for variant in variants(truncated):
                evals[variant or "full", arm, seed] = f"{base}{variant}.json"
    names = [v or "full" for v in variants(truncated)]
    summary = summarize(out, evals, names, list(arms), args.seeds, MEASURES)
    summary["budget"] = {
        k: getattr(args, k) for k in ("tower", "steps", "batch", "learning_rate", "temperature", "seeds")
    } | ({"float32_steps_before": T5_BASE_STEPS} if args.tower == "t5" else {})
    with open(f"{out}/summary.json", "w") as f:
        json.dump(summary, f, indent=2)
    print(summary["table"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
