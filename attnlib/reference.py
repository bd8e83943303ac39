"""The one reference: attention in float64, with its log-sum-exp and gradients.

Every test, notebook and benchmark compares against these two functions. They
are written out by hand (no ``F.scaled_dot_product_attention``) so the course
never grades PyTorch against itself.
"""

from __future__ import annotations

import torch

from .contract import causal_mask, check_inputs


def _scores(q64, k64, is_causal, scale, mask=None):
    s = (q64 @ k64.transpose(-2, -1)) * scale                # (..., Nq, Nk)
    if is_causal:
        s = s.masked_fill(~causal_mask(q64.shape[-2], k64.shape[-2], q64.device), float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask.to(q64.device), float("-inf"))
    return s


def reference_attention(q, k, v, is_causal: bool = False, scale: float | None = None, mask=None):
    """Return ``(O, LSE)`` in float64, on the inputs' device.

    ``O`` is ``(..., Nq, D)``; ``LSE`` is ``(..., Nq)``, the natural-log
    log-sum-exp of each row of scaled (and masked) scores. ``mask``: an optional
    boolean ``(Nq, Nk)`` (or broadcastable) tensor, True where a query sees a key,
    for the sparse patterns of step 09 (every row must see at least one key).
    """
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where="reference_attention")
    q64, k64, v64 = (t.detach().to(torch.float64) for t in (q, k, v))
    s = _scores(q64, k64, is_causal, scale, mask)
    lse = torch.logsumexp(s, dim=-1)                          # (..., Nq)
    p = torch.exp(s - lse[..., None])                         # (..., Nq, Nk)
    return p @ v64, lse


def reference_backward(q, k, v, dout, is_causal: bool = False, scale: float | None = None, mask=None):
    """Return ``(dQ, dK, dV)`` in float64 for the upstream gradient ``dout`` (``mask`` as above)."""
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where="reference_backward")
    q64, k64, v64 = (t.detach().to(torch.float64).requires_grad_(True) for t in (q, k, v))
    s = _scores(q64, k64, is_causal, scale, mask)
    o = torch.softmax(s, dim=-1) @ v64
    o.backward(dout.detach().to(torch.float64))
    return q64.grad, k64.grad, v64.grad
