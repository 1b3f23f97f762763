"""`samtone train-adore`: ADORE's query-tower training against a frozen index (gin `train_adore`).

    init model (MODEL_DIR / checkpoint / export, any architecture)
      -> an ADE: query tower + projection trained (copies of the init's query side),
         document tower + projection frozen (the init's document side, which builds the index)
      -> index: the task's corpus encoded once (resumable shards in MODEL_DIR/index), sharded on
         the mesh's 'data' axis in float32, bfloat16 or int8 (+ per-row scale)
      -> per step: samtone_jax.hard_negatives.adore (retrieve on device, ΔMRR-weighted RankNet),
         run by loop.py like every training mode (lock, resume, SIGTERM, non-finite stop)

MODEL_DIR is an ordinary run directory (config.gin, checkpoints/, vocab.model, TensorBoard), so
`samtone eval`, `samtone export` and `samtone_jax.load` work on it unchanged.
"""

from __future__ import annotations

import itertools
import logging

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from samtone_jax.config import gin_config
from samtone_jax.core import run_folders
from samtone_jax.core.atomic_file import write_atomic
from samtone_jax.core.errors import BadValueError
from samtone_jax.data.wordpiece_tokens import WordPieceTokens
from samtone_jax.hard_negatives.adore import adore_loss_local
from samtone_jax.models import DualEncoder, init_params, partitioning
from samtone_jax.models.layout import layout
from samtone_jax.training import loop

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
    from samtone_jax.data.sentencepiece_tokens import tokenize_texts

    doc_ids, relevant = collection.relevant_indices()
    rows = [
        (collection.queries[qid], gold[:max_positives] + [-1] * (max_positives - len(gold[:max_positives])))
        for qid, gold in relevant
    ]
    tokens, _ = tokenize_texts(vocabulary, [t for t, _ in rows], length)
    return tokens, np.array([g for _, g in rows], np.int32), doc_ids


def _index_on_mesh(embeddings: np.ndarray, index_dtype: str, mesh, chunk_size: int):
    """(index [rows, P], scale [rows], n real rows, chunk): the quantised index zero-padded to whole
    chunks on every device and sharded over 'data' (scale 1 for unquantised dtypes and padding)."""
    devices = mesh.shape["data"]
    stored, scale = quantize_index(embeddings, index_dtype)
    n = len(stored)
    chunk = min(chunk_size, -(-n // devices))
    rows = -(-n // (devices * chunk)) * devices * chunk
    stored = np.concatenate([stored, np.zeros((rows - n, stored.shape[1]), stored.dtype)])
    scale = np.ones(rows, np.float32) if scale is None else np.concatenate([scale, np.ones(rows - n, np.float32)])
    sharded = NamedSharding(mesh, P("data"))
    return jax.device_put(stored, sharded), jax.device_put(scale, sharded), n, chunk


def _frozen_document_side(optimizer, params):
    """The optimizer on the query side; the document side stays what built the index: no update, no
    optimizer state. (A concrete label tree, not a function: optax.tree_map_params traces the
    optimizer's init with placeholders.)"""
    labels = {
        key: jax.tree_util.tree_map(lambda _, key=key: "frozen" if key in FROZEN else "train", value)
        for key, value in params.items()
    }
    return optax.multi_transform({"train": optimizer, "frozen": optax.set_to_zero()}, labels)


def _query_batches(tokens, positives, batch_size: int, seed: int, mesh):
    """batches(start): global batches of steps start, start + 1, ...; epoch e visits the queries in
    the order seeded by (seed, e), so a resumed run sees the batches the uninterrupted one would."""
    per_epoch = len(tokens) // batch_size

    def batches(start: int):
        for step in itertools.count(start):
            epoch, position = divmod(step, per_epoch)
            rows = np.random.default_rng([seed, epoch]).permutation(len(tokens))
            rows = rows[position * batch_size : (position + 1) * batch_size]
            rows = rows.reshape(jax.process_count(), -1)[jax.process_index()]  # this host's block
            yield partitioning.host_to_global(mesh, {"tokens": tokens[rows], "positives": positives[rows]})

    return batches


def _config_text(model, source, task, batch_size, train_steps, k, metric_cut, temperature) -> str:
    """config.gin: the ADE's model bindings (what eval / export / load read), its lengths, and how it
    was made."""
    return (
        gin_config.model_gin(model)
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
        + "\n"
    )


@gin.configurable(denylist=["mesh"])
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
    on_corrupt_checkpoint: str = "fallback",
    *,
    mesh,
) -> dict:
    """ADORE from `init_checkpoint` for `train_steps` on `mesh` (resumes from MODEL_DIR; the loop,
    with its lock, SIGTERM, checkpoints and non-finite stop, is loop.py's); returns the last metrics."""
    from samtone_jax.evaluation.run import embed
    from samtone_jax.inference import encoder as inference
    from samtone_jax.tasks import catalogue
    from samtone_jax.training.optimizer import adafactor

    schedule = loop.Schedule(
        train_steps,
        batch_size,
        checkpoint_every,
        keep_checkpoints,
        log_every,
        eval_every,
        on_corrupt_checkpoint,
        gin_name="train_adore",
    )
    if index_dtype not in INDEX_DTYPES:
        raise BadValueError(f"train_adore.index_dtype={index_dtype!r}: choose one of {INDEX_DTYPES}")
    devices, hosts = mesh.shape["data"], jax.process_count()
    if batch_size % devices or batch_size % hosts:
        raise BadValueError(
            f"train_adore.batch_size={batch_size} must be divisible by the {devices} data devices of the {hosts} "
            "host(s)"
        )
    if eval_every and not retrieval_eval_task:
        raise BadValueError("train_adore.eval_every is set but train_adore.retrieval_eval_task is not: name a task")
    local_mesh = partitioning.create_mesh(devices=jax.local_devices())  # the index is encoded on this host's devices
    # A LoRA run's adapters folded into its towers: ADORE trains the whole query tower of the merged model.
    source = inference.load_encoder(init_checkpoint, mesh=local_mesh, task=task).merged()
    if source.query_prompt or source.document_prompt:
        raise BadValueError(
            f"train_adore.init_checkpoint={init_checkpoint!r} was trained with prompts "
            f"({source.query_prompt!r}, {source.document_prompt!r}); ADORE does not carry prompts into its "
            "queries and its run yet: start it from a run without prompts"
        )
    model = DualEncoder(
        config=source.model.config, architecture="ade", projection_dim=int(source.encode_queries(["x"]).shape[1])
    )
    collection = catalogue.collection(task, split)
    tokens, positives, doc_ids = _training_queries(collection, source.vocabulary, source.query_length, max_positives)
    if len(tokens) < batch_size:
        raise BadValueError(
            f"{task}/{split} has {len(tokens)} training queries with a relevant document, fewer than "
            f"train_adore.batch_size={batch_size}"
        )
    config = _config_text(model, source, task, batch_size, train_steps, k, metric_cut, temperature)
    with loop.run_directory(model_dir, model, schedule, config) as model_dir:
        if jax.process_index() == 0:
            if isinstance(source.vocabulary, WordPieceTokens):  # a BERT-family tower's tokenizer
                write_atomic(model_dir / run_folders.TOKENIZER, source.vocabulary.tokenizer_json)
            else:
                write_atomic(model_dir / run_folders.VOCABULARY, source.vocabulary.sp_model)
        ids, embeddings = embed(source, collection.corpus, "document", str(model_dir / "index"))
        if ids != doc_ids:
            raise BadValueError(f"{model_dir / 'index'} holds other documents than {task}/{split}: delete it")
        index, scale, n, chunk = _index_on_mesh(embeddings, index_dtype, mesh, chunk_size)
        boxed = jax.eval_shape(lambda: init_params(model, jax.random.PRNGKey(0)))
        params = jax.device_put(
            ade_params(source.architecture, source.params), partitioning.param_shardings(mesh, boxed)
        )
        tx = _frozen_document_side(adafactor(train_steps=train_steps)[0], params)

        def init_state(fresh: bool):
            replicated = NamedSharding(mesh, P())
            return {
                "step": jax.device_put(jnp.zeros((), jnp.int32), replicated),
                "params": params,
                "opt_state": partitioning.init_optimizer_state(tx, params, mesh),
            }

        adore_step = jax.jit(
            make_adore_step(
                model,
                tx,
                mesh,
                k=min(k, n),
                metric_cut=metric_cut,
                temperature=temperature,
                n=n,
                chunk_size=chunk,
                has_scale=index_dtype == "int8",
            ),
            donate_argnums=0,
        )

        def step(state, batch):
            return adore_step(state, batch["tokens"], batch["positives"], index, scale)

        evaluate = None
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

            def evaluate(state):
                return retrieval_eval(state["params"])

        batches = _query_batches(tokens, positives, batch_size, seed, mesh)
        return loop.run(model_dir, schedule, init_state=init_state, batches=batches, step=step, evaluate=evaluate)
