"""Hostile: asks for 8 TiB on every call. Expect: each check fails with the allocator's error, 0 points."""
import torch

from attnlib import check_inputs


def attention(q, k, v, is_causal=False, scale=None):
    check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    return torch.empty(2 ** 41, dtype=torch.float32)[: q.numel()].view(q.shape)
