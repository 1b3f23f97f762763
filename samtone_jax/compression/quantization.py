"""Compressed embeddings as serving stores them: int8 (per-dimension ranges from a calibration sample)
and binary (sign bits, packed 8 a byte), the same codes sentence-transformers' `quantize_embeddings`
gives, so an index built here and one built there agree bit for bit.

int8 (sentence-transformers' "int8"): with ranges [2, D] = (min, max) of each dimension over a
calibration sample, step = (max − min) / 255 (1 where max = min), code = clip(floor((x − min) / step),
0, 255) − 128. Decoded: (code + 128) · step + min, the bucket's lower edge.
binary (its "ubinary"): bit = x > 0, packed big-endian 8 a byte (np.packbits), ceil(D / 8) bytes a
vector; two vectors' Hamming distance h gives the ±1 inner product D − 2h.

Memory per vector: float32 4·D bytes, int8 D, binary ceil(D / 8). Each function takes and returns numpy
(the index side, on the host) or jax arrays (the quantization-aware loss, on device) alike.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from samtone_jax.core.errors import BadValueError

PRECISIONS = ("float32", "int8", "binary")


def check_precision(precision: str, where: str = "precision") -> str:
    if precision not in PRECISIONS:
        raise BadValueError(f"unknown {where} {precision!r}; choose one of {', '.join(PRECISIONS)}")
    return precision


def bytes_per_vector(precision: str, dim: int) -> int:
    """What one stored D-dimensional vector costs in an index of `precision`."""
    check_precision(precision)
    return {"float32": 4 * dim, "int8": dim, "binary": -(-dim // 8)}[precision]


def truncated(x: np.ndarray, dim: int) -> np.ndarray:
    """The first `dim` coordinates of each row, L2-normalised again (Matryoshka serving)."""
    head = np.asarray(x[..., :dim], np.float32)
    return head / np.maximum(np.linalg.norm(head, axis=-1, keepdims=True), 1e-12)


def int8_ranges(calibration: np.ndarray) -> np.ndarray:
    """[2, D] float32: each dimension's (min, max) over calibration embeddings [N, D] (N >= 2)."""
    calibration = np.asarray(calibration, np.float32)
    if calibration.ndim != 2 or len(calibration) < 2:
        raise BadValueError(
            f"int8 ranges need a calibration sample of at least 2 embeddings [N, D]; got shape {calibration.shape}"
        )
    if not np.isfinite(calibration).all():
        raise BadValueError("the int8 calibration sample has non-finite embeddings")
    return np.stack([calibration.min(axis=0), calibration.max(axis=0)])


def _divide(a, b, xp):
    """a / b rounded as IEEE 754 rounds it. numpy's is; XLA:CPU's vectorised division is off by an
    ulp for about a quarter of float32 values, which moves a value on an int8 bucket edge (each
    dimension's maximum is one) to the code below sentence-transformers'. On device: the nearest of
    XLA's quotient and its two neighbours, by the exact residual a − q·b (Dekker's product)."""
    if xp is np:
        return a / b
    b = xp.broadcast_to(xp.asarray(b, a.dtype), a.shape)
    q = a / b
    candidates = (q, xp.nextafter(q, xp.inf), xp.nextafter(q, -xp.inf))
    residuals = [xp.abs(_exact_residual(a, c, b)) for c in candidates]
    best = xp.where(residuals[1] < residuals[0], candidates[1], q)
    return xp.where(residuals[2] < xp.minimum(residuals[0], residuals[1]), candidates[2], best)


def _split(x):
    """x = hi + lo with 12-bit halves (Veltkamp), so products of halves are exact in float32."""
    c = 4097.0 * x
    hi = c - (c - x)
    return hi, x - hi


def _exact_residual(a, q, b):
    """a − q·b in float32 without the product's rounding error (q·b = p + e exactly)."""
    p = q * b
    (qh, ql), (bh, bl) = _split(q), _split(b)
    e = ((qh * bh - p) + qh * bl + ql * bh) + ql * bl
    return (a - p) - e


def _steps(ranges, xp):
    steps = _divide(ranges[1] - ranges[0], xp.asarray(255, xp.float32), xp)
    return xp.where(steps == 0, xp.ones_like(steps), steps)


def _module(x):
    return np if isinstance(x, np.ndarray) else jnp


def check_ranges(ranges, dim: int, where: str = "the int8 ranges") -> None:
    shape = tuple(np.shape(ranges))
    if shape != (2, dim):
        raise BadValueError(f"{where} have shape {shape}; embeddings of dimension {dim} need (2, {dim}) (min, max)")
    if isinstance(ranges, (np.ndarray, list, tuple)):  # host values (a traced array is checked where it is made)
        values = np.asarray(ranges, np.float64)
        bad = ~np.isfinite(values).all(axis=0) | (values[0] > values[1])
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise BadValueError(
                f"{where} are not usable ranges: {int(bad.sum())} of {dim} dimensions have a non-finite or reversed "
                f"(min > max) range (first: dimension {first}, {values[:, first].tolist()}); recalibrate "
                "(samtone calibrate)"
            )


def int8_steps(ranges):
    """[D] each dimension's bucket width (max − min) / 255 (1 where max = min)."""
    xp = _module(ranges)
    return _steps(xp.asarray(ranges, xp.float32), xp)


def quantize_int8(x, ranges):
    """[..., D] float -> int8 codes (sentence-transformers' int8 with these ranges)."""
    xp = _module(x)
    ranges = xp.asarray(ranges, xp.float32)
    check_ranges(ranges, x.shape[-1])
    codes = xp.clip(xp.floor(_divide(x.astype(xp.float32) - ranges[0], _steps(ranges, xp), xp)), 0, 255)
    return (codes - 128).astype(xp.int8)


def dequantize_int8(codes, ranges):
    """int8 codes [..., D] -> float32: each code's bucket lower edge."""
    xp = _module(codes)
    ranges = xp.asarray(ranges, xp.float32)
    check_ranges(ranges, codes.shape[-1])
    return (codes.astype(xp.float32) + 128) * _steps(ranges, xp) + ranges[0]


def pack_bits(x):
    """[..., D] float -> uint8 [..., ceil(D / 8)]: the sign bits (x > 0), big-endian within a byte."""
    xp = _module(x)
    if xp is np:
        return np.packbits(x > 0, axis=-1)
    bits = (x > 0).astype(xp.uint8)
    pad = (-bits.shape[-1]) % 8
    bits = xp.pad(bits, [(0, 0)] * (bits.ndim - 1) + [(0, pad)]).reshape(*bits.shape[:-1], -1, 8)
    weights = xp.asarray([128, 64, 32, 16, 8, 4, 2, 1], xp.uint8)
    return (bits * weights).sum(axis=-1, dtype=xp.uint32).astype(xp.uint8)


def unpack_signs(packed, dim: int):
    """uint8 [..., ceil(D / 8)] -> float32 [..., D] of ±1 (bit 1 -> +1), so that the inner product of
    two unpacked vectors is D − 2 · their Hamming distance."""
    xp = _module(packed)
    if packed.shape[-1] != -(-dim // 8):
        raise BadValueError(f"{packed.shape[-1]} bytes a vector do not hold {dim} bits (need {-(-dim // 8)})")
    shifts = xp.arange(7, -1, -1, dtype=xp.uint8)
    bits = (packed[..., None] >> shifts) & 1
    bits = bits.reshape(*packed.shape[:-1], -1)[..., :dim]
    return bits.astype(xp.float32) * 2 - 1


def encode(x, precision: str, ranges=None):
    """float32 [..., D] -> the stored codes of `precision` (float32 itself, int8 codes, packed bits)."""
    check_precision(precision)
    if precision == "float32":
        return x.astype(_module(x).float32)
    if precision == "int8":
        if ranges is None:
            raise BadValueError("int8 needs ranges (int8_ranges of a calibration sample)")
        return quantize_int8(x, ranges)
    return pack_bits(x)


def decode(codes, precision: str, dim: int, ranges=None):
    """Stored codes -> float32 [..., D] in the float query's coordinates (for rescoring): int8 codes
    dequantized, bits as ±1 (a query's ranking by q · (±1) is its ranking by q · bits)."""
    check_precision(precision)
    if precision == "float32":
        return codes
    if precision == "int8":
        return dequantize_int8(codes, ranges)
    return unpack_signs(codes, dim)
