"""Step 06: the Triton backward kernels, dQ, dK, dV against the float64 reference.

Without a GPU the kernels run in Triton's interpreter (fp32 and fp16, small sizes);
bf16 runs on a GPU only: the interpreter's bf16 ``tl.dot`` gives wrong results.
"""

import functools
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported; conftest does the same

import pytest  # noqa: E402

from attnlib import make_dout, make_qkv, reference_backward  # noqa: E402
from attnlib.cases import INTERPRETED_CASES, INTERPRETER_BF16_SKIP, Case  # noqa: E402
from attnlib.checks import check_attention, check_saved_lse  # noqa: E402
from attnlib.compare import assert_close  # noqa: E402

pytestmark = [pytest.mark.step06,
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]  # interpreter

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
BF16_SKIP = INTERPRETER_BF16_SKIP
DTYPES = [torch.float32, torch.float16]

CASES = INTERPRETED_CASES
ids = lambda x: x.id if isinstance(x, Case) else str(x).replace("torch.", "")  # noqa: E731


def qkv(case, dtype, seed=0):
    return make_qkv(Nq=case.nq, Nk=case.nk, D=case.d, batch_shape=case.batch, dtype=dtype, device=DEVICE,
                    seed=seed)


def with_mode(step, dq_mode, config=None):
    def attn(q, k, v, is_causal=False, scale=None):
        return step.attention(q, k, v, is_causal=is_causal, scale=scale, dq_mode=dq_mode)
    return attn


def assert_grads(grads, refs, context):
    """dQ, dK, dV against the reference's; a failure names the tensor and its rows (query or key)."""
    for name, g, ref in zip(("dQ", "dK", "dV"), grads, refs, strict=True):
        assert_close(g, ref, name=name, context=context, row_label="query rows" if name == "dQ" else "key rows")


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("case", CASES, ids=ids)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_gradients(load, case, dtype, is_causal):
    step = load(6)
    check_attention(step.attention, *qkv(case, dtype), is_causal=is_causal)


@pytest.mark.parametrize("case", [CASES[1], CASES[3], CASES[4], CASES[5]], ids=ids)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_gradients_atomic_dq(load, case, is_causal):
    """dQ accumulated with atomic adds inside the dK/dV kernel instead of a second pass."""
    step = load(6)
    check_attention(with_mode(step, "atomic"), *qkv(case, torch.float32), is_causal=is_causal)


FUSED_CASES = [(c, torch.float32) for c in (CASES[0], CASES[3], CASES[4], CASES[5])] + \
    [(c, torch.float16) for c in (CASES[3], CASES[5])]


@pytest.mark.parametrize("case, dtype", FUSED_CASES, ids=lambda x: ids(x))
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_gradients_fused(load, case, dtype, is_causal):
    """dK/dV and dQ in one launch: program j does key tile j, then query tile j. Nq != Nk both
    ways leaves programs with only one of the two phases to do."""
    step = load(6)
    check_attention(with_mode(step, "fused"), *qkv(case, dtype), is_causal=is_causal)


@functools.lru_cache(maxsize=None)
def _forward(step5, batch, heads, nq, nk, d, is_causal):
    """q, k, v, dO and step 05's (O, LSE) for the tests below that run the backward with several configs
    on the same inputs: step 05's forward interpreted once a process for each, not once a test (a cached
    function, not a module fixture: the gpu-check's rule for those). Each caller gets copies."""
    q, k, v = make_qkv(batch, heads, nq, nk, d, device=DEVICE, seed=nq)
    dout = make_dout(q)
    o, lse = step5.forward(q, k, v, is_causal, d ** -0.5)
    return q, k, v, dout, o, lse


def forward(step5, batch, heads, nq, nk, d, is_causal):
    return tuple(t.clone() for t in _forward(step5, batch, heads, nq, nk, d, is_causal))


TILES = [dict(dkdv=(16, 32), dq=(32, 16)), dict(dkdv=(32, 16), dq=(16, 32)), dict(dkdv=(64, 64), dq=(64, 64))]


@pytest.mark.parametrize("tiles", TILES, ids=lambda t: f"dkdv{t['dkdv'][0]}x{t['dkdv'][1]}-dq{t['dq'][0]}x{t['dq'][1]}")
@pytest.mark.parametrize("dq_mode", ["separate", "atomic"])
def test_tile_sizes(load, tiles, dq_mode):
    """Any (BLOCK_M, BLOCK_N) for either kernel, causal, with Nq and Nk that no tile divides."""
    step, step5 = load(6), load(5)
    cfg = dict(pre=dict(BLOCK_M=16), dq_mode=dq_mode,
               **{kern: dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=4, num_stages=1)
                  for kern, (bm, bn) in tiles.items()})
    for nq, nk in ((50, 75), (75, 50)):
        q, k, v, dout, o, lse = forward(step5, 1, 2, nq, nk, 32, True)
        grads = step.backward(q, k, v, o, lse, dout, True, 32 ** -0.5, config=cfg)
        assert_grads(grads, reference_backward(q, k, v, dout, True),
                     f"causal, Nq={nq}, Nk={nk}, tiles {tiles}, {dq_mode}")


@pytest.mark.parametrize("early_dp", [False, True], ids=["late-dp", "early-dp"])
@pytest.mark.parametrize("heads_first", [False, True], ids=["tiles-first", "heads-first"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_launch_order_and_early_dp(load, early_dp, heads_first, is_causal):
    """The two switches the tile table sets per shape (EARLY_DP: dP issued before the exponentials;
    HEADS_FIRST: grid (B*H, tiles)) give the same gradients, both kernels, two batches x three heads
    so that a grid read along the wrong axis computes another head's tile."""
    step, step5 = load(6), load(5)
    flags = dict(num_warps=4, num_stages=1, EARLY_DP=early_dp, HEADS_FIRST=heads_first)
    cfg = dict(pre=dict(BLOCK_M=16), dq_mode="separate",
               dkdv=dict(BLOCK_M=16, BLOCK_N=32, **flags), dq=dict(BLOCK_M=32, BLOCK_N=16, **flags))
    for nq, nk in ((50, 75), (75, 50)):
        q, k, v, dout, o, lse = forward(step5, 2, 3, nq, nk, 32, is_causal)
        grads = step.backward(q, k, v, o, lse, dout, is_causal, 32 ** -0.5, config=cfg)
        assert_grads(grads, reference_backward(q, k, v, dout, is_causal),
                     f"{'causal' if is_causal else 'full'}, Nq={nq}, Nk={nk}, EARLY_DP={early_dp}, HEADS_FIRST={heads_first}")


# (BLOCK_M1, BLOCK_N1) of the dK/dV phase, (BLOCK_M2, BLOCK_N2) of the dQ phase; None: derived from dkdv/dq.
FUSED_TILES = [(16, 64, 32, 16), (32, 16, 64, 32), None]


@pytest.mark.parametrize("tiles", FUSED_TILES, ids=lambda t: "derived" if t is None else "dkdv{}x{}-dq{}x{}".format(*t))
def test_fused_tile_sizes(load, tiles):
    """The fused kernel with the two phases' tiles of different sizes: the grid covers the longer of
    cdiv(Nk, BLOCK_N1) and cdiv(Nq, BLOCK_M2), and a phase past its sequence does nothing."""
    step, step5 = load(6), load(5)
    if tiles is None:       # a config with no "fused" entry: the dkdv and dq kernels' tiles
        cfg = dict(pre=dict(BLOCK_M=16), dq_mode="fused", dkdv=dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
                   dq=dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1))
    else:
        cfg = dict(pre=dict(BLOCK_M=16), dq_mode="fused",
                   fused=dict(zip(("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2"), tiles), num_warps=4, num_stages=1))
    for nq, nk, causal in ((50, 75, True), (75, 50, True)):
        q, k, v, dout, o, lse = forward(step5, 1, 2, nq, nk, 24, causal)
        grads = step.backward(q, k, v, o, lse, dout, causal, 24 ** -0.5, config=cfg)
        assert_grads(grads, reference_backward(q, k, v, dout, causal),
                     f"causal={causal}, Nq={nq}, Nk={nk}, fused tiles {tiles}")


@pytest.mark.parametrize("dq_mode", [None, "fused"], ids=["tuned", "fused"])
def test_strided_and_expanded_upstream_gradient(load, dq_mode):
    """dO may come with any strides: transposed, or stride 0 from a sum()."""
    step = load(6)
    g = torch.Generator().manual_seed(2)
    q, k, v = make_qkv(2, 3, 30, 30, 32, device=DEVICE, requires_grad=True)
    dout_t = torch.randn(2, 30, 3, 32, generator=g).to(DEVICE).transpose(1, 2)   # (B, H, N, D), strided
    step.attention(q, k, v, is_causal=True, dq_mode=dq_mode).backward(dout_t)
    assert_grads((q.grad, k.grad, v.grad), reference_backward(q, k, v, dout_t, True), "transposed dO")
    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    step.attention(q2, k2, v2, dq_mode=dq_mode).sum().backward()                # dO = ones, stride 0
    ones = torch.ones(q.shape, device=DEVICE)
    assert_grads((q2.grad, k2.grad, v2.grad), reference_backward(q, k, v, ones, False),
                 "dO from .sum(): expanded, stride 0")


@pytest.mark.parametrize("dq_mode", [None, "fused"], ids=["tuned", "fused"])
def test_strided_inputs(load, dq_mode):
    step = load(6)
    g = torch.Generator().manual_seed(3)
    packed = torch.randn(2, 37, 3, 2, 32, generator=g).to(DEVICE)               # (B, N, 3, H, D)
    q, k, v = (packed[:, :, i].transpose(1, 2) for i in range(3))
    check_attention(with_mode(step, dq_mode), q, k, v, is_causal=True)


@pytest.mark.parametrize("dq_mode", [None, "fused"], ids=["tuned", "fused"])
def test_keys_no_query_sees_are_skipped(load, dq_mode):
    """Causal, Nq < Nk: keys past the last query tile get zero gradient, and poisoned with NaN
    they must not leak into anything (they are never multiplied into a result)."""
    step = load(6)
    q, k, v = make_qkv(1, 2, 20, 90, 32, device=DEVICE, seed=7)
    kp, vp = k.clone(), v.clone()
    kp[..., 64:, :] = float("nan")       # past every tile the query rows (at most 64 of them) reach
    vp[..., 64:, :] = float("nan")
    kp.requires_grad_(True), vp.requires_grad_(True)
    qg = q.clone().requires_grad_(True)
    dout = make_dout(q)
    step.attention(qg, kp, vp, is_causal=True, dq_mode=dq_mode).backward(dout)
    assert_grads((qg.grad, kp.grad, vp.grad), reference_backward(q, k, v, dout, True),
                 "causal, keys past the diagonal poisoned with NaN")


def test_triton_kernels_run(load, monkeypatch):
    """Forward and backward launch their Triton kernels: forward, D, dK/dV, dQ (or dK/dV alone with atomics,
    or the fused kernel alone)."""
    step, step5 = load(6), load(5)
    launches = []

    def count(mod, name):
        kernel = getattr(mod, name)
        run = kernel.run

        def counting(*args, **kwargs):      # every launch, plain or through an autotuner, ends here
            launches.append(name)
            return run(*args, **kwargs)
        monkeypatch.setattr(kernel, "run", counting)
    count(step5, "_attn_fwd_kernel")
    for name in ("_bwd_preprocess", "_bwd_dkdv_kernel", "_bwd_dq_kernel", "_bwd_fused_kernel"):
        count(step, name)
    q, k, v = make_qkv(1, 2, 40, 40, 32, device=DEVICE)
    check_attention(with_mode(step, "separate"), q, k, v, is_causal=True)
    assert launches == ["_attn_fwd_kernel", "_bwd_preprocess", "_bwd_dkdv_kernel", "_bwd_dq_kernel"], launches
    launches.clear()
    check_attention(with_mode(step, "atomic"), q, k, v, is_causal=True)
    assert launches == ["_attn_fwd_kernel", "_bwd_preprocess", "_bwd_dkdv_kernel"], launches
    launches.clear()
    check_attention(with_mode(step, "fused"), q, k, v, is_causal=True)
    assert launches == ["_attn_fwd_kernel", "_bwd_preprocess", "_bwd_fused_kernel"], launches


def test_saves_exactly_one_lse(load):
    step = load(6)
    q, k, v = make_qkv(2, 2, 24, 40, 16, device=DEVICE, requires_grad=True)
    out = step.attention(q, k, v, is_causal=True)
    check_saved_lse(out, q, k, v, is_causal=True, function_name="FlashAttentionTriton")


def test_bad_dq_mode(load):
    step = load(6)
    q, k, v = make_qkv(1, 1, 8, 8, 16, device=DEVICE, requires_grad=True)
    with pytest.raises(ValueError, match="dq_mode"):
        step.attention(q, k, v, dq_mode="fast").sum().backward()


@pytest.mark.skipif(GPU, reason="the refusal on a CPU")
def test_atomic_tma_refused_on_cpu(load):
    """TMA's bulk reduce is a Hopper instruction the interpreter lacks: a clear ValueError, no fallback."""
    step = load(6)
    q, k, v = (t.requires_grad_() for t in qkv(CASES[1], torch.float32))
    with pytest.raises(ValueError, match="sm_90"):
        step.attention(q, k, v, is_causal=True, dq_mode="atomic_tma").sum().backward()


def test_atomic_tma_default_yields_to_determinism(load, monkeypatch):
    """The table's atomic_tma (D=128, causal, long) is not deterministic: under
    torch.use_deterministic_algorithms the backward takes the second pass. On a CPU the TMA path cannot
    run at all (the interpreter has no descriptor reduce), so a backward that returns took the second pass."""
    step = load(6)
    assert step.bwd_config(4096, 4096, 128, torch.bfloat16, True, "cuda")["dq_mode"] == "atomic_tma"
    assert step.bwd_config(4096, 4096, 128, torch.bfloat16, False, "cuda")["dq_mode"] == "separate"
    assert step.bwd_config(16384, 16384, 64, torch.bfloat16, True, "cuda")["dq_mode"] == "separate"
    if GPU:
        pytest.skip("the CPU half: on a GPU test_bf16 and test_compiled_sizes run atomic_tma itself")
    monkeypatch.setattr(step, "tma_dq_unsupported", lambda q: None)     # as if on Hopper
    q, k, v = qkv(CASES[1], torch.float32)
    o, lse = step.attention_with_lse(q, k, v, is_causal=True)
    cfg = dict(step.bwd_config(q.shape[-2], k.shape[-2], q.shape[-1], q.dtype, True, "cpu"), dq_mode="atomic_tma")
    args = (q, k, v, o, lse, make_dout(o), True, q.shape[-1] ** -0.5)
    prev = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        grads = step.backward(*args, config=cfg)                     # took the second pass
        assert_grads(grads, reference_backward(q, k, v, make_dout(o), True), "deterministic mode")
        for mode in ("atomic", "atomic_tma"):                         # asked for by name: PyTorch's error
            with pytest.raises(RuntimeError, match="use_deterministic_algorithms"):
                step.backward(*args, config=cfg, dq_mode=mode)
        torch.use_deterministic_algorithms(True, warn_only=True)
        with pytest.warns(UserWarning, match="use_deterministic_algorithms"):
            step.backward(*args, config=cfg, dq_mode="atomic")       # warn_only: a warning, and it runs
        torch.use_deterministic_algorithms(False)
        with pytest.raises(Exception, match="create_descriptor_reduce|atomic_add"):
            step.backward(*args, config=cfg)                          # the TMA path, which the interpreter lacks
    finally:
        torch.use_deterministic_algorithms(prev)


def test_table_switch_to_the_second_pass_with_an_atomic_config(load, monkeypatch):
    """``backward``'s docstring lets an atomic mode's ``config`` hold the dK/dV tiles only. When the backward turns
    the table's atomic_tma into the second pass (here deterministic mode), that pass takes the table's dQ tiles:
    the gradients are right, not a KeyError 'dq'."""
    step = load(6)
    monkeypatch.setattr(step, "tma_dq_unsupported", lambda q: None)     # as if on Hopper
    q, k, v = qkv(CASES[1], torch.float32)
    o, lse = step.attention_with_lse(q, k, v, is_causal=True)
    table = step.bwd_config(q.shape[-2], k.shape[-2], q.shape[-1], q.dtype, True, q.device.type)
    cfg = dict(pre=table["pre"], dkdv=table["dkdv"], dq_mode="atomic_tma")        # no "dq"
    dout = make_dout(o)
    prev = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        grads = step.backward(q, k, v, o, lse, dout, True, q.shape[-1] ** -0.5, config=cfg)
    finally:
        torch.use_deterministic_algorithms(prev)
    assert_grads(grads, reference_backward(q, k, v, dout, True), "an atomic config turned into the second pass")


# --- GPU only ------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason=BF16_SKIP)
@pytest.mark.parametrize("case", [CASES[1], CASES[4], CASES[5], Case((2, 4), 300, 300, 128)], ids=ids)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dq_mode", ["separate", "atomic", "fused", "atomic_tma"])
def test_bf16(load, case, is_causal, dq_mode):
    step = load(6)
    check_attention(with_mode(step, dq_mode), *qkv(case, torch.bfloat16), is_causal=is_causal)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="compiled kernels need a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=ids)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dq_mode", [None, "fused", "atomic_tma"], ids=["tuned", "fused", "atomic_tma"])
def test_compiled_sizes(load, dtype, is_causal, dq_mode):
    """Sizes the interpreter is too slow for, with the GPU's tile table: many tiles, D up to 256."""
    step = load(6)
    for case in (Case((2, 3), 1000, 1000, 64), Case((1, 2), 513, 1100, 96), Case((1, 2), 1100, 513, 128),
                 Case((1, 1), 200, 200, 256)):
        check_attention(with_mode(step, dq_mode), *qkv(case, dtype), is_causal=is_causal)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="atomics are deterministic in the interpreter, which runs one program at a time")
def test_separate_dq_is_deterministic(load):
    """The second-pass and fused dQ are bitwise reproducible; atomic dQ need not be (and is reported)."""
    step = load(6)
    q, k, v = make_qkv(4, 8, 1024, 1024, 64, dtype=torch.bfloat16, device=DEVICE, requires_grad=True)
    dout = make_dout(q)
    runs = {m: [torch.autograd.grad(step.attention(q, k, v, is_causal=True, dq_mode=m), q, dout)[0]
                for _ in range(3)] for m in ("separate", "fused", "atomic")}
    assert all(torch.equal(runs["separate"][0], r) for r in runs["separate"][1:]), "separate dQ changed between runs"
    assert all(torch.equal(runs["fused"][0], r) for r in runs["fused"][1:]), "fused dQ changed between runs"
    same = all(torch.equal(runs["atomic"][0], r) for r in runs["atomic"][1:])
    print(f"atomic dQ bitwise identical over 3 runs: {same}")
