#!/usr/bin/env bash
# Sourced by the GPU machine's scripts (from the repository root): unpacks
# the LLVM/MLIR runtime that tools/device/pack.sh put in .device/ into
# /tmp/llvm (once) and puts it on LD_LIBRARY_PATH.
if [ ! -f /tmp/llvm/.unpacked ]; then
  mkdir -p /tmp/llvm
  tar -xJf .device/llvm-rt.tar.xz -C /tmp/llvm && touch /tmp/llvm/.unpacked
fi
export LD_LIBRARY_PATH=/tmp/llvm/usr/lib/llvm-22/lib:/tmp/llvm/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
