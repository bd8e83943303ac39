"""Hostile (issue 14, hole 4), on a GPU: step 09 with O(N) memory only at the size the N x N rule probes.

At Nq = Nk = 512 it works on 64-row query chunks (no tensor reaches Nq x Nk / 2); at every other size it
builds the full Nq x Nk score matrix in PyTorch. Right answers everywhere; plain autograd, no Triton.

Expect on a GPU: rule "no_nxn" broken by the GPU memory probe (Nq = Nk = 16384 under a CUDA memory cap of
128 MiB over what the worker holds, where the N x N matrix takes 512 MiB in fp16). "triton_fwd" and
"triton_bwd" are broken too (no kernel of its own): the test looks for no_nxn's own message.
"""
import math

import torch

from attnlib import check_inputs

PROBE = 512


def _naive(q, k, v, is_causal, scale, q0=0):
    s = (q @ k.transpose(-2, -1)) * scale
    if is_causal:
        rows = torch.arange(q0, q0 + q.shape[-2], device=q.device)[:, None]
        s = s.masked_fill(torch.arange(k.shape[-2], device=q.device)[None, :] > rows, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def attention(q, k, v, is_causal=False, scale=None):
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    if q.shape[-2] == PROBE and k.shape[-2] == PROBE:
        return torch.cat([_naive(q[..., i:i + 64, :], k, v, is_causal, scale, i)
                          for i in range(0, q.shape[-2], 64)], dim=-2)
    return _naive(q, k, v, is_causal, scale)
