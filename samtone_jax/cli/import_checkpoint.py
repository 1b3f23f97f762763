"""`samtone import-checkpoint`: a T5 (HF / T5X / Mesh-TF) or BERT-family (HF / sentence-transformers)
checkpoint converted to ours."""

from __future__ import annotations

import argparse

from samtone_jax.cli import flags, runtime
from samtone_jax.core.errors import BadValueError

NAME = "import-checkpoint"
HELP = "convert a T5 (HF / T5X / Mesh-TF) or BERT-family (HF / sentence-transformers) checkpoint to ours"
EXAMPLE = "samtone import-checkpoint --format=sentence-transformers --checkpoint=all-MiniLM-L6-v2 --out=runs/minilm"
PARSES_GIN = False  # it reads no gin, or parses its own


def add_flags(p: argparse.ArgumentParser) -> None:
    flags.gin_flags(p)
    p.add_argument(
        "--format",
        required=True,
        choices=["hf", "t5x", "mtf", "sentence-transformers"],
        help="hf: a Hugging Face T5 / BERT folder; t5x, mtf: T5X / Mesh-TF T5 checkpoints; sentence-transformers",
    )
    p.add_argument(
        "--checkpoint",
        dest="src",
        default=None,
        help="the checkpoint to import (folder, file or TF prefix); 'all-MiniLM-L6-v2' or 'all-mpnet-base-v2' "
        "(with --format=sentence-transformers): a pretrained model installed from the registry (required)",
    )
    p.add_argument("--src", dest="src", action=flags.Deprecated, new="--checkpoint")
    flags.out_flag(p, "output parameter checkpoint folder (an INIT_CHECKPOINT)")
    p.add_argument("--seed", type=int, default=0, help="seed for a projection the source lacks")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")


def run(args, bindings) -> int:
    import gin
    import jax

    from samtone_jax.checkpoints import hf, import_params, save_params
    from samtone_jax.cli import gin_registry
    from samtone_jax.config import gin_config
    from samtone_jax.core import paths, run_folders

    runtime.required(args, "out")
    if args.src is None:
        raise BadValueError("samtone import-checkpoint needs --checkpoint (the checkpoint to import)")
    paths.check_bucket(args.out, "--out")
    from samtone_jax.checkpoints import pretrained

    if pretrained.is_pretrained(args.src):  # a model installed from the registry, by name
        args.src = pretrained.folder(args.src)
    paths.check_not_input(args.out, [("--checkpoint", args.src)])
    src = paths.as_path(args.src)
    gin_files, gin_text = args.gin_file, None
    extra_bindings, extra = [], {}
    exported = (src / run_folders.EXPORT_JSON).exists() and (src / run_folders.MODEL_GIN).exists()
    configured = None if exported else hf.configured_folder(args.format, str(src))
    if not gin_files and exported:  # a `samtone export` folder describes its model
        import json

        gin_text = (src / run_folders.MODEL_GIN).read_text()
        info = json.loads((src / run_folders.EXPORT_JSON).read_text())  # keep its lengths for samtone_jax.load
        extra_bindings = [f"train.query_length = {info['query_length']}", f"train.doc_length = {info['doc_length']}"]
    elif configured is not None:  # the tower's shape from its config.json: no models/*.gin
        folder, max_seq_length, family = configured
        extra_bindings = hf.model_bindings(folder, max_seq_length)
        extra = {family.run_vocabulary: (paths.as_path(folder) / family.export_vocabulary).read_bytes()}
    if gin_text is not None:
        gin_registry.parse([], [gin_text, *extra_bindings, *args.gin_bindings, *bindings])
    else:
        gin_registry.parse(gin_files, extra_bindings + args.gin_bindings + bindings)
    model = gin_config.model()
    params, info = import_params(args.format, str(src), model, seed=args.seed)
    from samtone_jax.models import families

    # An export's vocabulary (a T5 tower's spiece.model, a BERT tower's tokenizer.json), kept under the run's name.
    family = families.of(model.config)
    name, kept_as = family.export_vocabulary, family.run_vocabulary
    if kept_as not in extra and (src / name).exists():
        extra[kept_as] = (src / name).read_bytes()
    if (src / name).exists():  # a vocabulary the tower cannot embed is refused before anything is written
        from samtone_jax.data import vocab as vocab_lib

        vocab_lib.check_fits(
            paths.as_str(src / name), families.of(model.config), model.config.vocab_size, f"the source's {name}"
        )
    out = save_params(args.out, params, gin.config_str(), info, overwrite=args.overwrite, extra_files=extra)
    n = sum(x.size for x in jax.tree_util.tree_leaves(params))
    print(
        f"imported {info['variables_used']} variables ({n:,} parameters, architecture "
        f"{model.architecture}) from {args.src} -> {out}; "
        f"{len(info['unused_variables'])} source variables unused (listed in {out}/info.json)"
    )
    return 0
