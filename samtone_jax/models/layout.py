"""Where each architecture keeps its towers and projections in the parameter tree: the one place
that says so. The model, the importers, the exporters, ADORE and inference all ask it.

  sde      {encoder, projection}: both sides read the same tower and projection
  ade      {query_encoder, document_encoder, query_projection, document_projection}
  ade_spl  {query_encoder, document_encoder, projection}: two towers, one shared projection
  ade_lora {encoder, query_adapter, document_adapter, projection}: one frozen tower, one LoRA adapter
           per side, one shared projection (models/lora.py; merged, it is an ade_spl)
  (+ log_temperature [] when the model's temperature is learnable; + adapter with sde under LoRA)

A new architecture (or an adapter beside a tower) is one more entry in LAYOUTS.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from samtone_jax.core.errors import BadValueError

SIDES = ("query", "document")


@dataclasses.dataclass(frozen=True)
class Layout:
    """The tree keys of each side's tower and projection (the same key on both sides: shared)."""

    architecture: str
    towers: dict[str, str]
    projections: dict[str, str]
    # LoRA (DualEncoder.lora_rank > 0): each side's adapter key, and the architecture the adapters
    # merge into (None: this architecture takes no adapters).
    adapters: dict[str, str] | None = None
    merged: str | None = None
    needs_adapters: bool = False

    @property
    def shares_tower(self) -> bool:
        return self.towers["query"] == self.towers["document"]

    @property
    def shares_projection(self) -> bool:
        return self.projections["query"] == self.projections["document"]

    def tower_keys(self) -> tuple[str, ...]:
        """The distinct tower keys, query side first."""
        return tuple(self.towers[s] for s in self.tower_sides())

    def projection_keys(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.projections[s] for s in SIDES))

    def tower_sides(self) -> tuple[str, ...]:
        """One side per distinct tower: ('query',) when both sides share it."""
        return ("query",) if self.shares_tower else SIDES

    def adapter_keys(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.adapters[s] for s in SIDES)) if self.adapters else ()

    def side_keys(self, side: str) -> tuple[str, ...]:
        """The keys `side` reads: (tower, projection)."""
        return self.towers[side], self.projections[side]

    def owned_by(self, side: str) -> tuple[str, ...]:
        """The keys only `side` reads (ADE: its tower and projection; SDE: none)."""
        other = SIDES[1 - SIDES.index(side)]
        return tuple(k for k in self.side_keys(side) if k not in self.side_keys(other))

    def split(self, params) -> tuple[dict, dict]:
        """({side: tower tree}, {side: projection kernel [D, P]}); shared parts appear on both sides."""
        towers = {s: params[self.towers[s]] for s in SIDES}
        kernels = {s: params[self.projections[s]]["kernel"] for s in SIDES}
        return towers, kernels

    def assemble(self, towers: dict, kernels: dict) -> dict:
        """A parameter tree from per-side towers and kernels ({side: ...}). A shared key takes the
        query side's. Keys that differ get their own arrays (numpy copies when both sides passed the
        same object), so two towers that start equal train apart instead of aliasing."""
        params, placed = {}, []
        for side in SIDES:
            for key, value, wrap in (
                (self.towers[side], towers[side], False),
                (self.projections[side], kernels[side], True),
            ):
                if key in params:
                    continue
                if any(value is v for v in placed):
                    value = jax.tree_util.tree_map(np.array, value)
                placed.append(value)
                params[key] = {"kernel": value} if wrap else value
        return params


LAYOUTS = {
    "sde": Layout(
        "sde",
        {"query": "encoder", "document": "encoder"},
        {"query": "projection", "document": "projection"},
        adapters={"query": "adapter", "document": "adapter"},
        merged="sde",
    ),
    "ade": Layout(
        "ade",
        {"query": "query_encoder", "document": "document_encoder"},
        {"query": "query_projection", "document": "document_projection"},
    ),
    "ade_spl": Layout(
        "ade_spl",
        {"query": "query_encoder", "document": "document_encoder"},
        {"query": "projection", "document": "projection"},
    ),
    "ade_lora": Layout(
        "ade_lora",
        {"query": "encoder", "document": "encoder"},
        {"query": "projection", "document": "projection"},
        adapters={"query": "query_adapter", "document": "document_adapter"},
        merged="ade_spl",
        needs_adapters=True,
    ),
}
ARCHITECTURES = tuple(LAYOUTS)
ADAPTER_KEYS = frozenset(k for entry in LAYOUTS.values() for k in entry.adapter_keys())


def layout(architecture: str) -> Layout:
    if architecture not in LAYOUTS:
        raise BadValueError(
            f"DualEncoder.architecture={architecture!r}: must be one of {ARCHITECTURES} "
            "(gin: include one of gin_configs/architectures/*.gin)"
        )
    return LAYOUTS[architecture]
