"""What every experiment script shares: running `samtone` subcommands with a log each, arms that
resume (a finished arm's eval JSON is reused, so a killed experiment reruns only what is missing),
and the mini T5.1.1-shaped model the CPU experiments train from scratch."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import statistics
import time
import traceback

from samtone_jax.core import run_folders

# A T5.1.1-shaped mini encoder (d_model 64, 3 layers, gated GELU) over an 8k SentencePiece vocabulary.
MINI_MODEL = [
    "--gin_file=models/t5_1_1_tiny.gin",
    "--gin.T5Config.emb_dim=64",
    "--gin.T5Config.head_dim=16",
    "--gin.T5Config.mlp_dim=256",
    "--gin.T5Config.num_layers=3",
    "--gin.VOCAB_SIZE=8000",
]


def experiment_parser(doc: str, default_out: str, budget: bool = True) -> argparse.ArgumentParser:
    """The flags every experiment has: --out (its folder, from which a rerun resumes) and, with
    `budget`, the training budget all its arms share (seeds, steps, batch, lr, τ)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", default=default_out, help="the experiment's folder (a rerun resumes from it)")
    if budget:
        parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
        parser.add_argument("--steps", type=int, default=300)
        parser.add_argument("--batch", type=int, default=64)
        parser.add_argument("--learning_rate", type=float, default=1e-2)
        parser.add_argument("--temperature", type=float, default=0.05)
    return parser


def parse_into_folder(parser: argparse.ArgumentParser) -> tuple[argparse.Namespace, str]:
    """(the parsed flags, the absolute --out folder, created if missing)."""
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    return args, out


def samtone(*argv: str, log: str) -> None:
    """`samtone ARGV` in this process (no interpreter start, jax import or data loading per run), its
    output and logging appended to `log` (a rerun that finds the work done adds its lines after the
    run's own, never over them); exits naming the log on failure."""
    from samtone_jax.cli import main as cli

    start = time.time()
    root = logging.getLogger()
    with open(log, "a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        print(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} samtone {' '.join(argv)}", flush=True)
        handler = logging.StreamHandler(f)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        saved, root.handlers = root.handlers, [handler]
        root.setLevel(logging.INFO)
        try:
            code = cli.main(list(argv))
        except SystemExit as e:
            code = e.code
        except Exception:  # noqa: BLE001 - reported with the log's path below
            traceback.print_exc(file=f)
            code = 1
        finally:
            root.handlers = saved
    if code:
        raise SystemExit(f"samtone {argv[0]} failed (exit {code}); see {log}")
    print(f"  samtone {argv[0]:12s} {time.time() - start:6.0f}s  (log: {log})", flush=True)


def build_vocab(out: str, task: str) -> str:
    vocab = f"{out}/vocab.model"
    if not os.path.exists(vocab):
        samtone(
            "build-vocab",
            f"--task={task}",
            "--split=all",
            "--vocab_size=8000",
            f"--out={vocab}",
            log=f"{out}/vocab.log",
        )
    return vocab


def train_args(
    model_dir,
    vocab,
    task,
    steps,
    batch,
    lr,
    loss_gin,
    extra=(),
    architecture="sde",
    query_length=32,
    doc_length=64,
    temperature=0.05,
):
    """`samtone train` arguments for the mini model on `task` with one of gin_configs/losses/."""
    return [
        "train",
        *MINI_MODEL,
        f"--gin_file=architectures/{architecture}.gin",
        f"--gin_file={loss_gin}",
        f"--gin.TEMPERATURE={temperature}",
        f"--gin.train.model_dir='{model_dir}'",
        f"--gin.train.task='{task}'",
        f"--gin.train.train_steps={steps}",
        f"--gin.train.batch_size={batch}",
        f"--gin.train.query_length={query_length}",
        f"--gin.train.doc_length={doc_length}",
        f"--gin.train.vocabulary='{vocab}'",
        f"--gin.adafactor.learning_rate={lr}",
        "--gin.schedule.log_every=50",
        f"--gin.schedule.checkpoint_every={steps}",
        *extra,
    ]


def existing_eval(model_dir):
    """The eval JSON of a finished arm, or None."""
    folder = os.path.join(model_dir, run_folders.EVAL)
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    # not eval --dims / --precisions records: a truncation or a compressed index
    found = [
        f
        for f in names
        if f.endswith(".json") and not re.search(r"_(dim\d+|int8|binary|rescore\d+|ema)(_q\d+)?(_c\d+)?\.json$", f)
    ]
    return os.path.join(folder, found[-1]) if found else None


def evaluate(model_dir, log_dir, name, task, split="test"):
    samtone(
        "eval",
        f"--gin.evaluate.model_dir='{model_dir}'",
        f"--gin.evaluate.task='{task}'",
        f"--gin.evaluate.split='{split}'",
        "--gin.evaluate.keep_embeddings=False",
        log=f"{log_dir}/{name}_eval.log",
    )
    return existing_eval(model_dir)


def run_arm(out, name, argv, task, split="test"):
    """Train (argv) and evaluate arm `name` under OUT unless its eval JSON exists; returns its path."""
    model_dir = f"{out}/{name}"
    found = existing_eval(model_dir)
    if found is None:
        samtone(*argv, log=f"{out}/{name}_train.log")
        found = evaluate(model_dir, out, name, task, split)
    return found


def seed_average(paths: list[str], out_path: str) -> str:
    """An eval JSON whose per-query scores (and metrics) are the means over the seeds' runs."""
    runs = [json.load(open(p)) for p in paths]
    merged = {k: v for k, v in runs[0].items() if k not in ("per_query", "metrics", "trec")}
    merged["seeds"] = len(runs)
    merged["per_query"] = {
        m: {q: statistics.fmean(r["per_query"][m][q] for r in runs) for q in runs[0]["per_query"][m]}
        for m in runs[0]["per_query"]
    }
    merged["metrics"] = {m: statistics.fmean(r["metrics"][m] for r in runs) for m in runs[0]["metrics"]}
    with open(out_path, "w") as f:
        json.dump(merged, f)
    return out_path


def summarize(out, evals, architectures, arms, seeds, measures) -> dict:
    """Per (architecture, arm): mean ± std over seeds of each measure; per architecture: a paired
    randomisation test of every arm against arms[0] on the seed-averaged per-query scores, written
    to OUT/compare_<architecture>.txt. evals: {(architecture, arm, seed): eval JSON path}."""
    from samtone_jax.evaluation.significance import compare, format_table

    os.makedirs(f"{out}/averaged", exist_ok=True)
    summary = {"runs": {}, "compare": {}}
    lines = [f"{'architecture':12s} {'arm':22s} " + " ".join(f"{m + ' mean':>9s} {'± std':>7s}" for m in measures)]
    for arch in architectures:
        for arm in arms:
            per_seed = [json.load(open(evals[arch, arm, s]))["metrics"] for s in seeds]
            cells = {}
            for m in measures:
                values = [r[m] for r in per_seed]
                std = statistics.stdev(values) if len(values) > 1 else 0.0
                cells[m] = {"mean": statistics.fmean(values), "std": std, "seeds": values}
            summary["runs"][f"{arch}/{arm}"] = cells
            lines.append(
                f"{arch:12s} {arm:22s} " + " ".join(f"{c['mean']:9.4f} {c['std']:7.4f}" for c in cells.values())
            )
        averaged = [
            seed_average([evals[arch, arm, s] for s in seeds], f"{out}/averaged/{arch}_{arm}.json") for arm in arms
        ]
        if len(arms) < 2:  # nothing to compare against
            continue
        result = compare(averaged, measures=list(measures))
        summary["compare"][arch] = result
        with open(f"{out}/compare_{arch}.txt", "w") as f:
            f.write(
                f"{arch}: seed-averaged per-query scores ({len(seeds)} seeds), paired randomisation test "
                f"against {arms[0]}\n{format_table(result)}\n"
            )
    summary["table"] = "\n".join(lines)
    return summary
