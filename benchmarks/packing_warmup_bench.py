"""The first 100 steps of a real run: fixed-length vs packed (each row count compiled when it first
appears) vs packed with the row floor (packing.row_sample, the default), one fresh process per
arm, run one after another on the same machine.

The run: `samtone train` with runs/demo_cpu.gin on WordNet, the model made train_step_bench.py's
T5.1.1-shaped SDE (d_model 512, 8 × 64 heads, gated-GELU d_ff 1024, 4 layers), batch 32, 100 steps,
log_every 1 (so every step's metrics are fetched: its end is timed). Each arm's clock starts when the
process calls the CLI, so start-up, the pipeline's first batches and every compilation count.

Prints per arm: time to the end of step 1, steps 2..100, the whole 100, the median step, and the
"stalls" (steps over 3 × the median: a compilation, or waiting for data), then the ratios.

  .venv/bin/python benchmarks/packing_warmup_bench.py [--steps 100] [--batch 32] [--arms fixed packed-free packed]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parent.parent
SHAPE = dict(emb_dim=512, num_heads=8, head_dim=64, mlp_dim=1024, num_layers=4)  # train_step_bench.SHAPE's
ARMS = {
    "fixed": ["--gin.packing.enabled=False"],
    "packed-free": ["--gin.packing.enabled=True", "--gin.packing.row_sample=0"],
    "packed": ["--gin.packing.enabled=True"],
}


def vocabulary() -> str:
    path = ROOT / "runs" / "demo_t5" / "vocab.model"
    if path.exists():
        return str(path)
    built = Path("/tmp/packing_warmup_bench_vocab.model")
    if not built.exists():
        from samtone_jax.data import vocab as vocab_lib
        from samtone_jax.tasks import catalogue

        vocab_lib.train_sentencepiece(catalogue.collection("wordnet_definitions", "train").texts(), 8000, str(built))
    return str(built)


def one_arm(arm: str, steps: int, batch: int, vocab: str, out: str) -> None:
    """In a fresh process: train, recording when each step's metrics arrive."""
    from samtone_jax.cli import main as cli
    from samtone_jax.training.train_logging import ProgressLogger

    start = time.perf_counter()
    done: list[float] = []
    record = ProgressLogger.record

    def timed(self, step, metrics):
        record(self, step, metrics)  # log_every 1: fetches this step's metrics, i.e. waits for the step
        done.append(time.perf_counter() - start)

    ProgressLogger.record = timed
    with tempfile.TemporaryDirectory() as model_dir:
        argv = [
            "train",
            "--gin_file=runs/demo_cpu.gin",
            f"--gin.MODEL_DIR='{model_dir}'",
            f"--gin.VOCABULARY='{vocab}'",
            f"--gin.TRAIN_STEPS={steps}",
            f"--gin.BATCH_SIZE={batch}",
            "--gin.schedule.log_every=1",
            f"--gin.schedule.checkpoint_every={steps * 10}",
            "--gin.T5Config.vocab_size=8000",
            *(f"--gin.T5Config.{k}={v}" for k, v in SHAPE.items()),
            *ARMS[arm],
        ]
        assert cli.main(argv) == 0
    Path(out).write_text(json.dumps(done))


def summary(done: list[float]) -> dict:
    import numpy as np

    steps = np.diff([0.0, *done])
    median = float(np.median(steps[1:]))
    slow = steps[1:] > 3 * median
    return {
        "first": done[0],
        "rest": done[-1] - done[0],
        "total": done[-1],
        "median": median,
        "stalls": int(slow.sum()),
        "stall_s": float(steps[1:][slow].sum()),
        "stall_steps": [int(i) + 2 for i in np.flatnonzero(slow)],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one arm
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one_arm(args.one, args.steps, args.batch, vocabulary(), args.out)
        return
    vocab = vocabulary()
    print(
        f"CPU: {os.cpu_count()} cores; T5 SDE {SHAPE}; WordNet, batch {args.batch}, {args.steps} steps; vocab {vocab}"
    )
    results = {}
    for arm in args.arms:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            cmd = [sys.executable, __file__, "--one", arm, "--steps", str(args.steps), "--batch", str(args.batch)]
            subprocess.run([*cmd, "--out", out.name], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
            results[arm] = summary(json.loads(Path(out.name).read_text()))
    print(
        f"\n{'arm':12s} {'step 1':>8s} {'steps 2+':>9s} {'total':>8s} {'median':>8s} {'stalls':>7s} {'in stalls':>10s}"
    )
    for arm, r in results.items():
        print(
            f"{arm:12s} {r['first']:7.1f}s {r['rest']:8.1f}s {r['total']:7.1f}s {r['median']:7.3f}s "
            f"{r['stalls']:7d} {r['stall_s']:9.1f}s   at steps {r['stall_steps'][:12]}"
        )
    for a, b in (("packed", "fixed"), ("packed", "packed-free"), ("packed-free", "fixed")):
        if a in results and b in results:
            ra, rb = results[a], results[b]
            print(f"{a} / {b}: total {rb['total'] / ra['total']:.2f}x faster, steps 2+ {rb['rest'] / ra['rest']:.2f}x")


if __name__ == "__main__":
    main()
