"""bench/experiments/triton_fwd_pipelined.py: every loop variant of the experiment (step 05's forward with the
next tile's Q K^T issued before this tile's softmax, and the FlashAttention-3 order) against the float64
reference, so the GPU run starts from kernels known to be right; and the compile report's SASS / TTGIR parsers
on listings whose answer is known.

The variants ran in Triton's interpreter on a CPU before the GPU run (fp16 on every small tile, fp32 on one); the
experiment answered, they run on a GPU only now, compiled, at the same sizes. Shapes with partial tiles, Nq != Nk
both ways, a padded head dim and fewer keys than one key tile; causal and not; O and the LSE. The parsers' tests
run everywhere.
"""

import pytest
import torch

from bench.experiments import triton_fwd_pipelined as fp


# Answered (no form pays: the header): under the interpreter these checks cost ~40 s of `make test` a run for
# kernels no step uses, so they run where the experiment runs, on a GPU (every `make gpu-check`).
@pytest.mark.skipif(not torch.cuda.is_available(), reason="an answered experiment: its kernels are checked on a GPU")
@pytest.mark.parametrize("variant", list(fp.VARIANTS))
def test_variant_matches_reference(variant):
    dtypes = {torch.float16: fp.SMALL_TILES, torch.float32: fp.SMALL_TILES[:1]}
    failures = fp.small_check([variant], dtypes=dtypes, with_step05=False, verbose=False)
    assert not failures, f"{variant}: {len(failures)} cases wrong:\n" + "\n".join(failures[:12])


SASS = """
        /*0100*/                   WARPGROUP.ARRIVE ;
        /*0110*/                   HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR12].tnspB, R24 ;
        /*0120*/                   MUFU.EX2 R104, R104 ;
        /*0130*/                   HGMMA.64x64x16.F32.BF16 R24, R60, gdesc[UR12].tnspB, R24, gsb0 ;
        /*0140*/                   MUFU.EX2 R105, R105 ;
        /*0150*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0160*/                   MUFU.EX2 R106, R106 ;
        /*0170*/                   HGMMA.64x64x16.F32.BF16 R56, gdesc[UR8], RZ, !UPT ;
        /*0180*/                   IMAD.MOV.U32 R170, RZ, RZ, R57 ;
        /*0190*/                   MUFU.EX2 R107, R107 ;
        /*01a0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*01b0*/              @!P1 BRA 0x100 ;
        /*01c0*/                   MUFU.EX2 R108, R108 ;
"""


def test_sass_loop_parser():
    (loop,) = fp.sass_loops(SASS)
    assert loop["schedule"] == "Hr EX1 Hr EX1 W0 EX1 Hs mov EX1 W1", loop
    assert (loop["ex2"], loop["ex2_in_flight"], loop["hgmma"], loop["waits"]) == (4, 3, 3, [0, 1])


def test_ttgir_loop_parser():
    ttgir = """
    %r:2 = scf.for %i = %c0 to %n step %c64 iter_args(%a = %x, %s = %y) -> (...) {
      %d = ttng.warp_group_dot %p, %v, %a {isAsync = true} : tensor<128x64xbf16, #dot> * !ttg.memdesc<64x64xbf16> -> tensor<128x64xf32, #mma>
      %w:2 = ttng.warp_group_dot_wait %d, %s {pendings = 0 : i32} : tensor<128x64xf32, #mma>
      %n = ttng.warp_group_dot %q, %k, %c {isAsync = true} : !ttg.memdesc<128x64xbf16> * !ttg.memdesc<64x64xbf16> -> tensor<128x64xf32, #mma>
      %e = math.exp2 %t : tensor<128x64xf32, #mma>
      %f = math.exp2 %u : tensor<128xf32, #mma>
      scf.yield %w#0, %n : tensor<128x64xf32, #mma>, tensor<128x64xf32, #mma>
    }
    """
    assert fp.ttgir_loops(ttgir) == ["D(r) W0 D(s) EX2"]
