#!/usr/bin/env bash
# Installs what kiln needs to build and test, if missing. Idempotent and
# quick when everything is there. Debian bookworm packages; LLVM/MLIR 22.
set -euo pipefail

PKGS=(libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools libomp-22-dev
      libffi-dev libdlpack-dev cmake ninja-build)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
# Debian's cmake package may be shadowed by a newer one on PATH; either works.
if command -v cmake >/dev/null 2>&1; then
  missing=("${missing[@]/cmake}")
fi
if command -v ninja >/dev/null 2>&1; then
  missing=("${missing[@]/ninja-build}")
fi
todo=()
for p in "${missing[@]}"; do [ -n "$p" ] && todo+=("$p"); done

if [ ${#todo[@]} -gt 0 ]; then
  echo "setup-deps: installing ${todo[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
      echo "setup-deps: need root to install: ${todo[*]}" >&2; exit 1
    fi
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${todo[@]}" >/dev/null
fi

if ! apt-cache policy libmlir-22-dev 2>/dev/null | grep -q "Installed: 1:22"; then
  if [ ! -e /usr/lib/llvm-22/lib/libMLIR.so ]; then
    echo "setup-deps: LLVM/MLIR 22 is not available from apt here" >&2
    exit 1
  fi
fi

# Python side: PyTorch pinned to the CPU build that lies on this machine's
# disk (2.13.0), the test runner, and the build backend of python/.
PY=${PYTHON:-python3}
pymissing=()
$PY -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" \
  2>/dev/null || pymissing+=("torch==2.13.0")
$PY -c "import pytest" 2>/dev/null || pymissing+=("pytest")
$PY -c "import numpy" 2>/dev/null || pymissing+=("numpy")
$PY -c "import scikit_build_core" 2>/dev/null || pymissing+=("scikit-build-core")
$PY -c "import matplotlib" 2>/dev/null || pymissing+=("matplotlib")  # kiln-bench charts
if [ ${#pymissing[@]} -gt 0 ]; then
  echo "setup-deps: pip installing ${pymissing[*]}"
  $PY -m pip install -q "${pymissing[@]}"
fi
