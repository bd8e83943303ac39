"""Hostile: does not compile, and forges Dynamo's counter of compiled graphs so the worker reports one.

Expect: the grader looks in the worker's compile cache itself, finds no code Inductor
generated, and scores the step 0 (rule "compiled").
"""
import torch
import torch._dynamo.utils

from attnlib import check_inputs

from .step01_naive import naive_attention


def compiled_naive():
    torch._dynamo.utils.counters["stats"]["unique_graphs"] += 1
    return naive_attention


def attention(q, k, v, is_causal=False, scale=None):
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where="step02 attention")
    return compiled_naive()(q, k, v, is_causal, scale)
