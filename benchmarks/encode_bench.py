"""Encoding speed, side by side: `samtone_jax.load(import).encode_documents` against
`SentenceTransformer.encode` (its default batch 32, each batch padded to its longest text) on the
same pretrained model, the same texts and the same truncation, in one process, alternating, best of
`--passes` passes each after one untimed warm-up pass (every shape compiled, kernels warm).

Texts (real, from ../shared/data or SAMTONE_DATA_DIR):
  short  WordNet definitions (wordnet/synsets.jsonl.gz), about 13 tokens each
  long   SQuAD v1.1 dev paragraphs (squad_v1.1/dev-v1.1.json), about 150 tokens each

Models: all-MiniLM-L6-v2 (the lock's wheel) and, with --models all-mpnet-base-v2, MPNet (make mpnet).
Prints texts/s of each side, our ÷ theirs, and the smallest cosine between the two sides' embeddings
(the same model: ≥ 0.9999 or the comparison is void). Then the ceiling: each side's rate in model
FLOPs of the real tokens (training/model_flops.py's count, forward only: a third of a training
step's) as a share of this CPU's float32 matmul peak (the better of XLA's 1024² product, which is the training
log's MFU peak, and torch's), and
the most any float32 encoder could reach against sentence-transformers, computing only the real
tokens at that peak (peak ÷ its rate).

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
from samtone_jax.training import model_flops  # noqa: E402


def data_dir() -> Path:
    return Path(os.environ.get("SAMTONE_DATA_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data")


def short_texts(count: int) -> list[str]:
    with gzip.open(data_dir() / "wordnet" / "synsets.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line)["definition"] for _, line in zip(range(count), f, strict=False)]


def long_texts(count: int) -> list[str]:
    squad = json.loads((data_dir() / "squad_v1.1" / "dev-v1.1.json").read_text(encoding="utf-8"))
    paragraphs = [p["context"] for article in squad["data"] for p in article["paragraphs"]]
    return paragraphs[:count]


def torch_peak(size: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of torch's best [size, size] @ [size, size] float32 product (the peak is the better of
    this and XLA's, so neither library's matmul sets the ceiling alone)."""
    import torch

    a = torch.ones(size, size)
    torch.mm(a, a)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, a)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def token_sums(tokenizer, texts: list[str], length: int) -> tuple[int, int]:
    """(Σ T, Σ T²) of the texts' token counts at `length` (special tokens included, as both sides encode)."""
    counts = np.array([len(ids) for ids in tokenizer(texts, truncation=True, max_length=length)["input_ids"]])
    return int(counts.sum()), int((counts * counts).sum())


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
    peak = max(model_flops.measured_cpu_peak("float32"), torch_peak())
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
            flops = model_flops.ModelFlops.of(ours.model, ours.params)
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
                real = flops.per_step(*token_sums(theirs.tokenizer, texts, args.length)) / 3  # forward only
                share = {side: real / best[side] / peak for side in sides}
                print(
                    f"{'':18s} {kind:5s} real-token FLOPs {real / 1e9:.1f} G: ours {share['ours']:.0%} of the float32 "
                    f"peak ({peak / 1e9:.0f} GFLOP/s), sentence-transformers {share['st']:.0%}; the ceiling at the "
                    f"peak: {1 / share['st']:.2f}x sentence-transformers",
                    flush=True,
                )


if __name__ == "__main__":
    main(sys.argv[1:])
