"""SentencePiece vocabularies: the public T5 one by default, or one trained from a task's text.

T5.1.1 checkpoints use `gs://t5-data/vocabs/cc_all.32000/sentencepiece.model` (32,000 pieces +
100 extra ids = 32,100; the embedding is padded to 32,128). Offline (no hub, no GCS), train one
from a task with `samtone build-vocab --task=... --vocab_size=N --out=...`: deterministic for a
given input, ids as T5 (pad 0, eos 1, unk 2), written to a temporary file and renamed.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Iterable

from samtone_jax.core import paths
from samtone_jax.core.errors import BadValueError, MissingFileError, UnreachableError

DEFAULT_VOCAB_PATH = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"
PUBLIC_T5_PIECES = 32000  # DEFAULT_VOCAB_PATH's pieces (then 100 extra ids)
DEFAULT_EXTRA_IDS = 100


def _model_and_extra_ids(path: str | None, extra_ids: int | None) -> tuple[str, int]:
    """T5's public model (with its 100 extra ids) unless a path is given (no extra ids unless given)."""
    path = path or DEFAULT_VOCAB_PATH
    if extra_ids is None:
        extra_ids = DEFAULT_EXTRA_IDS if path == DEFAULT_VOCAB_PATH else 0
    return path, extra_ids


def is_wordpiece(path: str | None) -> bool:
    """Whether `path` is a Hugging Face tokenizer.json (a BERT-family tower's vocabulary)."""
    return path is not None and str(path).endswith(".json")


def vocabulary(path: str | None = None, extra_ids: int | None = None):
    """A seqio.SentencePieceVocabulary (loaded lazily, on first use), local or gs://; for a
    tokenizer.json, the seqio vocabulary of its WordPiece (ids without [CLS] / [SEP]: the feature
    converter adds them, as it adds T5's EOS)."""
    if is_wordpiece(path):
        return _wordpiece_vocabulary_class()(path)
    path, extra_ids = _model_and_extra_ids(path, extra_ids)
    return _vocabulary_class()(path, extra_ids=extra_ids)


def check_fits(path: str | None, family, vocab_size: int, what: str) -> None:
    """Refuse a vocabulary that is not the tower family's kind (`family.tokenizer`: a BERT tower reads
    a tokenizer.json, a T5 tower a SentencePiece model) or that has more ids than the tower's
    embedding (`vocab_size`; out-of-range ids embed as NaN); a tokenizer.json is read and its special
    tokens checked. `what` names the setting (e.g. 'train.vocabulary')."""
    bert = family.tokenizer == "wordpiece"
    setting = f"{family.gin_name}.vocab_size"
    if bert != is_wordpiece(path):
        raise BadValueError(
            f"{what}={path!r}: a {family.display} tower reads "
            f"{'its tokenizer.json (the import keeps one: PARAMS/tokenizer.json)' if bert else 'a SentencePiece model'}"
        )
    if bert:
        wordpiece = tokens(path)
        wordpiece.start_end_ids  # noqa: B018  (a tokenizer without [CLS] … [SEP] around a text is refused)
        if wordpiece.source_pad_id != family.hf_pad_id:
            raise BadValueError(
                f"{what}={path!r} pads with id {wordpiece.source_pad_id}, but a {family.display} tower's vocabulary "
                f"pads with id {family.hf_pad_id}: use the model's own tokenizer.json"
            )
        if wordpiece.vocab_size > vocab_size:
            raise BadValueError(
                f"{what}={path!r} has {wordpiece.vocab_size} ids but the tower embeds {vocab_size} "
                f"({setting}): use the model's own tokenizer.json"
            )
    elif not path:  # T5's public vocabulary: text maps to its 32,000 pieces (the extra ids are sentinels)
        if vocab_size < PUBLIC_T5_PIECES:
            raise BadValueError(
                f"{what} is not set, so T5's public vocabulary is used: its {PUBLIC_T5_PIECES:,} pieces do not fit "
                f"the tower's {vocab_size} ({setting}, gin VOCAB_SIZE): set {what} to the "
                "vocabulary the model was built for, or VOCAB_SIZE to at least 32128 (T5.1.1's)"
            )
    else:
        if paths.as_path(path).is_dir():
            raise BadValueError(f"{what}={path!r} is a folder: point it at the SentencePiece .model file")
        size = tokens(path).vocab_size  # reads it: a corrupt file fails here, naming it
        if size > vocab_size:
            raise BadValueError(
                f"{what}={path!r} has {size} pieces but the tower embeds {vocab_size} "
                f"({setting}, gin VOCAB_SIZE): set VOCAB_SIZE to at least {size}, or use the model's own "
                "vocabulary"
            )


def special_ids(path: str | None) -> tuple[int | None, int]:
    """(the id every input starts with, or None; the id that ends it) for the vocabulary at `path`:
    T5 (None, EOS 1); a BERT-family tokenizer.json ([CLS], [SEP])."""
    if not is_wordpiece(path):
        return None, 1
    return tokens(path).start_end_ids


@functools.cache
def _wordpiece_vocabulary_class():
    import numpy as np
    import seqio

    from samtone_jax.core.tensorflow_setup import tf
    from samtone_jax.data.wordpiece_tokens import WordPieceTokens

    class WordPieceVocabulary(seqio.Vocabulary):
        """seqio's interface over data/wordpiece_tokens.py (the `tokenizers` library, called from
        tf.data through tf.numpy_function): a scalar text -> [n] int32 ids, a vector -> ragged."""

        def __init__(self, path: str):
            self._tokens = self.tokens = WordPieceTokens(path)  # `tokens`: the same ids outside tf.data
            self.tokenizer_json_file = str(path)
            super().__init__(extra_ids=0)

        @property
        def eos_id(self):
            return None  # the converter ends every input with [SEP]

        @property
        def unk_id(self):
            return self._tokens.unk_id

        @property
        def _base_vocab_size(self):
            return self._tokens.vocab_size

        def _encode(self, s):
            return self._tokens.encode(s)

        def _decode(self, ids):
            return self._tokens.decode(ids)

        def _encode_tf(self, s):
            def encode(texts):
                rows = [self._tokens.encode(t.decode("utf-8")) for t in np.atleast_1d(texts)]
                values = np.array([i for row in rows for i in row], np.int32)
                return values, np.array([len(row) for row in rows], np.int64)

            values, lengths = tf.numpy_function(encode, [s], [tf.int32, tf.int64], stateful=False)
            values.set_shape([None])
            if s.shape.rank == 0:
                return values
            lengths.set_shape([None])
            return tf.RaggedTensor.from_row_lengths(values, lengths)

        def _decode_tf(self, ids):
            raise NotImplementedError("WordPieceVocabulary decodes in Python only (decode)")

        def __eq__(self, other):
            return isinstance(other, WordPieceVocabulary) and other.tokenizer_json_file == self.tokenizer_json_file

        def __hash__(self):
            return hash(self.tokenizer_json_file)

    return WordPieceVocabulary


def tokens(path: str | None = None, extra_ids: int | None = None):
    """The same model as `vocabulary(path, extra_ids)` for encoding text outside tf.data, without
    TensorFlow or seqio (data/sentencepiece_tokens.py); a Hugging Face `tokenizer.json` (a BERT-family
    model's WordPiece) gives data/wordpiece_tokens.py's tokeniser."""
    from samtone_jax.data.sentencepiece_tokens import SentencePieceTokens

    if is_wordpiece(path):
        from samtone_jax.data.wordpiece_tokens import WordPieceTokens

        return WordPieceTokens(path)
    return SentencePieceTokens(*_model_and_extra_ids(path, extra_ids))


@functools.cache
def _vocabulary_class():
    import seqio

    import samtone_jax.core.tensorflow_setup  # noqa: F401  (before seqio's first TF op)

    class SentencePieceVocabulary(seqio.SentencePieceVocabulary):
        """seqio's vocabulary, reading a gs:// model through the path layer: seqio opens the file
        with TensorFlow's own file system, which reaches gs:// only through TensorFlow's GCS client.
        The model is loaded (once, lazily, as seqio does) from a local copy named by its content
        (one per host, never shared); the vocabulary keeps its gs:// name."""

        def _model_context(self):
            name = self._sentencepiece_model_file
            if self._model or not paths.is_remote(name):
                return super()._model_context()
            self._sentencepiece_model_file = _local_model_file(name)
            try:
                return super()._model_context()
            finally:
                self._sentencepiece_model_file = name

    return SentencePieceVocabulary


def _local_model_file(path: str) -> str:
    import hashlib
    import tempfile

    from samtone_jax.core.atomic_file import write_atomic

    try:
        data = paths.as_path(path).read_bytes()
    except FileNotFoundError as e:
        raise MissingFileError(f"vocabulary {path} not found: check VOCABULARY / --vocabulary") from e
    except Exception as e:  # network / credentials: say which binding chose this file
        default = (
            " (T5's public vocabulary: train.vocabulary / VOCABULARY is not set)" if path == DEFAULT_VOCAB_PATH else ""
        )
        raise UnreachableError(
            f"could not read the vocabulary {path}{default}: {type(e).__name__}: {str(e)[:200]}; offline, set "
            "VOCABULARY (or --vocabulary) to a local SentencePiece model (samtone build-vocab makes one)"
        ) from e
    local = paths.as_path(tempfile.gettempdir()) / "samtone_jax-vocab" / f"{hashlib.sha1(data).hexdigest()}.model"
    if not local.exists():
        write_atomic(local, data)
    return str(local)


def train_sentencepiece(texts: Iterable[str], vocab_size: int, out: str | None = None, max_sentences: int = 1_000_000):
    """Train a unigram SentencePiece model on `texts` (in the given order, single-threaded, so the
    result is deterministic); write it to `out` atomically when given. Returns the model bytes."""
    import sentencepiece as spm

    if vocab_size < 8:
        raise BadValueError(f"--vocab_size must be at least 8, got {vocab_size}")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        character_coverage=1.0,
        input_sentence_size=max_sentences,
        shuffle_input_sentence=False,
        num_threads=1,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    data = model.getvalue()
    if out:
        from samtone_jax.core.atomic_file import write_atomic

        write_atomic(out, data)
    return data
