"""attnlib: what every step of the course shares.

- ``contract``  -- the one signature every step implements, and its input checks
- ``reference`` -- attention in float64, returning (O, LSE); the single source of truth
- ``compare``   -- the tolerance policy and a comparison that explains its failures
- ``diagnose``  -- names the classic FlashAttention bug a wrong result looks like
- ``inputs``    -- seeded q, k, v, dO factories
- ``loader``    -- imports a step from steps/, solutions/ or any submission folder
- ``stubgen``   -- writes steps/ from solutions/
"""

from .contract import STEPS, check_inputs, causal_mask
from .reference import reference_attention, reference_backward
from .compare import assert_close, tolerance_for, CompareError
from .inputs import make_qkv, make_dout

__all__ = [
    "STEPS", "check_inputs", "causal_mask",
    "reference_attention", "reference_backward",
    "assert_close", "tolerance_for", "CompareError",
    "make_qkv", "make_dout",
]
