// add_lora_delta (lora_delta.h), and the lora_delta op that runs it alone for its test against the torch
// reference (tests/backend/native/test_lora_delta.py). The shrink is split over (token, rank) pairs, the expand
// over output rows, both through torch's threads: a batch-1 step has one token but N outputs to spread.
#include "lora_delta.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

namespace triton_llm_native {

void add_lora_delta(const at::Tensor& x, at::Tensor& y, const at::Tensor& a, const at::Tensor& b,
                    const int32_t* slots) {
  const int64_t T = x.size(0), K = x.size(1), N = y.size(1), S = a.size(0), R = a.size(1);
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(2) == K && b.size(0) == S && b.size(1) == N &&
                  b.size(2) == R && y.size(0) == T,
              "lora delta: expected x [T, K], y [T, N], A [S, R, K], B [S, N, R]; got K=", K, " N=", N, " A ",
              a.sizes(), " B ", b.sizes());
  TORCH_CHECK(x.is_contiguous() && y.is_contiguous() && a.is_contiguous() && b.is_contiguous() &&
                  x.scalar_type() == at::kFloat && a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat,
              "lora delta: expected contiguous float32 tensors");
  std::vector<int64_t> tokens;  // the tokens with an adapter
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(slots[t] < S, "lora delta: token ", t, " has slot ", slots[t], ", past the ", S, " slots");
    if (slots[t] >= 0) tokens.push_back(t);
  }
  if (tokens.empty()) return;
  const int64_t M = static_cast<int64_t>(tokens.size());
  const float* xp = x.data_ptr<float>();
  const float* ap = a.data_ptr<float>();
  const float* bp = b.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  std::vector<float> mid(M * R);  // [M, R] the shrink
  at::parallel_for(0, M * R, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = tokens[i / R], r = i % R;
      const float* ar = ap + (static_cast<int64_t>(slots[t]) * R + r) * K;
      const float* xr = xp + t * K;
      float acc = 0.f;
      for (int64_t k = 0; k < K; ++k) acc += ar[k] * xr[k];
      mid[i] = acc;
    }
  });
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
    for (int64_t m = 0; m < M; ++m) {
      const int64_t t = tokens[m];
      const float* bs = bp + static_cast<int64_t>(slots[t]) * N * R;
      const float* mr = mid.data() + m * R;
      float* yr = yp + t * N;
      for (int64_t n = begin; n < end; ++n) {
        const float* bn = bs + n * R;
        float acc = 0.f;
        for (int64_t r = 0; r < R; ++r) acc += bn[r] * mr[r];
        yr[n] += acc;
      }
    }
  });
}

namespace {

at::Tensor lora_delta(const at::Tensor& x, const at::Tensor& y, const at::Tensor& a, const at::Tensor& b,
                      const at::Tensor& slots) {  // returns y + the delta (y is not changed)
  TORCH_CHECK(slots.scalar_type() == at::kInt && slots.numel() == x.size(0), "lora_delta: slots must be [T] int32");
  at::Tensor out = y.contiguous().clone();
  at::Tensor s = slots.contiguous();
  add_lora_delta(x.contiguous(), out, a.contiguous(), b.contiguous(), s.data_ptr<int32_t>());
  return out;
}

}  // namespace
}  // namespace triton_llm_native

TORCH_LIBRARY_FRAGMENT(triton_llm, m) {
  m.def("lora_delta(Tensor x, Tensor y, Tensor a, Tensor b, Tensor slots) -> Tensor");
  m.impl("lora_delta", c10::DispatchKey::CPU, TORCH_FN(triton_llm_native::lora_delta));
}
