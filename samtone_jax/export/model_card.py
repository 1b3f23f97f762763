"""The README.md (model card) of an export: what the model is, how it was trained, how it scores,
and how to load it, from the checkpoint's run directory (config.gin, eval/*.json)."""

from __future__ import annotations

import json
import re

from samtone_jax.core import paths, run_folders
from samtone_jax.models import families

_BINDING = re.compile(r"^([A-Za-z_][\w.]*)\s*=\s*(.+)$")


def run_settings(run_dir: str) -> dict[str, str]:
    """{gin name: value} from MODEL_DIR/config.gin with %MACROs resolved (empty without one)."""
    path = paths.as_path(run_dir) / run_folders.CONFIG_GIN
    if not path.exists():
        return {}
    bindings = {}
    for line in path.read_text().splitlines():
        m = _BINDING.match(line.strip())
        if m:
            bindings[m.group(1)] = m.group(2)
    return {k: bindings.get(v[1:], v) if v.startswith("%") else v for k, v in bindings.items()}


def eval_results(run_dir: str, weights: str = "params") -> list[dict]:
    """The eval JSONs under MODEL_DIR/eval of `weights` (newest step per task/split)."""
    latest = {}
    folder = paths.as_path(run_dir) / run_folders.EVAL
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            record = json.loads(path.read_text())
            key = (record["task"], record["split"])
        except (ValueError, KeyError, TypeError):
            continue
        if record.get("weights", "params") != weights:
            continue  # another set of the run's weights (its parameters or their moving average)
        if record.get("dim") is not None or record.get("precision", "float32") != "float32":
            continue  # `samtone eval --dims / --precisions`: a truncation or compression, not the model's score
        if key not in latest or record.get("step", 0) >= latest[key].get("step", 0):
            latest[key] = record
    return [latest[k] for k in sorted(latest)]


def mteb_metadata(run_dir: str, projection_dim: int, max_tokens: int, calibration=None) -> dict:
    """MTEB's model metadata fields this run can fill: embedding dimension, maximum tokens, similarity,
    output dtypes, and the training datasets (the task, or a declared mixture's members)."""
    from samtone_jax.config import gin_config
    from samtone_jax.tasks import catalogue

    config = paths.as_path(run_dir) / run_folders.CONFIG_GIN
    settings = gin_config.read_bindings(config.read_text()) if config.exists() else {}
    task = str(settings.get("train.task") or "")
    mixtures = settings.get("mixtures.declared") or {}
    members = (mixtures.get(task) if isinstance(mixtures, dict) else None) or catalogue.MIXTURES.get(task)
    names = list(members) if members else ([task] if task else [])
    split = str(settings.get("inputs.split") or "train")
    return {
        "embed_dim": projection_dim,
        "max_tokens": max_tokens,
        "similarity_fn_name": "cosine",
        "output_dtypes": ["float32", *(["int8"] if calibration is not None else []), "binary"],
        "training_datasets": {name: [split] for name in names},
    }


def model_card(
    *,
    architecture: str,
    config,
    projection_dim: int,
    fmt: str,
    query_length: int,
    doc_length: int,
    run_dir: str,
    step: int | None,
    matryoshka_dims=None,
    calibration=None,
    weights: str = "params",
    training_lengths=(None, None),
) -> str:
    settings = run_settings(run_dir)
    loss = {k.split(".", 1)[1]: v for k, v in settings.items() if k.startswith("contrastive_loss.")}
    family = families.of(config)
    lines = [
        "---",
        "library_name: sentence-transformers" if fmt == "sentence-transformers" else "library_name: transformers",
        f"tags: [sentence-transformers, feature-extraction, dense-retrieval, {family.name}, samtone]",
        "---",
        f"# Dual encoder ({architecture.upper()}, {family.display} towers) trained with samtone_jax",
        "",
        "## Model",
        f"- Architecture: `{architecture}` (sde: one shared tower and projection; ade: two towers and projections; "
        "ade_spl: two towers, one shared projection).",
        family.card_line(config),
        f"- Embedding: mean over non-padding tokens -> bias-free projection to {projection_dim} -> L2 normalisation "
        "(cosine similarity = dot product).",
        f"- Inputs: queries truncated to {query_length} tokens, documents to {doc_length} "
        f"({family.special_tokens} kept)"
        + (
            f"; trained at {training_lengths[0]} / {training_lengths[1]} tokens"
            if all(training_lengths) and tuple(training_lengths) != (query_length, doc_length)
            else ""
        )
        + ".",
        *(
            [
                f"- Matryoshka: trained to serve its first {', '.join(map(str, matryoshka_dims))} dimensions alone "
                f"(`SentenceTransformer(PATH, truncate_dim={matryoshka_dims[0]})`; cosine similarity re-normalises)."
            ]
            if matryoshka_dims
            else []
        ),
        "",
        "## Training",
        f"- Source: `{run_dir}`, step {step if step is not None else 'n/a'}"
        + (", the moving average of its parameters (step.ema_decay)." if weights == "ema" else "."),
    ]
    if settings.get("train.task"):
        task = settings["train.task"].strip("'\"")
        lines.append(
            f"- Data: task `{task}`, batch {settings.get('train.batch_size', '?')}, "
            f"{settings.get('train.train_steps', '?')} steps."
        )
    if loss:
        lines.append("- Loss (`contrastive_loss`): " + ", ".join(f"{k} = {v}" for k, v in sorted(loss.items())) + ".")
    results = eval_results(run_dir, weights)
    if results:
        names = list(dict.fromkeys(n for r in results for n in r["metrics"]))  # every measure, first-seen order
        lines += [
            "",
            "## Evaluation (samtone eval)",
            "",
            "| task | split | step | queries | documents | " + " | ".join(names) + " |",
            "|---|---|---:|---:|---:|" + "---:|" * len(names),
        ]
        for r in results:
            values = " | ".join(f"{r['metrics'][n]:.4f}" if n in r["metrics"] else "–" for n in names)
            lines.append(
                f"| {r['task']} | {r['split']} | {r.get('step')} | {r.get('queries')} | {r.get('corpus')} | {values} |"
            )
    if calibration is not None:
        dims = ", ".join(map(str, sorted(calibration.ranges)))
        lines += [
            "",
            "## Compressed serving",
            f"- `calibration.json` holds the int8 ranges (per dimension: min, max) of {dims} dimensions, from "
            f"{calibration.record['source'].get('documents')} documents of "
            f"`{calibration.record['source'].get('task')}`; the loss was computed at "
            f"{', '.join(calibration.record.get('trained_precisions', ['float32']))}.",
            "- int8, as sentence-transformers quantizes: `quantize_embeddings(embeddings, 'int8', "
            "ranges=np.array(json.load(open('calibration.json'))['int8_ranges']['DIM']))` (truncate to DIM and "
            "re-normalise first); binary needs no calibration (`'ubinary'`: sign bits, Hamming distance).",
            "- samtone_jax: `encoder.encode_documents(texts, precision='int8', dim=DIM)` returns the codes.",
        ]
    lines += ["", "## Usage", ""]
    if fmt == "sentence-transformers":
        lines += [
            "```python",
            "from sentence_transformers import SentenceTransformer",
            "model = SentenceTransformer(PATH)",
            'q = model.encode_query(["what is a dual encoder?"])',
            'd = model.encode_document(["A dual encoder embeds queries and documents separately."])',
            "print(model.similarity(q, d))",
            "```",
        ]
    lines += [
        "```python",
        "import samtone_jax",
        "encoder = samtone_jax.load(PATH)",
        'q = encoder.encode_queries(["what is a dual encoder?"])',
        "```",
        "",
    ]
    return "\n".join(lines)
