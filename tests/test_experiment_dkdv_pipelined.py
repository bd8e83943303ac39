"""bench/experiments/triton_dkdv_pipelined.py: every new loop of the experiment (step 06's dK/dV loop with the next
query tile's K Q^T issued in this step, the dV / dK products deferred to the next step, and the dummy product
that makes Triton wait at the step's end) against the float64 reference and against step 06's own kernels at the
same tiles, so the GPU run starts from kernels known to be right.

The variants ran in Triton's interpreter on a CPU before the GPU run (fp16 on both small tiles, BLOCK_N / BLOCK_M = 2
and 4; fp32 on one); the experiment answered, they run on a GPU only now, compiled, at the same sizes.
Shapes with partial tiles, Nq != Nk both ways, a padded head dim (24) and fewer queries than one query tile;
causal and not; dK and dV.
"""

import pytest
import torch

from bench.experiments import triton_dkdv_pipelined as dp

NEW = [v for v in dp.VARIANTS if v != "control"]


# Answered (no form pays: the header): under the interpreter these checks cost ~40 s of `make test` a run for
# kernels no step uses, so they run where the experiment runs, on a GPU (every `make gpu-check`).
@pytest.mark.skipif(not torch.cuda.is_available(), reason="an answered experiment: its kernels are checked on a GPU")
@pytest.mark.parametrize("variant", NEW)
def test_variant_matches_reference(variant):
    failures = dp.small_check([variant], dtypes={torch.float16: dp.SMALL_TILES}, verbose=False)
    failures += dp.small_check([variant], shapes=dp.SMALL_SHAPES[:2], dtypes={torch.float32: dp.SMALL_TILES[:1]},
                               verbose=False)
    assert not failures, f"{variant}: {len(failures)} cases wrong:\n" + "\n".join(failures[:12])


def test_rows_name_known_variants():
    assert set(dp.VARIANTS) >= {v for v, _ in dp.ROWS.values()}
    assert all(t["BLOCK_N"] % t["BLOCK_M"] == 0 for _, t in dp.ROWS.values())


def test_serial_codes():
    w = ["(C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized due to insufficient "
         "register resources", "(C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized"]
    assert dp.serial_codes(dict(ptxas_warnings=w, serialized=True)) == "7512+7514"
    assert dp.serial_codes(dict(ptxas_warnings=[], serialized=False)) == "no"
