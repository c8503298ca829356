#!/usr/bin/env bash
# Packs what the GPU machine lacks into .device/ (git-ignored; name it in the
# device tool's `carry`): Debian's LLVM/MLIR runtime libraries (libmlir-22,
# libllvm22, libz3-4: their shared libraries in one xz archive, 51 MB),
# libkiln and the C test and tool binaries built here (bin/), lit with the
# LLVM tools the lit tests run (lit/: 1.7 MB), the kiln wheel, and pytest's
# wheels (that machine reaches no package index). `make gpu-pack` runs it
# after the build. The tree the device tool carries, tracked files
# included, is limited to 64 MiB: at the twenty-fifth session 8.8 MiB
# tracked plus 54.7 packed. A run that needs neither lit nor pytest can
# carry less (remove .device/lit and the pytest wheels first).
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .device/debs .device/wheel .device/bin .device/lit
mkdir -p .device/wheel .device/bin .device/lit/bin .device-cache/debs
cp -P build/libkiln.so* .device/bin/
for t in cuda api_errors ops_numeric output_pool autotune_api; do
  cp build/test/unit/$t .device/bin/
done
cp build/tools/kiln-opt build/tools/kiln-run .device/bin/
# lit (Python, without its bytecode) and the LLVM tools the lit tests' RUN
# lines use, from llvm-22-tools here.
cp -r /usr/lib/llvm-22/utils/lit .device/lit/lit
find .device/lit -name __pycache__ -prune -exec rm -rf {} +
for t in FileCheck not count split-file; do cp /usr/lib/llvm-22/bin/$t .device/lit/bin/; done
# Without debug info (the build id, kiln's cache key, stays).
find .device/bin -type f -exec strip --strip-debug {} +
# The runtime libraries: the debs' shared libraries repacked with xz -9e
# (2 MB less than the debs), made again only when the debs change
# (.device-cache/, git-ignored, not carried).
(cd .device-cache/debs && apt-get download libmlir-22 libllvm22 libz3-4 2>/dev/null)
stamp=$(ls .device-cache/debs/*.deb | sort | xargs -n1 basename | md5sum | cut -c1-12)
if [ ! -f ".device-cache/llvm-rt-$stamp.tar.xz" ]; then
  rm -rf .device-cache/x .device-cache/llvm-rt-*.tar.xz
  mkdir -p .device-cache/x
  for f in .device-cache/debs/*.deb; do dpkg -x "$f" .device-cache/x; done
  (cd .device-cache/x && find usr -name '*.so*' | sort | tar -cf - -T - | xz -9e -T2) \
    > ".device-cache/llvm-rt-$stamp.tar.xz"
  rm -rf .device-cache/x
fi
cp ".device-cache/llvm-rt-$stamp.tar.xz" .device/llvm-rt.tar.xz
python3 -m pip wheel -q --no-build-isolation --no-deps ./python -w .device/wheel
python3 -m pip download -q pytest -d .device/wheel
cp tools/device/run-python-tests.sh tools/device/run-bench.sh \
   tools/device/run-gpu-check.sh tools/device/unpack.sh .device/
du -sh .device
