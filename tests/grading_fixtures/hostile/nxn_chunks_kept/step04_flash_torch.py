"""Hostile (issue 14, hole 4): 255-row query chunks, each a little under Nq x Nk / 2 at the probe's
Nq = Nk = 512, kept alive together by autograd (each chunk's probabilities are saved for the
backward): no single tensor is N x N, but all of them together are, at every size.

Expect: rule "no_nxn" broken by the memory probe (Nq = Nk = 8192: the saved chunks need the
N x N matrix's 256 MiB and more, under a cap far below it); 9/10 when the rule measured the largest
single tensor at 512 only.
"""
import math

import torch

from attnlib import check_inputs

CHUNK = 255


def _rows(q, k, v, is_causal, scale, q0):
    s = (q @ k.transpose(-2, -1)) * scale
    if is_causal:
        rows = torch.arange(q0, q0 + q.shape[-2])[:, None]
        s = s.masked_fill(torch.arange(k.shape[-2])[None, :] > rows, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def attention(q, k, v, is_causal=False, scale=None):
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    return torch.cat([_rows(q[..., i:i + CHUNK, :], k, v, is_causal, scale, i)
                      for i in range(0, q.shape[-2], CHUNK)], dim=-2)


def attention_with_lse(q, k, v, is_causal=False, scale=None):
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q.float() @ k.float().transpose(-2, -1)) * scale
    if is_causal:
        s = s.masked_fill(torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(s, dim=-1) @ v.float()).to(q.dtype), torch.logsumexp(s, dim=-1)
