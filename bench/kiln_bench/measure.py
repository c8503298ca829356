"""Timing, checking and the machine's roofline."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def median_time(fn, device, min_iters=5, max_iters=50, budget_s=0.5, best=False):
    """Median seconds per call after warm-up (CUDA events on the GPU); with
    `best`, the fastest call (for the machine's peaks: what it can do when
    the shared machine's other tenants let it).

    On the GPU, as triton.testing.do_bench: an event pair around each call
    and one synchronization after the last, so a call's host work (Dynamo's
    guards, the backend's launch path) overlaps the previous call's kernels,
    as in a loop. A call whose host work outlasts its kernels still shows
    it: its start event completes as soon as it is queued, on an idle GPU.
    (Before 2026-11-24's sixth session each call was synchronized, so every
    compiled call's 20-30 us of host work counted against its kernels.)"""
    for _ in range(2):
        fn()
    sync(device)
    times, events = [], []
    start = time.perf_counter()
    while len(times) + len(events) < max_iters and (
            len(times) + len(events) < min_iters or time.perf_counter() - start < budget_s):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            events.append((a, b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    if events:
        events[-1][1].synchronize()
        times = [a.elapsed_time(b) / 1e3 for a, b in events]
    return min(times) if best else statistics.median(times)


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


def cpu_peaks(threads):
    """The CPU's f32 FMA peak (GFLOP/s) and memcpy bandwidth (GB/s) on
    `threads` threads: peaks.c, compiled with the host C compiler for this
    CPU. (None, None) when there is no C compiler."""
    src = Path(__file__).with_name("peaks.c")
    cc = (shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
          or shutil.which("clang"))
    if not cc or not src.exists():
        return None, None
    with tempfile.TemporaryDirectory() as d:
        exe = Path(d) / "peaks"
        r = subprocess.run([cc, "-O2", "-march=native", "-pthread", str(src),
                            "-o", str(exe)], capture_output=True, text=True)
        if r.returncode:
            return None, None
        out = []
        for mode in ("fma", "copy"):
            p = subprocess.run([str(exe), mode, str(threads)], capture_output=True,
                               text=True, timeout=120)
            try:
                out.append(float(p.stdout.strip()))
            except ValueError:
                out.append(None)
        return out[0], out[1]


def roofline(device, quick):
    """Measured memory bandwidth (GB/s, a large copy) and compute peaks
    (GFLOP/s) per dtype, once per run: torch.mm at 1024^3 (8192^3 on CUDA),
    and on the CPU the f32 FMA peak of all cores, which replaces torch.mm's
    as the f32 bound."""
    n = (1 << 27) if device == "cuda" else (1 << 25)  # 512 / 128 MB
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    t = median_time(lambda: dst.copy_(src), device, min_iters=10, max_iters=40,
                    budget_s=2.0, best=True)
    bw = 2 * n * 4 / t / 1e9
    m = 8192 if device == "cuda" else 1024
    peaks = {}
    dtypes = (torch.float32, torch.bfloat16)
    if device == "cuda":
        dtypes += (torch.float16,)  # the GPU suite's f16 matmul
    for dt in dtypes:
        a = torch.randn(m, m, device=device, dtype=dt)
        b = torch.randn(m, m, device=device, dtype=dt)
        t = median_time(lambda: torch.mm(a, b), device, min_iters=3, max_iters=20,
                        budget_s=1.0, best=True)
        peaks[str(dt).replace("torch.", "")] = 2.0 * m ** 3 / t / 1e9
    source = f"torch.mm {m}^3 per dtype"
    torch_mm = dict(peaks)
    bw_source = "torch copy_"
    if device == "cpu":
        fma, copy = cpu_peaks(torch.get_num_threads())
        if fma:
            peaks["float32"] = fma
            source = (f"float32: FMA loop on {torch.get_num_threads()} threads, "
                      f"torch.mm {m}^3 {torch_mm['float32']:.1f}; "
                      f"bfloat16: torch.mm {m}^3")
        if copy and copy > bw:
            bw_source = f"memcpy on {torch.get_num_threads()} threads (torch copy_ {bw:.1f})"
            bw = copy
    return {"bandwidth_gbs": bw, "bandwidth_from": bw_source,
            "matmul_gflops": peaks["float32"],
            "matmul_gflops_by_dtype": peaks, "torch_mm_gflops_by_dtype": torch_mm,
            "matmul_peak_from": source}


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
