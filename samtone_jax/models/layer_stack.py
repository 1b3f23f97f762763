"""A tower's encoder layers, applied one after another: unrolled (each `layers_<i>` its own module),
rematerialised (jax.checkpoint per layer) and / or as one lax.scan over their stacked parameters.
T5 and BERT towers share it; the parameter tree keeps its layers_<i> layout in every mode, so
importers, exporters and checkpoints do not depend on how the layers run."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp


def apply_layers(tower: nn.Module, layer_cls, config, x, bias, deterministic: bool, adapter=None):
    """x -> layers_{num_layers - 1}(... layers_0(x, bias, deterministic)). `tower` is the calling
    module (compact), `layer_cls(config, name=...)` one layer; `config.remat` / `config.scan_layers`
    choose how they run (same outputs and gradients; with scan, dropout masks are drawn per layer
    from fold_in(key, layer)). `adapter`: a LoRA adapter's tree ({layers_<i>: ...}), each layer
    given its own part."""
    if config.scan_layers and not tower.is_initializing():
        return _scanned(tower, layer_cls, config, x, bias, deterministic, adapter)
    layer = nn.remat(layer_cls, static_argnums=(3,)) if config.remat else layer_cls
    for i in range(config.num_layers):
        part = None if adapter is None else adapter.get(f"layers_{i}")
        x = layer(config, name=f"layers_{i}", parent=tower)(x, bias, deterministic, part)
    return x


def _scanned(tower: nn.Module, layer_cls, config, x, bias, deterministic: bool, adapter=None):
    """The layers_<i> as one lax.scan: their parameters stacked on a leading axis (a cheap copy,
    sharded like the parameters), one layer applied per iteration. Under FSDP one layer's gathered
    weights are live at a time; compile time no longer grows with depth."""
    params = tower.variables["params"]

    def stack(tree):
        return jax.tree_util.tree_map(lambda *p: jnp.stack(p), *[tree[f"layers_{i}"] for i in range(config.num_layers)])

    stacked = stack(params)
    adapters = None if adapter is None else stack(adapter)  # every layer adapted alike (models/lora.factors)
    key = None if deterministic or not has_dropout(config) else tower.make_rng("dropout")
    layer = layer_cls(config, parent=None)

    def body(x, inputs):
        layer_params, layer_adapter, index = inputs
        rngs = {} if key is None else {"dropout": jax.random.fold_in(key, index)}
        return layer.apply({"params": layer_params}, x, bias, deterministic, layer_adapter, rngs=rngs), None

    if config.remat:
        body = jax.checkpoint(body)
    x, _ = jax.lax.scan(body, x, (stacked, adapters, jnp.arange(config.num_layers)))
    return x


def has_dropout(config) -> bool:
    """Whether any dropout of `config` is on: any of its *dropout_rate fields (T5: dropout_rate; BERT:
    also attention_dropout_rate; ModernBERT: also mlp_dropout_rate)."""
    return any(getattr(config, f.name) for f in dataclasses.fields(config) if f.name.endswith("dropout_rate"))
