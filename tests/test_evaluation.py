"""Exact search (single device and sharded) against a NumPy brute force, and ranking metrics on
hand-checked MultiReQA-style multi-gold cases."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import require_compiler

from samtone_jax.evaluation import metrics, search
from samtone_jax.models import partitioning


def brute_force(queries, corpus, k):
    """Top-k by score, ties by lower corpus index (np.lexsort: last key is primary)."""
    scores = queries.astype(np.float64) @ corpus.T.astype(np.float64)
    ids = np.arange(len(corpus))
    order = np.stack([np.lexsort((ids, -row))[:k] for row in scores])
    return np.take_along_axis(scores, order, axis=1), order


def _integer_data(seed=0, n=203, q=9, d=6):
    # Small integers: every score is exact in float32, and repeated rows make real ties.
    rng = np.random.RandomState(seed)
    corpus = rng.randint(-2, 3, size=(n, d)).astype(np.float32)
    corpus[50] = corpus[3]
    corpus[150] = corpus[3]
    queries = rng.randint(-2, 3, size=(q, d)).astype(np.float32)
    return queries, corpus


# 'native' is the CPU kernel (evaluation/native_top_k.py), 'lax' XLA's top_k; both must be exact.
SELECTIONS = ["native", "lax"]


def _require(selection):
    if selection == "native":
        require_compiler()


@pytest.mark.parametrize("selection", SELECTIONS)
@pytest.mark.parametrize("chunk_size", [1, 16, 1000])
def test_single_device_search_equals_brute_force_with_ties(chunk_size, selection):
    _require(selection)
    queries, corpus = _integer_data()
    scores, ids = search.exact_top_k(queries, corpus, k=10, chunk_size=chunk_size, selection=selection)
    ref_scores, ref_ids = brute_force(queries, corpus, 10)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(scores, ref_scores.astype(np.float32))


@pytest.mark.parametrize("selection", SELECTIONS)
@pytest.mark.parametrize("chunk_size", [4, 64])
def test_sharded_search_on_eight_devices_equals_brute_force(chunk_size, selection):
    if jax.device_count() < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
    _require(selection)
    queries, corpus = _integer_data(seed=1)
    mesh = partitioning.create_mesh()
    scores, ids = search.exact_top_k(
        queries, corpus, k=25, chunk_size=chunk_size, mesh=mesh, query_batch=4, selection=selection
    )
    ref_scores, ref_ids = brute_force(queries, corpus, 25)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(scores, ref_scores.astype(np.float32))
    assert (ids < len(corpus)).all()  # padding rows (203 is not a multiple of 8 x chunk) never returned


def test_multi_gold_precision_and_reciprocal_rank_by_hand():
    # MultiReQA: a question may have several gold sentences; any of them counts.
    qrels = {"q1": {"s2": 1, "s5": 1}, "q2": {"s9": 1}, "q3": {"s1": 1, "s4": 1}}
    run = {
        "q1": {"s5": 0.9, "s1": 0.8, "s2": 0.7},  # gold at rank 1 -> P@1 1, RR 1
        "q2": {"s3": 0.9, "s4": 0.8, "s9": 0.1},  # gold at rank 3 -> P@1 0, RR 1/3
        "q3": {"s7": 0.9, "s4": 0.5, "s1": 0.4},  # first gold at rank 2 -> P@1 0, RR 1/2
    }
    m = metrics.evaluate(qrels, run)
    assert m["P@1"] == pytest.approx(1 / 3)
    assert m["RR"] == pytest.approx((1 + 1 / 3 + 1 / 2) / 3)
    assert m["R@1"] == pytest.approx((1 / 2 + 0 + 0) / 3)  # one of q1's two golds
    assert m["R@5"] == pytest.approx(1.0)


def test_run_from_top_k_maps_indices_to_ids():
    run = metrics.run_from_top_k(
        ["a", "b"], ["d0", "d1", "d2"], np.array([[3.0, 1.0], [2.0, 0.5]]), np.array([[2, 0], [1, -1]])
    )
    assert run == {"a": {"d2": 3.0, "d0": 1.0}, "b": {"d1": 2.0}}


@pytest.mark.slow
def test_eval_command_on_real_squad_dev_is_near_chance_and_consistent(tmp_path, squad_dev, capsys):
    """A 1-step tiny model: all 10,570 questions against all 10,642 sentences (its time is a
    measurement for the README, not a test: it depends on the machine's load); the written TREC
    run, re-scored by ir-measures itself, gives the JSON's numbers."""
    import json

    import ir_measures

    from samtone_jax.cli import main as cli
    from samtone_jax.tasks import catalogue

    collection = catalogue.collection("multireqa_squad_dev", "all")
    vocab_path = squad_dev
    common = [
        "--gin_file=models/t5_1_1_tiny.gin",
        "--gin_file=architectures/sde.gin",
        "--gin_file=losses/bidirectional.gin",
        "--gin.VOCAB_SIZE=2000",
        f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
        f"--gin.VOCABULARY='{vocab_path}'",
        "--gin.create_mesh.num_devices=1",  # 8 simulated devices on 2 cores encode no faster (sharding: test_inference)
    ]
    train_flags = [
        "--gin.train.model_dir=%MODEL_DIR",
        "--gin.train.task='multireqa_squad_dev'",
        "--gin.inputs.split='train'",
        "--gin.train.train_steps=1",
        "--gin.train.batch_size=8",
        "--gin.train.vocabulary=%VOCABULARY",
    ]
    assert cli.main(["train", *common, *train_flags]) == 0
    eval_flags = [
        "--gin.evaluate.model_dir=%MODEL_DIR",
        "--gin.evaluate.task='multireqa_squad_dev'",
        "--gin.evaluate.split='all'",
        "--gin.evaluate.vocabulary=%VOCABULARY",
        "--gin.evaluate.query_length=32",
        "--gin.evaluate.doc_length=64",
    ]
    assert cli.main(["eval", *common, *eval_flags]) == 0
    saved = json.load(open(tmp_path / "run" / "eval" / "multireqa_squad_dev_all_step1.json"))
    assert saved["queries"] == 10570 and saved["corpus"] == 10642
    assert saved["metrics"]["P@1"] < 0.05  # an (almost) untrained model is near chance
    run = ir_measures.read_trec_run(str(tmp_path / "run" / "eval" / "multireqa_squad_dev_all_step1.trec"))
    theirs = ir_measures.calc_aggregate([ir_measures.P @ 1, ir_measures.RR], collection.qrels, run)
    assert theirs[ir_measures.P @ 1] == pytest.approx(saved["metrics"]["P@1"])
    assert theirs[ir_measures.RR] == pytest.approx(saved["metrics"]["RR"])
    assert "P@1" in capsys.readouterr().out


def _random_unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_faiss_flat_and_approx_backends_equal_exact_search():
    rng = np.random.default_rng(0)
    corpus, queries = _random_unit(rng, 3000, 32), _random_unit(rng, 40, 32)
    exact_scores, exact_ids = search.top_k(queries, corpus, 20)
    for backend in ("faiss", "approx"):  # approx_max_k is exact off TPU
        scores, ids = search.top_k(queries, corpus, 20, backend=backend)
        np.testing.assert_array_equal(ids, exact_ids)
        np.testing.assert_allclose(scores, exact_scores, atol=1e-5)
    # With exact ties (integer data): the same scores, and the same ids wherever the score is above
    # the k-th (which member of a tie straddling rank k is kept is up to each library's heap).
    queries, corpus = _integer_data(seed=2)
    exact_scores, exact_ids = search.top_k(queries, corpus, 25)
    scores, ids = search.top_k(queries, corpus, 25, backend="faiss")
    np.testing.assert_array_equal(scores, exact_scores)
    above = exact_scores > exact_scores[:, -1:]
    np.testing.assert_array_equal(np.where(above, ids, -1), np.where(above, exact_ids, -1))
    with pytest.raises(ValueError, match="unknown search backend 'annoy'"):
        search.top_k(queries, corpus, 5, backend="annoy")


def test_faiss_ivfpq_finds_most_exact_neighbours():
    rng = np.random.default_rng(1)
    centers = _random_unit(rng, 20, 32)  # clustered data, as real embeddings are
    corpus = centers[rng.integers(0, 20, 4000)] + 0.3 * rng.standard_normal((4000, 32)).astype(np.float32)
    corpus /= np.linalg.norm(corpus, axis=1, keepdims=True)
    queries = corpus[:50] + 0.05 * rng.standard_normal((50, 32)).astype(np.float32)
    _, exact_ids = search.top_k(queries, corpus, 10)
    _, ids = search.top_k(queries, corpus, 10, backend="faiss_ivfpq", nlist=16, nprobe=16)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids.tolist(), exact_ids.tolist(), strict=True)])
    assert 0.5 < recall  # compressed vectors: approximate, but far above chance (10 / 4000)


@pytest.mark.slow
def test_eval_compare_and_analyze_commands_on_a_trained_run(trained_run, wordnet_env, tmp_path, capsys):
    import json
    import re
    import shutil

    from samtone_jax.cli import main as cli

    eval_flags = [
        f"--gin.evaluate.model_dir='{trained_run}'",
        "--gin.evaluate.task='wordnet_definitions'",
        "--gin.evaluate.split='all'",
        "--gin.evaluate.k=10",
    ]
    capsys.readouterr()
    assert cli.main(["eval", *eval_flags]) == 0
    from samtone_jax.tasks import catalogue

    corpus = catalogue.collection("wordnet_definitions", "all").corpus
    assert f"encoding documents: {len(corpus):,}/{len(corpus):,} texts (100.0%)" in capsys.readouterr().err
    path = trained_run / "eval" / "wordnet_definitions_all_step2.json"
    saved = json.loads(path.read_text())
    assert saved["step"] == 2 and "R@100" not in saved["metrics"]  # a top-10 run cannot compute R@100
    rr = saved["per_query"]["RR"]
    assert len(rr) == saved["queries"] and np.mean(list(rr.values())) == pytest.approx(saved["metrics"]["RR"])
    other = tmp_path / "other" / "eval"
    other.mkdir(parents=True)
    shutil.copy(path, other / path.name)
    capsys.readouterr()
    assert cli.main(["compare", str(path), str(other / path.name), "--trials=200"]) == 0
    table = capsys.readouterr().out
    assert re.search(r"RR\s.*\+0\.0000, p=1\.000", table), table
    assert cli.main(["compare", str(path), str(tmp_path / "missing.json")]) == 2
    out = tmp_path / "analysis"
    argv = [
        "analyze",
        f"--checkpoint={trained_run}",
        f"--checkpoint={trained_run / 'checkpoints' / '2'}",
        "--name=run",
        "--name=step2",
        "--task=wordnet_definitions",
        "--split=all",
        f"--out={out}",
        "--tsne_sample=12",
        "--ratio_pairs=50",
    ]
    assert cli.main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["models"]["run"] == summary["models"]["step2"]  # the same checkpoint twice
    assert all((out / f).stat().st_size > 0 for f in ("tsne.png", "top1_cosine.png", "similarity_ratio.png"))


def test_exact_index_is_built_once_and_searched_in_query_batches():
    queries, corpus = _integer_data(seed=2, q=11)
    index = search.ExactIndex(corpus, chunk_size=32, query_batch=4)  # 3 query batches, 7 chunks
    ref_scores, ref_ids = brute_force(queries, corpus, 10)
    for _ in range(2):  # searched twice: the device corpus is reused
        scores, ids = index.search(queries, 10)
        np.testing.assert_array_equal(ids, ref_ids)
        np.testing.assert_array_equal(scores, ref_scores.astype(np.float32))
    assert index.search(queries[:0], 10)[1].shape == (0, 10)
    with pytest.raises(ValueError, match=r"queries must be \[Q, 6\] to search this corpus, got float32 \(2, 5\)"):
        index.search(queries[:2, :5], 10)
    with pytest.raises(ValueError, match=r"the corpus must be \[N, D\] embeddings, got shape \(203,\)"):
        search.ExactIndex(corpus[:, 0])


@pytest.mark.slow
def test_eval_dims_reports_every_truncation_from_the_same_embeddings(trained_run, wordnet_env, tmp_path):
    """`samtone eval --dims 4,16`: one JSON per truncation (first k dimensions, re-normalised), its P@1
    that of a brute-force search written here on the model's own embeddings cut the same way."""
    import json
    import shutil

    import samtone_jax
    from samtone_jax.cli import main as cli
    from samtone_jax.tasks import catalogue

    run = tmp_path / "run"
    # a copy without the fixture's eval folder: other tests' embeddings there name the fixture's path
    shutil.copytree(trained_run, run, ignore=shutil.ignore_patterns("eval"))
    flags = [
        f"--gin.evaluate.model_dir='{run}'",
        "--gin.evaluate.task='wordnet_definitions'",
        "--gin.evaluate.split='all'",
    ]
    assert cli.main(["eval", *flags, "--dims", "4,16"]) == 0
    collection = catalogue.collection("wordnet_definitions", "all")
    model = samtone_jax.load(str(run))
    query_ids, doc_ids = sorted(collection.queries), sorted(collection.corpus)
    q = model.encode_queries([collection.queries[i] for i in query_ids])
    d = model.encode_documents([collection.corpus[i] for i in doc_ids])
    for dim in (4, 16):
        record = json.loads((run / "eval" / f"wordnet_definitions_all_step2_dim{dim}.json").read_text())
        qk = q[:, :dim] / np.linalg.norm(q[:, :dim], axis=1, keepdims=True)
        dk = d[:, :dim] / np.linalg.norm(d[:, :dim], axis=1, keepdims=True)
        best = np.argmax(qk @ dk.T, axis=1)
        p1 = np.mean([collection.qrels[qid].get(doc_ids[j], 0) > 0 for qid, j in zip(query_ids, best, strict=True)])
        assert record["dim"] == dim and record["metrics"]["P@1"] == pytest.approx(p1, abs=1e-9)
    full = json.loads((run / "eval" / "wordnet_definitions_all_step2.json").read_text())
    assert "dim" not in full and q.shape[1] == 32
    assert cli.main(["eval", *flags, "--dims", "8,64"]) == 2  # beyond the embedding's 32 dimensions
    assert cli.main(["eval", *flags, "--dims", "eight"]) == 2
    assert cli.main(["eval", *flags, "--dims", ""]) == 2  # no dimension at all: said, not ignored
    # the model card reports the full embedding's score, not a truncation's
    from samtone_jax.export.model_card import eval_results

    assert [r.get("dim") for r in eval_results(str(run))] == [None]


def test_a_sampled_collection_keeps_its_queries_gold_documents_and_an_even_sample_of_the_rest():
    from samtone_jax.core.errors import BadValueError
    from samtone_jax.data.collection import RetrievalCollection

    queries = {f"q{i:03d}": f"query {i}" for i in range(100)}
    corpus = {f"d{i:04d}": f"doc {i}" for i in range(1000)}
    qrels = {f"q{i:03d}": {f"d{7 * i:04d}": 1, f"d{7 * i + 1:04d}": 0} for i in range(90)}  # q090.. unjudged
    full = RetrievalCollection("toy", queries, corpus, qrels)
    small = full.sample(max_queries=30, candidates=200)
    assert sorted(small.queries) == [f"q{i:03d}" for i in range(0, 90, 3)]  # every third judged query
    assert len(small.corpus) == 200 and set(small.qrels) == set(small.queries)
    gold = {f"d{7 * i:04d}" for i in range(0, 90, 3)}
    assert gold <= set(small.corpus)
    others = sorted(set(small.corpus) - gold)
    assert others[0] == "d0001" and len(others) == 170  # an even spread over the ids, not the first 170
    assert int(others[-1][1:]) > 900
    assert full.sample(max_queries=30, candidates=200) == small  # fixed by the data alone
    assert full.sample() == dataclasses.replace(full, queries={q: queries[q] for q in sorted(qrels)}, qrels=qrels)
    with pytest.raises(BadValueError, match="must be ≥ 0"):
        full.sample(candidates=-1)


def _dot_precisions(fn, *args) -> list[str]:
    """The precision of every dot_general fn runs (nested jaxprs too: jit, scan, shard_map, map)."""

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                yield str(eqn.params["precision"])
            for value in eqn.params.values():
                for sub in value if isinstance(value, tuple) else (value,):
                    inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's jaxpr, or a Jaxpr itself
                    if hasattr(inner, "eqns"):
                        yield from walk(inner)

    return list(walk(jax.make_jaxpr(fn)(*args).jaxpr))


def test_float_search_and_rescoring_multiply_at_full_float32_on_every_platform():
    # The CPU computes float32 dots in float32 whatever the precision says, so this cannot be seen in
    # scores here; on TPU (one bfloat16 pass) and NVIDIA GPUs (TF32) the default precision ranked by
    # rounded scores. Every dot over float rows must ask for HIGHEST; integer codes need not.
    from samtone_jax.compression import quantization

    rng = np.random.default_rng(0)
    queries, corpus = rng.standard_normal((4, 16), dtype=np.float32), rng.standard_normal((64, 16), dtype=np.float32)
    ranges = quantization.int8_ranges(corpus)
    mesh = partitioning.create_mesh(num_devices=4)

    def dots(corpus, queries, mesh=None, **options):
        """The dots of ExactIndex(corpus).search(queries) (sharded with `mesh`), as compiled."""
        bits = 16 if corpus.dtype == np.uint8 else None
        index = search.ExactIndex(
            corpus, mesh, chunk_size=8, query_batch=4, bits=bits, ranges=options.pop("ranges", None)
        )
        rows = jnp.asarray(index._as_rows(queries))
        if "float_queries" in options:
            options = {"rescore": (jnp.asarray(options.pop("float_queries")), index.ranges), "depth": 20}
        return _dot_precisions(lambda q, c: index._search(q, c, 5, index.chunk_size, **options), rows, index.corpus)

    codes, query_codes = quantization.encode(corpus, "int8", ranges), quantization.encode(queries, "int8", ranges)
    bits, query_bits = quantization.encode(corpus, "binary"), quantization.encode(queries, "binary")
    for where in (None, mesh):
        float_dots = dots(corpus, queries, where) + dots(corpus.astype(jnp.bfloat16), queries, where)
        assert len(float_dots) == 2 and all("HIGHEST" in p for p in float_dots), float_dots
        integer_dots = dots(codes, query_codes, where) + dots(bits, query_bits, where)
        assert len(integer_dots) == 2 and not any("HIGHEST" in p for p in integer_dots), integer_dots  # exact anyway
        for compressed, compressed_queries, extra in ((codes, query_codes, {"ranges": ranges}), (bits, query_bits, {})):
            rescoring = dots(compressed, compressed_queries, where, float_queries=queries, **extra)
            assert sorted("HIGHEST" in p for p in rescoring) == [False, True], rescoring  # the float re-rank's dot
    scaled = _dot_precisions(
        lambda q, c, s: search.chunked_top_k(q, c, 5, 16, 64, selection="lax", scale=s),
        queries,
        codes,
        np.ones(64, np.float32),
    )
    assert len(scaled) == 1 and "HIGHEST" in scaled[0], scaled  # an int8 corpus times float row scales
    adore = _dot_precisions(
        lambda q, c: search.chunked_top_k(q, c, 5, 16, 64, selection="lax", exact=False), queries, corpus
    )
    assert len(adore) == 1 and "HIGHEST" not in adore[0], adore  # ADORE's negatives: its loss's precision
