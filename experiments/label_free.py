"""Label-free adaptation by embedding-level distillation: all-MiniLM-L6-v2 taught the geometry of
all-mpnet-base-v2 on MultiReQA-SQuAD's own sentences, with no question seen; does it retrieve better?

  1. OUT/sentences.jsonl: every sentence of the corpus the test questions are ranked against (all
     10,642), one {"text": ...} line each: a text paired with itself (data/jsonl_pairs.py).
  2. The teacher, all-mpnet-base-v2 (make mpnet), imported and run once:
     samtone encode --side=both of those texts at 128 tokens -> OUT/teacher.
  3. Each arm fine-tunes the student from the pretrained MiniLM on those texts (batch 64, --steps
     steps, AdamW as experiments/pretrained_peer.py, 128 tokens, packed), seeds 0, 1, 2:
       similarity   the in-batch similarity matrices matched to the teacher's (no other term)
       simcse       the contrastive loss alone on (text, text) pairs, dropout the only difference
                    (unsupervised SimCSE: what the texts give without a teacher)
       simcse_similarity   both terms
  4. `samtone eval` on SQuAD's 2,000 test questions against all 10,642 sentences (64 / 128 tokens,
     as the side by side); p: paired randomisation test of each arm (seed-averaged per-query scores)
     against the zero-shot student (the teacher's zero-shot row: experiments/pretrained_peer.py).

  SAMTONE_DATA_DIR=../shared/data .venv/bin/python experiments/label_free.py --out runs/label_free
"""

from __future__ import annotations

import json
import os
import sys

from common import existing_eval, experiment_parser, parse_into_folder, samtone, summarize
from pretrained_peer import import_base, train_ours

TASK, TEXTS = "multireqa_squad_dev", "squad_sentences"
DISTILLED = ["--gin.objective.embedding_distillation_weight=1.0"]  # with inputs.teacher_embeddings
ARMS = {
    "similarity": ["--gin.objective.contrastive_weight=0.0", *DISTILLED],
    "simcse": [],
    "simcse_similarity": DISTILLED,
}
TEACHER = "all-mpnet-base-v2"
LENGTH = 128  # the texts' tokens, for the teacher and the student


def main():
    parser = experiment_parser(__doc__, "runs/label_free")
    parser.set_defaults(steps=200, learning_rate=5e-5)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    args, out = parse_into_folder(parser)
    from samtone_jax.tasks import catalogue

    texts = f"{out}/sentences.jsonl"
    if not os.path.exists(texts):
        corpus = catalogue.collection(TASK, "test").corpus
        with open(texts + ".tmp", "w") as f:
            for key in sorted(corpus):
                f.write(json.dumps({"text": corpus[key]}, ensure_ascii=False) + "\n")
        os.replace(texts + ".tmp", texts)
    declared = f"--gin.local_tasks.tasks={{'{TEXTS}': {{'format': 'jsonl', 'path': '{texts}', 'test_fraction': 0.0}}}}"
    student = import_base(out, "all-MiniLM-L6-v2")
    teacher = import_base(out, TEACHER)
    teacher_dir = f"{out}/teacher_embeddings"
    samtone(  # resumable: a rerun skips the finished shards
        "encode",
        f"--checkpoint={teacher}",
        f"--task={TEXTS}",
        "--split=train",
        "--side=both",
        f"--out={teacher_dir}",
        f"--query_length={LENGTH}",
        f"--doc_length={LENGTH}",
        "--shard_size=2048",
        declared,
        log=f"{out}/teacher_encode.log",
    )

    def evaluate(model_dir, name):
        found = existing_eval(model_dir)
        if found is None:
            flags = [f"--gin.evaluate.model_dir='{model_dir}'", f"--gin.evaluate.task='{TASK}'"]
            flags += ["--gin.evaluate.split='test'", "--gin.evaluate.keep_embeddings=False"]
            flags += ["--gin.evaluate.query_length=64", "--gin.evaluate.doc_length=128"]
            samtone("eval", *flags, log=f"{out}/{name}_eval.log")
            found = existing_eval(model_dir)
        return found

    zero_shot = evaluate(student, "zero_shot")  # the teacher's own zero-shot row: experiments/pretrained_peer.py
    evals = {}
    for seed in args.seeds:
        evals["minilm", "zero_shot", seed] = zero_shot
        for arm in args.arms:
            name = f"{arm}_seed{seed}"
            model_dir = f"{out}/{name}"
            if existing_eval(model_dir) is None:
                print(f"{name}:", flush=True)
                teacher_flag = [f"--gin.inputs.teacher_embeddings='{teacher_dir}'"] if DISTILLED[0] in ARMS[arm] else []
                extra = [declared, *ARMS[arm], *teacher_flag]
                train_ours(out, name, student, args, seed, "losses/in_batch.gin", extra, TEXTS, (LENGTH, LENGTH))
            evals["minilm", arm, seed] = evaluate(model_dir, name)
    summary = summarize(out, evals, ["minilm"], ["zero_shot", *args.arms], args.seeds, ("P@1", "RR"))
    with open(f"{out}/summary.json", "w") as f:
        json.dump(summary, f, indent=2)
    print(summary["table"])
    print(open(f"{out}/compare_minilm.txt").read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
