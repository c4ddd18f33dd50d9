// The kernels of quant_gemm.h: block-wise activation quantization and the strip tiles, AVX-512 VNNI, AVX2 or plain
// C++ (the same integer dots and float operations per output, so all give the same bits). No torch here.
#include "quant_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define QGEMM_VNNI 1
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define QGEMM_AVX2 1
#endif

namespace triton_llm_native::qgemm {
namespace {

inline int32_t load4(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Strips per tile: enough independent accumulators for few tokens, few enough to stay in registers for more
// (AVX2 has 16 vector registers where AVX-512 has 32).
template <int NT>
constexpr int strips_per_tile() {
#ifdef QGEMM_AVX2
  return NT == 1 ? 2 : 1;
#else
  return NT <= 2 ? 4 : 2;
#endif
}

constexpr int64_t kGroupStrips = 4;   // strips a thread takes together (their weights shared by every token tile)
constexpr int64_t kSpanBlocks = 8;    // blocks of a span: a strip group's weights for it stay in L1 (16 KiB int8)
constexpr int64_t kPartStride = kGroupStrips * kStrip;  // floats of one token's partial sums in a strip group

// Blocks [b0, b1) of a tile; `part` holds its partial sums between spans (token t, strip r at
// part[t * kPartStride + r * kStrip]): read unless the span starts the row, written unless it ends it, when the
// sums (+ bias) go to y instead. The sums pass through memory unchanged, so the spans do not change any result.
struct Span {
  int64_t b0, b1;
  float* part;
};

#ifdef QGEMM_VNNI

template <int NT, int R>
void tile(const Weights& w, int64_t s0, const uint8_t* xq, const float* sx, const int32_t* xsum, const float* bias,
          float* y, int64_t n_out, const Span& span) {
  const int64_t K = w.k, nb = K / kQBlock, G = w.groups, bpg = nb / G;
  __m512 acc[NT][R];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r)
      acc[t][r] = span.b0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(span.part + t * kPartStride + r * kStrip);
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int64_t b = span.b0; b < span.b1; ++b) {
    __m512i dot[NT][R];
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < R; ++r) dot[t][r] = _mm512_setzero_si512();
    __m512 v[NT][R];
    if (!w.int4) {
      const uint8_t* base = w.strips + s0 * K * kStrip + b * kQBlock * kStrip;
      for (int q = 0; q < 8; ++q) {
        __m512i wv[R];
        for (int r = 0; r < R; ++r) wv[r] = _mm512_loadu_si512(base + r * K * kStrip + q * 64);
        for (int t = 0; t < NT; ++t) {
          const __m512i xb = _mm512_set1_epi32(load4(xq + t * K + b * kQBlock + q * 4));
          for (int r = 0; r < R; ++r) dot[t][r] = _mm512_dpbusd_epi32(dot[t][r], xb, wv[r]);
        }
      }
      for (int r = 0; r < R; ++r) {
        const __m512i ws = _mm512_loadu_si512(w.wsum + ((s0 + r) * nb + b) * kStrip);
        for (int t = 0; t < NT; ++t) v[t][r] = _mm512_cvtepi32_ps(_mm512_sub_epi32(dot[t][r], ws));
      }
    } else {
      const uint8_t* base = w.strips + s0 * K * (kStrip / 2) + b * kQBlock * (kStrip / 2);
      for (int o = 0; o < 4; ++o) {
        __m512i lo[R], hi[R];
        for (int r = 0; r < R; ++r) {
          const __m512i raw = _mm512_loadu_si512(base + r * K * (kStrip / 2) + o * 64);
          lo[r] = _mm512_and_si512(raw, low4);
          hi[r] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
        }
        for (int t = 0; t < NT; ++t) {
          const __m512i x0 = _mm512_set1_epi32(load4(xq + t * K + b * kQBlock + o * 8));
          const __m512i x1 = _mm512_set1_epi32(load4(xq + t * K + b * kQBlock + o * 8 + 4));
          for (int r = 0; r < R; ++r) {
            dot[t][r] = _mm512_dpbusd_epi32(dot[t][r], lo[r], x0);
            dot[t][r] = _mm512_dpbusd_epi32(dot[t][r], hi[r], x1);
          }
        }
      }
      for (int r = 0; r < R; ++r) {
        const __m512 z = _mm512_loadu_ps(w.zeros + ((s0 + r) * G + b / bpg) * kStrip);
        for (int t = 0; t < NT; ++t)
          v[t][r] = _mm512_fnmadd_ps(z, _mm512_set1_ps(float(xsum[t * nb + b])), _mm512_cvtepi32_ps(dot[t][r]));
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m512 sc = _mm512_loadu_ps(w.scales + ((s0 + r) * G + b / bpg) * kStrip);
      for (int t = 0; t < NT; ++t)
        acc[t][r] = _mm512_fmadd_ps(v[t][r], _mm512_mul_ps(sc, _mm512_set1_ps(sx[t * nb + b])), acc[t][r]);
    }
  }
  if (span.b1 < nb) {
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < R; ++r) _mm512_storeu_ps(span.part + t * kPartStride + r * kStrip, acc[t][r]);
    return;
  }
  for (int r = 0; r < R; ++r) {
    const int64_t row = (s0 + r) * kStrip, valid = std::min<int64_t>(kStrip, n_out - row);
    const __mmask16 m = valid >= kStrip ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1);
    const __m512 bv = bias ? _mm512_maskz_loadu_ps(m, bias + row) : _mm512_setzero_ps();
    for (int t = 0; t < NT; ++t)
      _mm512_mask_storeu_ps(y + t * n_out + row, m, bias ? _mm512_add_ps(acc[t][r], bv) : acc[t][r]);
  }
}
constexpr const char* kIsa = "avx512_vnni";

#elif defined(QGEMM_AVX2)

// A quad's 64 bytes (16 rows x 4 columns) are two vectors of 8 rows each; a row's 4 products end in its int32 lane.
// int8: maddubs takes unsigned x signed bytes, so it gets |w| and x carrying w's sign (sign_epi8): the pair sums are
// at most 2 x 127 x 127 in magnitude (no saturation), madd with ones folds a row's two pairs into its int32 lane:
// exactly the signed dot, which is what VNNI's dot of offset activations minus wsum gives (so this build asks for
// activations without the offset: offset_activations). int4: unsigned nibbles x
// signed activations need no sign trick, and a block's 4 octets of pair sums stay below 4 x 2 x 2 x 15 x 127 =
// 15,240 in int16, so one madd per block folds them.
inline __m256i ones16() { return _mm256_set1_epi16(1); }

// x's 4 signed bytes at p broadcast to every int32 lane (this build quantizes activations without the offset)
inline __m256i x_quad(const uint8_t* p) { return _mm256_set1_epi32(load4(p)); }

// Every vector of a token x strip x half array of integer sums set to 0.
template <int NT, int R>
inline void zero_sums(__m256i (&v)[NT][R][2]) {
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) v[t][r][h] = _mm256_setzero_si256();
}

// The int32 row dots dot[t][r][h] of block b (rows 8h..8h+7 of strip s0 + r) for NT tokens.
template <int NT, int R>
inline void block_dots_int8(const Weights& w, int64_t s0, int64_t b, const uint8_t* xq, __m256i (&dot)[NT][R][2]) {
  const int64_t K = w.k;
  zero_sums<NT, R>(dot);
  const uint8_t* base = w.strips + s0 * K * kStrip + b * kQBlock * kStrip;
  for (int q = 0; q < 8; ++q) {
    __m256i wv[R][2], wa[R][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        wv[r][h] = _mm256_loadu_si256((const __m256i*)(base + r * K * kStrip + q * 64 + 32 * h));
        wa[r][h] = _mm256_abs_epi8(wv[r][h]);
      }
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const __m256i xk = x_quad(xq + t * K + b * kQBlock + q * 4);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const __m256i pairs = _mm256_maddubs_epi16(wa[r][h], _mm256_sign_epi8(xk, wv[r][h]));
          dot[t][r][h] = _mm256_add_epi32(dot[t][r][h], _mm256_madd_epi16(pairs, ones16()));
        }
    }
  }
}

template <int NT, int R>
inline void block_dots_int4(const Weights& w, int64_t s0, int64_t b, const uint8_t* xq, __m256i (&dot)[NT][R][2]) {
  const int64_t K = w.k;
  __m256i pairs[NT][R][2];  // int16 pair sums of the block's 4 octets
  zero_sums<NT, R>(pairs);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const uint8_t* base = w.strips + s0 * K * (kStrip / 2) + b * kQBlock * (kStrip / 2);
  for (int o = 0; o < 4; ++o) {
    __m256i lo[R][2], hi[R][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256i raw = _mm256_loadu_si256((const __m256i*)(base + r * K * (kStrip / 2) + o * 64 + 32 * h));
        lo[r][h] = _mm256_and_si256(raw, low4);
        hi[r][h] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      }
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const __m256i x0 = x_quad(xq + t * K + b * kQBlock + o * 8);
      const __m256i x1 = x_quad(xq + t * K + b * kQBlock + o * 8 + 4);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h)
          pairs[t][r][h] = _mm256_add_epi16(
              pairs[t][r][h], _mm256_add_epi16(_mm256_maddubs_epi16(lo[r][h], x0), _mm256_maddubs_epi16(hi[r][h], x1)));
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) dot[t][r][h] = _mm256_madd_epi16(pairs[t][r][h], ones16());
}

// The float sums live in `acc` (memory, L1) between blocks: the block's dot accumulators take the registers.
template <int NT, int R, bool kInt4>
void tile_of(const Weights& w, int64_t s0, const uint8_t* xq, const float* sx, const int32_t* xsum,
             const float* bias, float* y, int64_t n_out, const Span& span) {
  const int64_t nb = w.k / kQBlock, G = w.groups, bpg = nb / G;
  alignas(32) float acc[NT][R][kStrip];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < kStrip; ++j) acc[t][r][j] = span.b0 == 0 ? 0.f : span.part[t * kPartStride + r * kStrip + j];
  for (int64_t b = span.b0, g = span.b0 / bpg, in_group = span.b0 % bpg; b < span.b1; ++b) {
    __m256i dot[NT][R][2];
    if (kInt4) block_dots_int4<NT, R>(w, s0, b, xq, dot);
    else block_dots_int8<NT, R>(w, s0, b, xq, dot);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const int64_t gi = ((s0 + r) * G + g) * kStrip + 8 * h;
        const __m256 sc = _mm256_loadu_ps(w.scales + gi);
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) {
          const __m256 v = kInt4 ? _mm256_fnmadd_ps(_mm256_loadu_ps(w.zeros + gi),
                                                    _mm256_set1_ps(float(xsum[t * nb + b])),
                                                    _mm256_cvtepi32_ps(dot[t][r][h]))
                                 : _mm256_cvtepi32_ps(dot[t][r][h]);
          float* a = acc[t][r] + 8 * h;
          _mm256_store_ps(a, _mm256_fmadd_ps(v, _mm256_mul_ps(sc, _mm256_set1_ps(sx[t * nb + b])), _mm256_load_ps(a)));
        }
      }
    if (++in_group == bpg) in_group = 0, ++g;   // g = b / bpg without a division per block
  }
  if (span.b1 < nb) {
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < R; ++r) std::memcpy(span.part + t * kPartStride + r * kStrip, acc[t][r], sizeof(acc[t][r]));
    return;
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < kStrip; ++j) {
      const int64_t row = (s0 + r) * kStrip + j;
      if (row >= n_out) break;
      for (int t = 0; t < NT; ++t) y[t * n_out + row] = acc[t][r][j] + (bias ? bias[row] : 0.f);
    }
}

template <int NT, int R>
void tile(const Weights& w, int64_t s0, const uint8_t* xq, const float* sx, const int32_t* xsum, const float* bias,
          float* y, int64_t n_out, const Span& span) {
  if (w.int4) tile_of<NT, R, true>(w, s0, xq, sx, xsum, bias, y, n_out, span);
  else tile_of<NT, R, false>(w, s0, xq, sx, xsum, bias, y, n_out, span);
}
constexpr const char* kIsa = "avx2";

#else  // plain C++, lanes innermost (the compiler vectorizes them; no reduction to reassociate)

template <int NT, int R>
void tile(const Weights& w, int64_t s0, const uint8_t* xq, const float* sx, const int32_t* xsum, const float* bias,
          float* y, int64_t n_out, const Span& span) {
  constexpr int L = R * kStrip;
  const int64_t K = w.k, nb = K / kQBlock, G = w.groups, bpg = nb / G;
  float acc[NT][L] = {};
  if (span.b0 > 0)
    for (int t = 0; t < NT; ++t)
      for (int i = 0; i < L; ++i) acc[t][i] = span.part[t * kPartStride + i];
  for (int64_t b = span.b0; b < span.b1; ++b) {
    int32_t dot[NT][L] = {};
    for (int64_t c = 0; c < kQBlock; ++c) {
      const int64_t k = b * kQBlock + c;
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < kStrip; ++j) {
          int32_t wq;
          if (!w.int4) {
            wq = int8_t(w.strips[(s0 + r) * K * kStrip + (k / 4) * 64 + j * 4 + k % 4]);
          } else {
            const uint8_t byte = w.strips[(s0 + r) * K * (kStrip / 2) + (k / 8) * 64 + j * 4 + k % 4];
            wq = (k % 8) < 4 ? (byte & 0xF) : (byte >> 4);
          }
          for (int t = 0; t < NT; ++t)
            dot[t][r * kStrip + j] += wq * (w.int4 ? int32_t(int8_t(xq[t * K + k])) : int32_t(xq[t * K + k]));
        }
    }
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < kStrip; ++j) {
        const int64_t gi = ((s0 + r) * G + b / bpg) * kStrip + j;
        for (int t = 0; t < NT; ++t) {
          const float v = w.int4 ? std::fma(-w.zeros[gi], float(xsum[t * nb + b]), float(dot[t][r * kStrip + j]))
                                 : float(dot[t][r * kStrip + j] - w.wsum[((s0 + r) * nb + b) * kStrip + j]);
          acc[t][r * kStrip + j] = std::fma(v, w.scales[gi] * sx[t * nb + b], acc[t][r * kStrip + j]);
        }
      }
  }
  if (span.b1 < nb) {
    for (int t = 0; t < NT; ++t)
      for (int i = 0; i < L; ++i) span.part[t * kPartStride + i] = acc[t][i];
    return;
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < kStrip; ++j) {
      const int64_t row = (s0 + r) * kStrip + j;
      if (row >= n_out) break;
      for (int t = 0; t < NT; ++t) y[t * n_out + row] = acc[t][r * kStrip + j] + (bias ? bias[row] : 0.f);
    }
}
constexpr const char* kIsa = "generic";

#endif

// Strips [s_begin, s_end) of one strip group for NT tokens over one span: R strips a tile, then the remainder one
// strip at a time; `part` is the group's partial sums of these tokens.
template <int NT>
void tokens_tile(const Weights& w, int64_t s_begin, int64_t s_end, const uint8_t* xq, const float* sx,
                 const int32_t* xsum, const float* bias, float* y, int64_t b0, int64_t b1, float* part) {
  constexpr int R = strips_per_tile<NT>();
  int64_t s = s_begin;
  for (; s + R <= s_end; s += R) tile<NT, R>(w, s, xq, sx, xsum, bias, y, w.n, {b0, b1, part + (s - s_begin) * kStrip});
  for (; s < s_end; ++s) tile<NT, 1>(w, s, xq, sx, xsum, bias, y, w.n, {b0, b1, part + (s - s_begin) * kStrip});
}

}  // namespace

void quantize_blocks(const float* x, int64_t T, int64_t K, bool offset, uint8_t* xq, float* sx, int32_t* xsum) {
  const int64_t nb = K / kQBlock;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < nb; ++b) {
      const float* xs = x + t * K + b * kQBlock;
      uint8_t* qs = xq + t * K + b * kQBlock;
#ifdef QGEMM_VNNI
      const __m512 v0 = _mm512_loadu_ps(xs), v1 = _mm512_loadu_ps(xs + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
#elif defined(QGEMM_AVX2)
      const __m256 sign = _mm256_set1_ps(-0.f);
      __m256 v[4], m = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(xs + 8 * i);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
      }
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
#else
      float amax = 0.f;
      for (int64_t i = 0; i < kQBlock; ++i) amax = std::max(amax, std::fabs(xs[i]));
#endif
      const float inv = amax > 0.f ? 127.f / amax : 0.f;
      sx[t * nb + b] = amax * (1.f / 127.f);
#ifdef QGEMM_VNNI
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(inv)));  // round to nearest even
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(inv)));
      xsum[t * nb + b] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
      const __m128i flip = _mm_set1_epi8(offset ? char(0x80) : 0);
      _mm_storeu_si128((__m128i*)qs, _mm_xor_si128(_mm512_cvtepi32_epi8(q0), flip));
      _mm_storeu_si128((__m128i*)(qs + 16), _mm_xor_si128(_mm512_cvtepi32_epi8(q1), flip));
#elif defined(QGEMM_AVX2)
      __m256i q[4], total = _mm256_setzero_si256();
      for (int i = 0; i < 4; ++i) {
        q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(inv)));  // round to nearest even
        total = _mm256_add_epi32(total, q[i]);
      }
      __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
      t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4E));
      xsum[t * nb + b] = _mm_cvtsi128_si32(_mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xB1)));
      // |q| <= 127: the packs do not saturate; they interleave 128-bit lanes, the permute puts them back in order
      const __m256i bytes = _mm256_permutevar8x32_epi32(
          _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])),
          _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256((__m256i*)qs, _mm256_xor_si256(bytes, _mm256_set1_epi8(offset ? char(0x80) : 0)));
#else
      int32_t sum = 0;
      for (int64_t i = 0; i < kQBlock; ++i) {
        const int32_t q = int32_t(std::nearbyint(xs[i] * inv));
        sum += q;
        qs[i] = uint8_t(int8_t(q)) ^ (offset ? 0x80 : 0);
      }
      xsum[t * nb + b] = sum;
#endif
    }
}

void gemm_strips(const Weights& w, const uint8_t* xq, const float* sx, const int32_t* xsum, const float* bias,
                 float* y, int64_t T, int64_t s_begin, int64_t s_end) {
  const int64_t nb = w.k / kQBlock;
  std::vector<float> part(static_cast<size_t>(T * kPartStride));  // every token's partial sums of one strip group
  // Strip groups outermost, then spans of blocks, then token tiles: a group's weights for a span stay in L1 while
  // every token tile passes over them (each weight byte read from memory once a step).
  for (int64_t g0 = s_begin; g0 < s_end; g0 += kGroupStrips) {
    const int64_t g1 = std::min(s_end, g0 + kGroupStrips);
    for (int64_t b0 = 0; b0 < nb; b0 += kSpanBlocks) {
      const int64_t b1 = std::min(nb, b0 + kSpanBlocks);
      for (int64_t t0 = 0; t0 < T; t0 += kQMaxTokens) {
        const int64_t nt = std::min(kQMaxTokens, T - t0);
        const uint8_t* xt = xq + t0 * w.k;
        const float* st = sx + t0 * nb;
        const int32_t* ct = xsum + t0 * nb;
        float* yt = y + t0 * w.n;
        float* pt = part.data() + t0 * kPartStride;
        switch (nt) {
          case 1: tokens_tile<1>(w, g0, g1, xt, st, ct, bias, yt, b0, b1, pt); break;
          case 2: tokens_tile<2>(w, g0, g1, xt, st, ct, bias, yt, b0, b1, pt); break;
          case 3: tokens_tile<3>(w, g0, g1, xt, st, ct, bias, yt, b0, b1, pt); break;
          default: tokens_tile<4>(w, g0, g1, xt, st, ct, bias, yt, b0, b1, pt); break;
        }
      }
    }
  }
}
static_assert(kQMaxTokens == 4, "gemm_strips instantiates tiles of 1..4 tokens");

const char* gemm_isa() { return kIsa; }

bool offset_activations(bool int4) {
#ifdef QGEMM_AVX2
  (void)int4;
  return false;
#else
  return !int4;
#endif
}

}  // namespace triton_llm_native::qgemm
