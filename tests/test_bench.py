"""The benchmark harness: FLOP counting, rows, OOM handling, plots from JSON alone."""

import pytest
import torch

from bench import core
from bench.__main__ import draw


def test_flops_follow_flashattention():
    assert core.flops(1, 16, 16384, 64, False, "fwd") == 4 * 16 * 16384**2 * 64
    assert core.flops(1, 16, 16384, 64, True, "fwd") == 2 * 16 * 16384**2 * 64
    assert core.flops(2, 3, 100, 32, True, "fwd+bwd") == 3.5 * core.flops(2, 3, 100, 32, True, "fwd")
    assert core.flops(2, 3, 100, 32, False, "bwd") == 2.5 * core.flops(2, 3, 100, 32, False, "fwd")


def test_measure_ratio_oom_and_roundtrip(tmp_path):
    def naive(q, k, v, c):
        return torch.softmax(q @ k.transpose(-2, -1), -1) @ v

    def oom(q, k, v, c):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    kw = dict(B=1, H=2, N=64, D=16, causal=False, dtype=torch.float32, device="cpu", suite="grid")
    rows = core.measure("sdpa-flash", naive, **kw) + core.measure("mine", naive, **kw) + core.measure("big", oom, **kw)
    core.add_ratios(rows)
    assert [r.status for r in rows] == ["ok", "ok", "ok", "ok", "oom", "oom"]
    assert all(r.ms > 0 and r.tflops > 0 for r in rows[:4])
    assert rows[0].ratio_to_sdpa_flash == 1.0 and rows[2].ratio_to_sdpa_flash is not None
    core.save(rows, tmp_path / "results.json", tmp_path / "results.csv")
    again = core.load_rows(tmp_path / "results.json")
    assert [r.impl for r in again] == [r.impl for r in rows]
    assert "oom" in core.table(again)
    made = draw(again, tmp_path)
    assert made and all(p.exists() and p.stat().st_size > 1000 for p in made)


def test_forward_only_kernels_get_no_fwd_bwd_time():
    """Step 05's backward is step 04's PyTorch one: a "fwd+bwd" row for it would time PyTorch (86 ms at
    N=4096 in the 12-01 grid), so it is a refusal row that names where the Triton backward is timed."""
    calls = []

    def naive(q, k, v, c):
        calls.append(q.requires_grad)
        return torch.softmax(q @ k.transpose(-2, -1), -1) @ v

    kw = dict(B=1, H=2, N=32, D=16, causal=False, dtype=torch.float32, device="cpu", suite="grid")
    fwd, both = core.measure("step05", naive, **kw)
    assert fwd.mode == "fwd" and fwd.status == "ok" and fwd.ms > 0
    assert both.mode == "fwd+bwd" and both.ms is None and both.status.startswith("unsupported: forward only")
    assert "step 06" in both.status
    n = len(calls)
    assert core.measure("step06", naive, **kw)[1].status == "ok" and len(calls) > n


def test_compiled_rows_never_time_an_eager_fallback():
    """Past its recompile limit Dynamo silently runs eager; the bench must say so, not time it."""
    import torch._dynamo
    import torch._dynamo.config as dcfg
    saved = dcfg.recompile_limit, dcfg.fail_on_recompile_limit_hit      # global settings: put back
    try:
        core.no_silent_eager()
        assert dcfg.recompile_limit >= core.RECOMPILE_LIMIT and dcfg.fail_on_recompile_limit_hit
        dcfg.recompile_limit = 2                                          # a small limit to hit here
        torch._dynamo.reset()
        f = torch.compile(lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), -1) @ v, dynamic=False)
        rows = []
        for n in (8, 12, 16):                                              # every N compiles again
            rows += core.measure("compiled", lambda q, k, v, c: f(q, k, v), B=1, H=1, N=n, D=8, causal=False,
                                 dtype=torch.float32, device="cpu", modes=("fwd",))
    finally:
        dcfg.recompile_limit, dcfg.fail_on_recompile_limit_hit = saved
        torch._dynamo.reset()
    assert [r.status for r in rows[:2]] == ["ok", "ok"]
    assert rows[2].status.startswith("error: torch.compile recompiled") and rows[2].ms is None


def test_merge_keeps_measured_rows_and_refuses_other_gpus():
    from bench.__main__ import merge_rows
    m = {"gpu": "G", "date": "d1"}
    a = [core.Row(impl="x", mode="fwd", dtype="float32", B=1, H=1, N=n, D=8, causal=False, suite="sweep",
                  ms=1.0 if n == 1 else None, status="ok" if n == 1 else "skipped: budget", machine=m)
         for n in (1, 2)]
    b = [core.Row(impl="x", mode="fwd", dtype="float32", B=1, H=1, N=n, D=8, causal=False, suite="sweep",
                  ms=None if n == 1 else 2.0, status="skipped: budget" if n == 1 else "ok",
                  machine={"gpu": "G", "date": "d2"})
         for n in (1, 2)]
    merged = {r.N: r for r in merge_rows([a, b])}
    assert (merged[1].ms, merged[1].machine["date"]) == (1.0, "d1")     # a skip never hides a measurement
    assert (merged[2].ms, merged[2].machine["date"]) == (2.0, "d2")
    import pytest
    with pytest.raises(SystemExit, match="different machines"):
        merge_rows([a, [dataclasses_replace(b[0], machine={"gpu": "other"})]])


def dataclasses_replace(row, **kw):
    import dataclasses
    return dataclasses.replace(row, **kw)


def test_step04_figures_merge(tmp_path):
    """Runs of bench/step04_figures.py join into one figure: later rows win, failures never hide a
    measurement, each row keeps its run's date, runs of two different GPUs are refused."""
    import json

    import pytest

    from bench import step04_figures as s4

    def run(name, date, gpu, rows):
        settings = dict(B=1, H=16, D=64, mask="causal", block_q=128, block_k=128)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"machine": {"gpu": gpu, "torch": "x", "date": date}, "settings": settings,
                                    "rows": [dict(impl=i, mode="fwd", dtype="float32", causal=True, N=n, B=1, H=16,
                                                  D=64, ms=ms, peak_mib=ms, first_call_s=None,
                                                  status="ok" if ms else "error: x") for i, n, ms in rows]}))
        return path

    a = run("a", "d1", "G", [("naive", 1024, 1.0), ("step04", 1024, None), ("step04", 4096, 4.0)])
    b = run("b", "d2", "G", [("step04", 1024, 2.0), ("step04", 4096, None)])
    assert s4.merge([a, b], tmp_path / "out") == 0
    rows = json.loads((tmp_path / "out" / "step04_figures.json").read_text())["rows"]
    got = {(r["impl"], r["N"]): (r["ms"], r["date"]) for r in rows}
    assert got == {("naive", 1024): (1.0, "d1"), ("step04", 1024): (2.0, "d2"), ("step04", 4096): (4.0, "d1")}
    assert (tmp_path / "out" / "step04_figures.png").stat().st_size > 1000
    with pytest.raises(SystemExit, match="different machines"):
        s4.merge([a, run("c", "d3", "other", [("naive", 1024, 1.0)])], tmp_path / "out2")


def test_missing_from_measures_only_what_a_run_lacks():
    """`--missing-from`: an implementation is run only at the shapes a previous run has no measured row
    for; SDPA-FLASH runs everywhere (the new rows' ratios need it)."""
    from bench.__main__ import measured_keys, run_suite
    calls = []

    def impl(name):
        def fn(q, k, v, causal):
            calls.append((name, q.shape[-2]))
            return torch.softmax(q @ k.transpose(-2, -1), -1) @ v
        return fn

    impls = {"sdpa-flash": impl("sdpa-flash"), "mine": impl("mine")}
    first = run_suite("sweep", impls, "cpu", small=True, machine={})
    assert {(r.impl, r.N) for r in first} == {(i, n) for i in impls for n in (256, 1024)}
    # forget one shape of "mine": only that shape (and SDPA-FLASH's two) must run again
    have = measured_keys([r for r in first if not (r.impl == "mine" and r.N == 1024)])
    calls.clear()
    again = run_suite("sweep", impls, "cpu", small=True, machine={}, have=have)
    assert {(r.impl, r.N) for r in again} == {("sdpa-flash", 256), ("sdpa-flash", 1024), ("mine", 1024)}
    assert {c for c in calls} == {("sdpa-flash", 256), ("sdpa-flash", 1024), ("mine", 1024)}
    # a row that was skipped or failed before is not "measured": it runs again
    first[0].status = "skipped: budget"
    assert ("sweep", first[0].impl, first[0].mode, first[0].dtype, first[0].B, first[0].H, first[0].N,
            first[0].D, first[0].causal) not in measured_keys(first)


def test_varlen_and_sparse_suites_redraw_their_plots_without_a_gpu(tmp_path, capsys):
    """`python -m bench varlen|sparse` hand their options to bench/varlen_gpu.py and bench/sparse_gpu.py;
    --plot redraws the committed H200 run's figure from its JSON."""
    import shutil
    from pathlib import Path

    from bench.__main__ import main

    repo = Path(__file__).resolve().parent.parent
    if not (repo / "bench" / "varlen_gpu.py").exists():
        # The student release ships the bench harness, not these scripts (they time solutions/).
        pytest.skip("bench/varlen_gpu.py and bench/sparse_gpu.py are not in this copy of the course")
    root = repo / "results" / "h200"
    for suite, src, png in (("varlen", "varlen/varlen.json", "varlen.png"),
                            ("sparse", "sparse/sparse.json", "sparse_vs_flex.png")):
        d = tmp_path / suite
        d.mkdir()
        shutil.copy(root / src, d)
        assert main([suite, "--plot", str(d)]) == 0
        assert (d / png).stat().st_size > 10_000, f"{suite}: no figure drawn"
        assert str(d / png) in capsys.readouterr().out
