"""kiln: a torch.compile backend in C on MLIR.

    import torch
    model = torch.compile(model, backend="kiln")   # registered on pip install

`KILN_LOG=fallbacks,stats,recompiles,cache` prints what ran in PyTorch and
why, what kiln compiled, each new variant and cache decisions;
`options={"fallback": "error"}` makes any fallback an error. Compiled code is
kept in a persistent cache (KILN_CACHE_DIR, default ~/.cache/kiln);
`save_cache_artifacts()` / `load_cache_artifacts(b)` move it between machines.
"""

__version__ = "0.1.0"

from .backend import (  # noqa: E402,F401
    KilnFallbackError,
    compile_stats,
    kiln_backend,
    load_cache_artifacts,
    save_cache_artifacts,
)
