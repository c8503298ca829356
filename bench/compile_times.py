"""Cold and warm compile times, kiln vs Inductor, each in a fresh process.

    python3 bench/compile_times.py [--model transformer|mlp] [--train]

Cold: an empty cache directory (KILN_CACHE_DIR / TORCHINDUCTOR_CACHE_DIR);
warm: a second process over the same directory. Time is the first call of
the compiled model (Dynamo trace + AOTAutograd + backend), measured inside
the process after imports.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time, torch, torch.nn as nn
torch.manual_seed(0)
model_name, backend, train = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if model_name == "transformer":
    model = nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True)
    x = torch.randn(8, 64, 64)
else:
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    x = torch.randn(32, 64)
f = torch.compile(model, backend=backend)
t0 = time.perf_counter()
if train:
    x.requires_grad_()
    f(x).sum().backward()
else:
    with torch.no_grad():
        f(x)
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def run(model, backend, train, env):
    out = subprocess.run([sys.executable, "-c", CHILD, model, backend, "1" if train else "0"],
                         env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["seconds"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="transformer")
    ap.add_argument("--train", action="store_true")
    args = ap.parse_args()
    what = f"{args.model} {'training step' if args.train else 'forward'}"
    print(f"{what}: first-call time in a fresh process")
    for backend in ("kiln", "inductor"):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, KILN_CACHE_DIR=d, TORCHINDUCTOR_CACHE_DIR=d)
            cold = run(args.model, backend, args.train, env)
            warm = run(args.model, backend, args.train, env)
        print(f"  {backend:9s} cold {cold * 1e3:8.0f} ms   warm {warm * 1e3:8.0f} ms")


if __name__ == "__main__":
    main()
