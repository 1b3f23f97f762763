"""The RoBERTa family (RobertaModel and XLMRobertaModel: RoBERTa, XLM-R and the sentence-transformers
models built on them) as models/family.py's record."""

from samtone_jax.core import run_folders
from samtone_jax.models.family import TowerFamily
from samtone_jax.models.roberta import hf_names
from samtone_jax.models.roberta.tower import RobertaConfig, RobertaEncoder


def _card_line(config: RobertaConfig) -> str:
    return (
        f"- Tower: RoBERTa encoder, hidden {config.emb_dim}, {config.num_layers} layers, {config.num_heads} heads × "
        f"{config.head_dim}, intermediate {config.mlp_dim} (GELU), {config.max_length} positions, "
        f"vocabulary {config.vocab_size} (tokenizer.json)."
    )


FAMILY = TowerFamily(
    name="roberta",
    display="RoBERTa",
    config_class=RobertaConfig,
    encoder_class=RobertaEncoder,
    tokenizer="wordpiece",
    export_vocabulary=run_folders.TOKENIZER,
    run_vocabulary=run_folders.TOKENIZER,
    import_formats=("hf", "sentence-transformers"),
    hf_model_types=("roberta", "xlm-roberta"),
    hf_architecture="RobertaModel",
    hf_locate=hf_names.locate,
    hf_encoder_variable=hf_names.is_encoder_variable,
    hf_config=hf_names.hf_config,
    check_hf_config=hf_names.check_hf_config,
    hf_bindings=hf_names.bindings,
    hf_zero_prefixes=("pooler.",),
    hf_pad_id=hf_names.PAD_ID,
    hf_tokenizer="PreTrainedTokenizerFast",
    card_line=_card_line,
    special_tokens="<s> and </s>",
)
