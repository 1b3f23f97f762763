"""The one path layer: every file the package reads or writes goes through here, so a local path
and a `gs://` URL are the same code (etils `epath`; gcsfs/fsspec behind `gs://`).

    p = paths.as_path("../runs/x")      # local: normalised and absolute, once, at the edge
    p = paths.as_path("gs://bucket/run")
    (p / "config.gin").read_text()

Object stores have no directories to rename and a client may finalise an upload half-written when
an exception passes through its file object, so whole-file writes are staged locally and uploaded
in one call (samtone_jax/core/atomic_file.py builds on `upload`); a reader never sees a partial object.

Backends. `EPATH_USE_TF=false` (set on import unless the user set it) keeps TensorFlow's own GCS
client out of the way: it has no endpoint override, so the code a pod runs could not be the code
the tests run against the local emulator. gcsfs's experimental zonal-bucket probe is off for the
same reason (`GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`). Retries of transient errors are the
clients' own: gcsfs retries 429 / 5xx / connection errors 6 times with exponential backoff (up to
32 s); tensorstore (orbax's arrays, T5X zarr arrays) retries 32 times from 1 s to 32 s.
`STORAGE_EMULATOR_HOST` (gcsfs) and `TENSORSTORE_GCS_HTTP_URL` (tensorstore) point both at an
emulator; tests/conftest.py's `gcs` fixture does so.
"""

from __future__ import annotations

import os
import tempfile

from samtone_jax.core.errors import BadValueError, MissingFileError, NoAccessError

os.environ.setdefault("EPATH_USE_TF", "false")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from etils import epath  # noqa: E402

Path = epath.Path
REMOTE_SCHEMES = ("gs://",)


def is_remote(path: str | os.PathLike) -> bool:
    """True for an object-store URL (gs://...)."""
    return os.fspath(path).startswith(REMOTE_SCHEMES)


def as_path(path: str | os.PathLike) -> epath.Path:
    """`path` as an epath.Path: a gs:// URL as it is, a local path expanded (~), normalised (no
    `..`: tensorstore rejects it) and made absolute against the current directory."""
    text = os.fspath(path)
    if "://" in text and not is_remote(text):
        raise BadValueError(f"{text!r}: unsupported URL scheme; use a local path or gs://bucket/...")
    if is_remote(text):
        return epath.Path(text)
    return epath.Path(os.path.abspath(os.path.expanduser(text)))


def as_str(path: str | os.PathLike) -> str:
    """`as_path(path)` as a string (for libraries that take str paths, e.g. orbax, gin)."""
    return os.fspath(as_path(path))


def gcs_filesystem():
    """gcsfs's file system (fsspec), for what epath does not offer (listing a tree, bucket copies)."""
    import fsspec

    return fsspec.filesystem("gs")


_gcs = gcs_filesystem


def bucket_of(path: str | os.PathLike) -> str | None:
    text = os.fspath(path)
    return text[len("gs://") :].split("/", 1)[0] if is_remote(text) else None


def check_bucket(path: str | os.PathLike, what: str) -> None:
    """Fail early, naming `what` (e.g. 'train.model_dir') and the bucket, when a gs:// path's bucket
    does not exist or cannot be reached with the credentials at hand."""
    bucket = bucket_of(path)
    if bucket is None:
        return
    try:
        _gcs().ls(bucket, detail=False)
    except FileNotFoundError as e:
        raise MissingFileError(
            f"{what}={os.fspath(path)!r}: bucket gs://{bucket} does not exist; create it (gcloud storage "
            f"buckets create gs://{bucket}) or fix the path"
        ) from e
    except OSError as e:  # gcsfs raises a plain OSError("Forbidden: ...") for HTTP 403
        if not isinstance(e, PermissionError) and "forbidden" not in str(e).lower():
            raise
        raise NoAccessError(
            f"{what}={os.fspath(path)!r}: no access to gs://{bucket} ({e}); grant this VM's service account "
            "Storage Object Admin on the bucket, or run `gcloud auth application-default login`"
        ) from e


def upload(local_file: str, target: epath.Path) -> None:
    """Copy a finished local file to `target` in one client call (a resumable upload that is only
    finalised when every byte arrived: the object is complete or absent)."""
    _gcs().put_file(local_file, os.fspath(target))


def download(source: epath.Path, directory: str | None = None) -> str:
    """A local copy of the remote file `source` (in `directory`, else a fresh temporary folder that
    lives as long as the process); returns its path. Local paths are returned as they are."""
    if not is_remote(source):
        return os.fspath(source)
    directory = directory or tempfile.mkdtemp(prefix="samtone_jax-")
    local = os.path.join(directory, source.name)
    _gcs().get_file(os.fspath(source), local)
    return local


def local_copy(directory: str | os.PathLike, names=None) -> str:
    """A local folder holding `directory`'s files (all of them, recursively, or those of `names`
    that exist), for readers that only open local files (safetensors, transformers, TF
    checkpoints). Local folders are returned as they are, remote ones downloaded once per call."""
    source = as_path(directory)
    if not is_remote(source):
        return os.fspath(source)
    target = tempfile.mkdtemp(prefix="samtone_jax-")
    root = os.fspath(source).rstrip("/")
    if names is None:  # one listing request, not one per folder
        files = ["gs://" + f for f in _gcs().find(root)]
    else:
        files = [f"{root}/{n}" for n in names if (source / n).exists()]
    for file in files:
        local = os.path.join(target, file[len(root) + 1 :])
        os.makedirs(os.path.dirname(local), exist_ok=True)
        _gcs().get_file(file, local)
    return target


def _compared(path: str | os.PathLike) -> str:
    """`path` as compared by `check_not_input`: a gs:// URL without its trailing '/', a local path
    with every symbolic link resolved (two spellings of one folder are one folder)."""
    text = os.fspath(path)
    return text.rstrip("/") if is_remote(text) else os.path.realpath(os.path.expanduser(text))


REPLACING = ("is", "is inside", "contains")  # every relation: a mode that replaces a whole folder
NEW_FILES = ("is", "contains")  # a mode that writes new files: beside or inside an input is fine


def check_not_input(out: str | os.PathLike, inputs, flag: str = "--out", refuse=REPLACING) -> None:
    """Refuse an output that is, is inside, or contains one of the command's inputs (`inputs`:
    (flag or name, path) pairs; None paths skipped), local or gs://, for the relations in `refuse`:
    every one for a mode that replaces a whole folder (export, average, import-checkpoint), NEW_FILES
    for a mode that writes new files (a file beside a model, embeddings under it)."""
    ours = _compared(out)
    for what, path in inputs:
        if path is None:
            continue
        theirs = _compared(path)
        if ours == theirs:
            relation = "is"
        elif ours.startswith(theirs.rstrip("/") + "/"):
            relation = "is inside"
        elif theirs.startswith(ours.rstrip("/") + "/"):
            relation = "contains"
        else:
            continue
        if relation not in refuse:
            continue
        raise BadValueError(
            f"{flag}={os.fspath(out)} {relation} {what}={os.fspath(path)}, which this command reads: writing there "
            f"would replace its own input; choose an {flag} outside it"
        )


def join(base: str | os.PathLike, *parts: str) -> str:
    """`base / parts...` as a string (local: normalised and absolute)."""
    return os.fspath(as_path(base).joinpath(*parts))


def move(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Move a file or folder (a rename locally; on gs://, copies then deletes every object)."""
    source, target = as_path(source), as_path(target)
    if is_remote(source):
        _gcs().mv(os.fspath(source), os.fspath(target), recursive=True)
    else:
        os.replace(source, target)
