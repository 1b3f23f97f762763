"""What a tower family is: everything the rest of the package asks of a family, in one record.

A family (T5.1.1: models/t5/, BERT: models/bert/, MPNet: models/mpnet/) is one folder holding its config and encoder
(`tower.py`), its Hugging Face names in both directions (`hf_names.py`: the importer reads a tensor
under the name the exporter writes it), and a `family.py` that fills this record; the registry
(models/families.py) lists the families. Code outside a family's folder asks the record (through
`families.of(config)`) and never tests which family it holds, so a new family is its folder and
one registry line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from samtone_jax.core.errors import CheckpointMismatchError

Path = tuple[str, ...]

# The kernels of a layer that LoRA may adapt (models/lora.py): name (BERT-style towers store it as
# <name>_kernel) -> (its group, 'attention' or 'mlp'; how many leading dimensions are its input). The
# names most towers use; a family with others lists its own (TowerFamily.lora_kernels).
LORA_KERNELS = {
    "query": ("attention", 1),
    "key": ("attention", 1),
    "value": ("attention", 1),
    "out": ("attention", 2),
    "wi": ("mlp", 1),
    "wo": ("mlp", 1),
}


@dataclasses.dataclass(frozen=True)
class TowerFamily:
    name: str  # 't5', 'bert': the model card's tag
    display: str  # 'T5.1.1', 'BERT': what the model card and messages call it
    config_class: type  # its frozen config dataclass; the gin configurable is its class name
    encoder_class: type  # the Flax module of one tower
    # The tokenizer: 'sentencepiece' (a SentencePiece model) or 'wordpiece' (a tokenizer.json), and
    # the vocabulary's file name in a Hugging Face / export folder and in our runs.
    tokenizer: str
    export_vocabulary: str
    run_vocabulary: str
    # --format values `samtone import-checkpoint` reads for this family.
    import_formats: tuple[str, ...]
    # Hugging Face: the config.json model_type values it imports, the transformers class it exports as.
    hf_model_types: tuple[str, ...]
    hf_architecture: str
    # (our tower path) -> (candidate HF names, stored transposed?): the import's names, and the
    # export's (the first candidate).
    hf_locate: Callable[[Path], tuple[Sequence[str], bool]]
    hf_encoder_variable: Callable[[str], bool]  # an HF name that belongs to the encoder
    hf_config: Callable[[object], object]  # our config -> transformers' config of the same shape
    # config.json (dict, its path for messages) against our config: raises CheckpointMismatchError.
    check_hf_config: Callable[[dict, str, object], None]
    # config.json -> gin bindings of the tower's shape (a family that can import without a gin file),
    # or None when a models/*.gin must name the size.
    hf_bindings: Callable[[dict, str], list[str]] | None = None
    hf_zero_prefixes: tuple[str, ...] = ()  # HF weights we do not train, exported as zeros (BERT's pooler)
    shape_hints: dict[str, str] = dataclasses.field(default_factory=dict)  # tower leaf -> the gin settings
    mlp_hint: str = ""  # the gin setting of the MLP's form (named when a checkpoint's MLP differs)
    card_line: Callable[[object], str] = lambda config: ""  # the model card's "Tower:" line
    special_tokens: str = ""  # what tokenisation adds to every text ('EOS', '[CLS] and [SEP]')
    # The id that pads in the Hugging Face vocabulary. Every tower pads with 0, so where it is not 0
    # (MPNet, RoBERTa: <s> 0, <pad> 1) the tokenizer (data/wordpiece_tokens.py) swaps the two ids and
    # the importer and exporter swap the two embedding rows (`swap_pad_row`).
    hf_pad_id: int = 0
    hf_tokenizer: str = "BertTokenizerFast"  # the transformers class an export's tokenizer.json is loaded as
    lora_kernels: dict[str, tuple[str, int]] = dataclasses.field(default_factory=lambda: dict(LORA_KERNELS))

    @property
    def gin_name(self) -> str:
        return self.config_class.__name__

    def swap_pad_row(self, table):
        """A vocabulary-indexed table (the token embedder) with rows 0 and hf_pad_id swapped: from
        Hugging Face's order to ours and back (the swap is its own inverse)."""
        if not self.hf_pad_id:
            return table
        order = list(range(table.shape[0]))
        order[0], order[self.hf_pad_id] = self.hf_pad_id, 0
        return table[order]


def check_same_shape(theirs, ours, fields: Sequence[str], where: str) -> None:
    """Fail when the config read from a config.json (`theirs`, at `where`) and the gin one (`ours`, the
    same dataclass) disagree on a shape field or on layer_norm_epsilon, naming the gin setting."""
    name = type(ours).__name__
    for field in fields:
        if getattr(theirs, field) != getattr(ours, field):
            raise CheckpointMismatchError(
                f"{where} gives {name}.{field} = {getattr(theirs, field)!r} but the gin config has "
                f"{getattr(ours, field)!r}: drop the gin file's {name}.* (an import reads them from config.json)"
            )
    if not np.isclose(theirs.layer_norm_epsilon, ours.layer_norm_epsilon):
        raise CheckpointMismatchError(
            f"{where}: layer_norm_eps {theirs.layer_norm_epsilon} but {name}.layer_norm_epsilon = "
            f"{ours.layer_norm_epsilon}"
        )


def gin_bindings(config, fields: Sequence[str]) -> list[str]:
    """`<ConfigClass>.<field> = <value>` gin bindings of `config`'s `fields`."""
    return [f"{type(config).__name__}.{field} = {getattr(config, field)!r}" for field in fields]
