// Keyed draws: a sampled row's token as a pure function of its probabilities and its key (seed, sequence index,
// output position), on the CPU. Torch references: backend/sampling/keyed_noise.py (Philox4x32-10, the counter
// (position, seq_index, stream, j) under the key (seed low word, seed high word), words_to_uniform) and
// backend/sampling/ops.py (cdf_draw, race_draw); the tests compare them bit for bit.
//
// keys [n, 4] int64: (seed low word, seed high word, sequence index, position), each in [0, 2**32)
//   (keyed_draw.DrawKeys.packed); stream in [0, 2**32) (keyed_noise.NoiseStream).
// keyed_uniforms(keys, stream) -> [n] float64: position_uniforms; keyed_token_uniforms(keys, vocab, stream) ->
//   [n, vocab] float64: token_uniforms (token v: counter word j = v // 2, words 0-1 for even v, 2-3 for odd v).
// keyed_cdf_draw(probs, keys, stream) -> [n] int64: cdf_draw(probs, u[:, None]) with u = keyed_uniforms: the
//   sequential float64 running sum of torch's CPU cumsum, torch's upper-bound binary search on u * total, the
//   clamp to vocab - 1, and torch.argmax of the row when the chosen token has probability 0 (NaN or <= 0).
// keyed_race_draw(probs, keys, stream) -> [n] int64: race_draw(probs, token_uniforms(...)): the first maximum of
//   log(u_v) / p(v) over tokens with p(v) > 0 (0 when there is none). Noise only for counters (pairs of tokens)
//   or 64-token blocks holding a positive probability; a token is scored (one log) only when the bound
//   log(u) <= u - 1 leaves it a chance against the best score so far: O(log vocab) logs in a dense row.
// probs [n, vocab] contiguous float32. Rows run in parallel only when n * vocab exceeds kParallelWork.
//
// Compiled without -ffast-math (the pragma below; the build's flags have it): the draws depend on each rounding of
// the running sum (its partial sums also pass through an empty asm statement) and of log(u) / p.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#pragma GCC push_options
#pragma GCC optimize("no-fast-math")

namespace {

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;   // Philox round multipliers
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;   // Weyl key increments
constexpr int kRounds = 10;
constexpr int kLanes = 32;                  // counters per block: 64 tokens
constexpr int64_t kParallelWork = 1 << 18;  // n * vocab above which rows run on torch's threads
constexpr double kBoundMargin = 1.0 + 0x1p-20;   // relative slack of the skip test, far above any rounding

struct RowKey { uint32_t k0, k1, seq, position; };

inline double to_uniform(uint32_t hi, uint32_t lo) {   // keyed_noise.words_to_uniform
  const uint64_t m = (static_cast<uint64_t>(hi) << 20) | (lo >> 12);
  return (static_cast<double>(m) + 0.5) * 0x1p-52;
}

// Philox4x32-10 of kLanes counters (position, seq, stream, j[l]): c[w][l] = output word w of lane l. AVX-512:
// 16 lanes a register, two registers a word (independent chains), the 32 x 32 -> 64-bit products of the even and
// the odd lanes recombined by blends; otherwise lanes the compiler vectorises (omp simd).
void philox_lanes(const RowKey& key, uint32_t stream, const uint32_t (&j)[kLanes], uint32_t (&c)[4][kLanes]) {
  uint32_t k0 = key.k0, k1 = key.k1;
#if defined(__AVX512F__)
  constexpr int H = kLanes / 16;   // registers a word
  const __m512i m0 = _mm512_set1_epi64(kM0), m1 = _mm512_set1_epi64(kM1);
  constexpr __mmask16 kOdd = 0xAAAA;
  __m512i x[4][H];
  for (int h = 0; h < H; ++h) {
    x[0][h] = _mm512_set1_epi32(static_cast<int>(key.position));
    x[1][h] = _mm512_set1_epi32(static_cast<int>(key.seq));
    x[2][h] = _mm512_set1_epi32(static_cast<int>(stream));
    x[3][h] = _mm512_loadu_si512(j + 16 * h);
  }
  for (int r = 0; r < kRounds; ++r, k0 += kW0, k1 += kW1) {
    for (int h = 0; h < H; ++h) {
      const __m512i e0 = _mm512_mul_epu32(x[0][h], m0), o0 = _mm512_mul_epu32(_mm512_srli_epi64(x[0][h], 32), m0);
      const __m512i e1 = _mm512_mul_epu32(x[2][h], m1), o1 = _mm512_mul_epu32(_mm512_srli_epi64(x[2][h], 32), m1);
      const __m512i hi0 = _mm512_mask_blend_epi32(kOdd, _mm512_srli_epi64(e0, 32), o0);
      const __m512i hi1 = _mm512_mask_blend_epi32(kOdd, _mm512_srli_epi64(e1, 32), o1);
      x[0][h] = _mm512_xor_si512(_mm512_xor_si512(hi1, x[1][h]), _mm512_set1_epi32(static_cast<int>(k0)));
      x[2][h] = _mm512_xor_si512(_mm512_xor_si512(hi0, x[3][h]), _mm512_set1_epi32(static_cast<int>(k1)));
      x[1][h] = _mm512_mask_blend_epi32(kOdd, e1, _mm512_slli_epi64(o1, 32));   // the low words
      x[3][h] = _mm512_mask_blend_epi32(kOdd, e0, _mm512_slli_epi64(o0, 32));
    }
  }
  for (int w = 0; w < 4; ++w)
    for (int h = 0; h < H; ++h) _mm512_storeu_si512(c[w] + 16 * h, x[w][h]);
#else
#pragma omp simd
  for (int l = 0; l < kLanes; ++l) {
    uint32_t x0 = key.position, x1 = key.seq, x2 = stream, x3 = j[l], a = k0, b = k1;
    for (int r = 0; r < kRounds; ++r, a += kW0, b += kW1) {
      const uint64_t p0 = static_cast<uint64_t>(x0) * kM0, p1 = static_cast<uint64_t>(x2) * kM1;
      x0 = static_cast<uint32_t>(p1 >> 32) ^ x1 ^ a;
      x1 = static_cast<uint32_t>(p1);
      x2 = static_cast<uint32_t>(p0 >> 32) ^ x3 ^ b;
      x3 = static_cast<uint32_t>(p0);
    }
    c[0][l] = x0, c[1][l] = x1, c[2][l] = x2, c[3][l] = x3;
  }
#endif
}

// u[2 l], u[2 l + 1]: the uniforms of tokens 2 j[l] (words 0-1) and 2 j[l] + 1 (words 2-3).
void token_lanes(const RowKey& key, uint32_t stream, const uint32_t (&j)[kLanes], double (&u)[2 * kLanes]) {
  uint32_t c[4][kLanes];
  philox_lanes(key, stream, j, c);
#pragma omp simd
  for (int l = 0; l < kLanes; ++l) {
    u[2 * l] = to_uniform(c[0][l], c[1][l]);
    u[2 * l + 1] = to_uniform(c[2][l], c[3][l]);
  }
}

void token_block(const RowKey& key, uint32_t stream, uint32_t j0, double (&u)[2 * kLanes]) {   // tokens 2 j0 + i
  uint32_t j[kLanes];
  for (int l = 0; l < kLanes; ++l) j[l] = j0 + static_cast<uint32_t>(l);
  token_lanes(key, stream, j, u);
}

double position_uniform(const RowKey& key, uint32_t stream) {
  const uint32_t j[kLanes] = {};   // counter word j = 0 (all lanes)
  uint32_t c[4][kLanes];
  philox_lanes(key, stream, j, c);
  return to_uniform(c[0][0], c[1][0]);
}

uint32_t checked_stream(int64_t stream, const char* op) {
  TORCH_CHECK(stream >= 0 && stream <= 0xFFFFFFFFll, op, ": stream must be in [0, 2**32), got ", stream);
  return static_cast<uint32_t>(stream);
}

std::vector<RowKey> checked_keys(const at::Tensor& keys, const char* op) {
  TORCH_CHECK(keys.device().is_cpu() && keys.scalar_type() == at::kLong && keys.dim() == 2 && keys.size(1) == 4, op,
              ": keys must be a CPU int64 [n, 4] tensor (seed low word, seed high word, sequence index, position), "
              "got ", keys.scalar_type(), " ", keys.sizes(), " on ", keys.device());
  const auto k = keys.accessor<int64_t, 2>();
  std::vector<RowKey> out(keys.size(0));
  for (int64_t i = 0; i < keys.size(0); ++i) {
    for (int c = 0; c < 4; ++c)
      TORCH_CHECK(k[i][c] >= 0 && k[i][c] <= 0xFFFFFFFFll, op, ": keys[", i, ", ", c, "] = ", k[i][c],
                  " is not a 32-bit word in [0, 2**32)");
    out[i] = RowKey{uint32_t(k[i][0]), uint32_t(k[i][1]), uint32_t(k[i][2]), uint32_t(k[i][3])};
  }
  return out;
}

void check_probs(const at::Tensor& probs, int64_t rows, const char* op) {
  TORCH_CHECK(probs.device().is_cpu() && probs.scalar_type() == at::kFloat && probs.dim() == 2 && probs.is_contiguous(),
              op, ": probs must be a contiguous CPU float32 [n, vocab] tensor, got ", probs.scalar_type(), " ",
              probs.sizes(), " on ", probs.device());
  TORCH_CHECK(probs.size(1) > 0, op, ": probs has an empty vocabulary");
  TORCH_CHECK(probs.size(1) <= (int64_t{1} << 32), op, ": probs' vocabulary ", probs.size(1), " exceeds 2**32");
  TORCH_CHECK(probs.size(0) == rows, op, ": probs has ", probs.size(0), " rows, keys ", rows);
}

constexpr int kGroup = 4;   // rows whose running sums run at once

// cdf[r][i] = p[r][0] + ... + p[r][i] in float64, summed in id order (torch's CPU cumsum), for R = 1 or kGroup rows
// at once so that their dependency chains overlap. The empty asm statement makes each partial sum exist in a
// register at its step: no flag can reorder the additions.
template <int R>
void running_sums(const float* const* p, int64_t vocab, double* const* cdf) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    s0 += static_cast<double>(p[0][i]);
    if constexpr (R == kGroup) s1 += double{p[1][i]}, s2 += double{p[2][i]}, s3 += double{p[3][i]};
#if defined(__x86_64__) || defined(__i386__)
    asm volatile("" : "+x"(s0), "+x"(s1), "+x"(s2), "+x"(s3));
#elif defined(__aarch64__)
    asm volatile("" : "+w"(s0), "+w"(s1), "+w"(s2), "+w"(s3));
#endif
    cdf[0][i] = s0;
    if constexpr (R == kGroup) cdf[1][i] = s1, cdf[2][i] = s2, cdf[3][i] = s3;
  }
}

int64_t torch_argmax(const float* p, int64_t vocab) {   // the first maximum; the first NaN wins
  int64_t id = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (std::isnan(p[i])) return i;
    if (p[i] > p[id]) id = i;
  }
  return id;
}

// torch.searchsorted(cdf, target, right=True) as torch's CPU kernel searches (also on unsorted input), clamped.
int64_t cdf_token(const float* p, const double* cdf, int64_t vocab, double u) {
  const double target = u * cdf[vocab - 1];
  int64_t lo = 0, hi = vocab;
  while (lo < hi) {
    const int64_t mid = lo + ((hi - lo) >> 1);
    if (!(cdf[mid] > target)) lo = mid + 1;
    else hi = mid;
  }
  const int64_t id = std::min(lo, vocab - 1);
  return p[id] > 0.f ? id : torch_argmax(p, vocab);   // rounding past the last non-zero token
}

// Checks the arguments, then f(..., begin, end) on rows [begin, end): on torch's threads when n * vocab is large.
template <typename Body>
at::Tensor draw_rows(const at::Tensor& probs, const at::Tensor& keys, int64_t stream, const char* op, const Body& f) {
  const std::vector<RowKey> key = checked_keys(keys, op);
  const uint32_t s = checked_stream(stream, op);
  check_probs(probs, static_cast<int64_t>(key.size()), op);
  const int64_t rows = probs.size(0), vocab = probs.size(1);
  at::Tensor out = at::empty({rows}, keys.options());
  int64_t* ids = out.data_ptr<int64_t>();
  const float* base = probs.data_ptr<float>();
  at::parallel_for(0, rows, std::max<int64_t>(1, kParallelWork / vocab), [&](int64_t begin, int64_t end) {
    f(base, vocab, key.data(), s, ids, begin, end);
  });
  return out;
}

at::Tensor keyed_cdf_draw(const at::Tensor& probs, const at::Tensor& keys, int64_t stream) {
  return draw_rows(probs, keys, stream, "keyed_cdf_draw", [](const float* base, int64_t vocab, const RowKey* key,
                                                             uint32_t s, int64_t* ids, int64_t begin, int64_t end) {
    std::vector<double> scratch(static_cast<size_t>(std::min<int64_t>(kGroup, end - begin) * vocab));
    for (int64_t r0 = begin; r0 < end; r0 += kGroup) {
      const int g = static_cast<int>(std::min<int64_t>(kGroup, end - r0));
      const float* p[kGroup];
      double* cdf[kGroup];
      for (int r = 0; r < g; ++r) {
        p[r] = base + (r0 + r) * vocab;
        cdf[r] = scratch.data() + r * vocab;
      }
      if (g == kGroup) running_sums<kGroup>(p, vocab, cdf);
      else for (int r = 0; r < g; ++r) running_sums<1>(p + r, vocab, cdf + r);
      for (int r = 0; r < g; ++r) ids[r0 + r] = cdf_token(p[r], cdf[r], vocab, position_uniform(key[r0 + r], s));
    }
  });
}

// The race over one row: the first maximum of log(u_v) / p_v over p_v > 0, in id order. A token is skipped when
// (u - 1) / p, an upper bound of log(u) / p, is below the best score so far by more than any rounding of either
// side: it cannot reach the best, and a later token must exceed it to win. A row with few positive tokens (top-k,
// top-p) computes the noise of their counters only; a denser one that of each 64-token block holding one.
int64_t race_row(const float* p, int64_t vocab, const RowKey& key, uint32_t stream) {
  constexpr int B = 2 * kLanes;   // tokens a block
  double best = -std::numeric_limits<double>::infinity(), u[B];
  int64_t best_id = 0, live = 0;
  const auto offer = [&](double uv, double pv, int64_t id) {
    if (!(pv > 0.0) || uv - 1.0 < best * kBoundMargin * pv) return;
    const double score = std::log(uv) / pv;
    if (score > best) best = score, best_id = id;
  };
  for (int64_t i = 0; i < vocab; ++i) live += p[i] > 0.f;   // sums, not early exits: they vectorise
  if (4 * live < vocab) {
    uint32_t j[kLanes] = {};
    int n = 0;
    const auto flush = [&] {
      token_lanes(key, stream, j, u);
      for (int l = 0; l < n; ++l) {
        const int64_t t = 2 * int64_t{j[l]};
        offer(u[2 * l], p[t], t);
        if (t + 1 < vocab) offer(u[2 * l + 1], p[t + 1], t + 1);
      }
      n = 0;
    };
    for (int64_t t = 0; t < vocab; t += 2) {
      if (!(p[t] > 0.f) && !(t + 1 < vocab && p[t + 1] > 0.f)) continue;
      j[n++] = static_cast<uint32_t>(t / 2);
      if (n == kLanes) flush();
    }
    if (n) flush();
    return best_id;
  }
  float tail[B];
  for (int64_t t0 = 0; t0 < vocab; t0 += B) {
    const float* q = p + t0;
    if (vocab - t0 < B) {   // the last block, padded with zeros
      std::fill(std::copy(q, p + vocab, tail), tail + B, 0.f);
      q = tail;
    }
    int block_live = 0;
    for (int i = 0; i < B; ++i) block_live += q[i] > 0.f;
    if (!block_live) continue;
    token_block(key, stream, static_cast<uint32_t>(t0 / 2), u);
    const double bound = best * kBoundMargin;
    int chance = 0;
    for (int i = 0; i < B; ++i) chance += (q[i] > 0.f) & (u[i] - 1.0 >= bound * static_cast<double>(q[i]));
    for (int i = 0; chance && i < B; ++i) offer(u[i], q[i], t0 + i);   // the few left, against the rising best
  }
  return best_id;
}

at::Tensor keyed_race_draw(const at::Tensor& probs, const at::Tensor& keys, int64_t stream) {
  return draw_rows(probs, keys, stream, "keyed_race_draw", [](const float* base, int64_t vocab, const RowKey* key,
                                                              uint32_t s, int64_t* ids, int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) ids[r] = race_row(base + r * vocab, vocab, key[r], s);
  });
}

at::Tensor keyed_uniforms(const at::Tensor& keys, int64_t stream) {
  const std::vector<RowKey> key = checked_keys(keys, "keyed_uniforms");
  const uint32_t s = checked_stream(stream, "keyed_uniforms");
  at::Tensor out = at::empty({keys.size(0)}, keys.options().dtype(at::kDouble));
  double* u = out.data_ptr<double>();
  for (size_t i = 0; i < key.size(); ++i) u[i] = position_uniform(key[i], s);
  return out;
}

at::Tensor keyed_token_uniforms(const at::Tensor& keys, int64_t vocab, int64_t stream) {
  const std::vector<RowKey> key = checked_keys(keys, "keyed_token_uniforms");
  const uint32_t s = checked_stream(stream, "keyed_token_uniforms");
  TORCH_CHECK(vocab > 0 && vocab <= (int64_t{1} << 32), "keyed_token_uniforms: vocab must be in [1, 2**32]: ", vocab);
  const int64_t rows = keys.size(0);
  at::Tensor out = at::empty({rows, vocab}, keys.options().dtype(at::kDouble));
  double* u = out.data_ptr<double>();
  double block[2 * kLanes];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t0 = 0; t0 < vocab; t0 += 2 * kLanes) {
      token_block(key[r], s, static_cast<uint32_t>(t0 / 2), block);
      std::copy(block, block + std::min<int64_t>(2 * kLanes, vocab - t0), u + r * vocab + t0);
    }
  }
  return out;
}

}  // namespace

#pragma GCC pop_options

TORCH_LIBRARY_FRAGMENT(triton_llm, m) {
  m.def("keyed_uniforms(Tensor keys, int stream) -> Tensor", &keyed_uniforms);
  m.def("keyed_token_uniforms(Tensor keys, int vocab, int stream) -> Tensor", &keyed_token_uniforms);
  m.def("keyed_cdf_draw(Tensor probs, Tensor keys, int stream) -> Tensor", &keyed_cdf_draw);
  m.def("keyed_race_draw(Tensor probs, Tensor keys, int stream) -> Tensor", &keyed_race_draw);
}
