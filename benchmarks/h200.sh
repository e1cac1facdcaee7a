#!/usr/bin/env bash
# The GPU checks of the performance work, as one script for a machine with one H200 (under 10 minutes):
# BASE and BIG training steps on ~25,000-target-token batches in bfloat16 (MFU against the
# H200's 790 TFLOP/s dense bf16), then greedy and beam-4 decoding of BASE at batch 128.
# Needs the [gpu] extra: pip install -e '.[gpu]'. Prints JSON objects; writes them to $OUT too.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-.}
python -c "import jax; d = jax.devices()[0]; assert d.platform == 'gpu', d; print(d.device_kind)"
python benchmarks/train_throughput.py --shapes base_25k big_25k --dtype bfloat16 \
  --peak_tflops 790 --steps 10 | tee "$out/h200_train.json"
python benchmarks/decode_throughput.py --shapes base --batch 128 --dtype bfloat16 \
  --skip_naive --repeats 5 | tee "$out/h200_decode.json"
