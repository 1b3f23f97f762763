"""One run per MODEL_DIR: a lease object, MODEL_DIR/lock.json, held by process 0 for the whole run.

    {"host": ..., "pid": ..., "started": ISO time, "heartbeat": unix time, "token": random}

Taken only if absent: on local disk an exclusive create (O_EXCL), on gs:// an upload with the
generation precondition 0 (the object store's compare-and-swap; gcsfs has no preconditions, so
this is the one place google-cloud-storage is used). A thread renews the heartbeat every
`heartbeat_s`; a lease whose heartbeat is older than `stale_after_s` (a crashed or killed run), or
whose process is gone from this host, is taken over with a warning, again by compare-and-swap.
A second run is refused with the holder's host, pid and start time.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import socket
import threading
import time
import uuid

import numpy as np

from samtone_jax.core import paths, run_folders
from samtone_jax.core.atomic_file import write_atomic
from samtone_jax.core.errors import UserError

log = logging.getLogger(__name__)

LOCK = run_folders.LOCK


class RunLockedError(UserError, RuntimeError):
    """Another live run holds MODEL_DIR."""


class RunLock:
    def __init__(self, model_dir, heartbeat_s: float = 60.0, stale_after_s: float = 300.0):
        self.path = paths.as_path(model_dir) / LOCK
        self.heartbeat_s, self.stale_after_s = heartbeat_s, stale_after_s
        self.token = uuid.uuid4().hex
        self._generation = None  # gs://: the generation of our lease object
        self._stop = threading.Event()
        self._thread = None

    def _record(self) -> str:
        return json.dumps(
            {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "token": self.token,
                "started": self._started,
                "heartbeat": time.time(),
            }
        )

    # -- storage primitives: create-if-absent, read, replace-if-unchanged, delete-if-ours -------------
    def _blob(self):
        from google.cloud import storage

        bucket, _, key = os.fspath(self.path)[len("gs://") :].partition("/")
        return storage.Client().bucket(bucket).blob(key)

    def _create(self, data: str) -> bool:
        if paths.is_remote(self.path):
            from google.api_core import exceptions

            blob = self._blob()
            try:
                blob.upload_from_string(data, if_generation_match=0)
            except exceptions.PreconditionFailed:
                return False
            self._generation = blob.generation
            return True
        # Written in full under a private name, then linked into place (fails if the lock exists):
        # no reader ever sees an empty or half-written lease.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.parent / f".{LOCK}.{self.token}"
        tmp.write_text(data)
        try:
            os.link(tmp, self.path)
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        return True

    def _read(self) -> tuple[dict | None, object]:
        """(the lease, a version to compare-and-swap against) or (None, None) when absent."""
        if paths.is_remote(self.path):
            from google.api_core import exceptions

            blob = self._blob()
            try:
                text = blob.download_as_text()
            except exceptions.NotFound:
                return None, None
            return _parse(text), blob.generation
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None, None
        return _parse(text), text

    def _replace(self, version, data: str) -> bool:
        """Write `data` if the lease is still the one read as `version`."""
        if paths.is_remote(self.path):
            from google.api_core import exceptions

            blob = self._blob()
            try:
                blob.upload_from_string(data, if_generation_match=version)
            except exceptions.PreconditionFailed:
                return False
            self._generation = blob.generation
            return True
        # Local: move the stale lease aside (one renamer wins), then create ours exclusively.
        aside = self.path.parent / f".{LOCK}.stale-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        if aside.read_text() != version:  # another taker replaced it first: put theirs back
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass
            aside.unlink(missing_ok=True)
            return False
        aside.unlink(missing_ok=True)
        return self._create(data)

    # -- the lease ------------------------------------------------------------------------------------
    def acquire(self) -> None:
        self._started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        for _ in range(5):
            if self._create(self._record()):
                break
            holder, version = self._read()
            if holder is None:
                continue  # released meanwhile: try again
            why = self._stale(holder)
            if why is None:
                raise RunLockedError(
                    f"{paths.as_str(self.path.parent)} is in use by another run: host {holder.get('host')}, "
                    f"pid {holder.get('pid')}, started {holder.get('started')}, last heartbeat "
                    f"{time.time() - float(holder.get('heartbeat', 0)):.0f} s ago. Wait for it to finish, stop it, "
                    f"or use another MODEL_DIR (a crashed run's lock expires {self.stale_after_s:.0f} s after its "
                    "last heartbeat)"
                )
            if self._replace(version, self._record()):
                log.warning("took over the lock of %s from %s", self.path.parent, why)
                break
        else:
            raise RunLockedError(f"could not take {self.path}: other runs keep changing it")
        self._thread = threading.Thread(target=self._beat, name="samtone-run-lock", daemon=True)
        self._thread.start()

    def _stale(self, holder: dict) -> str | None:
        """Why the lease is stale (a dead process of this host, an old heartbeat), or None."""
        age = time.time() - float(holder.get("heartbeat", 0))
        if age > self.stale_after_s:
            return (
                f"a run whose last heartbeat was {age:.0f} s ago (host {holder.get('host')}, pid {holder.get('pid')})"
            )
        if holder.get("host") == socket.gethostname() and not _alive(holder.get("pid")):
            return f"pid {holder.get('pid')} of this host, which is no longer running"
        return None

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                holder, version = self._read()
                if not holder or holder.get("token") != self.token:
                    log.error(
                        "the lock %s was taken by another run (%s); this run no longer holds it", self.path, holder
                    )
                    return
                if paths.is_remote(self.path):
                    self._replace(version, self._record())
                else:
                    write_atomic(self.path, self._record())
            except Exception as e:  # noqa: BLE001  a missed heartbeat is retried at the next one
                log.warning("could not renew the lock %s: %s", self.path, e)

    def release(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        try:
            holder, _ = self._read()
            if holder and holder.get("token") == self.token:
                if paths.is_remote(self.path):
                    self._blob().delete()
                else:
                    self.path.unlink(missing_ok=True)
        except Exception as e:  # noqa: BLE001  the lease expires by itself
            log.warning("could not release the lock %s (%s); it expires after %.0f s", self.path, e, self.stale_after_s)

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


def _parse(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def held_by_process_0(model_dir, host: int, hosts: int):
    """MODEL_DIR's run lock, taken by process 0; every process learns whether it was taken, so all
    stop together when another run holds it."""
    lock, error = None, None
    if host == 0:
        lock = RunLock(model_dir)
        try:
            lock.acquire()
        except Exception as e:  # noqa: BLE001  told to every process below, then raised
            lock, error = None, e
    if hosts > 1:
        from jax.experimental import multihost_utils

        taken = int(multihost_utils.broadcast_one_to_all(np.int32(error is None)))
        if not taken and error is None:
            error = RunLockedError(f"{model_dir} is in use by another run (process 0's log says which)")
    if error:
        raise error
    try:
        yield
    finally:
        if lock:
            lock.release()
