// Step 07, version 2 -- tensor cores: mma.sync in fp16/bf16, fp32 accumulation.
// Measured (H200, bf16, D=128, N=16384, B=1, H=16): 55 TFLOP/s, x0.16 of SDPA-FLASH;
// 6x v1 and flat in N. Not profiled; by reading the code, the suspects are the
// 8-way bank conflicts of its fragment loads and its copies that stall the CTA.
//
// What changes from v1: the two matrix products of each tile, S = Q K^T and
// O += P V, go to the tensor cores as mma.sync.m16n8k16 (a 16x16 times 16x8
// product per warp per instruction, 4096 FLOPs) instead of one FFMA per thread
// per multiply-add. The work is now split by warps, not threads: a CTA of 4
// warps owns BM = 64 query rows, 16 per warp, and walks the keys in tiles of
// BN = 64. Each warp's piece of S (16 x 64) and of O (16 x D) lives in
// registers, spread over its 32 threads in the mma "fragment" layout (see
// mma_16816 in step07_common.cuh): thread (g = lane/4, t = lane%4) holds rows
// g and g+8, columns 2t and 2t+1 of every 8-column slice. So the online
// softmax is per thread over its columns, plus a max over the 4 threads (the
// "quad") that share a row, through warp shuffles.
//
// The trick that keeps P out of shared memory: the accumulator layout of
// S = Q K^T (16 x 8 slices) is exactly the A-operand layout of the next mma
// (16 x 16 slices), so P is converted to fp16/bf16 in registers and fed
// straight back to the tensor cores.
//
// Deliberately left simple, for v3 to fix: tiles are copied with ordinary
// loads (registers in between, the CTA waits for each copy before computing);
// fragments are read from shared memory with 32-bit loads, and V's with 16-bit
// loads since its fragment wants two rows of one column; rows are not padded
// or swizzled, so the 8 rows a warp reads at once all start in the same bank
// (an 8-way conflict on every fragment load at D=64 and D=128).
#include "step07_common.cuh"

namespace step07 {
namespace {

constexpr int V2_BM = 64;      // query rows per CTA (4 warps x 16)
constexpr int V2_BN = 64;      // keys per tile
constexpr int V2_WARPS = 4;

// Copy rows [r0, r0 + ROWS) of a (n, D) matrix into a ROWS x D shared tile,
// 16 bytes per thread per step; rows past n become zeros.
template <typename T, int ROWS, int D>
__device__ __forceinline__ void load_tile_sync(T* dst, const T* src, int r0, int n) {
    constexpr int CHUNKS = ROWS * D / 8;            // 8 16-bit values per 16 bytes
    for (int idx = threadIdx.x; idx < CHUNKS; idx += V2_WARPS * 32) {
        const int r = idx / (D / 8), c = (idx % (D / 8)) * 8;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (r0 + r < n) val = *reinterpret_cast<const uint4*>(src + (size_t)(r0 + r) * D + c);
        *reinterpret_cast<uint4*>(dst + r * D + c) = val;
    }
}

template <typename T, int D>
__global__ void __launch_bounds__(V2_WARPS * 32) fwd_v2_kernel(FwdParams p) {
    extern __shared__ __align__(16) unsigned char smem_v2[];
    T* Qs = reinterpret_cast<T*>(smem_v2);          // [BM][D]
    T* Ks = Qs + V2_BM * D;                         // [BN][D]
    T* Vs = Ks + V2_BN * D;                         // [BN][D]
    const uint16_t* Ks16 = reinterpret_cast<const uint16_t*>(Ks);
    const uint16_t* Vs16 = reinterpret_cast<const uint16_t*>(Vs);

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;           // fragment row / column group
    const int bh = blockIdx.y;
    const int q0 = blockIdx.x * V2_BM;
    const int wr = warp * 16;                       // this warp's first row in the tile
    const T* q = static_cast<const T*>(p.q) + (size_t)bh * p.nq * D;
    const T* k = static_cast<const T*>(p.k) + (size_t)bh * p.nk * D;
    const T* v = static_cast<const T*>(p.v) + (size_t)bh * p.nk * D;

    load_tile_sync<T, V2_BM, D>(Qs, q, q0, p.nq);
    __syncthreads();
    // This warp's Q rows as A fragments, kept in registers for the whole loop:
    // D/16 slices of 16 x 16, 4 registers each.
    uint32_t qa[D / 16][4];
    const uint32_t* Qs32 = reinterpret_cast<const uint32_t*>(Qs);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const int c = kk * 16 + 2 * t;              // column of the pair (c, c+1)
        qa[kk][0] = Qs32[((wr + g) * D + c) / 2];
        qa[kk][1] = Qs32[((wr + g + 8) * D + c) / 2];
        qa[kk][2] = Qs32[((wr + g) * D + c + 8) / 2];
        qa[kk][3] = Qs32[((wr + g + 8) * D + c + 8) / 2];
    }

    const float sl2 = p.scale * kLog2e;             // softmax in base 2: exp(x) = exp2(x log2 e)
    float m[2] = {-INFINITY, -INFINITY};            // running max of raw scores, rows g and g+8
    float l[2] = {0.f, 0.f};                        // running sums (this thread's columns only)
    float o[D / 8][4];                              // 16 x D output accumulator, fragment layout
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[nt][e] = 0.f;

    const int n_end = p.causal ? min(p.nk, q0 + V2_BM) : p.nk;
    for (int n0 = 0; n0 < n_end; n0 += V2_BN) {
        __syncthreads();                            // all warps are done with the last K/V tile
        load_tile_sync<T, V2_BN, D>(Ks, k, n0, p.nk);
        load_tile_sync<T, V2_BN, D>(Vs, v, n0, p.nk);
        __syncthreads();

        // S = Q K^T for this warp's 16 rows and the tile's 64 keys. The B operand
        // is K^T: B[kdim][key] = K[key][kdim], two consecutive kdim = one 32-bit load.
        float s[V2_BN / 8][4];
#pragma unroll
        for (int nt = 0; nt < V2_BN / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                // >>> STUDENT: load the two B registers of K^T for keys nt*8.., dims kk*16.. and issue the mma
                const uint32_t* row = reinterpret_cast<const uint32_t*>(Ks16 + (nt * 8 + g) * D + kk * 16 + 2 * t);
                const uint32_t b[2] = {row[0], row[4]};   // dims 2t..2t+1 and 2t+8..2t+9
                mma_16816<T>(s[nt], qa[kk], b);
                // <<< STUDENT
            }
        }

        // Mask: keys past Nk and, if causal, keys after the query. Only tiles that
        // reach past Nk or past the CTA's first row can hold masked entries.
        if (n0 + V2_BN > p.nk || (p.causal && n0 + V2_BN - 1 > q0)) {
#pragma unroll
            for (int nt = 0; nt < V2_BN / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = n0 + nt * 8 + 2 * t + (e & 1);
                    const int row = q0 + wr + g + 8 * (e >> 1);
                    if (key >= p.nk || (p.causal && key > row)) s[nt][e] = -INFINITY;
                }
        }

        // Online softmax, per row h (0: row g, 1: row g+8).
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = m[h];
#pragma unroll
            for (int nt = 0; nt < V2_BN / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
            mx = quad_max(mx);                       // the 4 threads of a quad share the row
            // A row with only masked scores so far keeps mx = -inf: subtract 0
            // instead, so exp2(-inf - 0) = 0 rather than exp2(-inf + inf) = NaN.
            const float msub = (mx == -INFINITY) ? 0.f : mx * sl2;
            const float alpha = exp2f(m[h] * sl2 - msub);
            m[h] = mx;
            float rs = 0.f;
#pragma unroll
            for (int nt = 0; nt < V2_BN / 8; ++nt)
#pragma unroll
                for (int e = 2 * h; e < 2 * h + 2; ++e) {
                    s[nt][e] = exp2f(fmaf(s[nt][e], sl2, -msub));   // s now holds P
                    rs += s[nt][e];
                }
            l[h] = l[h] * alpha + rs;
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                o[nt][2 * h] *= alpha;
                o[nt][2 * h + 1] *= alpha;
            }
        }

        // O += P V. P's accumulator slices (nt = 2kk, 2kk+1) form the A fragment of
        // keys kk*16..kk*16+15. B[key][dim] = V[key][dim]: the two keys of a register
        // sit D elements apart, so each register takes two 16-bit loads.
#pragma unroll
        for (int kk = 0; kk < V2_BN / 16; ++kk) {
            const uint32_t a[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                                   pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                   pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                const uint16_t* col = Vs16 + (kk * 16 + 2 * t) * D + nt * 8 + g;
                const uint32_t b[2] = {pack2_bits(col[0], col[D]), pack2_bits(col[8 * D], col[9 * D])};
                mma_16816<T>(o[nt], a, b);
            }
        }
    }

    // Epilogue: finish the row sums across the quad, normalize, store O and LSE.
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
                    pack2<T>(o[nt][2 * h] * inv, o[nt][2 * h + 1] * inv);
            if (t == 0) p.lse[(size_t)bh * p.nq + row] = m[h] * p.scale + logf(lsum);
        }
    }
}

template <typename T, int D>
cudaError_t launch(const FwdParams& p, cudaStream_t stream) {
    const int smem = (int)sizeof(T) * (V2_BM + 2 * V2_BN) * D;   // 48 KB at D=128
    cudaError_t err = cudaFuncSetAttribute(fwd_v2_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    dim3 grid((p.nq + V2_BM - 1) / V2_BM, p.bh);
    fwd_v2_kernel<T, D><<<grid, V2_WARPS * 32, smem, stream>>>(p);
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

cudaError_t fwd_v2(const FwdParams& p, cudaStream_t stream) {
    switch (p.dtype) {
        case DType::f16: return launch_d<__half>(p, stream);
        case DType::bf16: return launch_d<__nv_bfloat16>(p, stream);
        default: return cudaErrorInvalidValue;   // tensor cores here take 16-bit inputs only
    }
}

}  // namespace step07
