"""A sentence-transformers pipeline equal to our DualEncoder: Transformer (T5EncoderModel) ->
mean Pooling -> bias-free Dense (the projection) -> Normalize.

  sde      one pipeline; the Transformer truncates queries at query_length and documents at
           doc_length (its per-task lengths), so `encode_query` / `encode_document` match ours;
  ade      Router(query: [T5 query tower, Pooling, Dense_q], document: [T5 doc tower, Pooling,
           Dense_d]) -> Normalize;
  ade_spl  the same Router with one Dense module shared by both routes (saved once).
"""

from __future__ import annotations

import numpy as np


def _dense(kernel: np.ndarray):
    """ST Dense without bias or activation, weight = kernel [D, P] transposed."""
    import torch
    from sentence_transformers.sentence_transformer.modules import Dense

    return Dense(
        kernel.shape[0],
        kernel.shape[1],
        bias=False,
        activation_function=torch.nn.Identity(),
        init_weight=torch.from_numpy(np.array(kernel.T, np.float32)),
    )


def build(
    architecture: str,
    tower_dirs: dict[str, str],
    kernels: dict[str, np.ndarray],
    query_length: int,
    doc_length: int,
    prompts: dict[str, str] | None = None,
):
    """The SentenceTransformer model (CPU, float32). tower_dirs / kernels: {'query': ..., 'document': ...}
    (the same folder / array for both sides of an SDE). prompts: {'query': ..., 'document': ...}, the
    texts our model puts before each side's text, which `encode_query` / `encode_document` then
    put there too (saved in config_sentence_transformers.json)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Router, Transformer

    def transformer(folder, max_length):
        return Transformer(folder, max_seq_length=max_length, query_length=query_length, document_length=doc_length)

    from samtone_jax.models.layout import layout

    tree = layout(architecture)
    width = kernels["query"].shape[0]
    if tree.shares_tower:
        modules = [
            transformer(tower_dirs["query"], doc_length),
            Pooling(width, "mean"),
            _dense(kernels["query"]),
            Normalize(),
        ]
    else:
        pooling = Pooling(width, "mean")
        query_dense = _dense(kernels["query"])
        document_dense = query_dense if tree.shares_projection else _dense(kernels["document"])
        router = Router.for_query_document(
            query_modules=[transformer(tower_dirs["query"], query_length), pooling, query_dense],
            document_modules=[transformer(tower_dirs["document"], doc_length), pooling, document_dense],
        )
        modules = [router, Normalize()]
    prompts = dict(prompts or {})
    return SentenceTransformer(modules=modules, device="cpu", similarity_fn_name="cosine", prompts=prompts or None)
