"""LoRA (Hu et al. 2021) on a tower's attention and MLP projections: W x becomes W x + s · B A x, the
base W frozen, the low-rank factors trained (A [in, r] drawn like T5X's kernels, B [r, out] zeros, so
an adapted model embeds exactly as its base until training moves B; s = alpha / rank).

The factors are applied to the activations, not merged into W for every step: the step's gradient
is then taken only with respect to the factors (and the projection), so XLA computes no gradient,
optimizer state or gradient all-reduce for the base (train.py differentiates the trainable keys only).

Where the adapters live (models/layout.py): one top-level key per adapter, beside the base tower,
mirroring the tower's module path of each adapted kernel:
  sde      {encoder, adapter, projection}: one adapter for both sides;
  ade_lora {encoder, query_adapter, document_adapter, projection}: one frozen base, one adapter per
           side and a shared projection (an asymmetric dual encoder at the memory of a shared one).
`merge` folds the adapters into plain weights (sde -> sde, ade_lora -> ade_spl), for export and load.

gin: DualEncoder.lora_rank (0: no LoRA), lora_alpha (None: = rank), lora_targets (kernel names or the
groups 'attention' = query/key/value/out and 'mlp' = wi/wo, with the names a family adds: T5's wi_0 /
wi_1, ModernBERT's qkv; each family lists its own in TowerFamily.lora_kernels), lora_layers (None: all).
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from samtone_jax.core.errors import BadValueError
from samtone_jax.models.layout import LAYOUTS, SIDES, layout

GROUPS = ("attention", "mlp")


def _kernels(config=None) -> dict[str, tuple[str, int]]:
    """The adaptable kernels (name -> (group, input dimensions)) a family declares
    (TowerFamily.lora_kernels): of `config`'s family, or of every family (None)."""
    from samtone_jax.models import families

    if config is not None:
        return families.of(config).lora_kernels
    return {name: spec for family in families.FAMILIES for name, spec in family.lora_kernels.items()}


@dataclasses.dataclass(frozen=True)
class Lora:
    """Which kernels carry low-rank factors, of what rank, scaled by alpha / rank."""

    rank: int
    alpha: float | None = None
    targets: tuple[str, ...] = GROUPS
    layers: tuple[int, ...] | None = None

    def __post_init__(self):
        object.__setattr__(self, "targets", tuple(self.targets))
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(int(i) for i in self.layers))
        if not isinstance(self.rank, (int, np.integer)) or self.rank <= 0:
            raise BadValueError(f"DualEncoder.lora_rank must be a positive integer, got {self.rank!r}")
        if self.alpha is not None and not self.alpha > 0:
            raise BadValueError(f"DualEncoder.lora_alpha must be > 0 (or None: = lora_rank), got {self.alpha!r}")
        kernels = _kernels()
        unknown = [t for t in self.targets if t not in GROUPS and t not in kernels]
        if not self.targets or unknown:
            raise BadValueError(
                f"DualEncoder.lora_targets={self.targets!r}: each must be a group {GROUPS} or a kernel {tuple(kernels)}"
            )

    @property
    def scale(self) -> float:
        return (self.alpha if self.alpha is not None else self.rank) / self.rank

    def adapts(self, kernel: str, group: str, layer: int) -> bool:
        in_layers = self.layers is None or layer in self.layers
        return in_layers and (kernel in self.targets or group in self.targets)


def _kernel_name(leaf: str, kernels) -> str | None:
    """The adaptable kernel a parameter name is ('query' for T5's query, BERT's query_kernel), else None."""
    name = leaf[: -len("_kernel")] if leaf.endswith("_kernel") else leaf
    return name if name in kernels and (name == leaf or leaf.endswith("_kernel")) else None


@dataclasses.dataclass(frozen=True)
class Factor:
    """One adapted kernel: its path in the tower (layers_<i>, module, kernel name), and its input and
    output shapes and logical axes."""

    path: tuple[str, ...]
    leaf: str  # the base parameter's own name (BERT: <name>_kernel)
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    in_axes: tuple[str | None, ...]
    out_axes: tuple[str | None, ...]

    @property
    def name(self) -> str:
        """Its key in the adapter's parameters ('layers_0.attention.query')."""
        return ".".join(self.path)


@functools.cache
def factors(tower_cls, config, lora: Lora) -> tuple[Factor, ...]:
    """The kernels of a `tower_cls(config)` tower that `lora` adapts, read from its parameter shapes."""
    boxed = jax.eval_shape(lambda: tower_cls(config).init(jax.random.PRNGKey(0), jnp.ones((1, 2), jnp.int32)))
    found, kernels = [], _kernels(config)
    for path, leaf in jax.tree_util.tree_flatten_with_path(boxed["params"], is_leaf=_is_box)[0]:
        keys = tuple(p.key for p in path)
        kernel = _kernel_name(keys[-1], kernels)
        if kernel is None or not keys[0].startswith("layers_"):
            continue
        group, n = kernels[kernel]
        if not lora.adapts(kernel, group, int(keys[0].split("_")[1])):
            continue
        shape, names = tuple(leaf.value.shape), tuple(leaf.names)
        found.append(Factor(keys[:-1] + (kernel,), keys[-1], shape[:n], shape[n:], names[:n], names[n:]))
    if not found:
        raise BadValueError(
            f"DualEncoder.lora_targets={lora.targets!r} with lora_layers={lora.layers!r} adapt no kernel of the "
            f"{config.num_layers}-layer tower (layers are numbered from 0)"
        )
    if getattr(config, "scan_layers", False) and lora.layers is not None:
        adapted = {f.path[0] for f in found}
        if len(adapted) != config.num_layers:
            raise BadValueError(
                "scan_layers runs every layer as one program: DualEncoder.lora_layers must be None (all layers) "
                "with T5Config/BertConfig.scan_layers = True"
            )
    return tuple(found)


def _is_box(x) -> bool:
    return isinstance(x, nn.Partitioned)


class _Factors(nn.Module):
    """The low-rank factors of one kernel: a [*in, r] (fan-in initialised) and b [r, *out] (zeros)."""

    factor: Factor
    rank: int
    scale: float
    param_dtype: str

    @nn.compact
    def __call__(self):
        f, dtype = self.factor, jnp.dtype(self.param_dtype)
        init = nn.initializers.variance_scaling(
            1.0, "fan_in", "truncated_normal", in_axis=tuple(range(len(f.in_shape)))
        )
        a = self.param("a", nn.with_logical_partitioning(init, f.in_axes + (None,)), f.in_shape + (self.rank,), dtype)
        b = self.param(
            "b",
            nn.with_logical_partitioning(nn.initializers.zeros, (None,) + f.out_axes),
            (self.rank,) + f.out_shape,
            dtype,
        )
        return {"a": a, "b": b * jnp.asarray(self.scale, b.dtype)}


class Adapter(nn.Module):
    """One adapter of a tower: () -> a tree mirroring the tower's modules, {..., kernel: {a, b}} per
    adapted kernel (b already scaled by alpha / rank), which the tower's dense layers add."""

    factors: tuple[Factor, ...]
    rank: int
    scale: float
    param_dtype: str = "float32"

    @nn.compact
    def __call__(self):
        tree: dict = {}
        for f in self.factors:
            node = tree
            for key in f.path[:-1]:
                node = node.setdefault(key, {})
            node[f.path[-1]] = _Factors(f, self.rank, self.scale, self.param_dtype, name=f.name)()
        return tree


def frozen_keys(model) -> tuple[str, ...]:
    """The top-level parameter keys LoRA freezes: the towers (none without LoRA)."""
    return layout(model.architecture).tower_keys() if model.lora_rank else ()


def trainable_keys(model, params) -> tuple[str, ...]:
    """The top-level parameter keys a step trains: all of them, or under LoRA all but the frozen towers."""
    return tuple(k for k in params if k not in frozen_keys(model))


def merge(model, params, adapter_scale: float = 1.0):
    """(model, params) -> the same encoder without adapters: each adapted kernel W becomes
    W + γ·s·A·B (float32, then W's dtype), γ = `adapter_scale` (1: the run as trained; between 0 and 1
    the adapters' update scaled back towards the frozen base, WiSE-FT's idea for adapters; the
    parameters trained in full, such as the projection, stay the run's). sde -> sde; ade_lora -> ade_spl
    (the base copied into two towers, each with its side's adapter). Without LoRA, (model, params)
    unchanged (a scale other than 1 refused: there is nothing to scale)."""
    finite = isinstance(adapter_scale, (int, float)) and 0 <= adapter_scale < float("inf")
    if isinstance(adapter_scale, bool) or not finite:
        raise BadValueError(
            f"--adapter_scale must be a finite number >= 0 (1: the adapters as trained); got {adapter_scale!r}"
        )
    lora = model.lora
    if lora is None:
        if adapter_scale != 1:
            raise BadValueError(f"--adapter_scale={adapter_scale:g}: the model has no LoRA adapters to scale")
        return model, params
    tree = layout(model.architecture)
    found = factors(model.tower_class, model.config, lora)
    plain = LAYOUTS[tree.merged]
    merged = {k: v for k, v in params.items() if k not in tree.tower_keys() + tree.adapter_keys()}
    for side in SIDES:
        key = plain.towers[side]
        if key not in merged:
            merged[key] = merge_tower(
                params[tree.towers[side]], params[tree.adapters[side]], found, lora, adapter_scale
            )
    return model.clone(architecture=plain.architecture, lora_rank=0, parent=None), merged


def merge_tower(tower, adapter, found: tuple[Factor, ...], lora: Lora, adapter_scale: float = 1.0):
    """A tower's parameters with the adapter's factors, times `adapter_scale`, folded into their
    kernels (a new tree)."""
    out = _copy(tower)
    for f in found:
        node = out
        for key in f.path[:-1]:
            node = node[key]
        kernel = node[f.leaf]
        a = jnp.asarray(adapter[f.name]["a"], jnp.float32).reshape(-1, lora.rank)
        b = jnp.asarray(adapter[f.name]["b"], jnp.float32).reshape(lora.rank, -1)
        delta = jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST).reshape(kernel.shape) * (lora.scale * adapter_scale)
        node[f.leaf] = (jnp.asarray(kernel, jnp.float32) + delta).astype(kernel.dtype)
    return out


def _copy(tree):
    return {k: _copy(v) for k, v in tree.items()} if isinstance(tree, dict) else tree


def base_model(model):
    """The plain model whose parameters a LoRA model's frozen part is (its tower and projection: an
    sde's, for both LoRA layouts): what an INIT_CHECKPOINT for it holds."""
    return model.clone(architecture="sde", lora_rank=0, parent=None) if model.lora_rank else model


def adapter_keys(model) -> tuple[str, ...]:
    return layout(model.architecture).adapter_keys() if model.lora_rank else ()
