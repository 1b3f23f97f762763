"""`samtone average`: weight averages of checkpoints of one architecture (model soups, Wortsman et
al. 2022; checkpoint averaging), streamed: one ingredient's parameters in memory at a time beside the
running sum, each restored alone from its step (orbax partial restore: the optimizer state is never
read), in float32.

  uniform  the mean of every ingredient (a run's last K checkpoints, or several runs' latest)
  weighted Σ w_i · θ_i / Σ w_i (`--weights`): WiSE-FT (Wortsman et al. 2022), the fine-tuned model
           mixed with the model it started from (an import is an ingredient like any other)
  greedy   the ingredients by their own score on a validation task, best first, each added only if
           the soup's score does not drop (Wortsman et al.'s greedy soup)
  wise-ft  a fine-tuned run and its base mixed as α·θ_ft + (1 − α)·θ_base, α picked on a grid: the best
           in-domain validation score among the α whose guard tasks keep at least `min_retention` of
           the base's score (α = 0, the base, always qualifies)

The soup is written as a parameter checkpoint with the first ingredient's config, vocabulary and
prompts: samtone_jax.load, eval, export and INIT_CHECKPOINT read it like an import.

An ingredient is a training step (MODEL_DIR/checkpoints/<step>, or a MODEL_DIR's latest), or a
parameter checkpoint (import-checkpoint, a soup); all must share every parameter's name and shape
(read from the saved metadata): a difference is refused by name before anything is restored;
settings that leave the parameters alone (dropout, remat, dtype) may differ.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from samtone_jax.core import paths, run_folders
from samtone_jax.core.errors import BadValueError


@dataclasses.dataclass(frozen=True)
class Ingredient:
    """One checkpoint to average: where its parameters are."""

    label: str
    params_path: str  # a state tree (train step: …/state, restored at 'params') or a params/ folder
    in_state: bool  # True: params is the 'params' item of a train state
    source: str  # the folder its vocabulary / prompts / lengths come from


def ingredients(checkpoints: list[str], last: int | None = None) -> list[Ingredient]:
    """The ingredients named by `checkpoints` (runs, steps, parameter checkpoints); `last` K with one
    run: that run's last K complete steps."""
    from samtone_jax.checkpoints import reader

    if last is not None:
        if len(checkpoints) != 1 or last < 2:
            raise BadValueError("--last K (K >= 2) averages one run's last K checkpoints: name exactly one run")
        kind, directory, _ = reader.resolve(checkpoints[0])
        steps = run_folders.complete_steps(directory) if kind == "train" else []
        if len(steps) < last:
            raise BadValueError(
                f"{checkpoints[0]} has {len(steps)} complete checkpoints ({steps}), fewer than --last {last} "
                "(schedule.keep_checkpoints keeps how many)"
            )
        checkpoints = [paths.as_str(run_folders.checkpoints(directory) / str(s)) for s in steps[-last:]]
    if len(checkpoints) < 2:
        raise BadValueError(f"an average needs at least 2 checkpoints; got {checkpoints}")
    out = []
    for path in checkpoints:
        kind, directory, step = reader.resolve(path)
        if kind == "train":
            out.append(Ingredient(path, paths.as_str(run_folders.state(directory, step)), True, directory))
        elif kind == "params":
            params = paths.as_str(paths.as_path(directory) / run_folders.PARAMS)
            out.append(Ingredient(path, params, False, directory))
        else:
            raise BadValueError(f"{path} is an export: average the runs or parameter checkpoints it came from")
    _check_same_model(out)
    return out


def _check_same_model(found: list[Ingredient]) -> None:
    """Every ingredient has the first one's parameter names and shapes (saved metadata, nothing
    restored); settings that leave them alone (dropout, remat, scan, dtype) may differ."""
    from samtone_jax.checkpoints.train_checkpoints import first_shape_difference

    bases = {i.label: _base(i) for i in found}  # LoRA: the frozen tower every ingredient adapts
    paths_, fingerprints = {b[0] if b else None for b in bases.values()}, {b[1] for b in bases.values() if b and b[1]}
    if len(paths_) > 1 or len(fingerprints) > 1:
        named = "; ".join(f"{label}: {base[0] if base else 'its own'}" for label, base in bases.items())
        hint = (
            " (a LoRA run and the model it adapts: `samtone export --adapter_scale γ` merges the adapters' update "
            "scaled by γ, WiSE-FT for adapters)"
            if None in paths_
            else ""
        )
        raise BadValueError(
            f"the checkpoints adapt different frozen towers ({named}): average adapters of one base{hint}"
        )
    described = [_description(i) for i in found]
    for other, about in zip(found[1:], described[1:], strict=True):
        differ = [k for k in described[0] if about[k] != described[0][k]]
        if differ:
            what = "; ".join(f"{k}: {described[0][k]} in {found[0].label}, {about[k]} in {other.label}" for k in differ)
            raise BadValueError(
                f"{other.label} and {found[0].label} differ in what the soup would keep of the first only ({what}): "
                "average checkpoints trained with one vocabulary, one set of prompts and one tower family"
            )
    first = _abstract(found[0])
    for other in found[1:]:
        differ = first_shape_difference(first, _abstract(other))
        if differ is not None:
            name, ours, theirs = differ
            raise BadValueError(
                f"{other.label} is another architecture than {found[0].label} (its {name} is {theirs}, "
                f"{ours} there): only checkpoints of one model can be averaged"
            )


def _description(ingredient: Ingredient) -> dict[str, str]:
    """What of an ingredient the soup keeps from the first one only: its tower family, vocabulary
    (the bytes of its vocab.model / tokenizer.json, hashed) and prompts."""
    import hashlib

    from samtone_jax.config import gin_config
    from samtone_jax.tasks.prompts import prompt_of

    text = _config_text(ingredient)
    settings = gin_config.read_bindings(text)
    root = paths.as_path(ingredient.source)
    vocabulary = "none"
    for name in (run_folders.VOCABULARY, run_folders.TOKENIZER):
        if (root / name).exists():
            vocabulary = f"{name} sha256 {hashlib.sha256((root / name).read_bytes()).hexdigest()[:12]}"
            break
    query, document = prompt_of(settings.get("train.task"), settings)
    per_task = settings.get("prompts.per_task") or {}
    return {
        "tower family": type(gin_config.model_from_gin_text(text).config).__name__,
        "vocabulary": vocabulary,
        "prompts": repr((query, document, sorted(per_task.items()))),
    }


def _base(ingredient: Ingredient) -> tuple[str, str | None] | None:
    """(path, fingerprint or None) of the frozen tower a LoRA ingredient's base.json names (None: it
    holds all its parameters)."""
    import json

    reference = paths.as_path(ingredient.source) / run_folders.BASE
    if not reference.exists():
        return None
    try:
        record = json.loads(reference.read_text())
        return paths.as_str(record["path"]), record.get("fingerprint")
    except (ValueError, KeyError, TypeError) as e:
        raise BadValueError(
            f"{reference} is damaged ({e}): it should be {{'path': <the frozen tower's checkpoint>}}"
        ) from None


def _abstract(ingredient: Ingredient):
    """The saved parameter tree's shapes and dtypes (metadata only)."""
    from samtone_jax.checkpoints.train_checkpoints import saved_tree

    tree = saved_tree(ingredient.params_path)
    if tree is None:
        raise BadValueError(
            f"{ingredient.params_path}: its metadata cannot be read (an incomplete or damaged checkpoint)"
        )
    return tree["params"] if ingredient.in_state else tree


def restore_params(ingredient: Ingredient, shardings=None):
    """The ingredient's parameters in float32, nothing else read: numpy on this host, or with
    `shardings` (a tree of NamedShardings, `sharded`) each process reading only its own shards,
    onto its devices."""
    import orbax.checkpoint as ocp

    shapes = _abstract(ingredient)
    if shardings is None:
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        shardings = jax.tree_util.tree_map(lambda _: device, shapes)
        on_host = True
    else:
        on_host = False
    target = jax.tree_util.tree_map(lambda m, s: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=s), shapes, shardings)
    if ingredient.in_state:
        target = {"params": target}
    restore_args = jax.tree_util.tree_map(lambda t: ocp.ArrayRestoreArgs(sharding=t.sharding), target)
    restored = ocp.PyTreeCheckpointer().restore(
        paths.as_path(ingredient.params_path),
        args=ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True),
    )
    params = restored["params"] if ingredient.in_state else restored
    if on_host:
        return jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), params)
    return jax.tree_util.tree_map(lambda x: x.astype(np.float32), params)


def sharded(found: list[Ingredient], mesh):
    """Shardings of the ingredients' parameters over `mesh`, every parameter's embed dimension split
    over the devices (FSDP's layout): on a pod each host holds 1 / hosts of each tree."""
    from samtone_jax.config import gin_config
    from samtone_jax.models import init_params, partitioning

    model = gin_config.model_from_gin_text(_config_text(found[0]))
    boxed = jax.eval_shape(lambda: init_params(model, jax.random.PRNGKey(0)))
    every = partitioning.param_shardings(mesh, boxed, partitioning.FSDP_RULES)
    return {k: every[k] for k in _abstract(found[0])}  # a LoRA run's: what it trains


class RunningSum:
    """Σ of parameter trees of one shape (ingredients() checked them) added one at a time (float32,
    in place); `mean()` the average so far."""

    def __init__(self):
        self.total, self.count = None, 0.0

    def add(self, params, weight: float = 1.0) -> None:
        on_host = isinstance(jax.tree_util.tree_leaves(params)[0], np.ndarray)
        w = np.float32(weight)
        if self.total is None:
            self.total = jax.tree_util.tree_map(lambda p: np.array(p * w), params) if on_host else _scale(params, w)
        elif on_host:
            jax.tree_util.tree_map(lambda t, p: np.add(t, p * w, out=t), self.total, params)
        else:  # sharded on devices: summed where each shard lives
            self.total = _add(self.total, params, w)
        self.count += float(weight)

    def mean(self, plus=None):
        """The average so far (with `plus`, one more tree, without adding it)."""
        n = self.count + (plus is not None)
        if plus is None:
            return jax.tree_util.tree_map(lambda t: t / n, self.total)
        return jax.tree_util.tree_map(lambda t, p: (t + p) / n, self.total, plus)


@jax.jit
def _add(total, params, weight):
    return jax.tree_util.tree_map(lambda t, p: t + p * weight, total, params)


@jax.jit
def _scale(params, weight):
    return jax.tree_util.tree_map(lambda p: p * weight, params)


def check_weights(weights, found: list[Ingredient]) -> tuple[float, ...]:
    """The mixing weights of `--weights`: one non-negative number an ingredient, not all 0."""
    if len(weights) != len(found):
        raise BadValueError(f"--weights gives {len(weights)} weights for {len(found)} checkpoints: one each")
    if any(w < 0 for w in weights) or not sum(weights):
        raise BadValueError(f"--weights {' '.join(map(str, weights))}: non-negative, and not all 0")
    return tuple(float(w) for w in weights)


def uniform(found: list[Ingredient], mesh=None, weights: tuple[float, ...] | None = None):
    """The average of every ingredient's parameters (weighted by `weights`, normalised to sum 1), one
    restored at a time: on this host, or with `mesh` sharded over its devices (every process its shards)."""
    shardings = None if mesh is None else sharded(found, mesh)
    running = RunningSum()
    for ingredient, weight in zip(found, weights or [1.0] * len(found), strict=True):
        if weight:
            running.add(restore_params(ingredient, shardings), weight)
    return running.mean()


def greedy(found: list[Ingredient], score) -> tuple[object, list[str], dict[str, float]]:
    """(soup parameters, the labels kept, {label or 'soup': score}): `score(params)` higher is better."""
    alone = {}
    for ingredient in found:  # each ingredient's own score, one restored at a time
        alone[ingredient.label] = score(restore_params(ingredient))
    order = sorted(found, key=lambda i: -alone[i.label])
    running, kept = RunningSum(), [order[0].label]
    running.add(restore_params(order[0]))
    best = alone[order[0].label]
    for ingredient in order[1:]:
        params = restore_params(ingredient)
        value = score(running.mean(plus=params))
        if value >= best:
            running.add(params)
            kept.append(ingredient.label)
            best = value
    return running.mean(), kept, {**alone, "soup": best}


DEFAULT_GRID = tuple(round(0.1 * i, 1) for i in range(11))


@dataclasses.dataclass(frozen=True)
class Mix:
    """One α of a WiSE-FT grid: the validation score and each guard's score and retention."""

    alpha: float
    score: float
    guards: dict[str, float]
    retention: dict[str, float]
    allowed: bool


def wise_ft(found: list[Ingredient], score, guard_scores: dict, grid, min_retention: float):
    """(parameters, the picked Mix, every Mix): found = [fine-tuned, base]; `score(params)` and each
    `guard_scores[name](params)` higher is better; the picked α has the best score among those whose
    every guard keeps ≥ min_retention of α = 0's (ties: the smaller α, nearer the base)."""
    if len(found) != 2:
        raise BadValueError(f"WiSE-FT mixes 2 checkpoints (the fine-tuned run, then its base); got {len(found)}")
    grid = sorted({0.0, *(float(a) for a in grid)})
    if not (0 <= grid[0] and grid[-1] <= 1):  # NaN fails too
        raise BadValueError(f"--grid {' '.join(f'{a:g}' for a in grid)}: each α in [0, 1]")
    tuned, base = (restore_params(i) for i in found)
    mixes, at_base = [], {}
    for alpha in grid:
        params = jax.tree_util.tree_map(lambda t, b, a=alpha: np.float32(a) * t + np.float32(1 - a) * b, tuned, base)
        guards = {name: guard(params) for name, guard in guard_scores.items()}
        if not at_base:  # α = 0 comes first: the base's scores, each retention's denominator
            at_base = guards
            unusable = [name for name, v in guards.items() if not v > 0]
            if unusable:
                raise BadValueError(
                    f"WiSE-FT's guard {', '.join(unusable)}: the base scores {[guards[n] for n in unusable]} there, "
                    "so no retention can be measured; choose another guard task or sample"
                )
        retention = {name: v / at_base[name] for name, v in guards.items()}
        allowed = all(r >= min_retention for r in retention.values())
        mixes.append(Mix(alpha, score(params), guards, retention, allowed))
    picked = max((m for m in mixes if m.allowed), key=lambda m: (m.score, -m.alpha))
    params = jax.tree_util.tree_map(
        lambda t, b: np.float32(picked.alpha) * t + np.float32(1 - picked.alpha) * b, tuned, base
    )
    return params, picked, mixes


def validation_score(first: str, task: str, collection, args, max_queries=None, candidates=None):
    """(params -> the validation measure of the model of checkpoint `first` with those parameters,
    the measure's name) on an even sample of `collection` (args: measure, max_queries, candidates;
    `max_queries` / `candidates` given here instead: a guard's sample)."""
    from samtone_jax.evaluation import metrics, run
    from samtone_jax.inference import encoder as inference

    wanted = args.measure or "RR"
    measure = next((m for m in metrics.DEFAULT_MEASURES if str(m) == wanted), None)
    if measure is None:
        raise BadValueError(f"--measure {wanted!r}: choose one of {', '.join(map(str, metrics.DEFAULT_MEASURES))}")
    queries = max_queries if max_queries is not None else args.max_queries or 2000
    collection = collection.sample(queries, candidates if candidates is not None else args.candidates)
    if not collection.queries or not collection.qrels:
        raise BadValueError(f"{task}: no judged queries to score a soup on (an empty split or sample)")
    base = inference.load_encoder(first, task=task)

    def score(params) -> float:
        found = run.dense_run(base.with_params(params), collection.queries, collection.corpus, k=100)
        return metrics.evaluate(collection.qrels, found, [measure])[str(measure)]

    return score, str(measure)


def _config_text(ingredient: Ingredient) -> str:
    """The ingredient's gin config: its run's config.gin, or its parameter checkpoint's model.gin."""
    from samtone_jax.checkpoints.params_io import load_model_gin

    if ingredient.in_state:
        return (paths.as_path(ingredient.source) / run_folders.CONFIG_GIN).read_text()
    return load_model_gin(ingredient.source)


def write(out: str, params, found: list[Ingredient], info: dict, overwrite: bool = False) -> str:
    """The soup as a parameter checkpoint: the first ingredient's config (lengths, prompts, model) and
    vocabulary, `info` (what was averaged, how) in info.json. Parameters sharded over devices are
    written by every process, its shards (params_io.save_sharded_params)."""
    from samtone_jax.checkpoints import save_params
    from samtone_jax.checkpoints.params_io import save_sharded_params

    first = found[0]
    root = paths.as_path(first.source)
    text = _config_text(first)
    extra = {}
    for name in (run_folders.VOCABULARY, run_folders.TOKENIZER, run_folders.BASE):  # + a LoRA soup's base
        if (root / name).exists():
            extra[name] = (root / name).read_bytes()
    on_host = isinstance(jax.tree_util.tree_leaves(params)[0], np.ndarray)
    save = save_params if on_host else save_sharded_params
    return save(out, params, text, info, overwrite=overwrite, extra_files=extra)
