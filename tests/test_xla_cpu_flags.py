"""xla_cpu_flags: the XLA:CPU scheduler flag that keeps simulated devices' collectives in one order."""

from __future__ import annotations

import os

from samtone_jax.core import xla_cpu_flags


def test_the_flag_is_appended_to_the_flags_already_there():
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    assert xla_cpu_flags.apply(env, jaxlib_version="0.10.2")
    assert env["XLA_FLAGS"].split() == [
        "--xla_force_host_platform_device_count=8",
        "--xla_cpu_enable_concurrency_optimized_scheduler=false",
    ]
    assert not xla_cpu_flags.apply(env, jaxlib_version="0.10.2")  # once only
    assert env["XLA_FLAGS"].count("concurrency_optimized_scheduler") == 1
    empty: dict[str, str] = {}
    assert xla_cpu_flags.apply(empty, jaxlib_version="0.10.2")
    assert empty["XLA_FLAGS"] == "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def test_a_users_own_setting_and_unverified_jaxlib_are_left_alone():
    mine = {"XLA_FLAGS": "--xla_cpu_enable_concurrency_optimized_scheduler=true"}
    assert not xla_cpu_flags.apply(mine, jaxlib_version="0.10.2")
    assert mine["XLA_FLAGS"] == "--xla_cpu_enable_concurrency_optimized_scheduler=true"
    newer = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    assert not xla_cpu_flags.apply(newer, jaxlib_version="0.11.0")  # XLA aborts on flags it lacks
    assert newer == {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}


def test_importing_samtone_jax_set_it_for_this_process():
    """The tests' own XLA_FLAGS (conftest) got the flag when samtone_jax was imported."""
    assert "--xla_cpu_enable_concurrency_optimized_scheduler=false" in os.environ["XLA_FLAGS"].split()
