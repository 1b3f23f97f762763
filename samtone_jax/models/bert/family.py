"""The BERT family (BertModel: BERT, MiniLM and the sentence-transformers models built on them) as
models/family.py's record."""

from samtone_jax.core import run_folders
from samtone_jax.models.bert import hf_names
from samtone_jax.models.bert.tower import BertConfig, BertEncoder
from samtone_jax.models.family import TowerFamily


def _card_line(config: BertConfig) -> str:
    return (
        f"- Tower: BERT encoder, hidden {config.emb_dim}, {config.num_layers} layers, {config.num_heads} heads × "
        f"{config.head_dim}, intermediate {config.mlp_dim} (GELU), {config.max_length} positions, "
        f"vocabulary {config.vocab_size} (WordPiece, tokenizer.json)."
    )


FAMILY = TowerFamily(
    name="bert",
    display="BERT",
    config_class=BertConfig,
    encoder_class=BertEncoder,
    tokenizer="wordpiece",
    export_vocabulary=run_folders.TOKENIZER,
    run_vocabulary=run_folders.TOKENIZER,
    import_formats=("hf", "sentence-transformers"),
    hf_model_types=("bert",),
    hf_architecture="BertModel",
    hf_locate=hf_names.locate,
    hf_encoder_variable=hf_names.is_encoder_variable,
    hf_config=hf_names.hf_config,
    check_hf_config=hf_names.check_hf_config,
    hf_bindings=hf_names.bindings,
    hf_zero_prefixes=("pooler.",),
    card_line=_card_line,
    special_tokens="[CLS] and [SEP]",
)
