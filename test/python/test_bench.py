"""kiln-bench works end to end (a one-case run), and its checks catch what
they must. Times are not asserted: speed is shown in benchmarks only."""

import json
import os

import pytest
import torch

from kiln_bench.__main__ import main
from kiln_bench.cases import Case
from kiln_bench.measure import check, roofline_fraction


def test_one_case_run_writes_results(tmp_path, capsys):
    rc = main(["--demo", "--device", "cpu", "--cases", "softmax", "--no-compile-times",
               "--results", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "softmax" in out and "vs inductor" in out
    [run] = os.listdir(tmp_path)
    data = json.load(open(tmp_path / run / "results.json"))
    by_backend = {r["backend"]: r for r in data["records"]}
    assert set(by_backend) == {"eager", "inductor", "kiln"}
    assert by_backend["kiln"]["check"] == "ok"
    assert data["roofline"]["bandwidth_gbs"] > 0
    assert (tmp_path / run / "results.csv").exists()


def test_check_flags_a_mismatch():
    want = torch.randn(4, 4)
    assert check(want + 1e-6, want)[0]
    ok, err = check(want + 0.5, want)
    assert not ok and err > 0.1


def test_roofline_fraction_picks_the_binding_limit():
    roof = {"bandwidth_gbs": 10.0, "matmul_gflops": 100.0}
    mem = Case("m", "kernels", None, bytes=1e9)
    frac, bound = roofline_fraction(mem, 0.2, roof)   # bound time 0.1 s
    assert bound == "memory" and abs(frac - 0.5) < 1e-9
    comp = Case("c", "kernels", None, flops=1e11, bytes=1e6)
    frac, bound = roofline_fraction(comp, 2.0, roof)   # bound time 1 s
    assert bound == "compute" and abs(frac - 0.5) < 1e-9


def test_partition_times_cover_forward_and_backward():
    from kiln_bench.partitions import measure
    rows = measure("train_mlp", steps=3)
    names = [r[0] for r in rows]
    assert any(n.startswith("forward_") for n in names)
    assert any(n.startswith("backward_") for n in names)
    for _, ms, c in rows:
        assert 0 < c <= ms  # the C call is part of the partition's time


def test_call_cost_covers_every_backend_and_kind():
    from kiln_bench.callcost import measure
    got = measure(calls=20)
    assert set(got) == {("eager", "static"), ("inductor", "static"), ("inductor", "dynamic"),
                        ("kiln", "static"), ("kiln", "dynamic")}
    assert all(us > 0 for us in got.values())


def test_call_path_layers_and_gemm_against_mkl():
    """kiln_bench.callpath: each layer's callable runs the case (no layer is
    free, so the outer ones take longer than kiln's forward alone, give or
    take the noise of a few calls), and the GEMM mode times both kernels."""
    from kiln_bench.callpath import gemm, layers
    t = layers("mlp", rounds=3, calls=5)
    assert set(t) == {"torch.compile", "aot", "kiln"}
    assert all(ms > 0 for ms in t.values())
    assert t["torch.compile"] > 0.5 * t["kiln"]
    g = gemm(64, 64, 64, rounds=2)
    assert set(g) == {"mkl", "kiln"} and all(ms > 0 for ms in g.values())
    with pytest.raises(ValueError, match="training case"):
        layers("train_mlp")
