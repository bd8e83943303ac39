"""Seeded inputs. Never zeros: they hide unwritten outputs and wrong indexing."""

from __future__ import annotations

import torch


def make_qkv(B=2, H=3, Nq=17, Nk=None, D=32, *, dtype=torch.float32, device="cpu",
             seed=0, requires_grad=False, batch_shape=None):
    """Return q ``(*batch, Nq, D)``, k and v ``(*batch, Nk, D)`` drawn from N(0, 1).

    ``batch_shape`` overrides ``(B, H)`` for other ranks, e.g. ``()`` or ``(4,)``.
    Draws on the CPU in float32 then moves, so a seed gives the same numbers on
    every device and dtype.
    """
    Nk = Nq if Nk is None else Nk
    batch = (B, H) if batch_shape is None else tuple(batch_shape)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, Nq, D, generator=g)
    k = torch.randn(*batch, Nk, D, generator=g)
    v = torch.randn(*batch, Nk, D, generator=g)
    out = [t.to(device=device, dtype=dtype).requires_grad_(requires_grad) for t in (q, k, v)]
    return tuple(out)


def make_dout(like: torch.Tensor, seed=1):
    """Upstream gradient shaped like the output ``like``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(like.shape, generator=g).to(device=like.device, dtype=like.dtype)
