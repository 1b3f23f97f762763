"""Text -> token ids for encoding, with SentencePiece alone (no TensorFlow, no seqio).

The tasks' training pipelines tokenise with seqio's SentencePieceVocabulary inside tf.data.
Everything that embeds text outside them (`samtone_jax.load(...).encode_queries`, `samtone
eval / encode / mine`, the training-time retrieval evaluation, ADORE's queries, the export's
parity check) goes through this module instead, so serving a model imports neither TensorFlow
nor seqio. Built as the pipeline builds them: the same model proto with seqio's extra ids
appended (`▁<extra_id_i>`, user-defined, last id first), then each text truncated to length − 1
ids, EOS (1), zeros — the feature converter's `trim_append_eos_pad`. Tested (tests/test_inference.py)
equal to seqio's Python `encode`, and to the tf.data route except where tf_text's SentencePiece
build breaks a tie between equal-scored segmentations the other way (1 text in ~3,000 of SQuAD
dev: the same ids, permuted).
"""

from __future__ import annotations

import functools

import numpy as np

from samtone_jax.core import paths
from samtone_jax.core.errors import BadValueError, MissingFileError

EOS_ID = 1  # features.EOS_ID (not imported: that module needs TensorFlow)


class SentencePieceTokens:
    """The tokeniser of a SentencePiece model file (local or gs://), loaded on first use. Offers
    what the package reads of a seqio vocabulary: `sp_model` (the proto with the extra ids),
    `extra_ids`, `vocab_size`, `encode(text)`; and `tokenize_batch(texts, length)`."""

    def __init__(self, path: str, extra_ids: int = 0):
        self.path, self.extra_ids = str(path), int(extra_ids)

    @functools.cached_property
    def sp_model(self) -> bytes:
        from sentencepiece import sentencepiece_model_pb2

        try:
            raw = paths.as_path(self.path).read_bytes()
        except FileNotFoundError as e:
            raise MissingFileError(f"SentencePiece model {self.path} not found") from e
        try:
            model = sentencepiece_model_pb2.ModelProto.FromString(raw)
        except Exception as e:  # protobuf's DecodeError: not a SentencePiece model (corrupt, cut short, another file)
            raise BadValueError(
                f"{self.path} is not a SentencePiece model ({type(e).__name__}: {e}): point the vocabulary at the "
                ".model file `samtone build-vocab` (or spm_train) wrote"
            ) from None
        for i in reversed(range(self.extra_ids)):  # as seqio adds them: the last extra id first
            model.pieces.add(
                piece=f"▁<extra_id_{i}>", score=0.0, type=sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
            )
        return model.SerializeToString()

    @functools.cached_property
    def _processor(self):
        import sentencepiece

        processor = sentencepiece.SentencePieceProcessor()
        processor.LoadFromSerializedProto(self.sp_model)
        return processor

    @property
    def vocab_size(self) -> int:
        return self._processor.GetPieceSize()

    def encode(self, text: str) -> list[int]:
        """The ids of `text` (no EOS)."""
        return self._processor.EncodeAsIds(text)

    def tokenize_batch(self, texts: list[str], length: int) -> tuple[np.ndarray, np.ndarray]:
        """([N, length] int32 ids: the first length − 1, EOS, zeros; [N] int32 1 where truncated)."""
        tokens = np.zeros((len(texts), length), np.int32)
        truncated = np.zeros((len(texts),), np.int32)
        for row, ids in enumerate(self._processor.EncodeAsIds(list(texts)) if texts else []):
            kept = ids[: length - 1]
            tokens[row, : len(kept)] = kept
            tokens[row, len(kept)] = EOS_ID
            truncated[row] = len(ids) >= length
        return tokens, truncated


def tokens_of(vocabulary):
    """`vocabulary` (a SentencePieceTokens or WordPieceTokens, or a seqio SentencePieceVocabulary
    from a task) as the tokeniser that encodes text outside tf.data: itself, or the
    SentencePieceTokens of the same model file and extra ids."""
    if hasattr(vocabulary, "tokenize_batch"):
        return vocabulary
    if hasattr(vocabulary, "tokenizer_json_file"):  # data/vocab.WordPieceVocabulary (seqio's, for tf.data)
        return vocabulary.tokens
    return _shared(vocabulary.sentencepiece_model_file, vocabulary.extra_ids)


@functools.cache
def _shared(path: str, extra_ids: int) -> SentencePieceTokens:
    return SentencePieceTokens(path, extra_ids)


def tokenize_texts(vocabulary, texts: list[str], length: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokenise texts for encoding (corpus, queries): ([N, length] int32, [N] truncated 0/1)."""
    return tokens_of(vocabulary).tokenize_batch(texts, length)
