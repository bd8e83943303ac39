// Step 07, forwards v5 and v6 -- the warp-specialized machinery they share (sm_90a only):
// the tile configuration, the mbarrier / TMA / setmaxnreg / named-barrier instructions, the
// shared-memory ring of K and V stages with its barriers, the producer warpgroup's loop, the
// epilogue, and on the host the TMA tensor maps and the launch. What each piece is for:
// step07_fwd_v5.cu's header. v5 and v6 differ only in their consumers' loop.
#pragma once
#include <cuda.h>            // CUtensorMap and its enums (types only: the driver is reached at run time)
#include <cudaTypedefs.h>    // PFN_cuTensorMapEncodeTiled

#include <type_traits>

#include "step07_common.cuh"
#include "step07_wgmma.cuh"   // v4's layout, make_desc and the wgmma wrappers

namespace step07 {
namespace ws {
namespace {

template <int D_, int BN_, int STAGES_, int CONSUMERS_ = 2, bool PINGPONG_ = false>
struct V5Config {
    static constexpr int D = D_;
    static constexpr int BN = BN_;
    static constexpr int STAGES = STAGES_;
    static constexpr int CONSUMERS = CONSUMERS_;             // consumer warpgroups, 64 rows each
    // Ping-pong: the two consumer warpgroups take turns issuing their wgmma batch (named barriers),
    // so one's softmax runs while the other's batch holds the tensor cores (FlashAttention-3's schedule).
    static constexpr bool PINGPONG = PINGPONG_;
    static_assert(!PINGPONG || CONSUMERS == 2, "ping-pong pairs two consumer warpgroups");
    static constexpr int THREADS = (CONSUMERS + 1) * 128;    // + the producer warpgroup
    static constexpr int BM = CONSUMERS * 64;
    static constexpr int Q_BYTES = BM * D * 2;
    static constexpr int KV_BYTES = BN * D * 2;              // one stage of K (or of V)
    // Q + STAGES stages of K and of V, + 1024 bytes to align the base to a swizzle atom.
    static constexpr int SMEM = Q_BYTES + 2 * STAGES * KV_BYTES + 1024;
    // 128 x 24 + 256 x 240 = 64512 (2 consumers); 128 x 24 + 384 x 160 = 64512 (3).
    static constexpr int PRODUCER_REGS = 24;
    static constexpr int CONSUMER_REGS = CONSUMERS == 2 ? 240 : 160;
    static_assert(128 * PRODUCER_REGS + CONSUMERS * 128 * CONSUMER_REGS <= 65536, "register file");
    static_assert(SMEM <= 227 * 1024, "shared memory");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// ------------------------------------------------------------------ mbarrier
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
// The producer: one arrival, and `bytes` more transaction bytes this phase waits for.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
// Spin until the phase of parity `parity` has completed (a fresh barrier is in phase 0, so
// waiting for parity 1 returns at once: how the producer's first pass over the ring goes through).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}

// ------------------------------------------------------------------ TMA
// One box of a 3-D tensor map (coordinates innermost first: column, row, head) into shared
// memory at dst; the bytes are counted on mbarrier `bar` (complete_tx).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                            uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
        :: "r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
}
__device__ __forceinline__ void tma_prefetch_desc(const CUtensorMap* map) {
    asm volatile("prefetch.tensormap [%0];\n" :: "l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ------------------------------------------------------------------ setmaxnreg
template <int R>
__device__ __forceinline__ void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(R)); }
template <int R>
__device__ __forceinline__ void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(R)); }

// ------------------------------------------------------------------ named barriers (ping-pong)
// Barrier `id` completes when `n` threads have reached it: bar.sync waits there, bar.arrive does not.
__device__ __forceinline__ void named_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void named_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(n) : "memory"); }

// ------------------------------------------------------------------ the ring
// Shared memory: Q [D/64][BM][64], then STAGES stages of K and of V, each [D/64][BN][64], the
// base aligned to a 1024-byte swizzle atom. Barriers: full_k, full_v, empty_k, empty_v for each
// stage, then full_q (the kernel declares `uint64_t bars[4 * STAGES + 1]`).
template <typename Cfg>
struct Ring {
    uint32_t Qs, Ks, Vs, bar0;
    __device__ __forceinline__ Ring(const unsigned char* smem, const uint64_t* bars)
        : Qs((smem_u32(smem) + 1023u) & ~1023u), Ks(Qs + Cfg::Q_BYTES), Vs(Ks + Cfg::STAGES * Cfg::KV_BYTES),
          bar0(smem_u32(bars)) {}
    __device__ __forceinline__ uint32_t k_stage(int s) const { return Ks + s * Cfg::KV_BYTES; }
    __device__ __forceinline__ uint32_t v_stage(int s) const { return Vs + s * Cfg::KV_BYTES; }
    __device__ __forceinline__ uint32_t full_k(int s) const { return bar0 + 8u * s; }
    __device__ __forceinline__ uint32_t full_v(int s) const { return bar0 + 8u * (Cfg::STAGES + s); }
    __device__ __forceinline__ uint32_t empty_k(int s) const { return bar0 + 8u * (2 * Cfg::STAGES + s); }
    __device__ __forceinline__ uint32_t empty_v(int s) const { return bar0 + 8u * (3 * Cfg::STAGES + s); }
    __device__ __forceinline__ uint32_t full_q() const { return bar0 + 8u * (4 * Cfg::STAGES); }
    // Thread 0 initializes every barrier; the caller's __syncthreads publishes them.
    __device__ __forceinline__ void init() const {
        if (threadIdx.x == 0) {
            for (int s = 0; s < Cfg::STAGES; ++s) {
                mbar_init(full_k(s), 1);
                mbar_init(full_v(s), 1);
                mbar_init(empty_k(s), Cfg::CONSUMERS * 128);
                mbar_init(empty_v(s), Cfg::CONSUMERS * 128);
            }
            mbar_init(full_q(), 1);
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");   // visible to the async proxy
        }
    }
};

// ------------------------------------------------------------------ the producer
// Run by one thread of warpgroup 0: Q once, then K_j and V_j tile by tile into the ring, each
// stage reused once the consumers have released it.
template <typename Cfg>
__device__ __forceinline__ void produce(const Ring<Cfg>& r, const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                                        const CUtensorMap* tm_v, int q0, int bh, int n_tiles) {
    constexpr int D = Cfg::D, BN = Cfg::BN, BM = Cfg::BM, STAGES = Cfg::STAGES;
    tma_prefetch_desc(tm_q);
    tma_prefetch_desc(tm_k);
    tma_prefetch_desc(tm_v);
    mbar_expect_tx(r.full_q(), Cfg::Q_BYTES);
#pragma unroll
    for (int cb = 0; cb < D / 64; ++cb) tma_load_3d(r.Qs + cb * (BM * 128), tm_q, cb * 64, q0, bh, r.full_q());
    for (int j = 0; j < n_tiles; ++j) {
        const int st = j % STAGES;                // the ring's stage of tile j
        const uint32_t ph = (j / STAGES) & 1;     // and how many times round the ring, mod 2
        // >>> STUDENT: wait until the consumers have released stage st (empty_k, phase ph ^ 1), arm full_k(st) for KV_BYTES, then TMA-load K_j's D/64 column blocks into it; the same for V
        mbar_wait(r.empty_k(st), ph ^ 1);         // the consumers are done with K_{j - STAGES}
        mbar_expect_tx(r.full_k(st), Cfg::KV_BYTES);
#pragma unroll
        for (int cb = 0; cb < D / 64; ++cb)
            tma_load_3d(r.k_stage(st) + cb * (BN * 128), tm_k, cb * 64, j * BN, bh, r.full_k(st));
        mbar_wait(r.empty_v(st), ph ^ 1);
        mbar_expect_tx(r.full_v(st), Cfg::KV_BYTES);
#pragma unroll
        for (int cb = 0; cb < D / 64; ++cb)
            tma_load_3d(r.v_stage(st) + cb * (BN * 128), tm_v, cb * 64, j * BN, bh, r.full_v(st));
        // <<< STUDENT
    }
}

// ------------------------------------------------------------------ the epilogue (v4's)
// Row sums across the quad, normalize, store this thread's two rows of O (row0 and row0 + 8) and
// their LSE (natural log).
template <typename T, int D>
__device__ __forceinline__ void store_o_lse(const FwdParams& p, const float (&o)[D / 2], const float (&m)[2],
                                            const float (&l)[2], int bh, int row0, int t) {
    T* out = static_cast<T*>(p.o) + (size_t)bh * p.nq * D;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row0 + 8 * h;
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
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// ---------------------------------------------------------------- host: tensor maps and the launch
inline PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    if (fn == nullptr) {
        void* ptr = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &q) ==
                cudaSuccess && q == cudaDriverEntryPointSuccess)
            fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
    }
    return fn;
}

// A (BH, n, D) tensor of 16-bit values as a 3-D TMA tensor map (D, n, BH), boxes of
// 64 columns x `rows` rows x 1 head, 128-byte swizzle, out-of-range rows read as zeros.
template <typename T>
cudaError_t make_map(CUtensorMap* map, const void* base, int n, int bh, int d, int rows) {
    auto fn = encode_fn();
    if (fn == nullptr) return cudaErrorNotSupported;
    const cuuint64_t dims[3] = {(cuuint64_t)d, (cuuint64_t)n, (cuuint64_t)bh};
    const cuuint64_t strides[2] = {(cuuint64_t)d * 2, (cuuint64_t)n * d * 2};   // bytes, dims 1 and 2
    const cuuint32_t box[3] = {64, (cuuint32_t)rows, 1};
    const cuuint32_t estr[3] = {1, 1, 1};
    const CUtensorMapDataType ty = std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                                  : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    const CUresult r = fn(map, ty, 3, const_cast<void*>(base), dims, strides, box, estr,
                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

using WsKernel = void (*)(const FwdParams, const CUtensorMap, const CUtensorMap, const CUtensorMap);

// Q's, K's and V's tensor maps, then `kernel` on a grid of (query tiles, BH), one CTA of Cfg::THREADS.
template <typename T, typename Cfg>
cudaError_t launch_ws(WsKernel kernel, const FwdParams& p, cudaStream_t stream) {
    CUtensorMap tq, tk, tv;
    cudaError_t err;
    if ((err = make_map<T>(&tq, p.q, p.nq, p.bh, Cfg::D, Cfg::BM)) != cudaSuccess) return err;
    if ((err = make_map<T>(&tk, p.k, p.nk, p.bh, Cfg::D, Cfg::BN)) != cudaSuccess) return err;
    if ((err = make_map<T>(&tv, p.v, p.nk, p.bh, Cfg::D, Cfg::BN)) != cudaSuccess) return err;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM);
    if (err != cudaSuccess) return err;
    dim3 grid((p.nq + Cfg::BM - 1) / Cfg::BM, p.bh);
    kernel<<<grid, Cfg::THREADS, Cfg::SMEM, stream>>>(p, tq, tk, tv);
    return cudaGetLastError();
}

}  // namespace
}  // namespace ws
}  // namespace step07
