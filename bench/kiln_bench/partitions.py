"""Per-partition time of one kiln-bench case: where a compiled model's time
goes, partition by partition, split into the C call and the Python around it.

    python3 -m kiln_bench.partitions train_gpt [--device cuda] [--dynamic] [--steps 50]

Each compiled partition (kiln.backend.CompiledSubgraph) is wrapped with a
timer; on CUDA the device is synchronized around each partition so the time
includes its kernels. Medians over the timed steps. A diagnosis tool: it
perturbs what it measures (the wrappers, and on CUDA the synchronization).
"""

from __future__ import annotations

import argparse
import collections
import time

import torch

import kiln.backend as kb
import kiln._capi as capi

from .cases import suite


def measure(case_name: str, device: str = "cpu", dynamic: bool = False,
            steps: int = 50) -> list[tuple[str, float, float]]:
    """[(partition, ms per call, ms in the C call)] for `case_name`."""
    total, ccall = collections.defaultdict(list), collections.defaultdict(list)
    current = [None]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    forward, init = kb.CompiledSubgraph.forward, kb.CompiledSubgraph.__init__
    calls = {n: getattr(capi, n) for n in ("kiln_function_call", "kiln_function_call_alloc",
                                           "kiln_function_call_async")}

    def timed_forward(self, *args):
        current[0] = self._bench_name
        sync()
        t = time.perf_counter()
        r = forward(self, *args)
        sync()
        total[self._bench_name].append(time.perf_counter() - t)
        return r

    def named_init(self, gm, name, opts, *rest, **kw):
        init(self, gm, name, opts, *rest, **kw)
        self._bench_name = f"{name}/{len(gm.graph.nodes)} nodes"

    def timed_call(fn):
        def call(*args):
            t = time.perf_counter()
            r = fn(*args)
            ccall[current[0]].append(time.perf_counter() - t)
            return r
        return call

    kb.CompiledSubgraph.forward, kb.CompiledSubgraph.__init__ = timed_forward, named_init
    for n, fn in calls.items():
        setattr(capi, n, timed_call(fn))
    try:
        case = [c for c in suite(device) if c.name == case_name]
        if not case:
            raise SystemExit(f"no case {case_name!r}; cases: "
                             f"{', '.join(c.name for c in suite(device))}")
        torch._dynamo.reset()
        torch.manual_seed(0)
        model, inputs = case[0].build(device, case[0].dtype)
        if case[0].train:
            compiled = torch.compile(model.model, backend="kiln", dynamic=dynamic)
            model.compile_optimizer(lambda f: torch.compile(f, backend="kiln"))
            run = lambda: model(compiled, *inputs)  # noqa: E731
        else:
            compiled = torch.compile(model, backend="kiln", dynamic=dynamic)
            run = lambda: compiled(*inputs)  # noqa: E731
        with torch.set_grad_enabled(case[0].train):
            for _ in range(5):
                run()
            total.clear()
            ccall.clear()
            for _ in range(steps):
                run()
    finally:
        kb.CompiledSubgraph.forward, kb.CompiledSubgraph.__init__ = forward, init
        for n, fn in calls.items():
            setattr(capi, n, fn)

    def med(v):
        v = sorted(v)
        return v[len(v) // 2] * 1e3 if v else 0.0
    return [(name, med(v), med(ccall[name])) for name, v in total.items()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("case")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dynamic", action="store_true",
                   help="torch.compile(dynamic=True): symbolic sizes")
    p.add_argument("--steps", type=int, default=50)
    a = p.parse_args(argv)
    rows = measure(a.case, a.device, a.dynamic, a.steps)
    for name, ms, c in rows:
        print(f"{name:36s} {ms:8.3f} ms   (C call {c:.3f} ms)")
    print(f"{'total':36s} {sum(r[1] for r in rows):8.3f} ms   "
          f"(C calls {sum(r[2] for r in rows):.3f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
