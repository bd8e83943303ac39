"""The GPU tile tables hand every kernel only the compile-time constants it takes.

A table entry is passed whole to its kernel (``**tiles(config)``), so a key meant for one kernel (step
06's ``EARLY_DP`` / ``HEADS_FIRST``) that reaches another kernel reusing the table (steps 08, 09) fails at
its first GPU launch with an unexpected keyword, which no CPU test would see: the interpreter's tables
are different. This checks the CUDA tables on a CPU, at the shapes and dtypes their branches cover.
"""

import pytest
import torch

from attnlib.ops import tiles

SHAPES = [(16384, 16384, 64, 16), (4096, 4096, 128, 64), (1000, 2000, 32, 4), (2048, 2048, 256, 8)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _keys_taken(kernel, cfg, where):
    extra = set(tiles(cfg)) - set(kernel.arg_names)
    assert not extra, (f"{where}: the table gives {sorted(extra)} to {kernel.fn.__name__}, which does not take "
                       f"them (it takes {kernel.arg_names[-8:]} ...): strip them where the table is reused")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_table_entry_fits_its_kernel(load, dtype, causal, monkeypatch):
    s5, s6, s8, s9 = load(5), load(6), load(8), load(9)
    monkeypatch.setattr(s5, "_large_shared_memory", lambda device=None: True)     # an H100/H200, on a CPU
    for nq, nk, d, bh in SHAPES:
        where = f"N={nq}x{nk} D={d} B*H={bh} {dtype} {'causal' if causal else 'full'}"
        fwd = s5.dense_fwd_config(nq, nk, d, dtype, causal, "cuda", bh)
        _keys_taken(s5._attn_fwd_kernel, fwd, f"step 05 {where}")
        _keys_taken(s5._attn_fwd_tma_kernel, fwd, f"step 05 (tma) {where}")
        b6 = s6.bwd_config(nq, nk, d, dtype, causal, "cuda", bh)
        _keys_taken(s6._bwd_dkdv_kernel, b6["dkdv"], f"step 06 dkdv {where}")
        _keys_taken(s6._bwd_dq_kernel, b6["dq"], f"step 06 dq {where}")
        _keys_taken(s6._bwd_fused_kernel, b6["fused"], f"step 06 fused {where}")
        _keys_taken(s8._varlen_fwd_kernel, s5.fwd_config(nq, nk, d, dtype, causal, "cuda", bh), f"step 08 fwd {where}")
        b8 = s8.varlen_bwd_config(nq, nk, d, dtype, causal, "cuda", bh)
        _keys_taken(s8._varlen_dkdv_kernel, b8["dkdv"], f"step 08 dkdv {where}")
        _keys_taken(s8._varlen_dq_kernel, b8["dq"], f"step 08 dq {where}")
        b9 = s9.sparse_bwd_config(nq, nk, d, dtype, causal, "cuda", bh)
        for kern, entry in ((s9._sparse_dkdv_kernel, "dkdv"), (s9._sparse_dkdv_split_kernel, "dkdv"),
                            (s9._sparse_dq_kernel, "dq"), (s9._sparse_dq_split_kernel, "dq")):
            _keys_taken(kern, b9[entry], f"step 09 {entry} {where}")
        _keys_taken(s9._sparse_fwd_kernel, s9.sparse_fwd_config(nq, nk, d, dtype, causal, "cuda", bh),
                    f"step 09 fwd {where}")
