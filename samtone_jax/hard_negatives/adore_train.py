"""`samtone train-adore`: ADORE's query-tower training against a frozen index (gin `train_adore`).

    init model (MODEL_DIR / checkpoint / export, any architecture)
      -> an ADE: query tower + projection trained (copies of the init's query side),
         document tower + projection frozen (the init's document side, which builds the index)
      -> index: the task's corpus encoded once (resumable shards in MODEL_DIR/index), sharded on
         the mesh's 'data' axis in float32, bfloat16 or int8 (+ per-row scale)
      -> per step: samtone_jax.hard_negatives.adore (retrieve on device, ΔMRR-weighted RankNet)

MODEL_DIR is an ordinary run directory (config.gin, checkpoints/, vocab.model, TensorBoard), so
`samtone eval`, `samtone export` and `samtone_jax.load` work on it unchanged.
"""

from __future__ import annotations

import logging

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from samtone_jax import partitioning, paths
from samtone_jax.atomic_file import write_atomic
from samtone_jax.errors import BadValueError
from samtone_jax.hard_negatives.adore import adore_loss_local
from samtone_jax.models import DualEncoder, init_params
from samtone_jax.models.layout import layout

log = logging.getLogger(__name__)

ADE = layout("ade")
FROZEN = ADE.owned_by("document")
INDEX_DTYPES = ("float32", "bfloat16", "int8")


def ade_params(architecture: str, params) -> dict:
    """The init model's parameters as an ADE tree (query side = the init's query side, copied)."""
    towers, kernels = layout(architecture).split(jax.device_get(params))
    return ADE.assemble(towers, kernels)


def quantize_index(embeddings: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(stored rows, per-row scale for int8 else None): int8 keeps round(x / s · 127) with s = max|x|."""
    if dtype not in INDEX_DTYPES:
        raise BadValueError(f"train_adore.index_dtype={dtype!r}: choose one of {INDEX_DTYPES}")
    if dtype == "float32":
        return embeddings.astype(np.float32), None
    if dtype == "bfloat16":
        return embeddings.astype(jnp.bfloat16), None
    scale = np.maximum(np.abs(embeddings).max(axis=1), 1e-12).astype(np.float32) / 127.0
    return np.round(embeddings / scale[:, None]).astype(np.int8), scale


def make_adore_step(model, tx, mesh, *, k, metric_cut, temperature, n, chunk_size, has_scale):
    def loss_fn(params, tokens, index, scale, positives):
        q = model.apply({"params": params}, tokens, method=model.encode_queries)

        def local(q, index, scale, positives):
            return adore_loss_local(
                q,
                index,
                scale if has_scale else None,
                positives,
                k=k,
                metric_cut=metric_cut,
                temperature=temperature,
                n=n,
                chunk_size=chunk_size,
            )

        data = P("data")
        return jax.shard_map(
            local, mesh=mesh, in_specs=(data, data, data, data), out_specs=(P(), P()), check_vma=False
        )(q, index, scale, positives)

    def step(state, tokens, positives, index, scale):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state["params"], tokens, index, scale, positives
        )
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = dict(metrics, accuracy=metrics["retrieved_p1"], grad_norm=optax.global_norm(grads))
        return dict(state, step=state["step"] + 1, params=params, opt_state=opt_state), metrics

    return step


def _training_queries(collection, vocabulary, length, max_positives):
    """(query tokens [Q, L], positives [Q, G] corpus indices, -1 padded, doc ids) for queries with a gold."""
    from samtone_jax.data.sentencepiece_tokens import encode_texts

    doc_ids = sorted(collection.corpus)
    index = {d: i for i, d in enumerate(doc_ids)}
    rows = []
    for qid in sorted(collection.queries):
        gold = sorted(index[d] for d, r in collection.qrels.get(qid, {}).items() if r > 0 and d in index)
        if gold:
            rows.append(
                (collection.queries[qid], gold[:max_positives] + [-1] * (max_positives - len(gold[:max_positives])))
            )
    tokens, _ = encode_texts(vocabulary, [t for t, _ in rows], length)
    return tokens, np.array([g for _, g in rows], np.int32), doc_ids


@gin.configurable
def train_adore(
    model_dir: str = gin.REQUIRED,
    init_checkpoint: str = gin.REQUIRED,
    task: str = gin.REQUIRED,
    train_steps: int = gin.REQUIRED,
    batch_size: int = 32,
    split: str = "train",
    k: int = 200,
    metric_cut: int = 10,
    temperature: float = 0.05,
    index_dtype: str = "float32",
    chunk_size: int = 8192,
    max_positives: int = 4,
    seed: int = 0,
    checkpoint_every: int = 1000,
    keep_checkpoints: int = 2,
    log_every: int = 50,
    eval_every: int = 0,
    retrieval_eval_task: str | None = None,
    retrieval_eval_split: str = "test",
) -> dict:
    """ADORE from `init_checkpoint` for `train_steps` (resumes from MODEL_DIR); returns the last metrics."""
    from samtone_jax import gin_utils, inference, tasks
    from samtone_jax.checkpoints.train_checkpoints import TrainCheckpointer
    from samtone_jax.evaluation.run import embed
    from samtone_jax.train import adafactor
    from samtone_jax.train_logging import ProgressLogger

    mesh = partitioning.create_mesh()
    devices = mesh.shape["data"]
    if batch_size % devices:
        raise BadValueError(f"train_adore.batch_size={batch_size} must be divisible by the {devices} data devices")
    paths.check_bucket(model_dir, "train_adore.model_dir")
    model_dir = paths.as_path(model_dir)
    source = inference.load(init_checkpoint, mesh=partitioning.create_mesh(devices=jax.local_devices()))
    model = DualEncoder(
        config=source.model.config, architecture="ade", projection_dim=int(source.encode_queries(["x"]).shape[1])
    )
    if jax.process_index() == 0:  # one writer of the shared files
        write_atomic(model_dir / "vocab.model", source.vocabulary.sp_model)
        write_atomic(
            model_dir / "config.gin",
            gin_utils.model_gin(model)
            + "\n".join(
                [
                    f"train.query_length = {source.query_length}",
                    f"train.doc_length = {source.doc_length}",
                    f"train.task = {task!r}",
                    f"train.batch_size = {batch_size}",
                    f"train.train_steps = {train_steps}",
                    f"# ADORE from {source.source} step {source.step}: "
                    f"k = {k}, metric_cut = {metric_cut}, τ = {temperature}",
                ]
            )
            + "\n",
        )

    collection = tasks.load(task, split)
    tokens, positives, doc_ids = _training_queries(collection, source.vocabulary, source.query_length, max_positives)
    ids, embeddings = embed(source, collection.corpus, "document", str(model_dir / "index"))
    assert ids == doc_ids
    stored, scale = quantize_index(embeddings, index_dtype)
    n = len(stored)
    chunk = min(chunk_size, -(-n // devices))
    rows = -(-n // (devices * chunk)) * devices * chunk
    stored = np.concatenate([stored, np.zeros((rows - n, stored.shape[1]), stored.dtype)])
    scale = np.ones(rows, np.float32) if scale is None else np.concatenate([scale, np.ones(rows - n, np.float32)])
    sharded = NamedSharding(mesh, P("data"))
    index, scale = jax.device_put(stored, sharded), jax.device_put(scale, sharded)

    schedule_tx, schedule = adafactor(train_steps=train_steps)

    boxed = jax.eval_shape(lambda: init_params(model, jax.random.PRNGKey(0)))
    params = jax.device_put(
        ade_params(source.architecture, jax.device_get(source.params)), partitioning.param_shardings(mesh, boxed)
    )
    # The document side stays what built the index: no update, no optimizer state. (A concrete label
    # tree, not a function: optax.tree_map_params traces the optimizer's init with placeholders.)
    labels = {
        key: jax.tree_util.tree_map(lambda _, key=key: "frozen" if key in FROZEN else "train", value)
        for key, value in params.items()
    }
    tx = optax.multi_transform({"train": schedule_tx, "frozen": optax.set_to_zero()}, labels)
    replicated = NamedSharding(mesh, P())
    state = {
        "step": jax.device_put(jnp.zeros((), jnp.int32), replicated),
        "params": params,
        "opt_state": partitioning.init_optimizer_state(tx, params, mesh),
        "rng": jax.device_put(jax.random.key_data(jax.random.PRNGKey(seed)), replicated),
    }
    checkpointer = TrainCheckpointer(model_dir / "checkpoints", checkpoint_every, keep_checkpoints)
    state, start = checkpointer.restore_latest(state)
    adore_step = make_adore_step(
        model,
        tx,
        mesh,
        k=min(k, n),
        metric_cut=metric_cut,
        temperature=temperature,
        n=n,
        chunk_size=chunk,
        has_scale=index_dtype == "int8",
    )
    step_fn = jax.jit(adore_step, donate_argnums=0)
    retrieval_eval = None
    if retrieval_eval_task:
        from samtone_jax.evaluation.train_hook import RetrievalEval

        retrieval_eval = RetrievalEval(
            model,
            mesh,
            source.vocabulary,
            retrieval_eval_task,
            retrieval_eval_split,
            source.query_length,
            source.doc_length,
        )
    progress = ProgressLogger(model_dir, train_steps, batch_size, log_every, checkpointer)
    per_epoch = len(tokens) // batch_size
    if per_epoch == 0:
        raise BadValueError(f"{task}/{split} has {len(tokens)} training queries, fewer than batch_size={batch_size}")
    try:
        for step in range(start, train_steps):
            epoch, position = divmod(step, per_epoch)  # epoch e's order is seeded by (seed, e): resumable
            perm = np.random.default_rng([seed, epoch]).permutation(len(tokens))
            rows_now = perm[position * batch_size : (position + 1) * batch_size]
            rows_now = rows_now.reshape(jax.process_count(), -1)[jax.process_index()]  # this host's block
            batch = partitioning.host_to_global(mesh, {"tokens": tokens[rows_now], "positives": positives[rows_now]})
            state, metrics = step_fn(state, batch["tokens"], batch["positives"], index, scale)
            progress.record(step + 1, metrics)
            checkpointer.maybe_save(step + 1, state)
            if retrieval_eval and eval_every and (step + 1) % eval_every == 0:
                progress.write_eval(step + 1, retrieval_eval(state["params"]))
        checkpointer.save(train_steps, state, force=True)
    finally:
        checkpointer.close()
        progress.close()
    return progress.last
