"""Paired significance tests against exact enumeration, scipy and the t-test, and `compare` on
hand-written eval files (table numbers, error messages)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import scipy.stats

from samtone_jax.evaluation import significance as sig


def exact_sign_flip_p(d):
    """The randomization p-value over all 2^n sign assignments (the observed one included)."""
    observed = abs(sum(d))
    flips = [
        abs(sum(s * x for s, x in zip(signs, d, strict=True))) for signs in itertools.product((1, -1), repeat=len(d))
    ]
    return sum(f >= observed - 1e-9 for f in flips) / len(flips)


@pytest.mark.parametrize(
    "d",
    [
        [0.9, -0.2, 0.4, 0.35, -0.1, 0.6, 0.05, -0.3, 0.5, 0.2],  # continuous, p ~ 0.1
        [1, 1, 0, 1, -1, 1, 0, 1, 1, -1],  # P@1-like: many exact ties
        [0.5, 0.5, -0.5, 1.0, 0.25, 0.5, -0.25, 0.0, 0.75, 0.5],  # RR-like
    ],
)
def test_randomization_matches_exact_enumeration_and_scipy(d):
    rng = np.random.default_rng(1)
    b = rng.uniform(size=len(d))
    a = b + np.asarray(d, dtype=float)
    exact = exact_sign_flip_p(d)
    p = sig.paired_randomization_test(a, b, trials=20000, seed=3)
    assert abs(p - exact) < 0.02  # Monte-Carlo standard error <= 0.0036
    # With 2^10 < n_resamples scipy enumerates all sign flips exactly too.
    ref = scipy.stats.permutation_test(
        (a, b),
        lambda x, y, axis: np.mean(x - y, axis=axis),
        permutation_type="samples",
        vectorized=True,
        n_resamples=100000,
        alternative="two-sided",
    )
    assert ref.pvalue == pytest.approx(exact, abs=1e-9)


@pytest.mark.parametrize("test", [sig.paired_randomization_test, sig.paired_bootstrap_test])
def test_identical_runs_give_one_and_a_clearly_better_run_a_small_p(test):
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.6, size=200)
    assert test(base, base.copy()) >= 0.99
    better = np.clip(base + 0.3 + rng.normal(0, 0.2, size=200), 0, 1)
    assert test(better, base) < 0.01
    assert test(base, better) < 0.01


@pytest.mark.parametrize("t", [1.7, 2.0, 2.6])
def test_bootstrap_and_randomization_match_paired_t_test_under_a_normal_shift(t):
    # Normal differences rescaled to a t statistic of exactly t: the t-test p is about 0.09, 0.046
    # and 0.0098, where a miscalibrated test (no null shift, no studentization) would be far off.
    rng = np.random.default_rng(round(10 * t))
    noise = rng.normal(size=300)
    noise = (noise - noise.mean()) / noise.std(ddof=1) * 0.2
    b = rng.uniform(0.2, 0.8, size=300)
    a = b + noise + t * 0.2 / np.sqrt(300)
    t_p = scipy.stats.ttest_rel(a, b).pvalue
    assert scipy.stats.ttest_rel(a, b).statistic == pytest.approx(t)
    assert sig.paired_bootstrap_test(a, b, samples=20000) == pytest.approx(t_p, abs=0.02 * max(t_p / 0.05, 0.25))
    assert sig.paired_randomization_test(a, b, trials=20000) == pytest.approx(t_p, abs=0.02 * max(t_p / 0.05, 0.25))


def test_constant_nonzero_difference_is_significant_for_the_bootstrap():
    a = np.full(50, 0.8)
    assert sig.paired_bootstrap_test(a, a - 0.3, samples=1000) == pytest.approx(1 / 1001)


def test_same_seed_same_p_and_chunking_does_not_change_it(monkeypatch):
    rng = np.random.default_rng(5)
    a, b = rng.uniform(size=40), rng.uniform(size=40)
    for test in sig.TESTS.values():
        p = test(a, b, 3000, 7)
        assert test(a, b, 3000, 7) == p
        assert test(a, b, 3000, 8) != p
    # Many chunks of different sizes must still cover exactly `trials` draws.
    monkeypatch.setattr(sig, "_BLOCK_ELEMENTS", 40 * 7)
    p = sig.paired_randomization_test(a, b, trials=1000, seed=7)
    assert 0 < p <= 1 and (p * 1001) == pytest.approx(round(p * 1001))


def test_bad_vectors_are_rejected():
    with pytest.raises(ValueError, match="equal shape"):
        sig.paired_randomization_test(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="at least 2"):
        sig.paired_bootstrap_test(np.zeros(1), np.ones(1))


PER_QUERY = {
    "base": {"P@1": [1, 0, 0, 1, 0, 1], "RR": [1, 0.5, 0.25, 1, 0.2, 1]},
    "good": {"P@1": [1, 1, 0, 1, 1, 1], "RR": [1, 1, 0.5, 1, 1, 1]},
    "same": {"P@1": [1, 0, 0, 1, 0, 1], "RR": [1, 0.5, 0.25, 1, 0.2, 1]},
}


def write_eval(path, per_query, task="squad", split="dev", queries=None):
    queries = queries or [f"q{i}" for i in range(6)]
    per_query = {m: dict(zip(queries, v, strict=False)) for m, v in per_query.items()}
    metrics = {m: float(np.mean(list(v.values()))) for m, v in per_query.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "task": task,
        "split": split,
        "step": 100,
        "queries": len(queries),
        "corpus": 50,
        "metrics": metrics,
        "per_query": per_query,
        "trec": path.stem + ".trec",
    }
    path.write_text(json.dumps(data))
    return str(path)


@pytest.fixture
def three_runs(tmp_path):
    # Same file name in different MODEL_DIRs: labels must tell them apart.
    return [
        write_eval(tmp_path / "runs" / name / "eval" / "squad_dev_step100.json", v) for name, v in PER_QUERY.items()
    ]


def test_compare_table_has_the_hand_computed_means_and_differences(three_runs):
    result = sig.compare(three_runs, trials=2000)
    assert result["labels"] == [f"{n}/eval/squad_dev_step100.json" for n in PER_QUERY]
    base_rr, good_rr = np.mean([1, 0.5, 0.25, 1, 0.2, 1]), np.mean([1, 1, 0.5, 1, 1, 1])
    assert result["measures"]["RR"][0] == {"mean": pytest.approx(base_rr)}
    assert result["measures"]["RR"][1]["diff"] == pytest.approx(good_rr - base_rr)
    assert result["measures"]["RR"][2]["p"] == 1.0  # identical to the baseline
    # Exact two-sided sign-flip p for P@1: two +1 differences, 2 of 4 flips reach |sum| = 2.
    assert result["measures"]["P@1"][1]["p"] == pytest.approx(0.5, abs=0.05)
    table = sig.format_table(result)
    print(table)
    lines = table.splitlines()
    assert lines[0].startswith("squad/dev: 6 queries")
    rr_row = next(line for line in lines if line.startswith("RR "))
    assert f"{base_rr:.4f}" in rr_row and f"{good_rr:.4f} (+{good_rr - base_rr:.4f}, p=" in rr_row
    assert "good/eval/squad_dev_step100.json" in lines[1] and "(baseline)" in lines[1]
    assert lines[-1].startswith("* p < 0.05")
    assert sig.compare(three_runs, measures=["P@1"], baseline=1, trials=100)["measures"]["P@1"][1] == {
        "mean": pytest.approx(5 / 6)
    }


def test_bootstrap_marks_a_significant_difference(tmp_path):
    rng = np.random.default_rng(0)
    base = rng.uniform(0, 0.5, size=100)
    paths = [
        write_eval(tmp_path / f"{n}.json", {"RR": list(v)}, queries=[f"q{i}" for i in range(100)])
        for n, v in (("a", base), ("b", base + 0.3))
    ]
    result = sig.compare(paths, test="bootstrap", trials=500)
    assert result["measures"]["RR"][1]["p"] < 0.01
    assert result["labels"] == ["a.json", "b.json"]
    assert "0.5741 (+0.3000, p=0.002)*" in sig.format_table(result)  # 1/501: no sample as extreme


def test_compare_errors(tmp_path, three_runs):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"task": "squad", "split": "dev", "metrics": {"RR": 0.5}}))
    with pytest.raises(ValueError, match=r"old\.json.*older samtone eval; rerun `samtone eval`"):
        sig.compare([three_runs[0], str(old)])
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match=r"broken\.json is not valid JSON"):
        sig.load_eval(str(broken))
    with pytest.raises(FileNotFoundError, match="missing.json"):
        sig.load_eval(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match=r"unknown measure\(s\) \['MAP'\]; available in all files: P@1, RR"):
        sig.compare(three_runs, measures=["MAP"])
    with pytest.raises(ValueError, match="unknown test 'wilcoxon'"):
        sig.compare(three_runs, test="wilcoxon")
    other_split = write_eval(tmp_path / "test.json", PER_QUERY["good"], split="test")
    with pytest.raises(ValueError, match="different task/split"):
        sig.compare([three_runs[0], other_split])
    # Queries q0..q5 against q2..q7: 2 only in each, 4 shared.
    shifted = write_eval(tmp_path / "shifted.json", PER_QUERY["good"], queries=[f"q{i}" for i in range(2, 8)])
    with pytest.raises(ValueError, match=r"2 only in shifted\.json, 2 only in the baseline.*allow_partial=True.*4 q"):
        sig.compare([three_runs[0], shifted])
    result = sig.compare([three_runs[0], shifted], measures=["RR"], allow_partial=True, trials=100)
    assert result["queries"] == {"RR": 4}
    assert result["measures"]["RR"][0]["mean"] == pytest.approx(np.mean([0.25, 1, 0.2, 1]))  # q2..q5 of the baseline
    assert result["measures"]["RR"][1]["mean"] == pytest.approx(np.mean([1, 1, 0.5, 1]))  # its first four
