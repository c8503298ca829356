"""Models compiled with backend="kiln" (the registered entry point) against
eager, forward and backward."""

import copy
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from kiln_bench.cases import Attention as BenchAttention  # q @ k^T, softmax, @ v written out

from conftest import TOL

import kiln.backend


def check_close(got, want):
    torch.testing.assert_close(got, want, **TOL[want.dtype])


def _avx512f() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512f" in line for line in f)
    except OSError:
        return False


def mlp():
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 16), nn.ReLU())


class Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x * 2.0, dim=-1) + torch.log_softmax(x, dim=0)


class ConvBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2)

    def forward(self, x):
        return torch.relu(self.conv2(torch.relu(self.conv1(x)))).mean(dim=(2, 3))


CASES = [
    ("mlp", mlp, (8, 32)),
    ("layernorm", lambda: nn.LayerNorm(48), (4, 7, 48)),
    ("softmax", Softmax, (6, 33)),
    ("conv", ConvBlock, (2, 3, 12, 12)),
    ("transformer", lambda: nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0,
                                                      batch_first=True), (2, 9, 32)),
]


@pytest.mark.parametrize("name,make,shape", CASES, ids=[c[0] for c in CASES])
def test_forward_and_backward(name, make, shape):
    model = make()
    x = torch.randn(*shape)
    compiled = torch.compile(model, backend="kiln")
    y = compiled(x)
    check_close(y, model(x))
    # Backward through kiln's backward graph.
    xg = x.clone().requires_grad_()
    compiled(xg).sum().backward()
    grads_kiln = [p.grad.clone() for p in model.parameters()] + [xg.grad]
    model.zero_grad()
    xe = x.clone().requires_grad_()
    model(xe).sum().backward()
    grads_eager = [p.grad for p in model.parameters()] + [xe.grad]
    for g, w in zip(grads_kiln, grads_eager):
        torch.testing.assert_close(g, w, atol=1e-3, rtol=1e-3)


LAYER_NORMS = [
    # [B, T, C] of 1 MB: the backward in blocks of rows (kiln_lower_layer_norm_backward)
    ("rows", dict(), (8, 64, 512)),
    # rows not a multiple of the block: blocks of 4 rows
    ("odd_rows", dict(), (5, 52, 1024)),
    ("small", dict(), (3, 5, 40)),
    # no weight and bias: PyTorch's decomposition, kiln's elementwise ops
    ("no_affine", dict(elementwise_affine=False), (4, 16, 64)),
]


@pytest.mark.parametrize("name,kw,shape", LAYER_NORMS, ids=[c[0] for c in LAYER_NORMS])
def test_layer_norm_training_in_kiln(name, kw, shape):
    """The layer norm's forward and backward are kiln's (fallback="error"),
    its input, weight and bias gradients as eager's, over a few steps with
    fresh inputs and gradients."""
    torch.manual_seed(0)
    model = nn.LayerNorm(shape[-1], **kw)
    if kw.get("elementwise_affine", True):
        with torch.no_grad():
            model.weight.normal_()
            model.bias.normal_()
    compiled = torch.compile(model, backend="kiln", options={"fallback": "error"})
    for _ in range(2):
        x = torch.randn(*shape) * 3 + 1
        dy = torch.randn(*shape)
        xk = x.clone().requires_grad_()
        compiled(xk).backward(dy)
        got = [xk.grad] + [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        xe = x.clone().requires_grad_()
        model(xe).backward(dy)
        want = [xe.grad] + [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        for g, w in zip(got, want):
            # (weight and bias gradients sum over every row: atol scales with them)
            torch.testing.assert_close(g, w, atol=2e-4 * max(1.0, w.abs().max().item()),
                                       rtol=1e-4)


def test_bf16_autocast():
    model = mlp()
    x = torch.randn(8, 32)
    compiled = torch.compile(model, backend="kiln")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = compiled(x)
        want = model(x)
    assert got.dtype == torch.bfloat16
    check_close(got, want)


@pytest.mark.parametrize("n", [64, 72, 70])
def test_bf16_linear_with_a_symbolic_batch(n):
    """A bf16 linear layer under dynamic shapes: M symbolic, K and N the
    weight's. On CPUs with AVX512-BF16 it takes the microkernel with row
    blocks sized at run time (batches not a multiple of its 8-row tile
    included) and, for N not a multiple of 32, a zero-padded packed weight
    and a masked last panel; with AMX, 32-row tiles on the tile unit first
    (m = 203 and 300: blocks of 56 and 80 rows); elsewhere the generic
    contraction."""
    torch.manual_seed(0)
    lin = nn.Linear(96, n, bias=False).to(torch.bfloat16)
    compiled = torch.compile(lin, backend="kiln", dynamic=True)
    with torch.no_grad():
        for m in (1, 7, 64, 203, 300):
            x = torch.randn(m, 96, dtype=torch.bfloat16)
            check_close(compiled(x), lin(x))


def test_strided_input():
    model = mlp()
    x = torch.randn(32, 16).t()  # non-contiguous view
    compiled = torch.compile(model, backend="kiln")
    check_close(compiled(x), model(x))


def test_transformer_layer_with_dynamic_shapes():
    """Batch and sequence symbolic (torch.compile(dynamic=True), or a frame
    Dynamo made dynamic after a recompile): q, k and v are unsqueezed and
    squeezed views with two symbolic sizes, which once crashed MLIR's
    expand-strided-metadata inside the process."""
    torch.manual_seed(0)
    # (train mode: the layer takes its composite path, not the fused eval kernel)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    compiled = torch.compile(layer, backend="kiln", dynamic=True)
    with torch.no_grad():
        for b, t in ((2, 8), (3, 5), (4, 16)):
            x = torch.randn(b, t, 32)
            torch.testing.assert_close(compiled(x), layer(x), **TOL[torch.float32])


ENCODER_LAYERS = [
    ("relu_post_norm", dict()),
    ("gelu_pre_norm", dict(activation="gelu", norm_first=True)),
]


@pytest.mark.parametrize("name,kw", ENCODER_LAYERS, ids=[c[0] for c in ENCODER_LAYERS])
def test_encoder_layer_fast_path_runs_in_kiln(name, kw):
    """nn.TransformerEncoderLayer in eval mode without gradients takes
    PyTorch's fast path, one op for the whole layer
    (aten._transformer_encoder_layer_fwd); kiln decomposes it into the
    layer's math (backend._encoder_layer_fwd) and compiles all of it
    (fallback="error"); fresh random inputs, two batch sizes (static here;
    test_dynamic_batch_runs_in_kiln takes the symbolic batch)."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, **kw).eval()
    compiled = torch.compile(layer, backend="kiln", dynamic=False,
                             options={"fallback": "error"})
    with torch.no_grad():
        for b, t in ((2, 16), (3, 16)):
            x = torch.randn(b, t, 32)
            torch.testing.assert_close(compiled(x), layer(x), **TOL[torch.float32])


class BufferCausalAttention(nn.Module):
    """GPT-2's (nanoGPT's) attention: the causal mask a registered buffer,
    cut to the sequence length (`bias[:, :, :t, :t]`), masked_fill, softmax."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(64, 192)
        self.register_buffer("bias", torch.tril(torch.ones(256, 256)).view(1, 1, 256, 256))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 16).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * 0.25
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        y = torch.softmax(att, dim=-1) @ v
        return y.transpose(1, 2).reshape(b, t, d)


class HFCausalAttention(BufferCausalAttention):
    """HuggingFace GPT-2's eager attention: a bool tril buffer, and
    torch.where(causal, scores, finfo.min) in place of -inf."""

    def __init__(self):
        super().__init__()
        self.bias = self.bias.bool()

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 16).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * 0.25
        att = torch.where(self.bias[:, :, :t, :t], att, torch.finfo(att.dtype).min)
        y = torch.softmax(att, dim=-1) @ v
        return y.transpose(1, 2).reshape(b, t, d)


DYNAMIC_BATCH = [
    ("attention", lambda: BenchAttention(64, 4)),
    ("encoder_layer", lambda: nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0,
                                                         batch_first=True).eval()),
]
# With the length dynamic also GPT-2's causal buffer sliced to the length (a
# slice whose end is a size, checked at each call against the buffer), with
# masked_fill's -inf and with HuggingFace's where and finfo.min.
DYNAMIC_LENGTH = DYNAMIC_BATCH + [("buffer_masked_fill", BufferCausalAttention),
                                  ("buffer_where_finfo_min", HFCausalAttention)]


@pytest.mark.parametrize("name,make", DYNAMIC_BATCH, ids=[c[0] for c in DYNAMIC_BATCH])
def test_dynamic_batch_runs_in_kiln(name, make, capfd, monkeypatch):
    """A second batch size makes Dynamo recompile the frame with the batch
    symbolic (automatic dynamic shapes): the projections' views then have
    sizes like 16*s0 (rows) and 4*s0 (heads), which kiln's graph states as
    derived sizes (lib/graph/symbols.c). Every tensor op is kiln's
    (fallback="error"; the size arithmetic stays Python's), one symbolic
    variant serves the later batch sizes, and each call equals eager on
    fresh random inputs."""
    monkeypatch.setenv("KILN_LOG", "recompiles")
    torch.manual_seed(0)
    model = make()
    compiled = torch.compile(model, backend="kiln", options={"fallback": "error"})
    with torch.no_grad():
        for b in (2, 3, 5, 1, 3):
            x = torch.randn(b, 16, 64)
            torch.testing.assert_close(compiled(x), model(x), **TOL[torch.float32])
    err = capfd.readouterr().err
    # A variant with the batch symbolic and sizes derived from it
    # ("s77=? 16*s77=? 4*s77=?").
    symbolic = [l for l in err.splitlines()
                if l.startswith("[kiln recompiles]") and "=?" in l and "*" in l]
    assert symbolic, err


@pytest.mark.parametrize("name,make", DYNAMIC_LENGTH, ids=[c[0] for c in DYNAMIC_LENGTH])
def test_dynamic_length_runs_in_kiln(name, make):
    """Sequence lengths that change (16, then 24: Dynamo recompiles with the
    length symbolic, then 7, 33 and 130) run wholly in kiln: the fused
    attention kernel counts its blocks of query rows at run time and masks
    the keys past a length that is no multiple of 16 (lowering/ops/
    attention.c). Equal to eager on fresh random inputs."""
    torch.manual_seed(0)
    model = make()
    compiled = torch.compile(model, backend="kiln", options={"fallback": "error"})
    with torch.no_grad():
        for t in (16, 24, 7, 33, 130):
            x = torch.randn(2, t, 64)
            torch.testing.assert_close(compiled(x), model(x), **TOL[torch.float32])


MASKS = ["padding", "causal", "finite"]


@pytest.mark.parametrize("which", MASKS)
def test_encoder_layer_fast_path_with_masks_runs_in_kiln(which):
    """The fast path with a key padding mask (a padded sequence: PyTorch
    passes it as a [B, L] float mask, mask_type 1) or a causal src_mask
    (expanded to [B, H, L, L], mask_type 2), or a float src_mask of
    finite values, which the fused op applies as a mask (nonzero hides
    the key; added to the scores it differed by 0.77): kiln's, all of it,
    and equal to eager."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 16, 32)
    pad = torch.zeros(2, 16, dtype=torch.bool)
    pad[1, 12:] = True
    causal = nn.Transformer.generate_square_subsequent_mask(16)
    finite = torch.triu(torch.full((16, 16), -0.5), 1)
    kw = {"padding": dict(src_key_padding_mask=pad), "causal": dict(src_mask=causal),
          "finite": dict(src_mask=finite)}[which]
    compiled = torch.compile(lambda x: layer(x, **kw), backend="kiln",
                             options={"fallback": "error"})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), layer(x, **kw), **TOL[torch.float32])


class Attention(nn.Module):
    """SDPA as models call it; on the CPU it dispatches to the flash op."""

    def __init__(self, mask=None, causal=False, scale=None):
        super().__init__()
        self.mask, self.causal, self.scale = mask, causal, scale

    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=self.mask, is_causal=self.causal, scale=self.scale) * 2.0


ATTENTION = [
    ("plain", dict(), torch.float32),
    ("causal", dict(causal=True), torch.float32),
    ("float_mask", dict(mask=torch.randn(7, 5)), torch.float32),
    ("scale", dict(scale=0.3), torch.float32),
]


class ProjectedAttention(nn.Module):
    """q, k and v split off one projection, SDPA, the heads merged."""

    def __init__(self, causal):
        super().__init__()
        self.causal = causal
        self.qkv = nn.Linear(64, 192)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 16).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return y.transpose(1, 2).reshape(b, t, d)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_attention_with_dynamic_length_runs_in_kiln(causal):
    """SDPA (plain and is_causal) with the sequence length symbolic after a
    second length: kiln's fused kernel, the causal positions as kiln.arange
    of the symbolic length (fallback="error"); lengths across 16 and 128,
    equal to eager. (q, k and v as separate inputs would each have a length
    symbol of its own: kiln leaves that SDPA to PyTorch.)"""
    torch.manual_seed(0)
    model = ProjectedAttention(causal)
    compiled = torch.compile(model, backend="kiln", options={"fallback": "error"})
    with torch.no_grad():
        for t in (16, 24, 5, 33, 140):
            x = torch.randn(2, t, 64)
            torch.testing.assert_close(compiled(x), model(x), **TOL[torch.float32])


@pytest.mark.parametrize("cin,cout,kernel,bias", [(64, 32, 2, True), (8, 5, (2, 3), False)],
                         ids=["unet_up", "rect_nobias"])
def test_transposed_convolution_kernel_equal_to_stride_runs_in_kiln(cin, cout, kernel, bias):
    """ConvTranspose2d with the kernel equal to the stride (a UNet's
    upsampling) is kiln's (fallback="error": a matmul and a permute), equal
    to eager, with a second batch size (a symbolic batch) too."""
    torch.manual_seed(0)
    model = nn.ConvTranspose2d(cin, cout, kernel, stride=kernel, bias=bias)
    compiled = torch.compile(model, backend="kiln", options={"fallback": "error"})
    with torch.no_grad():
        for n in (2, 3, 5):
            x = torch.randn(n, cin, 7, 5)
            check_close(compiled(x), model(x))


def _linalg_of_fresh_process(script, tmp_path):
    """Runs `script` in a fresh Python with KILN_DUMP_DIR set (kiln reads it
    when its context is made) and the fused attention kernel allowed;
    returns the text of every partition's dumped linalg stage."""
    import subprocess
    import sys
    env = dict(os.environ, KILN_DUMP_DIR=str(tmp_path / "dump"),
               KILN_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("KILN_ATTENTION", None)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return [p.read_text() for p in (tmp_path / "dump").glob("*-1-linalg.mlir")]


def _kiln_texts(monkeypatch):
    """The graph text of every partition kiln compiles from here on."""
    texts = []
    init = kiln.backend.CompiledSubgraph.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        texts.append(self.text)
    monkeypatch.setattr(kiln.backend.CompiledSubgraph, "__init__", record)
    return texts


@pytest.mark.parametrize("shape,kernel,bias", [((2, 3, 32, 32), 8, True),
                                               ((2, 3, 37, 35), (4, 5), False),
                                               ((4, 64, 3, 3), 1, True)],
                         ids=["vit_patches", "ragged_nobias", "small_map_1x1"])
def test_patch_embedding_convolution_is_a_matmul(shape, kernel, bias, monkeypatch):
    """A convolution whose kernel equals its stride (a ViT's patch
    embedding; a 1x1 one on a map of a few pixels) is kiln's as one matmul
    over the patches (translate.py _patches): no convolution in the
    partition; the rows and columns past
    the last whole patch are dropped, as PyTorch's convolution drops them.
    Against eager, with a second batch size (a symbolic batch) too."""
    texts = _kiln_texts(monkeypatch)
    torch.manual_seed(0)
    model = nn.Conv2d(shape[1], 24, kernel, stride=kernel, bias=bias)
    compiled = torch.compile(model, backend="kiln", options={"fallback": "error"})
    with torch.no_grad():
        for n in (shape[0], 3, 5):
            x = torch.randn(n, *shape[1:])
            check_close(compiled(x), model(x))
    assert texts and not any("aten.convolution" in t for t in texts)
    assert all("aten.mm" in t or "aten.addmm" in t for t in texts)


class OddLengthAttention(nn.Module):
    """SDPA over a key length with no whole vector of 16 (197: a ViT's
    patches and class token), causal where `kind` says so, with the float
    mask given (or none)."""

    def __init__(self, kind="none"):
        super().__init__()
        self.kind = kind

    def forward(self, q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                              is_causal=self.kind == "causal")


@pytest.mark.parametrize("kind,L,S", [("none", 197, 197), ("causal", 197, 197),
                                      ("padding", 50, 197), ("rows", 197, 77),
                                      ("none", 20, 5)])
def test_odd_key_length_attention_against_eager(kind, L, S, monkeypatch):
    """Attention over a static key length that is not whole vectors of 16:
    K and V get zero keys up to the next 16 and those keys a -inf mask
    (translate.py _sdpa_cpu), so the fused kernel takes it; the user's
    mask is padded with -inf or added to the key mask. Against eager, all
    in kiln; on AVX-512 hosts the partition pads its keys (aten.full)."""
    texts = _kiln_texts(monkeypatch)
    torch.manual_seed(0)
    model = OddLengthAttention(kind)
    compiled = torch.compile(model, backend="kiln", options={"fallback": "error"})
    with torch.no_grad():
        for _ in range(2):
            q = torch.randn(2, 3, L, 64)
            k, v = torch.randn(2, 3, S, 64), torch.randn(2, 3, S, 64)
            mask = None
            if kind == "padding":  # [B, 1, 1, S]: batch 1's last 7 keys masked
                mask = torch.zeros(2, 1, 1, S)
                mask[1, ..., S - 7:] = float("-inf")
            elif kind == "rows":  # [B, 1, L, 1]: a bias per query row
                mask = torch.randn(2, 1, L, 1)
            args = (q, k, v) if mask is None else (q, k, v, mask)
            check_close(compiled(*args), model(*args))
    if _avx512f():
        assert any("aten.full" in t and "aten.bmm" in t for t in texts)


@pytest.mark.skipif(not _avx512f(), reason="the fused attention kernel needs AVX-512")
def test_odd_key_length_attention_compiles_to_the_fused_kernel(tmp_path):
    """At 197 keys the attention reaches the fused kernel: no batch matmul
    left in the partition's linalg. In a fresh process, for
    KILN_DUMP_DIR."""
    import inspect
    import textwrap
    script = ("import torch\nfrom torch import nn\nimport torch.nn.functional as F\n" +
              inspect.getsource(OddLengthAttention))
    script += textwrap.dedent("""
        torch.manual_seed(0)
        m = OddLengthAttention()
        q, k, v = (torch.randn(2, 3, 197, 64) for _ in range(3))
        with torch.no_grad():
            got = torch.compile(m, backend="kiln", options={"fallback": "error"})(q, k, v)
            torch.testing.assert_close(got, m(q, k, v), atol=2e-4, rtol=2e-4)
    """)
    linalg = _linalg_of_fresh_process(script, tmp_path)
    assert linalg, "no linalg dumped"
    assert not any("linalg.batch_matmul" in t for t in linalg)


def test_overlapping_transposed_convolution_stays_in_pytorch():
    """A transposed convolution whose taps overlap (kernel 4, stride 2,
    padding 1: a DCGAN's) is PyTorch's; the result is still right."""
    torch.manual_seed(0)
    model = nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1)
    with torch.no_grad():
        x = torch.randn(2, 8, 6, 6)
        check_close(torch.compile(model, backend="kiln")(x), model(x))
        strict = torch.compile(model, backend="kiln", options={"fallback": "error"})
        with pytest.raises(Exception, match="transposed convolution with kernel 4x4"):
            strict(x)


class PaddedAttention(nn.Module):
    """A BERT-style self-attention: SDPA with an additive padding mask
    [B, 1, 1, T] made from a [B, T] 0/1 attention mask."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(64, 192)

    def forward(self, x, keep):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 16).permute(2, 0, 3, 1, 4)
        mask = (1.0 - keep[:, None, None, :].to(x.dtype)) * -10000.0
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return y.transpose(1, 2).reshape(b, t, d)


@pytest.mark.skipif(not _avx512f(), reason="the fused attention kernel needs AVX-512")
def test_per_head_bias_attention_with_dynamic_batch_runs_in_kiln():
    """SDPA with a float bias per batch and head ([B, H, T, T], as ALiBi or
    a relative-position bias gives) under a dynamic batch and length: the
    fused kernel's mask offsets take the batch's symbolic stride
    (fallback="error"); equal to eager."""
    torch.manual_seed(0)
    qkv = nn.Linear(64, 192)

    def fn(x, bias):
        b, t, d = x.shape
        q, k, v = qkv(x).view(b, t, 3, 4, 16).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return y.transpose(1, 2).reshape(b, t, d)

    compiled = torch.compile(fn, backend="kiln", options={"fallback": "error"})
    with torch.no_grad():
        for b, t in [(2, 16), (3, 24), (1, 5), (4, 33)]:
            x, bias = torch.randn(b, t, 64), torch.randn(b, 4, t, t)
            check_close(compiled(x, bias), fn(x, bias))


@pytest.mark.skipif(not _avx512f(), reason="the fused attention kernel needs AVX-512")
@pytest.mark.parametrize("dynamic_batch", [False, True], ids=["length", "batch_and_length"])
def test_padding_mask_attention_with_dynamic_sizes_runs_in_kiln(dynamic_batch):
    """SDPA with a padding mask under a dynamic sequence length (and batch):
    the fused kernel reads the mask with symbolic strides; fallback="error"
    fails if that SDPA or the mask's slice is left to PyTorch. Equal to
    eager, each batch row padded at a different length."""
    torch.manual_seed(0)
    model = PaddedAttention()
    compiled = torch.compile(model, backend="kiln", options={"fallback": "error"})
    shapes = [(2, 16), (2, 24), (2, 5), (2, 33), (2, 140)]
    if dynamic_batch:
        shapes = [(2, 16), (3, 24), (1, 5), (4, 33), (3, 140)]
    with torch.no_grad():
        for b, t in shapes:
            x = torch.randn(b, t, 64)
            keep = torch.ones(b, t)
            for i in range(b):
                keep[i, t - (i * t) // 3:] = 0
            check_close(compiled(x, keep), model(x, keep))


@pytest.mark.parametrize("name,kw,dtype", ATTENTION, ids=[a[0] for a in ATTENTION])
def test_attention_inference_runs_in_kiln(name, kw, dtype):
    """Inference attention is kiln's (fallback="error" fails on any node
    left to PyTorch), on fresh random inputs, L != S."""
    torch.manual_seed(0)
    q = torch.randn(2, 3, 7, 8, dtype=dtype)
    k, v = torch.randn(2, 3, 5, 8, dtype=dtype), torch.randn(2, 3, 5, 8, dtype=dtype)
    if "mask" in kw:
        kw = dict(kw, mask=kw["mask"].to(dtype))
    model = Attention(**kw)
    compiled = torch.compile(model, backend="kiln", options={"fallback": "error"})
    with torch.no_grad():
        check_close(compiled(q, k, v), model(q, k, v))


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_grouped_query_attention_runs_in_kiln(causal):
    """SDPA with enable_gqa (6 query heads over 2 key and value heads, as
    Llama-style models call it): kiln's (keys and values expanded over
    their query heads), equal to eager."""
    torch.manual_seed(0)
    q = torch.randn(2, 6, 16, 8)
    k, v = torch.randn(2, 2, 16, 8), torch.randn(2, 2, 16, 8)

    def fn(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal, enable_gqa=True)

    compiled = torch.compile(fn, backend="kiln", options={"fallback": "error"})
    with torch.no_grad():
        check_close(compiled(q, k, v), fn(q, k, v))


def test_bf16_batched_matmuls_run_in_kiln():
    """The bench's attention block in bf16 (q @ k^T, softmax and @ v as
    written out, not SDPA): its batched matmuls take the bf16 microkernel's
    batched form; all of it is kiln's and matches eager."""
    torch.manual_seed(0)
    model = BenchAttention(64, 2).to(torch.bfloat16).eval()
    x = torch.randn(2, 32, 64, dtype=torch.bfloat16)
    compiled = torch.compile(model, backend="kiln", options={"fallback": "error"})
    with torch.no_grad():
        check_close(compiled(x), model(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_half_attention_stays_pytorchs_flash_kernel(capfd, monkeypatch, dtype):
    """bf16 and f16 attention, which kiln's fused kernel does not take,
    stays PyTorch's flash kernel (faster than kiln's op-by-op form) and the
    ops around it kiln's; the result matches eager."""
    monkeypatch.setenv("KILN_LOG", "fallbacks")
    torch.manual_seed(0)
    q = torch.randn(2, 3, 7, 8, dtype=dtype)
    k, v = torch.randn(2, 3, 5, 8, dtype=dtype), torch.randn(2, 3, 5, 8, dtype=dtype)
    model = Attention()
    with torch.no_grad():
        check_close(torch.compile(model, backend="kiln")(q, k, v), model(q, k, v))
    err = capfd.readouterr().err
    name = "bf16" if dtype is torch.bfloat16 else "f16"
    assert f"{name} attention: kiln's fused kernel takes f32" in err, err
    assert "mul runs in PyTorch" not in err, err  # the scaling after it is kiln's


def test_attention_training_compiles_math_form(capfd, monkeypatch):
    """A training graph's causal attention is traced in its math form
    (backend._hook_attention): kiln compiles it, forward and backward (no
    fallback reported), and the gradients match eager's flash kernels."""
    monkeypatch.setenv("KILN_LOG", "fallbacks")
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 6, 8, requires_grad=True) for _ in range(3))
    model = Attention(causal=True)
    compiled = torch.compile(model, backend="kiln")
    compiled(q, k, v).square().sum().backward()
    got = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    model(q, k, v).square().sum().backward()
    for g, t in zip(got, (q, k, v)):
        torch.testing.assert_close(g, t.grad, atol=1e-4, rtol=1e-4)
    err = capfd.readouterr().err
    assert "runs in PyTorch" not in err, err


def test_sdpa_with_large_scores_stays_pytorchs_unless_fused(capfd, monkeypatch):
    """Attention whose [B*H, L, S] scores kiln would write out (a call its
    fused kernel does not take: f64) stays PyTorch's flash kernel above
    translate's score-size limit, here lowered to 1 KiB; a call the kernel
    takes (f32, 40 keys padded to 48, AVX-512) stays kiln's. Both match
    eager."""
    from kiln import translate
    monkeypatch.setattr(translate, "_SDPA_SCORES_BYTES", 1024)
    monkeypatch.setenv("KILN_LOG", "fallbacks")
    torch.manual_seed(0)
    q = torch.randn(1, 2, 24, 32, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 40, 32, dtype=torch.float64) for _ in range(2))
    model = Attention()
    with torch.no_grad():
        check_close(torch.compile(model, backend="kiln", dynamic=False)(q, k, v), model(q, k, v))
    err = capfd.readouterr().err
    assert "scores (0 MiB) would be written out" in err, err
    if _avx512f():
        q = q.float()
        k, v = torch.randn(1, 2, 40, 32), torch.randn(1, 2, 40, 32)
        compiled = torch.compile(model, backend="kiln", dynamic=False,
                                 options={"fallback": "error"})
        with torch.no_grad():
            check_close(compiled(q, k, v), model(q, k, v))


class CrossAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.mha = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x, mem):
        return self.mha(x, mem, mem, need_weights=False)[0]


ATTENTION_BLOCKS = [
    # 128 tokens, heads of 32: whole 8-row tiles, a task per head.
    ("heads", lambda: BenchAttention(64, 2), [(2, 128, 64)]),
    # heads of 48 (keys and columns 32 + 16), 48 tokens.
    ("heads48", lambda: BenchAttention(96, 2), [(2, 48, 96)]),
    # 37 queries against 48 keys: a last tile of 5 rows.
    ("cross", lambda: CrossAttention(64, 2), [(2, 37, 64), (2, 48, 64)]),
    ("encoder", lambda: nn.TransformerEncoderLayer(64, 2, 128, dropout=0.0,
                                                   batch_first=True), [(2, 64, 64)]),
]


@pytest.mark.parametrize("name,make,shapes", ATTENTION_BLOCKS, ids=[a[0] for a in ATTENTION_BLOCKS])
def test_attention_blocks_against_eager(name, make, shapes):
    """Inference attention blocks (on AVX-512 hosts through the fused
    attention kernel, lowering/ops/attention.c; lit's cpu-attention checks
    that it is emitted) against eager on fresh random inputs, all in kiln.
    In training mode (no dropout) under no_grad, as the bench runs them: in
    eval mode PyTorch's fused encoder and attention ops take over."""
    torch.manual_seed(0)
    model = make()
    compiled = torch.compile(model, backend="kiln", options={"fallback": "error"})
    with torch.no_grad():
        for _ in range(2):
            xs = [torch.randn(s) for s in shapes]
            check_close(compiled(*xs), model(*xs))


@pytest.mark.skipif(not _avx512f(), reason="the fused attention kernel needs AVX-512")
def test_attention_block_compiles_to_the_fused_kernel(tmp_path):
    """The bench's attention block, torch.compile'd, reaches the fused
    kernel: its partition's linalg has no batch matmul left, and K^T is made
    per task (the kernel's 16 x 16 transposes). In a fresh process, so that
    KILN_DUMP_DIR (read when kiln's context is made) takes effect."""
    import textwrap
    script = textwrap.dedent(f"""
        import sys, torch
        from kiln_bench.cases import Attention
        torch.manual_seed(0)
        m = Attention(64, 2)
        x = torch.randn(2, 128, 64)
        with torch.no_grad():
            got = torch.compile(m, backend="kiln", options={{"fallback": "error"}})(x)
            torch.testing.assert_close(got, m(x), atol=2e-4, rtol=2e-4)
    """)
    linalg = _linalg_of_fresh_process(script, tmp_path)
    assert linalg, "no linalg dumped"
    assert not any("linalg.batch_matmul" in t for t in linalg)
    assert any("vector.transpose" in t for t in linalg)


@pytest.mark.skipif(not _avx512f(), reason="the fused attention kernel needs AVX-512")
def test_buffer_mask_attention_compiles_to_the_fused_kernel(tmp_path):
    """GPT-2's masked_fill of its causal buffer reaches the fused kernel as
    a boolean mask (no batch matmul left in the partition's linalg), at a
    static and then a dynamic length. In a fresh process, for
    KILN_DUMP_DIR."""
    import inspect
    import textwrap
    script = "import torch\nfrom torch import nn\n" + inspect.getsource(BufferCausalAttention)
    script += textwrap.dedent("""
        torch.manual_seed(0)
        m = BufferCausalAttention()
        c = torch.compile(m, backend="kiln", options={"fallback": "error"})
        with torch.no_grad():
            for t in (64, 48, 80):
                x = torch.randn(2, t, 64)
                torch.testing.assert_close(c(x), m(x), atol=2e-4, rtol=2e-4)
    """)
    linalg = _linalg_of_fresh_process(script, tmp_path)
    assert len(linalg) >= 2, "expected a static and a symbolic variant"
    assert not any("linalg.batch_matmul" in t for t in linalg)


def test_masked_sdpa_against_eager():
    """SDPA with a float padding mask (-inf on the last keys of one batch
    row), with a 2-D float mask and causal (query and key lengths equal),
    against eager, all in kiln; shapes the fused attention kernel takes
    (lit's cpu-attention checks it is emitted for each form)."""
    torch.manual_seed(0)
    q = torch.randn(2, 4, 37, 32)
    k, v = torch.randn(2, 4, 48, 32), torch.randn(2, 4, 48, 32)
    pad = torch.zeros(2, 1, 1, 48)
    pad[1, ..., 40:] = float("-inf")
    for mask in (pad, torch.randn(37, 48)):
        model = Attention(mask=mask)
        compiled = torch.compile(model, backend="kiln", dynamic=False,
                                 options={"fallback": "error"})
        with torch.no_grad():
            check_close(compiled(q, k, v), model(q, k, v))
    q, k, v = (torch.randn(2, 3, 80, 32) for _ in range(3))
    model = Attention(causal=True)
    compiled = torch.compile(model, backend="kiln", dynamic=False,
                             options={"fallback": "error"})
    with torch.no_grad():
        check_close(compiled(q, k, v), model(q, k, v))


@pytest.mark.parametrize("S", [48, 40], ids=["whole_vectors", "padded_keys"])
def test_fully_masked_attention_rows_are_zero(S):
    """A query row whose every key is masked is 0, as PyTorch's SDPA gives
    it (torch 2.13; softmax then bmm would give NaN), in the fused kernel
    and with the keys padded to whole vectors; the other rows match
    eager."""
    torch.manual_seed(0)
    q = torch.randn(2, 2, 20, 32)
    k, v = torch.randn(2, 2, S, 32), torch.randn(2, 2, S, 32)
    mask = torch.zeros(2, 1, 20, S)
    mask[0, 0, 3] = float("-inf")
    mask[1, 0, :, 5:] = float("-inf")
    model = Attention(mask=mask)
    compiled = torch.compile(model, backend="kiln", dynamic=False,
                             options={"fallback": "error"})
    with torch.no_grad():
        got, want = compiled(q, k, v), model(q, k, v)
    assert torch.equal(want[0, :, 3], torch.zeros_like(want[0, :, 3]))
    assert not got.isnan().any()
    check_close(got, want)


@pytest.mark.parametrize("fn", [torch.softmax, torch.log_softmax], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape", [(7, 33), (4, 8, 128, 128), (2048, 4096)],
                         ids=["flat", "cached", "row_blocks"])
def test_softmax_special_values(fn, shape):
    """Rows holding -inf, NaN and +inf, an all -inf row and a wide one match
    eager's NaN and inf pattern in each CPU form of the softmax (flat passes,
    exp kept in cache, blocks of rows): the row max may drop a NaN
    (arith.maxnumf, one vmaxps) and exp(x - max) has no overflow clamp, since
    the NaN reaches the row through exp and the sum (lowering/ops/nn.c)."""
    x = torch.randn(*shape)
    rows = x.view(-1, shape[-1])
    rows[0, :] = float("-inf")
    rows[1, 3] = float("nan")
    rows[2, 5] = float("inf")
    rows[3, ::2] = float("-inf")
    rows[4] *= 100.0
    compiled = torch.compile(lambda t: fn(t, -1), backend="kiln")
    got, want = compiled(x), fn(x, -1)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.isinf(), want.isinf())
    finite = want.isfinite()
    check_close(got[finite], want[finite])
    # Masked positions are exact zeros, as eager's.
    if fn is torch.softmax:
        assert torch.equal(got.view(-1, shape[-1])[3, ::2], torch.zeros(shape[-1] // 2 + shape[-1] % 2))


class PoolNet(nn.Module):
    """A ResNet stem: a 7x7 stride-2 convolution, batch norm, relu, a 3x3
    stride-2 max pool, then a 3x3 convolution on the small grid."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 7, 2, 3, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.conv = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        return self.conv(self.stem(x))


def test_max_pool_inference_runs_in_kiln():
    """Inference: max_pool2d_with_indices, whose indices nothing reads, is
    kiln's aten.max_pool2d (fallback="error" fails on any node in PyTorch);
    values match eager's, whose NaN also propagates."""
    torch.manual_seed(0)
    model = PoolNet().eval()
    compiled = torch.compile(model, backend="kiln", options={"fallback": "error"})
    x = torch.randn(2, 3, 40, 38)
    x[0, 1, 10, 11] = float("nan")
    with torch.no_grad():
        got, want = compiled(x), model(x)
    torch.testing.assert_close(got, want, equal_nan=True, **TOL[want.dtype])
    assert got.isnan().any()


def test_max_pool_training_keeps_indices_in_pytorch(capfd, monkeypatch):
    """Training saves the pool's indices for the backward: that node runs in
    PyTorch (reported), the rest in kiln, and the gradients match eager."""
    monkeypatch.setenv("KILN_LOG", "fallbacks")
    torch.manual_seed(0)
    model = PoolNet()
    x = torch.randn(2, 3, 24, 24)
    compiled = torch.compile(model, backend="kiln")
    compiled(x).square().sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().sum().backward()
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad, atol=1e-3, rtol=1e-3)
    err = capfd.readouterr().err
    assert "max_pool2d indices used" in err, err


def test_batch_norm_training_in_kiln(capfd, monkeypatch):
    """Training-mode batch norm (backend._decompositions: its forward and
    backward decomposed) runs in kiln: no batch-norm node is reported in
    PyTorch (the convolutions' backward is), the gradients and the updated
    running statistics match eager's."""
    monkeypatch.setenv("KILN_LOG", "fallbacks")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 4, 1), nn.BatchNorm2d(4, momentum=0.3))
    ref = copy.deepcopy(model)
    x = torch.randn(4, 3, 10, 9)
    compiled = torch.compile(model, backend="kiln")
    compiled(x).square().mean().backward()
    ref(x).square().mean().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        # (Sums of a few hundred products; the biases before a batch norm
        # have a gradient of zero up to rounding.)
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-3)
    for b, c in zip(model.buffers(), ref.buffers()):
        torch.testing.assert_close(b, c, atol=1e-5, rtol=1e-5)
    err = capfd.readouterr().err
    assert "batch_norm" not in err, err
    assert "convolution_backward runs in PyTorch" in err, err


class ConvGrads(nn.Module):
    """Stride-1 convolutions of several paddings and a dilation (their input
    gradients become convolutions, backend._conv_backward_input), one of
    stride 2 and a grouped one (convolution_backward kept whole)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 16, (3, 5), padding=(0, 2), dilation=(2, 1), bias=False)
        self.c = nn.Conv2d(16, 8, 1)
        self.d = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.e = nn.Conv2d(8, 8, 3, padding=1, groups=2)

    def forward(self, x):
        y = torch.relu(self.c(torch.relu(self.b(torch.relu(self.a(x))))))
        return self.e(self.d(y))


def test_bf16_convolutions_stay_pytorchs(capfd, monkeypatch):
    """bf16 convolutions stay PyTorch's (kiln's convolution kernel is f32):
    reported, the batch norms and activations around them kiln's, the
    result equal to eager."""
    monkeypatch.setenv("KILN_LOG", "fallbacks")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                          nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, bias=False),
                          nn.BatchNorm2d(8)).to(torch.bfloat16).eval()
    x = torch.randn(2, 8, 12, 12, dtype=torch.bfloat16)
    with torch.no_grad():
        check_close(torch.compile(model, backend="kiln")(x), model(x))
    err = capfd.readouterr().err
    assert err.count("bf16 convolution: kiln's convolution kernel is f32") == 2, err
    assert "relu runs in PyTorch" not in err, err


def test_conv_input_gradients_as_convolutions(monkeypatch):
    """The backward graph kiln is given holds the three stride-1 input
    gradients as convolutions (the strided and grouped ones stay PyTorch's
    convolution_backward), and the gradients match eager's."""
    from kiln import backend
    seen = []
    compile_graph = backend.compile_graph

    def record(gm, example_inputs, opts, kind="graph"):
        # (Before compile_graph, which fuses the partitions it compiles.)
        seen.append((kind, [n.target for n in gm.graph.nodes]))
        return compile_graph(gm, example_inputs, opts, kind)

    monkeypatch.setattr(backend, "compile_graph", record)
    torch.manual_seed(0)
    model = ConvGrads()
    ref = copy.deepcopy(model)
    x = torch.randn(2, 3, 17, 15, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    compiled = torch.compile(model, backend="kiln")
    compiled(x).square().mean().backward()
    ref(xr).square().mean().backward()
    torch.testing.assert_close(x.grad, xr.grad, atol=1e-5, rtol=1e-4)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4)
    convs = [t for kind, targets in seen if kind == "backward" for t in targets
             if t is torch.ops.aten.convolution.default]
    assert len(convs) == 3, seen


@pytest.mark.parametrize("name,inputs", [
    ("resnet18", lambda: (torch.randn(1, 3, 64, 64),)),
    ("mobilenet_v2", lambda: (torch.randn(1, 3, 72, 72),)),  # last stages 3 x 3
    ("vit_tiny", lambda: (torch.randn(2, 3, 64, 64),)),
    ("gpt2_small", lambda: (torch.randint(0, 5000, (2, 40)),)),
    ("llama_tiny", lambda: (torch.randint(0, 4000, (2, 40)),)),
    ("unet_small", lambda: (torch.randn(1, 3, 32, 32),)),
], ids=lambda x: x if isinstance(x, str) else "")
def test_bench_models_against_eager(name, inputs):
    """kiln-bench's whole models (bench/kiln_bench/zoo.py: ResNet-18,
    MobileNetV2, a ViT, GPT-2 and Llama blocks, a UNet) at small input
    sizes, inference, all in kiln (fallback="error"), against eager on
    fresh random inputs. The ViT at 64 x 64 has 17 tokens: its patches are
    a matmul and its attention pads the keys to 32."""
    from kiln_bench import zoo
    make = {"vit_tiny": lambda: zoo.ViT(image=64)}.get(name, zoo.MODELS[name][0])
    torch.manual_seed(0)
    model = zoo.randomize_batch_norms(make()).eval()
    compiled = torch.compile(model, backend="kiln", options={"fallback": "error"})
    with torch.no_grad():
        for _ in range(2):
            xs = inputs()
            check_close(compiled(*xs), model(*xs))
