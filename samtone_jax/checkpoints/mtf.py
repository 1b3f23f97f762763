"""Mesh-TensorFlow T5 / T5.1.1 checkpoints (the original release format), read with tf.train.

Variables are named `encoder/block_000/layer_000/SelfAttention/q` ..., kernels stored [in, out];
the shared relative-position bias lives in block 0 only (`relative_attention_type='bias_shared'`).
Norms are `rms_norm/scale` in T5.1.1 checkpoints and `layer_norm/scale` in older ones. Adafactor
slot variables (`*_slot_v`, `*_slot_vc`, `*_slot_vr`) and the decoder are ignored.

TensorFlow's reader opens gs:// only through TensorFlow's own GCS client, so a gs:// checkpoint's
files (the prefix's `.index` and `.data-*` shards) are first copied to local disk through the path
layer; only that step is read, never the folder's other checkpoints.
"""

from __future__ import annotations

import re
import tempfile

from samtone_jax.checkpoints.source import Source
from samtone_jax.core import paths
from samtone_jax.core.errors import MissingFileError
from samtone_jax.models import families

_SLOT = re.compile(r"_slot_v[rc]?$")


def _norm(prefix: str) -> list[str]:
    return [f"{prefix}/rms_norm/scale", f"{prefix}/layer_norm/scale"]


def _locate(path):
    first = path[0]
    if first == "token_embedder":
        return ["shared/embedding"], False
    if first == "relpos_bias":
        return ["encoder/block_000/layer_000/SelfAttention/relative_attention_bias"], False
    if first == "encoder_norm":
        return [*_norm("encoder"), "encoder/final_layer_norm/scale"], False
    block = f"encoder/block_{int(first.split('_')[1]):03d}"
    if path[1] == "pre_attention_layer_norm":
        return _norm(f"{block}/layer_000"), False
    if path[1] == "pre_mlp_layer_norm":
        return _norm(f"{block}/layer_001"), False
    if path[1] == "attention":
        letter = {"query": "q", "key": "k", "value": "v", "out": "o"}[path[2]]
        return [f"{block}/layer_000/SelfAttention/{letter}"], False
    return [f"{block}/layer_001/DenseReluDense/{path[2]}/kernel"], False


def _local_prefix(path: str) -> str:
    """The TF checkpoint prefix to read: `path` itself when local, else a local copy of its files."""
    prefix = paths.as_path(path)
    if not paths.is_remote(prefix):
        return str(prefix)
    if prefix.is_dir():  # a model dir: its `checkpoint` file names the latest prefix
        state = prefix / "checkpoint"
        found = re.search(r'model_checkpoint_path:\s*"([^"]+)"', state.read_text()) if state.exists() else None
        if not found:
            raise MissingFileError(f"{path}: no `checkpoint` file naming a model_checkpoint_path; pass the prefix")
        named = found.group(1)  # relative, or absolute as TF1 / Estimator often write it
        prefix = paths.as_path(named) if paths.is_remote(named) or named.startswith("/") else prefix / named
    if prefix.name.endswith(".index"):
        prefix = prefix.parent / prefix.name[: -len(".index")]
    files = [
        f
        for f in prefix.parent.glob(prefix.name + ".*")
        if f.name == prefix.name + ".index" or f.name.startswith(prefix.name + ".data-")
    ]
    if not files:
        raise MissingFileError(f"{path}: no {prefix.name}.index / .data-* files in {prefix.parent}")
    local = tempfile.mkdtemp(prefix="samtone_jax-mtf-")
    for f in files:
        paths.download(f, local)
    return str(paths.as_path(local) / prefix.name)


def open_source(path: str, config=None) -> Source:
    from samtone_jax.core.tensorflow_setup import tf

    path = _local_prefix(path)
    try:
        reader = tf.train.load_checkpoint(path)
    except (ValueError, tf.errors.NotFoundError) as e:
        raise MissingFileError(f"{path}: not a readable TF checkpoint (prefix or directory): {e}") from e
    shapes = reader.get_variable_to_shape_map()
    return Source(
        description=f"Mesh-TF checkpoint {path}",
        config_name=families.T5.gin_name,
        shape_hints=families.T5.shape_hints,
        mlp_hint=families.T5.mlp_hint,
        names=sorted(shapes),
        read=reader.get_tensor,
        shape=lambda n: tuple(shapes[n]),
        locate=_locate,
        is_encoder_variable=lambda n: n.startswith("encoder/") and not _SLOT.search(n),
    )
