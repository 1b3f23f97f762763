"""A sentence-transformers folder: modules.json naming a Transformer module over a Hugging Face
folder, then Pooling (mean over tokens: the only pooling our towers do), optionally Normalize; a
Dense module or another pooling is refused, naming it. Its max_seq_length is kept: the lengths an
import is served at."""

from __future__ import annotations

import json

from samtone_jax.core import paths
from samtone_jax.core.errors import CheckpointMismatchError, MissingFileError


def _json(path, what: str) -> dict:
    if not path.exists():
        raise MissingFileError(f"{path} is missing: {what}")
    return json.loads(path.read_text())


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
