"""Side-by-side timing of the backend test models: eager, kiln, Inductor.

    python3 bench/models.py [--iters N] [--no-inductor]

For each model: compile time (the first call, which traces and compiles),
then the median steady-state time of a forward call under torch.no_grad()
and of a training step (forward + backward). One process, one run, so the
ratios are comparable; absolute times depend on the machine's load. This is
the stopgap before kiln-bench (the bench-harness issue).
"""

import argparse
import statistics
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/test/python")
from test_models import ConvBlock, Softmax, mlp  # noqa: E402


def models():
    return [
        ("mlp", mlp, (64, 32)),
        ("layernorm", lambda: nn.LayerNorm(256), (64, 128, 256)),
        ("softmax", Softmax, (256, 1024)),
        ("conv", ConvBlock, (8, 3, 32, 32)),
        ("transformer", lambda: nn.TransformerEncoderLayer(
            64, 4, 256, dropout=0.0, batch_first=True), (8, 64, 64)),
    ]


def median_time(fn, iters):
    fn()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def run(backend, make, shape, iters):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = make()
    x = torch.randn(*shape)
    f = model if backend == "eager" else torch.compile(model, backend=backend)
    t0 = time.perf_counter()
    with torch.no_grad():
        f(x)
    compile_s = time.perf_counter() - t0
    with torch.no_grad():
        fwd = median_time(lambda: f(x), iters)
    x.requires_grad_()
    t0 = time.perf_counter()
    f(x).sum().backward()
    train_compile_s = time.perf_counter() - t0

    def step():
        model.zero_grad(set_to_none=True)
        f(x).sum().backward()
    train = median_time(step, iters)
    return compile_s, fwd, train_compile_s, train


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-inductor", action="store_true")
    args = ap.parse_args()
    backends = ["eager", "kiln"] + ([] if args.no_inductor else ["inductor"])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"median of {args.iters}")
    hdr = f"{'model':12s} {'backend':9s} {'compile(fwd)':>13s} {'fwd ms':>9s} " \
          f"{'compile(train)':>15s} {'train ms':>9s}"
    print(hdr)
    for name, make, shape in models():
        for b in backends:
            c, fwd, tc, tr = run(b, make, shape, args.iters)
            cs = "-" if b == "eager" else f"{c * 1e3:.0f} ms"
            tcs = "-" if b == "eager" else f"{tc * 1e3:.0f} ms"
            print(f"{name:12s} {b:9s} {cs:>13s} {fwd * 1e3:9.3f} {tcs:>15s} {tr * 1e3:9.3f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
