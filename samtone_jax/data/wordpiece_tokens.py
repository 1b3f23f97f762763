"""Text -> token ids with a Hugging Face `tokenizer.json` (a BERT-family model's WordPiece), through
the `tokenizers` library alone (no TensorFlow, no transformers).

A text becomes what sentence-transformers feeds the model: the tokenizer's own normaliser and
pre-tokeniser (BERT: clean-up, lower case, accents stripped, CJK characters split), WordPiece, then
its post-processor's special tokens ([CLS] … [SEP], or <s> … </s>) around it, truncated to `length`
ids *including* them (as `tokenizer(texts, truncation=True, max_length=length)`), then padding (id 0,
the towers' padding id) to `length`. Tested equal to transformers' tokenizer on real texts
(tests/test_bert.py, tests/test_mpnet.py).

A vocabulary whose padding token is not id 0 (MPNet, RoBERTa: <s> 0, <pad> 1) has its padding id and
id 0 swapped in every id it gives and reads (`source_pad_id`; `source_ids` maps back), as the tower
family's importer swaps the two embedding rows (models/family.py, `hf_pad_id`).
"""

from __future__ import annotations

import functools

import numpy as np

from samtone_jax.core import paths
from samtone_jax.core.errors import BadValueError, MissingFileError

PAD_ID = 0  # models.PAD_ID (not imported: data does not depend on models)


class WordPieceTokens:
    """The tokeniser of a `tokenizer.json` (local or gs://), loaded on first use. Offers what the
    package reads of a vocabulary: `vocab_size`, `encode(text)`, `tokenize_batch(texts, length)`;
    `tokenizer_json` (the file's bytes) for an export."""

    def __init__(self, path: str):
        self.path = str(path)
        self.extra_ids = 0
        self._source_pad_id = None  # the file's padding id: set when the file is read

    @property
    def source_pad_id(self) -> int:
        """The id the tokenizer.json pads with (its padding setting, else [PAD] / <pad>)."""
        self._tokenizer  # noqa: B018  (reading the file sets it)
        return self._source_pad_id

    def _swapped(self, ids):
        """`ids` with id 0 and the file's padding id exchanged (its own inverse: `source_ids`)."""
        pad = self.source_pad_id
        if not pad:
            return list(ids)
        return [pad if i == 0 else 0 if i == pad else i for i in ids]

    def source_ids(self, ids) -> list[int]:
        """Our ids of a text as the tokenizer.json numbers them (what transformers' tokenizer gives)."""
        return self._swapped(int(i) for i in ids)

    @functools.cached_property
    def tokenizer_json(self) -> bytes:
        try:
            return paths.as_path(self.path).read_bytes()
        except FileNotFoundError as e:
            raise MissingFileError(f"tokenizer file {self.path} not found") from e

    @functools.cached_property
    def _tokenizer(self):
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_str(self.tokenizer_json.decode("utf-8"))
        except Exception as e:  # noqa: BLE001  the library's parse errors, named with the file
            raise BadValueError(f"{self.path} is not a Hugging Face tokenizer.json ({type(e).__name__}: {e})") from e
        pad = (tokenizer.padding or {}).get("pad_id")
        if pad is None:
            pad = next((i for i in map(tokenizer.token_to_id, ("[PAD]", "<pad>")) if i is not None), None)
        if pad is None:
            raise BadValueError(
                f"{self.path}: no padding token (neither a padding setting nor [PAD] / <pad>); the towers need one"
            )
        self._source_pad_id = int(pad)
        tokenizer.no_padding()
        tokenizer.no_truncation()  # tokenize_batch truncates; the pipeline's ids are never cut here
        return tokenizer

    def source_token(self, which) -> str | None:
        """The token the file numbers `which` (an id in its numbering), or its 'unk' / 'mask' token
        ([UNK] / <unk>, [MASK] / <mask>; None when it has none)."""
        if isinstance(which, int):
            return self._tokenizer.id_to_token(which)
        names = {"unk": ("[UNK]", "<unk>"), "mask": ("[MASK]", "<mask>")}[which]
        return next((t for t in names if self._tokenizer.token_to_id(t) is not None), None)

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size()

    @property
    def unk_id(self) -> int | None:
        unk = self.source_token("unk")
        return None if unk is None else self._swapped([self._tokenizer.token_to_id(unk)])[0]

    @functools.cached_property
    def start_end_ids(self) -> tuple[int, int]:
        """([CLS], [SEP]): what the post-processor puts around one text (read from it, not assumed)."""
        ids = self._swapped(self._tokenizer.post_process(self._tokenizer.encode("", add_special_tokens=False)).ids)
        if len(ids) != 2:
            raise BadValueError(f"{self.path}: one text is wrapped in {ids}; expected [CLS] and [SEP] around it")
        return ids[0], ids[1]

    def encode(self, text: str) -> list[int]:
        """The ids of `text` without special tokens (never truncated)."""
        return self._swapped(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(every text's ids without special tokens, concatenated: int32; each text's count: int64), as
        `encode` gives them, the texts encoded together (the Rust library's threads)."""
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False) if len(texts) else []
        lengths = np.array([len(e.ids) for e in encodings], np.int64)
        values = np.fromiter((i for e in encodings for i in e.ids), np.int32, count=int(lengths.sum()))
        pad = self.source_pad_id
        if pad:
            values = np.where(values == 0, pad, np.where(values == pad, 0, values)).astype(np.int32)
        return values, lengths

    def decode(self, ids) -> str:
        return self._tokenizer.decode(self.source_ids(ids))

    def tokenize_batch(self, texts: list[str], length: int) -> tuple[np.ndarray, np.ndarray]:
        """([N, length] int32 ids: [CLS] text [SEP] truncated to `length`, then [PAD]; [N] int32 1
        where the text was truncated). The text's own ids are cut to length − 2 and wrapped, as the
        pipeline's feature converter wraps them (one rule for both; the Rust library's truncation of
        one text does the same)."""
        if length < 2:
            raise BadValueError(f"length {length}: a WordPiece input needs at least [CLS] and [SEP]")
        start, end = self.start_end_ids
        tokens = np.full((len(texts), length), PAD_ID, np.int32)
        truncated = np.zeros((len(texts),), np.int32)
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False) if texts else []
        for row, encoding in enumerate(encodings):
            ids = [start, *self._swapped(encoding.ids[: length - 2]), end]
            tokens[row, : len(ids)] = ids
            truncated[row] = len(encoding.ids) > length - 2
        return tokens, truncated
