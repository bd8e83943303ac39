"""Step 05's Hopper path: the solution's forward hands long sequences (N >= MIN_LEN under a causal mask, N >=
FULL_MIN_LEN without one) to its warp-specialized Gluon
kernel (solutions/gluon_fwd.py) on an sm_90 GPU where the kernel applies, and runs its Triton kernel everywhere else.

On a CPU: which inputs the kernel covers; the routing through step 05's ``forward`` with a stand-in for the hook; the
stub's step 05 has no such path; the kernel is not given to students; the tiles are the experiment's measured best
(its sm_90a compile is checked in tests/test_experiment_gluon_fwd_ws.py). On a Hopper GPU: the kernel runs, O and
the gradients through step 06 against float64 as the course checks every step, at MIN_LEN and (MIN_LEN lowered) at
ragged N, and the fallbacks.
"""

import importlib
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported; conftest does the same

import pytest  # noqa: E402

from attnlib import make_qkv  # noqa: E402
from attnlib.checks import check_attention  # noqa: E402
from attnlib.compare import assert_close  # noqa: E402
from attnlib.loader import load_step  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GPU = torch.cuda.is_available()
HOPPER = GPU and torch.cuda.get_device_capability()[0] == 9
pytestmark = [pytest.mark.step05,
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]  # interpreter


def _step05_and_gluon():
    """Step 05's solution and the Gluon module it imports (the loader gives solutions/ a package name of its own)."""
    s5 = load_step(5, "solutions")
    return s5, importlib.import_module(f"{s5.__package__}.gluon_fwd")


@pytest.fixture(autouse=True)
def _gluon_on(monkeypatch):
    """The path as step 05 ships it, whatever the process's environment."""
    monkeypatch.setenv("ATTN_GLUON_FWD", "1")


def _views(shape, dtype=torch.bfloat16):
    return [torch.empty(shape, dtype=dtype) for _ in range(3)]


def test_covers_what_was_measured_and_nothing_else():
    _, g = _step05_and_gluon()
    n, nf = g.MIN_LEN, g.FULL_MIN_LEN
    # Both from N=4096: under a causal mask since its heads are taken in groups (fwd_tile_order_1204), without one
    # since gluon_fwd_ws_1203_round2.
    assert n == nf == 4096, (n, nf)
    assert g.shape_reason(*_views((1, 16, nf, 64)), False) is None
    assert g.shape_reason(*_views((4, 16, nf, 128)), False) is None
    for views, causal, why in ((_views((1, 16, n - 64, 64)), True, f"with a causal mask: the path lost or tied below "
                                                                   f"N={n}"),
                               (_views((1, 16, nf - 64, 64)), False, f"without a causal mask: the path lost or tied "
                                                                     f"below N={nf}")):
        reason = g.shape_reason(*views, causal)
        assert reason and why in reason, f"{why}: {reason}"
    assert g.shape_reason(*_views((1, 16, n, 64))) is None
    assert g.shape_reason(*_views((2, 1, 2 * n, 128), torch.float16)) is None
    assert g.shape_reason(*_views((1, 2, n + 64, 64))) is None
    q = _views((1, 2, n, 64))
    for views, why in (
            (_views((1, 2, n - 64, 64)), f"below N={n}"),
            (_views((1, 2, n + 32, 64)), "multiple of 64"),
            (_views((1, 2, n, 96)), "D=96"),
            (_views((1, 2, n, 64), torch.float32), "16-bit"),
            (q[:1] + _views((1, 2, 2 * n, 64))[1:], "self-attention"),
            ([t.transpose(1, 2).contiguous().transpose(1, 2) for t in q], "contiguous")):
        reason = g.shape_reason(*views)
        assert reason and why in reason, f"{why}: {reason}"
    if not HOPPER:
        assert g.device_reason(q[0]), "a CPU tensor is not refused by the Hopper path"


def test_tiles_are_the_experiments_measured_best():
    """The solution's tiles are the variants bench/experiments/gluon_fwd_ws.py measured best at N=16384, and the
    experiment times the solution's kernel, not a copy."""
    import importlib.util
    _, g = _step05_and_gluon()
    spec = importlib.util.spec_from_file_location("gluon_fwd_ws", ROOT / "bench" / "experiments" / "gluon_fwd_ws.py")
    exp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(exp)
    assert g.TILES[64] == exp.VARIANTS["ws 3wg n128 s2"][:6]
    assert g.TILES[128] == exp.VARIANTS["ws 2wg n128 s3"][:6]
    assert exp._gluon_fwd_ws.fn.__module__.endswith("gluon_fwd")


@pytest.mark.skipif(GPU, reason="the stand-in runs on a CPU")
def test_step05_forward_asks_the_hook_first_when_not_told(monkeypatch):
    """``forward`` with neither ``tma`` nor ``config`` asks ``hopper_fwd`` first and returns what it gives; a call
    that names its kernel (tma=False, a config) never reaches it; a hook that declines (None) leaves the Triton
    kernel's result."""
    s5, _ = _step05_and_gluon()
    q, k, v = make_qkv(Nq=64, Nk=64, D=16, batch_shape=(1, 1), dtype=torch.float32)
    calls = []
    sentinel = (torch.zeros(1), torch.ones(1))

    def take(*a):
        calls.append(a)
        return sentinel
    monkeypatch.setattr(s5, "hopper_fwd", take)
    assert s5.forward(q, k, v, True, 0.25) is sentinel and len(calls) == 1
    assert calls[0][3:] == (True, 0.25)
    o, lse = s5.forward(q, k, v, True, 0.25, tma=False)
    assert len(calls) == 1 and o.shape == q.shape
    monkeypatch.setattr(s5, "hopper_fwd", lambda *a: None)
    o2, lse2 = s5.forward(q, k, v, True, 0.25)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


def test_stub_step05_has_no_gluon_path():
    """The stub's step 05 runs the student's Triton kernel on every GPU: the solution's import of the Gluon hook is
    SOLUTION-ONLY, and what stays is the hook that declines."""
    from attnlib.stubgen import make_stub
    sol = (ROOT / "solutions" / "step05_triton_fwd.py").read_text()
    assert "import launch_if_covered as hopper_fwd" in sol
    stub = make_stub(sol, "step05_triton_fwd.py")
    assert "gluon_fwd import" not in stub, "the stub of step 05 imports the solution's Gluon kernel"
    assert (ROOT / "steps" / "step05_triton_fwd.py").read_text() == stub, "steps/ is stale: `make stubs`"
    ns = {}
    start = stub.index("def hopper_fwd(")
    exec(stub[start:stub.index("\n\n\n", start)], ns)
    assert ns["hopper_fwd"](*[None] * 5) is None


def _ops_in_graph(gm) -> set:
    """The operators a Dynamo graph calls, its subgraphs' (an autograd.Function's forward body) included."""
    return {str(n.target) for m in gm.modules() if isinstance(m, torch.fx.GraphModule) for n in m.graph.nodes
            if n.op == "call_function"}


@pytest.mark.skipif(GPU, reason="forced on a CPU; on Hopper test_compiled_call_runs_the_gluon_kernel")
@pytest.mark.parametrize("step", [5, 6])
def test_compiler_picks_the_opaque_forward_where_the_hook_takes(monkeypatch, step):
    """While Dynamo traces ``FlashAttention*.apply`` (fullgraph), ``run_fwd`` asks the hook whether the other kernel
    would take the inputs: where it would, the graph holds the opaque operator (which a compiled graph calls with real
    tensors, so the Gluon kernel runs); elsewhere the triton_op. The device half of the question is forced here (a
    CPU has no Hopper), with the same ``assume_constant_result`` the real one carries; and the device question is
    asked of the compiler once, not a graph break."""
    _, g = _step05_and_gluon()
    s = load_step(step, "solutions")
    fn = s.FlashAttentionTriton if step == 6 else s.FlashAttentionTritonFwd
    monkeypatch.setattr(g, "MIN_LEN", 64)
    q, k, v = make_qkv(Nq=64, Nk=64, D=64, batch_shape=(1,), dtype=torch.float16, requires_grad=True)
    eager = fn.apply(q, k, v, True)
    for takes, name in ((False, f"step0{step}_fwd.default"), (True, f"step0{step}_fwd_opaque.default")):
        monkeypatch.setattr(g, "device_takes", torch.compiler.assume_constant_result(lambda t, i, takes=takes: takes))
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward
        torch._dynamo.reset()
        out = torch.compile(fn.apply, backend=backend, fullgraph=True)(q, k, v, True)
        assert len(graphs) == 1
        ops = {o.rpartition(".")[0].rpartition(".")[2] + ".default" for o in _ops_in_graph(graphs[0])
               if o.endswith(".default")}
        assert name in ops, f"hook says {takes}: the compiled graph calls {sorted(ops)}, not {name}"
        torch.testing.assert_close(out, eager, atol=0, rtol=0)
    # Dynamic shapes (a model fed sequences of several lengths): the choice becomes guards on N, and each length
    # gets the operator its own answer asks for (N=96 is not a multiple of 64: the triton_op).
    torch._dynamo.reset()
    graphs = []

    def record(gm, example_inputs):
        graphs.append(_ops_in_graph(gm))
        return gm.forward
    compiled = torch.compile(fn.apply, backend=record, dynamic=True, fullgraph=True)
    for n, opaque in ((64, True), (128, True), (96, False)):
        qn, kn, vn = make_qkv(Nq=n, Nk=n, D=64, batch_shape=(1,), dtype=torch.float16, seed=n)
        torch.testing.assert_close(compiled(qn, kn, vn, True), fn.apply(qn, kn, vn, True), atol=0, rtol=0)
        assert any(f"step0{step}_fwd_opaque" in o for o in graphs[-1]) == opaque, (n, graphs[-1])
    torch._dynamo.reset()
    q2 = make_qkv(Nq=64, Nk=64, D=32, batch_shape=(1,), dtype=torch.float16)[0]
    assert not s.hopper_fwd_takes(q2, q2, q2, True), "a head dim the kernel does not cover was taken"
    # The mask is part of the question: N=64 with MIN_LEN (causal) left at 8192 and FULL_MIN_LEN lowered to 64, the
    # call without a mask gets the opaque operator and the causal one the triton_op.
    monkeypatch.setattr(g, "MIN_LEN", 8192)
    monkeypatch.setattr(g, "FULL_MIN_LEN", 64)
    monkeypatch.setattr(g, "device_takes", torch.compiler.assume_constant_result(lambda t, i: True))
    for causal in (False, True):
        graphs = []
        torch._dynamo.reset()
        out = torch.compile(fn.apply, backend=record, fullgraph=True)(q, k, v, causal)
        torch.testing.assert_close(out, fn.apply(q, k, v, causal), atol=0, rtol=0)
        assert any(f"step0{step}_fwd_opaque" in o for o in graphs[-1]) == (not causal), (causal, graphs[-1])
    torch._dynamo.reset()


def test_kernel_is_not_given_to_students(tmp_path):
    """solutions/gluon_fwd.py has no stub (a whole forward kernel would give step 05's regions away), and the release
    gate treats its code as the solution's: a folder holding a copy of it leaks."""
    import shutil

    from attnlib import stubgen
    from grading import leaks
    assert "gluon_fwd.py" in stubgen.solution_only_files()
    assert "gluon_fwd.py" not in stubgen.generate() and not (ROOT / "steps" / "gluon_fwd.py").exists()
    shutil.copy(ROOT / "solutions" / "gluon_fwd.py", tmp_path / "notes.py")
    found, _ = leaks.scan(tmp_path)
    assert any("gluon_fwd.py" in str(x) for x in found), "the release gate does not see the Gluon kernel's code"


# %% On a Hopper GPU ------------------------------------------------------------------------------------------------

needs_hopper = pytest.mark.skipif(not HOPPER, reason="the Gluon kernel runs on an sm_90 GPU (Hopper) only")


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d, dtype", [(64, torch.bfloat16), (128, torch.bfloat16), (64, torch.float16)],
                         ids=["d64-bf16", "d128-bf16", "d64-fp16"])
def test_hopper_path_at_min_len(d, dtype, is_causal):
    """Step 05's solution at N = MIN_LEN (causal) or FULL_MIN_LEN (not) on Hopper: the Gluon kernel runs and O passes
    the course's float64 check; through step 06 (its forward is step 05's) dQ, dK, dV pass too."""
    s5, g = _step05_and_gluon()
    n = g.MIN_LEN if is_causal else g.FULL_MIN_LEN
    q, k, v = make_qkv(Nq=n, Nk=n, D=d, batch_shape=(1, 1), dtype=dtype, device="cuda")
    before = g.LAUNCHES
    check_attention(s5.attention, q, k, v, is_causal=is_causal, grads=False)
    assert g.LAUNCHES == before + 1, "step 05's forward did not run the Gluon kernel on Hopper at MIN_LEN"
    want = "persistent" if not is_causal and d in g.PERSISTENT_TILES else "ws"
    assert g.LAST_KERNEL == want, f"ran the {g.LAST_KERNEL} kernel, want {want}"
    if d == 64 and dtype == torch.bfloat16:
        s6 = load_step(6, "solutions")
        check_attention(s6.attention, q, k, v, is_causal=is_causal)
        assert g.LAUNCHES == before + 2, "step 06's forward did not run step 05's Gluon kernel"


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("n, d, is_causal, batch", [(1088, 64, True, (3,)), (1088, 64, False, (3,)),
                                                    (1088, 64, False, (5, 31)), (4032, 128, False, (3,)),
                                                    (2112, 128, True, (3,))])
def test_hopper_path_ragged_n(monkeypatch, n, d, is_causal, batch):
    """MIN_LEN lowered so that short, ragged N take the kernel: N not a multiple of the 128-key tiles nor of the
    CTA's 128 or 192 rows (the last key tile masked, the rows past N not stored), odd batch x heads. At D=64 without
    a mask the persistent kernel: with 155 heads, 930 work tiles on the H200's 132 CTAs, each CTA walks 7-8 of them
    (Q's two buffers and the K/V ring carried from one tile to the next)."""
    s5, g = _step05_and_gluon()
    monkeypatch.setattr(g, "MIN_LEN", 64)
    monkeypatch.setattr(g, "FULL_MIN_LEN", 64)
    q, k, v = make_qkv(Nq=n, Nk=n, D=d, batch_shape=batch, dtype=torch.bfloat16, device="cuda")
    before = g.LAUNCHES
    check_attention(s5.attention, q, k, v, is_causal=is_causal, grads=False)
    assert g.LAUNCHES == before + 1
    assert g.LAST_KERNEL == ("persistent" if not is_causal and d in g.PERSISTENT_TILES else "ws")


@pytest.mark.gpu
@needs_hopper
def test_hopper_path_off_and_fallbacks(monkeypatch):
    """``ATTN_GLUON_FWD=0``, a call that names its kernel, and inputs below MIN_LEN (causal) or FULL_MIN_LEN (not) take
    step 05's Triton kernel: no launch; with the path on, O from the Gluon kernel is close to the Triton kernel's (within the course's bf16
    comparison: the two round differently) and LSE too."""
    s5, g = _step05_and_gluon()
    n = g.MIN_LEN
    q, k, v = make_qkv(Nq=n, Nk=n, D=64, batch_shape=(1, 1), dtype=torch.bfloat16, device="cuda")
    before = g.LAUNCHES
    on = s5.forward(q, k, v, True, 0.125)
    assert g.LAUNCHES == before + 1
    off = s5.forward(q, k, v, True, 0.125, tma=False)
    monkeypatch.setenv("ATTN_GLUON_FWD", "0")
    s5.forward(q, k, v, True, 0.125)
    monkeypatch.setenv("ATTN_GLUON_FWD", "1")
    q2, k2, v2 = make_qkv(Nq=n - 64, Nk=n - 64, D=64, batch_shape=(1, 1), dtype=torch.bfloat16, device="cuda")
    s5.forward(q2, k2, v2, True, 0.125)
    assert g.LAUNCHES == before + 1, "the Gluon kernel ran where it was turned off, not asked for, or not covering"
    nf = g.FULL_MIN_LEN
    q3, k3, v3 = make_qkv(Nq=nf, Nk=nf, D=64, batch_shape=(1, 1), dtype=torch.bfloat16, device="cuda")
    s5.forward(q3, k3, v3, False, 0.125)
    assert g.LAUNCHES == before + 2, f"the Gluon kernel did not run at N=FULL_MIN_LEN={nf} without a causal mask"
    # Two kernels, two summation orders: O a bf16 rounding apart here and there (the course's bf16 comparison), LSE
    # in fp32. Each against float64 is test_hopper_path_at_min_len's.
    assert_close(on[0], off[0], name="O: Gluon path against Triton kernel", dtype=torch.bfloat16)
    torch.testing.assert_close(on[1], off[1], atol=1e-4, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.slow
@needs_hopper
@pytest.mark.parametrize("step", [5, 6])
def test_compiled_call_runs_the_gluon_kernel(step):
    """``torch.compile(FlashAttention*.apply)``, fullgraph, as CS336's harness compiles it, at N = MIN_LEN on Hopper:
    the compiled call runs the Gluon kernel as the eager call does (the graph holds the opaque operator: a triton_op
    would have Inductor relaunch the Triton kernel instead), O bitwise the eager call's; through step 06 the gradients
    too, within the course's comparison."""
    _, g = _step05_and_gluon()
    s = load_step(step, "solutions")
    fn = s.FlashAttentionTriton if step == 6 else s.FlashAttentionTritonFwd
    q, k, v = make_qkv(Nq=g.MIN_LEN, Nk=g.MIN_LEN, D=64, batch_shape=(2,), dtype=torch.bfloat16, device="cuda",
                       requires_grad=True)
    torch._dynamo.reset()
    results = []
    for label, f in (("eager", fn.apply), ("compiled", torch.compile(fn.apply, fullgraph=True))):
        before = g.LAUNCHES
        o = f(q, k, v, True)
        assert g.LAUNCHES == before + 1, f"step {step}, {label}: the Gluon kernel did not run"
        results.append((o.detach(), *(torch.autograd.grad(o.sum(), (q, k, v)) if step == 6 else ())))
    assert torch.equal(results[0][0], results[1][0]), "compiled O is not the eager call's"
    for name, a, b in zip(("dQ", "dK", "dV"), results[0][1:], results[1][1:]):
        assert_close(b, a, name=f"compiled {name} against eager", dtype=torch.bfloat16)
    torch._dynamo.reset()
