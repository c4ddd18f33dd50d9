// The panel kernel of f32_gemv.h, one template over the vector type of each build (no torch here).
#include "f32_gemv.h"

#include <algorithm>
#include <cstring>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

// How far ahead in the panel stream each k step prefetches, in floats (0: the hardware prefetchers alone, the
// default: on the demo target and the 82M model, 256-4096 floats ahead were no faster, and up to 1.3x slower on
// the 82M model's streamed weights; docs/benchmarks.md). The panels lie back to back: a prefetch runs on into the
// next panel.
#ifndef GEMV_PANEL_AHEAD_FLOATS
#define GEMV_PANEL_AHEAD_FLOATS 0
#endif

namespace triton_llm_native {
namespace {

constexpr int64_t kAhead = GEMV_PANEL_AHEAD_FLOATS;

#if defined(__AVX512F__)
struct Lanes {  // 16 floats; a tile is a whole panel row (4 vectors): 6 x 4 accumulators of 32 registers
  using V = __m512;
  static constexpr int kWidth = 16;
  static constexpr int kColumnVectors = 4;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
};
constexpr const char* kIsa = "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
struct Lanes {  // 8 floats; a tile is a whole panel row (2 vectors): 6 x 2 accumulators of 16 registers
  using V = __m256;
  static constexpr int kWidth = 8;
  static constexpr int kColumnVectors = 2;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
};
constexpr const char* kIsa = "avx2";
#else
struct Lanes {  // eight floats in memory: plain C++ the compiler maps onto whatever vectors the target has
  struct V {
    float v[8];
  };
  static constexpr int kWidth = 8;
  static constexpr int kColumnVectors = 2;
  static V zero() { return V{}; }
  static V load(const float* p) {
    V r;
    std::memcpy(r.v, p, sizeof(r.v));
    return r;
  }
  static V broadcast(const float* p) {
    V r;
    for (float& f : r.v) f = *p;
    return r;
  }
  static V add(V a, V b) {
    for (int i = 0; i < 8; ++i) a.v[i] += b.v[i];
    return a;
  }
  static V fma(V a, V b, V c) {
    for (int i = 0; i < 8; ++i) c.v[i] += a.v[i] * b.v[i];
    return c;
  }
  static void store(float* p, V v) { std::memcpy(p, v.v, sizeof(v.v)); }
};
constexpr const char* kIsa = "generic";
#endif

constexpr int kTileColumns = Lanes::kWidth * Lanes::kColumnVectors;
static_assert(kPanelWidth == kTileColumns, "a tile is a whole panel row: one sequential stream per panel");

// y[t][n0 + j] = x[t] . w[n0 + j] (+ bias) for NT tokens and the tile's kTileColumns columns, of which the first
// `valid` exist (the rest are the last panel's zero padding). `col` points at the tile's first column in panel row 0.
// Every loop over the accumulators is unrolled (`#pragma GCC unroll`): GCC 12 otherwise keeps the array in memory
// and stores all of it on every k, which halved the tile's multiply-add rate (18 of ~36 GFLOP/s on one EPYC core).
template <int NT>
void tile(const float* x, int64_t K, const float* col, const float* bias, float* y, int64_t N, int64_t n0,
          int64_t valid) {
  using V = Lanes::V;
  constexpr int CV = Lanes::kColumnVectors, W = Lanes::kWidth;
  V acc[NT][CV];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t)
#pragma GCC unroll 8
    for (int c = 0; c < CV; ++c) acc[t][c] = Lanes::zero();
  const float* p = col;
  for (int64_t k = 0; k < K; ++k, p += kPanelWidth) {
    if (kAhead > 0) __builtin_prefetch(p + kAhead, 0, 3);
    V wv[CV];
#pragma GCC unroll 8
    for (int c = 0; c < CV; ++c) wv[c] = Lanes::load(p + c * W);
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const V xv = Lanes::broadcast(x + t * K + k);
#pragma GCC unroll 8
      for (int c = 0; c < CV; ++c) acc[t][c] = Lanes::fma(wv[c], xv, acc[t][c]);
    }
  }
  if (valid >= kTileColumns) {
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t)
#pragma GCC unroll 8
      for (int c = 0; c < CV; ++c)
        Lanes::store(y + t * N + n0 + c * W, bias ? Lanes::add(acc[t][c], Lanes::load(bias + n0 + c * W)) : acc[t][c]);
    return;
  }
  alignas(64) float sums[kTileColumns];  // the last panel's partial tile: its valid columns only
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) {
#pragma GCC unroll 8
    for (int c = 0; c < CV; ++c) Lanes::store(sums + c * W, acc[t][c]);
    for (int64_t j = 0; j < valid; ++j) y[t * N + n0 + j] = bias ? sums[j] + bias[n0 + j] : sums[j];
  }
}

void tile_tokens(int64_t nt, const float* x, int64_t K, const float* col, const float* bias, float* y, int64_t N,
                 int64_t n0, int64_t valid) {
  switch (nt) {
    case 1: tile<1>(x, K, col, bias, y, N, n0, valid); break;
    case 2: tile<2>(x, K, col, bias, y, N, n0, valid); break;
    case 3: tile<3>(x, K, col, bias, y, N, n0, valid); break;
    case 4: tile<4>(x, K, col, bias, y, N, n0, valid); break;
    case 5: tile<5>(x, K, col, bias, y, N, n0, valid); break;
    default: tile<6>(x, K, col, bias, y, N, n0, valid); break;
  }
}
static_assert(kGemvMaxTokens == 6, "tile_tokens instantiates tiles of 1..6 tokens");

}  // namespace

void pack_panels_f32(const float* w, float* panels, int64_t N, int64_t K) {
  const int64_t P = panel_count(N);
  std::memset(panels, 0, static_cast<size_t>(P * K * kPanelWidth) * sizeof(float));
  for (int64_t n = 0; n < N; ++n) {
    float* dst = panels + (n / kPanelWidth) * K * kPanelWidth + n % kPanelWidth;
    const float* src = w + n * K;
    for (int64_t k = 0; k < K; ++k) dst[k * kPanelWidth] = src[k];
  }
}

void gemv_f32_panels(const float* x, const float* panels, const float* bias, float* y, int64_t T, int64_t N,
                     int64_t K, int64_t p_begin, int64_t p_end) {
  for (int64_t p = p_begin; p < p_end; ++p) {
    const float* panel = panels + p * K * kPanelWidth;
    const int64_t n0 = p * kPanelWidth;
    if (n0 >= N) break;
    const int64_t valid = std::min<int64_t>(kPanelWidth, N - n0);
    for (int64_t t0 = 0; t0 < T; t0 += kGemvMaxTokens)
      tile_tokens(std::min(kGemvMaxTokens, T - t0), x + t0 * K, K, panel, bias, y + t0 * N, N, n0, valid);
  }
}

const char* gemv_f32_isa() { return kIsa; }

}  // namespace triton_llm_native
