#!/usr/bin/env bash
# The accelerator part of the speed measurements (search, compressed search, the training step's MFU),
# as one script for a lent GPU / TPU machine whose own python3 has jax (no project venv there: the
# package is read from this checkout by PYTHONPATH).
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
# The training step (train_step_bench.py's random T5.1.1-shaped SDE; the package's own dependencies,
# requirements.lock's jax, flax, optax, gin, TensorFlow and seqio, but not torch) at an accelerator's
# batch, float32 and with bfloat16 activations (T5Config.dtype, ACTIVATION_DTYPE in the model gin files:
# float32 master weights), MFU against the chip's peak in training/model_flops.py.
step="benchmarks/train_step_bench.py --skip theirs --batch 256 --length 128 --steps 10"
$py $step 2>&1 | tee "$out/train_step_f32.txt"
$py $step --gin "T5Config.dtype = 'bfloat16'" 2>&1 | tee "$out/train_step_bf16.txt"
