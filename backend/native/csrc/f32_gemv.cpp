// gemv_f32 (f32_gemv.h): the kernel's rows split over torch's threads, and the decode_gemv op that tests and
// benchmarks call it through.
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
constexpr int64_t kRowsPerTask = 8;  // a thread's share is whole steps of the kernel's widest row block
}  // namespace

void gemv_f32(const float* x, const float* w, const float* bias, float* y, int64_t T, int64_t N, int64_t K) {
  const int64_t tasks = (N + kRowsPerTask - 1) / kRowsPerTask;
  const int64_t grain = std::max<int64_t>(1, kMacsPerThread / std::max<int64_t>(1, kRowsPerTask * K * T));
  if (at::get_num_threads() == 1 || tasks <= grain) {
    gemv_f32_rows(x, w, bias, y, T, N, K, 0, N);
    return;
  }
  at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
    gemv_f32_rows(x, w, bias, y, T, N, K, begin * kRowsPerTask, std::min(N, end * kRowsPerTask));
  });
}

namespace {

// x [T, K] @ w [N, K]^T (+ bias [N]) -> [T, N], any T (the kernel takes 8 tokens per pass over w).
at::Tensor decode_gemv(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat &&
                  x.is_contiguous() && w.is_contiguous() && x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1),
              "decode_gemv: contiguous float32 x [T, K] and w [N, K]");
  if (bias) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == w.size(0),
                "decode_gemv: bias must be a contiguous float32 tensor of ", w.size(0), " elements");
  }
  at::Tensor y = at::empty({x.size(0), w.size(0)}, x.options());
  gemv_f32(x.data_ptr<float>(), w.data_ptr<float>(), bias ? bias->data_ptr<float>() : nullptr, y.data_ptr<float>(),
           x.size(0), w.size(0), x.size(1));
  return y;
}

std::string decode_gemv_isa() { return gemv_f32_isa(); }

}  // namespace
}  // namespace triton_llm_native

TORCH_LIBRARY_FRAGMENT(triton_llm, m) {
  m.def("decode_gemv(Tensor x, Tensor w, Tensor? bias=None) -> Tensor", &triton_llm_native::decode_gemv);
  m.def("decode_gemv_isa() -> str", &triton_llm_native::decode_gemv_isa);
}
