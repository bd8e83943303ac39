// Experiment (not course code): the torch glue of bench/experiments/csrc/step07_bwd_wgmma.cu, the
// wgmma dK/dV kernel, modelled on solutions/csrc/step07_binding.cpp's bwd. Built by
// bench/experiments/cuda_bwd_wgmma.py with torch.utils.cpp_extension.load.
//
//   dkdv(q, k, v, o, lse, dout, causal, scale, config) -> [dk, dv]      Delta (v2's kernel) + dK/dV
//   dkdv_delta(q, k, v, lse, dout, delta, causal, scale, config) -> [dk, dv]   dK/dV alone
//   delta(o, dout) -> delta (BH, Nq) float32                             backward v2's delta2_kernel
//   bwd(q, k, v, o, lse, dout, causal, scale, config) -> [dq, dk, dv]   Delta, this dK/dV, v2's dQ
// Inputs contiguous (BH, N, D), fp16/bf16, D 64/128; lse float32 (BH, Nq); an sm_90a GPU.
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>

#include <vector>

#include "step07_launch.h"

namespace step07 {
cudaError_t bwdw_dkdv(const BwdParams& p, int config, cudaStream_t stream);
cudaError_t bwdw_delta(const BwdParams& p, cudaStream_t stream);
cudaError_t bwdw_dq(const BwdParams& p, cudaStream_t stream);
}  // namespace step07

namespace {

void check_3d(const at::Tensor& t, const char* name, int64_t bh, int64_t d, at::ScalarType st) {
    TORCH_CHECK(t.is_cuda(), "bwd_wgmma: ", name, " must be a CUDA tensor");
    TORCH_CHECK(t.dim() == 3, "bwd_wgmma: ", name, " must be (BH, N, D), got ", t.sizes());
    TORCH_CHECK(t.is_contiguous(), "bwd_wgmma: ", name, " must be contiguous");
    TORCH_CHECK(t.size(0) == bh && t.size(2) == d, "bwd_wgmma: ", name, " has shape ", t.sizes(), ", expected (", bh,
                ", N, ", d, ")");
    TORCH_CHECK(t.scalar_type() == st, "bwd_wgmma: ", name, " must be ", st, ", got ", t.scalar_type());
    TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "bwd_wgmma: ", name, " must be 16-byte aligned");
}

void check_rows(const at::Tensor& t, const char* name, int64_t bh, int64_t nq) {
    TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kFloat && t.is_contiguous() && t.dim() == 2 && t.size(0) == bh &&
                    t.size(1) == nq,
                "bwd_wgmma: ", name, " must be contiguous float32 (BH, Nq) on the GPU");
}

void check_sm90a() {
    int dev = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    TORCH_CHECK(major == 9 && minor == 0, "bwd_wgmma: the dK/dV kernel uses wgmma, which needs an sm_90a "
                "GPU (H100/H200); this one is ", major, ".", minor);
}

// Checks q, k, v, dout (and o if given), fills everything of BwdParams but the outputs.
step07::BwdParams params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor* o,
                         const at::Tensor& lse, const at::Tensor& dout, bool causal, double scale) {
    const int64_t bh = q.size(0), d = q.size(2);
    const auto st = q.scalar_type();
    TORCH_CHECK(st == at::kHalf || st == at::kBFloat16, "bwd_wgmma: fp16 or bf16 only, got ", st);
    TORCH_CHECK(d == 64 || d == 128, "bwd_wgmma: head dim must be 64 or 128, got ", d);
    check_3d(q, "q", bh, d, st);
    check_3d(k, "k", bh, d, st);
    check_3d(v, "v", bh, d, st);
    check_3d(dout, "dout", bh, d, st);
    if (o) check_3d(*o, "o", bh, d, st);
    TORCH_CHECK(k.sizes() == v.sizes(), "bwd_wgmma: k and v must have the same shape");
    TORCH_CHECK(dout.size(1) == q.size(1), "bwd_wgmma: dout must have q's shape");
    check_rows(lse, "lse", bh, q.size(1));
    check_sm90a();
    step07::BwdParams p{};
    p.q = q.data_ptr(); p.k = k.data_ptr(); p.v = v.data_ptr(); p.o = o ? o->data_ptr() : nullptr;
    p.dout = dout.data_ptr(); p.lse = lse.data_ptr<float>();
    p.bh = (int)bh; p.nq = (int)q.size(1); p.nk = (int)k.size(1); p.d = (int)d;
    p.scale = (float)scale; p.causal = causal;
    p.dtype = st == at::kHalf ? step07::DType::f16 : step07::DType::bf16;
    return p;
}

void check_err(cudaError_t err, const char* what) {
    TORCH_CHECK(err == cudaSuccess, "bwd_wgmma: ", what, " failed to launch: ", cudaGetErrorString(err));
}

std::vector<at::Tensor> dkdv_delta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& lse,
                                   const at::Tensor& dout, const at::Tensor& delta, bool causal, double scale,
                                   int64_t config) {
    const c10::cuda::CUDAGuard guard(q.device());
    step07::BwdParams p = params(q, k, v, nullptr, lse, dout, causal, scale);
    check_rows(delta, "delta", q.size(0), q.size(1));
    auto dk = at::empty_like(k), dv = at::empty_like(v);
    p.delta = delta.data_ptr<float>(); p.dk = dk.data_ptr(); p.dv = dv.data_ptr();
    check_err(step07::bwdw_dkdv(p, (int)config, c10::cuda::getCurrentCUDAStream()), "the wgmma dK/dV kernel");
    return {dk, dv};
}

at::Tensor delta(const at::Tensor& o, const at::Tensor& dout) {
    const c10::cuda::CUDAGuard guard(o.device());
    const int64_t bh = o.size(0), d = o.size(2);
    check_3d(o, "o", bh, d, o.scalar_type());
    check_3d(dout, "dout", bh, d, o.scalar_type());
    TORCH_CHECK(o.sizes() == dout.sizes(), "bwd_wgmma: o and dout must have one shape");
    step07::BwdParams p{};
    p.o = o.data_ptr(); p.dout = dout.data_ptr();
    p.bh = (int)bh; p.nq = (int)o.size(1); p.d = (int)d;
    p.dtype = o.scalar_type() == at::kHalf ? step07::DType::f16 : step07::DType::bf16;
    TORCH_CHECK(o.scalar_type() == at::kHalf || o.scalar_type() == at::kBFloat16, "bwd_wgmma: fp16 or bf16 only");
    auto dl = at::empty({bh, o.size(1)}, o.options().dtype(at::kFloat));
    p.delta = dl.data_ptr<float>();
    check_err(step07::bwdw_delta(p, c10::cuda::getCurrentCUDAStream()), "backward v2's Delta kernel");
    return dl;
}

std::vector<at::Tensor> dkdv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
                             const at::Tensor& lse, const at::Tensor& dout, bool causal, double scale, int64_t config) {
    params(q, k, v, &o, lse, dout, causal, scale);   // the checks, before any launch
    return dkdv_delta(q, k, v, lse, dout, delta(o, dout), causal, scale, config);
}

std::vector<at::Tensor> bwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
                            const at::Tensor& lse, const at::Tensor& dout, bool causal, double scale, int64_t config) {
    const c10::cuda::CUDAGuard guard(q.device());
    step07::BwdParams p = params(q, k, v, &o, lse, dout, causal, scale);
    auto dl = delta(o, dout);
    auto dkv = dkdv_delta(q, k, v, lse, dout, dl, causal, scale, config);
    auto dq = at::empty_like(q);
    p.delta = dl.data_ptr<float>(); p.dq = dq.data_ptr();
    check_err(step07::bwdw_dq(p, c10::cuda::getCurrentCUDAStream()), "backward v2's dQ kernel");
    return {dq, dkv[0], dkv[1]};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "Experiment: step 07's dK/dV backward on wgmma (sm_90a), with backward v2's Delta and dQ kernels";
    m.def("dkdv", &dkdv, "(q, k, v, o, lse, dout, causal, scale, config) -> [dk, dv]");
    m.def("dkdv_delta", &dkdv_delta, "(q, k, v, lse, dout, delta, causal, scale, config) -> [dk, dv]");
    m.def("delta", &delta, "(o, dout) -> delta (BH, Nq) float32");
    m.def("bwd", &bwd, "(q, k, v, o, lse, dout, causal, scale, config) -> [dq, dk, dv]");
}
