"""Time to first step, cold and warm, and the steady state's MFU: the demo's training config run twice.

`samtone train` of the recipe `samtone finetune` and the demo use (runs/finetune_minilm.gin on the
pretrained all-MiniLM-L6-v2, WordNet pairs, packed rows, batch 64, 32 / 48 tokens), each run a fresh
process into its own MODEL_DIR, both with one fresh persistent compilation cache:

  cold   the first run: imports, config, data, model, every compilation
  warm   the same command again (another MODEL_DIR): the compilations come from the cache

Prints each run's time to first step (the log's "step 1 done ... s after start") and the last logged
window's pairs/s and MFU (training/model_flops.py), and warm ÷ cold. --config t5 runs the
from-scratch T5.1.1 demo config (runs/demo_cpu.gin, its 8,000-piece vocabulary built first) instead.

  .venv/bin/python benchmarks/startup_bench.py [--steps 60] [--config minilm|t5]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMTONE = [sys.executable, "-m", "samtone_jax.cli.main"]


def run(argv: list[str], env: dict) -> str:
    done = subprocess.run([*SAMTONE, *argv], env=env, cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"samtone {' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def measured(stdout: str) -> dict:
    first = re.search(r"^step \d+ done ([\d.]+) s after start", stdout, re.M)
    windows = re.findall(r"^step \d+/\d+ \|.*?([\d.]+) ex/s \| MFU ([\d.]+)%", stdout, re.M)
    return {"first_step_s": float(first.group(1)), "ex_per_s": float(windows[-1][0]), "mfu": float(windows[-1][1])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--config", choices=["minilm", "t5"], default="minilm")
    args = parser.parse_args()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    with tempfile.TemporaryDirectory(prefix="startup_bench_") as tmp:
        env["JAX_COMPILATION_CACHE_DIR"] = f"{tmp}/xla_cache"  # fresh: the cold run compiles everything
        if args.config == "minilm":
            from samtone_jax.checkpoints import pretrained

            init = f"{tmp}/minilm"
            source = pretrained.folder(pretrained.NAME)
            run(["import-checkpoint", "--format=sentence-transformers", f"--checkpoint={source}", f"--out={init}"], env)
            config = [f"--gin_file={init}/model.gin", "--gin_file=runs/finetune_minilm.gin",
                      f"--gin.INIT_CHECKPOINT='{init}'", f"--gin.VOCABULARY='{init}/tokenizer.json'",
                      "--gin.train.task='wordnet_definitions'"]  # fmt: skip
        else:  # the T5 demo's vocabulary, built as `samtone demo --tower=t5` builds it
            vocabulary = f"{tmp}/vocab.model"
            run(
                [
                    "build-vocab",
                    "--task=wordnet_definitions",
                    "--split=all",
                    "--vocab_size=8000",
                    f"--out={vocabulary}",
                ],
                env,
            )
            config = ["--gin_file=runs/demo_cpu.gin", f"--gin.VOCABULARY='{vocabulary}'"]
        results = {}
        for name in ("cold", "warm"):
            argv = ["train", *config, f"--gin.MODEL_DIR='{tmp}/{name}'", f"--gin.TRAIN_STEPS={args.steps}"]
            argv += [f"--gin.schedule.log_every={args.steps // 3}", f"--gin.schedule.checkpoint_every={args.steps}"]
            results[name] = measured(run(argv, env))
            r = results[name]
            print(
                f"{name}: first step {r['first_step_s']:.1f} s after start; last window {r['ex_per_s']:.1f} pairs/s, "
                f"MFU {r['mfu']:.1f} %",
                flush=True,
            )
    print(f"warm ÷ cold time to first step: {results['warm']['first_step_s'] / results['cold']['first_step_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
