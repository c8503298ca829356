"""The compile cache from PyTorch: a second process compiles nothing, 12
identical blocks compile once (as partitions of their own, or as repeated
layers of one graph: layers.py), artifacts move between cache directories."""

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


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 32)
        self.norm = nn.LayerNorm(32)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class Stack(nn.Module):
    """Layers between a first and a last op of the model's own (not layers)."""

    def __init__(self, n):
        super().__init__()
        self.layers = nn.ModuleList([Layer() for _ in range(n)])
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = x * 2.0
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _compile_counts(capfd, model, *args, backward=False, **options):
    """Runs the model compiled by kiln; returns the result, kiln's partitions
    per graph kind (KILN_LOG=stats) and the variants made (compiled or
    loaded from the cache)."""
    before = kiln.compile_stats()
    fn = torch.compile(model, backend="kiln", options=dict(fallback="error", **options))
    out = fn(*args)
    if backward:
        out.pow(2).sum().backward()
    after = kiln.compile_stats()
    err = capfd.readouterr().err
    parts = {}
    for line in err.splitlines():
        if "kiln partition(s)" in line:
            kind, rest = line.split("] ", 1)[1].split(": ", 1)
            parts[kind] = int(rest.split()[0])
    made = (after["compiles"] - before["compiles"]) + (after["cache_hits"] - before["cache_hits"])
    return out, parts, made


def test_repeated_layers_in_one_graph_compile_once(capfd, monkeypatch):
    monkeypatch.setenv("KILN_LOG", "stats")
    torch.manual_seed(0)
    model = Stack(5).eval()
    x = torch.randn(8, 32)
    with torch.no_grad():
        got, parts, made = _compile_counts(capfd, model, x)
        torch.testing.assert_close(got, model(x), atol=1e-4, rtol=1e-4)
        # The scale, five layers, the head: seven partitions, three graphs.
        assert parts == {"forward": 7} and made == 3, (parts, made)
        # Whole, as before: one partition.
        torch._dynamo.reset()
        got, parts, made = _compile_counts(capfd, model, x, reuse_layers=False)
        torch.testing.assert_close(got, model(x), atol=1e-4, rtol=1e-4)
        assert parts == {"forward": 1}, parts


def test_repeated_layers_in_training(capfd, monkeypatch):
    monkeypatch.setenv("KILN_LOG", "stats")
    torch.manual_seed(0)
    model = Stack(4)
    ref = Stack(4)
    ref.load_state_dict(model.state_dict())
    x = torch.randn(8, 32)
    got, parts, made = _compile_counts(capfd, model, x, backward=True)
    ref(x).pow(2).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)
    # The backward's layers are cut too (by the forward nodes' stacks). Three
    # forward layers reuse the first's graph; of the backward's, the middle
    # ones are alike (the last layer's takes the head's gradient, the first
    # computes none for x), so at least five partitions reuse a graph.
    assert parts["forward"] == 6 and parts["backward"] >= 4, parts
    assert made <= parts["forward"] + parts["backward"] - 5, (parts, made)


class WideBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class Stage(nn.Module):
    def __init__(self, dim_in, dim):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim)
        self.blocks = nn.ModuleList([WideBlock(dim) for _ in range(3)])

    def forward(self, x):
        x = self.proj(x)
        for block in self.blocks:
            x = block(x)
        return x


class Stages(nn.Module):
    """Stages of one class but of other widths (a ResNet's, a Swin's): the
    stages repeat nowhere, their blocks do."""

    def __init__(self):
        super().__init__()
        self.stages = nn.ModuleList([Stage(12, 24), Stage(24, 40)])

    def forward(self, x):
        for stage in self.stages:
            x = stage(x)
        return x


def test_repeated_blocks_inside_stages_compile_once(capfd, monkeypatch):
    monkeypatch.setenv("KILN_LOG", "stats")
    torch.manual_seed(0)
    model = Stages().eval()
    x = torch.randn(6, 12)
    with torch.no_grad():
        got, parts, made = _compile_counts(capfd, model, x)
    torch.testing.assert_close(got, model(x), atol=1e-4, rtol=1e-4)
    # Per stage its projection and three blocks: eight partitions, four
    # graphs (two projections, a block of each width).
    assert parts == {"forward": 8} and made == 4, (parts, made)


class NormLayer(nn.Module):
    """A layer whose BatchNorm updates buffers (copy_ into inputs)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(32)
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 32)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


def test_repeated_layers_update_their_buffers_in_kiln(capfd, monkeypatch):
    """Each layer's running statistics are written by the piece that reads
    them: nothing falls back (fallback="error") and the buffers match."""
    monkeypatch.setenv("KILN_LOG", "stats")
    torch.manual_seed(0)
    model = nn.ModuleList([NormLayer() for _ in range(3)])
    ref = nn.ModuleList([NormLayer() for _ in range(3)])
    ref.load_state_dict(model.state_dict())

    def run(layers, x):
        for layer in layers:
            x = layer(x)
        return x

    class Net(nn.Module):
        def __init__(self, layers):
            super().__init__()
            self.layers = layers

        def forward(self, x):
            return run(self.layers, x)

    x = torch.randn(8, 32)
    got, parts, _ = _compile_counts(capfd, Net(model), x, backward=True)
    Net(ref)(x).pow(2).sum().backward()
    assert parts["forward"] == 3, parts
    for (name, b), b_ref in zip(model.named_buffers(), ref.buffers()):
        torch.testing.assert_close(b, b_ref, atol=1e-5, rtol=1e-5, msg=name)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)


def test_sequential_of_single_modules_is_not_cut(capfd, monkeypatch):
    """Items of a Sequential that are single modules (Linear, LayerNorm)
    are not layers: cutting them apart would undo the fusions between them."""
    monkeypatch.setenv("KILN_LOG", "stats")
    model = nn.Sequential(nn.Linear(32, 32), nn.LayerNorm(32), nn.GELU(),
                          nn.Linear(32, 32), nn.LayerNorm(32), nn.GELU())
    x = torch.randn(8, 32)
    got, parts, _ = _compile_counts(capfd, model, x, backward=True)
    assert parts == {"forward": 1, "backward": 1}, parts


class FlatLayer(nn.Module):
    """Reads [B*L, E] and views it as [B, L, E]: under dynamic shapes its
    inputs do not give B and L apart."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x, B, L):
        h = torch.relu(self.fc(x)).view(B, L, 32).softmax(1).view(B * L, 32)
        return x + h * 0.5


class FlatStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([FlatLayer() for _ in range(3)])

    def forward(self, x):
        B, L, E = x.shape
        x = x.reshape(B * L, E) * 2.0
        for layer in self.layers:
            x = layer(x, B, L)
        # Views between layers leave a piece of views only (PyTorch's).
        return x.view(B, L, E)


def test_repeated_layers_under_dynamic_shapes_stay_in_kiln():
    """A layer whose inputs cannot bind its sizes is not cut out (kiln would
    refuse it); the partition compiles whole, in kiln."""
    torch.manual_seed(0)
    model = FlatStack().eval()
    fn = torch.compile(model, backend="kiln", dynamic=True, options={"fallback": "error"})
    with torch.no_grad():
        for shape in ((2, 3, 32), (3, 5, 32)):
            x = torch.randn(*shape)
            torch.testing.assert_close(fn(x), model(x), atol=1e-5, rtol=1e-5)


class MaskedLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 32)
        self.fc2 = nn.Linear(32, 32)

    def forward(self, x, mask, B, L):
        h = torch.relu(self.fc1(x)).view(B, L, 32) * mask[..., None]
        return x + self.fc2(h.view(B * L, 32)) * 0.5


class MaskedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([MaskedLayer() for _ in range(3)])

    def forward(self, x, mask):
        B, L, E = x.shape
        x = x.reshape(B * L, E)
        for layer in self.layers:
            x = layer(x, mask, B, L)
        # The head reads only [B*L, E]: as a piece of its own it could not
        # bind B and L.
        return x.view(B, L, E).softmax(1).sum(1)


def test_leftover_pieces_must_bind_their_sizes_too():
    """The layers bind their sizes (the mask gives B and L), the head alone
    would not: the partition stays whole, in kiln."""
    torch.manual_seed(0)
    model = MaskedNet().eval()
    fn = torch.compile(model, backend="kiln", dynamic=True, options={"fallback": "error"})
    with torch.no_grad():
        for shape in ((2, 3), (3, 5)):
            x, m = torch.randn(*shape, 32), torch.rand(*shape)
            torch.testing.assert_close(fn(x, m), model(x, m), atol=1e-5, rtol=1e-5)


def test_views_between_repeated_layers_run_in_pytorch():
    """A piece between layers holding only views is left to PyTorch (it
    computes nothing kiln would return)."""
    torch.manual_seed(0)

    class Views(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Layer() for _ in range(3)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x).view(2, 4, 32).view(8, 32)
            return x

    model = Views().eval()
    x = torch.randn(8, 32)
    with torch.no_grad():
        got = torch.compile(model, backend="kiln", options={"fallback": "error"})(x)
    torch.testing.assert_close(got, model(x), atol=1e-4, rtol=1e-4)
