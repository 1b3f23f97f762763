"""Mapping an encoder of any tower family from a foreign checkpoint's variable names onto our
parameter tree.

Each format (Hugging Face, T5X, Mesh-TF) is a `Source`: the names it holds, a lazy reader, and
`locate(path)`, which gives the candidate source names for one of our tower parameters and
whether the source stores it transposed. `tower_from_source` walks our tower's abstract tree
and fills it, checking every shape, so a wrong gin config fails with the variable, both shapes
and the gin setting to change, instead of a silent reshape.

Our tower tree (T5Encoder): token_embedder [V, D]; relpos_bias/rel_embedding [H, buckets];
layers_i/{pre_attention_layer_norm,pre_mlp_layer_norm}/scale [D];
layers_i/attention/{query,key,value} [D, H, K], layers_i/attention/out [H, K, D];
layers_i/mlp/{wi | wi_0, wi_1} [D, F], layers_i/mlp/wo [F, D]; encoder_norm/scale [D].
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Sequence

import numpy as np

from samtone_jax.core.errors import CheckpointMismatchError

log = logging.getLogger(__name__)

Path = tuple[str, ...]


@dataclasses.dataclass
class Source:
    """A checkpoint's variables: `names`, a lazy `read(name)`, and the format's naming rules."""

    description: str
    names: Sequence[str]
    read: Callable[[str], np.ndarray]
    shape: Callable[[str], tuple[int, ...]]
    # (our tower path) -> (candidate source names, stored transposed?)
    locate: Callable[[Path], tuple[Sequence[str], bool]]
    # Source names that belong to the encoder (an unused one of these means a config mismatch).
    is_encoder_variable: Callable[[str], bool]
    projection_name: str | None = None
    config_name: str = "T5Config"  # the gin configurable of the tower's shape (named in errors)
    shape_hints: dict[str, str] = dataclasses.field(default_factory=dict)  # tower leaf -> gin settings to change
    mlp_hint: str = ""  # the gin setting of the MLP's form, named when encoder variables are left over

    def __post_init__(self):
        self.name_set = frozenset(self.names)


def _stored_shape(path: Path, shape: tuple[int, ...], transposed: bool) -> tuple[int, ...]:
    """The shape a checkpoint stores for our parameter (attention heads flattened)."""
    if len(shape) == 2 and path[-1].endswith("_bias"):  # a per-head bias [H, K] (BERT)
        return (shape[0] * shape[1],)
    if len(shape) == 3:  # [D, H, K] or, for the output projection, [H, K, D]
        out = path[-1] in ("out", "out_kernel")
        shape = (shape[0] * shape[1], shape[2]) if out else (shape[0], shape[1] * shape[2])
    return tuple(reversed(shape)) if transposed else tuple(shape)


def _missing_hint(path: Path, source: Source) -> str:
    leaf = path[-1]
    names = " ".join(source.names)
    if leaf in ("wi_0", "wi_1") and re.search(r"\bwi\b|[./]wi[./]", names):
        return "the source has a single `wi` (T5 1.0 ReLU MLP): set T5Config.mlp_activations = ('relu',)"
    if leaf == "wi" and "wi_0" in names:
        return "the source has gated `wi_0`/`wi_1` (T5.1.1): set T5Config.mlp_activations = ('gelu', 'linear')"
    m = re.fullmatch(r"layers_(\d+)", path[0])
    if m:
        return f"the source has fewer than {int(m.group(1)) + 1} encoder layers: lower {source.config_name}.num_layers"
    return "check that --format matches the checkpoint"


def _fetch(source: Source, path: Path, target_shape: tuple[int, ...], dtype) -> tuple[np.ndarray, str]:
    candidates, transposed = source.locate(path)
    name = next((c for c in candidates if c in source.name_set), None)
    if name is None:
        raise CheckpointMismatchError(
            f"{source.description}: no variable for parameter {'/'.join(path)} (looked for "
            f"{', '.join(repr(c) for c in candidates)}); {_missing_hint(path, source)}"
        )
    expected = _stored_shape(path, target_shape, transposed)
    got = tuple(source.shape(name))
    if got != expected:
        hint = source.shape_hints.get(path[-1], source.config_name)
        raise CheckpointMismatchError(
            f"{source.description}: variable {name!r} has shape {got}, but the model's "
            f"{'/'.join(path)} {tuple(target_shape)} needs {expected} as stored there; "
            f"set {hint} in the gin file to match the checkpoint"
        )
    value = np.asarray(source.read(name))
    if transposed:
        value = value.T
    return value.reshape(target_shape).astype(dtype), name


def _flatten(tree, prefix: Path = ()) -> dict[Path, object]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, prefix + (key,)))
        else:
            out[prefix + (key,)] = value
    return out


def _unflatten(flat: dict[Path, np.ndarray]) -> dict:
    tree: dict = {}
    for path, value in flat.items():
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return tree


def tower_from_source(source: Source, abstract_tower: dict) -> tuple[dict, set[str]]:
    """Fill our tower tree (`abstract_tower`: leaves with .shape/.dtype) from `source`.

    Returns (tower params as numpy arrays, the set of source names used).
    """
    flat, used = {}, set()
    for path, leaf in _flatten(abstract_tower).items():
        flat[path], name = _fetch(source, path, tuple(leaf.shape), leaf.dtype)
        used.add(name)
    return _unflatten(flat), used


def report_unused(source: Source, used: set[str]) -> None:
    """Error on unused encoder variables (config too small); log the rest (decoder, optimizer) at INFO."""
    unused = sorted(n for n in source.names if n not in used)
    encoder_unused = [n for n in unused if source.is_encoder_variable(n)]
    if encoder_unused:
        raise CheckpointMismatchError(
            f"{source.description}: {len(encoder_unused)} encoder variable(s) would be dropped, e.g. "
            f"{encoder_unused[:5]}; the checkpoint has more encoder layers than {source.config_name}.num_layers "
            f"(or a different MLP: check {source.config_name}.num_layers and its MLP settings"
            f"{', ' + source.mlp_hint if source.mlp_hint else ''})"
        )
    if unused:
        log.info("%s: %d variables not used by the encoder: %s", source.description, len(unused), unused)
