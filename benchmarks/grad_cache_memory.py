"""Memory of a training step against contrastive batch size, with and without GradCache.

For each batch size B (pairs) and each step kind, a fresh process builds the model, compiles the
training step (samtone_jax.training.train.make_train_step) and runs it twice, then reports
  temp   XLA's compiled temporary bytes (memory_analysis().temp_size_in_bytes),
  rss    the process's peak resident set (ru_maxrss) after the steps,
  emb    the bytes of the batch's embeddings and their gradients (2 sides × B × D × 4 × 2),
         the part of GradCache's memory that must grow with B.
Kinds: `plain` (value_and_grad through the whole batch) and `gradcache` (chunk C rows per
device; at B ≤ C it is one chunk, i.e. the plain step). The goal: GradCache's temp flat in B
apart from `emb`; plain grows linearly.

Model: T5.1.1-shaped SDE, d_model 256, 4 heads × 64, gated-GELU d_ff 512, 4 layers, vocab 32128,
64 tokens a side, float32, bidirectional query-side SamToNe.

  .venv/bin/python benchmarks/grad_cache_memory.py [--sizes 64 256 1024 4096] [--chunk 64]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

MiB = 1024**2
SHAPE = dict(emb_dim=256, num_heads=4, head_dim=64, mlp_dim=512, num_layers=4, vocab_size=32128)
LENGTH = 64


def measure(batch: int, chunk: int | None) -> dict:
    """One compiled step in this process: temp bytes, peak RSS, step seconds."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import jax
    import numpy as np

    from samtone_jax.cli import gin_registry
    from samtone_jax.config import gin_config
    from samtone_jax.models import partitioning
    from samtone_jax.training import optimizer, train

    bindings = [f"T5Config.{k} = {v}" for k, v in SHAPE.items()]
    gin_registry.parse(["architectures/sde.gin", "losses/samtone_query.gin"], bindings)
    model = gin_config.model()
    mesh = partitioning.create_mesh(devices=jax.devices()[:1])
    tx, schedule = optimizer.adafactor(train_steps=1000)
    state = train.initial_state(model, tx, mesh, seed=0, init_checkpoint=None)
    rng = np.random.RandomState(0)
    tokens = {
        k: rng.randint(2, SHAPE["vocab_size"], size=(batch, LENGTH)).astype(np.int32)
        for k in ("query_tokens", "doc_tokens")
    }
    global_batch = partitioning.host_to_global(mesh, tokens)
    step = jax.jit(
        train.make_train_step(model, tx, schedule, mesh, chunk, gin_config.contrastive_loss), donate_argnums=0
    )
    compiled = step.lower(state, global_batch).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        state, metrics = compiled(state, global_batch)
        jax.block_until_ready(metrics["loss"])
        seconds.append(time.perf_counter() - start)
    return {
        "temp": temp,
        "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "emb": 2 * batch * SHAPE["emb_dim"] * 4 * 2,
        "seconds": seconds[-1],
        "loss": float(metrics["loss"]),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--plain_max", type=int, default=1024, help="largest batch for the plain step")
    parser.add_argument("--child", nargs=2, metavar=("BATCH", "CHUNK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        batch, chunk = int(args.child[0]), int(args.child[1]) or None
        print(json.dumps(measure(batch, chunk)))
        return
    print(f"CPU: {os.cpu_count()} cores; SDE {SHAPE}, {LENGTH} tokens a side, float32, 1 device")
    columns = ("temp MiB", "rss MiB", "emb MiB", "temp-emb", "temp/first", "s/step")
    print(f"{'B':>6} {'kind':>10} " + " ".join(f"{c:>10}" for c in columns))
    first = {}
    for batch in args.sizes:
        for kind, chunk in (("plain", 0), ("gradcache", args.chunk)):
            if kind == "plain" and batch > args.plain_max:
                continue
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(batch), str(chunk)], capture_output=True, text=True
            )
            if out.returncode:
                print(f"{batch:>6} {kind:>10} failed: {out.stderr.strip().splitlines()[-1]}", flush=True)
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            first.setdefault(kind, r)
            values = (
                r["temp"] / MiB,
                r["rss"] / MiB,
                r["emb"] / MiB,
                (r["temp"] - r["emb"]) / MiB,
                r["temp"] / first[kind]["temp"],
                r["seconds"],
            )
            print(f"{batch:>6} {kind:>10} " + " ".join(f"{v:>10.2f}" for v in values), flush=True)
    print("temp/first: compiled temp bytes over those of the smallest batch of the same kind")


if __name__ == "__main__":
    main()
