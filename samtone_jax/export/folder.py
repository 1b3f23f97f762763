"""`samtone export`: a trained dual encoder as a Hugging Face or sentence-transformers folder.

  --format=sentence-transformers   SentenceTransformer(DST) loads it offline and embeds like us
  --format=hf                      T5EncoderModel / BertModel folder(s) + projection.safetensors
  --format=onnx                    the hf folder + onnx/: each side's graph, float32 and int8
                                   (onnx_towers.py), run by onnxruntime and checked against us

Both also hold `samtone.json` (where each tower and projection is, the lengths), `model.gin`,
`spiece.model` and a model card (README.md), so `samtone_jax.load(DST)` and
`samtone import-checkpoint --format=hf --checkpoint=DST` read them back. Everything is built in a local
staging folder and checked before it becomes DST (renamed, or uploaded to gs:// with the commit
marker last; see atomic_file.py): the tokenizer against SentencePiece on probe texts, and the
exported model's embeddings against ours (cosine ≥ MIN_COSINE), so a wrong export is never left
behind.
"""

from __future__ import annotations

import json
import logging

import numpy as np

from samtone_jax.core import paths, run_folders
from samtone_jax.core.atomic_file import atomic_directory
from samtone_jax.core.errors import BadValueError, ExistingFileError, MissingFileError
from samtone_jax.data.wordpiece_tokens import WordPieceTokens
from samtone_jax.models import families
from samtone_jax.models.layout import SIDES, layout
from samtone_jax.version import __version__

log = logging.getLogger(__name__)

FORMATS = ("sentence-transformers", "hf", "onnx")
MIN_COSINE = 0.9999


def _write_hf(tmp, encoder, towers, kernels, tokenizer) -> dict:
    from safetensors.numpy import save_file

    from samtone_jax.export.hf_weights import write_encoder

    tree = layout(encoder.architecture)
    dirs = {s: "." if tree.shares_tower else tree.towers[s] for s in SIDES}
    for side in tree.tower_sides():
        write_encoder(towers[side], encoder.model.config, str(paths.as_path(tmp) / dirs[side]))
    tokenizer.save_pretrained(tmp)
    tensors = {s: "linear.weight" if tree.shares_projection else f"{s}.linear.weight" for s in SIDES}
    save_file(
        {tensors[s]: np.ascontiguousarray(np.asarray(kernels[s], np.float32).T) for s in SIDES},
        str(paths.as_path(tmp) / "projection.safetensors"),
    )
    return {
        "towers": dirs,
        "projections": {s: {"file": "projection.safetensors", "tensor": tensors[s]} for s in tensors},
    }


def _write_sentence_transformers(tmp, encoder, towers, kernels, tokenizer) -> tuple[dict, object]:
    from samtone_jax.export import sentence_transformers as st
    from samtone_jax.export.hf_weights import write_encoder

    staging = paths.as_path(tmp) / ".towers"
    dirs = {}
    for side in layout(encoder.architecture).tower_sides():
        dirs[side] = str(staging / side)
        write_encoder(towers[side], encoder.model.config, dirs[side])
        tokenizer.save_pretrained(dirs[side])
    dirs.setdefault("document", dirs["query"])
    model = st.build(encoder.architecture, dirs, kernels, encoder.query_length, encoder.doc_length, _prompts(encoder))
    model.save(tmp)
    staging.rmtree()
    return _locate_st_weights(tmp, encoder.architecture), model


def _prompts(encoder) -> dict[str, str]:
    """The prompts the model was trained with, by name (empty: none): 'query' / 'document', the ones
    `encode_query` / `encode_document` use; with per-task prompts also '<task>/query' and
    '<task>/document' (sentence-transformers: encode(texts, prompt_name='<task>/query'))."""
    named = {k: v for k, v in (("query", encoder.query_prompt), ("document", encoder.document_prompt)) if v}
    for task, (query, document) in sorted(encoder.task_prompts.items()):  # both, even '': a task's pair is whole
        named |= {f"{task}/query": query, f"{task}/document": document}
    return named


def _relative(*parts: str) -> str:
    """A path relative to the export folder ('' parts, the folder itself, dropped)."""
    return "/".join(p for p in parts if p) or "."


def _locate_st_weights(folder: str, architecture: str) -> dict:
    """Where sentence-transformers put each tower and Dense weight (read from its own config files)."""
    root = paths.as_path(folder)
    modules = json.loads((root / "modules.json").read_text())
    if layout(architecture).shares_tower:  # one pipeline, no Router
        transformer = next(m["path"] for m in modules if m["type"].endswith("Transformer"))
        dense = next(m["path"] for m in modules if m["type"].endswith("Dense"))
        towers = {"query": transformer or ".", "document": transformer or "."}
        projections = {s: {"file": _relative(dense, "model.safetensors"), "tensor": "linear.weight"} for s in towers}
        return {"towers": towers, "projections": projections}
    router = next(m["path"] for m in modules if m["type"].endswith("Router"))
    config = json.loads((root / router / "router_config.json").read_text())
    towers, projections = {}, {}
    for side in SIDES:
        route = config["structure"][side]
        towers[side] = _relative(router, next(m for m in route if config["types"][m].endswith("Transformer")))
        dense = _relative(router, next(m for m in route if config["types"][m].endswith("Dense")))
        projections[side] = {"file": _relative(dense, "model.safetensors"), "tensor": "linear.weight"}
    return {"towers": towers, "projections": projections}


def _check_embeddings(encoder, embed_queries, embed_documents, texts) -> float:
    """The smallest cosine between ours and the export's embeddings over `texts` (both sides)."""
    worst = 1.0
    for ours, theirs in (
        (encoder.encode_queries(texts), embed_queries(texts)),
        (encoder.encode_documents(texts), embed_documents(texts)),
    ):
        cos = np.sum(ours * np.asarray(theirs, np.float32), axis=1)
        worst = min(worst, float(cos.min()))
    if worst < MIN_COSINE:
        raise BadValueError(
            f"the exported model's embeddings differ from ours (min cosine {worst:.6f} < {MIN_COSINE}) "
            "on the probe texts; the export was not written"
        )
    return worst


def export(
    checkpoint: str,
    fmt: str,
    dst: str,
    *,
    step: int | None = None,
    vocabulary: str | None = None,
    overwrite: bool = False,
    weights: str = "params",
    adapter_scale: float = 1.0,
) -> dict:
    """Export `checkpoint` (anything samtone_jax.load takes) to `dst`; returns samtone.json's content.
    `weights` 'ema': a run's moving average of its parameters (step.ema_decay); `adapter_scale` γ: a
    LoRA model's adapters merged as W + γ·s·A·B (models/lora.merge)."""
    from transformers.utils import logging as hf_logging

    from samtone_jax.config import gin_config
    from samtone_jax.export import tokenizer as tokenizer_lib
    from samtone_jax.export.model_card import model_card, mteb_metadata
    from samtone_jax.inference import encoder as inference

    if fmt not in FORMATS:
        raise BadValueError(f"--format={fmt!r}: choose one of {FORMATS}")
    paths.check_bucket(dst, "--out")
    dst = paths.as_path(dst)
    if dst.exists() and not overwrite:  # before the slow part
        raise ExistingFileError(f"{dst} already exists; choose another --out or pass --overwrite")
    hf_logging.disable_progress_bar()
    # LoRA adapters folded into the towers: sentence-transformers loads a plain model.
    encoder = inference.load_encoder(checkpoint, step=step, vocabulary=vocabulary, weights=weights)
    encoder = encoder.merged(adapter_scale)
    wordpiece = isinstance(encoder.vocabulary, WordPieceTokens)  # a BERT-family tower's tokenizer.json
    vocabulary_bytes = encoder.vocabulary.tokenizer_json if wordpiece else encoder.vocabulary.sp_model
    if vocabulary_bytes is None:  # seqio loads lazily: fail here, naming the file
        raise MissingFileError(f"the vocabulary of {checkpoint} could not be read")
    vocabulary_file = run_folders.TOKENIZER if wordpiece else run_folders.EXPORT_VOCABULARY
    probes = tokenizer_lib.probe_texts()
    longest = max(encoder.query_length, encoder.doc_length)
    if wordpiece:
        tokenizer = tokenizer_lib.json_tokenizer(
            encoder.vocabulary, longest, families.of(encoder.model.config).hf_tokenizer
        )
    else:
        tokenizer = tokenizer_lib.t5_tokenizer(encoder.vocabulary, longest)
    prompted = [prompt + text for prompt in set(_prompts(encoder).values()) - {""} for text in probes[:20]]
    for length in {encoder.query_length, encoder.doc_length}:  # and on prompted text, as the export will see it
        tokenizer_lib.check_parity(tokenizer, encoder.vocabulary, probes + prompted, length)
    towers, kernels = layout(encoder.architecture).split(encoder.params)
    with atomic_directory(dst, overwrite) as tmp:
        if fmt in ("hf", "onnx"):
            where = _write_hf(tmp, encoder, towers, kernels, tokenizer)
            if fmt == "onnx":
                from samtone_jax.export import onnx_towers

                where["onnx"] = onnx_towers.write(tmp, encoder, towers, kernels)
                where["onnx_quantization"] = onnx_towers.QUANTIZATION
        else:
            where, model = _write_sentence_transformers(tmp, encoder, towers, kernels, tokenizer)
        info = {
            "samtone_jax_version": __version__,
            "format": fmt,
            "architecture": encoder.architecture,
            "query_length": encoder.query_length,  # served at (serving_lengths.py)
            "doc_length": encoder.doc_length,
            "training_lengths": list(encoder.training_lengths),  # [query, document] it trained at
            "projection_dim": int(kernels["query"].shape[1]),
            "vocabulary": vocabulary_file,
            "extra_ids": int(encoder.vocabulary.extra_ids),
            **({"prompts": _prompts(encoder)} if _prompts(encoder) else {}),
            # trained to serve truncated: SentenceTransformer(DST, truncate_dim=k), samtone eval --dims
            **({"matryoshka_dims": list(encoder.matryoshka_dims)} if encoder.matryoshka_dims else {}),
            **where,
            "source": {"checkpoint": encoder.source, "step": encoder.step, "weights": encoder.weights}
            | ({"adapter_scale": adapter_scale} if adapter_scale != 1 else {}),
            **({"calibration": run_folders.CALIBRATION} if encoder.calibration is not None else {}),
            "mteb": mteb_metadata(encoder.source, int(kernels["query"].shape[1]), longest, encoder.calibration),
        }
        staged = paths.as_path(tmp)  # local; becomes DST as a whole
        if not (staged / vocabulary_file).exists():  # (an SDE's tokenizer save already put tokenizer.json there)
            (staged / vocabulary_file).write_bytes(vocabulary_bytes)
        (staged / run_folders.MODEL_GIN).write_text(gin_config.model_gin(encoder.model))
        if encoder.calibration is not None:  # the int8 ranges it is served with (calibration.py)
            encoder.calibration.save(staged)
        (staged / run_folders.EXPORT_JSON).write_text(json.dumps(info, indent=2))
        (staged / run_folders.MODEL_CARD).write_text(
            model_card(
                architecture=encoder.architecture,
                config=encoder.model.config,
                projection_dim=info["projection_dim"],
                fmt=fmt,
                query_length=encoder.query_length,
                doc_length=encoder.doc_length,
                training_lengths=encoder.training_lengths,
                run_dir=encoder.source,
                step=encoder.step,
                matryoshka_dims=encoder.matryoshka_dims,
                calibration=encoder.calibration,
                weights=encoder.weights,
            )
        )
        texts = probes[:40] + [" ".join(probes[40:60])]  # one text longer than any length: truncation checked
        if fmt == "sentence-transformers":  # reloaded from disk, offline, as a user would
            from sentence_transformers import SentenceTransformer

            del model
            reloaded = SentenceTransformer(tmp, device="cpu", local_files_only=True)
            info["min_cosine"] = _check_embeddings(encoder, reloaded.encode_query, reloaded.encode_document, texts)
        else:
            reloaded = inference.load_export(tmp)
            info["min_cosine"] = _check_embeddings(encoder, reloaded.encode_queries, reloaded.encode_documents, texts)
        if fmt == "onnx":  # each graph in onnxruntime against us, tokenised by the export's tokenizer
            from samtone_jax.export import onnx_towers

            info["onnx_check"] = onnx_towers.check(tmp, encoder, tokenizer, info["onnx"], texts, MIN_COSINE)
        (staged / run_folders.EXPORT_JSON).write_text(json.dumps(info, indent=2))
    log.info("exported %s (%s) to %s; min cosine to ours %.7f", checkpoint, fmt, dst, info["min_cosine"])
    return info
