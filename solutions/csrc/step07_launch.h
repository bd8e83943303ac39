// Step 07 -- FlashAttention in CUDA. This header is the index of the versions
// and the interface between the torch glue (step07_binding.cpp, host compiler)
// and the kernels (.cu files, nvcc). Host-only: it includes cuda_runtime.h alone.
//
// The versions, each kept, each validated against the float64 reference
// before it is timed. Measured on an NVIDIA H200 (torch 2.11 cu130, nvcc 13.0,
// 2026-11-29), bf16, 16k tokens (B = 16384/N), hidden 2048, N = 16384, D = 128,
// forward TFLOP/s and the ratio to SDPA's FLASH backend (FlashAttention-2) timed
// in the same run (results/h200/step07_cuda.json has the whole grid):
//
//   forward                                                    not causal      causal
//   v1  step07_fwd_v1.cu  one thread per query row, scalar fp32,
//                         tiles in shared memory (fp32/fp16/bf16)   9 (x0.03)*   8 (x0.03)*
//   v2  step07_fwd_v2.cu  tensor cores: mma.sync m16n8k16, P fed
//                         back from registers; plain loads, 16 rows
//                         per warp, unswizzled shared memory        55 (x0.16)   52 (x0.16)
//   v3  step07_fwd_v3.cu  cp.async double buffering, ldmatrix,
//                         XOR-swizzled shared memory, 32 rows per
//                         warp (128 x 64 tiles), base-2 softmax    340 (x0.97)  317 (x0.97)
//       (D = 64: 313 (x1.02) and 306 (x1.02); at N >= 4096, D = 128: x0.95-0.98)
//   v4  step07_fwd_v4.cu  v3 with both products on wgmma (sm_90a only):
//                         warpgroups of 64 rows, Q/K/V read by the
//                         tensor cores through shared-memory
//                         descriptors (128-byte swizzle), P from
//                         registers (128 x 64 tiles; own run)      434 (x1.24)  438 (x1.36)
//   v5  step07_fwd_v5.cu  v4 warp-specialized (sm_90a only): TMA
//                         loads by a producer warpgroup into an
//                         mbarrier ring, two consumer warpgroups,
//                         setmaxnreg 24/240 (128 x 128 tiles;
//                         own run, 12-01)                           521 (x1.48)  537 (x1.66)
//   v6  step07_fwd_v6.cu  v5 with the softmax's exponentials under the
//                         P V still in flight (FlashAttention-3's
//                         intra-warpgroup overlap; sm_90a only; 128 x
//                         128 tiles; own run, 12-01)                605 (x1.84)  596 (x1.85)
//   backward (dQ, dK, dV; FLOPs counted as 2.5 x forward)
//   v1  step07_bwd.cu     Delta, then dK/dV and dQ kernels, scalar
//                         fp32 (any dtype)                          7 (x0.03)*   6 (x0.04)*
//   v2  step07_bwd_mma.cu the same split on tensor cores (fp16/bf16) 231 (x0.75)  234 (x0.75)
//   v3  step07_bwd_wgmma.cu v2 with dK/dV on wgmma (sm_90a only;
//                         Delta, dQ: v2's kernels; own run, 12-01,
//                         x cuDNN's backward, not SDPA-FLASH)      285 (x0.53)  294 (x0.57)
//   * at N = 1024 (B = 16): the scalar versions take seconds per call at N = 16384.
//
// The Python side (solutions/step07_cuda.py) pairs forward v1 with backward v1,
// forwards v2 and v3 with backward v2, and the sm_90a forwards (v4 to v6) with backward v3.
#pragma once

#include <cuda_runtime.h>

namespace step07 {

enum class DType : int { f32 = 0, f16 = 1, bf16 = 2 };

// Forward inputs, all contiguous (BH, N, D): the Python wrapper flattens every
// leading dimension into BH = batch * heads.
struct FwdParams {
    const void* q;      // (BH, Nq, D)
    const void* k;      // (BH, Nk, D)
    const void* v;      // (BH, Nk, D)
    void* o;            // (BH, Nq, D), same dtype as q
    float* lse;         // (BH, Nq), natural-log log-sum-exp of each row of scaled scores
    int bh, nq, nk, d;
    float scale;        // softmax scale, usually 1/sqrt(D)
    bool causal;        // top-left: query i sees keys j <= i
    DType dtype;
    int config;         // v3, v4, v5: which tile shape (0 = the default; see launch_d in their .cu)
};

struct BwdParams {
    const void* q; const void* k; const void* v;   // as in FwdParams
    const void* o;      // forward output (BH, Nq, D)
    const void* dout;   // upstream gradient dO (BH, Nq, D)
    const float* lse;   // (BH, Nq) from the forward
    void* dq; void* dk; void* dv;                   // gradients, dtype of q
    float* delta;       // workspace (BH, Nq): rowsum(dO * O)
    int bh, nq, nk, d;
    float scale;
    bool causal;
    DType dtype;
};

// Launchers: return the launch's error (cudaSuccess if it started). They run on
// `stream` and never synchronize.
cudaError_t fwd_v1(const FwdParams& p, cudaStream_t stream);
cudaError_t fwd_v2(const FwdParams& p, cudaStream_t stream);
cudaError_t fwd_v3(const FwdParams& p, cudaStream_t stream);
cudaError_t fwd_v4(const FwdParams& p, cudaStream_t stream);   // sm_90a only (wgmma)
cudaError_t fwd_v5(const FwdParams& p, cudaStream_t stream);   // sm_90a only (wgmma, TMA, setmaxnreg)
cudaError_t fwd_v6(const FwdParams& p, cudaStream_t stream);   // sm_90a only (v5 + the softmax under P V)
cudaError_t bwd(const BwdParams& p, cudaStream_t stream);       // scalar fp32 math, any dtype
cudaError_t bwd_mma(const BwdParams& p, cudaStream_t stream);   // tensor cores, fp16/bf16
cudaError_t bwd_wgmma(const BwdParams& p, cudaStream_t stream); // v3: dK/dV on wgmma, sm_90a only
// Parts, for backward v3 (and the experiment that times its dK/dV kernel alone): v2's Delta kernel,
// v2's dQ kernel (p.delta computed), v3's dK/dV kernel (p.delta computed; config 0 or 1).
cudaError_t bwd_mma_delta(const BwdParams& p, cudaStream_t stream);
cudaError_t bwd_mma_dq(const BwdParams& p, cudaStream_t stream);
cudaError_t bwd_wgmma_dkdv(const BwdParams& p, int config, cudaStream_t stream);

}  // namespace step07
