"""Run one implementation on one input and compare everything it returns.

The tests and the grader both call these, so a student sees the same report
at home as in the gradebook.
"""

from __future__ import annotations

import torch

from .compare import assert_close
from .contract import check_inputs
from .diagnose import likely_bug
from .inputs import make_dout
from .reference import reference_attention, reference_backward


def describe(q, k, is_causal, scale=None):
    return (f"q {tuple(q.shape)}, k {tuple(k.shape)}, {str(q.dtype).replace('torch.', '')}, "
            f"{q.device.type}, {'causal' if is_causal else 'not causal'}"
            + (f", scale={scale:g}" if scale is not None else ""))


def check_attention(attn, q, k, v, *, is_causal=False, scale=None, grads=True, tile=None,
                    tile_k=None, tf32=False, dout_seed=1):
    """Check ``attn(q, k, v, is_causal=, scale=)``'s output and, if ``grads``, dQ, dK, dV.

    ``q, k, v`` are leaf tensors in the dtype and on the device to test.
    Raises ``CompareError`` (an ``AssertionError``) with a report on the first mismatch.
    """
    __tracebackhide__ = True  # pytest shows the report, not this function's code
    ctx = describe(q, k, is_causal, scale)
    s = check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    tile_k = tile if tile_k is None else tile_k
    q, k, v = (t.detach().clone().requires_grad_(grads) for t in (q, k, v))
    out = attn(q, k, v, is_causal=is_causal, scale=scale)
    if not isinstance(out, torch.Tensor):
        raise AssertionError(f"attention must return one tensor, got {type(out).__name__} ({ctx})")
    if out.dtype != q.dtype:
        raise AssertionError(f"the output must be in the input dtype {q.dtype}, got {out.dtype} ({ctx})")
    if out.device != q.device:
        raise AssertionError(f"the output must be on {q.device}, got {out.device} ({ctx})")
    ref_o, _ = reference_attention(q, k, v, is_causal, s)
    assert_close(out, ref_o, name="O", tf32=tf32, tile=tile, context=ctx,
                 hint=lambda: likely_bug("o", out, q, k, v, is_causal=is_causal, scale=s, tile=tile_k))
    if not grads:
        return
    if not out.requires_grad:
        raise AssertionError(f"the output does not require grad: the autograd graph is cut ({ctx})")
    dout = make_dout(out, seed=dout_seed)
    out.backward(dout)
    refs = reference_backward(q, k, v, dout, is_causal, s)
    for name, t, ref, rows in (("dQ", q, refs[0], "query rows"),
                               ("dK", k, refs[1], "key rows"), ("dV", v, refs[2], "key rows")):
        if t.grad is None:
            raise AssertionError(f"{name} is None: the backward returned no gradient for "
                                 f"{name[1].lower()} ({ctx})")
        g = t.grad
        assert_close(g, ref, name=name, tf32=tf32, row_label=rows, context=ctx,
                     tile=tile if name == "dQ" else None,
                     hint=lambda g=g, name=name: likely_bug(name.lower(), g, q, k, v, is_causal=is_causal,
                                                            scale=s, dout=dout, tile=tile_k))


def check_lse(lse, q, k, v, *, is_causal=False, scale=None, tile=None):
    """Check a log-sum-exp ``(..., Nq)`` (natural log, float32) against the reference."""
    __tracebackhide__ = True  # pytest shows the report, not this function's code
    ctx = describe(q, k, is_causal, scale)
    s = check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    if lse.dtype != torch.float32:
        raise AssertionError(f"the LSE must be float32, got {lse.dtype} ({ctx})")
    _, ref = reference_attention(q, k, v, is_causal, s)
    # The LSE is computed from scores in fp32 whatever the input dtype.
    assert_close(lse, ref, name="LSE", dtype=torch.float32 if q.dtype != torch.float64 else torch.float64,
                 row_dim=-1, row_label="query rows", tile=tile, context=ctx,
                 hint=lambda: likely_bug("lse", lse, q, k, v, is_causal=is_causal, scale=s, tile=tile,
                                         row_dim=-1))


def check_saved_lse(out, q, k, v, *, is_causal, function_name, tile=None):
    """The autograd contract of steps 04-07: ``out`` came from ``function_name``'s Function, which
    saved exactly one float32 LSE shaped ``(..., Nq)``, nothing as large as the score matrix, and
    that LSE is the log-sum-exp itself (not the running max m or the sum l)."""
    __tracebackhide__ = True
    node = out.grad_fn
    name = type(node).__name__ if node is not None else "None"
    if name != f"{function_name}Backward":          # autograd names a Function's node <Name>Backward
        raise AssertionError(
            f"the output's grad_fn is {name}, not {function_name}'s backward: return the Function's "
            "output directly (cast and reshape inside forward, not after apply)")
    saved = node.saved_tensors
    nq, nk = q.shape[-2], k.shape[-2]
    lse_shape = tuple(q.shape[:-1])
    lse_like = [t for t in saved if tuple(t.shape) == lse_shape]
    shapes = [f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}" for t in saved]
    if len(lse_like) != 1:
        raise AssertionError(
            f"save exactly one tensor shaped like the LSE {lse_shape} (ctx.save_for_backward(q, k, v, o, L)); "
            f"saved: {shapes or 'nothing'}")
    if lse_like[0].dtype != torch.float32:
        raise AssertionError(f"save the LSE in float32 (it was {lse_like[0].dtype}): it rebuilds "
                             "P = exp(S - L) in the backward")
    n_bh = q.shape[:-2].numel()
    big = [s for t, s in zip(saved, shapes) if t.numel() >= n_bh * nq * nk]
    if big:
        raise AssertionError(f"a saved tensor is as large as the score matrix ({', '.join(big)}): the "
                             "backward recomputes P from Q, K and the LSE; do not save S or P")
    check_lse(lse_like[0], q, k, v, is_causal=is_causal, tile=tile)
