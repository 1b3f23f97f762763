"""Per-query eval records kept in the repository (experiments/records/), so that a table's seeds
accumulate across machines and sessions: an experiment's run folders live on one machine's disk and
are lost with it, while a paired test over seeds needs every seed's per-query scores. Each record is an
eval JSON cut to what the tables read (task, split, the metrics, the per-query scores of the measures
compared) plus where it came from (the commit of the code that made it, whether the tree had changes,
the date, the run's folder); a rerun of the experiment reads it instead of training the arm again.
A record made by code whose recipe has since changed is stale: delete the arm's folder under records/
to make it again (the report names each record's commit)."""

from __future__ import annotations

import json
import os
import subprocess
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "records")


def _commit() -> dict:
    """The code's commit and whether the working tree differs from it."""
    here = os.path.dirname(os.path.abspath(__file__))

    def git(*argv):
        return subprocess.run(["git", *argv], cwd=here, capture_output=True, text=True, check=False).stdout.strip()

    changes = git("status", "--porcelain", "--", "..", ":(exclude)records")  # the records are not code
    return {"commit": git("rev-parse", "HEAD") or "unknown", "dirty": bool(changes)}


class KeptRecords:
    """The records of one experiment (and data / guard), under ROOT/NAME/<arm>_s<seed>/<task>.json."""

    def __init__(self, name: str, measures: tuple[str, ...], root: str = ROOT):
        self.folder = os.path.join(root, name)
        self.measures = measures
        self.code = _commit()  # the code this process started with, not the tree's when a record is kept

    def _path(self, arm: str, seed: int | None, task: str) -> str:
        return os.path.join(self.folder, arm if seed is None else f"{arm}_s{seed}", f"{task}.json")

    def get(self, arm: str, seed: int | None, tasks: list[str]) -> dict[str, str] | None:
        """{task: the kept record} when every task's is kept, else None."""
        found = {task: self._path(arm, seed, task) for task in tasks}
        return found if all(os.path.isfile(p) for p in found.values()) else None

    def keep(self, arm: str, seed: int | None, evals: dict[str, str]) -> dict[str, str]:
        """Copies each task's eval JSON (cut, with its provenance) into the store; {task: kept path}."""
        origin = {**self.code, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        kept = {}
        for task, path in evals.items():
            with open(path) as f:
                record = json.load(f)
            missing = [m for m in self.measures if m not in record.get("per_query", {})]
            if missing:
                raise ValueError(f"{path} has no per-query {', '.join(missing)}: cannot keep it for a paired test")
            cut = {k: record[k] for k in ("task", "split", "metrics") if k in record}
            cut["per_query"] = {m: {q: round(v, 6) for q, v in record["per_query"][m].items()} for m in self.measures}
            cut["made"] = {**origin, "from": os.path.dirname(os.path.dirname(os.path.abspath(path)))}
            target = self._path(arm, seed, task)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target + ".tmp", "w") as f:
                json.dump(cut, f, indent=0, sort_keys=True)
            os.replace(target + ".tmp", target)
            kept[task] = target
        return kept

    @staticmethod
    def made(path: str) -> str:
        """'commit[+changes] date' of a kept record ('' for an eval JSON not from the store)."""
        with open(path) as f:
            made = json.load(f).get("made")
        if not made:
            return ""
        return f"{made['commit'][:10]}{'+changes' if made['dirty'] else ''} {made['date']}"
