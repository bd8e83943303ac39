"""bench/sparse_gpu.py's FlexAttention mask is step 09's pattern: checked here, where no GPU runs the bench."""

import pytest
import torch


@pytest.mark.step09
@pytest.mark.parametrize("window,n_global", [(1, 0), (4, 0), (5, 3), (64, 8)])
def test_flex_mask_is_step09s_visible(load, window, n_global):
    from bench.sparse_gpu import make_mask_mod
    s9 = load(9)
    qi, ki = torch.arange(80)[:, None], torch.arange(80)[None, :]
    ours = s9.visible.fn(qi, ki, window, n_global, True)
    flex = make_mask_mod(window, n_global)(0, 0, qi, ki)
    assert torch.equal(ours, flex), (f"bench/sparse_gpu.py's mask_mod differs from step 09's visible at window "
                                     f"{window}, {n_global} global: {(ours != flex).nonzero()[:5].tolist()} ...")
