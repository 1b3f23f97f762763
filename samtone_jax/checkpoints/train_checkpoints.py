"""Training checkpoints: orbax CheckpointManager over the full train state, preemption-safe.

MODEL_DIR/checkpoints/<step>/state  {step, params, opt_state, rng} (orbax, sharded, async)
MODEL_DIR/checkpoints/<step>/meta   {"step", "data_position"} (JSON)

Orbax writes each step to a temporary directory and renames it when complete, so a killed job
leaves the previous complete checkpoints and, at worst, an incomplete temporary that restore
ignores. The data position is the number of global batches consumed (= step): the pipeline
replays to it (samtone_jax/data/pipeline.py). All processes must call save/restore together.
"""

from __future__ import annotations

import logging

import jax
import orbax.checkpoint as ocp

from samtone_jax import paths

log = logging.getLogger(__name__)


class TrainCheckpointer:
    def __init__(self, directory, every: int, keep: int):
        self.directory, self.every = paths.as_path(directory), max(every, 1)
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=max(every, 1), max_to_keep=keep, enable_async_checkpointing=True, create=True
        )
        self.manager = ocp.CheckpointManager(directory, options=options, item_names=("state", "meta"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def restore_latest(self, state):
        """(restored state, its step) onto `state`'s shardings, or (state, 0) without a checkpoint."""
        step = self.manager.latest_step()
        if step is None:
            return state, 0
        abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
        restored = self.manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore())
        )
        if restored.meta["data_position"] != step:
            raise ValueError(
                f"checkpoint {step} in {self.directory} has data position {restored.meta['data_position']}"
            )
        return restored.state, step

    def _args(self, step, state):
        return ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave({"step": step, "data_position": step})
        )

    def maybe_save(self, step: int, state) -> None:
        """Save (asynchronously) when `step` is a multiple of the interval. Decided here: orbax's
        own policy would also save the very first step it sees."""
        if step % self.every == 0:
            self.manager.save(step, args=self._args(step, state))

    def save(self, step: int, state, force: bool = True) -> None:
        if self.manager.latest_step() == step:
            return
        self.manager.save(step, args=self._args(step, state), force=force)
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def restore_on_one_device(path, item: str | None = None):
    """A saved tree (e.g. MODEL_DIR/checkpoints/<step>/state, local or gs://) restored whole onto
    this process's first device, whatever topology saved it (for inspection, export and tests)."""
    path = paths.as_path(path)
    checkpointer = ocp.StandardCheckpointer()
    metadata = checkpointer.metadata(path)
    tree = getattr(metadata, "item_metadata", metadata)
    tree = getattr(tree, "tree", tree)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), tree)
    return checkpointer.restore(path, target)
