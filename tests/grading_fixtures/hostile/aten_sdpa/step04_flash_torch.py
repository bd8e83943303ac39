"""Hostile: step 04 through PyTorch's own fused kernel, called at the aten level to dodge F.scaled_dot_product_attention.

Every forward and backward comparison passes. Expect: the rule "no_sdpa" is broken and the step scores 0.
"""
import torch

from attnlib import check_inputs


def attention(q, k, v, is_causal=False, scale=None):
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal, scale=scale)[0]
