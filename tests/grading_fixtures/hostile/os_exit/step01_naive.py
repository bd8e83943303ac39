"""Hostile: leaves the process (exit code 0) in the middle of the grade. Expect: crashed, 0 points."""
import os

from attnlib import check_inputs


def attention(q, k, v, is_causal=False, scale=None):
    check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    os._exit(0)
