"""DistilBERT towers: the Flax encoder against transformers' DistilBertModel (tiny random configs),
packing, what the importer refuses, and import -> train (packed) -> export -> sentence-transformers /
Hugging Face, reloaded equal."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from conftest import imported_tower, tiny_wordpiece_bert, trains_and_exports

from samtone_jax.checkpoints import hf
from samtone_jax.checkpoints.source import CheckpointMismatchError
from samtone_jax.models.distilbert import DistilBertEncoder
from samtone_jax.models.distilbert.hf_names import config_from_hf

TINY = dict(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=40)
TINY |= dict(dropout=0.0, attention_dropout=0.0)


def _distilbert(config):
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.DistilBertModel(transformers.DistilBertConfig(**config))
    with torch.no_grad():  # LayerNorms away from 1 / 0, so a swapped scale and bias would show
        for name, p in model.named_parameters():
            if "layer_norm" in name or "LayerNorm" in name:
                p.add_(0.5 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    model = _distilbert(TINY)
    folder = tmp_path_factory.mktemp("distilbert")
    model.save_pretrained(folder)
    return folder, model


def _our_tower(folder):
    return imported_tower(DistilBertEncoder, config_from_hf, folder)


def test_the_distilbert_tower_computes_what_transformers_computes(tiny_folder):
    import torch

    folder, torch_model = tiny_folder
    config, params, used = _our_tower(folder)
    assert len(used) == 4 + 16 * 2  # 2 tables + LN; 16 tensors a layer
    tokens = np.random.default_rng(1).integers(1, 99, (3, 40)).astype(np.int32)
    for row, n in enumerate([40, 17, 1]):
        tokens[row, n:] = 0
    ours = np.asarray(jax.jit(DistilBertEncoder(config).apply)({"params": params}, tokens))
    with torch.no_grad():
        theirs = torch_model(
            input_ids=torch.tensor(tokens, dtype=torch.long), attention_mask=torch.tensor(tokens != 0)
        ).last_hidden_state.numpy()
    real = tokens != 0
    np.testing.assert_allclose(ours[real], theirs[real], atol=2e-5, rtol=1e-5)


def test_a_packed_distilbert_row_gives_each_text_its_own_positions(tiny_folder):
    folder, _ = tiny_folder
    config, params, _ = _our_tower(folder)
    rng = np.random.default_rng(2)
    texts = [rng.integers(1, 99, n).astype(np.int32) for n in (5, 3, 6)]
    row = np.concatenate([*texts, np.zeros(2, np.int32)])[None]
    segment_ids = np.concatenate([np.full(len(t), i + 1) for i, t in enumerate(texts)] + [np.zeros(2)])[None]
    apply = jax.jit(DistilBertEncoder(config).apply)
    packed = np.asarray(apply({"params": params}, row, segment_ids=segment_ids.astype(np.int32)))[0]
    start = 0
    for t in texts:
        alone = np.asarray(apply({"params": params}, t[None]))[0]
        np.testing.assert_allclose(packed[start : start + len(t)], alone, atol=2e-5)
        start += len(t)


def test_distilbert_imports_refuse_what_the_tower_is_not(tiny_folder, tmp_path):
    folder, _ = tiny_folder
    config = json.loads((folder / "config.json").read_text())
    for change, said in (
        ({"activation": "relu"}, "activation 'relu'"),
        ({"pad_token_id": 1}, "pad_token_id 1; DistilBERT pads with id 0"),
        ({"model_type": "funnel"}, "model_type 'funnel', which no tower family here loads; supported: .*distilbert"),
    ):
        bad = tmp_path / next(iter(change))
        bad.mkdir()
        (bad / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(CheckpointMismatchError, match=said):
            hf.model_bindings(str(bad))


@pytest.mark.slow
def test_a_distilbert_tower_trains_packed_from_an_import_then_exports(wordnet_env, tmp_path):
    from samtone_jax.tasks import catalogue

    folder = tiny_wordpiece_bert(tmp_path / "hf", catalogue.collection("wordnet_definitions", "all").texts())
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    (folder / "config.json").unlink()  # the BertModel beside the tokenizer replaced by a DistilBertModel
    _distilbert({**TINY, "vocab_size": vocab, "max_position_embeddings": 64}).save_pretrained(folder)
    trains_and_exports(folder, tmp_path, "distilbert", 0)
