"""Hostile: makes the worker write pickles that run a command when loaded.

It replaces torch.save, which the worker uses to hand results back, with one
that writes an object whose unpickling calls os.system. Expect: the grader
refuses to load it (weights_only), the command never runs, the step scores 0.
"""
import os
import pickle
from pathlib import Path

import torch

# The file the command would create: the test points it at a temporary folder.
SENTINEL = str(Path(__file__).resolve().parent / "evil_pickle_ran")


class Evil:
    def __reduce__(self):
        return (os.system, (f"touch {SENTINEL}",))


def _save(obj, f, *args, **kwargs):
    with open(f, "wb") as fh:
        pickle.dump({"tensors": {"o": Evil()}}, fh)


torch.save = _save


def attention(q, k, v, is_causal=False, scale=None):
    from attnlib import check_inputs, reference_attention  # noqa: F401
    check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    return q.clone()
