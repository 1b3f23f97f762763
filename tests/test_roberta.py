"""RoBERTa / XLM-RoBERTa towers: the Flax encoder against transformers' RobertaModel and
XLMRobertaModel (tiny random configs), packing, byte-level BPE and Unigram tokenizer.json files that
pad with id 1 (swapped with 0), what the importer refuses, and import -> train (packed) -> export ->
sentence-transformers / Hugging Face, reloaded equal."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from conftest import imported_tower, swap01, trains_and_exports
from test_bert import UNICODE_TEXTS

from samtone_jax.checkpoints import hf
from samtone_jax.checkpoints.source import CheckpointMismatchError
from samtone_jax.data.wordpiece_tokens import WordPieceTokens
from samtone_jax.models.roberta import RobertaEncoder
from samtone_jax.models.roberta.hf_names import config_from_hf

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
TINY |= dict(max_position_embeddings=40, layer_norm_eps=1e-5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
SENTENCES = ["a small dog barked at the mailman", "the act of running quickly", "Ünïcödé café", "x y z"] * 25


def _perturbed(model):
    import torch

    with torch.no_grad():  # LayerNorms away from 1 / 0, so a swapped scale and bias would show
        for name, p in model.named_parameters():
            if "LayerNorm" in name:
                p.add_(0.5 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module", params=["roberta", "xlm-roberta"])
def tiny_folder(request, tmp_path_factory):
    import torch
    import transformers

    torch.manual_seed(0)
    if request.param == "roberta":
        model = transformers.RobertaModel(transformers.RobertaConfig(**TINY, type_vocab_size=1))
    else:
        model = transformers.XLMRobertaModel(transformers.XLMRobertaConfig(**TINY, type_vocab_size=1))
    folder = tmp_path_factory.mktemp(request.param)
    _perturbed(model).save_pretrained(folder)
    return folder, model


def _our_tower(folder):
    return imported_tower(RobertaEncoder, config_from_hf, folder)


def test_the_roberta_tower_computes_what_transformers_computes(tiny_folder):
    import torch

    folder, torch_model = tiny_folder
    config, params, used = _our_tower(folder)
    assert config.max_length == 38 and len(used) == 5 + 16 * 2
    theirs_ids = np.random.default_rng(1).integers(3, 99, (3, 38))  # their numbering: <s> 0, <pad> 1, </s> 2
    theirs_ids[:, 0] = 0
    for row, n in enumerate([38, 20, 2]):
        theirs_ids[row, n - 1], theirs_ids[row, n:] = 2, 1
    ours = np.asarray(jax.jit(RobertaEncoder(config).apply)({"params": params}, swap01(theirs_ids)))
    with torch.no_grad():
        theirs = torch_model(
            input_ids=torch.tensor(theirs_ids), attention_mask=torch.tensor(theirs_ids != 1)
        ).last_hidden_state.numpy()
    np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=1e-5)  # padding rows too (position 1, as theirs)


def test_a_packed_roberta_row_gives_each_text_its_own_positions(tiny_folder):
    folder, _ = tiny_folder
    config, params, _ = _our_tower(folder)
    rng = np.random.default_rng(2)
    texts = [rng.integers(2, 99, n).astype(np.int32) for n in (5, 3, 6)]
    row = np.concatenate([*texts, np.zeros(2, np.int32)])[None]
    segment_ids = np.concatenate([np.full(len(t), i + 1) for i, t in enumerate(texts)] + [np.zeros(2)])[None]
    apply = jax.jit(RobertaEncoder(config).apply)
    packed = np.asarray(apply({"params": params}, row, segment_ids=segment_ids.astype(np.int32)))[0]
    start = 0
    for t in texts:
        np.testing.assert_allclose(
            packed[start : start + len(t)], np.asarray(apply({"params": params}, t[None]))[0], atol=2e-5
        )
        start += len(t)


def byte_level_bpe(folder, texts):
    """A RoBERTa-style byte-level BPE tokenizer.json (<s> 0, <pad> 1, </s> 2, <unk> 3, <mask>)."""
    from tokenizers import ByteLevelBPETokenizer
    from tokenizers.processors import RobertaProcessing

    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(texts, vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tokenizer._tokenizer.post_processor = RobertaProcessing(("</s>", 2), ("<s>", 0))
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return tokenizer.get_vocab_size()


def unigram(folder, texts):
    """An XLM-R-style SentencePiece-Unigram tokenizer.json (<s> 0, <pad> 1, </s> 2, <unk> 3)."""
    from tokenizers import SentencePieceUnigramTokenizer
    from tokenizers.processors import RobertaProcessing

    tokenizer = SentencePieceUnigramTokenizer()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tokenizer.train_from_iterator(texts, vocab_size=120, special_tokens=specials, unk_token="<unk>")
    tokenizer._tokenizer.post_processor = RobertaProcessing(("</s>", 2), ("<s>", 0))
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return tokenizer.get_vocab_size()


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_bpe_and_unigram_vocabularies_that_pad_with_1_read_with_0_and_1_swapped(kind, tmp_path):
    from transformers import PreTrainedTokenizerFast

    from samtone_jax.export import tokenizer as tokenizer_lib

    (byte_level_bpe if kind == "bpe" else unigram)(tmp_path, SENTENCES + UNICODE_TEXTS)
    ours = WordPieceTokens(str(tmp_path / "tokenizer.json"))
    theirs = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"), pad_token="<pad>")
    texts = SENTENCES[:4] + UNICODE_TEXTS
    tokens, _ = ours.tokenize_batch(texts, 12)
    want = np.asarray(theirs(texts, truncation=True, max_length=12, padding="max_length")["input_ids"])
    np.testing.assert_array_equal(tokens, swap01(want))
    assert ours.start_end_ids == (1, 2) and ours.unk_id == 3
    # The training source tokenises every text of a task in one call (encode_batch): the same ids as
    # encode, text by text, and as transformers' (0 and 1 swapped); as ragged rows of a pair's negatives too.
    values, lengths = ours.encode_batch(texts)
    rows = np.split(values, np.cumsum(lengths)[:-1])
    assert [r.tolist() for r in rows] == [ours.encode(t) for t in texts]
    plain = theirs(texts, add_special_tokens=False)["input_ids"]
    assert [r.tolist() for r in rows] == [swap01(np.asarray(p, np.int64)).tolist() for p in plain]
    from samtone_jax.tasks.registration import _tokenized

    negatives = np.array([texts[:2], texts[2:4]], dtype=object)  # two pairs' two negatives
    ragged = _tokenized(ours, negatives)
    assert ragged.shape[:2] == (2, 2) and ragged[1][0].numpy().tolist() == ours.encode(texts[2])
    fresh = WordPieceTokens(str(tmp_path / "tokenizer.json"))  # nothing read yet: its padding id read on demand
    exported = tokenizer_lib.json_tokenizer(fresh, 12, "PreTrainedTokenizerFast")  # as the export writes it
    assert (exported.pad_token, exported.cls_token, exported.sep_token) == ("<pad>", "<s>", "</s>")
    tokenizer_lib.check_parity(exported, ours, texts, 12)


def test_roberta_imports_refuse_what_the_tower_is_not(tiny_folder, tmp_path):
    folder, _ = tiny_folder
    config = json.loads((folder / "config.json").read_text())
    for change, said in (
        ({"pad_token_id": 0}, "pad_token_id 0; RoBERTa's positions and embeddings pad with id 1"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type 'relative_key'"),
        ({"hidden_act": "relu"}, "hidden_act 'relu'"),
    ):
        bad = tmp_path / next(iter(change))
        bad.mkdir(exist_ok=True)
        (bad / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(CheckpointMismatchError, match=said):
            hf.model_bindings(str(bad))


@pytest.mark.slow
def test_a_roberta_tower_trains_packed_from_an_import_then_exports(wordnet_env, tmp_path):
    """Hugging Face XLM-R folder (a Unigram tokenizer.json) -> import-checkpoint -> samtone train (packed)
    -> sentence-transformers and hf (RobertaModel) exports that embed like the run, reloaded. (RoBERTa's
    byte-level BPE and tower are the same code paths, checked by the fast tests above.)"""
    kind = "xlm-roberta"
    import torch
    import transformers

    from samtone_jax.tasks import catalogue

    folder = tmp_path / "hf"
    texts_seen = catalogue.collection("wordnet_definitions", "all").texts()
    vocab = (byte_level_bpe if kind == "roberta" else unigram)(folder, texts_seen)
    torch.manual_seed(0)
    classes = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta"}[kind]
    config = getattr(transformers, f"{classes}Config")(**{**TINY, "vocab_size": vocab, "max_position_embeddings": 66})
    _perturbed(getattr(transformers, f"{classes}Model")(config)).save_pretrained(folder)
    trains_and_exports(folder, tmp_path, "roberta", 1)
