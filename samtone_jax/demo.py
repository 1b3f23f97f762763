"""`make demo`: the embedded default run.

Until the training loop lands, the demo exercises the model path end to end on the CPU: it
trains a small SentencePiece vocabulary on the sentences below, builds the tiny T5.1.1 SDE from
gin (`models/t5_1_1_tiny.gin`), encodes queries and documents, and prints the cosine matrix and
each query's top-1 document. The model is randomly initialised, so the ranking is not
meaningful yet; the shapes, normalisation and determinism are.
"""

from __future__ import annotations

import io
import time

import jax
import jax.numpy as jnp
import numpy as np
import sentencepiece as spm

QUERIES = [
    "what does a dual encoder compute",
    "why add same tower negatives to the loss",
    "which optimizer trains t5 models",
    "how are padding tokens handled in pooling",
]
DOCUMENTS = [
    "A dual encoder maps a query and a document to vectors and scores them by cosine similarity.",
    "Same-tower negatives add query-query similarities to the softmax denominator.",
    "T5 models are trained with the Adafactor optimizer and a decaying learning rate.",
    "Mean pooling averages the hidden states of the non-padding tokens only.",
]


def train_vocabulary(texts: list[str], vocab_size: int = 128) -> spm.SentencePieceProcessor:
    """A deterministic unigram SentencePiece model trained in memory (pad 0, eos 1, unk 2, as T5)."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def tokenize(vocab: spm.SentencePieceProcessor, texts: list[str], length: int) -> np.ndarray:
    """[N, length] int32 ids with EOS, zero-padded and truncated (T5 convention)."""
    out = np.zeros((len(texts), length), np.int32)
    for i, text in enumerate(texts):
        ids = (vocab.encode(text) + [vocab.eos_id()])[:length]
        out[i, : len(ids)] = ids
    return out


def main(gin_files=(), bindings=()) -> int:
    from samtone_jax import gin_utils
    from samtone_jax.models import init_params

    start = time.time()
    vocab = train_vocabulary(QUERIES + DOCUMENTS)
    gin_utils.parse(
        ["models/t5_1_1_tiny.gin", "architectures/sde.gin", *gin_files],
        [f"VOCAB_SIZE = {vocab.get_piece_size()}", *bindings],
    )
    model = gin_utils.model()
    params = init_params(model, jax.random.PRNGKey(0))
    q = model.apply({"params": params}, jnp.asarray(tokenize(vocab, QUERIES, 32)), method=model.encode_queries)
    d = model.apply({"params": params}, jnp.asarray(tokenize(vocab, DOCUMENTS, 64)), method=model.encode_documents)
    scores = np.asarray(q @ d.T)
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(params))
    print(f"tiny T5.1.1 {model.architecture.upper()}: {n_params:,} parameters, vocabulary {vocab.get_piece_size()}")
    print(f"embeddings: queries {q.shape}, documents {d.shape}, norms {np.linalg.norm(np.asarray(q), axis=1).round(4)}")
    print("cosine(query, document) of the untrained model:")
    print(np.array2string(scores, precision=3, suppress_small=True))
    for text, row in zip(QUERIES, scores, strict=True):
        print(f"  {text!r} -> {DOCUMENTS[int(row.argmax())][:60]!r}")
    print(f"done in {time.time() - start:.1f}s (random weights; training arrives with `samtone train`)")
    return 0
