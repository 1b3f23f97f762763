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
import logging
import os
import shutil
import tempfile
import time
import uuid

from samtone_jax.core import paths, run_folders
from samtone_jax.core.errors import (
    BadValueError,
    ExistingFileError,
    MissingFileError,
    NoAccessError,
    StorageFullError,
    UserError,
    storage_reason,
)

MARKER = run_folders.COMMIT_MARKER
log = logging.getLogger(__name__)


def _staging_name(target) -> str:
    """`<target>.tmp-<pid>-<random>`: the writing process's id lets a later write tell a killed
    writer's leftover (its process is gone) from a live writer's folder."""
    return f"{target}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _remove_orphans(target) -> None:
    """Tidy up after writers of a local `target` that no longer run on this host (a SIGKILL or power
    cut skips every cleanup). The one leftover ever put back: when `target` is missing and a dead
    writer left both an `.old-<pid>-…` and a `.tmp-<pid>-…` folder (killed between the two renames
    of an overwrite without RENAME_EXCHANGE, see _commit_local), its new folder (complete: marked)
    is put at `target`, else its old one. Everything else is removed, marker first, so that a
    removal cut short never leaves a folder that looks complete."""
    parent = os.path.dirname(os.fspath(target)) or "."
    name = os.path.basename(os.fspath(target))
    staged = _folders_by_pid(_dead_writers(parent, f"{name}.tmp-"))
    aside = _folders_by_pid(_dead_writers(parent, f"{name}.old-"))
    if not os.path.lexists(target):
        for pid in sorted(set(staged) & set(aside)):
            found = [p for p in (staged[pid], aside[pid]) if os.path.isfile(os.path.join(p, MARKER))]
            if found:
                with contextlib.suppress(FileNotFoundError):  # another writer recovered it first
                    os.rename(found[0], target)
                    log.warning("%s was missing after a killed overwrite; recovered it from %s", target, found[0])
                break
    for leftover in _dead_writers(parent, f"{name}.tmp-") + _dead_writers(parent, f"{name}.old-"):
        _remove(leftover)


def _folders_by_pid(found: list[str]) -> dict[int, str]:
    """{pid: folder} of leftovers named [.]<target>.<kind>-<pid>-… (folders only)."""
    out = {}
    for path in found:
        if os.path.isdir(path) and not os.path.islink(path):
            out[int(os.path.basename(path).rsplit(".", 1)[-1].split("-")[1])] = path
    return out


REMOTE_STAGING = "samtone_jax-staging-"  # <tmp>/samtone_jax-staging-<pid>-...: a gs:// write's local copy


def _remote_staging() -> str:
    """A local folder to stage a gs:// write in, named by this process; a killed writer's leftovers
    (their process is gone) are removed first."""
    _remove_dead_writers(tempfile.gettempdir(), REMOTE_STAGING)
    return tempfile.mkdtemp(prefix=f"{REMOTE_STAGING}{os.getpid()}-")


def _remove_dead_writers(parent: str, prefix: str) -> None:
    """Remove parent's entries named [.]<prefix><pid>-... whose process no longer runs on this host."""
    for leftover in _dead_writers(parent, prefix):
        _remove(leftover)


def _dead_writers(parent: str, prefix: str) -> list[str]:
    """parent's entries named [.]<prefix><pid>-... whose process no longer runs on this host."""
    found = []
    for name in sorted(os.listdir(parent)) if os.path.isdir(parent) else ():
        rest = name.lstrip(".")[len(prefix) :] if name.lstrip(".").startswith(prefix) else ""
        pid = rest.split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            found.append(os.path.join(parent, name))
    return found


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
        staged = f"{paths.as_str(directory)}.staged"
        if paths.is_remote(staged) and (paths.as_path(staged) / MARKER).exists():
            raise MissingFileError(
                f"{paths.as_str(directory)} is incomplete: an overwrite of it was interrupted, and its complete new "
                f"version waits in {staged}; rerun the command that writes it (it finishes the move first)"
            )
        raise MissingFileError(
            f"{paths.as_str(directory)} is an incomplete {what}: {MARKER} is missing, so its writer stopped "
            "before finishing (or it predates samtone_jax 0.2); rerun the command that writes it with --overwrite"
        )


@contextlib.contextmanager
def atomic_directory(path, overwrite: bool = False):
    """Yield a local staging folder (str) to fill; on success it becomes `path` with the commit
    marker, on any exception nothing changes at `path`. ExistingFileError when `path` exists and not
    `overwrite`, and at the commit when another writer put something at `path` meanwhile (without
    `overwrite`), or replaced what was there at the start (with it): a commit never replaces what
    this call did not see. See `_commit_local` / `_commit_remote` for what a kill leaves."""
    target = paths.as_path(path)
    remote = paths.is_remote(target)
    if not remote:
        with _writable(target):
            target.parent.mkdir(parents=True, exist_ok=True)
            _remove_orphans(target)  # and recover a killed overwrite's folder (see _commit_local)
    elif _remote_staged(target).exists():  # an interrupted overwrite's new version (see _commit_remote)
        with _remote_claim(target):
            _finish_remote_move(target)
    seen = _version(target)
    if seen is not None and not overwrite:
        raise ExistingFileError(f"{target} already exists; choose another destination or remove it first (--overwrite)")
    if remote:
        staging = _remote_staging()
    else:
        with _writable(target):
            staging = _staging_name(target)
            os.makedirs(staging)
    try:
        yield staging
        stamp = datetime.datetime.now(datetime.UTC).isoformat()
        with open(os.path.join(staging, MARKER), "w", encoding="utf-8") as f:
            f.write(f"complete {stamp} {uuid.uuid4().hex}\n")
        if remote:
            _commit_remote(staging, target, seen)
        else:
            _commit_local(staging, target, seen)
    except Exception as e:
        reason = None if isinstance(e, UserError) else storage_reason(e)
        if reason is None:
            raise
        full = any(word in reason for word in ("space", "quota", "full"))
        remedy = "free some space or choose another destination" if full else "choose a writable destination"
        raise StorageFullError(f"cannot write {target}: {reason}; nothing was written there: {remedy}") from e
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _version(target) -> tuple | None:
    """What is at `target` (None: nothing): a local file's or folder's (device, inode, commit marker),
    a gs:// folder's marker text; compared at the commit with what is there then."""
    if paths.is_remote(target):
        if not target.exists():
            return None
        marker = target / MARKER
        return ("remote", marker.read_text() if marker.exists() else None)
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return None
    marker = os.path.join(target, MARKER)
    text = None
    if os.path.isfile(marker):
        with open(marker, encoding="utf-8", errors="replace") as f:
            text = f.read()
    return (st.st_dev, st.st_ino, text)


def _replaced_meanwhile(target) -> ExistingFileError:
    return ExistingFileError(
        f"{target} was written by another process while this one ran; nothing was replaced and this output was "
        "discarded: rerun once the other writer has finished (with --overwrite to replace its output)"
    )


_NOT_THERE = (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR)


def _commit_local(staging: str, target, seen) -> None:
    """Put the complete `staging` folder at `target`.

    - Nothing was there at the start: a plain rename, which never replaces a non-empty folder (ours
      always hold the marker) or a file: a second writer that committed meanwhile wins, this one is
      refused.
    - An overwrite: the two folders swapped in one atomic call (Linux renameat2 RENAME_EXCHANGE):
      at every instant one complete version is at `target`. The folder swapped out must be the one
      seen at the start; if another writer replaced it meanwhile, the swap is undone and refused.
      Where the swap is not supported, the old folder is first renamed to `<target>.old-<pid>-…`:
      a kill before the new one is renamed into place leaves the old one there, and the next write
      of `target` (`_remove_orphans`) puts the new one (when complete) or the old one back.
    """
    target = os.fspath(target)
    if seen is None or _version(target) is None:
        try:
            os.rename(staging, target)
        except OSError as e:
            if e.errno in _NOT_THERE:
                raise _replaced_meanwhile(target) from None
            raise
        return
    try:
        _exchange(staging, target)
    except _NoExchange:
        backup = f"{target}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(target, backup)
        if not _same(_version(backup), seen):
            os.rename(backup, target)
            raise _replaced_meanwhile(target) from None
        try:
            _rename_into_place(staging, target)
        except OSError as e:
            if e.errno in _NOT_THERE:  # another writer's plain rename took the free name: theirs stays
                _remove(backup)
                raise _replaced_meanwhile(target) from None
            with contextlib.suppress(OSError):
                os.rename(backup, target)  # the old one back
            raise
        _remove(backup)
        return
    if not _same(_version(staging), seen):  # what we swapped out is another writer's: swap back, refuse
        _exchange(staging, target)
        raise _replaced_meanwhile(target)
    _remove(staging)


def _same(a: tuple | None, b: tuple | None) -> bool:
    """Whether two `_version`s are one folder: by its commit marker (unique to each commit) when
    both have one, else by device and inode (which some FUSE file systems change on rename)."""
    if a is None or b is None:
        return a is b
    if a[-1] is not None and b[-1] is not None:
        return a[-1] == b[-1]
    return a == b


def _rename_into_place(staging: str, target: str) -> None:
    """The second rename of an overwrite without RENAME_EXCHANGE (its own function: a kill between
    the two renames is what the tests inject here)."""
    os.rename(staging, target)


def _remove(path: str) -> None:
    """Remove a file or folder; a folder's commit marker first (a removal cut short leaves an
    incomplete folder, never one that looks complete)."""
    if os.path.isdir(path) and not os.path.islink(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(path, MARKER))
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class _NoExchange(Exception):
    """renameat2(RENAME_EXCHANGE) is not available here (not Linux, an old kernel, a file system
    without it)."""


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _exchange(a: str, b: str) -> None:
    """Swap the paths `a` and `b` in one atomic call, or _NoExchange."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        raise _NoExchange from None
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EXDEV):
            raise _NoExchange
        raise OSError(code, os.strerror(code), a)


def _commit_remote(staging: str, target, seen) -> None:
    """Upload the complete `staging` folder to the gs:// `target`, holding a claim on it (an object
    `<target>.writing`, created only if absent) so that two writers never mix their files.

    - Nothing was there at the start: the files, then the marker.
    - An overwrite: the new folder is first uploaded whole to `<target>.staged` (marker last), then
      the old one is removed (marker first) and the staged copy copied into place in the bucket,
      marker last. A kill in between leaves the complete new version in `<target>.staged`; the next
      write of `target` finishes the move, and readers name it (`require_complete`).
    """
    with _remote_claim(target):
        _finish_remote_move(target)
        now = _version(target)
        if now != seen:
            raise _replaced_meanwhile(target)
        if now is None:
            _upload_tree(staging, target)
            return
        staged = _remote_staged(target)
        if staged.exists():
            staged.rmtree()
        _upload_tree(staging, staged)
        _finish_remote_move(target)


def _remote_staged(target):
    return paths.as_path(f"{os.fspath(target)}.staged")


def _finish_remote_move(target) -> None:
    """A complete `<target>.staged` (an overwrite's new version, uploaded whole) replaces `target`,
    marker last; an incomplete one is removed."""
    staged = _remote_staged(target)
    if not staged.exists():
        return
    marker = staged / MARKER
    if not marker.exists() or (
        (target / MARKER).exists() and (target / MARKER).read_text() == marker.read_text()
    ):  # incomplete, or already moved in (a kill while it was removed)
        marker.unlink(missing_ok=True)
        staged.rmtree()
        return
    if target.exists():
        (target / MARKER).unlink(missing_ok=True)  # invalid from here on, until the new marker lands
        target.rmtree()
    fs = paths.gcs_filesystem()
    source = os.fspath(staged).rstrip("/")
    objects = ["gs://" + f for f in fs.find(source)]
    last = f"{source}/{MARKER}"
    for name in [o for o in objects if o != last] + [last]:
        fs.copy(name, os.fspath(target) + name[len(source) :])
    (staged / MARKER).unlink(missing_ok=True)  # first: a removal cut short is never taken as complete
    staged.rmtree()


@contextlib.contextmanager
def _remote_claim(target):
    """Hold `<target>.writing` (created only if absent: the object store's compare-and-swap) while
    committing to `target`; a claim left by a dead process of this host is taken over."""
    import json
    import socket

    from google.api_core import exceptions
    from google.cloud import storage

    bucket, _, key = os.fspath(target)[len("gs://") :].partition("/")
    blob = storage.Client().bucket(bucket).blob(key.rstrip("/") + ".writing")
    record = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()})
    for _ in range(3):
        try:
            blob.upload_from_string(record, if_generation_match=0)
            break
        except exceptions.PreconditionFailed:
            try:
                holder = json.loads(blob.download_as_text())
            except exceptions.NotFound:
                continue
            except ValueError:
                holder = {}
            if holder.get("host") == socket.gethostname() and not _alive(int(holder.get("pid", 0))):
                with contextlib.suppress(exceptions.NotFound):
                    blob.delete(if_generation_match=blob.generation)
                continue
            raise ExistingFileError(
                f"{target} is being written by another process (host {holder.get('host')}, pid {holder.get('pid')}): "
                f"wait for it; if it no longer runs, delete gs://{bucket}/{blob.name}"
            ) from None
    else:
        raise ExistingFileError(f"could not claim {target} for writing: other writers keep claiming it")
    try:
        yield
    finally:
        with contextlib.suppress(exceptions.NotFound):
            blob.delete()


def begin_in_place(path, overwrite: bool = False):
    """For writers that cannot stage locally (every process of a pod writing its shards: params_io.
    save_sharded_params), on one process: `(staged folder, what is at path now)`. The folder,
    `<path>.staged` beside the target (on the same storage), is empty; an earlier writer's leftover
    there is finished (gs://: a complete one moved in) or removed. Fill it, then
    `commit_in_place(path, seen)`."""
    target = paths.as_path(path)
    staged = _remote_staged(target)
    if paths.is_remote(target):
        if staged.exists():
            with _remote_claim(target):
                _finish_remote_move(target)
    elif staged.exists():
        _remove(os.fspath(staged))
    seen = _version(target)
    if seen is not None and not overwrite:
        raise ExistingFileError(f"{target} already exists; choose another destination or remove it first (--overwrite)")
    if not paths.is_remote(target):
        with _writable(target):
            os.makedirs(staged)
    return staged, seen


def commit_in_place(path, seen) -> None:
    """`begin_in_place`'s filled folder becomes `path` (marker last), replacing only `seen`."""
    target = paths.as_path(path)
    staged = _remote_staged(target)
    stamp = datetime.datetime.now(datetime.UTC).isoformat()
    (staged / MARKER).write_text(f"complete {stamp} {uuid.uuid4().hex}\n")
    if not paths.is_remote(target):
        _commit_local(os.fspath(staged), target, seen)
        return
    with _remote_claim(target):
        if _version(target) != seen:
            (staged / MARKER).unlink(missing_ok=True)
            staged.rmtree()
            raise _replaced_meanwhile(target)
        _finish_remote_move(target)


def _upload_tree(staging: str, target) -> None:
    files = []
    for root, _, names in os.walk(staging):
        files += [os.path.join(root, n) for n in names if os.path.join(root, n) != os.path.join(staging, MARKER)]
    for local in files:
        paths.upload(local, target / os.path.relpath(local, staging))
    paths.upload(os.path.join(staging, MARKER), target / MARKER)
