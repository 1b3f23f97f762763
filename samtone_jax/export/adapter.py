"""`samtone export --format=adapter`: a LoRA model's trained part alone (its adapters, the projection,
a learnable temperature) as a parameter checkpoint whose base.json names the frozen tower it adapts.
samtone_jax.load, eval, `samtone average` and INIT_CHECKPOINT read it (the tower from base.json); it
weighs the adapters' few MB where a merged export holds whole towers."""

from __future__ import annotations

import jax

from samtone_jax.checkpoints import reader
from samtone_jax.core import paths, run_folders
from samtone_jax.core.errors import BadValueError, ExistingFileError
from samtone_jax.inference import encoder as inference
from samtone_jax.models.lora import trainable_keys


def write(checkpoint: str, dst: str, *, step: int | None = None, weights: str = "params", overwrite: bool = False):
    """Write `checkpoint`'s adapters (a LoRA run, step, soup or adapter export) to `dst`; returns its info."""
    from samtone_jax.checkpoints import save_params
    from samtone_jax.checkpoints.params_io import load_model_gin

    paths.check_bucket(dst, "--out")
    if paths.as_path(dst).exists() and not overwrite:
        raise ExistingFileError(f"{dst} already exists; choose another --out or pass --overwrite")
    encoder = inference.load_encoder(checkpoint, step=step, weights=weights)
    model = encoder.model
    if not model.lora_rank:
        raise BadValueError(
            f"--format=adapter: {checkpoint} has no LoRA adapters (DualEncoder.lora_rank = 0); export the whole "
            "model (--format=sentence-transformers or hf)"
        )
    kind, directory, _ = reader.resolve(checkpoint, step)
    root = paths.as_path(directory)
    trained = {k: jax.device_get(encoder.params[k]) for k in trainable_keys(model, encoder.params)}
    text = (root / run_folders.CONFIG_GIN).read_text() if kind == "train" else load_model_gin(directory)
    extra = {run_folders.BASE: reader.base_record(reader.base_of(checkpoint, required=True))}
    for name in (run_folders.VOCABULARY, run_folders.TOKENIZER):
        if (root / name).exists():
            extra[name] = (root / name).read_bytes()
    count = sum(x.size for x in jax.tree_util.tree_leaves(trained))
    info = {
        "format": "adapter",
        "architecture": model.architecture,
        "lora_rank": model.lora_rank,
        "parameters": int(count),
        "source": {"checkpoint": encoder.source, "step": encoder.step, "weights": weights},
    }
    save_params(dst, trained, text, info, overwrite=overwrite, extra_files=extra)
    return info
