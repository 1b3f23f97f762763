"""Per-device memory of the T5.1.1-XXL training step on a v4-64-shaped mesh, computed without
allocating anything: abstract parameters and batch (jax.ShapeDtypeStruct with shardings), the
step lowered and compiled for 32 simulated devices (v4-64 = 32 chips), memory read from XLA's
compiled memory analysis. With and without FSDP (gin logical_rules.fsdp); SDE, ADE or ADE-SPL, and
with LoRA (--lora_rank: sde with one adapter, ade_lora with one per side over one frozen tower).

  .venv/bin/python benchmarks/xxl_memory.py [--devices 32] [--batch 512] [--length 64] [--grad_cache 0]
      [--remat] [--scan] [--layouts replicated fsdp] [--architectures sde ade ade_lora] [--lora_rank 8]

The numbers are XLA:CPU's buffer assignment for the partitioned program: arguments (parameters,
optimizer state, batch), outputs and temporaries per device. TPU's compiler fuses and rematerialises
differently; read them as the layout's footprint (what FSDP divides), not a TPU HBM prediction.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

DEVICES = int(sys.argv[sys.argv.index("--devices") + 1]) if "--devices" in sys.argv else 32
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from samtone_jax.cli import gin_registry  # noqa: E402
from samtone_jax.config import gin_config  # noqa: E402
from samtone_jax.models import init_params, partitioning  # noqa: E402
from samtone_jax.training import optimizer, train  # noqa: E402

GiB = 1024**3


def report(fsdp: bool, architecture: str, args) -> dict:
    """Memory of one layout; `architecture` 'sde_lora' is sde with a LoRA adapter, 'ade_lora' one
    frozen tower with an adapter per side (both rank args.lora_rank)."""
    lora = architecture.endswith("lora")
    gin_registry.parse(
        ["models/t5_1_1_xxl.gin", "architectures/sde.gin", "losses/samtone_query.gin"],
        [
            "ACTIVATION_DTYPE = 'bfloat16'",
            f"logical_rules.fsdp = {fsdp}",
            f"T5Config.remat = {args.remat}",
            f"T5Config.scan_layers = {args.scan}",
            f"DualEncoder.architecture = {'sde' if architecture == 'sde_lora' else architecture!r}",
            f"DualEncoder.lora_rank = {args.lora_rank if lora else 0}",
        ],
    )
    model = gin_config.model()
    mesh = partitioning.create_mesh()
    boxed = jax.eval_shape(lambda: init_params(model, jax.random.PRNGKey(0)))
    shardings = partitioning.param_shardings(mesh, boxed)
    import flax.linen as nn

    params = jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), nn.unbox(boxed), shardings
    )
    if args.optimizer == "adafactor":
        tx, schedule = optimizer.adafactor(train_steps=20000, adapters=lora)
    else:
        tx, schedule = optimizer.adamw(train_steps=20000)
    replicated = NamedSharding(mesh, P())
    trained, frozen = train.split_trained(model, params)  # LoRA: no optimizer state for the frozen tower
    opt_state = jax.tree_util.tree_map(  # laid out as training lays it out
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        jax.eval_shape(tx.init, trained),
        partitioning.optimizer_state_shardings(tx, trained, mesh),
    )
    state = {
        "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
        "params": trained,
        "opt_state": opt_state,
        "rng": jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated),
    }
    if frozen:
        state["frozen"] = frozen
    rows = NamedSharding(mesh, P("data"))
    batch = {
        k: jax.ShapeDtypeStruct((args.batch, args.length), jnp.int32, sharding=rows)
        for k in ("query_tokens", "doc_tokens")
    }
    start = time.time()
    step = jax.jit(
        train.make_train_step(model, tx, schedule, mesh, args.grad_cache or None, gin_config.contrastive_loss)
    )
    with partitioning.activation_sharding(mesh):
        compiled = step.lower(state, batch).compile()
    memory = compiled.memory_analysis()
    n = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
    size = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))  # noqa: E731
    return {
        "parameters": n,
        "trained": sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(trained)),
        "optimizer_gib": size(opt_state) / GiB,  # the whole state (all devices' shards)
        "arguments_gib": memory.argument_size_in_bytes / GiB,
        "outputs_gib": memory.output_size_in_bytes / GiB,
        "temp_gib": memory.temp_size_in_bytes / GiB,
        "aliased_gib": memory.alias_size_in_bytes / GiB,
        "compile_s": time.time() - start,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=32)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--grad_cache", type=int, default=0, help="GradCache chunk (0: off)")
    parser.add_argument("--remat", action="store_true", help="T5Config.remat: rematerialise each layer")
    parser.add_argument("--scan", action="store_true", help="T5Config.scan_layers: the layers as one lax.scan")
    parser.add_argument("--layouts", nargs="+", default=["replicated", "fsdp"], choices=["replicated", "fsdp"])
    parser.add_argument(
        "--architectures", nargs="+", default=["sde"], choices=["sde", "ade", "ade_spl", "sde_lora", "ade_lora"]
    )
    parser.add_argument("--lora_rank", type=int, default=8, help="rank of the *_lora rows")
    parser.add_argument("--optimizer", default="adafactor", choices=["adafactor", "adamw"])
    args = parser.parse_args()
    print(
        f"T5.1.1-XXL, {args.optimizer}, batch {args.batch} x {args.length} tokens, {jax.device_count()} devices "
        f"(mesh data={jax.device_count()}), GradCache chunk {args.grad_cache or 'off'}, remat {args.remat}, "
        f"scan {args.scan}; "
        "per device:"
    )
    print(
        f"{'layout':>10s} {'model':>9s} {'params':>14s} {'trained':>14s} {'opt state':>10s} {'arguments':>10s} "
        f"{'outputs':>10s} {'temp':>10s} {'compile':>8s}"
    )
    for architecture in args.architectures:
        for fsdp in [layout == "fsdp" for layout in args.layouts]:
            r = report(fsdp, architecture, args)
            print(
                f"{'FSDP' if fsdp else 'replicated':>10s} {architecture:>9s} {r['parameters']:14,d} "
                f"{r['trained']:14,d} {r['optimizer_gib']:9.3f}G {r['arguments_gib']:9.2f}G "
                f"{r['outputs_gib']:9.2f}G {r['temp_gib']:9.2f}G "
                f"{r['compile_s']:7.0f}s",
                flush=True,
            )


if __name__ == "__main__":
    main()
