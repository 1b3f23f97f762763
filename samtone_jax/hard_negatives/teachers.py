"""Teachers for `samtone score`: BM25, a samtone model, a sentence-transformers bi-encoder or CrossEncoder.

Every teacher scores (query, document) pairs; all but the cross-encoder also retrieve a query's
top documents from the whole corpus (a cross-encoder scores given pairs only: give it candidates,
e.g. a `samtone mine` file). Scores are what each teacher ranks by: BM25's (bm25s, English
stopwords, as `samtone mine --bm25`), the cosine of L2-normalised embeddings (a samtone model or
export; a sentence-transformers folder, with its query / document prompts), a cross-encoder's raw
logit (no sigmoid: margins stay linear). Ties rank by corpus position, so a run is deterministic.

`load_teacher(spec, kind)`: spec 'bm25' or a folder (local or gs://); kind 'auto' tells a samtone
MODEL_DIR / checkpoint / export, a sentence-transformers folder (modules.json) and a CrossEncoder
folder (a *ForSequenceClassification config.json) apart, and an explicit kind that does not
match the folder is an error naming both.
"""

from __future__ import annotations

import json
import logging

import numpy as np

from samtone_jax.core import paths, run_folders
from samtone_jax.core.errors import BadValueError, MissingFileError

KINDS = ("auto", "bm25", "samtone", "sentence-transformers", "cross-encoder")


def top_k(scores: np.ndarray, depth: int) -> np.ndarray:
    """[Q, N] scores -> [Q, min(depth, N)] indices, best first; a stable sort, so ties by index."""
    return np.argsort(-scores, axis=1, kind="stable")[:, :depth]


# Queries scored against the whole corpus at once: at most this many scores in memory (256 MiB).
SCORE_BLOCK = 1 << 26


class _Retriever:
    """top / score from `full_scores(queries) -> [Q, N]`, in blocks of queries that bound memory."""

    can_retrieve = True

    def _blocks(self, queries: list[str]):
        step = max(1, SCORE_BLOCK // max(self._size, 1))
        for start in range(0, len(queries), step):
            yield start, self.full_scores(queries[start : start + step])

    def rank(self, queries: list[str], depth: int, also: list[list[int]]):
        """([Q, depth] corpus indices best first, their scores, per query the scores of its `also`
        indices), from one scoring pass."""
        ranked, scores, extra = [], [], []
        for start, block in self._blocks(queries):
            best = top_k(block, depth)
            ranked.append(best)
            scores.append(np.take_along_axis(block, best, axis=1))
            rows = also[start : start + len(block)]
            extra += [row[np.asarray(c, np.int64)] for row, c in zip(block, rows, strict=True)]
        return np.concatenate(ranked), np.concatenate(scores), extra

    def score(self, queries: list[str], candidates: list[list[int]]) -> list[np.ndarray]:
        """Per query, the scores of its candidate corpus indices."""
        out = []
        for start, block in self._blocks(queries):
            out += [
                row[np.asarray(c, np.int64)]
                for row, c in zip(block, candidates[start : start + len(block)], strict=True)
            ]
        return out


class BM25Teacher(_Retriever):
    kind = "bm25"

    def __init__(self):
        self.name = "bm25"

    def index(self, corpus: list[str]) -> None:
        import bm25s

        logging.getLogger("bm25s").setLevel(logging.WARNING)
        self._bm25s = bm25s
        self._retriever = bm25s.BM25()
        self._retriever.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)
        self._size = len(corpus)

    def full_scores(self, queries: list[str]) -> np.ndarray:
        """[Q, N] float32 BM25 scores of every corpus document (0 for a query with no term left)."""
        tokens = self._bm25s.tokenize(queries, stopwords="en", show_progress=False, return_ids=False)
        rows = [self._retriever.get_scores(t) if t else np.zeros(self._size) for t in tokens]
        return np.asarray(rows, np.float32).reshape(len(queries), self._size)


class DenseTeacher(_Retriever):
    """A bi-encoder: `encode_queries(texts)` / `encode_documents(texts)` -> [N, P] L2-normalised."""

    def __init__(self, name: str, kind: str, encode_queries, encode_documents):
        self.name, self.kind = name, kind
        self._encode_queries, self._encode_documents = encode_queries, encode_documents

    def index(self, corpus: list[str]) -> None:
        self._corpus = np.asarray(self._encode_documents(corpus), np.float32)
        self._size = len(corpus)

    def full_scores(self, queries: list[str]) -> np.ndarray:
        """[Q, N] cosines of the queries with every corpus document."""
        return np.asarray(self._encode_queries(queries), np.float32) @ self._corpus.T


class CrossEncoderTeacher:
    kind = "cross-encoder"
    can_retrieve = False

    def __init__(self, path: str, batch_size: int):
        import torch
        from sentence_transformers import CrossEncoder

        from samtone_jax.checkpoints.hf import refuse_code_pickles

        self.name = paths.as_str(path)
        local = paths.local_copy(path)
        refuse_code_pickles(local)
        self._model = CrossEncoder(local, device="cpu", local_files_only=True)
        if self._model.num_labels != 1:
            raise BadValueError(
                f"--checkpoint={path} is a cross-encoder with {self._model.num_labels} labels; a teacher needs one "
                "relevance score per pair (num_labels 1)"
            )
        self._identity, self._batch_size = torch.nn.Identity(), batch_size

    def index(self, corpus: list[str]) -> None:
        self._corpus = corpus

    def score(self, queries: list[str], candidates: list[list[int]]) -> list[np.ndarray]:
        pairs = [(q, self._corpus[j]) for q, c in zip(queries, candidates, strict=True) for j in c]
        flat = np.asarray(
            self._model.predict(
                pairs, batch_size=self._batch_size, activation_fn=self._identity, show_progress_bar=False
            ),
            np.float32,
        ).reshape(-1)
        return np.split(flat, np.cumsum([len(c) for c in candidates])[:-1])


def detect(path: str) -> str:
    """The kind of teacher folder `path` is (see the module docstring)."""
    folder = paths.as_path(path)
    if not folder.is_dir():
        raise MissingFileError(f"--checkpoint={path}: no such folder (expected 'bm25' or a model folder)")
    if run_folders.kind(folder) is not None:
        return "samtone"  # a run, a checkpoint or an export (which also has modules.json)
    if (folder / "modules.json").exists():
        return "sentence-transformers"
    config = folder / "config.json"
    if config.exists():
        architectures = json.loads(config.read_text()).get("architectures") or []
        if any(a.endswith("ForSequenceClassification") for a in architectures):
            return "cross-encoder"
    raise BadValueError(
        f"--checkpoint={path} is not a teacher folder: expected a samtone MODEL_DIR, checkpoint or export, a "
        "sentence-transformers folder (modules.json) or a CrossEncoder folder (config.json of a "
        "*ForSequenceClassification model)"
    )


def detect_kind(spec: str, kind: str = "auto") -> str:
    """The kind of teacher `spec` ('bm25' or a folder) is, checked against an explicit `kind`."""
    if kind not in KINDS:
        raise BadValueError(f"--teacher_kind={kind!r} must be one of {KINDS}")
    if spec == "bm25" or kind == "bm25":
        if spec != "bm25":
            raise BadValueError(f"--teacher_kind=bm25 takes --checkpoint=bm25, not {spec!r}")
        return "bm25"
    found = detect(spec)
    if kind != "auto" and kind != found:
        raise BadValueError(
            f"--checkpoint={spec} is a {found} folder, not a {kind} one: fix --teacher_kind or --checkpoint"
        )
    return found


def load_teacher(spec: str, kind: str = "auto", *, step=None, vocabulary=None, batch_size: int = 64, mesh=None):
    """The teacher `spec` names ('bm25' or a folder) of `kind` (KINDS); batch_size: texts a batch
    of a model teacher."""
    found = detect_kind(spec, kind)
    if found == "bm25":
        return BM25Teacher()
    if found == "samtone":
        from samtone_jax.inference import encoder as inference

        encoder = inference.load_encoder(spec, step=step, vocabulary=vocabulary, batch_size=batch_size, mesh=mesh)
        name = f"samtone:{paths.as_str(spec)}@{encoder.step}"
        return DenseTeacher(name, found, encoder.encode_queries, encoder.encode_documents)
    if found == "sentence-transformers":
        from sentence_transformers import SentenceTransformer

        from samtone_jax.checkpoints.hf import refuse_code_pickles

        local = paths.local_copy(spec)
        refuse_code_pickles(local)
        model = SentenceTransformer(local, device="cpu", local_files_only=True)

        def encode(method):
            return lambda texts: method(
                texts, batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False
            )

        return DenseTeacher(
            f"sentence-transformers:{paths.as_str(spec)}",
            found,
            encode(model.encode_query),
            encode(model.encode_document),
        )
    return CrossEncoderTeacher(spec, batch_size)
