"""Hostile: the first call never returns. Expect: timed out, 0 points, the rest of the grade unharmed."""
from attnlib import check_inputs


def attention(q, k, v, is_causal=False, scale=None):
    check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    while True:
        pass
