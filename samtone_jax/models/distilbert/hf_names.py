"""The DistilBERT tower under Hugging Face's names, both directions: `DistilBertModel`'s variable names
(or a `DistilBertFor*` model's, under the `distilbert.` prefix) for each of our parameters; our
DistilBertConfig from a config.json (dim, n_layers, n_heads, hidden_dim: refusing what the tower is
not) and its gin bindings, and transformers' DistilBertConfig of our shape."""

from __future__ import annotations

from samtone_jax.core.errors import CheckpointMismatchError
from samtone_jax.models.distilbert.tower import DistilBertConfig
from samtone_jax.models.family import check_same_shape, gin_bindings

_SHAPE = ("vocab_size", "emb_dim", "num_heads", "num_layers", "head_dim", "mlp_dim", "max_length")
_ATTENTION = {"query": "q_lin", "key": "k_lin", "value": "v_lin", "out": "out_lin"}


def _prefixed(name: str) -> list[str]:
    return [name, f"distilbert.{name}"]


def _parameter(module: str, part: str) -> list[str]:
    return _prefixed(f"{module}.{'weight' if part in ('kernel', 'scale') else 'bias'}")


def locate(path):
    """(candidate Hugging Face names, transposed?) of one of our DistilBertEncoder parameters."""
    leaf = path[-1]
    if path[0] in ("token_embedder", "position_embedder"):
        table = {"token_embedder": "word", "position_embedder": "position"}
        return _prefixed(f"embeddings.{table[path[0]]}_embeddings.weight"), False
    if path[0] == "embedding_layer_norm":
        return _parameter("embeddings.LayerNorm", leaf), False
    layer = f"transformer.layer.{int(path[0].split('_')[1])}"
    if path[1] == "attention":
        name, part = leaf.rsplit("_", 1)
        return _parameter(f"{layer}.attention.{_ATTENTION[name]}", part), part == "kernel"
    if path[1] in ("attention_layer_norm", "mlp_layer_norm"):
        module = "sa_layer_norm" if path[1] == "attention_layer_norm" else "output_layer_norm"
        return _parameter(f"{layer}.{module}", leaf), False
    name, part = leaf.rsplit("_", 1)  # wi_kernel, wo_bias, ...
    return _parameter(f"{layer}.ffn.{'lin1' if name == 'wi' else 'lin2'}", part), part == "kernel"


def is_encoder_variable(name: str) -> bool:
    return name.removeprefix("distilbert.").startswith(("transformer.layer.", "embeddings.")) and not name.endswith(
        "position_ids"
    )


def config_from_hf(hf: dict, where: str) -> DistilBertConfig:
    """Our DistilBertConfig of a Hugging Face DistilBERT config.json, refusing what the tower is not."""
    if hf.get("activation", "gelu") != "gelu":
        raise CheckpointMismatchError(
            f"{where}: activation {hf['activation']!r}; the DistilBERT tower uses exact (erf) 'gelu'"
        )
    if hf.get("pad_token_id", 0) != 0:
        raise CheckpointMismatchError(f"{where}: pad_token_id {hf['pad_token_id']}; DistilBERT pads with id 0")
    heads, hidden = hf["n_heads"], hf["dim"]
    if hidden % heads:
        raise CheckpointMismatchError(f"{where}: dim {hidden} is not a multiple of {heads} heads")
    return DistilBertConfig(
        vocab_size=hf["vocab_size"],
        emb_dim=hidden,
        num_heads=heads,
        num_layers=hf["n_layers"],
        head_dim=hidden // heads,
        mlp_dim=hf["hidden_dim"],
        max_length=hf.get("max_position_embeddings", 512),
        dropout_rate=hf.get("dropout", 0.1),
        attention_dropout_rate=hf.get("attention_dropout", 0.1),
    )


def bindings(hf: dict, where: str) -> list[str]:
    """DistilBertConfig.* gin bindings of a config.json (the source's dropout rates)."""
    config = config_from_hf(hf, where)
    fields = _SHAPE + ("dropout_rate", "attention_dropout_rate")
    return gin_bindings(config, fields)


def check_hf_config(hf: dict, where: str, config: DistilBertConfig) -> None:
    """Fail on a config.json that disagrees with the gin DistilBertConfig, naming the setting."""
    check_same_shape(config_from_hf(hf, where), config, _SHAPE, where)


def hf_config(config: DistilBertConfig):
    """transformers.DistilBertConfig of an encoder with our DistilBertConfig's shape."""
    import transformers

    return transformers.DistilBertConfig(
        vocab_size=config.vocab_size,
        dim=config.emb_dim,
        n_layers=config.num_layers,
        n_heads=config.num_heads,
        hidden_dim=config.mlp_dim,
        max_position_embeddings=config.max_length,
        activation="gelu",
        dropout=0.0,
        attention_dropout=0.0,
    )
