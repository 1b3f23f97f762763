"""Why a teacher that learnt the pairs teaches little: how much of each query's in-batch softmax the
fine-tuned all-mpnet-base-v2 teacher (finetune_recipe.py's `mpnet` arm, seed 0) puts on the query's own
document, on the stand-in's training pairs (which it was fine-tuned on) and on its held-out test pairs.

Batches of 64 pairs drawn at random (200 a split, seed 0), each query's softmax over its batch's documents
(its own document's other copies left out, as id masking does) at τ 0.05 (the recipe's contrastive τ and
the 'softmax' distillation's), 0.1 and 0.2; also the teacher's in-batch top-1 (the same batches, the
same documents left out). The teacher's embeddings are `samtone encode --side=both` folders: the
training split's is the one `teacher_kl` distilled (read from finetune_recipe's --out), the test split's
is made here.

  SAMTONE_DATA_DIR=../shared/data .venv/bin/python experiments/teacher_soft_labels.py \
      --recipe runs/finetune_recipe --out runs/teacher_soft_labels
"""

from __future__ import annotations

import os

import numpy as np
from common import experiment_parser, parse_into_folder, samtone

TASK = "finetune_data"
TEMPERATURES = (0.05, 0.1, 0.2)
BATCH = 64


def main():
    parser = experiment_parser(__doc__, "runs/teacher_soft_labels", budget=False)
    parser.add_argument("--recipe", default="runs/finetune_recipe", help="finetune_recipe.py's --out")
    args, out = parse_into_folder(parser)
    recipe = os.path.abspath(args.recipe)
    declared = (
        f"local_tasks.tasks = {{'{TASK}': {{'format': 'jsonl', 'path': '{recipe}/pairs.jsonl', 'test_fraction': 0.1}}}}"
    )
    teacher = f"{recipe}/mpnet_s0/run"
    folders = {"train": f"{recipe}/teacher_kl_s0/teacher_embeddings", "test": f"{out}/teacher_test"}
    for split, folder in folders.items():
        if not os.path.exists(f"{folder}/documents/manifest.json"):
            encode = ["encode", f"--gin_bindings={declared}", f"--checkpoint={teacher}", f"--task={TASK}"]
            samtone(*encode, f"--split={split}", "--side=both", f"--out={folder}", log=f"{out}/encode_{split}.log")
    from samtone_jax.cli import gin_registry
    from samtone_jax.data.collection import text_id
    from samtone_jax.tasks import catalogue
    from samtone_jax.training import teacher_embeddings

    gin_registry.parse([], [declared])
    lines = [f"{'split':6s} {'pairs':>6s} {'τ':>5s} {'p(own document)':>16s} {'in-batch top-1':>15s}"]
    for split, folder in folders.items():
        collection = catalogue.collection(TASK, split)
        pairs = [(text_id(collection.queries[q]), text_id(collection.corpus[d])) for q, d in collection.pairs()]
        embeddings = teacher_embeddings.load(folder, (TASK,), split)
        top1 = np.mean(
            [np.mean(np.argmax(c, axis=1) == np.arange(len(c))) for c in embeddings.in_batch_cosines(pairs, BATCH)]
        )
        for tau in TEMPERATURES:
            peak = embeddings.positive_probability(pairs, BATCH, tau)
            lines.append(f"{split:6s} {len(pairs):6d} {tau:5g} {peak:16.3f} {top1:15.3f}")
    text = "\n".join(lines)
    print(text)
    with open(f"{out}/summary.txt", "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
