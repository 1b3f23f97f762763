"""The RoBERTa tower under Hugging Face's names: BERT's (models/bert/hf_names.py) with a `roberta.`
prefix for `RobertaFor*` / `XLMRobertaFor*` models; our RobertaConfig from a config.json (model_type
'roberta' or 'xlm-roberta'), its gin bindings, and transformers' RobertaConfig of our shape."""

from __future__ import annotations

from samtone_jax.core.errors import CheckpointMismatchError
from samtone_jax.models.bert import hf_names as bert_names
from samtone_jax.models.family import check_same_shape, gin_bindings
from samtone_jax.models.roberta.tower import FIRST_POSITION, RobertaConfig

PAD_ID = 1  # <pad> in RoBERTa's and XLM-R's vocabularies (<s> is 0): swapped with 0 on the way in and out
_SHAPE = ("vocab_size", "emb_dim", "num_heads", "num_layers", "head_dim", "mlp_dim", "max_length", "type_vocab_size")


def locate(path):
    """(candidate Hugging Face names, transposed?) of one of our RobertaEncoder parameters."""
    names, transposed = bert_names.locate(path)
    return [f"roberta.{n.removeprefix('bert.')}" if n.startswith("bert.") else n for n in names], transposed


def is_encoder_variable(name: str) -> bool:
    return name.removeprefix("roberta.").startswith(("encoder.layer.", "embeddings.")) and not name.endswith(
        ("position_ids", "token_type_ids")
    )


def config_from_hf(hf: dict, where: str) -> RobertaConfig:
    """Our RobertaConfig of a Hugging Face RoBERTa / XLM-R config.json, refusing what RobertaEncoder is not."""
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointMismatchError(
            f"{where}: position_embedding_type {hf['position_embedding_type']!r}; only 'absolute'"
        )
    if hf.get("hidden_act", "gelu") != "gelu":
        raise CheckpointMismatchError(f"{where}: hidden_act {hf['hidden_act']!r}; the RoBERTa tower uses exact 'gelu'")
    if hf.get("pad_token_id", PAD_ID) != PAD_ID:
        raise CheckpointMismatchError(
            f"{where}: pad_token_id {hf['pad_token_id']}; RoBERTa's positions and embeddings pad with id {PAD_ID}"
        )
    heads, hidden = hf["num_attention_heads"], hf["hidden_size"]
    if hidden % heads:
        raise CheckpointMismatchError(f"{where}: hidden_size {hidden} is not a multiple of {heads} heads")
    positions = hf.get("max_position_embeddings", 514)
    if positions <= FIRST_POSITION:
        raise CheckpointMismatchError(f"{where}: max_position_embeddings {positions} leaves no position for a token")
    return RobertaConfig(
        vocab_size=hf["vocab_size"],
        emb_dim=hidden,
        num_heads=heads,
        num_layers=hf["num_hidden_layers"],
        head_dim=hidden // heads,
        mlp_dim=hf["intermediate_size"],
        max_length=positions - FIRST_POSITION,
        type_vocab_size=hf.get("type_vocab_size", 1),
        layer_norm_epsilon=hf.get("layer_norm_eps", 1e-5),
        dropout_rate=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
    )


def bindings(hf: dict, where: str) -> list[str]:
    """RobertaConfig.* gin bindings of a config.json (the source's dropout rates, as BERT's)."""
    config = config_from_hf(hf, where)
    fields = _SHAPE + ("layer_norm_epsilon", "dropout_rate", "attention_dropout_rate")
    return gin_bindings(config, fields)


def check_hf_config(hf: dict, where: str, config: RobertaConfig) -> None:
    """Fail on a config.json that disagrees with the gin RobertaConfig, naming the setting."""
    check_same_shape(config_from_hf(hf, where), config, _SHAPE, where)


def hf_config(config: RobertaConfig):
    """transformers.RobertaConfig of an encoder with our RobertaConfig's shape (an XLM-R import is
    exported as RobertaModel: the same module and weights under the same names)."""
    import transformers

    return transformers.RobertaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.emb_dim,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        intermediate_size=config.mlp_dim,
        max_position_embeddings=config.positions,
        type_vocab_size=config.type_vocab_size,
        layer_norm_eps=config.layer_norm_epsilon,
        hidden_act="gelu",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=PAD_ID,
        bos_token_id=0,
        eos_token_id=2,
    )
