"""The real public checkpoints in ../shared/data/checkpoints, and the Mesh-TF name mapping."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import msgpack
import numpy as np
import pytest
from conftest import require_shared

from samtone_jax.checkpoints import import_params
from samtone_jax.checkpoints import mtf as mtf_format
from samtone_jax.checkpoints.importer import abstract_params
from samtone_jax.checkpoints.source import tower_from_source
from samtone_jax.models import DualEncoder, T5Config

# t5x_retrieval's test model: d_model 4, 2 heads of 2, ReLU MLP of 8, 4 relative buckets,
# projection to 768 (read off the checkpoint's shapes).
RETRIEVAL_TINY = T5Config(
    vocab_size=32128,
    emb_dim=4,
    num_heads=2,
    head_dim=2,
    mlp_dim=8,
    num_layers=2,
    mlp_activations=("relu",),
    relative_attention_num_buckets=4,
)


def _raw_t5x_arrays(directory):
    """Every array of a T5X checkpoint, read here with msgpack + tensorstore directly."""
    import tensorstore as ts

    def ext_hook(code, data):  # flax's msgpack ndarray extension: (shape, dtype name, bytes)
        shape, dtype, buffer = msgpack.unpackb(data)
        return np.frombuffer(buffer, dtype=np.dtype(dtype)).reshape(shape)

    with open(os.path.join(directory, "checkpoint"), "rb") as f:
        tree = msgpack.unpackb(f.read(), ext_hook=ext_hook, raw=False)
    out = {}

    def walk(node, prefix):
        if isinstance(node, dict) and "kvstore" in node:
            spec = {
                "driver": "zarr",
                "kvstore": {"driver": "file", "path": os.path.join(directory, node["kvstore"]["path"])},
            }
            # read-only, in a context of its own (no cache pool or file handles shared with other tests'
            # stores), as the importer opens them (checkpoints/t5x.py)
            out[prefix] = ts.open(spec, read=True, context=ts.Context()).result().read().result()
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}/{k}" if prefix else k)
        else:
            out[prefix] = np.asarray(node)

    walk(tree["optimizer"]["target"], "")
    return out


@pytest.mark.slow
def test_t5x_retrieval_checkpoint_every_array_equals_its_storage():
    directory = require_shared("checkpoints/t5x_retrieval_de_t5_tiny_checkpoint_1000")
    raw = _raw_t5x_arrays(str(directory))
    model = DualEncoder(RETRIEVAL_TINY, architecture="sde", projection_dim=768)
    params, info = import_params("t5x", str(directory), model)
    assert info["projection_from_source"]
    enc = params["encoder"]
    np.testing.assert_array_equal(params["projection"]["kernel"], raw["projection_layer/kernel"])
    np.testing.assert_array_equal(enc["token_embedder"], raw["token_embedder/embedding"])
    np.testing.assert_array_equal(enc["relpos_bias"]["rel_embedding"], raw["encoder/relpos_bias/rel_embedding"])
    np.testing.assert_array_equal(enc["encoder_norm"]["scale"], raw["encoder/encoder_norm/scale"])
    compared = 4
    for i in range(2):
        layer, raw_layer = enc[f"layers_{i}"], f"encoder/layers_{i}"
        for name in ("query", "key", "value"):
            np.testing.assert_array_equal(
                layer["attention"][name].reshape(4, 4), raw[f"{raw_layer}/attention/{name}/kernel"]
            )
        np.testing.assert_array_equal(layer["attention"]["out"].reshape(4, 4), raw[f"{raw_layer}/attention/out/kernel"])
        for name in ("wi", "wo"):
            np.testing.assert_array_equal(layer["mlp"][name], raw[f"{raw_layer}/mlp/{name}/kernel"])
        for name in ("pre_attention_layer_norm", "pre_mlp_layer_norm"):
            np.testing.assert_array_equal(layer[name]["scale"], raw[f"{raw_layer}/{name}/scale"])
        compared += 8
    assert compared == len(raw), sorted(raw)  # every stored array was checked

    # And it encodes: finite, unit-norm 768-d embeddings that depend on the input.
    ids = jnp.array([[37, 1996, 5, 1, 0, 0], [8, 1, 0, 0, 0, 0]])
    emb = np.asarray(jax.jit(lambda p, x: model.apply({"params": p}, x, method=model.encode_documents))(params, ids))
    assert emb.shape == (2, 768) and np.all(np.isfinite(emb))
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    assert np.abs(emb[0] - emb[1]).max() > 1e-3


@pytest.mark.slow
def test_t5x_single_file_checkpoint_loads_with_decoder_unused():
    path = require_shared("checkpoints/t5x_test_t5_tiny.checkpoint_0")
    config = T5Config(vocab_size=32128, emb_dim=8, num_heads=4, head_dim=3, mlp_dim=16, num_layers=2)
    model = DualEncoder(config, architecture="ade_spl", projection_dim=8)
    params, info = import_params("t5x", str(path), model)
    assert not info["projection_from_source"]
    assert info["unused_variables"] and all(
        n.startswith(("target/decoder/", "state/")) for n in info["unused_variables"]
    )
    q = params["query_encoder"]["layers_1"]["mlp"]["wi_1"]
    np.testing.assert_array_equal(q, params["document_encoder"]["layers_1"]["mlp"]["wi_1"])
    assert q is not params["document_encoder"]["layers_1"]["mlp"]["wi_1"]  # copies, free to diverge
    emb = jax.jit(lambda p, x: model.apply({"params": p}, x, method=model.encode_queries))(
        params, jnp.array([[5, 6, 7, 1]])
    )
    assert np.all(np.isfinite(np.asarray(emb)))


def test_t5x_checkpoint_with_wrong_config_names_the_setting():
    directory = require_shared("checkpoints/t5x_retrieval_de_t5_tiny_checkpoint_1000")
    import dataclasses

    from samtone_jax.checkpoints import CheckpointMismatchError

    gated = DualEncoder(dataclasses.replace(RETRIEVAL_TINY, mlp_activations=("gelu", "linear")), projection_dim=768)
    with pytest.raises(CheckpointMismatchError, match=r"mlp_activations = \('relu',\)"):
        import_params("t5x", str(directory), gated)
    wide = DualEncoder(dataclasses.replace(RETRIEVAL_TINY, mlp_dim=16), projection_dim=768)
    with pytest.raises(
        CheckpointMismatchError, match=r"has shape \(4, 8\).*needs \(4, 16\).*T5Config.emb_dim / T5Config.mlp_dim"
    ):
        import_params("t5x", str(directory), wide)
    with pytest.raises(CheckpointMismatchError, match=r"DualEncoder.projection_dim = 768"):
        import_params("t5x", str(directory), DualEncoder(RETRIEVAL_TINY, projection_dim=32))
    short = DualEncoder(dataclasses.replace(RETRIEVAL_TINY, num_layers=1), projection_dim=768)
    with pytest.raises(CheckpointMismatchError, match=r"encoder variable\(s\) would be dropped.*layers_1"):
        import_params("t5x", str(directory), short)


MTF_TINY = T5Config(vocab_size=32128, emb_dim=32, num_heads=2, head_dim=64, mlp_dim=64, num_layers=2)


def test_mtf_index_every_encoder_variable_is_mapped():
    prefix = require_shared("checkpoints/mtf_tiny_t5_index_only/model.ckpt-0.index")
    import tensorflow as tf

    prefix = str(prefix)[: -len(".index")]
    listed = dict(tf.train.list_variables(prefix))
    encoder_vars = {n for n in listed if (n.startswith("encoder/") or n == "shared/embedding") and "_slot_" not in n}
    assert len(encoder_vars) == 21  # embedding, bias, 2 x 9 per block, final norm
    source = mtf_format.open_source(prefix)
    source.read = lambda n: np.zeros(listed[n], np.float32)  # the data shards are not shipped
    abstract = abstract_params(DualEncoder(MTF_TINY))
    _, used = tower_from_source(source, abstract["encoder"])
    assert used == encoder_vars


@pytest.mark.slow
def test_mtf_checkpoint_round_trip_matches_transformers(tmp_path):
    """A TF checkpoint with exactly the real index's encoder names and shapes, random values:
    our import of it encodes like transformers' T5EncoderModel loaded with the same weights."""
    prefix = require_shared("checkpoints/mtf_tiny_t5_index_only/model.ckpt-0.index")
    tf = pytest.importorskip("tensorflow")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    listed = dict(tf.train.list_variables(str(prefix)[: -len(".index")]))
    rng = np.random.RandomState(0)
    values = {n: rng.normal(0, 0.5, s).astype(np.float32) for n, s in listed.items() if n != "global_step"}
    for n in values:
        if n.endswith("/scale") and "_slot_" not in n:
            values[n] = rng.uniform(0.5, 1.5, listed[n]).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        variables = [tf.compat.v1.Variable(v, name=n) for n, v in values.items()]
        saver = tf.compat.v1.train.Saver(variables)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            written = saver.save(sess, str(tmp_path / "model.ckpt"), write_meta_graph=False)

    model = DualEncoder(MTF_TINY)
    params, _ = import_params("mtf", written, model)

    hf = transformers.T5EncoderModel(
        transformers.T5Config(
            vocab_size=32128,
            d_model=32,
            d_kv=64,
            d_ff=64,
            num_layers=2,
            num_heads=2,
            feed_forward_proj="gated-gelu",
            dropout_rate=0.0,
        )
    ).eval()
    state = {"shared.weight": values["shared/embedding"], "encoder.embed_tokens.weight": values["shared/embedding"]}
    state["encoder.final_layer_norm.weight"] = values["encoder/rms_norm/scale"]
    state["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = values[
        "encoder/block_000/layer_000/SelfAttention/relative_attention_bias"
    ].T
    for i in range(2):
        b = f"encoder/block_{i:03d}"
        for x in "qkvo":
            state[f"encoder.block.{i}.layer.0.SelfAttention.{x}.weight"] = values[f"{b}/layer_000/SelfAttention/{x}"].T
        state[f"encoder.block.{i}.layer.0.layer_norm.weight"] = values[f"{b}/layer_000/rms_norm/scale"]
        state[f"encoder.block.{i}.layer.1.layer_norm.weight"] = values[f"{b}/layer_001/rms_norm/scale"]
        for w in ("wi_0", "wi_1", "wo"):
            state[f"encoder.block.{i}.layer.1.DenseReluDense.{w}.weight"] = values[
                f"{b}/layer_001/DenseReluDense/{w}/kernel"
            ].T
    hf.load_state_dict({k: torch.tensor(np.ascontiguousarray(v)) for k, v in state.items()}, strict=True)

    ids = np.array([[31, 7, 2048, 9, 1, 0, 0], [3, 4, 5, 6, 7, 8, 1]])
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(ids != 0)).last_hidden_state.numpy()
    from samtone_jax.models import T5Encoder

    ours = np.asarray(jax.jit(T5Encoder(MTF_TINY).apply)({"params": params["encoder"]}, jnp.asarray(ids)))
    np.testing.assert_allclose(ours[ids != 0], ref[ids != 0], atol=1e-5, rtol=1e-5)
