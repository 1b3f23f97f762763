"""`samtone_jax.load(path)`: a trained dual encoder as an object that embeds text.

    encoder = samtone_jax.load("runs/demo")           # a MODEL_DIR: its latest checkpoint
    q = encoder.encode_queries(["what is a dog?"])    # [1, P] float32, L2-normalised
    d = encoder.encode_documents(["a domestic canine"])
    scores = q @ d.T

`path` may be a MODEL_DIR (config.gin + checkpoints/<step>/), one of its step directories
(MODEL_DIR/checkpoints/<step>), a parameter checkpoint written by `samtone import-checkpoint`
(model.gin + params/), or a folder written by `samtone export` (either format). The SentencePiece
vocabulary comes from, in order: the `vocabulary` argument, DIR/vocab.model (train copies a local
vocabulary there; an export has spiece.model), the run's `train.vocabulary`, T5's public vocabulary
when the run named none. Prompts a run was trained with (gin `prompts.*`, tasks/prompts.py) are
put before every text, as in training: the run-wide ones, or `task`'s own (`load(path, task=...)`).
"""

from __future__ import annotations

import json

import numpy as np

from samtone_jax.checkpoints import reader
from samtone_jax.core import paths, run_folders
from samtone_jax.core.errors import BadValueError, MissingFileError
from samtone_jax.data import vocab as vocab_lib
from samtone_jax.inference import serving_lengths
from samtone_jax.inference.text_embedder import TextEmbedder
from samtone_jax.models import families

WEIGHTS = ("params", "ema")  # a run's parameters, or their moving average (step.ema_decay)


class Encoder:
    """Embeds text with a trained DualEncoder: batching, tokenisation, sharding over `mesh`."""

    def __init__(
        self,
        model,
        params,
        vocabulary,
        query_length: int = 64,
        doc_length: int = 128,
        batch_size: int = 256,
        mesh=None,
        step: int | None = None,
        source: str | None = None,
        packing_max_segments: int | None = None,
        query_prompt: str = "",
        document_prompt: str = "",
        matryoshka_dims: tuple[int, ...] | None = None,
        task_prompts: dict | None = None,
        calibration=None,
        weights: str = "params",
        training_lengths: tuple[int | None, int | None] = (None, None),
    ):
        if isinstance(vocabulary, str):
            vocabulary = vocab_lib.tokens(vocabulary)
        self.model, self.vocabulary = model, vocabulary
        self.query_length, self.doc_length = query_length, doc_length  # what it encodes at (serving)
        self.training_lengths = tuple(training_lengths)  # (query, document) it was trained at, when known
        self.step, self.source = step, source
        self.query_prompt, self.document_prompt = query_prompt, document_prompt
        # The nested dimensions the model was trained to serve truncated (objective.matryoshka_dims).
        self.matryoshka_dims = tuple(matryoshka_dims) if matryoshka_dims else None
        # {task: (query prompt, document prompt)} of a run with per-task prompts (written into an export).
        self.task_prompts = dict(task_prompts or {})
        # The int8 ranges it is served with (calibration.py; None: not calibrated for these weights).
        self.calibration = calibration
        self.weights = weights  # a run's 'params', or their moving average 'ema
        self.params_from_source = True  # False after with_params: `source` no longer says what the weights are
        self._encoder = TextEmbedder(
            model, params, vocabulary, mesh, batch_size, packing_max_segments=packing_max_segments
        )

    @property
    def params(self):
        return self._encoder.params

    def with_params(self, params) -> Encoder:
        """The same encoder (model, vocabulary, lengths, prompts, mesh) with other parameters; top-level
        keys `params` lacks keep this encoder's (a LoRA model's frozen tower under averaged adapters)."""
        import copy

        clone = copy.copy(self)
        clone._encoder = copy.copy(self._encoder)
        clone._encoder.params = clone._encoder.place(dict(self.params) | dict(params))
        clone.calibration = None  # made with other weights
        clone.params_from_source = False
        return clone

    def merged(self, adapter_scale: float = 1.0) -> Encoder:
        """The same encoder with its LoRA adapters (their update times `adapter_scale`) folded into its
        towers (models/lora.merge: sde stays sde, ade_lora becomes ade_spl), as an export writes it;
        itself when it has no adapters."""
        from samtone_jax.models.lora import merge

        if not self.model.lora_rank:
            merge(self.model, self.params, adapter_scale)  # refuses a scale other than 1
            return self
        import copy

        model, params = merge(self.model, self.params, adapter_scale)
        clone = copy.copy(self)
        clone.model = model
        clone._encoder = copy.copy(self._encoder)
        clone._encoder.model = model
        clone._encoder.params = clone._encoder.place(params)
        return clone

    @property
    def mesh(self):
        return self._encoder.mesh

    @property
    def architecture(self) -> str:
        return self.model.architecture

    def encode_queries(self, texts: list[str], progress=None, precision: str = "float32", dim: int | None = None):
        """[N, P] float32, L2-normalised query embeddings of query_prompt + text (truncated to
        query_length tokens). `dim`: the first dim dimensions, re-normalised (Matryoshka);
        `precision` 'int8' (codes with the model's calibration) or 'binary' (packed sign bits,
        uint8 [N, ceil(dim / 8)]): as a compressed index stores them (quantization.py)."""
        texts = [self.query_prompt + t for t in texts]
        return self._served(self._encoder.encode(texts, self.query_length, "query", progress), precision, dim)

    def encode_documents(
        self, texts: list[str], progress=None, precision: str = "float32", dim: int | None = None
    ) -> np.ndarray:
        """[N, P] float32, L2-normalised document embeddings of document_prompt + text (truncated
        to doc_length tokens); `precision` and `dim` as encode_queries."""
        texts = [self.document_prompt + t for t in texts]
        return self._served(self._encoder.encode(texts, self.doc_length, "document", progress), precision, dim)

    def _served(self, embeddings: np.ndarray, precision: str, dim: int | None) -> np.ndarray:
        from samtone_jax.compression import quantization

        quantization.check_precision(precision)
        if not len(embeddings):  # no texts: nothing to compress
            return embeddings
        width = embeddings.shape[1]
        if dim is not None and not 1 <= dim <= width:
            raise BadValueError(f"dim={dim}: the model embeds {width} dimensions")
        if precision == "float32" and dim is None:
            return embeddings
        if precision == "int8":
            if self.calibration is None:
                raise MissingFileError(
                    f"int8 needs the model's calibration, and {self.source} has none for step {self.step}: "
                    f"samtone calibrate --checkpoint={self.source} --task=..."
                )
            return self.calibration.compress(embeddings, precision, dim)
        x = embeddings if dim is None else quantization.truncated(embeddings, dim)
        return quantization.encode(x, precision)

    def __repr__(self) -> str:
        return (
            f"Encoder({self.architecture}, step={self.step}, query_length={self.query_length}, "
            f"doc_length={self.doc_length}, source={self.source!r})"
        )


def _vocabulary_path(directory: str, explicit: str | None, settings: dict, family) -> str | None:
    """The vocabulary file of a run or parameter checkpoint: DIR's copy under its family's name (a
    BERT tower's tokenizer.json, a T5 tower's vocab.model), else the run's train.vocabulary, else
    (None) T5's public one."""
    if explicit:
        return explicit
    local = paths.as_path(directory) / family.run_vocabulary
    if local.exists():
        return str(local)
    named = settings.get("train.vocabulary")
    if named and not paths.as_path(named).exists():
        raise MissingFileError(
            f"the vocabulary of {directory} was not found: looked for {local} and for train.vocabulary={named!r} "
            f"(as {paths.as_path(named)}); pass vocabulary=PATH (CLI: --vocabulary)"
        )
    return named  # None: T5's public vocabulary


def load_encoder(
    path: str,
    *,
    step: int | None = None,
    vocabulary: str | None = None,
    query_length: int | None = None,
    doc_length: int | None = None,
    batch_size: int = 256,
    mesh=None,
    packing_max_segments: int | None = None,
    task: str | None = None,
    calibrated: bool = True,
    weights: str = "params",
) -> Encoder:
    """An `Encoder` for the checkpoint at `path` (see the module docstring for what `path` may be).
    `calibrated` False: without the folder's calibration.json (samtone calibrate replaces it).
    `weights` 'ema': a run's moving average of its parameters (step.ema_decay) instead of them.

    Query / document lengths default to the model's serving lengths (serving_lengths.py: its base
    model's for a fine-tune, else its training lengths), not its training lengths; the
    prompts to the run's (those of `task` when the run set per-task prompts).
    `packing_max_segments` S: texts packed up to S a row (text_embedder.py), the same
    embeddings with less padding; `batch_size` then counts rows.
    """
    from samtone_jax.checkpoints import load_model_gin, load_params
    from samtone_jax.checkpoints.train_checkpoints import ema_params, restore_on_one_device
    from samtone_jax.config import gin_config

    kind, directory, step = reader.resolve(path, step)
    root = paths.as_path(directory)
    if weights not in WEIGHTS:
        raise BadValueError(f"weights={weights!r}: choose one of {WEIGHTS}")
    if weights == "ema" and kind != "train":
        raise BadValueError(f"{path} holds one set of weights (a {kind} folder): weights='ema' needs a training run")
    if kind == "train":
        config = root / run_folders.CONFIG_GIN
        if not config.exists():
            raise MissingFileError(f"{config} not found: {directory} has checkpoints but no gin config")
        text = config.read_text()
        state = restore_on_one_device(run_folders.state(root, step))
        if weights not in state:
            raise MissingFileError(
                f"{run_folders.state(root, step)} holds no moving average of the parameters: the run was trained "
                "without step.ema_decay"
            )
        params = ema_params(state) if weights == "ema" else state["params"]
    elif kind == "export":
        return load_export(
            directory,
            vocabulary=vocabulary,
            query_length=query_length,
            doc_length=doc_length,
            batch_size=batch_size,
            mesh=mesh,
            packing_max_segments=packing_max_segments,
            task=task,
            calibrated=calibrated,
        )
    else:
        text = load_model_gin(directory)
        params = load_params(directory)
    model = gin_config.model_from_gin_text(text)
    params = reader.with_base(params, model, directory)  # a LoRA model's frozen tower, from its base.json
    settings = gin_config.read_bindings(text)
    vocabulary = _vocabulary_path(directory, vocabulary, settings, families.of(model.config))
    vocab_lib.check_fits(vocabulary, families.of(model.config), model.config.vocab_size, "the vocabulary")
    serving_query, serving_doc = serving_lengths.of_settings(settings)  # not the training lengths
    query_length = query_length or serving_query
    doc_length = doc_length or serving_doc
    from samtone_jax.tasks.prompts import prompt_of

    # The prompts of `task`, else of the task the run trained on (its per-task ones, or the run-wide ones).
    query_prompt, document_prompt = prompt_of(task or settings.get("train.task"), settings)
    return Encoder(
        model,
        params,
        vocab_lib.tokens(vocabulary),
        query_length,
        doc_length,
        batch_size,
        mesh,
        step=step,
        source=directory,
        packing_max_segments=packing_max_segments,
        query_prompt=query_prompt,
        document_prompt=document_prompt,
        matryoshka_dims=settings.get("objective.matryoshka_dims"),
        task_prompts=dict(settings.get("prompts.per_task") or {}),
        calibration=_calibration_of(directory, step, weights) if calibrated else None,
        weights=weights,
        training_lengths=serving_lengths.training_lengths(settings),
    )


def _calibration_of(directory: str, step: int | None, weights: str = "params"):
    """The folder's calibration when it was made with these weights (a run's of its step, raw or
    moving average), else None."""
    import logging

    from samtone_jax.compression import calibration

    found = calibration.load(directory)
    if found is None:
        return None
    source = found.record.get("source", {})
    made_with = (source.get("step"), source.get("weights", "params"))
    if made_with != (step, weights):
        logging.getLogger(__name__).warning(
            "%s/%s is of step %s (%s), not step %s (%s): not used (recalibrate: samtone calibrate)",
            directory,
            run_folders.CALIBRATION,
            *made_with,
            step,
            weights,
        )
        return None
    return found


def load_export(
    directory: str,
    *,
    vocabulary: str | None = None,
    query_length: int | None = None,
    doc_length: int | None = None,
    batch_size: int = 256,
    mesh=None,
    packing_max_segments: int | None = None,
    task: str | None = None,
    calibrated: bool = True,
) -> Encoder:
    """An `Encoder` for a `samtone export` folder, complete or still being checked by the export
    (`load_encoder` checks the commit marker first); its prompts are the export's (samtone.json)."""
    from samtone_jax.checkpoints import load_model_gin
    from samtone_jax.checkpoints.importer import import_export
    from samtone_jax.config import gin_config

    root = paths.as_path(directory)
    info = json.loads((root / run_folders.EXPORT_JSON).read_text())
    model = gin_config.model_from_gin_text(load_model_gin(directory))
    params, _ = import_export(directory, model)
    weights = info["source"].get("weights", "params")  # what the export holds
    vocab_path = vocabulary or str(root / info["vocabulary"])
    vocab_lib.check_fits(
        vocab_path,
        families.of(model.config),
        model.config.vocab_size,
        "--vocabulary" if vocabulary else "the export's vocabulary",
    )
    vocab = vocab_lib.tokens(vocab_path, info["extra_ids"])
    return Encoder(
        model,
        params,
        vocab,
        query_length or info["query_length"],
        doc_length or info["doc_length"],
        batch_size,
        mesh,
        step=info["source"].get("step"),
        source=str(root),
        packing_max_segments=packing_max_segments,
        matryoshka_dims=info.get("matryoshka_dims"),
        calibration=_calibration_of(directory, info["source"].get("step"), weights) if calibrated else None,
        weights=weights,
        training_lengths=tuple(info.get("training_lengths") or (None, None)),
        **_export_prompts(info, task),
    )


def _export_prompts(info: dict, task: str | None) -> dict:
    """Encoder's prompt arguments from samtone.json's `prompts` ({'query', 'document'} and, per task,
    '<task>/query' / '<task>/document'); an export without prompts has none."""
    prompts = info.get("prompts") or {}
    own = task and (f"{task}/query" in prompts or f"{task}/document" in prompts)  # a task's pair is whole
    prefix = f"{task}/" if own else ""
    return {"query_prompt": prompts.get(prefix + "query", ""), "document_prompt": prompts.get(prefix + "document", "")}
