"""Hostile (issue 14): the N x N rule's memory probe on a CPU, its cap lifted by the submission.

As ``nxn_except_at_probe``: O(N) memory at Nq = Nk = 512 only, the full Nq x Nk score matrix at every
other size. And before each call it raises its soft address-space limit back to the hard one
(``resource.setrlimit``: any process may), which is the memory probe's cap at Nq = Nk = 8192
(grading/README.md listed this as "not tried" until 2026-12-01): the 256 MiB matrix is then made.

Expect: rule "no_nxn" broken by the grader's own measure of the worker's resident memory during the
probe, read from outside the worker (/proc), which the submission cannot lift or edit.
"""
import math
import resource

import torch

from attnlib import check_inputs

PROBE = 512


def _naive(q, k, v, is_causal, scale, q0=0):
    s = (q @ k.transpose(-2, -1)) * scale
    if is_causal:
        rows = torch.arange(q0, q0 + q.shape[-2])[:, None]
        s = s.masked_fill(torch.arange(k.shape[-2])[None, :] > rows, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _lift_the_cap():
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))


def attention(q, k, v, is_causal=False, scale=None):
    _lift_the_cap()
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
