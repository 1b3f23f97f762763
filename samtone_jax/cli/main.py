"""The `samtone` console script: `samtone <mode> [--gin_file=F ...] [--gin.NAME=VALUE ...] [flags]`.

Gin overrides use T5X's spelling, `--gin.NAME=VALUE` (e.g. `--gin.MODEL_DIR="'/tmp/run'"`), and
`--gin_bindings="NAME = VALUE"` works too. `python -m samtone_jax.main --run_mode=<mode>` is the
same entry point for T5X users.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from samtone_jax.cli import commands
from samtone_jax.hard_negatives.teachers import KINDS as TEACHER_KINDS

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TF's INFO lines; its CUDA probe: tensorflow_setup.py


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every flag's help ends with its default (when it has one the help does not already state);
    the epilog (an example) keeps its lines."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if action.option_strings and "default" not in text and default not in (None, False, [], argparse.SUPPRESS):
            text += f" (default: {default})"
        return text


class _Deprecated(argparse.Action):
    """An old spelling of a flag: still works, says the new one on stderr (scripts keep running)."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        self.new = new
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"samtone: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _out_flag(p: argparse.ArgumentParser, help: str) -> None:
    """--out, the one name of every mode's output (--dst: its old spelling in import-checkpoint / export)."""
    p.add_argument("--out", default=None, help=help + " (required)")
    p.add_argument("--dst", dest="out", action=_Deprecated, new="--out")


# One example a mode (`samtone MODE --help` shows it).
EXAMPLES = {
    "import-checkpoint": "samtone import-checkpoint --format=sentence-transformers --src=all-MiniLM-L6-v2 "
    "--out=runs/minilm",
    "train": "samtone train --gin_file=runs/minilm/model.gin --gin_file=runs/finetune_minilm.gin "
    "--gin.train.task=\"'wordnet_definitions'\" --gin.MODEL_DIR=\"'runs/my_model'\"",
    "train-adore": "samtone train-adore --gin_file=runs/adore.gin --gin.INIT=\"'runs/my_model'\" "
    "--gin.MODEL_DIR=\"'runs/adore'\" --gin.TASK=\"'multireqa_squad_dev'\"",
    "eval": "samtone eval --checkpoint=runs/my_model --task=wordnet_definitions --max_queries=2000 --candidates=20000",
    "average": "samtone average --checkpoints runs/seed0 runs/seed1 runs/seed2 --out runs/soup",
    "calibrate": "samtone calibrate --checkpoint=runs/my_model --task=wordnet_definitions --documents=10000",
    "encode": "samtone encode --checkpoint=runs/my_model --task=wordnet_definitions --split=test --side=document",
    "analyze": "samtone analyze --checkpoint=runs/minilm --checkpoint=runs/my_model --task=wordnet_definitions "
    "--split=test --out=/tmp/figures",
    "export": "samtone export --checkpoint=runs/my_model --format=sentence-transformers --out=runs/my_model_st",
    "mine": "samtone mine --bm25 --task=multireqa_squad_dev --out=/tmp/negatives.tsv --num_negatives=8",
    "score": "samtone score --teacher=bm25 --task=multireqa_squad_dev --out=/tmp/scores.jsonl",
    "compare": "samtone compare runs/a/eval/wordnet_definitions_test_step500.json "
    "runs/b/eval/wordnet_definitions_test_step500.json --measures P@1 RR",
    "build-vocab": "samtone build-vocab --task=wordnet_definitions --vocab_size=8000 --out=/tmp/wn.model",
    "data-stats": "samtone data-stats --task=wordnet_definitions --split=train --vocabulary=/tmp/wn.model",
    "tasks": "samtone tasks --gin_file=runs/my_data.gin",
    "demo": "samtone demo [--candidates=0] [--tower=t5]",
}


def _split_gin_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """Pull `--gin.NAME=VALUE` out of argv as gin bindings `NAME = VALUE`."""
    rest, bindings = [], []
    for arg in argv:
        if arg.startswith("--gin."):
            name, sep, value = arg[len("--gin.") :].partition("=")
            if not sep:
                raise SystemExit(f"samtone: {arg!r} needs a value: --gin.{name}=VALUE")
            bindings.append(f"{name} = {value}")
        else:
            rest.append(arg)
    return rest, bindings


def _add_gin_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gin_file", action="append", default=[], help="gin file(s), applied in order")
    parser.add_argument("--gin_bindings", action="append", default=[], help="extra gin binding(s)")


# Modes configured entirely by gin: (mode, module, gin-configurable function, print final metrics, help).
GIN_MODES = (
    ("train", "samtone_jax.cli.gin_registry", "train_program", True, "train a dual encoder (gin: runs/*.gin)"),
    (
        "train-adore",
        "samtone_jax.cli.gin_registry",
        "train_adore_program",
        True,
        "ADORE: train the query tower against a frozen index (gin: train_adore.*)",
    ),
    ("eval", "samtone_jax.evaluation.run", "evaluate", False, "retrieval metrics of a trained model (gin: evaluate.*)"),
)


def _add_distributed_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--multihost", action="store_true", help="jax.distributed.initialize() from the environment (TPU)")
    p.add_argument("--coordinator_address", default=None, help="host:port of process 0 (multi-process)")
    p.add_argument(
        "--num_processes", type=int, default=None, help="processes in all (multi-process, with --process_id)"
    )
    p.add_argument("--process_id", type=int, default=None, help="this process's index in [0, --num_processes)")
    p.add_argument("--num_cpu_devices", type=int, default=None, help="CPU devices per process (testing)")
    p.add_argument(
        "--heartbeat_timeout_seconds",
        type=int,
        default=100,
        help="a process silent this long (killed, lost) makes the others exit, not hang",
    )


def _checkpoint_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="a MODEL_DIR, MODEL_DIR/checkpoints/<step> or parameter dir")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    p.add_argument("--vocabulary", default=None, help="SentencePiece .model or tokenizer.json (default: the run's)")
    p.add_argument("--query_length", type=int, default=None, help="default: the run's train.query_length")
    p.add_argument("--doc_length", type=int, default=None, help="default: the run's train.doc_length")


def _weights_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--weights",
        choices=["params", "ema"],
        default="params",
        help="a run's parameters, or their moving average (a run trained with train.ema_decay)",
    )


def _false_negative_flags(parser: argparse.ArgumentParser) -> None:
    """The cuts of data/false_negatives.FalseNegativeFilter (gin FalseNegativeFilter.* in training)."""
    parser.add_argument(
        "--margin", type=float, default=None, help="drop candidates scoring above the positive's score minus this"
    )
    parser.add_argument(
        "--relative_margin",
        type=float,
        default=None,
        help="drop candidates scoring above (1 - margin) x the positive's score",
    )
    parser.add_argument("--max_score", type=float, default=None, help="drop candidates scoring above this")


def _task_flags(parser: argparse.ArgumentParser, task_help: str = "a task name (see `samtone tasks`)") -> None:
    parser.add_argument("--task", required=True, help=task_help)
    parser.add_argument(
        "--split", default=None, help="split (default: train if the task has one, else its first in `samtone tasks`)"
    )
    parser.add_argument("--data_dir", default=None, help="data root (default: $SAMTONE_DATA_DIR)")
    parser.add_argument("--skip_bad_records", action="store_true", help="skip and count malformed lines")


def _eval_flags(p: argparse.ArgumentParser) -> None:
    """samtone eval's plain flags: each sets the gin name commands.EVAL_FLAGS gives (over a gin file)."""
    p.add_argument("--checkpoint", default=None, help="the model: a MODEL_DIR or imported folder (evaluate.model_dir)")
    p.add_argument("--task", default=None, help="the task to evaluate on, see `samtone tasks` (evaluate.task)")
    p.add_argument("--split", default=None, help="its split (evaluate.split; default: test, or dev if it has no test)")
    p.add_argument("--data_dir", default=None, help="data root (data_dir.path; default: $SAMTONE_DATA_DIR)")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (evaluate.step; default: the latest)")
    p.add_argument("--vocabulary", default=None, help="vocabulary file (evaluate.vocabulary; default: the run's)")
    p.add_argument("--query_length", type=int, default=None, help="default: the run's train.query_length")
    p.add_argument("--doc_length", type=int, default=None, help="default: the run's train.doc_length")
    p.add_argument("--max_queries", type=int, default=None, help="an even sample of this many queries (default: all)")
    p.add_argument(
        "--candidates", type=int, default=None, help="rank among this many documents, the gold ones kept (default: all)"
    )
    p.add_argument("--skip_bad_records", action="store_true", help="skip and count malformed lines")


def _run_demo(args, bindings) -> int:
    from samtone_jax.cli import demo  # the demo imports through commands.py: it is not one of them

    return demo.main(
        args.gin_file,
        args.gin_bindings + bindings,
        tower=args.tower,
        candidates=args.candidates,
        eval_queries=args.eval_queries,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="samtone", description=__doc__.splitlines()[0])
    parser.add_argument("--verbosity", default="INFO", help="logging level (DEBUG, INFO, WARNING)")
    parser.add_argument(
        "--compilation_cache",
        default=None,
        help="folder (or gs:// URL) of JAX's persistent compilation cache, or 'off' (default: "
        "$SAMTONE_COMPILATION_CACHE, else ~/.cache/samtone_jax/xla/<this CPU>; compilation_cache.py)",
    )
    subparsers = parser.add_subparsers(dest="mode", required=True, metavar="mode")

    class sub:  # every mode with the defaults-showing help and its example
        @staticmethod
        def add_parser(name: str, **kwargs) -> argparse.ArgumentParser:
            epilog = f"example:\n  {EXAMPLES[name]}"
            return subparsers.add_parser(name, formatter_class=_HelpFormatter, epilog=epilog, **kwargs)

    p = sub.add_parser(
        "import-checkpoint",
        help="convert a T5 (HF / T5X / Mesh-TF) or BERT-family (HF / sentence-transformers) checkpoint to ours",
    )
    _add_gin_flags(p)
    p.add_argument(
        "--format",
        required=True,
        choices=["hf", "t5x", "mtf", "sentence-transformers"],
        help="hf: a Hugging Face T5 / BERT folder; t5x, mtf: T5X / Mesh-TF T5 checkpoints; sentence-transformers",
    )
    p.add_argument(
        "--src",
        required=True,
        help="source checkpoint (folder, file or TF prefix); 'all-MiniLM-L6-v2' (with --format=sentence-transformers): "
        "the pretrained model the lock installs",
    )
    _out_flag(p, "output parameter checkpoint folder (an INIT_CHECKPOINT)")
    p.add_argument("--seed", type=int, default=0, help="seed for a projection the source lacks")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(run=commands.cmd_import_checkpoint)

    for mode, module, function, report_final, text in GIN_MODES:
        p = sub.add_parser(mode, help=text)
        _add_gin_flags(p)
        _add_distributed_flags(p)
        if mode == "eval":
            _eval_flags(p)
            p.add_argument(
                "--dims",
                nargs="+",
                default=None,
                help="also the metrics of the first k dimensions of every embedding, re-normalised, for each k of "
                "e.g. 64,128,256 or 64 128 256 (gin evaluate.dims; a Matryoshka model's smaller indexes)",
            )
            p.add_argument(
                "--precisions",
                nargs="+",
                default=None,
                help="also search the index compressed as served: float32, int8 (per-dimension ranges from a "
                "sample of the corpus), binary (sign bits, Hamming), e.g. float32,int8,binary (evaluate.precisions)",
            )
            p.add_argument(
                "--rescore",
                type=int,
                default=None,
                help="int8 / binary also with the top k·R re-ranked by the float query, for R (evaluate.rescore)",
            )
            p.add_argument(
                "--weights",
                choices=["params", "ema"],
                default=None,
                help="a run's parameters (default), or their moving average (evaluate.weights; train.ema_decay)",
            )
        p.set_defaults(run=commands.gin_command(module, function, report_final))

    p = sub.add_parser("calibrate", help="the int8 ranges a model is served with, from a sample of a task's documents")
    _checkpoint_flags(p)
    _task_flags(p)
    p.add_argument("--documents", type=int, default=10000, help="an even sample of this many documents (by id)")
    _weights_flag(p)
    p.add_argument(
        "--dims", nargs="+", default=None, help="dimensions to calibrate (default: the Matryoshka ones and the full)"
    )
    _add_gin_flags(p)
    p.set_defaults(run=commands.with_gin(commands.cmd_calibrate))

    p = sub.add_parser("average", help="a soup: the weight average of checkpoints of one model (uniform or greedy)")
    p.add_argument(
        "--checkpoints",
        nargs="+",
        required=True,
        help="runs (their latest step), step folders or parameter checkpoints",
    )
    p.add_argument("--last", type=int, default=None, help="with one run: the mean of its last K checkpoints")
    _out_flag(p, "output parameter checkpoint (loadable, exportable, an INIT_CHECKPOINT)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--task", default=None, help="greedy soup: the validation task (default: uniform, no task)")
    p.add_argument("--split", default=None, help="its split (default: train, else its first)")
    p.add_argument("--measure", default=None, help="the measure the greedy soup maximises (default RR), e.g. P@1")
    p.add_argument(
        "--max_queries", type=int, default=None, help="an even sample of this many validation queries (2000)"
    )
    p.add_argument("--candidates", type=int, default=None, help="rank among this many documents (default: all)")
    p.add_argument("--data_dir", default=None, help="data root (default: $SAMTONE_DATA_DIR)")
    p.add_argument("--skip_bad_records", action="store_true", help="skip and count malformed lines")
    _add_gin_flags(p)
    _add_distributed_flags(p)
    p.set_defaults(run=commands.with_gin(commands.cmd_average))

    p = sub.add_parser("encode", help="embed a task's queries / corpus into resumable shards")
    _checkpoint_flags(p)
    _task_flags(p)
    _add_distributed_flags(p)
    p.add_argument("--side", choices=["query", "document", "both"], default="both", help="which texts to embed")
    p.add_argument("--out", default=None, help="output folder (default: <MODEL_DIR>/embeddings/<task>_<split>_step<N>)")
    p.add_argument("--shard_size", type=int, default=65536, help="rows per shard file (the unit of resumption)")
    p.add_argument(
        "--precision",
        choices=["float32", "int8", "binary"],
        default="float32",
        help="store as an index serves them: int8 codes (the model's calibration.json) or packed sign bits",
    )
    p.add_argument("--dim", type=int, default=None, help="the first DIM dimensions, re-normalised (Matryoshka)")
    p.add_argument("--batch_size", type=int, default=256, help="texts (packed: rows) a batch (rounded to the devices)")
    p.add_argument(
        "--packing_max_segments", type=int, default=None, help="pack texts up to this many a row (same embeddings)"
    )
    _add_gin_flags(p)
    p.set_defaults(run=commands.with_gin(commands.cmd_encode))

    p = sub.add_parser("analyze", help="the paper's embedding-space figures for one or more models")
    p.add_argument("--checkpoint", action="append", required=True, help="model to analyse (repeat to compare)")
    p.add_argument("--name", action="append", default=None, help="display name per --checkpoint")
    p.add_argument("--vocabulary", default=None, help="SentencePiece .model or tokenizer.json (default: each run's)")
    p.add_argument("--query_length", type=int, default=None, help="default: each run's train.query_length")
    p.add_argument("--doc_length", type=int, default=None, help="default: each run's train.doc_length")
    _task_flags(p)
    p.add_argument("--out", required=True, help="folder for the PNGs, summary.json and report.md")
    p.add_argument("--tsne_sample", type=int, default=500, help="(query, gold document) pairs in the t-SNE")
    p.add_argument("--ratio_pairs", type=int, default=10000, help="random (i, j) pairs of the similarity ratio")
    p.add_argument("--max_queries", type=int, default=None, help="analyse the first N queries by id")
    p.add_argument("--seed", type=int, default=0, help="seed of the t-SNE sample and the random pairs")
    _add_gin_flags(p)
    p.set_defaults(run=commands.with_gin(commands.cmd_analyze))

    p = sub.add_parser("export", help="a sentence-transformers / Hugging Face / ONNX folder of a trained model")
    p.add_argument("--checkpoint", required=True, help="a MODEL_DIR, MODEL_DIR/checkpoints/<step> or parameter dir")
    p.add_argument(
        "--format",
        required=True,
        choices=["sentence-transformers", "hf", "onnx", "adapter"],
        help="a sentence-transformers folder, a Hugging Face model folder (+ the projection), or that folder "
        "with each side's ONNX graph (float32 and int8 weights, checked in onnxruntime); LoRA adapters are "
        "merged into the towers. adapter: a LoRA model's adapters alone, naming their frozen tower",
    )
    _out_flag(p, "output folder (written atomically)")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    p.add_argument("--vocabulary", default=None, help="SentencePiece .model or tokenizer.json (default: the run's)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    _weights_flag(p)
    p.set_defaults(run=commands.cmd_export)

    p = sub.add_parser("mine", help="hard negatives for a task's queries, from a trained model or BM25")
    p.add_argument("--checkpoint", default=None, help="dense mining with this model (MODEL_DIR or checkpoint)")
    p.add_argument("--bm25", action="store_true", help="BM25 mining (bm25s) instead of a model")
    p.add_argument("--step", type=int, default=None, help="checkpoint step of --checkpoint (default: the latest)")
    p.add_argument("--vocabulary", default=None, help="vocabulary of --checkpoint (default: the run's)")
    _task_flags(p)
    p.add_argument("--out", required=True, help="output TSV 'query_id<TAB>doc_id,doc_id,...' (+ OUT.json counts)")
    p.add_argument("--num_negatives", type=int, default=8, help="negatives kept a query")
    p.add_argument("--range_min", type=int, default=0, help="first retrieved rank kept (0-based)")
    p.add_argument("--range_max", type=int, default=100, help="retrieval depth; ranks >= this are ignored")
    _false_negative_flags(p)
    p.add_argument(
        "--strategy", choices=["top", "sample"], default="top", help="the best-ranked candidates, or a random sample"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of --strategy=sample")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    _add_gin_flags(p)
    p.set_defaults(run=commands.with_gin(commands.cmd_mine))

    p = sub.add_parser("score", help="a teacher's scores of a task's training pairs and candidates (for distillation)")
    p.add_argument(
        "--teacher",
        required=True,
        help="'bm25', or a samtone MODEL_DIR / checkpoint / export, a sentence-transformers folder or a "
        "CrossEncoder folder",
    )
    p.add_argument(
        "--teacher_kind", default="auto", choices=TEACHER_KINDS, help="what --teacher is (auto: from its files)"
    )
    p.add_argument("--step", type=int, default=None, help="checkpoint step of a samtone teacher (default: latest)")
    p.add_argument("--vocabulary", default=None, help="vocabulary of a samtone teacher (default: its own)")
    _task_flags(p)
    p.add_argument("--out", required=True, help="output JSON lines (qid, negatives, scores, positives); + OUT.json")
    p.add_argument(
        "--candidates",
        default="top",
        help="'top': the teacher's own top --depth documents; or a negatives file (samtone mine) to score",
    )
    p.add_argument("--depth", type=int, default=32, help="candidates per query with --candidates=top")
    p.add_argument("--shard_size", type=int, default=1000, help="queries per resumable shard")
    p.add_argument("--batch_size", type=int, default=64, help="texts per batch of a model teacher")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    _add_gin_flags(p)
    p.set_defaults(run=commands.with_gin(commands.cmd_score))

    p = sub.add_parser("compare", help="eval JSONs side by side with paired significance tests")
    p.add_argument("runs", nargs="+", help="eval JSON files (MODEL_DIR/eval/*.json); the first is the baseline")
    p.add_argument(
        "--measures", nargs="+", default=None, help="measure names, e.g. P@1 RR or P@1,RR (default: all shared)"
    )
    p.add_argument(
        "--test", choices=["randomization", "bootstrap"], default="randomization", help="paired significance test"
    )
    p.add_argument("--trials", type=int, default=10000, help="random permutations / resamples of the test")
    p.add_argument("--seed", type=int, default=0, help="seed of the test")
    p.add_argument("--allow_partial", action="store_true", help="compare on the queries all runs share")
    p.set_defaults(run=commands.cmd_compare)

    p = sub.add_parser(
        "build-vocab", help="train a SentencePiece vocabulary on the text of a task, tasks (a,b) or a mixture"
    )
    _task_flags(p, "tasks and / or mixtures, comma-separated (each task's texts once, weighted by its size)")
    p.add_argument("--vocab_size", type=int, required=True, help="pieces in the vocabulary (e.g. 32000)")
    p.add_argument("--out", required=True, help="output .model file (written atomically)")
    _add_gin_flags(p)
    p.set_defaults(run=commands.with_gin(commands.cmd_build_vocab))

    p = sub.add_parser("data-stats", help="examples, unique queries / documents, truncation of a task")
    _task_flags(p)
    p.add_argument("--vocabulary", default=None, help="SentencePiece model for the truncation rate (default: none)")
    p.add_argument("--vocab", dest="vocabulary", action=_Deprecated, new="--vocabulary")
    p.add_argument("--query_length", type=int, default=64, help="query length for the truncation rate")
    p.add_argument("--doc_length", type=int, default=128, help="document length for the truncation rate")
    _add_gin_flags(p)
    p.set_defaults(run=commands.with_gin(commands.cmd_data_stats))

    p = sub.add_parser("tasks", help="every task with its splits and the files it reads, and every mixture")
    _add_gin_flags(p)
    p.add_argument("--data_dir", default=None, help="data root shown (default: $SAMTONE_DATA_DIR)")
    p.set_defaults(run=commands.with_gin(commands.cmd_tasks))

    p = sub.add_parser(
        "demo", help="the embedded end-to-end example: fine-tune all-MiniLM-L6-v2 on WordNet and evaluate (CPU)"
    )
    _add_gin_flags(p)
    p.add_argument(
        "--tower",
        choices=["minilm", "t5"],
        default="minilm",
        help="minilm: fine-tune the pretrained all-MiniLM-L6-v2 (runs/demo); t5: a mini T5.1.1 from scratch "
        "(runs/demo_t5)",
    )
    p.add_argument(
        "--candidates",
        type=int,
        default=20_000,
        help="definitions each held-out query is ranked among: its gold ones and an even sample of the rest "
        "(default 20000; 0 = all 117,659, ~4 min more per model on 2 cores)",
    )
    p.add_argument("--eval_queries", type=int, default=2000, help="held-out queries evaluated (default 2000)")
    p.set_defaults(run=_run_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, bindings = _split_gin_overrides(argv)
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.verbosity.upper(), format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "jax._src", "tensorflow", "h5py"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from samtone_jax.core.errors import UserError, one_line

    if bindings and not hasattr(args, "gin_file"):
        given = bindings[0].replace(" = ", "=", 1)
        print(f"samtone {args.mode}: error: this mode takes no gin settings (got --gin.{given})", file=sys.stderr)
        return 2
    try:
        from samtone_jax.core import compilation_cache

        compilation_cache.enable(args.compilation_cache)  # before anything is compiled
        return args.run(args, bindings)
    except UserError as e:
        # What the user can fix: one clear line (--verbosity=DEBUG shows the traceback). Anything
        # else (a bug, a library's own error) keeps its traceback.
        logging.getLogger("samtone").debug("traceback", exc_info=True)
        print(f"samtone {args.mode}: error: {one_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
