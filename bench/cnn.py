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
from models import median_time  # bench/models.py, beside this script


class Basic(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
        return torch.relu(y + (x if self.short is None else self.short(x)))


class ResNet18(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for cout, stride in [(64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1),
                             (512, 2), (512, 1)]:
            layers.append(Basic(cin, cout, stride))
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, 1000)

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.layers(self.stem(x)), 1)
        return self.fc(torch.flatten(x, 1))


class InvertedResidual(nn.Module):
    def __init__(self, c, expand=6):
        super().__init__()
        h = c * expand
        self.net = nn.Sequential(
            nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, h, 3, 1, 1, groups=h, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return x + self.net(x)


def median_ms(fn, iters=10):
    fn()
    return median_time(fn, iters) * 1e3


def main():
    name, batch, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.manual_seed(0)
    if name == "resnet18":
        model = ResNet18()
    else:
        model = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), InvertedResidual(32),
                              InvertedResidual(32))
    model.eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 1.5)
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
