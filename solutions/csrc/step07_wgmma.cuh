// Step 07 -- Hopper's warpgroup MMA (wgmma) for forward v4 and v5: the 128-byte swizzled
// layout, the shared-memory matrix descriptor and the wgmma instructions, as device functions.
// v4 (step07_fwd_v4.cu) is where they are explained and first used; v5 (step07_fwd_v5.cu) keeps
// v4's layout, so its TMA loads land exactly where these descriptors point.
#pragma once
#include <type_traits>

#include "step07_common.cuh"

namespace step07 {
namespace {

// Byte offset of (row, 16-byte chunk c) in a ROWS x D tile stored as D/64 column
// blocks of ROWS x 128 bytes, 128-byte swizzled (the layout wgmma's descriptors name).
template <int ROWS>
__device__ __forceinline__ uint32_t sw128(int row, int c) {
    return (c >> 3) * (ROWS * 128) + row * 128 + (((c & 7) ^ (row & 7)) << 4);
}

// The 64-bit shared-memory matrix descriptor of wgmma (PTX ISA, "Matrix Descriptor
// Format"), for a tile in the 128-byte swizzle:
//   bits  0-13  start address >> 4 (the 18-bit shared address of the first element)
//   bits 16-29  leading-dimension byte offset >> 4 (LBO)
//   bits 32-45  stride-dimension byte offset >> 4 (SBO)
//   bits 49-51  base offset: 0, every swizzle atom here starts 1024-byte aligned
//   bits 62-63  swizzle mode: 1 = 128-byte (2 = 64-byte, 3 = 32-byte, 0 = none)
// SBO is the distance between two groups of 8 rows (1024 bytes here, K-major or MN-major).
// LBO: K-major with a swizzle, unused (a k16 slice, 32 bytes, never leaves one 128-byte
// row; 16 by convention); MN-major, the distance between two 64-element column blocks.
__device__ __forceinline__ uint64_t make_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
    // >>> STUDENT: pack the start address, LBO and SBO (each >> 4, 14 bits) and the 128-byte swizzle mode into the descriptor
    uint64_t desc = (uint64_t)((smem_addr & 0x3FFFF) >> 4);
    desc |= (uint64_t)((lbo_bytes >> 4) & 0x3FFF) << 16;
    desc |= (uint64_t)((sbo_bytes >> 4) & 0x3FFF) << 32;
    desc |= 1ull << 62;
    return desc;
    // STUB: return 0;
    // <<< STUDENT
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// --------------------------------------------------------------- wgmma wrappers
// The accumulator of m64nNk16 (fp32) is N/2 registers a thread; warp w of the
// warpgroup holds rows 16w..16w+15, and within the warp the layout of mma.sync's
// D, one 8-column chunk after another: with g = lane / 4, t = lane % 4,
//   d[4i + 0..1] = D[16w + g][8i + 2t..2t+1],  d[4i + 2..3] = D[16w + g + 8][8i + 2t..2t+1].
// Generated text (one asm per shape; TY is "f16" or "bf16").
// d (64 x 64 fp32, 32 registers a thread) = (accumulate ? d : 0) + A * B; A 64 x 16 and
// B 16 x 64 both in shared memory, both K-major (imm-trans-a = imm-trans-b = 0).
#define STEP07_WGMMA_SS_N64(TY)                                                                 \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                              \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {"                   \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"  \
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"                                         \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),  \
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])  \
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate))

// d (64 x 64 fp32) = (accumulate ? d : 0) + A * B; A 64 x 16 from registers (four 32-bit
// registers a thread, mma.sync's A fragment), B 16 x 64 in shared memory, MN-major (imm-trans-b = 1).
#define STEP07_WGMMA_RS_N64(TY)                                                                 \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                              \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {"                   \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"  \
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"            \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),  \
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))

// d (64 x 128 fp32, 64 registers a thread) = (accumulate ? d : 0) + A * B; A 64 x 16 and
// B 16 x 128 both in shared memory, both K-major (imm-trans-a = imm-trans-b = 0).
#define STEP07_WGMMA_SS_N128(TY)                                                                 \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                              \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {"                   \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"  \
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"                                         \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),  \
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),  \
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])  \
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate))

// d (64 x 128 fp32) = (accumulate ? d : 0) + A * B; A 64 x 16 from registers (four 32-bit
// registers a thread, mma.sync's A fragment), B 16 x 128 in shared memory, MN-major (imm-trans-b = 1).
#define STEP07_WGMMA_RS_N128(TY)                                                                 \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                              \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {"                   \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"  \
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"            \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),  \
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),  \
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))

template <typename T, int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    constexpr bool F16 = std::is_same<T, __half>::value;
    if constexpr (N == 64) { if constexpr (F16) STEP07_WGMMA_SS_N64("f16"); else STEP07_WGMMA_SS_N64("bf16"); }
    else { static_assert(N == 128, "N is 64 or 128"); if constexpr (F16) STEP07_WGMMA_SS_N128("f16"); else STEP07_WGMMA_SS_N128("bf16"); }
}

template <typename T, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    constexpr bool F16 = std::is_same<T, __half>::value;
    if constexpr (N == 64) { if constexpr (F16) STEP07_WGMMA_RS_N64("f16"); else STEP07_WGMMA_RS_N64("bf16"); }
    else { static_assert(N == 128, "N is 64 or 128"); if constexpr (F16) STEP07_WGMMA_RS_N128("f16"); else STEP07_WGMMA_RS_N128("bf16"); }
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory"); }
// Makes this thread's generic-proxy writes to shared memory (cp.async's) visible to the async proxy (wgmma).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Ties an accumulator's registers to this point: the compiler may not move reads or writes
// of them across it (it cannot see that wgmma writes them after the asm has "returned").
template <int R>
__device__ __forceinline__ void fence_regs(float (&r)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(r[i]) :: "memory");
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace
}  // namespace step07
