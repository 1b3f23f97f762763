"""What a tower family is: everything the rest of the package asks of a family, in one record.

A family (T5.1.1: models/t5/, BERT: models/bert/) is one folder holding its config and encoder
(`tower.py`), its Hugging Face names in both directions (`hf_names.py`: the importer reads a tensor
under the name the exporter writes it), and a `family.py` that fills this record; the registry
(models/families.py) lists the families. Code outside a family's folder asks the record (through
`families.of(config)`) and never tests which family it holds, so a new family is its folder and
one registry line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

Path = tuple[str, ...]


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

    @property
    def gin_name(self) -> str:
        return self.config_class.__name__
