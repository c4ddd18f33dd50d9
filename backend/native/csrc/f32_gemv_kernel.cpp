// The f32 GEMV kernel of f32_gemv.h, one template over three lane types (no torch here).
#include "f32_gemv.h"

#include <cstring>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

// How far ahead in its row each stream prefetches (0: none, the hardware prefetchers alone). Measured on the
// 82M model's projections (EPYC, 1 thread, docs/benchmarks.md): with 4 KiB pages no prefetch was fastest (18.3
// ms per pass against 20.9-21.8 ms at 64-512 floats ahead); on huge pages, where the decode step keeps its
// weights, the distance made no difference (17.6-19.3 ms).
#ifndef GEMV_PREFETCH_FLOATS
#define GEMV_PREFETCH_FLOATS 0
#endif

namespace triton_llm_native {
namespace {

constexpr int64_t kPrefetch = GEMV_PREFETCH_FLOATS;
constexpr int64_t kLineFloats = 16;  // 64-byte cache lines

#if defined(__AVX512F__)

struct Lanes {  // one AVX-512 register
  using V = __m512;
  static constexpr int kWidth = 16;
  static constexpr int kAccumulators = 24;  // of 32 registers; the rest hold x and w
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load_first(const float* p, int64_t n) { return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float sum(V v) { return _mm512_reduce_add_ps(v); }
};
constexpr const char* kIsa = "avx512";

#elif defined(__AVX2__) && defined(__FMA__)

struct Lanes {  // one AVX2 register
  using V = __m256;
  static constexpr int kWidth = 8;
  static constexpr int kAccumulators = 12;  // of 16 registers
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load_first(const float* p, int64_t n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), idx));
  }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float sum(V v) {
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
  }
};
constexpr const char* kIsa = "avx2";

#else

struct Lanes {  // eight floats in memory: plain C++ the compiler maps onto whatever vectors the target has
  struct V {
    float v[8];
  };
  static constexpr int kWidth = 8;
  static constexpr int kAccumulators = 16;
  static V zero() { return V{}; }
  static V load(const float* p) {
    V r;
    std::memcpy(r.v, p, sizeof(r.v));
    return r;
  }
  static V load_first(const float* p, int64_t n) {
    V r{};
    std::memcpy(r.v, p, static_cast<size_t>(n) * sizeof(float));
    return r;
  }
  static V fma(V a, V b, V c) {
    for (int i = 0; i < 8; ++i) c.v[i] += a.v[i] * b.v[i];
    return c;
  }
  static float sum(V a) { return ((a.v[0] + a.v[4]) + (a.v[2] + a.v[6])) + ((a.v[1] + a.v[5]) + (a.v[3] + a.v[7])); }
};
constexpr const char* kIsa = "generic";

#endif

// Rows per step for NT tokens: NT * R accumulators fit in the registers, at most 8 rows.
template <int NT>
constexpr int rows_per_step() {
  constexpr int r = Lanes::kAccumulators / NT;
  return r < 1 ? 1 : (r > 8 ? 8 : r);
}

// out[t * R + r] = x[t] . w[r] for R consecutive rows of w (row stride K) and NT tokens (row stride K).
template <int NT, int R>
inline void dot_rows(const float* x, const float* w, int64_t K, float* out) {
  using V = Lanes::V;
  constexpr int W = Lanes::kWidth;
  V acc[NT][R];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = Lanes::zero();
  int64_t k = 0;
  for (; k + W <= K; k += W) {
    if (kPrefetch > 0 && k % kLineFloats == 0)
      for (int r = 0; r < R; ++r) __builtin_prefetch(w + r * K + k + kPrefetch, 0, 3);
    V xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = Lanes::load(x + t * K + k);
    for (int r = 0; r < R; ++r) {
      const V wv = Lanes::load(w + r * K + k);
      for (int t = 0; t < NT; ++t) acc[t][r] = Lanes::fma(wv, xv[t], acc[t][r]);
    }
  }
  if (k < K) {  // the last K % W columns
    const int64_t n = K - k;
    V xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = Lanes::load_first(x + t * K + k, n);
    for (int r = 0; r < R; ++r) {
      const V wv = Lanes::load_first(w + r * K + k, n);
      for (int t = 0; t < NT; ++t) acc[t][r] = Lanes::fma(wv, xv[t], acc[t][r]);
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) out[t * R + r] = Lanes::sum(acc[t][r]);
}

template <int NT>
void rows_for_tokens(const float* x, const float* w, const float* bias, float* y, int64_t N, int64_t K,
                     int64_t n_begin, int64_t n_end) {
  constexpr int R = rows_per_step<NT>();
  float acc[NT * R];
  int64_t n = n_begin;
  for (; n + R <= n_end; n += R) {
    dot_rows<NT, R>(x, w + n * K, K, acc);
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < R; ++r) y[t * N + n + r] = acc[t * R + r] + (bias ? bias[n + r] : 0.f);
  }
  for (; n < n_end; ++n) {
    dot_rows<NT, 1>(x, w + n * K, K, acc);
    for (int t = 0; t < NT; ++t) y[t * N + n] = acc[t] + (bias ? bias[n] : 0.f);
  }
}

}  // namespace

void gemv_f32_rows(const float* x, const float* w, const float* bias, float* y, int64_t T, int64_t N, int64_t K,
                   int64_t n_begin, int64_t n_end) {
  for (int64_t t0 = 0; t0 < T; t0 += kGemvMaxTokens) {  // more than 8 tokens: 8 at a time, the weight re-read
    const float* xt = x + t0 * K;
    float* yt = y + t0 * N;
    switch (T - t0 < kGemvMaxTokens ? T - t0 : kGemvMaxTokens) {
      case 1: rows_for_tokens<1>(xt, w, bias, yt, N, K, n_begin, n_end); break;
      case 2: rows_for_tokens<2>(xt, w, bias, yt, N, K, n_begin, n_end); break;
      case 3: rows_for_tokens<3>(xt, w, bias, yt, N, K, n_begin, n_end); break;
      case 4: rows_for_tokens<4>(xt, w, bias, yt, N, K, n_begin, n_end); break;
      case 5: rows_for_tokens<5>(xt, w, bias, yt, N, K, n_begin, n_end); break;
      case 6: rows_for_tokens<6>(xt, w, bias, yt, N, K, n_begin, n_end); break;
      case 7: rows_for_tokens<7>(xt, w, bias, yt, N, K, n_begin, n_end); break;
      default: rows_for_tokens<8>(xt, w, bias, yt, N, K, n_begin, n_end); break;
    }
  }
}

const char* gemv_f32_isa() { return kIsa; }

}  // namespace triton_llm_native
