"""`samtone build-vocab`: train a SentencePiece vocabulary on the text of a task, tasks (a,b) or a mixture."""

from __future__ import annotations

import argparse

from samtone_jax.cli import flags, runtime
from samtone_jax.core.errors import BadValueError

NAME = "build-vocab"
HELP = "train a SentencePiece vocabulary on the text of a task, tasks (a,b) or a mixture"
EXAMPLE = "samtone build-vocab --task=wordnet_definitions --vocab_size=8000 --out=/tmp/wn.model"
PARSES_GIN = True  # runtime.with_gin parses --gin_file / --gin.NAME=VALUE before run


def add_flags(p: argparse.ArgumentParser) -> None:
    flags.task_flags(p, "tasks and / or mixtures, comma-separated (each task's texts once, weighted by its size)")
    p.add_argument("--vocab_size", type=int, required=True, help="pieces in the vocabulary (e.g. 32000)")
    p.add_argument("--out", required=True, help="output .model file (written atomically)")
    flags.gin_flags(p)


def run(args, bindings) -> int:
    from samtone_jax.core import paths
    from samtone_jax.data import vocab

    paths.check_bucket(args.out, "--out")
    names = vocab_tasks(args.task)
    paths.check_not_input(args.out, [i for name in names for i in runtime.task_inputs(name)], refuse=paths.NEW_FILES)
    texts, sources = [], []
    for name in names:  # each task's texts in id order, tasks in the order given: the same files give the same model
        split, collection = runtime.load_task(argparse.Namespace(**{**vars(args), "task": name}))
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
