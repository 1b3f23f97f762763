"""Files and folders that are either complete or absent, on local disk and on gs://.

Every output a killed job could leave half-written (vocabularies, embedding shards, eval JSON,
TREC runs, figures, reports, exports, parameter checkpoints) goes through here:

- a file (`atomic_open`, `write_atomic`): locally a temporary sibling renamed into place; on an
  object store the bytes are staged on local disk and uploaded in one call once the writer
  finished, so an exception (or a kill) leaves no object at all;
- a folder (`atomic_directory`): filled in a local staging folder; a `commit_success.txt` marker
  is written last, then the folder is renamed into place (local) or uploaded file by file with
  the marker last (gs://, where there is no rename). Every reader of such a folder calls
  `require_complete`, so a folder whose upload was cut off is never taken as complete.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import shutil
import tempfile
import uuid

from samtone_jax import paths, run_folders
from samtone_jax.errors import BadValueError, ExistingFileError, MissingFileError, NoAccessError

MARKER = run_folders.COMMIT_MARKER


def _staging_name(target) -> str:
    """`<target>.tmp-<pid>-<random>`: the writing process's id lets a later write tell a killed
    writer's leftover (its process is gone) from a live writer's folder."""
    return f"{target}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _remove_orphans(target) -> None:
    """Remove the staging files / folders of a local `target` whose writing process no longer runs on
    this host (a SIGKILL or power cut skips every cleanup; the next write of the same target tidies
    up)."""
    parent = os.path.dirname(os.fspath(target)) or "."
    _remove_dead_writers(parent, f"{os.path.basename(os.fspath(target))}.tmp-")


REMOTE_STAGING = "samtone_jax-staging-"  # <tmp>/samtone_jax-staging-<pid>-...: a gs:// write's local copy


def _remote_staging() -> str:
    """A local folder to stage a gs:// write in, named by this process; a killed writer's leftovers
    (their process is gone) are removed first."""
    _remove_dead_writers(tempfile.gettempdir(), REMOTE_STAGING)
    return tempfile.mkdtemp(prefix=f"{REMOTE_STAGING}{os.getpid()}-")


def _remove_dead_writers(parent: str, prefix: str) -> None:
    """Remove parent's entries named [.]<prefix><pid>-... whose process no longer runs on this host."""
    for name in os.listdir(parent) if os.path.isdir(parent) else ():
        rest = name.lstrip(".")[len(prefix) :] if name.lstrip(".").startswith(prefix) else ""
        pid = rest.split("-")[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        leftover = os.path.join(parent, name)
        if os.path.isdir(leftover):
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


@contextlib.contextmanager
def _writable(target):
    """A folder we may not write (a read-only file system, no permission): one line naming it."""
    try:
        yield
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        raise NoAccessError(f"cannot write {paths.as_str(target)}: {e.strerror}; choose a writable destination") from e


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


@contextlib.contextmanager
def atomic_open(path, mode: str = "wb"):
    """A file object for writing `path` whole: on success it becomes `path`, on any exception
    nothing is left. Text mode writes UTF-8."""
    if mode not in ("w", "wb"):
        raise BadValueError(f"atomic_open writes whole files: mode 'w' or 'wb', got {mode!r}")
    target = paths.as_path(path)
    encoding = None if "b" in mode else "utf-8"
    if paths.is_remote(target):
        staging = _remote_staging()
        try:
            local = os.path.join(staging, target.name)
            with open(local, mode, encoding=encoding) as f:  # local staging file, uploaded below
                yield f
            paths.upload(local, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return
    with _writable(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_orphans(target)
    tmp = target.parent / f".{os.path.basename(_staging_name(target))}"
    try:
        # 'x': created with the umask's mode (not mkstemp's 0600), never over another file.
        with _writable(target):
            f = open(tmp, mode.replace("w", "x"), encoding=encoding)  # a local file (epath has no 'x')
        with f:
            yield f
        tmp.replace(target)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise


def write_atomic(path, data: bytes | str) -> str:
    """Write `data` to `path` atomically; returns `path` as a string."""
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    return paths.as_str(path)


def is_complete(directory) -> bool:
    return (paths.as_path(directory) / MARKER).exists()


def require_complete(directory, what: str = "folder") -> None:
    """FileNotFoundError unless `directory` carries the commit marker `atomic_directory` writes last."""
    if not is_complete(directory):
        raise MissingFileError(
            f"{paths.as_str(directory)} is an incomplete {what}: {MARKER} is missing, so its writer stopped "
            "before finishing (or it predates samtone_jax 0.2); rerun the command that writes it with --overwrite"
        )


@contextlib.contextmanager
def atomic_directory(path, overwrite: bool = False):
    """Yield a local staging folder (str) to fill; on success it becomes `path` (replacing it when
    `overwrite`) with the commit marker, on any exception nothing changes at `path` (on gs://, an
    overwrite removes the old folder's marker before its files). FileExistsError when `path`
    exists and not overwrite."""
    target = paths.as_path(path)
    if target.exists() and not overwrite:
        raise ExistingFileError(f"{target} already exists; choose another destination or remove it first (--overwrite)")
    remote = paths.is_remote(target)
    if remote:
        staging = _remote_staging()
    else:
        with _writable(target):
            target.parent.mkdir(parents=True, exist_ok=True)
            _remove_orphans(target)
            staging = _staging_name(target)
            os.makedirs(staging)
    try:
        yield staging
        stamp = datetime.datetime.now(datetime.UTC).isoformat()
        with open(os.path.join(staging, MARKER), "w", encoding="utf-8") as f:
            f.write(f"complete {stamp}\n")
        if remote:
            _upload_tree(staging, target)
        else:
            if target.exists():
                target.rmtree()
            paths.as_path(staging).replace(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _upload_tree(staging: str, target) -> None:
    if target.exists():
        (target / MARKER).unlink(missing_ok=True)  # invalid from here on, until the new marker lands
        target.rmtree()
    files = []
    for root, _, names in os.walk(staging):
        files += [os.path.join(root, n) for n in names if os.path.join(root, n) != os.path.join(staging, MARKER)]
    for local in files:
        paths.upload(local, target / os.path.relpath(local, staging))
    paths.upload(os.path.join(staging, MARKER), target / MARKER)
