// The element-wise steps of a decoder layer (layer_ops.h).
#include "layer_ops.h"

#include <cmath>

#include "vec16.h"

namespace triton_llm_native {

void add_rms_norm(float* x, const float* delta, const float* weight, float* out, int64_t T, int64_t D,
                  double eps) {
  for (int64_t t = 0; t < T; ++t) {
    float* xr = x + t * D;
    if (delta != nullptr) {
      const float* dr = delta + t * D;
      for (int64_t i = 0; i < D; ++i) xr[i] += dr[i];
    }
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < D; ++i) ss += xr[i] * xr[i];
    const float inv = 1.f / std::sqrt(ss / static_cast<float>(D) + static_cast<float>(eps));
    float* o = out + t * D;
    for (int64_t i = 0; i < D; ++i) o[i] = weight[i] * (xr[i] * inv);
  }
}

void rms_norm_heads(float* qkv, int64_t row_stride, int64_t first, int64_t heads, int64_t head_dim,
                    const float* weight, double eps, int64_t T) {
  for (int64_t t = 0; t < T; ++t) {
    float* row = qkv + t * row_stride + first * head_dim;  // `heads` contiguous heads
    add_rms_norm(row, nullptr, weight, row, heads, head_dim, eps);
  }
}

void apply_rope(float* qkv, int64_t row_stride, int64_t heads, int64_t head_dim, int64_t rotary_dim,
                const int64_t* positions, const float* cos_table, const float* sin_table, int64_t T) {
  const int64_t half = rotary_dim / 2;
  for (int64_t t = 0; t < T; ++t) {
    const float* c = cos_table + positions[t] * rotary_dim;
    const float* s = sin_table + positions[t] * rotary_dim;
    for (int64_t h = 0; h < heads; ++h) {
      float* x = qkv + t * row_stride + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c[i] - x2 * s[i];
        x[i + half] = x2 * c[i + half] + x1 * s[i + half];
      }
    }
  }
}

void silu_mul(const float* gate_up, float* act, int64_t T, int64_t I) {
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gate_up + t * 2 * I;
    const float* u = g + I;
    float* a = act + t * I;
    int64_t i = 0;
    for (; i + 16 <= I; i += 16) {
      const f32x16 gv = load16(g + i);
      store16(a + i, gv / (1.f + exp16(-gv)) * load16(u + i));
    }
    for (; i < I; ++i) a[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
  }
}

void gelu_tanh_mul(const float* gate_up, float* act, int64_t T, int64_t I) {
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kKappa = 0.044715f;
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gate_up + t * 2 * I;
    const float* u = g + I;
    float* a = act + t * I;
    for (int64_t i = 0; i < I; ++i) {
      const float x = g[i];
      a[i] = 0.5f * x * (1.f + std::tanh(kBeta * (x + kKappa * x * x * x))) * u[i];
    }
  }
}

}  // namespace triton_llm_native
