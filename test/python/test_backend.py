"""Backend behaviour: registration, options, fallback and its reporting,
fullgraph, threads."""

import threading

import pytest
import torch
import torch.nn as nn

import kiln
from conftest import TOL, partitioned


def test_registered_entry_point():
    assert "kiln" in torch._dynamo.list_backends()


def test_fullgraph():
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
    x = torch.randn(3, 8)
    got = torch.compile(model, backend="kiln", fullgraph=True)(x)
    torch.testing.assert_close(got, model(x), **TOL[torch.float32])


class WithCumsum(nn.Module):
    """torch.cumsum has no kiln lowering: it must run in PyTorch."""

    def forward(self, x):
        return torch.cumsum(torch.relu(x) * 2, dim=1).exp()


def test_fallback_runs_and_is_reported(capfd, monkeypatch):
    monkeypatch.setenv("KILN_LOG", "fallbacks")
    x = torch.randn(4, 5)
    got = torch.compile(WithCumsum(), backend="kiln")(x)
    torch.testing.assert_close(got, WithCumsum()(x), **TOL[torch.float32])
    err = capfd.readouterr().err
    assert "[kiln fallbacks] forward: cumsum runs in PyTorch" in err
    assert "no kiln lowering for aten.cumsum.default" in err


def test_fallback_error_option():
    x = torch.randn(4, 5)
    compiled = torch.compile(WithCumsum(), backend="kiln",
                             options={"fallback": "error"})
    with pytest.raises(Exception, match="cumsum would fall back to PyTorch"):
        compiled(x)


def test_unknown_option_lists_valid_ones():
    compiled = torch.compile(nn.ReLU(), backend="kiln", options={"bogus": 1})
    with pytest.raises(Exception, match="unknown option 'bogus'; valid options: "
                                        "autotune_budget, cuda_graphs, fallback, hoist_params, "
                                        "max_autotune, max_variants, opt_level, "
                                        "reuse_layers, vectorize"):
        compiled(torch.randn(2))


def test_modes_reach_the_backend():
    for mode in ("default", "max-autotune", "reduce-overhead"):
        torch._dynamo.reset()
        x = torch.randn(3, 4)
        got = torch.compile(nn.Softplus(), backend="kiln", mode=mode)(x)
        torch.testing.assert_close(got, nn.Softplus()(x), **TOL[torch.float32])
    with pytest.raises(ValueError, match="unknown mode 'fastest'"):
        kiln.backend.parse_options("fastest", None)


def test_max_autotune_measures_tiles_and_matches_eager(tmp_path, monkeypatch):
    # A fresh cache directory so nothing is known yet: the search runs.
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    # The linears as tiled matmuls, whose tiles are searched (on AVX-512
    # CPUs they would be the f32 microkernel, whose tiles are fixed).
    monkeypatch.setenv("KILN_F32_DOT", "0")
    monkeypatch.setattr(kiln._capi.Context, "_default", None)
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256)).eval()
    x = torch.randn(128, 256)
    before = kiln.compile_stats()
    compiled = torch.compile(model, backend="kiln",
                             options={"max_autotune": True, "autotune_budget": 5})
    with torch.no_grad():
        got = compiled(x)
        want = model(x)
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    after = kiln.compile_stats()
    assert after["tune_measured"] > before["tune_measured"]
    assert kiln.backend.parse_options("max-autotune", None)["mode"] == "max-autotune"
    with pytest.raises(ValueError, match="autotune_budget"):
        kiln.backend.parse_options(None, {"autotune_budget": 7})


def test_two_threads_share_one_compiled_model():
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32)).eval()
    compiled = torch.compile(model, backend="kiln")
    with torch.no_grad():
        compiled(torch.randn(4, 16))  # compile once, before the threads
    errors = []

    def work(seed):
        g = torch.Generator().manual_seed(seed)
        try:
            for _ in range(30):
                x = torch.randn(4, 16, generator=g)
                with torch.no_grad():
                    torch.testing.assert_close(compiled(x), model(x),
                                               **TOL[torch.float32])
        except Exception as ex:  # reported below
            errors.append(ex)

    threads = [threading.Thread(target=work, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_translated_composites_match_eager():
    """ATen ops kiln takes as a few of its own ops (clamp, bool bitwise ops,
    full_like, any, select, backward helpers), compiled with no fallback."""

    def f(x, m):
        a = torch.clamp(x, -0.5, 0.25) + torch.full_like(x, 2.0)
        b = (m & (x > 0)) | ~m
        c = torch.any(b, dim=1, keepdim=True)
        return a[:, 1], torch.where(c, a, -a).select(0, -1), b

    x = torch.randn(5, 7)
    m = torch.rand(5, 7) > 0.5
    got = torch.compile(f, backend="kiln", options={"fallback": "error"})(x, m)
    for g, w in zip(got, f(x, m)):
        torch.testing.assert_close(g, w)


def test_splits_match_eager():
    """split by size (a shorter last piece, a negative dim) and by sizes,
    as slices in kiln with no fallback."""

    def f(x):
        a, b, c = torch.split(x, 3, dim=-1)
        p, q = torch.split(x, [2, 3], dim=0)
        return a * 2, b + 1, c, p.sum(0), q - 1

    x = torch.randn(5, 8)
    got = torch.compile(f, backend="kiln", options={"fallback": "error"})(x)
    for g, w in zip(got, f(x)):
        torch.testing.assert_close(g, w)


def test_clamp_forms_match_eager():
    """hardtanh (relu6), clamp with tensor bounds (broadcast), clamp_min and
    clamp_max: maximum/minimum chains in one kiln partition."""

    def f(x, lo, hi):
        return (nn.functional.relu6(x * 4), nn.functional.hardtanh(x),
                torch.clamp(x, lo, hi), torch.clamp(x, min=lo),
                torch.clamp_min(x, 0.1), torch.clamp_max(x, hi))

    x = torch.randn(5, 7)
    x[0, 0] = float("nan")
    lo, hi = torch.randn(7) - 1, torch.randn(5, 1) + 1
    got = torch.compile(f, backend="kiln", options={"fallback": "error"})(x, lo, hi)
    for g, w in zip(got, f(x, lo, hi)):
        torch.testing.assert_close(g, w, equal_nan=True)


def test_index_forms_match_eager():
    """aten.index in kiln (one gather generic): nearest upsampling (index
    tensors [H', 1] and [W'] broadcast together) of an input and of a
    computed tensor, columns by an index tensor with negative entries, a
    broadcast pair of index tensors, rows by a 2-D index, bf16. Index
    tensors on dims apart from each other stay in PyTorch."""

    def f(x, t, i, r, c):
        return (nn.functional.interpolate(x, scale_factor=2, mode="nearest"),
                nn.functional.interpolate(x * 2 + 1, scale_factor=(2, 3), mode="nearest"),
                t[:, i] * 2, t[r[:, None], c], t[r.view(2, 3)],
                nn.functional.interpolate(x.bfloat16(), size=(5, 7), mode="nearest"))

    x = torch.randn(2, 3, 6, 8)
    t = torch.randn(12, 20)
    i = torch.randint(-20, 20, (9,))
    r, c = torch.randint(0, 12, (6,)), torch.randint(-20, 20, (4,), dtype=torch.int32)
    got = torch.compile(f, backend="kiln", options={"fallback": "error"})(x, t, i, r, c)
    for g, w in zip(got, f(x, t, i, r, c)):
        torch.testing.assert_close(g, w, rtol=0, atol=0)

    def apart(t3, a, b):
        return t3[a, :, b] + 1

    t3, a, b = torch.randn(4, 5, 6), torch.randint(0, 4, (3,)), torch.randint(0, 6, (3,))
    torch.testing.assert_close(torch.compile(apart, backend="kiln")(t3, a, b), apart(t3, a, b))
    with pytest.raises(Exception, match="not adjacent"):
        torch.compile(apart, backend="kiln", options={"fallback": "error"})(t3, a, b)


def test_activation_compositions_match_eager():
    """leaky_relu, elu (alpha, and SELU's scale through F.selu) and log1p
    (softplus decomposes to it) as kiln op chains, special values included:
    log1p keeps tiny x (log(1 + x) alone rounds 1e-9 to 0)."""

    def f(x):
        return (nn.functional.leaky_relu(x, 0.2), nn.functional.elu(x, 0.7),
                nn.functional.selu(x), torch.log1p(x), nn.functional.softplus(x))

    x = torch.randn(6, 9) * 3
    x[0, :6] = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e-9, -1e-9, -1.0])
    x[1, 0] = -2.0  # log1p: NaN
    got = torch.compile(f, backend="kiln", options={"fallback": "error"})(x)
    for g, w in zip(got, f(x)):
        torch.testing.assert_close(g, w, equal_nan=True)
    assert torch.log1p(x)[0, 3].item() == got[3][0, 3].item() != 0
    assert got[1][0, 4].item() == pytest.approx(0.7 * -1e-9, rel=1e-6)  # elu: expm1


def test_var_mean_matches_eager():
    """torch.var_mean (and std, which decomposes to var) in one kiln
    partition: two reductions read through getitem."""

    def f(x):
        v, m = torch.var_mean(x, dim=-1)
        v2, m2 = torch.var_mean(x, dim=0, correction=0, keepdim=True)
        v3, m3 = torch.var_mean(x)
        return v + m, x.std(-1), v2 * m2, v3 - m3

    x = torch.randn(33, 65)
    got = torch.compile(f, backend="kiln", options={"fallback": "error"})(x)
    for g, w in zip(got, f(x)):
        torch.testing.assert_close(g, w)


def test_group_norm_in_kiln_forward_and_backward():
    """GroupNorm through its decomposition (var_mean over the groups; the
    per-group scales reshaped by an as_strided view): no fallback, forward
    and input/weight gradients as eager's."""
    torch.manual_seed(0)
    gn = nn.GroupNorm(4, 16)
    nn.init.normal_(gn.weight)
    x = torch.randn(3, 16, 5, 7)
    with torch.no_grad():
        got = torch.compile(gn, backend="kiln", options={"fallback": "error"})(x)
    torch.testing.assert_close(got, gn(x), **TOL[torch.float32])
    xg = x.clone().requires_grad_()
    torch.compile(gn, backend="kiln", options={"fallback": "error"})(xg).square().sum().backward()
    got_w, gn.weight.grad = gn.weight.grad, None
    xe = x.clone().requires_grad_()
    gn(xe).square().sum().backward()
    torch.testing.assert_close(xg.grad, xe.grad, **TOL[torch.float32])
    torch.testing.assert_close(got_w, gn.weight.grad, **TOL[torch.float32])


def test_backward_helpers_match_eager():
    def f(x):
        return (torch.relu(x) * torch.sigmoid(x) * torch.tanh(x)).log_softmax(-1).softmax(0)

    x = torch.randn(4, 9, requires_grad=True)
    compiled = torch.compile(f, backend="kiln", options={"fallback": "error"})
    compiled(x).pow(2).sum().backward()
    gk = x.grad.clone()
    x.grad = None
    f(x).pow(2).sum().backward()
    torch.testing.assert_close(gk, x.grad, **TOL[torch.float32])


def test_arange_folds_to_a_constant():
    def f(x):
        return x * torch.arange(2, 2 + 3 * x.shape[1], 3, dtype=torch.float32) + torch.arange(x.shape[1])

    x = torch.randn(3, 6)
    got = torch.compile(f, backend="kiln", options={"fallback": "error"})(x)
    torch.testing.assert_close(got, f(x))


def test_dynamic_batch_compiles_once(capfd, monkeypatch):
    """dynamic=True graphs reach kiln with symbolic sizes; one kiln variant
    serves every batch size."""
    monkeypatch.setenv("KILN_LOG", "fallbacks,recompiles")
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32)).eval()
    compiled = torch.compile(model, backend="kiln", dynamic=True)
    with torch.no_grad():
        # Sizes repeated and revisited: a repeated call takes the steady-state
        # path with the output shapes of the call before; a new size refills.
        for n in (3, 3, 1, 7, 7, 64, 13, 13, 7, 64):
            x = torch.randn(n, 16)
            got = compiled(x)
            assert got.shape == (n, 32)
            torch.testing.assert_close(got, model(x), **TOL[torch.float32])
    err = capfd.readouterr().err
    # One symbolic variant per kiln partition, compiled on its first call.
    recompiles = [l for l in err.splitlines() if l.startswith("[kiln recompiles]")]
    assert recompiles and all("=?" in l and "first call" in l for l in recompiles), err


def test_dynamic_sizes_kiln_cannot_bind_fall_back(capfd, monkeypatch):
    """Under dynamic=True a partition may name sizes none of its tensors
    has: after a cumsum left to PyTorch, the [B*L, D] rows are viewed back
    as [B, L, D], and B and L are each no input's size. kiln refuses that
    graph when it compiles it (the partition runs in PyTorch), not on its
    first call. A size used as a number (`+ x.shape[0]`) is no kiln
    operand: that add alone stays PyTorch's."""
    monkeypatch.setenv("KILN_LOG", "fallbacks")

    def rows_back(x):
        b, t, d = x.shape
        y = torch.cumsum(x.reshape(b * t, d).relu(), 0)
        return y.view(b, t, d) * 2.0

    def plus_batch(x):
        return x.view(-1, x.shape[-1]) * 2.0 + x.shape[0]

    for fn in (rows_back, plus_batch):
        compiled = torch.compile(fn, backend="kiln", dynamic=True)
        for b in (2, 3, 4):
            x = torch.randn(b, 5, 8)
            torch.testing.assert_close(compiled(x), fn(x))
    err = capfd.readouterr().err
    assert "is not determined by the inputs' sizes" in err, err
    assert "add_" in err and "operand" in err and "is not available to kiln" in err, err


def test_max_autotune_and_cuda_graphs_conflict():
    compiled = torch.compile(nn.ReLU(), backend="kiln",
                             options={"max_autotune": True, "cuda_graphs": True})
    with pytest.raises(Exception, match="max_autotune and cuda_graphs are two modes"):
        compiled(torch.randn(2))


def test_permuted_cuda_inputs_are_declared_in_memory_order():
    # Traced with fake CUDA tensors (no GPU needed): a transposed input of a
    # CUDA partition is declared in its memory order and permuted back in
    # the graph; the caller passes its buffer without a copy. CPU inputs and
    # inputs kiln writes in place keep their logical shape.
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from kiln.translate import translate

    def f(p, q):
        return torch.tanh(p) * 2 + q

    with FakeTensorMode():
        a, b = torch.empty(64, 48, device="cuda"), torch.empty(48, 64, device="cuda")
        gm = make_fx(f)(a.t(), b)
        gm_cpu = make_fx(f)(torch.empty(64, 48).t(), torch.empty(48, 64))
        pt = a.t()
    # copy_ into an input (as a functionalized graph ends), built by hand:
    # fake CUDA tensors trace no copy_ without CUDA.
    g = torch.fx.Graph()
    p, q = g.placeholder("p"), g.placeholder("q")
    add = g.call_function(torch.ops.aten.add.Tensor, (q, q))
    cp = g.call_function(torch.ops.aten.copy_.default, (p, add))
    g.output((cp,))
    p.meta["val"], q.meta["val"], add.meta["val"], cp.meta["val"] = pt, b, b, pt
    gm_written = torch.fx.GraphModule(torch.nn.Module(), g)
    tr = translate(gm, "t")
    assert tr.in_perms == [[1, 0], None]
    assert "(%in0: f32[64,48], %in1: f32[48,64])" in tr.text
    assert "aten.permute(%in0) {dims = [1, 0]} : f32[48,64]" in tr.text
    assert translate(gm_cpu, "t").in_perms == [None, None]
    assert translate(gm_written, "t").in_perms == [None, None]


def test_embedding_gradient_translates_on_cuda_only():
    # index_put(zeros, [idx], grad, accumulate=True), an embedding's
    # gradient: kiln's aten.index_put on CUDA (traced with fake CUDA tensors,
    # no GPU needed); on the CPU PyTorch's index_put stays (faster there).
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from kiln.translate import support_reason, translate

    def f(idx, g):
        base = torch.full((256, 64), 0.0, device=g.device)
        return torch.ops.aten.index_put(base, [idx], g, True)

    with FakeTensorMode():
        idx = torch.empty(16, 256, dtype=torch.int64, device="cuda")
        g = torch.empty(16, 256, 64, device="cuda")
        gm = make_fx(f)(idx, g)
        gm_cpu = make_fx(f)(torch.empty(16, 256, dtype=torch.int64),
                            torch.empty(16, 256, 64))
    tr = translate(gm, "emb")
    assert "aten.index_put(" in tr.text and "{accumulate = true} : f32[256,64]" in tr.text
    node = [n for n in gm_cpu.graph.nodes if n.target is torch.ops.aten.index_put.default][0]
    assert "on CUDA" in support_reason(node)
    # A reduction to one element on CUDA (keepdim: [1, 1]) stays in PyTorch,
    # as a rank-0 one does: it would lower to a loop on the host.
    with FakeTensorMode():
        gm_mean = make_fx(lambda x: x.mean(dim=(0, 1), keepdim=True))(
            torch.empty(16, 256, device="cuda"))
    node = [n for n in gm_mean.graph.nodes if n.op == "call_function"][0]
    assert support_reason(node) == "a reduction to one element on CUDA"


def test_permuted_outputs_are_written_in_memory_order():
    from kiln.translate import output_permutation
    x = torch.randn(4, 5, 6)
    assert output_permutation(x.permute(2, 0, 1)) == [1, 2, 0]
    assert output_permutation(x.transpose(0, 2)) == [2, 1, 0]
    assert output_permutation(x) is None                       # contiguous
    assert output_permutation(x[:, :, ::2]) is None             # not dense
    assert output_permutation(x[:1].expand(3, 5, 6)) is None    # broadcast

    fused = partitioned(lambda a: (a * 2).permute(2, 0, 1), x)
    subs = [m for m in fused.children() if isinstance(m, kiln.backend.CompiledSubgraph)]
    assert len(subs) == 1 and subs[0].out_views == [[2, 0, 1]]
    assert subs[0].out_strides == [None]  # viewed back, not copied
    got, want = fused(x), (x * 2).permute(2, 0, 1)
    assert got.stride() == want.stride()
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_views_of_inputs_are_returned_as_views():
    # A linear layer's forward saves its transposed weight for the backward:
    # an output that is a chain of views of an input is that view of the
    # caller's input (no kiln output, no copy), as eager returns it; an
    # input returned through views that cancel is the input itself.
    x, w = torch.randn(8, 16), torch.randn(32, 16)
    fused = partitioned(lambda a, b: (a @ b.t(), b.t(), b.t().t(), b.t() * 2), x, w)
    subs = [m for m in fused.children() if isinstance(m, kiln.backend.CompiledSubgraph)]
    assert len(subs) == 1 and subs[0].n_out == 2  # the product and b.t() * 2
    y, wt, same, w2 = fused(x, w)
    assert wt.data_ptr() == w.data_ptr() and wt.shape == (16, 32) and wt.stride() == (1, 16)
    assert same is w
    torch.testing.assert_close(y, x @ w.t())
    torch.testing.assert_close(w2, w.t() * 2, rtol=0, atol=0)
    # Fresh inputs: the views follow the call's tensors, not the first call's.
    x2, wb = torch.randn(8, 16), torch.randn(32, 16)
    y, wt, same, _ = fused(x2, wb)
    assert wt.data_ptr() == wb.data_ptr() and same is wb
    torch.testing.assert_close(y, x2 @ wb.t())
    # An input in another layout than traced (column-major): the view ops
    # are replayed on it, as eager would apply them.
    wc = torch.randn(32, 16).t().contiguous().t()
    y, wt, same, _ = fused(x2, wc)
    assert torch.equal(wt, wc.t()) and wt.stride() == wc.t().stride() and same is wc
    torch.testing.assert_close(y, x2 @ wc.t())
    # An input that PyTorch writes after the partition (a copy_ left to it)
    # gets no view: the output is kiln's copy, with the values at the call.
    from torch.fx.experimental.proxy_tensor import make_fx
    from kiln.translate import translate
    gm = make_fx(lambda a, b: (a @ b.t(), b.t()))(x, w)
    assert translate(gm, "t").graph_outputs == [0, None]
    assert translate(gm, "t", written_later={1}).graph_outputs == [0, 1]


@pytest.mark.parametrize("rows", [6, 600000])  # 600000 x 7 floats (16 MB): pooled outputs
def test_steady_state_calls_follow_input_layouts(rows):
    a, b = torch.randn(rows, 7), torch.randn(rows, 7)
    fused = partitioned(lambda p, q: (p * 3 + q, p - q, q * q), a, b)
    sub = [m for m in fused.children() if isinstance(m, kiln.backend.CompiledSubgraph)][0]
    assert sub.pooled_out == (rows > 6) and sub.fast_ok
    at = a.t().contiguous().t()  # same shape, column-major
    bs = torch.randn(rows, 14)[:, ::2]
    for p, q in [(a, b), (a, b), (at, b), (at, b), (a, bs), (a, bs), (a, b)]:
        got = fused(p, q)
        for g, w in zip(got, (p * 3 + q, p - q, q * q)):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    # A full call where the layouts change (calls 1, 3, 5 and 7); the
    # repeats take the fast path.
    assert sub.full_calls == 4
    # Same shapes and strides, another dtype: kiln's guard sees it (the
    # steady-state path must not reuse the structs' f32 dtype).
    with pytest.raises(kiln._capi.KilnError, match="float64|f64"):
        fused(a.double(), b.double())


def test_a_temporary_that_cannot_be_allocated_raises_out_of_memory():
    # (a @ b) @ c with a [2^20, 1] and b [1, 2^20]: the product in between
    # takes 4 TiB, which compiled code cannot allocate. The call raises
    # kiln's OUT_OF_MEMORY (it wrote through NULL and killed the process
    # before), twice, and the process goes on compiling and calling.
    # (Where the kernel overcommits without limit, malloc would say yes.)
    try:
        with open("/proc/sys/vm/overcommit_memory") as f:
            if f.read().strip() == "1":
                pytest.skip("vm.overcommit_memory = 1: a 4 TiB malloc succeeds")
    except OSError:
        pass
    from torch.fx.experimental.proxy_tensor import make_fx
    n = 1 << 20
    a, b, c = torch.randn(n, 1), torch.randn(1, n), torch.randn(n, 1)
    gm = make_fx(lambda a, b, c: (a @ b) @ c, tracing_mode="fake")(a, b, c)
    huge = kiln.backend.compile_graph(gm, (a, b, c), kiln.backend.parse_options(None, None),
                                      "forward")
    for _ in range(2):
        with pytest.raises(kiln._capi.KilnError, match="OUT_OF_MEMORY.*could not be allocated"):
            huge(a, b, c)
    x, y = torch.randn(64, 32), torch.randn(32, 16)
    small = partitioned(lambda x, y: torch.relu(x @ y), x, y)
    torch.testing.assert_close(small(x, y), torch.relu(x @ y), **TOL[torch.float32])
