"""Where a packed training step's time goes, on real batches: the whole step against its parts.

real_data_step_bench.py's model, step and batches (seed 0, 32 pairs, WordNet by default), packed
with `--row_bits`. Each part is compiled on its own and timed on the same batches, interleaved:

  step       the training step (train.make_train_step: encode, loss, gradients, Adafactor)
  grads      loss and gradients only (no optimizer update)
  forward    loss only (encode both sides, no backward)
  update     Adafactor's update and apply on gradients of the parameters' shapes

and the fixed-length step on the same pairs, which gives a linear fit step = F + tokens · c.

  .venv/bin/python benchmarks/packed_step_breakdown.py [--task wordnet_definitions] [--batches 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import optax  # noqa: E402
from real_data_step_bench import TASKS, Ours, computed_tokens, real_batches, vocabulary_for  # noqa: E402

from samtone_jax.config import gin_config  # noqa: E402
from samtone_jax.data.packing import pack_batch  # noqa: E402
from samtone_jax.models import partitioning
from samtone_jax.training import train
from samtone_jax.training.batch_embeddings import embed_batch  # noqa: E402


def parts(ours: Ours) -> dict:
    """Compiled (params, opt_state, batch) -> outputs for each part of the step."""
    model, mesh, tx, segments = ours.model, ours.mesh, ours.tx, ours.max_segments

    def loss(params, batch):
        loss_fn = train.make_loss_on_embeddings(model, mesh, batch, gin_config.contrastive_loss)
        return loss_fn(params, *embed_batch(model, params, batch, None, segments))

    def grads(params, opt_state, batch):
        return jax.value_and_grad(loss, has_aux=True)(params, batch)

    def forward(params, opt_state, batch):
        return loss(params, batch)

    def update(params, opt_state, batch):
        fake = jax.tree_util.tree_map(lambda p: p * 1e-3, params)  # gradients of the parameters' shapes
        updates, opt_state = tx.update(fake, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return {name: jax.jit(fn) for name, fn in (("grads", grads), ("forward", forward), ("update", update))}


def timed(fn, *args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="wordnet_definitions", choices=list(TASKS))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--row_bits", type=int, default=4)
    args = parser.parse_args()
    batches = real_batches(args.task, args.batch, args.batches, vocabulary_for(args.task))
    packed_batches = [pack_batch(b, devices=1, max_segments=8, row_bits=args.row_bits) for b in batches]
    packed, fixed = Ours(8), Ours(None)
    fns = parts(packed)
    arrays = [partitioning.host_to_global(packed.mesh, b) for b in packed_batches]
    arms = {
        "step": lambda i: packed(packed_batches[i]),
        **{
            name: (lambda i, f=f: timed(f, packed.state["params"], packed.state["opt_state"], arrays[i]))
            for name, f in fns.items()
        },  # the state the step left (its input is donated)
        "fixed step": lambda i: fixed(batches[i]),
    }
    for arm in arms.values():  # untimed: compile every shape
        for i in range(len(batches)):
            arm(i)
    seconds = dict.fromkeys(arms, 0.0)
    for _ in range(args.repeats):
        for i in range(len(batches)):
            for name, arm in arms.items():
                seconds[name] += arm(i)
    n = len(batches) * args.repeats
    per = {name: s / n for name, s in seconds.items()}
    tokens_packed = sum(map(computed_tokens, packed_batches)) / len(batches)
    tokens_fixed = sum(map(computed_tokens, batches)) / len(batches)
    c = (per["fixed step"] - per["step"]) / (tokens_fixed - tokens_packed)
    print(f"{args.task}: {args.batch} pairs, {tokens_packed:.0f} tokens a packed step, {tokens_fixed:.0f} fixed")
    for name, s in per.items():
        print(f"{name:11s} {s * 1000:8.1f} ms  {s / per['step']:6.1%} of the packed step")
    print(
        f"fit step = F + tokens · c: c = {c * 1e3:.3f} ms a token, F = {(per['step'] - c * tokens_packed) * 1e3:.0f} ms"
    )


if __name__ == "__main__":
    main()
