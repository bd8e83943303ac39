"""The contract every step implements, written down once.

    attention(q, k, v, is_causal=False, scale=None) -> o

- ``q`` is ``(..., Nq, D)``; ``k`` and ``v`` are ``(..., Nk, D)``, with the same
  leading ("batch") dimensions as ``q``. ``(B, H, N, D)`` is the usual case.
  ``Nq != Nk`` is allowed.
- ``o`` is ``(..., Nq, D)`` in the dtype of the inputs.
- ``scale`` defaults to ``1 / sqrt(D)``.
- ``is_causal`` masks as ``F.scaled_dot_product_attention`` does: aligned to
  the top-left corner, so query row ``i`` sees keys ``j <= i``. Every row sees
  key 0, so no row is ever fully masked.
- Steps 04-07 also expose a ``torch.autograd.Function`` that saves exactly one
  log-sum-exp tensor, shaped ``(..., Nq)`` in float32.

Bad input raises ``ValueError`` naming the problem. ``check_inputs`` is the one
place those checks live; every step calls it first.
"""

from __future__ import annotations

import math

import torch

# step number -> (module name, one-line title). steps/ and solutions/ hold the same names.
STEPS: dict[int, tuple[str, str]] = {
    1: ("step01_naive", "naive PyTorch attention"),
    2: ("step02_compile", "torch.compile of the naive attention"),
    3: ("step03_sdpa", "F.scaled_dot_product_attention and its backends"),
    4: ("step04_flash_torch", "FlashAttention-2 in pure PyTorch"),
    5: ("step05_triton_fwd", "Triton forward kernel"),
    6: ("step06_triton_bwd", "Triton backward kernels"),
    7: ("step07_cuda", "hand-written CUDA kernels"),
    8: ("step08_varlen", "ragged batches and GQA"),
    9: ("step09_sparse", "sliding window + global tokens"),
    10: ("step10_ring", "ring attention across processes"),
}

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
MAX_HEAD_DIM = 256


def check_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES,
    head_dims: tuple[int, ...] | None = None,
    max_head_dim: int = MAX_HEAD_DIM,
    where: str = "attention",
) -> float:
    """Validate the inputs of ``attention`` and return the scale to use.

    ``dtypes`` and ``head_dims`` let a step narrow the contract (a CUDA kernel
    built for D in {64, 128}, say); the message then says what is supported.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(
                f"{where}: {name} must have at least 2 dimensions (..., N, D), "
                f"got shape {tuple(t.shape)}"
            )
    if not (q.dim() == k.dim() == v.dim()):
        raise ValueError(
            f"{where}: q, k, v must have the same rank, got {q.dim()}, {k.dim()}, {v.dim()} "
            f"(shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)})"
        )
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise ValueError(
            f"{where}: the leading (batch, head) dimensions must match exactly, got "
            f"q {tuple(q.shape[:-2])}, k {tuple(k.shape[:-2])}, v {tuple(v.shape[:-2])}"
        )
    if k.shape != v.shape:
        raise ValueError(
            f"{where}: v must be shaped like k (..., Nk, D), got k {tuple(k.shape)} and v {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"{where}: q and k must have the same head dim D, got {q.shape[-1]} and {k.shape[-1]}"
        )
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    if nq == 0 or nk == 0:
        raise ValueError(f"{where}: sequence lengths must be at least 1, got Nq={nq}, Nk={nk}")
    if any(s == 0 for s in q.shape[:-2]):
        raise ValueError(f"{where}: empty batch dimensions {tuple(q.shape[:-2])}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(
            f"{where}: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype} "
            "(this course never casts silently: convert them yourself)"
        )
    if q.dtype not in dtypes:
        names = ", ".join(str(t).replace("torch.", "") for t in dtypes)
        raise ValueError(f"{where}: dtype {q.dtype} is not supported here; supported: {names}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{where}: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if head_dims is not None and d not in head_dims:
        raise ValueError(f"{where}: head dim D={d} is not supported here; supported: {sorted(head_dims)}")
    if d < 1 or d > max_head_dim:
        raise ValueError(f"{where}: head dim D={d} is outside this course's range 1..{max_head_dim}")
    if not isinstance(is_causal, bool):
        raise ValueError(f"{where}: is_causal must be a bool, got {type(is_causal).__name__}")
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, torch.Tensor) or not isinstance(scale, (int, float)):
        raise ValueError(f"{where}: scale must be a Python number or None, got {type(scale).__name__}")
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"{where}: scale must be a positive finite number, got {scale}")
    return scale


def causal_mask(nq: int, nk: int, device=None) -> torch.Tensor:
    """Boolean ``(nq, nk)`` mask, True where query ``i`` may see key ``j`` (``j <= i``).

    Top-left aligned, as ``F.scaled_dot_product_attention(is_causal=True)``.
    Only the naive steps and the reference may build it: it is N x N.
    """
    rows = torch.arange(nq, device=device)[:, None]
    cols = torch.arange(nk, device=device)[None, :]
    return cols <= rows
