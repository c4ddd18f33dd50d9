// Design (b) of the int4 GEMV (quant_gemv_int4_q8 in quant_gemv.cpp): the activations quantized to int8, integer
// dot products (AVX-512 VNNI when the build has it, else the same arithmetic in scalar loops).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "quant_rows.h"

namespace triton_llm_native::quant {

// ---- Design (b) for int4: the activations quantized to int8 per (token, group), integer dot products ----
// x[t, i] ~= xq[t, i] * sx[t, g] (xq in [-127, 127], sx = max |x| / 127 over the group), then
// sum_i (n_i - zero) * scale * x_i ~= scale * sx * (sum_i n_i * xq_i - zero * sum_i xq_i): the nibbles are the
// unsigned operand of VNNI's vpdpbusd (64 products a instruction), xq the signed one. Needs group % 64 == 0.
// Within each 64 columns, xq is stored in the order one 32-byte load of packed nibbles expands to:
// low nibbles of bytes 0..31 (columns 0-15, 32-47), then the high ones (16-31, 48-63).
constexpr int kChunk = 64;

inline int64_t chunk_pos(int64_t c) {  // column within a 64-column chunk -> its byte in the expanded order
  const int64_t blk = c / kBlock, j = c % kBlock;
  return j < 16 ? blk * 16 + j : 32 + blk * 16 + (j - 16);
}

struct QuantizedX {
  std::vector<int8_t> q;      // [n, in], chunk order
  std::vector<float> scale;   // [n, groups]
  std::vector<int32_t> sum;   // [n, groups]: sum of q over the group
};

inline QuantizedX quantize_activations(const float* x, int64_t n, int64_t in, int64_t groups) {
  const int64_t group = in / groups;
  QuantizedX r{std::vector<int8_t>(n * in), std::vector<float>(n * groups), std::vector<int32_t>(n * groups)};
  for (int64_t t = 0; t < n; ++t)
    for (int64_t g = 0; g < groups; ++g) {
      const float* xs = x + t * in + g * group;
      float amax = 0.f;
      for (int64_t i = 0; i < group; ++i) amax = std::max(amax, std::fabs(xs[i]));
      const float sx = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
      int32_t sum = 0;
      for (int64_t i = 0; i < group; ++i) {
        const int v = int(std::nearbyint(xs[i] * inv));
        r.q[t * in + g * group + (i / kChunk) * kChunk + chunk_pos(i % kChunk)] = int8_t(v);
        sum += v;
      }
      r.scale[t * groups + g] = sx;
      r.sum[t * groups + g] = sum;
    }
  return r;
}

#if defined(QUANT_GEMV_AVX512) && defined(__AVX512VNNI__)

template <int NT, int R>
inline void int4_q8_rows(const QuantizedX& xq, int64_t in, const uint8_t* p, int64_t o, const float* scale,
                         const float* zeros, int64_t groups, float* acc_out /* [NT][R] */) {
  const int64_t group = in / groups, row_bytes = in / 2;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 acc[NT][R];
  float corr[NT][R];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps(), corr[t][r] = 0.f;
  for (int64_t g = 0; g < groups; ++g) {
    __m512i dot[NT][R];
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < R; ++r) dot[t][r] = _mm512_setzero_si512();
    for (int64_t c = g * group; c < (g + 1) * group; c += kChunk) {
      if ((c & 127) == 0)
        for (int r = 0; r < R; ++r) _mm_prefetch((const char*)(p + (o + R + r) * row_bytes + c / 2), _MM_HINT_T0);
      __m512i xv[NT];
      for (int t = 0; t < NT; ++t) xv[t] = _mm512_loadu_si512(xq.q.data() + t * in + c);
      for (int r = 0; r < R; ++r) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)(p + (o + r) * row_bytes + c / 2));
        const __m512i w = _mm512_and_si512(
            _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1), low4);
        for (int t = 0; t < NT; ++t) dot[t][r] = _mm512_dpbusd_epi32(dot[t][r], w, xv[t]);
      }
    }
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < R; ++r) {
        const float f = scale[(o + r) * groups + g] * xq.scale[t * groups + g];
        const float zero = zeros ? zeros[(o + r) * groups + g] : 8.f;
        acc[t][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[t][r]), _mm512_set1_ps(f), acc[t][r]);
        corr[t][r] += f * zero * float(xq.sum[t * groups + g]);
      }
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) acc_out[t * R + r] = hsum(acc[t][r]) - corr[t][r];
}

#else  // the same arithmetic, scalar

template <int NT, int R>
inline void int4_q8_rows(const QuantizedX& xq, int64_t in, const uint8_t* p, int64_t o, const float* scale,
                         const float* zeros, int64_t groups, float* acc_out) {
  const int64_t group = in / groups, row_bytes = in / 2;
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) {
      float acc = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        int32_t dot = 0;
        for (int64_t c = g * group; c < (g + 1) * group; c += kChunk)
          for (int b = 0; b < 32; ++b) {
            const uint8_t byte = p[(o + r) * row_bytes + c / 2 + b];
            dot += int32_t(byte & 0xF) * xq.q[t * in + c + b] + int32_t(byte >> 4) * xq.q[t * in + c + 32 + b];
          }
        const float f = scale[(o + r) * groups + g] * xq.scale[t * groups + g];
        const float zero = zeros ? zeros[(o + r) * groups + g] : 8.f;
        acc += f * float(dot) - f * zero * float(xq.sum[t * groups + g]);
      }
      acc_out[t * R + r] = acc;
    }
}

#endif

}  // namespace triton_llm_native::quant
