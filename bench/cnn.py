"""CNN inference side by side: eager, kiln, Inductor, one process.

    python3 bench/cnn.py resnet18 BATCH SIZE    a ResNet-18 (7x7 stem, max
                                                pool, basic blocks, fc)
    python3 bench/cnn.py mobile BATCH SIZE      a stem and two inverted
                                                residual blocks (depthwise)

Prints kiln's error relative to eager's largest output (batch norms with
random statistics) and the median time of each backend. The twentieth
session's numbers are in docs/cpu-codegen.md.
"""

import sys

import torch
import torch.nn as nn

import kiln  # noqa: F401  (registers the backend)
from kiln_bench import zoo  # the models' definitions (kiln-bench's models group)
from models import median_time  # bench/models.py, beside this script


def median_ms(fn, iters=10):
    fn()
    return median_time(fn, iters) * 1e3


def main():
    name, batch, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.manual_seed(0)
    if name == "resnet18":
        model = zoo.ResNet18()
    else:
        model = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), zoo.InvertedResidual(32, 32, 1, 6),
                              zoo.InvertedResidual(32, 32, 1, 6))
    model.eval()
    zoo.randomize_batch_norms(model)
    x = torch.randn(batch, 3, size, size)
    kiln_fn = torch.compile(model, backend="kiln")
    inductor_fn = torch.compile(model)
    with torch.no_grad():
        want, got = model(x), kiln_fn(x)
        err = ((got - want).abs().max() / want.abs().max()).item()
        print(f"{name} batch {batch} size {size}: kiln's error {err:.2e}")
        print("eager %.2f ms  kiln %.2f ms  inductor %.2f ms" % (
            median_ms(lambda: model(x)), median_ms(lambda: kiln_fn(x)),
            median_ms(lambda: inductor_fn(x))))


if __name__ == "__main__":
    main()
