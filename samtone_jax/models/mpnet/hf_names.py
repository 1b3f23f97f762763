"""The MPNet tower under Hugging Face's names, both directions: `MPNetModel`'s variable names (or an
`MPNetFor*` model's, under the `mpnet.` prefix) for each of our parameters (import reads them,
export writes the first), our MPNetConfig from a config.json (refusing what MPNetEncoder is not)
and its gin bindings, and transformers' MPNetConfig of our shape."""

from __future__ import annotations

from samtone_jax.core.errors import CheckpointMismatchError
from samtone_jax.models.family import check_same_shape, gin_bindings
from samtone_jax.models.mpnet.tower import BUCKETS, FIRST_POSITION, MPNetConfig

PAD_ID = 1  # <pad> in MPNet's vocabulary (<s> is 0): swapped with 0 on the way in and out
_SHAPE = ("vocab_size", "emb_dim", "num_heads", "num_layers", "head_dim", "mlp_dim", "max_length")


def _prefixed(name: str) -> list[str]:
    return [name, f"mpnet.{name}"]


def _parameter(module: str, part: str) -> list[str]:
    return _prefixed(f"{module}.{'weight' if part in ('kernel', 'scale') else 'bias'}")


def locate(path):
    """(candidate Hugging Face names, transposed?) of one of our MPNetEncoder parameters."""
    leaf = path[-1]
    if path[0] in ("token_embedder", "position_embedder"):
        table = {"token_embedder": "word", "position_embedder": "position"}
        return _prefixed(f"embeddings.{table[path[0]]}_embeddings.weight"), False
    if path[0] == "relative_position_table":  # ours [heads, buckets], theirs an Embedding(buckets, heads)
        return _prefixed("encoder.relative_attention_bias.weight"), True
    if path[0] == "embedding_layer_norm":
        return _parameter("embeddings.LayerNorm", leaf), False
    layer = f"encoder.layer.{int(path[0].split('_')[1])}"
    if path[1] == "attention":
        name, part = leaf.rsplit("_", 1)  # query_kernel -> (query, kernel)
        short = {"query": "q", "key": "k", "value": "v", "out": "o"}[name]
        return _parameter(f"{layer}.attention.attn.{short}", part), part == "kernel"
    if path[1] in ("attention_layer_norm", "mlp_layer_norm"):
        module = "attention.LayerNorm" if path[1] == "attention_layer_norm" else "output.LayerNorm"
        return _parameter(f"{layer}.{module}", leaf), False
    name, part = leaf.rsplit("_", 1)  # wi_kernel, wo_bias, ...
    module = "intermediate.dense" if name == "wi" else "output.dense"
    return _parameter(f"{layer}.{module}", part), part == "kernel"


def is_encoder_variable(name: str) -> bool:
    return name.removeprefix("mpnet.").startswith(("encoder.", "embeddings.")) and not name.endswith("position_ids")


def config_from_hf(hf: dict, where: str) -> MPNetConfig:
    """Our MPNetConfig of a Hugging Face MPNet config.json (`hf`, read from `where`), refusing what
    MPNetEncoder is not."""
    if hf.get("hidden_act", "gelu") != "gelu":
        raise CheckpointMismatchError(
            f"{where}: hidden_act {hf['hidden_act']!r}; the MPNet tower uses exact (erf) 'gelu'"
        )
    if hf.get("pad_token_id", PAD_ID) != PAD_ID:
        raise CheckpointMismatchError(
            f"{where}: pad_token_id {hf['pad_token_id']}; MPNet's embeddings pad with id {PAD_ID}"
        )
    if hf.get("relative_attention_num_buckets", BUCKETS) != BUCKETS:
        raise CheckpointMismatchError(
            f"{where}: relative_attention_num_buckets {hf['relative_attention_num_buckets']}; transformers' "
            f"MPNetModel buckets into {BUCKETS} (a larger table would be read only in part)"
        )
    heads, hidden = hf["num_attention_heads"], hf["hidden_size"]
    if hidden % heads:
        raise CheckpointMismatchError(f"{where}: hidden_size {hidden} is not a multiple of {heads} heads")
    positions = hf.get("max_position_embeddings", 514)
    if positions <= FIRST_POSITION:
        raise CheckpointMismatchError(f"{where}: max_position_embeddings {positions} leaves no position for a token")
    return MPNetConfig(
        vocab_size=hf["vocab_size"],
        emb_dim=hidden,
        num_heads=heads,
        num_layers=hf["num_hidden_layers"],
        head_dim=hidden // heads,
        mlp_dim=hf["intermediate_size"],
        max_length=positions - FIRST_POSITION,
        layer_norm_epsilon=hf.get("layer_norm_eps", 1e-12),
        dropout_rate=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
    )


def bindings(hf: dict, where: str) -> list[str]:
    """MPNetConfig.* gin bindings of a config.json (the source's dropout rates, as BERT's)."""
    config = config_from_hf(hf, where)
    fields = _SHAPE + ("layer_norm_epsilon", "dropout_rate", "attention_dropout_rate")
    return gin_bindings(config, fields)


def check_hf_config(hf: dict, where: str, config: MPNetConfig) -> None:
    """Fail on a config.json that disagrees with the gin MPNetConfig, naming the setting."""
    check_same_shape(config_from_hf(hf, where), config, _SHAPE, where)


def hf_config(config: MPNetConfig):
    """transformers.MPNetConfig of an encoder with our MPNetConfig's shape."""
    import transformers

    return transformers.MPNetConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.emb_dim,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        intermediate_size=config.mlp_dim,
        max_position_embeddings=config.positions,
        relative_attention_num_buckets=BUCKETS,
        layer_norm_eps=config.layer_norm_epsilon,
        hidden_act="gelu",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=PAD_ID,
        bos_token_id=0,
        eos_token_id=2,
    )
