"""Gin: the configurables this project exposes, the search path, and parsing with clear errors.

Layering follows T5X: `architectures/` (sde, ade, ade_spl) -> `models/` (T5.1.1 sizes) ->
`losses/` -> `runs/`. Files are looked up relative to the current directory first, then
relative to the package's `gin_configs/` (samtone_jax/gin_configs, shipped in the wheel).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path

import gin

from samtone_jax.config import renamed
from samtone_jax.core.errors import BadValueError
from samtone_jax.models import DualEncoder as _DualEncoder
from samtone_jax.models import families
from samtone_jax.objectives import distillation as _distillation
from samtone_jax.objectives import losses as _losses

GIN_CONFIGS_DIR = Path(__file__).resolve().parent.parent / "gin_configs"  # inside the package: a wheel ships them

# The tower configs a gin file may bind (one of them, each family's config class by its name):
# name -> (its class, its gin-wrapped class, which picks up the bound parameters when called).
TOWER_CONFIGS = {
    f.gin_name: (f.config_class, gin.external_configurable(f.config_class, f.gin_name)) for f in families.FAMILIES
}
MODEL_FIELDS = (
    "architecture",
    "projection_dim",
    "learnable_temperature",
    "projection_init",
    "lora_rank",
    "lora_alpha",
    "lora_targets",
    "lora_layers",
)
DualEncoder = gin.external_configurable(_DualEncoder, "DualEncoder")
# Bound by gin_configs/losses/*.gin; call it with (q, d, ...) and the bound settings apply.
contrastive_loss = gin.external_configurable(_losses.contrastive_loss, "contrastive_loss")
distillation_loss = gin.external_configurable(_distillation.distillation_loss, "distillation_loss")


def _tolerant(exists):
    """gin's check whether an include names a file inside a Python package raises TypeError when the
    include's first folder is a namespace package, which any folder on sys.path is: `include
    'runs/x.gin'` from a working directory that has a runs/ folder. Such a path is not a package
    file: say so, and gin goes on to its search path."""

    def check(path: str) -> bool:
        try:
            return exists(path)
        except TypeError:
            return False

    return check


def _renaming(reader):
    """A gin file reader whose text has the previous release's names renamed (config/renamed.py)."""

    @contextlib.contextmanager
    def read(path):
        with reader(path) as f:
            content = f.read()
        yield io.StringIO(renamed.text(content if isinstance(content, str) else content.decode(), path))

    return read


gin.config._FILE_READERS[:] = [(_renaming(reader), _tolerant(exists)) for reader, exists in gin.config._FILE_READERS]


def resolve_gin_file(path: str) -> str:
    """`path` as given if it exists, else relative to the package's gin_configs/."""
    if os.path.exists(path):
        return os.path.abspath(path)
    candidate = GIN_CONFIGS_DIR / path
    if candidate.exists():
        return str(candidate)
    raise BadValueError(f"gin file {path!r} not found in {os.getcwd()} nor in {GIN_CONFIGS_DIR}")


def parse(gin_files: Sequence[str] = (), bindings: Sequence[str] = (), *, finalize: bool = True) -> None:
    """Parse `gin_files` then `bindings` (e.g. "T5Config.dropout_rate = 0.1") into the global config.

    Raises ValueError naming the file and the gin name when a file is missing, a name is not
    configurable (typo), or a binding does not parse. Names resolve against the configurables
    imported so far: programs call gin_registry.parse, which registers all of them first.
    """
    gin.clear_config()
    gin.add_config_file_search_path(str(GIN_CONFIGS_DIR))  # for `include` inside gin files
    # gin logs an ERROR for each search-path miss while resolving `include`s; real failures raise.
    logging.disable(logging.ERROR)
    try:
        gin.parse_config_files_and_bindings(
            [resolve_gin_file(f) for f in gin_files], [renamed.binding(b) for b in bindings], finalize_config=finalize
        )
    except (ValueError, KeyError, SyntaxError, TypeError, OSError) as e:  # OSError: an include not found
        raise BadValueError(f"gin config {list(gin_files)} with bindings {list(bindings)} is invalid: {e}") from e
    finally:
        logging.disable(logging.NOTSET)
    _check_macros_are_used(bindings)
    _check_bound_types()


def _macro_name(value) -> str | None:
    if isinstance(value, gin.config.ConfigurableReference) and value.configurable.selector == "gin.macro":
        return value.scoped_selector.rsplit("/", 1)[0]
    return None


def _references(value):
    """The macro names a bound value refers to (inside lists, tuples and dicts too)."""
    name = _macro_name(value)
    if name:
        yield name
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _references(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _references(v)


# Macros a file of another layer uses: what to add when nothing uses them.
MACRO_USERS = {
    "TEMPERATURE": " (a contrastive loss file uses it: add --gin_file=losses/samtone_query.gin, or another "
    "losses/*.gin, before losses/distill_*.gin)",
    "VOCAB_SIZE": " (a T5 models/*.gin file uses it: add --gin_file=models/t5_1_1_<size>.gin)",
}


def _check_macros_are_used(bindings: Sequence[str]) -> None:
    """A macro set on the command line (`--gin.NAME=...`) that no binding refers to is a typo (the
    run would silently keep the gin file's value): ValueError naming it and the nearest macro."""
    import difflib
    import re

    used = {n for params in gin.config._CONFIG.values() for v in params.values() for n in _references(v)}
    defined = {scope for scope, selector in gin.config._CONFIG if selector == "gin.macro"}
    for binding in bindings:
        match = re.match(r"\s*([A-Za-z_]\w*)\s*=", binding)
        if "\n" in binding.strip() or not match or match.group(1) in used:
            continue
        name = match.group(1)
        near = difflib.get_close_matches(name, sorted(used), n=1)
        hint = f"; did you mean {near[0]}?" if near else f"; macros in use: {', '.join(sorted(used)) or 'none'}"
        hint += MACRO_USERS.get(name, "")
        raise BadValueError(
            f"gin macro {name} = ... is set ({binding.strip()!r}) but no binding uses %{name}{hint}"
            if name in defined
            else f"gin binding {binding.strip()!r} sets nothing{hint}"
        )


def _scalar_types(hint) -> tuple | None:
    """The accepted types of a simple annotation (int, float, str, bool, or one of them | None)."""
    import types
    import typing

    simple = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}
    if hint in simple:
        return simple[hint]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if all(a in simple for a in args):
            return tuple(t for a in args for t in simple[a]) + (type(None),)
    return None


def _check_bound_types() -> None:
    """Every bound int / float / str / bool parameter holds a value of its annotated type (after
    macros), so `train.batch_size = 'four'` fails here, naming the binding, not deep in a step."""
    import typing

    for (_scope, selector), params in gin.config._CONFIG.items():
        configurable = gin.config._REGISTRY.get(selector) if selector != "gin.macro" else None
        if configurable is None:
            continue
        try:
            hints = typing.get_type_hints(configurable.wrapped)
        except Exception:  # noqa: BLE001  an annotation gin's target cannot resolve: nothing to check
            continue
        for param, value in params.items():
            via = []
            while (name := _macro_name(value)) is not None:
                via.append(name)
                value = gin.config._CONFIG.get((name, "gin.macro"), {}).get("value")
            accepted = _scalar_types(hints.get(param))
            if accepted is None or isinstance(value, gin.config.ConfigurableReference):
                continue
            if not isinstance(value, accepted) or (isinstance(value, bool) and bool not in accepted):
                where = f"{configurable.name}.{param}" + (f" (via %{' -> %'.join(via)})" if via else "")
                raise BadValueError(
                    f"gin binding {where} = {value!r} is a {type(value).__name__}, but {configurable.name} takes "
                    f"{param}: {_type_name(hints[param])}; fix it in the gin file or with "
                    f"--gin.{via[0] if via else f'{configurable.name}.{param}'}=VALUE"
                )


def _type_name(hint) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def model() -> _DualEncoder:
    """The DualEncoder the parsed gin config describes (`DualEncoder.*` and `T5Config.*` or
    `BertConfig.*`)."""
    bound = sorted(
        {name for name in TOWER_CONFIGS for _, selector in gin.config._CONFIG if selector.split(".")[-1] == name}
    )  # the whole last part: DistilBertConfig is not BertConfig
    if not bound:
        raise BadValueError(
            "no T5Config.* binding: the gin config names no model size; include one of gin_configs/models/*.gin "
            "(e.g. --gin_file=models/t5_1_1_base.gin) before the run's gin file, or for a BERT-family tower the "
            "model.gin of its import (samtone import-checkpoint)"
        )
    if len(bound) > 1:
        raise BadValueError(
            f"the gin config binds both {' and '.join(f'{n}.*' for n in bound)}: include one models/*.gin (one tower)"
        )
    try:
        return DualEncoder(config=TOWER_CONFIGS[bound[0]][1]())
    except TypeError as e:
        raise BadValueError(
            f"gin config does not describe a DualEncoder: {e} (include a gin_configs/models/*.gin)"
        ) from e


_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")  # a quoted Python string


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
        continued = line.rstrip().endswith("\\")  # gin wraps a long value: `name = \` then the value
        current += (" " if current else "") + line.strip().removesuffix("\\").strip()
        code = _STRING.sub("", line)  # brackets inside a quoted value (a prompt) do not nest
        depth += sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")
        if depth <= 0 and not continued:
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

    return renamed.keys({name: evaluate(value) for name, value in raw.items()})


def model_from_gin_text(text: str) -> _DualEncoder:
    """The DualEncoder described by a saved gin config (a checkpoint's model.gin, a run's config.gin),
    built from its T5Config.* or BertConfig.* and DualEncoder.* bindings without touching gin's
    global configuration."""
    import dataclasses

    bindings = read_bindings(text)
    bound = [name for name in TOWER_CONFIGS if any(k.startswith(f"{name}.") for k in bindings)]
    name = bound[0] if bound else families.DEFAULT.gin_name  # no binding: the default family's defaults
    config_class = TOWER_CONFIGS[name][0]
    fields = {f.name for f in dataclasses.fields(config_class)}
    config_kwargs = {k.split(".", 1)[1]: v for k, v in bindings.items() if k.startswith(f"{name}.")}
    model_kwargs = {k.split(".", 1)[1]: v for k, v in bindings.items() if k.startswith("DualEncoder.")}
    unknown = sorted(set(config_kwargs) - fields) + sorted(set(model_kwargs) - set(MODEL_FIELDS))
    if unknown:
        raise BadValueError(f"saved gin config binds unknown model parameters {unknown}")
    if isinstance(config_kwargs.get("mlp_activations"), list):
        config_kwargs["mlp_activations"] = tuple(config_kwargs["mlp_activations"])
    for name in ("lora_targets", "lora_layers"):  # hashable: the model is a static argument of jit
        if isinstance(model_kwargs.get(name), list):
            model_kwargs[name] = tuple(model_kwargs[name])
    try:
        return _DualEncoder(config=config_class(**config_kwargs), **model_kwargs)
    except TypeError as e:
        raise BadValueError(f"saved gin config does not describe a DualEncoder: {e}") from e


def model_gin(model: _DualEncoder) -> str:
    """Gin bindings that rebuild exactly `model` (its tower config's and DualEncoder.*), nothing else."""
    import dataclasses

    name = type(model.config).__name__
    lines = [f"{name}.{f.name} = {getattr(model.config, f.name)!r}" for f in dataclasses.fields(model.config)]
    lines += [f"DualEncoder.{field} = {getattr(model, field)!r}" for field in MODEL_FIELDS]
    return "\n".join(lines) + "\n"
