"""DualEncoderFeatureConverter: tokenised task examples -> fixed-shape dual-encoder model features.

Task features (from the tasks in samtone_jax/tasks): `query`, `document` (int32 token ids, any
length, no EOS yet), `query_id`, `doc_id` (int64), optionally `negatives` (ragged [K, None]) and
`negative_ids` (int64 [K]).

Model features: `query_tokens` [Lq], `doc_tokens` [Ld], `negative_tokens` [K, Ld] — each
truncated to what fits, then EOS-terminated (T5's `append_eos_after_trim`; a BERT-family
vocabulary: [CLS] first and [SEP] last, as its tokenizer's post-processor does), zero-padded,
never packed — the ids, and `query_truncated` / `doc_truncated` (int32 0/1) so truncation is counted.

Teacher features pass through as they are: `teacher_scores` (float32 [1 + K]) and `guide_ids`
(int64 [G]), when the converter is built with them (data/input_spec.InputSpec).
"""

from __future__ import annotations

import seqio

from samtone_jax.core.errors import BadValueError
from samtone_jax.core.tensorflow_setup import tf

EOS_ID = 1
Spec = seqio.FeatureConverter.FeatureSpec


def trim_append_eos_pad(tokens: tf.Tensor, length: int, start_id: int | None = None, end_id: int = EOS_ID):
    """[n] ids -> [length]: [start_id] (when given), the ids that fit, end_id, zeros."""
    start = [] if start_id is None else [start_id]
    tokens = tf.concat([start, tokens[: length - 1 - len(start)], [end_id]], axis=0)
    return tf.pad(tokens, [[0, length - tf.shape(tokens)[0]]])


class DualEncoderFeatureConverter(seqio.FeatureConverter):
    """See the module docstring. `num_negatives` > 0 expects and emits the negative features."""

    TASK_FEATURES = {}
    MODEL_FEATURES = {}
    PACKING_FEATURE_DTYPES = {}

    def __init__(
        self,
        num_negatives: int = 0,
        teacher_scores: bool = False,
        guide_ids: int = 0,
        start_id: int | None = None,
        end_id: int = EOS_ID,
        **kwargs,
    ):
        if num_negatives < 0 or guide_ids < 0:
            raise BadValueError(f"num_negatives ({num_negatives}) and guide_ids ({guide_ids}) must be >= 0")
        if teacher_scores and not num_negatives:
            raise BadValueError(
                "teacher scores are the scores of the hard negatives too: they need inputs.num_negatives > 0"
            )
        super().__init__(pack=False, apply_length_check=False, **kwargs)
        self.num_negatives = num_negatives
        self.start_id, self.end_id = start_id, end_id  # data/vocab.special_ids of the vocabulary
        self.passthrough = {}
        if teacher_scores:
            self.passthrough["teacher_scores"] = (Spec(dtype=tf.float32), 1 + num_negatives)
        if guide_ids:
            self.passthrough["guide_ids"] = (Spec(dtype=tf.int64), guide_ids)
        self.TASK_FEATURES = {
            "query": Spec(dtype=tf.int32),
            "document": Spec(dtype=tf.int32),
            "query_id": Spec(dtype=tf.int64, rank=0),
            "doc_id": Spec(dtype=tf.int64, rank=0),
        }
        self.MODEL_FEATURES = {
            "query_tokens": Spec(dtype=tf.int32),
            "doc_tokens": Spec(dtype=tf.int32),
            "query_id": Spec(dtype=tf.int64, rank=0),
            "doc_id": Spec(dtype=tf.int64, rank=0),
            "query_truncated": Spec(dtype=tf.int32, rank=0),
            "doc_truncated": Spec(dtype=tf.int32, rank=0),
        }
        if num_negatives:
            self.TASK_FEATURES["negatives"] = Spec(dtype=tf.int32, rank=2, sequence_dim=1)
            self.TASK_FEATURES["negative_ids"] = Spec(dtype=tf.int64)
            self.MODEL_FEATURES["negative_tokens"] = Spec(dtype=tf.int32, rank=2, sequence_dim=1)
            self.MODEL_FEATURES["negative_ids"] = Spec(dtype=tf.int64)
        for name, (spec, _) in self.passthrough.items():
            self.TASK_FEATURES[name] = self.MODEL_FEATURES[name] = spec

    def task_feature_lengths(self, query_length: int, doc_length: int) -> dict[str, int]:
        """The task_feature_lengths mapping this converter expects (ids have no length)."""
        lengths = {"query": query_length, "document": doc_length, "query_id": 0, "doc_id": 0}
        if self.num_negatives:
            lengths.update(negatives=doc_length, negative_ids=self.num_negatives)
        lengths.update({name: length for name, (_, length) in self.passthrough.items()})
        return lengths

    def _convert_features(self, ds: tf.data.Dataset, task_feature_lengths) -> tf.data.Dataset:
        lq, ld, k = task_feature_lengths["query"], task_feature_lengths["document"], self.num_negatives
        special = 1 + (self.start_id is not None)  # ids each input spends on special tokens

        def wrap(tokens, length):
            return trim_append_eos_pad(tokens, length, self.start_id, self.end_id)

        def convert(ex):
            out = {
                "query_tokens": wrap(ex["query"], lq),
                "doc_tokens": wrap(ex["document"], ld),
                "query_id": ex["query_id"],
                "doc_id": ex["doc_id"],
                "query_truncated": tf.cast(tf.size(ex["query"]) > lq - special, tf.int32),
                "doc_truncated": tf.cast(tf.size(ex["document"]) > ld - special, tf.int32),
            }
            if k:
                negatives = ex["negatives"]
                if not isinstance(negatives, tf.RaggedTensor):
                    negatives = tf.RaggedTensor.from_tensor(negatives, padding=0)
                wrapped = tf.map_fn(
                    lambda row: wrap(row, ld), negatives[:k], fn_output_signature=tf.TensorSpec([ld], tf.int32)
                )
                out["negative_tokens"] = tf.pad(wrapped, [[0, k - tf.shape(wrapped)[0]], [0, 0]])
                out["negative_ids"] = ex["negative_ids"][:k]
            out.update({name: ex[name] for name in self.passthrough})
            return out

        return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

    def get_model_feature_lengths(self, task_feature_lengths):
        lengths = {
            "query_tokens": task_feature_lengths["query"],
            "doc_tokens": task_feature_lengths["document"],
            "query_id": 0,
            "doc_id": 0,
            "query_truncated": 0,
            "doc_truncated": 0,
        }
        if self.num_negatives:
            lengths.update(negative_tokens=task_feature_lengths["document"], negative_ids=self.num_negatives)
        lengths.update({name: length for name, (_, length) in self.passthrough.items()})
        return lengths
