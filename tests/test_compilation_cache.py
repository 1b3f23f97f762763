"""The persistent compilation cache every `samtone` mode turns on (compilation_cache.py): a second
identical run compiles nothing (every program a cache hit, none written), a changed shape compiles
again; the folder and 'off' are chosen by flag or environment. Compilations are counted with JAX's
own monitoring events, in a fresh process each run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import tiny_train_argv

from samtone_jax.core import compilation_cache

_COUNTING = """
import json, sys
from collections import Counter
import jax.monitoring
events = Counter()
jax.monitoring.register_event_listener(lambda name, **kw: events.update([name]))
from samtone_jax.cli import main as cli
code = cli.main(json.loads(sys.argv[1]))
print("EVENTS " + json.dumps({k.rsplit("/", 1)[-1]: v for k, v in events.items() if "compilation_cache" in k}))
sys.exit(code)
"""


def _run(argv, cache, env_extra=None):
    env = dict(os.environ, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", TF_CPP_MIN_LOG_LEVEL="2")
    for name in (compilation_cache.ENVIRONMENT, "JAX_COMPILATION_CACHE_DIR"):
        env.pop(name, None)
    env |= env_extra or {}
    done = subprocess.run(
        [sys.executable, "-c", _COUNTING, json.dumps([f"--compilation_cache={cache}", *argv])],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("EVENTS "))
    return json.loads(line[len("EVENTS ") :])


@pytest.mark.slow
def test_a_second_identical_run_compiles_nothing_and_a_changed_shape_compiles_again(wordnet_env, tmp_path):
    cache = tmp_path / "xla"
    first = _run(tiny_train_argv(tmp_path / "a", wordnet_env[1], steps=1), cache)
    assert first.get("cache_misses", 0) > 0 and first.get("cache_hits", 0) == 0, first
    entries = sorted(os.listdir(cache))
    again = _run(tiny_train_argv(tmp_path / "b", wordnet_env[1], steps=1), cache)  # a new run, the same shapes
    assert again.get("cache_misses", 0) == 0, again
    assert again["cache_hits"] == again["compile_requests_use_cache"] >= first["cache_misses"], (first, again)
    assert sorted(os.listdir(cache)) == entries
    other = tiny_train_argv(tmp_path / "c", wordnet_env[1], steps=1, extra=["--gin.train.batch_size=4"])
    changed = _run(other, cache)
    assert changed.get("cache_misses", 0) > 0, changed


def test_off_disables_jaxs_cache_and_jaxs_own_folder_is_kept_when_ours_is_not_given(tmp_path, monkeypatch):
    import jax

    monkeypatch.delenv(compilation_cache.ENVIRONMENT, raising=False)
    before = (jax.config.jax_enable_compilation_cache, jax.config.jax_compilation_cache_dir)
    try:
        assert compilation_cache.enable("off") is None and jax.config.jax_enable_compilation_cache is False
        jax.config.update("jax_enable_compilation_cache", True)
        jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax_own"))
        assert compilation_cache.enable() == str(tmp_path / "jax_own")  # JAX_COMPILATION_CACHE_DIR's
        assert compilation_cache.enable(str(tmp_path / "ours")) == str(tmp_path / "ours")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "ours")
    finally:
        jax.config.update("jax_enable_compilation_cache", before[0])
        jax.config.update("jax_compilation_cache_dir", before[1])


def test_the_cache_folder_by_flag_environment_or_default_per_cpu(tmp_path, monkeypatch):
    monkeypatch.delenv(compilation_cache.ENVIRONMENT, raising=False)
    monkeypatch.setenv("SAMTONE_CACHE_DIR", str(tmp_path))
    default = compilation_cache.directory()
    assert default.startswith(str(tmp_path / "xla")) and len(os.path.basename(default)) == 12
    monkeypatch.setenv(compilation_cache.ENVIRONMENT, "gs://bucket/xla")
    assert compilation_cache.directory() == "gs://bucket/xla"
    assert compilation_cache.directory(str(tmp_path / "mine")) == str(tmp_path / "mine")  # the flag wins
    monkeypatch.setenv(compilation_cache.ENVIRONMENT, "OFF")
    assert compilation_cache.directory() is None
    assert compilation_cache.directory("off") is None
