"""Dual encoders over T5 or BERT towers: SDE, ADE and ADE-SPL (Dong et al. 2022; SamToNe, Moiseev et al. 2023).

  sde      one tower and one projection for queries and documents (every parameter shared);
  ade      a query tower and a document tower, each with its own projection;
  ade_spl  two towers, one shared projection ("ADE with shared projection layer").

Embedding of a text: tower hidden states -> mean over non-padding tokens -> projection
without bias -> L2 normalisation. The tower is the config's family's encoder (models/families.py:
T5Config -> T5Encoder, BertConfig -> BertEncoder). A pretrained mean-pooling sentence encoder has no
projection: `projection_init='identity'` starts the projection as the identity (projection_dim =
emb_dim), so the model embeds exactly as the imported one did before training. Where each tower
and projection lives in the parameter tree is models/layout.py's to say (one entry per
architecture). `lora_rank` > 0 adds LoRA adapters to the towers (models/lora.py: sde shares one,
ade_lora has one per side over one frozen tower).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from samtone_jax.core.errors import BadValueError
from samtone_jax.models import families
from samtone_jax.models import lora as lora_lib
from samtone_jax.models.layers import PAD_ID, fan_in_init, param
from samtone_jax.models.layout import ARCHITECTURES, layout

__all__ = [
    "ARCHITECTURES",
    "DualEncoder",
    "Projection",
    "init_params",
    "l2_normalize",
    "mean_pool",
    "segment_mean_pool",
]


def mean_pool(hidden: jax.Array, tokens: jax.Array) -> jax.Array:
    """hidden [B, L, D], tokens [B, L] -> [B, D] float32 mean over non-padding positions.

    An all-padding row (empty text) pools to zeros instead of dividing by zero.
    """
    mask = (tokens != PAD_ID).astype(jnp.float32)[..., None]
    total = jnp.sum(hidden.astype(jnp.float32) * mask, axis=1)
    return total / jnp.maximum(jnp.sum(mask, axis=1), 1.0)


def segment_mean_pool(hidden: jax.Array, segment_ids: jax.Array, num_segments: int) -> jax.Array:
    """hidden [B, L, D], segment_ids [B, L] (1..S per text, 0 = padding) -> [B, S, D] float32 mean
    of each text's positions; a slot no text uses pools to zeros."""
    slots = (segment_ids[..., None] == jnp.arange(1, num_segments + 1)).astype(jnp.float32)  # [B, L, S]
    # HIGHEST: a float32 sum like mean_pool's (TPU / GPU would otherwise take bf16 / TF32 passes).
    total = jnp.einsum("bld,bls->bsd", hidden.astype(jnp.float32), slots, precision=jax.lax.Precision.HIGHEST)
    return total / jnp.maximum(jnp.sum(slots, axis=1), 1.0)[..., None]


def l2_normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
    """Row-wise x / max(||x||, eps), in float32 (a zero row stays zero, with a finite gradient: the
    max is taken before the square root, whose derivative at 0 is infinite and would make 0 · ∞ =
    NaN of an unused packed slot's zero cotangent)."""
    x = x.astype(jnp.float32)
    return x / jnp.sqrt(jnp.maximum(jnp.sum(jnp.square(x), axis=-1, keepdims=True), eps * eps))


PROJECTION_INITS = ("fan_in", "identity")


def _identity(key, shape, dtype=jnp.float32):
    return jnp.eye(*shape, dtype=dtype)


class Projection(nn.Module):
    """Bias-free dense map emb_dim -> projection_dim; `kernel_init` 'fan_in' (T5X's variance scaling)
    or 'identity' (square: the pooled embedding passes unchanged until training moves it)."""

    features: int
    param_dtype: str = "float32"
    kernel_init: str = "fan_in"

    @nn.compact
    def __call__(self, x):
        kernel = param(
            self,
            "kernel",
            _identity if self.kernel_init == "identity" else fan_in_init(),
            (x.shape[-1], self.features),
            ("embed", "projection"),
            jnp.dtype(self.param_dtype),
        )
        return jnp.dot(x.astype(jnp.float32), kernel.astype(jnp.float32))


class DualEncoder(nn.Module):
    """Token ids -> L2-normalised float32 embeddings [B, projection_dim].

    Call through `apply(..., method=...)`:
      encode_queries(tokens [B, L])   -> [B, P]
      encode_documents(tokens [B, L]) -> [B, P]
      __call__(queries [B, Lq], documents [B, Ld], negatives [B, K, Ld] | None)
          -> (q [B, P], d [B, P], n [B, K, P] | None)
    """

    config: object  # a tower family's config (T5Config, BertConfig, ...)
    architecture: str = "sde"
    projection_dim: int | None = None  # None: emb_dim
    # None: the loss's temperature is a constant (gin TEMPERATURE). A float τ0: the model owns a
    # learnable `log_temperature` initialised to log τ0 (log-parametrised, so τ stays positive).
    learnable_temperature: float | None = None
    # Two-tower models (ade, ade_spl) start with the document tower equal to the query tower, as
    # when both load one pre-trained checkpoint (the paper's setting); False: independent draws.
    identical_tower_init: bool = True
    # 'fan_in' or 'identity' (needs projection_dim None or emb_dim): see the module docstring.
    projection_init: str = "fan_in"
    # LoRA (models/lora.py): rank (0: none), alpha (None: = rank), which kernels, which layers.
    lora_rank: int = 0
    lora_alpha: float | None = None
    lora_targets: tuple[str, ...] = lora_lib.GROUPS
    lora_layers: tuple[int, ...] | None = None

    @property
    def lora(self) -> lora_lib.Lora | None:
        """The adapters' settings (None without LoRA); refuses an architecture that takes none, or
        ade_lora without them."""
        tree = layout(self.architecture)
        if not self.lora_rank:
            if tree.needs_adapters:
                raise BadValueError(
                    f"DualEncoder.architecture={self.architecture!r} is one tower with a LoRA adapter per side: "
                    "set DualEncoder.lora_rank (e.g. 8)"
                )
            return None
        if not tree.adapters:
            raise BadValueError(
                f"DualEncoder.lora_rank={self.lora_rank} with architecture {self.architecture!r} (two full towers): "
                "LoRA adapts 'sde' (one adapter) or 'ade_lora' (one frozen tower, an adapter per side)"
            )
        return lora_lib.Lora(self.lora_rank, self.lora_alpha, self.lora_targets, self.lora_layers)

    @property
    def tower_class(self):
        return families.of(self.config).encoder_class

    def setup(self):
        tree = layout(self.architecture)
        if self.projection_init not in PROJECTION_INITS:
            raise BadValueError(f"DualEncoder.projection_init={self.projection_init!r}: use one of {PROJECTION_INITS}")
        if self.projection_init == "identity" and self.projection_dim not in (None, self.config.emb_dim):
            raise BadValueError(
                f"DualEncoder.projection_init='identity' needs projection_dim = emb_dim ({self.config.emb_dim}) or "
                f"None; got {self.projection_dim}"
            )
        if self.learnable_temperature is not None:
            if not self.learnable_temperature > 0:
                raise BadValueError(f"DualEncoder.learnable_temperature must be > 0, got {self.learnable_temperature}")
            self.log_temperature = self.param(
                "log_temperature",
                nn.with_logical_partitioning(nn.initializers.constant(jnp.log(self.learnable_temperature)), ()),
                (),
                jnp.float32,
            )
        features = self.projection_dim or self.config.emb_dim
        # Submodules named by the layout's keys (Flax names a module set in setup by its attribute).
        parts = {key: self.tower_class(self.config, name=key) for key in tree.tower_keys()} | {
            key: Projection(features, self.config.param_dtype, self.projection_init, name=key)
            for key in tree.projection_keys()
        }
        lora = self.lora
        if lora is not None:
            factors = lora_lib.factors(self.tower_class, self.config, lora)
            parts |= {
                key: lora_lib.Adapter(factors, lora.rank, lora.scale, self.config.param_dtype, name=key)
                for key in tree.adapter_keys()
            }
        self._parts = parts

    def _towers(self, side: str):
        """The side's tower, projection and its adapter's factors (None without LoRA)."""
        tree = layout(self.architecture)
        tower, projection = tree.side_keys(side)
        adapter = self._parts[tree.adapters[side]]() if self.lora_rank else None
        return functools.partial(self._parts[tower], adapter=adapter), self._parts[projection]

    def _encode(self, tokens: jax.Array, side: str, deterministic: bool) -> jax.Array:
        encoder, projection = self._towers(side)
        if tokens.ndim == 3:  # [B, K, L] hard negatives: fold K into the batch
            b, k, length = tokens.shape
            return self._encode(tokens.reshape(b * k, length), side, deterministic).reshape(b, k, -1)
        pooled = mean_pool(encoder(tokens, deterministic=deterministic), tokens)
        return l2_normalize(projection(pooled))

    def encode_packed(
        self,
        tokens: jax.Array,
        segment_ids: jax.Array,
        side: str,
        num_segments: int,
        deterministic: bool = True,
    ) -> jax.Array:
        """Packed rows (tokens, segment_ids [B, L]; T5X's convention) of one side ->
        embeddings [B, num_segments, P], slot s of row b holding the text with segment id s + 1
        (a slot no text uses: zeros). Each text's embedding is the one it gets unpacked."""
        encoder, projection = self._towers(side)
        hidden = encoder(tokens, deterministic=deterministic, segment_ids=segment_ids)
        return l2_normalize(projection(segment_mean_pool(hidden, segment_ids, num_segments)))

    def encode_queries(self, tokens: jax.Array, deterministic: bool = True) -> jax.Array:
        return self._encode(tokens, "query", deterministic)

    def encode_documents(self, tokens: jax.Array, deterministic: bool = True) -> jax.Array:
        return self._encode(tokens, "document", deterministic)

    def temperature(self) -> jax.Array | None:
        """exp(log_temperature) when learnable, else None (the loss uses its constant)."""
        return jnp.exp(self.log_temperature) if self.learnable_temperature is not None else None

    def __call__(self, queries, documents, negatives=None, deterministic: bool = True):
        q = self.encode_queries(queries, deterministic)
        d = self.encode_documents(documents, deterministic)
        n = None if negatives is None else self.encode_documents(negatives, deterministic)
        return q, d, n


@functools.partial(jax.jit, static_argnums=(0, 2))
def _init(model: DualEncoder, rng: jax.Array, length: int):
    tokens = jnp.ones((1, length), jnp.int32)
    return model.init(rng, tokens, tokens)


def init_params(model: DualEncoder, rng: jax.Array, length: int = 8):
    """Boxed (logically partitioned) parameters of `model`, initialised from `rng`.

    `nn.get_partition_spec(params)` gives logical specs; `nn.unbox(params)` plain arrays.
    Both towers are initialised (a dummy batch of ones is run through both sides); with
    `identical_tower_init` the document tower (and ADE's document projection) is then a copy of
    the query one. Compiled as one program per model (equal models share it), not op by op; inside
    jit or eval_shape it is inlined.
    """
    params = dict(_init(model, rng, length)["params"])
    if model.identical_tower_init:
        tree = layout(model.architecture)
        for q_key, d_key in zip(tree.side_keys("query"), tree.side_keys("document"), strict=True):
            params[d_key] = params[q_key]
    return params
