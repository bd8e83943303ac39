// Step 07 -- backward version 3: backward v2 with its dK/dV kernel on Hopper's warpgroup MMA
// (wgmma), v4's machinery (step07_wgmma.cuh). sm_90a only (H100/H200); fp16/bf16.
// H200, bf16, N 4k-16k (B = 16384/N, H = 2048/D), D 64/128, causal and not, against backward v2
// and cuDNN's SDPA backward in the same run (bench/experiments/cuda_bwd_wgmma.py at 29222e3,
// results/h200/step07_bwd_wgmma/: cuda_bwd_wgmma.json, .log, _stdout.log): the whole backward
// 1.19-1.36x faster than v2's (236-304 TFLOP/s against 191-236), 0.53-0.64x cuDNN's (v2:
// 0.43-0.52x); this file's dK/dV kernel takes 0.33-0.39 of v2's whole backward time (401-545
// TFLOP/s counting its 4 products); forward v5 + v3 run 0.59-0.70x cuDNN's forward + backward
// (v5 + v2: 0.49-0.58x). 112/112 reference cases, compute-sanitizer memcheck and racecheck clean.
// dQ (v2's kernel, mma.sync) is now the larger part of the backward.
//
// The split is v2's: Delta = rowsum(dO * O), then dK/dV, then dQ. Delta and dQ are v2's kernels,
// launched through bwd_mma_delta and bwd_mma_dq (step07_bwd_mma.cu); this file's kernel computes
// dK and dV.
//
// dkdv_wgmma_kernel. A CTA owns BN keys: WG warpgroups x 64 (config 0, the default: 2 warpgroups,
// 128 keys, 256 threads; config 1: 1 warpgroup, 64 keys). K and V stay resident in shared memory
// in v4's 128-byte swizzle (D/64 column blocks of 64); fp32 dK and dV (64 x D a warpgroup, D/2
// registers a thread each) stay in registers. The CTA walks the query tiles of BM = 64 rows from
// the first that can see its keys (causal: q_start = k0; else 0), Q and dO double-buffered by
// cp.async into the same swizzled layout, LSE*log2(e) and Delta rows double-buffered in shared
// memory. Per query tile, per warpgroup (its 64 keys are the M of every product):
//     S^T  = K Q^T     wgmma SS, m64n64k16 x D/16: A = K, B = Q, both K-major (v4's S = Q K^T)
//     dP^T = V dO^T    wgmma SS likewise; S^T and dP^T in one commit group, one wait
//     P^T  = exp2(S^T * scale*log2e - LSE*log2e), masked (key >= Nk, query >= Nq, top-left
//            causal key > query) on boundary tiles only;  dS^T = P^T * (dP^T - Delta)  (registers)
//     dV  += P^T dO    wgmma RS, m64nDk16 x BM/16: A = P^T from registers (the S^T accumulator
//                      repacked to 16 bits, exactly as v4 feeds P), B = dO read MN-major
//     dK  += dS^T Q    wgmma RS likewise, B = Q MN-major; dV and dK in one commit group, one wait
// then dK * scale and dV stored from registers in the input dtype.
//
// What changes from v2's dK/dV kernel (dkdv_mma_kernel): mma.sync m16n8k16 issued by each warp
// on ldmatrix(.trans) fragments -> one wgmma a 64 x N x 16 step, K, V, Q, dO read by the tensor
// cores from shared memory through descriptors (no ldmatrix at all); 64 keys a CTA (4 warps x 16)
// -> 128 (2 warpgroups x 64); 2 CTAs an SM (97 KB at D=128) -> one (config 0: 129 KB at D=128,
// 254 registers x 256 threads) or two (config 1). Kept: P^T and dS^T rounded to fp16/bf16 before
// their products (as FlashAttention-2), the masks on boundary tiles only, the causal start at the
// key tile's first query, zero gradients for keys no query sees, fp32 accumulation.
// Compiled for sm_90a (nvcc 13.0, step07_cuda.build()'s flags): no spills, no stack; 184 (D=64) /
// 254 (D=128) registers for config 0; HGMMA 2*D/16 + 2*64/16 a kernel, no HMMA, two wgmma waits
// (tests/test_experiment_cuda_bwd_wgmma.py checks these on a CPU).
//
// Not done (FlashAttention-3's backward does): TMA loads from a producer warpgroup with
// setmaxnreg, dQ accumulated in this same kernel with fp32 atomics (here dQ is still v2's
// separate mma.sync kernel, which recomputes S and dP: seven products where FA-3 does five),
// the exponentials of one tile under the next tile's S^T / dP^T, BM = 128 query tiles.
//
// Only sm_90a has wgmma: on any other target the kernel's body compiles to nothing, and the
// binding (and step07_cuda.py for an explicit bwd_version=3) refuses backward v3 on a GPU other
// than 9.0.
#include "step07_common.cuh"
#include "step07_wgmma.cuh"   // sw128, make_desc and the wgmma wrappers (v4's)

namespace step07 {
namespace bwd3 {

template <int D_, int WG_>
struct BwdWConfig {
    static constexpr int D = D_;
    static constexpr int WG = WG_;                      // warpgroups, 64 keys each
    static constexpr int THREADS = WG * 128;
    static constexpr int BN = WG * 64;                  // keys a CTA
    static constexpr int BM = 64;                       // queries a tile
    static constexpr int CHUNKS = D / 8;                // 16-byte chunks a row
    static constexpr int KV_BYTES = BN * D * 2;         // K (or V), resident
    static constexpr int QT_BYTES = BM * D * 2;         // one stage of Q (or dO)
    // K, V, 2 stages of Q and dO, 2 stages of LSE*log2e and Delta (fp32), 1024 to align the base.
    static constexpr int SMEM = 2 * KV_BYTES + 4 * QT_BYTES + 4 * BM * 4 + 1024;
};

// Start copying rows [r0, r0 + ROWS) of a (n, D) matrix into a swizzled tile at shared address dst.
template <typename Cfg, int ROWS, typename T>
__device__ __forceinline__ void load_tile_async(uint32_t dst, const T* src, int r0, int n) {
    constexpr int TOTAL = ROWS * Cfg::CHUNKS;
    static_assert(TOTAL % Cfg::THREADS == 0, "tile chunks must divide evenly among threads");
#pragma unroll
    for (int i = 0; i < TOTAL / Cfg::THREADS; ++i) {
        const int idx = i * Cfg::THREADS + threadIdx.x;
        const int r = idx / Cfg::CHUNKS, c = idx % Cfg::CHUNKS;
        const bool ok = r0 + r < n;
        const T* g = src + (size_t)(ok ? r0 + r : 0) * Cfg::D + c * 8;   // rows past n: zero-filled
        cp_async_16(dst + sw128<ROWS>(r, c), g, ok);
    }
}

template <typename T, typename Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, 1) dkdv_wgmma_kernel(BwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int D = Cfg::D, BN = Cfg::BN, BM = Cfg::BM;
    extern __shared__ __align__(1024) unsigned char smem_bw[];
    const uint32_t base = (smem_u32(smem_bw) + 1023u) & ~1023u;
    const uint32_t Ks = base;                               // [D/64][BN][64]
    const uint32_t Vs = Ks + Cfg::KV_BYTES;                 // [D/64][BN][64]
    const uint32_t Qs = Vs + Cfg::KV_BYTES;                 // [2][D/64][BM][64]
    const uint32_t dOs = Qs + 2 * Cfg::QT_BYTES;            // [2][D/64][BM][64]
    // LSE*log2e and Delta, [2][BM] each, through a generic pointer (plain stores and loads).
    float* lse2 = reinterpret_cast<float*>(smem_bw + (dOs + 2 * Cfg::QT_BYTES - smem_u32(smem_bw)));
    float* dlt = lse2 + 2 * BM;

    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int bh = blockIdx.y, k0 = blockIdx.x * BN;       // causal: low k0 = most query tiles, launched first
    const int kw = wg * 64 + warp * 16;                     // this warp's first key in the tile
    const size_t qoff = (size_t)bh * p.nq, koff = (size_t)bh * p.nk;
    const T* q = static_cast<const T*>(p.q) + qoff * D;
    const T* dout = static_cast<const T*>(p.dout) + qoff * D;

    const int q_start = p.causal ? k0 : 0;                  // causal: queries before k0 see none of these keys
    const int n_tiles = (p.nq - q_start + BM - 1) / BM;
    if (n_tiles <= 0) {                                     // these keys get no gradient
        for (int idx = threadIdx.x; idx < BN * D; idx += Cfg::THREADS) {
            const int r = idx / D;
            if (k0 + r < p.nk) {
                static_cast<T*>(p.dk)[(koff + k0 + r) * D + idx % D] = from_float<T>(0.f);
                static_cast<T*>(p.dv)[(koff + k0 + r) * D + idx % D] = from_float<T>(0.f);
            }
        }
        return;
    }
    load_tile_async<Cfg, BN>(Ks, static_cast<const T*>(p.k) + koff * D, k0, p.nk);
    load_tile_async<Cfg, BN>(Vs, static_cast<const T*>(p.v) + koff * D, k0, p.nk);
    load_tile_async<Cfg, BM>(Qs, q, q_start, p.nq);
    load_tile_async<Cfg, BM>(dOs, dout, q_start, p.nq);
    cp_async_commit();
    if (threadIdx.x < BM) {
        const int i = q_start + threadIdx.x;
        lse2[threadIdx.x] = i < p.nq ? p.lse[qoff + i] * kLog2e : 0.f;
        dlt[threadIdx.x] = i < p.nq ? p.delta[qoff + i] : 0.f;
    }

    const float sl2 = p.scale * kLog2e;
    float dk[D / 2], dv[D / 2];                             // this warpgroup's 64 keys x D
#pragma unroll
    for (int i = 0; i < D / 2; ++i) { dk[i] = 0.f; dv[i] = 0.f; }
    const uint32_t Kwg = Ks + wg * 64 * 128, Vwg = Vs + wg * 64 * 128;   // this warpgroup's 64 rows

    for (int j = 0; j < n_tiles; ++j) {
        const int q0 = q_start + j * BM, st = j & 1;
        cp_async_wait<0>();
        fence_proxy_async();                                // this thread's copies -> visible to wgmma
        __syncthreads();                                    // everyone's copies landed; stage st^1 is free
        if (j + 1 < n_tiles) {                              // prefetch the next query tile
            const int nx = st ^ 1;
            load_tile_async<Cfg, BM>(Qs + nx * Cfg::QT_BYTES, q, q0 + BM, p.nq);
            load_tile_async<Cfg, BM>(dOs + nx * Cfg::QT_BYTES, dout, q0 + BM, p.nq);
            if (threadIdx.x < BM) {
                const int i = q0 + BM + threadIdx.x;
                lse2[nx * BM + threadIdx.x] = i < p.nq ? p.lse[qoff + i] * kLog2e : 0.f;
                dlt[nx * BM + threadIdx.x] = i < p.nq ? p.delta[qoff + i] : 0.f;
            }
        }
        cp_async_commit();
        const uint32_t Qt = Qs + st * Cfg::QT_BYTES, dOt = dOs + st * Cfg::QT_BYTES;

        // S^T = K Q^T and dP^T = V dO^T: D/16 wgmma each, 16-wide slices of D (v4's S = Q K^T).
        float s[BM / 2], dp[BM / 2];
        fence_regs(s);
        fence_regs(dp);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const uint32_t off = (kk % 4) * 32;
            wgmma_ss<T, BM>(s, make_desc(Kwg + (kk / 4) * (BN * 128) + off, 16, 1024),
                            make_desc(Qt + (kk / 4) * (BM * 128) + off, 16, 1024), kk > 0);
        }
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const uint32_t off = (kk % 4) * 32;
            wgmma_ss<T, BM>(dp, make_desc(Vwg + (kk / 4) * (BN * 128) + off, 16, 1024),
                            make_desc(dOt + (kk / 4) * (BM * 128) + off, 16, 1024), kk > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(s);
        fence_regs(dp);

        // Element i of the accumulators: key kw + g + 8*((i>>1)&1) (a row), query (i/4)*8 + 2t + (i&1) (a column).
        const float* l2 = lse2 + st * BM;
        const float* dl = dlt + st * BM;
        const bool need_mask = q0 + BM > p.nq || k0 + BN > p.nk || (p.causal && k0 + BN - 1 > q0);
        if (need_mask) {
#pragma unroll
            for (int i = 0; i < BM / 2; ++i) {
                const int qi = q0 + (i / 4) * 8 + 2 * t + (i & 1);
                const int key = k0 + kw + g + 8 * ((i >> 1) & 1);
                const bool ok = qi < p.nq && key < p.nk && !(p.causal && key > qi);
                const int c = (i / 4) * 8 + 2 * t + (i & 1);
                const float pv = ok ? exp2f(fmaf(s[i], sl2, -l2[c])) : 0.f;
                s[i] = pv;
                dp[i] = pv * (dp[i] - dl[c]);
            }
        } else {
#pragma unroll
            for (int i = 0; i < BM / 2; ++i) {
                const int c = (i / 4) * 8 + 2 * t + (i & 1);
                const float pv = exp2f(fmaf(s[i], sl2, -l2[c]));
                s[i] = pv;
                dp[i] = pv * (dp[i] - dl[c]);
            }
        }
        // P^T and dS^T as A fragments: 16 queries (two 8-column chunks) per wgmma (v4's P packing).
        uint32_t pa[BM / 16][4], da[BM / 16][4];
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) {
            pa[kk][0] = pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
            pa[kk][1] = pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
            pa[kk][2] = pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
            pa[kk][3] = pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
            da[kk][0] = pack2<T>(dp[8 * kk + 0], dp[8 * kk + 1]);
            da[kk][1] = pack2<T>(dp[8 * kk + 2], dp[8 * kk + 3]);
            da[kk][2] = pack2<T>(dp[8 * kk + 4], dp[8 * kk + 5]);
            da[kk][3] = pack2<T>(dp[8 * kk + 6], dp[8 * kk + 7]);
        }
        // dV += P^T dO, dK += dS^T Q: B = 16 rows (queries) of dO / Q from row 16kk, MN-major.
        // The B operand is stored K-major for S^T (a row of Q is a query's D values) but read MN-major here:
        // its K (the queries) runs down the rows, so imm-trans-b = 1 (wgmma_rs) and the descriptor's
        // LBO is the distance between Q's (or dO's) 64-column blocks, BM * 128 bytes; SBO 1024 as before.
        fence_regs(dv);
        fence_regs(dk);
        wgmma_fence();
        // >>> STUDENT: dV += P^T dO, then dK += dS^T Q: BM/16 wgmma_rs<T, D> each, A = pa[kk] (da[kk]) from registers, B = dO (Q) rows 16kk.. of this stage, descriptor make_desc(addr, BM * 128, 1024)
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk)
            wgmma_rs<T, D>(dv, pa[kk], make_desc(dOt + kk * 16 * 128, BM * 128, 1024), 1);
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk)
            wgmma_rs<T, D>(dk, da[kk], make_desc(Qt + kk * 16 * 128, BM * 128, 1024), 1);
        // <<< STUDENT
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(dv);
        fence_regs(dk);
    }
    cp_async_wait<0>();   // leave no copy in flight (the last group is empty)

    // Epilogue: this thread's rows kw + g and kw + g + 8, v4's O store.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int key = k0 + kw + g + 8 * h;
        if (key < p.nk) {
            T* dkp = static_cast<T*>(p.dk) + (koff + key) * D;
            T* dvp = static_cast<T*>(p.dv) + (koff + key) * D;
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                *reinterpret_cast<uint32_t*>(dkp + nt * 8 + 2 * t) =
                    pack2<T>(dk[4 * nt + 2 * h] * p.scale, dk[4 * nt + 2 * h + 1] * p.scale);
                *reinterpret_cast<uint32_t*>(dvp + nt * 8 + 2 * t) = pack2<T>(dv[4 * nt + 2 * h], dv[4 * nt + 2 * h + 1]);
            }
        }
    }
#endif  // __CUDA_ARCH_FEAT_SM90_ALL: elsewhere the kernel is empty (never launched: see the header)
}

template <typename T, typename Cfg>
cudaError_t launch_dkdv(const BwdParams& p, cudaStream_t stream) {
    cudaError_t err = cudaFuncSetAttribute(dkdv_wgmma_kernel<T, Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           Cfg::SMEM);
    if (err != cudaSuccess) return err;
    dkdv_wgmma_kernel<T, Cfg><<<dim3((p.nk + Cfg::BN - 1) / Cfg::BN, p.bh), Cfg::THREADS, Cfg::SMEM, stream>>>(p);
    return cudaGetLastError();
}

template <typename T>
cudaError_t launch_dkdv_d(const BwdParams& p, int config, cudaStream_t stream) {
    // config 0 (the default, the faster at all 12 shapes timed on the H200): 2 warpgroups, 128 keys a
    // CTA (D=64: 66 KB shared, D=128: 129 KB); config 1: 1 warpgroup, 64 keys a CTA (50 KB, 98 KB).
    if (p.d == 64) {
        switch (config) {
            case 0: return launch_dkdv<T, BwdWConfig<64, 2>>(p, stream);
            case 1: return launch_dkdv<T, BwdWConfig<64, 1>>(p, stream);
        }
    } else if (p.d == 128) {
        switch (config) {
            case 0: return launch_dkdv<T, BwdWConfig<128, 2>>(p, stream);
            case 1: return launch_dkdv<T, BwdWConfig<128, 1>>(p, stream);
        }
    }
    return cudaErrorInvalidValue;
}

}  // namespace bwd3

// Backward v3's dK/dV kernel alone, p.delta already computed (bench/experiments/cuda_bwd_wgmma.py
// times it; config: launch_dkdv_d above).
cudaError_t bwd_wgmma_dkdv(const BwdParams& p, int config, cudaStream_t stream) {
    switch (p.dtype) {
        case DType::f16: return bwd3::launch_dkdv_d<__half>(p, config, stream);
        case DType::bf16: return bwd3::launch_dkdv_d<__nv_bfloat16>(p, config, stream);
        default: return cudaErrorInvalidValue;
    }
}

// Backward v3: Delta (v2's kernel), dK and dV (this file's, config 0), dQ (v2's kernel).
cudaError_t bwd_wgmma(const BwdParams& p, cudaStream_t stream) {
    cudaError_t err = bwd_mma_delta(p, stream);
    if (err != cudaSuccess) return err;
    if ((err = bwd_wgmma_dkdv(p, 0, stream)) != cudaSuccess) return err;
    return bwd_mma_dq(p, stream);
}

}  // namespace step07
