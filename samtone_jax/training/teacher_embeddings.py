"""A teacher's embeddings of every training text, attached to each batch for embedding-level
distillation (objectives/embedding_distillation.py).

The teacher is run once, before training, by the mode every model already has:

  samtone encode --checkpoint=TEACHER --task=TASK --split=train --side=both --out=FOLDER

(FOLDER/queries and FOLDER/documents, each a resumable embedding store keyed by the collection's
ids). `inputs.teacher_embeddings = FOLDER` (or several folders: a mixture's tasks, one each) makes
the run read them back: each side's rows are keyed by the text id the batch carries
(data/collection.text_id), so a batch's `teacher_query_embedding` / `teacher_doc_embedding` [B, D_t]
are looked up on the host, next to its tokens, and the teacher never runs during training (nor needs
the student's tokenizer or width).

A folder encoded from other texts than the task's split has now (an edited file, another split) is
refused by the store's own fingerprint of its (id, text) rows, never silently used stale.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from samtone_jax.core import paths
from samtone_jax.core.errors import BadValueError
from samtone_jax.data.collection import text_id

NAMES = {"query_id": "teacher_query_embedding", "doc_id": "teacher_doc_embedding"}
SIDES = (("queries", "query_id"), ("documents", "doc_id"))


@dataclasses.dataclass(frozen=True)
class TeacherEmbeddings:
    """Each side's sorted text ids [N] int64 and their embeddings [N, D_t] float32."""

    ids: dict[str, np.ndarray]
    embeddings: dict[str, np.ndarray]
    where: str

    @property
    def width(self) -> int:
        return int(self.embeddings["query_id"].shape[1])

    def attach(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The batch with teacher_query_embedding / teacher_doc_embedding [B, D_t], looked up by its
        int64 query_id / doc_id (before the ids are folded)."""
        out = dict(batch)
        for id_name, name in NAMES.items():
            ids, table = self.ids[id_name], self.embeddings[id_name]
            wanted = np.asarray(batch[id_name], np.int64)
            rows = np.minimum(np.searchsorted(ids, wanted), len(ids) - 1)
            missing = ids[rows] != wanted
            if missing.any():
                raise BadValueError(
                    f"inputs.teacher_embeddings ({self.where}) has no {id_name.split('_')[0]} embedding for "
                    f"{int(missing.sum())} of this batch's texts: encode every task and split the run reads with the "
                    "teacher (samtone encode --side=both)"
                )
            out[name] = table[rows]
        return out

    def positive_probability(
        self, pairs: list[tuple[int, int]], batch_size: int, temperature: float, batches: int = 200, seed: int = 0
    ) -> float:
        """The teacher's mean in-batch softmax probability on each query's own document: `batches`
        batches of `batch_size` distinct `pairs` (query text id, document text id) drawn at random (all
        of them in each when there are fewer), each query's softmax at `temperature` over its batch's
        documents, less the other copies of its own document and the documents of its own query's other
        pairs (as id masking leaves them out of the training loss). Near 1, the teacher's soft labels
        are the pairs' hard labels (a teacher that learnt these pairs): distilling its in-batch ranking
        adds little beyond the contrastive loss. Batches as `in_batch_cosines` draws them."""
        total = 0.0
        for cosines in self.in_batch_cosines(pairs, batch_size, batches, seed):
            logits = cosines / temperature
            logits -= logits.max(axis=1, keepdims=True)
            total += float(np.mean(np.exp(np.diag(logits)) / np.exp(logits).sum(axis=1)))
        return total / batches

    def in_batch_cosines(self, pairs: list[tuple[int, int]], batch_size: int, batches: int = 200, seed: int = 0):
        """The teacher's query x document cosines of `batches` batches of `batch_size` distinct `pairs`
        (query text id, document text id) drawn at random (all of them in each when there are fewer),
        one float64 matrix a batch with each query's own document on the diagonal; -inf where id masking
        would leave a document out (another copy of the query's document, or the document of another of
        its query's pairs). Only the drawn pairs' rows are read."""
        if not pairs:
            raise BadValueError(f"inputs.teacher_embeddings ({self.where}): no pairs to measure the teacher on")
        ids = np.asarray(pairs, np.int64)
        rng, size = np.random.default_rng(seed), min(batch_size, len(ids))
        picks = [rng.choice(len(ids), size, replace=False) for _ in range(batches)]
        used, where = np.unique(np.concatenate(picks), return_inverse=True)
        rows = self.attach({"query_id": ids[used, 0], "doc_id": ids[used, 1]})
        q, d = (rows[name].astype(np.float64) for name in NAMES.values())
        q, d = (x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12) for x in (q, d))
        for batch in np.split(where, batches):
            query_ids, doc_ids = ids[used[batch], 0], ids[used[batch], 1]
            same = (doc_ids[:, None] == doc_ids[None, :]) | (query_ids[:, None] == query_ids[None, :])
            yield np.where(same & ~np.eye(size, dtype=bool), -np.inf, q[batch] @ d[batch].T)


def load(folders: str | tuple[str, ...], tasks: tuple[str, ...], split: str) -> TeacherEmbeddings:
    """The teacher embeddings of `tasks`' `split` from `folders` (one `samtone encode --side=both`
    folder a task, in the same order; one folder serves a single task). Read once a process while
    the folders' manifests stay the same (a folder encoded again is read again)."""
    from samtone_jax.evaluation import embedding_store

    folders = (folders,) if isinstance(folders, str) else tuple(folders)
    manifests = tuple(
        repr(embedding_store.read_manifest(paths.join(folder, sub))) for folder in folders for sub, _ in SIDES
    )
    return _load(folders, tuple(tasks), split, manifests)


@functools.lru_cache(maxsize=4)
def _load(folders: tuple[str, ...], tasks: tuple[str, ...], split: str, manifests: tuple[str, ...]):
    from samtone_jax.evaluation import embedding_store
    from samtone_jax.tasks import catalogue

    if len(folders) != len(tasks):
        raise BadValueError(
            f"inputs.teacher_embeddings names {len(folders)} folder(s) for the {len(tasks)} task(s) the run reads "
            f"({', '.join(tasks)}): give one `samtone encode --side=both` folder a task, in that order"
        )
    ids = {side: [] for _, side in SIDES}
    rows = {side: [] for _, side in SIDES}
    for folder, task in zip(folders, tasks, strict=True):
        collection = catalogue.collection(task, split)
        for sub, side in SIDES:
            texts = collection.queries if side == "query_id" else collection.corpus
            store = paths.join(folder, sub)
            manifest = embedding_store.read_manifest(store)
            order = sorted(texts)
            if manifest.get("texts_sha1") != embedding_store.texts_sha1(order, [texts[i] for i in order]):
                raise BadValueError(
                    f"inputs.teacher_embeddings: {store} was encoded from other texts than task {task}/{split}'s "
                    f"{sub} now (another split, or the data changed): encode again with samtone encode "
                    f"--task={task} --split={split} --side=both --out=<a new folder>"
                )
            keys, vectors = embedding_store.load_shards(store)
            if vectors.dtype != np.float32:
                raise BadValueError(f"inputs.teacher_embeddings: {store} is {vectors.dtype}; encode it as float32")
            ids[side].append(np.array([text_id(texts[k]) for k in keys], np.int64))
            rows[side].append(vectors)
    out_ids, out_rows = {}, {}
    for side in ids:
        every, vectors = np.concatenate(ids[side]), np.concatenate(rows[side])
        every, first = np.unique(every, return_index=True)  # a text twice (equal up to case): its first row
        out_ids[side], out_rows[side] = every, np.ascontiguousarray(vectors[first])
    widths = {v.shape[1] for v in out_rows.values()}
    if len(widths) != 1:
        raise BadValueError(f"inputs.teacher_embeddings: the folders hold embeddings of widths {sorted(widths)}")
    return TeacherEmbeddings(out_ids, out_rows, ", ".join(folders))
