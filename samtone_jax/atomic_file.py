"""Files and folders that are either complete or absent: write a temporary sibling, then rename it.

Every output a killed job could leave half-written (vocabularies, embedding shards, eval JSON,
TREC runs, figures, reports) goes through `atomic_open`, so a reader never sees a partial file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "wb"):
    """Open a temporary file next to `path` for writing; on success rename it to `path`, on any
    exception remove it. Created with open(..., 'x'), so the umask (not mkstemp's 0600) sets the mode."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode 'w' or 'wb', got {mode!r}")
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, mode.replace("w", "x")) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_atomic(path: str, data: bytes | str) -> str:
    """Write `data` to `path` atomically; returns `path`."""
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    return path


@contextlib.contextmanager
def atomic_directory(path: str, overwrite: bool = False):
    """Yield a temporary sibling folder to fill; on success it replaces `path` (removed first when
    `overwrite`), on any exception it is deleted. FileExistsError when `path` exists and not overwrite."""
    path = os.path.abspath(path)
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"{path} already exists; choose another destination or remove it first (--overwrite)")
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    os.makedirs(tmp)
    try:
        yield tmp
        if os.path.exists(path):
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
