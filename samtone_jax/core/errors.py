"""The user's errors: problems the person running samtone can fix (a binding, a path, a file, a
run already in MODEL_DIR). `samtone` prints one of these as one line (its message says what was
wrong, where, and what to do) and exits 2; every other exception keeps its traceback, so a bug or
a library's own error (JAX's shape errors, say) is never disguised as a user error.

Each is also the built-in type it refines (ValueError, FileNotFoundError, ...), for callers that
catch those.
"""

from __future__ import annotations


class UserError(Exception):
    """Base of the errors shown as one line."""


class BadValueError(UserError, ValueError):
    """A value (gin binding, flag, record, array shape) that cannot work."""


class CheckpointMismatchError(BadValueError):
    """A source checkpoint does not fit the configured model."""


class MissingFileError(UserError, FileNotFoundError):
    """An input that is not there (or not complete)."""


class ExistingFileError(UserError, FileExistsError):
    """An output that would overwrite something (pass --overwrite)."""


class StoppedError(UserError):
    """A command stopped on request (SIGTERM, Ctrl-C) before it finished; what it did is saved."""


def one_line(e: BaseException) -> str:
    """The message without gin's "In call to configurable ..." suffix."""
    return str(e).split("\n  In call to configurable")[0].strip()


class NoAccessError(UserError, PermissionError):
    """Storage the credentials at hand may not use."""


class UnreachableError(UserError, OSError):
    """Storage or a server that cannot be reached."""


class StorageFullError(UserError, OSError):
    """A write the storage refused for lack of space or quota, or for want of permission."""


# The OS's reasons a write fails for, as they appear anywhere in a (chained) storage error: a
# library may wrap them (tensorstore's long specs, the tokenizers' Rust `Exception(... os error 28)`).
STORAGE_REASONS = ("No space left on device", "Disk quota exceeded", "Read-only file system", "Permission denied")


def storage_reason(e: BaseException) -> str | None:
    """The OS's reason anywhere in `e`'s chain (STORAGE_REASONS, or a full storage that only says
    RESOURCE_EXHAUSTED), else None."""
    chain, cause = [], e
    while cause is not None and len(chain) < 8:
        chain.append(str(cause))
        cause = cause.__cause__ or cause.__context__
    everything = "\n".join(chain)
    reason = next((r for r in STORAGE_REASONS if r in everything), None)
    if reason is None and "RESOURCE_EXHAUSTED" in everything:
        reason = "RESOURCE_EXHAUSTED: the storage is full (no space or quota left)"
    return reason
