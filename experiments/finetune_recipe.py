"""What each part of `samtone finetune`'s recipe buys in-domain and costs on a guard, over seeds: the
README's own-data stand-in (every 10th WordNet example -> definition pair, 4,834 pairs; 483 queries
held out by the md5 rule) fine-tuned from all-MiniLM-L6-v2, guarded on MultiReQA-SQuAD (500 test
questions among 5,000 sentences), each arm one `samtone finetune` a seed (train.seed):

  plain        the recipe's defaults (500 steps, batch 64, Adafactor 1e-3, 32 / 48 training tokens)
  lr3e-4       the same at a third of the learning rate
  wise0.8      plain's run mixed with the base, 0.8 x run + 0.2 x base (the α `--wise_ft` picked on
               seed 0's dev queries), no training of its own: `samtone average` and two evaluations
  hn_refresh   + one mined hard negative a query (relative margin 0.05), mined by the base, then
               again by the run's own weights at step 250 (--hard_negatives 1 --refresh_negatives 250)
  hn_wise0.8   hn_refresh's run mixed with the base as wise0.8 (the recipe's parts together, no teacher)
  teacher      + all-mpnet-base-v2 as the teacher (make mpnet): the run's in-batch similarities matched
               to its embeddings of the training texts (--teacher, the default weight)
  mpnet        all-mpnet-base-v2 fine-tuned by plain's recipe (make mpnet; about 5x MiniLM's cost a step)
  teacher_ft   + the mpnet arm's seed-0 run as the teacher (a bigger model that learnt the data; made once,
               first, and the same teacher for every seed of the student)
  teacher_kl   teacher_ft with the teacher's in-batch ranking as soft labels at weight 1 (the KL of the
               in-batch softmaxes at τ 0.05: --teacher_mode=softmax), where
               teacher_ft matches the cosines themselves (weight 100)
  teacher_kl_t0.2  the same at τ 0.2, weight 4: softer labels (the teacher learnt these pairs, and puts 0.989
               of a training query's softmax on its own document at τ 0.05, 0.29 at τ 0.2: its ranking of the
               other documents shows; experiments/teacher_soft_labels.py), the weight for the KL's gradient
               (÷ τ) to sit near the contrastive loss's
  full         hn_refresh + teacher_ft's teacher; full_wise0.8: its run mixed with the base as wise0.8
  st_mnrl      the peer: sentence-transformers' own model and MultipleNegativesRankingLoss (query ->
               document, scale 20) on the same pipeline's batches, 500 steps of 64 at 32 / 48 tokens, with
               its usual AdamW recipe (lr 5e-5, 10 % warm-up then linear decay, weight decay 0.01, clip
               1.0: experiments/pretrained_peer.py's st_train), imported and evaluated as the other arms
  lora32       LoRA rank 32 on every attention and MLP projection (DualEncoder.lora_rank), rate 1e-2
               (not run yet: docs/RESULTS.md has the arms that were)

Both sides are evaluated as `samtone finetune` evaluates them (the base's serving lengths). Reported per
arm: in-domain and guard P@1 / MRR, mean ± std over seeds, the guard's retention (÷ the base's),
and paired randomisation tests on the seed-averaged per-query scores, against the base and against
plain, into OUT/summary_<arms>_s<seeds>.txt / .json. Resumable: a finished step of an arm is skipped
(finetune's own resumption). Each arm and seed's per-query records are kept in the repository
(experiments/records/finetune_recipe/<data>+<guard>/, experiments/kept_records.py): an arm already kept
is read from there, not trained again (--ignore_kept trains it anew), so seeds add up across machines.

  SAMTONE_DATA_DIR=../shared/data .venv/bin/python experiments/finetune_recipe.py --out runs/finetune_recipe
  # the other direction: MultiReQA-SQuAD's pairs, guarded on WordNet
  SAMTONE_DATA_DIR=../shared/data .venv/bin/python experiments/finetune_recipe.py --data multireqa_squad_dev \
      --guard wordnet_definitions --out runs/finetune_recipe_squad
"""

from __future__ import annotations

import json
import os
import statistics

from common import parse_into_folder, samtone, seed_average
from kept_records import KeptRecords

from samtone_jax.core.run_folders import COMMIT_MARKER

GUARD = "multireqa_squad_dev"
GUARD_QUERIES, GUARD_CANDIDATES = 500, 5000  # finetune's defaults
MAX_QUERIES = 2000  # finetune's default
DATA_TASK = "finetune_data"
ARMS = {  # arm -> extra `samtone finetune` flags (wise0.8: made from plain, see above)
    "plain": [],
    "lr3e-4": ["--learning_rate=3e-4"],
    "hn_refresh": ["--hard_negatives=1", "--refresh_negatives=250"],
    "lora32": ["--learning_rate=1e-2", "--gin_bindings=DualEncoder.lora_rank=32"],
    "teacher": ["--teacher=all-mpnet-base-v2"],
    "mpnet": ["--base=all-mpnet-base-v2"],
    "teacher_ft": ["--teacher={teacher}"],
    "teacher_kl": ["--teacher={teacher}", "--teacher_mode=softmax", "--teacher_weight=1"],
    "teacher_kl_t0.2": [
        "--teacher={teacher}",
        "--teacher_mode=softmax",
        "--teacher_weight=4",
        "--gin_bindings=objective.embedding_distillation_temperature=0.2",
    ],
    "full": ["--hard_negatives=1", "--refresh_negatives=250", "--teacher={teacher}"],
    "wise0.8": None,
    "hn_wise0.8": None,
    "full_wise0.8": None,
    "st_mnrl": None,
}
PEER = {"st_mnrl": (("query_to_doc",), "joint")}  # arm -> MultipleNegativesRankingLoss (directions, partition)
PEER_BUDGET = {"steps": 500, "batch": 64, "learning_rate": 5e-5, "temperature": 0.05}
TRAIN_LENGTHS = (32, 48)  # finetune's training lengths for a pretrained base
# a mix -> the arm whose run it mixes with the base
WISE = {"wise0.8": "plain", "hn_wise0.8": "hn_refresh", "full_wise0.8": "full"}
NEEDS = WISE  # an arm -> the arm whose run (of the same seed) it uses
# The fine-tuned teacher: the mpnet arm's seed-0 run, made once and used by every seed of the arms that
# name {teacher} (a teacher is fine-tuned once, as a user would; the students' seeds vary).
TEACHER, TEACHER_FLAG = ("mpnet", 0), "{teacher}"
WISE_ALPHA = 0.8
MEASURES = ("P@1", "RR")


def stand_in_pairs(path: str) -> None:
    """The README's stand-in file: every 10th WordNet (example, definition) pair."""
    from samtone_jax.tasks import catalogue

    if os.path.exists(path):
        return
    c = catalogue.collection("wordnet_definitions", "all")
    with open(path + ".tmp", "w") as f:
        for q, d in c.pairs()[::10]:
            print(json.dumps({"query": c.queries[q], "document": c.corpus[d]}), file=f)
    os.replace(path + ".tmp", path)


def records(model: str, gin: list[str], tasks: list[tuple[str, str, int, int | None]]) -> dict[str, str]:
    """{task: the eval JSON of `model`} for each (task, split, queries, candidates), evaluated as
    finetune evaluates (once)."""
    from samtone_jax.cli.finetune_state import eval_record

    found = {}
    for name, split, queries, candidates in tasks:
        record = eval_record(model, name, split, queries, candidates)
        if record is None:
            ev = ["eval", *gin, f"--checkpoint={model}", f"--task={name}", f"--split={split}"]
            ev += [f"--max_queries={queries}"] + ([f"--candidates={candidates}"] if candidates else [])
            samtone(*ev, log=f"{model}_eval_{name}.log")
            record = eval_record(model, name, split, queries, candidates)
        found[name] = record
    return found


def main() -> None:
    from common import experiment_parser

    from samtone_jax.evaluation.significance import compare

    parser = experiment_parser(__doc__, "runs/finetune_recipe", budget=False)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--data", default=None, help="a task to fine-tune on (default: the stand-in pairs)")
    parser.add_argument("--guard", default=GUARD, help="the guard task")
    parser.add_argument(
        "--ignore_kept",
        action="store_true",
        help="keep every arm's records anew from this --out's run folders (trained and evaluated where they "
        "are missing), even those kept in experiments/records/ under the same settings",
    )
    args, out = parse_into_folder(parser)
    arms = ["plain", *(a for a in args.arms if a != "plain")]  # every arm is compared with plain
    arms += [NEEDS[a] for a in arms if a in NEEDS and NEEDS[a] not in arms]  # a mix needs its run, ...
    arms.sort(key=lambda a: a in NEEDS)  # ... made before it
    from samtone_jax.evaluation.guard import guard_split

    if args.data is None:  # the stand-in file, declared as finetune declares a --data file
        data, task = f"{out}/pairs.jsonl", DATA_TASK
        stand_in_pairs(data)
        declared = f"local_tasks.tasks = {{'{task}': {{'format': 'jsonl', 'path': '{data}', 'test_fraction': 0.1}}}}"
        gin = [f"--gin_bindings={declared}"]
    else:
        data = task = args.data
        gin = []
    from samtone_jax.cli import gin_registry

    gin_registry.parse([], [b.split("=", 1)[1] for b in gin])  # the file's task, declared for guard_split
    tasks = [(task, guard_split(task), MAX_QUERIES, None)]
    tasks += [(args.guard, guard_split(args.guard), GUARD_QUERIES, GUARD_CANDIDATES)]
    base = f"{out}/base"
    store = KeptRecords(f"finetune_recipe/{args.data or 'stand_in'}+{args.guard}", MEASURES)

    def imported() -> str:
        if not os.path.exists(f"{base}/{COMMIT_MARKER}"):
            samtone(
                "import-checkpoint",
                "--format=sentence-transformers",
                "--checkpoint=all-MiniLM-L6-v2",
                f"--out={base}",
                log=f"{out}/import.log",
            )
        return base

    def make(arm: str, seed: int | None) -> str:
        """The model of ARM at SEED (trained, mixed or imported; skipped when done)."""
        if arm == "base":
            return imported()
        imported()
        folder = f"{out}/{arm}_s{seed}"
        print(f"{arm} seed {seed}", flush=True)
        if arm in PEER:
            model = f"{folder}/model"
            if not os.path.exists(f"{model}/{COMMIT_MARKER}"):
                peer_train(base, task, seed, PEER[arm], folder)
            return model
        if arm in WISE:
            model = f"{folder}/model"
            if not os.path.exists(f"{model}/{COMMIT_MARKER}"):
                os.makedirs(folder, exist_ok=True)
                run = make(WISE[arm], seed)  # its run, trained again when only its records are kept
                if store.digest(records(run, gin, tasks)) != needs(arm, seed)[f"{WISE[arm]}_s{seed}"]:
                    raise SystemExit(
                        f"{run} (trained again to make {arm} seed {seed}) scores otherwise than its kept records: "
                        "rerun with --ignore_kept to make both anew"
                    )
                mix = ["average", "--checkpoint", run, base, "--weights", f"{WISE_ALPHA:g}", f"{1 - WISE_ALPHA:g}"]
                samtone(*mix, f"--out={model}", log=f"{folder}/average.log")
            return model
        if any(TEACHER_FLAG in flag for flag in ARMS[arm]):
            make(*TEACHER)  # the fine-tuned teacher, made once (a later call finds it done)
        finetune = ["finetune", f"--data={data}", f"--base={base}", f"--out={folder}", "--guard", args.guard]
        extra = [flag.format(out=out, seed=seed, teacher=f"{out}/{TEACHER[0]}_s{TEACHER[1]}/run") for flag in ARMS[arm]]
        samtone(*finetune, *extra, f"--gin_bindings=train.seed={seed}", log=f"{folder}.log")
        return f"{folder}/run"

    def needs(arm: str, seed: int | None) -> dict[str, str]:
        """{the arm and seed whose run ARM at SEED is made from: the digest of its kept records}."""
        made_from = [(WISE[arm], seed)] if arm in WISE else []
        made_from += [TEACHER] if any(TEACHER_FLAG in flag for flag in ARMS.get(arm) or []) else []
        return {f"{a}_s{s}": store.digest(evaluated(a, s)) for a, s in made_from}

    def evaluated(arm: str, seed: int | None) -> dict[str, str]:
        """{task: eval JSON} of ARM at SEED: the kept record, else made, evaluated and kept."""
        key = {"tasks": [list(t) for t in tasks], "flags": ARMS.get(arm), "needs": needs(arm, seed)}
        key |= {"alpha": WISE_ALPHA} if arm in WISE else {}
        key |= {"peer": PEER[arm], "budget": PEER_BUDGET, "lengths": TRAIN_LENGTHS} if arm in PEER else {}
        kept = None if args.ignore_kept else store.get(arm, seed, [t[0] for t in tasks], key)
        return kept or store.keep(arm, seed, key, records(make(arm, seed), gin, tasks))

    evals = {("base", None): evaluated("base", None)}
    for seed in args.seeds:
        for arm in arms:
            evals[arm, seed] = evaluated(arm, seed)
    report(out, evals, arms, args.seeds, [t[0] for t in tasks], compare)


def peer_train(base: str, task: str, seed: int, loss: tuple, folder: str) -> None:
    """sentence-transformers' fine-tune of all-MiniLM-L6-v2 into FOLDER/st, imported as FOLDER/model."""
    import argparse

    from pretrained_peer import st_train

    from samtone_jax.checkpoints import pretrained

    st_folder = f"{folder}/st"
    if not os.path.exists(f"{st_folder}/modules.json"):
        budget = argparse.Namespace(**PEER_BUDGET)
        st_train(
            pretrained.folder(pretrained.NAME),
            f"{base}/tokenizer.json",
            task,
            budget,
            seed,
            loss,
            st_folder,
            TRAIN_LENGTHS,
        )
    samtone(
        "import-checkpoint",
        "--format=sentence-transformers",
        f"--checkpoint={st_folder}",
        f"--out={folder}/model",
        "--overwrite",
        log=f"{folder}/import.log",
    )


def report(out, evals, arms, seeds, tasks, compare) -> None:
    # Named by the seeds (the per-query averages) and the arms (the table): another command's report
    # in the same OUT, over other seeds or arms, is written beside this one, not over it.
    seed_tag = "s" + "_".join(map(str, seeds))
    averaged_dir = f"{out}/averaged/{seed_tag}"
    os.makedirs(averaged_dir, exist_ok=True)
    base = evals["base", None]
    lines = [
        f"{len(seeds)} seeds ({' '.join(map(str, seeds))}); mean ± std over seeds; p: paired randomisation test on "
        "the seed-averaged per-query scores",
        f"{'arm':11s} {'task':22s} {'measure':7s} {'mean':>7s} {'± std':>7s} {'kept':>7s} {'vs base':>8s} "
        f"{'p':>6s} {'vs plain':>8s} {'p':>6s}",
    ]
    summary = {}
    for task in tasks:
        base_metrics = json.load(open(base[task]))["metrics"]
        for m in MEASURES:
            lines.append(f"{'base':11s} {task:22s} {m:7s} {base_metrics[m]:7.4f}")
        averaged = {
            arm: seed_average([evals[arm, s][task] for s in seeds], f"{averaged_dir}/{arm}_{task}.json") for arm in arms
        }
        for arm in arms:
            vs_base = compare([base[task], averaged[arm]], measures=list(MEASURES))["measures"]
            vs_plain = compare([averaged["plain"], averaged[arm]], measures=list(MEASURES))["measures"]
            for m in MEASURES:
                values = [json.load(open(evals[arm, s][task]))["metrics"][m] for s in seeds]
                mean = statistics.fmean(values)
                std = statistics.stdev(values) if len(values) > 1 else 0.0
                b, pb = vs_base[m][1]["mean"] - vs_base[m][0]["mean"], vs_base[m][1]["p"]
                d, pp = vs_plain[m][1]["mean"] - vs_plain[m][0]["mean"], vs_plain[m][1]["p"]
                plain = f"{d:+8.4f} {pp:6.4f}" if arm != "plain" else ""
                lines.append(
                    f"{arm:11s} {task:22s} {m:7s} {mean:7.4f} {std:7.4f} {mean / base_metrics[m]:7.1%} "
                    f"{b:+8.4f} {pb:6.4f} {plain}"
                )
                summary[f"{arm}/{task}/{m}"] = {"mean": mean, "std": std, "seeds": values, "p_base": pb, "p_plain": pp}
    lines.append("made by (commit, date) of each record kept in experiments/records/:")
    for (arm, seed), found in evals.items():
        lines.append(f"  {arm}{'' if seed is None else f' s{seed}'}: {KeptRecords.made(next(iter(found.values())))}")
    table = "\n".join(lines)
    print(table)
    name = f"{out}/summary_{'+'.join(arms)}_{seed_tag}"
    with open(f"{name}.txt", "w") as f:
        f.write(table + "\n")
    with open(f"{name}.json", "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
