"""Quantization-aware training: the contrastive loss also computed on the embeddings as a compressed
index serves them, so the model learns to keep its ranking through int8 / binary codes.

  L = Σ_p w_p · L_c(Q_p(q), Q_p(d), Q_p(n), ...)        p over objective.quantized_precisions

with Q_float32 = identity and, for the others, a straight-through estimator (forward: the served
vector; backward: the identity, Bengio et al. 2013):

  binary  Q(x) = sign±(x) / √D: the packed bits' ±1 vector on the unit sphere, so Q(q) · Q(d) =
          (D − 2 · Hamming) / D, exactly the Hamming search's ranking (quantization.pack_bits: x > 0)
  int8    Q(x) = c(x) / K: x's int8 code (quantization.quantize_int8, sentence-transformers'
          codes) with the ranges of this step's global batch of documents (per dimension min / max
          over every device's document and negative rows, pmin / pmax over the mesh: tracked per
          step, not learned; served are `samtone calibrate`'s over a corpus sample), so Q(q) · Q(d)
          is the int8 index's integer inner product c(q) · c(d), the ranking it serves, over K², a
          constant of the step (the batch's mean code norm) that keeps the scores cosine-sized for
          the temperature. Backward: through the continuous code (x − min) / step − 128, its step
          floored at SLOPE_FLOOR × the mean step: a dimension nearly constant over the batch's
          documents (all-MiniLM-L6-v2 has one: a range of 7e-33 over 64 definitions) has a step of
          ~1e-35, and 1 / step overflowed the gradient's norm to inf, which froze the run (measured:
          MRR equal to the untrained model's). Its forward codes are unchanged (as served).

int8-aware training needs a trained float geometry to start from (train.init_checkpoint: a
pretrained import, or a float32 run to fine-tune), and is refused without one. Measured on the T5
mini SDE from scratch (docs/RESULTS.md): by step 100 of 300 the float32 and binary terms sat at
chance (4.50, the loss of equal scores) while the int8 term kept falling; the run's documents
ended on one point (per-dimension std 0.00044, against 0.1076 at initialisation and 0.1075 after a
float32 run), their sign bits constant (binary MRR 0.0014, chance), int8 MRR 0.06 against float32's 0.20.
The int8 scores, like the int8 index's, are invariant to any positive per-dimension affine map
applied to queries and documents alike (the ranges follow the batch's documents, and the queries are
coded with them), so the int8 term offers no resistance to both collapsing together; once
the spread shrinks, the float32 and binary terms' gradients shrink with it and the int8 term's do
not. The same terms fine-tuning a 300-step float32 run (3 seeds) lifted int8 from 84.7 % to 95.7 %
of float32 MRR. The `quantized/int8_range` metric (the batch's mean per-dimension document range)
shows a collapse as it starts.

L_c is any contrastive loss of losses.py with its ids, guide and sharding unchanged (each Q is per
row, the int8 ranges a global reduction), so N devices = 1 device and GradCache = plain hold as for
L_c itself. Composes with Matryoshka (matryoshka.nested outside: every (dimension, precision) pair
is a term, as `samtone eval --dims --precisions` serves them) and distillation (outside too).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from samtone_jax.compression import quantization
from samtone_jax.core.errors import BadValueError
from samtone_jax.objectives.matryoshka import term_weights


def straight_through(x: jax.Array, served: jax.Array) -> jax.Array:
    """`served` forward, the identity's gradient backward."""
    return x + jax.lax.stop_gradient(served - x)


def binary_served(x: jax.Array) -> jax.Array:
    """The ±1 / √D vector of x's sign bits (bit: x > 0), in x's dtype."""
    signs = jnp.where(x > 0, 1.0, -1.0) / jnp.sqrt(jnp.float32(x.shape[-1]))
    return signs.astype(x.dtype)


def batch_ranges(documents: Sequence[jax.Array], axis_name: str | None) -> jax.Array:
    """[2, D] float32 per-dimension (min, max) over every row of `documents` ([..., D] each), across
    the devices of `axis_name` too."""
    rows = [jax.lax.stop_gradient(x).reshape(-1, x.shape[-1]).astype(jnp.float32) for x in documents if x is not None]
    low = jnp.min(jnp.concatenate([r.min(axis=0, keepdims=True) for r in rows]), axis=0)
    high = jnp.max(jnp.concatenate([r.max(axis=0, keepdims=True) for r in rows]), axis=0)
    if axis_name is not None:
        low, high = jax.lax.pmin(low, axis_name), jax.lax.pmax(high, axis_name)
    return jnp.stack([low, high])


def int8_codes(x: jax.Array, ranges: jax.Array) -> jax.Array:
    """x's int8 codes as float32 (no gradient)."""
    return quantization.quantize_int8(jax.lax.stop_gradient(x), ranges).astype(jnp.float32)


def code_scale(codes: Sequence[jax.Array | None], axis_name: str | None) -> jax.Array:
    """K: the mean L2 norm of the code rows (every device's rows with `axis_name`), no gradient."""
    rows = [c.reshape(-1, c.shape[-1]) for c in codes if c is not None]
    total = sum(jnp.sum(jnp.linalg.norm(r, axis=-1)) for r in rows)
    count = jnp.float32(sum(r.shape[0] for r in rows))
    if axis_name is not None:
        total, count = jax.lax.psum(total, axis_name), jax.lax.psum(count, axis_name)
    return jax.lax.stop_gradient(jnp.maximum(total / count, 1e-6))


SLOPE_FLOOR = 0.1  # the smallest step the backward divides by, as a fraction of the mean step


def int8_served(x: jax.Array, codes: jax.Array, ranges: jax.Array, scale: jax.Array) -> jax.Array:
    """codes / scale forward; backward through the continuous code (x − min) / step − 128, with the
    step floored at SLOPE_FLOOR × the mean step (the module docstring says why)."""
    steps = quantization.int8_steps(ranges)
    steps = jnp.maximum(steps, SLOPE_FLOOR * jnp.mean(steps))
    continuous = (x.astype(jnp.float32) - ranges[0]) / steps - 128.0
    return (straight_through(continuous, codes) / scale).astype(x.dtype)


def check_precisions(precisions: Sequence[str], weights: Sequence[float] | None):
    """(precisions, weights) as tuples, validated: distinct known precisions, one weight >= 0 each."""
    precisions = tuple(precisions)
    for p in precisions:
        quantization.check_precision(p, "objective.quantized_precisions entry")
    if not precisions or len(set(precisions)) != len(precisions):
        raise BadValueError(
            "objective.quantized_precisions must name distinct precisions, e.g. ('float32', 'binary'); "
            f"got {precisions}"
        )
    return precisions, term_weights(weights, precisions, "objective.quantized_weights", "precision of")


def check_start(precisions: Sequence[str] | None, init_checkpoint: str | None, saved_steps: Sequence[int] = ()):
    """Refuse int8-aware training from a random initialisation (the module docstring says why): it
    needs train.init_checkpoint, or MODEL_DIR's own `saved_steps` (a run continued with the term)."""
    if precisions and "int8" in precisions and not init_checkpoint and not saved_steps:
        raise BadValueError(
            "objective.quantized_precisions has 'int8', which collapses a randomly initialised model's embeddings "
            "(docs/RESULTS.md, compressed serving on T5): train float32 first (or import a pretrained model), then "
            "fine-tune it with train.init_checkpoint=<that run> (or continue that run's MODEL_DIR) and the int8 term; "
            "('float32', 'binary') may start from scratch"
        )


def aware(loss_fn, precisions: Sequence[str], weights: Sequence[float] | None = None):
    """loss_fn (contrastive_loss's signature) summed over the precisions of the module docstring.
    Metrics: loss_fn's of the first precision, `quantized/loss_<precision>` for each, `loss`, the
    weighted sum, and with int8 `quantized/int8_range`, the batch's mean per-dimension document range."""
    precisions, weights = check_precisions(precisions, weights)

    def loss(q, d, *, negatives=None, axis_name=None, **kwargs):
        total, terms, metrics = 0.0, {}, None
        for precision, w in zip(precisions, weights, strict=True):
            if precision == "float32":
                served = (q, d, negatives)
            elif precision == "binary":
                served = tuple(None if x is None else straight_through(x, binary_served(x)) for x in (q, d, negatives))
            else:
                ranges = batch_ranges((d, negatives), axis_name)
                codes = tuple(None if x is None else int8_codes(x, ranges) for x in (q, d, negatives))
                scale = code_scale(codes, axis_name)
                terms["quantized/int8_range"] = jnp.mean(ranges[1] - ranges[0])
                served = tuple(
                    None if x is None else int8_served(x, c, ranges, scale)
                    for x, c in zip((q, d, negatives), codes, strict=True)
                )
            value, found = loss_fn(served[0], served[1], negatives=served[2], axis_name=axis_name, **kwargs)
            metrics = found if metrics is None else metrics
            total = total + w * value
            terms[f"quantized/loss_{precision}"] = value
        return total, {**metrics, **terms, "loss": total}

    return loss
