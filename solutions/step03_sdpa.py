"""Step 03 -- F.scaled_dot_product_attention: PyTorch's fused attention and its backends.

One call, four implementations behind it. PyTorch picks the first backend that
accepts the inputs, in this order of preference on a GPU: FlashAttention-2
("flash"), cuDNN ("cudnn"), memory-efficient xFormers-style ("efficient") and
the plain composite ("math"). A backend refuses inputs it cannot handle (a dtype,
a head dim, an attention mask, the GPU's architecture) and PyTorch says why in a
warning when you force it. On the CPU only "math" and a CPU "flash" exist.

This step teaches you to choose a backend explicitly, to ask which one runs, and
to read why one refuses.
"""

import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnlib import check_inputs

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
_NAMES = {v: k for k, v in BACKENDS.items()}


def _backend(name):
    if name not in BACKENDS:
        raise ValueError(f"unknown SDPA backend {name!r}; choose one of {sorted(BACKENDS)}")
    return BACKENDS[name]


def attention(q, k, v, is_causal=False, scale=None, backend=None):
    """The course contract through ``F.scaled_dot_product_attention``.

    ``backend``: None lets PyTorch choose; "flash", "efficient", "cudnn" or
    "math" forces that one (a RuntimeError if it refuses these inputs:
    ``refusal_reasons`` says why).
    """
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where="step03 attention")
    if backend is not None:
        _backend(backend)
    # >>> STUDENT: call F.scaled_dot_product_attention(q, k, v, is_causal=..., scale=...); when backend is given, inside `with sdpa_kernel([BACKENDS[backend]]):`
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)
    with sdpa_kernel([BACKENDS[backend]]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)
    # <<< STUDENT


def chosen_backend(q, k, v, is_causal=False, scale=None):
    """The name of the backend PyTorch would run for these inputs."""
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where="step03 chosen_backend")
    # >>> STUDENT: ask the dispatcher: torch._fused_sdp_choice(q, k, v, None, 0.0, is_causal, scale=scale) returns an int; map it through SDPBackend(...) and _NAMES
    choice = SDPBackend(torch._fused_sdp_choice(q, k, v, None, 0.0, is_causal, scale=scale))
    return _NAMES.get(choice, choice.name.lower())
    # <<< STUDENT


def refusal_reasons(backend, q, k, v, is_causal=False, scale=None):
    """Why ``backend`` refuses these inputs: a list of sentences, empty if it accepts them."""
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where="step03 refusal_reasons")
    b = _backend(backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.no_grad(), sdpa_kernel([b]):
                F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)
            return []
        except RuntimeError as err:
            reasons = [str(w.message) for w in caught]
            if not reasons:
                reasons = [str(err).splitlines()[0]]
                if q.device.type == "cpu":
                    reasons.append("on the CPU, PyTorch has only the 'math' and 'flash' backends")
            return reasons
