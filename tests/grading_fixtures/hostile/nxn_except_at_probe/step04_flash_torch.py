"""Hostile (issue 14, hole 4): O(N) memory only at the size the N x N rule probes (Nq = Nk = 512).

At 512 it works on 64-row query chunks (no tensor reaches Nq x Nk / 2); at every other size it
builds the full Nq x Nk score matrix. Right answers everywhere; plain autograd, no Function.

Expect: rule "no_nxn" broken by the memory probe (Nq = Nk = 8192 under a cap far below the
N x N matrix's 256 MiB); 9/10 when the rule looked at Nq = Nk = 512 only (the autograd group,
which wants one saved LSE, is the point it lost).
"""
import math

import torch

from attnlib import check_inputs

PROBE = 512


def _naive(q, k, v, is_causal, scale, q0=0):
    s = (q @ k.transpose(-2, -1)) * scale
    if is_causal:
        rows = torch.arange(q0, q0 + q.shape[-2])[:, None]
        s = s.masked_fill(torch.arange(k.shape[-2])[None, :] > rows, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def attention(q, k, v, is_causal=False, scale=None):
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    if q.shape[-2] == PROBE and k.shape[-2] == PROBE:
        return torch.cat([_naive(q[..., i:i + 64, :], k, v, is_causal, scale, i)
                          for i in range(0, q.shape[-2], 64)], dim=-2)
    return _naive(q, k, v, is_causal, scale)


def attention_with_lse(q, k, v, is_causal=False, scale=None):
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q.float() @ k.float().transpose(-2, -1)) * scale
    if is_causal:
        s = s.masked_fill(torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(s, dim=-1) @ v.float()).to(q.dtype), torch.logsumexp(s, dim=-1)
