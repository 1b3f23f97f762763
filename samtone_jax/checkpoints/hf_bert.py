"""Hugging Face BERT-family checkpoints, alone or inside a sentence-transformers folder.

  a Hugging Face folder      config.json (model_type 'bert') + model.safetensors | pytorch_model.bin
                             (BertModel's names, or BertFor*'s with the `bert.` prefix)
  a sentence-transformers    modules.json: a Transformer module over such a folder, then Pooling
  folder                     (mean over tokens: the only pooling our towers do), optionally
                             Normalize; a Dense module or another pooling is refused, naming it

`model_bindings(folder)` gives the gin bindings of a DualEncoder with that tower (BertConfig.* from
config.json, an identity-initialised projection, the lengths sentence-transformers truncates to),
so an import needs no gin file; `open_source(folder, config)` maps the weights onto our BertEncoder
tree (models/bert.py), every shape checked. RoBERTa, MPNet, DistilBERT and relative position
embeddings are refused with the reason (their embeddings or layers differ from BertModel's).
"""

from __future__ import annotations

import json

import numpy as np

from samtone_jax.checkpoints.hf import _open_tensors, local_folder
from samtone_jax.checkpoints.source import CheckpointMismatchError, Source
from samtone_jax.core import paths, run_folders
from samtone_jax.core.errors import MissingFileError
from samtone_jax.models import BertConfig

TOKENIZER = run_folders.TOKENIZER
# The Hugging Face model types an --format=hf import reads, and what they are.
SUPPORTED_MODEL_TYPES = {"t5": "a T5.1.1 encoder", "mt5": "an mT5 encoder", "bert": "BERT, MiniLM"}


def _json(path, what: str) -> dict:
    if not path.exists():
        raise MissingFileError(f"{path} is missing: {what}")
    return json.loads(path.read_text())


def is_bert_folder(folder: str) -> bool:
    """Whether `folder` holds a Hugging Face config.json of a BERT-family model (model_type 'bert')."""
    path = paths.as_path(folder) / "config.json"
    return path.exists() and json.loads(path.read_text()).get("model_type") == "bert"


def bert_folder(fmt: str, src: str) -> tuple[str, int | None] | None:
    """(the Hugging Face BERT folder, sentence-transformers' max_seq_length) of an import from a
    sentence-transformers folder or a Hugging Face BERT folder; None for a T5 import."""
    is_sentence_transformers = (paths.as_path(src) / "modules.json").exists()
    config = paths.as_path(src) / "config.json"
    if fmt == "hf" and not is_sentence_transformers and config.exists():
        kind = json.loads(config.read_text()).get("model_type")
        if kind is not None and kind not in SUPPORTED_MODEL_TYPES:
            raise CheckpointMismatchError(
                f"{config}: model_type {kind!r}, which no tower family here loads; supported: "
                + ", ".join(f"{k} ({v})" for k, v in SUPPORTED_MODEL_TYPES.items())
            )
    if fmt == "sentence-transformers" or (fmt == "hf" and is_sentence_transformers and is_bert_folder(src)):
        folder, max_seq_length = transformer_folder(src)  # its pooling checked, its lengths kept
    elif fmt == "hf" and is_bert_folder(src):
        folder, max_seq_length = src, None
    else:
        return None
    if not (paths.as_path(folder) / TOKENIZER).exists():
        raise MissingFileError(f"{folder}/{TOKENIZER} is missing: a BERT-family import needs its tokenizer")
    return folder, max_seq_length


def transformer_folder(folder: str) -> tuple[str, int | None]:
    """(the Hugging Face folder inside a sentence-transformers folder, its max_seq_length), with the
    pipeline checked: Transformer, mean Pooling, optional Normalize, nothing else."""
    root = paths.as_path(folder)
    modules = _json(root / "modules.json", f"{folder} is not a sentence-transformers folder (no modules.json)")
    kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
    if not kinds or kinds[0] != "Transformer" or "Pooling" not in kinds:
        raise CheckpointMismatchError(f"{folder}: modules {kinds}; expected Transformer, Pooling[, Normalize]")
    extra = [k for k in kinds if k not in ("Transformer", "Pooling", "Normalize")]
    if extra:
        raise CheckpointMismatchError(
            f"{folder}: modules {kinds}; {extra} cannot be imported (a pretrained mean-pooling encoder is "
            "Transformer, Pooling[, Normalize]; our projection replaces any Dense)"
        )
    pooling = modules[kinds.index("Pooling")]
    pooling_config = _json(root / pooling["path"] / "config.json", "the Pooling module's config")
    if "pooling_mode" in pooling_config:  # sentence-transformers ≥ 6: {"pooling_mode": "mean" | [...], ...}
        mode = pooling_config["pooling_mode"]
        modes = sorted([mode] if isinstance(mode, str) else mode)
        modes = ["mean_tokens" if m == "mean" else m for m in modes]
    else:  # earlier versions: one pooling_mode_<name> flag each
        modes = sorted(
            k.removeprefix("pooling_mode_") for k, v in pooling_config.items() if k.startswith("pooling_mode_") and v
        )
    if modes != ["mean_tokens"] or pooling_config.get("include_prompt", True) is False:
        raise CheckpointMismatchError(
            f"{folder}: pooling {modes} (include_prompt {pooling_config.get('include_prompt', True)}); our towers "
            "mean-pool over every token of the text, prompt included"
        )
    transformer = root / modules[0]["path"] if modules[0]["path"] else root
    settings_file = transformer / "sentence_bert_config.json"
    settings = json.loads(settings_file.read_text()) if settings_file.exists() else {}
    if settings.get("do_lower_case"):
        raise CheckpointMismatchError(
            f"{settings_file}: do_lower_case true lower-cases text before its tokenizer, which the import would not do"
        )
    max_seq_length = settings.get("max_seq_length") or _tokenizer_max_length(transformer)
    return str(transformer), max_seq_length


def _tokenizer_max_length(folder) -> int | None:
    """tokenizer_config.json's model_max_length, when it is a real limit (not transformers' 1e30)."""
    config = folder / "tokenizer_config.json"
    length = json.loads(config.read_text()).get("model_max_length") if config.exists() else None
    return int(length) if isinstance(length, (int, float)) and length < 1e6 else None


def bert_config(folder: str) -> BertConfig:
    """The BertConfig of a Hugging Face BERT folder's config.json (refusing what BertEncoder is not)."""
    path = paths.as_path(folder) / "config.json"
    hf = _json(path, "a Hugging Face model folder needs its config.json")
    kind = hf.get("model_type")
    if kind != "bert":
        raise CheckpointMismatchError(
            f"{path}: model_type {kind!r}; only BERT-family models (model_type 'bert': BERT, MiniLM) load into a "
            "BERT tower (RoBERTa offsets positions by its padding id, MPNet uses relative positions, DistilBERT "
            "has no token types: their weights would silently embed differently)"
        )
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointMismatchError(
            f"{path}: position_embedding_type {hf['position_embedding_type']!r}; only 'absolute'"
        )
    if hf.get("hidden_act", "gelu") != "gelu":
        raise CheckpointMismatchError(
            f"{path}: hidden_act {hf['hidden_act']!r}; the BERT tower uses exact (erf) 'gelu'"
        )
    if hf.get("pad_token_id", 0) != 0:
        raise CheckpointMismatchError(f"{path}: pad_token_id {hf['pad_token_id']}; the towers pad with id 0")
    heads, hidden = hf["num_attention_heads"], hf["hidden_size"]
    if hidden % heads:
        raise CheckpointMismatchError(f"{path}: hidden_size {hidden} is not a multiple of {heads} heads")
    return BertConfig(
        vocab_size=hf["vocab_size"],
        emb_dim=hidden,
        num_heads=heads,
        num_layers=hf["num_hidden_layers"],
        head_dim=hidden // heads,
        mlp_dim=hf["intermediate_size"],
        max_length=hf["max_position_embeddings"],
        type_vocab_size=hf.get("type_vocab_size", 2),
        layer_norm_epsilon=hf.get("layer_norm_eps", 1e-12),
        dropout_rate=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
    )


def model_bindings(folder: str, max_seq_length: int | None = None) -> list[str]:
    """Gin bindings of a DualEncoder over the BERT tower of `folder`: BertConfig.* from its
    config.json, an identity-initialised projection (the import embeds as the source does), and
    train.query_length / train.doc_length = the source's max_seq_length (else 256, capped by the
    positions) for samtone_jax.load. The dropout rates are the source's (hidden_dropout_prob,
    attention_probs_dropout_prob: 0.1 for BERT), as fine-tuning it in sentence-transformers would use."""
    config = bert_config(folder)
    length = min(max_seq_length or 256, config.max_length)
    fields = ("vocab_size", "emb_dim", "num_heads", "num_layers", "head_dim", "mlp_dim", "max_length")
    fields += ("type_vocab_size", "layer_norm_epsilon", "dropout_rate", "attention_dropout_rate")
    return [f"BertConfig.{name} = {getattr(config, name)!r}" for name in fields] + [
        "DualEncoder.projection_init = 'identity'",
        f"train.query_length = {length}",
        f"train.doc_length = {length}",
    ]


def _locate(path):
    """(candidate source names, transposed?) of one of our BertEncoder parameters."""
    leaf = path[-1]
    if path[0] in ("token_embedder", "position_embedder", "token_type_embedder"):
        table = {"token_embedder": "word", "position_embedder": "position", "token_type_embedder": "token_type"}
        return _prefixed(f"embeddings.{table[path[0]]}_embeddings.weight"), False
    if path[0] == "embedding_layer_norm":
        return _layer_norm("embeddings.LayerNorm", leaf), False
    layer = f"encoder.layer.{int(path[0].split('_')[1])}"
    if path[1] == "attention":
        name, part = leaf.rsplit("_", 1)  # query_kernel -> (query, kernel)
        module = "attention.output.dense" if name == "out" else f"attention.self.{name}"
        return _prefixed(f"{layer}.{module}.{'weight' if part == 'kernel' else 'bias'}"), part == "kernel"
    if path[1] in ("attention_layer_norm", "mlp_layer_norm"):
        module = "attention.output.LayerNorm" if path[1] == "attention_layer_norm" else "output.LayerNorm"
        return _layer_norm(f"{layer}.{module}", leaf), False
    name, part = leaf.rsplit("_", 1)  # wi_kernel, wo_bias, ...
    module = "intermediate.dense" if name == "wi" else "output.dense"
    return _prefixed(f"{layer}.{module}.{'weight' if part == 'kernel' else 'bias'}"), part == "kernel"


def _prefixed(name: str) -> list[str]:
    return [name, f"bert.{name}"]  # BertModel's own names, or a BertFor* model's


def _layer_norm(module: str, leaf: str) -> list[str]:
    new, old = ("weight", "gamma") if leaf == "scale" else ("bias", "beta")  # old TF-converted names
    return _prefixed(f"{module}.{new}") + _prefixed(f"{module}.{old}")


def check_config(folder: str, config: BertConfig) -> None:
    """Fail on a config.json that disagrees with the gin BertConfig, naming the setting."""
    theirs = bert_config(folder)
    for name in ("vocab_size", "emb_dim", "num_heads", "num_layers", "head_dim", "mlp_dim", "max_length"):
        if getattr(theirs, name) != getattr(config, name):
            raise CheckpointMismatchError(
                f"{folder}/config.json gives BertConfig.{name} = {getattr(theirs, name)!r} but the gin config has "
                f"{getattr(config, name)!r}: drop the gin file's BertConfig.* (an import reads them from config.json)"
            )
    if not np.isclose(theirs.layer_norm_epsilon, config.layer_norm_epsilon):
        raise CheckpointMismatchError(
            f"{folder}/config.json: layer_norm_eps {theirs.layer_norm_epsilon} but BertConfig.layer_norm_epsilon = "
            f"{config.layer_norm_epsilon}"
        )


def open_source(folder: str, config: BertConfig) -> Source:
    folder = local_folder(folder)
    check_config(folder, config)
    names, read, shape = _open_tensors(folder)
    return Source(
        description=f"Hugging Face BERT checkpoint {folder}",
        names=names,
        read=read,
        shape=shape,
        locate=_locate,
        is_encoder_variable=lambda n: (
            n.removeprefix("bert.").startswith(("encoder.layer.", "embeddings.")) and not n.endswith("position_ids")
        ),
        config_name="BertConfig",
    )
