"""Work on parameters alone (a linear's weight transpose, a weight built
from two parameters) hoisted out of inference calls with
options={"hoist_params": True} (python/kiln/hoist.py): done once, redone
when a parameter changes, never in training graphs, never by default."""

import pytest
import torch
import torch.nn as nn
from torch.fx.experimental.proxy_tensor import make_fx

from conftest import TOL
from kiln import hoist


ON = {"hoist_params": True}


def _mlp():
    return nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 64), nn.GELU(),
                         nn.Linear(64, 16)).eval()


def _runs():
    return hoist.PREP_RUNS


def _check(compiled, model, x):
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **TOL[torch.float32])


def test_weights_are_prepared_once_while_unchanged():
    model = _mlp()
    compiled = torch.compile(model, backend="kiln", options=ON)
    before = _runs()
    for _ in range(3):
        _check(compiled, model, torch.randn(8, 16))
    assert _runs() - before == 1


def test_changed_parameters_are_prepared_again():
    model = _mlp()
    compiled = torch.compile(model, backend="kiln", options=ON)
    x = torch.randn(8, 16)
    _check(compiled, model, x)
    before = _runs()
    with torch.no_grad():  # in place: the version counter moves
        model[1].weight.mul_(-0.5)
    _check(compiled, model, x)
    other = _mlp()  # load_state_dict copies into the parameters
    model.load_state_dict(other.state_dict())
    _check(compiled, model, x)
    # A new Parameter object, and new memory under the same object
    model[3].weight = nn.Parameter(torch.randn(16, 64))
    _check(compiled, model, x)
    model[3].weight.data = torch.randn(16, 64)
    _check(compiled, model, x)
    assert _runs() - before == 4
    _check(compiled, model, x)
    assert _runs() - before == 4


class Scaled(nn.Module):
    """A weight built from two parameters (as weight norm does)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 16))
        self.g = nn.Parameter(torch.rand(32) + 0.5)

    def forward(self, x):
        return torch.relu(x @ (self.w * self.g[:, None]).t())


def test_a_weight_from_two_parameters_follows_either():
    model = Scaled()
    compiled = torch.compile(model, backend="kiln", options=ON)
    x = torch.randn(8, 16)
    before = _runs()
    _check(compiled, model, x)
    with torch.no_grad():
        model.g.add_(1)
    _check(compiled, model, x)
    assert _runs() - before == 2


class ReturnsScale(nn.Module):
    """A value from parameters alone that is also a result."""

    def __init__(self):
        super().__init__()
        self.b = nn.Parameter(torch.randn(16))

    def forward(self, x):
        sc = self.b * 2
        return x + sc, sc


def test_a_returned_parameter_value_is_fresh_on_every_call():
    model = ReturnsScale()
    compiled = torch.compile(model, backend="kiln", options=ON)
    x = torch.randn(4, 16)
    with torch.no_grad():
        y1, s1 = compiled(x)
        s1.zero_()  # the caller's tensor: the next call must not see it
        y2, s2 = compiled(x)
        want_y, want_s = model(x)
    torch.testing.assert_close(y2, want_y, **TOL[torch.float32])
    torch.testing.assert_close(s2, want_s, **TOL[torch.float32])
    assert s1.data_ptr() != s2.data_ptr()


def test_off_by_default():
    model = _mlp()
    compiled = torch.compile(model, backend="kiln")
    before = _runs()
    _check(compiled, model, torch.randn(8, 16))
    assert _runs() == before


def test_training_graphs_are_not_hoisted():
    model = _mlp().train()
    ref = _mlp().train()
    ref.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="kiln", options=ON)
    before = _runs()
    x = torch.randn(8, 16)
    compiled(x).square().sum().backward()
    ref(x).square().sum().backward()
    assert _runs() == before
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL[torch.float32])


def test_inference_tensors_are_prepared_on_every_call():
    with torch.inference_mode():
        model = _mlp()
        compiled = torch.compile(model, backend="kiln", options=ON)
        x = torch.randn(8, 16)
        before = _runs()
        torch.testing.assert_close(compiled(x), model(x), **TOL[torch.float32])
        model[1].weight.mul_(2)  # no version counter to see this by
        torch.testing.assert_close(compiled(x), model(x), **TOL[torch.float32])
        assert _runs() - before == 2


def test_split_keeps_growing_and_mutating_ops_in_the_main_graph():
    def f(w, b, s, x):
        wt = w.t()                    # hoisted: the frontier, passed dense
        big = b.expand(x.shape[0], 4)  # more elements than b: stays
        s.add_(1)                     # a written buffer: what reads it stays
        return x @ wt + big + s * 2

    gm = make_fx(f, tracing_mode="fake")(torch.randn(4, 3), torch.randn(4),
                                         torch.randn(4), torch.randn(5, 3))
    sp = hoist.split(gm, [0, 1, 2])
    assert sp is not None and sp.positions == [0]
    ops = [n.target for n in sp.prep.graph.nodes if n.op == "call_function"]
    assert ops == [torch.ops.aten.t.default]
    main = sp.main.graph
    targets = {n.target for n in main.nodes if n.op == "call_function"}
    assert torch.ops.aten.t.default not in targets
    assert torch.ops.aten.expand.default in targets
    (ph,) = [n for n in main.nodes if n.name == "hoisted_0"]
    assert ph.meta["val"].shape == (3, 4) and ph.meta["val"].is_contiguous()


def test_split_without_parameter_work_is_none():
    gm = make_fx(lambda w, x: x @ w, tracing_mode="fake")(torch.randn(3, 4),
                                                          torch.randn(5, 3))
    assert hoist.split(gm, [0]) is None
    assert not any(n.name.startswith("hoisted") for n in gm.graph.nodes)
