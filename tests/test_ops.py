"""Steps 05-07 as PyTorch operators: registered right, and usable inside a compiled model.

- ``torch.library.opcheck`` on every operator: schema, fake (meta) implementation, the
  autograd registration, and tracing through AOTAutograd (static and dynamic shapes).
- a two-layer attention block built on the step's operator, ``torch.compile(fullgraph=True)``:
  it compiles once, and its outputs and gradients match the same block run eagerly.

On a CPU the Triton operators run in the interpreter (fp32 and fp16, small sizes; there
they are opaque custom ops, attnlib/ops.py says why); on a GPU fp16 and bf16, and step 07.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported; conftest does the same

import pytest  # noqa: E402

from attnlib import make_dout, make_qkv  # noqa: E402
from attnlib.compare import tolerance_for  # noqa: E402

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
LOWP = [torch.float16, torch.bfloat16] if GPU else [torch.float16]
dt = lambda d: str(d).replace("torch.", "")  # noqa: E731
CAUSAL = [False, True] if GPU else [True]      # a compile on a CPU costs ~20 s: one variant there
needs_gpu = pytest.mark.skipif(not GPU, reason="step 07's CUDA kernels need a GPU")
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")  # interpreter


def _opcheck(op, args):
    # test_aot_dispatch_dynamic traces with symbolic shapes; every test runs the op on real inputs too.
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_autograd_registration",
                                                "test_faketensor", "test_aot_dispatch_static",
                                                "test_aot_dispatch_dynamic"))


OPCHECK_DTYPES = [torch.float32, *LOWP] if GPU else [torch.float32]   # each opcheck is ~20 s interpreted


@pytest.mark.step05
@pytest.mark.parametrize("dtype", OPCHECK_DTYPES, ids=dt)
def test_opcheck_step05(load, dtype):
    step = load(5)
    q, k, v = make_qkv(2, 2, 40, 33, 32, dtype=dtype, device=DEVICE, requires_grad=True)
    _opcheck(step.fwd_op, (q, k, v, True, 0.3))
    if GPU:   # the same forward registered opaque (run_fwd's choice where hopper_fwd takes the inputs)
        _opcheck(step.fwd_op_opaque, (q, k, v, True, 0.3))


@pytest.mark.step06
@pytest.mark.parametrize("dtype", OPCHECK_DTYPES, ids=dt)
def test_opcheck_step06(load, dtype):
    step = load(6)
    q, k, v = make_qkv(2, 2, 40, 33, 32, dtype=dtype, device=DEVICE, requires_grad=True)
    _opcheck(step.fwd_op, (q, k, v, True, 0.3))
    if GPU:   # on a CPU both are opaque and the same; an opcheck there costs ~20 s
        _opcheck(step.fwd_op_opaque, (q, k, v, True, 0.3))
    o, lse = step.fwd_op(q.detach(), k.detach(), v.detach(), True, 0.3)
    do = make_dout(o)
    for mode in (None, "atomic", "fused"):
        _opcheck(step.bwd_op, (q.detach(), k.detach(), v.detach(), o, lse, do, True, 0.3, mode))


@pytest.mark.step07
@needs_gpu
@pytest.mark.parametrize("dtype", LOWP, ids=dt)
def test_opcheck_step07(load, dtype):
    step = load(7)
    q, k, v = make_qkv(2, 2, 100, 77, 64, dtype=dtype, device=DEVICE, requires_grad=True)
    _opcheck(step.fwd_op, (q, k, v, True, 0.125, 3, 0))
    o, lse = step.fwd_op(q.detach(), k.detach(), v.detach(), True, 0.125, 3, 0)
    _opcheck(step.bwd_op, (q.detach(), k.detach(), v.detach(), o, lse, make_dout(o), True, 0.125, 2))


class Block(torch.nn.Module):
    """Two layers of multi-head self-attention with projections and residuals, as a model has them."""

    def __init__(self, attn, dim, heads, dtype, device, is_causal):
        super().__init__()
        self.attn, self.heads, self.is_causal = attn, heads, is_causal
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(dim, 3 * dim, dtype=dtype, device=device) for _ in range(2))
        self.out = torch.nn.ModuleList(torch.nn.Linear(dim, dim, dtype=dtype, device=device) for _ in range(2))

    def forward(self, x):                                             # x: (B, N, C)
        B, N, C = x.shape
        for qkv, out in zip(self.qkv, self.out):
            q, k, v = qkv(x).view(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)  # 3 x (B, h, N, d)
            y = self.attn(q, k, v, self.is_causal)                    # (B, h, N, d)
            x = x + out(y.transpose(1, 2).reshape(B, N, C))
        return x


def _compiled_matches_eager(attn, dtype, is_causal, dim=128, heads=2, n=80):
    torch.manual_seed(0)
    block = Block(attn, dim, heads, dtype, DEVICE, is_causal)
    x = torch.randn(2, n, dim, dtype=dtype, device=DEVICE)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(block, fullgraph=True)
    results = []
    for model in (block, compiled):
        model.zero_grad(set_to_none=True)
        xg = x.clone().requires_grad_(True)
        y = model(xg)
        y.float().square().mean().backward()
        results.append([y, xg.grad] + [p.grad for p in block.parameters()])
    y2 = compiled(x.clone().requires_grad_(True))          # same shapes: no recompilation
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1, (
        f"the block compiled {torch._dynamo.utils.counters['stats']['unique_graphs']} graphs, expected 1")
    atol, rtol = tolerance_for(dtype)
    names = ["output", "dx"] + [f"d{name}" for name, _ in block.named_parameters()]
    for name, eager, comp in zip(names, *results):
        assert comp is not None, f"{name}: no gradient in the compiled model"
        torch.testing.assert_close(comp.float(), eager.float(), atol=4 * atol, rtol=4 * rtol,
                                   msg=lambda m, name=name: f"compiled vs eager, {name}: {m}")
    torch.testing.assert_close(y2, results[1][0])


@pytest.mark.slow
@pytest.mark.step06
@pytest.mark.parametrize("is_causal", CAUSAL, ids=lambda c: "causal" if c else "full")
@pytest.mark.parametrize("dtype", LOWP if GPU else [torch.float32], ids=dt)
@pytest.mark.parametrize("via", ["function", "operator"] if GPU else ["function"])   # ~15 s a compile on a CPU
def test_compiled_block_trains_step06(load, dtype, is_causal, via):
    """fullgraph compile of a model calling step 06: through FlashAttentionTriton.apply (what CS336's
    harness compiles) and through the bare operator (its registered autograd)."""
    step = load(6)
    if via == "function":
        attn = lambda q, k, v, c: step.FlashAttentionTriton.apply(q, k, v, c)  # noqa: E731
    else:
        attn = lambda q, k, v, c: step.fwd_op(q, k, v, c, q.shape[-1] ** -0.5)[0]  # noqa: E731
    _compiled_matches_eager(attn, dtype, is_causal)


@pytest.mark.slow
@pytest.mark.step06
@pytest.mark.skipif(not GPU, reason="TMA under torch.compile: the interpreter's descriptors are not Inductor's")
def test_compiled_block_trains_step06_d128(load):
    """Head dim 128, N = 2048: on an sm_90 GPU step 05's forward takes its TMA kernel by default
    (tma_by_default), which a compiled graph runs with descriptors built in the kernel; the block must
    compile once and train."""
    step = load(6)
    _compiled_matches_eager(lambda q, k, v, c: step.FlashAttentionTriton.apply(q, k, v, c), torch.bfloat16, True,
                            dim=256, n=load(5).TMA_MIN_LEN)


@pytest.mark.slow
@pytest.mark.step05
@pytest.mark.skipif(not GPU, reason="on a CPU, tests/test_cs336.py compiles step 05's Function already (15 s each)")
@pytest.mark.parametrize("dtype", LOWP, ids=dt)
def test_compiled_block_trains_step05(load, dtype):
    step = load(5)
    _compiled_matches_eager(lambda q, k, v, c: step.FlashAttentionTritonFwd.apply(q, k, v, c), dtype, True)


@pytest.mark.slow
@pytest.mark.step07
@needs_gpu
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", LOWP, ids=dt)
def test_compiled_block_trains_step07(load, dtype, is_causal):
    step = load(7)
    _compiled_matches_eager(lambda q, k, v, c: step.FlashAttentionCUDA.apply(q, k, v, c), dtype, is_causal)


@pytest.mark.step06
@pytest.mark.skipif(not GPU, reason="under the interpreter the operators are opaque custom ops")
def test_compile_caches_see_the_kernels(load):
    """PyTorch's compile caches key a triton_op on its kernels' source: they must find every kernel."""
    from torch._library.triton import get_triton_kernels_for_op
    step = load(6)
    for op, names in ((step.fwd_op, {"_attn_fwd_kernel"}),):     # step06_bwd is opaque (ops.py says why)
        found = {getattr(k, "fn", k).__name__ for k in get_triton_kernels_for_op(op._name)}
        assert names <= found, f"{op._name}: the cache key misses {sorted(names - found)} (found {sorted(found)})"


@pytest.mark.step08
@pytest.mark.parametrize("dtype", OPCHECK_DTYPES, ids=dt)
def test_opcheck_step08(load, dtype):
    step = load(8)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(45, 4, 16, generator=g).to(DEVICE, dtype).requires_grad_(True)
    k, v = (torch.randn(38, 2, 16, generator=g).to(DEVICE, dtype).requires_grad_(True) for _ in range(2))
    cu_q = torch.tensor([0, 20, 20, 45], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 13, 13, 38], dtype=torch.int32, device=DEVICE)
    _opcheck(step.fwd_op, (q, k, v, cu_q, cu_k, 25, 25, True, 0.25))
    o, lse = step.fwd_op(q.detach(), k.detach(), v.detach(), cu_q, cu_k, 25, 25, True, 0.25)
    _opcheck(step.bwd_op, (q.detach(), k.detach(), v.detach(), o, lse, make_dout(o), cu_q, cu_k, 25, 25, True, 0.25))


@pytest.mark.step09
@pytest.mark.parametrize("dtype", OPCHECK_DTYPES, ids=dt)
def test_opcheck_step09(load, dtype):
    step = load(9)
    q, k, v = make_qkv(1, 2, 70, 70, 16, dtype=dtype, device=DEVICE, requires_grad=True)
    _opcheck(step.fwd_op, (q, k, v, 9, 5, True, 0.25))
    o, lse = step.fwd_op(q.detach(), k.detach(), v.detach(), 9, 5, True, 0.25)
    _opcheck(step.bwd_op, (q.detach(), k.detach(), v.detach(), o, lse, make_dout(o), 9, 5, True, 0.25))



def test_direct_launches_switches_wrap_triton_off_for_real_tensors_only():
    """``direct_launches`` turns ``wrap_triton`` off for plain tensors and leaves it on for a tracer's."""
    from torch._library.triton import is_wrap_triton_enabled
    from torch._subclasses.fake_tensor import FakeTensorMode

    from attnlib.ops import direct_launches

    seen = []
    launcher = direct_launches(lambda *ts, **kw: seen.append(is_wrap_triton_enabled()))
    launcher(torch.zeros(2), torch.ones(2))
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.zeros(2))
        launcher(torch.zeros(2), fake)
        launcher(torch.zeros(2), x=fake)
    assert seen == [False, True, True], seen
    assert is_wrap_triton_enabled(), "direct_launches left wrap_triton off after the call"



def test_eager_fast_calls_the_function_eagerly_and_the_operator_when_traced():
    """``eager_fast``: the function in eager mode with grad off and plain tensors; the operator otherwise."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from attnlib.ops import eager_fast

    calls = []
    run = eager_fast(lambda x: calls.append("op") or x, lambda x: calls.append("fn") or x)
    x = torch.zeros(2)
    with torch.no_grad():
        run(x)                                   # eager, as inside an autograd.Function: the function
        with FakeTensorMode() as mode:
            run(mode.from_tensor(x))             # AOTAutograd's FakeTensors: the operator
    run(x)                                       # grad mode on: the operator (its autograd formula)
    with torch.no_grad():                        # Dynamo traces (grad off, as in a Function): the operator
        torch.compile(lambda t: run(t) + 1, backend="eager", fullgraph=True)(x)
    assert calls == ["fn", "op", "op", "op"], calls


@pytest.mark.step06
@pytest.mark.skipif(not GPU, reason="under the interpreter wrap_triton returns the kernel itself: no HOP path to avoid")
@pytest.mark.parametrize("how", ["autograd", "direct"])
def test_eager_launches_skip_the_hop_path(load, how, monkeypatch):
    """An eager call launches Triton directly, not through PyTorch's higher-order-operator path.

    ``wrap_triton`` is on by default outside a ``triton_op``'s own call (the opaque backward, the
    autograd thread, a launcher called directly): each launch then went through the HOP path, about
    0.25 ms of host time per launch on an H200 host (results/h200/host/). Fails if a launcher loses
    ``@direct_launches``: wrap_triton builds its traceable wrapper only when it is on.
    """
    from torch._higher_order_ops.triton_kernel_wrap import TraceableTritonKernelWrapper

    made = []
    real_init = TraceableTritonKernelWrapper.__init__

    def spy(self, *args, **kwargs):
        made.append(1)
        real_init(self, *args, **kwargs)
    monkeypatch.setattr(TraceableTritonKernelWrapper, "__init__", spy)
    step = load(6)
    q, k, v = make_qkv(1, 2, 256, 256, 64, dtype=torch.bfloat16, device=DEVICE, requires_grad=True)
    if how == "autograd":
        step.attention(q, k, v, True).backward(make_dout(q))
    else:
        o, lse = step.attention_with_lse(q.detach(), k.detach(), v.detach(), True)
        step.backward(q.detach(), k.detach(), v.detach(), o, lse, make_dout(o), True, 0.125)
    torch.cuda.synchronize()
    assert not made, (f"{len(made)} launches went through PyTorch's higher-order-operator path (wrap_triton "
                      "enabled): decorate the launcher with attnlib.ops.direct_launches")
