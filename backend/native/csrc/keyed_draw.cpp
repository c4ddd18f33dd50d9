// Keyed draws: a sampled row's token as a pure function of its probabilities and its key (seed, sequence index,
// output position), on the CPU. Torch references: backend/sampling/keyed_noise.py (Philox4x32-10, the counter
// (position, seq_index, stream, j) under the key (seed low word, seed high word), words_to_uniform) and
// backend/sampling/ops.py (cdf_draw, race_draw); the tests compare them bit for bit.
//
// keys [n, 4] int64: (seed low word, seed high word, sequence index, position), each in [0, 2**32)
//   (keyed_draw.DrawKeys.packed); stream in [0, 2**32) (keyed_noise.NoiseStream).
// keyed_uniforms(keys, stream) -> [n] float64: position_uniforms, counter (position, seq, stream, 0).
// keyed_token_uniforms(keys, vocab, stream) -> [n, vocab] float64: token_uniforms (token v: counter word
//   j = v // 2, output words 0-1 for even v, 2-3 for odd v).
// keyed_cdf_draw(probs, keys, stream) -> [n] int64: cdf_draw(probs, u[:, None]) with u = keyed_uniforms: the
//   sequential float64 running sum of torch's CPU cumsum, torch's upper-bound binary search on u * total, the
//   clamp to vocab - 1, and torch.argmax of the row when the chosen token has probability 0 (NaN or <= 0).
// keyed_race_draw(probs, keys, stream) -> [n] int64: race_draw(probs, token_uniforms(...)): the first maximum of
//   log(u_v) / p(v) over tokens with p(v) > 0 (0 when there is none). Blocks of 32 tokens without a positive
//   probability compute no noise; a token is scored (one log) only when the bound log(u) <= u - 1 leaves it a
//   chance against the best score so far, which in a dense row leaves O(log vocab) logs.
// probs [n, vocab] contiguous float32. Rows run in parallel only when n * vocab exceeds kParallelWork.
//
// The file is compiled without -ffast-math (the pragma below; the build's flags have it): the draws depend on
// each rounding of the running sum and of log(u) / p. The running sum also passes each partial sum through an
// empty asm statement (x86-64, AArch64), so that no flag can reorder the additions.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#pragma GCC push_options
#pragma GCC optimize("no-fast-math")

namespace {

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;   // Philox round multipliers
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;   // Weyl key increments
constexpr int kRounds = 10;
constexpr int kLanes = 16;                  // counters per block: 32 tokens
constexpr int64_t kParallelWork = 1 << 18;  // n * vocab above which rows run on torch's threads
constexpr double kBoundMargin = 1.0 + 0x1p-20;   // relative slack of the skip test, far above any rounding

struct RowKey {
  uint32_t k0, k1, seq, position;
};

// One Philox4x32-10 block of kLanes counters (position, seq, stream, j0 + l), vectorised over the lanes (omp simd:
// 32 x 32 -> 64-bit products). even[l], odd[l]: the uniforms of tokens 2 (j0 + l) (words 0-1) and 2 (j0 + l) + 1 (2-3).
inline double to_uniform(uint32_t hi, uint32_t lo) {
  const uint64_t m = (static_cast<uint64_t>(hi) << 20) | (lo >> 12);
  return (static_cast<double>(m) + 0.5) * 0x1p-52;
}

void philox_block(const RowKey& key, uint32_t stream, uint32_t j0, double* even, double* odd) {
  uint32_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    c0[l] = key.position;
    c1[l] = key.seq;
    c2[l] = stream;
    c3[l] = j0 + static_cast<uint32_t>(l);
  }
  uint32_t k0 = key.k0, k1 = key.k1;
  for (int r = 0; r < kRounds; ++r) {
    if (r) {
      k0 += kW0;
      k1 += kW1;
    }
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) {
      const uint64_t p0 = static_cast<uint64_t>(c0[l]) * kM0, p1 = static_cast<uint64_t>(c2[l]) * kM1;
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[l] ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[l] ^ k1;
      c1[l] = static_cast<uint32_t>(p1);
      c3[l] = static_cast<uint32_t>(p0);
      c0[l] = n0;
      c2[l] = n2;
    }
  }
#pragma omp simd
  for (int l = 0; l < kLanes; ++l) {
    even[l] = to_uniform(c0[l], c1[l]);
    odd[l] = to_uniform(c2[l], c3[l]);
  }
}

double position_uniform(const RowKey& key, uint32_t stream) {
  double even[kLanes], odd[kLanes];
  philox_block(key, stream, 0, even, odd);   // lane 0 is counter word j = 0
  return even[0];
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
    uint32_t w[4];
    for (int c = 0; c < 4; ++c) {
      TORCH_CHECK(k[i][c] >= 0 && k[i][c] <= 0xFFFFFFFFll, op, ": keys[", i, ", ", c, "] = ", k[i][c],
                  " is not a 32-bit word in [0, 2**32)");
      w[c] = static_cast<uint32_t>(k[i][c]);
    }
    out[i] = RowKey{w[0], w[1], w[2], w[3]};
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

// Rows [begin, end) on torch's threads when their work (rows * vocab) is large, else here.
template <typename F>
void for_rows(int64_t rows, int64_t vocab, const F& f) {
  at::parallel_for(0, rows, std::max<int64_t>(1, kParallelWork / vocab), f);
}

constexpr int kGroup = 4;   // rows whose running sums run at once

// cdf[r][i] = p[r][0] + ... + p[r][i] in float64, summed in id order (torch's CPU cumsum), for kGroup rows at once so
// that their dependency chains overlap (a group of fewer rows repeats its last). The empty asm statement makes
// each partial sum exist in a register at its step: no flag can reorder the additions.
void running_sums(const float* const* p, int64_t vocab, double* const* cdf) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    s0 += static_cast<double>(p[0][i]);
    s1 += static_cast<double>(p[1][i]);
    s2 += static_cast<double>(p[2][i]);
    s3 += static_cast<double>(p[3][i]);
#if defined(__x86_64__) || defined(__i386__)
    asm volatile("" : "+x"(s0), "+x"(s1), "+x"(s2), "+x"(s3));
#elif defined(__aarch64__)
    asm volatile("" : "+w"(s0), "+w"(s1), "+w"(s2), "+w"(s3));
#endif
    cdf[0][i] = s0;
    cdf[1][i] = s1;
    cdf[2][i] = s2;
    cdf[3][i] = s3;
  }
}

int64_t torch_argmax(const float* p, int64_t vocab) {   // the first maximum; the first NaN wins
  float best = p[0];
  int64_t id = 0;
  if (std::isnan(best)) return 0;
  for (int64_t i = 1; i < vocab; ++i) {
    if (std::isnan(p[i])) return i;
    if (p[i] > best) {
      best = p[i];
      id = i;
    }
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

at::Tensor keyed_cdf_draw(const at::Tensor& probs, const at::Tensor& keys, int64_t stream) {
  const std::vector<RowKey> key = checked_keys(keys, "keyed_cdf_draw");
  const uint32_t s = checked_stream(stream, "keyed_cdf_draw");
  check_probs(probs, static_cast<int64_t>(key.size()), "keyed_cdf_draw");
  const int64_t rows = probs.size(0), vocab = probs.size(1);
  at::Tensor out = at::empty({rows}, keys.options());
  int64_t* ids = out.data_ptr<int64_t>();
  const float* base = probs.data_ptr<float>();
  for_rows(rows, vocab, [&](int64_t begin, int64_t end) {
    std::vector<double> scratch(static_cast<size_t>(std::min<int64_t>(kGroup, end - begin) * vocab));
    for (int64_t r0 = begin; r0 < end; r0 += kGroup) {
      const int g = static_cast<int>(std::min<int64_t>(kGroup, end - r0));
      const float* p[kGroup];
      double* cdf[kGroup];
      for (int r = 0; r < kGroup; ++r) {
        p[r] = base + (r0 + std::min(r, g - 1)) * vocab;
        cdf[r] = scratch.data() + std::min(r, g - 1) * vocab;
      }
      running_sums(p, vocab, cdf);
      for (int r = 0; r < g; ++r) ids[r0 + r] = cdf_token(p[r], cdf[r], vocab, position_uniform(key[r0 + r], s));
    }
  });
  return out;
}

// The race over one row: the first maximum of log(u_v) / p_v over p_v > 0. A token is skipped when
// (u - 1) / p, an upper bound of log(u) / p, is below the best score by more than any rounding of either side:
// it cannot reach the best, and a later token must exceed it to win.
int64_t race_row(const float* p, int64_t vocab, const RowKey& key, uint32_t stream) {
  double best = -std::numeric_limits<double>::infinity();
  int64_t best_id = 0;
  double even[kLanes], odd[kLanes];
  for (int64_t t0 = 0; t0 < vocab; t0 += 2 * kLanes) {
    const int64_t n = std::min<int64_t>(2 * kLanes, vocab - t0);
    bool any = false;
    for (int64_t i = 0; i < n; ++i) any |= p[t0 + i] > 0.f;
    if (!any) continue;
    philox_block(key, stream, static_cast<uint32_t>(t0 / 2), even, odd);
    for (int64_t i = 0; i < n; ++i) {
      if (!(p[t0 + i] > 0.f)) continue;
      const double pv = static_cast<double>(p[t0 + i]);
      const double u = (i & 1) ? odd[i >> 1] : even[i >> 1];
      if (u - 1.0 < best * pv * kBoundMargin) continue;
      const double score = std::log(u) / pv;
      if (score > best) {
        best = score;
        best_id = t0 + i;
      }
    }
  }
  return best_id;
}

at::Tensor keyed_race_draw(const at::Tensor& probs, const at::Tensor& keys, int64_t stream) {
  const std::vector<RowKey> key = checked_keys(keys, "keyed_race_draw");
  const uint32_t s = checked_stream(stream, "keyed_race_draw");
  check_probs(probs, static_cast<int64_t>(key.size()), "keyed_race_draw");
  const int64_t rows = probs.size(0), vocab = probs.size(1);
  at::Tensor out = at::empty({rows}, keys.options());
  int64_t* ids = out.data_ptr<int64_t>();
  const float* base = probs.data_ptr<float>();
  for_rows(rows, vocab, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) ids[r] = race_row(base + r * vocab, vocab, key[r], s);
  });
  return out;
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
  TORCH_CHECK(vocab > 0 && vocab <= (int64_t{1} << 32), "keyed_token_uniforms: vocab must be in [1, 2**32], got ",
              vocab);
  const int64_t rows = keys.size(0);
  at::Tensor out = at::empty({rows, vocab}, keys.options().dtype(at::kDouble));
  double* u = out.data_ptr<double>();
  double even[kLanes], odd[kLanes];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t0 = 0; t0 < vocab; t0 += 2 * kLanes) {
      philox_block(key[r], s, static_cast<uint32_t>(t0 / 2), even, odd);
      for (int64_t i = 0; i < std::min<int64_t>(2 * kLanes, vocab - t0); ++i)
        u[r * vocab + t0 + i] = (i & 1) ? odd[i >> 1] : even[i >> 1];
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
