"""Compressed embeddings (quantization.py) and retrieval over them (evaluation/compressed.py,
search.ExactIndex on int8 codes and packed bits): the codes equal sentence-transformers' own, each
search equals a brute-force reference written here, sharded equals one device, and `samtone eval
--precisions` writes one record per (dimension, precision)."""

from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from samtone_jax.compression import quantization
from samtone_jax.core.errors import BadValueError
from samtone_jax.evaluation import compressed, search
from samtone_jax.models import partitioning


def _unit(rng, n, d):
    x = rng.normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def embeddings():
    rng = np.random.default_rng(0)
    return _unit(rng, 60, 37), _unit(rng, 900, 37)  # queries, corpus; 37: bits that do not fill a byte


def test_codes_equal_sentence_transformers_quantize_embeddings(embeddings):
    from sentence_transformers.util.quantization import quantize_embeddings

    q, d = embeddings
    calibration = d[:300]
    ranges = quantization.int8_ranges(calibration)
    theirs = quantize_embeddings(q, "int8", calibration_embeddings=calibration)
    np.testing.assert_array_equal(quantization.quantize_int8(q, ranges), theirs)  # bit for bit, out-of-range clipped
    np.testing.assert_array_equal(quantization.pack_bits(d), quantize_embeddings(d, "ubinary"))
    # On device (the quantization-aware loss), jitted or not: the same codes, bit for bit (XLA:CPU's
    # own division is off by an ulp for ~25 % of values: corrected, see quantization._divide)
    np.testing.assert_array_equal(np.asarray(quantization.pack_bits(jnp.asarray(d))), quantization.pack_bits(d))
    many = np.concatenate([q, d, np.random.default_rng(1).normal(size=(5000, 37)).astype(np.float32)])
    for device in (quantization.quantize_int8, jax.jit(quantization.quantize_int8)):
        np.testing.assert_array_equal(
            np.asarray(device(jnp.asarray(many), jnp.asarray(ranges))), quantize_embeddings(many, "int8", ranges=ranges)
        )
    # Decoding: each code's bucket lower edge; within one step of the value it encodes (in range).
    steps = (ranges[1] - ranges[0]) / 255
    inside = quantization.quantize_int8(calibration, ranges)
    error = calibration - quantization.dequantize_int8(inside, ranges)
    assert (error >= -1e-6).all() and (error <= steps + 1e-6).all()
    signs = quantization.unpack_signs(quantization.pack_bits(d), 37)
    np.testing.assert_array_equal(signs, np.where(d > 0, 1.0, -1.0))


def test_int8_and_binary_search_equal_brute_force_and_sharded_equals_one_device(embeddings):
    q, d = embeddings
    ranges = quantization.int8_ranges(d)
    q8, d8 = quantization.quantize_int8(q, ranges), quantization.quantize_int8(d, ranges)
    qb, db = quantization.pack_bits(q), quantization.pack_bits(d)
    integer = q8.astype(np.int64) @ d8.astype(np.int64).T  # the integer inner products
    hamming = np.unpackbits(qb[:, None, :] ^ db[None, :, :], axis=-1).sum(axis=-1).astype(np.int64)
    mesh = partitioning.create_mesh(devices=jax.devices()[:4])
    for codes, queries, bits, reference in ((d8, q8, None, integer), (db, qb, 37, 37 - 2 * hamming)):
        order = np.argsort(-reference, axis=1, kind="stable")[:, :10]  # ties: the lower index first
        for where in (None, mesh):
            scores, ids = search.ExactIndex(codes, where, chunk_size=64, bits=bits).search(queries, 10)
            np.testing.assert_array_equal(ids, order)
            np.testing.assert_array_equal(scores, np.take_along_axis(reference, order, axis=1).astype(np.float32))


def test_rescoring_reranks_the_candidates_by_the_float_query_on_one_device_and_sharded(embeddings):
    """int8 / binary with rescore R: the top 10·R of the compressed search re-ranked by q · decoded,
    on device; a corpus sharded over 4 devices (each scoring the candidates it holds) = 1 device."""
    q, d = embeddings
    ranges = quantization.int8_ranges(d[::3])
    mesh = partitioning.create_mesh(devices=jax.devices()[:4])
    for precision in ("int8", "binary"):
        plain = compressed.compressed_top_k(q, d, precision, k=40, ranges=ranges)
        if precision == "int8":
            decoded = ((quantization.quantize_int8(d, ranges).astype(np.float64) + 128) / 255) * (
                ranges[1].astype(np.float64) - ranges[0]
            ) + ranges[0]
        else:
            decoded = np.where(d > 0, 1.0, -1.0)
        for where in (None, mesh):
            found = compressed.compressed_top_k(q, d, precision, k=10, ranges=ranges, rescore_factor=4, mesh=where)
            for i in range(len(q)):
                candidates = plain.indices[i]
                scores = decoded[candidates] @ q[i].astype(np.float64)
                best = candidates[np.argsort(-scores, kind="stable")[:10]]
                np.testing.assert_array_equal(found.indices[i], best)
                np.testing.assert_allclose(found.scores[i], decoded[best] @ q[i], rtol=1e-5, atol=1e-5)
            assert found.bytes_per_document == {"int8": 37, "binary": 5}[precision]
            assert found.queries_per_second > 0
    exact = compressed.compressed_top_k(q, d, "float32", k=10)
    np.testing.assert_array_equal(exact.indices, search.exact_top_k(q, d, 10)[1])
    assert exact.bytes_per_document == 4 * 37


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda q, d: compressed.compressed_top_k(q, d, "int4"), "unknown evaluate.precisions entry 'int4'"),
        (lambda q, d: compressed.compressed_top_k(q, d, "int8"), "int8 search needs ranges"),
        (lambda q, d: compressed.compressed_top_k(q, d, "binary", rescore_factor=-1), "must be >= 0"),
        (lambda q, d: quantization.int8_ranges(d[:1]), "at least 2 embeddings"),
        (lambda q, d: quantization.quantize_int8(d, np.zeros((2, 5))), r"shape \(2, 5\).*need \(2, 37\)"),
        (lambda q, d: search.ExactIndex(quantization.pack_bits(d), bits=64), r"uint8 \[N, 8\]"),
        (
            lambda q, d: search.ExactIndex(quantization.pack_bits(d), bits=37).search(q, 3),
            r"queries must be packed bits \[Q, 5\]",
        ),
        (
            lambda q, d: search.ExactIndex(quantization.pack_bits(d), bits=37).search(
                quantization.pack_bits(q), 3, float_queries=q[:, :8], depth=9
            ),
            r"float queries \[60, 37\], got \(60, 8\)",
        ),
        (lambda q, d: search.ExactIndex(d).search(q, 3, float_queries=q, depth=9), "this one is float32"),
        (
            lambda q, d: search.ExactIndex(quantization.quantize_int8(d, quantization.int8_ranges(d))).search(
                quantization.quantize_int8(q, quantization.int8_ranges(d)), 3, float_queries=q, depth=9
            ),
            "build the ExactIndex with their ranges",
        ),
    ],
)
def test_bad_compressed_input_is_refused_with_what_to_do(embeddings, call, match):
    with pytest.raises(BadValueError, match=match):
        call(*embeddings)


def test_eval_precisions_writes_a_record_per_dimension_and_precision(trained_run, wordnet_env, tmp_path, capsys):
    """`samtone eval --precisions float32,int8,binary --rescore 2 --dims 8`: a record for each
    (dimension, precision[, rescored]); each one's P@1 that of a brute-force search written here on the
    embeddings the eval kept, compressed the same way (int8 calibrated on every document: the corpus
    is smaller than the sample); the model card ignores all but the float32 record."""
    from samtone_jax.cli import main as cli
    from samtone_jax.evaluation.embedding_store import load_shards
    from samtone_jax.export.model_card import eval_results
    from samtone_jax.tasks import catalogue

    run = tmp_path / "run"
    shutil.copytree(trained_run, run, ignore=shutil.ignore_patterns("eval"))
    flags = ["eval", f"--checkpoint={run}", "--task=wordnet_definitions", "--split=all"]
    assert cli.main([*flags, "--precisions", "float32,int8,binary", "--rescore", "2", "--dims", "8"]) == 0
    written = sorted(p.name for p in (run / "eval").glob("*.json"))
    base = "wordnet_definitions_all_step2"
    variants = ["", "_int8", "_int8_rescore2", "_binary", "_binary_rescore2"]
    assert written == sorted(f"{base}{dim}{v}.json" for dim in ("", "_dim8") for v in variants)
    collection = catalogue.collection("wordnet_definitions", "all")
    query_ids, q = load_shards(str(run / "eval" / "embeddings" / base / "queries"))
    doc_ids, d = load_shards(str(run / "eval" / "embeddings" / base / "documents"))
    assert query_ids == sorted(collection.queries) and doc_ids == sorted(collection.corpus)

    def p_at_1(scores):
        best = np.argmax(scores, axis=1)  # the first maximum: ties to the lower index, as the search
        return np.mean([collection.qrels[qid].get(doc_ids[j], 0) > 0 for qid, j in zip(query_ids, best, strict=True)])

    for dim in (8, 32):
        qk = q[:, :dim] / np.linalg.norm(q[:, :dim], axis=1, keepdims=True)
        dk = d[:, :dim] / np.linalg.norm(d[:, :dim], axis=1, keepdims=True)
        lo, hi = dk.min(axis=0), dk.max(axis=0)
        step = np.where(hi == lo, 1, (hi - lo) / np.float32(255))
        q8, d8 = (np.clip(np.floor((x - lo) / step), 0, 255) - 128 for x in (qk, dk))
        expected = {
            "int8": p_at_1(q8 @ d8.T),
            "binary": p_at_1(np.where(qk > 0, 1.0, -1.0) @ np.where(dk > 0, 1.0, -1.0).T),  # bit: x > 0
        }
        name = base + ("" if dim == 32 else f"_dim{dim}")
        for precision, bytes_per_document in (("int8", dim), ("binary", dim // 8)):
            record = json.loads((run / "eval" / f"{name}_{precision}.json").read_text())
            assert record["precision"] == precision and record["bytes_per_document"] == bytes_per_document
            assert record["metrics"]["P@1"] == pytest.approx(expected[precision], abs=1e-9), (dim, precision)
            assert record["queries_per_second"] > 0
        assert json.loads((run / "eval" / f"{name}_int8.json").read_text())["calibration"]["documents"] == len(d)
        rescored = json.loads((run / "eval" / f"{name}_binary_rescore2.json").read_text())
        assert rescored["rescore"] == 2 and rescored["precision"] == "binary"
    float32 = json.loads((run / "eval" / f"{base}.json").read_text())
    assert float32["precision"] == "float32" and float32["bytes_per_document"] == 4 * 32
    assert float32["metrics"]["P@1"] == pytest.approx(p_at_1(q @ d.T), abs=1e-9)
    assert [(r.get("dim"), r.get("precision")) for r in eval_results(str(run))] == [(None, "float32")]
    capsys.readouterr()
    assert cli.main([*flags, "--precisions", "float32,int4"]) == 2
    assert "unknown evaluate.precisions (--precisions) entry 'int4'" in capsys.readouterr().err
    assert cli.main([*flags, "--precisions", "int8,int8"]) == 2
    assert cli.main([*flags, "--precisions", "int8", "--rescore", "-1"]) == 2
    assert cli.main([*flags, "--rescore", "2"]) == 2  # nothing compressed to rescore: said, not ignored
    assert "re-ranks an int8 / binary index: add one to evaluate.precisions (--precisions)" in capsys.readouterr().err
    assert cli.main([*flags, "--precisions", "binary", "--gin.evaluate.backend='faiss'"]) == 2


def test_calibration_ships_with_the_model_through_load_eval_encode_and_export(
    trained_run, wordnet_env, tmp_path, capsys, caplog
):
    """`samtone calibrate` writes the ranges of an even sample of documents per served dimension;
    samtone_jax.load returns int8 codes equal to sentence-transformers' quantize_embeddings with those
    ranges (and its ubinary bits), eval uses them, encode stores codes, the export carries them (with
    the model card's explanation and MTEB's fields); a calibration of other weights or of another
    dimension is refused, not used."""
    from sentence_transformers.util.quantization import quantize_embeddings

    import samtone_jax
    from samtone_jax.cli import main as cli
    from samtone_jax.core.errors import MissingFileError
    from samtone_jax.evaluation.embedding_store import load_shards
    from samtone_jax.tasks import catalogue

    run = tmp_path / "run"
    shutil.copytree(trained_run, run, ignore=shutil.ignore_patterns("eval"))
    task = ["--task=wordnet_definitions", "--split=all"]
    texts = ["a small dog", "the capital of France", ""]
    with pytest.raises(MissingFileError, match="samtone calibrate --checkpoint="):
        samtone_jax.load(str(run)).encode_documents(texts, precision="int8")
    early = tmp_path / "early"  # refused before any shard or manifest is written
    assert cli.main(["encode", f"--checkpoint={run}", *task, f"--out={early}", "--precisions=int8"]) == 2
    assert "samtone calibrate" in capsys.readouterr().err and not early.exists()
    assert cli.main(["calibrate", f"--checkpoint={run}", *task, "--documents=30", "--dims", "8,32"]) == 0
    record = json.loads((run / "calibration.json").read_text())
    assert record["dims"] == [8, 32] and record["source"]["documents"] == 30 and record["source"]["step"] == 2
    corpus = catalogue.collection("wordnet_definitions", "all").corpus
    ids = sorted(corpus)
    sample = [corpus[ids[i]] for i in np.linspace(0, len(ids) - 1, 30).astype(int)]
    model = samtone_jax.load(str(run))
    d = model.encode_documents(sample)
    for dim in (8, 32):
        head = d[:, :dim] / np.linalg.norm(d[:, :dim], axis=1, keepdims=True)
        np.testing.assert_array_equal(record["int8_ranges"][str(dim)], [head.min(axis=0), head.max(axis=0)])
    x = model.encode_documents(texts)
    head = x[:, :8] / np.linalg.norm(x[:, :8], axis=1, keepdims=True)
    ranges = np.array(record["int8_ranges"]["8"])
    np.testing.assert_array_equal(
        model.encode_documents(texts, precision="int8", dim=8), quantize_embeddings(head, "int8", ranges=ranges)
    )
    np.testing.assert_array_equal(
        model.encode_queries(texts, precision="binary"), quantize_embeddings(model.encode_queries(texts), "ubinary")
    )
    with pytest.raises(BadValueError, match=r"int8 ranges for dimensions \[8, 32\], not 16.*--dims 16"):
        model.encode_documents(texts, precision="int8", dim=16)
    # eval reads the model's ranges; encode stores the codes
    flags = ["eval", f"--checkpoint={run}", *task, "--precisions", "int8"]
    assert cli.main(flags) == 0
    evaluated = json.loads((run / "eval" / "wordnet_definitions_all_step2_int8.json").read_text())
    assert evaluated["calibration"]["source"] == "the model's calibration.json"
    out = tmp_path / "codes"
    assert (
        cli.main(
            ["encode", f"--checkpoint={run}", *task, "--side=document", f"--out={out}", "--precisions=int8", "--dims=8"]
        )
        == 0
    )
    stored_ids, codes = load_shards(str(out / "documents"))
    assert codes.dtype == np.int8 and codes.shape == (len(ids), 8) and stored_ids == ids
    # encode shards its batches over the 8 test devices, load encodes on one: float embeddings equal to
    # ~1e-7, so a value on a bucket edge may land one code over. The calibration texts are in this corpus:
    # each dimension's largest value sits exactly on the top edge (code = floor(255.0)), so the codes may
    # differ there, and only there (within 1e-3 of a bucket's edge, ~100x the float difference)
    loaded = model.encode_documents([corpus[i] for i in ids], precision="int8", dim=8).astype(int)
    floats = model.encode_documents([corpus[i] for i in ids])[:, :8]
    position = (floats / np.linalg.norm(floats, axis=1, keepdims=True) - ranges[0]) / ((ranges[1] - ranges[0]) / 255)
    on_edge = np.abs(position - np.round(position)) < 1e-3
    differ = codes.astype(int) != loaded
    assert np.abs(codes.astype(int) - loaded).max() <= 1 and on_edge[differ].all(), position[differ & ~on_edge]
    # the export carries them
    export = tmp_path / "export"
    assert cli.main(["export", f"--checkpoint={run}", "--format=hf", f"--out={export}"]) == 0
    assert json.loads((export / "calibration.json").read_text()) == record
    info = json.loads((export / "samtone.json").read_text())
    assert info["calibration"] == "calibration.json"
    assert info["mteb"] == {
        "embed_dim": 32,
        "max_tokens": 12,
        "similarity_fn_name": "cosine",
        "output_dtypes": ["float32", "int8", "binary"],
        "training_datasets": {"wordnet_definitions": ["all"]},
    }
    assert "quantize_embeddings(embeddings, 'int8'" in (export / "README.md").read_text()
    exported = samtone_jax.load(str(export))
    np.testing.assert_array_equal(
        exported.encode_documents(texts, precision="int8", dim=8),
        model.encode_documents(texts, precision="int8", dim=8),
    )
    # a calibration made with other weights is not used; a damaged one is refused naming the file
    (run / "calibration.json").write_text(json.dumps(dict(record, source=dict(record["source"], step=1))))
    with caplog.at_level("WARNING"):
        assert samtone_jax.load(str(run)).calibration is None
    assert "is of step 1 (params), not step 2 (params): not used" in caplog.text
    (run / "calibration.json").write_text(json.dumps(dict(record, int8_ranges={"8": [[0.0] * 7, [1.0] * 7]})))
    with pytest.raises(BadValueError, match=r"calibration.json's int8 ranges of dimension 8 have shape \(2, 7\)"):
        samtone_jax.load(str(run))
    capsys.readouterr()
    assert cli.main(["calibrate", f"--checkpoint={run}", *task, "--documents=1"]) == 2
    assert "--documents must be at least 2" in capsys.readouterr().err
    assert cli.main(["calibrate", f"--checkpoint={run}", *task, "--documents=30", "--dims", "8,32"]) == 0  # replaced
    assert json.loads((run / "calibration.json").read_text()) == record


def test_the_in_training_eval_scores_the_compressed_index_too(trained_run, wordnet_env):
    """RetrievalEval.precisions: retrieval/<precision>[_rescoreR]/<measure> beside the float32 metrics;
    binary's P@1 is the brute-force P@1 of the sign vectors of the same embeddings (ties to the lower
    index, as the index returns them)."""
    import samtone_jax
    from samtone_jax.evaluation.train_hook import RetrievalEval

    model = samtone_jax.load(str(trained_run))
    hook = RetrievalEval(
        model.model,
        None,
        model.vocabulary,
        "wordnet_definitions",
        "all",
        model.query_length,
        model.doc_length,
        precisions=("int8", "binary"),
        rescore=2,
    )
    found = hook(model.params)
    for prefix in (
        "retrieval",
        "retrieval/int8",
        "retrieval/int8_rescore2",
        "retrieval/binary",
        "retrieval/binary_rescore2",
    ):
        assert f"{prefix}/P@1" in found and f"{prefix}/RR" in found
    q = hook.encoder.encode_all(hook.query_tokens, "query", params=model.params)
    d = hook.encoder.encode_all(hook.doc_tokens, "document", params=model.params)
    best = np.argmax(np.where(q > 0, 1.0, -1.0) @ np.where(d > 0, 1.0, -1.0).T, axis=1)
    p1 = np.mean([hook.qrels[qid].get(hook.doc_ids[j], 0) > 0 for qid, j in zip(hook.query_ids, best, strict=True)])
    assert found["retrieval/binary/P@1"] == pytest.approx(p1, abs=1e-9)
    with pytest.raises(BadValueError, match="RetrievalEval.precisions entry 'int4'"):
        RetrievalEval(model.model, None, model.vocabulary, "wordnet_definitions", "all", 8, 12, precisions=("int4",))
