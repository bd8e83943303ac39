"""Step 05: the Triton forward kernel, O and LSE against the float64 reference.

Without a GPU the kernel runs in Triton's interpreter (set below, before triton is
imported), in fp32 and fp16 at small sizes. bf16 runs on a GPU only: the
interpreter's bf16 ``tl.dot`` gives wrong results.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # conftest does the same; kept so this file runs alone

import pytest  # noqa: E402

from attnlib import make_qkv, reference_attention  # noqa: E402
from attnlib.cases import INTERPRETED_CASES, INTERPRETER_BF16_SKIP, Case  # noqa: E402
from attnlib.checks import check_attention, check_lse, check_saved_lse  # noqa: E402
from attnlib.compare import assert_close  # noqa: E402

pytestmark = [pytest.mark.step05,
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]  # interpreter

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
BF16_SKIP = INTERPRETER_BF16_SKIP
DTYPES = [torch.float32, torch.float16]           # bf16: the gpu-marked tests

# N = 1, 17, 100 (not multiples of any tile), Nq != Nk both ways, D from 16 to 128 with 80.
CASES = INTERPRETED_CASES + [Case((1, 1), 40, 40, 128)]      # and D = 128
ids = lambda x: x.id if isinstance(x, Case) else str(x).replace("torch.", "")  # noqa: E731


def qkv(case, dtype, seed=0):
    return make_qkv(Nq=case.nq, Nk=case.nk, D=case.d, batch_shape=case.batch, dtype=dtype, device=DEVICE,
                    seed=seed)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("case", CASES, ids=ids)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_output_and_lse(load, case, dtype, is_causal):
    step = load(5)
    q, k, v = qkv(case, dtype)
    kept = {}

    def attn(*a, **kw):
        o, lse = kept["o"], kept["lse"] = step.attention_with_lse(*a, **kw)
        assert o.shape == q.shape and o.dtype == q.dtype, f"O must be {tuple(q.shape)} {q.dtype}, got {o.shape} {o.dtype}"
        assert lse.shape == q.shape[:-1], f"the LSE must be shaped (..., Nq) = {tuple(q.shape[:-1])}, got {tuple(lse.shape)}"
        return o
    # O first: its diagnosis is the richer one (a fully masked row is NaN in O, as in the candidates).
    # The LSE checked is that same call's (one interpreted launch, not two).
    check_attention(attn, q, k, v, is_causal=is_causal, grads=False)
    check_lse(kept["lse"], q, k, v, is_causal=is_causal)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_gradients_through_step04(load, is_causal):
    """Step 05's Function trains end to end: its backward is step 04's."""
    step = load(5)
    for case in (CASES[1], CASES[4], CASES[5]):
        check_attention(step.attention, *qkv(case, torch.float32), is_causal=is_causal)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_explicit_scale(load, is_causal):
    step = load(5)
    q, k, v = make_qkv(1, 2, 33, 20, 32, seed=5, device=DEVICE)
    check_attention(step.attention, q, k, v, is_causal=is_causal, scale=0.3, grads=False)


TILES = [dict(BLOCK_M=16, BLOCK_N=32), dict(BLOCK_M=32, BLOCK_N=16), dict(BLOCK_M=64, BLOCK_N=64)]


@pytest.mark.parametrize("tiles", TILES, ids=lambda t: f"{t['BLOCK_M']}x{t['BLOCK_N']}")
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_tile_sizes(load, tiles, is_causal):
    """Any BLOCK_M, BLOCK_N pair: the causal split must not assume BLOCK_M == BLOCK_N."""
    step = load(5)
    cfg = dict(tiles, num_warps=4, num_stages=1)
    for nq, nk in ((100, 100), (50, 75), (75, 50)):
        q, k, v = make_qkv(1, 2, nq, nk, 32, device=DEVICE, seed=nq + nk)

        kept = {}

        def attn(q, k, v, is_causal, scale):
            s = scale if scale is not None else q.shape[-1] ** -0.5
            o, kept["lse"] = step.forward(q, k, v, is_causal, s, config=cfg)
            return o
        check_attention(attn, q, k, v, is_causal=is_causal, grads=False, tile=tiles["BLOCK_M"])
        check_lse(kept["lse"], q, k, v, is_causal=is_causal, tile=tiles["BLOCK_M"])     # that same call's LSE


@pytest.mark.parametrize("group", [0, 1, 2, 4], ids=lambda g: f"group{g}")
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_heads_first_grid(load, is_causal, group):
    """HEADS_FIRST (a config key: grid (B*H, query tiles), every head's tile i before any tile i+1), and with it
    HEAD_GROUP (heads taken that many at a time, one group after another; 0: all at once; step 05's ``program_tile``):
    every (query tile, head) computed exactly once. Two batches x three heads, so that an axis read the wrong way
    shows and a group of four leaves a last group of two; four query tiles a head."""
    step = load(5)
    cfg = dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1, HEADS_FIRST=True, HEAD_GROUP=group)
    q, k, v = make_qkv(2, 3, 50, 75, 32, device=DEVICE, seed=11)

    kept = {}

    def attn(q, k, v, is_causal, scale):
        s = scale if scale is not None else q.shape[-1] ** -0.5
        o, kept["lse"] = step.forward(q, k, v, is_causal, s, config=cfg)
        return o
    check_attention(attn, q, k, v, is_causal=is_causal, grads=False, tile=16)
    check_lse(kept["lse"], q, k, v, is_causal=is_causal, tile=16)          # that same call's LSE


def test_causal_heads_go_in_groups_that_fit_l2(load):
    """The table's causal order on a GPU: heads first, in groups whose K and V fit ``L2_GROUP_BYTES`` (8 MB: 8 heads
    of 1 MB at N=4096, D=64, bf16; one head of 8 MB at N=16384, D=128), never fewer than one head. All heads at once
    thrashed the H200's L2 (fwd_tile_order_1204)."""
    step = load(5)
    assert step.head_group(4096, 64, 2) == 8
    assert step.head_group(16384, 128, 2) == 1
    assert step.head_group(65536, 128, 2) == 1
    cfg = step.dense_fwd_config(4096, 4096, 64, torch.bfloat16, True, "cuda", 128)
    assert cfg.get("HEADS_FIRST") and cfg.get("HEAD_GROUP") == 8, cfg
    assert not step.dense_fwd_config(4096, 4096, 64, torch.bfloat16, False, "cuda", 128).get("HEAD_GROUP"), \
        "without a causal mask one head's tiles follow one another already"


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
def test_launch_passes_every_constexpr(load, monkeypatch, tma):
    """``forward`` passes every compile-time constant of its kernel, those with defaults too (``HEADS_FIRST``,
    ``HEAD_GROUP``): torch.compile's ``wrap_triton`` refuses a launch that leaves one out ("Incorrect number of
    arguments passed to kernel"), which only a compiled call on a GPU would show. The launch is recorded, not run."""
    step = load(5)
    seen = {}

    class Recorder:
        def __init__(self, kernel):
            seen["kernel"] = kernel

        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.update(args=args, kwargs=kwargs)
    monkeypatch.setattr(step, "wrap_triton", Recorder)
    q, k, v = make_qkv(1, 2, 64, 64, 32, device=DEVICE, seed=5)
    for causal in (False, True):
        seen.clear()
        step.forward(q, k, v, causal, 0.2, config=dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1), tma=tma,
                     **({"descriptors": "device"} if tma else {}))
        tuner = seen["kernel"]                 # configured(): a one-config autotuner over the kernel
        params = tuner.fn.arg_names
        given = set(seen["kwargs"]) | set(tuner.configs[0].kwargs)
        missing = [p for p in params[len(seen["args"]):] if p not in given]
        assert not missing, (f"{'causal' if causal else 'no mask'}: the launch leaves out {missing}; set each in the "
                             f"config (cfg.setdefault) so that a compiled call passes it")


def test_strided_inputs(load):
    """Non-contiguous q, k, v: a (B, N, H, D) layout seen as (B, H, N, D), a strided head dim,
    and rank 5 whose leading dims cannot be merged into one view."""
    step = load(5)
    g = torch.Generator().manual_seed(3)
    bnhd = torch.randn(2, 37, 3, 3, 32, generator=g).to(DEVICE)            # (B, N, 3, H, D) packed qkv
    q, k, v = (bnhd[:, :, i].transpose(1, 2) for i in range(3))           # (B, H, N, D), strided
    assert not q.is_contiguous()
    check_attention(step.attention, q, k, v, is_causal=True, grads=False)
    wide = torch.randn(1, 2, 29, 64, generator=g).to(DEVICE)
    q2 = wide[..., ::2]                                                   # head-dim stride 2
    check_attention(step.attention, q2, q2.flip(-2), q2 * 0.5, grads=False)
    r5 = torch.randn(3, 2, 2, 21, 16, generator=g).to(DEVICE).transpose(0, 1)   # leading dims not mergeable
    check_attention(step.attention, r5, r5.flip(-2), r5.roll(1, -1), is_causal=True, grads=False)


def test_tiles_above_the_diagonal_are_skipped(load):
    """Causal with Nq < Nk: keys past the last query tile are never visible. Poisoned with NaN,
    they must not be read: a kernel that loads them and multiplies by p = 0 gets NaN (0 * NaN)."""
    step = load(5)
    cfg = dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
    q, k, v = make_qkv(1, 2, 20, 90, 32, device=DEVICE, seed=7)
    kp, vp = k.clone(), v.clone()
    kp[..., 32:, :] = float("nan")                   # query tiles of 16 rows end at row 31
    vp[..., 32:, :] = float("nan")
    o, lse = step.forward(q, kp, vp, True, 32 ** -0.5, config=cfg)
    ref_o, ref_lse = reference_attention(q, k, v, True)
    assert_close(o, ref_o, name="O", context="causal, keys past the diagonal poisoned with NaN")
    assert_close(lse, ref_lse, name="LSE", dtype=torch.float32, row_dim=-1,
                 context="causal, keys past the diagonal poisoned with NaN")


def test_a_triton_kernel_runs(load, monkeypatch):
    """The forward really launches the Triton kernel, once, over (query tiles, batch * heads)."""
    step = load(5)
    launches = []
    kernel = step._attn_fwd_kernel
    run = kernel.run

    def counting(*args, grid, **kwargs):     # every launch, plain or through an autotuner, ends here
        launches.append(grid)
        return run(*args, grid=grid, **kwargs)
    monkeypatch.setattr(kernel, "run", counting)
    q, k, v = make_qkv(2, 3, 50, 50, 32, device=DEVICE)
    cfg = step.fwd_config(50, 50, 32, q.dtype, False, q.device.type, 6)
    check_attention(step.attention, q, k, v, grads=False)
    assert len(launches) == 1, f"expected one launch of _attn_fwd_kernel, got {len(launches)}"
    assert tuple(launches[0])[:2] == (-(-50 // cfg["BLOCK_M"]), 6), (
        f"grid {launches[0]}: expected (cdiv(Nq, BLOCK_M), B*H) = ({-(-50 // cfg['BLOCK_M'])}, 6)")
    assert type(kernel).__module__.startswith("triton."), (
        f"_attn_fwd_kernel is a {type(kernel).__name__}, not a @triton.jit kernel")


def test_saves_exactly_one_lse(load):
    """The autograd contract: one float32 (..., Nq) tensor saved, and nothing Nq x Nk."""
    step = load(5)
    q, k, v = make_qkv(2, 2, 24, 40, 16, device=DEVICE, requires_grad=True)
    out = step.attention(q, k, v, is_causal=True)
    check_saved_lse(out, q, k, v, is_causal=True, function_name="FlashAttentionTritonFwd")


# --- GPU only ------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason=BF16_SKIP)
@pytest.mark.parametrize("case", [CASES[1], CASES[4], CASES[5], Case((2, 4), 300, 300, 128)], ids=ids)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_bf16(load, case, is_causal):
    step = load(5)
    q, k, v = qkv(case, torch.bfloat16)
    o, lse = step.attention_with_lse(q, k, v, is_causal=is_causal)
    check_lse(lse, q, k, v, is_causal=is_causal)
    check_attention(step.attention, q, k, v, is_causal=is_causal)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="compiled kernels need a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=ids)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_compiled_sizes(load, dtype, is_causal):
    """Sizes the interpreter is too slow for, with the GPU's tile table: many tiles, D up to 256."""
    step = load(5)
    for case in (Case((2, 3), 1000, 1000, 64), Case((1, 2), 513, 1100, 96), Case((1, 1), 200, 200, 256)):
        q, k, v = qkv(case, dtype)
        o, lse = step.attention_with_lse(q, k, v, is_causal=is_causal)
        check_lse(lse, q, k, v, is_causal=is_causal)
        check_attention(lambda *a, **kw: step.attention_with_lse(*a, **kw)[0], q, k, v,
                        is_causal=is_causal, grads=False)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="the Hopper tile choice exists on a GPU only")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=ids)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_dense_table_at_d128(load, dtype, is_causal):
    """The tiles ``forward`` takes at D = 128 with many query tiles (128 x 128 on Hopper), partial tiles included.

    17 x 8 query tiles of 128 fill the 132 SMs, so ``dense_fwd_config`` leaves step 05's table; the
    test says which tiles ran, so a GPU without Hopper's shared memory is not mistaken for this check.
    """
    step = load(5)
    case = Case((1, 17), 1000, 1000, 128)
    cfg = step.dense_fwd_config(1000, 1000, 128, dtype, is_causal, "cuda", 17)
    if step._large_shared_memory():
        assert (cfg["BLOCK_M"], cfg["BLOCK_N"]) == (128, 128), f"expected 128 x 128 tiles on this GPU, got {cfg}"
    q, k, v = qkv(case, dtype)
    o, lse = step.attention_with_lse(q, k, v, is_causal=is_causal)
    check_lse(lse, q, k, v, is_causal=is_causal)
    check_attention(lambda *a, **kw: step.attention_with_lse(*a, **kw)[0], q, k, v,
                    is_causal=is_causal, grads=False)


# --- the opt-in TMA kernel (attention(..., tma=True)) ------------------------------------------
#
# The same contract through _attn_fwd_tma_kernel: Q, K, V loaded and O stored through 4-D tensor
# descriptors over (B, H, N, D). The interpreter runs descriptors (loads past a dim's end read 0,
# stores past it are dropped, as TMA does), so these run on a CPU; the GPU-only ones check bf16 and
# that the compiled kernel really issues TMA copies.

TMA_CASES = [Case((1, 2), n, n, d) for n in (1, 77, 200) for d in (16, 64)] + [
    Case((2, 1), 50, 130, 32),      # Nq < Nk
    Case((2, 1), 130, 50, 32),      # Nq > Nk
]


def _tma_attention(step):
    return lambda *a, **kw: step.attention(*a, tma=True, **kw)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("case", TMA_CASES, ids=ids)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_tma_output_and_lse(load, case, dtype, is_causal):
    """N not a multiple of any tile (the descriptors zero-fill, the key mask must still hide the zeros)."""
    step = load(5)
    q, k, v = qkv(case, dtype)
    kept = {}

    def attn(*a, **kw):
        o, lse = kept["o"], kept["lse"] = step.attention_with_lse(*a, tma=True, **kw)
        assert o.shape == q.shape and o.dtype == q.dtype, f"O must be {tuple(q.shape)} {q.dtype}, got {o.shape} {o.dtype}"
        assert lse.shape == q.shape[:-1] and lse.dtype == torch.float32, (
            f"the LSE must be float32 (..., Nq) = {tuple(q.shape[:-1])}, got {tuple(lse.shape)} {lse.dtype}")
        return o
    check_attention(attn, q, k, v, is_causal=is_causal, grads=False)
    check_lse(kept["lse"], q, k, v, is_causal=is_causal)                   # that same call's LSE


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_tma_device_descriptors(load, is_causal):
    """Descriptors built in the kernel (tl.make_tensor_descriptor, what a compiled graph runs) give the
    same result as host ones."""
    step = load(5)
    for case in (Case((2, 2), 77, 77, 16), Case((1, 2), 40, 90, 32)):
        q, k, v = qkv(case, torch.float32, seed=2)
        s = case.d ** -0.5
        for desc in ("host", "device"):
            kept = {}

            def attn(q, k, v, is_causal, scale, desc=desc):
                o, kept["lse"] = step.forward(q, k, v, is_causal, s, tma=True, descriptors=desc)
                return o
            check_attention(attn, q, k, v, is_causal=is_causal, grads=False)
            check_lse(kept["lse"], q, k, v, is_causal=is_causal)            # that same call's LSE


def test_tma_tiles_above_the_diagonal_are_skipped(load):
    """As test_tiles_above_the_diagonal_are_skipped, through the TMA kernel: keys no query may see are NaN."""
    step = load(5)
    cfg = dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
    q, k, v = make_qkv(1, 2, 20, 90, 32, device=DEVICE, seed=7)
    kp, vp = k.clone(), v.clone()
    kp[..., 32:, :] = float("nan")
    vp[..., 32:, :] = float("nan")
    o, lse = step.forward(q, kp, vp, True, 32 ** -0.5, config=cfg, tma=True)
    ref_o, ref_lse = reference_attention(q, k, v, True)
    assert_close(o, ref_o, name="O", context="TMA, causal, keys past the diagonal poisoned with NaN")
    assert_close(lse, ref_lse, name="LSE", dtype=torch.float32, row_dim=-1,
                 context="TMA, causal, keys past the diagonal poisoned with NaN")


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_tma_gradients_and_saved_lse(load, is_causal):
    """tma=True through the autograd Function: step 04's backward on the TMA forward's O and LSE."""
    step = load(5)
    q, k, v = qkv(Case((1, 2), 45, 45, 32), torch.float32)
    check_attention(_tma_attention(step), q, k, v, is_causal=is_causal)
    q, k, v = make_qkv(2, 2, 24, 40, 16, device=DEVICE, requires_grad=True)
    out = step.attention(q, k, v, is_causal=True, tma=True)
    check_saved_lse(out, q, k, v, is_causal=True, function_name="FlashAttentionTritonFwd")


def test_tma_strided_inputs(load):
    """Strides TMA can address run (a (B, N, H, D) layout seen as (B, H, N, D); rank 5 whose leading dims
    must be copied); a head dim with stride 2 cannot, and is refused, not silently copied."""
    step = load(5)
    g = torch.Generator().manual_seed(3)
    bnhd = torch.randn(2, 37, 3, 3, 32, generator=g).to(DEVICE)            # (B, N, 3, H, D) packed qkv
    q, k, v = (bnhd[:, :, i].transpose(1, 2) for i in range(3))           # (B, H, N, D), strided
    assert not q.is_contiguous()
    check_attention(_tma_attention(step), q, k, v, is_causal=True, grads=False)
    r5 = torch.randn(3, 2, 2, 21, 16, generator=g).to(DEVICE).transpose(0, 1)
    check_attention(_tma_attention(step), r5, r5.flip(-2), r5.roll(1, -1), is_causal=True, grads=False)
    wide = torch.randn(1, 2, 29, 64, generator=g).to(DEVICE)
    q2 = wide[..., ::2]                                                   # head-dim stride 2
    with pytest.raises(ValueError, match="last dim contiguous"):
        step.attention(q2, q2.flip(-2), q2 * 0.5, tma=True)


def test_tma_by_default_where_measured(load):
    """tma=None (the default) takes TMA only for 16-bit D=128, N >= 2048, on an sm_90 GPU that can address
    the inputs."""
    step = load(5)
    n = step.TMA_MIN_LEN
    x = make_qkv(1, 2, n, n, 128, dtype=torch.bfloat16, device=DEVICE)
    hopper = GPU and torch.cuda.get_device_capability()[0] == 9
    assert step.tma_by_default(*x) == hopper, f"D=128 bf16 N={n} on {DEVICE}: expected {hopper}"
    assert not step.tma_by_default(*make_qkv(1, 2, n, n // 2, 128, dtype=torch.bfloat16, device=DEVICE)), "short keys"
    assert not step.tma_by_default(*make_qkv(1, 2, n, n, 64, dtype=torch.bfloat16, device=DEVICE)), "D=64"
    assert not step.tma_by_default(*make_qkv(1, 2, n, n, 128, device=DEVICE)), "fp32"
    odd = torch.randn(2 * n * 128 + 1, dtype=torch.bfloat16, device=DEVICE)[1:].view(1, 2, n, 128)
    assert not step.tma_by_default(odd, odd, odd), "a misaligned start"


def _refusals():
    g = torch.Generator().manual_seed(4)
    r = lambda *s, dtype=torch.float32: torch.randn(*s, generator=g).to(dtype).to(DEVICE)   # noqa: E731
    x = r(1, 2, 17, 32)
    rows20 = r(1, 2, 17, 20, dtype=torch.float16)[..., :16]              # rows 40 bytes apart
    flat = r(2 * 17 * 32 + 1)[1:].view(1, 2, 17, 32)                     # starts 4 bytes past an aligned address
    return [
        ("float64", (x.double(), x.double(), x.double()), "fp16, bf16 and fp32"),
        ("D=80", (r(1, 2, 17, 80),) * 3, "head dim D in"),
        ("D=8", (r(1, 2, 17, 8),) * 3, "head dim D in"),
        ("row stride 40 B", (rows20, rows20, rows20), "multiple of 16 bytes"),
        ("k misaligned", (x, flat, x), "k to start at a 16-byte aligned"),
        ("last dim strided", (x, x, r(1, 2, 17, 64)[..., ::2]), "v's last dim contiguous"),
    ]


@pytest.mark.parametrize("what,args,match", _refusals(), ids=[c[0] for c in _refusals()])
def test_tma_refuses_with_a_reason(load, what, args, match):
    """What TMA cannot address is a ValueError naming the reason, from attention (autograd on), from
    attention_with_lse, and from the launcher: never a Triton traceback, never the pointer kernel."""
    step = load(5)
    grad = [t.detach().requires_grad_(True) for t in args]            # detach keeps the strides; clone would not
    for call in (lambda: step.attention(*grad, tma=True), lambda: step.attention_with_lse(*args, tma=True),
                 lambda: step.forward(*args, False, 0.5, tma=True)):
        with pytest.raises(ValueError, match=match):
            call()


def test_tma_refused_where_there_is_no_tma(load, monkeypatch):
    """A CPU without the interpreter, an older GPU: refused, saying why (the device checks faked)."""
    step = load(5)
    import attnlib.ops
    q, k, v = make_qkv(1, 2, 17, 17, 32, device="cpu")
    monkeypatch.setattr(attnlib.ops, "interpreting", lambda: False)
    with pytest.raises(ValueError, match="interpreter"):
        step.tma_unsupported(q, k, v) and step.forward(q, k, v, False, 0.5, tma=True)
    monkeypatch.undo()
    if GPU:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
        qc, kc, vc = (t.cuda() for t in (q, k, v))
        with pytest.raises(ValueError, match="sm_90"):
            step.attention(qc, kc, vc, tma=True)


def test_tma_kernel_runs(load, monkeypatch):
    """tma=True launches the TMA kernel once over (query tiles, batch * heads), and not the pointer kernel."""
    step = load(5)
    launches = {"tma": [], "pointers": []}
    for name, key in (("_attn_fwd_tma_kernel", "tma"), ("_attn_fwd_kernel", "pointers")):
        kernel = getattr(step, name)

        def counting(*args, grid, _run=kernel.run, _key=key, **kwargs):
            launches[_key].append(grid)
            return _run(*args, grid=grid, **kwargs)
        monkeypatch.setattr(kernel, "run", counting)
    q, k, v = make_qkv(2, 3, 50, 50, 32, device=DEVICE)
    cfg = step.dense_fwd_config(50, 50, 32, q.dtype, False, q.device.type, 6)
    check_attention(_tma_attention(step), q, k, v, grads=False)
    assert launches["pointers"] == [], "tma=True ran the pointer kernel"
    assert len(launches["tma"]) == 1, f"expected one launch of _attn_fwd_tma_kernel, got {len(launches['tma'])}"
    assert tuple(launches["tma"][0])[:2] == (-(-50 // cfg["BLOCK_M"]), 6), f"grid {launches['tma'][0]}"


@pytest.mark.slow
def test_tma_compiles_fullgraph(load):
    """torch.compile(fullgraph=True) of a function calling attention(..., tma=True), forward and backward.

    On a CPU the operator is opaque (the interpreter cannot be traced into a graph); on a GPU it is a
    triton_op whose kernel Inductor launches itself, with descriptors made in the kernel."""
    step = load(5)
    torch._dynamo.reset()

    def f(q, k, v):
        return step.attention(q, k, v, is_causal=True, tma=True) * 2.0

    compiled = torch.compile(f, fullgraph=True)
    dtype = torch.bfloat16 if GPU else torch.float32
    q, k, v = make_qkv(1, 2, 77, 77, 64, dtype=dtype, device=DEVICE, requires_grad=True)
    got = compiled(q, k, v)
    want = f(q, k, v)
    torch.testing.assert_close(got, want, atol=0, rtol=0, msg="compiled and eager TMA forward differ")
    got.float().square().sum().backward()
    check_attention(lambda *a, **kw: compiled(*a) / 2.0, q.detach(), k.detach(), v.detach(), is_causal=True,
                    grads=not GPU)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason=BF16_SKIP)
@pytest.mark.parametrize("case", [Case((2, 4), 300, 300, 64), Case((1, 17), 1000, 1000, 128),
                                  Case((2, 3), 513, 1100, 128), Case((1, 2), 1000, 77, 64)], ids=ids)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_tma_bf16(load, case, is_causal):
    """bf16 at the GPU's tiles (D = 128 with 17 x 8 query tiles takes 128 x 128 on Hopper), partial tiles."""
    step = load(5)
    if step.tma_unsupported(*qkv(Case((1, 1), 16, 16, 64), torch.bfloat16)):
        pytest.skip(step.tma_unsupported(*qkv(Case((1, 1), 16, 16, 64), torch.bfloat16)))
    q, k, v = qkv(case, torch.bfloat16)
    o, lse = step.attention_with_lse(q, k, v, is_causal=is_causal, tma=True)
    check_lse(lse, q, k, v, is_causal=is_causal)
    check_attention(lambda *a, **kw: step.attention_with_lse(*a, tma=True, **kw)[0], q, k, v,
                    is_causal=is_causal, grads=False)
    o_ptr, lse_ptr = step.attention_with_lse(q, k, v, is_causal=is_causal)
    assert_close(o, o_ptr.double(), name="O, TMA vs pointer kernel", dtype=torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="TMA copies exist in compiled code only")
@pytest.mark.parametrize("descriptors", ["host", "device"])
def test_tma_kernel_issues_tma_copies(load, monkeypatch, descriptors):
    """The compiled TMA kernel holds bulk tensor copies (cp.async.bulk.tensor) and the pointer kernel none."""
    step = load(5)
    q, k, v = make_qkv(1, 2, 300, 300, 64, dtype=torch.bfloat16, device="cuda")
    if step.tma_unsupported(q, k, v):
        pytest.skip(step.tma_unsupported(q, k, v))
    compiled = {}
    for name in ("_attn_fwd_tma_kernel", "_attn_fwd_kernel"):
        kernel = getattr(step, name)

        def keep(*args, _run=kernel.run, _name=name, **kwargs):
            compiled[_name] = _run(*args, **kwargs)
            return compiled[_name]
        monkeypatch.setattr(kernel, "run", keep)
    step.forward(q, k, v, True, 0.125, tma=True, descriptors=descriptors)
    step.forward(q, k, v, True, 0.125)
    assert "cp.async.bulk.tensor" in compiled["_attn_fwd_tma_kernel"].asm["ptx"], "no TMA load in the TMA kernel's PTX"
    assert "cp.async.bulk.tensor" not in compiled["_attn_fwd_kernel"].asm["ptx"]
