// The f32 GEMV kernel of f32_gemv.h, one template over the lane types of each build (no torch here).
#include <algorithm>
#include "f32_gemv.h"

#include <cstring>
#include <type_traits>

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

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))

template <int Registers>
struct Lanes256 {  // one AVX2 register, of 16 (AVX2) or 32 (AVX-512VL)
  using V = __m256;
  static constexpr int kWidth = 8;
  static constexpr int kRegisters = Registers;
  static constexpr int kAccumulators = Registers * 3 / 4;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load_first(const float* p, int64_t n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), idx));
  }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  // v, held in a register: the compiler otherwise folds a token's load into each of its R FMAs (R loads per
  // token and column step instead of one: load-bound on this EPYC when the weight is in cache).
  static V in_register(V v) {
    if constexpr (Registers > 16) {
      __asm__("" : "+v"(v));
    } else {
      __asm__("" : "+x"(v));
    }
    return v;
  }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  // Lane i of the result: the sum of a[i]'s 8 lanes (a transpose-and-add tree: 14 shuffles and 7 adds for 8 sums,
  // where 8 separate horizontal reductions take ~50 instructions).
  static V sum_lanes(const V* a) {
    V s1[4], s2[2];
    for (int i = 0; i < 4; ++i)
      s1[i] = _mm256_add_ps(_mm256_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm256_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 2; ++i) {
      const __m256d c = _mm256_castps_pd(s1[2 * i]), d = _mm256_castps_pd(s1[2 * i + 1]);
      s2[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(c, d)), _mm256_castpd_ps(_mm256_unpackhi_pd(c, d)));
    }
    return _mm256_add_ps(_mm256_permute2f128_ps(s2[0], s2[1], 0x20), _mm256_permute2f128_ps(s2[0], s2[1], 0x31));
  }
};
#endif

#if defined(__AVX512F__)
struct Lanes512 {  // one AVX-512 register
  using V = __m512;
  static constexpr int kWidth = 16;
  static constexpr int kRegisters = 32;
  static constexpr int kAccumulators = 24;  // the rest hold x and w
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load_first(const float* p, int64_t n) { return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V in_register(V v) {
    __asm__("" : "+v"(v));
    return v;
  }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  // Lane i of the result: the sum of a[i]'s 16 lanes (a transpose-and-add tree: 30 shuffles and 15 adds for 16
  // sums, where 16 separate horizontal reductions take ~130 instructions).
  static V sum_lanes(const V* a) {
    V s1[8], s2[4];
    for (int i = 0; i < 8; ++i)  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] of a = a[2i], b = a[2i+1]
      s1[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; ++i) {  // per 128-bit lane L: the lane's partial sums of a[4i .. 4i+3]
      const __m512d c = _mm512_castps_pd(s1[2 * i]), d = _mm512_castps_pd(s1[2 * i + 1]);
      s2[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(c, d)), _mm512_castpd_ps(_mm512_unpackhi_pd(c, d)));
    }
    const V t0 = _mm512_add_ps(_mm512_shuffle_f32x4(s2[0], s2[1], 0x88), _mm512_shuffle_f32x4(s2[0], s2[1], 0xdd));
    const V t1 = _mm512_add_ps(_mm512_shuffle_f32x4(s2[2], s2[3], 0x88), _mm512_shuffle_f32x4(s2[2], s2[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(t0, t1, 0x88), _mm512_shuffle_f32x4(t0, t1, 0xdd));
  }
};
constexpr const char* kIsa = "avx512";
// Short rows (kPinMaxK): 256-bit lanes in AVX-512's 32 registers, measured faster than 512-bit lanes on this EPYC
// for 2-8 tokens at the demo target's in-cache shapes; long rows: 512-bit lanes, fewer instructions per weight
// byte where the weight streams from memory. The choice depends on K alone, so every token count and row range
// of one weight sums in the same order: a token's result does not depend on the others in its step.
template <bool ShortRows>
using LanesFor = std::conditional_t<ShortRows, Lanes256<32>, Lanes512>;
#elif defined(__AVX2__) && defined(__FMA__)
constexpr const char* kIsa = "avx2";
template <bool ShortRows>
using LanesFor = Lanes256<16>;
#else

struct Lanes {  // eight floats in memory: plain C++ the compiler maps onto whatever vectors the target has
  struct V {
    float v[8];
  };
  static constexpr int kWidth = 8;
  static constexpr int kRegisters = 64;  // no register file of its own: only kAccumulators bounds the rows
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
  static void store(float* p, V v) { std::memcpy(p, v.v, sizeof(v.v)); }
  static V in_register(V v) { return v; }
  static V sum_lanes(const V* a) {  // lane i: the sum of a[i]'s 8 lanes
    V r;
    for (int i = 0; i < 8; ++i) {
      const float* v = a[i].v;
      r.v[i] = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
    }
    return r;
  }
};
constexpr const char* kIsa = "generic";
template <bool ShortRows>
using LanesFor = Lanes;

#endif

// Rows per step for NT tokens: NT * R accumulators, NT token vectors and one weight vector fit in the registers,
// at most 8 rows (a spilled accumulator costs a load and a store per FMA).
template <class L, int NT>
constexpr int rows_per_step() {
  constexpr int by_acc = L::kAccumulators / NT, by_regs = (L::kRegisters - NT - 1) / NT;
  constexpr int r = by_acc < by_regs ? by_acc : by_regs;
  return r < 1 ? 1 : (r > 8 ? 8 : r);
}

// Floats of the sums buffer for NT tokens and R rows: whole vectors (one store per kWidth sums).
template <class L, int NT, int R>
constexpr int sums_floats() {
  return (NT * R + L::kWidth - 1) / L::kWidth * L::kWidth;
}

// out[t * R + r] = x[t] . w[r] for R consecutive rows of w (row stride K) and NT tokens (row stride K); out holds
// sums_floats<L, NT, R>() floats (those past NT * R are left zero). Pin: each loaded vector held in a register
// for all its uses (kPinMaxK); the arithmetic, and so every result bit, is the same either way.
template <class L, int NT, int R, bool Pin>
inline void dot_rows(const float* x, const float* w, int64_t K, float* out) {
  using V = typename L::V;
  constexpr int W = L::kWidth, A = NT * R;
  V acc[A];  // acc[t * R + r]
  for (int i = 0; i < A; ++i) acc[i] = L::zero();
  int64_t k = 0;
  for (; k + W <= K; k += W) {
    if (kPrefetch > 0 && k % kLineFloats == 0)
      for (int r = 0; r < R; ++r) __builtin_prefetch(w + r * K + k + kPrefetch, 0, 3);
    V xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = Pin ? L::in_register(L::load(x + t * K + k)) : L::load(x + t * K + k);
    for (int r = 0; r < R; ++r) {
      const V wv = Pin && NT > 1 ? L::in_register(L::load(w + r * K + k)) : L::load(w + r * K + k);
      for (int t = 0; t < NT; ++t) acc[t * R + r] = L::fma(wv, xv[t], acc[t * R + r]);
    }
  }
  if (k < K) {  // the last K % W columns
    const int64_t n = K - k;
    V xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = L::load_first(x + t * K + k, n);
    for (int r = 0; r < R; ++r) {
      const V wv = L::load_first(w + r * K + k, n);
      for (int t = 0; t < NT; ++t) acc[t * R + r] = L::fma(wv, xv[t], acc[t * R + r]);
    }
  }
  for (int g = 0; g < A; g += W) {  // W accumulators at a time, the last group padded with zeros
    V group[W];
    for (int i = 0; i < W; ++i) group[i] = g + i < A ? acc[g + i] : L::zero();
    L::store(out + g, L::sum_lanes(group));
  }
}

// Short rows (pinned, K <= kPinMaxK: the demo target's 192 and 512): every line of the rows this many bytes ahead
// is prefetched, one row step at a time. Such weights fit in L3, but in the engine other work (and other tenants of
// the L3) evicts them between steps, and a multi-token step with two rows in flight then waits on memory. Measured
// in the engine at batch 1 (EPYC, 1 thread, docs/benchmarks.md): a 5-token verify step's op 543-545 us median,
// p90 1169-1244 us without; 451-482 us, p90 526-692 us at 2048 bytes (4096 and 8192 no better, cold-cache replay).
// The 1-token step was unchanged (235-242 us). Long rows (the 82M model) keep to the hardware prefetchers.
#ifndef GEMV_ROWS_AHEAD_BYTES
#define GEMV_ROWS_AHEAD_BYTES 2048
#endif
constexpr int64_t kRowsAheadBytes = GEMV_ROWS_AHEAD_BYTES;

template <int NT, bool Pin>
void rows_for_tokens(const float* x, const float* w, const float* bias, float* y, int64_t N, int64_t K,
                     int64_t n_begin, int64_t n_end) {
  using L = LanesFor<Pin>;
  constexpr int R = rows_per_step<L, NT>();
  alignas(64) float acc[sums_floats<L, NT, R>()];
  const int64_t row_bytes = K * int64_t{sizeof(float)};
  const int64_t ahead = kRowsAheadBytes > 0 ? std::max<int64_t>(R, kRowsAheadBytes / row_bytes) : 0;
  int64_t n = n_begin;
  for (; n + R <= n_end; n += R) {
    if (Pin && ahead > 0 && n + ahead < n_end) {  // short rows: the step's rows ahead, every line of them
      const char* p = reinterpret_cast<const char*>(w + (n + ahead) * K);
      const int64_t bytes = std::min<int64_t>(R, n_end - n - ahead) * row_bytes;
      for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, 3);
    }
    dot_rows<L, NT, R, Pin>(x, w + n * K, K, acc);
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < R; ++r) y[t * N + n + r] = acc[t * R + r] + (bias ? bias[n + r] : 0.f);
  }
  for (; n < n_end; ++n) {
    dot_rows<L, NT, 1, Pin>(x, w + n * K, K, acc);
    for (int t = 0; t < NT; ++t) y[t * N + n] = acc[t] + (bias ? bias[n] : 0.f);
  }
}

// Rows of at most this many floats get pinned loads (dot_rows) and LanesFor<true>. Measured (EPYC, 1 thread, docs/benchmarks.md): on
// the demo target (rows of 192 and 512, 9 MB of weights, in cache, compute-bound) pinning made 5-8 tokens ~1.6x
// faster; on the 82M model (rows of 768 and 2048, 330 MB streamed from memory) pinning, and 256-bit lanes, made
// 2-4 tokens 10-20% slower (fewer instructions per weight byte keep more of the stream in flight).
constexpr int64_t kPinMaxK = kGemvShortRowK;  // one meaning of short rows (f32_gemv.h)

template <bool Pin>
void tokens_rows(const float* x, const float* w, const float* bias, float* y, int64_t T, int64_t N, int64_t K,
                 int64_t n_begin, int64_t n_end) {
  switch (T) {
    case 1: rows_for_tokens<1, Pin>(x, w, bias, y, N, K, n_begin, n_end); break;
    case 2: rows_for_tokens<2, Pin>(x, w, bias, y, N, K, n_begin, n_end); break;
    case 3: rows_for_tokens<3, Pin>(x, w, bias, y, N, K, n_begin, n_end); break;
    case 4: rows_for_tokens<4, Pin>(x, w, bias, y, N, K, n_begin, n_end); break;
    case 5: rows_for_tokens<5, Pin>(x, w, bias, y, N, K, n_begin, n_end); break;
    case 6: rows_for_tokens<6, Pin>(x, w, bias, y, N, K, n_begin, n_end); break;
    case 7: rows_for_tokens<7, Pin>(x, w, bias, y, N, K, n_begin, n_end); break;
    default: rows_for_tokens<8, Pin>(x, w, bias, y, N, K, n_begin, n_end); break;
  }
}

}  // namespace

// More than kGemvMaxTokens tokens go kGemvMaxTokens at a time over a block of rows of about this many bytes of
// weights, which stays in L2 from one pass to the next: the weights come from memory once, whatever T.
constexpr int64_t kRowBlockBytes = 256 * 1024;

void gemv_f32_rows(const float* x, const float* w, const float* bias, float* y, int64_t T, int64_t N, int64_t K,
                   int64_t n_begin, int64_t n_end) {
  const int64_t block = T <= kGemvMaxTokens ? n_end - n_begin
                                            : std::max<int64_t>(16, kRowBlockBytes / (K * int64_t{sizeof(float)}));
  for (int64_t b0 = n_begin; b0 < n_end; b0 += block) {
    const int64_t b1 = std::min(n_end, b0 + block);
    for (int64_t t0 = 0; t0 < T; t0 += kGemvMaxTokens) {
      const int64_t nt = std::min(T - t0, kGemvMaxTokens);
      if (K <= kPinMaxK) {
        tokens_rows<true>(x + t0 * K, w, bias, y + t0 * N, nt, N, K, b0, b1);
      } else {
        tokens_rows<false>(x + t0 * K, w, bias, y + t0 * N, nt, N, K, b0, b1);
      }
    }
  }
}

const char* gemv_f32_isa() { return kIsa; }

}  // namespace triton_llm_native
