"""Exact top-100 search: ours (samtone_jax.evaluation.search.ExactIndex) against faiss.IndexFlatIP, one run.

Random unit vectors, float32, on the CPU. Both indexes are built before timing (faiss: add; ours:
the corpus placed on device); the timed call is `search` of all queries. Prints queries/s of each
(median of --repeats after a warm-up), the ratio, and whether the two return the same top-k sets
with the same scores. `--selections native lax` also times XLA's lax.top_k merge (the old path);
`--chunk_sizes` sweeps the chunk size (default: search.auto_chunk_size).

  .venv/bin/python benchmarks/search_bench.py                       # 1,000,000 x 256 and 100,000 x 768
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import faiss  # noqa: E402
import numpy as np  # noqa: E402

from samtone_jax.evaluation.search import ExactIndex  # noqa: E402


def unit(rng, n, d):
    x = rng.standard_normal((n, d), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def timed(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["1000000x256", "100000x768"])
    parser.add_argument("--queries", type=int, default=1024)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk_sizes", type=int, nargs="+", default=[None])
    parser.add_argument("--selections", nargs="+", default=["native"], choices=["native", "lax"])
    args = parser.parse_args()
    faiss.omp_set_num_threads(os.cpu_count())
    print(f"CPU: {os.cpu_count()} cores, faiss {faiss.__version__}; {args.queries} queries, top-{args.k}, float32")
    print(
        f"{'corpus':>14s} {'selection':>9s} {'chunk':>6s} {'ours q/s':>10s} {'faiss q/s':>10s} "
        f"{'ours/faiss':>10s} {'same':>5s}"
    )
    for shape in args.shapes:
        n, d = (int(x) for x in shape.split("x"))
        rng = np.random.default_rng(0)
        corpus, queries = unit(rng, n, d), unit(rng, args.queries, d)
        index = faiss.IndexFlatIP(d)
        index.add(corpus)
        t_faiss, (f_scores, f_ids) = timed(functools.partial(index.search, queries, args.k), args.repeats)
        for selection in args.selections:
            for chunk_size in args.chunk_sizes:
                ours = ExactIndex(corpus, chunk_size=chunk_size, query_batch=args.queries, selection=selection)
                t_ours, (o_scores, o_ids) = timed(functools.partial(ours.search, queries, args.k), args.repeats)
                # Same result: the same top-k set for every query and the same scores (float32 summation
                # order may swap two near-tied neighbours, so the order inside a tie is not compared).
                same_sets = all(set(a) == set(b) for a, b in zip(o_ids.tolist(), f_ids.tolist(), strict=True))
                same = same_sets and np.allclose(o_scores, f_scores, atol=1e-5)
                rate_ours, rate_faiss = args.queries / t_ours, args.queries / t_faiss
                print(
                    f"{shape:>14s} {selection:>9s} {ours.chunk_size:6d} {rate_ours:10.1f} {rate_faiss:10.1f} "
                    f"{rate_ours / rate_faiss:10.2f} {str(same):>5s}",
                    flush=True,
                )
                del ours


if __name__ == "__main__":
    main()
