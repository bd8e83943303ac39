"""Hostile: the reference behind the rule's back -- the counting wrapper's ``__wrapped__`` for the forward,
a fresh ``importlib.reload(attnlib.reference)`` for anything else (issue 14, hole 2: 10/10 both ways when
the worker's attnlib held the real reference).

Expect 0: the worker's copy of attnlib.reference has nothing to call; every check fails saying so.
"""
import importlib

import attnlib
import attnlib.reference
from attnlib import check_inputs

_fresh = importlib.reload(attnlib.reference)


def attention(q, k, v, is_causal=False, scale=None):
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    fn = getattr(attnlib.reference_attention, "__wrapped__", _fresh.reference_attention)
    return fn(q, k, v, is_causal, scale)[0].to(q.dtype)
