"""20 Adam steps with kiln's forward and backward graphs match eager: the
per-step losses and the final parameters."""

import copy

import pytest
import torch
import torch.nn as nn


class TinyTransformer(nn.Module):
    def __init__(self, vocab=50, dim=32, heads=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        # No biases: the key projection's bias has an exactly-zero gradient
        # (softmax ignores it), so Adam turns rounding noise into full-size
        # steps in eager and kiln alike, and those parameters cannot match.
        self.block = nn.TransformerEncoderLayer(dim, heads, 64, dropout=0.0,
                                                batch_first=True, bias=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        return self.head(self.block(self.emb(tokens)))


def train(model, batches, loss_fn, steps=20):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for i in range(steps):
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def compare(make, batches, loss_fn):
    eager = make()
    ref = copy.deepcopy(eager)
    compiled = torch.compile(eager, backend="kiln")
    got = train(compiled, batches, loss_fn)
    want = train(ref, batches, loss_fn)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want),
                               atol=1e-4, rtol=1e-4)
    for (name, p), q in zip(eager.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, atol=1e-4, rtol=1e-3, msg=name)


def test_mlp_training():
    batches = [(torch.randn(16, 20), torch.randn(16, 5)) for _ in range(4)]
    compare(lambda: nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64),
                                  nn.GELU(), nn.Linear(64, 5)),
            batches, nn.functional.mse_loss)


def test_training_compiles_each_partition_once(capfd, monkeypatch, tmp_path):
    """The backward graph reads saved activations through transposed views:
    kiln compiles its first variant for the layouts the calls pass (the
    traced strides), not contiguous ones that the first call recompiles."""
    monkeypatch.setenv("KILN_LOG", "recompiles")
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    model = nn.Sequential(nn.Linear(24, 48), nn.GELU(), nn.Linear(48, 24), nn.LayerNorm(24))
    compiled = torch.compile(model, backend="kiln", options={"fallback": "error"})
    x = torch.randn(12, 24)
    for _ in range(3):
        compiled(x).square().mean().backward()
    err = capfd.readouterr().err
    assert not [l for l in err.splitlines() if "not covered" in l], err


def test_transformer_training():
    batches = [(torch.randint(0, 50, (4, 12)), torch.randint(0, 50, (4, 12)))
               for _ in range(4)]

    def loss_fn(logits, y):
        return nn.functional.cross_entropy(logits.reshape(-1, 50), y.reshape(-1))

    compare(TinyTransformer, batches, loss_fn)


class CausalAttention(nn.Module):
    """One head group of causal self-attention over [B, T, D] inputs, called
    as F.scaled_dot_product_attention (`mask`: an explicit boolean mask in
    place of is_causal)."""

    def __init__(self, dim=32, heads=4, mask=False):
        super().__init__()
        self.heads, self.mask = heads, mask
        # No bias: the key's has a zero gradient (see TinyTransformer).
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if self.mask:
            keep = torch.ones(t, t, dtype=torch.bool).tril()
            y = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        else:
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


def _graph_stats(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "kiln" and "kiln partition(s)" in r.getMessage()]


def test_causal_attention_training_in_one_partition(caplog):
    # A training graph's CPU attention is traced in its math form
    # (backend._hook_attention): forward and backward are one kiln partition
    # each, nothing left in PyTorch, and the steps match eager's flash
    # attention.
    batches = [(torch.randn(4, 16, 32), torch.randn(4, 16, 32)) for _ in range(4)]
    with caplog.at_level("DEBUG", logger="kiln"):
        compare(CausalAttention, batches, nn.functional.mse_loss)
    stats = _graph_stats(caplog)
    assert any(m.startswith("stats: forward:") for m in stats), stats
    assert any(m.startswith("stats: backward:") for m in stats), stats
    for m in stats:
        assert ": 1 kiln partition(s), 0 node(s) in PyTorch" in m, stats


def test_masked_attention_training_keeps_fused_op(caplog):
    # With an attention mask the fused op stays (a fully masked row is 0 in
    # PyTorch's kernels, NaN in the plain math form): it runs in PyTorch
    # between kiln partitions, and the steps still match eager.
    batches = [(torch.randn(4, 16, 32), torch.randn(4, 16, 32)) for _ in range(4)]
    with caplog.at_level("DEBUG", logger="kiln"):
        compare(lambda: CausalAttention(mask=True), batches, nn.functional.mse_loss)
    stats = _graph_stats(caplog)
    assert stats and any(" 0 node(s) in PyTorch" not in m for m in stats), stats


@pytest.mark.parametrize("name", ["attention", "mlp"])
def test_dynamic_batch_training(name):
    """Forward and backward under a dynamic batch (Dynamo recompiles with
    the batch symbolic at the second size): the backward graphs' views and
    the loss gradient's aten.full take derived sizes (4*s0 heads, 16*s0
    rows). Every op is kiln's (fallback="error"); outputs and parameter
    gradients match eager on fresh inputs at each batch size."""
    from kiln_bench.cases import Attention
    torch.manual_seed(0)
    make = {"attention": lambda: Attention(64, 4),
            "mlp": lambda: nn.Sequential(nn.Linear(64, 128), nn.GELU(),
                                         nn.Linear(128, 64))}[name]
    model = make()
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="kiln", options={"fallback": "error"})
    for b in (2, 3, 5):
        x = torch.randn(b, 16, 64)
        y = compiled(x)
        y.square().mean().backward()
        r = ref(x)
        r.square().mean().backward()
        torch.testing.assert_close(y, r, rtol=1e-4, atol=1e-4)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4)
            p.grad, q.grad = None, None


def test_dynamic_training_through_two_symbol_reshapes():
    """LayerNorm -> Linear -> ReLU -> Linear on [B, T, E] with both B and T
    dynamic: the backward views [B*T, E] as [B, T, E] (a reshape whose sizes
    are stored into a buffer), and its horizontally fused loops once read
    those sizes before they were stored (a segfault; lit
    pipeline/cpu-hfuse-reshape.kiln)."""
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(32)
            self.fc1 = nn.Linear(32, 64)
            self.fc2 = nn.Linear(64, 32)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(self.norm(x))))

    model, ref = Net(), Net()
    ref.load_state_dict(model.state_dict())
    fn = torch.compile(model, backend="kiln", dynamic=True, options={"fallback": "error"})
    for shape in ((2, 5, 32), (3, 7, 32)):
        x = torch.randn(*shape)
        model.zero_grad()
        ref.zero_grad()
        fn(x).pow(2).sum().backward()
        ref(x).pow(2).sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)
