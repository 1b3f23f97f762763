"""The ('data', 'model') mesh, logical axis rules, and host <-> global array helpers, as in T5X.

Data parallelism over 'data' (the batch dimension), model parallelism over 'model' (heads,
mlp, vocab), chosen by gin `num_partitions`. With num_partitions = 1 the 'model' axis has size 1
and parameters are replicated: plain data parallelism, which the contrastive loss needs anyway
(its columns are all-gathered over 'data').
"""

from __future__ import annotations

import flax.linen as nn
import gin
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# T5X's standard 1-D model-parallel rules (t5x.partitioning.standard_logical_axis_rules).
DEFAULT_RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", "data"),
    ("vocab", "model"),
    ("embed", None),
    ("mlp", "model"),
    ("heads", "model"),
    ("kv", None),
    ("length", None),
    ("relpos_buckets", None),
    ("projection", None),
)


# FSDP (T5X's "2-D" layout): the `embed` dimension of every parameter is also split over 'data',
# so parameters, gradients and optimizer state take 1/devices of the memory; XLA all-gathers each
# weight where it is used (per layer) and reduce-scatters its gradient.
FSDP_RULES: tuple[tuple[str, str | None], ...] = tuple(
    (name, "data") if name == "embed" else (name, axis) for name, axis in DEFAULT_RULES
)


@gin.configurable
def logical_rules(fsdp: bool = False):
    """The logical -> mesh axis rules in use (gin `logical_rules.fsdp = True` for FSDP)."""
    return FSDP_RULES if fsdp else DEFAULT_RULES


@gin.configurable
def create_mesh(num_partitions: int = 1, devices=None) -> Mesh:
    """A ('data', 'model') mesh over all devices (of all processes); 'model' has num_partitions."""
    devices = np.asarray(jax.devices() if devices is None else devices)
    if num_partitions < 1 or devices.size % num_partitions:
        raise ValueError(
            f"create_mesh.num_partitions={num_partitions} must divide the {devices.size} devices (gin: num_partitions)"
        )
    grid = devices.reshape(devices.size // num_partitions, num_partitions)
    return Mesh(grid, ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def param_partition_specs(boxed_params, rules=None):
    """Mesh PartitionSpecs for a tree of logically-boxed parameters (from `init_params`); rules
    default to `logical_rules()` (gin)."""
    return nn.logical_to_mesh(nn.get_partition_spec(boxed_params), rules or logical_rules())


def param_shardings(mesh: Mesh, boxed_params, rules=None):
    specs = param_partition_specs(boxed_params, rules)
    return jax.tree_util.tree_map(
        lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, PartitionSpec)
    )


def init_on_mesh(init_fn, params, mesh: Mesh):
    """init_fn(params) (e.g. an optimizer's init) with every leaf laid out on `mesh`: leaves XLA left
    on one device (scalar step counts) are replicated, so a checkpoint of them restores on any
    topology (a single-device array would pin the restored state to device 0)."""
    replicated = NamedSharding(mesh, PartitionSpec())

    def place(x):
        on_mesh = isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh
        return x if on_mesh else jax.device_put(x, replicated)

    return jax.tree_util.tree_map(place, jax.jit(init_fn)(params))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) dimension over 'data', everything else replicated."""
    return NamedSharding(mesh, PartitionSpec("data"))


def host_to_global(mesh: Mesh, local_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """This host's rows -> global arrays sharded over 'data' (hosts contribute in process order)."""
    sharding = batch_sharding(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local_batch.items()}


__all__ = [
    "DEFAULT_RULES",
    "FSDP_RULES",
    "logical_rules",
    "PartitionSpec",
    "batch_sharding",
    "create_mesh",
    "host_to_global",
    "init_on_mesh",
    "param_partition_specs",
    "param_shardings",
]
