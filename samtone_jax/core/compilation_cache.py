"""JAX's persistent compilation cache, on by default for every `samtone` mode: a run, a resume, an
eval or an export of the same shapes loads its compiled programs instead of compiling them again.

    SAMTONE_COMPILATION_CACHE   unset: $SAMTONE_CACHE_DIR (default ~/.cache/samtone_jax)/xla/<host>;
                                a folder or gs:// URL (a pod: one cache for all hosts); 'off': none
    samtone --compilation_cache=DIR|off <mode> ...   the same, for one command (wins over the variable)
    (JAX_COMPILATION_CACHE_DIR, JAX's own variable, is kept when neither of ours is given)

Entries are keyed by JAX itself (the program, jaxlib, the backend, XLA flags, compile options,
devices). XLA:CPU compiles for the host's own instruction set, which JAX's key does not name, so the
default folder ends in a digest of this host's CPU flags: a home folder shared by machines of two
CPU generations never hands one the other's code. The cache is trusted code (JAX's warning): keep it
in a folder only you can write. Programs that compile in under a second are not kept (JAX's own
default, `JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`: tiny programs recompile faster than they load).
"""

from __future__ import annotations

import hashlib
import os

from samtone_jax.core import paths

ENVIRONMENT = "SAMTONE_COMPILATION_CACHE"
OFF = "off"


def _host_digest() -> str:
    """A short digest of what XLA:CPU compiles for: the CPU's model and feature flags."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = [line for line in f if line.startswith(("flags", "model name", "Features", "CPU part"))]
        text = "".join(sorted(set(lines)))
    except OSError:
        import platform

        text = f"{platform.machine()} {platform.processor()}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def default_directory() -> str:
    root = os.environ.get("SAMTONE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "samtone_jax")
    return paths.join(root, "xla", _host_digest())


def directory(flag: str | None = None) -> str | None:
    """Where the cache is (None: off): the flag, else the environment variable, else the default."""
    chosen = flag if flag is not None else os.environ.get(ENVIRONMENT)
    if chosen is not None and chosen.strip().lower() == OFF:
        return None
    return chosen or default_directory()


def enable(flag: str | None = None) -> str | None:
    """Point JAX's persistent cache at `directory(flag)` before anything is compiled; returns it.
    (JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS, JAX's own variable, sets what is kept: 1 s by default.)"""
    import jax

    where = directory(flag)
    if where is None:
        jax.config.update("jax_enable_compilation_cache", False)  # (also a JAX_COMPILATION_CACHE_DIR's)
        return None
    if flag is None and os.environ.get(ENVIRONMENT) is None and jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir  # JAX's own JAX_COMPILATION_CACHE_DIR, set by the user
    if not paths.is_remote(where):
        os.makedirs(where, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", paths.as_str(where))
    return where
