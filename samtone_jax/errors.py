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


class MissingFileError(UserError, FileNotFoundError):
    """An input that is not there (or not complete)."""


class ExistingFileError(UserError, FileExistsError):
    """An output that would overwrite something (pass --overwrite)."""


def one_line(e: BaseException) -> str:
    """The message without gin's "In call to configurable ..." suffix."""
    return str(e).split("\n  In call to configurable")[0].strip()


class NoAccessError(UserError, PermissionError):
    """Storage the credentials at hand may not use."""


class UnreachableError(UserError, OSError):
    """Storage or a server that cannot be reached."""
