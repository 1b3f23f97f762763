"""Where a packed fine-tuning step's time goes, ours against sentence-transformers', on the same real
batches (bert_finetune_bench.py's model, batches, loss and optimizer): each side timed, then profiled
(ours: jax.profiler's trace of the XLA:CPU ops; theirs: torch.profiler), and the time per step printed
by kind of op, with the share of our step that no traced op covers (the executor between ops).

  .venv/bin/python benchmarks/bert_step_profile.py [--model all-mpnet-base-v2] [--batches 3]
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import types
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bert_finetune_bench as bench  # noqa: E402
import jax  # noqa: E402

from samtone_jax.checkpoints import pretrained  # noqa: E402
from samtone_jax.cli import main as cli  # noqa: E402
from samtone_jax.core import run_folders  # noqa: E402


def xla_ops(trace_dir: str, steps: int) -> tuple[dict[str, float], float, float]:
    """({op kind: seconds a step}, seconds a step the executions took, seconds a step ops covered)
    from a jax.profiler trace of `steps` executions."""
    (path,) = glob.glob(f"{trace_dir}/plugins/profile/*/*.trace.json.gz")
    events = json.load(gzip.open(path))["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    xla = [e for e in events if e.get("ph") == "X" and threads.get((e["pid"], e["tid"]), "").startswith("tf_XLA")]
    ops = [e for e in xla if "Thunk" not in e["name"] and "Await" not in e["name"] and "Threadpool" not in e["name"]]
    kinds = collections.defaultdict(float)
    for e in ops:
        kinds[re.sub(r"[.\d]+$", "", e["name"])] += e["dur"] / 1e6 / steps
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in ops)
    covered, (start, end) = 0.0, spans[0]
    for s, e in spans[1:]:
        if s > end:
            covered, start, end = covered + end - start, s, e
        else:
            end = max(end, e)
    covered += end - start
    wall = sum(e["dur"] for e in xla if e["name"] == "ThunkExecutor::Execute (wait for completion)")
    return dict(kinds), wall / 1e6 / steps, covered / 1e6 / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="all-mpnet-base-v2", choices=sorted(pretrained.MODELS))
    parser.add_argument("--batches", type=int, default=3)
    args = parser.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from samtone_jax.data.packing import pack_batch
    from samtone_jax.data.wordpiece_tokens import WordPieceTokens
    from samtone_jax.training.train_batches import Packing

    torch.set_num_threads(os.cpu_count())
    folder = pretrained.folder(args.model)
    imported = tempfile.mkdtemp(prefix="bert_step_profile_") + "/m"
    assert (
        cli.main(["import-checkpoint", "--format=sentence-transformers", f"--checkpoint={folder}", f"--out={imported}"])
        == 0
    )
    batches = bench.real_batches(f"{imported}/{run_folders.TOKENIZER}", 64, args.batches)
    pad_id = WordPieceTokens(f"{imported}/{run_folders.TOKENIZER}").source_pad_id
    floor = Packing(max_segments=8).row_floor(types.SimpleNamespace(shape={"data": 1}), batches)
    packed = [pack_batch(b, 1, 8, min_rows=floor) for b in batches]
    cut = [[b[k][:, : int(bench.lengths_of(b[k]).max())] for k in ("query_tokens", "doc_tokens")] for b in batches]
    ours = bench.Ours(imported, bench.LOSSES["in-batch"][0], 8)
    theirs = bench.theirs(folder, ("query_to_doc",), pad_id)
    for p, c in zip(packed, cut, strict=True):  # compile, warm up
        ours(p), theirs(c)
    n = len(batches)
    ours_s, theirs_s = sum(map(ours, packed)) / n, sum(map(theirs, cut)) / n
    tokens_ours = sum(p[k].size for p in packed for k in ("query_tokens", "doc_tokens")) / n
    tokens_theirs = sum(q.size + d.size for q, d in cut) / n
    print(f"{args.model}, in-batch loss, batch 64, {n} WordNet batches, {os.cpu_count()} cores, float32")
    for side, seconds, tokens in (("ours", ours_s, tokens_ours), ("theirs", theirs_s, tokens_theirs)):
        print(
            f"{side:6s} {seconds:6.2f} s a step, {tokens:5.0f} computed tokens: {seconds / tokens * 1e3:.2f} ms a token"
        )
    print(f"ours / theirs, pairs/s: {theirs_s / ours_s:.2f}x")
    trace = tempfile.mkdtemp(prefix="bert_step_profile_trace_")
    with jax.profiler.trace(trace):
        for p in packed:
            ours(p)
    kinds, wall, covered = xla_ops(trace, n)
    print(
        f"\nours, profiled: {wall:.2f} s a step, ops cover {covered:.2f} s ({covered / wall:.0%}); by kind, s a step:"
    )
    for kind, seconds in sorted(kinds.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {seconds:6.3f}  {kind}")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for c in cut:
            theirs(c)
    print("\ntheirs, profiled (self CPU time, all steps):")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))


if __name__ == "__main__":
    main()
