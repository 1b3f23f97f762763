"""gin's groups of `samtone train`'s settings, as T5X groups its own. `train.*` names the run (where,
on what, how long, from which weights); everything else is one of these frozen records, each
refusing what it cannot run:

  schedule.*    how often the run logs, evaluates and checkpoints          -> loop.Schedule
  inputs.*      the split, hard negatives, teacher files, data order, ids  -> InputSpec, TrainInputs
  packing.*     several texts a row                                        -> train_batches.Packing
  train_eval.*  what the in-training evaluation scores                     -> Evaluation
  objective.*   the loss's terms beside the contrastive one: distillation, Matryoshka, quantization-aware
  step.*        how a step computes: GradCache, the parameters' moving average

The previous release's names (train.checkpoint_every, train.packing, ...) are still read, as these
(config/renamed.py)."""

from __future__ import annotations

import dataclasses

import gin

from samtone_jax.core.errors import BadValueError
from samtone_jax.data.false_negatives import FalseNegativeFilter
from samtone_jax.tasks.task_batches import TaskBatches


@gin.configurable("schedule")
@dataclasses.dataclass(frozen=True)
class ScheduleSettings:
    """gin `schedule.*`: every how many steps the run logs, evaluates (0: never) and checkpoints, how
    many checkpoints it keeps, what a resume does when the latest is unreadable ('fallback': the
    newest readable one, the unreadable one moved aside; 'fail': stop), and a step to pause at
    (pause_at: saved there and stopped, as a preemption; the learning-rate schedule is still the whole
    run's, so a rerun without it goes on as if never paused: `samtone finetune` mines hard negatives
    again with the run's own weights at each pause; 0: never)."""

    checkpoint_every: int = 1000
    keep_checkpoints: int = 3
    log_every: int = 100
    eval_every: int = 0
    on_corrupt_checkpoint: str = "fallback"
    pause_at: int = 0


@gin.configurable("inputs")
@dataclasses.dataclass(frozen=True)
class InputSettings:
    """gin `inputs.*`: the `split` trained on; `num_negatives` K hard negatives an example carries
    (hard_negatives_file.path; a query with fewer is dropped, or with `negatives_fallback` kept with
    in-batch negatives only for the missing ones); from a `samtone score` file, the teacher's scores (`teacher_scores`,
    for distillation) and its false-negative flags (`teacher_guide`, a FalseNegativeFilter); the data
    order (`data_shards` V: each host reads V / hosts shards, so a fixed V gives the same batches on
    any host count dividing it; `shuffle_block_size` k: runs of k consecutive examples, for
    duplicate-heavy ablations); `id_masking` False drops the ids from the loss (duplicate texts become
    each other's negatives: SamToNe's duplicate-document ablation; keep it True); `task_batches` (a
    TaskBatches; the task a mixture) draws every batch from one member task; `teacher_embeddings`: a
    teacher's `samtone encode --side=both` folder of the task (a mixture: one a member task, in order),
    for objective.embedding_distillation_weight (training/teacher_embeddings.py)."""

    split: str = "train"
    num_negatives: int = 0
    negatives_fallback: bool = False
    teacher_scores: bool = False
    teacher_guide: FalseNegativeFilter | None = None
    data_shards: int | None = None
    shuffle_block_size: int = 1
    id_masking: bool = True
    task_batches: TaskBatches | None = None
    teacher_embeddings: str | tuple[str, ...] | None = None


@gin.configurable("objective")
@dataclasses.dataclass(frozen=True)
class ObjectiveSettings:
    """gin `objective.*`: the loss is contrastive_weight · contrastive + distillation_weight ·
    distillation (the teacher's scores: inputs.teacher_scores); `matryoshka_dims` (k_1 < k_2 < ...,
    optional `matryoshka_weights`) sums the contrastive loss over the embeddings truncated to each k;
    `quantized_precisions` (e.g. ('float32', 'binary'), optional `quantized_weights`) adds it on the
    embeddings as an int8 / binary index serves them (with 'int8', train.init_checkpoint is required);
    `spread_out_weight` w > 0 adds w · the spread-out term (objectives/spread_out.py: each tower's
    embeddings pushed apart on the sphere); `embedding_distillation_weight` w > 0 adds w · the student's
    embeddings matched to the teacher's (inputs.teacher_embeddings), by `embedding_distillation_mode`
    'similarity' (the in-batch similarity matrices, any widths), 'cosine' (each text's, equal widths) or
    'softmax' (the teacher's in-batch softmax at `embedding_distillation_temperature`, default 0.05, as
    soft labels; objectives/embedding_distillation.py). With contrastive_weight 0 and no score distillation it is the
    whole loss (label-free adaptation)."""

    contrastive_weight: float = 1.0
    distillation_weight: float = 0.0
    matryoshka_dims: tuple[int, ...] | None = None
    matryoshka_weights: tuple[float, ...] | None = None
    quantized_precisions: tuple[str, ...] | None = None
    quantized_weights: tuple[float, ...] | None = None
    spread_out_weight: float = 0.0
    embedding_distillation_weight: float = 0.0
    embedding_distillation_mode: str = "similarity"
    embedding_distillation_temperature: float | None = None  # 'softmax' only; None: 0.05


@gin.configurable("step")
@dataclasses.dataclass(frozen=True)
class StepSettings:
    """gin `step.*`: `grad_cache_chunk_size` C computes the batch's embeddings C examples at a time
    and their gradients through cached embeddings (GradCache: the same loss and gradient, the memory
    of C examples); `ema_decay` d (e.g. 0.999) keeps the parameters' exponential moving average
    beside them (checkpointed, evaluated as ema/..., served by weights='ema')."""

    grad_cache_chunk_size: int | None = None
    ema_decay: float | None = None


@gin.configurable("train_eval", denylist=["every", "guard"])
@dataclasses.dataclass(frozen=True)
class Evaluation:
    """gin `train_eval.*`: every `every` steps (schedule.eval_every), in-batch loss metrics over the
    first `batches` batches of `split` and / or retrieval metrics over `retrieval_task` /
    `retrieval_split` (gin RetrievalEval.max_queries, RetrievalEval.k); `guard`: guard.tasks are
    evaluated too (evaluation/guard.py)."""

    every: int = 0
    split: str | None = None
    batches: int = 4
    retrieval_task: str | None = None
    retrieval_split: str = "test"
    guard: bool = False

    def __post_init__(self):
        if self.every and not (self.split or self.retrieval_task or self.guard):
            raise BadValueError(
                "schedule.eval_every is set but neither train_eval.split, train_eval.retrieval_task nor guard.tasks "
                "is: name a held-out split or a guard task to evaluate on"
            )
        if (self.split or self.retrieval_task) and not self.every:
            raise BadValueError(
                "train_eval.split / train_eval.retrieval_task need schedule.eval_every > 0 (how often to evaluate)"
            )
