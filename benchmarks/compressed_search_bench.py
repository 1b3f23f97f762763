"""Exact top-100 search over a compressed index: float32 vs int8 codes vs packed sign bits (with and
without rescoring the top 100·R by the float query), ours (evaluation/compressed.py on
search.ExactIndex), one run on the same vectors.

Vectors: random unit vectors with a shared low-rank structure (queries are noisy copies of corpus
rows, so the float32 top 10 is meaningful), float32, on JAX's default device (the CPU here; a GPU or
TPU where one is). Per precision: bytes a document,
the index's bytes, queries/s of `compressed_top_k` once compiled (median of --repeats after a
warm-up; rescoring included), the ratio to float32's queries/s, and recall@10 of the float32 top 10.

On the CPU, int8 and binary chunks are widened to float32 (±1 for bits) inside the scan and
multiplied like float32 ones: the compressed index saves memory (4× int8, 32× binary), not
arithmetic; on TPU / GPU the same program reads 4× / 32× fewer bytes from HBM.

  .venv/bin/python benchmarks/compressed_search_bench.py                    # 1,000,000 x 384, 1,000 queries
  .venv/bin/python benchmarks/compressed_search_bench.py --corpus 100000    # a quick look
  python3 benchmarks/compressed_search_bench.py --queries 10000 --chunk_size 131072   # on a GPU
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from samtone_jax.compression import quantization  # noqa: E402
from samtone_jax.evaluation import compressed  # noqa: E402


def structured(rng, n: int, d: int, rank: int = 32) -> np.ndarray:
    """Unit vectors with most of their variance in a shared rank-`rank` subspace (as embeddings have)."""
    basis = rng.standard_normal((rank, d), dtype=np.float32)
    x = rng.standard_normal((n, rank), dtype=np.float32) @ basis + 0.5 * rng.standard_normal((n, d), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def corpus_and_queries(n: int, queries: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """A structured corpus [n, d] and unit queries [queries, d], each a noisy copy of a corpus row (seed 0)."""
    rng = np.random.default_rng(0)
    corpus = structured(rng, n, d)
    picked = rng.choice(n, queries, replace=False)
    noisy = corpus[picked] + 0.05 * rng.standard_normal((queries, d), dtype=np.float32)
    return corpus, noisy / np.linalg.norm(noisy, axis=1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--rescore", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk_size", type=int, default=None, help="corpus rows a scan step scores")
    args = parser.parse_args()
    corpus, queries = corpus_and_queries(args.corpus, args.queries, args.dim)
    ranges = quantization.int8_ranges(corpus[np.linspace(0, args.corpus - 1, 10000).astype(int)])
    device = jax.devices()[0]
    print(
        f"corpus {args.corpus:,} x {args.dim}, {args.queries:,} queries, top {args.k}; "
        f"one {device.platform} device ({device.device_kind}), jax {jax.__version__}, chunk {args.chunk_size or 'auto'}"
    )
    print(f"{'index':22s} {'bytes/doc':>9s} {'index MB':>9s} {'queries/s':>10s} {'vs float32':>10s} {'recall@10':>9s}")
    truth, base = None, None
    for precision, factor in (
        ("float32", 0),
        ("int8", 0),
        ("int8", args.rescore),
        ("binary", 0),
        ("binary", args.rescore),
    ):

        def run(precision=precision, factor=factor):
            return compressed.compressed_top_k(
                queries,
                corpus,
                precision,
                k=args.k,
                ranges=ranges,
                rescore_factor=factor,
                query_batch=args.queries,
                chunk_size=args.chunk_size,
            )

        run()  # compiles
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            found = run()
            times.append(time.perf_counter() - start)
        # compressed_top_k also encodes the corpus and places it on device: time the search alone too
        rate = found.queries_per_second
        if truth is None:
            truth, base = found.indices[:, :10], rate
        recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found.indices[:, :10], truth, strict=True)])
        name = precision + (f" + rescore {factor}" if factor else "")
        index_mb = found.bytes_per_document * args.corpus / 2**20
        print(
            f"{name:22s} {found.bytes_per_document:9d} {index_mb:9.1f} {rate:10.1f} {rate / base:10.2f}x "
            f"{recall:9.3f}   (whole call incl. encoding the corpus: {statistics.median(times):.1f} s)"
        )


if __name__ == "__main__":
    main()
