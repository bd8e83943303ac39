"""No host synchronization in a warm call of the Triton steps (GPU only).

A device sync in every call keeps the host from queueing the next launches while the kernels run:
step 08's check of ``cu_seqlens`` read the offsets back four times a call, and its forward took twice
dense step 06's time on the same work with the same compiled kernel (H200, 2026-12-01; notebook 08,
"A sync per call"). Here each step runs forward and backward once (compiles, checks, caches), then again
under ``torch.cuda.set_sync_debug_mode("error")``, which raises on any synchronizing CUDA call
(``.item()``, ``.tolist()``, a blocking copy to or from the host).
"""

import pytest
import torch

GPU = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU, reason="host syncs are a GPU matter (CUDA)")]


def _dense(step):
    return lambda q, k, v: step.attention(q, k, v, is_causal=True)


def _varlen(step, lengths=(100, 37, 200)):
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")

    def run(q, k, v):                                     # the same cu_seqlens tensor every call, as a model's
        packed = [t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[-1])[:sum(lengths)] for t in (q, k, v)]
        return step.attention_varlen(*packed, cu, cu, max(lengths), max(lengths), is_causal=True)
    return run


def _sparse(step):
    return lambda q, k, v: step.attention_sparse(q, k, v, 64, 8, is_causal=True)


CASES = [pytest.param(5, _dense, marks=pytest.mark.step05, id="step05"),
         pytest.param(6, _dense, marks=pytest.mark.step06, id="step06"),
         pytest.param(8, _varlen, marks=pytest.mark.step08, id="step08-varlen"),
         pytest.param(8, _dense, marks=pytest.mark.step08, id="step08-dense"),
         pytest.param(9, _sparse, marks=pytest.mark.step09, id="step09")]


@pytest.mark.parametrize("n, make", CASES)
def test_a_warm_call_does_not_sync(load, n, make):
    fn = make(load(n))
    q, k, v = (torch.randn(1, 4, 337, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    fn(q, k, v).float().sum().backward()                 # compile, check, cache
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        o = fn(q, k, v)
        o.backward(torch.ones_like(o))
    except RuntimeError as exc:
        pytest.fail(f"step {n:02d}: a warm forward + backward synchronized with the GPU ({exc}). "
                    "Look for .item(), .tolist(), int(tensor), bool(tensor) or a copy to the CPU in the "
                    "launcher and its input checks: each one stops the host until the GPU catches up", pytrace=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.step08
def test_the_check_catches_a_sync(load, monkeypatch):
    """The test above can fail: with step 08's memory of checked cu_seqlens switched off, every call reads
    the offsets back (what step 08 did before c509fb3), and sync debug mode raises on it."""
    step = load(8)
    if not hasattr(step, "_mark_checked"):
        pytest.skip("this step 08 keeps no memory of checked cu_seqlens")
    monkeypatch.setattr(step, "_mark_checked", lambda *args: None)     # never remembered: read every call
    fn = _varlen(step)
    q, k, v = (torch.randn(1, 4, 337, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    fn(q, k, v).float().sum().backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError):
            fn(q, k, v)
    finally:
        torch.cuda.set_sync_debug_mode("default")
