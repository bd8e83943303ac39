"""A torch.profiler table and a Chrome trace for one implementation at one size.

For deeper looks on a machine that has them:
    nsys profile -o attn python -m bench profile --impl step05 --N 4096
    ncu --clock-control none --set full -k regex:attn python -m bench profile --impl step07 --N 4096
(`--clock-control none` leaves the GPU's clocks as they are: measure the card as you find it.)
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile as torch_profile

from attnlib import make_qkv


def profile(impls, name, *, device, N, D, causal, bwd, out: Path, B=1, H=8):
    fn = impls.get(name)
    if fn is None or isinstance(fn, str):
        print(f"cannot profile {name!r}: {fn or 'unknown'}; known: {sorted(impls)}")
        return 2
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, k, v = make_qkv(B, H, N, N, D, dtype=dtype, device=device, requires_grad=bwd)

    def step():
        o = fn(q, k, v, causal)
        if bwd:
            o.sum().backward()

    for _ in range(3):
        step()                                              # warm-up, compile, autotune
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch_profile(activities=acts, record_shapes=True) as prof:
        for _ in range(5):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
    key = "cuda_time_total" if device == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=15))
    out.mkdir(parents=True, exist_ok=True)
    trace = out / f"{name}_N{N}_D{D}{'_causal' if causal else ''}{'_bwd' if bwd else ''}.json"
    prof.export_chrome_trace(str(trace))
    print(f"Chrome trace: {trace} (open in chrome://tracing or https://ui.perfetto.dev)")
    return 0
