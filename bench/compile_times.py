"""Cold and warm compile times, kiln vs Inductor, each in a fresh process.

    python3 bench/compile_times.py [--model transformer|mlp|gpt2-12] [--train]

gpt2-12 is GPT-2 small's shape (12 layers of width 768, 128 tokens;
kiln_bench.zoo's GPT2), where compiling each repeated layer once counts:
kiln also runs with options={"reuse_layers": False} (`kiln-whole`).

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
import json, os, sys, time, torch, torch.nn as nn
torch.manual_seed(0)
model_name, backend, train = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
options = {}
if backend == "kiln-whole":
    backend, options = "kiln", {"options": {"reuse_layers": False}}
if model_name == "gpt2-12":
    sys.path.insert(0, os.path.join(sys.argv[4], "bench"))
    from kiln_bench import zoo
    model = zoo.GPT2(vocab=5000, dim=768, depth=12, heads=12, context=256)
    x = torch.randint(0, 5000, (1, 128))
elif model_name == "transformer":
    model = nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True)
    x = torch.randn(8, 64, 64)
else:
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    x = torch.randn(32, 64)
f = torch.compile(model, backend=backend, **options)
t0 = time.perf_counter()
if train:
    if x.is_floating_point():
        x.requires_grad_()
    f(x).sum().backward()
else:
    with torch.no_grad():
        f(x)
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(model, backend, train, env):
    out = subprocess.run([sys.executable, "-c", CHILD, model, backend, "1" if train else "0",
                          ROOT], env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["seconds"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="transformer", choices=("transformer", "mlp", "gpt2-12"))
    ap.add_argument("--train", action="store_true")
    args = ap.parse_args()
    what = f"{args.model} {'training step' if args.train else 'forward'}"
    print(f"{what}: first-call time in a fresh process")
    backends = ("kiln", "kiln-whole", "inductor") if args.model == "gpt2-12" else ("kiln", "inductor")
    for backend in backends:
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, KILN_CACHE_DIR=d, TORCHINDUCTOR_CACHE_DIR=d)
            cold = run(args.model, backend, args.train, env)
            warm = run(args.model, backend, args.train, env)
        print(f"  {backend:10s} cold {cold * 1e3:8.0f} ms   warm {warm * 1e3:8.0f} ms")


if __name__ == "__main__":
    main()
