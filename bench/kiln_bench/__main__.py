"""kiln-bench command line. See the package docstring."""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time

import torch

from . import backends as bk
from .cases import suite
from .measure import check, median_time, roofline, roofline_fraction, sync


class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, total):
        self.total, self.done, self.t0 = max(total, 1), 0, time.perf_counter()

    def step(self, label):
        self.done += 1
        width = 30
        filled = int(width * self.done / self.total)
        el = time.perf_counter() - self.t0
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                         f"{el:5.0f}s {label[:40]:40s}")
        sys.stderr.flush()

    def close(self):
        sys.stderr.write("\n")


def unique_graphs():
    from torch._dynamo.utils import counters
    return sum(counters["stats"].values()) if "stats" in counters else 0


def run_case(case, name, compile_fn, device, quick, eager_out):
    torch._dynamo.reset()
    torch.manual_seed(0)
    fn, inputs = case.build(device, case.dtype)
    rec = {"case": case.name, "group": case.group, "backend": name,
           "dtype": str(case.dtype).replace("torch.", "")}
    try:
        from torch._dynamo.utils import counters
        counters.clear()
        t0 = time.perf_counter()
        if case.train:
            compiled = compile_fn(fn.model)
            fn.compile_optimizer(compile_fn)
            out = fn(compiled, *inputs)
            call = lambda: fn(compiled, *inputs)  # noqa: E731
        else:
            compiled = compile_fn(fn)
            with torch.no_grad():
                out = compiled(*inputs)

            def call():
                with torch.no_grad():
                    return compiled(*inputs)
        sync(device)
        rec["first_call_s"] = time.perf_counter() - t0
        # CUDA-graph backends (the "-ro" ones) reuse their output buffers on
        # the next replay: keep the first call's result for the check.
        out = torch.utils._pytree.tree_map(
            lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, out)
        rec["graphs"] = counters["stats"].get("unique_graphs", 0)
        budget = 0.15 if quick else 0.6
        rec["seconds"] = median_time(call, device, min_iters=3 if quick else 5,
                                     max_iters=20 if quick else 50, budget_s=budget)
        if eager_out is not None:
            ok, err = check(out, eager_out)
            rec["check"] = "ok" if ok else "MISMATCH"
            rec["max_rel_err"] = err
        else:
            rec["check"] = "reference"
        return rec, out
    except Exception as ex:  # a backend that fails is reported, not fatal
        rec["error"] = f"{type(ex).__name__}: {str(ex).splitlines()[0][:200]}"
        return rec, None


def compile_times(case, name, device):
    """Cold and warm first-call time and peak memory, fresh processes."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, KILN_CACHE_DIR=d, TORCHINDUCTOR_CACHE_DIR=d)
        res = []
        for _ in range(2):
            p = subprocess.run([sys.executable, "-m", "kiln_bench.child", case.name, name, device],
                               env=env, capture_output=True, text=True)
            if p.returncode != 0:
                return {"compile_error": (p.stderr.strip().splitlines() or ["?"])[-1][:200]}
            res.append(json.loads(p.stdout.strip().splitlines()[-1]))
    return {"cold_compile_s": res[0]["seconds"], "warm_compile_s": res[1]["seconds"],
            "peak_mb": res[0]["peak_mb"]}


def geomean(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def machine():
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpu": platform.processor() or "?"}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        info["cores"] = os.cpu_count()
    except OSError:
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def print_table(records, backends_order):
    inductor = {r["case"]: r.get("seconds") for r in records if r["backend"] == "inductor"}
    print(f"{'case':22s} {'backend':13s} {'ms':>10s} {'vs inductor':>11s} {'compile s':>9s} "
          f"{'roofline':>9s} {'cold/warm s':>13s}  check")
    last = None
    for r in records:
        if r["case"] != last and last is not None:
            print()
        last = r["case"]
        if "error" in r:
            print(f"{r['case']:22s} {r['backend']:13s} {'ERROR':>10s}  {r['error']}")
            continue
        if "skipped" in r:
            continue
        ind = inductor.get(r["case"])
        ratio = f"{ind / r['seconds']:.2f}x" if ind and r.get("seconds") else "-"
        roof = f"{100 * r['roofline']:.0f}% {r['bound'][0]}" if r.get("roofline") else "-"
        cw = (f"{r['cold_compile_s']:.1f}/{r['warm_compile_s']:.1f}"
              if "cold_compile_s" in r else "-")
        chk = r.get("check", "")
        if chk == "MISMATCH":
            chk = f"*** MISMATCH (rel err {r['max_rel_err']:.2g}) ***"
        print(f"{r['case']:22s} {r['backend']:13s} {r['seconds'] * 1e3:10.3f} {ratio:>11s} "
              f"{r['first_call_s']:9.2f} {roof:>9s} {cw:>13s}  {chk}")


def charts(records, outdir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("charts skipped: pip install matplotlib")
        return []
    cases = list(dict.fromkeys(r["case"] for r in records))
    names = [b for b in dict.fromkeys(r["backend"] for r in records
                                      if "seconds" in r and r["backend"] != "inductor")]
    inductor = {r["case"]: r["seconds"] for r in records if r["backend"] == "inductor" and "seconds" in r}
    files = []
    fig, ax = plt.subplots(figsize=(max(8, len(cases) * 0.8), 4.5))
    w = 0.8 / max(len(names), 1)
    for i, b in enumerate(names):
        ys = []
        for c in cases:
            r = next((r for r in records if r["case"] == c and r["backend"] == b and "seconds" in r), None)
            ys.append(inductor[c] / r["seconds"] if r and c in inductor else 0)
        ax.bar([j + i * w for j in range(len(cases))], ys, w, label=b)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("speedup over Inductor (log)")
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(cases))])
    ax.set_xticklabels(cases, rotation=45, ha="right")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = os.path.join(outdir, "speedup_vs_inductor.png")
    fig.savefig(p, dpi=110)
    files.append(p)
    plt.close(fig)
    comp = [r for r in records if "cold_compile_s" in r]
    if comp:
        fig, ax = plt.subplots(figsize=(8, 4))
        labels = [f"{r['case']}\n{r['backend']}" for r in comp]
        x = range(len(comp))
        ax.bar([i - 0.2 for i in x], [r["cold_compile_s"] for r in comp], 0.4, label="cold")
        ax.bar([i + 0.2 for i in x], [r["warm_compile_s"] for r in comp], 0.4, label="warm cache")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("first call (s), fresh process")
        ax.legend()
        fig.tight_layout()
        p = os.path.join(outdir, "compile_times.png")
        fig.savefig(p, dpi=110)
        files.append(p)
        plt.close(fig)
    return files


def main(argv=None):
    ap = argparse.ArgumentParser(prog="kiln-bench", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="a subset that finishes in ~2 minutes")
    ap.add_argument("--demo", action="store_true", help="the few cases `make demo` shows")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--groups", default="kernels,blocks,training",
                    help="comma-separated: kernels, blocks, training, dynamic, models")
    ap.add_argument("--backends", default=None, help="comma-separated subset")
    ap.add_argument("--cases", default=None, help="comma-separated subset")
    ap.add_argument("--results", default="bench-results")
    ap.add_argument("--no-compile-times", action="store_true",
                    help="skip the fresh-process cold/warm compile measurements")
    ap.add_argument("--install-peers", action="store_true",
                    help="pip install OpenVINO and IREE Turbine, then run")
    args = ap.parse_args(argv)
    if args.install_peers:
        bk.install_peers()
    device = args.device
    quick = args.quick or args.demo
    groups = set(args.groups.split(","))
    cases = [c for c in suite(device) if c.group in groups]
    if args.demo:
        cases = [c for c in cases if c.demo]
    elif args.quick:
        cases = [c for c in cases if c.quick]
    if args.cases:
        keep = set(args.cases.split(","))
        cases = [c for c in cases if c.name in keep]
    bks = bk.backends(device, quick)
    if args.demo:
        bks = [b for b in bks if b[0] in ("eager", "inductor", "kiln")]
    if args.backends:
        keep = set(args.backends.split(","))
        bks = [b for b in bks if b[0] in keep]
    else:
        bks = [b for b in bks if b[0] not in bk.OPT_IN]
    for name, fn, note in bks:
        if fn is None:
            print(f"note: {name}: {note}")
    active = [(n, f) for n, f, _ in bks if f is not None]
    roof = roofline(device, quick)
    info = machine()
    peaks = ", ".join(f"{k} {v:.1f}" for k, v in roof["matmul_gflops_by_dtype"].items())
    print(f"kiln-bench on {device}: {info.get('cpu')} ({info.get('cores')} cores), torch "
          f"{torch.__version__}; bandwidth {roof['bandwidth_gbs']:.1f} GB/s "
          f"({roof.get('bandwidth_from', 'torch copy_')}), matmul peak "
          f"GFLOP/s {peaks} ({roof['matmul_peak_from']})")
    compile_cases = [] if args.no_compile_times or args.demo else (
        [c for c in cases if c.group == "blocks"][:1 if quick else 3]
        + [c for c in cases if c.group == "models"])
    prog = Progress(len(cases) * len(active) + 2 * len(compile_cases))
    records = []
    for case in cases:
        eager_out = None
        for name, fn in active:
            rec, out = run_case(case, name, fn, device, quick, eager_out)
            if name == "eager":
                eager_out = out
            if "seconds" in rec:
                rf = roofline_fraction(case, rec["seconds"], roof)
                if rf:
                    rec["roofline"], rec["bound"] = rf
            records.append(rec)
            prog.step(f"{case.name} / {name}")
        for name in ("kiln", "kiln-whole", "inductor"):
            if case in compile_cases and any(n == name for n, _ in active):
                r = next(r for r in records if r["case"] == case.name and r["backend"] == name)
                r.update(compile_times(case, name, device))
                prog.step(f"{case.name} / {name} cold+warm")
    prog.close()
    print_table(records, [n for n, _ in active])
    summary = {}
    for g in ("kernels", "blocks", "training", "dynamic", "models"):
        ratios = []
        for r in records:
            if r["group"] != g or r["backend"] != "kiln" or "seconds" not in r:
                continue
            ind = next((x for x in records if x["case"] == r["case"] and
                        x["backend"] == "inductor" and "seconds" in x), None)
            if ind:
                ratios.append(ind["seconds"] / r["seconds"])
        gm = geomean(ratios)
        if gm:
            summary[g] = gm
    comp = {r["case"]: r for r in records if "cold_compile_s" in r and r["backend"] == "kiln"}
    comp_ratios = {}
    for case, r in comp.items():
        ind = next((x for x in records if x["case"] == case and x["backend"] == "inductor"
                    and "cold_compile_s" in x), None)
        if ind:
            comp_ratios[case] = {"cold": ind["cold_compile_s"] / r["cold_compile_s"],
                                 "warm": ind["warm_compile_s"] / r["warm_compile_s"]}
    print()
    for g, gm in summary.items():
        print(f"geomean kiln speedup over Inductor, {g}: {gm:.2f}x")
    for case, cr in comp_ratios.items():
        print(f"compile time, Inductor / kiln ({case}): cold {cr['cold']:.1f}x, warm {cr['warm']:.1f}x")
    mism = [r for r in records if r.get("check") == "MISMATCH"]
    if mism:
        print(f"*** {len(mism)} MISMATCH(ES) against eager: "
              + ", ".join(f"{r['case']}/{r['backend']}" for r in mism) + " ***")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    outdir = os.path.join(args.results, f"{device}-{'demo' if args.demo else 'quick' if quick else 'full'}-{stamp}")
    os.makedirs(outdir, exist_ok=True)
    payload = {"command": "kiln-bench " + " ".join(argv if argv is not None else sys.argv[1:]),
               "machine": info, "roofline": roof, "geomean_speedup_vs_inductor": summary,
               "compile_ratio_inductor_over_kiln": comp_ratios, "records": records}
    with open(os.path.join(outdir, "results.json"), "w") as f:
        json.dump(payload, f, indent=1)
    keys = sorted({k for r in records for k in r})
    with open(os.path.join(outdir, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(records)
    files = charts(records, outdir)
    print(f"results: {outdir}/results.json, results.csv" + "".join(f", {os.path.basename(p)}" for p in files))
    return 1 if mism else 0


if __name__ == "__main__":
    sys.exit(main())
