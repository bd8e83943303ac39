"""Hostile: compiles a decoy *inside* attention, on every call, and computes attention eagerly.

Issue 14 / grading/README.md: the rule ``compiled`` counted the graphs Dynamo compiled during the
graded calls, so a trivial function compiled there (``torch.compile(lambda x: torch.sin(x) + 1)``,
a fresh one each call so Dynamo compiles it every time) passed the rule with the attention itself run by
step 01's eager code: 6/6 with the tests' config.

Expect: the worker's profiler sees the score-sized aten ops (mul, softmax, matmul on (..., Nq, Nk))
run outside the code Inductor generated; the rule "compiled" is broken, the step scores 0.
"""
import torch

from attnlib import check_inputs

from .step01_naive import naive_attention


def compiled_naive():
    decoy = torch.compile(lambda x: torch.sin(x) + 1)     # a new function each time: compiled on every call
    decoy(torch.ones(3))
    return naive_attention


def attention(q, k, v, is_causal=False, scale=None):
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where="step02 attention")
    return compiled_naive()(q, k, v, is_causal, scale)
