"""The backends compared, and how to install the peers."""

from __future__ import annotations

import importlib
import subprocess
import sys

import torch

PEER_PACKAGES = ["openvino", "iree-turbine", "iree-base-compiler", "iree-base-runtime"]

# Run only when named in --backends: kiln with an option off, for A/B runs.
OPT_IN = {"kiln-whole"}


def _has(module):
    try:
        importlib.import_module(module)
        return True
    except Exception:
        return False


def backends(device: str, quick: bool):
    """(name, compile function or None, note) for each backend, in order."""
    out = [("eager", lambda m: m, "")]
    out.append(("inductor", lambda m: torch.compile(m, backend="inductor"), ""))
    if quick:
        out.append(("inductor-max", None, "skipped in --quick (minutes of autotuning)"))
    else:
        out.append(("inductor-max", lambda m: torch.compile(m, backend="inductor",
                                                            mode="max-autotune"), ""))
    kiln_ok = device in ("cpu", "cuda")
    note = ""
    out.append(("kiln", (lambda m: torch.compile(m, backend="kiln")) if kiln_ok else None, note))
    out.append(("kiln-max", (lambda m: torch.compile(m, backend="kiln", mode="max-autotune"))
                if kiln_ok and not quick else None,
                note or ("skipped in --quick" if quick else "")))
    # Partitions compiled whole, repeated layers included (python/kiln/layers.py).
    out.append(("kiln-whole", (lambda m: torch.compile(m, backend="kiln",
                                                       options={"reuse_layers": False}))
                if kiln_ok else None, note))
    if device == "cuda":
        # CUDA graphs: Inductor's cudagraph trees against kiln's recorded
        # graphs (lib/api, options.cuda_graphs).
        out.append(("inductor-ro", lambda m: torch.compile(m, backend="inductor",
                                                           mode="reduce-overhead"), ""))
        out.append(("kiln-ro", lambda m: torch.compile(m, backend="kiln",
                                                       mode="reduce-overhead"), ""))
    if _has("openvino.torch"):
        out.append(("openvino", lambda m: torch.compile(m, backend="openvino"), ""))
    else:
        out.append(("openvino", None, "not installed (kiln-bench --install-peers)"))
    if _has("iree.turbine"):
        out.append(("turbine_cpu", lambda m: torch.compile(m, backend="turbine_cpu"), ""))
    else:
        out.append(("turbine_cpu", None, "not installed (kiln-bench --install-peers)"))
    return out


def install_peers():
    subprocess.run([sys.executable, "-m", "pip", "install", *PEER_PACKAGES], check=True)
