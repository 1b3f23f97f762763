"""WordNet 3.0 read directly from its database files (`data.noun`, `data.verb`, `data.adj`, `data.adv`).

Debian's `wordnet-base` installs them in /usr/share/wordnet (the demo's default data: real,
permissive, from a package registry). Data line format (wndb(5WN)):

  offset lex_filenum ss_type w_cnt(hex) word lex_id [word lex_id ...] p_cnt [ptr ...] [frames] | gloss

The gloss is 'definition; definition; "example"; "example"'. A retrieval pair is
query = "<lemma>: <example sentence>", document = the sense's definition; a sense with several
examples gives several queries for the same document (duplicates that ids mask).
"""

from __future__ import annotations

import re

from samtone_jax.core import paths
from samtone_jax.core.errors import BadValueError, MissingFileError
from samtone_jax.data.collection import RetrievalCollection
from samtone_jax.data.records import ReadStats, UniqueIds, read_lines

FILES = {"noun": "n", "verb": "v", "adj": "a", "adv": "r"}
DEFAULT_DIR = "/usr/share/wordnet"
_ADJ_MARKER = re.compile(r"\((?:a|p|ip)\)$")
_QUOTED = re.compile(r'"([^"]*)"')
_EXAMPLE_START = re.compile(r';\s*"')


def parse_data_line(line: str, pos: str) -> dict | None:
    """One synset as {id, pos, lemmas, definition, examples}; None for the licence header."""
    if line.startswith("  "):  # licence lines start with two spaces
        return None
    head, sep, gloss = line.partition(" | ")
    if not sep:
        head, gloss = line.rstrip(), ""
    fields = head.split()
    offset, ss_type, w_cnt = fields[0], fields[2], int(fields[3], 16)
    if not offset.isdigit() or len(offset) != 8:
        raise BadValueError(f"synset offset {offset!r} is not 8 digits")
    words = fields[4 : 4 + 2 * w_cnt : 2]
    if len(words) != w_cnt:
        raise BadValueError(f"expected {w_cnt} words, found {len(words)}")
    lemmas = [_ADJ_MARKER.sub("", w).replace("_", " ") for w in words]
    p_cnt = int(fields[4 + 2 * w_cnt])
    if len(fields) < 5 + 2 * w_cnt + 4 * p_cnt:
        raise BadValueError(f"expected {p_cnt} pointers")
    gloss = gloss.strip()
    # Examples are the double-quoted strings (they may contain "; "); the definition is what
    # precedes the first quoted example that follows a "; ".
    definition = _EXAMPLE_START.split(gloss, 1)[0].strip().rstrip(";").strip()
    examples = [e.strip() for e in _QUOTED.findall(gloss)]
    return {
        "id": f"{FILES[pos]}{offset}",
        "pos": pos,
        "ss_type": ss_type,
        "lemmas": lemmas,
        "definition": definition,
        "examples": [e for e in examples if e],
    }


def read_synsets(directory: str = DEFAULT_DIR, stats: ReadStats | None = None, skip_bad_records: bool = False):
    """Every synset of the four data files, in file order (with the `path` and `line` it is on)."""
    stats = ReadStats() if stats is None else stats
    for pos in FILES:
        path = paths.join(directory, f"data.{pos}")
        if not paths.as_path(path).exists():
            raise MissingFileError(
                f"{path} not found: install Debian's wordnet-base (apt-get install wordnet-base) "
                "or set WORDNET_DIR to a folder with data.noun, data.verb, data.adj, data.adv"
            )
        rows = read_lines(
            path, lambda line, pos=pos: parse_data_line(line, pos), stats, skip_bad_records, numbered=True
        )
        for line, synset in rows:
            if synset is not None:
                yield dict(synset, path=path, line=line)


def query_text(lemmas: list[str], example: str) -> str:
    """'<lemma>: <example>', with the lemma that occurs in the example (else the first)."""
    lowered = example.lower()
    lemma = next((lem for lem in lemmas if lem.lower() in lowered), lemmas[0])
    return f"{lemma}: {example}"


def load_collection(directory: str = DEFAULT_DIR, skip_bad_records: bool = False) -> RetrievalCollection:
    """Queries = example sentences (with lemma), corpus = every sense's definition, one qrel each."""
    stats = ReadStats()
    queries, qrels, corpus = {}, {}, UniqueIds(directory, "document", stats)
    for synset in read_synsets(directory, stats, skip_bad_records):
        corpus.path = synset["path"]
        if not corpus.add(synset["line"], synset["id"], synset["definition"]):
            continue
        for k, example in enumerate(synset["examples"]):
            qid = f"{synset['id']}#{k}"
            queries[qid] = query_text(synset["lemmas"], example)
            qrels[qid] = {synset["id"]: 1}
    return RetrievalCollection("wordnet_definitions", queries, corpus.table, qrels, stats=stats).drop_empty()
