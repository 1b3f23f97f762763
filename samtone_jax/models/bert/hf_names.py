"""The BERT tower under Hugging Face's names, both directions: `BertModel`'s variable names (or a
`BertFor*` model's, under the `bert.` prefix; LayerNorm's old `gamma` / `beta` too) for each of our
parameters (import reads them, export writes the first), our BertConfig from a config.json (refusing
what BertEncoder is not) and its gin bindings, and transformers' BertConfig of our shape."""

from __future__ import annotations

from samtone_jax.core.errors import CheckpointMismatchError
from samtone_jax.models.bert.tower import BertConfig
from samtone_jax.models.family import check_same_shape, gin_bindings

_SHAPE = ("vocab_size", "emb_dim", "num_heads", "num_layers", "head_dim", "mlp_dim", "max_length")


def _prefixed(name: str) -> list[str]:
    return [name, f"bert.{name}"]  # BertModel's own names, or a BertFor* model's


def _layer_norm(module: str, leaf: str) -> list[str]:
    new, old = ("weight", "gamma") if leaf == "scale" else ("bias", "beta")  # old TF-converted names
    return _prefixed(f"{module}.{new}") + _prefixed(f"{module}.{old}")


def locate(path):
    """(candidate Hugging Face names, transposed?) of one of our BertEncoder parameters."""
    leaf = path[-1]
    if path[0] in ("token_embedder", "position_embedder", "token_type_embedder"):
        table = {"token_embedder": "word", "position_embedder": "position", "token_type_embedder": "token_type"}
        return _prefixed(f"embeddings.{table[path[0]]}_embeddings.weight"), False
    if path[0] == "embedding_layer_norm":
        return _layer_norm("embeddings.LayerNorm", leaf), False
    layer = f"encoder.layer.{int(path[0].split('_')[1])}"
    if path[1] == "attention":
        name, part = leaf.rsplit("_", 1)  # query_kernel -> (query, kernel)
        module = "attention.output.dense" if name == "out" else f"attention.self.{name}"
        return _prefixed(f"{layer}.{module}.{'weight' if part == 'kernel' else 'bias'}"), part == "kernel"
    if path[1] in ("attention_layer_norm", "mlp_layer_norm"):
        module = "attention.output.LayerNorm" if path[1] == "attention_layer_norm" else "output.LayerNorm"
        return _layer_norm(f"{layer}.{module}", leaf), False
    name, part = leaf.rsplit("_", 1)  # wi_kernel, wo_bias, ...
    module = "intermediate.dense" if name == "wi" else "output.dense"
    return _prefixed(f"{layer}.{module}.{'weight' if part == 'kernel' else 'bias'}"), part == "kernel"


def is_encoder_variable(name: str) -> bool:
    return name.removeprefix("bert.").startswith(("encoder.layer.", "embeddings.")) and not name.endswith(
        "position_ids"
    )


def config_from_hf(hf: dict, where: str) -> BertConfig:
    """Our BertConfig of a Hugging Face BERT config.json (`hf`, read from `where`), refusing what
    BertEncoder is not."""
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointMismatchError(
            f"{where}: position_embedding_type {hf['position_embedding_type']!r}; only 'absolute'"
        )
    if hf.get("hidden_act", "gelu") != "gelu":
        raise CheckpointMismatchError(
            f"{where}: hidden_act {hf['hidden_act']!r}; the BERT tower uses exact (erf) 'gelu'"
        )
    if hf.get("pad_token_id", 0) != 0:
        raise CheckpointMismatchError(f"{where}: pad_token_id {hf['pad_token_id']}; the towers pad with id 0")
    heads, hidden = hf["num_attention_heads"], hf["hidden_size"]
    if hidden % heads:
        raise CheckpointMismatchError(f"{where}: hidden_size {hidden} is not a multiple of {heads} heads")
    return BertConfig(
        vocab_size=hf["vocab_size"],
        emb_dim=hidden,
        num_heads=heads,
        num_layers=hf["num_hidden_layers"],
        head_dim=hidden // heads,
        mlp_dim=hf["intermediate_size"],
        max_length=hf["max_position_embeddings"],
        type_vocab_size=hf.get("type_vocab_size", 2),
        layer_norm_epsilon=hf.get("layer_norm_eps", 1e-12),
        dropout_rate=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
    )


def bindings(hf: dict, where: str) -> list[str]:
    """BertConfig.* gin bindings of a config.json. The dropout rates are the source's
    (hidden_dropout_prob, attention_probs_dropout_prob: 0.1 for BERT), as fine-tuning it in
    sentence-transformers would use."""
    config = config_from_hf(hf, where)
    fields = _SHAPE + ("type_vocab_size", "layer_norm_epsilon", "dropout_rate", "attention_dropout_rate")
    return gin_bindings(config, fields)


def check_hf_config(hf: dict, where: str, config: BertConfig) -> None:
    """Fail on a config.json that disagrees with the gin BertConfig, naming the setting."""
    check_same_shape(config_from_hf(hf, where), config, _SHAPE, where)


def hf_config(config: BertConfig):
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
