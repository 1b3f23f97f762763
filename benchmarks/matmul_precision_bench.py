"""Matmul throughput by precision, XLA:CPU against torch, in one process: does lower precision buy
anything on this CPU, on either side? (A CPU with AMX runs torch's bfloat16 matmuls several times
faster than float32; an XLA:CPU without a path to AMX does not.) Prints GFLOP/s of an N x N @ N x N
matmul, best of --repeats, for float32 and bfloat16 on each side.

  .venv/bin/python benchmarks/matmul_precision_bench.py [--n 2048]
  XLA_FLAGS=--xla_cpu_use_onednn=true .venv/bin/python benchmarks/matmul_precision_bench.py   # a flag's effect
"""

from __future__ import annotations

import argparse
import time


def best_seconds(run, repeats: int) -> float:
    run()  # compiled / warm
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    import jax
    import jax.numpy as jnp
    import torch

    flops = 2 * args.n**3
    matmul = jax.jit(lambda a, b: a @ b)
    for name, jdt, tdt in (("float32", jnp.float32, torch.float32), ("bfloat16", jnp.bfloat16, torch.bfloat16)):
        a = jnp.ones((args.n, args.n), jdt)
        ours = best_seconds(lambda a=a: matmul(a, a).block_until_ready(), args.repeats)
        t = torch.ones((args.n, args.n), dtype=tdt)
        theirs = best_seconds(lambda t=t: t @ t, args.repeats)
        print(
            f"{name:9s} XLA:CPU {flops / ours / 1e9:6.0f} GFLOP/s   torch {flops / theirs / 1e9:6.0f} GFLOP/s",
            flush=True,
        )


if __name__ == "__main__":
    main()
