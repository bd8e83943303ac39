"""Step 06's Hopper path: the solution's backward hands dK/dV to its Gluon kernel (solutions/gluon_dkdv.py) on an
sm_90 GPU where the kernel applies, and to its Triton kernel everywhere else.

On a CPU: which inputs the kernel covers; the routing through step 06's ``backward`` with an exact stand-in for the
kernel (every tensor where the kernel expects it, what it writes kept); the stub's step 06 has no such path; the
kernel's tiles and sm_90a compile are checked beside the experiment's (tests/test_experiment_gluon_fwd_overlap.py).
On a Hopper GPU: the kernel runs, its gradients against float64 as the
course checks every step, inside ``torch.compile`` as CS336 calls it, and the fallbacks.
"""

import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported; conftest does the same

import pytest  # noqa: E402

from attnlib import make_dout, make_qkv  # noqa: E402
from attnlib.checks import check_attention  # noqa: E402
from attnlib.compare import assert_close  # noqa: E402
from attnlib.loader import load_step  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GPU = torch.cuda.is_available()
HOPPER = GPU and torch.cuda.get_device_capability()[0] == 9
pytestmark = [pytest.mark.step06,
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]  # interpreter


def _step06_and_gluon():
    """Step 06's solution and the Gluon module it imports (the loader gives solutions/ a package name of its own)."""
    import importlib
    s6 = load_step(6, "solutions")
    return s6, importlib.import_module(f"{s6.__package__}.gluon_dkdv")


def _gluon():
    return _step06_and_gluon()[1]


@pytest.fixture(autouse=True)
def _gluon_on(monkeypatch):
    """The path as step 06 ships it, whatever the process's environment (an experiment's Record turns it off)."""
    monkeypatch.setenv("ATTN_GLUON_DKDV", "1")


def _views(shape, dtype=torch.float16, device="cpu"):
    return [torch.empty(shape, dtype=dtype, device=device) for _ in range(4)]


def test_covers_what_was_measured_and_nothing_else():
    g = _gluon()
    q = _views((2, 3, 256, 64))
    assert g.shape_reason(*q, "separate") is None
    assert g.shape_reason(*_views((2, 3, 256, 64), torch.bfloat16), "separate") is None
    assert g.shape_reason(*_views((1, 2, 4096, 128), torch.bfloat16), "separate") is None
    for views, mode, why in (
            (q, "atomic", "dq_mode"), (q, "fused", "dq_mode"), (q, None, "dq_mode"),
            (_views((2, 3, 1000, 64)), "separate", "multiple of 128"),
            (_views((2, 3, 256, 256)), "separate", "D=256"),
            (_views((2, 3, 256, 32)), "separate", "D=32"),
            (_views((2, 3, 256, 64), torch.float32), "separate", "16-bit"),
            (q[:1] + _views((2, 3, 512, 64))[1:], "separate", "different shapes"),
            ([t.transpose(1, 2).contiguous().transpose(1, 2) for t in q], "separate", "contiguous")):
        reason = g.shape_reason(*views, mode)
        assert reason and why in reason, f"{why}: {reason}"
    if not HOPPER:
        assert "Hopper" in g.device_reason(q[0]) or "Gluon" in g.device_reason(q[0])


def test_without_a_causal_mask_the_path_starts_at_full_min_len(monkeypatch):
    """Round 6: without a causal mask the path lost below N=4096 (0.93-1.00x), causal it tied or won at every N. So
    non-causal inputs shorter than ``FULL_MIN_LEN`` are not covered, causal ones are, and ``takes`` (which step 06
    asks before preferring "separate" to its table's atomic_tma) says the same."""
    g = _gluon()
    assert g.FULL_MIN_LEN == 4096
    for n in (128, 2048, 4096 - 128):
        short = _views((1, 2, n, 64))
        assert g.shape_reason(*short, "separate", True) is None
        reason = g.shape_reason(*short, "separate", False)
        assert reason and "causal" in reason and "4096" in reason, reason
    for n, d in ((4096, 64), (4096, 128), (8192, 64)):
        assert g.shape_reason(*_views((1, 1, n, d)), "separate", False) is None
    short, long = _views((1, 2, 2048, 128)), _views((1, 1, 4096, 128))
    monkeypatch.setattr(g, "device_reason", lambda q4: None)      # as if on Hopper
    assert g.takes(*short, True) and g.takes(*long, False) and g.takes(*long, True)
    assert not g.takes(*short, False)


class _ExactDkdv:
    """Stands in for ``_gluon_dkdv`` on a CPU: ``kern[grid](...)`` writes the float64 reference's dK and dV, read
    from the descriptors' tensors, where the kernel would; it records each launch's grid and options."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def launch(q_desc, k_desc, v_desc, do_desc, lse, delta, dk, dv, n, sm_scale, qk_scale, **kw):
            from attnlib.reference import reference_backward
            BH, N = lse.shape
            B, H, _, D = dk.shape
            assert (B * H, N) == (BH, n) and delta.shape == lse.shape, (lse.shape, delta.shape, dk.shape, n)
            assert abs(qk_scale - sm_scale * 1.4426950408889634) < 1e-12
            q, k, v, do = (d.base.view(B, H, N, D) for d in (q_desc, k_desc, v_desc, do_desc))
            with torch.enable_grad():                   # called from inside autograd's backward
                _, rdk, rdv = reference_backward(q, k, v, do, kw["IS_CAUSAL"], scale=sm_scale)
            dk.copy_(rdk)
            dv.copy_(rdv)
            self.launches.append((grid, kw))
        return launch


@pytest.mark.skipif(GPU, reason="the stand-in runs on a CPU")
def test_step06_backward_routes_dkdv_through_the_hook(monkeypatch):
    """Step 06's solution with the Gluon kernel replaced by an exact stand-in and the device check passed: its
    backward launches it once on the inputs it covers, with the grid and tiles of ``TILES``, keeps what it writes
    for dK and dV, and computes dQ with its own kernel (interpreted); inputs it does not cover never reach it."""
    s6, g = _step06_and_gluon()
    fake = _ExactDkdv()
    monkeypatch.setattr(g, "_gluon_dkdv", fake)
    monkeypatch.setattr(g, "device_reason", lambda q4: None)
    monkeypatch.setattr(g, "FULL_MIN_LEN", 128)                 # the non-causal route, at a size the interpreter runs
    for shape, causal in (((1, 2, 128, 64), True), ((2, 128, 64), False)):    # (B, H, N, D) and CS336's (H, N, D)
        q, k, v = make_qkv(Nq=shape[-2], Nk=shape[-2], D=64, batch_shape=shape[:-2], dtype=torch.float16, seed=1,
                           requires_grad=True)
        do = make_dout(q)
        before = g.LAUNCHES
        o = s6.attention(q, k, v, is_causal=causal)
        grads = torch.autograd.grad(o, (q, k, v), do)
        assert g.LAUNCHES == before + 1, "step 06's backward did not hand dK/dV to the Gluon kernel"
        grid, kw = fake.launches[-1]
        bn, bm, stages, warps, maxnreg = g.TILES[64]
        bh = q.numel() // (shape[-2] * 64)
        assert grid == (bh, shape[-2] // bn) and (kw["BLOCK_N"], kw["BLOCK_M"], kw["STAGES"]) == (bn, bm, stages)
        assert (kw["num_warps"], kw["maxnreg"], kw["OVERLAP"], kw["IS_CAUSAL"]) == (warps, maxnreg, True, causal)
        want = torch.autograd.grad(s6.attention(q, k, v, is_causal=causal, dq_mode="fused"), (q, k, v), do)
        for name, a, b in zip(("dQ", "dK", "dV"), grads, want):
            assert_close(a, b, name=f"{shape}: {name} with the stand-in", dtype=torch.float16)
    monkeypatch.setattr(g, "FULL_MIN_LEN", 256)
    before = len(fake.launches)
    for shape, dtype, causal in (((1, 2, 100, 64), torch.float16, True), ((1, 2, 128, 32), torch.float16, True),
                                 ((1, 2, 128, 64), torch.float32, True), ((1, 2, 128, 64), torch.float16, False)):
        q, k, v = make_qkv(Nq=shape[2], Nk=shape[2], D=shape[3], batch_shape=shape[:2], dtype=dtype, requires_grad=True)
        torch.autograd.grad(s6.attention(q, k, v, is_causal=causal), (q, k, v), make_dout(q))
    assert len(fake.launches) == before, "the Gluon kernel was handed inputs it does not cover"


class _ExactDq:
    """Stands in for ``_gluon_dq`` on a CPU, as ``_ExactDkdv`` does for the dK/dV kernel: writes the float64
    reference's dQ where the kernel would and records each launch's grid and options."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def launch(q_desc, k_desc, v_desc, do_desc, lse, delta, dq, n, sm_scale, qk_scale, **kw):
            from attnlib.reference import reference_backward
            BH, N = lse.shape
            B, H, _, D = dq.shape
            assert (B * H, N) == (BH, n) and delta.shape == lse.shape and dq.is_contiguous(), (lse.shape, dq.shape)
            assert abs(qk_scale - sm_scale * 1.4426950408889634) < 1e-12
            q, k, v, do = (d.base.view(B, H, N, D) for d in (q_desc, k_desc, v_desc, do_desc))
            with torch.enable_grad():
                rdq = reference_backward(q, k, v, do, kw["IS_CAUSAL"], scale=sm_scale)[0]
            dq.copy_(rdq)
            self.launches.append((grid, kw))
        return launch


def test_dq_pass_covers_what_was_measured_and_nothing_else(monkeypatch):
    """The Gluon dQ kernel: D=128 only (at D=64 it ran 0.88-0.97x the Triton kernel), from N=4096 with either mask (it
    was measured from there), on what the dK/dV kernel covers, into a contiguous dQ like q."""
    g = _gluon()
    assert set(g.DQ_TILES) == {128} and g.DQ_MIN_LEN == 4096
    monkeypatch.setattr(g, "device_reason", lambda q4: None)      # as if on Hopper
    q = _views((1, 2, 4096, 128), torch.bfloat16)
    for causal in (True, False):
        assert g.dq_not_covered(*q, torch.empty_like(q[0]), causal) is None
    for views, dq, causal, why in (
            (_views((1, 2, 4096, 64), torch.bfloat16), None, True, "D=64"),
            (_views((1, 2, 2048, 128), torch.bfloat16), None, True, "4096"),
            (_views((1, 2, 2048, 128), torch.bfloat16), None, False, "4096"),
            (q, torch.empty(1, 2, 128, 4096, dtype=torch.bfloat16).transpose(2, 3), True, "contiguous"),
            (q, torch.empty_like(q[0], dtype=torch.float16), True, "contiguous"),
            (_views((1, 2, 4096, 128), torch.float32), None, True, "16-bit")):
        dq = torch.empty_like(views[0]) if dq is None else dq
        reason = g.dq_not_covered(*views, dq, causal)
        assert reason and why in reason, f"{why}: {reason}"


@pytest.mark.skipif(GPU, reason="the stand-in runs on a CPU")
def test_step06_backward_routes_dq_through_the_hook(monkeypatch):
    """Step 06's solution with both Gluon kernels replaced by exact stand-ins and the device check passed: at D=128
    its backward hands the dQ pass to ``_gluon_dq`` once, with ``DQ_TILES``' grid and tiles, and keeps what it
    writes; at D=64 the dQ pass stays the Triton kernel's (interpreted)."""
    s6, g = _step06_and_gluon()
    fake_kv, fake_q = _ExactDkdv(), _ExactDq()
    monkeypatch.setattr(g, "_gluon_dkdv", fake_kv)
    monkeypatch.setattr(g, "_gluon_dq", fake_q)
    monkeypatch.setattr(g, "device_reason", lambda q4: None)
    monkeypatch.setattr(g, "FULL_MIN_LEN", 128)                 # sizes the interpreter runs
    monkeypatch.setattr(g, "DQ_MIN_LEN", 128)
    for causal in (True, False):
        q, k, v = make_qkv(Nq=128, Nk=128, D=128, batch_shape=(1, 2), dtype=torch.float16, seed=2, requires_grad=True)
        do = make_dout(q)
        before = g.DQ_LAUNCHES
        grads = torch.autograd.grad(s6.attention(q, k, v, is_causal=causal), (q, k, v), do)
        assert g.DQ_LAUNCHES == before + 1, "step 06's backward did not hand its dQ pass to the Gluon kernel"
        grid, kw = fake_q.launches[-1]
        bm, bn, stages, warps = g.DQ_TILES[128]
        assert grid == (2, 128 // bm) and (kw["BLOCK_M"], kw["BLOCK_N"], kw["STAGES"]) == (bm, bn, stages)
        assert (kw["num_warps"], kw["IS_CAUSAL"], kw["HEAD_DIM"]) == (warps, causal, 128)
        from attnlib.reference import reference_backward
        want = reference_backward(q.detach(), k.detach(), v.detach(), do, causal)
        for name, a, b in zip(("dQ", "dK", "dV"), grads, want):
            assert_close(a, b, name=f"D=128 causal={causal}: {name} with the stand-ins", dtype=torch.float16)
    before = len(fake_q.launches)
    q, k, v = make_qkv(Nq=128, Nk=128, D=64, batch_shape=(1, 2), dtype=torch.float16, requires_grad=True)
    torch.autograd.grad(s6.attention(q, k, v, is_causal=True), (q, k, v), make_dout(q))
    assert len(fake_q.launches) == before, "the Gluon dQ kernel ran at D=64"


class _ExactBwd:
    """Stands in for ``_gluon_bwd_ws`` on a CPU: writes the float64 reference's dK, dV and (scaled, into the fp32
    buffer the kernel adds to) dQ where the kernel would, and records each launch's grid and options."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def launch(q_desc, k_desc, v_desc, do_desc, dq_desc, lse, delta, dk, dv, n, sm_scale, qk_scale, **kw):
            from attnlib.reference import reference_backward
            BH, N = lse.shape
            B, H, _, D = dk.shape
            assert (B * H, N) == (BH, n) and delta.shape == lse.shape, (lse.shape, delta.shape, dk.shape, n)
            assert abs(qk_scale - sm_scale * 1.4426950408889634) < 1e-12
            acc = dq_desc.base
            assert acc.dtype == torch.float32 and acc.shape == (B * H * N, D) and not acc.any(), "dQ's buffer not zeroed"
            q, k, v, do = (d.base.view(B, H, N, D) for d in (q_desc, k_desc, v_desc, do_desc))
            with torch.enable_grad():
                rdq, rdk, rdv = reference_backward(q, k, v, do, kw["IS_CAUSAL"], scale=sm_scale)
            acc.copy_(rdq.reshape(B * H * N, D))
            dk.copy_(rdk)
            dv.copy_(rdv)
            self.launches.append((grid, kw))
        return launch


def test_one_kernel_backward_covers_what_was_measured_and_nothing_else(monkeypatch):
    """``_gluon_bwd_ws`` (FlashAttention-3's shape, five products): what the dK/dV kernel covers, but from N=1024
    with either mask (measured from there: the dK/dV kernel's floor without a mask, ``FULL_MIN_LEN``, is not its),
    into a contiguous dQ like q, and never under deterministic algorithms (its reduces add dQ in any order)."""
    g = _gluon()
    assert set(g.BWD_TILES) == {64, 128} and g.BWD_MIN_LEN == 1024 < g.FULL_MIN_LEN
    assert g.BWD_TILES[64][3] == 1 and g.BWD_TILES[128][3] == 2, "D=64 makes dQ_i whole, D=128 in column halves"
    monkeypatch.setattr(g, "device_reason", lambda q4: None)      # as if on Hopper
    for d in (64, 128):
        for n in (1024, 2048, 4096):
            q = _views((1, 2, n, d), torch.bfloat16)
            for causal in (True, False):
                assert g.bwd_not_covered(*q, torch.empty_like(q[0]), causal) is None, (n, d, causal)
    q = _views((1, 2, 4096, 64), torch.bfloat16)
    for views, dq, why in (
            (_views((1, 2, 1024 - 128, 64), torch.bfloat16), None, "1024"),
            (_views((1, 2, 4096, 32), torch.bfloat16), None, "D=32"),
            (q, torch.empty(1, 2, 64, 4096, dtype=torch.bfloat16).transpose(2, 3), "contiguous"),
            (q, torch.empty_like(q[0], dtype=torch.float16), "contiguous")):
        dq = torch.empty_like(views[0]) if dq is None else dq
        reason = g.bwd_not_covered(*views, dq, True)
        assert reason and why in reason, f"{why}: {reason}"
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    reason = g.bwd_not_covered(*q, torch.empty_like(q[0]), True)
    assert reason and "deterministic" in reason, reason


@pytest.mark.skipif(GPU, reason="the stand-in runs on a CPU")
def test_step06_backward_routes_the_whole_backward_through_the_hook(monkeypatch):
    """Step 06's solution with ``_gluon_bwd_ws`` replaced by an exact stand-in and the device check passed: where it
    covers the inputs and the table chooses (no ``config``, no ``dq_mode``), the backward launches it once, with the
    grid and tiles of ``BWD_TILES``, keeps what it writes (dQ cast from its fp32 buffer) and runs neither the dK/dV
    nor the dQ kernel; asked for a mode or a config, or under deterministic algorithms, it never reaches it."""
    s6, g = _step06_and_gluon()
    fake, fake_kv, fake_q = _ExactBwd(), _ExactDkdv(), _ExactDq()
    monkeypatch.setattr(g, "_gluon_bwd_ws", fake)
    monkeypatch.setattr(g, "_gluon_dkdv", fake_kv)
    monkeypatch.setattr(g, "_gluon_dq", fake_q)
    monkeypatch.setattr(g, "device_reason", lambda q4: None)
    for name in ("BWD_MIN_LEN", "FULL_MIN_LEN", "DQ_MIN_LEN"):
        monkeypatch.setattr(g, name, 128)                       # sizes the interpreter runs
    from attnlib.reference import reference_backward
    for shape, causal in (((1, 2, 128, 64), True), ((2, 128, 128), False)):   # (B, H, N, D) and CS336's (H, N, D)
        q, k, v = make_qkv(Nq=shape[-2], Nk=shape[-2], D=shape[-1], batch_shape=shape[:-2], dtype=torch.float16,
                           seed=3, requires_grad=True)
        do = make_dout(q)
        before = g.BWD_LAUNCHES
        grads = torch.autograd.grad(s6.attention(q, k, v, is_causal=causal), (q, k, v), do)
        assert g.BWD_LAUNCHES == before + 1, "step 06's backward did not hand itself to the one-kernel backward"
        assert not fake_kv.launches and not fake_q.launches, "the dK/dV or dQ kernel ran beside the one kernel"
        grid, kw = fake.launches[-1]
        d = shape[-1]
        bm, stages, dq_bufs, dq_mode, maxnreg, cregs, lregs = g.BWD_TILES[d]
        assert grid == (128 // 128, q.numel() // (128 * d)), grid
        assert (kw["BLOCK_M"], kw["STAGES"], kw["DQ_BUFS"], kw["DQ_MODE"], kw["maxnreg"]) == (bm, stages, dq_bufs,
                                                                                              dq_mode, maxnreg)
        assert (kw["CONSUMER_REGS"], kw["LOADER_REGS"], kw["IS_CAUSAL"], kw["HEAD_DIM"]) == (cregs, lregs, causal, d)
        want = reference_backward(q.detach(), k.detach(), v.detach(), do, causal)
        for name, a, b in zip(("dQ", "dK", "dV"), grads, want):
            assert_close(a, b, name=f"{shape} causal={causal}: {name} with the stand-in", dtype=torch.float16)
    q, k, v = make_qkv(Nq=128, Nk=128, D=64, batch_shape=(1, 2), dtype=torch.float16, requires_grad=True)
    do = make_dout(q)
    before = len(fake.launches)
    torch.autograd.grad(s6.attention(q, k, v, is_causal=True, dq_mode="separate"), (q, k, v), do)
    assert len(fake_kv.launches) == 1, "dq_mode='separate' asked for: the dK/dV kernel should run"
    o, lse = s6.triton_forward(q.detach(), k.detach(), v.detach(), True, 0.125)
    s6.backward(q.detach(), k.detach(), v.detach(), o, lse, do, True, 0.125,
                config=s6.bwd_config(128, 128, 64, q.dtype, True, "cpu", 2))
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    torch.autograd.grad(s6.attention(q, k, v, is_causal=True), (q, k, v), do)
    assert len(fake.launches) == before, "the one kernel ran with a mode or config asked for, or deterministically"


def test_stub_step06_has_no_gluon_path():
    """The stub's step 06 runs the student's Triton kernel on every GPU: the solution's import of the Gluon hook is
    SOLUTION-ONLY, and what stays is the hook that declines."""
    from attnlib.stubgen import make_stub
    sol = (ROOT / "solutions" / "step06_triton_bwd.py").read_text()
    assert "import launch_if_covered as hopper_dkdv" in sol
    stub = make_stub(sol, "step06_triton_bwd.py")
    assert "gluon_dkdv import" not in stub, "the stub of step 06 imports the solution's Gluon kernel"
    assert (ROOT / "steps" / "step06_triton_bwd.py").read_text() == stub, "steps/ is stale: `make stubs`"
    ns = {}
    start = stub.index("def hopper_dkdv(")
    exec(stub[start:stub.index("\n\n\n", start)], ns)
    assert ns["hopper_dkdv"](*[None] * 11) is False
    start = stub.index("def hopper_dkdv_takes(")
    exec(stub[start:stub.index("\n\n\n", start)], ns)
    assert ns["hopper_dkdv_takes"](*[None] * 5) is False
    assert "import launch_dq_if_covered as hopper_dq" in sol and "launch_dq_if_covered" not in stub
    start = stub.index("def hopper_dq(")
    exec(stub[start:stub.index("\n\n\n", start)], ns)
    assert ns["hopper_dq"](*[None] * 9) is False
    assert "import launch_bwd_if_covered as hopper_bwd" in sol and "launch_bwd_if_covered" not in stub
    start = stub.index("def hopper_bwd(")
    exec(stub[start:stub.index("\n\n\n", start)], ns)
    assert ns["hopper_bwd"](*[None] * 11) is False


# %% On a Hopper GPU ------------------------------------------------------------------------------------------------

needs_hopper = pytest.mark.skipif(not HOPPER, reason="the Gluon kernel runs on an sm_90 GPU (Hopper) only")


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 1, 128, 64), (2, 3, 384, 64), (1, 4, 2048, 64), (3, 256, 64),
                                   (2, 3, 384, 128), (1, 3, 1024, 128), (1, 2, 4096, 128), (1, 1, 4096, 64),
                                   (3, 4096, 64)],
                         ids=lambda s: "x".join(map(str, s)))
def test_hopper_path_gradients(shape, is_causal, dtype):
    """Step 06's solution on Hopper: from ``BWD_MIN_LEN`` the one-kernel backward (``_gluon_bwd_ws``) makes dQ, dK
    and dV alone; below it, where the Gluon dK/dV kernel covers the inputs (causal at every N, not causal from
    ``FULL_MIN_LEN``) it runs; either way dQ, dK, dV pass the course's float64 check, at one tile, at odd batch x
    heads, at many tiles, on CS336's (H, N, D) tensors, and at D=128 (causal N=4096: where step 06's table says
    "atomic_tma"); where neither covers them, step 06's Triton kernels pass the same check."""
    s6, g = _step06_and_gluon()
    q, k, v = make_qkv(Nq=shape[-2], Nk=shape[-2], D=shape[-1], batch_shape=shape[:-2], dtype=dtype, device="cuda")
    before, dq_before, bwd_before = g.LAUNCHES, g.DQ_LAUNCHES, g.BWD_LAUNCHES
    check_attention(s6.attention, q, k, v, is_causal=is_causal)
    if shape[-2] >= g.BWD_MIN_LEN:
        assert g.BWD_LAUNCHES > bwd_before, "step 06's backward did not run the one-kernel backward on Hopper"
        assert (g.LAUNCHES, g.DQ_LAUNCHES) == (before, dq_before), "a Gluon dK/dV or dQ kernel ran beside it"
        return
    assert g.BWD_LAUNCHES == bwd_before, f"the one-kernel backward ran below N={g.BWD_MIN_LEN}"
    if is_causal or shape[-2] >= g.FULL_MIN_LEN:
        assert g.LAUNCHES > before, "step 06's backward did not run the Gluon kernel on Hopper"
    else:
        assert g.LAUNCHES == before, f"the Gluon kernel ran without a causal mask below N={g.FULL_MIN_LEN}"
    if shape[-1] in g.DQ_TILES and shape[-2] >= g.DQ_MIN_LEN:
        assert g.DQ_LAUNCHES > dq_before, "step 06's backward did not run the Gluon dQ kernel at D=128 on Hopper"
    else:
        assert g.DQ_LAUNCHES == dq_before, "the Gluon dQ kernel ran on inputs it does not cover"


@pytest.mark.gpu
@needs_hopper
def test_hopper_path_inside_torch_compile():
    """As CS336's leaderboard calls it: ``torch.compile(FlashAttention2.apply)``, (H, N, D) bf16, causal, and
    ``o.sum().backward()`` (an expanded dO). The backward is an opaque operator, so the Gluon launch inside it runs.
    N=512: below ``BWD_MIN_LEN``, where the Gluon dK/dV kernel runs (the one-kernel backward's own compiled test is
    ``test_one_kernel_backward_inside_torch_compile_and_deterministic_mode``)."""
    s6, g = _step06_and_gluon()
    assert 512 < g.BWD_MIN_LEN
    q, k, v = make_qkv(Nq=512, Nk=512, D=64, batch_shape=(4,), dtype=torch.bfloat16, device="cuda", requires_grad=True)
    f = torch.compile(s6.FlashAttentionTriton.apply)
    before = g.LAUNCHES
    f(q, k, v, True).sum().backward()
    assert g.LAUNCHES > before, "the compiled step 06 did not run the Gluon kernel"
    got = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    s6.attention(q, k, v, is_causal=True, dq_mode="fused").sum().backward()
    for name, a, t in zip(("dQ", "dK", "dV"), got, (q, k, v)):
        assert_close(a, t.grad, name=f"{name}, compiled Gluon path against step 06's fused kernel",
                     dtype=torch.bfloat16)


@pytest.mark.gpu
@needs_hopper
def test_hopper_path_off_and_fallbacks(monkeypatch):
    """``ATTN_GLUON_DKDV=0`` and the inputs the kernel does not cover take step 06's Triton kernel: no launch, and
    the gradients still pass; with it on, the Gluon path gives dQ bitwise the Triton path's (same dQ kernel)."""
    s6, g = _step06_and_gluon()
    q, k, v = make_qkv(Nq=512, Nk=512, D=64, batch_shape=(2, 2), dtype=torch.bfloat16, device="cuda", requires_grad=True)
    do = make_dout(q)
    on = torch.autograd.grad(s6.attention(q, k, v, is_causal=True), (q, k, v), do)
    monkeypatch.setenv("ATTN_GLUON_DKDV", "0")
    before = g.LAUNCHES
    off = torch.autograd.grad(s6.attention(q, k, v, is_causal=True), (q, k, v), do)
    assert g.LAUNCHES == before, "ATTN_GLUON_DKDV=0 did not turn the Gluon path off"
    assert torch.equal(on[0], off[0]), "dQ differs between the Gluon and Triton dK/dV paths: it should not"
    for name, a, b in zip(("dK", "dV"), on[1:], off[1:]):
        assert_close(a, b, name=f"{name}: Gluon path against Triton path", dtype=torch.bfloat16)
    monkeypatch.setenv("ATTN_GLUON_DKDV", "1")
    for nq, d, dtype in ((1000, 64, torch.bfloat16), (512, 32, torch.bfloat16), (512, 64, torch.float32)):
        q, k, v = make_qkv(Nq=nq, Nk=nq, D=d, batch_shape=(1, 2), dtype=dtype, device="cuda")
        check_attention(s6.attention, q, k, v, is_causal=True)
    assert g.LAUNCHES == before, "the Gluon kernel ran on inputs it does not cover"


@pytest.mark.gpu
@needs_hopper
def test_hopper_path_takes_separate_over_the_tables_atomic_tma(monkeypatch):
    """D=128, causal, N=4096: step 06's table says ``atomic_tma`` (dQ added inside the Triton dK/dV kernel). On Hopper
    with the path on, the backward takes "separate" and hands all of it to the one-kernel backward; asked for
    "separate" by name, the Gluon dK/dV kernel and the Gluon dQ pass run (round 5 measured them faster than
    atomic_tma); asked for "atomic_tma", or with the path off, the Triton kernels run. All agree."""
    s6, g = _step06_and_gluon()
    q, k, v = make_qkv(Nq=4096, Nk=4096, D=128, batch_shape=(1, 2), dtype=torch.bfloat16, device="cuda",
                       requires_grad=True)
    do = make_dout(q)
    assert s6.bwd_config(4096, 4096, 128, q.dtype, True, "cuda", 2)["dq_mode"] == "atomic_tma"
    before, dq_before, bwd_before = g.LAUNCHES, g.DQ_LAUNCHES, g.BWD_LAUNCHES
    on = torch.autograd.grad(s6.attention(q, k, v, is_causal=True), (q, k, v), do)
    assert g.BWD_LAUNCHES == bwd_before + 1, "the table's atomic_tma ran where the one-kernel backward takes the inputs"
    assert (g.LAUNCHES, g.DQ_LAUNCHES) == (before, dq_before), "a Gluon dK/dV or dQ kernel ran beside the one kernel"
    sep = torch.autograd.grad(s6.attention(q, k, v, is_causal=True, dq_mode="separate"), (q, k, v), do)
    assert (g.LAUNCHES, g.DQ_LAUNCHES) == (before + 1, dq_before + 1), \
        "dq_mode='separate' asked for: the Gluon dK/dV kernel and the Gluon dQ pass should run"
    s6.attention(q, k, v, is_causal=True, dq_mode="atomic_tma").sum().backward()
    monkeypatch.setenv("ATTN_GLUON_DKDV", "0")
    off = torch.autograd.grad(s6.attention(q, k, v, is_causal=True), (q, k, v), do)
    assert (g.LAUNCHES, g.DQ_LAUNCHES, g.BWD_LAUNCHES) == (before + 1, dq_before + 1, bwd_before + 1), \
        "a Gluon kernel ran with dq_mode='atomic_tma' asked for, or with the path off"
    for name, a, b, c in zip(("dQ", "dK", "dV"), on, sep, off):
        assert_close(a, b, name=f"{name}: one kernel against the two Gluon kernels", dtype=torch.bfloat16)
        assert_close(a, c, name=f"{name}: one kernel against atomic_tma", dtype=torch.bfloat16)


@pytest.mark.gpu
@needs_hopper
def test_one_kernel_backward_inside_torch_compile_and_deterministic_mode():
    """As CS336's leaderboard calls it, at a length the one-kernel backward covers: ``torch.compile(apply)``, (H, N,
    D) bf16, causal, ``o.sum().backward()``: it runs inside the compiled model, dK and dV the same bits every run
    (each CTA owns its keys), dQ (added by reduces in any order) close. Under ``torch.use_deterministic_algorithms``
    it does not run, and the two kernels give the same gradients."""
    s6, g = _step06_and_gluon()
    q, k, v = make_qkv(Nq=4096, Nk=4096, D=64, batch_shape=(4,), dtype=torch.bfloat16, device="cuda",
                       requires_grad=True)
    f = torch.compile(s6.FlashAttentionTriton.apply)
    runs = []
    for _ in range(2):
        before = g.BWD_LAUNCHES
        f(q, k, v, True).sum().backward()
        assert g.BWD_LAUNCHES == before + 1, "the compiled step 06 did not run the one-kernel backward"
        runs.append([t.grad.clone() for t in (q, k, v)])
        for t in (q, k, v):
            t.grad = None
    assert torch.equal(runs[0][1], runs[1][1]) and torch.equal(runs[0][2], runs[1][2]), "dK or dV not repeatable"
    torch.use_deterministic_algorithms(True)
    try:
        before = g.BWD_LAUNCHES
        s6.attention(q, k, v, is_causal=True).sum().backward()
        assert g.BWD_LAUNCHES == before, "the one-kernel backward ran under deterministic algorithms"
    finally:
        torch.use_deterministic_algorithms(False)
    for name, a, t in zip(("dQ", "dK", "dV"), runs[0], (q, k, v)):
        assert_close(a, t.grad, name=f"{name}: compiled one kernel against the deterministic two kernels",
                     dtype=torch.bfloat16)


def test_kernel_is_not_given_to_students(tmp_path):
    """solutions/gluon_dkdv.py has no stub (a whole dK/dV kernel would give step 06's regions away), and the release
    gate treats its code as the solution's: a folder holding a copy of it leaks."""
    import shutil

    from attnlib import stubgen
    from grading import leaks
    assert "gluon_dkdv.py" in stubgen.solution_only_files()
    assert "gluon_dkdv.py" not in stubgen.generate() and not (ROOT / "steps" / "gluon_dkdv.py").exists()
    shutil.copy(ROOT / "solutions" / "gluon_dkdv.py", tmp_path / "notes.py")
    found, _ = leaks.scan(tmp_path)
    assert any("gluon_dkdv.py" in str(x) for x in found), "the release gate does not see the Gluon kernel's code"
