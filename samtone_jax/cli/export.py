"""`samtone export`: a sentence-transformers / Hugging Face / ONNX folder of a trained model."""

from __future__ import annotations

import argparse

from samtone_jax.cli import flags, runtime

NAME = "export"
HELP = "a sentence-transformers / Hugging Face / ONNX folder of a trained model"
EXAMPLE = "samtone export --checkpoint=runs/my_model --format=sentence-transformers --out=runs/my_model_st"
PARSES_GIN = False  # it reads no gin, or parses its own


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="a MODEL_DIR, MODEL_DIR/checkpoints/<step> or parameter dir")
    p.add_argument(
        "--format",
        required=True,
        choices=["sentence-transformers", "hf", "onnx", "adapter"],
        help="a sentence-transformers folder, a Hugging Face model folder (+ the projection), or that folder "
        "with each side's ONNX graph (float32 and int8 weights, checked in onnxruntime); LoRA adapters are "
        "merged into the towers. adapter: a LoRA model's adapters alone, naming their frozen tower",
    )
    flags.out_flag(p, "output folder (written atomically)")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    p.add_argument("--vocabulary", default=None, help="SentencePiece .model or tokenizer.json (default: the run's)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument(
        "--adapter_scale",
        type=float,
        default=1.0,
        help="a LoRA model's adapters merged as W + γ·s·A·B: γ < 1 moves the towers back towards the frozen base "
        "(WiSE-FT for adapters; default 1: as trained)",
    )
    flags.weights_flag(p)


def run(args, bindings) -> int:
    from samtone_jax.core import paths
    from samtone_jax.export.folder import export

    runtime.required(args, "out")
    inputs = runtime.model_inputs("--checkpoint", args.checkpoint) + [("--vocabulary", args.vocabulary)]
    paths.check_not_input(args.out, inputs)
    if args.format == "adapter":
        from samtone_jax.core.errors import BadValueError
        from samtone_jax.export import adapter

        if args.adapter_scale != 1:
            raise BadValueError(
                "--adapter_scale scales the adapters merged into the towers; --format=adapter merges none"
            )
        info = adapter.write(args.checkpoint, args.out, step=args.step, weights=args.weights, overwrite=args.overwrite)
        print(f"exported the {info['parameters']:,} trained parameters of {info['architecture']} to {args.out}")
        return 0
    info = export(
        args.checkpoint,
        args.format,
        args.out,
        step=args.step,
        vocabulary=args.vocabulary,
        overwrite=args.overwrite,
        weights=args.weights,
        adapter_scale=args.adapter_scale,
    )
    print(
        f"exported {info['architecture']} ({args.format}) to {args.out}; embeddings equal ours on the probe texts "
        f"(min cosine {info['min_cosine']:.7f})"
    )
    return 0
