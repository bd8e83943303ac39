"""Experiment: does loading Q/K/V through Hopper TMA (Triton tensor descriptors) speed up step 05?

Answer (one H200 run, 2026-11-30 01:03 UTC: results/h200/triton/fwd_tma.json and tma.log; told in
results/h200/triton/README.md, "What they say", at the end of notebook 05 and in step 05's
docstring). Not at D=64: 1.341 against 1.347 ms at the leaderboard shape with the same tiles,
0.98-1.03x elsewhere. At D=128, TMA with 128x128 tiles ran 1.17x (causal) and 1.13x (not causal)
faster than step 05's table, 1.05-1.07x at the table's own tiles; pointer loads at 128x128 were
not timed at D=128, so how much of that is the tile size is still open. Warp specialization
(``warp_specialize=True``, device-side descriptors, 4 warps): NaN with 3 stages on every shape,
correct and 1.2-1.3x slower with 2. Step 05 kept its pointer loads; issue 17 (TMA, warp
specialization and wgmma on Hopper) starts from here.

Follow-up (``--plan d128``, one H200 run, 2026-12-01 12:25 UTC: results/h200/triton/fwd_tma_d128.log; the
JSON did not come back from the machine, the log has every row). At D=128, N=16384 (B=1) and 4096 (B=4),
H=16, causal and not, same tiles, TMA against step 05's pointer loads: 1.02-1.11x at 128x128 w8 s3
(1.11x causal, 1.02-1.04x not), 1.06-1.10x at 128x64. The tile alone: step 05's pointer kernel at
128x128 w8 s3 runs 1.01-1.04x (causal) and 1.07x (not) faster than its table's 64x64 / 128x64, so step
05's ``dense_fwd_config`` now takes 128x128 at D=128 on Hopper. Against cuDNN in the same run: pointer
loads at 128x128 0.81-0.87x causal, 0.76-0.82x not; TMA 0.89-0.96x causal, 0.77-0.85x not (issue 17's
target, 0.95x, met only at causal N=16384).

How the kernel here differs from step 05's ``_attn_fwd_kernel`` (solutions/step05_triton_fwd.py):
same math and schedule (below), but every tile moves by TMA through descriptors on a 2-D
(B*H*N, D) view, so it takes only what TMA can address without masks: contiguous inputs, Nq == Nk,
N a multiple of both tiles, D a power of two; plus the flags step 05 lacks (one masked causal loop,
warp specialization, O stored by pointers). The "step05_ptr_*" and "step05_default" rows run
step 05 itself (solutions/, through attnlib.loader), not a copy.

The kernel below is step 05's ``_attn_fwd_kernel`` math unchanged (exp2
with log2(e) folded into the scale, causal keys split into unmasked tiles [0, hi_full) and masked
diagonal tiles [hi_full, hi), heaviest query tiles first, LSE stored in natural log), restricted to
what TMA needs: contiguous (B, H, N, D) fp16/bf16 inputs viewed as 2-D (B*H*N, D), D in {64, 128}
on the GPU, N a multiple of BLOCK_M and BLOCK_N (no masked rows or columns at all: a tile that ran
past N would read the next head's rows, which TMA does not zero-pad).

Descriptors, as Triton 3.6's tutorial 06-fused-attention does it (python/tutorials/06-fused-attention.py):
  * "host"   : ``triton.tools.tensor_descriptor.TensorDescriptor(t2d, shape=[B*H*N, D], strides=[D, 1],
               block_shape=[BLOCK, D])`` built on the host and passed as a kernel argument (the
               tutorial's path on Hopper without warp specialization);
  * "device" : raw pointers passed, ``tl.make_tensor_descriptor(ptr, shape, strides, block_shape)``
               inside the kernel, which needs ``triton.set_allocator`` (global scratch for the
               128-byte descriptors); the tutorial's path on Hopper *with* ``warp_specialize=True``;
  * ``warp_specialize=True`` on the key loop (``tl.range(lo, hi, BLOCK_N, warp_specialize=...)``);
    Triton 3.6 runs ``nvidia.passes.hopper.add_hopper_warpspec`` for sm_8x/9x, and the tutorial
    benchmarks WS on Hopper for the non-causal forward only. Compiling for sm_90 without a GPU
    (--aot-check) shows: WS only takes effect with num_warps=4 (with 8 the flag is silently ignored),
    only with device-side descriptors (host ones fail in the WS pass), and the causal two-loop form
    fails; so the WS rows use ONE_LOOP=True (one loop over [0, hi) masking every tile: same result,
    a little more ALU work on the tiles below the diagonal).
Both paths meet in ``_maybe_make_tensor_desc`` (a compile-time isinstance on tl.tensor_descriptor).

Every row is checked against step 05 and the fp64 reference before it is timed; every failure is
caught and recorded per row; the JSON is rewritten after every row; a watchdog writes it and exits
if one row hangs (--row-limit-s) or the run passes --hard-limit-s.

Usage (repo root):
    python3 bench/experiments/triton_fwd_tma.py --out $OUT/tma --budget-s 90     # on the H200
    python3 bench/experiments/triton_fwd_tma.py --cpu-check                       # no GPU: Triton interpreter, tiny sizes
    python3 bench/experiments/triton_fwd_tma.py --aot-check                       # no GPU: compile every variant for sm_90
"""

import os
import sys
import time

T_START = time.time()          # the budget and the watchdog count from here (imports and CUDA init included)
CPU_CHECK = "--cpu-check" in sys.argv
if CPU_CHECK:
    os.environ["TRITON_INTERPRET"] = "1"          # must precede the first `import triton`

import argparse
import datetime
import json
import math
import platform
import tempfile
import threading
import traceback
from dataclasses import dataclass, asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]    # the repository root: bench/experiments/../..
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

LOG2E = 1.4426950408889634
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)


# %% Kernel -------------------------------------------------------------------------

@triton.jit
def _maybe_make_tensor_desc(desc_or_ptr, shape, strides, block_shape):
    # Same helper as the Triton tutorial: a host TensorDescriptor arrives as a tl.tensor_descriptor
    # and is used as is; a pointer gets a device-side descriptor (needs triton.set_allocator).
    if isinstance(desc_or_ptr, tl.tensor_descriptor):
        return desc_or_ptr
    else:
        return tl.make_tensor_descriptor(desc_or_ptr, shape, strides, block_shape)


@triton.jit
def _fwd_inner_tma(acc, l_i, m_i, q, desc_k, desc_v,
                   row0,                         # first row of this (batch, head) in the 2-D (B*H*N, D) view
                   offs_m, lo, hi, qk_scale,
                   BLOCK_N: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr,
                   WARP_SPEC: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Step 05's _fwd_inner with the two tile loads done by TMA; N % BLOCK_N == 0 so no key mask."""
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPEC):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = desc_k.load([row0 + start_n, 0])                       # (BLOCK_N, D)
        v = desc_v.load([row0 + start_n, 0])                       # (BLOCK_N, D)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale    # (BLOCK_M, BLOCK_N), base 2
        if MASKED:
            if IS_CAUSAL:
                offs_n = start_n + tl.arange(0, BLOCK_N)
                s = tl.where(offs_n[None, :] <= offs_m[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_tma_kernel(
    desc_q, desc_k, desc_v, desc_o,     # host TensorDescriptors, or pointers to the (B*H*N, D) views
    LSE,                                # (B*H*N,) fp32
    Y_ROWS, N_CTX,                      # B*H*N, N
    qk_scale,                           # softmax scale * log2(e)
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    O_BY_PTR: tl.constexpr,             # store O with pointers (desc_o is then a plain pointer)
    WARP_SPEC: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    ONE_LOOP: tl.constexpr = False,     # causal: one loop over [0, hi), every tile masked (WS wants one loop)
):
    pid_m = tl.program_id(0)
    if IS_CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m            # heaviest query tiles first
    bh = tl.program_id(1)

    desc_q = _maybe_make_tensor_desc(desc_q, shape=[Y_ROWS, HEAD_DIM], strides=[HEAD_DIM, 1],
                                     block_shape=[BLOCK_M, HEAD_DIM])
    desc_k = _maybe_make_tensor_desc(desc_k, shape=[Y_ROWS, HEAD_DIM], strides=[HEAD_DIM, 1],
                                     block_shape=[BLOCK_N, HEAD_DIM])
    desc_v = _maybe_make_tensor_desc(desc_v, shape=[Y_ROWS, HEAD_DIM], strides=[HEAD_DIM, 1],
                                     block_shape=[BLOCK_N, HEAD_DIM])

    row0 = bh * N_CTX
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = desc_q.load([row0 + start_m, 0])                  # (BLOCK_M, D), on chip for the whole loop

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    # Step 05's split, with N_K = N_CTX a multiple of BLOCK_N (and N_Q = N_K).
    if IS_CAUSAL:
        hi_full = (start_m // BLOCK_N) * BLOCK_N
        hi = start_m + BLOCK_M
    else:
        hi_full = N_CTX
        hi = N_CTX
    if ONE_LOOP:
        # Same result: the mask is a no-op on the tiles below the diagonal (every key < start_m <= query).
        acc, l_i, m_i = _fwd_inner_tma(acc, l_i, m_i, q, desc_k, desc_v, row0, offs_m, 0, hi, qk_scale,
                                       BLOCK_N, IS_CAUSAL, IS_CAUSAL, WARP_SPEC, DOT_PRECISION)
    else:
        acc, l_i, m_i = _fwd_inner_tma(acc, l_i, m_i, q, desc_k, desc_v, row0, offs_m, 0, hi_full, qk_scale,
                                       BLOCK_N, False, IS_CAUSAL, WARP_SPEC, DOT_PRECISION)
    if IS_CAUSAL and not ONE_LOOP:      # non-causal: [hi_full, hi) is empty since N % BLOCK_N == 0
        acc, l_i, m_i = _fwd_inner_tma(acc, l_i, m_i, q, desc_k, desc_v, row0, offs_m, hi_full, hi, qk_scale,
                                       BLOCK_N, True, IS_CAUSAL, WARP_SPEC, DOT_PRECISION)

    o = acc * (1.0 / l_i)[:, None]
    lse = (m_i + tl.math.log2(l_i)) * LN2
    if O_BY_PTR:
        offs_d = tl.arange(0, HEAD_DIM)
        rows = (row0 + offs_m).to(tl.int64)
        tl.store(desc_o + rows[:, None] * HEAD_DIM + offs_d[None, :], o.to(desc_o.dtype.element_ty))
    else:
        desc_o = _maybe_make_tensor_desc(desc_o, shape=[Y_ROWS, HEAD_DIM], strides=[HEAD_DIM, 1],
                                         block_shape=[BLOCK_M, HEAD_DIM])
        desc_o.store([row0 + start_m, 0], o.to(q.dtype))
    tl.store(LSE + row0 + offs_m, lse)


# %% Launcher -----------------------------------------------------------------------

@dataclass(frozen=True)
class Variant:
    name: str
    impl: str             # "tma" (this file) or "step05" (step 05's pointer kernel with this config)
    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int
    desc: str = "host"    # "host" TensorDescriptor or "device" tl.make_tensor_descriptor
    ws: bool = False      # warp_specialize=True on the key loop
    o_ptr: bool = False   # store O with pointers instead of a descriptor
    one_loop: bool = False  # causal: one masked loop instead of unmasked + diagonal loops

    def cfg(self):
        return dict(BLOCK_M=self.BLOCK_M, BLOCK_N=self.BLOCK_N, num_warps=self.num_warps, num_stages=self.num_stages)


def _v(desc, bm, bn, w, s, ws=False, o_ptr=False, one_loop=False):
    tag = (f"tma_{desc}{'_ws' if ws else ''}{'_optr' if o_ptr else ''}{'_1loop' if one_loop else ''}"
           f"_{bm}x{bn}_w{w}_s{s}")
    return Variant(tag, "tma", bm, bn, w, s, desc, ws, o_ptr, one_loop)


def _p(bm, bn, w, s):
    return Variant(f"step05_ptr_{bm}x{bn}_w{w}_s{s}", "step05", bm, bn, w, s)


def tma_forward(q, k, v, is_causal, scale, var: Variant, return_kernel=False):
    """(O, LSE) like step 05's forward, for contiguous (B, H, N, D) q, k, v with N % BLOCK == 0."""
    assert q.shape == k.shape == v.shape and q.dim() == 4, "q, k, v: the same (B, H, N, D) shape"
    assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous(), "TMA path wants contiguous inputs"
    B, H, N, D = q.shape
    BM, BN = var.BLOCK_M, var.BLOCK_N
    assert N % BM == 0 and N % BN == 0, f"N={N} must be a multiple of BLOCK_M={BM} and BLOCK_N={BN}"
    assert D >= 16 and (D & (D - 1)) == 0, f"D={D} must be a power of two >= 16"
    if q.is_cuda:
        assert D in (64, 128), "GPU runs are restricted to D in {64, 128}"
        assert q.dtype in (torch.float16, torch.bfloat16)
    Y = B * H * N
    q2, k2, v2 = q.view(Y, D), k.view(Y, D), v.view(Y, D)
    o = torch.empty_like(q)
    o2 = o.view(Y, D)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
    if var.desc == "host":
        dq = TensorDescriptor(q2, shape=[Y, D], strides=[D, 1], block_shape=[BM, D])
        dk = TensorDescriptor(k2, shape=[Y, D], strides=[D, 1], block_shape=[BN, D])
        dv = TensorDescriptor(v2, shape=[Y, D], strides=[D, 1], block_shape=[BN, D])
        do = o2 if var.o_ptr else TensorDescriptor(o2, shape=[Y, D], strides=[D, 1], block_shape=[BM, D])
    elif var.desc == "device":
        dq, dk, dv, do = q2, k2, v2, o2
    else:
        raise ValueError(var.desc)
    grid = (N // BM, B * H)
    kern = _attn_fwd_tma_kernel[grid](
        dq, dk, dv, do, lse, Y, N, scale * LOG2E,
        HEAD_DIM=D, BLOCK_M=BM, BLOCK_N=BN, IS_CAUSAL=bool(is_causal), O_BY_PTR=var.o_ptr,
        WARP_SPEC=var.ws, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", ONE_LOOP=var.one_loop,
        num_warps=var.num_warps, num_stages=var.num_stages)
    if return_kernel:
        return o, lse, kern
    return o, lse


def kernel_info(kern):
    """Registers, spills, shared memory, and whether TMA / warp specialization made it into the code."""
    info = {}
    for key in ("n_regs", "n_spills"):
        try:
            info[key] = getattr(kern, key)
        except Exception:
            pass
    try:
        info["shared_bytes"] = kern.metadata.shared
    except Exception:
        pass
    try:
        ptx = kern.asm.get("ptx", "")
        info["ptx_tma_load"] = "cp.async.bulk.tensor" in ptx
        info["ptx_cp_async"] = "cp.async.cg" in ptx or "cp.async.ca" in ptx
        info["ptx_setmaxnreg"] = "setmaxnreg" in ptx
        info["ptx_wgmma"] = "wgmma" in ptx
    except Exception:
        pass
    try:
        ttgir = kern.asm.get("ttgir", "")
        info["ttgir_warp_specialize"] = "ttg.warp_specialize" in ttgir
    except Exception:
        pass
    return info


# %% Variants -------------------------------------------------------------------------

TMA_VARIANTS = [
    _v("host", 128, 64, 8, 3),            # step 05's D=64 config, TMA loads
    _v("host", 128, 64, 4, 3),
    _v("host", 128, 128, 8, 3),
    _v("host", 128, 64, 8, 4),
    _v("host", 64, 64, 4, 3),
    _v("device", 128, 64, 8, 3),          # same as the first, descriptors built in the kernel
    _v("host", 128, 64, 8, 3, o_ptr=True),
    _v("host", 128, 64, 8, 3, one_loop=True),   # what the one-loop form costs without WS
]
# Warp specialization on Hopper in Triton 3.6, as found by compiling for sm_90 here (--aot-check):
#  * only num_warps=4 specializes (ttg.warp_specialize + setmaxnreg in the code); with 8 warps the flag is
#    silently ignored (the cubin is byte-for-byte the non-WS one);
#  * host TensorDescriptors + WS fail to compile (NVGPUWarpSpecialization pass), which is why the tutorial
#    switches to device-side descriptors on Hopper when WS is on;
#  * the causal kernel's two loops (unmasked + diagonal) fail in the same pass; one masked loop compiles.
WS_VARIANTS = [
    _v("device", 128, 64, 4, 3, ws=True, one_loop=True),
    _v("device", 128, 64, 4, 2, ws=True, one_loop=True),
    _v("device", 128, 128, 4, 3, ws=True, one_loop=True),
    _v("device", 64, 64, 4, 3, ws=True, one_loop=True),
]
# (The two-loop causal WS kernel, _v("device", 128, 64, 4, 3, ws=True), fails in --aot-check and would dump a
# long MLIR reproducer into the log: left out of the GPU plan.)
D128_VARIANTS = [
    _v("host", 64, 64, 4, 3),             # step 05's D=128 causal config
    _v("host", 128, 64, 8, 3),            # step 05's D=128 non-causal config
    _v("host", 128, 128, 8, 3),
    _v("device", 128, 64, 4, 3, ws=True, one_loop=True),
    _v("device", 128, 64, 4, 2, ws=True, one_loop=True),
]
# Step 05's pointer kernel at the TMA configs it does not use by default (isolates TMA from tile choice).
PTR_VARIANTS = [_p(128, 64, 4, 3), _p(128, 128, 8, 3), _p(128, 64, 8, 4), _p(64, 64, 4, 3)]


# %% Harness ---------------------------------------------------------------------------

def flops(B, H, N, D, causal):
    f = 4.0 * B * H * N * N * D
    return f / 2 if causal else f


class Recorder:
    """Rows, written to JSON after every row (a crash or hang later loses nothing before it)."""

    def __init__(self, out_dir, meta):
        self.path = Path(out_dir) / "fwd_tma.json" if out_dir else None
        self.meta = meta
        self.rows = []
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def add(self, row):
        self.rows.append(row)
        self.flush()
        return row

    def flush(self, extra=None):
        if not self.path:
            return
        doc = dict(meta=self.meta, rows=self.rows)
        if extra:
            doc.update(extra)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        os.replace(tmp, self.path)


class Watchdog:
    """If one row runs longer than `row_limit_s` (a hang), or the whole run passes `hard_limit_s`,
    record it, write the JSON and exit: the device call must come back with results."""

    def __init__(self, rec, row_limit_s, hard_limit_s, t0):
        self.rec, self.row_limit_s, self.hard_limit_s, self.t0 = rec, row_limit_s, hard_limit_s, t0
        self.current, self.started = None, None
        self._stop = False
        threading.Thread(target=self._loop, daemon=True).start()

    def begin(self, label):
        self.current, self.started = label, time.time()

    def end(self):
        self.current, self.started = None, None

    def stop(self):
        self._stop = True

    def _loop(self):
        while not self._stop:
            time.sleep(1.0)
            now = time.time()
            why = None
            if self.started is not None and now - self.started > self.row_limit_s:
                why = f"row {self.current!r} ran over {self.row_limit_s:.0f} s (hang?)"
            elif now - self.t0 > self.hard_limit_s:
                why = f"whole run passed the hard limit {self.hard_limit_s:.0f} s during {self.current!r}"
            if why:
                print(f"\n!! WATCHDOG: {why}; writing JSON and exiting", flush=True)
                try:
                    self.rec.flush(extra=dict(watchdog=why))
                except Exception:
                    pass
                os._exit(3)


def err_max(a, b):
    d = (a.double() - b.double()).abs()
    if not torch.isfinite(a.double()).all():
        return float("nan")
    return float(d.max())


def short_err(e, n=600):
    s = f"{type(e).__name__}: {e}"
    s = s.strip()
    return s if len(s) <= n else s[: n // 2] + " ... " + s[-n // 2:]


def cuda_alive():
    if not torch.cuda.is_available():
        return True
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return True
    except Exception:
        return False


def group_name(D, causal, label=""):
    return f"D{D}_{'causal' if causal else 'noncausal'}" + (f"_{label}" if label else "")


def run_group(ctx, D, causal, variants, shape_check, shape_time, dtype, device, label="", baselines=True):
    """Correctness of every row at shape_check, then timing at shape_time. Returns the group's rows.

    baselines: time SDPA-FLASH, SDPA-cuDNN and step 05's default here too (otherwise the speedup column
    uses the SDPA-FLASH time of an earlier group with the same D and causality)."""
    from attnlib import reference_attention
    s5, rec, wd, args, bench, t0 = ctx["s5"], ctx["rec"], ctx["wd"], ctx["args"], ctx["bench"], ctx["t0"]
    group = group_name(D, causal, label)
    print(f"\n=== group {group}: check at (B,H,N,D)={shape_check}, time at {shape_time}, {dtype} ===", flush=True)
    scale = 1.0 / math.sqrt(D)
    out = []

    def over_budget():
        return time.time() - t0 > args.budget_s

    def base_row(name, impl, var=None):
        r = dict(group=group, name=name, impl=impl, D=D, causal=causal, dtype=str(dtype).replace("torch.", ""),
                 shape_check=list(shape_check), shape_time=list(shape_time), status=None)
        if var is not None:
            r.update(var.cfg(), desc=var.desc if var.impl == "tma" else "pointers", ws=var.ws, o_ptr=var.o_ptr,
                     one_loop=var.one_loop)
        return r

    # ---- correctness -------------------------------------------------------------
    g = torch.Generator(device=device).manual_seed(0)
    qc, kc, vc = (torch.randn(shape_check, generator=g, device=device, dtype=torch.float32).to(dtype)
                  for _ in range(3))
    ref_o, ref_lse = reference_attention(qc, kc, vc, is_causal=causal, scale=scale)
    s5_o = s5_lse = None
    s5_err_o = s5_err_lse = float("nan")
    try:
        s5_o, s5_lse = s5.forward(qc, kc, vc, causal, scale)
        s5_err_o, s5_err_lse = err_max(s5_o, ref_o), err_max(s5_lse, ref_lse)
    except Exception as e:
        print(f"  step05 forward failed in the check: {short_err(e)}", flush=True)
    if math.isfinite(s5_err_o) and math.isfinite(s5_err_lse):
        tol_o, tol_lse = 2 * s5_err_o + 1e-2, 2 * s5_err_lse + 1e-2
    else:
        tol_o, tol_lse = 3e-2, 3e-2
    if dtype == torch.float32:
        tol_o, tol_lse = 2 * s5_err_o + 1e-4, 2 * s5_err_lse + 1e-4
    print(f"  step05 vs fp64 reference: O {s5_err_o:.3e}  LSE {s5_err_lse:.3e}  -> tolerance O {tol_o:.3e} LSE {tol_lse:.3e}",
          flush=True)

    candidates = []     # (row, variant or None)
    if baselines:
        r = base_row("sdpa_flash", "sdpa"); r["backend"] = "FLASH_ATTENTION"; candidates.append((r, None))
        r = base_row("sdpa_cudnn", "sdpa"); r["backend"] = "CUDNN_ATTENTION"; candidates.append((r, None))
        r = base_row("step05_default", "step05")
        r.update(err_o=s5_err_o, err_lse=s5_err_lse, status="ok" if math.isfinite(s5_err_o) else "error")
        try:   # the tile config step 05 picks at the timed shape
            r.update(s5.fwd_config(shape_time[2], shape_time[2], D, dtype, causal, device, shape_time[0] * shape_time[1]),
                     desc="pointers")
        except Exception:
            pass
        candidates.append((r, None))
    for var in variants:
        r = base_row(var.name, var.impl, var)
        if over_budget():
            r["status"] = "skipped_budget"
            out.append(rec.add(r))
            continue
        wd.begin(f"{group}/{var.name}/check")
        t1 = time.time()
        try:
            if var.impl == "tma":
                o, lse, kern = tma_forward(qc, kc, vc, causal, scale, var, return_kernel=True)
                if device == "cuda":
                    torch.cuda.synchronize()
                    r.update(kernel_info(kern))
            else:
                o, lse = s5.forward(qc, kc, vc, causal, scale, config=var.cfg())
            r["err_o"], r["err_lse"] = err_max(o, ref_o), err_max(lse, ref_lse)
            if s5_o is not None:
                r["diff_o_vs_step05"] = err_max(o, s5_o)
                r["diff_lse_vs_step05"] = err_max(lse, s5_lse)
            ok = (r["err_o"] <= tol_o) and (r["err_lse"] <= tol_lse)     # NaN fails
            r["status"] = "ok" if ok else "wrong"
        except Exception as e:
            r["status"] = "error"
            r["error"] = short_err(e)
            r["traceback_tail"] = traceback.format_exc()[-1500:]
        r["check_s"] = round(time.time() - t1, 2)
        wd.end()
        print(f"  check {var.name:34s} {r['status']:8s} O {r.get('err_o', float('nan')):.3e} "
              f"LSE {r.get('err_lse', float('nan')):.3e}  ({r['check_s']} s)"
              + (f"  regs {r.get('n_regs')} spills {r.get('n_spills')} smem {r.get('shared_bytes')} "
                 f"tma {r.get('ptx_tma_load')} ws {r.get('ttgir_warp_specialize')}" if var.impl == "tma" else "")
              + (f"\n      {r['error'][:300]}" if r["status"] == "error" else ""), flush=True)
        if r["status"] == "error" and not cuda_alive():
            r["note"] = "CUDA context lost after this row"
            out.append(rec.add(r))
            ctx["dead"] = True
            return out
        candidates.append((r, var))
    del qc, kc, vc, ref_o, ref_lse, s5_o, s5_lse

    # ---- timing -------------------------------------------------------------------
    B, H, N, _ = shape_time
    g = torch.Generator(device=device).manual_seed(1)
    qt, kt, vt = (torch.randn(shape_time, generator=g, device=device, dtype=torch.float32).to(dtype)
                  for _ in range(3))
    fl = flops(B, H, N, D, causal)
    flash_ms = ctx["flash_ms"].get((D, causal, tuple(shape_time)))
    for r, var in candidates:
        if r["status"] not in (None, "ok"):
            out.append(rec.add(r))
            continue
        if over_budget():
            r["status"] = "skipped_budget" if r["status"] is None else r["status"]
            r["timing"] = "skipped_budget"
            out.append(rec.add(r))
            continue
        if r["impl"] == "sdpa":
            backend = r["backend"]

            def fn(backend=backend):
                from torch.nn.attention import sdpa_kernel, SDPBackend
                with sdpa_kernel(getattr(SDPBackend, backend)):
                    return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale)
        elif r["name"] == "step05_default":
            def fn():
                return s5.forward(qt, kt, vt, causal, scale)
        elif var.impl == "step05":
            def fn(var=var):
                return s5.forward(qt, kt, vt, causal, scale, config=var.cfg())
        else:
            def fn(var=var):
                return tma_forward(qt, kt, vt, causal, scale, var)
        wd.begin(f"{group}/{r['name']}/time")
        t1 = time.time()
        try:
            ms = float(bench(fn))
            r["ms"] = ms
            r["tflops"] = fl / (ms * 1e-3) / 1e12
            if r["status"] is None:
                r["status"] = "ok"
            if r["name"] == "sdpa_flash":
                flash_ms = ctx["flash_ms"][(D, causal, tuple(shape_time))] = ms
            if flash_ms:
                r["speedup_vs_sdpa_flash"] = flash_ms / ms
        except Exception as e:
            r["status"] = "error" if r["status"] is None else r["status"]
            r["timing"] = "error"
            r["error"] = short_err(e)
            r["traceback_tail"] = traceback.format_exc()[-1500:]
        r["time_s"] = round(time.time() - t1, 2)
        wd.end()
        if "ms" in r:
            sp = r.get("speedup_vs_sdpa_flash")
            print(f"  time  {r['name']:34s} {r['ms']:8.3f} ms  {r['tflops']:6.1f} TFLOP/s  "
                  f"x{sp:.3f} vs SDPA-FLASH" if sp else
                  f"  time  {r['name']:34s} {r['ms']:8.3f} ms  {r['tflops']:6.1f} TFLOP/s", flush=True)
        else:
            print(f"  time  {r['name']:34s} ERROR {r.get('error', '')[:300]}", flush=True)
        out.append(rec.add(r))
        if r.get("timing") == "error" and not cuda_alive():
            ctx["dead"] = True
            return out
    del qt, kt, vt
    return out


def run_all(args, device, dtype, plan, bench, meta):
    """plan: list of dicts D, causal, variants (a list, or rows_so_far -> list), check, time, label, baselines."""
    from attnlib.loader import load_step
    t0 = T_START if args.budget_from_start else time.time()
    rec = Recorder(args.out, meta)
    wd = Watchdog(rec, args.row_limit_s, args.hard_limit_s, t0)
    try:
        s5 = load_step(5, "solutions")
    except Exception as e:          # step 05 rows then fail one by one; the TMA rows still run
        print(f"!! could not import step 05: {short_err(e)}", flush=True)
        rec.meta["step05_import_error"] = short_err(e)
        s5 = None
    ctx = dict(s5=s5, rec=rec, wd=wd, args=args, bench=bench, t0=t0, dead=False, flash_ms={})
    for item in plan:
        D, causal, label = item["D"], item["causal"], item.get("label", "")
        gname = group_name(D, causal, label)
        try:
            variants = item["variants"](rec.rows) if callable(item["variants"]) else item["variants"]
        except Exception as e:
            rec.add(dict(group=gname, name="<variants>", status="error", error=short_err(e)))
            continue
        if ctx["dead"] or time.time() - t0 > args.budget_s:
            why = "skipped_cuda_dead" if ctx["dead"] else "skipped_budget"
            print(f"\n=== group {gname}: {why}", flush=True)
            for var in variants:
                rec.add(dict(group=gname, name=var.name, status=why))
            continue
        try:
            run_group(ctx, D, causal, variants, item["check"], item["time"], dtype, device,
                      label=label, baselines=item.get("baselines", True))
        except Exception as e:    # anything the per-row guards missed: record and go on
            print(f"  group failed: {short_err(e)}", flush=True)
            rec.add(dict(group=gname, name="<group>", status="error",
                         error=short_err(e), traceback_tail=traceback.format_exc()[-1500:]))
    wd.stop()
    elapsed = time.time() - t0
    rec.meta["elapsed_s"] = round(elapsed, 1)
    rec.flush()
    try:
        summarize(rec.rows)
    except Exception as e:
        print(f"summary failed: {short_err(e)} (the JSON is complete)", flush=True)
    print(f"\nelapsed {elapsed:.1f} s; rows: {len(rec.rows)}" + (f"; JSON: {rec.path}" if rec.path else ""), flush=True)
    return rec.rows


def summarize(rows):
    print("\n=== summary (ms, TFLOP/s, speedup vs SDPA-FLASH; best TMA row per group marked *) ===")
    groups = []
    for r in rows:
        if r.get("group") not in groups:
            groups.append(r.get("group"))
    for gname in groups:
        rs = [r for r in rows if r.get("group") == gname]
        timed = [r for r in rs if "ms" in r]
        tma = [r for r in timed if r.get("impl") == "tma"]
        best = min(tma, key=lambda r: r["ms"]) if tma else None
        print(f"-- {gname}")
        for r in rs:
            if "ms" in r:
                sp = r.get("speedup_vs_sdpa_flash")
                print(f"  {'*' if r is best else ' '} {r['name']:36s} {r['ms']:8.3f} {r['tflops']:7.1f}"
                      + (f"  x{sp:.3f}" if sp else ""))
            else:
                print(f"    {r['name']:36s} {r.get('status')}" + (f"  {r.get('error', '')[:120]}" if r.get("error") else ""))
        s5 = next((r for r in timed if r["name"] == "step05_default"), None)
        if best and s5:
            print(f"  best TMA {best['name']} vs step05_default: x{s5['ms'] / best['ms']:.3f}")
    # Same tile config, TMA (host descriptors, plain) vs step 05's pointer loads: the effect of TMA alone.
    key = lambda r: (r.get("D"), r.get("causal"), tuple(r.get("shape_time") or ()), r.get("BLOCK_M"), r.get("BLOCK_N"),
                     r.get("num_warps"), r.get("num_stages"))       # the same timed shape too (--plan d128 has two)
    ptr = {key(r): r for r in rows if r.get("impl") == "step05" and "ms" in r and r.get("BLOCK_M")}
    pairs = [(r, ptr[key(r)]) for r in rows if r.get("impl") == "tma" and "ms" in r and r.get("desc") == "host"
             and not (r.get("ws") or r.get("o_ptr") or r.get("one_loop")) and key(r) in ptr]
    if pairs:
        print("-- same tile config: TMA (host descriptors) vs step 05 pointer loads (>1: TMA faster)")
        for t, p_ in pairs:
            print(f"  D{t['D']} {'causal' if t['causal'] else 'noncausal':9s} {t['BLOCK_M']}x{t['BLOCK_N']} w{t['num_warps']} "
                  f"s{t['num_stages']} N={t['shape_time'][2]}: TMA {t['ms']:.3f} ms, pointers {p_['ms']:.3f} ms ({p_['name']}): x{p_['ms'] / t['ms']:.3f}")


def top_tma(rows, group, k):
    """The k fastest plain (non-WS) TMA variants timed in `group`, fastest first, rebuilt from their rows."""
    timed = sorted((r for r in rows if r.get("group") == group and r.get("impl") == "tma" and "ms" in r
                    and not r.get("ws")), key=lambda r: r["ms"])
    return [_v(r["desc"], r["BLOCK_M"], r["BLOCK_N"], r["num_warps"], r["num_stages"], r["ws"], r["o_ptr"],
               r.get("one_loop", False)) for r in timed[:k]]


def later_group_variants(rows, must, k=3):
    picked = top_tma(rows, "D64_causal", k)
    if not picked:
        picked = TMA_VARIANTS[:k]
    for m in must:
        if m not in picked:
            picked.append(m)
    return picked


def gpu_plan():
    chk64, chk128 = (1, 4, 1024, 64), (1, 4, 1024, 128)
    lb64, lb128 = (1, 16, 16384, 64), (1, 16, 16384, 128)
    must64 = [_v("host", 128, 64, 8, 3)]             # step 05's D=64 config
    # Priority order (the budget cuts from the end). The leaderboard shape first: plain TMA rows, then step 05's
    # pointer kernel at the same tile configs, then WS rows (a compiler crash or hang there must not cost the
    # main result: the JSON is written row by row and the watchdog writes it again before exiting);
    # D=64 non-causal times the 3 fastest plain TMA configs of the first group, step 05's config and WS;
    # D=128 a fixed list.
    plan = [
        dict(D=64, causal=True, variants=TMA_VARIANTS, check=chk64, time=lb64),           # leaderboard shape
        dict(D=64, causal=True, variants=PTR_VARIANTS, check=chk64, time=lb64, label="ptr", baselines=False),
        dict(D=64, causal=True, variants=WS_VARIANTS, check=chk64, time=lb64, label="ws", baselines=False),
        dict(D=64, causal=False, variants=lambda rows: later_group_variants(rows, must64) + WS_VARIANTS[:3],
             check=chk64, time=lb64),
        dict(D=128, causal=True, variants=D128_VARIANTS, check=chk128, time=lb128),
        dict(D=128, causal=False, variants=D128_VARIANTS, check=chk128, time=lb128),
    ]
    return plan


# --plan d128: the question the 11-30 run left open. At D=128, how much of TMA's 1.13-1.17x is the 128x128
# tile and how much the TMA loads? Step 05's pointer kernel and the TMA kernel at the same tiles, causal
# and not, at the leaderboard's N=16384 (B=1, H=16) and at N=4096 (B=4, H=16).
D128_PLAN_VARIANTS = [
    _p(64, 64, 4, 3), _p(128, 64, 8, 3), _p(128, 128, 8, 3), _p(128, 128, 8, 2), _p(128, 64, 8, 4),
    _v("host", 128, 64, 8, 3), _v("host", 128, 128, 8, 3), _v("host", 128, 128, 8, 2), _v("host", 64, 64, 4, 3),
]


def d128_plan():
    chk128 = (1, 4, 1024, 128)
    plan = []
    for shape in ((1, 16, 16384, 128), (4, 16, 4096, 128)):
        for causal in (True, False):
            plan.append(dict(D=128, causal=causal, variants=D128_PLAN_VARIANTS, check=chk128, time=shape,
                             label=f"d128_n{shape[2]}", baselines=True))
    return plan


def gpu_main(args):
    assert torch.cuda.is_available(), "no CUDA device (use --cpu-check on a CPU machine)"

    def alloc_fn(size: int, alignment: int, stream):
        return torch.empty(size, device="cuda", dtype=torch.int8)

    triton.set_allocator(alloc_fn)        # device-side tl.make_tensor_descriptor needs global scratch

    props = torch.cuda.get_device_properties(0)
    meta = dict(gpu=torch.cuda.get_device_name(0), capability=list(torch.cuda.get_device_capability(0)),
                sms=props.multi_processor_count, torch=torch.__version__, triton=triton.__version__,
                cuda=torch.version.cuda, python=platform.python_version(),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                argv=sys.argv, budget_s=args.budget_s,
                flops_formula="4*B*H*N^2*D, halved when causal",
                check_rule="wrong if err_O > 2*err_O(step05)+1e-2 or err_LSE > 2*err_LSE(step05)+1e-2 vs fp64 reference")
    print(json.dumps({k: meta[k] for k in ("gpu", "capability", "torch", "triton", "cuda", "date")}), flush=True)
    if torch.cuda.get_device_capability(0)[0] < 9:
        print("!! not Hopper or newer: TMA rows will fail (recorded per row)", flush=True)

    def bench(fn):
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")

    run_all(args, "cuda", torch.bfloat16, d128_plan() if args.plan == "d128" else gpu_plan(), bench, meta)


# %% AOT check (no GPU needed): compile every planned TMA variant for sm_90 -------------------

H100_MAX_SMEM = 232448       # bytes of shared memory one block may use on sm_90 (227 KB)


def aot_compile(var, D, causal, dtype=torch.bfloat16, capability=90):
    """Compile the TMA kernel for `var` for a CUDA target without a GPU; returns facts about the code."""
    import re
    import subprocess
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import mangle_type
    fn = _attn_fwd_tma_kernel
    y = torch.empty(16 * 1024, D, dtype=dtype)
    ptr = mangle_type(y)
    if var.desc == "host":
        sq = mangle_type(TensorDescriptor(y, [y.shape[0], D], [D, 1], [var.BLOCK_M, D]))
        sk = mangle_type(TensorDescriptor(y, [y.shape[0], D], [D, 1], [var.BLOCK_N, D]))
        so = ptr if var.o_ptr else sq
    else:
        sq = sk = so = ptr
    sig = dict(desc_q=sq, desc_k=sk, desc_v=sk, desc_o=so, LSE="*fp32", Y_ROWS="i32", N_CTX="i32", qk_scale="fp32")
    const = dict(HEAD_DIM=D, BLOCK_M=var.BLOCK_M, BLOCK_N=var.BLOCK_N, IS_CAUSAL=causal, O_BY_PTR=var.o_ptr,
                 WARP_SPEC=var.ws, DOT_PRECISION="tf32", ONE_LOOP=var.one_loop)
    sig.update({k: "constexpr" for k in const})
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]]
             for n in ("desc_q", "desc_k", "desc_v", "desc_o", "LSE", "Y_ROWS", "N_CTX") if not sig[n].startswith("tensordesc")}
    k = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", capability, 32),
                       options=dict(num_warps=var.num_warps, num_stages=var.num_stages))
    ptx, ttgir = k.asm.get("ptx", ""), k.asm.get("ttgir", "")
    info = dict(shared_bytes=k.metadata.shared, ptx_tma_load="cp.async.bulk.tensor" in ptx,
                ptx_cp_async="cp.async.cg" in ptx or "cp.async.ca" in ptx, ptx_wgmma="wgmma" in ptx,
                ttgir_warp_specialize="ttg.warp_specialize" in ttgir, ptx_setmaxnreg="setmaxnreg" in ptx)
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if cuobjdump.exists() and "cubin" in k.asm:
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            out = subprocess.run([str(cuobjdump), "-res-usage", f.name], capture_output=True, text=True).stdout
        m = re.search(r"REG:(\d+) STACK:(\d+)", out)
        if m:
            info["n_regs"], info["stack_bytes"] = int(m.group(1)), int(m.group(2))
    return info


def aot_main(args):
    print(f"AOT compile for cuda:90 (no GPU), triton {triton.__version__}")
    seen, failures, n = set(), 0, 0
    for item in gpu_plan():
        vs = item["variants"]([]) if callable(item["variants"]) else item["variants"]
        for var in vs:
            if var.impl != "tma" or (var, item["D"], item["causal"]) in seen:
                continue
            seen.add((var, item["D"], item["causal"]))
            n += 1
            tag = f"D{item['D']:<3d} causal={item['causal']!s:5s} {var.name:34s}"
            try:
                i = aot_compile(var, item["D"], item["causal"])
                smem = i["shared_bytes"]
                print(f"{tag} ok  smem {smem:6d}{' (> sm_90 limit: will fail at launch)' if smem > H100_MAX_SMEM else ''}"
                      f" regs {i.get('n_regs')} stack {i.get('stack_bytes')} TMA {i['ptx_tma_load']} "
                      f"cp.async {i['ptx_cp_async']} wgmma {i['ptx_wgmma']} WS {i['ttgir_warp_specialize']} "
                      f"setmaxnreg {i['ptx_setmaxnreg']}", flush=True)
            except Exception as e:
                failures += 1
                print(f"{tag} FAIL {short_err(e).splitlines()[0][:200]}", flush=True)
    print(f"{n} compiled, {failures} failed (failures are recorded as error rows on the GPU, not fatal)")
    return 0


# %% CPU check (Triton interpreter) -------------------------------------------------------

def cpu_main(args):
    from attnlib import reference_attention
    from attnlib.loader import load_step
    s5 = load_step(5, "solutions")
    print(f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')} triton {triton.__version__} torch {torch.__version__}")
    failures = []

    # 1) the kernel itself, host and device descriptors, fp32 and fp16, causal and not, several tilings
    cases = [
        (torch.float32, _v("host", 32, 32, 4, 1)),
        (torch.float32, _v("device", 32, 32, 4, 1)),
        (torch.float32, _v("host", 64, 32, 4, 1)),       # BLOCK_M > BLOCK_N: fully masked rows in a diagonal tile
        (torch.float32, _v("host", 32, 64, 4, 1)),       # BLOCK_N > BLOCK_M
        (torch.float32, _v("host", 32, 32, 4, 1, o_ptr=True)),
        (torch.float32, _v("device", 32, 32, 4, 1, ws=True)),
        (torch.float32, _v("device", 32, 32, 4, 1, ws=True, one_loop=True)),
        (torch.float32, _v("host", 64, 32, 4, 1, one_loop=True)),
        (torch.float32, _v("host", 32, 64, 4, 1, one_loop=True)),
        (torch.float16, _v("host", 32, 32, 4, 1)),
        (torch.float16, _v("device", 64, 32, 4, 1, o_ptr=True)),
    ]
    shape = (2, 2, 128, 64)
    for dtype, var in cases:
        for causal in (True, False):
            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(shape, generator=g).to(dtype) for _ in range(3))
            scale = 1.0 / math.sqrt(shape[-1])
            ref_o, ref_lse = reference_attention(q, k, v, is_causal=causal, scale=scale)
            s5o, s5l = s5.forward(q, k, v, causal, scale)
            t1 = time.time()
            try:
                o, lse = tma_forward(q, k, v, causal, scale, var)
                eo, el = err_max(o, ref_o), err_max(lse, ref_lse)
                e5o, e5l = err_max(s5o, ref_o), err_max(s5l, ref_lse)
                d5 = err_max(o, s5o)
                tol = 1e-4 if dtype == torch.float32 else 1e-2
                ok = eo <= 2 * e5o + tol and el <= 2 * e5l + tol
                msg = (f"{str(dtype):14s} {var.name:32s} causal={causal!s:5s} O {eo:.2e} LSE {el:.2e} "
                       f"(step05 {e5o:.2e}/{e5l:.2e}, |tma-step05| {d5:.2e}) {'OK' if ok else 'WRONG'} "
                       f"{time.time() - t1:.1f}s")
            except Exception as e:
                ok, msg = False, f"{str(dtype):14s} {var.name:32s} causal={causal} ERROR {short_err(e)}"
                traceback.print_exc()
            print(msg, flush=True)
            if not ok:
                failures.append(msg)

    # 2) guards: shapes TMA cannot do must be refused on the host, not read out of bounds
    for bad, why in [((1, 1, 100, 64), "N % BLOCK"), ((1, 1, 128, 48), "D not pow2")]:
        try:
            x = torch.randn(bad)
            tma_forward(x, x, x, True, 0.1, _v("host", 32, 32, 4, 1))
            failures.append(f"guard {why}: not refused")
            print(f"guard {why}: NOT refused", flush=True)
        except AssertionError as e:
            print(f"guard {why}: refused ({e})", flush=True)

    # 3) the GPU harness end to end on CPU: tiny shapes, a wall-clock timer instead of do_bench,
    #    SDPA's cuDNN row fails on CPU (exercises the per-row error path), JSON written.
    def bench(fn):
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    tiny = [_v("host", 32, 32, 4, 1), _v("device", 32, 32, 4, 1, ws=True), _v("host", 64, 64, 4, 1)]
    sh = (1, 2, 128, 64)
    plan = [
        dict(D=64, causal=True, variants=tiny, check=sh, time=sh),
        dict(D=64, causal=True, variants=[_p(32, 32, 4, 1)], check=sh, time=sh, label="ptr", baselines=False),
        dict(D=64, causal=False, variants=lambda rows: later_group_variants(rows, [_v("host", 64, 64, 4, 1)], k=1),
             check=sh, time=sh),
        dict(D=32, causal=True, variants=[_v("host", 32, 32, 4, 1)], check=(1, 1, 64, 32), time=(1, 1, 64, 32)),
    ]
    meta = dict(gpu="cpu-interpreter", torch=torch.__version__, triton=triton.__version__,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), argv=sys.argv)
    with tempfile.TemporaryDirectory() as td:
        args.out = args.out or td
        rows = run_all(args, "cpu", torch.float32, plan, bench, meta)
        doc = json.loads((Path(args.out) / "fwd_tma.json").read_text())
        print(f"JSON ok: {len(doc['rows'])} rows, meta keys {sorted(doc['meta'])}")
        st = {r["name"]: r["status"] for r in rows if r.get("group") == "D64_causal"}
        print("statuses D64_causal:", st)
        for name in ("tma_host_32x32_w4_s1", "tma_device_ws_32x32_w4_s1", "step05_default"):
            if st.get(name) != "ok":
                failures.append(f"harness: {name} status {st.get(name)}")
        if st.get("sdpa_cudnn") != "error":      # torch's CPU build has a flash SDPA, no cuDNN one
            failures.append("harness: sdpa_cudnn on CPU should be an error row")

    # 4) the GPU plan's variant selection, fed fake timings
    fake = [dict(group="D64_causal", impl="tma", ms=ms, **{k: getattr(v, k) for k in
                 ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "desc", "ws", "o_ptr", "one_loop")})
            for ms, v in zip([1.3, 1.1, 1.2, 1.5, 1.0, 1.4, 1.25], TMA_VARIANTS)]
    for item in gpu_plan():
        vs = item["variants"](fake) if callable(item["variants"]) else item["variants"]
        print(f"GPU plan {group_name(item['D'], item['causal'], item.get('label', '')):22s} "
              f"check {item['check']} time {item['time']}: {[v.name for v in vs]}")
        if not vs:
            failures.append(f"GPU plan group {item['D']} {item['causal']}: no variants")

    # 5) budget: with a zero budget nothing is timed, every row is skipped, nothing raises
    args2 = argparse.Namespace(**vars(args))
    args2.budget_s, args2.out = 0.0, None
    rows = run_all(args2, "cpu", torch.float32, plan[:1], bench, meta)
    if not all(r["status"].startswith("skipped") for r in rows):
        failures.append("budget 0: some row was not skipped")
    print("\nCPU CHECK:", "PASS" if not failures else f"{len(failures)} FAILURE(S)")
    for f in failures:
        print("  -", f)
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="directory for fwd_tma.json")
    ap.add_argument("--budget-s", type=float, default=90.0, help="no new check/timing starts after this many seconds")
    ap.add_argument("--row-limit-s", type=float, default=60.0, help="watchdog: one row longer than this = hang, exit")
    ap.add_argument("--hard-limit-s", type=float, default=150.0,
                    help="watchdog: exit (JSON written) this many seconds after the script started")
    ap.add_argument("--cpu-check", action="store_true", help="run in the Triton interpreter at tiny sizes")
    ap.add_argument("--plan", default="all", choices=("all", "d128"),
                    help="d128: only D=128, step 05's pointer kernel and TMA at the same tiles (the 11-30 open question)")
    ap.add_argument("--aot-check", action="store_true",
                    help="no GPU: compile every planned TMA variant for sm_90 and report TMA/WS/regs/smem")
    args = ap.parse_args()
    args.budget_from_start = True
    if args.aot_check:
        sys.exit(aot_main(args))
    if args.cpu_check:
        args.row_limit_s, args.hard_limit_s = 1e9, 1e9
        args.budget_from_start = False
        sys.exit(cpu_main(args))
    gpu_main(args)


if __name__ == "__main__":
    main()
