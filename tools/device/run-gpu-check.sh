#!/usr/bin/env bash
# `make gpu-check` on the GPU machine (after `make gpu-pack` here, with
# carry [".device"]): unpacks Debian's LLVM/MLIR runtime, then runs the
# CUDA-target C tests on the GPU, the C API checks, the CUDA target's lit
# tests (test/lit/pipeline/cuda*, with this device's kiln-opt), and the
# pytest suite on the machine's PyTorch. Prints one summary line per suite;
# exits non-zero on a failure.
set -u
# Run from the repository root (make gpu-check does).
source .device/unpack.sh
export LD_LIBRARY_PATH=$PWD/.device/bin:$LD_LIBRARY_PATH
export KILN_CACHE_DIR=/tmp/kiln-gpu-check-cache
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
fail=0
# The whole check takes 8-10 minutes on an H100, near the device tool's
# 10-minute limit per command: KILN_GPU_CHECK_C=0 skips the C suites and
# KILN_GPU_CHECK_PYTEST=0 the pytest suite, to run them in two calls.
if [ "${KILN_GPU_CHECK_C:-1}" = 1 ]; then
  for t in cuda api_errors output_pool autotune_api; do
    out=$(.device/bin/$t 2>&1); rc=$?
    echo "$out" | tail -12
    echo "[gpu-check] $t: rc=$rc"
    [ $rc -eq 0 ] || fail=1
  done
  # The sm_80 tensor-core kernel (mma.sync) where sm_90 takes wgmma.
  if nvidia-smi --query-gpu=compute_cap --format=csv,noheader | grep -q '^9\.0'; then
    out=$(KILN_GPU_WGMMA=0 .device/bin/cuda 2>&1); rc=$?
    echo "$out" | tail -2
    echo "[gpu-check] cuda (KILN_GPU_WGMMA=0): rc=$rc"
    [ $rc -eq 0 ] || fail=1
  fi
  .device/bin/ops_numeric matmul 2>&1 | tail -1
  printf 'graph @ew(%%x: f32[1000], %%y: f32[1000]) {\n  %%s = aten.add(%%x, %%y)\n  return %%s\n}\n' > /tmp/ew.kiln
  .device/bin/kiln-opt --target=cuda --emit=llvm /tmp/ew.kiln | grep -o '\.target sm_[0-9a-z]*' | head -1
  # The CUDA target's lit tests; kiln-opt targets this device's
  # architecture (their CHECK lines are sm_90's: on other GPUs some differ).
  if [ -d .device/lit ]; then
    mkdir -p /tmp/kiln-lit/tools
    cp .device/bin/kiln-opt .device/bin/kiln-run /tmp/kiln-lit/tools/
    out=$(PYTHONPATH=$PWD/.device/lit/lit python3 -c "from lit.main import main; main()" \
          -q --param build_dir=/tmp/kiln-lit \
          --param llvm_bin=$PWD/.device/lit/bin --filter 'pipeline/cuda' test/lit 2>&1); rc=$?
    echo "$out" | tail -6
    echo "[gpu-check] lit (cuda): rc=$rc"
    [ $rc -eq 0 ] || fail=1
  fi
fi
if [ "${KILN_GPU_CHECK_PYTEST:-1}" = 1 ] && [ -d .device/wheel ]; then
  bash .device/run-python-tests.sh 2>&1 | tail -4
  rc=${PIPESTATUS[0]}
  echo "[gpu-check] pytest: rc=$rc"
  [ $rc -eq 0 ] || fail=1
fi
echo "[gpu-check] $([ $fail = 0 ] && echo PASSED || echo FAILED)"
exit $fail
