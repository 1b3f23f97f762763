"""The native CPU top-k kernel (evaluation/native_top_k.py): exact merging (ties, padding, NaN), its
compile cache, clear errors when it cannot be built, and search's fallback to lax.top_k."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import require_compiler

from samtone_jax.evaluation import native_top_k, search


def test_merge_keeps_the_best_ties_by_lower_id_and_skips_padding_and_nan():
    require_compiler()
    rng = np.random.default_rng(0)
    q, chunk, chunks, k, n = 5, 40, 4, 7, 150  # ids 150..159 of the last chunk are padding
    scores = rng.integers(-3, 4, size=(q, chunk * chunks)).astype(np.float32)  # many ties
    scores[0, 5] = np.nan
    scores[1, 155] = 100.0  # padding: must not enter even though it is the largest
    best, ids = jnp.full((q, k), -jnp.inf), jnp.full((q, k), -1, jnp.int32)
    merge = jax.jit(native_top_k.merge, static_argnames="n")
    for c in range(chunks):
        best, ids = merge(jnp.asarray(scores[:, c * chunk : (c + 1) * chunk]), c * chunk, best, ids, n=n)
    best, ids = native_top_k.sort_best(best, ids)
    valid = np.where(np.isnan(scores[:, :n]), -np.inf, scores[:, :n])
    order = np.stack([np.lexsort((np.arange(n), -row))[:k] for row in valid])
    np.testing.assert_array_equal(np.asarray(ids), order)
    np.testing.assert_array_equal(np.asarray(best), np.take_along_axis(valid, order, 1))


def test_build_compiles_once_into_the_cache(tmp_path, monkeypatch):
    require_compiler()
    monkeypatch.setenv("SAMTONE_NATIVE_CACHE", str(tmp_path))
    path = native_top_k.build()
    assert os.path.dirname(path) == str(tmp_path) and os.listdir(tmp_path) == [os.path.basename(path)]
    built = os.stat(path).st_mtime_ns
    assert native_top_k.build() == path and os.stat(path).st_mtime_ns == built  # reused, not rebuilt


def test_build_errors_name_the_compiler_and_leave_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SAMTONE_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    with pytest.raises(native_top_k.NativeBuildError, match="no C.. compiler 'no-such-compiler-xyz'.*set .CXX"):
        native_top_k.build()
    monkeypatch.setenv("CXX", "false")  # a compiler that fails
    with pytest.raises(native_top_k.NativeBuildError, match="false failed on .*top_k_merge.cc"):
        native_top_k.build()
    assert os.listdir(tmp_path) == []  # no half-written library


def test_search_falls_back_to_lax_when_the_kernel_is_unavailable(monkeypatch):
    monkeypatch.setattr(native_top_k, "_load", lambda: "no C++ compiler 'g++' on PATH")
    rng = np.random.default_rng(1)
    queries, corpus = rng.standard_normal((3, 8), np.float32), rng.standard_normal((50, 8), np.float32)
    scores, ids = search.exact_top_k(queries, corpus, k=5, chunk_size=16)  # 'auto': lax.top_k
    expected = np.argsort(-(queries @ corpus.T), axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(ids, expected)
    with pytest.raises(RuntimeError, match="selection='native' but .*no C.. compiler 'g..'"):
        search.exact_top_k(queries, corpus, k=5, chunk_size=16, selection="native")
    with pytest.raises(ValueError, match="unknown top-k selection 'heap'"):
        search.exact_top_k(queries, corpus, k=5, chunk_size=16, selection="heap")


def test_an_unwritable_cache_folder_falls_back_to_a_temp_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("SAMTONE_NATIVE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    (tmp_path / "file").write_text("a file where the cache folder would go")
    monkeypatch.setattr(native_top_k.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    assert native_top_k._cache_dir().startswith(str(tmp_path / "tmp" / "samtone_jax-"))


def test_auto_selection_on_an_accelerator_host_never_builds_the_kernel(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    monkeypatch.setattr(native_top_k, "_load", lambda: pytest.fail("the kernel was built on a TPU host"))
    assert not search._use_native("auto", None)
