"""The ('data', 'model') mesh, logical axis rules, and host <-> global array helpers, as in T5X.

Data parallelism over 'data' (the batch dimension), model parallelism over 'model' (heads,
mlp, vocab), chosen by gin `num_partitions`. With num_partitions = 1 the 'model' axis has size 1
and parameters are replicated: plain data parallelism, which the contrastive loss needs anyway
(its columns are all-gathered over 'data').
"""

from __future__ import annotations

import contextlib

import flax.linen as nn
import gin
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from samtone_jax.core.errors import BadValueError

# T5X's standard 1-D model-parallel rules (t5x.partitioning.standard_logical_axis_rules).
DEFAULT_RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", "data"),
    ("vocab", "model"),
    ("embed", None),
    ("mlp", "model"),
    ("heads", "model"),
    ("kv", None),
    ("activation_embed", None),
    ("length", None),
    ("relpos_buckets", None),
    ("positions", None),
    ("token_types", None),
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
def create_mesh(num_partitions: int = 1, devices=None, num_devices: int | None = None) -> Mesh:
    """A ('data', 'model') mesh over all devices (of all processes), or over `devices`; 'model' has
    num_partitions. `num_devices` N (gin create_mesh.num_devices) keeps only the first N of them: a
    debugging run, or a test, on one device of a multi-device host. A mesh that spans processes
    needs all their devices (a device left out would never join the collectives)."""
    devices = np.asarray(jax.devices() if devices is None else devices)
    if num_devices is not None and num_devices != devices.size:
        if not 1 <= num_devices <= devices.size:
            raise BadValueError(
                f"create_mesh.num_devices={num_devices} must be between 1 and the {devices.size} devices there are"
            )
        processes = {d.process_index for d in devices.flat}
        if len(processes) > 1:
            raise BadValueError(
                f"create_mesh.num_devices={num_devices} would leave devices of some of the {len(processes)} "
                f"processes out of their shared mesh of {devices.size}: unset it on a multi-process run"
            )
        devices = devices[:num_devices]
    if num_partitions < 1 or devices.size % num_partitions:
        raise BadValueError(
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


class activation_sharding(contextlib.ContextDecorator):  # noqa: N801 (used like a function)
    """Trace the model with its activation constraints live (`rules`, default the gin-configured
    ones, and `mesh`).
    jax.set_mesh must be entered outside jit: wrap the calls that trace the train step. Reusable."""

    def __init__(self, mesh: Mesh, rules=None):
        self.mesh, self.rules, self._stack = mesh, rules, None

    def __enter__(self):
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(jax.set_mesh(self.mesh))
        self._stack.enter_context(nn.logical_axis_rules(self.rules or logical_rules()))
        return self

    def __exit__(self, *exc):
        return self._stack.__exit__(*exc)


def optimizer_state_shardings(tx, params, mesh: Mesh):
    """Shardings for tx.init(params): a statistic shaped like a parameter (Adafactor's unfactored
    second moment, momenta) takes that parameter's sharding (so FSDP divides it too); everything else
    (factored row / column statistics, step counts) is replicated over the mesh. Matched by shape,
    so it works through any optax wrapper (multi_transform, masked, ...). `params`: arrays or
    ShapeDtypeStructs carrying shardings."""
    replicated = NamedSharding(mesh, PartitionSpec())
    by_shape = {}
    for leaf in jax.tree_util.tree_leaves(params):
        by_shape.setdefault(tuple(leaf.shape), leaf.sharding)
    return jax.tree_util.tree_map(
        lambda stat: by_shape.get(tuple(stat.shape), replicated) if stat.ndim else replicated,
        jax.eval_shape(tx.init, params),
    )


def init_optimizer_state(tx, params, mesh: Mesh):
    """tx.init(params) created directly in its sharded layout (never whole on one device), so a
    checkpoint of it also restores on any topology."""
    return jax.jit(tx.init, out_shardings=optimizer_state_shardings(tx, params, mesh))(params)


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
    "activation_sharding",
    "batch_sharding",
    "create_mesh",
    "host_to_global",
    "init_optimizer_state",
    "optimizer_state_shardings",
    "param_partition_specs",
    "param_shardings",
]
