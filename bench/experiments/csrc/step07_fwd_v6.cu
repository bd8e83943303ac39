// Step 07 experiment, forward v6 -- v5 (solutions/csrc/step07_fwd_v5.cu) plus FlashAttention-3's
// intra-warpgroup overlap (arXiv:2407.08608, section 3.2): inside one consumer warpgroup, the
// exponentials of tile j run while a product is still in flight on the tensor cores (P_{j-1} V_{j-1}
// in FlashAttention-3's order, Q K_{j+1}^T in the "S-next" order).
// sm_90a only. An experiment (bench/experiments/cuda_v6.py), not course code.
//
// Question. v5 config 2 (128 x 128 tiles, 2 stages) reaches 0.88-0.98x cuDNN at D = 64 and
// 0.86-0.91x at D = 128 on the H200 (results/h200/step07_v5/, results/h200/grid_1201/). Each v5
// consumer iteration issues P_{j-1} V_{j-1} and Q K_j^T, waits for both (wgmma_wait<0>), then does
// the softmax while the tensor cores idle unless the other warpgroup has work queued. Does keeping
// a product in flight across the softmax (one warpgroup's tensor-core work and exponentials
// overlapped, no reliance on the other warpgroup) close the rest of the gap?
//
// Design (what changes from v5; the producer warpgroup, the TMA tensor maps, the mbarrier ring,
// setmaxnreg 24/240, the layout, masks on boundary tiles only, causal longest-first, the epilogue
// are v5's, and so is every helper: this file #includes step07_fwd_v5.cu and uses v5's
// mbarrier / TMA / setmaxnreg functions, V5Config and its host tensor-map code from step07::v5).
// Only the consumer loop changes; it comes in two orders (V6Config::ORDER):
//   ORDER 0, FlashAttention-3's (its Algorithm 2). Tile 0: S_0, wait, softmax, pack P_0. Tile j >= 1:
//     issue S_j = Q K_j^T and O += P_{j-1} V_{j-1}; wgmma_wait<1> (S_j retires, P V stays in
//     flight); mask, row max, exp2, row sums of S_j -- the exponentials under P_{j-1} V_{j-1};
//     wgmma_wait<0>; release V_{j-1}; O *= alpha; pack P_j. The last P V after the loop. From v5
//     it differs only in the order of the two issues and the split wait; nothing is in flight at
//     the back edge and one S tile is live (P_{j-1}'s 16-bit registers beside it), so its register
//     use is v5's.
//   ORDER 2, "S-next" (the question's form: the softmax of tile j under Q K^T of tile j+1). Step j,
//     S_j already waited in one S buffer: issue S_{j+1} into the OTHER buffer; mask / max / exp2 /
//     sums of S_j under it (and under P_{j-1} V_{j-1}); wgmma_wait<1> (P_{j-1} V_{j-1} retires,
//     S_{j+1} stays in flight); release V_{j-1}; O *= alpha; pack P_j; issue P_j V_j; wgmma_wait<1>
//     (S_{j+1} retires, P_j V_j stays in flight); release K_{j+1}. The loop is unrolled by two
//     (step(s0, s1, j); step(s1, s0, j + 1)): S_even and S_odd are two register arrays, never
//     copied into each other. P V is drained (wait<0>) before the back edge: an accumulator in
//     flight across it is copied there and ptxas serializes every wgmma (C7514, checked). The last
//     tile is peeled with `next` a literal: two run-time `if (next)` blocks, the issue in one and
//     the wait in the other, also made ptxas serialize (C7514: its check does not follow the
//     condition from one block to the next). ORDER 1 (P_{j-1} V_{j-1} waited right after S_{j+1}
//     is issued) is kept in the code but in no config: it spilled 32 bytes at D = 64, 128 x 128
//     (measured before the basic-block end below was added; at 128 x 64 it compiled clean).
//   In both orders the exponentials end with the wait on V_j's mbarrier (needed next anyway): its
//   try-wait loop ends ptxas's basic block. Without it ptxas hoists the wgmma wait that follows to
//   the top of the block, above every MUFU.EX2, and nothing overlaps (seen in the SASS, checked).
//   fence_regs (empty asm, "+f"/"+r") pins each accumulator's and P's reads and writes to after
//   the wait that retires them, and the exponentials to before the next wait.
//   Configs (launch6_d): 0 = 128 x 64 tiles, order 0; 2 = 128 x 128, order 0 (v5's config 2 plus
//   the overlap); 6 = 128 x 64, order 2; 7 = 128 x 128, order 2, D = 64 only. All 2 stages, two
//   consumer warpgroups, no ping-pong. At D = 128 with 128 x 128 tiles both S-next orders spill
//   (156-196 bytes) and ptxas serializes every wgmma (C7512): two 64-register S tiles, O's 64 and
//   P's 32 do not fit 240.
// Contract: v5's (fp16/bf16, D 64/128, top-left causal, Nq != Nk, natural-log LSE, (BH, N, D)
// contiguous 16-byte aligned tensors).
//
// Compile report (CPU, nvcc 13.0, sm_90a, the course's flags; bench/experiments/cuda_v6.py
// --compile-report, 2026-12-01): 14 instances (fp16/bf16 x configs 0, 2, 6 at D = 64 and 128, 7 at
// D = 64), 10 s. No spills, 0 bytes stack, no C75xx warning anywhere; USETMAXREG 24 / 240 in
// each; UTMALDG 3 (D = 64) / 6 (D = 128). Order 0: the consumers' code tops out at v5's register
// (R103 / R135 / R151 / R183 for D, BN = 64,64 / 128,64 / 64,128 / 128,128), HGMMA 16-32, 4
// WARPGROUP.DEPBAR, and all BN/2 + 2 MUFU.EX2 of a tile (34 at BN = 64, 66 at 128) issued while
// P_{j-1} V_{j-1} is in flight (between its HGMMA group and the DEPBAR that retires it). Order 2:
// R157 / R187 / R237 (D, BN = 64,64 / 128,64 / 64,128), HGMMA 36-56, 11 DEPBAR, and 34 / 66 EX2
// a tile while Q K_{j+1}^T is in flight, 28-65 of them also under P_{j-1} V_{j-1}. v5's config 2
// (bf16, D = 64 and 128), compiled in the same unit as the control: no EX2 under any wgmma.
// Answer: not yet run on a GPU.
//
// STEP07_V6_TEST_ONLY (the CPU test's build): bf16, config 2 at D = 64 and 128, config 7 at D = 64.
// v6 needs v5's helpers, not its kernels (the course's build has them): v5's fwd_v5, the one function
// that instantiates its 24 kernels, becomes a function template here that nothing instantiates, so
// they are not compiled (about 5 s of ptxas on 2 cores, in the test's compile and in the extension's
// build). Its helpers and templates are untouched.
#define fwd_v5(...) fwd_v5_not_in_v6(__VA_ARGS__); \
    template <int V6_UNUSED_> cudaError_t fwd_v5_uninstantiated(__VA_ARGS__)
#include "step07_fwd_v5.cu"
#undef fwd_v5
namespace step07 {
namespace v5 {
namespace {
// ... but for v5's config 2 in bf16 at D = 64 and 128: the compile report's control (its exponentials
// under no wgmma), two kernels nothing launches.
[[maybe_unused]] void* const v5_control_instances[] = {
    reinterpret_cast<void*>(&fwd_v5_kernel<__nv_bfloat16, V5Config<64, 128, 2>>),
    reinterpret_cast<void*>(&fwd_v5_kernel<__nv_bfloat16, V5Config<128, 128, 2>>)};
}  // namespace
}  // namespace v5
}  // namespace step07

namespace step07 {
namespace v6 {
namespace {

using namespace ::step07::v5;   // V5Config, the mbarrier / TMA / setmaxnreg helpers, make_map

// v5's configuration (two consumer warpgroups, no ping-pong), under its own name so that the
// kernel instances' mangled names say v6.
// ORDER: where the exponentials of S_j overlap a product (see the header).
//   0: FlashAttention-3's (its Algorithm 2): under P_{j-1} V_{j-1}; S_j is waited first.
//   1: S-next, early: under S_{j+1}; P_{j-1} V_{j-1} is waited right after S_{j+1} is issued.
//   2: S-next, late: under S_{j+1} and P_{j-1} V_{j-1}; P_{j-1}'s registers stay live meanwhile.
template <int D_, int BN_, int STAGES_, int ORDER_>
struct V6Config : V5Config<D_, BN_, STAGES_, 2, false> {
    static constexpr int ORDER = ORDER_;
    static_assert(ORDER_ >= 0 && ORDER_ <= 2, "order 0, 1 or 2");
};

template <typename T, typename Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
fwd_v6_kernel(const FwdParams p, const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
              const __grid_constant__ CUtensorMap tm_v) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int D = Cfg::D, BN = Cfg::BN, BM = Cfg::BM, STAGES = Cfg::STAGES;
    extern __shared__ __align__(1024) unsigned char smem_v6[];
    __shared__ __align__(8) uint64_t bars[4 * STAGES + 1];    // full_k, full_v, empty_k, empty_v, full_q
    const uint32_t Qs = (smem_u32(smem_v6) + 1023u) & ~1023u;
    const uint32_t Ks = Qs + Cfg::Q_BYTES;
    const uint32_t Vs = Ks + STAGES * Cfg::KV_BYTES;
    const uint32_t bar0 = smem_u32(bars);
    auto full_k = [&](int s) { return bar0 + 8u * s; };
    auto full_v = [&](int s) { return bar0 + 8u * (STAGES + s); };
    auto empty_k = [&](int s) { return bar0 + 8u * (2 * STAGES + s); };
    auto empty_v = [&](int s) { return bar0 + 8u * (3 * STAGES + s); };
    const uint32_t full_q = bar0 + 8u * (4 * STAGES);

    const int wg = threadIdx.x / 128;
    const int bh = blockIdx.y;
    const int m_block = p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;   // causal: longest first
    const int q0 = m_block * BM;
    const int n_end = p.causal ? min(p.nk, q0 + BM) : p.nk;
    const int n_tiles = (n_end + BN - 1) / BN;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full_k(s), 1);
            mbar_init(full_v(s), 1);
            mbar_init(empty_k(s), Cfg::CONSUMERS * 128);
            mbar_init(empty_v(s), Cfg::CONSUMERS * 128);
        }
        mbar_init(full_q, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        // ------------------------------------------------------------ producer (v5's)
        regs_dec<Cfg::PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            tma_prefetch_desc(&tm_q);
            tma_prefetch_desc(&tm_k);
            tma_prefetch_desc(&tm_v);
            mbar_expect_tx(full_q, Cfg::Q_BYTES);
#pragma unroll
            for (int cb = 0; cb < D / 64; ++cb) tma_load_3d(Qs + cb * (BM * 128), &tm_q, cb * 64, q0, bh, full_q);
            for (int j = 0; j < n_tiles; ++j) {
                const int st = j % STAGES;
                const uint32_t ph = (j / STAGES) & 1;
                mbar_wait(empty_k(st), ph ^ 1);
                mbar_expect_tx(full_k(st), Cfg::KV_BYTES);
#pragma unroll
                for (int cb = 0; cb < D / 64; ++cb)
                    tma_load_3d(Ks + st * Cfg::KV_BYTES + cb * (BN * 128), &tm_k, cb * 64, j * BN, bh, full_k(st));
                mbar_wait(empty_v(st), ph ^ 1);
                mbar_expect_tx(full_v(st), Cfg::KV_BYTES);
#pragma unroll
                for (int cb = 0; cb < D / 64; ++cb)
                    tma_load_3d(Vs + st * Cfg::KV_BYTES + cb * (BN * 128), &tm_v, cb * 64, j * BN, bh, full_v(st));
            }
        }
        return;
    }

    // ---------------------------------------------------------------- consumers
    regs_inc<Cfg::CONSUMER_REGS>();
    const int cw = wg - 1;
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int wr = cw * 64 + warp * 16;
    const float sl2 = p.scale * kLog2e;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
    const uint32_t Qwg = Qs + cw * 64 * 128;
    uint32_t pa[BN / 16][4];
    float s0[BN / 2], s1[BN / 2];   // S_even and S_odd (the S-next orders; order 0 uses s0 only)

    // S = Q K^T of the tile in stage st into s (issue and commit only; no wait).
    auto issue_s = [&](float (&s)[BN / 2], int st) {
        const uint32_t Kt = Ks + st * Cfg::KV_BYTES;
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
            for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(pa[kk][r]) :: "memory");
    };
    // O += P_j V_j (P_j in pa), issue and commit only.
    auto issue_pv = [&](int j) {
        const int st = j % STAGES;
        mbar_wait(full_v(st), (j / STAGES) & 1);
        const uint32_t Vt = Vs + st * Cfg::KV_BYTES;
        fence_regs(o);
        fence_pa();
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
            wgmma_rs<T, D>(o, pa[kk], make_desc(Vt + kk * 16 * 128, BN * 128, 1024), 1);
        wgmma_commit();
    };
    // After the wait that retires P_j V_j: O and P may be touched again, V_j may be overwritten.
    auto retired_pv = [&](int j) {
        fence_regs(o);
        fence_pa();
        if (j >= 0) mbar_arrive(empty_v(j % STAGES));
    };
    // The part of the softmax of S_j (in sc) that touches neither O nor P: the boundary mask, the
    // row max, exp2 in place, the row sums; alpha = the rescale of O. It can run under a product.
    auto softmax_exp = [&](float (&sc)[BN / 2], const int j, float (&alpha)[2]) {
        const int n0 = j * BN;
        if (n0 + BN > p.nk || (p.causal && n0 + BN - 1 > q0 + cw * 64)) {
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) {
                const int key = n0 + (i / 4) * 8 + 2 * t + (i & 1);
                const int row = q0 + wr + g + 8 * ((i >> 1) & 1);
                if (key >= p.nk || (p.causal && key > row)) sc[i] = -INFINITY;
            }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = m[h];
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt) mx = fmaxf(mx, fmaxf(sc[4 * nt + 2 * h], sc[4 * nt + 2 * h + 1]));
            mx = quad_max(mx);
            const float msub = (mx == -INFINITY) ? 0.f : mx * sl2;
            alpha[h] = exp2f(m[h] * sl2 - msub);
            m[h] = mx;
            float rs = 0.f;
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt) {
                sc[4 * nt + 2 * h] = exp2f(fmaf(sc[4 * nt + 2 * h], sl2, -msub));
                sc[4 * nt + 2 * h + 1] = exp2f(fmaf(sc[4 * nt + 2 * h + 1], sl2, -msub));
                rs += sc[4 * nt + 2 * h] + sc[4 * nt + 2 * h + 1];
            }
            l[h] = l[h] * alpha[h] + rs;
        }
        fence_regs(sc);   // the exponentials are computed here, before the wait that follows
        // V_j's mbarrier (P_j V_j needs it next): its try-wait loop also ends ptxas's basic block
        // here. Without it ptxas hoists the wgmma wait that follows to the top of the block, above
        // every MUFU.EX2 (seen in the SASS), and nothing overlaps.
        mbar_wait(full_v(j % STAGES), (j / STAGES) & 1);
    };
    // The rest of it, once the last P V has retired: O *= alpha, P_j packed into pa.
    auto rescale_pack = [&](float (&sc)[BN / 2], const float (&alpha)[2]) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                o[4 * nt + 2 * h] *= alpha[h];
                o[4 * nt + 2 * h + 1] *= alpha[h];
            }
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            pa[kk][0] = pack2<T>(sc[8 * kk + 0], sc[8 * kk + 1]);
            pa[kk][1] = pack2<T>(sc[8 * kk + 2], sc[8 * kk + 3]);
            pa[kk][2] = pack2<T>(sc[8 * kk + 4], sc[8 * kk + 5]);
            pa[kk][3] = pack2<T>(sc[8 * kk + 6], sc[8 * kk + 7]);
        }
    };

    mbar_wait(full_q, 0);
    if (n_tiles > 0) {                         // S_0, waited at once (nothing to overlap it with)
        mbar_wait(full_k(0), 0);
        issue_s(s0, 0);
        wgmma_wait<0>();
        fence_regs(s0);
        mbar_arrive(empty_k(0));
    }

    if constexpr (Cfg::ORDER == 0) {
        // FlashAttention-3's order: S_j and P_{j-1} V_{j-1} issued, S_j waited (wait<1>), its
        // exponentials under P_{j-1} V_{j-1}, then wait<0>, rescale O, pack P_j. Nothing is in
        // flight at the back edge, and one S tile is live (P_{j-1}, half its size, the other).
        if (n_tiles > 0) {
            float alpha[2];
            softmax_exp(s0, 0, alpha);
            rescale_pack(s0, alpha);
        }
        for (int j = 1; j < n_tiles; ++j) {
            const int st = j % STAGES;
            mbar_wait(full_k(st), (j / STAGES) & 1);
            issue_s(s0, st);                   // S_j
            issue_pv(j - 1);                   // O += P_{j-1} V_{j-1}
            wgmma_wait<1>();                   // S_j retires, P_{j-1} V_{j-1} stays in flight
            fence_regs(s0);
            mbar_arrive(empty_k(st));
            float alpha[2];
            softmax_exp(s0, j, alpha);         // the exponentials under P_{j-1} V_{j-1}
            wgmma_wait<0>();
            retired_pv(j - 1);
            rescale_pack(s0, alpha);
        }
        if (n_tiles > 0) issue_pv(n_tiles - 1);
    } else {
        // The S-next orders: S_j is in sc (waited); sn receives S_{j+1}. NEXT (whether tile j+1
        // exists) is a literal at every call, folded once the lambda is inlined: every wgmma issue
        // and wait stays out of run-time branches (ptxas's check of in-flight accumulators does not
        // follow a condition from one `if` to the next: two `if (next)` blocks made it serialize
        // every wgmma, C7514; a generic lambda with a std::bool_constant tag crashes cicc 13.0).
        auto step = [&](float (&sc)[BN / 2], float (&sn)[BN / 2], const int j, const bool NEXT) {
            const int st1 = (j + 1) % STAGES;
            if (NEXT) {                         // 1. S_{j+1}, left in flight
                mbar_wait(full_k(st1), ((j + 1) / STAGES) & 1);
                issue_s(sn, st1);
                if (Cfg::ORDER == 1) {          // early: P_{j-1} V_{j-1} retires now
                    wgmma_wait<1>();
                    retired_pv(j - 1);
                }
            }
            float alpha[2];
            softmax_exp(sc, j, alpha);          // 2. the exponentials under S_{j+1} (order 2: and P_{j-1} V_{j-1})
            if (Cfg::ORDER == 2 || !NEXT) {     // 3. P_{j-1} V_{j-1} retires (S_{j+1} stays in flight)
                if (NEXT) wgmma_wait<1>(); else wgmma_wait<0>();
                retired_pv(j - 1);
            }
            rescale_pack(sc, alpha);
            issue_pv(j);                        // 4. O += P_j V_j, left in flight
            if (NEXT) {                         // 5. S_{j+1} retires, P_j V_j stays in flight
                wgmma_wait<1>();
                fence_regs(sn);
                mbar_arrive(empty_k(st1));
            }
        };
        int j = 0;
        for (; j + 2 < n_tiles; j += 2) {      // S_j in s0 at the top of every pass
            step(s0, s1, j, true);
            step(s1, s0, j + 1, true);
            // Drain P_{j+1} V_{j+1} before the back edge: an accumulator in flight across it is
            // copied there and ptxas serializes every wgmma (C7514). Its V is released by the next
            // step's wait, a no-op then.
            wgmma_wait<0>();
            fence_regs(o);
            fence_pa();
        }
        if (j + 1 < n_tiles) {                 // two tiles left
            step(s0, s1, j, true);
            step(s1, s0, j + 1, false);
        } else if (j < n_tiles) {              // one
            step(s0, s1, j, false);
        }
    }
    wgmma_wait<0>();
    fence_regs(o);

    // Epilogue (v5's): row sums across the quad, normalize, store O and the LSE.
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
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

template <typename T, typename Cfg>
cudaError_t launch6(const FwdParams& p, cudaStream_t stream) {
    CUtensorMap tq, tk, tv;
    cudaError_t err;
    if ((err = make_map<T>(&tq, p.q, p.nq, p.bh, Cfg::D, Cfg::BM)) != cudaSuccess) return err;
    if ((err = make_map<T>(&tk, p.k, p.nk, p.bh, Cfg::D, Cfg::BN)) != cudaSuccess) return err;
    if ((err = make_map<T>(&tv, p.v, p.nk, p.bh, Cfg::D, Cfg::BN)) != cudaSuccess) return err;
    err = cudaFuncSetAttribute(fwd_v6_kernel<T, Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM);
    if (err != cudaSuccess) return err;
    dim3 grid((p.nq + Cfg::BM - 1) / Cfg::BM, p.bh);
    fwd_v6_kernel<T, Cfg><<<grid, Cfg::THREADS, Cfg::SMEM, stream>>>(p, tq, tk, tv);
    return cudaGetLastError();
}

template <typename T>
cudaError_t launch6_d(const FwdParams& p, cudaStream_t stream) {
    // 0 = 128 x 64 tiles, 2 stages; 2 = 128 x 128, 2 stages (v5's config numbers), both in
    // FlashAttention-3's order (ORDER 0); 6 = 128 x 64, 7 = 128 x 128 (D = 64 only), both in the
    // late S-next order (ORDER 2). (The early S-next order, ORDER 1, spills 32 bytes at D = 64 and
    // 128 x 128, and at D = 128 with 128 x 128 tiles both S-next orders spill 156-196 bytes and
    // ptxas serializes every wgmma, C7512: two 64-register S tiles, O's 64 and P's 32 do not fit 240.)
    if (p.d == 64) {
        switch (p.config) {
#ifndef STEP07_V6_TEST_ONLY
            case 0: return launch6<T, V6Config<64, 64, 2, 0>>(p, stream);
            case 6: return launch6<T, V6Config<64, 64, 2, 2>>(p, stream);
#endif
            case 2: return launch6<T, V6Config<64, 128, 2, 0>>(p, stream);
            case 7: return launch6<T, V6Config<64, 128, 2, 2>>(p, stream);
        }
    } else if (p.d == 128) {
        switch (p.config) {
#ifndef STEP07_V6_TEST_ONLY
            case 0: return launch6<T, V6Config<128, 64, 2, 0>>(p, stream);
            case 6: return launch6<T, V6Config<128, 64, 2, 2>>(p, stream);
#endif
            case 2: return launch6<T, V6Config<128, 128, 2, 0>>(p, stream);
        }
    }
    return cudaErrorInvalidValue;
}

}  // namespace
}  // namespace v6

cudaError_t fwd_v6(const FwdParams& p, cudaStream_t stream) {
    switch (p.dtype) {
#ifndef STEP07_V6_TEST_ONLY
        case DType::f16: return v6::launch6_d<__half>(p, stream);
#endif
        case DType::bf16: return v6::launch6_d<__nv_bfloat16>(p, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace step07
