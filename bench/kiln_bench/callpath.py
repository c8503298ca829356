"""Where a torch.compile'd call's time goes outside kiln's kernels: one
inference case of kiln-bench called through Dynamo's compiled callable (what
the user calls), through AOTAutograd's (what Dynamo calls) and through
kiln's forward (what AOTAutograd calls), in interleaved rounds; medians of
the rounds' medians, in ms. The differences are Dynamo's frame and guards
and AOTAutograd's runtime wrappers.

    python3 -m kiln_bench.callpath mlp [attention ...] [--rounds 15] [--calls 20]
    python3 -m kiln_bench.callpath --gemm 1024x1024x1024 [...] [--threads 1]

`--gemm MxKxN ...`: torch.mm (MKL) against kiln's compiled forward of
`a @ b` called directly, so the comparison is of the kernels alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def _capture(compile_fn, first_call):
    """`compile_fn(backend)` with kiln's backend wrapped, called once by
    `first_call(compiled)` (torch.compile compiles on the first call);
    returns what it compiled and {"aot": AOTAutograd's callable, "fwd":
    kiln's forward, "args": the arguments Dynamo last passed}."""
    import kiln.backend as kb
    cap = {}
    orig_backend, orig_boxed = kb.kiln_backend, kb._boxed

    def backend(gm, ex, **kw):
        aot = orig_backend(gm, ex, **kw)
        cap["aot"] = aot

        def recording(*args):
            cap["args"] = args
            return aot(*args)
        return recording

    def boxed(fn):
        cap["fwd"] = fn
        return orig_boxed(fn)

    kb._boxed = boxed
    try:
        compiled = compile_fn(backend)
        first_call(compiled)
    finally:
        kb._boxed = orig_boxed
    return compiled, cap


def _rounds(callables: dict, rounds: int, calls: int) -> dict:
    """{name: median over rounds of each round's median, seconds}."""
    res = {k: [] for k in callables}
    for _ in range(rounds):
        for k, fn in callables.items():
            ts = []
            for _ in range(calls):
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
            res[k].append(statistics.median(ts))
    return {k: statistics.median(v) for k, v in res.items()}


def layers(case_name: str, rounds: int = 15, calls: int = 20) -> dict:
    """{"torch.compile" | "aot" | "kiln": ms per call} for an inference case.
    The AOTAutograd and kiln layers are the last graph's Dynamo compiled: a
    case with graph breaks, or several partitions in one graph, is split
    for that graph only (the bench's blocks are one graph, one partition)."""
    from .cases import suite
    case = next(c for c in suite("cpu") if c.name == case_name)
    if case.train:
        raise ValueError(f"{case_name} is a training case; callpath takes inference cases")
    model, inputs = case.build("cpu", case.dtype)
    with torch.no_grad():
        f, cap = _capture(lambda be: torch.compile(model, backend=be, dynamic=False),
                          lambda f: f(*inputs))
        for _ in range(3):
            f(*inputs)
        aot, fwd, args = cap["aot"], cap["fwd"], cap["args"]
        t = _rounds({"torch.compile": lambda: f(*inputs), "aot": lambda: aot(*args),
                     "kiln": lambda: fwd(*args)}, rounds, calls)
    return {k: v * 1e3 for k, v in t.items()}


def gemm(m: int, k: int, n: int, rounds: int = 11) -> dict:
    """{"mkl" | "kiln": ms per call} for f32 [m, k] @ [k, n]."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    torch._dynamo.reset()
    f, cap = _capture(lambda be: torch.compile(lambda x, y: x @ y, backend=be, dynamic=False),
                      lambda f: f(a, b))
    fwd = cap["fwd"]
    calls = max(3, int(2e9 / (2.0 * m * k * n)))
    t = _rounds({"mkl": lambda: torch.mm(a, b), "kiln": lambda: fwd(a, b)}, rounds, calls)
    return {key: v * 1e3 for key, v in t.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="*", help="inference cases of kiln-bench (mlp, attention, ...)")
    p.add_argument("--gemm", nargs="*", default=[], metavar="MxKxN")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--threads", type=int, default=0,
                   help="threads for PyTorch and kiln (default: theirs)")
    args = p.parse_args(argv)
    if args.threads:
        # Before kiln's context exists (it reads KILN_NUM_THREADS once).
        os.environ["KILN_NUM_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    import kiln  # noqa: F401  (registers the backend)
    for name in args.cases:
        t = layers(name, args.rounds, args.calls)
        print(f"{name}: torch.compile {t['torch.compile']:.3f} ms, AOTAutograd's callable "
              f"{t['aot']:.3f}, kiln's forward {t['kiln']:.3f}: Dynamo "
              f"{(t['torch.compile'] - t['aot']) * 1e3:.0f} us, AOTAutograd "
              f"{(t['aot'] - t['kiln']) * 1e3:.0f} us", flush=True)
    for spec in args.gemm:
        m, k, n = (int(x) for x in spec.split("x"))
        t = gemm(m, k, n, args.rounds)
        fl = 2.0 * m * k * n
        print(f"{spec}: MKL {t['mkl']:.3f} ms ({fl / t['mkl'] / 1e6:.0f} GFLOP/s), kiln "
              f"{t['kiln']:.3f} ({fl / t['kiln'] / 1e6:.0f} GFLOP/s): kiln at "
              f"{t['mkl'] / t['kiln']:.2f}x MKL's speed", flush=True)


if __name__ == "__main__":
    main()
