"""Step 07 -- FlashAttention in hand-written CUDA, built into PyTorch.

The same algorithm as steps 04-06, written as CUDA C++ kernels in ``csrc/``:

    csrc/step07_fwd_v1.cu   v1: one thread per query row, scalar fp32 (fp32/fp16/bf16 inputs)
    csrc/step07_fwd_v2.cu   v2: tensor cores (mma.sync m16n8k16), fp16/bf16, fp32 accumulation
    csrc/step07_fwd_v3.cu   v3: v2 + cp.async double buffering, ldmatrix, swizzled shared
                            memory, 128-row tiles (the production techniques)
    csrc/step07_fwd_v4.cu   v4: v3 with both products on Hopper's wgmma (warpgroup MMA,
                            operands read from shared memory through descriptors, P from
                            registers); sm_90a only (H100/H200)
    csrc/step07_fwd_v5.cu   v5: v4 warp-specialized: TMA loads by a producer warpgroup into
                            an mbarrier ring, two consumer warpgroups, setmaxnreg, optional
                            ping-pong; sm_90a only
    csrc/step07_fwd_v6.cu   v6: v5 with each tile's exponentials computed while the tensor
                            cores still run the previous tile's P V (FlashAttention-3's
                            intra-warpgroup overlap); sm_90a only
    csrc/step07_wgmma.cuh   v4's to v6's wgmma: the swizzled layout, the descriptor, the
                            instructions
    csrc/step07_tma.cuh     v5's and v6's warp-specialized machinery: mbarriers, TMA loads and
                            tensor maps, setmaxnreg, the producer warpgroup, the epilogue
    csrc/step07_bwd.cu      backward v1: Delta, then dK/dV and dQ kernels, scalar fp32 (any dtype)
    csrc/step07_bwd_mma.cu  backward v2: the same split on tensor cores (fp16/bf16)
    csrc/step07_bwd_wgmma.cu backward v3: v2 with its dK/dV kernel on wgmma (Delta and dQ are
                            v2's kernels); sm_90a only, the default backward of v4 to v6
    csrc/step07_binding.cpp the torch glue (the only file that includes torch)

Each version's measured speed is in the header of its .cu file and in
``results/h200/``. Head dims 64 and 128; causal is top-left, as everywhere in
the course.

Building. ``build()`` compiles everything with ``torch.utils.cpp_extension.load``
the first time it is called (a minute or so), then loads the cached module:

- flags: ``-O3``; ``--use_fast_math``, which turns ``expf``/``exp2f`` into the
  hardware's approximate ``ex2.approx`` (about 2 ulp of relative error, against
  fp16's 4.9e-4 and bf16's 3.9e-3 rounding of every stored value: invisible here),
  divisions into approximate reciprocals, and flushes fp32 denormals (below
  1.2e-38) to zero -- probabilities that small add nothing to a row sum near 1.
  Outside a kernel checked against a float64 reference, measure before you trust
  it. And ``-gencode arch=compute_XY,code=sm_XY`` for this GPU's architecture
  (sm_90a on an H100/H200, sm_80 on an A100): machine code for this chip and no
  other, so nothing is JIT-compiled from PTX when the module loads. On 9.0 the
  target is ``sm_90a``, not ``sm_90``: the "a" (architecture-specific) features,
  wgmma, setmaxnreg and TMA's tensor loads among them, exist only there, and v4 to
  v6 need them; code built for sm_90a runs on sm_90 GPUs only. Elsewhere their kernels
  compile to an empty body and ``attention(..., version=4)`` (5, 6) is refused with a
  ValueError before any launch.
- cache: the build directory is ``$ATTN_BUILD_DIR`` (default
  ``~/.cache/attn-course``) / ``attn_step07_<hash>``, the hash taken over every
  source file, the flags and the torch version. Edit a kernel and the hash
  changes: a fresh directory, a full rebuild, and no stale module. ``steps/`` and
  ``solutions/`` hash differently, so both can be loaded in one process. Delete
  the directory to force a rebuild.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

import torch

from attnlib import check_inputs
from attnlib.ops import extension_op, op_namespace

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = ["step07_binding.cpp", "step07_fwd_v1.cu", "step07_fwd_v2.cu", "step07_fwd_v3.cu", "step07_fwd_v4.cu",
           "step07_fwd_v5.cu", "step07_fwd_v6.cu", "step07_bwd.cu", "step07_bwd_mma.cu",
           "step07_bwd_wgmma.cu"]
HEADERS = ["step07_launch.h", "step07_common.cuh", "step07_wgmma.cuh", "step07_tma.cuh"]
VERSIONS = (1, 2, 3, 4, 5, 6)
# v3's tile shapes (FlashAttentionCUDA's `config`; 0 is what attention() uses):
# see launch_d in csrc/step07_fwd_v3.cu. bench/cuda_gpu.py times them all.
V3_CONFIGS = {64: (0, 1, 2, 3), 128: (0, 1, 2)}
# v4's tile shapes (launch_d in csrc/step07_fwd_v4.cu): 0 = 128 x 128, 1 = 128 x 64.
V4_CONFIGS = {64: (0, 1), 128: (0, 1)}
# v5's (launch_d in csrc/step07_fwd_v5.cu): 0 = 128 x 64 tiles, 2 stages; 1 = 128 x 64, 4 stages;
# 2 = 128 x 128, 2 stages; 3 = 0 with ping-pong; 4 = 2 with ping-pong; 5 = three consumers, 192 x 64.
V5_CONFIGS = {64: (0, 1, 2, 3, 4, 5), 128: (0, 1, 2, 3, 4, 5)}
# v6's (launch_d in csrc/step07_fwd_v6.cu; v5's numbers for the same tiles): 0 = 128 x 64, 2 = 128 x 128.
V6_CONFIGS = {64: (0, 2), 128: (0, 2)}
# The config each version runs when none is asked for: v4's 128 x 64 tiles were the faster at every
# shape on the H200 (results/h200/step07_v4/README.md); v5's 128 x 128 tiles, 2 stages, the fastest at
# 9 of 12 shapes and 1% behind at a tenth (config 4, ping-pong, 1.09-1.11x it at D=128 without a mask,
# N 4k and 16k; one run, results/h200/step07_v5/); v6's 128 x 128 tiles, faster than its 128 x 64 at
# every shape measured (results/h200/step07_v6/); v3's table is its config 0.
DEFAULT_CONFIG = {4: 1, 5: 2, 6: 2}
# Versions that need a particular GPU: the wgmma of v4 to v6 exists on compute capability 9.0 only.
ARCH_ONLY = {4: (9, 0), 5: (9, 0), 6: (9, 0)}
HEAD_DIMS = (64, 128)
DTYPES = {
    1: (torch.float32, torch.float16, torch.bfloat16),
    2: (torch.float16, torch.bfloat16),
    3: (torch.float16, torch.bfloat16),
    4: (torch.float16, torch.bfloat16),
    5: (torch.float16, torch.bfloat16),
    6: (torch.float16, torch.bfloat16),
}
NVCC_FLAGS = ["-O3", "--use_fast_math", "-lineinfo"]   # cpp_extension adds -std=c++17/20 itself

_EXT = None


def find_nvcc() -> str | None:
    """The nvcc that cpp_extension will use: $CUDA_HOME/bin/nvcc, else the one on PATH."""
    from torch.utils.cpp_extension import CUDA_HOME
    if CUDA_HOME:
        cand = Path(CUDA_HOME) / "bin" / "nvcc"
        if cand.exists():
            return str(cand)
    return shutil.which("nvcc")


def arch_flags(capability: tuple[int, int]) -> list[str]:
    """``-gencode`` for one GPU: (9, 0) -> sm_90a (H100/H200: the "a" is what gives v4 its wgmma),
    (8, 0) -> sm_80 (A100)."""
    cc = f"{capability[0]}{capability[1]}" + ("a" if tuple(capability) == (9, 0) else "")
    return [f"-gencode=arch=compute_{cc},code=sm_{cc}"]


def check_version_arch(version: int, capability: tuple[int, int], where: str = "step07") -> None:
    """ValueError when ``version`` cannot run on a GPU of this compute capability (v4, v5: 9.0 only)."""
    need = ARCH_ONLY.get(version)
    if need is not None and tuple(capability) != need:
        raise ValueError(
            f"{where}: forward v{version} uses wgmma (warpgroup tensor-core instructions), which only "
            f"sm_{need[0]}{need[1]}a GPUs (H100/H200) have; this GPU is compute capability "
            f"{capability[0]}.{capability[1]}. Use version=3 here.")


def build(verbose: bool = False):
    """Compile (or load from the cache) the extension; return the module.

    RuntimeError, saying what to do, when there is no GPU, no nvcc, or a GPU
    older than sm_80 (the kernels use bf16 mma and cp.async).
    """
    global _EXT
    if _EXT is not None:
        return _EXT
    if not torch.cuda.is_available():
        raise RuntimeError(
            "Step 07 runs CUDA kernels and this machine has no usable GPU "
            f"(torch {torch.__version__}, torch.cuda.is_available() is False). Run it on a machine "
            "with an NVIDIA GPU and a CUDA build of torch; on a CPU, the tests only compile the .cu files.")
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError(
            "Step 07 needs nvcc to build its kernels and none was found: install the CUDA toolkit "
            f"matching torch's CUDA ({torch.version.cuda}) and put its bin/ on PATH, or set CUDA_HOME.")
    cap = torch.cuda.get_device_capability()
    if cap < (8, 0):
        raise RuntimeError(
            f"Step 07's kernels need compute capability 8.0 or newer (bf16 mma.sync, cp.async); "
            f"{torch.cuda.get_device_name()} is {cap[0]}.{cap[1]}.")
    from torch.utils.cpp_extension import load

    flags = NVCC_FLAGS + arch_flags(cap)
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update(name.encode() + b"\0" + (CSRC / name).read_bytes())
    h.update(" ".join(flags).encode() + torch.__version__.encode())
    name = f"attn_step07_{h.hexdigest()[:12]}"
    root = Path(os.environ.get("ATTN_BUILD_DIR", Path.home() / ".cache" / "attn-course"))
    build_dir = root / name
    build_dir.mkdir(parents=True, exist_ok=True)
    _EXT = load(name=name, sources=[str(CSRC / s) for s in SOURCES], extra_cflags=["-O3"],
                extra_cuda_cflags=flags, extra_include_paths=[str(CSRC)], build_directory=str(build_dir),
                verbose=verbose)
    return _EXT


def _validate(q, k, v, is_causal, scale, version, where):
    """check_inputs narrowed to this step, then what only CUDA kernels need."""
    s = check_inputs(q, k, v, is_causal=is_causal, scale=scale, head_dims=HEAD_DIMS,
                     dtypes=DTYPES.get(version, DTYPES[1]), where=where)
    if version not in VERSIONS:
        raise ValueError(f"{where}: no forward version {version!r}; versions are {list(VERSIONS)}")
    if q.device.type != "cuda":
        raise ValueError(f"{where}: the CUDA kernels need CUDA tensors, got {q.device}: move q, k, v with .cuda()")
    check_version_arch(version, torch.cuda.get_device_capability(q.device), where)
    return s


def _flat(t):
    """(..., N, D) -> contiguous, 16-byte aligned (BH, N, D)."""
    t = t.reshape(-1, t.shape[-2], t.shape[-1]).contiguous()
    if t.data_ptr() % 16:
        t = t.clone()
    return t


# The extension as two PyTorch operators (attnlib/ops.py says why torch.compile needs them):
#   torch.ops.<namespace>.step07_fwd(q, k, v, is_causal, scale, version, config) -> (O, LSE)
#   torch.ops.<namespace>.step07_bwd(q, k, v, o, lse, do, is_causal, scale, bwd_version) -> (dQ, dK, dV)
# The compiler cannot look inside compiled CUDA: the fakes tell it the output shapes, and
# step07_fwd's autograd formula calls step07_bwd.

FWD_FILES = {1: "step07_fwd_v1.cu", 2: "step07_fwd_v2.cu", 3: "step07_fwd_v3.cu", 4: "step07_fwd_v4.cu",
             5: "step07_fwd_v5.cu", 6: "step07_fwd_v6.cu"}
BWD_FILES = {1: "step07_bwd.cu", 2: "step07_bwd_mma.cu", 3: "step07_bwd_wgmma.cu"}
# Backward versions that need a particular GPU: v3's dK/dV kernel is wgmma, compute capability 9.0 only.
BWD_ARCH_ONLY = {3: (9, 0)}


_LOCAL_INCLUDE = re.compile(r'^\s*#include "(step07_[^"]+)"', re.M)


def _unwritten_check(name: str) -> list[str]:
    """Raise NotImplementedError at the first ``STUDENT_TODO;`` line of ``name`` or of a step07_*
    header it includes; otherwise return the files read."""
    text = (CSRC / name).read_text()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("STUDENT_TODO;"):
            todo = lines[i - 1].strip().lstrip("/ ") if i else ""
            raise NotImplementedError(
                f"Step 07: csrc/{name}:{i + 1} is a region still to write ({todo or 'see its TODO'}); "
                "delete its STUDENT_TODO; line once it is written")
    read = [name]
    for header in _LOCAL_INCLUDE.findall(text):
        read += _unwritten_check(header)
    return read


def _stamp(names) -> tuple:
    return tuple((n, (st := os.stat(f"{CSRC}/{n}")).st_mtime_ns, st.st_size) for n in dict.fromkeys(names))


_WRITTEN: dict[str, tuple] = {}   # file -> the stamps of what it was read from when last found written


def refuse_unwritten(name: str) -> None:
    """A kernel cannot raise NotImplementedError: a stub's would run and return garbage. So this
    refuses to launch one whose file -- or a step07_* header it includes (v4's and v5's descriptor
    lives in step07_wgmma.cuh) -- still holds a region's ``STUDENT_TODO;`` line.

    It runs before every launch, so a file found written is not read again until it changes
    (its size or modification time): reading and scanning v5 and its header took ~1 ms a call,
    longer than the kernel at N = 4096 on an H200."""
    seen = _WRITTEN.get(name)
    if seen is not None and _stamp(n for n, _, _ in seen) == seen:
        return
    _WRITTEN[name] = _stamp(_unwritten_check(name))


def _fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float,
              version: int, config: int) -> tuple[torch.Tensor, torch.Tensor]:
    refuse_unwritten(FWD_FILES[int(version)])          # in the operator's body: torch.compile never traces it
    o, lse = build().fwd(_flat(q), _flat(k), _flat(v), bool(is_causal), float(scale), int(version), int(config))
    return o.view(q.shape), lse.view(q.shape[:-1])


def _fwd_fake(q, k, v, is_causal, scale, version, config):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


def _bwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
              do: torch.Tensor, is_causal: bool, scale: float,
              bwd_version: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    refuse_unwritten(BWD_FILES[int(bwd_version)])      # in the operator's body: torch.compile never traces it
    # >>> STUDENT: call build().bwd on the flattened (BH, N, D) tensors (lse as (BH, Nq)) and reshape dq, dk, dv back
    ext = build()
    dq, dk, dv = ext.bwd(_flat(q), _flat(k), _flat(v), _flat(o), lse.reshape(-1, lse.shape[-1]).contiguous(),
                         _flat(do), bool(is_causal), float(scale), int(bwd_version))
    return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)
    # <<< STUDENT


def _bwd_fake(q, k, v, o, lse, do, is_causal, scale, bwd_version):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def default_bwd_version(version, dtype):
    """Forward v1 (and any fp32 input) pairs with backward v1; v2 and v3 with v2 (tensor cores);
    the sm_90a-only forwards (ARCH_ONLY: v4 to v6) with v3 (dK/dV on wgmma), which runs where they do."""
    if version == 1 or dtype == torch.float32:
        return 1
    return 3 if version in ARCH_ONLY else 2


def check_bwd_version(bwd_version, dtype, capability, where: str = "step07") -> None:
    """ValueError when backward ``bwd_version`` does not exist, cannot take ``dtype`` (2 and 3:
    fp16/bf16) or cannot run on a GPU of this compute capability (3: 9.0 only)."""
    if bwd_version not in BWD_FILES:
        raise ValueError(f"{where}: no backward version {bwd_version!r}; versions are {list(BWD_FILES)}")
    if bwd_version != 1 and dtype == torch.float32:
        raise ValueError(f"{where}: backward v{bwd_version} uses fp16/bf16 tensor cores; float32 runs on "
                         "backward v1 only")
    need = BWD_ARCH_ONLY.get(bwd_version)
    if need is not None and tuple(capability) != need:
        raise ValueError(
            f"{where}: backward v{bwd_version} uses wgmma (warpgroup tensor-core instructions), which only "
            f"sm_{need[0]}{need[1]}a GPUs (H100/H200) have; this GPU is compute capability "
            f"{capability[0]}.{capability[1]}. Use bwd_version=2 here.")


NAMESPACE = op_namespace(__name__)
bwd_op = extension_op(f"{NAMESPACE}::step07_bwd", _bwd_impl, fake=_bwd_fake)


def _setup_context(ctx, inputs, output):
    q, k, v, is_causal, scale, version = inputs[:6]
    ctx.save_for_backward(q, k, v, *output)
    ctx.is_causal, ctx.scale = is_causal, scale
    bwd_version = inputs[7] if len(inputs) > 7 else None
    ctx.bwd_version = default_bwd_version(version, q.dtype) if bwd_version is None else bwd_version


def _backward(ctx, do, _dlse=None):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = bwd_op(q, k, v, o, lse, do, ctx.is_causal, ctx.scale, ctx.bwd_version)
    return dq, dk, dv, None, None, None, None


fwd_op = extension_op(f"{NAMESPACE}::step07_fwd", _fwd_impl, fake=_fwd_fake,
                      backward=_backward, setup_context=_setup_context)


class FlashAttentionCUDA(torch.autograd.Function):
    """Forward by the chosen CUDA version; backward by the CUDA backward kernels.

    ``apply(q, k, v, is_causal=False, scale=None, version=3, config=None, bwd_version=None)`` -> O.
    Saves q, k, v, o and exactly one LSE (float32, (..., Nq), natural log).
    ``config`` picks v3's tile shape (V3_CONFIGS), v4's (V4_CONFIGS), v5's (V5_CONFIGS) or v6's (V6_CONFIGS), by default
    DEFAULT_CONFIG's;
    v1 and v2 ignore it.
    ``bwd_version``: 1, the scalar backward, 2, the tensor-core one (mma.sync), or 3, v2 with
    dK/dV on wgmma (sm_90a only); by default forward v1 (and any fp32 input) is paired with
    backward v1, v2 and v3 with v2, the sm_90a forwards (v4 to v6) with v3 (default_bwd_version).
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, scale=None, version=3, config=None, bwd_version=None):
        scale = _validate(q, k, v, is_causal, scale, version, "step07 FlashAttentionCUDA")
        config = DEFAULT_CONFIG.get(version, 0) if config is None else config
        if bwd_version is not None:
            check_bwd_version(bwd_version, q.dtype, torch.cuda.get_device_capability(q.device),
                              "step07 FlashAttentionCUDA")
        o, lse = fwd_op(q, k, v, is_causal, scale, version, config)
        _setup_context(ctx, (q, k, v, is_causal, scale, version, config, bwd_version), (o, lse))
        return o

    @staticmethod
    def backward(ctx, do):
        return *_backward(ctx, do), None


def attention_with_lse(q, k, v, is_causal=False, scale=None, version=3):
    """``(O, LSE)``: O ``(..., Nq, D)`` in q's dtype, LSE float32 ``(..., Nq)``; no autograd."""
    s = _validate(q, k, v, is_causal, scale, version, "step07 attention_with_lse")
    with torch.no_grad():
        return fwd_op(q, k, v, is_causal, s, version, DEFAULT_CONFIG.get(version, 0))


def attention(q, k, v, is_causal=False, scale=None, version=3):
    """The course contract, on the CUDA kernels; ``version`` picks the forward (1, 2, 3; 4, 5 or 6 on sm_90)."""
    s = _validate(q, k, v, is_causal, scale, version, "step07 attention")
    return FlashAttentionCUDA.apply(q, k, v, is_causal, s, version)
