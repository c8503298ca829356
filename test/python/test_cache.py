"""The compile cache from PyTorch: a second process compiles nothing, 12
identical blocks compile once, artifacts move between cache directories."""

import os
import subprocess
import sys
import textwrap

import torch
import torch.nn as nn

import kiln

SCRIPT = textwrap.dedent("""
    import json, torch, torch.nn as nn, kiln
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32))
    x = torch.randn(4, 16)
    y = torch.compile(model, backend="kiln")(x)
    torch.testing.assert_close(y, model(x), atol=1e-4, rtol=1e-4)
    print(json.dumps(kiln.compile_stats()))
""")


def run_process(cache_dir):
    env = dict(os.environ, KILN_CACHE_DIR=str(cache_dir))
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, check=True,
                         capture_output=True, text=True).stdout
    import json
    return json.loads(out.strip().splitlines()[-1])


def test_second_process_compiles_nothing(tmp_path):
    cold = run_process(tmp_path)
    warm = run_process(tmp_path)
    assert cold["compiles"] >= 1 and cold["cache_hits"] == 0
    assert warm["compiles"] == 0 and warm["cache_hits"] == cold["compiles"]


def test_artifacts_move_between_caches(tmp_path):
    run_process(tmp_path / "a")
    blob = subprocess.run(
        [sys.executable, "-c", "import sys, kiln; sys.stdout.buffer.write(kiln.save_cache_artifacts())"],
        env=dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "a")), check=True,
        capture_output=True).stdout
    assert blob.startswith(b"KILNART1")
    count = subprocess.run(
        [sys.executable, "-c", "import sys, kiln; print(kiln.load_cache_artifacts(sys.stdin.buffer.read()))"],
        input=blob, env=dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "b")),
        check=True, capture_output=True).stdout
    assert int(count) >= 1
    warm = run_process(tmp_path / "b")
    assert warm["compiles"] == 0 and warm["cache_hits"] >= 1


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.norm = nn.LayerNorm(32)

    def forward(self, x):
        # cumsum runs in PyTorch, so each block is its own kiln partition.
        return torch.cumsum(self.norm(torch.relu(self.fc(x)) + x), dim=0)


def test_identical_blocks_compile_once():
    model = nn.Sequential(*[Block() for _ in range(12)]).eval()
    x = torch.randn(8, 32)
    before = kiln.compile_stats()
    with torch.no_grad():
        got = torch.compile(model, backend="kiln")(x)
        torch.testing.assert_close(got, model(x), atol=1e-4, rtol=1e-4)
    after = kiln.compile_stats()
    compiled = (after["compiles"] - before["compiles"]) + (after["cache_hits"] - before["cache_hits"])
    # 12 partitions of one distinct graph: compiled (or loaded) once.
    assert compiled == 1, (before, after)
