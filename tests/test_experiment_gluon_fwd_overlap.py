"""bench/experiments/gluon_fwd_overlap.py and gluon_dkdv_overlap.py without a GPU: their Gluon kernels compile for sm_90a,
the overlapped variants leave products in flight (``wgmma.wait_group`` 1 or 2) where the others wait on every one, ptxas
does not serialize them, and the host refuses the inputs the kernels do not cover. (Gluon has no CPU interpreter: the
numbers are checked on the GPU, each experiment's part (1).)"""

import functools
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "experiments" / "gluon_fwd_overlap.py"
pytestmark = [pytest.mark.step05]


@functools.cache
def _experiment():
    spec = importlib.util.spec_from_file_location("gluon_fwd_overlap", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@functools.cache
def _waits():
    """{variant: {pendings: count}}, compiled in a process without TRITON_INTERPRET (on a CPU the test session runs
    Triton's interpreter, whose library functions Gluon cannot compile)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, str(SCRIPT), "--waits", "--variants",
                        "overlap 128x64 s2 w8,no-overlap 128x64 s2 w8"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("variant, in_flight", [("overlap 128x64 s2 w8", True), ("no-overlap 128x64 s2 w8", False)])
def test_overlap_leaves_one_product_in_flight(variant, in_flight):
    waits = _waits()[variant]
    assert waits.get("0"), f"{variant}: no wgmma.wait_group 0 in its PTX ({waits})"
    assert bool(waits.get("1")) == in_flight, (
        f"{variant}: wgmma.wait_group 1 {'missing' if in_flight else 'present'} in its PTX ({waits}); the main loop of "
        f"_gluon_fwd {'must wait for S_j alone (num_outstanding=1)' if in_flight else 'waits on both products'}")


def test_refuses_what_it_does_not_cover():
    mod = _experiment()
    q = torch.empty(1, 2, 1000, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 128"):
        mod.check_inputs(q, q, q)
    q = torch.empty(1, 2, 1024, 64, dtype=torch.float32)
    with pytest.raises(ValueError, match="16-bit"):
        mod.check_inputs(q, q, q)


DKDV = ROOT / "bench" / "experiments" / "gluon_dkdv_overlap.py"


@functools.cache
def _backward_reports():
    """gluon_dkdv_overlap.py --report for its dK/dV and dQ kernels, in one process without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, str(DKDV), "--report", "overlap 64x32 s3 w4,overlap 64x32 s3 w4 r128,"
                                                 "dq overlap 128x64 s3 w8,dq carry-seq 128x64 s3 w8,"
                                                 "overlap 64x64 s2 w4@128"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.step06
def test_dkdv_overlap_keeps_products_in_flight_unserialized():
    """gluon_dkdv_overlap.py's kernel: S^T and dP^T waited for one at a time, and ptxas does not serialize the wgmmas
    (its C7515 warning, which a product left in flight across the loop's back edge caused)."""
    rep = _backward_reports()["overlap 64x32 s3 w4"]
    assert rep["waits"].get("1") == 2, f"expected two waits leaving one product in flight: {rep}"
    assert not rep["serialized"], f"ptxas serialized the wgmmas of _gluon_dkdv: {rep}"


@pytest.mark.step06
def test_dq_overlap_waits_one_product_at_a_time_unserialized():
    """gluon_dkdv_overlap.py's dQ kernel: S_j, dP_j and the previous dQ product waited for one by one (2, 1, 0 left
    in flight), and ptxas does not serialize the wgmmas."""
    rep = _backward_reports()["dq overlap 128x64 s3 w8"]
    assert rep["waits"].get("2") == 1 and rep["waits"].get("1") == 1, f"expected waits leaving 2, then 1: {rep}"
    assert not rep["serialized"], f"ptxas serialized the wgmmas of _gluon_dq: {rep}"


@pytest.mark.step06
def test_dq_carry_fits_two_programs_an_sm_unserialized():
    """The dQ kernel on step 06's own schedule (CARRY_DQ, dP after P): dQ's product left in flight across the back
    edge (one ``wait_group 1`` in the loop) without ptxas serializing the wgmmas, in at most 128 registers a thread,
    so that two 8-warp programs share an SM's 65536 registers as step 06's dQ kernel does (round 3's kernels took
    139-149 and ran one to an SM)."""
    rep = _backward_reports()["dq carry-seq 128x64 s3 w8"]
    assert rep["waits"].get("1") == 1, f"expected one wait leaving dQ's product in flight: {rep}"
    assert not rep["serialized"], f"ptxas serialized the wgmmas of _gluon_dq (CARRY_DQ): {rep}"
    assert rep["regs"] <= 128, f"_gluon_dq (CARRY_DQ) takes {rep['regs']} registers: one 8-warp program an SM"


@pytest.mark.step06
def test_step06_hopper_tiles_are_the_measured_variant_and_compile_unserialized():
    """solutions/gluon_dkdv.py's ``TILES`` (what step 06's solution launches on Hopper) are the variants the
    experiment measured best (round 2's at D=64, round 5's at D=128), and at them the kernel keeps one product in
    flight twice per iteration without ptxas serializing the wgmmas, at D=64 in at most 128 registers (four programs
    an SM). (At D=128 it takes 255 and spills 56 bytes a thread with ptxas 12.8: round 5 measured it so.)"""
    from attnlib.loader import load_step
    mod = _dkdv_experiment()
    bn, bm, stages, warps, overlap, maxnreg = mod.VARIANTS[mod.ROUND2_BEST_DKDV]
    assert mod.ROUND2_BEST_DKDV == "overlap 64x32 s3 w4 r128" and overlap is True
    s6 = load_step(6, "solutions")
    hopper = importlib.import_module(f"{s6.__package__}.gluon_dkdv")
    assert hopper.TILES[64] == (bn, bm, stages, warps, maxnreg)
    rep = _backward_reports()["overlap 64x32 s3 w4 r128"]
    assert rep["waits"].get("1") == 2 and not rep["serialized"] and rep["regs"] <= 128, rep
    bn, bm, stages, warps, overlap, maxnreg = mod.VARIANTS[mod.ROUND5_BEST_D128]
    assert overlap is True and hopper.TILES[128] == (bn, bm, stages, warps, maxnreg)
    rep = _backward_reports()[f"{mod.ROUND5_BEST_D128}@128"]
    assert rep["waits"].get("1") == 2 and not rep["serialized"], rep


@functools.cache
def _dkdv_experiment():
    spec = importlib.util.spec_from_file_location("gluon_dkdv_overlap_tiles", DKDV)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(DKDV.parent))
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.step06
def test_ptxas_report_uses_the_ptxas_triton_compiles_with(monkeypatch, tmp_path):
    """The register reports run the ptxas Triton chose, which wrote the PTX's ``.version``: torch's Inductor points
    TRITON_PTXAS_PATH at torch/bin/ptxas (CUDA 13 wheels), and on the H200 at 6f691db the bundled 12.8 ptxas refused
    that PTX 9.0 in every report. Here a newer ptxas on PATH stands in for torch's."""
    import shutil
    from triton import knobs
    from triton.backends.nvidia.compiler import ptx_get_version
    newer = shutil.which("ptxas")
    bundled = knobs.nvidia.ptxas
    if newer is None:
        pytest.skip("no ptxas on PATH to stand in for torch/bin/ptxas")
    monkeypatch.setenv("TRITON_PTXAS_PATH", newer)
    chosen = knobs.nvidia.ptxas
    if chosen.version == bundled.version:
        pytest.skip(f"the ptxas on PATH is Triton's own version ({chosen.version}): nothing to tell apart")
    v = ptx_get_version(chosen.version)
    ptx = f".version {v // 10}.{v % 10}\n.target sm_90a\n.address_size 64\n.visible .entry k()\n{{\n\tret;\n}}\n"
    rep = _dkdv_experiment().ptxas_report(ptx)
    assert isinstance(rep["regs"], int), rep


class _FakeGluon:
    """Stands in for a Gluon kernel on a CPU: ``kern[grid](*args)`` computes what the kernel must write, in float64
    from the descriptors' tensors, so the host code around it (the shims in step 06's rebuilt backward) is tested."""

    def __init__(self, what):
        self.what, self.calls = what, 0

    def __getitem__(self, grid):
        def launch(q_desc, k_desc, v_desc, do_desc, lse, delta, out, *rest, IS_CAUSAL, **kw):
            from attnlib.reference import reference_backward
            self.calls += 1
            B, H, N = lse.shape
            q, k, v, do = (d.base.view(B, H, N, -1) for d in (q_desc, k_desc, v_desc, do_desc))
            dq, dk, dv = reference_backward(q, k, v, do, IS_CAUSAL)
            if self.what == "dkdv":
                out.view(B, H, N, -1).copy_(dk)
                rest[0].view(B, H, N, -1).copy_(dv)
            else:
                out.view(B, H, N, -1).copy_(dq)
        return launch


@pytest.mark.step06
@pytest.mark.skipif(torch.cuda.is_available(), reason="the stand-ins take CPU tensors, which a GPU's Triton refuses")
def test_step06_with_gluon_kernels_routes_every_tensor(monkeypatch):
    """step06_with_gluon_dkdv on a CPU, the Gluon kernels replaced by exact stand-ins: step 06's rebuilt backward
    hands them the right tensors and keeps what they write (the harness's (H, N, D) inputs included); inputs they
    do not cover fall back to step 06's real backward even while the wrapper sits in step 06's module (as CS336's
    harness puts it there: round 2's run recursed)."""
    from attnlib.compare import assert_close
    from attnlib.loader import load_step
    mod = importlib.util.module_from_spec(importlib.util.spec_from_file_location("gluon_dkdv_overlap", DKDV))
    sys.path.insert(0, str(DKDV.parent))
    mod.__spec__.loader.exec_module(mod)
    fake_kv, fake_dq = _FakeGluon("dkdv"), _FakeGluon("dq")
    monkeypatch.setattr(mod, "_gluon_dkdv", fake_kv)
    monkeypatch.setattr(mod, "_gluon_dq", fake_dq)
    s5, s6 = load_step(5, "solutions"), load_step(6, "solutions")
    bwd = mod.step06_with_gluon_dkdv("overlap 64x32 s3 w4", "dq overlap 128x64 s3 w8")
    g = torch.Generator().manual_seed(3)
    for shape in ((2, 128, 64), (1, 2, 128, 64)):                 # the harness's (H, N, D), and (B, H, N, D)
        q, k, v, do = (torch.randn(*shape, generator=g).half() for _ in range(4))    # the kernels take 16-bit
        o, lse = s5.forward(q, k, v, True, 64 ** -0.5)
        got = bwd(q, k, v, o, lse, do, True, 64 ** -0.5)
        want = s6.backward(q, k, v, o, lse, do, True, 64 ** -0.5)
        for name, a, b in zip(("dQ", "dK", "dV"), got, want):
            assert_close(a, b, name=f"{shape}: {name} through the shims", dtype=torch.float16)
    assert fake_kv.calls == 2 and fake_dq.calls == 2, (fake_kv.calls, fake_dq.calls)
    monkeypatch.setattr(s6, "backward", bwd)                     # as CS336's harness does while it runs
    q, k, v, do = (torch.randn(2, 100, 64, generator=g).half() for _ in range(4))   # N=100: not the kernels' to take
    o, lse = s5.forward(q, k, v, True, 64 ** -0.5)
    bwd(q, k, v, o, lse, do, True, 64 ** -0.5)
    assert fake_kv.calls == 2 and fake_dq.calls == 2
