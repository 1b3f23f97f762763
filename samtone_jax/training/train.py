"""`samtone train`: the contrastive training mode, a step function and a batch source for loop.py.

  train()  gin's train.* and its groups (settings.py) -> frozen settings (loop.Schedule, InputSpec,
           TrainInputs, Packing, Evaluation) and the step's loss (objective.training_loss) -> fit()
  fit()    model + optimizer -> state (fresh, INIT_CHECKPOINT, or resumed from MODEL_DIR by loop.run)
           -> batches at the resumed position (train_batches.py) -> jitted step (GradCache
           optional; loss in shard_map over 'data') -> eval hooks (in-batch loss on a held-out
           split, retrieval metrics).

`samtone train --gin_file=runs/demo_cpu.gin --gin.MODEL_DIR="'/tmp/run'"`.
"""

from __future__ import annotations

import contextlib
import logging

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from samtone_jax.checkpoints import reader
from samtone_jax.checkpoints.train_checkpoints import FROZEN, ema_params, full_params
from samtone_jax.core import paths, run_folders, stop_request
from samtone_jax.core.atomic_file import write_atomic
from samtone_jax.core.errors import BadValueError, MissingFileError
from samtone_jax.data import vocab as vocab_lib
from samtone_jax.data.input_spec import InputSpec
from samtone_jax.evaluation import guard as guard_lib
from samtone_jax.evaluation.guard import GuardSettings
from samtone_jax.inference import serving_lengths
from samtone_jax.models import families, init_params, partitioning
from samtone_jax.models import lora as lora_lib
from samtone_jax.objectives import quantization_aware
from samtone_jax.training import grad_cache, loop, model_flops, optimizer, start_checks
from samtone_jax.training.batch_embeddings import embed_batch
from samtone_jax.training.objective import training_loss
from samtone_jax.training.settings import Evaluation, InputSettings, ObjectiveSettings, ScheduleSettings, StepSettings
from samtone_jax.training.train_batches import Packing, TrainInputs, batch_source, eval_batches

log = logging.getLogger(__name__)


def make_loss_on_embeddings(model, mesh, batch, loss_fn):
    """(params, q, d, n) -> (loss, metrics): `loss_fn` (contrastive_loss's signature; gin binds
    its mode at the edge), each device scoring its rows against the all-gathered columns
    (shard_map over 'data')."""
    names = {"query_id": "query_ids", "doc_id": "doc_ids", "negative_ids": "negative_ids", "guide_ids": "guide_ids"}
    per_pair = {arg: batch[k] for k, arg in names.items() if k in batch}
    if "teacher_scores" in batch:  # only a loss built by distillation.with_distillation takes them
        per_pair["teacher_scores"] = batch["teacher_scores"]
    for feature, arg in (("teacher_query_embedding", "teacher_query"), ("teacher_doc_embedding", "teacher_doc")):
        if feature in batch:  # only a loss built by embedding_distillation.matched takes them
            per_pair[arg] = batch[feature]

    def loss(params, q, d, n):
        tau = model.apply({"params": params}, method=model.temperature)
        kwargs = {} if tau is None else {"temperature": tau}

        def local(q, d, n, arrays):
            return loss_fn(q, d, negatives=n, axis_name="data", **arrays, **kwargs)

        spec = P("data")
        return jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 4, out_specs=(P(), P()), check_vma=False)(
            q, d, n, per_pair
        )

    return loss


def make_train_step(
    model,
    tx,
    schedule,
    mesh,
    grad_cache_chunk_size: int | None,
    loss_fn,
    max_segments: int | None = None,
    ema_decay: float | None = None,
):
    """(state, batch) -> (state, metrics). A packed batch (data/packing.py) needs `max_segments`, the
    packer's texts-per-row limit. `ema_decay` d: state['ema'] ← d · ema + (1 − d) · params after
    each update (the parameters' exponential moving average, laid out like them)."""
    num_shards = mesh.shape["data"]

    def step(state, batch):
        rng = jax.random.fold_in(state["rng"], state["step"])
        loss_on_embeddings = make_loss_on_embeddings(model, mesh, batch, loss_fn)
        # Gradients of the trained parameters only (LoRA: not of the frozen towers, so XLA computes
        # no gradient, optimizer update or all-reduce for them).
        trained, frozen = state["params"], state.get(FROZEN, {})
        if grad_cache_chunk_size:
            (loss, metrics), grads = grad_cache.loss_and_grads(
                model, trained, batch, rng, loss_on_embeddings, grad_cache_chunk_size, num_shards, max_segments, frozen
            )
        else:

            def full(trained):
                params = trained | frozen
                return loss_on_embeddings(params, *embed_batch(model, params, batch, rng, max_segments))

            (loss, metrics), grads = jax.value_and_grad(full, has_aux=True)(trained)
        updates, opt_state = tx.update(grads, state["opt_state"], trained)
        new_state = dict(state, step=state["step"] + 1, params=optax.apply_updates(trained, updates))
        new_state["opt_state"] = opt_state
        if ema_decay is not None:
            new_state["ema"] = jax.tree_util.tree_map(
                lambda e, p: ema_decay * e + (1.0 - ema_decay) * p.astype(jnp.float32),
                state["ema"],
                new_state["params"],
            )
        metrics = dict(metrics, grad_norm=optax.global_norm(grads), learning_rate=schedule(state["step"]))
        metrics |= model_flops.batch_tokens(batch, max_segments)  # for the log's MFU
        return new_state, metrics

    return step


def split_trained(model, params) -> tuple[dict, dict]:
    """(the keys a step trains, the frozen rest): everything and nothing, or under LoRA the adapters,
    projection and temperature, and the base towers (models/lora.py)."""
    keys = lora_lib.trainable_keys(model, params)
    return {k: params[k] for k in keys}, {k: v for k, v in params.items() if k not in keys}


def make_eval_step(model, mesh, loss_fn):
    def step(params, batch):
        loss_on_embeddings = make_loss_on_embeddings(model, mesh, batch, loss_fn)
        return loss_on_embeddings(params, *embed_batch(model, params, batch, None))[1]

    return step


def initial_state(
    model, tx, mesh, seed: int, init_checkpoint: str | None, rules=partitioning.DEFAULT_RULES, ema: bool = False
):
    """Sharded {step, params, opt_state, rng[, ema][, frozen]}; params from INIT_CHECKPOINT when given.
    `rules`: the logical -> mesh axis rules (partitioning.FSDP_RULES shards every parameter). `ema`:
    the parameters' moving average, starting as a copy of them. Under LoRA, `params` holds what is
    trained and `frozen` the base towers (never saved: checkpoints hold the rest)."""
    boxed = jax.eval_shape(lambda: init_params(model, jax.random.PRNGKey(seed)))
    shardings = partitioning.param_shardings(mesh, boxed, rules)

    def fresh(keys=None):
        """The initial parameters (only `keys`' when given: XLA then drops the rest's initialisation)."""
        keys = tuple(shardings) if keys is None else tuple(keys)

        def init():
            return {k: v for k, v in nn.unbox(init_params(model, jax.random.PRNGKey(seed))).items() if k in keys}

        return jax.jit(init, out_shardings={k: shardings[k] for k in keys})()

    if init_checkpoint:
        params = _initial_params(model, init_checkpoint, nn.unbox(boxed), shardings, fresh)
        log.info("initialised parameters from %s", init_checkpoint)
    else:
        params = fresh()
    replicated = NamedSharding(mesh, P())
    trained, frozen = split_trained(model, params)  # LoRA: no optimizer state (nor average) for the base
    state = {
        "step": jax.device_put(jnp.zeros((), jnp.int32), replicated),
        "params": trained,
        "opt_state": partitioning.init_optimizer_state(tx, trained, mesh),
        "rng": jax.device_put(jax.random.key_data(jax.random.PRNGKey(seed + 1)), replicated),
    }
    if frozen:
        state[FROZEN] = frozen
    if ema:  # float32 whatever the parameters' dtype (bfloat16 would round 0.999 · e back to e), params' layout
        state["ema"] = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32, copy=True), trained)
    return state


def _initial_params(model, init_checkpoint: str, abstract, shardings, fresh):
    """INIT_CHECKPOINT's parameters on the mesh: a parameter checkpoint (import-checkpoint), another
    run's MODEL_DIR or MODEL_DIR/checkpoints/<step> (e.g. STAR from an in-batch run), or an export.
    A LoRA model takes its frozen tower and projection from a plain model's checkpoint and fresh
    adapters (`fresh(keys)`: those of the model's initial parameters), or its trained part from another
    LoRA run, soup or adapter export (and the tower from that one's base.json)."""

    adapters = lora_lib.adapter_keys(model)
    placed = jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings
    )
    params = reader.checkpoint_params(init_checkpoint, model, placed)
    if adapters and not any(k in params for k in adapters):
        params = dict(params) | fresh(adapters)
    got = jax.tree_util.tree_map(lambda x: tuple(x.shape), params)
    want = jax.tree_util.tree_map(lambda x: tuple(x.shape), abstract)
    if got != want:
        raise BadValueError(
            f"train.init_checkpoint={init_checkpoint!r} does not fit the gin model (architecture "
            f"{model.architecture}): use the same architectures/ and models/ gin files as the run that wrote it"
        )
    return jax.device_put(params, shardings)


def _keep_vocabulary(vocabulary: str | None, model_dir) -> None:
    """Copy the SentencePiece model to MODEL_DIR/vocab.model (a BERT-family tokenizer.json to
    MODEL_DIR/tokenizer.json; atomically, local or gs:// either side), so the run is self-contained
    for `samtone_jax.load` and export. T5's public vocabulary (no train.vocabulary) stays referenced
    by name."""
    if not vocabulary:
        return
    name = run_folders.TOKENIZER if vocab_lib.is_wordpiece(vocabulary) else run_folders.VOCABULARY
    source, target = paths.as_path(vocabulary), paths.as_path(model_dir) / name
    if not source.exists():
        raise MissingFileError(f"train.vocabulary={vocabulary!r} not found (as {source}): fix VOCABULARY")
    if source == target:
        return
    write_atomic(target, source.read_bytes())


@gin.configurable(denylist=["model", "loss_fn", "mesh", "rules", "distill_fn", "guard"])
def train(
    model_dir: str = gin.REQUIRED,
    task: str = gin.REQUIRED,
    train_steps: int = gin.REQUIRED,
    batch_size: int = gin.REQUIRED,
    query_length: int = 64,
    doc_length: int = 128,
    vocabulary: str | None = None,
    init_checkpoint: str | None = None,
    seed: int = 0,
    *,
    model,
    loss_fn,
    mesh,
    rules=partitioning.DEFAULT_RULES,
    distill_fn=None,
    guard: GuardSettings | None = None,
) -> dict:
    """Train `model` with `loss_fn` on `mesh` until `train_steps` (resuming from MODEL_DIR); returns
    the last logged metrics. The program (gin_registry.train_program, what `samtone train` runs)
    passes the gin-configured model, loss, mesh, partitioning rules and guard; gin's `train.*` names
    the run: where (`model_dir`), on what (`task`, tokenised by `vocabulary` to `query_length` /
    `doc_length` tokens), how long (`train_steps` of `batch_size` pairs), from which weights
    (`init_checkpoint`; `seed` for the rest and the data order). The rest is in gin's groups
    (training/settings.py: schedule.*, inputs.*, packing.*, train_eval.*, objective.*, step.*),
    which this function turns into frozen settings and the step's loss, for `fit`. The loop itself
    (resume, checkpoints, SIGTERM, logging, eval hooks) is loop.py's.

    batch_size is the *global* batch: each of the jax.process_count() hosts feeds batch_size /
    process_count examples (its own shard of the data).

    MODEL_DIR: one run at a time (samtone_jax/core/run_lock.py); a run of another model there, or one
    already past `train_steps`, is refused before anything is written.
    """
    cadence, data, terms, step = ScheduleSettings(), InputSettings(), ObjectiveSettings(), StepSettings()
    schedule = loop.Schedule(
        train_steps,
        batch_size,
        cadence.checkpoint_every,
        cadence.keep_checkpoints,
        cadence.log_every,
        cadence.eval_every,
        cadence.on_corrupt_checkpoint,
        cadence_name="schedule",
        pause_at=cadence.pause_at,
    )
    evaluation = Evaluation(every=cadence.eval_every, guard=bool(guard and guard.tasks))
    spec = InputSpec(
        vocabulary,
        query_length,
        doc_length,
        data.num_negatives,
        data.teacher_scores,
        data.teacher_guide,
        data.negatives_fallback,
    )
    if terms.quantized_precisions:  # before MODEL_DIR is written
        quantization_aware.check_start(
            terms.quantized_precisions, init_checkpoint, run_folders.complete_steps(model_dir)
        )
    inputs = TrainInputs(
        task, data.split, batch_size, spec, seed, data.data_shards, data.shuffle_block_size, data.id_masking,
        data.task_batches, data.teacher_embeddings,
    )  # fmt: skip
    packing = Packing()
    return fit(
        model_dir,
        model,
        training_loss(loss_fn, distill_fn, spec, terms, data.teacher_embeddings),
        mesh,
        rules,
        schedule=schedule,
        inputs=inputs,
        packing=packing if packing.enabled else None,
        evaluation=evaluation,
        init_checkpoint=init_checkpoint,
        grad_cache_chunk_size=step.grad_cache_chunk_size,
        ema_decay=step.ema_decay,
        guard=guard,
    )


def fit(
    model_dir: str,
    model,
    loss_fn,
    mesh,
    rules=partitioning.DEFAULT_RULES,
    *,
    schedule: loop.Schedule,
    inputs: TrainInputs,
    packing: Packing | None = None,
    evaluation: Evaluation,
    init_checkpoint: str | None = None,
    grad_cache_chunk_size: int | None = None,
    ema_decay: float | None = None,
    guard: GuardSettings | None = None,
) -> dict:
    """Train `model` on `inputs` with `loss_fn` (the whole objective) on `mesh` in MODEL_DIR, as
    `schedule` says (loop.run); returns the last logged metrics (and the guard's, evaluation/guard.py)."""
    from samtone_jax.tasks import registration  # seqio + TensorFlow: when a run starts, not for every gin parse

    inputs.check_mesh(mesh)
    # Everything the run reads, checked before MODEL_DIR is written: the vocabulary against the model,
    # every task's data as the run reads it (a mixture's every member; the eval split too),
    # INIT_CHECKPOINT, and the retrieval eval's collection (read and tokenised once, here).
    vocab_lib.check_fits(inputs.spec.vocabulary, families.of(model.config), model.config.vocab_size, "train.vocabulary")
    no_in_batch = inputs.task_batches is not None and inputs.task_batches.no_in_batch_negatives
    if no_in_batch and inputs.teacher_embeddings is not None:
        raise BadValueError(
            "TaskBatches.no_in_batch_negatives marks a task's pairs as one example by query id, and "
            "inputs.teacher_embeddings finds each text's teacher embedding by its own id: use one or the other"
        )
    if evaluation.split and inputs.teacher_embeddings is not None:
        raise BadValueError(
            "train_eval.split (the in-batch eval's loss) with inputs.teacher_embeddings would need the teacher's "
            "embeddings of that split too: evaluate with train_eval.retrieval_task or guard.tasks instead"
        )
    inputs.check_data(also_splits=(evaluation.split,) if evaluation.split else ())
    start_checks.init_checkpoint_fits(init_checkpoint, model, model_dir)
    start_checks.ema_matches(ema_decay, model_dir)
    base = start_checks.lora_base(model, init_checkpoint, model_dir)
    evaluate = _evaluator(model, mesh, loss_fn, inputs, evaluation)
    tx, lr_schedule = optimizer.make(train_steps=schedule.train_steps, adapters=bool(model.lora_rank))
    serving_lengths.inherit(init_checkpoint)  # served as the model it starts from was (its config.gin says)
    spec = inputs.spec
    guarded = guard_lib.for_run(guard, inputs.task, model, mesh, spec.vocabulary, (spec.query_length, spec.doc_length))
    with loop.run_directory(model_dir, model, schedule, gin.config_str()) as model_dir:
        if jax.process_index() == 0:
            _keep_vocabulary(inputs.spec.vocabulary, model_dir)
            if base is not None:  # where the frozen tower is: the checkpoints hold only what is trained
                write_atomic(paths.as_path(model_dir) / run_folders.BASE, reader.base_record(base))
        registration.register(inputs.spec)
        max_segments = packing.max_segments if packing else None
        step_fn = jax.jit(
            make_train_step(model, tx, lr_schedule, mesh, grad_cache_chunk_size, loss_fn, max_segments, ema_decay),
            donate_argnums=0,
        )
        fsdp = rules == partitioning.FSDP_RULES
        activations = partitioning.activation_sharding(mesh, rules) if fsdp else contextlib.nullcontext()

        def step(state, batch):
            task_name = batch.pop("task", None)  # task-homogeneous batches: whose batch this is
            with activations:  # FSDP: the activation constraints, traced on the first call
                state, metrics = step_fn(state, batch)
            if task_name is not None:
                named = {f"task/{task_name}/{k}": metrics[k] for k in ("loss", "accuracy") if k in metrics}
                metrics = dict(metrics, **named)
            return state, metrics

        def init_state(fresh: bool):
            # A resumed LoRA run reads its frozen tower again (its checkpoints hold the rest).
            init = init_checkpoint if fresh else base
            return initial_state(model, tx, mesh, inputs.seed, init, rules, ema=ema_decay is not None)

        if guarded is not None:
            evaluate = guarded.around(evaluate, full_params)

        def on_start(state, start: int):  # the starting model's guard scores: recorded, or measured now
            # (a guard added to a resumed run scores INIT_CHECKPOINT, loaded only then)
            guarded.start(lambda: full_params(state if start == 0 else init_state(True)), model_dir)

        def on_finish(state, evaluated: bool):
            return guarded.finish(full_params(state), evaluated)

        shapes = nn.unbox(jax.eval_shape(lambda: init_params(model, jax.random.PRNGKey(0))))
        flops = model_flops.ModelFlops.of(model, shapes)
        return loop.run(
            model_dir,
            schedule,
            flops=flops,
            peak=model_flops.device_peak(mesh.devices.reshape(-1), str(getattr(model.config, "dtype", "float32"))),
            init_state=init_state,
            batches=batch_source(inputs, mesh, packing, grad_cache_chunk_size),
            step=step,
            evaluate=evaluate,
            on_start=on_start if guarded is not None else None,
            on_finish=on_finish if guarded is not None else None,
        )


def _evaluator(model, mesh, loss_fn, inputs: TrainInputs, evaluation: Evaluation):
    """state -> metrics of the in-training evaluation (None: no evaluation)."""
    evaluators = []
    if evaluation.split:
        eval_fn = jax.jit(make_eval_step(model, mesh, loss_fn))

        def in_batch(state):  # mean loss metrics over the first batches of the split
            totals = {}
            for batch in eval_batches(inputs, mesh, evaluation.split, evaluation.batches):
                for k, v in jax.device_get(eval_fn(full_params(state), batch)).items():
                    totals[k] = totals.get(k, 0.0) + float(v) / evaluation.batches
                stop_request.check()  # a preempted host stops here too (every host checks every batch)
            return totals

        evaluators.append(in_batch)
    if evaluation.retrieval_task:
        from samtone_jax.evaluation.train_hook import RetrievalEval

        spec = inputs.spec
        retrieval_eval = RetrievalEval(
            model,
            mesh,
            vocab_lib.tokens(spec.vocabulary),
            evaluation.retrieval_task,
            evaluation.retrieval_split,
            spec.query_length,
            spec.doc_length,
        )
        evaluators.append(lambda state: retrieval_eval(full_params(state)))
    if not evaluators:
        return None

    def evaluate(state):
        metrics = {k: v for evaluator in evaluators for k, v in evaluator(state).items()}
        if "ema" in state:  # the moving average beside the raw parameters (in their dtype: the same programs)
            averaged = dict(state, params=ema_params(state))
            metrics |= {f"ema/{k}": v for evaluator in evaluators for k, v in evaluator(averaged).items()}
        return metrics

    return evaluate
