"""Input pipeline throughput against the train step's consumption rate, measured in one run.

For each configuration: examples/s of `samtone_jax.data.pipeline.train_dataset` (batches pulled
as numpy, after a warm-up that fills the in-memory cache) and examples/s of the jitted training
step of the demo model (runs/demo_cpu.gin) on a batch of the same shape. Goal: pipeline ≥ 5×
the step, so input never stalls training.

  .venv/bin/python benchmarks/input_bench.py          # needs WordNet (make wordnet)
"""

from __future__ import annotations

import argparse
import gc
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402

from samtone_jax.cli import gin_registry  # noqa: E402
from samtone_jax.config import gin_config
from samtone_jax.data import pipeline  # noqa: E402
from samtone_jax.data import vocab as vocab_lib  # noqa: E402
from samtone_jax.data.input_spec import InputSpec  # noqa: E402
from samtone_jax.models import partitioning
from samtone_jax.tasks import (
    catalogue,
    registration,  # noqa: E402
)
from samtone_jax.training import optimizer, train, train_batches

CONFIGS = [("demo: batch 64, 32/48 tokens", 64, 32, 48), ("batch 512 x 64 tokens", 512, 64, 64)]


def pipeline_rate(batch, lq, ld, batches):
    it = pipeline.train_dataset(
        "wordnet_definitions", "train", InputSpec(None, lq, ld), batch_size=batch
    ).as_numpy_iterator()
    next(it)  # fills the cache
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    rate = batches * batch / (time.perf_counter() - start)
    del it
    gc.collect()
    return rate


def step_rate(batch, lq, ld, steps):
    model = gin_config.model()
    mesh = partitioning.create_mesh()
    tx, schedule = optimizer.adafactor(train_steps=1000)
    state = train.initial_state(model, tx, mesh, 0, None)
    step = jax.jit(
        train.make_train_step(model, tx, schedule, mesh, None, gin_config.contrastive_loss), donate_argnums=0
    )
    it = pipeline.train_dataset(
        "wordnet_definitions", "train", InputSpec(None, lq, ld), batch_size=batch
    ).as_numpy_iterator()
    data = partitioning.host_to_global(mesh, train_batches.model_features(next(it)))
    del it  # no prefetching thread competing with the timed steps
    gc.collect()
    state, m = step(state, data)
    jax.block_until_ready(m)
    start = time.perf_counter()
    for _ in range(steps):
        state, m = step(state, data)
    jax.block_until_ready(m)
    return steps * batch / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--vocab", default="runs/demo_t5/vocab.model", help="built by `samtone demo --tower=t5` when absent"
    )
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    if not os.path.exists(args.vocab):
        vocab_lib.train_sentencepiece(catalogue.collection("wordnet_definitions", "train").texts(), 8000, args.vocab)
    gin_registry.parse(["runs/demo_cpu.gin"], [f"VOCABULARY = '{args.vocab}'"])
    registration.register(InputSpec(args.vocab))
    print(f"CPU: {os.cpu_count()} cores; model: runs/demo_cpu.gin (d_model 64, 3 layers); task wordnet_definitions")
    print(f"{'configuration':32s} {'pipeline ex/s':>14s} {'step ex/s':>10s} {'ratio':>7s}")
    for name, batch, lq, ld in CONFIGS:
        p = pipeline_rate(batch, lq, ld, batches=max(20, 4000 // batch))
        s = step_rate(batch, lq, ld, args.steps)
        print(f"{name:32s} {p:14.0f} {s:10.0f} {p / s:7.1f}", flush=True)


if __name__ == "__main__":
    main()
