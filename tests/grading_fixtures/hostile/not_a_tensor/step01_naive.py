"""Wrong: returns a list. Expect: every forward and backward check fails with a message saying so."""
from attnlib import check_inputs


def attention(q, k, v, is_causal=False, scale=None):
    check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    return [q, k, v]
