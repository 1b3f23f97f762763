"""Our T5 tower -> a Hugging Face `T5EncoderModel` folder (config.json + model.safetensors).

The name mapping is the importer's (`checkpoints/hf.py::_locate` + `source._stored_shape`) run
backwards, so export and import cannot drift apart: a tensor goes out under exactly the name and
layout it would be read back from. Written by transformers' own `save_pretrained`.
"""

from __future__ import annotations

import numpy as np

from samtone_jax.checkpoints.hf import _locate
from samtone_jax.checkpoints.source import _flatten, _stored_shape
from samtone_jax.errors import BadValueError
from samtone_jax.models import T5Config

_FEED_FORWARD = {("relu",): "relu", ("gelu", "linear"): "gated-gelu"}


def hf_config(config: T5Config):
    """transformers.T5Config of an encoder with our T5Config's shape."""
    import transformers

    activation = _FEED_FORWARD.get(tuple(config.mlp_activations))
    if activation is None:
        raise BadValueError(
            f"T5Config.mlp_activations={config.mlp_activations} has no Hugging Face equivalent (relu or gated-gelu)"
        )
    return transformers.T5Config(
        vocab_size=config.vocab_size,
        d_model=config.emb_dim,
        d_kv=config.head_dim,
        d_ff=config.mlp_dim,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        relative_attention_num_buckets=config.relative_attention_num_buckets,
        relative_attention_max_distance=config.relative_attention_max_distance,
        dropout_rate=0.0,
        layer_norm_epsilon=config.layer_norm_epsilon,
        feed_forward_proj=activation,
        is_encoder_decoder=False,
        use_cache=False,
        tie_word_embeddings=False,
    )


def hf_state_dict(tower: dict) -> dict[str, np.ndarray]:
    """{HF T5EncoderModel name: float32 array} for our tower tree."""
    out = {}
    for path, value in _flatten(tower).items():
        names, transposed = _locate(path)
        value = np.asarray(value, np.float32).reshape(_stored_shape(path, value.shape, False))
        if transposed:
            value = value.T
        for name in names:
            out[name] = np.array(value, dtype=np.float32, order="C")  # a writable copy for torch
    return out


def write_t5_encoder(tower: dict, config: T5Config, folder: str) -> None:
    """A T5EncoderModel folder at `folder` holding `tower` (checked: every weight set, none left over)."""
    import torch
    import transformers

    model = transformers.T5EncoderModel(hf_config(config))
    state = {k: torch.from_numpy(v) for k, v in hf_state_dict(tower).items()}
    expected = set(model.state_dict())
    if set(state) != expected:
        raise BadValueError(
            f"tower does not match T5EncoderModel: missing {sorted(expected - set(state))[:5]}, "
            f"unexpected {sorted(set(state) - expected)[:5]}"
        )
    model.load_state_dict(state, strict=True)
    model.save_pretrained(folder, safe_serialization=True)
