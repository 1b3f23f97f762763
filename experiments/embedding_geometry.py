"""Where a model's embeddings sit, and what that does to an int8 index: the documents' per-dimension
spread and shared mean, and the MRR of four rankings of the same embeddings (full ranking, no top-k
cut-off, a tie counted in the query's favour):

  float32   q · d
  int8      c(q) · c(d), the int8 index's integer inner products (the ranges `samtone eval` uses:
            the model's calibration.json, else an even sample of --calibration documents)
  decoded   q · decode(c(d)), what rescoring scores
  centred   (q − m) · (d − m), m the documents' mean: what int8's per-dimension centring keeps

A collapsed model (quantization_aware.py) has a per-dimension std far below a trained model's; a
shared mean that carries ranking shows as centred (and int8) well below float32.

  SAMTONE_DATA_DIR=../shared/data .venv/bin/python experiments/embedding_geometry.py \\
    runs/compressed_serving_t5/posthoc_seed0 runs/compressed_serving_t5/qat_all_seed0
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def reciprocal_ranks(scores: np.ndarray, relevant: list[list[int]]) -> np.ndarray:
    """[Q] 1 / rank of each query's best relevant document among all ([Q, N] scores)."""
    best = np.array([scores[i, docs].max() for i, docs in enumerate(relevant)])
    return 1.0 / (1.0 + (scores > best[:, None]).sum(axis=1))


def geometry(folder: str, task: str, split: str, calibration: int) -> dict[str, float]:
    from samtone_jax.compression import quantization
    from samtone_jax.evaluation import run
    from samtone_jax.inference import encoder as inference
    from samtone_jax.tasks import catalogue

    collection = catalogue.collection(task, split)
    encoder = inference.load_encoder(folder, task=task)
    query_ids, q, doc_ids, d = run.dense_embeddings(encoder, collection.queries, collection.corpus)
    row = {doc: i for i, doc in enumerate(doc_ids)}
    relevant = [[row[doc] for doc in collection.qrels[qid] if doc in row] for qid in query_ids]
    ranges, _ = run.served_int8_ranges(encoder, d, calibration)
    cq, cd = (quantization.quantize_int8(x, ranges) for x in (q, d))
    decoded = quantization.decode(cd, "int8", d.shape[1], ranges)
    cq, cd = cq.astype(np.float32), cd.astype(np.float32)
    mean = d.mean(axis=0)
    rankings = {"float32": q @ d.T, "int8": cq @ cd.T, "decoded": q @ decoded.T, "centred": (q - mean) @ (d - mean).T}
    return {
        "documents' per-dimension std": float(d.std(axis=0).mean()),
        "documents' mean, norm": float(np.linalg.norm(mean)),
        "queries' per-dimension std": float(q.std(axis=0).mean()),
        **{f"MRR {name}": float(reciprocal_ranks(s, relevant).mean()) for name, s in rankings.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="model folders (runs, imports)")
    parser.add_argument("--task", default="multireqa_squad_dev")
    parser.add_argument("--split", default="test")
    parser.add_argument("--calibration", type=int, default=10_000, help="documents the int8 ranges come from")
    args = parser.parse_args()
    for folder in args.models:
        print(folder)
        for name, value in geometry(folder, args.task, args.split, args.calibration).items():
            print(f"  {name:32s} {value:.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
