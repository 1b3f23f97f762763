"""What every mode shares when it runs: the multi-process runtime, gin parsed before a flag mode
runs, a task loaded by --task / --split, the inputs an --out must not replace."""

from __future__ import annotations

from samtone_jax.core.errors import BadValueError


def model_inputs(flag: str, checkpoint: str | None) -> list[tuple[str, str]]:
    """What reading the model `checkpoint` reads: the folder, and a LoRA model's frozen tower (the
    checkpoint its base.json names), as (name, path) pairs for paths.check_not_input."""
    if not checkpoint:
        return []
    from samtone_jax.checkpoints import reader
    from samtone_jax.core import paths

    found = [(flag, checkpoint)]
    if paths.as_path(checkpoint).exists():
        try:
            base = reader.base_of(checkpoint)
        except Exception:  # noqa: BLE001  an unreadable checkpoint is named when it is loaded
            base = None
        if base is not None:
            found.append((f"the frozen tower of {checkpoint} (its base.json)", base))
    return found


def task_inputs(task: str | None) -> list[tuple[str, str]]:
    """The folder (or file) task `task` reads, as (name, path) for paths.check_not_input."""
    if not task:
        return []
    from samtone_jax.tasks import catalogue

    if task not in catalogue.loaders():  # an unknown task is named when it is loaded
        return []
    return [(f"--task={task}'s data", path) for path in catalogue.input_paths(task)]


def required(args, dest: str, flag: str | None = None) -> None:
    if getattr(args, dest) is None:
        raise BadValueError(f"samtone {args.mode} needs {flag or '--' + dest}")


def init_distributed(args) -> None:
    """Join the multi-controller runtime before JAX is used (TPU pods: automatic)."""
    import jax

    if args.num_cpu_devices:
        jax.config.update("jax_num_cpu_devices", args.num_cpu_devices)
    if args.coordinator_address or args.num_processes:
        jax.distributed.initialize(
            coordinator_address=args.coordinator_address,
            num_processes=args.num_processes,
            process_id=args.process_id,
            heartbeat_timeout_seconds=args.heartbeat_timeout_seconds,
        )
    elif args.multihost:  # TPU pod / SLURM: discovered from the environment
        jax.distributed.initialize(heartbeat_timeout_seconds=args.heartbeat_timeout_seconds)


def with_gin(command):
    """A flag mode that also takes gin (--gin_file, --gin.NAME=VALUE): the gin is parsed before the
    mode runs, so gin-declared tasks (local_tasks, tfds_tasks), mixtures, prompts, data_dir and
    skip_bad_records apply to it as they do to train and eval."""

    def run(args, bindings) -> int:
        from samtone_jax.cli import gin_registry

        flag = [f"data_dir.path = {args.data_dir!r}"] if getattr(args, "data_dir", None) else []  # the flag wins
        gin_registry.parse(args.gin_file, args.gin_bindings + bindings + flag)
        return command(args, bindings)

    return run


def load_task(args, default_split: str = "train"):
    """(split, collection) of args.task / args.split (default: `default_split`, else the task's first;
    a default of 'dev' the task lacks is refused: held-out queries are what it asks for)."""
    from samtone_jax.tasks import catalogue

    if args.task not in catalogue.loaders():
        raise BadValueError(f"unknown task {args.task!r}; registered tasks: {', '.join(catalogue.task_names())}")
    splits = catalogue.loaders()[args.task][1]
    if args.split is None and default_split == "dev" and "dev" not in splits:
        raise BadValueError(
            f"{args.task} has no dev split ({', '.join(splits)}): held-out in-domain queries pick the mix; declare "
            "one (a JSONL task's 'dev_fraction') or name a split with --split"
        )
    split = args.split or (default_split if default_split in splits else splits[0])
    return split, catalogue.collection(args.task, split, args.skip_bad_records or None)  # None: gin decides


def report_final(metrics: dict | None) -> None:
    """A training mode's last line: its final metrics."""
    if metrics:
        print("final " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items())))
