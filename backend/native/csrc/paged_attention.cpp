// The decode step's paged K/V write and attention (paged_attention.h); split over torch's threads by
// (token, KV head) when the step is large enough.
#include "paged_attention.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "vec16.h"

namespace triton_llm_native {

void write_kv(const float* qkv, int64_t row_stride, int64_t num_heads, int64_t kv_heads, int64_t head_dim,
              const int64_t* positions, const int32_t* token_rows, const Paged& paged, float* k_cache,
              float* v_cache, int64_t T) {
  const int64_t kv = kv_heads * head_dim;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t slot = paged.slot(token_rows[t], positions[t]);
    const float* k = qkv + t * row_stride + num_heads * head_dim;
    std::copy(k, k + kv, k_cache + slot * kv);
    std::copy(k + kv, k + 2 * kv, v_cache + slot * kv);
  }
}

void paged_attention(const float* qkv, int64_t row_stride, int64_t num_heads, int64_t kv_heads,
                     int64_t head_dim, const int64_t* positions, const int32_t* token_rows, const Paged& paged,
                     const float* k_cache, const float* v_cache, float scale, float* out, int64_t T,
                     int64_t max_ctx) {
  const int64_t G = num_heads / kv_heads;
  const int64_t kv = kv_heads * head_dim;
  const int64_t bs = paged.block_size;
  // a thread per 2^18 multiply-adds at least: a small step never forks
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, max_ctx * G * head_dim));
  at::parallel_for(0, T * kv_heads, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(G * max_ctx));
    std::vector<float> acc(static_cast<size_t>(G * head_dim));
    for (int64_t w = begin; w < end; ++w) {
      const int64_t t = w / kv_heads, kvh = w % kv_heads;
      const int64_t ctx = positions[t] + 1;
      const int32_t* table = paged.block_tables + static_cast<int64_t>(token_rows[t]) * paged.width;
      const float* q = qkv + t * row_stride + kvh * G * head_dim;  // [G, head_dim]
      for (int64_t b = 0, j0 = 0; j0 < ctx; ++b, j0 += bs) {
        const float* kb = k_cache + static_cast<int64_t>(table[b]) * bs * kv + kvh * head_dim;
        const int64_t n = std::min(bs, ctx - j0);
        for (int64_t o = 0; o < n; ++o) {
          const float* k = kb + o * kv;
          for (int64_t g = 0; g < G; ++g) scores[g * max_ctx + j0 + o] = dot(q + g * head_dim, k, head_dim) * scale;
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        float* sg = scores.data() + g * max_ctx;
        float m = -INFINITY;
        for (int64_t j = 0; j < ctx; ++j) m = std::max(m, sg[j]);
        f32x16 sums = {};
        int64_t j = 0;
        for (; j + 16 <= ctx; j += 16) {
          const f32x16 e = exp16(load16(sg + j) - m);
          store16(sg + j, e);
          sums += e;
        }
        float sum = hsum16(sums);
        for (; j < ctx; ++j) {
          sg[j] = std::exp(sg[j] - m);
          sum += sg[j];
        }
        const float inv = 1.f / sum;
#pragma omp simd
        for (int64_t j = 0; j < ctx; ++j) sg[j] *= inv;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t b = 0, j0 = 0; j0 < ctx; ++b, j0 += bs) {
        const float* vb = v_cache + static_cast<int64_t>(table[b]) * bs * kv + kvh * head_dim;
        const int64_t n = std::min(bs, ctx - j0);
        for (int64_t o = 0; o < n; ++o) {
          const float* v = vb + o * kv;
          for (int64_t g = 0; g < G; ++g) axpy(acc.data() + g * head_dim, scores[g * max_ctx + j0 + o], v, head_dim);
        }
      }
      std::copy(acc.begin(), acc.end(), out + t * num_heads * head_dim + kvh * G * head_dim);
    }
  });
}

}  // namespace triton_llm_native
