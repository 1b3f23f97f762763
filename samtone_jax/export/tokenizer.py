"""Our SentencePiece vocabulary -> a transformers T5 tokenizer that produces the same ids.

Built from the SentencePiece model's own pieces, scores and normalisation table (precompiled
charsmap), with seqio's extra ids appended in its order (<extra_id_0> last), and checked: the
export refuses a tokenizer that disagrees with seqio on any probe text (transformers' loading of
a bare `spiece.model` gave wrong ids here, so nothing is assumed).
"""

from __future__ import annotations

import random
import string

from samtone_jax.core.errors import BadValueError

PROBE_TEXTS = [
    "A small dog barked at the mailman.",
    "  leading, trailing   and   repeated   spaces  ",
    "Tabs\tand\nnew lines",
    "Ünïcödé café naïve — “curly quotes” and ‘apostrophes’",
    "ﬁ ligature, ①②③, fullwidth ＡＢＣ１２３",
    "emoji 😀🚀 and CJK 中文字符 日本語",
    "UPPER lower MiXeD 123,456.78 e=mc^2 <tag> &amp;",
    "",
    "x",
]


def probe_texts(count: int = 200, seed: int = 0) -> list[str]:
    """Fixed probe texts plus random printable / non-ASCII strings (deterministic)."""
    rng = random.Random(seed)
    alphabet = string.printable + "éüßçñøå中文😀—“”…"
    return PROBE_TEXTS + ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))) for _ in range(count)]


def t5_tokenizer(vocabulary, max_length: int):
    """transformers.T5Tokenizer equal to `vocabulary` (a seqio.SentencePieceVocabulary) + EOS."""
    from sentencepiece import sentencepiece_model_pb2
    from transformers import T5Tokenizer

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(vocabulary.sp_model)
    pieces = [(p.piece, p.score) for p in proto.pieces]
    return T5Tokenizer(
        vocab=pieces + [(f"<extra_id_{i}>", 0.0) for i in reversed(range(vocabulary.extra_ids))],
        _spm_precompiled_charsmap=proto.normalizer_spec.precompiled_charsmap or None,
        extra_ids=vocabulary.extra_ids,
        model_max_length=max_length,
    )


def json_tokenizer(vocabulary, max_length: int, class_name: str = "BertTokenizerFast"):
    """transformers' fast tokenizer `class_name` (the tower family's `hf_tokenizer`: BertTokenizerFast,
    MPNetTokenizerFast, ...) over the tower's own tokenizer.json (the same Rust tokenizer; checked
    against ours on the probe texts like the T5 one)."""
    import tempfile

    import transformers

    special = {}
    if class_name == "PreTrainedTokenizerFast":  # a generic class knows no special tokens: named from the file
        pad, (start, end) = vocabulary.source_pad_id, (vocabulary.source_ids(vocabulary.start_end_ids))
        token = vocabulary.source_token
        special = dict(pad_token=token(pad), bos_token=token(start), cls_token=token(start))
        special |= dict(eos_token=token(end), sep_token=token(end))
        special |= {k: v for k, v in (("unk_token", token("unk")), ("mask_token", token("mask"))) if v}
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        f.write(vocabulary.tokenizer_json)
        f.flush()
        return getattr(transformers, class_name)(tokenizer_file=f.name, model_max_length=max_length, **special)


def check_parity(tokenizer, vocabulary, texts: list[str], length: int) -> None:
    """ValueError naming the first text whose ids (truncated to `length`, the special tokens kept)
    differ; ours in the vocabulary file's numbering (`source_ids`: its padding id may not be 0)."""
    from samtone_jax.data.sentencepiece_tokens import tokenize_texts

    ours, _ = tokenize_texts(vocabulary, texts, length)
    theirs = tokenizer(texts, truncation=True, max_length=length)["input_ids"]
    numbered = getattr(vocabulary, "source_ids", list)
    for text, a, b in zip(texts, ours, theirs, strict=True):
        a = numbered([int(x) for x in a if x != 0])
        if a != list(b):
            raise BadValueError(
                f"the converted tokenizer disagrees with the vocabulary on {text!r}: "
                f"ours {a[:12]}, transformers {list(b)[:12]}; the export was not written"
            )
