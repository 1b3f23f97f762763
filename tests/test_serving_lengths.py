"""A model is served at its serving lengths, not its training lengths (inference/serving_lengths.py):
the precedence of the recorded lengths, and what a run inherits from the model it starts from. The
end to end (import at 64, train at 12 / 16, eval, export) is tests/test_own_data.py's CLI test."""

from __future__ import annotations

import gin
import pytest

from samtone_jax.cli import gin_registry
from samtone_jax.inference import serving_lengths


def test_serving_lengths_come_before_training_lengths_and_a_default_last():
    assert serving_lengths.of_settings({"train.query_length": 32, "train.doc_length": 48}) == (32, 48)
    both = {"train.query_length": 32, "train.doc_length": 48, "serving.query_length": 256, "serving.doc_length": 200}
    assert serving_lengths.of_settings(both) == (256, 200)
    assert serving_lengths.of_settings({}) == serving_lengths.DEFAULT
    assert serving_lengths.training_lengths(both) == (32, 48)


@pytest.fixture
def clean_gin():
    yield
    gin.clear_config()


def test_a_run_inherits_its_starting_models_serving_lengths_unless_set(tiny_bert_import, clean_gin):
    _, imported = tiny_bert_import  # an import of a 64-position BERT: served at 64
    assert "serving.doc_length = 64" in (imported / "model.gin").read_text()
    gin_registry.parse([], [])
    assert serving_lengths.inherit(str(imported)) == {"serving.query_length": 64, "serving.doc_length": 64}
    assert gin.query_parameter("serving.doc_length") == 64
    gin_registry.parse([], ["serving.doc_length = 32"])  # set by the user: kept
    assert serving_lengths.inherit(str(imported)) == {"serving.query_length": 64}
    assert gin.query_parameter("serving.doc_length") == 32
    gin_registry.parse([], [])
    assert serving_lengths.inherit(None) == {}  # from scratch: served at its training lengths
    with pytest.raises(ValueError):
        gin.query_parameter("serving.query_length")
