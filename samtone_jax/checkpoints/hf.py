"""Hugging Face checkpoints of any tower family: a transformers model folder (config.json +
`model.safetensors`, a sharded `model.safetensors.index.json`, or `pytorch_model.bin` read with
`torch.load(weights_only=True)`), alone or as a sentence-transformers folder's Transformer module.

config.json's model_type picks the family (models/families.py); the family's record gives the
variable names (`hf_locate`), the config checks and, where it has them, the gin bindings of the
tower's shape, so an import of such a folder needs no gin file (`model_bindings`). A gs:// folder's
config and weight files (only those) are copied to local disk first: safetensors and torch read
local files.
"""

from __future__ import annotations

import json
import os

import numpy as np

from samtone_jax.checkpoints.sentence_transformers_folder import transformer_folder
from samtone_jax.checkpoints.source import Source
from samtone_jax.core import paths
from samtone_jax.core.errors import BadValueError, CheckpointMismatchError, MissingFileError
from samtone_jax.models import families


def open_safetensors(file, framework: str = "numpy"):
    """safetensors' safe_open of `file`, a damaged or truncated file named in one line."""
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(str(file), framework=framework)
    except SafetensorError as e:
        raise BadValueError(
            f"{file} is damaged or truncated ({e}): copy or download it again (its size should match the source's)"
        ) from None


def load_torch_tensors(binary) -> dict:
    """The tensors of a pytorch_model.bin, read with torch.load(weights_only=True): a pickle that
    would run code is refused in one line (and never run)."""
    import pickle

    import torch

    try:
        return torch.load(str(binary), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # code inside the pickle: never run
        raise BadValueError(
            f"{binary} holds more than tensors (a pickle that would run code), so it is not loaded: save the "
            "model as model.safetensors (transformers' save_pretrained(..., safe_serialization=True)) and "
            f"use that ({_pickle_reason(e)})"
        ) from None


def _pickle_reason(e: Exception) -> str:
    """torch's reason for refusing a pickle, without its advice to turn the check off."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    kept = [line for line in lines if "weights_only=False" not in line and "weights_only" not in line.split(":")[0]]
    reason = next((line for line in kept if "Unsupported global" in line or "GLOBAL" in line), kept[0] if kept else "")
    return reason[:160]


def refuse_code_pickles(folder) -> None:
    """Before a library (sentence-transformers, transformers) loads the model folder `folder`: every
    pytorch_model.bin in it (its modules' too) holds tensors only, else one line (load_torch_tensors)."""
    for where, _, names in sorted(os.walk(paths.local_copy(folder))):
        if "pytorch_model.bin" in names:
            load_torch_tensors(os.path.join(where, "pytorch_model.bin"))


def open_tensors(folder: str):
    """(names, read(name), shape(name)) from safetensors (single or sharded) or pytorch_model.bin
    in the local `folder`."""
    root = paths.as_path(folder)
    single, index = root / "model.safetensors", root / "model.safetensors.index.json"
    if single.exists() or index.exists():
        if single.exists():
            files = [single]
        else:
            files = sorted({root / f for f in json.loads(index.read_text())["weight_map"].values()})
        handles = {}
        for f in files:
            # framework="flax" reads bfloat16 too (numpy has no bf16 of its own).
            h = open_safetensors(f, framework="flax")
            handles.update({k: h for k in h.keys()})
        return (
            list(handles),
            lambda k: np.asarray(handles[k].get_tensor(k)),
            lambda k: tuple(handles[k].get_slice(k).get_shape()),
        )
    binary = root / "pytorch_model.bin"
    if binary.exists():
        state = load_torch_tensors(binary)
        return list(state), lambda k: state[k].float().numpy(), lambda k: tuple(state[k].shape)
    raise MissingFileError(
        f"{folder}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin "
        "(expected a folder written by transformers' save_pretrained)"
    )


def local_folder(folder: str) -> str:
    """`folder` when local, else a local copy of its config and weight files."""
    root = paths.as_path(folder)
    if not paths.is_remote(root):
        return str(root)
    names = ["config.json", "model.safetensors", "model.safetensors.index.json"]
    if (root / names[2]).exists():
        names += sorted(set(json.loads((root / names[2]).read_text())["weight_map"].values()))
    elif not (root / names[1]).exists():
        names.append("pytorch_model.bin")
    return paths.local_copy(root, names)


def read_config(folder: str) -> tuple[dict, str]:
    """(config.json of a Hugging Face folder, its path for messages)."""
    path = paths.as_path(folder) / "config.json"
    if not path.exists():
        raise MissingFileError(f"{path} is missing: a Hugging Face model folder needs its config.json")
    return json.loads(path.read_text()), str(path)


def folder_family(folder: str):
    """The tower family whose model_type a Hugging Face folder's config.json names (None: no
    config.json, or no model_type, as in T5X-converted T5 folders); a model_type no family reads is
    refused, naming those that are read."""
    if not (paths.as_path(folder) / "config.json").exists():
        return None
    hf, where = read_config(folder)
    return families.for_model_type(hf.get("model_type"), where)


def configured_folder(fmt: str, src: str) -> tuple[str, int | None, object] | None:
    """(the Hugging Face folder, sentence-transformers' max_seq_length, its family) of an import whose
    tower shape comes from config.json (a sentence-transformers folder, or a Hugging Face folder of a
    family with `hf_bindings`); None when a models/*.gin must name the shape (a T5 import)."""
    if fmt == "sentence-transformers":
        folder, max_seq_length = transformer_folder(src)  # its pooling checked, its lengths kept
    elif fmt == "hf" and getattr(folder_family(src), "hf_bindings", None) is not None:
        is_sentence_transformers = (paths.as_path(src) / "modules.json").exists()
        folder, max_seq_length = transformer_folder(src) if is_sentence_transformers else (src, None)
    else:
        return None
    family = folder_family(folder)
    if family is None or family.hf_bindings is None:
        raise CheckpointMismatchError(
            f"{folder}: --format=sentence-transformers imports a tower whose config.json gives its shape "
            f"({', '.join(f.display for f in families.FAMILIES if f.hf_bindings)}); this one does not"
        )
    if not (paths.as_path(folder) / family.export_vocabulary).exists():
        raise MissingFileError(
            f"{folder}/{family.export_vocabulary} is missing: a {family.display} import needs its tokenizer"
        )
    return folder, max_seq_length, family


def model_bindings(folder: str, max_seq_length: int | None = None) -> list[str]:
    """Gin bindings of a DualEncoder over the tower of `folder`: its family's config bindings from
    config.json, an identity-initialised projection (the import embeds as the source does), and
    train.query_length / train.doc_length = the source's max_seq_length (else 256, capped by the
    positions) for samtone_jax.load."""
    hf, where = read_config(folder)
    family = families.for_model_type(hf.get("model_type"), where)
    bindings = family.hf_bindings(hf, where)
    positions = next((int(b.split("=")[1]) for b in bindings if b.startswith(f"{family.gin_name}.max_length")), None)
    length = min(max_seq_length or 256, positions or 256)
    return bindings + [
        "DualEncoder.projection_init = 'identity'",
        f"train.query_length = {length}",
        f"train.doc_length = {length}",
        f"serving.query_length = {length}",  # what it is served at after any fine-tune (serving_lengths.py)
        f"serving.doc_length = {length}",
    ]


def open_source(folder: str, config) -> Source:
    """The tensors of a Hugging Face folder under `config`'s family's names, config.json checked
    against `config` first."""
    family = families.of(config)
    folder = local_folder(folder)
    hf, where = read_config(folder)
    found = hf.get("model_type")
    if found is not None and found not in family.hf_model_types:
        raise CheckpointMismatchError(
            f"{where}: model_type {found!r}, but the gin config builds a {family.display} tower "
            f"(model_type {' / '.join(family.hf_model_types)}): import it with its own config"
        )
    family.check_hf_config(hf, where, config)
    names, read, shape = open_tensors(folder)
    if family.hf_pad_id:  # the vocabulary's padding row moves to 0, where every tower pads
        embedding = set(family.hf_locate(("token_embedder",))[0])
        stored = read

        def read(name):
            return family.swap_pad_row(stored(name)) if name in embedding else stored(name)

    return Source(
        description=f"Hugging Face {family.display} checkpoint {folder}",
        names=names,
        read=read,
        shape=shape,
        locate=family.hf_locate,
        is_encoder_variable=family.hf_encoder_variable,
        config_name=family.gin_name,
        shape_hints=family.shape_hints,
        mlp_hint=family.mlp_hint,
    )
