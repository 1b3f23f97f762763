"""ADORE's on-device retrieval against the rest of its training step, one process, CPU.

A T5.1.1-shaped mini query tower (d_model 64, 3 layers, 32 tokens), batch 64, top-200 over a
random unit index of N × 64 (N = 10,642: the SQuAD dev pool; N = 1,000,000). Prints the median
time of the whole jitted step (encode, retrieve, RankNet, backward, Adafactor) and of the
retrieval alone (the same chunked top-k on the same shapes), and their ratio.

  .venv/bin/python benchmarks/adore_bench.py
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from samtone_jax.evaluation.search import chunked_top_k  # noqa: E402
from samtone_jax.hard_negatives.adore_train import make_adore_step  # noqa: E402
from samtone_jax.models import (  # noqa: E402
    DualEncoder,
    T5Config,
    init_params,
    partitioning,  # noqa: E402
)


def median_time(fn, args, repeats):
    """Median seconds of fn(*args) after one warm-up (compilation) call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=int, nargs="+", default=[10642, 1_000_000])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--k", type=int, default=200)
    parser.add_argument("--chunk", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    config = T5Config(vocab_size=8000, emb_dim=64, num_heads=4, head_dim=16, mlp_dim=256, num_layers=3)
    model = DualEncoder(config=config, architecture="ade")
    mesh = partitioning.create_mesh(devices=jax.devices()[:1])
    params = nn.unbox(init_params(model, jax.random.PRNGKey(0)))
    tx = optax.adafactor(1e-3)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(3, 8000, (args.batch, 32)), jnp.int32)
    print(f"CPU: {os.cpu_count()} cores; batch {args.batch}, top-{args.k}, mini query tower (d_model 64, 3 layers)")
    print(f"{'corpus':>10s} {'step s':>8s} {'retrieval s':>12s} {'retrieval/step':>15s}")
    for n in args.corpus:
        chunk = min(args.chunk, n)
        rows = -(-n // chunk) * chunk
        index = rng.standard_normal((rows, 64), dtype=np.float32)
        index /= np.linalg.norm(index, axis=1, keepdims=True)
        index_dev = jax.device_put(index, NamedSharding(mesh, P("data")))
        scale = jax.device_put(np.ones(rows, np.float32), NamedSharding(mesh, P("data")))
        positives = jnp.asarray(rng.integers(0, n, (args.batch, 1)), jnp.int32)
        step = jax.jit(
            make_adore_step(
                model, tx, mesh, k=args.k, metric_cut=10, temperature=0.05, n=n, chunk_size=chunk, has_scale=False
            )
        )
        state = {
            "step": jnp.zeros((), jnp.int32),
            "params": params,
            "opt_state": tx.init(params),
            "rng": jax.random.key_data(jax.random.PRNGKey(0)),
        }
        t_step = median_time(step, (state, tokens, positives, index_dev, scale), args.repeats)
        q = jnp.asarray(rng.standard_normal((args.batch, 64)), jnp.float32)
        retrieve = jax.jit(functools.partial(chunked_top_k, exact=False), static_argnums=(2, 3, 4))  # as ADORE runs it
        t_retrieval = median_time(retrieve, (q, index_dev, args.k, chunk, n), args.repeats)
        print(f"{n:10,d} {t_step:8.3f} {t_retrieval:12.3f} {t_retrieval / t_step:15.2f}", flush=True)


if __name__ == "__main__":
    main()
