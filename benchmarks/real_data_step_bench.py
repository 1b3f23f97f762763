"""A training step on real batches: ours packed, ours fixed-length, sentence-transformers padded
to each batch's longest text; one run, the same batches in the same order for every arm.

Model and step: train_step_bench.py's T5.1.1-shaped SDE (d_model 512, 8 × 64 heads, gated-GELU
d_ff 1024, 4 layers, vocab 32128), bidirectional query-side SamToNe at τ 0.01, Adafactor; float32,
dropout off. Batches: the training pipeline's (pipeline.train_dataset, seed 0) of each task, with
the demo's vocabulary (runs/demo_t5/vocab.model; built from the task's text when missing):

  wordnet_definitions   queries 32, definitions 48 tokens (the demo's lengths)
  multireqa_squad_dev   queries 64, sentences 192 tokens (runs/finetune_multireqa.gin's lengths)

Arms, interleaved batch by batch after one untimed pass over every batch (compiles every row count
the packed arm meets; sentence-transformers' kernels warm up):

  packed   packing.enabled: each batch's texts packed first-fit decreasing into rows (data/packing.py)
  fixed    today's default: every text padded to its side's length
  st       sentence-transformers 6.2 (train_step_bench.py's model and loss), inputs cut to the
           batch's longest text (its own padding)

Prints, per task and arm: pairs/s (total pairs / total step time), the real-token fraction of the
tokens the step computes, MFU on real tokens (the FLOPs the texts need unpadded, over the
measured matmul peak), and packed / st, packed / fixed.

  .venv/bin/python benchmarks/real_data_step_bench.py [--batch 32] [--batches 8] [--tasks ...]
      [--skip st]   (needs WordNet: make wordnet; SQuAD: ../shared/data or $SAMTONE_DATA_DIR)
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from train_step_bench import LR, SHAPE, TAU, matmul_peak, theirs_step  # noqa: E402

from samtone_jax.cli import gin_registry  # noqa: E402
from samtone_jax.config import gin_config
from samtone_jax.core import run_folders
from samtone_jax.models import partitioning
from samtone_jax.training import optimizer, train, train_batches

ROOT = Path(__file__).resolve().parent.parent
TASKS = {"wordnet_definitions": (32, 48, "train"), "multireqa_squad_dev": (64, 192, "train")}


def real_flops(lengths: np.ndarray, shape: dict = SHAPE) -> float:
    """Matmul FLOPs of a training step (forward × 3) over texts of `lengths` tokens, unpadded."""
    d, h, dh, f, n = shape["emb_dim"], shape["num_heads"], shape["head_dim"], shape["mlp_dim"], shape["num_layers"]
    per_token = 2 * (4 * d * h * dh + 3 * d * f)
    attention = 2 * 2 * h * dh * np.square(lengths.astype(np.float64))  # QKᵀ and AV within each text
    texts = len(lengths)
    forward = n * (per_token * lengths.sum() + attention.sum()) + 2 * texts * d * d
    return 3.0 * forward


def lengths_of(tokens: np.ndarray) -> np.ndarray:
    nonzero = tokens != 0
    return np.where(nonzero.any(axis=1), tokens.shape[1] - np.argmax(nonzero[:, ::-1], axis=1), 0)


def real_batches(task: str, batch: int, count: int, vocabulary: str) -> list[dict]:
    from samtone_jax.data import pipeline
    from samtone_jax.data.input_spec import InputSpec
    from samtone_jax.tasks import registration

    query_length, doc_length, split = TASKS[task]
    spec = InputSpec(vocabulary, query_length, doc_length)
    registration.register(spec)
    ds = pipeline.train_dataset(task, split, spec, batch_size=batch)
    return [train_batches.model_features(b, id_masking=True) for b in itertools.islice(ds.as_numpy_iterator(), count)]


def vocabulary_for(task: str) -> str:
    path = ROOT / "runs" / "demo_t5" / run_folders.VOCABULARY
    if path.exists():
        return str(path)
    from samtone_jax.data import vocab as vocab_lib
    from samtone_jax.tasks import catalogue

    built = Path("/tmp") / f"real_data_step_bench_{task}.model"
    if not built.exists():
        vocab_lib.train_sentencepiece(catalogue.collection(task, "train").texts(), 8000, str(built))
    return str(built)


class Ours:
    """The training loop's jitted step on a 1-device mesh; one compiled step per batch shape."""

    def __init__(self, max_segments: int | None):
        bindings = [f"T5Config.{k} = {v}" for k, v in SHAPE.items()]
        gin_registry.parse(
            ["architectures/sde.gin", "losses/samtone_query.gin"],
            [*bindings, "T5Config.mlp_activations = ('gelu', 'linear')", f"TEMPERATURE = {TAU}"],
        )
        model = gin_config.model()
        self.mesh = partitioning.create_mesh(devices=jax.devices()[:1])
        tx, schedule = optimizer.adafactor(learning_rate=LR, train_steps=10_000)
        self.model, self.tx, self.max_segments = model, tx, max_segments
        self.state = train.initial_state(model, tx, self.mesh, seed=0, init_checkpoint=None)
        step = train.make_train_step(model, tx, schedule, self.mesh, None, gin_config.contrastive_loss, max_segments)
        self.step = jax.jit(step, donate_argnums=0)

    def __call__(self, batch: dict) -> float:
        arrays = partitioning.host_to_global(self.mesh, batch)
        start = time.perf_counter()
        self.state, metrics = self.step(self.state, arrays)
        jax.block_until_ready(metrics["loss"])
        return time.perf_counter() - start


def computed_tokens(batch: dict) -> int:
    return sum(batch[k].size for k in ("query_tokens", "doc_tokens"))


def run_task(task: str, args, peak: float) -> dict:
    from samtone_jax.data.packing import pack_batch

    batches = real_batches(task, args.batch, args.batches, vocabulary_for(task))
    packed = [pack_batch(b, devices=1, max_segments=args.max_segments, row_bits=args.row_bits) for b in batches]
    lengths = [np.concatenate([lengths_of(b["query_tokens"]), lengths_of(b["doc_tokens"])]) for b in batches]
    real = sum(int(x.sum()) for x in lengths)
    useful = sum(real_flops(x) for x in lengths)
    arms = {"packed": (Ours(args.max_segments), packed), "fixed": (Ours(None), batches)}
    computed = {"packed": sum(map(computed_tokens, packed)), "fixed": sum(map(computed_tokens, batches))}
    if "st" not in args.skip:
        st_step = theirs_step(args.batch, max(TASKS[task][:2]))
        cut = []
        for b in batches:  # its own padding: each side cut to the batch's longest text
            sides = [b[k][:, : int(lengths_of(b[k]).max())] for k in ("query_tokens", "doc_tokens")]
            cut.append(sides)
        arms["st"] = (st_step, cut)
        computed["st"] = sum(q.size + d.size for q, d in cut)
    for fn, data in arms.values():  # untimed pass: every shape compiled, kernels warm
        for item in data:
            fn(item)
    seconds = dict.fromkeys(arms, 0.0)
    for _ in range(args.repeats):
        for i in range(len(batches)):  # interleaved: the same batch for every arm, in turn
            for name, (fn, data) in arms.items():
                seconds[name] += fn(data[i])
    pairs = args.batch * len(batches) * args.repeats
    result = {}
    for name in arms:
        result[name] = {
            "pairs_per_s": pairs / seconds[name],
            "real_fraction": real / computed[name],
            "mfu_real": useful * args.repeats / seconds[name] / peak,
        }
    rows = {b["query_tokens"].shape[0] for b in packed}, {b["doc_tokens"].shape[0] for b in packed}
    print(
        f"\n{task}: {len(batches)} batches × {args.batch} pairs × {args.repeats} passes; real tokens {real:,} "
        f"({real / len(batches) / args.batch:.1f} a pair); packed rows per batch: queries {sorted(rows[0])}, "
        f"documents {sorted(rows[1])}"
    )
    print(f"{'arm':8s} {'pairs/s':>9s} {'real tokens':>12s} {'MFU (real)':>11s}")
    for name, r in result.items():
        print(f"{name:8s} {r['pairs_per_s']:9.2f} {r['real_fraction']:11.1%} {r['mfu_real']:11.2f}")
    for other in ("st", "fixed"):
        if other in result:
            ratio = result["packed"]["pairs_per_s"] / result[other]["pairs_per_s"]
            print(f"packed / {other:5s} {ratio:6.2f}x")
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max_segments", type=int, default=8)
    parser.add_argument("--row_bits", type=int, default=3, help="packing.row_bits")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--skip", nargs="*", default=[], help="st")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(os.cpu_count())
    print(f"CPU: {os.cpu_count()} cores; jax {jax.__version__}, torch {torch.__version__}; SDE {SHAPE}, float32")
    peak = matmul_peak()
    print(f"matmul peak {peak / 1e9:.1f} GFLOP/s")
    for task in args.tasks:
        run_task(task, args, peak)


if __name__ == "__main__":
    main()
