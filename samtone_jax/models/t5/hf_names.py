"""The T5 tower under Hugging Face's names, both directions: `T5EncoderModel` /
`T5ForConditionalGeneration` variable names for each of our parameters (import reads them, export
writes the first), the config.json fields checked against our T5Config, and transformers' T5Config
of our shape. Linear weights are stored [out, in]: transposed."""

from __future__ import annotations

import numpy as np

from samtone_jax.core.errors import BadValueError, CheckpointMismatchError

_FEED_FORWARD = {"relu": ("relu",), "gated-gelu": ("gelu", "linear")}  # config.json -> T5Config.mlp_activations

# Our tower leaf -> the gin settings that set its shape (named when a checkpoint's shape differs).
SHAPE_HINTS = {
    "token_embedder": "T5Config.vocab_size / T5Config.emb_dim",
    "rel_embedding": "T5Config.num_heads / T5Config.relative_attention_num_buckets",
    "query": "T5Config.emb_dim / T5Config.num_heads / T5Config.head_dim",
    "key": "T5Config.emb_dim / T5Config.num_heads / T5Config.head_dim",
    "value": "T5Config.emb_dim / T5Config.num_heads / T5Config.head_dim",
    "out": "T5Config.emb_dim / T5Config.num_heads / T5Config.head_dim",
    "wi": "T5Config.emb_dim / T5Config.mlp_dim",
    "wi_0": "T5Config.emb_dim / T5Config.mlp_dim",
    "wi_1": "T5Config.emb_dim / T5Config.mlp_dim",
    "wo": "T5Config.emb_dim / T5Config.mlp_dim",
    "scale": "T5Config.emb_dim",
}


def locate(path):
    """(candidate Hugging Face names, transposed?) of one of our T5Encoder parameters."""
    first = path[0]
    if first == "token_embedder":
        return ["shared.weight", "encoder.embed_tokens.weight"], False
    if first == "relpos_bias":
        return ["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"], True
    if first == "encoder_norm":
        return ["encoder.final_layer_norm.weight"], False
    i = int(first.split("_")[1])
    block = f"encoder.block.{i}"
    if path[1] == "pre_attention_layer_norm":
        return [f"{block}.layer.0.layer_norm.weight"], False
    if path[1] == "pre_mlp_layer_norm":
        return [f"{block}.layer.1.layer_norm.weight"], False
    if path[1] == "attention":
        letter = {"query": "q", "key": "k", "value": "v", "out": "o"}[path[2]]
        return [f"{block}.layer.0.SelfAttention.{letter}.weight"], True
    return [f"{block}.layer.1.DenseReluDense.{path[2]}.weight"], True  # mlp


def is_encoder_variable(name: str) -> bool:
    return name.startswith("encoder.block.")


def check_hf_config(hf: dict, where: str, config) -> None:
    """Fail on a config.json (`hf`, read from `where`) that disagrees with the gin T5Config for what
    shapes cannot reveal (activation, buckets, max distance, epsilon), naming the gin setting."""
    act = _FEED_FORWARD.get(hf.get("feed_forward_proj", "relu"))
    checks = [
        ("num_layers", hf.get("num_layers"), config.num_layers, "T5Config.num_layers"),
        ("d_model", hf.get("d_model"), config.emb_dim, "T5Config.emb_dim"),
        ("num_heads", hf.get("num_heads"), config.num_heads, "T5Config.num_heads"),
        ("d_kv", hf.get("d_kv"), config.head_dim, "T5Config.head_dim"),
        ("d_ff", hf.get("d_ff"), config.mlp_dim, "T5Config.mlp_dim"),
        ("vocab_size", hf.get("vocab_size"), config.vocab_size, "T5Config.vocab_size"),
        (
            "relative_attention_num_buckets",
            hf.get("relative_attention_num_buckets", 32),
            config.relative_attention_num_buckets,
            "T5Config.relative_attention_num_buckets",
        ),
        (
            "relative_attention_max_distance",
            hf.get("relative_attention_max_distance", 128),
            config.relative_attention_max_distance,
            "T5Config.relative_attention_max_distance",
        ),
        ("feed_forward_proj", act, config.mlp_activations, "T5Config.mlp_activations"),
    ]
    for hf_name, theirs, ours, gin_name in checks:
        if theirs != ours:
            hint = "an unsupported feed_forward_proj" if theirs is None else repr(theirs)
            raise CheckpointMismatchError(
                f"{where}: {hf_name}={hf.get(hf_name, hf_name)!r} but the gin config has {gin_name} = {ours!r}; "
                f"set {gin_name} = {hint} (or use the gin file of this checkpoint's size)"
            )
    eps = hf.get("layer_norm_epsilon", 1e-6)
    if not np.isclose(eps, config.layer_norm_epsilon):
        raise CheckpointMismatchError(
            f"{where}: layer_norm_epsilon={eps} but T5Config.layer_norm_epsilon = {config.layer_norm_epsilon}"
        )


def hf_config(config):
    """transformers.T5Config of an encoder with our T5Config's shape."""
    import transformers

    activation = {v: k for k, v in _FEED_FORWARD.items()}.get(tuple(config.mlp_activations))
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
