"""A full training step, ours against sentence-transformers, one run (the CPU; on an accelerator ours
alone, --skip theirs: benchmarks/on_accelerator.sh).

Model: a T5.1.1-shaped SDE (d_model 512, 8 heads × 64, gated-GELU d_ff 1024, 4 layers, vocab
32128, bias-free projection 512 -> 512, mean pooling, L2 normalisation), random weights, batch 32
pairs × 64 tokens on each side, float32, dropout off. Step = forward of both sides, bidirectional
query-side SamToNe (τ 0.01), backward, Adafactor update (factored, decay 0.8, parameter scale,
clipping 1.0, lr 1e-3).

  ours   samtone_jax.training.train.make_train_step (the training loop's jitted step, on a 1-device mesh)
  theirs sentence-transformers 6.2: Transformer(T5EncoderModel) + Pooling(mean) + Dense(no bias)
         + Normalize, MultipleNegativesRankingLoss(directions query_to_doc, query_to_query,
         doc_to_query; joint) = the same loss, transformers' Adafactor with the same settings
         (relative_step off, scale_parameter on, clip_threshold 1.0, decay_rate -0.8)
  peak   on the CPU this process's float32 matmul rate (a 2048³ jnp matmul, best of 10), for MFU; on
         an accelerator its chip's dense bfloat16 peak from training/model_flops.py's table (the
         training log's), also for a float32 step (its MFU then reads against the bfloat16 peak)

Prints pairs/s of each (median step time after warm-up), ours/theirs (goal ≥ 1.2), ours' model
FLOP/s as a fraction of the measured matmul peak (goal ≥ 0.40), and the time of the step's matmuls
alone, each timed in isolation with XLA's dot kernels: the floor of any XLA:CPU step. Model FLOPs are counted
analytically (matmuls of the forward × 3, PaLM-style: no rematerialisation counted) and checked
against XLA's cost analysis of the compiled step.

  .venv/bin/python benchmarks/train_step_bench.py [--steps 8] [--skip theirs]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from samtone_jax.cli import gin_registry  # noqa: E402
from samtone_jax.config import gin_config
from samtone_jax.models import partitioning
from samtone_jax.training import optimizer, train
from samtone_jax.training.model_flops import peak_from_table

SHAPE = dict(emb_dim=512, num_heads=8, head_dim=64, mlp_dim=1024, num_layers=4, vocab_size=32128)
TAU = 0.01
LR = 1e-3


def model_flops(batch: int, length: int, shape: dict = SHAPE) -> float:
    """Matmul FLOPs of one training step (forward × 3), both sides, attention included."""
    d, h, dh, f, n = shape["emb_dim"], shape["num_heads"], shape["head_dim"], shape["mlp_dim"], shape["num_layers"]
    per_token_layer = 2 * (4 * d * h * dh + 3 * d * f) + 2 * 2 * length * h * dh  # projections + QK^T, AV
    tokens = 2 * batch * length
    forward = tokens * n * per_token_layer + 2 * (2 * batch) * d * d  # + projection of pooled vectors
    b2 = 2 * batch
    forward += 2 * 3 * batch * b2 * d // 2  # three B×B×D similarity blocks
    return 3.0 * forward


def timed(fn, steps: int) -> float:
    fn()
    fn()  # warm-up: compilation, allocator
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_peak(n: int = 2048, repeats: int = 10) -> float:
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
    mm = jax.jit(lambda a, b: a @ b)
    mm(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):  # the best of several: a peak, not a typical rate
        start = time.perf_counter()
        mm(a, b).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def dots_alone(batch: int, length: int, repeats: int = 5, shape: dict = SHAPE) -> float:
    """Seconds of the step's matmuls alone, each timed in isolation at its shape (median of `repeats`):
    per layer and side the q, k, v, o, wi_0, wi_1, wo projections (forward, and the backward's
    dx = dy·Wᵀ and dW = xᵀ·dy) and the attention products QKᵀ, AV (× 3). What a step built from
    XLA:CPU's dot kernels cannot go below, so it bounds any XLA step's speed-up over theirs."""
    d, h, dh, f, n = shape["emb_dim"], shape["num_heads"], shape["head_dim"], shape["mlp_dim"], shape["num_layers"]
    m = batch * length
    products = []  # (lhs shape, rhs shape, einsum, count per side and layer)
    for k, out, count in ((d, h * dh, 3), (h * dh, d, 1), (d, f, 2), (f, d, 1)):
        products += [
            ((m, k), (k, out), "mk,kn->mn", count),
            ((m, out), (k, out), "mn,kn->mk", count),
            ((m, k), (m, out), "mk,mn->kn", count),
        ]
    attention = ((batch * h, length, dh), (batch * h, length, dh), "bqd,bkd->bqk", 3 * 2)  # QKᵀ and AV, fwd + bwd
    total = 0.0
    for lhs, rhs, spec, count in [*products, attention]:
        a = jax.random.normal(jax.random.PRNGKey(0), lhs, jnp.float32)
        b = jax.random.normal(jax.random.PRNGKey(1), rhs, jnp.float32)
        dot = jax.jit(lambda a, b, spec=spec: jnp.einsum(spec, a, b))
        total += count * timed(functools.partial(lambda dot, a, b: dot(a, b).block_until_ready(), dot, a, b), repeats)
    return 2 * n * total  # both sides, every layer


def random_tokens(batch: int, length: int, seed: int) -> np.ndarray:
    rng = np.random.RandomState(seed)
    tokens = rng.randint(2, SHAPE["vocab_size"], size=(batch, length)).astype(np.int32)
    tokens[:, -1] = 1  # EOS, as the pipeline appends it
    return tokens


def bench_ours(batch: int, length: int, steps: int, extra_bindings=()):
    bindings = [f"T5Config.{k} = {v}" for k, v in SHAPE.items()]
    gin_registry.parse(
        ["architectures/sde.gin", "losses/samtone_query.gin"],
        [*bindings, "T5Config.mlp_activations = ('gelu', 'linear')", f"TEMPERATURE = {TAU}", *extra_bindings],
    )
    model = gin_config.model()
    mesh = partitioning.create_mesh(devices=jax.devices()[:1])
    tx, schedule = optimizer.adafactor(learning_rate=LR, train_steps=10_000)
    state = train.initial_state(model, tx, mesh, seed=0, init_checkpoint=None)
    batch_arrays = {"query_tokens": random_tokens(batch, length, 1), "doc_tokens": random_tokens(batch, length, 2)}
    global_batch = partitioning.host_to_global(mesh, batch_arrays)
    step = jax.jit(
        train.make_train_step(model, tx, schedule, mesh, None, gin_config.contrastive_loss), donate_argnums=0
    )
    compiled = step.lower(state, global_batch).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    holder = {"state": state}

    def run():
        holder["state"], metrics = compiled(holder["state"], global_batch)
        jax.block_until_ready(metrics["loss"])

    return timed(run, steps), float(cost.get("flops", float("nan")))


def theirs_step(batch: int, length: int):
    """sentence-transformers' training step on the same model and loss: step((query ids, doc ids))
    -> seconds, for zero-padded int arrays [batch, any length] (attention mask: the non-zeros)."""
    import tokenizers
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=SHAPE["vocab_size"],
        d_model=SHAPE["emb_dim"],
        d_kv=SHAPE["head_dim"],
        d_ff=SHAPE["mlp_dim"],
        num_layers=SHAPE["num_layers"],
        num_heads=SHAPE["num_heads"],
        feed_forward_proj="gated-gelu",
        dropout_rate=0.0,
        is_encoder_decoder=False,
        use_cache=False,
    )
    directory = tempfile.mkdtemp(prefix="train_step_bench_")  # a random model, loaded the usual way
    transformers.T5EncoderModel(config).save_pretrained(directory)
    word_level = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<pad>": 0, "</s>": 1, "<unk>": 2}, "<unk>"))
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=word_level, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(directory)
    transformer = Transformer(directory, max_seq_length=length)
    d = SHAPE["emb_dim"]
    modules = [
        transformer,
        Pooling(d, pooling_mode="mean"),
        Dense(d, d, bias=False, activation_function=torch.nn.Identity()),
        Normalize(),
    ]
    model = SentenceTransformer(modules=modules, device="cpu")
    model.train()
    loss = MultipleNegativesRankingLoss(
        model, scale=1.0 / TAU, directions=("query_to_doc", "query_to_query", "doc_to_query"), partition_mode="joint"
    )
    optimizer = transformers.optimization.Adafactor(
        model.parameters(),
        lr=LR,
        relative_step=False,
        scale_parameter=True,
        warmup_init=False,
        clip_threshold=1.0,
        decay_rate=-0.8,
    )
    labels = torch.arange(batch)

    def step(sides) -> float:
        features = []
        for ids in sides:
            ids = torch.from_numpy(np.asarray(ids, np.int64))
            features.append({"input_ids": ids, "attention_mask": (ids != 0).long()})
        start = time.perf_counter()
        value = loss(features, labels)
        value.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    return step


def bench_theirs(batch: int, length: int, steps: int):
    step = theirs_step(batch, length)
    sides = (random_tokens(batch, length, 1), random_tokens(batch, length, 2))
    return timed(lambda: step(sides), steps)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--skip", nargs="*", default=[], help="theirs")
    parser.add_argument("--gin", nargs="*", default=[], help="extra gin bindings for ours")
    args = parser.parse_args()
    device = jax.devices()[0]
    versions = f"jax {jax.__version__}"
    if "theirs" not in args.skip:  # torch only for theirs: an accelerator's python may lack it
        import torch

        torch.set_num_threads(os.cpu_count())
        versions += f", torch {torch.__version__}"
    print(f"{device.platform} ({device.device_kind}), {os.cpu_count()} CPU cores; {versions}")
    dtype = " ".join(args.gin) or "float32"
    print(f"SDE {SHAPE}, batch {args.batch} pairs × {args.length} tokens, {dtype}; median of {args.steps} steps")
    # The CPU: its measured float32 matmul rate; an accelerator: its chip's dense bfloat16 peak (the
    # table in training/model_flops.py, as the training log's MFU), else its measured matmul rate.
    table = peak_from_table(device.device_kind) if device.platform != "cpu" else None
    peak = table or matmul_peak()
    flops = model_flops(args.batch, args.length)
    ours, xla_flops = bench_ours(args.batch, args.length, args.steps, args.gin)
    print(f"peak               {peak / 1e9:8.1f} GFLOP/s ({'the table' if table else 'measured matmul'})")
    print(f"model FLOPs/step   {flops / 1e9:8.1f} GFLOP (XLA cost analysis: {xla_flops / 1e9:.1f})")
    print(f"ours               {ours:8.3f} s/step  {args.batch / ours:6.2f} pairs/s  MFU {flops / ours / peak:.2f}")
    if "theirs" not in args.skip:
        theirs = bench_theirs(args.batch, args.length, args.steps)
        print(
            f"sentence-transf.   {theirs:8.3f} s/step  {args.batch / theirs:6.2f} pairs/s  "
            f"MFU {flops / theirs / peak:.2f}"
        )
        print(f"ours / theirs      {theirs / ours:8.2f}x  (goal >= 1.2)")
        dots = dots_alone(args.batch, args.length)
        print(f"dots alone (XLA)   {dots:8.3f} s/step  -> no XLA:CPU step can exceed {theirs / dots:.2f}x theirs")
    print(f"ours MFU           {flops / ours / peak:8.2f}   (goal >= 0.40)")


if __name__ == "__main__":
    main()
