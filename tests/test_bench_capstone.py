"""bench/capstone_gpu.py checked on the CPU before its one run on the H200: every part runs tiny, a
refusal or a spent budget is recorded rather than fatal, and the profiler's kernel share is read right.

Part d (torch.compile) is left out here: compiling even the tiny model takes about 40 s on two cores
(run ``python bench/capstone_gpu.py --cpu-smoke`` for all of it).
"""

import json

import pytest

from bench.capstone_gpu import kernel_share, main


@pytest.mark.step04
def test_cpu_smoke_runs_every_part_and_records_what_cannot_run(tmp_path):
    assert main(["--cpu-smoke", "--out", str(tmp_path), "--parts", "a,b,c,a7"]) == 0
    res = json.loads((tmp_path / "capstone.json").read_text())
    rows = {(r["attn"], r["context"]): r for r in res["speed"]}
    for attn in ("sdpa-flash", "step04", "naive"):
        for ctx in (32, 64, 128):
            r = rows[attn, ctx]
            assert r["chose"] == attn and r["tokens_per_s"] > 0 and r["batch"] * ctx == 256, r
    for attn in ("step06", "step07", "sdpa-cudnn"):
        assert "error" in rows[attn, 64], rows[attn, 64]         # refused on a CPU, recorded, the rest went on
    assert "needs a CUDA GPU" in rows["step06", 64]["error"]
    assert {(s["attn"], s["context"]) for s in res["attention_share"]} == {
        (a, c) for a in ("step06", "sdpa-flash") for c in (32, 64, 128)}
    for dtype in ("bf16", "fp16"):
        curve = res["loss_curves"][dtype]
        assert len(curve["step04"]["losses"]) == 20 and curve["max_abs_diff"] < 0.01, curve
        assert len(curve["math"]["losses"]) == 20 and curve["bound"] >= 1e-3, curve   # the third, for the spread
        assert curve["within_spread"] == (curve["max_abs_diff"] <= curve["bound"]), curve
    assert (tmp_path / "capstone_loss.png").stat().st_size > 0 and (tmp_path / "capstone_tokens.png").exists()
    assert not res.get("skipped") and not [k for k in res if k.endswith("_error")], res.keys()


def test_a_spent_budget_skips_and_says_so(tmp_path):
    assert main(["--cpu-smoke", "--out", str(tmp_path), "--budget-s", "0"]) == 0
    res = json.loads((tmp_path / "capstone.json").read_text())
    assert res["skipped"] == ["part a", "part b", "part c", "part a7", "part d", "part an"], res
    assert res["part_a"] == "skipped: budget spent" and res["speed"] == []


def test_kernel_share_counts_attention_kernels_over_all_kernels(tmp_path):
    events = [
        {"cat": "kernel", "name": "_attn_fwd_kernel", "ts": 0, "dur": 100},                       # step 06
        {"cat": "kernel", "name": "_bwd_dkdv_kernel", "ts": 100, "dur": 150},
        {"cat": "kernel", "name": "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>", "ts": 250, "dur": 50},
        {"cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32", "ts": 300, "dur": 600},      # the linears
        {"cat": "kernel", "name": "void at::native::vectorized_layer_norm_kernel", "ts": 900, "dur": 100},
        {"cat": "cpu_op", "name": "aten::scaled_dot_product_attention", "ts": 0, "dur": 5000},   # not a kernel
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    r = kernel_share(path)
    assert (r["share"], r["attention_kernel_ms"], r["all_kernel_ms"], r["kernels"]) == (0.3, 0.3, 1.0, 5), r
    assert [n for n, _ in r["attention_kernels"]][0] == "_bwd_dkdv_kernel"


def test_loss_curves_are_judged_against_the_spread_of_two_correct_kernels(monkeypatch):
    """Part c's verdict: within SPREAD_FACTOR x |third - ref| + SPREAD_FLOOR passes; past it fails."""
    import bench.capstone_gpu as cg

    runs = {"ours": [5.0, 4.0, 3.50], "ref": [5.0, 4.0, 3.40], "third": [5.0, 4.0, 3.45]}
    monkeypatch.setattr(cg, "free", lambda: None)
    monkeypatch.setattr(cg, "run_train", lambda cfg, attn, *a, **k: {"chose": attn, "losses": runs[attn],
                                                                     "tokens_per_s": 1.0})
    cfg = type("cfg", (), {"curve_context": 8, "curve_batch": 1, "curve_steps": 3})()
    e = cg.curves(cfg, "ours", "ref", "bf16", "third")
    assert e["max_abs_diff"] == 0.1 and e["reference_spread"] == 0.05 and e["within_spread"], e
    runs["ours"] = [5.0, 4.0, 3.52]                     # 0.12 > 2 x 0.05 + 1e-3
    assert not cg.curves(cfg, "ours", "ref", "bf16", "third")["within_spread"]
