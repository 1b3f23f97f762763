"""The package as a user installs it: a wheel built from this tree (`pip wheel .`) and installed into a
fresh virtual environment, with no checkout on the path, runs `samtone --help`, trains a tiny model
with the gin files the wheel ships (`--gin_file=models/t5_1_1_tiny.gin` resolved inside the installed
package) and loads the run with `samtone_jax.load`.

The fresh environment reuses this venv's third-party packages through a .pth line (installing the
pinned dependencies again would take minutes and GBs): a path added by a .pth line is searched, but
the .pth files inside it are not read, so the editable install's pointer to the checkout is not
followed. The test asserts where `samtone_jax` and its gin files were imported from."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import tiny_train_argv

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_a_built_wheel_installs_and_trains_with_its_own_gin_files(wordnet_env, tmp_path):
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("samtone_jax-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet", str(wheel)]
    installed = subprocess.run(pip, capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"TF_CPP_MIN_LOG_LEVEL": "2"}
    away = tmp_path / "elsewhere"  # no checkout in the working directory either
    away.mkdir()

    def run(*argv, program=python):
        done = subprocess.run([str(program), *argv], capture_output=True, text=True, cwd=away, env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    where = run("-c", "import samtone_jax.config.gin_config as g; print(g.__file__); print(g.GIN_CONFIGS_DIR)").split()
    assert all(w.startswith(str(site)) for w in where), where
    samtone = venv / "bin" / "samtone"  # the console script the wheel declares
    assert "train" in run("--help", program=samtone)
    model_dir = tmp_path / "run"
    out = run(*tiny_train_argv(model_dir, wordnet_env[1], steps=1), program=samtone)
    assert "step 1/1" in out
    embedded = run(
        "-c", f"import samtone_jax; print(samtone_jax.load({str(model_dir)!r}).encode_queries(['a dog']).shape)"
    )
    assert embedded.strip().startswith("(1, "), embedded
