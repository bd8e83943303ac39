"""Hostile: a segmentation fault through ctypes, as a buggy kernel would. Expect: crashed (SIGSEGV), 0 points."""
import ctypes

from attnlib import check_inputs


def attention(q, k, v, is_causal=False, scale=None):
    check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    return ctypes.string_at(0)       # reads address 0
