"""kiln: a torch.compile backend in C on MLIR.

    import torch
    model = torch.compile(model, backend="kiln")   # registered on pip install

`KILN_LOG=fallbacks,stats` prints what ran in PyTorch and why, and what kiln
compiled; `options={"fallback": "error"}` makes any fallback an error.
"""

__version__ = "0.1.0"

from .backend import KilnFallbackError, kiln_backend  # noqa: E402,F401
