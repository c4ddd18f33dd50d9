// Design (a) of the weight-only int8 / int4 GEMV (quant_gemv.cpp): R rows x NT tokens, the weight dequantized
// in fp32 registers and FMA'd (AVX-512F/BW/VL when the build's -march has it, else scalar loops). Layouts: see
// quant_gemv.cpp.
#pragma once

#include <cstdint>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define QUANT_GEMV_AVX512 1
#endif

namespace triton_llm_native::quant {

constexpr int kMaxTokens = 8;
constexpr int kBlock = 32;  // int4 columns per packed block

#ifdef QUANT_GEMV_AVX512

inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

// R rows x NT tokens of int8 weights; group is the row (groups == 1) or a multiple of 16 columns.
template <int NT, int R>
inline void int8_rows(const float* x, int64_t in, const int8_t* q, int64_t o, const float* scale, int64_t groups,
                      float* acc_out /* [NT][R] */) {
  const int64_t group = in / groups;
  __m512 acc[NT][R];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 part[NT][R];
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < R; ++r) part[t][r] = _mm512_setzero_ps();
    const int64_t begin = g * group, end = begin + group, full = begin + ((end - begin) & ~int64_t(15));
    for (int64_t i = begin; i < full; i += 16) {
      if ((i & 63) == 0)  // the next step's rows, one step ahead (the hardware prefetcher alone lags)
        for (int r = 0; r < R; ++r) _mm_prefetch((const char*)(q + (o + R + r) * in + i), _MM_HINT_T0);
      __m512 w[R];
      for (int r = 0; r < R; ++r)
        w[r] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(q + (o + r) * in + i))));
      for (int t = 0; t < NT; ++t) {
        const __m512 xv = _mm512_loadu_ps(x + t * in + i);
        for (int r = 0; r < R; ++r) part[t][r] = _mm512_fmadd_ps(w[r], xv, part[t][r]);
      }
    }
    if (full < end) {  // only when one group spans a row whose width is not a multiple of 16
      const __mmask16 m = (__mmask16)((1u << (end - full)) - 1);
      __m512 w[R];
      for (int r = 0; r < R; ++r)
        w[r] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, q + (o + r) * in + full)));
      for (int t = 0; t < NT; ++t) {
        const __m512 xv = _mm512_maskz_loadu_ps(m, x + t * in + full);
        for (int r = 0; r < R; ++r) part[t][r] = _mm512_fmadd_ps(w[r], xv, part[t][r]);
      }
    }
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < R; ++r)
        acc[t][r] = _mm512_fmadd_ps(part[t][r], _mm512_set1_ps(scale[(o + r) * groups + g]), acc[t][r]);
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) acc_out[t * R + r] = hsum(acc[t][r]);
}

// R rows x NT tokens of int4 weights (blocked layout above); group is a multiple of 32.
template <int NT, int R>
inline void int4_rows(const float* x, int64_t in, const uint8_t* p, int64_t o, const float* scale,
                      const float* zeros, int64_t groups, float* acc_out /* [NT][R] */) {
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const int64_t group = in / groups, blocks_per_group = group / kBlock, row_bytes = in / 2;
  __m512 acc[NT][R];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 table[R];  // nibble -> (nibble - zero) * scale, the dequantized value
    for (int r = 0; r < R; ++r) {
      const float zero = zeros ? zeros[(o + r) * groups + g] : 8.f;
      table[r] = _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps(zero)), _mm512_set1_ps(scale[(o + r) * groups + g]));
    }
    for (int64_t b = g * blocks_per_group; b < (g + 1) * blocks_per_group; ++b) {
      if ((b & 3) == 0)
        for (int r = 0; r < R; ++r) _mm_prefetch((const char*)(p + (o + R + r) * row_bytes + b * 16), _MM_HINT_T0);
      __m512 lo[R], hi[R];
      for (int r = 0; r < R; ++r) {
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(p + (o + r) * row_bytes + b * 16)));
        lo[r] = _mm512_permutexvar_ps(v, table[r]);  // uses the index's low 4 bits: the low nibble
        hi[r] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table[r]);
      }
      for (int t = 0; t < NT; ++t) {
        const __m512 x0 = _mm512_loadu_ps(x + t * in + b * kBlock), x1 = _mm512_loadu_ps(x + t * in + b * kBlock + 16);
        for (int r = 0; r < R; ++r) {
          acc[t][r] = _mm512_fmadd_ps(lo[r], x0, acc[t][r]);
          acc[t][r] = _mm512_fmadd_ps(hi[r], x1, acc[t][r]);
        }
      }
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) acc_out[t * R + r] = hsum(acc[t][r]);
}

#else  // scalar fallback

template <int NT, int R>
inline void int8_rows(const float* x, int64_t in, const int8_t* q, int64_t o, const float* scale, int64_t groups,
                      float* acc_out) {
  const int64_t group = in / groups;
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) {
      const int8_t* row = q + (o + r) * in;
      float s = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        float part = 0.f;
        for (int64_t i = g * group; i < (g + 1) * group; ++i) part += float(row[i]) * x[t * in + i];
        s += part * scale[(o + r) * groups + g];
      }
      acc_out[t * R + r] = s;
    }
}

template <int NT, int R>
inline void int4_rows(const float* x, int64_t in, const uint8_t* p, int64_t o, const float* scale,
                      const float* zeros, int64_t groups, float* acc_out) {
  const int64_t group = in / groups, row_bytes = in / 2;
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) {
      const uint8_t* row = p + (o + r) * row_bytes;
      float s = 0.f;
      for (int64_t b = 0; b < in / kBlock; ++b) {
        const int64_t g = b * kBlock / group;
        const float sc = scale[(o + r) * groups + g], zero = zeros ? zeros[(o + r) * groups + g] : 8.f;
        for (int j = 0; j < 16; ++j) {
          const uint8_t byte = row[b * 16 + j];
          s += (float(byte & 0xF) - zero) * sc * x[t * in + b * kBlock + j];
          s += (float(byte >> 4) - zero) * sc * x[t * in + b * kBlock + 16 + j];
        }
      }
      acc_out[t * R + r] = s;
    }
}

#endif

}  // namespace triton_llm_native::quant
