"""Each side of a dual encoder as an ONNX graph, for servers that run neither JAX nor a T5 encoder
(TEI and vLLM have none): token ids and attention mask in, the L2-normalised embedding out (the
tower, mean pooling over non-padding tokens, the projection, normalisation: all inside the graph).

  onnx/model.onnx, onnx/model_int8.onnx                   an SDE (one graph serves both sides)
  onnx/query.onnx, onnx/document.onnx (+ _int8 of each)   an ADE / ADE-SPL

The graphs are traced with torch.onnx from the transformers model our weights are written into
(hf_weights.hf_model, eager attention), opset 17, batch and length dynamic; the int8 graphs are
onnxruntime's dynamic quantization of the MatMul weights (QUANTIZATION, also in samtone.json):
int8 per output channel in the 7-bit range [-64, 64], activations uint8 per tensor, computed per
batch. The 7 bits are what makes them accurate on every CPU: onnxruntime's u8 x s8 kernels on AVX2
and on AVX-512 without VNNI (VPMADDUBSW) add two products in 16 bits with saturation, which full
int8 weights overflow (255 · 127 · 2 > 32767) and 7-bit ones cannot (255 · 64 · 2 = 32640); VNNI,
AMX and ARM kernels are exact either way. `saturating_matmuls` finds weights outside that range,
and `write` refuses a graph that has any. The tokenizer is the export's own (tokenizer.json beside
them; prompts in samtone.json). `check` runs every graph in onnxruntime against our JAX embeddings
on real texts: float32 must reach MIN_COSINE; int8's cosine is measured and reported, not required.

sentence-transformers' ONNX backend cannot load these here: it reads ONNX through `optimum`, whose
releases pin transformers < 5 (optimum 2.1 would downgrade this project's transformers 5.24).
"""

from __future__ import annotations

import logging

import numpy as np

from samtone_jax.core import paths
from samtone_jax.core.errors import BadValueError
from samtone_jax.models.layout import SIDES, layout

OPSET = 17
# How the int8 graphs are quantized (samtone.json's "onnx_quantization"; see the module docstring).
QUANTIZATION = {
    "method": "onnxruntime.quantization.quantize_dynamic",
    "ops": ["MatMul"],
    "weights": "int8, per output channel, symmetric, 7-bit range [-64, 64] (reduce_range)",
    "activations": "uint8, per tensor, scale and zero point computed per batch",
    "cpus": "no 16-bit saturation in onnxruntime's AVX2 / AVX-512 / VNNI / AMX / ARM kernels",
}
SAFE_WEIGHT_RANGE = (-64, 64)  # 255 * 64 * 2 = 32640 fits VPMADDUBSW's saturating int16 pair sum


def _graph_names(architecture: str) -> dict[str, str]:
    """{side: graph file stem}: 'model' for both sides of an SDE, else 'query' / 'document'."""
    shared = layout(architecture).shares_tower
    return {side: "model" if shared else side for side in SIDES}


def _module(tower, config, kernel):
    """A torch module (input_ids, attention_mask) -> [B, P] normalised embeddings."""
    import torch

    from samtone_jax.export.hf_weights import hf_model

    class Embedding(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tower = hf_model(tower, config, attention="eager")
            self.projection = torch.nn.Parameter(torch.from_numpy(np.array(kernel, np.float32)), requires_grad=False)

        def forward(self, input_ids, attention_mask):
            hidden = self.tower(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
            return torch.nn.functional.normalize(pooled @ self.projection, dim=-1)

    return Embedding().eval()


def write(folder: str, encoder, towers: dict, kernels: dict) -> dict:
    """Write onnx/ under `folder` (local staging): the float32 and int8 graph of each side; returns
    {side: {'float32': path, 'int8': path}} relative to `folder`."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = paths.as_path(folder) / "onnx"
    out.mkdir(parents=True, exist_ok=True)
    names = _graph_names(encoder.architecture)
    tree = layout(encoder.architecture)
    written = {}
    for side in SIDES:
        stem = names[side]
        if stem in written:  # an SDE's document side is its query side's graph
            continue
        tower = towers[side if not tree.shares_tower else tree.tower_sides()[0]]
        module = _module(tower, encoder.model.config, kernels[side])
        ids = torch.ones((2, 8), dtype=torch.long)
        mask = torch.ones_like(ids)
        mask[1, 5:] = 0  # traced with padding, so the graph keeps the masking path
        float_path, int8_path = out / f"{stem}.onnx", out / f"{stem}_int8.onnx"
        axes = {"input_ids": {0: "batch", 1: "length"}, "attention_mask": {0: "batch", 1: "length"}}
        torch.onnx.export(
            module,
            (ids, mask),
            str(float_path),
            input_names=["input_ids", "attention_mask"],
            output_names=["embedding"],
            dynamic_axes={**axes, "embedding": {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )
        quiet = logging.getLogger().level
        logging.getLogger().setLevel(logging.WARNING)  # onnxruntime logs a line a tensor to the root logger
        try:
            quantize_dynamic(
                str(float_path),
                str(int8_path),
                weight_type=QuantType.QInt8,
                per_channel=True,
                reduce_range=True,  # 7-bit weights: exact on every CPU's integer kernels (module docstring)
                op_types_to_quantize=QUANTIZATION["ops"],
            )
        finally:
            logging.getLogger().setLevel(quiet)
        overflowing = saturating_matmuls(str(int8_path))
        if overflowing:
            raise BadValueError(
                f"{int8_path.name}: {len(overflowing)} MatMul weights outside {SAFE_WEIGHT_RANGE} (first: "
                f"{overflowing[0]}), which saturate on AVX2 CPUs; the export was not written"
            )
        written[stem] = {"float32": f"onnx/{float_path.name}", "int8": f"onnx/{int8_path.name}"}
    return {side: written[names[side]] for side in SIDES}


def saturating_matmuls(path: str) -> list[str]:
    """The MatMulInteger nodes of the int8 graph at `path` whose int8 weights leave SAFE_WEIGHT_RANGE
    (those onnxruntime's AVX2 / AVX-512 u8 x s8 kernels can compute wrongly); uint8 weights run on
    kernels without the 16-bit step."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(path).graph
    weights = {t.name: t for t in graph.initializer}
    low, high = SAFE_WEIGHT_RANGE
    found = []
    for node in graph.node:
        if node.op_type == "MatMulInteger" and node.input[1] in weights:
            w = numpy_helper.to_array(weights[node.input[1]])
            if w.dtype == np.int8 and (w.min() < low or w.max() > high):
                found.append(node.name)
    return found


def check(folder: str, encoder, tokenizer, graphs: dict, texts: list[str], min_cosine: float) -> dict:
    """{'min_cosine': float32's, 'int8_min_cosine', 'int8_mean_cosine'}: every graph in onnxruntime
    on `texts` (each side with its prompt and length, tokenised by the export's tokenizer) against
    the JAX encoder; float32 below `min_cosine` raises."""
    import onnxruntime

    cosines = {"float32": [], "int8": []}
    for side in SIDES:
        prompt, length = (
            (encoder.query_prompt, encoder.query_length)
            if side == "query"
            else (encoder.document_prompt, encoder.doc_length)
        )
        ours = encoder.encode_queries(texts) if side == "query" else encoder.encode_documents(texts)
        batch = tokenizer(
            [prompt + t for t in texts], max_length=length, truncation=True, padding=True, return_tensors="np"
        )
        feed = {
            "input_ids": batch["input_ids"].astype(np.int64),
            "attention_mask": batch["attention_mask"].astype(np.int64),
        }
        for precision in ("float32", "int8"):
            session = onnxruntime.InferenceSession(
                str(paths.as_path(folder) / graphs[side][precision]), providers=["CPUExecutionProvider"]
            )
            theirs = session.run(["embedding"], feed)[0]
            cosines[precision].append(np.sum(ours * theirs, axis=1))
    float32, int8 = np.concatenate(cosines["float32"]), np.concatenate(cosines["int8"])
    if float32.min() < min_cosine:
        raise BadValueError(
            f"the ONNX graphs' embeddings differ from ours (min cosine {float32.min():.6f} < {min_cosine}) on the "
            "probe texts; the export was not written"
        )
    return {
        "min_cosine": float(float32.min()),
        "int8_min_cosine": float(int8.min()),
        "int8_mean_cosine": float(int8.mean()),
    }
