"""Issue 21's mixture experiment: batches mixed across tasks vs one task per batch vs one task per batch
with per-task prompts.

The mixture `offline_mixture` (wordnet_definitions + multireqa_squad_dev's article split, rates 1 : 1),
the loss comparison's mini SDE trained from scratch on a vocabulary built over both tasks (300 steps ×
batch 64, τ 0.05, query-side SamToNe, seeds 0-2), three arms with the same budget:
  mixed        seqio's mixture: every batch mixes examples of both tasks (today's default)
  homogeneous  inputs.task_batches = @TaskBatches(): every batch from one task, drawn 1 : 1
  prompted     homogeneous, and each task's texts carry its own prompts (prompts.per_task), which
               `samtone eval` applies to the task it evaluates
Every run is evaluated on both test sets (WordNet: its test senses' examples against every
definition; SQuAD: 2,000 test questions against 10,642 sentences). Reported: P@1 and MRR per test
set (mean ± std over seeds) and paired randomisation tests on seed-averaged per-query scores of
homogeneous and prompted against mixed, and of prompted against homogeneous. Resumable.

  SAMTONE_DATA_DIR=../shared/data .venv/bin/python experiments/mixture_batches.py --out runs/mixture_batches
"""

from __future__ import annotations

import json
import os
import sys
import time

from common import build_vocab, experiment_parser, parse_into_folder, samtone, summarize, train_args

MIXTURE = "offline_mixture"
TEST_SETS = ("wordnet_definitions", "multireqa_squad_dev")
PROMPTS = "{'wordnet_definitions': ('example: ', 'definition: '), 'multireqa_squad_dev': ('question: ', 'sentence: ')}"
ARMS = {
    "mixed": [],
    "homogeneous": ["--gin.inputs.task_batches=@TaskBatches()"],
    "prompted": ["--gin.inputs.task_batches=@TaskBatches()", f"--gin.prompts.per_task={PROMPTS}"],
}
MEASURES = ("P@1", "RR")


def eval_file(model_dir: str, task: str, steps: int) -> str:
    return f"{model_dir}/eval/{task}_test_step{steps}.json"


def main():
    from samtone_jax.evaluation.significance import compare, format_table

    parser = experiment_parser(__doc__, "runs/mixture_batches")
    args, out = parse_into_folder(parser)
    start = time.time()
    vocab = build_vocab(out, MIXTURE)  # over both member tasks' texts
    files = {}
    for seed in args.seeds:
        for arm, extra in ARMS.items():
            name, model_dir = f"sde_{arm}_seed{seed}", f"{out}/sde_{arm}_seed{seed}"
            if not os.path.exists(f"{model_dir}/checkpoints/{args.steps}"):
                argv = train_args(
                    model_dir,
                    vocab,
                    MIXTURE,
                    args.steps,
                    args.batch,
                    args.learning_rate,
                    "losses/samtone_query.gin",
                    [*extra, "--gin.adafactor.warmup_steps=50", f"--gin.train.seed={seed}"],
                    temperature=args.temperature,
                )
                samtone(*argv, log=f"{out}/{name}_train.log")
            for task in TEST_SETS:
                if not os.path.exists(eval_file(model_dir, task, args.steps)):
                    flags = [f"--gin.evaluate.model_dir='{model_dir}'", f"--gin.evaluate.task='{task}'"]
                    samtone("eval", *flags, "--gin.evaluate.keep_embeddings=False", log=f"{out}/{name}_{task}.log")
                files[task, arm, seed] = eval_file(model_dir, task, args.steps)
    # Per test set: mean ± std over seeds, and homogeneous / prompted against mixed (common.summarize);
    # then prompted against homogeneous on the same seed-averaged files.
    summary = summarize(out, files, TEST_SETS, list(ARMS), args.seeds, MEASURES)
    lines = [summary["table"].replace("architecture", "test set    ")]
    for task in TEST_SETS:
        result = compare([f"{out}/averaged/{task}_{a}.json" for a in ("homogeneous", "prompted")], list(MEASURES))
        summary["compare"][f"{task}/prompted-homogeneous"] = result
        with open(f"{out}/compare_{task}.txt", "a") as f:
            f.write(f"\nprompted against homogeneous\n{format_table(result)}\n")
        pairs = [(arm, "mixed", summary["compare"][task], i) for i, arm in enumerate(ARMS) if i] + [
            ("prompted", "homogeneous", result, 1)
        ]
        for arm, base, found, i in pairs:
            cells = "  ".join(
                f"{m} {found['measures'][m][i]['diff']:+.4f} (p {found['measures'][m][i]['p']:.4f})" for m in MEASURES
            )
            lines.append(f"{task:22s} {arm} - {base}: {cells}")
    summary.update(config=vars(args), prompts=PROMPTS, table="\n".join(lines), minutes=(time.time() - start) / 60)
    with open(f"{out}/summary.json", "w") as f:
        json.dump(summary, f, indent=2, default=str)
    print(summary["table"])
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    sys.exit(main())
