"""The CPU kernel of exact search's running top-k (native/top_k_merge.cc), as an XLA FFI custom call.

XLA:CPU lowers `lax.top_k` to a single-threaded sort-like custom call (1.5–5 ns per element), which
made selection cost more than the matmul it follows. The kernel keeps a per-query heap and compares
32 scores at a time against its worst entry, so a chunk costs about one pass over its scores.

It is compiled on first use with the machine's C++ compiler (`$CXX`, else g++) against jaxlib's FFI
headers, into a cache keyed by the source, jaxlib's version, the compiler and the CPU
(`$SAMTONE_NATIVE_CACHE`, else `$XDG_CACHE_HOME/samtone_jax` or ~/.cache/samtone_jax, else a
per-user temp folder when that is not writable), written
atomically so concurrent processes never load a half-written library. `SAMTONE_NATIVE=0` turns it
off. When it cannot be built, search falls back to `lax.top_k` with one warning naming the reason.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import uuid

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

log = logging.getLogger(__name__)

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native", "top_k_merge.cc")
TARGET = "samtone_top_k_merge"
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-w")


class NativeBuildError(RuntimeError):
    """The kernel could not be compiled or loaded; the message says why and what to do."""


def _cpu_signature() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return "".join(line for line in f if line.startswith(("model name", "flags")))[:4096]
    except OSError:
        return platform.processor() or platform.machine()


def _cache_dir() -> str:
    """$SAMTONE_NATIVE_CACHE, else the user's cache folder, else (read-only home) a per-user temp folder."""
    root = os.environ.get("SAMTONE_NATIVE_CACHE")
    if root:
        return root
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    preferred = os.path.join(base, "samtone_jax")
    try:
        os.makedirs(preferred, exist_ok=True)
        if os.access(preferred, os.W_OK):
            return preferred
    except OSError:
        pass
    return os.path.join(tempfile.gettempdir(), f"samtone_jax-{os.getuid() if hasattr(os, 'getuid') else 'user'}")


def _compile(compiler: str, arch_flags: list[str], out: str) -> subprocess.CompletedProcess:
    command = [compiler, *FLAGS, *arch_flags, f"-I{jax.ffi.include_dir()}", SOURCE, "-o", out]
    return subprocess.run(command, capture_output=True, text=True)


def build() -> str:
    """The path of the compiled kernel, compiling it into the cache when missing."""
    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        raise NativeBuildError(f"no C++ compiler {compiler!r} on PATH (install g++, or set $CXX)")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    with open(SOURCE, "rb") as f:
        source = f.read()
    parts = [source, jaxlib.__version__, " ".join(FLAGS), *version, _cpu_signature()]
    key = hashlib.sha256(b"\0".join(p if isinstance(p, bytes) else p.encode() for p in parts)).hexdigest()[:16]
    cache = _cache_dir()
    path = os.path.join(cache, f"top_k_merge-{key}.so")
    if os.path.exists(path):
        return path
    os.makedirs(cache, exist_ok=True)
    tmp = os.path.join(cache, f".top_k_merge-{key}.so.tmp-{uuid.uuid4().hex[:8]}")
    try:
        result = _compile(compiler, ["-march=native"], tmp)
        if result.returncode:  # a compiler or CPU without -march=native: portable code, scalar scan
            result = _compile(compiler, [], tmp)
        if result.returncode:
            raise NativeBuildError(f"{compiler} failed on {SOURCE}:\n{result.stderr[-2000:]}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


@functools.cache
def _load() -> str | None:
    """Builds, loads and registers the kernel once per process; None (with a warning) if it cannot."""
    if os.environ.get("SAMTONE_NATIVE", "1") == "0":
        return "SAMTONE_NATIVE=0"
    try:
        library = ctypes.cdll.LoadLibrary(build())
        jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(library.SamtoneTopKMerge), platform="cpu")
    except (NativeBuildError, OSError, AttributeError) as e:
        log.warning(
            "exact search on CPU falls back to lax.top_k (slower): the native top-k kernel is unavailable: %s", e
        )
        return str(e)
    return None


def available() -> bool:
    """Whether the kernel is built and registered for the CPU platform in this process."""
    return _load() is None


def unavailable_reason() -> str | None:
    return _load()


def merge(scores: jax.Array, start: jax.Array, best: jax.Array, best_ids: jax.Array, n: int):
    """Merge a chunk's scores [Q, C] (column j = corpus id start + j; ids >= n are padding) into the
    running per-query heaps best [Q, K] / best_ids [Q, K] (initially -inf / -1). CPU only; chunks
    in increasing id order. The heaps are not sorted: see `sort_best`."""
    if not available():
        raise RuntimeError(f"the native top-k kernel is unavailable: {unavailable_reason()}")
    call = jax.ffi.ffi_call(
        TARGET,
        (jax.ShapeDtypeStruct(best.shape, jnp.float32), jax.ShapeDtypeStruct(best_ids.shape, jnp.int32)),
        input_output_aliases={2: 0, 3: 1},
    )
    return call(scores, jnp.asarray(start, jnp.int32), best, best_ids, n=np.int64(n))


def sort_best(scores: jax.Array, ids: jax.Array):
    """Rows ordered by score descending, then id ascending (the order lax.top_k's merge gives)."""
    neg, ids = jax.lax.sort((-scores, ids), dimension=1, num_keys=2)
    return -neg, ids
