"""Step 07: hand-written CUDA FlashAttention.

On a CPU: every .cu file compiles with nvcc (so a kernel that does not compile
never lands), and bad inputs raise clear errors. On a GPU: every forward
version and the backward match the float64 reference.
"""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from attnlib import make_qkv
from attnlib.checks import check_attention, check_lse
from attnlib.loader import REPO, impl_root

pytestmark = pytest.mark.step07

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")

# The same flags torch.utils.cpp_extension gives nvcc, so code that compiles
# here compiles there: cpp_extension forbids half/bf16 operators and conversions.
NVCC_FLAGS = ["-std=c++17", "-O3", "--use_fast_math", "-gencode=arch=compute_90,code=sm_90",
              "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
              "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]


def _cu_files():
    """The .cu files of the stubs (steps/) and of the implementation under test (--impl)."""
    dirs = {REPO / "steps" / "csrc"}
    try:
        dirs.add(impl_root() / "csrc")
    except FileNotFoundError:
        pass
    return sorted(f for d in dirs if d.is_dir() for f in d.glob("*.cu"))


def test_every_cu_file_compiles(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH: install the CUDA toolkit to compile-check the kernels")
    files = _cu_files()
    assert any(f.parent.parent == REPO / "steps" for f in files), "no .cu file found under steps/csrc"

    def compile_one(i_f):
        i, f = i_f
        r = subprocess.run([nvcc, *NVCC_FLAGS, "-c", str(f), "-o", str(tmp_path / f"{i}.o")],
                           capture_output=True, text=True)
        return f, r

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(compile_one, enumerate(files)))
    failed = [f"{f.relative_to(REPO) if f.is_relative_to(REPO) else f}:\n{r.stderr[-3000:]}"
              for f, r in results if r.returncode != 0]
    assert not failed, "nvcc failed on:\n" + "\n".join(failed)



def _cuobjdump() -> str | None:
    """cuobjdump from the CUDA toolkit, else the copy Triton ships (pip wheels have no toolkit)."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton
    except ImportError:
        return None
    cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(cand) if cand.exists() else None


def compile_v4(tmp_path, arch: str):
    """Compile the implementation's step07_fwd_v4.cu to a cubin for ``arch`` with ``-Xptxas -v``;
    return (ptxas report, SASS)."""
    nvcc, cuobjdump = shutil.which("nvcc"), _cuobjdump()
    if nvcc is None or cuobjdump is None:
        pytest.skip("needs nvcc and cuobjdump (the CUDA toolkit, or Triton's copy) to read v4's machine code")
    src = impl_root() / "csrc" / "step07_fwd_v4.cu"
    cubin = tmp_path / f"v4_{arch}.cubin"
    flags = [f for f in NVCC_FLAGS if not f.startswith("-gencode")]
    r = subprocess.run([nvcc, *flags, f"-gencode=arch=compute_{arch[3:]},code={arch}", "-Xptxas", "-v",
                        "-cubin", str(src), "-o", str(cubin)], capture_output=True, text=True)
    assert r.returncode == 0, f"nvcc failed on step07_fwd_v4.cu for {arch}:\n{r.stderr[-3000:]}"
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True).stdout
    return r.stdout + r.stderr, sass


def spill_lines(report: str) -> list[str]:
    """The lines of a ``-Xptxas -v`` report that say a kernel uses stack or spills."""
    return [line.strip() for line in report.splitlines()
            if "spill" in line and not line.strip().startswith("0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads")]


# 96 floats live in each thread with at most 32 registers (1024 threads, 2 blocks an SM): ptxas must spill.
SPILLING_KERNEL = """
__global__ void __launch_bounds__(1024, 2) spill(const float* x, float* y) {
    float a[96];
#pragma unroll
    for (int i = 0; i < 96; ++i) a[i] = x[threadIdx.x * 96 + i];
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 96; ++i) s += a[i] * a[95 - i];
#pragma unroll
    for (int i = 0; i < 96; ++i) y[threadIdx.x * 96 + i] = a[i] * s;
}
"""


def test_spill_check_catches_a_spilling_kernel(tmp_path):
    """The check v4 passes can fail: a kernel that must spill is caught by the same filter (v4 itself could
    not be made to spill: its __launch_bounds__ overrides -maxrregcount)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc to compile a spilling kernel")
    src = tmp_path / "spill.cu"
    src.write_text(SPILLING_KERNEL)
    r = subprocess.run([nvcc, "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-cubin", str(src),
                        "-o", str(tmp_path / "spill.cubin")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert spill_lines(r.stdout + r.stderr), "the spill filter missed a kernel ptxas reports spilling:\n" + r.stderr


def test_v4_is_wgmma_without_spills(load, tmp_path):
    """v4 for sm_90a: every kernel instance spills nothing, and the tensor-core work is HGMMA (wgmma),
    not HMMA (mma.sync) -- the machine code is what the source claims. (A stub's descriptor is a
    constant 0 and nvcc drops the whole kernel: hence "not implemented" first.)"""
    load(7).refuse_unwritten("step07_fwd_v4.cu")
    report, sass = compile_v4(tmp_path, "sm_90a")
    kernels = report.count("Compiling entry function")
    assert kernels == 8, f"expected 8 instances of the v4 kernel (2 dtypes x 2 head dims x 2 tiles), ptxas saw {kernels}"
    spills = spill_lines(report)
    assert not spills, "v4 spills registers:\n" + "\n".join(spills)
    assert "HGMMA" in sass, "no HGMMA in v4's SASS: wgmma did not compile to warpgroup tensor-core instructions"
    assert "HMMA" not in sass.replace("HGMMA", ""), "v4's SASS still has mma.sync (HMMA) instructions"


def test_v4_is_a_stub_off_sm90a(tmp_path):
    """Built for plain sm_90 (no "a"), as the sm_80 build or an old arch_flags would: it still compiles,
    to a kernel with no wgmma (the #if on __CUDA_ARCH_FEAT_SM90_ALL), which step07_cuda.py never launches."""
    _, sass = compile_v4(tmp_path, "sm_90")
    assert "HGMMA" not in sass


# ------------------------------------------------------------------ clear errors (CPU)

def test_unsupported_head_dim_is_a_value_error(load):
    m = load(7)
    for version in (1, 2, 3):
        q, k, v = make_qkv(1, 1, 8, D=80, dtype=torch.float16)
        with pytest.raises(ValueError, match="head dim D=80 is not supported here; supported: \\[64, 128\\]"):
            m.attention(q, k, v, version=version)


def test_fp32_on_tensor_core_versions_is_a_value_error(load):
    m = load(7)
    q, k, v = make_qkv(1, 1, 8, D=64)
    for version in (2, 3):
        with pytest.raises(ValueError, match="float32"):
            m.attention(q, k, v, version=version)


def test_unknown_version_is_a_value_error(load):
    m = load(7)
    q, k, v = make_qkv(1, 1, 8, D=64, dtype=torch.float16)
    with pytest.raises(ValueError, match="version"):
        m.attention(q, k, v, version=7)


def test_cpu_tensors_are_a_value_error(load):
    m = load(7)
    q, k, v = make_qkv(1, 1, 8, D=64)
    with pytest.raises(ValueError, match="CUDA tensors"):
        m.attention(q, k, v, version=1)


def test_every_kernel_file_is_written(load):
    """Each version's file has no STUDENT_TODO; line left: the refusal that makes a stub say
    'not implemented' lets every finished kernel run (tests/test_stubs.py checks the stub side)."""
    m = load(7)
    for f in (*m.FWD_FILES.values(), *m.BWD_FILES.values()):
        m.refuse_unwritten(f)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised where there is no GPU")
def test_build_without_gpu_is_a_runtime_error(load):
    m = load(7)
    with pytest.raises(RuntimeError, match="no usable GPU"):
        m.build()


def test_v4_refused_off_sm90(load):
    m = load(7)
    m.check_version_arch(4, (9, 0))
    m.check_version_arch(5, (9, 0))
    m.check_version_arch(6, (9, 0))
    m.check_version_arch(3, (8, 0))
    for cap in [(8, 0), (8, 9), (10, 0), (12, 0)]:
        for version in (4, 5, 6):
            with pytest.raises(ValueError, match="wgmma.*sm_90a.*" + f"{cap[0]}\\.{cap[1]}"):
                m.check_version_arch(version, cap)


def test_default_backward_pairs_sm90_forwards_with_v3(load):
    """Forward v1 and fp32 -> backward v1; v2, v3 -> v2; every sm_90a-only forward (ARCH_ONLY: v4, v5,
    and any later one) -> v3, which runs wherever they do."""
    m = load(7)
    for version in m.VERSIONS:
        assert m.default_bwd_version(version, torch.float32) == 1, f"forward v{version}, fp32"
        for dtype in (torch.float16, torch.bfloat16):
            want = 1 if version == 1 else 3 if version in m.ARCH_ONLY else 2
            got = m.default_bwd_version(version, dtype)
            assert got == want, f"forward v{version}, {dtype}: paired with backward v{got}, want v{want}"
    assert {4, 5} <= set(m.ARCH_ONLY), "v4 and v5 are sm_90a only"
    assert m.BWD_FILES[3] == "step07_bwd_wgmma.cu" and "step07_bwd_wgmma.cu" in m.SOURCES


def test_bwd_v3_refused_off_sm90_and_for_fp32(load):
    """An explicit bwd_version=3 is refused (ValueError, before any launch) on a GPU other than 9.0
    and for fp32 inputs; v1 takes fp32, v2 runs anywhere; an unknown backward version is refused."""
    m = load(7)
    for dtype in (torch.float16, torch.bfloat16):
        m.check_bwd_version(3, dtype, (9, 0))
        m.check_bwd_version(2, dtype, (8, 0))
        for cap in [(8, 0), (8, 9), (10, 0), (12, 0)]:
            with pytest.raises(ValueError, match="backward v3 uses wgmma.*sm_90a.*" + f"{cap[0]}\\.{cap[1]}"):
                m.check_bwd_version(3, dtype, cap)
    m.check_bwd_version(1, torch.float32, (8, 0))
    for version in (2, 3):
        with pytest.raises(ValueError, match=f"backward v{version} uses fp16/bf16.*float32"):
            m.check_bwd_version(version, torch.float32, (9, 0))
    with pytest.raises(ValueError, match="no backward version 4"):
        m.check_bwd_version(4, torch.float16, (9, 0))


def test_arch_flags(load):
    m = load(7)
    assert m.arch_flags((9, 0)) == ["-gencode=arch=compute_90a,code=sm_90a"]   # v4's wgmma needs the "a"
    assert m.arch_flags((8, 0)) == ["-gencode=arch=compute_80,code=sm_80"]


# ------------------------------------------------------------------ the GPU

# (batch, Nq, Nk, D): N not a multiple of any tile, Nq != Nk both ways, rank 3,
# and one case long enough for many full tiles of every version.
GPU_CASES = [
    ((2, 3), 1, 1, 64),
    ((1, 2), 17, 17, 128),
    ((2, 1), 100, 100, 64),
    ((1, 1), 257, 257, 128),
    ((1, 2), 17, 40, 64),        # Nq < Nk
    ((2, 1), 100, 33, 128),      # Nq > Nk
    ((3,), 65, 65, 64),          # rank 3
    ((1, 2), 515, 1029, 128),    # many tiles, both partial at the end
]
# v4 to v6 exist on sm_90a only (H100/H200): elsewhere their rows skip, saying so.
SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
sm90 = pytest.mark.skipif(not SM90, reason="v4 to v6 and backward v3 need an sm_90a GPU (H100/H200)")


def _version_param(version, *rest):
    """A parametrize row for ``version``, skipped off sm_90a for v4 to v6."""
    dt = [str(d).replace("torch.", "") for d in rest]
    return pytest.param(version, *rest, id="-".join([f"v{version}", *dt]), marks=[sm90] if version >= 4 else [])


VERSION_DTYPES = [_version_param(v, d) for v, d in
                  [(1, torch.float32), (1, torch.float16), (1, torch.bfloat16), (2, torch.float16),
                   (2, torch.bfloat16), (3, torch.float16), (3, torch.bfloat16), (4, torch.float16),
                   (4, torch.bfloat16), (5, torch.float16), (5, torch.bfloat16), (6, torch.float16),
                   (6, torch.bfloat16)]]


def _id(c):
    b, nq, nk, d = c
    return f"{'x'.join(map(str, b))}-q{nq}-k{nk}-d{d}"


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=_id)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("version,dtype", VERSION_DTYPES)
def test_forward_backward_lse(load, version, dtype, is_causal, case):
    m = load(7)
    batch, nq, nk, d = case
    q, k, v = make_qkv(Nq=nq, Nk=nk, D=d, batch_shape=batch, dtype=dtype, device="cuda", seed=nq + d)
    attn = lambda q, k, v, is_causal, scale: m.attention(q, k, v, is_causal=is_causal, scale=scale,  # noqa: E731
                                                         version=version)
    check_attention(attn, q, k, v, is_causal=is_causal)
    _, lse = m.attention_with_lse(q, k, v, is_causal=is_causal, version=version)
    check_lse(lse, q, k, v, is_causal=is_causal)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("version", [_version_param(v) for v in (1, 2, 3, 4, 5, 6)])
def test_explicit_scale(load, version):
    m = load(7)
    q, k, v = make_qkv(2, 2, 70, D=64, dtype=torch.float16, device="cuda")
    attn = lambda q, k, v, is_causal, scale: m.attention(q, k, v, is_causal=is_causal, scale=scale,  # noqa: E731
                                                         version=version)
    check_attention(attn, q, k, v, is_causal=True, scale=0.3)


@gpu
@pytest.mark.gpu
def test_saves_exactly_one_lse(load):
    m = load(7)
    q, k, v = make_qkv(2, 3, 33, D=64, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    o = m.attention(q, k, v)
    saved = o.grad_fn.saved_tensors
    lses = [t for t in saved if t.dtype == torch.float32 and tuple(t.shape) == (2, 3, 33)]
    assert len(lses) == 1, (f"the autograd Function must save exactly one float32 LSE shaped (2, 3, 33); "
                            f"saved {[(tuple(t.shape), t.dtype) for t in saved]}")


@gpu
@pytest.mark.gpu
def test_non_contiguous_inputs(load):
    m = load(7)
    q, k, v = make_qkv(2, 4, 50, D=128, dtype=torch.float16, device="cuda")
    # (B, N, H, D) memory viewed as (B, H, N, D): the layout most models hand over
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    assert not q.is_contiguous()
    check_attention(lambda q, k, v, is_causal, scale: m.attention(q, k, v, is_causal=is_causal, scale=scale),
                    q, k, v, is_causal=True)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_v3_tile_configs(load, d, is_causal):
    """Every tile shape v3 can launch (the benchmark times them all) computes the same function."""
    m = load(7)
    q, k, v = make_qkv(Nq=300, Nk=317, D=d, batch_shape=(1, 2), dtype=torch.bfloat16, device="cuda")
    for config in m.V3_CONFIGS[d]:
        def attn(q, k, v, is_causal, scale, config=config):
            s = d ** -0.5 if scale is None else scale
            return m.FlashAttentionCUDA.apply(q, k, v, is_causal, s, 3, config)
        check_attention(attn, q, k, v, is_causal=is_causal, grads=False)


@gpu
@sm90
@pytest.mark.gpu
@pytest.mark.parametrize("version", [4, 5, 6])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_hopper_tile_configs(load, version, d, is_causal):
    """Every config v4 to v6 can launch (tiles, stages, ping-pong, three consumers: the benchmark
    times them all) computes the same function, Nq != Nk and neither a multiple of a tile."""
    m = load(7)
    q, k, v = make_qkv(Nq=300, Nk=317, D=d, batch_shape=(1, 2), dtype=torch.bfloat16, device="cuda")
    configs = {4: m.V4_CONFIGS, 5: m.V5_CONFIGS, 6: m.V6_CONFIGS}[version][d]
    for config in configs:
        def attn(q, k, v, is_causal, scale, config=config):
            s = d ** -0.5 if scale is None else scale
            return m.FlashAttentionCUDA.apply(q, k, v, is_causal, s, version, config)
        check_attention(attn, q, k, v, is_causal=is_causal, grads=False)


# Backward v3 (dK/dV on wgmma, Delta and dQ from v2), sm_90a only: forward v3 (any GPU) + bwd_version=3,
# so a failure here is the backward's; v4 and v5 rows of test_forward_backward_lse run it by default.
BWD3_CASES = [
    ((2, 3), 1, 1, 64),
    ((1, 2), 77, 77, 128),
    ((1, 2), 17, 40, 64),        # Nq < Nk
    ((2, 1), 300, 33, 128),      # Nq > Nk
    ((1, 2), 515, 1029, 64),     # many key and query tiles, both partial at the end
    ((1, 1), 1030, 700, 128),
]


@gpu
@sm90
@pytest.mark.gpu
@pytest.mark.parametrize("case", BWD3_CASES, ids=_id)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_backward_v3(load, dtype, is_causal, case):
    m = load(7)
    batch, nq, nk, d = case
    q, k, v = make_qkv(Nq=nq, Nk=nk, D=d, batch_shape=batch, dtype=dtype, device="cuda", seed=nq + nk + d)

    def attn(q, k, v, is_causal, scale):
        s = d ** -0.5 if scale is None else scale
        return m.FlashAttentionCUDA.apply(q, k, v, is_causal, s, 3, None, 3)
    check_attention(attn, q, k, v, is_causal=is_causal)


@gpu
@sm90
@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_backward_v3_dkdv_configs(load, d, is_causal):
    """Both configs of v3's dK/dV kernel (the module's bwd3_dkdv, Delta given: what the experiment
    times) against the float64 reference, Nq != Nk and neither a multiple of a tile."""
    from attnlib.compare import assert_close
    from attnlib.inputs import make_dout
    from attnlib.reference import reference_backward
    m = load(7)
    q, k, v = make_qkv(Nq=300, Nk=317, D=d, batch_shape=(1, 2), dtype=torch.bfloat16, device="cuda")
    scale = d ** -0.5
    o, lse = m.attention_with_lse(q, k, v, is_causal=is_causal, version=3)
    do = make_dout(o, seed=1)
    delta = (o.float() * do.float()).sum(-1).reshape(-1, 300).contiguous()
    ref = reference_backward(q, k, v, do, is_causal, scale)
    flat = lambda t: t.reshape(-1, t.shape[-2], t.shape[-1]).contiguous()  # noqa: E731
    for config in (0, 1):
        dk, dv = m.build().bwd3_dkdv(flat(q), flat(k), flat(v), lse.reshape(-1, 300).contiguous(), flat(do), delta,
                                     is_causal, scale, config)
        assert_close(dk.view(k.shape), ref[1], name=f"dK (config {config})", row_label="key rows")
        assert_close(dv.view(v.shape), ref[2], name=f"dV (config {config})", row_label="key rows")


def test_refusal_is_cached_until_a_file_changes(tmp_path, monkeypatch):
    """refuse_unwritten runs before every launch: once a file (and the step07_* headers it includes)
    is found written it is not read again -- reading v5 and its header took ~1 ms a call, which made
    the H200 grid's N = 4096 rows time the host -- but an edit that brings a STUDENT_TODO back, in
    the file or in a header, is refused again."""
    from attnlib.loader import load_step
    impl = tmp_path / "impl"
    shutil.copytree(impl_root(), impl, ignore=shutil.ignore_patterns("__pycache__"))
    m = load_step(7, impl)
    try:
        m.refuse_unwritten("step07_fwd_v5.cu")
    except NotImplementedError:
        pytest.skip("this implementation's v5 is not written yet")
    reads = []
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **kw: reads.append(self.name) or real(self, *a, **kw))
    m.refuse_unwritten("step07_fwd_v5.cu")
    assert reads == [], f"a written file was read again: {reads}"
    header = impl / "csrc" / "step07_wgmma.cuh"
    header.write_text(header.read_text().replace("    return desc;\n", "    STUDENT_TODO;\n    return desc;\n", 1))
    with pytest.raises(NotImplementedError, match="Step 07: csrc/step07_wgmma.cuh:"):
        m.refuse_unwritten("step07_fwd_v5.cu")
