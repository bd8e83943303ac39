"""Step 01 -- naive attention: the textbook formula, and the N x N matrix it needs.

    O = softmax(Q K^T * scale + mask) V

Every step after this one computes the same function faster or in less memory.
This one is the baseline: four separate operations (matmul, mask, softmax,
matmul), each writing its result to memory and reading it back, and a score
matrix of Nq x Nk elements per (batch, head). At B=8, N=8192 in fp32 that is
8 * 8192 * 8192 * 4 bytes = 2 GiB for S alone, and the backward keeps P too.
"""

import torch

from attnlib import causal_mask, check_inputs


def naive_attention(q, k, v, is_causal=False, scale=1.0):
    """The computation itself, with no input checks, so step 02 can compile it.

    q: (..., Nq, D), k and v: (..., Nk, D) -> (..., Nq, D), in q's dtype.
    The causal mask is top-left aligned: query i sees keys j <= i.
    """
    # >>> STUDENT: scores S = q @ k^T * scale; if is_causal, set S[i, j] = -inf where j > i; softmax over keys; return P @ v
    s = (q @ k.transpose(-2, -1)) * scale                 # (..., Nq, Nk): the N x N matrix
    if is_causal:
        s = s.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    p = torch.softmax(s, dim=-1)                          # (..., Nq, Nk)
    return p @ v                                          # (..., Nq, D)
    # <<< STUDENT


def attention(q, k, v, is_causal=False, scale=None):
    """The course contract (see attnlib/contract.py): checks, then ``naive_attention``."""
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where="step01 attention")
    return naive_attention(q, k, v, is_causal, scale)
