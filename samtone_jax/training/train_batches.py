"""The batch source of `samtone train`: what the run reads (TrainInputs), how its rows are packed
(Packing), and the global arrays each step takes.

  seqio task or mixture -> this host's tf.data batches (data/pipeline.py; a mixture's task-
  homogeneous batches: tasks/task_batches.py) -> model_features (tokens and folded ids) -> packed
  rows (data/packing.py) -> one global jax.Array per feature (partitioning.host_to_global)
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import gin
import jax
import numpy as np

from samtone_jax.core.errors import BadValueError
from samtone_jax.data.input_spec import InputSpec
from samtone_jax.models import partitioning
from samtone_jax.tasks.task_batches import TaskBatches, mixture_batches
from samtone_jax.training import teacher_embeddings

ID_FEATURES = ("query_id", "doc_id", "negative_ids", "guide_ids")
TEACHER_EMBEDDINGS = tuple(teacher_embeddings.NAMES.values())


def fold_ids(ids: np.ndarray) -> np.ndarray:
    """int64 hashes -> int32 (JAX's default width): xor of the halves, equal ids stay equal."""
    ids = np.asarray(ids, np.int64)
    return ((ids ^ (ids >> 32)) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


def model_features(batch: dict[str, np.ndarray], id_masking: bool = True) -> dict[str, np.ndarray]:
    """The arrays the step consumes (tokens and folded ids; bookkeeping features dropped). Without
    id_masking the ids are dropped too: the loss then treats only the diagonal as positive."""
    keep = ("query_tokens", "doc_tokens", "negative_tokens", "teacher_scores", *TEACHER_EMBEDDINGS)
    keep += ID_FEATURES if id_masking else ()
    return {k: (fold_ids(v) if k in ID_FEATURES else v) for k, v in batch.items() if k in keep}


@dataclasses.dataclass(frozen=True)
class TrainInputs:
    """What a run reads (gin `train.*` and `inputs.*`): `task` / `split`, the *global* `batch_size`, the data order
    (`seed`, `data_shards`, `shuffle_block_size`: data/pipeline.py), what every example carries
    (`spec`), whether ids mask duplicates (`id_masking`), a mixture's one-task batches
    (`task_batches`), and the teacher's embeddings of its texts (`teacher_embeddings`: folders,
    training/teacher_embeddings.py)."""

    task: str
    split: str
    batch_size: int
    spec: InputSpec
    seed: int = 0
    data_shards: int | None = None
    shuffle_block_size: int = 1
    id_masking: bool = True
    task_batches: TaskBatches | None = None
    teacher_embeddings: str | tuple[str, ...] | None = None

    def __post_init__(self):
        guide = self.spec.guide
        if self.task_batches is not None and self.task_batches.no_in_batch_negatives:
            if not self.id_masking or not self.spec.num_negatives:
                raise BadValueError(
                    "TaskBatches.no_in_batch_negatives trains those tasks on their hard negatives alone (pairs marked "
                    "one example by query id): it needs inputs.id_masking = True and inputs.num_negatives > 0"
                )
        if self.spec.negatives_fallback and not self.id_masking:
            raise BadValueError(
                "inputs.negatives_fallback pads with each query's own positive, which the loss removes by its "
                "document id: it needs inputs.id_masking = True"
            )
        if guide is not None and not self.id_masking:
            raise BadValueError("inputs.teacher_guide masks by document ids: it needs inputs.id_masking = True")
        if guide is not None and not guide.active:
            raise BadValueError(
                "inputs.teacher_guide is a FalseNegativeFilter with no cut: set FalseNegativeFilter.margin (0: scored "
                "above the positive), FalseNegativeFilter.relative_margin or FalseNegativeFilter.max_score"
            )

    def check_mesh(self, mesh) -> None:
        hosts = jax.process_count()
        if self.batch_size % mesh.shape["data"] or self.batch_size % hosts:
            raise BadValueError(
                f"BATCH_SIZE={self.batch_size} must be divisible by the {mesh.shape['data']} data-parallel devices "
                f"of the {hosts} host(s)"
            )

    def task_names(self) -> list[str]:
        """The tasks the run draws from: the task, or a mixture's members."""
        from samtone_jax.tasks import catalogue

        mixtures = catalogue.mixtures()
        names = list(mixtures[self.task]) if self.task in mixtures else [self.task]
        if self.task not in mixtures and self.task not in catalogue.loaders():
            import seqio  # a mixture registered with seqio in Python (T5X's way), not declared in gin

            if self.task in seqio.MixtureRegistry.names():
                names = [t.name for t in seqio.get_mixture_or_task(self.task).tasks]
        return names

    def teacher(self) -> teacher_embeddings.TeacherEmbeddings | None:
        """The teacher's embeddings of the training texts (read once a process), or None."""
        if self.teacher_embeddings is None:
            return None
        folders = self.teacher_embeddings
        folders = folders if isinstance(folders, str) else tuple(folders)
        return teacher_embeddings.load(folders, tuple(self.task_names()), self.split)

    def check_data(self, also_splits: tuple[str, ...] = ()) -> None:
        """Read every task the run draws from, as the run will (a mixture: each member now, not when
        it is first drawn, which may be hours in), before MODEL_DIR is written: a missing file, a task
        with no query that has inputs.num_negatives hard negatives, or a batch larger than its task's
        examples fails at start-up, naming the task. `also_splits` (the in-batch eval's
        train_eval.split) are read the same way."""
        from samtone_jax.tasks import registration

        names = self.task_names()
        sizes = {name: len(registration.examples(name, self.split, self.spec)["query_id"]) for name in names}
        self.teacher()  # read and checked against the tasks' texts now
        for split in also_splits:
            for name in names:
                if not len(registration.examples(name, split, self.spec)["query_id"]):
                    raise BadValueError(f"train_eval.split: task {name}/{split} has no pairs to evaluate on")
        if self.task_batches is None:
            if sum(sizes.values()) < self.batch_size:
                raise BadValueError(
                    f"train.batch_size = {self.batch_size} is larger than {self.task}/{self.split}'s "
                    f"{sum(sizes.values())} training pairs: lower BATCH_SIZE"
                )
            return
        for name, size in sizes.items():
            wanted = dict(self.task_batches.batch_sizes or {}).get(name, self.batch_size)
            if size < wanted:
                raise BadValueError(
                    f"task {name}/{self.split} has {size} training pairs, fewer than its batch of {wanted} "
                    "(inputs.task_batches: one task a batch): lower BATCH_SIZE or TaskBatches.batch_sizes"
                )

    def dataset(self):
        """(task, split, start_batch=k[, batch_size=per host]) -> this host's tf.data batches."""
        from samtone_jax.data import pipeline  # seqio + TensorFlow: when a run starts, not for every gin parse

        hosts = jax.process_count()
        return functools.partial(
            pipeline.train_dataset,
            spec=self.spec,
            batch_size=self.batch_size // hosts,
            seed=self.seed,
            shard_index=jax.process_index(),
            num_shards=hosts,
            data_shards=self.data_shards,
            shuffle_block_size=self.shuffle_block_size,
        )


@gin.configurable("packing")
@dataclasses.dataclass(frozen=True)
class Packing:
    """gin `packing.*`: when `enabled`, each device's pairs packed into its own rows (data/packing.py), at most
    `max_segments` texts a row, the row count rounded up to `row_bits` significant binary digits and
    at least the most that the run's first `row_sample` batches need (0: each batch its own count).

    The floor bounds compilation: without it each row count compiles when it first appears, and new
    counts keep appearing for dozens of steps (a stall of a compilation each: minutes on a pod).
    The floor is a function of the data alone (batches 0 .. row_sample - 1, also when resuming), so a
    resumed run packs every batch as the uninterrupted run did."""

    enabled: bool = False
    max_segments: int = 8
    row_bits: int = 3
    row_sample: int = 64

    def __post_init__(self):
        if self.max_segments < 1 or self.row_bits < 1 or self.row_sample < 0:
            raise BadValueError(
                f"packing.max_segments = {self.max_segments} and packing.row_bits = {self.row_bits} "
                f"must be ≥ 1, packing.row_sample = {self.row_sample} ≥ 0"
            )

    def row_floor(self, mesh, batches) -> tuple[int, int]:
        """The most (query, document) rows a device needs over these model-feature batches."""
        from samtone_jax.data.packing import rows_needed

        devices = mesh.shape["data"] // jax.process_count()
        needed = [rows_needed(batch, devices, self.max_segments) for batch in batches]
        return tuple(int(max(n[i] for n in needed)) for i in (0, 1)) if needed else (0, 0)

    def packer(self, mesh, grad_cache_chunk_size: int | None, min_rows: tuple[int, int] = (0, 0)):
        """features -> packed features (this host's devices' rows), at least `min_rows` a device. Every
        host's row count must agree (one global array): with several hosts the largest is taken."""
        from samtone_jax.data.packing import pack_batch

        devices = mesh.shape["data"] // jax.process_count()
        agree = None
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            def agree(rows: tuple[int, int]) -> tuple[int, int]:
                q, d = np.max(multihost_utils.process_allgather(np.asarray(rows, np.int32)), axis=0)
                return int(q), int(d)

        host, chunk = jax.process_index(), grad_cache_chunk_size or 1  # GradCache encodes chunks of whole rows
        return lambda features: pack_batch(
            features, devices, self.max_segments, self.row_bits, chunk, agree, host, min_rows
        )


def batch_source(inputs: TrainInputs, mesh, packing: Packing | None, grad_cache_chunk_size: int | None):
    """batches(start): the global batches of steps start, start + 1, ... (each a dict of global
    arrays; a task-homogeneous batch also names its task under 'task')."""
    dataset = inputs.dataset()
    teacher = inputs.teacher()

    def step_features(batch):
        return model_features(batch if teacher is None else teacher.attach(batch), inputs.id_masking)

    def features(start: int):
        """(task name or None, model features) of the steps start, start + 1, ... on this host."""
        if inputs.task_batches is None:
            for batch in dataset(inputs.task, inputs.split, start_batch=start).as_numpy_iterator():
                yield None, step_features(batch)
            return
        source = mixture_batches(
            inputs.task,
            inputs.split,
            inputs.task_batches,
            dataset,
            inputs.batch_size,
            inputs.seed,
            start,
            mesh.shape["data"],
        )
        for name, batch in source:
            yield name, step_features(batch)

    def batches(start: int):
        stream = features(start)
        packers = {}
        if packing is not None:
            # The first row_sample batches set each task's row floor; from start 0 they are the batches
            # the run takes first (kept), when resuming the same batches are read again.
            sample = list(itertools.islice(stream if start == 0 else features(0), packing.row_sample))
            if start == 0:
                stream = itertools.chain(sample, stream)
            for name in {name for name, _ in sample} | {None}:
                floor = packing.row_floor(mesh, [f for n, f in sample if n == name])
                packers[name] = packing.packer(mesh, grad_cache_chunk_size, floor)
        for name, batch in stream:
            if packing is not None:
                if name not in packers:  # a task the sample did not draw: no floor
                    packers[name] = packing.packer(mesh, grad_cache_chunk_size)
                batch = packers[name](batch)
            placed = partitioning.host_to_global(mesh, batch)
            yield placed if name is None else dict(placed, task=name)

    return batches


def eval_batches(inputs: TrainInputs, mesh, split: str, count: int):
    """The first `count` global batches of `split` (seed-fixed, unpacked): the in-batch eval's."""
    source = inputs.dataset()(inputs.task, split, start_batch=0).as_numpy_iterator()
    for _, batch in zip(range(count), source, strict=False):
        yield partitioning.host_to_global(mesh, model_features(batch, inputs.id_masking))
