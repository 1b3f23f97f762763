"""Small data folders in the official formats (MultiReQA + MRQA, MS MARCO, WordNet 3.0), written
by the tests and the shared fixtures in conftest.py; the readers must take them as they take the
real files."""

from __future__ import annotations

import gzip
import json

# ----------------------------------------------------------------------------------------------
# MultiReQA: MRQA contexts + sentence boundaries.
# ----------------------------------------------------------------------------------------------
CONTEXT = "Paris is the capital of France. It lies on the Seine. The Louvre is there."


#          0         1         2         3         4         5         6         7
SENTENCES = [(0, 31), (32, 53), (54, 74)]


def write_multireqa(root, dataset="SQuAD", split="dev"):
    qas = [
        # answer "Paris" (0..4 inclusive) -> sentence 0
        {"qid": "q1", "question": "What is the capital of France?", "detected_answers": [{"char_spans": [[0, 4]]}]},
        # answer "Seine" in sentence 1, and a second span "Louvre" in sentence 2 -> both gold
        {
            "qid": "q2",
            "question": "What river and museum?",
            "detected_answers": [{"char_spans": [[47, 51]]}, {"char_spans": [[58, 63]]}],
        },
        # answer crossing sentences 0 and 1 ("France. It") -> both, counted
        {"qid": "q3", "question": "Crossing?", "detected_answers": [{"char_spans": [[24, 34]]}]},
    ]
    mrqa_path = root / "mrqa" / split / f"{dataset}.jsonl.gz"
    mrqa_path.parent.mkdir(parents=True)
    with gzip.open(mrqa_path, "wt") as f:
        f.write(json.dumps({"header": {"dataset": dataset, "split": split}}) + "\n")
        f.write(json.dumps({"context": CONTEXT, "qas": qas}) + "\n")
        f.write(json.dumps({"context": "Unannotated context.", "qas": [{"qid": "q9", "question": "x?"}]}) + "\n")
    cand_path = root / "multireqa" / "data" / split / dataset / "candidates.json.gz"
    cand_path.parent.mkdir(parents=True)
    key = f"{dataset}_q1/q2/q3"
    with gzip.open(cand_path, "wt") as f:
        for k, (s, e) in enumerate(SENTENCES):
            f.write(json.dumps({"candidate_id": f"{key}/_{k}", "response_start": s, "response_end": e}) + "\n")
        f.write(json.dumps({"candidate_id": "SQuAD_nope/_0", "response_start": 0, "response_end": 3}) + "\n")
    return str(mrqa_path), str(cand_path)


# ----------------------------------------------------------------------------------------------
# MS MARCO and BEIR.
# ----------------------------------------------------------------------------------------------
def write_msmarco(root, negatives="tsv"):
    d = root / "msmarco_passage"
    d.mkdir(parents=True)
    (d / "collection.tsv").write_text("0\tThe sky is blue.\n1\tGrass is green.\n2\tSnow is white.\n3\t \n")
    (d / "queries.train.tsv").write_text("10\twhat colour is the sky\n11\twhat colour is grass\n12\tmissing doc\n")
    (d / "qrels.train.tsv").write_text("10\t0\t0\t1\n11\t0\t1\t1\n12\t0\t99\t1\n")
    (d / "queries.dev.tsv").write_text("20\twhat colour is snow\n")
    (d / "qrels.dev.tsv").write_text("20 Q0 2 1\n")  # TREC format
    if negatives == "tsv":
        (d / "negatives.train.tsv").write_text("10\t1,2\n11\t0,2,77\n")
    else:
        (d / "negatives.train.jsonl").write_text(
            '{"qid": "10", "negatives": ["1", "2"]}\n{"qid": "11", "negatives": ["0", "2"]}\n'
        )
    return d


# ----------------------------------------------------------------------------------------------
# WordNet database files.
# ----------------------------------------------------------------------------------------------
LICENCE = "  1 This software and database is being provided to you, the LICENSEE, by  \n"


NOUN = (
    "00001740 03 n 01 entity 0 003 ~ 00001930 n 0000 ~ 00002137 n 0000 ~ 04431553 n 0000 | that which is "
    "perceived or known or inferred to have its own distinct existence (living or nonliving)  \n"
    "00149262 04 n 03 untying 0 undoing 0 unfastening 0 001 @ 00148653 n 0000 | loosening the ties that fasten "
    'something; "the tying of bow ties is an art; the untying is easy"  \n'
)


ADJ = '00001740 00 a 01 able 0 001 = 05200169 n 0000 | having the means; "able to swim"; "she was able to program"  \n'
ADJ += '00014358 00 s 02 abounding 0 galore(ip) 0 001 & 00013887 a 0000 | existing in abundance; "whiskey galore"  \n'


VERB = (
    '00001740 29 v 01 breathe 0 000 01 + 02 00 | draw air into, and expel out of, the lungs; "I can breathe better"  \n'
)


ADV = "00001740 02 r 01 a_cappella 0 000 | without musical accompaniment  \n"


def write_wordnet(root):
    root.mkdir(parents=True, exist_ok=True)
    for name, body in (("noun", NOUN), ("adj", ADJ), ("verb", VERB), ("adv", ADV)):
        (root / f"data.{name}").write_text(LICENCE + body)
    return root


# Forty more WordNet senses: enough for batches of 8 in the pipeline and training tests.
MORE_SENSES = "".join(
    f'{10000000 + i:08d} 03 n 01 thing{i} 0 000 | definition number {i} of a thing; "example {i} of thing{i}"  \n'
    for i in range(40)
)
