"""Issue 34's experiment: cheaper and better weights on the pretrained all-MiniLM-L6-v2, fine-tuned on
WordNet with SamToNe (query side), the budget of pretrained_peer.py (batch 64, 200 steps, AdamW with
transformers' settings, τ 0.05, 3 seeds, the same batches per seed).

  full        every parameter trained, lr 5e-5 (pretrained_peer.py's samtone_query arm), with
              step.ema_decay 0.99 tracked beside it
  lora8       LoRA rank 8 on every attention and MLP projection (sde: one adapter), the projection
              trained too, the tower frozen; lr --lora_learning_rate (LoRA's usual 10x)
  lora32      the same at rank 32
  ade_lora8   one frozen tower, a rank-8 adapter per side, one shared projection
  ema         full's moving average, evaluated from the same run (--weights=ema): the average does not
              train, so one run gives both rows (the raw weights equal an untracked run's: measured)
  soup        the uniform soup of full's 3 seeds (`samtone average`), one model

Reported: per arm mean ± std of P@1 and MRR over seeds, a paired randomisation test of every arm
against full on the seed-averaged per-query scores, the soup against the seed average and each seed,
and per arm its trained parameters and AdamW state (two float32 moments a trained parameter).
Resumable (a finished arm's eval JSON is reused).

  .venv/bin/python experiments/cheaper_weights.py --out runs/cheaper_weights
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

from common import existing_eval, experiment_parser, parse_into_folder, samtone, summarize
from pretrained_peer import TASKS, import_base, train_ours

LOSS = "losses/samtone_query.gin"
ARMS = {  # arm -> (extra train flags, uses the LoRA learning rate)
    "full": (["--gin.step.ema_decay=0.99"], False),
    "lora8": (["--gin.DualEncoder.lora_rank=8"], True),
    "lora32": (["--gin.DualEncoder.lora_rank=32"], True),
    "ade_lora8": (["--gin.DualEncoder.architecture='ade_lora'", "--gin.DualEncoder.lora_rank=8"], True),
}
MEASURES = ("P@1", "RR")


def ema_record(model_dir: str) -> str | None:
    folder = f"{model_dir}/eval"
    found = sorted(f for f in os.listdir(folder) if re.search(r"_ema(_q\d+)?(_c\d+)?\.json$", f))
    return f"{folder}/{found[-1]}" if found else None


def trained_parameters(model_dir: str, steps: int) -> int:
    """The parameters a run trains: what its checkpoint's params hold (LoRA: no frozen tower)."""
    import jax
    import numpy as np

    from samtone_jax.checkpoints.train_checkpoints import saved_tree

    tree = saved_tree(f"{model_dir}/checkpoints/{steps}/state")["params"]
    return int(sum(np.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(tree)))


def main():
    parser = experiment_parser(__doc__, "runs/cheaper_weights")
    parser.set_defaults(steps=200, learning_rate=5e-5)
    parser.add_argument("--lora_learning_rate", type=float, default=5e-4)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    args, out = parse_into_folder(parser)
    args.task = "wordnet_definitions"
    _, _, split, sample = TASKS[args.task]
    init = import_base(out, "all-MiniLM-L6-v2")

    def evaluate(model_dir, name, weights="params"):
        flags = [f"--gin.evaluate.model_dir='{model_dir}'", f"--gin.evaluate.task='{args.task}'"]
        flags += [f"--gin.evaluate.split='{split}'", "--gin.evaluate.keep_embeddings=False", *sample]
        samtone("eval", *flags, f"--weights={weights}", log=f"{out}/{name}_{weights}_eval.log")

    evals, sizes = {}, {}
    for seed in args.seeds:
        for arm in args.arms:
            name = f"{arm}_seed{seed}"
            model_dir = f"{out}/{name}"
            if existing_eval(model_dir) is None:
                print(f"{name}:", flush=True)
                extra, lora = ARMS[arm]
                budget = (
                    argparse.Namespace(**{**vars(args), "learning_rate": args.lora_learning_rate}) if lora else args
                )
                train_ours(out, name, init, budget, seed, LOSS, extra)
                evaluate(model_dir, name)
            evals["minilm", arm, seed] = existing_eval(model_dir)
            if arm == "full":  # the moving average's record beside the raw weights' (..._ema[_q<N>_c<M>].json)
                if ema_record(model_dir) is None:
                    evaluate(model_dir, name, "ema")
                evals["minilm", "ema", seed] = ema_record(model_dir)
            sizes[arm] = trained_parameters(model_dir, args.steps)
    arms = [*args.arms, *(["ema"] if "full" in args.arms else [])]
    summary = summarize(out, evals, ["minilm"], arms, args.seeds, MEASURES)
    summary["trained_parameters"] = sizes
    summary["adamw_state_mib"] = {arm: 2 * 4 * n / 2**20 for arm, n in sizes.items()}
    summary["budget"] = {
        k: getattr(args, k) for k in ("steps", "batch", "learning_rate", "lora_learning_rate", "temperature", "seeds")
    }
    if "full" in args.arms:
        summary["soup"] = soup(out, args, evaluate, evals)
    with open(f"{out}/summary.json", "w") as f:
        json.dump(summary, f, indent=2)
    print(summary["table"])
    print(open(f"{out}/compare_minilm.txt").read())
    print({arm: f"{n:,} trained ({n / sizes.get('full', n):.1%})" for arm, n in sizes.items()})
    if "soup" in summary:
        print(open(f"{out}/compare_soup.txt").read())
    return 0


def soup(out, args, evaluate, evals) -> dict:
    """The uniform soup of full's seeds, evaluated, and tested against the seeds' mean and each seed."""
    from samtone_jax.evaluation.significance import compare, format_table

    folder = f"{out}/soup"
    if existing_eval(folder) is None:
        runs = [f"{out}/full_seed{s}" for s in args.seeds]
        samtone("average", "--checkpoint", *runs, f"--out={folder}", "--overwrite", log=f"{out}/soup.log")
        evaluate(folder, "soup")
    found = existing_eval(folder)
    averaged = f"{out}/averaged/minilm_full.json"  # summarize's seed average of full
    seeds = [evals["minilm", "full", s] for s in args.seeds]
    result = compare([averaged, found], measures=list(MEASURES))
    each = [compare([seed, found], measures=list(MEASURES)) for seed in seeds]
    with open(f"{out}/compare_soup.txt", "w") as f:
        f.write(f"soup of {len(seeds)} seeds against their seed-averaged per-query scores\n{format_table(result)}\n")
        for seed, r in zip(args.seeds, each, strict=True):
            f.write(f"\nsoup against seed {seed}\n{format_table(r)}\n")
    return {"eval": found, "against_mean": result, "against_each": each}


if __name__ == "__main__":
    sys.exit(main())
