"""The torch.compile call path's cost per call: a tiny linear layer (8x8,
so the kernel is nothing) called many times through eager, Inductor and
kiln, with static sizes and with the batch dim dynamic; medians in us.

    python3 -m kiln_bench.callcost [--calls 2000]
"""
import argparse
import statistics
import time

import torch
from torch import nn


def _median_us(fn, x, calls):
    for _ in range(50):
        fn(x)
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn(x)
        ts.append(time.perf_counter_ns() - t0)
    return statistics.median(ts) / 1e3


def measure(calls: int = 2000) -> dict:
    """{(backend, "static" | "dynamic"): us per call}."""
    import kiln  # noqa: F401  (registers the backend)
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)
    x = torch.randn(7, 8)
    out = {}
    with torch.no_grad():
        out[("eager", "static")] = _median_us(lin, x, calls)
        for backend in ("inductor", "kiln"):
            for kind in ("static", "dynamic"):
                torch._dynamo.reset()
                fn = torch.compile(lin, backend=backend, dynamic=kind == "dynamic")
                out[(backend, kind)] = _median_us(fn, x, calls)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    a = p.parse_args(argv)
    for (backend, kind), us in measure(a.calls).items():
        print(f"{backend:9s} {kind:8s} {us:8.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
