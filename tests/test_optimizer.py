"""optimizer.py: AdamW takes the steps torch's AdamW takes under transformers' Trainer (clipping,
weight decay on matrices only, linear warm-up and decay); a bad kind is named."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from samtone_jax.core.errors import BadValueError
from samtone_jax.training import optimizer


def test_adamw_steps_equal_torch_adamw_with_clipping_and_a_linear_schedule():
    import torch

    rng = np.random.default_rng(0)
    params = {"kernel": rng.normal(size=(3, 4)).astype(np.float32), "bias": rng.normal(size=(4,)).astype(np.float32)}
    grads = [{k: (5 * rng.normal(size=v.shape)).astype(np.float32) for k, v in params.items()} for _ in range(4)]
    lr, steps, warmup = 1e-2, 6, 2
    tx, _ = optimizer.adamw(learning_rate=lr, train_steps=steps, warmup_steps=warmup, weight_decay=0.1)
    state, ours = tx.init(params), dict(params)
    for g in grads:
        updates, state = tx.update(g, state, ours)
        ours = jax.tree_util.tree_map(lambda p, u: p + u, ours, updates)

    theirs = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in params.items()}
    groups = [
        {"params": [theirs["kernel"]], "weight_decay": 0.1},
        {"params": [theirs["bias"]], "weight_decay": 0.0},  # the Trainer's no-decay group
    ]
    adamw = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8)
    # transformers.get_linear_schedule_with_warmup: step i uses lr · min(i / warmup, (steps - i) / (steps - warmup))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        adamw, lambda i: i / warmup if i < warmup else max(0.0, (steps - i) / (steps - warmup))
    )
    for g in grads:
        for k, p in theirs.items():
            p.grad = torch.tensor(g[k])
        torch.nn.utils.clip_grad_norm_(list(theirs.values()), 1.0)
        adamw.step()
        schedule.step()
    for k in params:
        np.testing.assert_allclose(ours[k], theirs[k].detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=k)
    assert np.abs(ours["kernel"] - params["kernel"]).max() > 1e-3  # it moved


def test_the_optimizer_kind_is_chosen_by_gin_and_a_bad_one_is_named():
    import gin

    with gin.unlock_config():
        gin.parse_config("optimizer.kind = 'adamw'")
    try:
        _, schedule = optimizer.make(train_steps=10)
    finally:
        gin.clear_config()
    assert float(schedule(0)) == pytest.approx(5e-5) and float(schedule(10)) == 0.0
    with pytest.raises(BadValueError, match="optimizer.kind = 'sgd': choose one of 'adafactor', 'adamw'"):
        optimizer.make(train_steps=10, kind="sgd")
