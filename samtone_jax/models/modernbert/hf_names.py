"""The ModernBERT tower under Hugging Face's names, both directions: `ModernBertModel`'s variable names
(or a `ModernBertFor*` model's, under the `model.` prefix) for each of our parameters (import reads
them, export writes the first); our ModernBertConfig from a config.json (transformers 5's
layer_types / rope_parameters or the Hub's older global_attn_every_n_layers / *_rope_theta keys,
refusing what ModernBertEncoder is not), its gin bindings, and transformers' ModernBertConfig of our
shape."""

from __future__ import annotations

from samtone_jax.core.errors import CheckpointMismatchError
from samtone_jax.models.family import check_same_shape, gin_bindings
from samtone_jax.models.modernbert.tower import ACTIVATIONS, GLOBAL, LOCAL, PAD_ID, ModernBertConfig

# Every field that changes what the tower computes: a config.json that disagrees with the gin file
# on one of them is refused.
_SHAPE = (
    "vocab_size",
    "emb_dim",
    "num_heads",
    "num_layers",
    "head_dim",
    "mlp_dim",
    "max_length",
    "global_attention_every",
    "local_attention",
    "global_rope_theta",
    "local_rope_theta",
    "attention_bias",
    "mlp_bias",
    "norm_bias",
    "hidden_activation",
)
_DROPOUTS = ("dropout_rate", "mlp_dropout_rate", "attention_dropout_rate")
_NORMS = {"embedding_norm": "embeddings.norm", "final_norm": "final_norm"}
_LAYER_MODULES = {"attention_norm": "attn_norm", "mlp_norm": "mlp_norm"}
_KERNELS = {"qkv": "attn.Wqkv", "out": "attn.Wo", "wi": "mlp.Wi", "wo": "mlp.Wo"}


def _prefixed(name: str) -> list[str]:
    return [name, f"model.{name}"]


def _parameter(module: str, part: str) -> list[str]:
    return _prefixed(f"{module}.{'weight' if part in ('kernel', 'scale') else 'bias'}")


def locate(path):
    """(candidate Hugging Face names, transposed?) of one of our ModernBertEncoder parameters."""
    leaf = path[-1]
    if path[0] == "token_embedder":
        return _prefixed("embeddings.tok_embeddings.weight"), False
    if path[0] in _NORMS:
        return _parameter(_NORMS[path[0]], leaf), False
    layer = f"layers.{int(path[0].split('_')[1])}"
    if path[1] in _LAYER_MODULES:
        return _parameter(f"{layer}.{_LAYER_MODULES[path[1]]}", leaf), False
    name, part = leaf.rsplit("_", 1)  # qkv_kernel -> (qkv, kernel)
    return _parameter(f"{layer}.{_KERNELS[name]}", part), part == "kernel"


def is_encoder_variable(name: str) -> bool:
    return name.removeprefix("model.").startswith(("layers.", "embeddings.", "final_norm."))


def _every(hf: dict, layers: int, where: str) -> int:
    """global_attention_every of a config.json: global_attn_every_n_layers, or the period of its
    layer_types (refused unless layer i is global exactly when i is a multiple of it)."""
    types = hf.get("layer_types")
    if types is None:
        return int(hf.get("global_attn_every_n_layers", 3))
    if len(types) != layers or set(types) - {GLOBAL, LOCAL}:
        raise CheckpointMismatchError(
            f"{where}: layer_types {types!r}: expected {layers} entries, each {GLOBAL!r} or {LOCAL!r}"
        )
    for every in range(1, layers + 1):
        if all((t == GLOBAL) == (i % every == 0) for i, t in enumerate(types)):
            return every
    raise CheckpointMismatchError(
        f"{where}: layer_types {types!r}: the ModernBERT tower makes layer i global when i is a multiple of "
        "ModernBertConfig.global_attention_every, and no period gives this pattern"
    )


def _theta(hf: dict, kind: str, old_key: str, default: float, where: str) -> float:
    """The rope_theta of one attention kind: transformers 5's rope_parameters or the older key."""
    parameters = (hf.get("rope_parameters") or {}).get(kind) or {}
    if parameters.get("rope_type", "default") != "default" or hf.get("rope_scaling"):
        raise CheckpointMismatchError(
            f"{where}: {kind} rotary embeddings of type {parameters.get('rope_type')!r} "
            f"(rope_scaling {hf.get('rope_scaling')!r}); the ModernBERT tower computes the default (unscaled) RoPE"
        )
    if "rope_theta" in parameters:
        return float(parameters["rope_theta"])
    if old_key in hf and hf[old_key] is None and kind == LOCAL:  # transformers 4.x: null = the global theta
        return _theta(hf, GLOBAL, "global_rope_theta", 160_000.0, where)
    return float(hf.get(old_key, default))


def config_from_hf(hf: dict, where: str) -> ModernBertConfig:
    """Our ModernBertConfig of a Hugging Face ModernBERT config.json (`hf`, read from `where`),
    refusing what ModernBertEncoder is not."""
    activation = hf.get("hidden_activation", "gelu")
    if activation not in ACTIVATIONS:
        raise CheckpointMismatchError(
            f"{where}: hidden_activation {activation!r}; the ModernBERT tower computes {sorted(ACTIVATIONS)}"
        )
    if hf.get("pad_token_id", PAD_ID) != PAD_ID:
        raise CheckpointMismatchError(
            f"{where}: pad_token_id {hf['pad_token_id']}; ModernBERT's vocabulary pads with id {PAD_ID}"
        )
    heads, hidden, layers = hf["num_attention_heads"], hf["hidden_size"], hf["num_hidden_layers"]
    if hidden % heads:
        raise CheckpointMismatchError(f"{where}: hidden_size {hidden} is not a multiple of {heads} heads")
    return ModernBertConfig(
        vocab_size=hf["vocab_size"],
        emb_dim=hidden,
        num_heads=heads,
        num_layers=layers,
        head_dim=hidden // heads,
        mlp_dim=hf["intermediate_size"],
        max_length=hf.get("max_position_embeddings", 8192),
        global_attention_every=_every(hf, layers, where),
        local_attention=hf.get("local_attention", 128),
        global_rope_theta=_theta(hf, GLOBAL, "global_rope_theta", 160_000.0, where),
        local_rope_theta=_theta(hf, LOCAL, "local_rope_theta", 10_000.0, where),
        attention_bias=bool(hf.get("attention_bias", False)),
        mlp_bias=bool(hf.get("mlp_bias", False)),
        norm_bias=bool(hf.get("norm_bias", False)),
        hidden_activation=activation,
        layer_norm_epsilon=hf.get("norm_eps", 1e-5),
        dropout_rate=hf.get("embedding_dropout", 0.0),
        mlp_dropout_rate=hf.get("mlp_dropout", 0.0),
        attention_dropout_rate=hf.get("attention_dropout", 0.0),
    )


def bindings(hf: dict, where: str) -> list[str]:
    """ModernBertConfig.* gin bindings of a config.json (the source's dropout rates too)."""
    return gin_bindings(config_from_hf(hf, where), _SHAPE + ("layer_norm_epsilon",) + _DROPOUTS)


def check_hf_config(hf: dict, where: str, config: ModernBertConfig) -> None:
    """Fail on a config.json that disagrees with the gin ModernBertConfig, naming the setting."""
    check_same_shape(config_from_hf(hf, where), config, _SHAPE, where)


def hf_config(config: ModernBertConfig):
    """transformers.ModernBertConfig of an encoder with our ModernBertConfig's shape."""
    import transformers

    return transformers.ModernBertConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.emb_dim,
        intermediate_size=config.mlp_dim,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        hidden_activation=config.hidden_activation,
        max_position_embeddings=config.max_length,
        norm_eps=config.layer_norm_epsilon,
        norm_bias=config.norm_bias,
        attention_bias=config.attention_bias,
        mlp_bias=config.mlp_bias,
        layer_types=[config.layer_type(i) for i in range(config.num_layers)],
        rope_parameters={
            GLOBAL: {"rope_type": "default", "rope_theta": config.global_rope_theta},
            LOCAL: {"rope_type": "default", "rope_theta": config.local_rope_theta},
        },
        local_attention=config.local_attention,
        embedding_dropout=0.0,
        mlp_dropout=0.0,
        attention_dropout=0.0,
        pad_token_id=PAD_ID,
    )
