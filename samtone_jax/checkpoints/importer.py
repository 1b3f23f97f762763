"""Import a public encoder (any tower family from Hugging Face or sentence-transformers folders,
checkpoints/hf.py; T5 also from T5X and Mesh-TF) into our DualEncoder parameter tree.

SDE: the encoder is the source encoder. ADE / ADE-SPL: both towers start as copies of it. The
projection comes from the source when it has one (t5x_retrieval's `projection_layer/kernel`),
else it is freshly initialised from `seed`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from samtone_jax.checkpoints import hf, mtf, t5x
from samtone_jax.checkpoints.sentence_transformers_folder import transformer_folder
from samtone_jax.checkpoints.source import report_unused, tower_from_source
from samtone_jax.core import paths, run_folders
from samtone_jax.core.atomic_file import require_complete
from samtone_jax.core.errors import BadValueError, CheckpointMismatchError
from samtone_jax.models import DualEncoder, families, init_params
from samtone_jax.models.dual_encoder import Projection
from samtone_jax.models.layout import SIDES, layout

FORMATS = {
    "hf": hf.open_source,
    "t5x": t5x.open_source,
    "mtf": mtf.open_source,
    "sentence-transformers": lambda src, config: hf.open_source(transformer_folder(src)[0], config),
}


def abstract_params(model: DualEncoder):
    """Shapes and dtypes of the model's (unboxed) parameters, without allocating them."""
    return jax.eval_shape(lambda: nn.unbox(init_params(model, jax.random.PRNGKey(0))))


def _projection(source, model: DualEncoder, expected, seed: int) -> np.ndarray:
    if source.projection_name in source.name_set:
        got = tuple(source.shape(source.projection_name))
        if got != tuple(expected.shape):
            raise CheckpointMismatchError(
                f"{source.description}: {source.projection_name!r} has shape {got} but the model's "
                f"projection is {tuple(expected.shape)}; set DualEncoder.projection_dim = {got[-1]}"
            )
        return np.asarray(source.read(source.projection_name), expected.dtype)
    layer = Projection(expected.shape[-1], model.config.param_dtype, model.projection_init)
    init = layer.init(jax.random.PRNGKey(seed), jnp.zeros((1, expected.shape[0]), jnp.float32))
    return np.asarray(nn.unbox(init)["params"]["kernel"])


def import_export(src: str, model: DualEncoder) -> tuple[dict, dict]:
    """Parameters from a `samtone export` folder (its samtone.json says where each part is); the
    caller has checked that the folder is complete (import_params does)."""
    import json

    src = paths.local_copy(src)  # a gs:// export is read from a local copy (safetensors reads local files)
    info = json.loads((paths.as_path(src) / run_folders.EXPORT_JSON).read_text())
    if info["architecture"] != model.architecture:
        raise CheckpointMismatchError(
            f"{src} holds an {info['architecture']} model but the gin config builds {model.architecture}: include "
            f"architectures/{info['architecture']}.gin (or pass --gin_file={src}/model.gin)"
        )
    abstract = abstract_params(model)
    tree = layout(model.architecture)
    towers, kernels, used_total = {}, {}, 0
    for side in SIDES:
        folder = str(paths.as_path(paths.as_path(src) / info["towers"][side]))  # normalised
        source = hf.open_source(folder, model.config)
        towers[side], used = tower_from_source(source, abstract[tree.towers[side]])
        report_unused(source, used)
        used_total += len(used) + 1
        where = info["projections"][side]
        with hf.open_safetensors(paths.as_path(src) / where["file"]) as f:
            kernels[side] = np.array(f.get_tensor(where["tensor"]).T)  # stored [P, D] as torch's Linear
    params = tree.assemble(towers, kernels)
    expected = abstract[tree.projections["query"]]["kernel"].shape
    if kernels["query"].shape != tuple(expected):
        raise CheckpointMismatchError(
            f"{src}: projection {kernels['query'].shape} but the model's is {tuple(expected)}; "
            f"set DualEncoder.projection_dim = {kernels['query'].shape[1]}"
        )
    if "log_temperature" in abstract:
        params["log_temperature"] = np.asarray(np.log(model.learnable_temperature), np.float32)
    if tree.shares_tower:
        used_total //= 2  # both sides read the same tower and projection
    return params, {"format": "hf", "source": src, "export": info, "variables_used": used_total, "unused_variables": []}


def import_params(fmt: str, src: str, model: DualEncoder, seed: int = 0) -> tuple[dict, dict]:
    """Parameters for `model` from checkpoint `src` in format `fmt` ('hf' | 't5x' | 'mtf').

    An `hf` source may also be a `samtone export` folder (either format): both towers and the
    projection(s) come back from it. Returns (params: nested dict of numpy arrays, info).
    """
    if fmt not in FORMATS:
        raise BadValueError(f"--format={fmt!r}: must be one of {sorted(FORMATS)}")
    if fmt == "hf" and (paths.as_path(src) / run_folders.EXPORT_JSON).exists():
        require_complete(src, "export")
        return import_export(src, model)
    family = families.of(model.config)
    if fmt not in family.import_formats:
        raise BadValueError(
            f"--format={fmt} does not hold {family.display} towers (the gin config builds one); "
            f"a {family.display} tower imports from --format={' | '.join(family.import_formats)}"
        )
    source = FORMATS[fmt](src, model.config)
    abstract = abstract_params(model)
    tree = layout(model.architecture)
    tower, used = tower_from_source(source, abstract[tree.towers["query"]])
    kernel = _projection(source, model, abstract[tree.projections["query"]]["kernel"], seed)
    projection_from_source = source.projection_name in source.name_set
    if projection_from_source:
        used.add(source.projection_name)
    report_unused(source, used)
    # Both sides start from the source; two towers get independent copies (they train apart).
    params = tree.assemble({s: tower for s in SIDES}, {s: kernel for s in SIDES})
    if "log_temperature" in abstract:  # a fresh learnable temperature starts at its configured value
        params["log_temperature"] = np.asarray(np.log(model.learnable_temperature), np.float32)
    info = {
        "format": fmt,
        "source": src,
        "variables_used": len(used),
        "projection_from_source": projection_from_source,
        "unused_variables": sorted(set(source.names) - used),
    }
    return params, info
