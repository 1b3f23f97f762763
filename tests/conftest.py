"""Shared fixtures: tiny configs, the shared real-data folder, and environment for JAX / TF."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Eight simulated CPU devices for the sharding tests; must be set before jax is imported.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path:
    """$SAMTONE_DATA_DIR, else ../shared/data next to the repository."""
    return Path(os.environ.get("SAMTONE_DATA_DIR", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return shared_data_dir()


def require_shared(relative: str) -> Path:
    """The path under the shared data folder, or skip the test saying what is missing."""
    path = shared_data_dir() / relative
    if not path.exists():
        pytest.skip(f"real data not available: {path} is absent (set SAMTONE_DATA_DIR to the shared data folder)")
    return path


@pytest.fixture
def tiny_config():
    from samtone_jax.models import T5Config

    return T5Config(vocab_size=97, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64, num_layers=2)


@pytest.fixture
def squad_dev(monkeypatch, tmp_path_factory):
    """The real rebuilt SQuAD dev task (skips when absent): SAMTONE_DATA_DIR set for the test, and
    a 2,000-piece SentencePiece vocabulary trained once per session on all its text."""
    require_shared("multireqa_squad_dev/questions.jsonl")
    monkeypatch.setenv("SAMTONE_DATA_DIR", str(shared_data_dir()))
    return _squad_dev_vocab(tmp_path_factory)


_SQUAD_VOCAB: list = []


def _squad_dev_vocab(tmp_path_factory):
    if not _SQUAD_VOCAB:
        from samtone_jax import tasks
        from samtone_jax.data import vocab as vocab_lib

        collection = tasks.load("multireqa_squad_dev", "all")
        path = tmp_path_factory.mktemp("squad_vocab") / "vocab.model"
        vocab_lib.train_sentencepiece(collection.texts(), 2000, str(path))
        _SQUAD_VOCAB.append(path)
    return _SQUAD_VOCAB[0]
