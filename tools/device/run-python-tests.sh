#!/usr/bin/env bash
# On the GPU machine (after tools/device/pack.sh here, with carry [".device"]):
# unpack Debian's LLVM/MLIR runtime, install the kiln
# wheel built here, run the pytest suite against the machine's PyTorch.
set -u
source .device/unpack.sh
python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])"
python3 -c "import pytest" 2>/dev/null || python3 -m pip install -q --break-system-packages --no-index --find-links .device/wheel pytest
python3 -m pip install -q --break-system-packages --no-deps --force-reinstall .device/wheel/kiln-*.whl 2>&1 | grep -v WARNING
python3 -c "import torch; print('kiln registered:', 'kiln' in torch._dynamo.list_backends())"
python3 -m pytest -q "${@:-test/python}" 2>&1 | tail -15
exit "${PIPESTATUS[0]}"
