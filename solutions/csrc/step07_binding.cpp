// Step 07 -- the torch glue: checks what the kernels assume, allocates the
// outputs, picks the current CUDA stream, calls a launcher from the .cu files
// and turns a CUDA error into a Python RuntimeError (TORCH_CHECK).
//
// Only this file includes torch: torch.utils.cpp_extension compiles it with the
// host compiler, the .cu files with nvcc, and links them into one module. The
// Python wrapper (solutions/step07_cuda.py) has already validated the inputs
// and flattened them to contiguous (BH, N, D); the checks here are the last
// line of defence for anyone calling the module directly.
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <ATen/cuda/CUDAContext.h>

#include <vector>

#include "step07_launch.h"

namespace {

step07::DType dtype_of(const at::Tensor& t) {
    switch (t.scalar_type()) {
        case at::kFloat: return step07::DType::f32;
        case at::kHalf: return step07::DType::f16;
        case at::kBFloat16: return step07::DType::bf16;
        default: TORCH_CHECK(false, "step07: unsupported dtype ", t.scalar_type());
    }
    return step07::DType::f32;
}

void check_3d(const at::Tensor& t, const char* name, int64_t bh, int64_t d) {
    TORCH_CHECK(t.is_cuda(), "step07: ", name, " must be a CUDA tensor");
    TORCH_CHECK(t.dim() == 3, "step07: ", name, " must be (BH, N, D), got ", t.sizes());
    TORCH_CHECK(t.is_contiguous(), "step07: ", name, " must be contiguous");
    TORCH_CHECK(t.size(0) == bh && t.size(2) == d, "step07: ", name, " has shape ", t.sizes(),
                ", expected (", bh, ", N, ", d, ")");
    TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "step07: ", name,
                " must be 16-byte aligned (the kernels copy 16 bytes at a time)");
}

// wgmma exists on sm_90a only (the kernels compile to an empty body elsewhere): refuse to launch.
void check_sm90a(const char* what) {
    const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
    TORCH_CHECK(prop->major == 9 && prop->minor == 0, "step07: ", what, " uses wgmma, which needs an sm_90a GPU "
                "(H100/H200); this one is ", prop->major, ".", prop->minor);
}

// fwd(q, k, v, causal, scale, version, config) -> [o (BH, Nq, D), lse (BH, Nq) float32]
std::vector<at::Tensor> fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                            double scale, int64_t version, int64_t config) {
    const int64_t bh = q.size(0), d = q.size(2);
    check_3d(q, "q", bh, d);
    check_3d(k, "k", bh, d);
    check_3d(v, "v", bh, d);
    TORCH_CHECK(k.sizes() == v.sizes(), "step07: k and v must have the same shape");
    TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(),
                "step07: q, k, v must share one dtype");
    TORCH_CHECK(d == 64 || d == 128, "step07: head dim must be 64 or 128, got ", d);
    const c10::cuda::CUDAGuard guard(q.device());
    auto o = at::empty_like(q);
    auto lse = at::empty({bh, q.size(1)}, q.options().dtype(at::kFloat));
    step07::FwdParams p{};
    p.q = q.data_ptr(); p.k = k.data_ptr(); p.v = v.data_ptr();
    p.o = o.data_ptr(); p.lse = lse.data_ptr<float>();
    p.bh = (int)bh; p.nq = (int)q.size(1); p.nk = (int)k.size(1); p.d = (int)d;
    p.scale = (float)scale; p.causal = causal; p.dtype = dtype_of(q); p.config = (int)config;
    TORCH_CHECK(version >= 1 && version <= 6, "step07: no forward version ", version, " (there are 1 to 6)");
    if (version >= 4) {
        const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
        TORCH_CHECK(prop->major == 9 && prop->minor == 0, "step07: forward v", version, " uses wgmma, which needs an "
                    "sm_90a GPU (H100/H200); this one is ", prop->major, ".", prop->minor);
    }
    TORCH_CHECK(version == 1 || p.dtype != step07::DType::f32,
                "step07: forward v", version, " uses fp16/bf16 tensor cores; fp32 runs on v1 only");
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    const cudaError_t err = version == 1 ? step07::fwd_v1(p, stream)
                          : version == 2 ? step07::fwd_v2(p, stream)
                          : version == 3 ? step07::fwd_v3(p, stream)
                          : version == 4 ? step07::fwd_v4(p, stream)
                          : version == 5 ? step07::fwd_v5(p, stream)
                                         : step07::fwd_v6(p, stream);
    TORCH_CHECK(err == cudaSuccess, "step07: forward v", version, " (config ", config, ") failed to launch: ",
                cudaGetErrorString(err));
    return {o, lse};
}

// bwd(q, k, v, o, lse, dout, causal, scale, version) -> [dq, dk, dv]; version 1: scalar fp32
// math (any dtype), 2: tensor cores (fp16/bf16), 3: v2 with dK/dV on wgmma (fp16/bf16, sm_90a only)
std::vector<at::Tensor> bwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
                            const at::Tensor& lse, const at::Tensor& dout, bool causal, double scale,
                            int64_t version) {
    const int64_t bh = q.size(0), d = q.size(2);
    for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&o, "o"}, {&dout, "dout"}})
        check_3d(*t, name, bh, d);
    TORCH_CHECK(d == 64 || d == 128, "step07: head dim must be 64 or 128, got ", d);
    TORCH_CHECK(lse.scalar_type() == at::kFloat && lse.is_contiguous() && lse.dim() == 2 && lse.size(0) == bh &&
                    lse.size(1) == q.size(1),
                "step07: lse must be contiguous float32 (BH, Nq)");
    TORCH_CHECK(dout.scalar_type() == q.scalar_type() && o.scalar_type() == q.scalar_type(),
                "step07: o and dout must have q's dtype");
    const c10::cuda::CUDAGuard guard(q.device());
    auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
    auto delta = at::empty({bh, q.size(1)}, q.options().dtype(at::kFloat));
    step07::BwdParams p{};
    p.q = q.data_ptr(); p.k = k.data_ptr(); p.v = v.data_ptr(); p.o = o.data_ptr(); p.dout = dout.data_ptr();
    p.lse = lse.data_ptr<float>();
    p.dq = dq.data_ptr(); p.dk = dk.data_ptr(); p.dv = dv.data_ptr(); p.delta = delta.data_ptr<float>();
    p.bh = (int)bh; p.nq = (int)q.size(1); p.nk = (int)k.size(1); p.d = (int)d;
    p.scale = (float)scale; p.causal = causal; p.dtype = dtype_of(q);
    TORCH_CHECK(version >= 1 && version <= 3, "step07: no backward version ", version, " (there are 1, 2, 3)");
    TORCH_CHECK(version == 1 || p.dtype != step07::DType::f32,
                "step07: backward v", version, " uses fp16/bf16 tensor cores; fp32 runs on v1 only");
    if (version == 3) check_sm90a("backward v3");
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    const cudaError_t err = version == 1 ? step07::bwd(p, stream)
                          : version == 2 ? step07::bwd_mma(p, stream)
                                         : step07::bwd_wgmma(p, stream);
    TORCH_CHECK(err == cudaSuccess, "step07: backward v", version, " failed to launch: ", cudaGetErrorString(err));
    return {dq, dk, dv};
}

// bwd3_dkdv(q, k, v, lse, dout, delta, causal, scale, config) -> [dk, dv]: backward v3's dK/dV
// kernel alone, Delta (float32 (BH, Nq), rowsum(dO * O)) given; config 0 or 1. What
// bench/experiments/cuda_bwd_wgmma.py times; attention's backward goes through bwd.
std::vector<at::Tensor> bwd3_dkdv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& lse, const at::Tensor& dout, const at::Tensor& delta, bool causal,
                                  double scale, int64_t config) {
    const int64_t bh = q.size(0), d = q.size(2);
    for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&dout, "dout"}}) check_3d(*t, name, bh, d);
    TORCH_CHECK(d == 64 || d == 128, "step07: head dim must be 64 or 128, got ", d);
    for (auto [t, name] : {std::pair{&lse, "lse"}, {&delta, "delta"}})
        TORCH_CHECK(t->is_cuda() && t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 2 &&
                        t->size(0) == bh && t->size(1) == q.size(1),
                    "step07: ", name, " must be contiguous float32 (BH, Nq) on the GPU");
    TORCH_CHECK(k.sizes() == v.sizes(), "step07: k and v must have the same shape");
    TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type() &&
                    dout.scalar_type() == q.scalar_type(),
                "step07: k, v and dout must have q's dtype");
    TORCH_CHECK(config == 0 || config == 1, "step07: backward v3's dK/dV kernel has configs 0 and 1, not ", config);
    const c10::cuda::CUDAGuard guard(q.device());
    step07::BwdParams p{};
    p.dtype = dtype_of(q);
    TORCH_CHECK(p.dtype != step07::DType::f32, "step07: backward v3 uses fp16/bf16 tensor cores");
    check_sm90a("backward v3");
    auto dk = at::empty_like(k), dv = at::empty_like(v);
    p.q = q.data_ptr(); p.k = k.data_ptr(); p.v = v.data_ptr(); p.o = nullptr; p.dout = dout.data_ptr();
    p.lse = lse.data_ptr<float>(); p.dq = nullptr; p.dk = dk.data_ptr(); p.dv = dv.data_ptr();
    p.delta = delta.data_ptr<float>();   // read only by the dK/dV kernel
    p.bh = (int)bh; p.nq = (int)q.size(1); p.nk = (int)k.size(1); p.d = (int)d;
    p.scale = (float)scale; p.causal = causal;
    const cudaError_t err = step07::bwd_wgmma_dkdv(p, (int)config, c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "step07: backward v3's dK/dV kernel (config ", config, ") failed to launch: ",
                cudaGetErrorString(err));
    return {dk, dv};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "Step 07: FlashAttention in CUDA: forward v1 scalar, v2 mma.sync, v3 cp.async+ldmatrix, v4 wgmma (sm_90a); backward v1 scalar, v2 mma.sync";
    m.def("fwd", &fwd, "forward: (q, k, v, causal, scale, version, config) -> [o, lse]");
    m.def("bwd", &bwd, "backward: (q, k, v, o, lse, dout, causal, scale, version) -> [dq, dk, dv]");
    m.def("bwd3_dkdv", &bwd3_dkdv, "backward v3's dK/dV kernel alone: (q, k, v, lse, dout, delta, causal, scale, "
          "config) -> [dk, dv]");
}
