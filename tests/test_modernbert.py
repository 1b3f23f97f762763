"""ModernBERT towers: the Flax encoder against transformers' ModernBertModel on tiny random configs
(every option of its config that changes the math: biases, activations, the global / local pattern,
the window, the rotary thetas, the Hub's older config keys), packed rows with their own positions and
windows, remat, LoRA on the fused projection, the byte-level BPE vocabulary that pads with 50283,
what the importer refuses, and import -> train (packed) -> export -> sentence-transformers / Hugging
Face, reloaded equal."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import fsdp_and_one_device_steps, imported_tower, trains_and_exports
from test_bert import UNICODE_TEXTS
from test_roberta import SENTENCES

from samtone_jax.checkpoints import hf
from samtone_jax.checkpoints.source import CheckpointMismatchError
from samtone_jax.core.errors import BadValueError
from samtone_jax.data.wordpiece_tokens import WordPieceTokens
from samtone_jax.models.modernbert import ModernBertConfig, ModernBertEncoder
from samtone_jax.models.modernbert.hf_names import config_from_hf

PAD = 50283
VOCAB = 50368  # ModernBERT's: the padding id 50283 must be in it
TINY = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4)
TINY |= dict(max_position_embeddings=64, local_attention=8, global_attn_every_n_layers=2)
# Each option set changes what the tower computes; the parity test runs every one.
OPTIONS = {
    "defaults": {},
    "biases_tanh_gelu": dict(attention_bias=True, mlp_bias=True, norm_bias=True, hidden_activation="gelu_pytorch_tanh"),
    "silu_every_layer_global": dict(hidden_activation="silu", global_attn_every_n_layers=1),
    "relu_wide_window_own_thetas": dict(
        hidden_activation="relu", local_attention=12, global_rope_theta=1_000.0, local_rope_theta=500.0
    ),
}


def _modernbert(**options):
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.ModernBertModel(transformers.ModernBertConfig(**{**TINY, **options}))
    with torch.no_grad():  # norms away from 1 / 0 and biases away from 0, so a swap or a missing one shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.5 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module", params=sorted(OPTIONS))
def tiny_folder(request, tmp_path_factory):
    model = _modernbert(**OPTIONS[request.param])
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    return folder, model


def _our_tower(folder):
    return imported_tower(ModernBertEncoder, config_from_hf, folder)


def _swap_pad(ids):
    """Ids with 0 and 50283 exchanged: their numbering to ours and back."""
    ids = np.asarray(ids)
    return np.where(ids == 0, PAD, np.where(ids == PAD, 0, ids)).astype(np.int32)


def test_the_modernbert_tower_computes_what_transformers_computes(tiny_folder):
    import torch

    folder, torch_model = tiny_folder
    config, params, used = _our_tower(folder)
    biases = config.attention_bias + config.mlp_bias
    per_layer = 4 + 2 * biases + 1 + config.norm_bias  # kernels, their biases, mlp_norm
    assert len(used) == (1 + 2 * (1 + config.norm_bias)) + 3 * per_layer + 2 * (1 + config.norm_bias)
    theirs_ids = np.random.default_rng(1).integers(0, 50280, (3, 40))  # id 0 is a real token of theirs
    for row, n in enumerate([40, 17, 1]):
        theirs_ids[row, n:] = PAD
    ours = np.asarray(jax.jit(ModernBertEncoder(config).apply)({"params": params}, _swap_pad(theirs_ids)))
    with torch.no_grad():
        theirs = torch_model(
            input_ids=torch.tensor(theirs_ids), attention_mask=torch.tensor(theirs_ids != PAD)
        ).last_hidden_state.numpy()
    real = theirs_ids != PAD
    np.testing.assert_allclose(ours[real], theirs[real], atol=2e-5, rtol=1e-5)


def test_the_hubs_older_config_keys_give_the_same_tower(tiny_folder, tmp_path):
    """ModernBERT-base's config.json on the Hub names global_attn_every_n_layers and the two thetas;
    transformers 5 writes layer_types and rope_parameters: one config either way."""
    folder, _ = tiny_folder
    new = json.loads((folder / "config.json").read_text())
    config = config_from_hf(new, "new")
    old = {k: v for k, v in new.items() if k not in ("layer_types", "rope_parameters")}
    old |= dict(global_attn_every_n_layers=config.global_attention_every)
    old |= dict(global_rope_theta=config.global_rope_theta, local_rope_theta=config.local_rope_theta)
    assert config_from_hf(old, "old") == config
    nulled = config_from_hf({**old, "local_rope_theta": None}, "old")  # transformers 4.x: null = the global theta
    assert nulled.local_rope_theta == config.global_rope_theta


def test_a_packed_modernbert_row_gives_each_text_its_own_positions_and_window(tiny_folder):
    folder, _ = tiny_folder
    config, params, _ = _our_tower(folder)
    rng = np.random.default_rng(2)
    texts = [rng.integers(1, 50280, n).astype(np.int32) for n in (11, 3, 9)]  # longer than the window (4)
    row = np.concatenate([*texts, np.zeros(2, np.int32)])[None]
    segment_ids = np.concatenate([np.full(len(t), i + 1) for i, t in enumerate(texts)] + [np.zeros(2)])[None]
    apply = jax.jit(ModernBertEncoder(config).apply)
    packed = np.asarray(apply({"params": params}, row, segment_ids=segment_ids.astype(np.int32)))[0]
    alone = np.zeros((len(texts), 11), np.int32)  # each text alone in its own (padded) row
    for i, t in enumerate(texts):
        alone[i, : len(t)] = t
    alone = np.asarray(apply({"params": params}, alone))
    start = 0
    for i, t in enumerate(texts):
        np.testing.assert_allclose(packed[start : start + len(t)], alone[i, : len(t)], atol=2e-5)
        start += len(t)


def test_rematerialised_modernbert_layers_give_the_same_gradients():
    config = ModernBertConfig(vocab_size=VOCAB, emb_dim=16, num_heads=2, head_dim=8, num_layers=3, mlp_dim=12)
    config = ModernBertConfig(**{**config.__dict__, "attention_bias": True, "norm_bias": True, "local_attention": 4})
    tokens = np.random.default_rng(3).integers(1, 50280, (2, 12)).astype(np.int32)
    tokens[1, 5:] = 0
    params = jax.jit(ModernBertEncoder(config).init)(jax.random.PRNGKey(0), tokens)["params"]

    def loss(config, params):
        return jnp.sum(jnp.sin(ModernBertEncoder(config).apply({"params": params}, tokens)))

    plain = jax.jit(jax.value_and_grad(lambda p: loss(config, p)))(params)
    other = ModernBertConfig(**{**config.__dict__, "remat": True})
    got = jax.jit(jax.value_and_grad(lambda p: loss(other, p)))(params)
    np.testing.assert_allclose(got[0], plain[0], rtol=1e-5)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), got[1], plain[1])


def test_lora_adapts_the_fused_projection_and_merges_into_it():
    """LoRA's attention group takes ModernBERT's fused Wqkv (and Wo), its MLP group Wi and Wo; the
    adapted tower with trained factors equals the plain tower over the merged kernels."""
    import flax.linen as nn

    from samtone_jax.models import lora

    config = ModernBertConfig(vocab_size=VOCAB, emb_dim=16, num_heads=2, head_dim=8, num_layers=2, mlp_dim=12)
    found = lora.factors(ModernBertEncoder, config, lora.Lora(rank=4))
    assert {f.path[1:] for f in found} == {("attention", "qkv"), ("attention", "out"), ("wi",), ("wo",)}
    qkv = next(f for f in found if f.path[1:] == ("attention", "qkv"))
    assert (qkv.in_shape, qkv.out_shape) == ((16,), (48,))
    tower = ModernBertEncoder(config)
    tokens = np.random.default_rng(4).integers(1, 50280, (2, 7)).astype(np.int32)
    params = nn.unbox(jax.jit(tower.init)(jax.random.PRNGKey(0), tokens)["params"])
    adapter = lora.Adapter(found, rank=4, scale=2.0)
    factors = nn.unbox(adapter.init(jax.random.PRNGKey(1))["params"])
    factors = jax.tree_util.tree_map(lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(2), x.shape), factors)
    tree = adapter.apply({"params": factors})
    apply = jax.jit(lambda params, tree: tower.apply({"params": params}, tokens, adapter=tree))
    adapted = apply(params, tree)
    merged = lora.merge_tower(params, {f.name: factors[f.name] for f in found}, found, lora.Lora(rank=4, alpha=8.0))
    np.testing.assert_allclose(apply(merged, None), adapted, atol=1e-5)
    assert np.abs(np.asarray(adapted) - np.asarray(apply(params, None))).max() > 1e-3


@pytest.mark.slow
def test_a_modernbert_step_under_fsdp_on_eight_devices_equals_one_device():
    """The train step of a ModernBERT ADE-SPL (loss, updated parameters, biases and norms included) on 1
    device = on 8 under partitioning.FSDP_RULES, global and local layers both, packed texts longer
    than the window."""
    from samtone_jax.models import DualEncoder

    config = ModernBertConfig(vocab_size=VOCAB, emb_dim=32, num_heads=4, head_dim=8, num_layers=2, mlp_dim=24)
    config = ModernBertConfig(**{**config.__dict__, "attention_bias": True, "norm_bias": True, "local_attention": 6})
    model = DualEncoder(config, "ade_spl", projection_dim=16, identical_tower_init=False)
    rng = np.random.default_rng(5)
    query, doc = (rng.integers(1, 50280, (16, n)).astype(np.int32) for n in (8, 12))
    for row, (q, d) in enumerate(zip(rng.integers(2, 9, 16), rng.integers(2, 13, 16), strict=True)):
        query[row, q:], doc[row, d:] = 0, 0
    batch = {"query_tokens": query, "doc_tokens": doc}
    batch |= {"query_id": np.arange(16, dtype=np.int32) % 12, "doc_id": np.arange(16, dtype=np.int32) + 100}
    state, (params_1, metrics_1), (params_8, metrics_8) = fsdp_and_one_device_steps(model, batch)
    tower = state["params"]["query_encoder"]
    assert tower["final_norm"]["bias"].addressable_shards[0].data.shape == (32 // 8,)
    assert tower["layers_1"]["wi_kernel"].addressable_shards[0].data.shape == (32 // 8, 48)  # [embed, mlp]
    assert metrics_1["masked_fraction"] > 0
    np.testing.assert_allclose(metrics_8["loss"], metrics_1["loss"], rtol=1e-5)
    # atol 3e-6: a token's embedding gradient is summed over its occurrences in another order on 8 devices
    for a, b in zip(jax.tree_util.tree_leaves(params_8), jax.tree_util.tree_leaves(params_1), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=3e-6)


def modernbert_bpe(folder, texts):
    """A ModernBERT-style byte-level BPE tokenizer.json trained on `texts`: its specials where
    ModernBERT's are ([UNK] 50280, [CLS] 50281, [SEP] 50282, [PAD] 50283, [MASK] 50284), the learned
    tokens from 0, [CLS] … [SEP] around each text."""
    from tokenizers import ByteLevelBPETokenizer, Tokenizer
    from tokenizers.processors import TemplateProcessing

    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    trained = ByteLevelBPETokenizer()
    trained.train_from_iterator(texts, vocab_size=300, special_tokens=specials)
    spec = json.loads(trained._tokenizer.to_str())
    ids = {
        t: 50280 + specials.index(t) if t in specials else i - len(specials) for t, i in spec["model"]["vocab"].items()
    }
    spec["model"]["vocab"] = ids
    for added in spec["added_tokens"]:
        added["id"] = ids[added["content"]]
    spec["post_processor"] = None
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    tokenizer.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", 50281), ("[SEP]", 50282)]
    )
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))


def test_a_modernbert_vocabulary_pads_with_50283_read_with_0_and_50283_swapped(tmp_path):
    from transformers import PreTrainedTokenizerFast

    from samtone_jax.data import vocab as vocab_lib
    from samtone_jax.models import families

    modernbert_bpe(tmp_path, SENTENCES + UNICODE_TEXTS)
    path = str(tmp_path / "tokenizer.json")
    ours = WordPieceTokens(path)
    theirs = PreTrainedTokenizerFast(tokenizer_file=path, pad_token="[PAD]")
    texts = SENTENCES[:4] + UNICODE_TEXTS + [f"a{theirs.decode([0])}b"]  # id 0: a real token of theirs
    tokens, _ = ours.tokenize_batch(texts, 12)
    want = np.asarray(theirs(texts, truncation=True, max_length=12, padding="max_length")["input_ids"])
    assert (want == 0).any() and (want == PAD).any()  # both ids occur, so a missing swap would show
    np.testing.assert_array_equal(tokens, _swap_pad(want))
    assert ours.start_end_ids == (50281, 50282) and ours.unk_id == 50280
    modernbert = families.by_gin_name("ModernBertConfig")
    vocab_lib.check_fits(path, modernbert, VOCAB, "train.vocabulary")
    with pytest.raises(BadValueError, match="pads with id 50283, but a BERT tower's vocabulary pads with id 0"):
        vocab_lib.check_fits(path, families.by_gin_name("BertConfig"), VOCAB, "train.vocabulary")


def test_modernbert_imports_refuse_what_the_tower_is_not(tmp_path):
    folder = tmp_path / "good"
    _modernbert().save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    layers = ["full_attention", "full_attention", "sliding_attention"]
    rope = {kind: {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4} for kind in config["rope_parameters"]}
    for change, said in (
        ({"hidden_activation": "swiglu"}, "hidden_activation 'swiglu'"),
        ({"pad_token_id": 0}, "pad_token_id 0; ModernBERT's vocabulary pads with id 50283"),
        ({"layer_types": layers}, "no period gives this pattern"),
        ({"rope_parameters": rope}, "the ModernBERT tower computes the default"),
        ({"model_type": "funnel"}, "model_type 'funnel', which no tower family here loads; supported: .*modernbert"),
    ):
        bad = tmp_path / next(iter(change))
        bad.mkdir()
        (bad / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(CheckpointMismatchError, match=said):
            hf.model_bindings(str(bad))
    with pytest.raises(BadValueError, match="scan_layers = True: ModernBERT's layers are not alike"):
        ModernBertConfig(scan_layers=True)
    with pytest.raises(BadValueError, match="vocab_size = 1000: ModernBERT's vocabulary pads with id 50283"):
        ModernBertConfig(vocab_size=1000)
    with pytest.raises(BadValueError, match=r"reads at most 64 \(ModernBertConfig.max_length\)"):
        config, params, _ = _our_tower(folder)
        ModernBertEncoder(config).apply({"params": params}, np.ones((1, 65), np.int32))


@pytest.mark.slow
def test_a_modernbert_tower_trains_packed_from_an_import_then_exports(wordnet_env, tmp_path):
    from samtone_jax.tasks import catalogue

    folder = tmp_path / "hf"
    modernbert_bpe(folder, catalogue.collection("wordnet_definitions", "all").texts())
    _modernbert().save_pretrained(folder)
    trains_and_exports(folder, tmp_path, "modernbert", PAD)
