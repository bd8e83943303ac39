// Step 07, version 4 -- v3's algorithm with both products on Hopper's warpgroup
// tensor cores (wgmma.mma_async, sm_90a only). H200, bf16, N 4k-16k, 128 x 64 tiles:
// 368-405 TFLOP/s at D = 64 (0.87-0.88x cuDNN), 377-438 at D = 128 (0.69-0.79x),
// 1.27-1.39x v3 (bench/experiments/cuda_v4_wgmma.py, results/h200/step07_v4/).
//
// What changes from v3, and why:
//  1. wgmma instead of mma.sync. A warpgroup (4 consecutive warps, 128 threads)
//     issues one m64nNk16 instruction: 64 query rows x N columns x 16 of the
//     reduction, against mma.sync's 16 x 8 x 16 for one warp. The operands are
//     read by the tensor cores straight from shared memory: no ldmatrix, no
//     fragments of K or V in registers. A CTA is 2 warpgroups, 128 query rows,
//     64 per warpgroup (16 per warp, as v3's config 2).
//  2. Shared-memory matrix descriptors. wgmma is told where a tile is by a 64-bit
//     descriptor (make_desc, in step07_wgmma.cuh with the wgmma wrappers): the start address, two byte strides and a
//     swizzle mode. The tiles here use the 128-byte swizzle: a tile of ROWS x D
//     16-bit values is stored as D/64 column blocks of ROWS x 64 (128 bytes a
//     row); in each block, 16-byte chunk c of row r sits at chunk c ^ (r % 8)
//     (v3's XOR, in blocks of 64 columns). Eight rows (1024 bytes) form one
//     swizzle atom; every atom starts on a 1024-byte boundary (base offset 0).
//  3. S = Q K^T: A = Q (64 x 16 slices) and B = K^T, both "K-major" (the
//     reduction, D, is contiguous in shared memory) -- the layout cp.async
//     already writes. O += P V: A = P straight from registers (the S
//     accumulator's layout is, two 8-column chunks at a time, the A operand's:
//     FlashAttention-3's way), B = V, whose contiguous dimension is D, the
//     output's N: "MN-major", which the instruction's imm-trans-b = 1 selects.
//  4. wgmma is asynchronous: wgmma.fence before a batch (the registers it
//     reads were written by ordinary instructions), commit_group after it,
//     wait_group 0 before the accumulator is read. cp.async writes shared memory
//     through the generic proxy and wgmma reads it through the async proxy, so
//     each thread issues fence.proxy.async after its copies land and before the
//     barrier that releases the tile to the tensor cores.
// Kept from v3: cp.async double buffering of K and V, the base-2 online softmax
// with the scale folded into one FFMA, the masks only on boundary tiles, causal
// tiles launched longest first. Not done here (v5, step07_fwd_v5.cu, does the first two;
// FlashAttention-3 all three): TMA loads, warp specialization (producer warps,
// setmaxnreg), overlapping one tile's softmax with the next tile's Q K^T.
//
// Only sm_90a has wgmma: on any other target (the sm_80 build, or sm_90 without
// the "a") the kernel's body compiles to nothing, and step07_cuda.py refuses
// version 4 on a GPU other than 9.0 (and builds with compute_90a there).
#include <type_traits>

#include "step07_common.cuh"
#include "step07_wgmma.cuh"   // sw128, make_desc and the wgmma wrappers (your descriptor is there)

namespace step07 {
namespace {

// Tile configuration: 2 warpgroups of 64 query rows, BN keys per tile.
template <int D_, int BN_>
struct V4Config {
    static constexpr int D = D_;
    static constexpr int BN = BN_;
    static constexpr int WARPGROUPS = 2;
    static constexpr int THREADS = WARPGROUPS * 128;
    static constexpr int BM = WARPGROUPS * 64;
    static constexpr int CHUNKS = D / 8;                 // 16-byte chunks per row
    static constexpr int Q_BYTES = BM * D * 2;
    static constexpr int KV_BYTES = BN * D * 2;          // one stage of K (or V)
    // Q + 2 stages of K and V, plus 1024 bytes to align the base to a swizzle atom.
    static constexpr int SMEM = Q_BYTES + 4 * KV_BYTES + 1024;
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
__global__ void __launch_bounds__(Cfg::THREADS, 1) fwd_v4_kernel(FwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int D = Cfg::D, BN = Cfg::BN, BM = Cfg::BM;
    extern __shared__ __align__(1024) unsigned char smem_v4[];
    // Shared addresses (32-bit) of the tiles, the base rounded up to a 1024-byte swizzle atom.
    const uint32_t Qs = (smem_u32(smem_v4) + 1023u) & ~1023u;   // [D/64][BM][64]
    const uint32_t Ks = Qs + Cfg::Q_BYTES;                       // [2][D/64][BN][64]
    const uint32_t Vs = Ks + 2 * Cfg::KV_BYTES;                  // [2][D/64][BN][64]

    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int bh = blockIdx.y;
    const int m_block = p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;   // causal: longest first
    const int q0 = m_block * BM;
    const int wr = wg * 64 + warp * 16;            // this warp's first row in the tile
    const T* q = static_cast<const T*>(p.q) + (size_t)bh * p.nq * D;
    const T* k = static_cast<const T*>(p.k) + (size_t)bh * p.nk * D;
    const T* v = static_cast<const T*>(p.v) + (size_t)bh * p.nk * D;

    const int n_end = p.causal ? min(p.nk, q0 + BM) : p.nk;
    const int n_tiles = (n_end + BN - 1) / BN;

    load_tile_async<Cfg, BM>(Qs, q, q0, p.nq);
    load_tile_async<Cfg, BN>(Ks, k, 0, p.nk);
    load_tile_async<Cfg, BN>(Vs, v, 0, p.nk);
    cp_async_commit();

    const float sl2 = p.scale * kLog2e;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float o[D / 2];                                // the 64 x D accumulator of this warpgroup
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
    // This warpgroup's 64 rows of Q: rows wg*64.. of every column block.
    const uint32_t Qwg = Qs + wg * 64 * 128;

    for (int j = 0; j < n_tiles; ++j) {
        const int n0 = j * BN;
        cp_async_wait<0>();
        fence_proxy_async();                       // this thread's copies -> visible to wgmma
        __syncthreads();                           // everyone's copies landed; stage j^1 is free
        if (j + 1 < n_tiles) {
            const uint32_t nxt = ((j + 1) & 1) * Cfg::KV_BYTES;
            load_tile_async<Cfg, BN>(Ks + nxt, k, n0 + BN, p.nk);
            load_tile_async<Cfg, BN>(Vs + nxt, v, n0 + BN, p.nk);
        }
        cp_async_commit();
        const uint32_t Kt = Ks + (j & 1) * Cfg::KV_BYTES;
        const uint32_t Vt = Vs + (j & 1) * Cfg::KV_BYTES;

        // S = Q K^T: D/16 wgmma, each a 16-wide slice of D: 32 bytes into a 128-byte
        // row, in column block kk / 4. The hardware applies the swizzle to the
        // addresses it forms, so advancing the start address by 32 bytes is right.
        float s[BN / 2];
        fence_regs(s);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const uint32_t koff = (kk % 4) * 32;
            const uint64_t da = make_desc(Qwg + (kk / 4) * (BM * 128) + koff, 16, 1024);
            const uint64_t db = make_desc(Kt + (kk / 4) * (BN * 128) + koff, 16, 1024);
            wgmma_ss<T, BN>(s, da, db, kk > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(s);

        // Mask only the tiles that can hold masked scores (as v3).
        if (n0 + BN > p.nk || (p.causal && n0 + BN - 1 > q0)) {
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) {
                const int key = n0 + (i / 4) * 8 + 2 * t + (i & 1);
                const int row = q0 + wr + g + 8 * ((i >> 1) & 1);
                if (key >= p.nk || (p.causal && key > row)) s[i] = -INFINITY;
            }
        }

        // Online softmax for this thread's two rows (h = 0: row g, h = 1: row g + 8).
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = m[h];
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt) mx = fmaxf(mx, fmaxf(s[4 * nt + 2 * h], s[4 * nt + 2 * h + 1]));
            mx = quad_max(mx);
            const float msub = (mx == -INFINITY) ? 0.f : mx * sl2;
            const float alpha = exp2f(m[h] * sl2 - msub);
            m[h] = mx;
            float rs = 0.f;
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt) {
                s[4 * nt + 2 * h] = exp2f(fmaf(s[4 * nt + 2 * h], sl2, -msub));
                s[4 * nt + 2 * h + 1] = exp2f(fmaf(s[4 * nt + 2 * h + 1], sl2, -msub));
                rs += s[4 * nt + 2 * h] + s[4 * nt + 2 * h + 1];
            }
            l[h] = l[h] * alpha + rs;
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                o[4 * nt + 2 * h] *= alpha;
                o[4 * nt + 2 * h + 1] *= alpha;
            }
        }

        // O += P V: P as the A operand from registers, 16 keys (two 8-column chunks
        // of S) per wgmma; V's 16 rows from row 16kk of the tile, its two 64-column
        // blocks (D = 128) BN * 128 bytes apart: the LBO of an MN-major operand.
        uint32_t pa[BN / 16][4];
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            pa[kk][0] = pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);   // row g,     keys 2t, 2t+1
            pa[kk][1] = pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);   // row g + 8, keys 2t, 2t+1
            pa[kk][2] = pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);   // row g,     keys 2t+8, 2t+9
            pa[kk][3] = pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);   // row g + 8, keys 2t+8, 2t+9
        }
        fence_regs(o);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
            wgmma_rs<T, D>(o, pa[kk], make_desc(Vt + kk * 16 * 128, BN * 128, 1024), 1);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(o);
    }
    cp_async_wait<0>();   // leave no copy in flight (the last group is empty)

    // Epilogue (as v3): row sums across the quad, normalize, store O and the LSE.
    T* out = static_cast<T*>(p.o) + (size_t)bh * p.nq * D;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = q0 + wr + g + 8 * h;
        const float lsum = quad_sum(l[h]);
        const float inv = 1.f / lsum;
        if (row < p.nq) {
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt)
                *reinterpret_cast<uint32_t*>(out + (size_t)row * D + nt * 8 + 2 * t) =
                    pack2<T>(o[4 * nt + 2 * h] * inv, o[4 * nt + 2 * h + 1] * inv);
            if (t == 0) p.lse[(size_t)bh * p.nq + row] = m[h] * p.scale + logf(lsum);
        }
    }
#endif  // __CUDA_ARCH_FEAT_SM90_ALL: elsewhere the kernel is empty (never launched: see the header)
}

template <typename T, typename Cfg>
cudaError_t launch(const FwdParams& p, cudaStream_t stream) {
    cudaError_t err = cudaFuncSetAttribute(fwd_v4_kernel<T, Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           Cfg::SMEM);
    if (err != cudaSuccess) return err;
    dim3 grid((p.nq + Cfg::BM - 1) / Cfg::BM, p.bh);
    fwd_v4_kernel<T, Cfg><<<grid, Cfg::THREADS, Cfg::SMEM, stream>>>(p);
    return cudaGetLastError();
}

template <typename T>
cudaError_t launch_d(const FwdParams& p, cudaStream_t stream) {
    // config 0: 128 x 128 tiles (D=64: 81 KB shared; D=128: 161 KB, one CTA per SM);
    // config 1: 128 x 64 tiles (49 KB; 97 KB), the faster at every shape on the H200 and
    // the default (DEFAULT_CONFIG in step07_cuda.py).
    if (p.d == 64) {
        switch (p.config) {
            case 0: return launch<T, V4Config<64, 128>>(p, stream);
            case 1: return launch<T, V4Config<64, 64>>(p, stream);
        }
    } else if (p.d == 128) {
        switch (p.config) {
            case 0: return launch<T, V4Config<128, 128>>(p, stream);
            case 1: return launch<T, V4Config<128, 64>>(p, stream);
        }
    }
    return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t fwd_v4(const FwdParams& p, cudaStream_t stream) {
    switch (p.dtype) {
        case DType::f16: return launch_d<__half>(p, stream);
        case DType::bf16: return launch_d<__nv_bfloat16>(p, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace step07
