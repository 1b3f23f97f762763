"""Gin names of earlier releases, read as today's: a run's saved config.gin, a user's gin file and a
`--gin.X=` binding keep working after a setting moved (training/settings.py grouped train.*), and
each use is logged once with the name to write instead.

gin_config.parse reads every gin file (includes too) and binding through `text` / `binding`;
gin_config.read_bindings (how a saved run's settings are read: load, eval, export) through `keys`.
"""

from __future__ import annotations

import logging
import re

log = logging.getLogger(__name__)

# train.* settings grouped by concern: (the previous release's name, today's)
RENAMED = {
    **{
        f"train.{n}": f"schedule.{n}"
        for n in ("checkpoint_every", "keep_checkpoints", "log_every", "eval_every", "on_corrupt_checkpoint")
    },
    **{
        f"train.{n}": f"inputs.{n}"
        for n in (
            "split",
            "num_negatives",
            "teacher_scores",
            "teacher_guide",
            "data_shards",
            "shuffle_block_size",
            "id_masking",
            "task_batches",
        )
    },
    "train.packing": "packing.enabled",
    "train.packing_max_segments": "packing.max_segments",
    "train.packing_row_bits": "packing.row_bits",
    "train.packing_row_sample": "packing.row_sample",
    "train.eval_split": "train_eval.split",
    "train.eval_batches": "train_eval.batches",
    "train.retrieval_eval_task": "train_eval.retrieval_task",
    "train.retrieval_eval_split": "train_eval.retrieval_split",
    **{
        f"train.{n}": f"objective.{n}"
        for n in (
            "contrastive_weight",
            "distillation_weight",
            "matryoshka_dims",
            "matryoshka_weights",
            "quantized_precisions",
            "quantized_weights",
        )
    },
    "train.grad_cache_chunk_size": "step.grad_cache_chunk_size",
    "train.ema_decay": "step.ema_decay",
}

# A binding's selector at a line's start (after an optional gin scope `scope/`), before its `=`.
_SELECTOR = re.compile(r"^(\s*(?:[\w.]+/)?)([A-Za-z_][\w.]*)(\s*=)", re.MULTILINE)
_warned: set[str] = set()


def name(selector: str) -> str:
    """Today's name of a binding's selector (`train.packing` -> `packing.enabled`), else itself."""
    return RENAMED.get(selector, selector)


def _warn(old: str, where: str) -> None:
    if old not in _warned:
        _warned.add(old)
        log.warning("%s: %s is the previous release's name, read as %s (write that instead)", where, old, RENAMED[old])


def text(config: str, where: str = "gin config") -> str:
    """A gin file's text with the previous release's selectors renamed."""

    def renamed(m: re.Match) -> str:
        if m.group(2) not in RENAMED:
            return m.group(0)
        _warn(m.group(2), where)
        return m.group(1) + RENAMED[m.group(2)] + m.group(3)

    return _SELECTOR.sub(renamed, config)


def binding(line: str) -> str:
    """A `--gin.X=` binding with the previous release's selector renamed."""
    return text(line, "binding")


def keys(settings: dict) -> dict:
    """A saved config's {selector: value} (gin_config.read_bindings) under today's names (where a
    config binds a setting under both, today's wins, as a parse's later binding would)."""
    out = {name(k): v for k, v in settings.items() if k in RENAMED}
    return out | {k: v for k, v in settings.items() if k not in RENAMED}
