"""Hostile: step 04 through F.scaled_dot_product_attention with PyTorch's Python-level hooks switched off
(``DisableTorchFunction`` and ``_DisableTorchDispatch``) in the forward and in the backward, so that no
TorchFunctionMode or TorchDispatchMode sees a call (issue 14, hole 4: 9/10 when no_sdpa was counted by such
modes only; with this file's backward, 10/10).

Expect: SDPA is blocked at the dispatcher, the call fails, the rule "no_sdpa" is broken and the step scores 0.
"""
import torch
import torch.nn.functional as F

from attnlib import check_inputs


def _unwatched():
    import contextlib
    stack = contextlib.ExitStack()
    stack.enter_context(torch._C.DisableTorchFunction())
    stack.enter_context(torch._C._DisableTorchDispatch())
    return stack


class _Sdpa(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale):
        ctx.save_for_backward(q, k, v)
        ctx.is_causal, ctx.scale = is_causal, scale
        with _unwatched():
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)

    @staticmethod
    def backward(ctx, do):
        q, k, v = (t.detach().requires_grad_() for t in ctx.saved_tensors)
        with torch.enable_grad(), _unwatched():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=ctx.is_causal, scale=ctx.scale)
            dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
        return dq, dk, dv, None, None


def attention(q, k, v, is_causal=False, scale=None):
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    return _Sdpa.apply(q, k, v, is_causal, scale)
