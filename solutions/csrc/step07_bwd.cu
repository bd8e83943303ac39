// Step 07 -- backward version 1: scalar fp32 math, correct first.
// Measured (H200, bf16, D=128, N=1024, B=16, H=16): 6.8 TFLOP/s, x0.03 of SDPA-FLASH.
//
// With S = scale * Q K^T, P = exp(S - LSE) (the forward's saved log-sum-exp
// gives P back without a second softmax) and dO the upstream gradient:
//   dV = P^T dO
//   dP = dO V^T
//   dS = P * (dP - Delta),   Delta_i = sum_j P_ij dP_ij = sum_d dO_id O_id
//   dQ = scale * dS K,       dK = scale * dS^T Q
// Three kernels, none of which ever holds an N x N matrix:
//   1. delta_kernel: Delta = rowsum(dO * O), one warp per row.
//   2. dkdv_kernel:  one CTA per 32 keys; dK and dV rows accumulate in registers
//      while the CTA walks the query tiles (from the diagonal on, if causal).
//   3. dq_kernel:    one CTA per 32 queries; dQ accumulates while it walks the
//      key tiles. Two kernels instead of FlashAttention-2's atomic adds into dQ:
//      each gradient element has one owner, so the result is deterministic.
// Each recomputes the 32 x 32 tiles of P and dS in shared memory. Tiles are
// copied to shared memory as fp32 with one padding column, so that a warp
// reading down a column (32 rows, stride D+1) hits 32 different banks.
// No tensor cores here: this backward is the reference the course trusts, not
// a fast one. It takes fp32, fp16 and bf16.
#include "step07_common.cuh"

namespace step07 {
namespace {

constexpr int BT = 32;            // rows per tile, both queries and keys
constexpr int BWD_THREADS = 128;  // 4 warps; warp w owns columns [w*D/4, (w+1)*D/4) of its gradients

template <typename T>
__global__ void delta_kernel(BwdParams p) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= p.bh * p.nq) return;
    const T* o = static_cast<const T*>(p.o) + (size_t)row * p.d;
    const T* dout = static_cast<const T*>(p.dout) + (size_t)row * p.d;
    float acc = 0.f;
    for (int d = lane; d < p.d; d += 32) acc = fmaf(to_float(o[d]), to_float(dout[d]), acc);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) p.delta[row] = acc;
}

// rows [r0, r0 + BT) of a (n, D) matrix -> BT x (D + 1) floats, zeros past n.
template <typename T, int D>
__device__ __forceinline__ void load_rows(float* dst, const T* src, int r0, int n) {
    for (int idx = threadIdx.x; idx < BT * D; idx += BWD_THREADS) {
        const int r = idx / D, c = idx % D;
        dst[r * (D + 1) + c] = (r0 + r < n) ? to_float(src[(size_t)(r0 + r) * D + c]) : 0.f;
    }
}

// P and dS for queries [q0, q0 + BT) x keys [k0, k0 + BT), into Ps and dSs
// ([BT][BT + 1]); zero where the pair is masked or out of range.
template <int D>
__device__ __forceinline__ void p_and_ds(const BwdParams& p, const float* Qs, const float* dOs, const float* Ks,
                                         const float* Vs, const float* lse, const float* delta, float* Ps,
                                         float* dSs, int q0, int k0) {
    for (int e = threadIdx.x; e < BT * BT; e += BWD_THREADS) {
        const int i = e / BT, j = e % BT;      // a warp shares i, its lanes take the 32 keys
        const int qi = q0 + i, kj = k0 + j;
        float s = 0.f, dp = 0.f;
#pragma unroll 8
        for (int d = 0; d < D; ++d) {
            s = fmaf(Qs[i * (D + 1) + d], Ks[j * (D + 1) + d], s);
            dp = fmaf(dOs[i * (D + 1) + d], Vs[j * (D + 1) + d], dp);
        }
        const bool ok = qi < p.nq && kj < p.nk && !(p.causal && kj > qi);
        // >>> STUDENT: P = exp(scale*s - lse_i) where ok (else 0); dS = P * (dP - Delta_i)
        const float pij = ok ? __expf(s * p.scale - lse[i]) : 0.f;
        Ps[i * (BT + 1) + j] = pij;
        dSs[i * (BT + 1) + j] = pij * (dp - delta[i]);
        // STUB: Ps[i * (BT + 1) + j] = 0.f;
        // STUB: dSs[i * (BT + 1) + j] = 0.f;
        // <<< STUDENT
    }
}

template <typename T, int D>
__global__ void __launch_bounds__(BWD_THREADS) dkdv_kernel(BwdParams p) {
    extern __shared__ float smem_bwd[];
    float* Ks = smem_bwd;                  // [BT][D + 1], this CTA's keys, loaded once
    float* Vs = Ks + BT * (D + 1);
    float* Qs = Vs + BT * (D + 1);         // [BT][D + 1], the current query tile
    float* dOs = Qs + BT * (D + 1);
    float* Ps = dOs + BT * (D + 1);        // [BT][BT + 1]
    float* dSs = Ps + BT * (BT + 1);
    float* lse = dSs + BT * (BT + 1);      // [BT]
    float* delta = lse + BT;               // [BT]

    const int bh = blockIdx.y, k0 = blockIdx.x * BT;
    const size_t qoff = (size_t)bh * p.nq, koff = (size_t)bh * p.nk;
    load_rows<T, D>(Ks, static_cast<const T*>(p.k) + koff * D, k0, p.nk);
    load_rows<T, D>(Vs, static_cast<const T*>(p.v) + koff * D, k0, p.nk);

    const int jj = threadIdx.x % 32;       // this thread's key within the tile
    const int c0 = (threadIdx.x / 32) * (D / 4);   // and its first gradient column
    float dk[D / 4], dv[D / 4];
#pragma unroll
    for (int c = 0; c < D / 4; ++c) { dk[c] = 0.f; dv[c] = 0.f; }

    // Causal: queries before k0 see none of these keys.
    const int q_start = p.causal ? (k0 / BT) * BT : 0;
    for (int q0 = q_start; q0 < p.nq; q0 += BT) {
        __syncthreads();
        load_rows<T, D>(Qs, static_cast<const T*>(p.q) + qoff * D, q0, p.nq);
        load_rows<T, D>(dOs, static_cast<const T*>(p.dout) + qoff * D, q0, p.nq);
        if (threadIdx.x < BT) {
            const bool ok = q0 + threadIdx.x < p.nq;
            lse[threadIdx.x] = ok ? p.lse[qoff + q0 + threadIdx.x] : 0.f;
            delta[threadIdx.x] = ok ? p.delta[qoff + q0 + threadIdx.x] : 0.f;
        }
        __syncthreads();
        p_and_ds<D>(p, Qs, dOs, Ks, Vs, lse, delta, Ps, dSs, q0, k0);
        __syncthreads();
        // dV[j] += sum_i P[i][j] dO[i];  dK[j] += sum_i dS[i][j] Q[i]  (scale applied at the end)
        for (int i = 0; i < BT; ++i) {
            const float pij = Ps[i * (BT + 1) + jj], dsij = dSs[i * (BT + 1) + jj];
#pragma unroll
            for (int c = 0; c < D / 4; ++c) {
                dv[c] = fmaf(pij, dOs[i * (D + 1) + c0 + c], dv[c]);
                dk[c] = fmaf(dsij, Qs[i * (D + 1) + c0 + c], dk[c]);
            }
        }
    }
    if (k0 + jj < p.nk) {
        T* dkp = static_cast<T*>(p.dk) + (koff + k0 + jj) * D + c0;
        T* dvp = static_cast<T*>(p.dv) + (koff + k0 + jj) * D + c0;
#pragma unroll
        for (int c = 0; c < D / 4; ++c) {
            dkp[c] = from_float<T>(dk[c] * p.scale);
            dvp[c] = from_float<T>(dv[c]);
        }
    }
}

template <typename T, int D>
__global__ void __launch_bounds__(BWD_THREADS) dq_kernel(BwdParams p) {
    extern __shared__ float smem_bwd[];
    float* Qs = smem_bwd;                  // [BT][D + 1], this CTA's queries, loaded once
    float* dOs = Qs + BT * (D + 1);
    float* Ks = dOs + BT * (D + 1);        // [BT][D + 1], the current key tile
    float* Vs = Ks + BT * (D + 1);
    float* Ps = Vs + BT * (D + 1);
    float* dSs = Ps + BT * (BT + 1);
    float* lse = dSs + BT * (BT + 1);
    float* delta = lse + BT;

    const int bh = blockIdx.y, q0 = blockIdx.x * BT;
    const size_t qoff = (size_t)bh * p.nq, koff = (size_t)bh * p.nk;
    load_rows<T, D>(Qs, static_cast<const T*>(p.q) + qoff * D, q0, p.nq);
    load_rows<T, D>(dOs, static_cast<const T*>(p.dout) + qoff * D, q0, p.nq);
    if (threadIdx.x < BT) {
        const bool ok = q0 + threadIdx.x < p.nq;
        lse[threadIdx.x] = ok ? p.lse[qoff + q0 + threadIdx.x] : 0.f;
        delta[threadIdx.x] = ok ? p.delta[qoff + q0 + threadIdx.x] : 0.f;
    }

    const int ii = threadIdx.x % 32;
    const int c0 = (threadIdx.x / 32) * (D / 4);
    float dq[D / 4];
#pragma unroll
    for (int c = 0; c < D / 4; ++c) dq[c] = 0.f;

    const int k_end = p.causal ? min(p.nk, q0 + BT) : p.nk;
    for (int k0 = 0; k0 < k_end; k0 += BT) {
        __syncthreads();
        load_rows<T, D>(Ks, static_cast<const T*>(p.k) + koff * D, k0, p.nk);
        load_rows<T, D>(Vs, static_cast<const T*>(p.v) + koff * D, k0, p.nk);
        __syncthreads();
        p_and_ds<D>(p, Qs, dOs, Ks, Vs, lse, delta, Ps, dSs, q0, k0);
        __syncthreads();
        for (int j = 0; j < BT; ++j) {
            const float dsij = dSs[ii * (BT + 1) + j];
#pragma unroll
            for (int c = 0; c < D / 4; ++c) dq[c] = fmaf(dsij, Ks[j * (D + 1) + c0 + c], dq[c]);
        }
    }
    if (q0 + ii < p.nq) {
        T* dqp = static_cast<T*>(p.dq) + (qoff + q0 + ii) * D + c0;
#pragma unroll
        for (int c = 0; c < D / 4; ++c) dqp[c] = from_float<T>(dq[c] * p.scale);
    }
}

template <typename T, int D>
cudaError_t launch(const BwdParams& p, cudaStream_t stream) {
    const int smem = (int)sizeof(float) * (4 * BT * (D + 1) + 2 * BT * (BT + 1) + 2 * BT);   // 75 KB at D=128
    cudaError_t err;
    if ((err = cudaFuncSetAttribute(dkdv_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem))) return err;
    if ((err = cudaFuncSetAttribute(dq_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem))) return err;
    delta_kernel<T><<<(p.bh * p.nq + 3) / 4, 128, 0, stream>>>(p);
    dkdv_kernel<T, D><<<dim3((p.nk + BT - 1) / BT, p.bh), BWD_THREADS, smem, stream>>>(p);
    dq_kernel<T, D><<<dim3((p.nq + BT - 1) / BT, p.bh), BWD_THREADS, smem, stream>>>(p);
    return cudaGetLastError();
}

template <typename T>
cudaError_t launch_d(const BwdParams& p, cudaStream_t stream) {
    switch (p.d) {
        case 64: return launch<T, 64>(p, stream);
        case 128: return launch<T, 128>(p, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace

cudaError_t bwd(const BwdParams& p, cudaStream_t stream) {
    switch (p.dtype) {
        case DType::f32: return launch_d<float>(p, stream);
        case DType::f16: return launch_d<__half>(p, stream);
        case DType::bf16: return launch_d<__nv_bfloat16>(p, stream);
    }
    return cudaErrorInvalidValue;
}

}  // namespace step07
