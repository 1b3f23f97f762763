"""Embeddings on disk in shards that a killed job resumes from instead of recomputing.

    OUT/manifest.json                  rows, shard size, dimension-free fingerprint of what is encoded
    OUT/shard-00003-of-00042.npz       {embeddings [n, P] float32, ids [n] str} for rows [3·S, 4·S)
                                       (compressed, `samtone encode --precision`: int8 codes [n, P], or
                                       packed sign bits uint8 [n, ceil(P / 8)]; the manifest says which)

Shard i belongs to process i mod process_count, so every host of a pod encodes its own share
with its local devices (no cross-host traffic). Each shard is written to a temporary file and
renamed (on gs://, uploaded whole: see atomic_file.py): a shard file that exists is complete. A
rerun with the same manifest skips finished shards; a rerun over a different model, text set or
shard size refuses to mix them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable

import numpy as np

from samtone_jax.core import paths
from samtone_jax.core.atomic_file import atomic_open, write_atomic
from samtone_jax.core.console_progress import Progress
from samtone_jax.core.errors import BadValueError, MissingFileError

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"


def _shard_path(out_dir, index: int, count: int):
    return paths.as_path(out_dir) / f"shard-{index:05d}-of-{count:05d}.npz"


def texts_sha1(ids: list[str], texts: list[str]) -> str:
    """The manifest's fingerprint of what is encoded: (id, text) in order."""
    digest = hashlib.sha1()
    for i, t in zip(ids, texts, strict=True):
        digest.update(f"{i}\t{t}\n".encode())
    return digest.hexdigest()


def _manifest(ids: list[str], texts: list[str], shard_size: int, fingerprint: dict) -> dict:
    return {
        "rows": len(ids),
        "shard_size": shard_size,
        "shards": max(1, -(-len(ids) // shard_size)),
        "texts_sha1": texts_sha1(ids, texts),
        "fingerprint": fingerprint,
    }


def encode_to_shards(
    encode: Callable[[list[str]], np.ndarray],
    ids: list[str],
    texts: list[str],
    out_dir: str,
    *,
    shard_size: int = 65536,
    fingerprint: dict | None = None,
    stale: str = "refuse",
    process_index: int = 0,
    process_count: int = 1,
    description: str = "encoding",
) -> list[int]:
    """Encode this process's unfinished shards of `texts` (`encode(texts, progress)` -> [n, P]
    float32, calling progress(k) as k texts are done) into out_dir, with done / total, rate and ETA
    on the console (console_progress.py); returns the shard indices encoded now. `fingerprint`
    (model path, step, side, length…) must match the one a previous, interrupted run wrote, or
    ValueError. A folder holding shards of something else (another fingerprint, text set or shard
    size) is emptied and encoded again (`stale` 'recompute': a cache the command owns, with a
    warning naming what changed) or refused ('refuse': a folder the user named)."""
    if stale not in ("recompute", "refuse"):
        raise BadValueError(f"stale={stale!r}: choose 'recompute' or 'refuse'")
    if len(ids) != len(texts):
        raise BadValueError(f"{len(ids)} ids but {len(texts)} texts")
    if shard_size < 1:
        raise BadValueError(f"shard_size must be positive, got {shard_size}")
    manifest = _manifest(ids, texts, shard_size, fingerprint or {})
    path = paths.as_path(out_dir) / MANIFEST
    previous = json.loads(path.read_text()) if path.exists() else None
    # 0: no manifest yet, 1: this one, 2: another's: process 0 decides for every process
    decision = _agreed(0 if previous is None else 1 if previous == manifest else 2, process_count)
    if decision == 2:
        differ = _differences(previous or {}, manifest) or ["what process 0 read"]
        if stale == "refuse":
            raise BadValueError(
                f"{out_dir} holds embeddings of something else (differs in {', '.join(differ)}); "
                "remove the folder or choose another output"
            )
        if process_index == 0:
            log.warning("%s held embeddings of something else (%s): encoding again", out_dir, ", ".join(differ))
            _clear(out_dir)
    if decision != 1 and process_index == 0:
        write_atomic(path, json.dumps(manifest, indent=2, sort_keys=True))
    _barrier(process_count, f"manifest of {out_dir}")
    count = manifest["shards"]
    mine = [i for i in range(count) if i % process_count == process_index]
    todo = [i for i in mine if not _shard_path(out_dir, i, count).exists()]
    if len(todo) < len(mine):
        log.info(
            "%s: %d of this process's %d shards already in %s", description, len(mine) - len(todo), len(mine), out_dir
        )
    rows = sum(min(shard_size, len(ids) - i * shard_size) for i in todo)
    with Progress(rows, description, process_index=process_index) as progress:
        for i in todo:
            lo, hi = i * shard_size, min((i + 1) * shard_size, len(ids))
            embeddings = np.asarray(encode(texts[lo:hi], progress.update))
            if embeddings.dtype.kind == "f":  # float embeddings are kept as float32; codes as they are
                embeddings = embeddings.astype(np.float32)
            if len(embeddings) != hi - lo or not np.isfinite(embeddings).all():
                raise BadValueError(f"{description}: shard {i} has non-finite or missing embeddings; nothing written")
            with atomic_open(_shard_path(out_dir, i, count)) as f:
                np.savez(f, embeddings=embeddings, ids=np.asarray(ids[lo:hi], dtype=str))
    return todo


def _agreed(value: int, process_count: int) -> int:
    """Process 0's `value`, on every process (one process: `value`)."""
    import jax

    if process_count > 1 and jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return int(multihost_utils.broadcast_one_to_all(np.int32(value)))
    return value


def _barrier(process_count: int, name: str) -> None:
    import jax

    if process_count > 1 and jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _differences(previous: dict, manifest: dict) -> list[str]:
    """The manifest entries (and fingerprint entries) that differ, by name."""
    differ = [
        k for k in sorted(set(manifest) | set(previous)) if k != "fingerprint" and previous.get(k) != manifest.get(k)
    ]
    ours, theirs = manifest.get("fingerprint", {}), previous.get("fingerprint", {})
    differ += [k for k in sorted(set(ours) | set(theirs)) if ours.get(k) != theirs.get(k)]
    return differ


def _clear(out_dir) -> None:
    """Remove the manifest and shards of a stale encoding (nothing else in the folder)."""
    folder = paths.as_path(out_dir)
    for shard in folder.glob("shard-*.npz"):
        shard.unlink(missing_ok=True)
    (folder / MANIFEST).unlink(missing_ok=True)


def read_manifest(out_dir: str) -> dict:
    path = paths.as_path(out_dir) / MANIFEST
    if not path.exists():
        raise MissingFileError(f"{path} not found: {out_dir} is not an embedding folder (samtone encode writes one)")
    return json.loads(path.read_text())


def load_shards(out_dir: str) -> tuple[list[str], np.ndarray]:
    """(ids, embeddings [N, P] float32) in the original order; FileNotFoundError naming the missing
    shards when an encoding is incomplete."""
    manifest = read_manifest(out_dir)
    count = manifest["shards"]
    present = {p.name for p in paths.as_path(out_dir).glob("shard-*.npz")}  # one listing, not one request a shard
    missing = [i for i in range(count) if _shard_path(out_dir, i, count).name not in present]
    if missing:
        raise MissingFileError(
            f"{out_dir}: {len(missing)} of {count} shards missing (first: {missing[:5]}); the encoding is "
            "incomplete: rerun the same command to finish it"
        )
    stale = present - {_shard_path(out_dir, i, count).name for i in range(count)}
    if stale:
        raise BadValueError(f"{out_dir} has shard files of another shard layout: {sorted(stale)[:3]}")
    ids, parts = [], []
    for i in range(count):
        with _shard_path(out_dir, i, count).open("rb") as f, np.load(f) as shard:
            ids.extend(shard["ids"].tolist())
            parts.append(shard["embeddings"])
    if len(ids) != manifest["rows"]:
        raise BadValueError(f"{out_dir}: shards hold {len(ids)} rows, the manifest says {manifest['rows']}")
    return ids, np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)
