"""Whole models for kiln-bench's `models` group (not in the default run:
`--groups models`): small versions of the architectures users compile,
written here so the bench needs no torchvision or transformers. Inference,
random weights, batch 2.

- resnet18: torchvision's ResNet-18 layout (7x7 stem, max pool, eight
  basic blocks, average pool, classifier), 224 x 224.
- mobilenet_v2: MobileNetV2's inverted residuals (1x1 expand, 3x3
  depthwise, 1x1 project, ReLU6), 224 x 224.
- vit_tiny: a ViT's 16 x 16 patch embedding (a convolution whose kernel is
  its stride), class token and positions, four pre-norm encoder layers of
  width 192 over 197 tokens (a key length with no whole vector of 16).
- gpt2_small: four GPT-2 blocks of width 384 (causal SDPA, tanh GELU),
  token and position embeddings, a tied 5000-word head, 128 tokens.
- llama_tiny: four Llama blocks of width 256 (RMSNorm, rotary embeddings,
  grouped-query causal SDPA, SiLU-gated MLP), 128 tokens.
- unet_small: two levels down (conv, batch norm, relu, max pool) and up
  (ConvTranspose2d(k=2, s=2), skip cats), 128 x 128.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def conv_bn(ci, co, k=3, s=1, groups=1, act=nn.ReLU):
    return nn.Sequential(nn.Conv2d(ci, co, k, s, k // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(co), act() if act else nn.Identity())


class BasicBlock(nn.Module):
    def __init__(self, ci, co, stride):
        super().__init__()
        self.c1 = conv_bn(ci, co, 3, stride)
        self.c2 = conv_bn(co, co, 3, 1, act=None)
        self.short = (nn.Identity() if stride == 1 and ci == co
                      else conv_bn(ci, co, 1, stride, act=None))

    def forward(self, x):
        return F.relu(self.c2(self.c1(x)) + self.short(x))


class ResNet18(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1))
        blocks, ci = [], 64
        for co, stride in [(64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1),
                           (512, 2), (512, 1)]:
            blocks.append(BasicBlock(ci, co, stride))
            ci = co
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1)
        return self.fc(torch.flatten(x, 1))


class InvertedResidual(nn.Module):
    def __init__(self, ci, co, stride, expand):
        super().__init__()
        h = ci * expand
        self.body = nn.Sequential(conv_bn(ci, h, 1, act=nn.ReLU6),
                                  conv_bn(h, h, 3, stride, groups=h, act=nn.ReLU6),
                                  conv_bn(h, co, 1, act=None))
        self.residual = stride == 1 and ci == co

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        layers, ci = [conv_bn(3, 32, 3, 2, act=nn.ReLU6)], 32
        for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                           (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
            for i in range(n):
                layers.append(InvertedResidual(ci, c, s if i == 0 else 1, t))
                ci = c
        layers.append(conv_bn(ci, 1280, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(1280, classes)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


class ViT(nn.Module):
    def __init__(self, dim=192, depth=4, heads=3, patch=16, image=224, classes=1000):
        super().__init__()
        self.patches = nn.Conv2d(3, dim, patch, patch)
        n = (image // patch) ** 2
        self.cls = nn.Parameter(torch.randn(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patches(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.head(self.norm(self.encoder(x))[:, 0])


class GPT2Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, 2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, vocab=5000, dim=384, depth=4, heads=6, context=256):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
        self.blocks = nn.Sequential(*[GPT2Block(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.norm(self.blocks(x)))


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, dim=256, heads=8, kv_heads=2, hidden=688):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.n1, self.n2 = RMSNorm(dim), RMSNorm(dim)
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.v = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.n1(x)
        q = self.q(h).view(B, T, self.heads, self.hd).transpose(1, 2)
        k = self.k(h).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v(h).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k = k.repeat_interleave(self.heads // self.kv_heads, 1)
        v = v.repeat_interleave(self.heads // self.kv_heads, 1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, vocab=4000, dim=256, depth=4, context=512):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList([LlamaBlock(dim) for _ in range(depth)])
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        hd = self.blocks[0].hd
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        f = torch.outer(torch.arange(context).float(), inv)
        f = torch.cat([f, f], -1)
        self.register_buffer("cos", f.cos())
        self.register_buffer("sin", f.sin())

    def forward(self, idx):
        T = idx.shape[1]
        x, cos, sin = self.embed(idx), self.cos[:T], self.sin[:T]
        for b in self.blocks:
            x = b(x, cos, sin)
        return self.head(self.norm(x))


class UNetSmall(nn.Module):
    def __init__(self, c=32):
        super().__init__()
        self.d1 = nn.Sequential(conv_bn(3, c), conv_bn(c, c))
        self.d2 = nn.Sequential(conv_bn(c, 2 * c), conv_bn(2 * c, 2 * c))
        self.mid = nn.Sequential(conv_bn(2 * c, 4 * c), conv_bn(4 * c, 4 * c))
        self.up2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, 2)
        self.u2 = nn.Sequential(conv_bn(4 * c, 2 * c), conv_bn(2 * c, 2 * c))
        self.up1 = nn.ConvTranspose2d(2 * c, c, 2, 2)
        self.u1 = nn.Sequential(conv_bn(2 * c, c), conv_bn(c, c))
        self.out = nn.Conv2d(c, 2, 1)

    def forward(self, x):
        a = self.d1(x)
        b = self.d2(F.max_pool2d(a, 2))
        m = self.mid(F.max_pool2d(b, 2))
        y = self.u2(torch.cat([self.up2(m), b], 1))
        return self.out(self.u1(torch.cat([self.up1(y), a], 1)))


def _images(size):
    def inputs(dev, dt):
        return (torch.randn(2, 3, size, size, device=dev, dtype=dt),)
    return inputs


def _tokens(vocab, length):
    def inputs(dev, dt):
        return (torch.randint(0, vocab, (2, length), device=dev),)
    return inputs


# name -> (model class, inputs(device, dtype))
MODELS = {
    "resnet18": (ResNet18, _images(224)),
    "mobilenet_v2": (MobileNetV2, _images(224)),
    "vit_tiny": (ViT, _images(224)),
    "gpt2_small": (GPT2, _tokens(5000, 128)),
    "llama_tiny": (Llama, _tokens(4000, 128)),
    "unet_small": (UNetSmall, _images(128)),
}


def randomize_batch_norms(model):
    """Running statistics as a trained model's (mean about 0, variance
    0.5-1.5), not the identity of a fresh BatchNorm2d."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model


def build(name):
    """A Case's build function: the model in eval mode on the device (batch
    norms with random statistics), and its inputs."""
    make, inputs = MODELS[name]

    def b(dev, dt):
        torch.manual_seed(0)
        return randomize_batch_norms(make()).to(dev, dt).eval(), inputs(dev, dt)
    return b
