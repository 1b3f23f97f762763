"""Issue 33's experiment: all-MiniLM-L6-v2 fine-tuned on WordNet with SamToNe (query side), served
compressed: post-hoc quantization of the plain fine-tune vs quantization-aware training, at each
(dimension, precision), with and without rescoring; 3 seeds, paired tests on seed-averaged
per-query scores.

  posthoc     the plain fine-tune (pretrained_peer.py's samtone_query arm, the same budget)
  qat_binary  + train.quantized_precisions = ('float32', 'binary')
  qat_all     + train.quantized_precisions = ('float32', 'int8', 'binary')

Every arm is then calibrated (`samtone calibrate`: int8 ranges from 10,000 training documents, for
128 and 384 dimensions) and evaluated with `samtone eval --precisions float32,int8,binary --rescore 4
--dims 128` on the pretrained experiment's protocol (2,000 held-out queries among 20,000
definitions). Goals (issue 33): binary rescored ≥ 97 % of float32 MRR after QAT and significantly
above post-hoc binary; int8 ≥ 99.5 %. Resumable; `--posthoc_from runs/peer_wordnet` reuses
pretrained_peer.py's samtone_query runs (copied) instead of training them again.

  SAMTONE_DATA_DIR=../shared/data .venv/bin/python experiments/compressed_serving.py --out runs/compressed_serving
"""

from __future__ import annotations

import json
import os
import shutil
import sys

from common import experiment_parser, parse_into_folder, samtone, summarize
from pretrained_peer import TASKS, import_minilm, train_ours

ARMS = {
    "posthoc": [],
    "qat_binary": ["--gin.train.quantized_precisions=('float32', 'binary')"],
    "qat_all": ["--gin.train.quantized_precisions=('float32', 'int8', 'binary')"],
}
VARIANTS = [  # record suffixes of `samtone eval --precisions float32,int8,binary --rescore 4 --dims 128`
    f"{dim}{precision}"
    for dim in ("", "_dim128")
    for precision in ("", "_int8", "_int8_rescore4", "_binary", "_binary_rescore4")
]
MEASURES = ("RR", "P@1", "nDCG@10")


def main():
    parser = experiment_parser(__doc__, "runs/compressed_serving")
    parser.set_defaults(steps=200, learning_rate=5e-5)
    parser.add_argument("--posthoc_from", default=None, help="a pretrained_peer.py folder with samtone_query runs")
    args, out = parse_into_folder(parser)
    args.task = "wordnet_definitions"
    init = import_minilm(out)
    _, _, split, sample = TASKS[args.task]
    evals = {}
    for seed in args.seeds:
        for arm, extra in ARMS.items():
            name = f"{arm}_seed{seed}"
            model_dir = f"{out}/{name}"
            if not os.path.isdir(f"{model_dir}/checkpoints/{args.steps}"):
                earlier = f"{args.posthoc_from}/samtone_query_seed{seed}" if args.posthoc_from else None
                if arm == "posthoc" and earlier and os.path.isdir(f"{earlier}/checkpoints/{args.steps}"):
                    shutil.copytree(earlier, model_dir, ignore=shutil.ignore_patterns("eval"), dirs_exist_ok=True)
                else:
                    train_ours(out, name, init, args, seed, "losses/samtone_query.gin", extra)
            records = f"{model_dir}/eval"
            base = f"{records}/{args.task}_{split}_step{args.steps}_q2000_c20000"
            if not os.path.exists(f"{base}_dim128_binary_rescore4.json"):
                samtone(
                    "calibrate",
                    f"--checkpoint={model_dir}",
                    f"--task={args.task}",
                    "--split=train",
                    "--documents=10000",
                    "--dims",
                    "128,384",
                    log=f"{out}/{name}_calibrate.log",
                )
                samtone(
                    "eval",
                    f"--checkpoint={model_dir}",
                    f"--task={args.task}",
                    f"--split={split}",
                    "--precisions",
                    "float32,int8,binary",
                    "--rescore",
                    "4",
                    "--dims",
                    "128",
                    "--gin.evaluate.keep_embeddings=False",
                    *sample,
                    log=f"{out}/{name}_eval.log",
                )
            for variant in VARIANTS:
                evals[variant or "full", arm, seed] = f"{base}{variant}.json"
    summary = summarize(out, evals, [v or "full" for v in VARIANTS], list(ARMS), args.seeds, MEASURES)
    summary["budget"] = {k: getattr(args, k) for k in ("steps", "batch", "learning_rate", "temperature", "seeds")}
    with open(f"{out}/summary.json", "w") as f:
        json.dump(summary, f, indent=2)
    print(summary["table"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
