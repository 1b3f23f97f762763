"""Per-query eval records kept in the repository (experiments/records/), so that a table's seeds
accumulate across machines and sessions: an experiment's run folders live on one machine's disk and
are lost with it, while a paired test over seeds needs every seed's per-query scores.

Each arm and seed is a folder <arm>_s<seed>/ of one JSON a task: the eval JSON cut to what the tables
read (task, split, the sample's size, lengths, step, the metrics, the per-query scores of the measures
compared) plus

  key   what the record answers for: the experiment's settings for the arm (its flags, the evaluation
        samples, ...) and the digest of every record it was made from (a WiSE mix's run, a student's
        teacher). A record whose key differs from the one a rerun asks for is stale and made again.
  made  the commit of the code that kept it (and whether the tree had changes then), when its eval
        JSON was written and whether this process wrote it (an eval a rerun found on disk is kept
        with the commit of the process that found it, marked as found).

A folder is written whole (into a temporary name, then renamed), never half of its tasks."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "records")


def _commit() -> dict:
    """The code's commit and whether the working tree differs from it (None when git cannot say)."""
    here = os.path.dirname(os.path.abspath(__file__))

    def git(*argv):
        try:
            done = subprocess.run(["git", "--no-optional-locks", *argv], cwd=here, capture_output=True, text=True)
        except OSError:
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    changes = git("status", "--porcelain", "--", "..", ":(exclude)records")  # the records are not code
    return {"commit": commit or "unknown", "dirty": None if commit is None or changes is None else bool(changes)}


def _stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


class KeptRecords:
    """The records of one experiment (and data / guard), under ROOT/NAME/<arm>_s<seed>/<task>.json."""

    FIELDS = ("task", "split", "step", "queries", "corpus", "lengths", "training_lengths", "metrics")

    def __init__(self, name: str, measures: tuple[str, ...], root: str = ROOT):
        self.folder = os.path.join(root, name)
        self.measures = measures
        self.code = _commit()  # the code this process started with, not the tree's when a record is kept
        self.started = time.time()

    def _arm_folder(self, arm: str, seed: int | None) -> str:
        return os.path.join(self.folder, arm if seed is None else f"{arm}_s{seed}")

    def get(self, arm: str, seed: int | None, tasks: list[str], key: dict) -> dict[str, str] | None:
        """{task: the kept record} when every task's is kept under this key, else None (a record kept
        under another key is reported as stale)."""
        found = {task: os.path.join(self._arm_folder(arm, seed), f"{task}.json") for task in tasks}
        if not all(os.path.isfile(p) for p in found.values()):
            return None
        for path in found.values():
            with open(path) as f:
                kept = json.load(f).get("key")
            if kept != json.loads(json.dumps(key)):
                print(f"  {path}: kept for other settings or from other records; made again", flush=True)
                return None
        return found

    def cut(self, path: str) -> dict:
        """An eval JSON cut to what is kept (no provenance)."""
        with open(path) as f:
            record = json.load(f)
        missing = [m for m in self.measures if m not in record.get("per_query", {})]
        if missing:
            raise ValueError(f"{path} has no per-query {', '.join(missing)}: cannot keep it for a paired test")
        cut = {k: record[k] for k in self.FIELDS if k in record}
        cut["per_query"] = {m: {q: round(v, 6) for q, v in record["per_query"][m].items()} for m in self.measures}
        return cut

    def digest(self, evals: dict[str, str]) -> str:
        """What a set of records says (their tasks' scores, not when or by what they were kept)."""
        scores = {
            task: {k: v for k, v in self.cut(p).items() if k in ("task", "split", "per_query")}
            for task, p in evals.items()
        }
        return hashlib.sha256(json.dumps(scores, sort_keys=True).encode()).hexdigest()[:16]

    def keep(self, arm: str, seed: int | None, key: dict, evals: dict[str, str]) -> dict[str, str]:
        """Copies each task's eval JSON (cut, with its key and provenance) into the arm's folder, written
        whole; {task: kept path}."""
        target = self._arm_folder(arm, seed)
        os.makedirs(self.folder, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.", dir=self.folder)
        for task, path in evals.items():
            written = os.path.getmtime(path)
            record = self.cut(path)
            record["key"] = key
            record["made"] = {
                "kept_by": self.code,
                "eval_written": _stamp(written),
                "eval_by_this_process": written >= self.started,
                "from": os.path.dirname(os.path.dirname(os.path.abspath(path))),
            }
            with open(os.path.join(staging, f"{task}.json"), "w") as f:
                json.dump(record, f, indent=0, sort_keys=True)
        old = None
        if os.path.exists(target):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old.", dir=self.folder)
            os.replace(target, os.path.join(old, "kept"))
        os.replace(staging, target)
        if old:
            shutil.rmtree(old)
        return {task: os.path.join(target, f"{task}.json") for task in evals}

    @staticmethod
    def made(path: str) -> str:
        """'commit[+changes] date' of a kept record ('' for an eval JSON not from the store)."""
        with open(path) as f:
            made = json.load(f).get("made")
        if not made:
            return ""
        code = made["kept_by"]
        changes = {True: "+changes", False: "", None: "+?"}[code["dirty"]]
        found = "" if made["eval_by_this_process"] else " (an eval found on disk)"
        return f"{code['commit'][:10]}{changes}, eval written {made['eval_written']}{found}"
