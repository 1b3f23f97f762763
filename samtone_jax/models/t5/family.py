"""The T5.1.1 family (T5X / Mesh-TF / Hugging Face T5 and mT5 encoders) as models/family.py's record."""

from samtone_jax.core import run_folders
from samtone_jax.models.family import LORA_KERNELS, TowerFamily
from samtone_jax.models.t5 import hf_names
from samtone_jax.models.t5.tower import T5Config, T5Encoder


def _card_line(config: T5Config) -> str:
    return (
        f"- Tower: T5.1.1 encoder, d_model {config.emb_dim}, {config.num_layers} layers, {config.num_heads} heads "
        f"× {config.head_dim}, d_ff {config.mlp_dim} ({'/'.join(config.mlp_activations)}), "
        f"vocabulary {config.vocab_size}."
    )


FAMILY = TowerFamily(
    name="t5",
    display="T5.1.1",
    config_class=T5Config,
    encoder_class=T5Encoder,
    tokenizer="sentencepiece",
    export_vocabulary=run_folders.EXPORT_VOCABULARY,
    run_vocabulary=run_folders.VOCABULARY,
    import_formats=("hf", "t5x", "mtf"),
    hf_model_types=("t5", "mt5"),
    hf_architecture="T5EncoderModel",
    hf_locate=hf_names.locate,
    hf_encoder_variable=hf_names.is_encoder_variable,
    hf_config=hf_names.hf_config,
    check_hf_config=hf_names.check_hf_config,
    shape_hints=hf_names.SHAPE_HINTS,
    mlp_hint="T5Config.mlp_activations",
    card_line=_card_line,
    special_tokens="EOS",
    lora_kernels={**LORA_KERNELS, "wi_0": ("mlp", 1), "wi_1": ("mlp", 1)},  # gated-GELU's two inputs
)
