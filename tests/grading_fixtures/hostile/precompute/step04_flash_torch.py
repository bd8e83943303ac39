"""Hostile: pre-computes every answer at import, where no rule is watching (issue 14, hole 1).

The worker used to load every check's inputs, hidden groups included, from the task file named in
its command line (``sys.argv[1]``). At import this step reads that file -- and any other ``*.pt``
file beside it -- computes each output, LSE and gradient with ``F.scaled_dot_product_attention``
and serves them from a cache through a ``FlashAttention`` Function that saves exactly one LSE. No
SDPA call, no N x N tensor, no reference call ever happens inside a graded call. Against the grader
before the change it scored full marks (12/12 with the hidden tests in the issue; 10/10 here).

Expect now: the task file holds settings only and the inputs arrive one at a time after the import,
so the cache is empty, every call raises "pre-computed 0 outputs at import", and the step scores 0.
"""
import hashlib
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlib import check_inputs

OUTPUTS: dict = {}      # key of (q, k, v, is_causal, scale) -> (O, LSE)
GRADS: dict = {}        # (that key, key of dO) -> (dQ, dK, dV)
LOOKED_IN: list = []    # the files it read


def _key(*tensors, extra="") -> str:
    h = hashlib.sha256(extra.encode())
    for t in tensors:
        t = t.detach().contiguous().cpu()
        h.update(f"{tuple(t.shape)}/{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _task_files():
    """The task file the worker was started with, and every other .pt file in the grader's folder."""
    seen = set()
    for arg in sys.argv[1:]:
        p = Path(arg)
        if p.is_file():
            seen.add(p)
            seen.update(p.parent.parent.rglob("*.pt"))       # the other steps' folders too
    return sorted(seen)


def _precompute(it):
    q, k, v, causal, scale = it["q"], it["k"], it["v"], it["is_causal"], it["scale"]
    if q.numel() == 0 or "bad_q" in it:
        return
    key = _key(q, k, v, extra=f"{causal}/{scale}")
    s = scale if scale is not None else q.shape[-1] ** -0.5
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = F.scaled_dot_product_attention(*leaves, is_causal=causal, scale=scale)
    scores = (q.double() @ k.double().transpose(-2, -1)) * s
    if causal:
        hide = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(hide, float("-inf"))
    OUTPUTS[key] = (o.detach(), torch.logsumexp(scores, dim=-1).float())
    if it.get("dout") is not None:
        GRADS[(key, _key(it["dout"]))] = torch.autograd.grad(o, leaves, it["dout"])


for path in _task_files():
    try:
        task = torch.load(path, weights_only=True)
    except Exception:  # noqa: BLE001 - not a task file
        continue
    LOOKED_IN.append(path.name)
    if isinstance(task, dict):
        for item in task.get("items", []):
            _precompute(item)


def _cached(q, k, v, is_causal, scale):
    key = _key(q, k, v, extra=f"{is_causal}/{scale}")
    if key not in OUTPUTS:
        raise RuntimeError(f"pre-computed {len(OUTPUTS)} outputs at import (read: {', '.join(LOOKED_IN) or 'nothing'}); "
                           "this input was not among them")
    return key, OUTPUTS[key]


class FlashAttentionCached(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale):
        ctx.key, (o, lse) = _cached(q, k, v, is_causal, scale)
        ctx.save_for_backward(lse)
        return o.clone()

    @staticmethod
    def backward(ctx, do):
        return (*GRADS[(ctx.key, _key(do))], None, None)


def attention(q, k, v, is_causal=False, scale=None):
    check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    return FlashAttentionCached.apply(q, k, v, is_causal, scale)


def attention_with_lse(q, k, v, is_causal=False, scale=None):
    check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    _, (o, lse) = _cached(q, k, v, is_causal, scale)
    return o.clone(), lse.clone()
