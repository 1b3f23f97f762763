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
