#!/usr/bin/env bash
# Packs what the GPU machine lacks into .device/ (git-ignored; name it in the
# device tool's `carry`): Debian's LLVM/MLIR runtime libraries (libmlir-22,
# libllvm22, libz3-4; about 53 MB), the kiln wheel built here, and pytest's
# wheels (that machine reaches no package index).
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .device/debs .device/wheel
mkdir -p .device/debs .device/wheel
(cd .device/debs && apt-get download libmlir-22 libllvm22 libz3-4 2>/dev/null)
python3 -m pip wheel -q --no-build-isolation --no-deps ./python -w .device/wheel
python3 -m pip download -q pytest -d .device/wheel
cp tools/device/run-python-tests.sh tools/device/run-bench.sh .device/
du -sh .device
