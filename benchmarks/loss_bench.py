"""Forward + backward of bidirectional query-side SamToNe on the CPU, against its peers, one run.

  ours            samtone_jax.objectives.losses.contrastive_loss (jit, float32)
  naive torch     the formula written the straightforward way: three cos_sim matrices, exp,
                  sums, log (as users post it)
  mnrl            sentence-transformers 6.2 MultipleNegativesRankingLoss with the same three
                  similarity blocks (query_to_doc, query_to_query, doc_to_query; 'joint')
  3 matmuls (jax) the three B×B×D matmuls of the loss, forward + backward, timed alone
                  (jax.vjp with random cotangents so XLA cannot merge them): the floor

Prints seconds (median of --repeats after one warm-up) and the ratios the goals are stated in:
ours ≥ 1.5× faster than naive torch, ≥ 1.0× MNRL, and ≤ 1.3× the matmul floor.

  .venv/bin/python benchmarks/loss_bench.py --sizes 512 4096 16384
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from samtone_jax.objectives.losses import contrastive_loss  # noqa: E402

TAU = 0.01


def timed(fn, repeats):
    fn()  # warm-up (compilation, allocator)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_ours(q, d, repeats):
    step = jax.jit(jax.value_and_grad(lambda q, d: contrastive_loss(q, d, temperature=TAU)[0], argnums=(0, 1)))
    qj, dj = jnp.asarray(q), jnp.asarray(d)
    return timed(lambda: jax.block_until_ready(step(qj, dj)), repeats)


def bench_matmul_floor(q, d, repeats):
    def three(q, d):
        return q @ d.T, q @ q.T, d @ q.T

    b = q.shape[0]
    cot = tuple(jnp.asarray(np.random.RandomState(i).normal(size=(b, b)), jnp.float32) for i in range(3))

    @jax.jit
    def fwd_bwd(q, d, cot):  # cotangents as arguments, not multi-GB captured constants
        out, vjp = jax.vjp(three, q, d)
        return out, vjp(cot)

    qj, dj = jnp.asarray(q), jnp.asarray(d)
    return timed(lambda: jax.block_until_ready(fwd_bwd(qj, dj, cot)), repeats)


def _cos_sim(a, b):
    a = torch.nn.functional.normalize(a, dim=1)
    b = torch.nn.functional.normalize(b, dim=1)
    return a @ b.T


def bench_naive_torch(q, d, repeats):
    def run():
        tq = torch.tensor(q, requires_grad=True)
        td = torch.tensor(d, requires_grad=True)
        s_qd, s_qq, s_dq = _cos_sim(tq, td) / TAU, _cos_sim(tq, tq) / TAU, _cos_sim(td, tq) / TAU
        off_diagonal = 1 - torch.eye(len(q))
        positive = torch.exp(torch.diag(s_qd))
        l_qd = -torch.log(positive / (torch.exp(s_qd).sum(1) + (torch.exp(s_qq) * off_diagonal).sum(1)))
        l_dq = -torch.log(positive / torch.exp(s_dq).sum(1))
        loss = 0.5 * (l_qd.mean() + l_dq.mean())
        loss.backward()
        return loss

    return timed(run, repeats)


def bench_mnrl(q, d, repeats):
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    mnrl = MultipleNegativesRankingLoss(
        None, scale=1.0 / TAU, directions=("query_to_doc", "query_to_query", "doc_to_query"), partition_mode="joint"
    )

    def run():
        tq = torch.tensor(q, requires_grad=True)
        td = torch.tensor(d, requires_grad=True)
        loss = mnrl.compute_loss_from_embeddings([tq, td], None)
        loss.backward()
        return loss

    return timed(run, repeats)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 4096, 16384])
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip", nargs="*", default=[], help="methods to skip: naive mnrl floor")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count())
    print(
        f"CPU: {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"jax {jax.__version__}"
    )
    print(f"bidirectional query-side SamToNe, fwd+bwd, D={args.dim}, float32, tau={TAU}, median of {args.repeats}")
    columns = ["ours s", "naive s", "mnrl s", "floor s", "naive/ours", "mnrl/ours", "ours/floor"]
    header = f"{'B':>6} " + " ".join(f"{c:>10}" for c in columns)
    print(header)
    for b in args.sizes:
        rng = np.random.RandomState(0)
        q = rng.normal(size=(b, args.dim)).astype(np.float32)
        d = rng.normal(size=(b, args.dim)).astype(np.float32)
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        d /= np.linalg.norm(d, axis=1, keepdims=True)
        repeats = args.repeats if b < 16384 else max(1, args.repeats - 1)
        ours = bench_ours(q, d, repeats)
        naive = bench_naive_torch(q, d, repeats) if "naive" not in args.skip else float("nan")
        mnrl = bench_mnrl(q, d, repeats) if "mnrl" not in args.skip else float("nan")
        floor = bench_matmul_floor(q, d, repeats) if "floor" not in args.skip else float("nan")
        print(
            f"{b:>6} {ours:>10.3f} {naive:>10.3f} {mnrl:>10.3f} {floor:>10.3f} "
            f"{naive / ours:>10.2f} {mnrl / ours:>10.2f} {ours / floor:>10.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
