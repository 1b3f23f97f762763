"""Our tower -> a Hugging Face folder (config.json + model.safetensors) of its family's transformers
class (`T5EncoderModel`, `BertModel`, ...: the family record's `hf_architecture`).

The name mapping is the importer's (the family's `hf_locate` + `source._stored_shape`) run
backwards, so export and import cannot drift apart: a tensor goes out under exactly the name and
layout it would be read back from. Written by transformers' own `save_pretrained`.
"""

from __future__ import annotations

import numpy as np

from samtone_jax.checkpoints.source import _flatten, _stored_shape
from samtone_jax.core.errors import BadValueError
from samtone_jax.models import families


def hf_state_dict(tower: dict, family, wanted: set[str]) -> dict[str, np.ndarray]:
    """{Hugging Face name: float32 array} for our tower tree, under each name the family's `hf_locate`
    gives that the transformers model holds (`wanted`; T5's shared embedding is under two), the token
    embedder's padding row back where the family's vocabulary has it."""
    out = {}
    for path, value in _flatten(tower).items():
        names, transposed = family.hf_locate(path)
        value = np.asarray(value, np.float32).reshape(_stored_shape(path, value.shape, False))
        if path == ("token_embedder",):
            value = family.swap_pad_row(value)
        if transposed:
            value = value.T
        for name in [n for n in names if n in wanted] or names[:1]:
            out[name] = np.array(value, dtype=np.float32, order="C")  # a writable copy for torch
    return out


def write_encoder(tower: dict, config, folder: str) -> None:
    """A Hugging Face folder of the family's encoder class at `folder` holding `tower` (hf_model)."""
    hf_model(tower, config).save_pretrained(folder, safe_serialization=True)


def hf_model(tower: dict, config, attention: str | None = None):
    """The transformers encoder of `config`'s family holding `tower` (checked: every weight set, none
    left over; weights we do not train, such as BERT's pooler, are zeros, so loaders warn of nothing);
    CPU, float32, eval mode. `attention`: transformers' attn_implementation (None: its default)."""
    import torch
    import transformers

    family = families.of(config)
    hf = family.hf_config(config)
    if attention is not None:
        hf._attn_implementation = attention
    model = getattr(transformers, family.hf_architecture)(hf)
    expected = set(model.state_dict())
    state = hf_state_dict(tower, family, expected)
    state |= {
        k: np.zeros(v.shape, np.float32)
        for k, v in model.state_dict().items()
        if k.startswith(family.hf_zero_prefixes)  # () matches nothing
    }
    state = {k: torch.from_numpy(v) for k, v in state.items()}
    if set(state) != expected:
        raise BadValueError(
            f"tower does not match {type(model).__name__}: missing {sorted(expected - set(state))[:5]}, "
            f"unexpected {sorted(set(state) - expected)[:5]}"
        )
    model.load_state_dict(state, strict=True)
    return model.eval()
