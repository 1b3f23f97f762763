"""Our tower -> a Hugging Face folder (config.json + model.safetensors): a T5 tower as
`T5EncoderModel`, a BERT tower as `BertModel`.

The name mapping is the importer's (`checkpoints/hf.py::_locate` / `checkpoints/hf_bert.py::_locate`
+ `source._stored_shape`) run backwards, so export and import cannot drift apart: a tensor goes out
under exactly the name and layout it would be read back from. Written by transformers' own
`save_pretrained`.
"""

from __future__ import annotations

import numpy as np

from samtone_jax.checkpoints.hf import _locate
from samtone_jax.checkpoints.hf_bert import _locate as bert_locate
from samtone_jax.checkpoints.source import _flatten, _stored_shape
from samtone_jax.core.errors import BadValueError
from samtone_jax.models import BertConfig, T5Config

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


def hf_state_dict(tower: dict, locate=_locate, every_name: bool = True) -> dict[str, np.ndarray]:
    """{Hugging Face name: float32 array} for our tower tree: under every candidate name `locate`
    gives (T5: the shared embedding's two names), or only the first (BERT: BertModel's own names)."""
    out = {}
    for path, value in _flatten(tower).items():
        names, transposed = locate(path)
        value = np.asarray(value, np.float32).reshape(_stored_shape(path, value.shape, False))
        if transposed:
            value = value.T
        for name in names if every_name else names[:1]:
            out[name] = np.array(value, dtype=np.float32, order="C")  # a writable copy for torch
    return out


def bert_hf_config(config: BertConfig):
    """transformers.BertConfig of an encoder with our BertConfig's shape."""
    import transformers

    return transformers.BertConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.emb_dim,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        intermediate_size=config.mlp_dim,
        max_position_embeddings=config.max_length,
        type_vocab_size=config.type_vocab_size,
        layer_norm_eps=config.layer_norm_epsilon,
        hidden_act="gelu",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def write_encoder(tower: dict, config: T5Config | BertConfig, folder: str) -> None:
    """A T5EncoderModel or BertModel folder at `folder` holding `tower` (hf_model)."""
    hf_model(tower, config).save_pretrained(folder, safe_serialization=True)


def hf_model(tower: dict, config: T5Config | BertConfig, attention: str | None = None):
    """The transformers T5EncoderModel or BertModel holding `tower` (checked: every weight set, none
    left over; a BERT tower's unused pooler is zeros, so loaders warn of nothing); CPU, float32, eval
    mode. `attention`: transformers' attn_implementation (None: its default)."""
    import torch
    import transformers

    hf = bert_hf_config(config) if isinstance(config, BertConfig) else hf_config(config)
    if attention is not None:
        hf._attn_implementation = attention
    if isinstance(config, BertConfig):
        model = transformers.BertModel(hf)
        state = hf_state_dict(tower, bert_locate, every_name=False)
        state |= {k: np.zeros(v.shape, np.float32) for k, v in model.state_dict().items() if k.startswith("pooler.")}
    else:
        model = transformers.T5EncoderModel(hf)
        state = hf_state_dict(tower)
    state = {k: torch.from_numpy(v) for k, v in state.items()}
    expected = set(model.state_dict())
    if set(state) != expected:
        raise BadValueError(
            f"tower does not match {type(model).__name__}: missing {sorted(expected - set(state))[:5]}, "
            f"unexpected {sorted(set(state) - expected)[:5]}"
        )
    model.load_state_dict(state, strict=True)
    return model.eval()
