"""The training step of all-MiniLM-L6-v2 with LoRA adapters against full fine-tuning, one run: the loop's
jitted step (train.make_train_step), packed real WordNet batches, AdamW, dropout 0.1 (so each example
is encoded under batch_embeddings.embed's vmap, as in training), one CPU device.

Per arm: seconds a step (mean over --repeats passes over --batches batches, after an untimed pass that
compiles every shape), pairs/s, the ratio to full fine-tuning's step time, and the compiled step's
flops and bytes accessed (XLA's cost analysis). LoRA computes no weight gradient for the frozen tower,
so its step should not be slower than full fine-tuning's.

  .venv/bin/python benchmarks/lora_step_bench.py [--ranks 8 32] [--batches 6] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import types
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).parent))

import jax  # noqa: E402
from bert_finetune_bench import TAU, real_batches  # noqa: E402

from samtone_jax.checkpoints.pretrained import minilm_folder  # noqa: E402
from samtone_jax.cli import gin_registry
from samtone_jax.cli import main as cli  # noqa: E402
from samtone_jax.config import gin_config
from samtone_jax.core import run_folders
from samtone_jax.models import partitioning
from samtone_jax.training import optimizer, train


def arm(imported: str, rank: int, packed: list[dict]) -> tuple[float, dict]:
    """(seconds a step, XLA's cost analysis) of the step with LoRA rank `rank` (0: full fine-tuning)."""
    bindings = [f"TEMPERATURE = {TAU}", "create_mesh.num_devices = 1"]
    gin_registry.parse(
        [f"{imported}/{run_folders.MODEL_GIN}", "losses/samtone_query.gin"],
        bindings + ([f"DualEncoder.lora_rank = {rank}"] if rank else []),
    )
    model = gin_config.model()
    mesh = partitioning.create_mesh(devices=jax.devices()[:1])
    tx, schedule = optimizer.adamw(learning_rate=5e-4 if rank else 5e-5, train_steps=10_000)
    state = train.initial_state(model, tx, mesh, seed=0, init_checkpoint=imported)
    step = jax.jit(
        train.make_train_step(model, tx, schedule, mesh, None, gin_config.contrastive_loss, 8), donate_argnums=0
    )
    arrays = [partitioning.host_to_global(mesh, p) for p in packed]
    cost = step.lower(state, arrays[0]).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    for batch in arrays:  # compiles every row-count shape
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics["loss"])
    start = time.perf_counter()
    for _ in range(ARGS.repeats):
        for batch in arrays:
            state, metrics = step(state, batch)
    jax.block_until_ready(metrics["loss"])
    return (time.perf_counter() - start) / (ARGS.repeats * len(arrays)), cost


def main() -> None:
    from samtone_jax.data.packing import pack_batch
    from samtone_jax.training.train_batches import Packing

    imported = tempfile.mkdtemp(prefix="lora_step_bench_") + "/m"
    assert (
        cli.main(
            [
                "import-checkpoint",
                "--format=sentence-transformers",
                f"--checkpoint={minilm_folder()}",
                f"--out={imported}",
            ]
        )
        == 0
    )
    batches = real_batches(f"{imported}/{run_folders.TOKENIZER}", ARGS.batch, ARGS.batches)
    floor = Packing(max_segments=8).row_floor(types.SimpleNamespace(shape={"data": 1}), batches)
    packed = [pack_batch(b, 1, 8, min_rows=floor) for b in batches]
    print(
        f"CPU: {os.cpu_count()} cores, jax {jax.__version__}; all-MiniLM-L6-v2, dropout 0.1, AdamW; WordNet, "
        f"{ARGS.batches} packed batches x {ARGS.batch} pairs x {ARGS.repeats} passes"
    )
    print(f"{'arm':8s} {'s/step':>7s} {'pairs/s':>8s} {'vs full':>8s} {'GFLOP':>7s} {'GB accessed':>11s}")
    base = None
    for rank in [0, *ARGS.ranks]:
        seconds, cost = arm(imported, rank, packed)
        base = base or seconds
        name = f"lora{rank}" if rank else "full"
        flops, moved = cost.get("flops", 0) / 1e9, cost.get("bytes accessed", 0) / 1e9
        print(f"{name:8s} {seconds:7.3f} {ARGS.batch / seconds:8.1f} {seconds / base:7.2f}x {flops:7.1f} {moved:11.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    ARGS = parser.parse_args()
    main()
