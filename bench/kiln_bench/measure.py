"""Timing, checking and the machine's roofline."""

from __future__ import annotations

import statistics
import time

import torch


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def median_time(fn, device, min_iters=5, max_iters=50, budget_s=0.5):
    """Median seconds per call after warm-up (CUDA events on the GPU)."""
    for _ in range(2):
        fn()
    sync(device)
    times = []
    start = time.perf_counter()
    while len(times) < max_iters and (len(times) < min_iters or
                                      time.perf_counter() - start < budget_s):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


TOL = {torch.float32: 2e-3, torch.float64: 1e-6, torch.bfloat16: 6e-2, torch.float16: 1e-2}


def check(got, want):
    """(ok, max relative error) of `got` against eager's `want`."""
    if isinstance(want, (tuple, list)):
        res = [check(g, w) for g, w in zip(got, want)]
        return all(r[0] for r in res), max(r[1] for r in res)
    got, want = got.float(), want.float()
    if got.shape != want.shape:
        return False, float("inf")
    scale = want.abs().max().clamp_min(1.0)
    err = ((got - want).abs().max() / scale).item()
    tol = TOL.get(want.dtype, 2e-3)
    return err <= tol, err


def roofline(device, quick):
    """Measured memory bandwidth (GB/s, a large copy) and matmul peak
    (GFLOP/s, torch.mm f32 on CPU, bf16 on CUDA), once per run."""
    n = (1 << 27) if device == "cuda" else (1 << 25)  # 512 / 128 MB
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    t = median_time(lambda: dst.copy_(src), device, min_iters=5, max_iters=20, budget_s=1.0)
    bw = 2 * n * 4 / t / 1e9
    m = 8192 if device == "cuda" else 1024
    peaks = {}
    for dt in (torch.float32, torch.bfloat16):
        a = torch.randn(m, m, device=device, dtype=dt)
        b = torch.randn(m, m, device=device, dtype=dt)
        t = median_time(lambda: torch.mm(a, b), device, min_iters=3, max_iters=20,
                        budget_s=1.0)
        peaks[str(dt).replace("torch.", "")] = 2.0 * m ** 3 / t / 1e9
    return {"bandwidth_gbs": bw, "matmul_gflops": peaks["float32"],
            "matmul_gflops_by_dtype": peaks,
            "matmul_peak_from": f"torch.mm {m}^3 per dtype"}


def roofline_fraction(case, seconds, roof):
    """The case's bound time (max of compute and traffic time) over its
    measured time; None without a flop/byte model."""
    if not case.flops and not case.bytes:
        return None
    peak = roof.get("matmul_gflops_by_dtype", {}).get(
        str(case.dtype).replace("torch.", ""), roof["matmul_gflops"])
    t_compute = case.flops / (peak * 1e9) if case.flops else 0.0
    t_memory = case.bytes / (roof["bandwidth_gbs"] * 1e9) if case.bytes else 0.0
    bound = "compute" if t_compute >= t_memory else "memory"
    return max(t_compute, t_memory) / seconds, bound
