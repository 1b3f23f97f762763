"""Is exact search exact on this device? search.ExactIndex's float32 top 10 against a float64 NumPy
reference, beside the same search with the platform's default matmul precision (what ExactIndex did
before it asked for full float32: one bfloat16 pass on TPU, TF32 on NVIDIA GPUs; on the CPU both are
float32).

Vectors: compressed_search_bench.corpus_and_queries (unit vectors with a shared low-rank structure; queries
are noisy copies of corpus rows). Per variant: the top-k overlap with float64's (ids), the queries
whose top k equals float64's in order (float32 itself can swap a near-tie float64 orders otherwise),
and the largest difference from float64's score at the same rank. Prints the device it ran on.

  .venv/bin/python benchmarks/search_precision_check.py --corpus 100000
  python3 benchmarks/search_precision_check.py              # on a GPU / TPU: 1,000,000 x 384
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from compressed_search_bench import corpus_and_queries  # noqa: E402

from samtone_jax.evaluation import search  # noqa: E402


def default_precision_top_k(queries, corpus, k: int, chunk: int):
    """The top k by an f32 matmul at the platform's default precision, chunk by chunk (one chunk's
    scores [Q, chunk] at a time, as ExactIndex scores them)."""

    @jax.jit
    def scores_of(q, rows):
        scores = jnp.einsum("qd,cd->qc", q, rows, preferred_element_type=jnp.float32)
        return jax.lax.top_k(scores, min(k, rows.shape[0]))

    q = jnp.asarray(queries)
    best_s, best_i = [], []
    for start in range(0, len(corpus), chunk):
        s, i = scores_of(q, jnp.asarray(corpus[start : start + chunk]))
        best_s.append(np.asarray(s))
        best_i.append(np.asarray(i) + start)
    s, i = np.concatenate(best_s, 1), np.concatenate(best_i, 1)
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(s, order, 1), np.take_along_axis(i, order, 1)


def float64_top_k(queries, corpus, k: int, chunk: int = 65536):
    s_all, i_all = [], []
    q = queries.astype(np.float64)
    for start in range(0, len(corpus), chunk):
        s = q @ corpus[start : start + chunk].astype(np.float64).T
        i = np.argpartition(-s, min(k, s.shape[1]) - 1, axis=1)[:, :k]
        s_all.append(np.take_along_axis(s, i, 1))
        i_all.append(i + start)
    s, i = np.concatenate(s_all, 1), np.concatenate(i_all, 1)
    order = np.lexsort((i, -s), axis=1)[:, :k]
    return np.take_along_axis(s, order, 1), np.take_along_axis(i, order, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()
    corpus, queries = corpus_and_queries(args.corpus, args.queries, args.dim)
    device = jax.devices()[0]
    where = f"{device.platform} ({device.device_kind})"
    print(f"corpus {args.corpus:,} x {args.dim}, {args.queries:,} queries, top {args.k}; {where}")
    ref_s, ref_i = float64_top_k(queries, corpus, args.k)
    index = search.ExactIndex(corpus, query_batch=args.queries)
    found = {
        "ExactIndex (full float32)": index.search(queries, args.k),
        "default matmul precision": default_precision_top_k(queries, corpus, args.k, index.chunk_size),
    }
    top = f"top {args.k}"
    print(f"{'variant':28s} {top + ' overlap':>14s} {'same ' + top:>11s} {'max |score - float64| at a rank':>31s}")
    for name, (s, i) in found.items():
        overlap = np.mean([len(set(a) & set(b)) / args.k for a, b in zip(i, ref_i, strict=True)])
        same = np.mean(np.all(i == ref_i, axis=1))
        print(f"{name:28s} {overlap:14.4f} {same:11.4f} {np.max(np.abs(s - ref_s)):31.2e}")


if __name__ == "__main__":
    main()
