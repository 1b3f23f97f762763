"""`samtone compare`: paired significance tests between `samtone eval` runs on the same task split.

Each eval JSON holds per-query scores ("per_query": {measure: {query id: score}}); two runs are
compared query by query with a two-sided paired randomization (sign-flip) test (Smucker, Allan and
Carterette, CIKM 2007) or a paired studentized bootstrap test (Sakai, SIGIR 2006). No correction
for multiple comparisons is made: with many runs x measures, some p < 0.05 are expected by chance.
"""

from __future__ import annotations

import json

import numpy as np

from samtone_jax.core import paths as path_layer
from samtone_jax.core.errors import BadValueError, MissingFileError

# Random draws are made in (chunk x queries) blocks of about this many elements (32 MiB as float64),
# so 10k queries x 10k trials never needs the full matrix.
_BLOCK_ELEMENTS = 1 << 22


def _chunks(total: int, width: int):
    size = max(1, _BLOCK_ELEMENTS // max(width, 1))
    for start in range(0, total, size):
        yield min(size, total - start)


def _differences(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape or a.size == 0:
        raise BadValueError(
            f"need two non-empty per-query score vectors of equal shape [Q], got {a.shape} and {b.shape}"
        )
    return a - b


def paired_randomization_test(a: np.ndarray, b: np.ndarray, trials: int = 10000, seed: int = 0) -> float:
    """Two-sided p-value that runs a and b (scores [Q], same query order) have the same mean.

    Under the null either run could have produced either score of a query, so the per-query
    differences d = a - b get independent random signs; p = (count + 1) / (trials + 1) with count
    the trials where |sum(s * d)| >= |sum(d)| (the +1 counts the observed assignment, so p > 0).
    """
    d = _differences(a, b)
    observed = abs(d.sum())
    # Ties are common with discrete measures (P@1 differences are -1, 0 or 1); summation order
    # must not turn an exact tie into a miss.
    tol = 1e-9 * np.abs(d).sum()
    rng = np.random.default_rng(seed)
    count = 0
    for n in _chunks(trials, d.size):
        signs = rng.integers(0, 2, size=(n, d.size), dtype=np.int8) * np.int8(2) - np.int8(1)
        count += int(np.count_nonzero(np.abs(signs @ d) >= observed - tol))
    return (count + 1) / (trials + 1)


def _abs_t(x: np.ndarray, scale: float) -> np.ndarray:
    """|mean| / (sd / sqrt(Q)) of each row of x [N, Q]: 0 for a zero mean, inf for a nonzero mean with sd 0."""
    mean, sd = np.abs(x.mean(axis=-1)), x.std(axis=-1, ddof=1)
    zero_mean, zero_sd = mean <= 1e-12 * scale, sd <= 1e-12 * scale
    with np.errstate(divide="ignore", invalid="ignore"):
        t = mean / (sd / np.sqrt(x.shape[-1]))
    return np.where(zero_mean, 0.0, np.where(zero_sd, np.inf, t))


def paired_bootstrap_test(a: np.ndarray, b: np.ndarray, samples: int = 10000, seed: int = 0) -> float:
    """Two-sided paired bootstrap p-value that runs a and b (scores [Q], Q >= 2) have the same mean.

    Definition (Sakai 2006; Efron and Tibshirani 1993, alg. 16.2): d = a - b, t(x) = |mean(x)| /
    (sd(x, ddof=1) / sqrt(Q)). The null is imposed by shifting z = d - mean(d); each sample draws
    Q queries of z with replacement, and p = (count + 1) / (samples + 1) with count the samples
    whose t is >= t(d). A zero mean counts as t = 0 and a nonzero mean with zero sd as t = inf.
    """
    d = _differences(a, b)
    if d.size < 2:
        raise BadValueError("the bootstrap test needs at least 2 queries")
    scale = float(np.abs(d).max())
    if scale == 0.0:
        return 1.0
    observed = _abs_t(d[None], scale)[0]
    z = d - d.mean()
    rng = np.random.default_rng(seed)
    count = 0
    for n in _chunks(samples, d.size):
        t = _abs_t(z[rng.integers(0, d.size, size=(n, d.size))], scale)
        count += int(np.count_nonzero(t >= observed * (1 - 1e-9)))
    return (count + 1) / (samples + 1)


TESTS = {"randomization": paired_randomization_test, "bootstrap": paired_bootstrap_test}


def load_eval(path: str) -> dict:
    """One `samtone eval` JSON (with its "per_query" scores), with errors that name the file."""
    file = path_layer.as_path(path)
    if not file.is_file():
        raise MissingFileError(f"eval file not found: {file}")
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise BadValueError(f"{path} is not valid JSON ({e}); expected a `samtone eval` result") from None
    if not isinstance(data, dict) or not isinstance(data.get("per_query"), dict):
        raise BadValueError(
            f"{path} has no per-query scores ('per_query'): it was written by an older samtone eval; "
            "rerun `samtone eval` to get them"
        )
    return data


def short_labels(files: list[str]) -> list[str]:
    """The paths (local or gs://) with their common leading folders removed (the file name is kept)."""
    parts = [path_layer.as_str(f).split("/") for f in files]
    common = 0
    while all(len(p) > common + 1 and p[common] == parts[0][common] for p in parts):
        common += 1
    return ["/".join(p[common:]) for p in parts]


def _query_ids(measure: str, runs: list[dict], labels: list[str], baseline: int, allow_partial: bool) -> list[str]:
    base = set(runs[baseline]["per_query"][measure])
    shared = base.intersection(*(r["per_query"][measure] for r in runs))
    for label, run in zip(labels, runs, strict=True):
        own = set(run["per_query"][measure])
        if own != base and not allow_partial:
            raise BadValueError(
                f"{label} and the baseline {labels[baseline]} scored different queries for {measure}: "
                f"{len(own - base)} only in {label}, {len(base - own)} only in the baseline; pass "
                f"allow_partial=True to compare on the {len(shared)} queries all runs share"
            )
    if not shared:
        raise BadValueError(f"the runs share no query scored for {measure}")
    return sorted(shared)


def compare(
    paths: list[str],
    measures: list[str] | None = None,
    test: str = "randomization",
    trials: int = 10000,
    seed: int = 0,
    baseline: int = 0,
    allow_partial: bool = False,
) -> dict:
    """Every run in `paths` against paths[baseline], per measure (default: all the runs share).

    Returns {"task", "split", "test", "trials", "seed", "baseline" (index), "labels" [R], "paths" [R],
    "queries" {measure: Q}, "measures" {measure: [R cells]}}; a cell is {"mean"} for the baseline and
    {"mean", "diff" (mean - baseline mean), "p"} for the others, all over the same Q queries.
    """
    if test not in TESTS:
        raise BadValueError(f"unknown test {test!r}; available: {', '.join(TESTS)}")
    if len(paths) < 2:
        raise BadValueError("compare needs at least two eval files")
    if not 0 <= baseline < len(paths):
        raise BadValueError(f"baseline index {baseline} is out of range for {len(paths)} files")
    runs = [load_eval(p) for p in paths]
    keys = [(r.get("task"), r.get("split")) for r in runs]
    if len(set(keys)) > 1:
        found = ", ".join(f"{p}: {t}/{s}" for p, (t, s) in zip(paths, keys, strict=True))
        raise BadValueError(f"the eval files are for different task/split pairs ({found}); compare runs of one split")
    available = [m for m in runs[baseline]["per_query"] if all(m in r["per_query"] for r in runs)]
    measures = list(available if measures is None else measures)
    unknown = [m for m in measures if m not in available]
    if unknown or not measures:
        raise BadValueError(f"unknown measure(s) {unknown}; available in all files: {', '.join(available)}")
    labels = short_labels(paths)
    result = {
        "task": keys[0][0],
        "split": keys[0][1],
        "test": test,
        "trials": trials,
        "seed": seed,
        "baseline": baseline,
        "labels": labels,
        "paths": list(paths),
        "queries": {},
        "measures": {},
    }
    for m in measures:
        qids = _query_ids(m, runs, labels, baseline, allow_partial)
        scores = [np.array([float(r["per_query"][m][q]) for q in qids]) for r in runs]
        cells = []
        for i, x in enumerate(scores):
            cell = {"mean": float(x.mean())}
            if i != baseline:
                cell["diff"] = float(x.mean() - scores[baseline].mean())
                cell["p"] = TESTS[test](x, scores[baseline], trials, seed)
            cells.append(cell)
        result["queries"][m], result["measures"][m] = len(qids), cells
    return result


def _cell_text(cell: dict) -> str:
    if "p" not in cell:
        return f"{cell['mean']:.4f}"
    p = "p<0.001" if cell["p"] < 0.001 else f"p={cell['p']:.3f}"
    return f"{cell['mean']:.4f} ({cell['diff']:+.4f}, {p}){'*' if cell['p'] < 0.05 else ' '}"


def format_table(result: dict) -> str:
    """compare()'s result as a plain-text table: one row per measure, one column per run."""
    labels = [label + (" (baseline)" if i == result["baseline"] else "") for i, label in enumerate(result["labels"])]
    rows = [["measure", *labels]]
    rows += [[m, *(_cell_text(c) for c in cells)] for m, cells in result["measures"].items()]
    widths = [max(len(row[j]) for row in rows) for j in range(len(rows[0]))]
    lines = ["  ".join(text.ljust(w) for text, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    counts = sorted(set(result["queries"].values()))
    queries = "/".join(f"{n:,}" for n in counts)
    lines.insert(0, f"{result['task']}/{result['split']}: {queries} queries; mean (difference from baseline, p-value)")
    lines.append(
        f"* p < 0.05, two-sided paired {result['test']} test against the baseline "
        f"({result['trials']:,} {'trials' if result['test'] == 'randomization' else 'samples'}, seed {result['seed']})"
    )
    return "\n".join(lines)
