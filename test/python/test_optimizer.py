"""Compiled optimizer steps: torch.compile(opt.step, backend="kiln").

The step's graph updates parameters and optimizer state in place (copy_ into
graph inputs after functionalization); kiln compiles it as one partition
that writes those inputs itself (`return %v -> %x`). Checked against eager
optimizers on fresh random gradients over several steps.
"""

import copy

import pytest
import torch
import torch.nn as nn

from kiln import backend as kb

OPTIMIZERS = {
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adam_foreach": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
    "adam_amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9),
    "sgd_foreach": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True,
                                             foreach=True),
}


def _model():
    return nn.Sequential(nn.Linear(48, 64), nn.LayerNorm(64), nn.Linear(64, 8))


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_compiled_step_matches_eager(name, monkeypatch):
    compiled_texts = []
    init = kb.CompiledSubgraph.__init__

    def spy(self, gm, n, opts, *rest, **kw):
        init(self, gm, n, opts, *rest, **kw)
        compiled_texts.append(self.text)
    monkeypatch.setattr(kb.CompiledSubgraph, "__init__", spy)

    ref = _model()
    mod = copy.deepcopy(ref)
    opt_ref, opt = OPTIMIZERS[name](ref.parameters()), OPTIMIZERS[name](mod.parameters())
    step = torch.compile(opt.step, backend="kiln", options={"fallback": "error"})
    for _ in range(4):
        for p, q in zip(ref.parameters(), mod.parameters()):
            g = torch.randn_like(p)
            p.grad, q.grad = g.clone(), g.clone()
        opt_ref.step()
        step()
    for (pname, p), q in zip(ref.named_parameters(), mod.parameters()):
        torch.testing.assert_close(q, p, atol=1e-5, rtol=1e-4, msg=pname)
    for s_ref, s in zip(opt_ref.state.values(), opt.state.values()):
        for key in s_ref:
            if torch.is_tensor(s_ref[key]):
                torch.testing.assert_close(s[key], s_ref[key], atol=1e-5, rtol=1e-4,
                                           msg=key)
    # One partition per Dynamo graph (SGD's first step, which creates the
    # momentum buffers, is a graph of its own), writing parameters and state
    # in place.
    assert 1 <= len(compiled_texts) <= 2
    for text in compiled_texts:
        assert text.count(" -> %in") >= len(list(mod.parameters()))


def test_copy_into_an_input_read_elsewhere_runs_in_pytorch(capfd, monkeypatch):
    """An input another partition (or PyTorch) still reads is not written in
    place: its copy_ stays in PyTorch, after every read."""
    monkeypatch.setenv("KILN_LOG", "fallbacks")

    def f(x):
        y = torch.cumsum(x, 0)  # kiln has no cumsum: runs in PyTorch
        x.mul_(2.0)
        return y

    x = torch.randn(16)
    x_ref = x.clone()
    with torch.no_grad():
        got = torch.compile(f, backend="kiln")(x)
        want = f(x_ref)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x, x_ref)
    assert "copy_ into an input that another partition reads" in capfd.readouterr().err


def test_foreach_addcdiv_with_a_tensor_of_scalars():
    """_foreach_addcdiv.Tensor (compiled Adam's stacked step sizes): element
    i of the scalars tensor scales list entry i."""
    op = torch.ops.aten._foreach_addcdiv.Tensor

    def f(x0, x1, a0, a1, b0, b1, s):
        r = op([x0, x1], [a0, a1], [b0, b1], s)
        return r[0], r[1]

    args = [torch.randn(5), torch.randn(3, 2), torch.randn(5), torch.randn(3, 2),
            torch.rand(5) + 1, torch.rand(3, 2) + 1, torch.tensor([0.5, -2.0])]
    gm = torch.fx.symbolic_trace(f)
    env = dict(zip([n for n in gm.graph.nodes if n.op == "placeholder"], args))
    for n in gm.graph.nodes:  # what Dynamo records: each node's value
        if n.op == "placeholder":
            n.meta["val"] = env[n]
        elif n.op == "call_function":
            n.meta["val"] = n.target(*torch.fx.node.map_arg(n.args, lambda a: a.meta["val"]))
    compiled = kb.compile_graph(gm, args, kb.parse_options(None, {"fallback": "error"}))
    got, want = compiled(*args), f(*args)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_copies_left_to_pytorch_follow_every_partition():
    """x is read by a partition behind a PyTorch node: its copy_ stays in
    PyTorch and must run after that partition (compile_graph moves such
    copies last)."""
    def f(x, y):
        v1 = x * 2.0
        u = torch.cumsum(v1, 0)  # PyTorch
        v2 = u + x               # reads the old x, in a second partition
        x.copy_(v1)
        y.copy_(v2)

    x, y = torch.randn(64), torch.zeros(64)
    xr, yr = x.clone(), y.clone()
    with torch.no_grad():
        torch.compile(f, backend="kiln")(x, y)
        f(xr, yr)
    torch.testing.assert_close(x, xr)
    torch.testing.assert_close(y, yr)
