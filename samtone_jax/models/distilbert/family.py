"""The DistilBERT family (DistilBertModel and the sentence-transformers models built on it) as
models/family.py's record."""

from samtone_jax.core import run_folders
from samtone_jax.models.distilbert import hf_names
from samtone_jax.models.distilbert.tower import DistilBertConfig, DistilBertEncoder
from samtone_jax.models.family import TowerFamily


def _card_line(config: DistilBertConfig) -> str:
    return (
        f"- Tower: DistilBERT encoder, dim {config.emb_dim}, {config.num_layers} layers, {config.num_heads} heads × "
        f"{config.head_dim}, hidden {config.mlp_dim} (GELU), {config.max_length} positions, "
        f"vocabulary {config.vocab_size} (WordPiece, tokenizer.json)."
    )


FAMILY = TowerFamily(
    name="distilbert",
    display="DistilBERT",
    config_class=DistilBertConfig,
    encoder_class=DistilBertEncoder,
    tokenizer="wordpiece",
    export_vocabulary=run_folders.TOKENIZER,
    run_vocabulary=run_folders.TOKENIZER,
    import_formats=("hf", "sentence-transformers"),
    hf_model_types=("distilbert",),
    hf_architecture="DistilBertModel",
    hf_locate=hf_names.locate,
    hf_encoder_variable=hf_names.is_encoder_variable,
    hf_config=hf_names.hf_config,
    check_hf_config=hf_names.check_hf_config,
    hf_bindings=hf_names.bindings,
    hf_tokenizer="DistilBertTokenizerFast",
    card_line=_card_line,
    special_tokens="[CLS] and [SEP]",
)
