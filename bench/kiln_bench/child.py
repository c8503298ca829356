"""One case under one backend in a fresh process: first-call (compile) time
and peak memory. Used for cold and warm-cache compile times.

    python -m kiln_bench.child CASE BACKEND DEVICE
"""

import json
import resource
import sys
import time

import torch

from .backends import backends
from .cases import suite


def main():
    case_name, backend, device = sys.argv[1:4]
    case = next(c for c in suite(device) if c.name == case_name)
    compile_fn = dict((n, f) for n, f, _ in backends(device, quick=False))[backend]
    torch.manual_seed(0)
    fn, inputs = case.build(device, case.dtype)
    t0 = time.perf_counter()
    if case.train:
        fn.compile_optimizer(compile_fn)
        fn(compile_fn(fn.model), *inputs)
    else:
        with torch.no_grad():
            compile_fn(fn)(*inputs)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated() / 2**20 if device == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps({"seconds": seconds, "peak_mb": peak}))


if __name__ == "__main__":
    main()
