// gemv_f32 (f32_gemv.h): the panels split over torch's threads, and the ops that pack weights into panels and that
// tests and benchmarks call the kernel through.
#include "f32_gemv.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <string>

namespace triton_llm_native {

namespace {
// A thread only for this many multiply-adds at least (256 KiB of weight, ~15 us at one core's bandwidth): a
// fork and a barrier cost a few microseconds when the second thread is spinning, far more when it is not.
constexpr int64_t kMacsPerThread = int64_t{1} << 16;
}  // namespace

void gemv_f32(const float* x, const float* panels, const float* bias, float* y, int64_t T, int64_t N, int64_t K) {
  const int64_t tasks = panel_count(N);
  const int64_t grain = std::max<int64_t>(1, kMacsPerThread / std::max<int64_t>(1, kPanelWidth * K * T));
  if (at::get_num_threads() == 1 || tasks <= grain) {
    gemv_f32_panels(x, panels, bias, y, T, N, K, 0, tasks);
    return;
  }
  at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
    gemv_f32_panels(x, panels, bias, y, T, N, K, begin, end);
  });
}

void check_panels(const at::Tensor& panels, int64_t n, int64_t k, const char* who) {
  TORCH_CHECK(panels.device().is_cpu() && panels.scalar_type() == at::kFloat && panels.is_contiguous() &&
                  panels.dim() == 3 && panels.size(0) == panel_count(n) && panels.size(1) == k &&
                  panels.size(2) == kPanelWidth,
              who, ": panels must be a contiguous float32 tensor [", panel_count(n), ", ", k, ", ", kPanelWidth,
              "] (pack_panels of a weight of ", n, " rows), got ", panels.sizes());
}

namespace {

// w [N, K] -> its panels [ceil(N / kPanelWidth), K, kPanelWidth] (f32_gemv.h).
at::Tensor pack_panels(const at::Tensor& w) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kFloat && w.dim() == 2,
              "pack_panels: expected a float32 CPU weight [N, K]");
  const at::Tensor c = w.contiguous();
  const int64_t N = c.size(0), K = c.size(1);
  at::Tensor panels = at::empty({panel_count(N), K, kPanelWidth}, c.options());
  pack_panels_f32(c.data_ptr<float>(), panels.data_ptr<float>(), N, K);
  return panels;
}

// x [T, K] @ w^T (+ bias [n]) -> [T, n], w given as its panels; any T (kGemvMaxTokens tokens per register tile).
at::Tensor decode_gemv(const at::Tensor& x, const at::Tensor& panels, int64_t n,
                       const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous() && x.dim() == 2,
              "decode_gemv: x must be a contiguous float32 tensor [T, K]");
  TORCH_CHECK(n > 0, "decode_gemv: n must be positive");
  check_panels(panels, n, x.size(1), "decode_gemv");
  if (bias) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
                "decode_gemv: bias must be a contiguous float32 tensor of ", n, " elements");
  }
  at::Tensor y = at::empty({x.size(0), n}, x.options());
  gemv_f32(x.data_ptr<float>(), panels.data_ptr<float>(), bias ? bias->data_ptr<float>() : nullptr,
           y.data_ptr<float>(), x.size(0), n, x.size(1));
  return y;
}

std::string decode_gemv_isa() { return gemv_f32_isa(); }

int64_t gemv_panel_width() { return kPanelWidth; }

}  // namespace
}  // namespace triton_llm_native

TORCH_LIBRARY_FRAGMENT(triton_llm, m) {
  m.def("pack_panels(Tensor w) -> Tensor", &triton_llm_native::pack_panels);
  m.def("decode_gemv(Tensor x, Tensor panels, int n, Tensor? bias=None) -> Tensor", &triton_llm_native::decode_gemv);
  m.def("decode_gemv_isa() -> str", &triton_llm_native::decode_gemv_isa);
  m.def("gemv_panel_width() -> int", &triton_llm_native::gemv_panel_width);
}
