"""Hostile: asks for 8 TiB on every call and fills it. Expect 0 points: on a CPU machine each check fails with
the allocator's error (the worker's address space is capped); on a GPU machine the memory watchdog kills it."""
import torch

from attnlib import check_inputs


def attention(q, k, v, is_causal=False, scale=None):
    check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    return torch.ones(2 ** 41, dtype=torch.float32)[: q.numel()].view(q.shape)
