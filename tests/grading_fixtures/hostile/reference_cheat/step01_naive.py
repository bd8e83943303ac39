"""Hostile: returns the course's own reference, forward and backward, through an autograd.Function.

Every comparison passes. Expect: the rule "no_reference" is broken and the step scores 0.
"""
import torch

import attnlib
from attnlib import check_inputs


class _Ref(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale):
        ctx.save_for_backward(q, k, v)
        ctx.is_causal, ctx.scale = is_causal, scale
        return attnlib.reference_attention(q, k, v, is_causal, scale)[0].to(q.dtype)

    @staticmethod
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors
        dq, dk, dv = attnlib.reference_backward(q, k, v, do, ctx.is_causal, ctx.scale)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def attention(q, k, v, is_causal=False, scale=None):
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    return _Ref.apply(q, k, v, is_causal, scale)
