// Step 07 -- what every kernel of this step shares: dtype conversions and thin
// wrappers around the PTX instructions the tensor-core versions use (mma.sync,
// ldmatrix, cp.async). The parameter structs are in step07_launch.h.
//
// This header includes CUDA headers only, never torch: every .cu file of the
// step compiles standalone with `nvcc -arch=sm_90 -std=c++17 -c`, which is how
// CI checks them on a machine without a GPU. The torch glue lives in
// step07_binding.cpp, compiled only where torch.utils.cpp_extension builds.
#pragma once

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "step07_launch.h"

// In a stub, every region still to write holds the statement `STUDENT_TODO;`. It compiles to
// nothing; step07_cuda.py will not launch a kernel whose file still has one and says "not
// implemented" instead of running a half-written kernel. Delete the line once you write the region.
#define STUDENT_TODO ((void)0)

namespace step07 {

// ---------------------------------------------------------------- conversions
// torch.utils.cpp_extension compiles with -D__CUDA_NO_HALF_OPERATORS__ and
// friends, so half/bf16 go through explicit intrinsics, never operators.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// Two floats -> one 32-bit register holding two 16-bit values; `lo` goes in the
// low half, which the mma fragments read as the element with the smaller column.
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}
// Two 16-bit values already in memory -> one register (lo, hi).
__device__ __forceinline__ uint32_t pack2_bits(uint16_t lo, uint16_t hi) {
    return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// ------------------------------------------------------------------ mma.sync
// D = A * B + D for one warp: A 16x16 (row-major), B 16x8 (column-major), D 16x8
// in fp32. With g = lane / 4 and t = lane % 4, each thread holds
//   A: a[0] = A[g][2t..2t+1],   a[1] = A[g+8][2t..2t+1],
//      a[2] = A[g][2t+8..2t+9], a[3] = A[g+8][2t+8..2t+9]
//   B: b[0] = B[2t..2t+1][g],   b[1] = B[2t+8..2t+9][g]
//   D: d[0..1] = D[g][2t..2t+1], d[2..3] = D[g+8][2t..2t+1]
// (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type").
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                          const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ------------------------------------------------------------------ ldmatrix
// Four 8x8 matrices of 16-bit values from shared memory into a warp's registers:
// lanes 8i..8i+7 give the row addresses of matrix i; register r[i] of each
// thread receives, from matrix i, row lane/4, columns 2*(lane%4) and +1 -- the
// fragment layout of mma above. `.trans` delivers the transpose instead.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr) : "memory");
}

// ------------------------------------------------------------------ cp.async
// 16 bytes global -> shared without passing through registers (sm_80+). With
// `valid` false it reads nothing and writes 16 zero bytes: how the kernels pad
// tiles that run past the end of a sequence.
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* gmem, bool valid) {
    int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_addr), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Wait until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Max over the 4 threads of a quad (the threads holding one mma row).
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
    return x;
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x;
}

constexpr float kLog2e = 1.4426950408889634f;   // exp(x) = exp2(x * log2(e))
constexpr float kLn2 = 0.6931471805599453f;

}  // namespace step07
