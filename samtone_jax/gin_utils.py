"""Gin: the configurables this project exposes, the search path, and parsing with clear errors.

Layering follows T5X: `architectures/` (sde, ade, ade_spl) -> `models/` (T5.1.1 sizes) ->
`losses/` -> `runs/`. Files are looked up relative to the current directory first, then
relative to the repository's `gin_configs/`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import gin

from samtone_jax import losses as _losses
from samtone_jax.models import DualEncoder as _DualEncoder
from samtone_jax.models import T5Config as _T5Config

GIN_CONFIGS_DIR = Path(__file__).resolve().parent.parent / "gin_configs"

# The gin-wrapped classes: calling them picks up the bound parameters.
T5Config = gin.external_configurable(_T5Config, "T5Config")
DualEncoder = gin.external_configurable(_DualEncoder, "DualEncoder")
# Bound by gin_configs/losses/*.gin; call it with (q, d, ...) and the bound settings apply.
contrastive_loss = gin.external_configurable(_losses.contrastive_loss, "contrastive_loss")


def _import_configurables() -> None:
    """Every module with @gin.configurable, so a config can name any of them (and a typo fails)."""
    import samtone_jax.evaluation.run  # noqa: F401  evaluate
    import samtone_jax.evaluation.train_hook  # noqa: F401  RetrievalEval
    import samtone_jax.hard_negatives.adore_train  # noqa: F401  train_adore
    import samtone_jax.partitioning  # noqa: F401  create_mesh
    import samtone_jax.tasks  # noqa: F401  data_dir, wordnet_dir
    import samtone_jax.train  # noqa: F401  train, adafactor


def resolve_gin_file(path: str) -> str:
    """`path` as given if it exists, else relative to the repository's gin_configs/."""
    if os.path.exists(path):
        return os.path.abspath(path)
    candidate = GIN_CONFIGS_DIR / path
    if candidate.exists():
        return str(candidate)
    raise ValueError(f"gin file {path!r} not found in {os.getcwd()} nor in {GIN_CONFIGS_DIR}")


def parse(gin_files: Sequence[str] = (), bindings: Sequence[str] = (), *, finalize: bool = True) -> None:
    """Parse `gin_files` then `bindings` (e.g. "T5Config.dropout_rate = 0.1") into the global config.

    Raises ValueError naming the file and the gin name when a file is missing, a name is not
    configurable (typo), or a binding does not parse.
    """
    _import_configurables()
    gin.clear_config()
    gin.add_config_file_search_path(str(GIN_CONFIGS_DIR))  # for `include` inside gin files
    # gin logs an ERROR for each search-path miss while resolving `include`s; real failures raise.
    logging.disable(logging.ERROR)
    try:
        gin.parse_config_files_and_bindings(
            [resolve_gin_file(f) for f in gin_files], list(bindings), finalize_config=finalize
        )
    except (ValueError, KeyError, SyntaxError, TypeError) as e:
        raise ValueError(f"gin config {list(gin_files)} with bindings {list(bindings)} is invalid: {e}") from e
    finally:
        logging.disable(logging.NOTSET)


def model() -> _DualEncoder:
    """The DualEncoder the parsed gin config describes (`DualEncoder.*`, `T5Config.*`)."""
    try:
        return DualEncoder(config=T5Config())
    except TypeError as e:
        raise ValueError(f"gin config does not describe a DualEncoder: {e} (include a gin_configs/models/*.gin)") from e


def read_bindings(text: str) -> dict[str, object]:
    """{'T5Config.emb_dim': 64, ...}: the `name = value` bindings of a saved gin config (as
    gin.config_str() writes it) with %MACROs resolved, read WITHOUT touching gin's global
    configuration (loading a checkpoint inside a gin-configured job must not change the job's config).
    Values are Python literals; a value that is not one (e.g. an @reference) is kept as its text."""
    import ast

    statements, current, depth = [], "", 0
    for line in text.splitlines():
        if line.lstrip().startswith("#") or (not line.strip() and not depth):
            continue
        current += (" " if current else "") + line.strip()
        depth += sum(line.count(c) for c in "([{") - sum(line.count(c) for c in ")]}")
        if depth <= 0:
            statements.append(current)
            current, depth = "", 0
    raw = {}
    for statement in statements:
        name, sep, value = statement.partition("=")
        if sep and name.strip() and not name.strip().startswith(("include", "import")):
            raw[name.strip()] = value.strip()

    def evaluate(value: str):
        if value.startswith("%"):
            return evaluate(raw.get(value[1:], "None"))
        for candidate in (value, value.split("#", 1)[0].strip()):  # then without a trailing comment
            try:
                return ast.literal_eval(candidate)
            except (ValueError, SyntaxError):
                pass
        return value

    return {name: evaluate(value) for name, value in raw.items()}


def model_from_gin_text(text: str) -> _DualEncoder:
    """The DualEncoder described by a saved gin config (a checkpoint's model.gin, a run's config.gin),
    built from its T5Config.* / DualEncoder.* bindings without touching gin's global configuration."""
    import dataclasses

    bindings = read_bindings(text)
    fields = {f.name for f in dataclasses.fields(_T5Config)}
    config_kwargs = {k.split(".", 1)[1]: v for k, v in bindings.items() if k.startswith("T5Config.")}
    model_kwargs = {k.split(".", 1)[1]: v for k, v in bindings.items() if k.startswith("DualEncoder.")}
    unknown = sorted(set(config_kwargs) - fields) + sorted(set(model_kwargs) - {"architecture", "projection_dim",
                                                                                  "learnable_temperature"})  # fmt: skip
    if unknown:
        raise ValueError(f"saved gin config binds unknown model parameters {unknown}")
    if isinstance(config_kwargs.get("mlp_activations"), list):
        config_kwargs["mlp_activations"] = tuple(config_kwargs["mlp_activations"])
    try:
        return _DualEncoder(config=_T5Config(**config_kwargs), **model_kwargs)
    except TypeError as e:
        raise ValueError(f"saved gin config does not describe a DualEncoder: {e}") from e


def model_gin(model: _DualEncoder) -> str:
    """Gin bindings that rebuild exactly `model` (T5Config.* and DualEncoder.*), nothing else."""
    import dataclasses

    lines = [f"T5Config.{f.name} = {getattr(model.config, f.name)!r}" for f in dataclasses.fields(model.config)]
    lines += [f"DualEncoder.{name} = {getattr(model, name)!r}"
              for name in ("architecture", "projection_dim", "learnable_temperature")]  # fmt: skip
    return "\n".join(lines) + "\n"
