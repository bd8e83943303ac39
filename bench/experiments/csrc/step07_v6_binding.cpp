// Step 07 v6 experiment -- the torch glue for bench/experiments/csrc/step07_fwd_v6.cu (which
// #includes the course's solutions/csrc/step07_fwd_v5.cu); bench/experiments/cuda_v6.py builds both
// with torch.utils.cpp_extension.load. The checks of solutions/csrc/step07_binding.cpp's fwd,
// narrowed to v6: fp16/bf16, D 64 or 128, an sm_90a GPU.
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <ATen/cuda/CUDAContext.h>

#include <vector>

#include "step07_launch.h"

namespace step07 {
cudaError_t fwd_v6(const FwdParams& p, cudaStream_t stream);   // step07_fwd_v6.cu
}

namespace {

void check_3d(const at::Tensor& t, const char* name, int64_t bh, int64_t d) {
    TORCH_CHECK(t.is_cuda(), "v6: ", name, " must be a CUDA tensor");
    TORCH_CHECK(t.dim() == 3, "v6: ", name, " must be (BH, N, D), got ", t.sizes());
    TORCH_CHECK(t.is_contiguous(), "v6: ", name, " must be contiguous");
    TORCH_CHECK(t.size(0) == bh && t.size(2) == d, "v6: ", name, " has shape ", t.sizes(), ", expected (", bh,
                ", N, ", d, ")");
    TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "v6: ", name,
                " must be 16-byte aligned (a TMA tensor map's base)");
}

// fwd(q, k, v, causal, scale, config) -> [o (BH, Nq, D), lse (BH, Nq) float32]
std::vector<at::Tensor> fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, double scale,
                            int64_t config) {
    const int64_t bh = q.size(0), d = q.size(2);
    check_3d(q, "q", bh, d);
    check_3d(k, "k", bh, d);
    check_3d(v, "v", bh, d);
    TORCH_CHECK(k.sizes() == v.sizes(), "v6: k and v must have the same shape");
    TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(),
                "v6: q, k, v must share one dtype");
    TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16, "v6: fp16 or bf16 only");
    TORCH_CHECK(d == 64 || d == 128, "v6: head dim must be 64 or 128, got ", d);
    const c10::cuda::CUDAGuard guard(q.device());
    const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
    TORCH_CHECK(prop->major == 9 && prop->minor == 0, "v6: wgmma, TMA and setmaxnreg need an sm_90a GPU "
                "(H100/H200); this one is ", prop->major, ".", prop->minor);
    auto o = at::empty_like(q);
    auto lse = at::empty({bh, q.size(1)}, q.options().dtype(at::kFloat));
    step07::FwdParams p{};
    p.q = q.data_ptr(); p.k = k.data_ptr(); p.v = v.data_ptr();
    p.o = o.data_ptr(); p.lse = lse.data_ptr<float>();
    p.bh = (int)bh; p.nq = (int)q.size(1); p.nk = (int)k.size(1); p.d = (int)d;
    p.scale = (float)scale; p.causal = causal; p.config = (int)config;
    p.dtype = q.scalar_type() == at::kHalf ? step07::DType::f16 : step07::DType::bf16;
    const cudaError_t err = step07::fwd_v6(p, c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "v6 (config ", config, ") failed to launch: ", cudaGetErrorString(err));
    return {o, lse};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "Step 07 v6 experiment: v5 plus the softmax overlapped with a wgmma inside each consumer warpgroup (sm_90a)";
    m.def("fwd", &fwd, "forward: (q, k, v, causal, scale, config) -> [o, lse]");
}
