"""Hugging Face T5 checkpoints: a `T5EncoderModel` / `T5ForConditionalGeneration` folder.

Reads `model.safetensors` (or a sharded `model.safetensors.index.json`), else
`pytorch_model.bin` with `torch.load(weights_only=True)`. `config.json` is checked against the
gin config for what shapes cannot reveal (activation, buckets, max distance, epsilon).
Linear weights are stored [out, in]: transposed on the way in. A gs:// folder's config and weight
files (only those) are copied to local disk first: safetensors and torch read local files.
"""

from __future__ import annotations

import json
import os

import numpy as np

from samtone_jax.checkpoints.source import CheckpointMismatchError, Source
from samtone_jax.core import paths
from samtone_jax.core.errors import BadValueError, MissingFileError
from samtone_jax.models import T5Config

_FEED_FORWARD = {"relu": ("relu",), "gated-gelu": ("gelu", "linear")}


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


def _open_tensors(folder: str):
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


def check_config(folder: str, config: T5Config) -> None:
    """Fail on a config.json that disagrees with the gin T5Config, naming the gin setting."""
    path = paths.as_path(folder) / "config.json"
    if not path.exists():
        raise MissingFileError(f"{path} is missing: a Hugging Face T5 folder needs its config.json")
    hf = json.loads(path.read_text())
    act = _FEED_FORWARD.get(hf.get("feed_forward_proj", "relu"))
    checks = [
        ("num_layers", hf.get("num_layers"), config.num_layers, "T5Config.num_layers"),
        ("d_model", hf.get("d_model"), config.emb_dim, "T5Config.emb_dim"),
        ("num_heads", hf.get("num_heads"), config.num_heads, "T5Config.num_heads"),
        ("d_kv", hf.get("d_kv"), config.head_dim, "T5Config.head_dim"),
        ("d_ff", hf.get("d_ff"), config.mlp_dim, "T5Config.mlp_dim"),
        ("vocab_size", hf.get("vocab_size"), config.vocab_size, "T5Config.vocab_size"),
        (
            "relative_attention_num_buckets",
            hf.get("relative_attention_num_buckets", 32),
            config.relative_attention_num_buckets,
            "T5Config.relative_attention_num_buckets",
        ),
        (
            "relative_attention_max_distance",
            hf.get("relative_attention_max_distance", 128),
            config.relative_attention_max_distance,
            "T5Config.relative_attention_max_distance",
        ),
        ("feed_forward_proj", act, config.mlp_activations, "T5Config.mlp_activations"),
    ]
    for hf_name, theirs, ours, gin_name in checks:
        if theirs != ours:
            hint = "an unsupported feed_forward_proj" if theirs is None else repr(theirs)
            raise CheckpointMismatchError(
                f"{path}: {hf_name}={hf.get(hf_name, hf_name)!r} but the gin config has {gin_name} = {ours!r}; "
                f"set {gin_name} = {hint} (or use the gin file of this checkpoint's size)"
            )
    eps = hf.get("layer_norm_epsilon", 1e-6)
    if not np.isclose(eps, config.layer_norm_epsilon):
        raise CheckpointMismatchError(
            f"{path}: layer_norm_epsilon={eps} but T5Config.layer_norm_epsilon = {config.layer_norm_epsilon}"
        )


def _locate(path):
    first = path[0]
    if first == "token_embedder":
        return ["shared.weight", "encoder.embed_tokens.weight"], False
    if first == "relpos_bias":
        return ["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"], True
    if first == "encoder_norm":
        return ["encoder.final_layer_norm.weight"], False
    i = int(first.split("_")[1])
    block = f"encoder.block.{i}"
    if path[1] == "pre_attention_layer_norm":
        return [f"{block}.layer.0.layer_norm.weight"], False
    if path[1] == "pre_mlp_layer_norm":
        return [f"{block}.layer.1.layer_norm.weight"], False
    if path[1] == "attention":
        letter = {"query": "q", "key": "k", "value": "v", "out": "o"}[path[2]]
        return [f"{block}.layer.0.SelfAttention.{letter}.weight"], True
    return [f"{block}.layer.1.DenseReluDense.{path[2]}.weight"], True  # mlp


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


def open_source(folder: str, config: T5Config) -> Source:
    folder = local_folder(folder)
    check_config(folder, config)
    names, read, shape = _open_tensors(folder)
    return Source(
        description=f"Hugging Face checkpoint {folder}",
        names=names,
        read=read,
        shape=shape,
        locate=_locate,
        is_encoder_variable=lambda n: n.startswith("encoder.block."),
    )
