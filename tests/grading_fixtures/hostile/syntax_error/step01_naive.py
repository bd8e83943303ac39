"""Wrong: does not parse. Expect: import error, 0 points."""

def attention(q, k, v, is_causal=False, scale=None)
    return q
