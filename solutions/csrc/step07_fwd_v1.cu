// Step 07, version 1 -- the source material's structure, in scalar fp32.
// Measured (H200, bf16, D=128, N=1024, B=16, H=16): 9.1 TFLOP/s, x0.03 of SDPA-FLASH.
//
// One CTA owns BQ = 64 query rows and one thread owns one row: its running max
// m, running sum l and output row o[D] live in that thread's registers (the
// "online softmax state in registers"). The CTA walks the keys in tiles of
// BK = 32: it copies K and V tiles into shared memory (converted to fp32), then
// every thread scores its row against the 32 keys, updates (m, l, o) and moves
// on. No tensor cores, no vector loads: every multiply-add is one FFMA fed by
// one or two shared-memory loads, so this version is bound by shared-memory
// load instructions, not arithmetic. It is the correctness baseline the faster
// versions are checked against, and it is the only version that takes fp32.
//
// Shared memory: Q tile BQ x (D+1) floats, K and V tiles 2 x BK x D floats and
// the scores BQ x (BK+1) floats = 73.7 KB at D=128, over the 48 KB a kernel
// gets by default: the launcher raises the limit with cudaFuncSetAttribute.
// The +1 columns pad rows so that 32 threads reading row[threadIdx.x][j] hit
// 32 different banks. The scores go to shared memory, not a register array,
// because the loop over keys is not unrolled: a register array indexed by a
// run-time j would be placed in (slow, off-chip) local memory instead.
#include "step07_common.cuh"

namespace step07 {
namespace {

constexpr int V1_BQ = 64;   // query rows per CTA = threads per CTA
constexpr int V1_BK = 32;   // keys per tile

template <typename T, int D>
__global__ void __launch_bounds__(V1_BQ) fwd_v1_kernel(FwdParams p) {
    extern __shared__ float smem_v1[];
    float* Qs = smem_v1;                        // [BQ][D + 1]
    float* Ks = Qs + V1_BQ * (D + 1);           // [BK][D]
    float* Vs = Ks + V1_BK * D;                 // [BK][D]
    float* Ss = Vs + V1_BK * D;                 // [BQ][BK + 1]: row threadIdx.x is this thread's
    float* s = Ss + threadIdx.x * (V1_BK + 1);  //   scores, private to it (no barrier needed)

    const int bh = blockIdx.y;
    const int q0 = blockIdx.x * V1_BQ;
    const int row = q0 + threadIdx.x;           // this thread's query row
    const T* q = static_cast<const T*>(p.q) + (size_t)bh * p.nq * D;
    const T* k = static_cast<const T*>(p.k) + (size_t)bh * p.nk * D;
    const T* v = static_cast<const T*>(p.v) + (size_t)bh * p.nk * D;

    // Q tile -> shared (fp32). Consecutive threads read consecutive elements:
    // coalesced. Rows past Nq are filled with zeros and never written back.
    for (int idx = threadIdx.x; idx < V1_BQ * D; idx += V1_BQ) {
        int r = idx / D, c = idx % D;
        Qs[r * (D + 1) + c] = (q0 + r < p.nq) ? to_float(q[(size_t)(q0 + r) * D + c]) : 0.f;
    }

    float m = -INFINITY;    // running max of this row's scaled scores
    float l = 0.f;          // running sum of exp(score - m)
    float o[D];             // running sum of exp(score - m) * v, unnormalized
#pragma unroll
    for (int d = 0; d < D; ++d) o[d] = 0.f;

    // Causal: no key past the CTA's last row is ever seen by any of its rows.
    const int k_end = p.causal ? min(p.nk, q0 + V1_BQ) : p.nk;
    for (int k0 = 0; k0 < k_end; k0 += V1_BK) {
        __syncthreads();   // every thread is done with the previous K/V tile
        for (int idx = threadIdx.x; idx < V1_BK * D; idx += V1_BQ) {
            int r = idx / D, c = idx % D;
            bool ok = k0 + r < p.nk;
            Ks[idx] = ok ? to_float(k[(size_t)(k0 + r) * D + c]) : 0.f;
            Vs[idx] = ok ? to_float(v[(size_t)(k0 + r) * D + c]) : 0.f;
        }
        __syncthreads();   // the tile is in shared memory

        // Scores of this row against the tile's keys, and their max.
        float tile_max = -INFINITY;
        for (int j = 0; j < V1_BK; ++j) {
            float acc = 0.f;
#pragma unroll 16
            for (int d = 0; d < D; ++d) acc = fmaf(Qs[threadIdx.x * (D + 1) + d], Ks[j * D + d], acc);
            const int key = k0 + j;
            // >>> STUDENT: scale the score; set it to -INFINITY for keys past Nk and, if causal, keys after this row
            bool masked = key >= p.nk || (p.causal && key > row);
            s[j] = masked ? -INFINITY : acc * p.scale;
            // STUB: s[j] = acc;
            // <<< STUDENT
            tile_max = fmaxf(tile_max, s[j]);
        }

        // >>> STUDENT: online softmax: new max, rescale l and o by exp(m_old - m_new), add this tile's exp(s - m_new) and exp(s - m_new) * V
        const float m_new = fmaxf(m, tile_max);
        // A row that has seen only masked keys so far keeps m = -inf; exp(-inf - -inf)
        // would be NaN, so its (zero) state is "rescaled" by 0 instead.
        const float alpha = (m == -INFINITY) ? 0.f : __expf(m - m_new);
        l *= alpha;
#pragma unroll
        for (int d = 0; d < D; ++d) o[d] *= alpha;
        for (int j = 0; j < V1_BK; ++j) {
            const float pj = (s[j] == -INFINITY) ? 0.f : __expf(s[j] - m_new);
            l += pj;
#pragma unroll
            for (int d = 0; d < D; ++d) o[d] = fmaf(pj, Vs[j * D + d], o[d]);
        }
        m = m_new;
        // <<< STUDENT
    }

    if (row < p.nq) {
        T* out = static_cast<T*>(p.o) + ((size_t)bh * p.nq + row) * D;
        // >>> STUDENT: normalize: out = o / l, and lse = m + log(l)
        const float inv_l = 1.f / l;
#pragma unroll
        for (int d = 0; d < D; ++d) out[d] = from_float<T>(o[d] * inv_l);
        p.lse[(size_t)bh * p.nq + row] = m + logf(l);
        // STUB: for (int d = 0; d < D; ++d) out[d] = from_float<T>(0.f);
        // STUB: p.lse[(size_t)bh * p.nq + row] = 0.f;
        // <<< STUDENT
    }
}

template <typename T, int D>
cudaError_t launch(const FwdParams& p, cudaStream_t stream) {
    const size_t smem = sizeof(float) * (V1_BQ * (D + 1) + 2 * V1_BK * D + V1_BQ * (V1_BK + 1));
    cudaError_t err = cudaFuncSetAttribute(fwd_v1_kernel<T, D>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return err;
    dim3 grid((p.nq + V1_BQ - 1) / V1_BQ, p.bh);
    fwd_v1_kernel<T, D><<<grid, V1_BQ, smem, stream>>>(p);
    return cudaGetLastError();
}

template <typename T>
cudaError_t launch_d(const FwdParams& p, cudaStream_t stream) {
    switch (p.d) {
        case 64: return launch<T, 64>(p, stream);
        case 128: return launch<T, 128>(p, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace

cudaError_t fwd_v1(const FwdParams& p, cudaStream_t stream) {
    switch (p.dtype) {
        case DType::f32: return launch_d<float>(p, stream);
        case DType::f16: return launch_d<__half>(p, stream);
        case DType::bf16: return launch_d<__nv_bfloat16>(p, stream);
    }
    return cudaErrorInvalidValue;
}

}  // namespace step07
