"""Our Flax T5.1.1 encoder against transformers' PyTorch T5EncoderModel on the same weights."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from samtone_jax.checkpoints import CheckpointMismatchError, import_params  # noqa: E402
from samtone_jax.models import DualEncoder, T5Config, T5Encoder  # noqa: E402

FEED_FORWARD = {"gated-gelu": ("gelu", "linear"), "relu": ("relu",)}


def _hf_model(tmp_path, feed_forward, num_layers, d_kv, seed=0, cls="T5EncoderModel", safe=True):
    torch.manual_seed(seed)
    config = transformers.T5Config(
        vocab_size=101,
        d_model=32,
        d_kv=d_kv,
        d_ff=48,
        num_layers=num_layers,
        num_decoder_layers=1,
        num_heads=4,
        feed_forward_proj=feed_forward,
        dropout_rate=0.0,
    )
    model = getattr(transformers, cls)(config).eval()
    # Randomise the norms too (they start at 1.0 and would hide a missing or misplaced scale).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.uniform_(0.5, 1.5)
    folder = tmp_path / "hf"
    model.save_pretrained(folder, safe_serialization=safe)
    ours = T5Config(
        vocab_size=101,
        emb_dim=32,
        num_heads=4,
        head_dim=d_kv,
        mlp_dim=48,
        num_layers=num_layers,
        mlp_activations=FEED_FORWARD[feed_forward],
    )
    return model, str(folder), ours


def _ids(length, seed=0):
    rng = np.random.RandomState(seed)
    ids = rng.randint(1, 101, size=(4, length))
    ids[1, length // 2 :] = 0  # half padding
    ids[2, 3:] = 0  # mostly padding
    return ids


@pytest.mark.slow
@pytest.mark.parametrize(
    "feed_forward,num_layers,d_kv,length,safe",
    [
        ("gated-gelu", 2, 8, 40, True),
        ("relu", 3, 5, 200, False),  # odd d_kv, past max_distance, pytorch_model.bin
        ("gated-gelu", 1, 7, 300, True),
    ],
)
def test_hidden_states_and_embeddings_match_transformers(tmp_path, feed_forward, num_layers, d_kv, length, safe):
    hf, folder, config = _hf_model(tmp_path, feed_forward, num_layers, d_kv, safe=safe)
    model = DualEncoder(config, architecture="sde", projection_dim=16)
    params, info = import_params("hf", folder, model, seed=3)
    ids = _ids(length)
    mask = ids != 0
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    ours = np.asarray(jax.jit(T5Encoder(config).apply)({"params": params["encoder"]}, jnp.asarray(ids)))
    np.testing.assert_allclose(ours[mask], ref[mask], atol=1e-5, rtol=1e-5)

    # Embedding = mean over non-padding tokens -> projection -> L2 norm, computed here by hand.
    pooled = (ref * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    projected = pooled @ params["projection"]["kernel"]
    expected = projected / np.linalg.norm(projected, axis=1, keepdims=True)
    got = np.asarray(jax.jit(lambda p, x: model.apply({"params": p}, x, method=model.encode_queries))(params, ids))
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_seq2seq_checkpoint_lists_the_decoder_as_unused(tmp_path, caplog):
    _, folder, config = _hf_model(tmp_path, "gated-gelu", 2, 8, cls="T5ForConditionalGeneration")
    with caplog.at_level(logging.INFO, logger="samtone_jax.checkpoints.source"):
        _, info = import_params("hf", folder, DualEncoder(config))
    assert info["unused_variables"], "the decoder variables should be reported"
    assert all(n.startswith(("decoder.", "lm_head.")) for n in info["unused_variables"])
    assert "decoder.block.0.layer.0.SelfAttention.q.weight" in caplog.text


def test_config_mismatch_names_the_gin_setting(tmp_path):
    _, folder, config = _hf_model(tmp_path, "gated-gelu", 2, 8)
    import dataclasses

    with pytest.raises(CheckpointMismatchError, match=r"num_layers=2 .*T5Config.num_layers = 3"):
        import_params("hf", folder, DualEncoder(dataclasses.replace(config, num_layers=3)))
    with pytest.raises(CheckpointMismatchError, match=r"T5Config.mlp_activations"):
        import_params("hf", folder, DualEncoder(dataclasses.replace(config, mlp_activations=("relu",))))


def test_missing_weights_file_is_a_clear_error(tmp_path):
    _, folder, config = _hf_model(tmp_path, "relu", 1, 8)
    for f in (tmp_path / "hf").glob("*.safetensors"):
        f.unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        import_params("hf", folder, DualEncoder(config))
