"""`samtone average`: a uniform soup is the mean of its ingredients' parameters (a soup of identical
runs is the run), a run's last K checkpoints, the greedy soup's rule, the soup loads / exports like
an import, and mismatched ingredients are refused by name."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from conftest import tiny_train_argv

import samtone_jax
from samtone_jax.checkpoints import load_params
from samtone_jax.checkpoints.train_checkpoints import restore_on_one_device
from samtone_jax.cli import main as cli


def _params(run, step):
    return restore_on_one_device(run / "checkpoints" / str(step) / "state")["params"]


def _leaves(tree):
    return jax.tree_util.tree_leaves(tree)


def test_a_soup_of_identical_runs_is_the_run_and_loads_like_it(trained_run, tmp_path, capsys):
    out = tmp_path / "soup"
    assert cli.main(["average", "--checkpoint", str(trained_run), str(trained_run), f"--out={out}"]) == 0
    for a, b in zip(_leaves(load_params(str(out))), _leaves(_params(trained_run, 2)), strict=True):
        np.testing.assert_array_equal(a, b)
    texts = ["a small dog", "the bank of a river"]
    np.testing.assert_array_equal(
        samtone_jax.load(str(out)).encode_queries(texts), samtone_jax.load(str(trained_run)).encode_queries(texts)
    )
    assert json.loads((out / "info.json").read_text())["method"] == "uniform"
    capsys.readouterr()
    assert cli.main(["average", "--checkpoint", str(trained_run), f"--out={tmp_path / 'one'}"]) == 2
    assert "needs at least 2 checkpoints" in capsys.readouterr().err
    assert cli.main(["average", "--checkpoint", str(trained_run), "--last=2", f"--out={tmp_path / 'last'}"]) == 2
    assert "has 1 complete checkpoints ([2]), fewer than --last 2" in capsys.readouterr().err
    assert cli.main(["average", "--checkpoint", str(trained_run), str(trained_run), f"--out={out}"]) == 2
    assert "already exists" in capsys.readouterr().err


@pytest.mark.slow
def test_uniform_last_k_greedy_and_refusals(trained_run, wordnet_env, tmp_path, capsys):
    other = tmp_path / "seed1"
    extra = ["--gin.train.seed=1", "--gin.schedule.checkpoint_every=1", "--gin.schedule.keep_checkpoints=3"]
    assert cli.main(tiny_train_argv(other, wordnet_env[1], steps=3, extra=extra)) == 0
    # uniform: the mean of the two runs' parameters
    soup = tmp_path / "soup"
    assert cli.main(["average", "--checkpoint", str(trained_run), str(other), f"--out={soup}"]) == 0
    for s, a, b in zip(
        _leaves(load_params(str(soup))), _leaves(_params(trained_run, 2)), _leaves(_params(other, 3)), strict=True
    ):
        np.testing.assert_allclose(s, (a + b) / 2, rtol=1e-6, atol=1e-7)
    # a run's last 3 checkpoints
    last = tmp_path / "last"
    assert cli.main(["average", "--checkpoint", str(other), "--last=3", f"--out={last}"]) == 0
    for s, *steps in zip(
        _leaves(load_params(str(last))), *(_leaves(_params(other, k)) for k in (1, 2, 3)), strict=True
    ):
        np.testing.assert_allclose(s, sum(steps) / 3, rtol=1e-6, atol=1e-7)
    # greedy: each alone scored, best first; the soup is the mean of what was kept, never worse than the best
    greedy = tmp_path / "greedy"
    flags = ["--task=wordnet_definitions", "--split=all", "--measure=RR"]
    assert (
        cli.main(["average", "--checkpoint", str(trained_run), str(other), str(last), f"--out={greedy}", *flags]) == 0
    )
    info = json.loads((greedy / "info.json").read_text())
    labels = [str(trained_run), str(other), str(last)]
    assert info["method"] == "greedy" and set(info["scores"]) == {*labels, "soup"}
    assert info["kept"][0] == max(labels, key=lambda label: info["scores"][label])
    assert info["scores"]["soup"] >= max(info["scores"][label] for label in labels)
    sources = {
        str(trained_run): _params(trained_run, 2),
        str(other): _params(other, 3),
        str(last): load_params(str(last)),
    }
    kept = [_leaves(sources[label]) for label in info["kept"]]
    for s, *parts in zip(_leaves(load_params(str(greedy))), *kept, strict=True):
        np.testing.assert_allclose(s, sum(parts) / len(parts), rtol=1e-6, atol=1e-7)
    # another model: refused by name before anything is summed
    wider = tmp_path / "wider"
    assert cli.main(tiny_train_argv(wider, wordnet_env[1], steps=1, extra=["--gin.VOCAB_SIZE=120"])) == 0
    capsys.readouterr()
    assert cli.main(["average", "--checkpoint", str(trained_run), str(wider), f"--out={tmp_path / 'bad'}"]) == 2
    err = capsys.readouterr().err
    assert "is another architecture than" in err and "(120, " in err and "(100, " in err
    assert not (tmp_path / "bad").exists()


def test_weighted_average_of_a_fine_tuned_run_and_its_base_is_wise_ft(tiny_bert_import, wordnet_env, tmp_path, capsys):
    """--weights w_1 … w_n: Σ w_i θ_i / Σ w_i, with the import the run started from as an ingredient."""
    from conftest import tiny_bert_train_argv

    _, imported = tiny_bert_import
    run = tmp_path / "run"
    assert cli.main(tiny_bert_train_argv(run, tiny_bert_import, steps=1)) == 0
    mixed = tmp_path / "wise"
    argv = ["average", "--checkpoint", str(run), str(imported), "--weights", "3", "1", f"--out={mixed}"]
    assert cli.main(argv) == 0
    fine_tuned, base = _leaves(_params(run, 1)), _leaves(load_params(str(imported)))
    for s, a, b in zip(_leaves(load_params(str(mixed))), fine_tuned, base, strict=True):
        np.testing.assert_allclose(
            s, 0.75 * np.asarray(a, np.float32) + 0.25 * np.asarray(b, np.float32), rtol=1e-6, atol=1e-7
        )
    info = json.loads((mixed / "info.json").read_text())
    assert info["method"] == "weighted" and info["weights"] == [0.75, 0.25]
    assert any(np.abs(np.asarray(a) - np.asarray(b)).max() > 0 for a, b in zip(fine_tuned, base, strict=True))
    capsys.readouterr()
    for weights, said in ((["1"], "gives 1 weights for 2 checkpoints"), (["0", "0"], "not all 0")):
        argv = ["average", "--checkpoint", str(run), str(imported), "--weights", *weights, f"--out={tmp_path / 'x'}"]
        assert cli.main(argv) == 2
        assert said in capsys.readouterr().err


def test_wise_ft_picks_the_best_alpha_whose_guards_keep_enough(monkeypatch):
    """The rule alone, on made-up parameters and scores: θ_ft = 1, θ_base = 0, so a mix's θ is α; the
    in-domain score rises with α, the guard falls as 1 − 0.4 α (its retention too)."""
    from samtone_jax.core.errors import BadValueError
    from samtone_jax.evaluation import soup

    trees = {"ft": {"w": np.ones(3, np.float32)}, "base": {"w": np.zeros(3, np.float32)}}
    monkeypatch.setattr(soup, "restore_params", lambda ingredient: trees[ingredient.label])
    found = [soup.Ingredient("ft", "", False, ""), soup.Ingredient("base", "", False, "")]
    rising = lambda p: float(p["w"][0])  # noqa: E731  α
    guard = {"g": lambda p: 1.0 - 0.4 * float(p["w"][0])}
    params, picked, mixes = soup.wise_ft(found, rising, guard, soup.DEFAULT_GRID, 0.95)
    assert picked.alpha == pytest.approx(0.1) and params["w"] == pytest.approx([0.1] * 3)
    assert [m.allowed for m in mixes] == [True, True] + [False] * 9
    assert mixes[4].retention["g"] == pytest.approx(0.84) and mixes[4].score == pytest.approx(0.4)
    assert soup.wise_ft(found, rising, guard, soup.DEFAULT_GRID, 0.5)[1].alpha == 1.0  # every α keeps ≥ 0.5
    assert soup.wise_ft(found, rising, {}, [0.5, 0.7], 0.95)[1].alpha == pytest.approx(0.7)  # no guard
    assert [m.alpha for m in soup.wise_ft(found, rising, {}, [0.5], 0.95)[2]] == [0.0, 0.5]  # the base always tried
    flat = lambda p: 0.5  # noqa: E731
    assert soup.wise_ft(found, flat, {}, soup.DEFAULT_GRID, 0.95)[1].alpha == 0.0  # a tie: nearest the base
    with pytest.raises(BadValueError, match="each α in"):
        soup.wise_ft(found, rising, {}, [1.5], 0.95)
    with pytest.raises(BadValueError, match="WiSE-FT mixes 2 checkpoints"):
        soup.wise_ft(found[:1], rising, {}, [0.5], 0.95)


def test_wise_ft_picks_alpha_on_a_dev_split_under_a_guard_and_writes_the_mix(
    tiny_bert_import, wordnet_env, tmp_path, capsys
):
    from conftest import tiny_bert_train_argv

    from samtone_jax.cli import gin_registry
    from samtone_jax.tasks import catalogue

    _, imported = tiny_bert_import
    run = tmp_path / "run"
    assert cli.main(tiny_bert_train_argv(run, tiny_bert_import, steps=1)) == 0
    gin_registry.parse([], [])
    source = catalogue.collection("wordnet_definitions", "all")
    rows = [{"query": source.queries[q], "document": source.corpus[d]} for q, d in source.pairs()]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {"format": "jsonl", "path": str(tmp_path / "pairs.jsonl"), "dev_fraction": 0.3}
    (tmp_path / "pairs.gin").write_text(f"local_tasks.tasks = {{'pairs': {spec!r}}}\n")
    mixed = tmp_path / "wise"
    argv = ["average", "--checkpoint", str(run), str(imported), "--wise_ft", "--task=pairs", "--grid", "0.5,1"]
    argv += ["--guard", "wordnet_definitions", "--guard_queries=10", "--guard_candidates=30", "--max_queries=20"]
    argv += [f"--gin_file={tmp_path / 'pairs.gin'}", "--min_retention=0", f"--out={mixed}"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    info = json.loads((mixed / "info.json").read_text())
    assert info["method"] == "wise-ft" and info["validation"] == "pairs/dev"
    assert [m["alpha"] for m in info["grid"]] == [0.0, 0.5, 1.0]
    assert set(info["grid"][0]["guards"]) == {"wordnet_definitions/train"}  # the guard's split the table does not use
    assert info["grid"][0]["retention"] == {"wordnet_definitions/train": 1.0}
    best = max(info["grid"], key=lambda m: (m["score"], -m["alpha"]))  # every α allowed at min_retention 0
    assert info["alpha"] == best["alpha"] and f"WiSE-FT: α = {best['alpha']:g}" in printed
    a = info["alpha"]
    fine_tuned, base = _leaves(_params(run, 1)), _leaves(load_params(str(imported)))
    for s, t, b in zip(_leaves(load_params(str(mixed))), fine_tuned, base, strict=True):
        expected = a * np.asarray(t, np.float32) + (1 - a) * np.asarray(b, np.float32)
        np.testing.assert_allclose(s, expected, rtol=1e-6, atol=1e-7)
    bad = ["average", "--checkpoint", str(run), str(imported), "--wise_ft", f"--out={tmp_path / 'x'}"]
    assert cli.main([*bad, "--task=wordnet_definitions"]) == 2
    assert "wordnet_definitions has no dev split (train, test, all)" in capsys.readouterr().err
    assert cli.main(bad) == 2
    assert "--wise_ft picks α by the score on held-out in-domain queries" in capsys.readouterr().err
    both = ["average", "--checkpoint", str(run), str(imported)]
    assert cli.main([*both, "--grid", "0.5", "--min_retention=0.9", f"--out={tmp_path / 'x'}"]) == 2
    assert "--grid, --min_retention choose how --wise_ft picks its α" in capsys.readouterr().err
    assert cli.main([*both, "--wise_ft", "--task=pairs", "--weights", "1", "1", f"--out={tmp_path / 'x'}"]) == 2
    err = capsys.readouterr().err
    assert "--wise_ft mixes a fine-tuned run and its base" in err and "drop --weights" in err
    guard_is_test = tmp_path / "guard.gin"  # a guard whose only split is the one its evaluation reports
    spec_test = {"format": "jsonl", "files": {"test": str(tmp_path / "pairs.jsonl")}}
    guard_is_test.write_text(f"local_tasks.tasks = {{'pairs': {spec!r}, 'only_test': {spec_test!r}}}\n")
    wise = [*both, "--wise_ft", "--task=pairs", f"--gin_file={guard_is_test}", f"--out={tmp_path / 'x'}"]
    assert cli.main([*wise, "--guard", "only_test"]) == 2
    assert "--guard only_test: its only split is the one its evaluation reports (test)" in capsys.readouterr().err
