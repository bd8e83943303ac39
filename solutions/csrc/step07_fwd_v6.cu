// Step 07, version 6 -- v5 with FlashAttention-3's intra-warpgroup overlap (arXiv:2407.08608,
// section 3.2): inside each consumer warpgroup, the exponentials of tile j run while the tensor
// cores still work on P_{j-1} V_{j-1}. sm_90a only (H100/H200).
// H200, bf16, N 4k-16k (B = 16384/N, H = 2048/D), config 2 (128 x 128 tiles, 2 stages), against
// cuDNN's SDPA in the same run: D = 64 395-452 TFLOP/s (0.94-1.00x cuDNN), D = 128 507-605
// (0.91-1.06x: faster than cuDNN at causal N = 16384); v5's config 2 in that run 0.90-0.95x and
// 0.85-0.96x, so v6 is 1.03-1.12x v5 (bench/experiments/cuda_v6.py, results/h200/step07_v6/).
//
// What changes from v5 (step07_fwd_v5.cu): the consumers' loop, nothing else. v5 issues
// P_{j-1} V_{j-1} and S_j = Q K_j^T, waits for BOTH (wgmma_wait<0>), then runs the softmax of
// S_j: while a warpgroup computes exponentials its tensor cores only work if the other warpgroup
// has a batch queued. v6, for tile j >= 1:
//     issue S_j = Q K_j^T, then O += P_{j-1} V_{j-1}     (two commit groups, in that order)
//     wgmma_wait<1>()      S_j has retired; P_{j-1} V_{j-1} is still in flight
//     mask, row max, exp2, row sums of S_j               <- on the SFU/FMA pipes, under P V
//     wgmma_wait<0>()      P_{j-1} V_{j-1} retires
//     O *= alpha, pack P_j (these touch O and P: only after the wait)
// wgmma retires its commit groups in order, which is why S_j is issued first: wait<1> then means
// "everything but the newest group", and the newest is P V. Nothing is in flight at the loop's
// back edge (an accumulator in flight across it makes ptxas copy it there and serialize every
// wgmma of the kernel: warning C7514/C7515), and one S tile is live, so v6 needs v5's registers.
// Two details the SASS showed (bench/experiments/cuda_v6.py --compile-report):
//   - ptxas hoists a wgmma wait to the top of its basic block, above every MUFU.EX2, unless
//     something ends the block after the exponentials: v6 ends them with the wait on V_j's
//     mbarrier (needed for the next P V anyway; its try-wait loop is a block boundary);
//   - fence_regs (an empty asm that "reads and writes" registers) pins each accumulator's and
//     P's uses to after the wait that retires them, and the exponentials to before the next wait.
// Configs (launch_d; v5's numbers for the same tiles): 0 = 128 x 64 tiles, 2 = 128 x 128 (the
// default), both 2 stages, two consumer warpgroups, no ping-pong. Config 0 ran 0.76-0.90x cuDNN,
// behind v5's config 2: with 64-key tiles the P V under which the exponentials hide is half as
// long. Measured and left out (the experiment, commit 29222e3): the "S-next" order, the
// exponentials of tile j under Q K_{j+1}^T (two S tiles live: 0.51-0.78x cuDNN, and at D = 128
// with 128 x 128 tiles it spills and ptxas serializes every wgmma).
// Kept from v5: the producer warpgroup and its TMA loads into the mbarrier ring, setmaxnreg
// 24/240, the layout, descriptors and wgmma wrappers, masks on boundary tiles only, causal tiles
// longest first, the epilogue (step07_tma.cuh, step07_wgmma.cuh). Not done (FlashAttention-3
// does): a TMA store of O, persistent CTAs, cluster multicast of K and V, FP8.
//
// Only sm_90a has wgmma, TMA and setmaxnreg: on any other target the kernel's body compiles to
// nothing, and step07_cuda.py refuses version 6 on a GPU other than 9.0.
#include "step07_tma.cuh"     // v5's config, mbarrier / TMA / setmaxnreg, the ring, the producer, the epilogue

namespace step07 {
namespace v6 {
namespace {

using namespace ::step07::ws;

template <typename T, typename Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
fwd_v6_kernel(const FwdParams p, const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
              const __grid_constant__ CUtensorMap tm_v) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int D = Cfg::D, BN = Cfg::BN, BM = Cfg::BM, STAGES = Cfg::STAGES;
    extern __shared__ __align__(1024) unsigned char smem_v6[];
    __shared__ __align__(8) uint64_t bars[4 * STAGES + 1];   // the ring's barriers (step07_tma.cuh)
    const Ring<Cfg> r(smem_v6, bars);

    const int wg = threadIdx.x / 128;
    const int bh = blockIdx.y;
    const int m_block = p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;   // causal: longest first
    const int q0 = m_block * BM;
    const int n_end = p.causal ? min(p.nk, q0 + BM) : p.nk;
    const int n_tiles = (n_end + BN - 1) / BN;

    r.init();
    __syncthreads();

    if (wg == 0) {
        // ------------------------------------------------------------ producer (v5's, step07_tma.cuh)
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
    float s[BN / 2];

    // S = Q K^T of the tile in stage st, issued and committed (no wait).
    auto issue_s = [&](int st) {
        const uint32_t Kt = r.k_stage(st);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const uint32_t koff = (kk % 4) * 32;
            const uint64_t da = make_desc(Qwg + (kk / 4) * (BM * 128) + koff, 16, 1024);
            const uint64_t db = make_desc(Kt + (kk / 4) * (BN * 128) + koff, 16, 1024);
            wgmma_ss<T, BN>(s, da, db, kk > 0);
        }
        wgmma_commit();
    };
    auto fence_pa = [&]() {
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
            for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(pa[kk][i]) :: "memory");
    };
    // O += P_j V_j (P_j in pa), issued and committed (no wait).
    auto issue_pv = [&](int j) {
        const int st = j % STAGES;
        mbar_wait(r.full_v(st), (j / STAGES) & 1);
        const uint32_t Vt = r.v_stage(st);
        fence_regs(o);
        fence_pa();
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
            wgmma_rs<T, D>(o, pa[kk], make_desc(Vt + kk * 16 * 128, BN * 128, 1024), 1);
        wgmma_commit();
    };
    // After the wait that retires P_j V_j: O and P may be touched again, V_j's stage may be reloaded.
    auto retired_pv = [&](int j) {
        fence_regs(o);
        fence_pa();
        mbar_arrive(r.empty_v(j % STAGES));
    };
    // The part of tile j's softmax that touches neither O nor P -- the boundary mask, the row max,
    // exp2 in place, the row sums -- so it can run under P_{j-1} V_{j-1}; alpha is O's rescale.
    auto softmax_exp = [&](const int j, float (&alpha)[2]) {
        const int n0 = j * BN;
        if (n0 + BN > p.nk || (p.causal && n0 + BN - 1 > q0 + cw * 64)) {
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) {
                const int key = n0 + (i / 4) * 8 + 2 * t + (i & 1);
                const int row = q0 + wr + g + 8 * ((i >> 1) & 1);
                if (key >= p.nk || (p.causal && key > row)) s[i] = -INFINITY;
            }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = m[h];
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt) mx = fmaxf(mx, fmaxf(s[4 * nt + 2 * h], s[4 * nt + 2 * h + 1]));
            mx = quad_max(mx);
            const float msub = (mx == -INFINITY) ? 0.f : mx * sl2;
            alpha[h] = exp2f(m[h] * sl2 - msub);
            m[h] = mx;
            float rs = 0.f;
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt) {
                s[4 * nt + 2 * h] = exp2f(fmaf(s[4 * nt + 2 * h], sl2, -msub));
                s[4 * nt + 2 * h + 1] = exp2f(fmaf(s[4 * nt + 2 * h + 1], sl2, -msub));
                rs += s[4 * nt + 2 * h] + s[4 * nt + 2 * h + 1];
            }
            l[h] = l[h] * alpha[h] + rs;
        }
        fence_regs(s);   // the exponentials are computed here, before the wait that follows
        // V_j's mbarrier (P_j V_j needs it next): its try-wait loop also ends ptxas's basic block
        // here. Without it ptxas hoists the wgmma wait that follows to the top of the block, above
        // every MUFU.EX2, and nothing overlaps.
        mbar_wait(r.full_v(j % STAGES), (j / STAGES) & 1);
    };
    // The rest of it, once the last P V has retired: O *= alpha, P_j packed into pa.
    auto rescale_pack = [&](const float (&alpha)[2]) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                o[4 * nt + 2 * h] *= alpha[h];
                o[4 * nt + 2 * h + 1] *= alpha[h];
            }
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            pa[kk][0] = pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
            pa[kk][1] = pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
            pa[kk][2] = pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
            pa[kk][3] = pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
        }
    };

    mbar_wait(r.full_q(), 0);
    if (n_tiles > 0) {                         // tile 0: nothing to overlap it with
        mbar_wait(r.full_k(0), 0);
        issue_s(0);
        wgmma_wait<0>();
        fence_regs(s);
        mbar_arrive(r.empty_k(0));
        float alpha[2];
        softmax_exp(0, alpha);
        rescale_pack(alpha);
    }
    for (int j = 1; j < n_tiles; ++j) {
        const int st = j % STAGES;
        mbar_wait(r.full_k(st), (j / STAGES) & 1);
        float alpha[2];
        // >>> STUDENT: issue S_j (issue_s) and then O += P_{j-1} V_{j-1} (issue_pv); wait for S_j alone (wgmma_wait<1>), fence s, release K_j (empty_k); softmax_exp(j, alpha) while P V runs; then wait<0>, retired_pv(j - 1), rescale_pack(alpha)
        issue_s(st);                           // S_j = Q K_j^T
        issue_pv(j - 1);                       // O += P_{j-1} V_{j-1}
        wgmma_wait<1>();                       // S_j retires; P_{j-1} V_{j-1} stays in flight
        fence_regs(s);
        mbar_arrive(r.empty_k(st));            // K_j may be overwritten
        softmax_exp(j, alpha);                 // the exponentials, under P_{j-1} V_{j-1}
        wgmma_wait<0>();
        retired_pv(j - 1);
        rescale_pack(alpha);
        // <<< STUDENT
    }
    if (n_tiles > 0) issue_pv(n_tiles - 1);   // the last tile's O += P V
    wgmma_wait<0>();
    fence_regs(o);

    store_o_lse<T, D>(p, o, m, l, bh, q0 + wr + g, t);   // the epilogue (v4's; step07_tma.cuh)
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

template <typename T>
cudaError_t launch_d(const FwdParams& p, cudaStream_t stream) {
    // config 0: 128 x 64 tiles; 2: 128 x 128 (v5's numbers for the same tiles); both 2 stages.
    if (p.d == 64) {
        switch (p.config) {
            case 0: return launch_ws<T, V5Config<64, 64, 2>>(fwd_v6_kernel<T, V5Config<64, 64, 2>>, p, stream);
            case 2: return launch_ws<T, V5Config<64, 128, 2>>(fwd_v6_kernel<T, V5Config<64, 128, 2>>, p, stream);
        }
    } else if (p.d == 128) {
        switch (p.config) {
            case 0: return launch_ws<T, V5Config<128, 64, 2>>(fwd_v6_kernel<T, V5Config<128, 64, 2>>, p, stream);
            case 2: return launch_ws<T, V5Config<128, 128, 2>>(fwd_v6_kernel<T, V5Config<128, 128, 2>>, p, stream);
        }
    }
    return cudaErrorInvalidValue;
}

}  // namespace
}  // namespace v6

cudaError_t fwd_v6(const FwdParams& p, cudaStream_t stream) {
    switch (p.dtype) {
        case DType::f16: return v6::launch_d<__half>(p, stream);
        case DType::bf16: return v6::launch_d<__nv_bfloat16>(p, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace step07
