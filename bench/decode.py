"""Few rows through large linear layers, as in decoding: eager vs kiln vs
Inductor in one process.

    python3 bench/decode.py [--dtype bf16|f32] [--batches 1,8,16,40,100]

A 2048 -> 8192 -> 2048 MLP (GELU) is compiled and first called with a
batch of 1; the later batch sizes then reach the backends as Dynamo's
symbolic batch (its second size makes the dim dynamic), as a decode loop
with a varying batch does. Prints the median time per call of each
backend per batch and kiln's max error against eager.
"""

import argparse

import torch
import torch.nn as nn

from models import median_time  # bench/models.py, beside this script


def median_ms(fn, iters=50):
    return median_time(fn, iters) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--batches", default="1,8,16,40,100")
    args = ap.parse_args()
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2048, 8192), nn.GELU(),
                          nn.Linear(8192, 2048)).to(dt).eval()
    kiln = torch.compile(model, backend="kiln")
    inductor = torch.compile(model)
    print(f"{args.dtype} 2048 -> 8192 -> 2048 MLP, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    with torch.no_grad():
        first = torch.randn(1, 2048, dtype=dt)
        kiln(first), inductor(first)
        for b in (int(x) for x in args.batches.split(",")):
            x = torch.randn(b, 2048, dtype=dt)
            err = (kiln(x).float() - model(x).float()).abs().max().item()
            print(f"batch {b:4d}: eager {median_ms(lambda: model(x)):7.3f} ms  "
                  f"kiln {median_ms(lambda: kiln(x)):7.3f} ms  "
                  f"inductor {median_ms(lambda: inductor(x)):7.3f} ms  "
                  f"(kiln max err {err:.2g})")


if __name__ == "__main__":
    main()
