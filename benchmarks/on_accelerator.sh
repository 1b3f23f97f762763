#!/usr/bin/env bash
# The accelerator part of issue 33's measurements, as one script for a lent GPU / TPU machine whose
# own python3 has jax (no project venv there: the package is read from this checkout by PYTHONPATH).
# Writes each step's output to $OUT (or ./out) and the device it ran on.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}; mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 SAMTONE_NATIVE=0 TF_CPP_MIN_LOG_LEVEL=3
py=${PYTHON:-python3}
(nvidia-smi -L 2>/dev/null; $py -c 'import jax; print(jax.__version__, jax.devices())') 2>&1 | tee "$out/device.txt"
$py benchmarks/search_precision_check.py --corpus 1000000 --queries 1000 2>&1 | tee "$out/precision.txt"
$py benchmarks/compressed_search_bench.py --corpus 1000000 --queries 10000 --chunk_size 65536 2>&1 | tee "$out/compressed_1m_q10000.txt"
$py benchmarks/compressed_search_bench.py --corpus 1000000 --queries 1000 2>&1 | tee "$out/compressed_1m_q1000.txt"
