"""The embedding-space analysis (SamToNe Figures 1, 5, 6): each measurement against a plain NumPy
reference, and `analyze` end to end with two tiny real models writing valid PNGs and a report."""

from __future__ import annotations

import json

import numpy as np
import pytest

from samtone_jax.analysis import embedding_space
from samtone_jax.analysis.report import analyze
from samtone_jax.data.collection import RetrievalCollection

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ANIMALS = "cat dog fox owl eel bat yak emu ant bee cow pig hen elk ram gnu".split()
PLACES = "forest river desert city barn cave lake field".split()
FOODS = "fish seeds grass insects fruit leaves roots honey".split()


def _unit(rng, n, d):
    x = rng.normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def tiny_collection(num_queries: int = 30) -> RetrievalCollection:
    """num_queries questions, each with a gold sentence, plus distractor sentences; query 0 has two
    golds (the first by id is used) and one extra query has no gold in the corpus."""
    queries, corpus, qrels = {}, {}, {}
    for k in range(num_queries):
        animal, place, food = ANIMALS[k % 16], PLACES[k % 8], FOODS[(k // 2) % 8]
        queries[f"q{k:02d}"] = f"where does the {animal} number {k} live and what does it eat"
        corpus[f"d{k:02d}"] = f"the {animal} number {k} lives in the {place} and eats {food}"
        qrels[f"q{k:02d}"] = {f"d{k:02d}": 1}
    for k in range(10):
        corpus[f"x{k:02d}"] = f"a {PLACES[k % 8]} is full of {FOODS[(k + 3) % 8]} in season {k}"
    qrels["q00"]["d01"] = 1
    queries["q99"] = "which animal has no answer here"
    qrels["q99"] = {"missing": 1}
    return RetrievalCollection("tiny", queries, corpus, qrels)


class CharacterEncoder:
    """A test double: a fixed random projection of a bag of characters, L2-normalised."""

    def __init__(self, dim: int = 16, seed: int = 0, document_dim: int | None = None, poison: bool = False):
        rng = np.random.default_rng(seed)
        self.query_matrix = rng.normal(size=(128, dim))
        self.document_matrix = rng.normal(size=(128, document_dim or dim))
        self.poison = poison

    def _embed(self, texts, matrix):
        counts = np.zeros((len(texts), 128))
        for r, text in enumerate(texts):
            for ch in text.encode("ascii", "replace"):
                counts[r, ch % 128] += 1
        x = counts @ matrix
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    def encode_queries(self, texts):
        x = self._embed(texts, self.query_matrix)
        if self.poison:
            x[3, 0] = np.nan
        return x

    def encode_documents(self, texts):
        return self._embed(texts, self.document_matrix)


def test_top1_cosine_is_the_best_inner_product_over_the_corpus():
    rng = np.random.default_rng(0)
    queries, corpus = _unit(rng, 23, 12), _unit(rng, 101, 12)
    expected = (queries.astype(np.float64) @ corpus.T.astype(np.float64)).max(axis=1)
    np.testing.assert_allclose(embedding_space.top1_cosine(queries, corpus), expected, atol=1e-5)


def test_sample_pairs_are_distinct_deterministic_and_cover_every_row():
    i, j = embedding_space.sample_pairs(5, 2000, seed=3)
    assert (i != j).all() and i.min() == 0 and j.min() == 0 and i.max() == 4 and j.max() == 4
    i2, j2 = embedding_space.sample_pairs(5, 2000, seed=3)
    np.testing.assert_array_equal(i, i2)
    np.testing.assert_array_equal(j, j2)
    with pytest.raises(ValueError, match="at least 2"):
        embedding_space.sample_pairs(1, 10, seed=0)


def test_similarity_ratio_equals_a_loop_over_the_sampled_pairs():
    rng = np.random.default_rng(1)
    queries, documents = _unit(rng, 17, 8), _unit(rng, 17, 8)
    ratios = embedding_space.similarity_ratio(queries, documents, num_pairs=300, seed=7)
    i, j = embedding_space.sample_pairs(17, 300, seed=7)
    expected = []
    for a, b in zip(i, j, strict=True):
        denominator = float(np.dot(queries[a].astype(np.float64), documents[b]))
        if abs(denominator) >= 1e-6:
            expected.append(float(np.dot(queries[a].astype(np.float64), queries[b])) / denominator)
    np.testing.assert_allclose(ratios, expected, rtol=1e-9)


def test_similarity_ratio_drops_pairs_whose_denominator_is_zero():
    # Document 0 is orthogonal to every query: every pair with j == 0 has sim(q_i, p_0) = 0.
    queries = np.array([[1, 0, 0], [0, 1, 0], [0.6, 0.8, 0]], np.float32)
    documents = np.array([[0, 0, 1], [0.8, 0.6, 0], [0.6, 0.8, 0]], np.float32)
    i, j = embedding_space.sample_pairs(3, 50, seed=0)
    ratios = embedding_space.similarity_ratio(queries, documents, num_pairs=50, seed=0)
    _, kept = embedding_space.similarity_ratio_for_pairs(queries, documents, i, j)
    np.testing.assert_array_equal(kept, j != 0)
    assert len(ratios) == int((j != 0).sum()) and np.isfinite(ratios).all()
    summary = embedding_space.summarize(np.ones(3), ratios, np.ones(3), ratio_pairs_requested=50)
    assert summary["num_ratio_pairs_dropped"] == int((j == 0).sum()) > 0


@pytest.mark.slow
def test_tsne_is_joint_reproducible_and_checks_perplexity():
    rng = np.random.default_rng(2)
    queries, documents = _unit(rng, 12, 6), _unit(rng, 12, 6)
    coords_q, coords_d = embedding_space.tsne(queries, documents, seed=0, perplexity=5.0)
    assert coords_q.shape == (12, 2) and coords_d.shape == (12, 2) and np.isfinite(coords_q).all()
    again_q, again_d = embedding_space.tsne(queries, documents, seed=0, perplexity=5.0)
    np.testing.assert_allclose(again_q, coords_q, atol=1e-4)
    np.testing.assert_allclose(again_d, coords_d, atol=1e-4)
    with pytest.raises(ValueError, match="perplexity"):
        embedding_space.tsne(queries, documents, seed=0, perplexity=24.0)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """Two tiny real dual encoders (SDE, ADE-SPL) behind samtone_jax.inference.encoder.Encoder."""
    import flax.linen as nn
    import jax

    from samtone_jax.data import vocab as vocab_lib
    from samtone_jax.inference.encoder import Encoder
    from samtone_jax.models import DualEncoder, T5Config, init_params

    path = str(tmp_path_factory.mktemp("analysis_vocab") / "vocab.model")
    vocab_lib.train_sentencepiece(tiny_collection().texts() * 3, 64, path)
    config = T5Config(vocab_size=97, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64, num_layers=2)
    encoders = {}
    for seed, (name, architecture) in enumerate([("in-batch (sde)", "sde"), ("samtone (ade_spl)", "ade_spl")]):
        model = DualEncoder(config=config, architecture=architecture)
        params = nn.unbox(init_params(model, jax.random.PRNGKey(seed)))
        encoders[name] = Encoder(model, params, vocab_lib.vocabulary(path), 16, 24, batch_size=64)
    return encoders


@pytest.mark.slow
def test_analyze_two_real_models_writes_figures_report_and_consistent_summary(tmp_path, tiny_models):
    import matplotlib.image

    collection = tiny_collection()
    out = tmp_path / "analysis"  # does not exist yet: analyze creates it
    summary = analyze(tiny_models, collection, str(out), tsne_sample=20, ratio_pairs=500, seed=0)

    for name in ("tsne.png", "top1_cosine.png", "similarity_ratio.png"):
        data = (out / name).read_bytes()
        assert len(data) > 1000 and data.startswith(PNG_SIGNATURE)
        image = matplotlib.image.imread(out / name)
        assert image.ndim == 3 and image.shape[2] in (3, 4) and min(image.shape[:2]) > 100
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left behind
    report = (out / "report.md").read_text()
    for name in ("tsne.png", "top1_cosine.png", "similarity_ratio.png"):
        assert f"]({name})" in report
    assert all(name in report for name in tiny_models)
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(summary))
    assert sorted(summary["models"]) == sorted(tiny_models)
    assert summary["parameters"]["num_queries"] == 31 and summary["parameters"]["tsne_sample"] == 20

    # Recompute every median from the same encoders with the same functions, and from the saved arrays.
    query_ids, doc_ids = sorted(collection.queries), sorted(collection.corpus)
    gold_q = [query_ids.index(f"q{k:02d}") for k in range(30)]  # q99 has no gold; q00's first gold is d00
    gold_d = [doc_ids.index(f"d{k:02d}") for k in range(30)]
    arrays = np.load(out / "distributions.npz")
    for name, encoder in tiny_models.items():
        q = encoder.encode_queries([collection.queries[i] for i in query_ids])
        c = encoder.encode_documents([collection.corpus[i] for i in doc_ids])
        top1 = embedding_space.top1_cosine(q, c)
        ratios = embedding_space.similarity_ratio(q[gold_q], c[gold_d], 500, 0)
        m = summary["models"][name]
        assert m["top1_cosine_median"] == pytest.approx(float(np.median(top1)), abs=1e-6)
        assert m["similarity_ratio_median"] == pytest.approx(float(np.median(ratios)), rel=1e-6)
        assert m["top1_cosine_median"] == pytest.approx(float(np.median(arrays[f"{name}/top1_cosine"])), abs=1e-7)
        assert m["similarity_ratio_median"] == pytest.approx(float(np.median(arrays[f"{name}/similarity_ratio"])))
        assert m["num_queries"] == 31 and m["num_gold_pairs"] == 30
        assert m["num_ratio_pairs"] + m["num_ratio_pairs_dropped"] == 500
        assert arrays[f"{name}/tsne_queries"].shape == (20, 2)


@pytest.mark.slow
def test_analyze_max_queries_and_the_character_double(tmp_path):
    encoders = {"a": CharacterEncoder(seed=0), "b": CharacterEncoder(seed=1)}
    summary = analyze(encoders, tiny_collection(), str(tmp_path), tsne_sample=8, ratio_pairs=50, max_queries=10)
    assert summary["parameters"]["num_queries"] == 10
    assert all(m["num_queries"] == 10 and m["num_gold_pairs"] == 10 for m in summary["models"].values())


def test_analyze_rejects_empty_collection_non_finite_and_mismatched_embeddings(tmp_path):
    empty = RetrievalCollection("empty", {}, {"d": "text"}, {})
    with pytest.raises(ValueError, match="tsne_sample >= 2"):
        analyze({"a": CharacterEncoder()}, tiny_collection(), str(tmp_path), tsne_sample=1)
    with pytest.raises(ValueError, match="empty"):
        analyze({"a": CharacterEncoder()}, empty, str(tmp_path))
    with pytest.raises(ValueError, match=r"'bad'.*non-finite.*row 3"):
        analyze({"bad": CharacterEncoder(poison=True)}, tiny_collection(), str(tmp_path))
    with pytest.raises(ValueError, match=r"'mixed'.*16-d.*8-d"):
        analyze({"mixed": CharacterEncoder(document_dim=8)}, tiny_collection(), str(tmp_path))
