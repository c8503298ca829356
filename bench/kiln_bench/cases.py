"""The benchmark suite: kernels, blocks, training steps."""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass
class Case:
    name: str
    group: str                   # kernels | blocks | training | dynamic | models
    build: Callable              # (device, dtype) -> (callable, inputs)
    dtype: torch.dtype = torch.float32
    flops: float = 0.0           # per call, for the roofline
    bytes: float = 0.0           # per call, minimum traffic
    train: bool = False          # the callable returns a loss to backward
    quick: bool = False          # part of --quick
    demo: bool = False           # part of `make demo`


def _esize(dtype):
    return torch.finfo(dtype).bits // 8


def pointwise(n):
    def build(dev, dt):
        def f(x, y):
            return torch.sigmoid(x * 1.5 + y).mul(x).relu() - 0.25 * y
        return f, (torch.randn(n, device=dev, dtype=dt), torch.randn(n, device=dev, dtype=dt))
    return build


def softmax(rows, cols):
    def build(dev, dt):
        return (lambda x: torch.softmax(x, dim=-1)), (torch.randn(rows, cols, device=dev, dtype=dt),)
    return build


def layernorm(rows, cols):
    def build(dev, dt):
        m = nn.LayerNorm(cols).to(dev, dt)
        return m, (torch.randn(rows, cols, device=dev, dtype=dt),)
    return build


def matmul(m, k, n):
    def build(dev, dt):
        return torch.mm, (torch.randn(m, k, device=dev, dtype=dt),
                          torch.randn(k, n, device=dev, dtype=dt))
    return build


def linear_gelu(m, k, n):
    def build(dev, dt):
        lin = nn.Linear(k, n).to(dev, dt)
        return (lambda x: F.gelu(lin(x))), (torch.randn(m, k, device=dev, dtype=dt),)
    return build


def linear_dynamic(m, k, n):
    """A linear layer with its batch dim marked dynamic: every backend gets
    a graph with a symbolic M (as after torch.compile's recompile on a new
    batch size), K and N the weight's."""
    def build(dev, dt):
        lin = nn.Linear(k, n, bias=False).to(dev, dt)
        x = torch.randn(m, k, device=dev, dtype=dt)
        torch._dynamo.mark_dynamic(x, 0)
        return lin, (x,)
    return build


def mlp_block(tokens, dim):
    def build(dev, dt):
        m = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.GELU(),
                          nn.Linear(4 * dim, dim)).to(dev, dt)
        return m, (torch.randn(tokens, dim, device=dev, dtype=dt),)
    return build


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d // self.heads))
        y = torch.softmax(att, dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class CausalAttention(Attention):
    """The attention block with SDPA's causal form (a decoder's)."""

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class BufferCausalAttention(Attention):
    """GPT-2's (nanoGPT's) causal attention: a registered tril buffer cut
    to the length, masked_fill with -inf, softmax."""

    def __init__(self, dim, heads, max_len=1024):
        super().__init__(dim, heads)
        self.register_buffer("bias", torch.tril(torch.ones(max_len, max_len))
                             .view(1, 1, max_len, max_len))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d // self.heads))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        y = torch.softmax(att, dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class PaddedAttention(Attention):
    """A BERT-style self-attention: SDPA with the additive padding mask
    [B, 1, 1, T] made from a [B, T] 0/1 attention mask."""

    def forward(self, x, keep):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        mask = (1.0 - keep[:, None, None, :].to(x.dtype)) * -10000.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


def padded_dynamic(batch, tokens, dim, heads):
    """PaddedAttention with the length marked dynamic (in x and the
    0/1 mask), each batch row padded at a different length."""
    def build(dev, dt):
        m = PaddedAttention(dim, heads).to(dev, dt).eval()
        x = torch.randn(batch, tokens, dim, device=dev, dtype=dt)
        keep = torch.ones(batch, tokens, device=dev, dtype=dt)
        for i in range(batch):
            keep[i, tokens - (i * tokens) // (2 * batch):] = 0
        torch._dynamo.mark_dynamic(x, 1)
        torch._dynamo.mark_dynamic(keep, 1)
        return m, (x, keep)
    return build


def dynamic_block(make, batch, tokens, dim, dyn_dim):
    """A block whose input has dim `dyn_dim` marked dynamic: every backend
    gets a graph with that size symbolic (as after torch.compile's
    recompile on a second batch size or sequence length), timed at the
    traced size."""
    def build(dev, dt):
        m = make().to(dev, dt).eval()
        x = torch.randn(batch, tokens, dim, device=dev, dtype=dt)
        torch._dynamo.mark_dynamic(x, dyn_dim)
        return m, (x,)
    return build


def attention(batch, tokens, dim, heads):
    def build(dev, dt):
        m = Attention(dim, heads).to(dev, dt)
        return m, (torch.randn(batch, tokens, dim, device=dev, dtype=dt),)
    return build


def encoder_layer(batch, tokens, dim, heads):
    def build(dev, dt):
        m = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0,
                                       batch_first=True).to(dev, dt)
        return m, (torch.randn(batch, tokens, dim, device=dev, dtype=dt),)
    return build


class BasicBlock(nn.Module):
    """ResNet's basic block (inference: batch norm folds to a scale and
    shift per channel)."""

    def __init__(self, ch):
        super().__init__()
        self.conv1 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(ch)
        self.conv2 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(ch)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


def conv_block(batch, ch, hw):
    def build(dev, dt):
        m = BasicBlock(ch).to(dev, dt).eval()
        return m, (torch.randn(batch, ch, hw, hw, device=dev, dtype=dt),)
    return build


class GPT(nn.Module):
    def __init__(self, vocab=256, dim=64, heads=4, layers=2, ctx=64):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(
            [nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0,
                                        batch_first=True, norm_first=True, bias=False)
             for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device)
        for blk in self.blocks:
            x = blk(x, src_mask=mask, is_causal=True)
        return self.head(self.norm(x))


def train_mlp(batch, dim):
    def build(dev, dt):
        m = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)).to(dev, dt)
        x = torch.randn(batch, dim, device=dev, dtype=dt)
        y = torch.randn(batch, dim, device=dev, dtype=dt)
        return _train_step(m, lambda out: F.mse_loss(out, y)), (x,)
    return build


def train_gpt(batch, ctx):
    def build(dev, dt):
        m = GPT(ctx=ctx).to(dev)
        idx = torch.randint(0, 256, (batch, ctx), device=dev)
        tgt = torch.randint(0, 256, (batch, ctx), device=dev)
        return _train_step(m, lambda out: F.cross_entropy(out.reshape(-1, 256), tgt.reshape(-1))), (idx,)
    return build


def _train_step(model, loss_fn):
    """A training step as one callable: forward, backward, Adam. The harness
    compiles the model (`step.model`) and the optimizer step
    (`step.compile_optimizer`) per backend, as torch.compile users do."""

    class Step:
        def __init__(self):
            self.model = model
            self.opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            self.opt_step = self.opt.step

        def compile_optimizer(self, compile_fn):
            self.opt_step = compile_fn(self.opt.step)

        def __call__(self, compiled, *inputs):
            # Inductor's CUDA graph trees (max-autotune, reduce-overhead on
            # CUDA) reuse their output memory on the next replay: a new step
            # is declared, and the loss leaves as a copy. No-ops elsewhere.
            torch.compiler.cudagraph_mark_step_begin()
            self.opt.zero_grad(set_to_none=True)
            loss = loss_fn(compiled(*inputs))
            loss.backward()
            self.opt_step()
            return loss.detach().clone()

    return Step()


def adam_step(layers, dim):
    """One Adam step over the parameters of `layers` linear + layer-norm
    blocks (4 tensors each), gradients fixed: the compiled optimizer step
    alone. Returns the first parameters for the check."""
    def build(dev, dt):
        m = nn.Sequential(*[nn.Sequential(nn.Linear(dim, dim), nn.LayerNorm(dim))
                            for _ in range(layers)]).to(dev, dt)
        for p in m.parameters():
            p.grad = torch.randn_like(p)
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        first = list(m.parameters())[:4]

        def step():
            opt.step()
            return [p.detach() for p in first]
        return step, ()
    return build


def suite(device: str) -> list[Case]:
    f32, bf16 = torch.float32, torch.bfloat16
    big = device == "cuda"
    # Memory-bound kernels move well over any last-level cache (64 MB per
    # tensor on the CPU), so the roofline compares against DRAM bandwidth.
    n_pw = (1 << 26) if big else (1 << 24)
    rows, cols = (16384, 4096) if big else (4096, 4096)
    mm_sizes = [(4096,) * 3, (2048,) * 3] if big else [(256,) * 3, (512,) * 3, (1024,) * 3]
    cases = [
        Case("pointwise_chain", "kernels", pointwise(n_pw), f32, flops=7 * n_pw,
             bytes=3 * n_pw * 4, quick=True, demo=True),
        Case("softmax", "kernels", softmax(rows, cols), f32, flops=5 * rows * cols,
             bytes=2 * rows * cols * 4, quick=True, demo=True),
        Case("layer_norm", "kernels", layernorm(rows, cols), f32, flops=8 * rows * cols,
             bytes=2 * rows * cols * 4, quick=True),
    ]
    for (m, k, n) in mm_sizes:
        for dt in (f32, bf16):
            cases.append(Case(f"matmul_{m}_{'f32' if dt is f32 else 'bf16'}", "kernels",
                              matmul(m, k, n), dt, flops=2.0 * m * n * k,
                              bytes=(m * k + k * n + m * n) * _esize(dt),
                              quick=(m == mm_sizes[0][0] and (dt is f32 or big))))
    if big:
        # f16 on the GPU's tensor cores, as bf16 (the CPU has no f16 kernel).
        m = k = n = 4096
        cases.append(Case("matmul_4096_f16", "kernels", matmul(m, k, n), torch.float16,
                          flops=2.0 * m * n * k, bytes=(m * k + k * n + m * n) * 2))
    m, k, n = (4096, 4096, 4096) if big else (512, 512, 1024)
    cases.append(Case("matmul_bias_gelu", "kernels", linear_gelu(m, k, n), f32,
                      flops=2.0 * m * n * k, bytes=(m * k + k * n + m * n) * 4))
    # A classifier head's shape: N = 1000 has no whole-vector divisor.
    m, k, n = (4096, 4096, 1000) if big else (256, 2048, 1000)
    cases.append(Case("matmul_ragged", "kernels", matmul(m, k, n), f32,
                      flops=2.0 * m * n * k, bytes=(m * k + k * n + m * n) * 4))
    m = k = n = 4096 if big else 512
    cases.append(Case("linear_dyn_bf16", "kernels", linear_dynamic(m, k, n), bf16,
                      flops=2.0 * m * n * k, bytes=(m * k + k * n + m * n) * 2))
    tokens, dim = (4096, 1024) if big else (256, 256)
    cases += [
        Case("mlp", "blocks", mlp_block(tokens, dim), f32, quick=True, demo=True),
        Case("attention", "blocks", attention(8 if big else 4, 512 if big else 128,
                                              dim, 8), f32),
        Case("transformer_layer", "blocks", encoder_layer(8 if big else 4, 512 if big else 128,
                                                          dim, 8), f32),
        Case("resnet_block", "blocks", conv_block(32 if big else 8, 64, 56), f32,
             flops=2 * 2.0 * (32 if big else 8) * 64 * 64 * 9 * 56 * 56),
        Case("train_mlp", "training", train_mlp(1024 if big else 128, dim), f32,
             train=True, quick=True),
        Case("train_gpt", "training", train_gpt(16 if big else 8, 256 if big else 64),
             f32, train=True),
    ]
    # Dynamic shapes (--groups dynamic; not in the default run's groups).
    b, t, d = (8, 512, dim) if big else (4, 128, dim)
    cases += [
        Case("attention_dyn_batch", "dynamic",
             dynamic_block(lambda: Attention(d, 8), b, t, d, 0), f32),
        Case("attention_dyn_len", "dynamic",
             dynamic_block(lambda: Attention(d, 8), b, t, d, 1), f32),
        Case("causal_dyn_len", "dynamic",
             dynamic_block(lambda: CausalAttention(d, 8), b, t, d, 1), f32),
        Case("gpt2_attention_dyn_len", "dynamic",
             dynamic_block(lambda: BufferCausalAttention(d, 8), b, t, d, 1), f32),
        Case("padded_attention_dyn_len", "dynamic", padded_dynamic(b, t, d, 8), f32),
        Case("encoder_dyn_len", "dynamic",
             dynamic_block(lambda: nn.TransformerEncoderLayer(d, 8, 4 * d, dropout=0.0,
                                                              batch_first=True), b, t, d, 1),
             f32),
    ]
    layers, dim = (24, 1024) if big else (8, 512)
    n = layers * (dim * dim + 3 * dim)
    # Per element: read param, grad and two moments, write three.
    cases += [
        Case("adam_step", "training", adam_step(layers, dim), f32, bytes=7 * 4 * n),
    ]
    # Whole models (--groups models; not in the default run's groups).
    from . import zoo
    cases += [Case(name, "models", zoo.build(name), f32) for name in zoo.MODELS]
    return cases
