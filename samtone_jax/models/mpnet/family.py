"""The MPNet family (MPNetModel: all-mpnet-base-v2 and the sentence-transformers models built on it)
as models/family.py's record."""

from samtone_jax.core import run_folders
from samtone_jax.models.family import TowerFamily
from samtone_jax.models.mpnet import hf_names
from samtone_jax.models.mpnet.tower import MPNetConfig, MPNetEncoder


def _card_line(config: MPNetConfig) -> str:
    return (
        f"- Tower: MPNet encoder, hidden {config.emb_dim}, {config.num_layers} layers, {config.num_heads} heads × "
        f"{config.head_dim}, intermediate {config.mlp_dim} (GELU), relative position bias, {config.max_length} "
        f"positions, vocabulary {config.vocab_size} (WordPiece, tokenizer.json)."
    )


FAMILY = TowerFamily(
    name="mpnet",
    display="MPNet",
    config_class=MPNetConfig,
    encoder_class=MPNetEncoder,
    tokenizer="wordpiece",
    export_vocabulary=run_folders.TOKENIZER,
    run_vocabulary=run_folders.TOKENIZER,
    import_formats=("hf", "sentence-transformers"),
    hf_model_types=("mpnet",),
    hf_architecture="MPNetModel",
    hf_locate=hf_names.locate,
    hf_encoder_variable=hf_names.is_encoder_variable,
    hf_config=hf_names.hf_config,
    check_hf_config=hf_names.check_hf_config,
    hf_bindings=hf_names.bindings,
    hf_zero_prefixes=("pooler.",),
    hf_pad_id=hf_names.PAD_ID,
    hf_tokenizer="MPNetTokenizerFast",
    card_line=_card_line,
    special_tokens="<s> and </s>",
)
