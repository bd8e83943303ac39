"""Hostile: compiles naive attention *inside* attention and runs it, then returns step 01's eager result.

Issue 14 / grading/README.md: the rule ``compiled`` counted the graphs Dynamo compiled during the
graded calls, so a compiled function run beside the attention -- here the right one, on the same inputs,
its output thrown away (a trivial ``torch.compile(lambda x: torch.sin(x) + 1)`` does the same) -- passed
the rule with the attention that is returned computed eagerly: 6/6 with the tests' config. (Compiling
step 02's own graph keeps this fixture cheap in the test session: Inductor's cache already holds it.)

Expect: the worker's profiler sees the score-sized aten ops (mul, masked_fill, softmax on (..., Nq, Nk))
run outside the code Inductor generated; the rule "compiled" is broken, the step scores 0.
"""
import torch

from attnlib import check_inputs

from .step01_naive import naive_attention

_decoy = None


def attention(q, k, v, is_causal=False, scale=None):
    global _decoy
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where="step02 attention")
    if _decoy is None:                    # compiled inside the first graded call, where the rule counts it
        _decoy = torch.compile(naive_attention, dynamic=True)
    with torch.no_grad():
        _decoy(q.detach(), k.detach(), v.detach(), is_causal, scale)      # compiled, run, thrown away
    return naive_attention(q, k, v, is_causal, scale)                     # what is graded: eager
