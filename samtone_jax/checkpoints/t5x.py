"""T5X checkpoints: a msgpack `checkpoint` file, with large arrays in tensorstore zarr folders.

T5X writes small arrays inline in the msgpack tree and replaces large ones by a tensorstore
spec (`{'driver': 'zarr', 'kvstore': {'path': <name relative to the checkpoint dir>}, ...}`);
the single-file form (everything inline) is read by the same code. Local paths and `gs://` (the
msgpack file through the path layer, the arrays through tensorstore's `gcs` kvstore).
t5x_retrieval dual-encoder checkpoints add `target/projection_layer/kernel`.
"""

from __future__ import annotations

import numpy as np
from flax import serialization

from samtone_jax.checkpoints.source import Source
from samtone_jax.core import paths
from samtone_jax.core.errors import MissingFileError
from samtone_jax.models import families


def _is_tensorstore_spec(node) -> bool:
    return isinstance(node, dict) and "driver" in node and "kvstore" in node


def _flatten(tree, prefix=""):
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and not _is_tensorstore_spec(value):
            yield from _flatten(value, name + "/")
        else:
            yield name, value


def _kvstore(directory: str, relative: str) -> dict:
    path = str(paths.as_path(directory) / relative)  # local: absolute, no `..` (tensorstore rejects it)
    if paths.is_remote(path):
        bucket, _, key = path[len("gs://") :].partition("/")
        return {"driver": "gcs", "bucket": bucket, "path": key}
    return {"driver": "file", "path": path}


def _read_tensorstore(directory: str, spec: dict) -> np.ndarray:
    import tensorstore as ts

    kvstore = spec["kvstore"]
    relative = kvstore["path"] if isinstance(kvstore, dict) else kvstore
    full = {"driver": spec["driver"], "kvstore": _kvstore(directory, relative)}
    try:
        # read-only, in a context of its own: no cache pool or file handles shared with other stores
        return np.asarray(ts.open(full, read=True, context=ts.Context()).result().read().result())
    except Exception as e:  # tensorstore raises ValueError subclasses with terse messages
        raise MissingFileError(f"T5X array {relative!r} could not be read from {full['kvstore']}: {e}") from e


def read_tree(path: str) -> tuple[str, dict[str, object]]:
    """(checkpoint directory, {'target/encoder/...': ndarray or tensorstore spec}) of a T5X checkpoint."""
    path = paths.as_path(path)
    file = path / "checkpoint" if path.is_dir() else path
    if not file.exists():
        raise MissingFileError(
            f"{file} not found: expected a T5X checkpoint directory (checkpoint_N/ with a msgpack "
            "`checkpoint` file) or a single-file msgpack checkpoint"
        )
    tree = serialization.msgpack_restore(file.read_bytes())
    root = tree.get("optimizer", tree)  # {'optimizer': {'target': ..., 'state': ...}, 'version': n}
    return str(file.parent), dict(_flatten(root))


def open_source(path: str, config=None) -> Source:
    directory, flat = read_tree(path)

    def read(name):
        value = flat[name]
        return _read_tensorstore(directory, value) if _is_tensorstore_spec(value) else np.asarray(value)

    def shape(name):
        value = flat[name]
        return tuple(value["metadata"]["shape"]) if _is_tensorstore_spec(value) else np.shape(value)

    def locate(p):
        leaf = "/".join(p)
        if p[0] == "token_embedder":
            return ["target/token_embedder/embedding"], False
        if p[-1] in ("query", "key", "value", "out") or p[1:2] == ("mlp",):
            leaf += "/kernel"
        return [f"target/encoder/{leaf}"], False

    return Source(
        description=f"T5X checkpoint {path}",
        config_name=families.T5.gin_name,
        shape_hints=families.T5.shape_hints,
        mlp_hint=families.T5.mlp_hint,
        names=list(flat),
        read=read,
        shape=shape,
        locate=locate,
        is_encoder_variable=lambda n: n.startswith("target/encoder/"),
        projection_name="target/projection_layer/kernel",
    )
