"""Task-homogeneous batches from a mixture: every global batch holds examples of one task only.

A seqio mixture mixes examples inside a batch, so a WordNet definition becomes an in-batch negative
of a SQuAD question: an easy negative that teaches nothing (and across near-duplicate tasks a false
one). With `inputs.task_batches = @TaskBatches()` each step's batch comes from one member task,
drawn with the probabilities of `rates`:

  'mixture'       the mixture's own rates (seqio.MixtureRegistry.add(name, [(task, rate), ...]))
  'proportional'  the members' training-example counts
  'temperature'   counts^(1/T), T = `temperature` (T > 1 flattens towards uniform; T = 1 proportional)

The task of step s is a pure function of (seed, s) (a counter-based hash, not a stateful RNG), so
every host draws the same task for a step and a run resumed at step k sees exactly the batches it
would have seen: each task's own stream (pipeline.train_dataset, with its shards and shuffle) is
resumed at the number of times that task was drawn before step k. `batch_sizes` gives a task its
own global batch (default train.batch_size); tasks in `no_in_batch_negatives` (documents that
overlap across pairs) are trained without in-batch negatives: every pair of such a batch is marked
one example (one shared query id), which removes the other pairs' queries and positives from every
term; the hard negatives (inputs.num_negatives > 0, required) stay, shared by the batch as always.
"""

from __future__ import annotations

import dataclasses
import zlib

import gin
import numpy as np

from samtone_jax.core.errors import BadValueError

RATES = ("mixture", "proportional", "temperature")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TaskBatches:
    rates: str = "mixture"
    temperature: float = 1.0
    batch_sizes: dict | None = None
    no_in_batch_negatives: tuple = ()

    def __post_init__(self):
        if self.rates not in RATES:
            raise BadValueError(f"TaskBatches.rates={self.rates!r} must be one of {RATES}")
        if not self.temperature > 0:
            raise BadValueError(f"TaskBatches.temperature must be > 0; got {self.temperature}")
        if self.temperature != 1.0 and self.rates != "temperature":
            raise BadValueError(
                f"TaskBatches.temperature={self.temperature} is used by rates='temperature' only; rates is "
                f"{self.rates!r}"
            )


def probabilities(mixture, split: str, config: TaskBatches, count_examples) -> tuple[list[str], np.ndarray]:
    """(member task names, their probabilities) of a seqio Mixture; count_examples(name, split) -> int."""
    names = [t.name for t in mixture.tasks]
    if config.rates == "mixture":
        weights = np.array([mixture.get_rate(t) for t in mixture.tasks], np.float64)
    else:
        counts = np.array([count_examples(n, split) for n in names], np.float64)
        weights = counts ** (1.0 / (config.temperature if config.rates == "temperature" else 1.0))
    if not np.all(weights >= 0) or not weights.sum() > 0:
        raise BadValueError(
            f"mixture {mixture.name}: rates {dict(zip(names, weights, strict=True))} must be >= 0, not all 0"
        )
    unknown = set(config.batch_sizes or {}) - set(names) | set(config.no_in_batch_negatives) - set(names)
    if unknown:
        raise BadValueError(
            f"TaskBatches names {sorted(unknown)}, which are not tasks of mixture {mixture.name} ({names})"
        )
    return names, weights / weights.sum()


def _uniform(seed: int, steps: np.ndarray) -> np.ndarray:
    """Uniform [0, 1) numbers, one per step, a pure function of (seed, step) (splitmix64)."""
    golden = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        x = np.asarray(steps, np.uint64) + np.uint64(seed & 0xFFFFFFFF) * golden + golden
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def task_sequence(seed: int, probs: np.ndarray, start: int, count: int) -> np.ndarray:
    """The task index of each step in [start, start + count)."""
    edges = np.cumsum(probs)
    edges[-1] = 1.0
    return np.searchsorted(edges, _uniform(seed, np.arange(start, start + count)), side="right")


def one_example_id(task: str) -> int:
    """The query id every pair of a no-in-batch-negatives batch shares (the same on every host)."""
    return zlib.crc32(f"samtone-task-batch:{task}".encode())


def batches(
    mixture,
    split: str,
    config: TaskBatches,
    *,
    dataset,
    global_batch: int,
    hosts: int,
    seed: int,
    start: int,
    count_examples,
    data_devices: int = 1,
):
    """(task name, this host's batch) for every step from `start` on. dataset(task, split,
    batch_size=per host, start_batch=k) -> the task's own tf.data batches (pipeline.train_dataset);
    every task's global batch must divide over the hosts and the `data_devices` data-parallel devices."""
    names, probs = probabilities(mixture, split, config, count_examples)
    sizes = {n: (config.batch_sizes or {}).get(n, global_batch) for n in names}
    for name, size in sizes.items():
        if size % hosts or size % data_devices:
            raise BadValueError(
                f"the global batch of task {name!r} (TaskBatches.batch_sizes, else BATCH_SIZE) is {size}: it must be "
                f"divisible by the {data_devices} data-parallel devices of the {hosts} host(s)"
            )
    drawn = (
        np.bincount(task_sequence(seed, probs, 0, start), minlength=len(names)) if start else np.zeros(len(names), int)
    )
    streams = {}
    step = start
    while True:
        for t in task_sequence(seed, probs, step, 1024):
            name = names[t]
            if name not in streams:
                streams[name] = dataset(name, split, batch_size=sizes[name] // hosts, start_batch=int(drawn[t]))
                streams[name] = streams[name].as_numpy_iterator()
            batch = next(streams[name])
            if name in config.no_in_batch_negatives:
                batch = dict(batch, query_id=np.full_like(batch["query_id"], one_example_id(name)))
            yield name, batch
        step += 1024


def mixture_batches(
    task: str, split: str, config: TaskBatches, dataset, batch_size: int, seed: int, start: int, data_devices: int
):
    """`batches` over the registered mixture `task` (train.task; an error for a single task), this
    process of jax.process_count() hosts, example counts from the task registry."""
    import jax
    import seqio

    from samtone_jax.tasks import registration

    provider = seqio.get_mixture_or_task(task)
    if not isinstance(provider, seqio.Mixture):
        raise BadValueError(f"inputs.task_batches needs a mixture as train.task; {task!r} is a single task")
    return batches(
        provider,
        split,
        config,
        dataset=dataset,
        global_batch=batch_size,
        hosts=jax.process_count(),
        seed=seed,
        start=start,
        count_examples=lambda name, split: len(registration.examples(name, split)["query_id"]),
        data_devices=data_devices,
    )
