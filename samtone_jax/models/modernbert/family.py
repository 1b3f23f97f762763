"""The ModernBERT family (ModernBertModel: ModernBERT-base / -large and the sentence-transformers models
built on them) as models/family.py's record."""

from samtone_jax.core import run_folders
from samtone_jax.models.family import LORA_KERNELS, TowerFamily
from samtone_jax.models.modernbert import hf_names
from samtone_jax.models.modernbert.tower import PAD_ID, ModernBertConfig, ModernBertEncoder


def _card_line(config: ModernBertConfig) -> str:
    return (
        f"- Tower: ModernBERT encoder, hidden {config.emb_dim}, {config.num_layers} layers, {config.num_heads} heads × "
        f"{config.head_dim}, gated MLP {config.mlp_dim} ({config.hidden_activation}), rotary positions, global "
        f"attention every {config.global_attention_every} layers and local ±{config.window} tokens between, "
        f"{config.max_length} positions, vocabulary {config.vocab_size} (tokenizer.json)."
    )


FAMILY = TowerFamily(
    name="modernbert",
    display="ModernBERT",
    config_class=ModernBertConfig,
    encoder_class=ModernBertEncoder,
    tokenizer="wordpiece",
    export_vocabulary=run_folders.TOKENIZER,
    run_vocabulary=run_folders.TOKENIZER,
    import_formats=("hf", "sentence-transformers"),
    hf_model_types=("modernbert",),
    hf_architecture="ModernBertModel",
    hf_locate=hf_names.locate,
    hf_encoder_variable=hf_names.is_encoder_variable,
    hf_config=hf_names.hf_config,
    check_hf_config=hf_names.check_hf_config,
    hf_bindings=hf_names.bindings,
    hf_pad_id=PAD_ID,
    hf_tokenizer="PreTrainedTokenizerFast",
    card_line=_card_line,
    special_tokens="[CLS] and [SEP]",
    lora_kernels={**LORA_KERNELS, "qkv": ("attention", 1)},  # one fused query / key / value projection (Wqkv)
)
