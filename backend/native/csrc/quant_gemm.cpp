// quant_project (quant_gemm.h's GEMM from torch tensors, split over torch's threads by strips) and the ops that tests,
// QuantLinear and benchmarks call it through: quant_gemm, quant_quantize_blocks, quant_gemm_isa.
#include "quant_gemm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <string>
#include <tuple>

namespace triton_llm_native::qgemm {

namespace {
// A thread only for this many multiply-adds at least (as f32_gemv.cpp's split).
constexpr int64_t kMacsPerThread = int64_t{1} << 17;

// The strips' tensors describe a weight of n rows and K = x's columns; refuses anything else naming `who`.
Weights check_weights(const at::Tensor& strips, const at::Tensor& scales, const at::Tensor& aux, int64_t n,
                      int64_t K, const char* who) {
  TORCH_CHECK(K % kQBlock == 0, who, ": the input width ", K, " must be a multiple of ", kQBlock);
  const int64_t S = strip_count(n);
  const bool int4 = strips.scalar_type() == at::kByte;
  TORCH_CHECK(strips.device().is_cpu() && strips.is_contiguous() && (int4 || strips.scalar_type() == at::kChar) &&
                  strips.dim() == 4 && strips.size(0) == S && strips.size(1) == K / (int4 ? 8 : 4) &&
                  strips.size(2) == kStrip && strips.size(3) == 4,
              who, ": strips must be contiguous int8 [", S, ", ", K / 4, ", 16, 4] or uint8 [", S, ", ", K / 8,
              ", 16, 4] (quant_strips.py), got ", strips.sizes(), " ", strips.scalar_type());
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.dim() == 3 &&
                  scales.size(0) == S && scales.size(1) >= 1 && scales.size(2) == kStrip,
              who, ": scales must be contiguous float32 [", S, ", groups, 16], got ", scales.sizes());
  const int64_t G = scales.size(1);
  TORCH_CHECK(K % G == 0 && (K / G) % kQBlock == 0, who, ": ", G, " groups of ", K, " columns: each must be a ",
              "multiple of ", kQBlock, " columns");
  if (int4) {
    TORCH_CHECK(aux.scalar_type() == at::kFloat && aux.is_contiguous() && aux.sizes() == scales.sizes(), who,
                ": int4 zeros must be contiguous float32 shaped like scales");
  } else {
    TORCH_CHECK(aux.scalar_type() == at::kInt && aux.is_contiguous() && aux.dim() == 3 && aux.size(0) == S &&
                    aux.size(1) == K / kQBlock && aux.size(2) == kStrip,
                who, ": int8 wsum must be contiguous int32 [", S, ", ", K / kQBlock, ", 16]");
  }
  return Weights{int4, reinterpret_cast<const uint8_t*>(strips.data_ptr()), scales.data_ptr<float>(),
                 int4 ? nullptr : aux.data_ptr<int32_t>(), int4 ? aux.data_ptr<float>() : nullptr, n, K, G};
}

void check_x(const at::Tensor& x, const char* who) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous() && x.dim() == 2 &&
                  x.size(0) >= 1,
              who, ": x must be a contiguous float32 tensor [T >= 1, K]");
}

}  // namespace

// y [T, n] = the quantized GEMM of x [T, K] (+ bias, may be null); strips over torch's threads (never K).
at::Tensor quant_project(const at::Tensor& x, const at::Tensor& strips, const at::Tensor& scales,
                         const at::Tensor& aux, int64_t n, const float* bias) {
  check_x(x, "quant_project");
  const int64_t T = x.size(0), K = x.size(1), nb = K / kQBlock;
  const Weights w = check_weights(strips, scales, aux, n, K, "quant_project");
  at::Tensor xq = at::empty({T, K}, x.options().dtype(at::kByte));
  at::Tensor sx = at::empty({T, nb}, x.options());
  at::Tensor xsum = at::empty({T, nb}, x.options().dtype(at::kInt));
  quantize_blocks(x.data_ptr<float>(), T, K, offset_activations(w.int4), xq.data_ptr<uint8_t>(), sx.data_ptr<float>(),
                  xsum.data_ptr<int32_t>());
  at::Tensor y = at::empty({T, n}, x.options());
  const int64_t tasks = strip_count(n);
  const int64_t grain = std::max<int64_t>(1, kMacsPerThread / std::max<int64_t>(1, kStrip * K * T));
  auto run = [&](int64_t begin, int64_t end) {
    gemm_strips(w, xq.data_ptr<uint8_t>(), sx.data_ptr<float>(), xsum.data_ptr<int32_t>(), bias,
                y.data_ptr<float>(), T, begin, end);
  };
  if (at::get_num_threads() == 1 || tasks <= grain) {
    run(0, tasks);
  } else {
    at::parallel_for(0, tasks, grain, run);
  }
  return y;
}

namespace {

at::Tensor quant_gemm(const at::Tensor& x, const at::Tensor& strips, const at::Tensor& scales, const at::Tensor& aux,
                      int64_t n, const std::optional<at::Tensor>& bias) {
  check_x(x, "quant_gemm");
  TORCH_CHECK(n > 0, "quant_gemm: n must be positive");
  if (bias) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
                "quant_gemm: bias must be a contiguous float32 tensor of ", n, " elements");
  }
  check_weights(strips, scales, aux, n, x.size(1), "quant_gemm");
  return quant_project(x, strips, scales, aux, n, bias ? bias->data_ptr<float>() : nullptr);
}

// x [T, K] -> (xq int8 [T, K], sx [T, K / 32], xsum int32 [T, K / 32]): the activations as the GEMM sees them.
std::tuple<at::Tensor, at::Tensor, at::Tensor> quant_quantize_blocks(const at::Tensor& x) {
  check_x(x, "quant_quantize_blocks");
  const int64_t T = x.size(0), K = x.size(1);
  TORCH_CHECK(K % kQBlock == 0, "quant_quantize_blocks: the width ", K, " must be a multiple of ", kQBlock);
  at::Tensor xq = at::empty({T, K}, x.options().dtype(at::kChar));
  at::Tensor sx = at::empty({T, K / kQBlock}, x.options());
  at::Tensor xsum = at::empty({T, K / kQBlock}, x.options().dtype(at::kInt));
  quantize_blocks(x.data_ptr<float>(), T, K, false, reinterpret_cast<uint8_t*>(xq.data_ptr()),
                  sx.data_ptr<float>(), xsum.data_ptr<int32_t>());
  return {xq, sx, xsum};
}

std::string quant_gemm_isa() { return gemm_isa(); }

}  // namespace
}  // namespace triton_llm_native::qgemm

TORCH_LIBRARY_FRAGMENT(triton_llm, m) {
  using namespace triton_llm_native::qgemm;
  m.def("quant_gemm(Tensor x, Tensor strips, Tensor scales, Tensor aux, int n, Tensor? bias=None) -> Tensor",
        &quant_gemm);
  m.def("quant_quantize_blocks(Tensor x) -> (Tensor, Tensor, Tensor)", &quant_quantize_blocks);
  m.def("quant_gemm_isa() -> str", &quant_gemm_isa);
}
