"""`make check` (pytest -m quick): every step once, in the order an error travels, in under 2 minutes.

Per step, on one awkward causal shape (Nq > Nk, neither a multiple of a tile), in fp32 and fp16
(step 07: fp16 and bf16, on a GPU):
the forward's O and, for steps 04-07, the LSE from ``attention_with_lse``; then O, dQ, dK, dV
through autograd. The full suite (`make test`, `pytest -m stepNN`) checks many more shapes.
"""

import pytest
import torch

from attnlib import make_qkv
from attnlib.cases import Case
from attnlib.checks import check_attention, check_lse
from attnlib.compare import assert_close
from attnlib.contract import STEPS
from attnlib.diagnose import launched_tiles, likely_bug
from attnlib.reference import reference_attention

CASE = Case((1, 2), 40, 33, 64)          # D = 64: a head dim every step takes (step 07: 64 or 128)
GPU = torch.cuda.is_available()


def _params():
    for n in STEPS:
        marks = [pytest.mark.quick, getattr(pytest.mark, f"step{n:02d}")]
        if n == 7:
            marks.append(pytest.mark.skipif(not GPU, reason="step 07 runs CUDA kernels: it needs a GPU"))
        # Step 07's kernels take 16-bit inputs only (its check_inputs refuses fp32).
        for dtype in ((torch.float16, torch.bfloat16) if n == 7 else (torch.float32, torch.float16)):
            yield pytest.param(n, dtype, marks=marks, id=f"step{n:02d}-{str(dtype)[6:]}")


@pytest.mark.parametrize("step,dtype", list(_params()))
def test_step(load, step, dtype):
    m = load(step)
    device = "cuda" if GPU else "cpu"
    q, k, v = make_qkv(Nq=CASE.nq, Nk=CASE.nk, D=CASE.d, batch_shape=CASE.batch, dtype=dtype, device=device,
                       seed=11)
    tile = None
    if hasattr(m, "attention_with_lse"):
        # Forward first, then the LSE: the backward rebuilds P from it, so it is checked before.
        # The tiles a diagnosis names are the implementation's own: read from its Triton launches
        # (steps 05-06) or its BLOCK_Q / BLOCK_K (step 04); given only when query and key tiles agree.
        with launched_tiles() as launched:
            o, lse = m.attention_with_lse(q, k, v, is_causal=True)
        bq = launched.get("BLOCK_M", getattr(m, "BLOCK_Q", None))
        bk = launched.get("BLOCK_N", getattr(m, "BLOCK_K", None))
        tile = bq if bq == bk else None
        ref_o, _ = reference_attention(q, k, v, True)
        assert_close(o, ref_o, name="O from attention_with_lse", context="forward, causal", tile=tile,
                     hint=lambda: likely_bug("o", o, q, k, v, is_causal=True, scale=CASE.d ** -0.5, tile=tile))
        check_lse(lse, q, k, v, is_causal=True, tile=tile)
    check_attention(m.attention, q, k, v, is_causal=True, tile=tile)
