"""Experiment: does step 07's forward v4 (both products on Hopper wgmma) compute the right thing, and how fast?

Question. v4 (solutions/csrc/step07_fwd_v4.cu) is v3's algorithm with S = Q K^T and O += P V on
``wgmma.mma_async`` (sm_90a): Q, K, V read by the tensor cores from shared memory through 64-bit
matrix descriptors (128-byte swizzle; K K-major, V MN-major with imm-trans-b = 1), P from registers.
It was written and compiled without a GPU (no spills: 111-222 registers, HGMMA in the SASS). Are its
descriptors right, is it correct on every shape, and how fast is it beside v3, SDPA FLASH and cuDNN?

Answer (one H200, 2026-12-01 15:01 UTC, the tree of 3f626a2; results/h200/step07_v4/ ``v4_wgmma.json``,
``v4_wgmma.log``, ``README.md``): right the first time: every probe, 80 of 80 reference cases, memcheck and
racecheck clean. bf16, N 4k-16k: with 128x64 tiles 368-405 TFLOP/s at D=64 (0.87-0.88x cuDNN, 1.27-1.29x v3)
and 377-438 at D=128 (0.69-0.79x cuDNN, 1.26-1.39x v3); the 128x128 tiles are slower everywhere; SDPA-FLASH
is passed at every shape. Issue 17's 0.90x cuDNN is not reached: each wgmma batch is waited on at once.

What it does, in order, each part in its own try/except (one failure hides nothing else), the JSON
rewritten after every part:
  1. build the extension (solutions/, through attnlib.loader; sm_90a on an H100/H200);
  2. probes that localize a descriptor or fragment-layout bug, before anything else (B = H = 1,
     Nq = Nk = 128 or 256, both tile configs, both dtypes, D 64 and 128); each prints WHICH rows /
     columns / keys are wrong, against what the float64 reference says:
       - "v-layout":  Q = K = 0 (S = 0), causal, V all zero but V[j0, c0] = 1: row i must average
         keys 0..i, so O[i, c] = [c == c0][i >= j0] / (i + 1). Printed: where the one landed (first
         lit row = the key v4 read it as, lit column = the column), i.e. V's row and column mapping
         (the MN-major descriptor: LBO, SBO, trans-b) with nothing else involved;
       - "qk-onehot": Q all zero but Q[i0, d0] = 1, K all zero but K[j0, d0] = 30, V[j] = j (every
         column), scale 1: row i0 must pick key j0 (O = j0), every other row averages (O = (Nk-1)/2).
         Printed: the rows that picked something, and what. Tests Q's rows, K's rows and D's columns
         (the K-major descriptors and the advance along D, the swizzle of the second 64-column block);
       - "identity":  K rows random +-1, Q = K, V[j] = j, scale 1: row i must pick key i. Printed:
         rows that picked another key, grouped by warp (16 rows) and warpgroup (64 rows), with the
         keys they picked -- the accumulator layout and P's register-A layout, across key tiles.
  3. v4 against the float64 reference (attnlib.checks: O, LSE, and dQ/dK/dV through backward v2 for
     config 0), bf16 and fp16, D 64 and 128, causal and not, N in {1, 77, 128, 1000, 4096};
  4. timing (triton.testing.do_bench, median; v4 checked against v3's output first at every shape):
     v3, v4 (configs 0 and 1), SDPA FLASH, SDPA cuDNN, bf16, N 4k/8k/16k, B = 16384/N, H = 2048/D,
     TFLOP/s with FlashAttention's count 4*B*H*N*N*D (halved for causal) and the ratio to cuDNN
     from the same run;
  5. ``--sanitize``: reruns a small case (N = 77 and 300, causal and not, both D) in a child process
     under compute-sanitizer (memcheck, then racecheck: cp.async and wgmma share the tiles).
A watchdog stops starting new timing rows after --budget-s (default 170 s; the whole run stays
under 4 minutes on an H200, the first build included).

Usage (repo root, on the H200):
    python bench/experiments/cuda_v4_wgmma.py --out $OUT/v4 [--sanitize]
    python bench/experiments/cuda_v4_wgmma.py --selftest     # no GPU: the probe decoders, on the reference
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from attnlib.reference import reference_attention  # noqa: E402
from bench.experiments import gpu_run  # noqa: E402

REC = gpu_run.Record("v4_wgmma")    # the run's log and JSON (bench/experiments/gpu_run.py)
RESULT = REC.result
log, save, part = REC.log, REC.save, REC.part


def ranges(xs):
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8'."""
    xs = sorted(set(int(x) for x in xs))
    out, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(f"{xs[i]}" if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(out) if out else "-"


# ---------------------------------------------------------------- probes: inputs and decoders

def probe_v_layout(N, D, j0, c0, dtype, device):
    q = torch.zeros(1, 1, N, D, dtype=dtype, device=device)
    k = torch.zeros_like(q)
    v = torch.zeros_like(q)
    v[0, 0, j0, c0] = 1
    return q, k, v, True, None


def decode_v_layout(o, N, D, j0, c0):
    """Where did V[j0, c0] land? expected: column c0 only, rows >= j0 with 1/(i+1)."""
    o = o.float().cpu()[0, 0]
    lit = (o.abs() > 1e-4)
    cols = sorted(set(torch.nonzero(lit)[:, 1].tolist()))
    rows = sorted(set(torch.nonzero(lit)[:, 0].tolist()))
    exp = torch.zeros(N, D)
    exp[j0:, c0] = 1.0 / torch.arange(j0 + 1, N + 1, dtype=torch.float32)
    bad = (o - exp).abs() > 2e-2 * exp.abs().clamp_min(1e-3) + 1e-3
    ok = not bool(bad.any())
    msg = (f"V[{j0},{c0}]: " + ("ok" if ok else
           f"WRONG: lit columns {ranges(cols)} (want {c0}); first lit row {rows[0] if rows else None} "
           f"(the key v4 read it as; want {j0}); bad rows {ranges(torch.nonzero(bad.any(1))[:, 0].tolist())}"))
    return ok, msg


def probe_qk_onehot(N, D, i0, j0, d0, dtype, device):
    q = torch.zeros(1, 1, N, D, dtype=dtype, device=device)
    k = torch.zeros_like(q)
    q[0, 0, i0, d0] = 1
    k[0, 0, j0, d0] = 30
    v = torch.arange(N, dtype=torch.float32, device=device)[:, None].expand(N, D).to(dtype)[None, None].contiguous()
    return q, k, v, False, 1.0


def decode_qk_onehot(o, N, D, i0, j0, d0):
    o = o.float().cpu()[0, 0]
    mean = (N - 1) / 2
    exp = torch.full((N,), mean)
    exp[i0] = j0
    got = o.mean(1)
    spread = (o.max(1).values - o.min(1).values)
    bad = ((got - exp).abs() > 0.02 * max(1.0, mean)) | (spread > 0.02 * max(1.0, mean))
    ok = not bool(bad.any())
    if ok:
        return True, f"Q[{i0},{d0}] x K[{j0},{d0}]: ok"
    picked = [(int(r), round(float(got[r]), 2)) for r in torch.nonzero((got - mean).abs() > 0.5)[:, 0][:8]]
    return False, (f"Q[{i0},{d0}] x K[{j0},{d0}]: WRONG: row {i0} got {float(got[i0]):.2f} (want {j0}); rows that "
                   f"picked a key (row, key): {picked}; bad rows {ranges(torch.nonzero(bad)[:, 0].tolist())}; "
                   f"columns of row {i0} differ by {float(spread[i0]):.2f}")


def probe_identity(N, D, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = (torch.randint(0, 2, (1, 1, N, D), generator=g) * 2 - 1).to(dtype).to(device)
    q = k.clone()
    v = torch.arange(N, dtype=torch.float32, device=device)[:, None].expand(N, D).to(dtype)[None, None].contiguous()
    return q, k, v, False, 1.0


def decode_identity(o, N, D):
    o = o.float().cpu()[0, 0]
    got = o.mean(1)
    want = torch.arange(N, dtype=torch.float32)
    tol = torch.clamp(want.abs() * 8e-3, min=0.3)       # bf16 keeps 8 bits: 255 -> +-1
    bad = ((got - want).abs() > tol) | ((o.max(1).values - o.min(1).values) > tol)
    if not bool(bad.any()):
        return True, "identity: ok (every row picked its own key)"
    rows = torch.nonzero(bad)[:, 0].tolist()
    by_warp = sorted(set(r // 16 for r in rows))
    by_wg = sorted(set(r // 64 for r in rows))
    sample = [(r, round(float(got[r]), 1)) for r in rows[:12]]
    return False, (f"identity: WRONG rows {ranges(rows)} ({len(rows)}/{N}); warps (16 rows) {ranges(by_warp)}; "
                   f"warpgroups (64 rows) {ranges(by_wg)}; (row, key it read as its own): {sample}")


def probe_cases(D):
    """(name, make, decode) triples for one head dim."""
    cases = []
    for N in (128, 256):
        for j0, c0 in [(0, 0), (1, 1), (5, 9), (8, 8), (17, D - 1), (63, 31), (64, 40), (N - 1, D // 2 + 3)]:
            cases.append((f"v-layout N={N}", lambda dt, dev, N=N, j0=j0, c0=c0: probe_v_layout(N, D, j0, c0, dt, dev),
                          lambda o, N=N, j0=j0, c0=c0: decode_v_layout(o, N, D, j0, c0)))
    N = 256
    for i0, j0, d0 in [(0, 0, 0), (1, 2, 3), (9, 130, 17), (70, 5, 63), (127, 127, D - 1), (128, 200, D // 2 + 1),
                       (255, 77, 8), (33, 64, 40)]:
        cases.append((f"qk-onehot N={N}", lambda dt, dev, i0=i0, j0=j0, d0=d0: probe_qk_onehot(N, D, i0, j0, d0, dt, dev),
                      lambda o, i0=i0, j0=j0, d0=d0: decode_qk_onehot(o, N, D, i0, j0, d0)))
    for N in (128, 256):
        cases.append((f"identity N={N}", lambda dt, dev, N=N: probe_identity(N, D, dt, dev),
                      lambda o, N=N: decode_identity(o, N, D)))
    return cases


def reference_fn(q, k, v, is_causal, scale, config=0):
    return reference_attention(q, k, v, is_causal=is_causal, scale=scale)[0].to(q.dtype)


def run_probes(fn, dtypes, configs, device):
    """Run every probe through fn(q, k, v, is_causal, scale, config); returns (n_bad, lines)."""
    n_bad, lines = 0, []
    for D in (64, 128):
        for dtype in dtypes:
            for config in configs:
                for name, make, decode in probe_cases(D):
                    q, k, v, causal, scale = make(dtype, device)
                    ref_ok, _ = decode(reference_fn(q, k, v, causal, scale))
                    try:
                        o = fn(q, k, v, causal, scale, config)
                        ok, msg = decode(o)
                    except Exception as e:  # noqa: BLE001
                        ok, msg = False, f"raised {type(e).__name__}: {e}"
                    tag = f"D={D} {str(dtype)[6:]} config {config} {name}"
                    if not ref_ok:
                        msg += "  [the float64 reference itself fails this decoder: the probe is wrong, not v4]"
                    if not ok:
                        n_bad += 1
                        lines.append(f"{tag}: {msg}")
                    log(f"  {tag}: {msg}")
    return n_bad, lines


# ---------------------------------------------------------------- the parts

def flops(B, H, N, D, causal):
    f = 4.0 * B * H * N * N * D
    return f / 2 if causal else f


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="folder for v4_wgmma.json and v4_wgmma.log")
    ap.add_argument("--sanitize", action="store_true", help="also rerun a small case under compute-sanitizer")
    ap.add_argument("--budget-s", type=float, default=170.0, help="no new timing row starts after this")
    ap.add_argument("--selftest", action="store_true", help="no GPU: run the probe decoders on the reference")
    ap.add_argument("--sanitize-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    t_start = time.time()

    if args.selftest:
        # The decoders must pass the float64 reference and catch a planted layout bug.
        n_bad, _ = run_probes(reference_fn, [torch.float32], [0], "cpu")
        assert n_bad == 0, f"{n_bad} probes fail on the reference itself"

        def swapped(q, k, v, causal, scale, config):    # rows 8-15 of each 16 swapped with 0-7: a fragment bug
            o = reference_fn(q, k, v, causal, scale)
            idx = torch.arange(o.shape[-2])
            idx = torch.where(idx % 16 < 8, idx + 8, idx - 8).clamp_max(o.shape[-2] - 1)
            return o[..., idx, :]
        n_bad, lines = run_probes(swapped, [torch.float32], [0], "cpu")
        assert n_bad > 0 and any("identity: WRONG" in x for x in lines), "the probes miss a row swap"
        print(f"selftest ok: the reference passes every probe; a planted row swap fails {n_bad} of them")
        return

    if args.sanitize_child:
        from attnlib.loader import load_step
        from attnlib import make_qkv
        s7 = load_step(7, "solutions")
        for D in (64, 128):
            for N in (77, 300):
                for causal in (False, True):
                    q, k, v = make_qkv(1, 2, N, D=D, dtype=torch.bfloat16, device="cuda", seed=N)
                    for config in (0, 1):
                        s7.FlashAttentionCUDA.apply(q, k, v, causal, D ** -0.5, 4, config)
        torch.cuda.synchronize()
        print("sanitize child: done")
        return

    if args.out is None:
        ap.error("--out DIR is required on the GPU")
    REC.open(args.out, REPO)
    if not torch.cuda.is_available():
        log("no GPU: nothing to do here (try --selftest)")
        RESULT["meta"]["error"] = "no GPU"
        save()
        return
    RESULT["meta"]["gpu"] = torch.cuda.get_device_name()
    RESULT["meta"]["capability"] = torch.cuda.get_device_capability()
    try:
        import subprocess as sp
        RESULT["meta"]["git"] = sp.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                       capture_output=True, text=True).stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    log(f"GPU {RESULT['meta']['gpu']} {RESULT['meta']['capability']}, torch {torch.__version__}")

    from attnlib.loader import load_step
    s7 = load_step(7, "solutions")
    state = {}

    @part("1 build")
    def build():
        t0 = time.time()
        ext = s7.build()
        state["ext"] = ext
        log(f"built in {time.time() - t0:.1f} s: {ext.__file__}")
        return {"build_s": round(time.time() - t0, 1), "flags": s7.NVCC_FLAGS + s7.arch_flags(
            torch.cuda.get_device_capability())}
    build()

    def v4(q, k, v, causal, scale, config):
        s = q.shape[-1] ** -0.5 if scale is None else scale
        with torch.no_grad():
            return s7.FlashAttentionCUDA.apply(q, k, v, causal, s, 4, config)

    @part("2 probes")
    def probes():
        n_bad, lines = run_probes(v4, [torch.bfloat16, torch.float16], [0, 1], "cuda")
        log(f"probes: {n_bad} wrong" + ("" if not lines else ":\n  " + "\n  ".join(lines[:60])))
        return {"n_wrong": n_bad, "wrong": lines[:200]}
    probes()

    @part("3 correctness")
    def correctness():
        from attnlib import make_qkv
        from attnlib.checks import check_attention, check_lse

        def check(q, k, v, D, causal, config):
            def attn(q, k, v, is_causal, scale):
                s = D ** -0.5 if scale is None else scale
                return s7.FlashAttentionCUDA.apply(q, k, v, is_causal, s, 4, config)
            check_attention(attn, q, k, v, is_causal=causal, grads=q.requires_grad)
            with torch.no_grad():
                _, lse = s7.fwd_op(q, k, v, causal, D ** -0.5, 4, config)
            check_lse(lse, q, k, v, is_causal=causal)

        def cases():
            for dtype in (torch.bfloat16, torch.float16):
                for D in (64, 128):
                    for causal in (False, True):
                        for N in (1, 77, 128, 1000, 4096):
                            for config in (0, 1):
                                B, H = (1, 2) if N >= 4096 else (2, 3)
                                q, k, v = make_qkv(B, H, N, D=D, dtype=dtype, device="cuda", seed=N + D,
                                                   requires_grad=config == 0 and N <= 1000)
                                yield (f"{str(dtype)[6:]} D={D} causal={causal} N={N} config={config}",
                                       lambda q=q, k=k, v=v, D=D, causal=causal, config=config:
                                       check(q, k, v, D, causal, config))
        return gpu_run.check_cases(cases(), log)
    correctness()

    @part("4 timing")
    def timing():
        import triton
        from torch.nn.attention import SDPBackend, sdpa_kernel
        import torch.nn.functional as F
        rows = []
        for D in (128, 64):
            for causal in (False, True):
                for N in (4096, 8192, 16384):
                    if time.time() - t_start > args.budget_s:
                        log(f"  budget ({args.budget_s} s) spent: no more rows")
                        return {"rows": rows, "stopped_early": True}
                    B, H = 16384 // N, 2048 // D
                    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                    sc = D ** -0.5
                    impls = {
                        "v3": lambda: s7.fwd_op(q, k, v, causal, sc, 3, 0)[0],
                        "v4-c0": lambda: s7.fwd_op(q, k, v, causal, sc, 4, 0)[0],
                        "v4-c1": lambda: s7.fwd_op(q, k, v, causal, sc, 4, 1)[0],
                    }

                    def sdpa(backend):
                        def f():
                            with sdpa_kernel(backend):
                                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        return f
                    impls["sdpa-flash"] = sdpa(SDPBackend.FLASH_ATTENTION)
                    impls["cudnn"] = sdpa(SDPBackend.CUDNN_ATTENTION)
                    row = {"D": D, "causal": causal, "N": N, "B": B, "H": H, "ms": {}, "tflops": {}, "errors": {}}
                    with torch.no_grad():
                        ref = impls["v3"]()
                        for name, fn in impls.items():
                            try:
                                out = fn()
                                diff = (out.float() - ref.float()).abs().max().item()
                                row.setdefault("max_diff_vs_v3", {})[name] = diff
                                if not diff < 0.05:
                                    raise AssertionError(f"output differs from v3 by {diff:.3g}: not timed")
                                ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                                row["ms"][name] = ms
                                row["tflops"][name] = flops(B, H, N, D, causal) / ms / 1e9
                            except Exception as e:  # noqa: BLE001
                                row["errors"][name] = f"{type(e).__name__}: {str(e)[:300]}"
                    cud = row["ms"].get("cudnn")
                    row["x_cudnn"] = {n: cud / ms for n, ms in row["ms"].items()} if cud else {}
                    rows.append(row)
                    RESULT["parts"]["4 timing (partial)"] = rows
                    save()
                    log(f"  D={D} causal={int(causal)} N={N:5d} B={B} H={H}: " + "  ".join(
                        f"{n} {row['tflops'][n]:.0f} TF/s" + (f" (x{row['x_cudnn'][n]:.2f})" if n in row["x_cudnn"] else "")
                        for n in row["tflops"]) + ("" if not row["errors"] else f"  errors: {row['errors']}"))
        return {"rows": rows}
    timing()
    RESULT["parts"].pop("4 timing (partial)", None)

    if args.sanitize:
        @part("5 sanitize")
        def sanitize():
            return gpu_run.sanitize(__file__, t_start, log)
        sanitize()

    RESULT["meta"]["total_s"] = round(time.time() - t_start, 1)
    save()
    log(f"\ndone in {time.time() - t_start:.0f} s; {REC.json_path}")


if __name__ == "__main__":
    main()
