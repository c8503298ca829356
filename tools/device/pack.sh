#!/usr/bin/env bash
# Packs what the GPU machine lacks into .device/ (git-ignored; name it in the
# device tool's `carry`): Debian's LLVM/MLIR runtime libraries (libmlir-22,
# libllvm22, libz3-4; about 53 MB), libkiln and the C test and tool binaries
# built here (bin/), lit with the LLVM tools the lit tests run (lit/: 2 MB),
# the kiln wheel, and pytest's wheels (that machine reaches no package
# index). `make gpu-pack` runs it after the build.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .device/debs .device/wheel .device/bin .device/lit
mkdir -p .device/debs .device/wheel .device/bin .device/lit/bin
cp -P build/libkiln.so* .device/bin/
for t in cuda api_errors ops_numeric output_pool autotune_api; do
  cp build/test/unit/$t .device/bin/
done
cp build/tools/kiln-opt build/tools/kiln-run .device/bin/
# lit (Python) and the LLVM tools the lit tests' RUN lines use, from
# llvm-22-tools here.
cp -r /usr/lib/llvm-22/utils/lit .device/lit/lit
for t in FileCheck not count split-file; do cp /usr/lib/llvm-22/bin/$t .device/lit/bin/; done
# Without debug info (the build id, kiln's cache key, stays): the tree the
# device tool carries is limited to 64 MiB, and the debs take 53 MB of it.
find .device/bin -type f -exec strip --strip-debug {} +
(cd .device/debs && apt-get download libmlir-22 libllvm22 libz3-4 2>/dev/null)
python3 -m pip wheel -q --no-build-isolation --no-deps ./python -w .device/wheel
python3 -m pip download -q pytest -d .device/wheel
cp tools/device/run-python-tests.sh tools/device/run-bench.sh \
   tools/device/run-gpu-check.sh .device/
du -sh .device
