"""Encoding speed, side by side: `samtone_jax.load(import).encode_documents` against
`SentenceTransformer.encode` (its default batch 32, each batch padded to its longest text) on the
same pretrained model, the same texts and the same truncation, in one process, alternating, best of
`--passes` passes each after one untimed warm-up pass (every shape compiled, kernels warm).

Texts (real, from ../shared/data or SAMTONE_DATA_DIR):
  short  WordNet definitions (wordnet/synsets.jsonl.gz), about 13 tokens each
  long   SQuAD v1.1 dev paragraphs (squad_v1.1/dev-v1.1.json), about 150 tokens each

Models: all-MiniLM-L6-v2 (the lock's wheel) and, with --models all-mpnet-base-v2, MPNet (make mpnet).
Prints texts/s of each side, our ÷ theirs, and the smallest cosine between the two sides' embeddings
(the same model: ≥ 0.9999 or the comparison is void).

  .venv/bin/python benchmarks/encode_bench.py [--short 4000] [--long 500] [--length 128] [--models ...]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

import samtone_jax  # noqa: E402
from samtone_jax.checkpoints import pretrained  # noqa: E402
from samtone_jax.cli import main as cli  # noqa: E402


def data_dir() -> Path:
    return Path(os.environ.get("SAMTONE_DATA_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data")


def short_texts(count: int) -> list[str]:
    with gzip.open(data_dir() / "wordnet" / "synsets.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line)["definition"] for _, line in zip(range(count), f, strict=False)]


def long_texts(count: int) -> list[str]:
    squad = json.loads((data_dir() / "squad_v1.1" / "dev-v1.1.json").read_text(encoding="utf-8"))
    paragraphs = [p["context"] for article in squad["data"] for p in article["paragraphs"]]
    return paragraphs[:count]


def timed(encode, texts) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    out = np.asarray(encode(texts), np.float32)
    return time.perf_counter() - start, out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=int, default=4000, help="WordNet definitions")
    parser.add_argument("--long", type=int, default=500, help="SQuAD paragraphs")
    parser.add_argument("--length", type=int, default=128, help="truncation in tokens, both sides")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=[pretrained.NAME], choices=sorted(pretrained.MODELS))
    args = parser.parse_args(argv)
    from sentence_transformers import SentenceTransformer

    sets = {"short": short_texts(args.short), "long": long_texts(args.long)}
    for name in args.models:
        folder = pretrained.folder(name)
        with tempfile.TemporaryDirectory() as tmp:
            dst = f"{tmp}/import"
            assert (
                cli.main(
                    ["import-checkpoint", "--format=sentence-transformers", f"--checkpoint={name}", f"--out={dst}"]
                )
                == 0
            )
            ours = samtone_jax.load(dst, query_length=args.length, doc_length=args.length)
            theirs = SentenceTransformer(folder, device="cpu", local_files_only=True)
            theirs.max_seq_length = args.length
            for kind, texts in sets.items():
                sides = {"ours": ours.encode_documents, "st": theirs.encode}
                best = dict.fromkeys(sides, float("inf"))
                out = {}
                for encode in sides.values():
                    timed(encode, texts)  # warm-up: compilations, kernels
                for _ in range(args.passes):
                    for side, encode in sides.items():
                        seconds, out[side] = timed(encode, texts)
                        best[side] = min(best[side], seconds)
                cosine = float(np.sum(out["ours"] * out["st"], axis=1).min())
                rate = {side: len(texts) / best[side] for side in sides}
                print(
                    f"{name:18s} {kind:5s} {len(texts):5d} texts at {args.length} tokens: ours {rate['ours']:7.1f} "
                    f"texts/s, sentence-transformers {rate['st']:7.1f} texts/s, ratio {rate['ours'] / rate['st']:.2f}x "
                    f"(min cosine {cosine:.6f})",
                    flush=True,
                )


if __name__ == "__main__":
    main(sys.argv[1:])
