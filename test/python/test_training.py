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


def test_transformer_training():
    batches = [(torch.randint(0, 50, (4, 12)), torch.randint(0, 50, (4, 12)))
               for _ in range(4)]

    def loss_fn(logits, y):
        return nn.functional.cross_entropy(logits.reshape(-1, 50), y.reshape(-1))

    compare(TinyTransformer, batches, loss_fn)
