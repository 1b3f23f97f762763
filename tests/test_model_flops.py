"""MFU in the training log: the model-FLOPs count against hand counts from the configs, token counts
of packed rows equal to the unpacked batch's, the peak table, and a run whose log reports it."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np

from samtone_jax.data.packing import pack_batch
from samtone_jax.models import init_params
from samtone_jax.models.bert.tower import BertConfig
from samtone_jax.models.dual_encoder import DualEncoder
from samtone_jax.models.t5.tower import T5Config
from samtone_jax.training import model_flops


def _shapes(model):
    return nn.unbox(jax.eval_shape(lambda: init_params(model, jax.random.PRNGKey(0))))


def test_matrix_parameters_are_one_towers_and_its_projection_by_hand():
    d, h, hd, m, layers = 32, 4, 8, 37, 2
    bert = BertConfig(vocab_size=99, emb_dim=d, num_heads=h, head_dim=hd, mlp_dim=m, num_layers=layers)
    # BERT: q, k, v [d, h·hd] and the output [h·hd, d]; the MLP [d, m] and [m, d]; the projection [d, P].
    per_layer = 4 * d * h * hd + 2 * d * m
    spl = DualEncoder(bert, "ade_spl", projection_dim=16)
    flops = model_flops.ModelFlops.of(spl, _shapes(spl))
    assert flops.matmul_params == layers * per_layer + d * 16  # one of the two towers: a token passes one
    assert (flops.layers, flops.attention_width) == (layers, h * hd)
    sde = DualEncoder(bert, "sde")
    assert model_flops.ModelFlops.of(sde, _shapes(sde)).matmul_params == layers * per_layer + d * d
    # T5.1.1: q, k, v, o without biases, a gated-GELU MLP (two [d, m] inputs, one [m, d] output);
    # the relative-position table and the token embeddings are lookups, not counted.
    t5 = T5Config(vocab_size=100, emb_dim=d, num_heads=h, head_dim=hd, mlp_dim=m, num_layers=layers)
    model = DualEncoder(t5, "sde")
    assert (
        model_flops.ModelFlops.of(model, _shapes(model)).matmul_params == layers * (4 * d * h * hd + 3 * d * m) + d * d
    )


def test_per_step_flops_follow_the_formula():
    flops = model_flops.ModelFlops(matmul_params=1000, layers=3, attention_width=8)
    # two texts of 4 and 6 tokens: 6 · 1000 · 10 + 12 · 3 · 8 · (16 + 36)
    assert flops.per_step(10, 52) == 6 * 1000 * 10 + 12 * 3 * 8 * 52


def _batch(rng, b=8, lq=12, ld=16, k=1):
    def texts(n, length):
        lengths = rng.randint(1, length + 1, n)
        ids = rng.randint(2, 90, (n, length))
        return np.where(np.arange(length)[None] < lengths[:, None], ids, 0).astype(np.int32), lengths

    q, lq_ = texts(b, lq)
    d, ld_ = texts(b, ld)
    n, ln_ = texts(b * k, ld)
    batch = {"query_tokens": q, "doc_tokens": d, "negative_tokens": n.reshape(b, k, ld)}
    every = np.concatenate([lq_, ld_, ln_])
    return batch, float(every.sum()), float((every**2).sum())


def test_token_counts_of_packed_rows_equal_the_unpacked_batch_and_a_hand_count():
    batch, tokens, attended = _batch(np.random.RandomState(0))
    plain = model_flops.batch_tokens(batch)
    assert float(plain["tokens"]) == tokens and float(plain["attended_tokens"]) == attended
    packed = model_flops.batch_tokens(pack_batch(batch, devices=2, max_segments=4), max_segments=4)
    assert float(packed["tokens"]) == tokens and float(packed["attended_tokens"]) == attended


def test_peaks_come_from_the_table_or_a_measured_cpu_product():
    assert model_flops.peak_from_table("TPU v5 lite") == 197e12
    assert model_flops.peak_from_table("TPU v5") == 459e12 and model_flops.peak_from_table("TPU v4") == 275e12
    assert model_flops.peak_from_table("NVIDIA H100 80GB HBM3") == 989e12
    assert model_flops.peak_from_table("NVIDIA A100-SXM4-40GB") == 312e12
    assert model_flops.peak_from_table("some new chip") is None
    peak, how = model_flops.device_peak(jax.devices("cpu")[:2])
    assert 1e8 < peak < 1e14 and "measured" in how  # simulated host devices share the cores: counted once


def test_the_training_log_reports_tokens_flops_and_mfu(tmp_path, wordnet_env, capsys):
    from conftest import tiny_train_argv

    from samtone_jax.cli import main as cli

    model_dir = tmp_path / "run"
    assert cli.main(tiny_train_argv(model_dir, wordnet_env[1], steps=2, extra=["--gin.packing.enabled=True"])) == 0
    printed = capsys.readouterr().out
    assert "| MFU " in printed
    first = [line for line in printed.splitlines() if line.startswith("step 1 done ")]
    assert len(first) == 1 and 0 < float(first[0].split()[3]) < 600  # time to first step, in seconds
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(model_dir / "train"))
    events.Reload()
    logged = {n: [float(tf.make_ndarray(e.tensor_proto)) for e in events.Tensors(n)] for n in events.Tags()["tensors"]}
    assert all(0 < v < 5 for v in logged["mfu"])  # the CPU's peak is measured: a loaded machine measures it low
    assert logged["time_to_first_step_seconds"] == [float(first[0].split()[3])] or (
        abs(logged["time_to_first_step_seconds"][0] - float(first[0].split()[3])) < 0.06
    )
    assert all(v > 0 for v in logged["tokens"]) and len(logged["model_flops_per_second"]) == 2
    # batch 8 pairs, at most 8 + 12 tokens a pair: the counts are real tokens, not padded rows
    assert all(16 <= v <= 8 * (8 + 12) for v in logged["tokens"])
