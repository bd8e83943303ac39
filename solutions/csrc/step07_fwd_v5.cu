// Step 07, version 5 -- v4's wgmma forward, warp-specialized as FlashAttention-3's Hopper
// forward is: TMA loads by a producer warpgroup, two consumer warpgroups that only compute,
// setmaxnreg, and optionally ping-pong between the consumers. sm_90a only (H100/H200).
// H200, bf16, N 4k-16k (B = 16384/N, H = 2048/D), config 2 (128 x 128 tiles, 2 stages), against
// cuDNN's SDPA in the same run: D = 64 381-429 TFLOP/s (0.91-0.98x cuDNN), D = 128 472-537
// (0.84-0.95x); v4 in that run 0.86-0.90x and 0.68-0.76x (bench/experiments/cuda_v5.py,
// results/h200/step07_v5/).
//
// What changes from v4 (step07_fwd_v4.cu), and why (ncu on v4, results/h200/step07_v4/ncu/:
// the tensor pipe idles longer than cuDNN's, the barrier is v4's largest stall, its warps load
// with cp.async themselves and wait on every wgmma batch at once):
//  1. TMA loads. Q, K and V reach shared memory by cp.async.bulk.tensor (the Tensor Memory
//     Accelerator): one instruction a 64-column block of a tile, issued by ONE thread, the
//     addresses formed and the 128-byte swizzle applied by the hardware (CU_TENSOR_MAP_SWIZZLE_128B
//     writes exactly v4's layout: 16-byte chunk c of row r at c ^ (r % 8), 1024-byte atoms), rows
//     past a sequence's end zero-filled (the tensor maps are 3-D, (D, N, BH): a tile never runs
//     into the next head). The tensor maps are built on the host (cuTensorMapEncodeTiled, taken
//     from the driver through cudaGetDriverEntryPointByVersion: no -lcuda) and passed as
//     __grid_constant__ kernel parameters.
//  2. A producer warpgroup and two consumer warpgroups (384 threads, one CTA an SM). Warpgroup 0
//     is the producer: one elected thread loads Q once, then K and V tile by tile into a ring of
//     STAGES shared-memory stages. Each stage has four mbarriers: full_k / full_v (the producer
//     arms them with arrive.expect_tx; TMA's complete_tx completes them when the bytes land) and
//     empty_k / empty_v (the 256 consumer threads arrive once they are done with the tile; the
//     producer waits there before overwriting the stage). No __syncthreads in the main loop.
//  3. setmaxnreg: the producer drops to 24 registers a thread, the consumers rise to 240
//     (128 x 24 + 256 x 240 = 64512 of the SM's 65536), where v4's 256 threads had 255 at most.
//  4. Consumer warpgroups 1 and 2 own query rows 0-63 and 64-127 of the 128-row tile, as v4's
//     two warpgroups. Iteration j issues O += P_{j-1} V_{j-1} (P from registers) and then
//     S = Q K_j^T (both operands from shared memory) back to back, waits once for both, releases
//     K_j and V_{j-1}, masks, runs v4's base-2 online softmax and packs P. The last tile's P V
//     comes after the loop. (Leaving P V in flight across the loop's back edge instead makes
//     ptxas serialize every wgmma of the kernel: warning C7515.)
//  5. Configs (launch_d): 0 = 128 x 64 tiles, 2 stages; 1 = 128 x 64, 4 stages; 2 = 128 x 128,
//     2 stages (the default: the fastest at 9 of the 12 shapes measured, 1% behind at a tenth);
//     3 = config 0 with ping-pong; 4 = config 2 with ping-pong; 5 = three consumer warpgroups
//     (192 x 64 tiles, 160 registers each). Ping-pong is FlashAttention-3's inter-warpgroup
//     schedule: named barriers 1 and 2 give the two consumers turns; a consumer issues its batch
//     only in its turn and passes the turn on right after issuing, so the tensor cores run one
//     warpgroup's batch while the other does its softmax. On the H200 it paid only at D = 128
//     without a mask (config 4: 0.87-0.95x cuDNN there).
// Kept from v4: the layout, the descriptors and the wgmma wrappers (step07_wgmma.cuh), fp32
// accumulation, the scale folded into one FFMA before exp2, masks on boundary tiles only, causal
// tiles longest first, O and the LSE (natural log) stored from registers. Not done
// (FlashAttention-3 does): the softmax of tile j under the Q K^T of tile j+1 inside one
// warpgroup, a TMA store of O, persistent CTAs, cluster multicast of K and V.
//
// Only sm_90a has wgmma, TMA and setmaxnreg: on any other target the kernel's body compiles to
// nothing, and step07_cuda.py refuses version 5 on a GPU other than 9.0.
#include "step07_tma.cuh"     // the config, mbarrier / TMA / setmaxnreg, the ring, the producer, the epilogue

namespace step07 {
namespace v5 {
namespace {

using namespace ::step07::ws;

template <typename T, typename Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
fwd_v5_kernel(const FwdParams p, const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
              const __grid_constant__ CUtensorMap tm_v) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int D = Cfg::D, BN = Cfg::BN, BM = Cfg::BM, STAGES = Cfg::STAGES;
    extern __shared__ __align__(1024) unsigned char smem_v5[];
    __shared__ __align__(8) uint64_t bars[4 * STAGES + 1];   // the ring's barriers (step07_tma.cuh)
    const Ring<Cfg> r(smem_v5, bars);

    const int wg = threadIdx.x / 128;
    const int bh = blockIdx.y;
    const int m_block = p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;   // causal: longest first
    const int q0 = m_block * BM;
    const int n_end = p.causal ? min(p.nk, q0 + BM) : p.nk;
    const int n_tiles = (n_end + BN - 1) / BN;

    r.init();
    __syncthreads();   // the last block-wide barrier: from here the roles meet only on mbarriers

    if (wg == 0) {
        // ------------------------------------------------------------ producer (step07_tma.cuh)
        regs_dec<Cfg::PRODUCER_REGS>();
        if (threadIdx.x == 0) produce<Cfg>(r, &tm_q, &tm_k, &tm_v, q0, bh, n_tiles);
        return;
    }

    // ---------------------------------------------------------------- consumers
    regs_inc<Cfg::CONSUMER_REGS>();
    const int cw = wg - 1;                                   // consumer warpgroup: rows 64cw..64cw+63
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int wr = cw * 64 + warp * 16;                      // this warp's first row in the tile
    const float sl2 = p.scale * kLog2e;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
    const uint32_t Qwg = r.Qs + cw * 64 * 128;
    uint32_t pa[BN / 16][4];

    // Ping-pong: named barrier 1 + c is consumer c's turn to issue; consumer 1 lets consumer 0 go first.
    // Each turn is taken (bar.sync, 128 threads) once an iteration and once for the last P V, and
    // given (bar.arrive by the other's 128) as often: consumer 1 skips its last arrive to match.
    if constexpr (Cfg::PINGPONG) if (cw == 1) named_arrive(1, 256);
    mbar_wait(r.full_q(), 0);
    for (int j = 0; j < n_tiles; ++j) {
        const int n0 = j * BN;
        const int st = j % STAGES;
        const uint32_t ph = (j / STAGES) & 1;
        const uint32_t Kt = r.k_stage(st);

        // O += P_{j-1} V_{j-1} (P from the previous iteration's registers), then S = Q K^T_j
        // (v4's batch): two batches issued back to back, one wait for both. (Issuing P V at the
        // end of iteration j-1 instead, in flight across the loop's back edge, makes ptxas
        // serialize every wgmma: C7515, the back edge's copies of O define its registers.)
        if constexpr (Cfg::PINGPONG) named_sync(1 + cw, 256);
        if (j > 0) {
            const int pst = (j - 1) % STAGES;
            mbar_wait(r.full_v(pst), ((j - 1) / STAGES) & 1);
            const uint32_t Vp = r.v_stage(pst);
            fence_regs(o);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk)
                wgmma_rs<T, D>(o, pa[kk], make_desc(Vp + kk * 16 * 128, BN * 128, 1024), 1);
            wgmma_commit();
        }
        mbar_wait(r.full_k(st), ph);
        float s[BN / 2];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const uint32_t koff = (kk % 4) * 32;
            const uint64_t da = make_desc(Qwg + (kk / 4) * (BM * 128) + koff, 16, 1024);
            const uint64_t db = make_desc(Kt + (kk / 4) * (BN * 128) + koff, 16, 1024);
            wgmma_ss<T, BN>(s, da, db, kk > 0);
        }
        wgmma_commit();
        if constexpr (Cfg::PINGPONG) named_arrive(2 - cw, 256);    // the other consumer's turn
        wgmma_wait<0>();
        fence_regs(s);
        fence_regs(o);
        mbar_arrive(r.empty_k(st));                            // K_j may be overwritten
        if (j > 0) mbar_arrive(r.empty_v((j - 1) % STAGES));   // and V_{j-1}

        if (n0 + BN > p.nk || (p.causal && n0 + BN - 1 > q0 + cw * 64)) {
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) {
                const int key = n0 + (i / 4) * 8 + 2 * t + (i & 1);
                const int row = q0 + wr + g + 8 * ((i >> 1) & 1);
                if (key >= p.nk || (p.causal && key > row)) s[i] = -INFINITY;
            }
        }

        // Online softmax for this thread's two rows (v4's, unchanged).
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
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            pa[kk][0] = pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
            pa[kk][1] = pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
            pa[kk][2] = pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
            pa[kk][3] = pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
        }

    }
    // The last tile's O += P V.
    if (n_tiles > 0) {
        if constexpr (Cfg::PINGPONG) named_sync(1 + cw, 256);
        const int pst = (n_tiles - 1) % STAGES;
        mbar_wait(r.full_v(pst), ((n_tiles - 1) / STAGES) & 1);
        const uint32_t Vp = r.v_stage(pst);
        fence_regs(o);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
            wgmma_rs<T, D>(o, pa[kk], make_desc(Vp + kk * 16 * 128, BN * 128, 1024), 1);
        wgmma_commit();
        if constexpr (Cfg::PINGPONG) if (cw == 0) named_arrive(2, 256);
    }
    wgmma_wait<0>();
    fence_regs(o);

    store_o_lse<T, D>(p, o, m, l, bh, q0 + wr + g, t);   // the epilogue (v4's; step07_tma.cuh)
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

template <typename T, typename Cfg>
cudaError_t launch(const FwdParams& p, cudaStream_t stream) {
    return launch_ws<T, Cfg>(fwd_v5_kernel<T, Cfg>, p, stream);   // tensor maps and launch: step07_tma.cuh
}

template <typename T>
cudaError_t launch_d(const FwdParams& p, cudaStream_t stream) {
    // config 0: 128 x 64 tiles, 2 stages; 1: 128 x 64, 4 stages; 2: 128 x 128, 2 stages;
    // 3: as 0 with ping-pong; 4: as 2 with ping-pong; 5: 3 consumer warpgroups, 192 x 64 tiles, 2 stages.
    if (p.d == 64) {
        switch (p.config) {
            case 0: return launch<T, V5Config<64, 64, 2>>(p, stream);
            case 1: return launch<T, V5Config<64, 64, 4>>(p, stream);
            case 2: return launch<T, V5Config<64, 128, 2>>(p, stream);
            case 3: return launch<T, V5Config<64, 64, 2, 2, true>>(p, stream);
            case 4: return launch<T, V5Config<64, 128, 2, 2, true>>(p, stream);
            case 5: return launch<T, V5Config<64, 64, 2, 3>>(p, stream);
        }
    } else if (p.d == 128) {
        switch (p.config) {
            case 0: return launch<T, V5Config<128, 64, 2>>(p, stream);
            case 1: return launch<T, V5Config<128, 64, 4>>(p, stream);
            case 2: return launch<T, V5Config<128, 128, 2>>(p, stream);
            case 3: return launch<T, V5Config<128, 64, 2, 2, true>>(p, stream);
            case 4: return launch<T, V5Config<128, 128, 2, 2, true>>(p, stream);
            case 5: return launch<T, V5Config<128, 64, 2, 3>>(p, stream);
        }
    }
    return cudaErrorInvalidValue;
}

}  // namespace
}  // namespace v5

cudaError_t fwd_v5(const FwdParams& p, cudaStream_t stream) {
    switch (p.dtype) {
        case DType::f16: return v5::launch_d<__half>(p, stream);
        case DType::bf16: return v5::launch_d<__nv_bfloat16>(p, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace step07
