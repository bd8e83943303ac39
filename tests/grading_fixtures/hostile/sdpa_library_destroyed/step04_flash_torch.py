"""Hostile: step 04 through F.scaled_dot_product_attention after switching off the grader's no_sdpa blocker.

The blocker is a kernel registered at PyTorch's dispatcher for every SDPA operator. A Python registration
lives as long as its handle, so this file looks for every ``torch.library.Library`` object in the process
(``gc.get_objects()``) and destroys the ones that register over aten, and also calls ``_destroy`` on anything
else with that method that refers to the aten namespace. The original kernels come back, and the SDPA calls
below are not counted by anything (grading/README.md, "what a hostile submission can still do": this was
"not tried" until 2026-12-01).

Expect: the blocker survives (it has no Python object to find), SDPA fails, the rule "no_sdpa" is broken
and the step scores 0.
"""
import gc

import torch
import torch.nn.functional as F

from attnlib import check_inputs


def _switch_off_the_blocker():
    found = 0
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.library.Library) and getattr(obj, "ns", None) == "aten":
                obj._destroy()
                found += 1
        except Exception:  # noqa: BLE001 - whatever resists, move on
            pass
    torch.library._impls.clear()             # the bookkeeping that refuses a second Python registration
    return found


_switch_off_the_blocker()


def attention(q, k, v, is_causal=False, scale=None):
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    _switch_off_the_blocker()                # again: in case the grader registers per check
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)
