"""Logical axis names -> mesh axes, as in T5X (data parallel over 'data', model parallel over 'model').

Every parameter is created with logical names (see models/t5.py); these rules turn them into
`PartitionSpec`s on a ('data', 'model') mesh. With `num_partitions=1` the 'model' axis has
size 1 and everything is replicated, which is plain data parallelism.
"""

from __future__ import annotations

import flax.linen as nn
from jax.sharding import PartitionSpec

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


def param_partition_specs(boxed_params, rules=DEFAULT_RULES):
    """Mesh PartitionSpecs for a tree of logically-boxed parameters (from `init_params`)."""
    logical = nn.get_partition_spec(boxed_params)
    return nn.logical_to_mesh(logical, rules)


__all__ = ["DEFAULT_RULES", "PartitionSpec", "param_partition_specs"]
