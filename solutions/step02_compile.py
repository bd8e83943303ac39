"""Step 02 -- torch.compile: the same naive attention, fused by the compiler.

``torch.compile`` traces step 01's ``naive_attention`` into a graph and lets
Inductor fuse what it can: the scale, the mask and the softmax become one or two
generated kernels around the two matrix products. What it cannot do is change
the algorithm: the N x N score matrix is still written to memory, so peak
memory stays O(N^2). The notebook shows both.

Input checks stay outside the compiled function: they are Python logic on
shapes, and inside the graph they would only add guards.
"""

import torch

from attnlib import check_inputs

from .step01_naive import naive_attention

_compiled = None


def compiled_naive():
    """Return ``naive_attention`` compiled once per process (lazily: compiling costs seconds)."""
    global _compiled
    if _compiled is None:
        # >>> STUDENT: compile naive_attention with torch.compile; pass dynamic=True so a new N does not trigger a recompile
        _compiled = torch.compile(naive_attention, dynamic=True)
        # <<< STUDENT
    return _compiled


def attention(q, k, v, is_causal=False, scale=None):
    """The course contract, through the compiled naive attention."""
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where="step02 attention")
    return compiled_naive()(q, k, v, is_causal, scale)
