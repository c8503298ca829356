"""torch.compile(backend="kiln") on device="cuda": the partitions compile for
kiln's CUDA target and run on PyTorch's current stream; results and a
training loop match eager. Skipped on machines without a CUDA device (CI)."""

import pytest
import torch
from torch import nn

import kiln
from conftest import TOL, partitioned

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device (the GPU machine runs these)")


def test_mlp_forward_on_cuda_matches_eager():
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.LayerNorm(128),
                          nn.Linear(128, 32)).cuda().eval()
    x = torch.randn(16, 64, device="cuda")
    before = kiln.compile_stats()["compiles"]
    # fallback="error": every node must run in kiln's CUDA code.
    compiled = torch.compile(model, backend="kiln", options={"fallback": "error"})
    with torch.no_grad():
        got = compiled(x)
        want = model(x)
    assert got.device.type == "cuda"
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    assert kiln.compile_stats()["compiles"] > before


def test_bf16_matmul_with_epilogue_on_tensor_cores_matches_eager():
    # A bf16 matmul in whole tiles runs on tensor cores (wgmma on sm_90,
    # with bias, ReLU and the f32 residual folded into its stores; mma.sync
    # elsewhere), on fresh inputs, against eager; then a plain bf16 mm.
    def f(a, b, c, r):
        return torch.relu(torch.addmm(c, a, b)) + r

    a = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(128, 512, device="cuda", dtype=torch.bfloat16)
    c = torch.randn(512, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(256, 512, device="cuda")
    compiled = torch.compile(f, backend="kiln", options={"fallback": "error"})
    got = compiled(a, b, c, r)
    want = f(a, b, c, r)
    assert got.dtype == torch.float32
    # Eager rounds addmm's result to bf16 before the ReLU and the add, as
    # kiln's graph does: bf16's tolerance.
    torch.testing.assert_close(got, want, **TOL[torch.bfloat16])
    mm = torch.compile(torch.mm, backend="kiln", options={"fallback": "error"})
    a2 = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    b2 = torch.randn(1024, 768, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(mm(a2, b2), torch.mm(a2, b2), **TOL[torch.bfloat16])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_linear_reads_its_weight_in_place_and_matches_eager(dtype):
    # nn.Linear in bf16 or f16: on sm_90 the wgmma kernel reads the weight
    # [N, K] as it is (K-major B, no transpose kernel) with the bias and
    # GELU folded into its stores; elsewhere a transpose and mma.sync.
    # Against eager, on fresh inputs; then a plain mm of that type.
    model = nn.Sequential(nn.Linear(512, 384), nn.GELU()).cuda().to(dtype).eval()
    x = torch.randn(256, 512, device="cuda", dtype=dtype)
    compiled = torch.compile(model, backend="kiln", options={"fallback": "error"})
    with torch.no_grad():
        got = compiled(x)
        want = model(x)
    assert got.dtype == dtype
    torch.testing.assert_close(got, want, **TOL[dtype])
    mm = torch.compile(torch.mm, backend="kiln", options={"fallback": "error"})
    a = torch.randn(384, 256, device="cuda", dtype=dtype)
    b = torch.randn(256, 512, device="cuda", dtype=dtype)
    torch.testing.assert_close(mm(a, b), torch.mm(a, b), **TOL[dtype])


def test_elementwise_and_softmax_on_a_side_stream():
    def f(x, y):
        return torch.softmax(torch.tanh(x) * y + 1.0, dim=-1)

    x = torch.randn(33, 517, device="cuda")
    y = torch.randn(517, device="cuda")
    compiled = torch.compile(f, backend="kiln", options={"fallback": "error"})
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        got = compiled(x, y)
    side.synchronize()
    torch.testing.assert_close(got, f(x, y), **TOL[torch.float32])


def test_training_loop_on_cuda_matches_eager():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 8)).cuda()
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 8)).cuda()
    model.load_state_dict(ref.state_dict())
    compiled = torch.compile(model, backend="kiln")
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(128, 32, device="cuda")
    target = torch.randn(128, 8, device="cuda")
    for _ in range(10):
        for m, o in ((ref, opt_ref), (compiled, opt)):
            o.zero_grad()
            loss = ((m(x) - target) ** 2).mean()
            loss.backward()
            o.step()
        torch.testing.assert_close(((compiled(x) - target) ** 2).mean(),
                                   ((ref(x) - target) ** 2).mean(), atol=1e-4, rtol=1e-4)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, atol=1e-4, rtol=1e-3)


def test_reduce_overhead_replays_cuda_graphs():
    # mode="reduce-overhead": each CUDA partition records a CUDA graph per
    # set of buffer addresses and replays it. An inference loop over a
    # static input buffer (refilled each step) meets the same addresses
    # again, so most calls replay; the graphs read the buffers' new contents.
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.LayerNorm(128),
                          nn.Linear(128, 32)).cuda().eval()
    # options cuda_graphs=True is mode="reduce-overhead" (torch.compile
    # takes one or the other).
    compiled = torch.compile(model, backend="kiln",
                             options={"fallback": "error", "cuda_graphs": True})
    x = torch.empty(16, 64, device="cuda")
    before = kiln.compile_stats()
    with torch.no_grad():
        for _ in range(10):
            x.copy_(torch.randn(16, 64, device="cuda"))
            got = compiled(x)
            torch.testing.assert_close(got, model(x), **TOL[torch.float32])
    after = kiln.compile_stats()
    replays = after["graph_replays"] - before["graph_replays"]
    records = after["graph_records"] - before["graph_records"]
    assert records > 0 and replays > records, (records, replays)


def test_reduce_overhead_training_matches_eager():
    # Training steps move activations between calls: graphs are recorded
    # again (updated in place) where addresses differ; results stay exact.
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64),
                        nn.Linear(64, 8)).cuda()
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64),
                          nn.Linear(64, 8)).cuda()
    model.load_state_dict(ref.state_dict())
    compiled = torch.compile(model, backend="kiln", mode="reduce-overhead")
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    before = kiln.compile_stats()["graph_records"]
    for _ in range(8):
        x = torch.randn(64, 32, device="cuda")
        target = torch.randn(64, 8, device="cuda")
        losses = []
        for m, o in ((ref, opt_ref), (compiled, opt)):
            o.zero_grad()
            loss = ((m(x) - target) ** 2).mean()
            loss.backward()
            o.step()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], atol=1e-4, rtol=1e-4)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, atol=1e-4, rtol=1e-3)
    assert kiln.compile_stats()["graph_records"] > before


@pytest.mark.parametrize("name", ["adam", "adamw_capturable", "sgd_momentum"])
def test_compiled_optimizer_step_on_cuda_matches_eager(name):
    """torch.compile(opt.step) on CUDA parameters: kiln writes parameters and
    state in place on the device (foreach ops, PyTorch's default there)."""
    import copy
    make = {"adam": lambda p: torch.optim.Adam(p, lr=1e-2),
            "adamw_capturable": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1,
                                                            capturable=True),
            "sgd_momentum": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9)}[name]
    ref = nn.Sequential(nn.Linear(64, 256), nn.Linear(256, 32)).cuda()
    mod = copy.deepcopy(ref)
    opt_ref, opt = make(ref.parameters()), make(mod.parameters())
    before = kiln.compile_stats()["compiles"]
    step = torch.compile(opt.step, backend="kiln")
    for _ in range(3):
        for p, q in zip(ref.parameters(), mod.parameters()):
            g = torch.randn_like(p)
            p.grad, q.grad = g.clone(), g.clone()
        opt_ref.step()
        step()
    for p, q in zip(ref.parameters(), mod.parameters()):
        torch.testing.assert_close(q, p, atol=1e-5, rtol=1e-4)
    assert kiln.compile_stats()["compiles"] > before


def test_rank0_ops_compile_and_scalar_reductions_fall_back():
    # Rank-0 ops of rank-0 operands (step counts, bias corrections) run as
    # one-thread kernels: fallback="error" holds. A reduction of a tensor
    # to a scalar stays in PyTorch; the rest of its graph compiles.
    def step(s, p, g):
        s.add_(1)
        bc = 1 - 0.9 ** s
        p.sub_(g / bc)
        return p

    s = torch.zeros((), device="cuda")
    p = torch.randn(256, 128, device="cuda")
    g = torch.randn(256, 128, device="cuda")
    s2, p2 = s.clone(), p.clone()
    compiled = torch.compile(step, backend="kiln", options={"fallback": "error"})
    for _ in range(3):
        compiled(s, p, g)
        step(s2, p2, g)
    torch.testing.assert_close(s, s2)
    torch.testing.assert_close(p, p2, **TOL[torch.float32])

    def loss(x, w):
        return ((x @ w).relu() * 2.0).mean()

    x = torch.randn(64, 32, device="cuda")
    w = torch.randn(32, 128, device="cuda")
    got = torch.compile(loss, backend="kiln")(x, w)
    torch.testing.assert_close(got, loss(x, w), **TOL[torch.float32])


def test_transposed_inputs_take_the_fast_path_on_cuda():
    # The CUDA kernels read contiguous inputs: a transposed view (as the
    # backward receives saved activations) is declared in its memory order
    # (translate), and calls after the first take the steady-state path.
    # A layout other than the traced one is copied, and still correct.
    a = torch.randn(64, 48, device="cuda")
    b = torch.randn(48, 64, device="cuda")
    fused = partitioned(lambda p, q: torch.tanh(p) * 2 + q, a.t(), b)
    sub = [m for m in fused.children() if isinstance(m, kiln.backend.CompiledSubgraph)][0]
    assert sub.in_perms == [[1, 0], None]  # passed as its buffer, no copy
    for _ in range(3):
        a = torch.randn(64, 48, device="cuda")
        torch.testing.assert_close(fused(a.t(), b), torch.tanh(a.t()) * 2 + b,
                                   **TOL[torch.float32])
    assert sub.full_calls == 1
    a = torch.randn(48, 64, device="cuda")  # contiguous this time
    torch.testing.assert_close(fused(a, b), torch.tanh(a) * 2 + b, **TOL[torch.float32])
    torch.testing.assert_close(fused(a, b), torch.tanh(a) * 2 + b, **TOL[torch.float32])
    assert sub.full_calls == 2


def test_embedding_gradient_runs_in_kiln():
    # An embedding's gradient, index_put(zeros, [idx], grad, accumulate=True),
    # is kiln's aten.index_put on CUDA (fallback="error" holds for the
    # backward): repeated token ids accumulate; against eager's gradient.
    # A direct index_put with negative indices wraps as PyTorch's does.
    torch.manual_seed(0)
    emb = nn.Embedding(256, 64).cuda()
    ref = nn.Embedding(256, 64).cuda()
    ref.load_state_dict(emb.state_dict())
    idx = torch.randint(0, 256, (16, 256), device="cuda")
    scale = torch.randn(16, 256, 64, device="cuda")

    def f(m, i):
        return (m(i) * scale).sum(dim=-1)

    out = torch.compile(f, backend="kiln", options={"fallback": "error"})(emb, idx)
    out.square().mean().backward()
    f(ref, idx).square().mean().backward()
    torch.testing.assert_close(emb.weight.grad, ref.weight.grad, **TOL[torch.float32])

    def put(base, i, v):
        return torch.ops.aten.index_put(base * 1.0, [i], v, True)

    base = torch.randn(10, 8, device="cuda")
    i = torch.tensor([3, -1, 3, 0, -10, 9], device="cuda")
    v = torch.randn(6, 8, device="cuda")
    got = torch.compile(put, backend="kiln", options={"fallback": "error"})(base, i, v)
    torch.testing.assert_close(got, put(base, i, v), **TOL[torch.float32])
