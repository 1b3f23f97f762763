"""The general-retrieval guard: what fine-tuning costs the model everywhere else.

A fine-tune that doubles its in-domain P@1 can lose a quarter of its retrieval quality on data it
did not train on. The guard measures that while training: retrieval metrics on tasks the run does not
train on (gin `guard.tasks`, `samtone train --guard`), at the model's serving lengths, on a fixed
sample (`guard.max_queries` queries ranked among `guard.candidates` documents, gold ones kept). The
starting model's scores are measured once, before the first step, and kept in MODEL_DIR/guard.json
(and in the user's cache, keyed by the content they depend on: the starting weights, the model, the
sample's tokens and relevance, the settings and the backend, so another run from the same weights and
guard, a rerun of the demo or of `samtone finetune` into a new --out, reads them instead of encoding
the guard's texts again before its first step); every in-training evaluation and the end of the run
log `guard/<task>/<measure>` and `guard/<task>/retention` (the score ÷ the starting model's), and the
run's last line says them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
from collections.abc import Callable

import gin
import jax

from samtone_jax.core import paths, run_folders
from samtone_jax.core.atomic_file import write_atomic
from samtone_jax.core.errors import BadValueError

log = logging.getLogger(__name__)
# Starting weights larger than this (a T5.1.1 XL's 3 B parameters and up) are not hashed for the cache
# of starting scores: they are measured again, as before the cache.
MAX_HASHED_BYTES = 4 << 30


@functools.cache
def _code_digest() -> str:
    """The sha256 of the package's source: any change to the code that scores (towers, pooling,
    search, metrics) makes the cached starting scores another key's."""
    digest = hashlib.sha256()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for folder, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(f for f in files if f.endswith(".py")):
            with open(os.path.join(folder, name), "rb") as f:
                digest.update(name.encode() + f.read())
    return digest.hexdigest()


@gin.configurable("guard")
@dataclasses.dataclass(frozen=True)
class GuardSettings:
    """gin `guard.*`: the tasks the run is guarded on, the measure whose retention is reported, and
    the size of the fixed evaluation sample."""

    tasks: tuple[str, ...] = ()
    measure: str = "RR"
    max_queries: int = 500
    candidates: int = 5000

    def __post_init__(self):
        if isinstance(self.tasks, str):
            object.__setattr__(self, "tasks", (self.tasks,))
        if self.max_queries < 1 or self.candidates < 1:
            raise BadValueError(f"guard.max_queries ({self.max_queries}) and guard.candidates must be ≥ 1")


def guard_split(task: str) -> str:
    """The split a guard task is scored on: test, else dev, else all, else its last."""
    from samtone_jax.tasks import catalogue

    if task not in catalogue.loaders():
        raise BadValueError(
            f"guard.tasks: unknown task {task!r}; registered tasks: {', '.join(catalogue.task_names())}"
        )
    splits = catalogue.loaders()[task][1]
    return next((s for s in ("test", "dev", "all") if s in splits), splits[-1])


def for_run(
    settings: GuardSettings | None, training_task: str, model, mesh, vocabulary: str | None, lengths: tuple[int, int]
) -> Guard | None:
    """A run's guard at the lengths the model is served at (serving_lengths.current over the training
    `lengths`), or None when no guard task is set."""
    if settings is None or not settings.tasks:
        return None
    from samtone_jax.data import vocab as vocab_lib
    from samtone_jax.inference import serving_lengths

    served = serving_lengths.current(lengths)
    return Guard(settings, training_task, model, mesh, vocab_lib.tokens(vocabulary), served)


class Guard:
    """params -> {'guard/<task>/<measure>': ..., 'guard/<task>/retention': ...} on each guard task."""

    def __init__(self, settings: GuardSettings, training_task: str, model, mesh, vocabulary, lengths: tuple[int, int]):
        from samtone_jax.evaluation.train_hook import RetrievalEval

        if training_task in settings.tasks:
            raise BadValueError(
                f"guard.tasks names {training_task!r}, the task the run trains on: a guard measures what the model "
                "keeps elsewhere; name tasks it does not train on"
            )
        self.settings, self.measure = settings, settings.measure
        self.model_text = repr(model)  # the module and its config: part of the starting scores' cache key
        self.evals = {
            task: RetrievalEval(
                model,
                mesh,
                vocabulary,
                task,
                guard_split(task),
                *lengths,
                max_queries=settings.max_queries,
                candidates=settings.candidates,
                prefix=f"guard/{task}",
            )
            for task in settings.tasks
        }
        self.baseline: dict[str, float] | None = None
        self.last: dict[str, float] = {}  # the latest scores (the run's summary)
        for evaluator in self.evals.values():
            names = sorted(str(m) for m in evaluator.measures)
            if self.measure not in names:
                raise BadValueError(f"guard.measure={self.measure!r} is not one of {names}")

    def scores(self, params) -> dict[str, float]:
        return {k: v for evaluator in self.evals.values() for k, v in evaluator(params).items()}

    def start(self, starting_params: Callable[[], dict], model_dir: str) -> None:
        """The starting model's scores: MODEL_DIR/guard.json's when a run recorded them, else measured
        now on `starting_params()` (the parameters training starts from; only called then) and written there."""
        path = paths.as_path(model_dir) / run_folders.GUARD
        if path.exists():
            recorded = json.loads(path.read_text())
            if recorded.get("measure") == self.measure and set(recorded.get("baseline", {})) >= set(self.evals):
                self.baseline = {t: recorded["baseline"][t] for t in self.evals}
                return
        params = starting_params()
        cached = self._cache_path(params)
        if cached is not None and os.path.exists(cached):
            with open(cached) as f:
                self.baseline = json.load(f)["baseline"]
            log.info("guard: the starting model's %s (recorded in %s): %s", self.measure, cached, self.baseline)
        else:
            scores = self.scores(params)
            self.baseline = {task: scores[f"guard/{task}/{self.measure}"] for task in self.evals}
            log.info("guard: the starting model's %s: %s", self.measure, self.baseline)
        if jax.process_index() == 0:
            record = {"measure": self.measure, "baseline": self.baseline, "settings": dataclasses.asdict(self.settings)}
            write_atomic(path, json.dumps(record, indent=1))
            if cached is not None and not os.path.exists(cached):
                os.makedirs(os.path.dirname(cached), exist_ok=True)
                write_atomic(cached, json.dumps(record, indent=1))

    def _cache_path(self, params) -> str | None:
        """Where the starting scores of `params` on this guard are cached: a file named by the sha256 of
        everything they depend on (the package's code and jax's version too); None on several hosts
        or for weights over MAX_HASHED_BYTES (measured each time)."""
        from samtone_jax.checkpoints import pretrained

        leaves = jax.tree_util.tree_flatten_with_path(params)[0]
        if jax.process_count() > 1 or sum(leaf.size * leaf.dtype.itemsize for _, leaf in leaves) > MAX_HASHED_BYTES:
            return None
        import numpy as np

        digest = hashlib.sha256()
        code = (_code_digest(), jax.__version__, jax.default_backend())
        for part in (*code, self.model_text, json.dumps(dataclasses.asdict(self.settings))):
            digest.update(part.encode() + b"\0")
        for key, leaf in leaves:
            value = np.asarray(jax.device_get(leaf))
            digest.update(f"{jax.tree_util.keystr(key)} {value.dtype} {value.shape}".encode())
            digest.update(np.ascontiguousarray(value).tobytes())
        for task in sorted(self.evals):
            evaluator = self.evals[task]
            digest.update(f"{task} {evaluator.name} {evaluator.k}".encode())
            for tokens in (evaluator.query_tokens, evaluator.doc_tokens):
                digest.update(f"{tokens.dtype} {tokens.shape}".encode() + np.ascontiguousarray(tokens).tobytes())
            relevance = [evaluator.query_ids, evaluator.doc_ids, sorted(map(str, evaluator.measures))]
            relevance.append({q: sorted(evaluator.qrels[q].items()) for q in evaluator.query_ids})
            digest.update(json.dumps(relevance, sort_keys=True, default=str).encode())
        return os.path.join(pretrained.cache_dir(), "guard_baselines", f"{digest.hexdigest()}.json")

    def __call__(self, params) -> dict[str, float]:
        metrics = self.scores(params)
        for task, base in (self.baseline or {}).items():
            metrics[f"guard/{task}/retention"] = (
                metrics[f"guard/{task}/{self.measure}"] / base if base else float("nan")
            )
        return metrics

    def around(self, evaluate, params_of):
        """The in-training evaluation `evaluate(state)` (None: none) with the guard's metrics beside it;
        `params_of(state)` gives the parameters to score."""

        def evaluated(state):
            metrics = dict(evaluate(state)) if evaluate is not None else {}
            self.last = self(params_of(state))
            return metrics | self.last

        return evaluated

    def finish(self, params, evaluated: bool) -> dict[str, float]:
        """The end of the run: the last step's scores (measured now unless its evaluation just did),
        logged as one line a task."""
        if not evaluated:
            self.last = self(params)
        log.info("%s", self.summary(self.last))
        return self.last

    def summary(self, metrics: dict[str, float]) -> str:
        """One line per guard task: the score, the starting model's, the retention."""
        lines = []
        for task, base in (self.baseline or {}).items():
            now = metrics.get(f"guard/{task}/{self.measure}")
            if now is not None:
                kept = metrics[f"guard/{task}/retention"]
                lines.append(f"guard {task}: {self.measure} {now:.4f} (start {base:.4f}), retention {kept:.1%}")
        return "\n".join(lines)
