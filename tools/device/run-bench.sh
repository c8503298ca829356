#!/usr/bin/env bash
# On the GPU machine (after tools/device/pack.sh here, with carry [".device"]):
# kiln-bench --quick on the GPU (and on that machine's CPU), results to $OUT.
set -u
source .device/unpack.sh
python3 -m pip install -q --break-system-packages --no-deps --force-reinstall .device/wheel/kiln-*.whl 2>&1 | grep -v WARNING
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
OUT=${OUT:-/tmp/out}
python3 -m kiln_bench --quick --device cuda --results "$OUT/gpu" 2>/dev/null
python3 -m kiln_bench --quick --device cpu --results "$OUT/cpu" 2>/dev/null
