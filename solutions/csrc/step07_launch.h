// Step 07 -- the interface between the torch glue (step07_binding.cpp, host
// compiler) and the kernels (.cu files, nvcc): parameter structs and launcher
// declarations. Host-only: it includes cuda_runtime.h and nothing else.
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
    int config;         // v3 only: which tile shape (0 = the default; see step07_fwd_v3.cu)
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
cudaError_t bwd(const BwdParams& p, cudaStream_t stream);

}  // namespace step07
