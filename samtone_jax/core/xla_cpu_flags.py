"""XLA:CPU flags that several simulated CPU devices need to run this project's programs without hanging.

With several CPU devices in one process (`--xla_force_host_platform_device_count`, `--num_cpu_devices`),
XLA:CPU's concurrency-optimised scheduler lets each device's thunk executor start independent
all-gathers in a different order; the in-process collectives then wait for each other forever (until
XLA aborts: "Termination timeout for `all gather ...`"). It happens in FSDP with scanned layers (the
per-layer parameter all-gathers inside the while loop): measured on jaxlib 0.10.2, 2 cores, 8 devices,
the compiled step hung within its first 2 executions in 3 of 3 runs, and in none of 440 (6 runs) with
the scheduler off. The flag is read by XLA:CPU only; TPU and GPU compilation ignore it.

`apply()` (called when samtone_jax is imported, before JAX reads XLA_FLAGS at its first backend use)
adds `--xla_cpu_enable_concurrency_optimized_scheduler=false` unless XLA_FLAGS already names that
flag (set it yourself to choose), and only for jaxlib versions it was verified to exist in: XLA aborts
on flags it does not know. Importing JAX and using a device before samtone_jax leaves XLA_FLAGS as it
was read then.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import MutableMapping

FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler"
# jaxlib releases whose XLA has FLAG (Python 3.11 installs 0.10.x only; see ../shared/NOTES.md).
VERIFIED_JAXLIB = ("0.10.",)


def _jaxlib_version() -> str | None:
    try:
        return importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        return None


def apply(environ: MutableMapping[str, str] = os.environ, jaxlib_version: str | None = None) -> bool:
    """Add `FLAG=false` to environ['XLA_FLAGS'] (keeping the flags there); whether it was added."""
    version = jaxlib_version if jaxlib_version is not None else _jaxlib_version()
    if not version or not version.startswith(VERIFIED_JAXLIB):
        return False
    flags = environ.get("XLA_FLAGS", "")
    if FLAG in flags:
        return False
    environ["XLA_FLAGS"] = f"{flags} {FLAG}=false".strip()
    return True
