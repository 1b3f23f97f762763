"""Prompts: text put before every query / document of a task (gin `prompts.*`), saved with the run,
applied at training (tasks/registration.py), by samtone_jax.load / eval / encode, and in an export."""

from __future__ import annotations

import gin

from samtone_jax.core.errors import BadValueError


@gin.configurable
def prompts(query: str = "", document: str = "", per_task: dict | None = None) -> dict:
    """Text put before every query / document (an instruction or prefix, e.g. E5's 'query: '), in
    the pipeline before tokenisation (so counted in the length): `prompts.query`, `prompts.document`
    for every task, `prompts.per_task = {'task': ('query prompt', 'document prompt')}` per task.
    Saved with the run (config.gin), applied by samtone_jax.load / eval / encode, and written into
    an export (sentence-transformers `prompts`)."""
    return {"query": query, "document": document, "per_task": dict(per_task or {})}


def prompt_of(name: str, settings: dict | None = None) -> tuple[str, str]:
    """(query prompt, document prompt) of task `name` (None: the run-wide ones) from gin's `prompts.*`,
    or from a saved run's `settings` (gin_config.read_bindings) when given."""
    if settings is None:
        configured = prompts()
    else:
        configured = {
            "query": settings.get("prompts.query", ""),
            "document": settings.get("prompts.document", ""),
            "per_task": settings.get("prompts.per_task") or {},
        }
    pair = configured["per_task"].get(name) if name else None
    if pair is None:
        return configured["query"], configured["document"]
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
        raise BadValueError(f"prompts.per_task[{name!r}] must be a (query prompt, document prompt) pair; got {pair!r}")
    return tuple(pair)
