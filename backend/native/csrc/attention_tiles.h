// The tiled attention's per-span kernels (paged_attention.cpp): a span's keys transposed in tiles of 16 (K^T),
// QK^T of a chunk of M queries as broadcast-FMAs (16 scores per vector, no horizontal sum per key), one online
// softmax step per query, and PV with the chunk's accumulators in registers. Templates on D16 = head_dim / 16 and
// M, so that M x D16 accumulators stay in registers. Pure functions on raw arrays (no torch).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "vec16.h"

namespace triton_llm_native {

constexpr int64_t kPrefetchTiles = 2;  // K rows prefetched this many tiles of 16 keys ahead

// The span's keys, transposed in tiles of 16 (rows past n are zeros: their scores are masked anyway). Prefetches
// the K rows kPrefetchTiles tiles ahead (offsets holds n_ahead >= n rows, into the next span) and the V rows of
// each tile for the span's PV: blocks are scattered pages, where the hardware prefetchers stop.
template <int D16>
void transpose_keys(const float* k, const float* v, const int64_t* offsets, int64_t n, int64_t n_ahead,
                    f32x16* kt) {
  constexpr int HD = 16 * D16;
  for (int64_t tt = 0; 16 * tt < n; ++tt) {
    for (int64_t j = 16 * (tt + kPrefetchTiles); j < std::min(n_ahead, 16 * (tt + kPrefetchTiles + 1)); ++j)
      for (int dd = 0; dd < D16; ++dd) __builtin_prefetch(k + offsets[j] + 16 * dd, 0, 3);
    for (int64_t j = 16 * tt; j < std::min(n, 16 * (tt + 1)); ++j)
      for (int dd = 0; dd < D16; ++dd) __builtin_prefetch(v + offsets[j] + 16 * dd, 0, 2);
    for (int dd = 0; dd < D16; ++dd) {
      f32x16 r[16];
      for (int i = 0; i < 16; ++i) r[i] = 16 * tt + i < n ? load16(k + offsets[16 * tt + i] + 16 * dd) : f32x16{};
      transpose16(r);
      for (int i = 0; i < 16; ++i) kt[tt * HD + 16 * dd + i] = r[i];
    }
  }
}

// scores[m][16 tt + i] = q[m] . k[16 tt + i] (q pre-scaled), -inf where the key's position exceeds qpos[m] or, with a
// sliding window (> 0), is at or before qpos[m] - window.
// kt: [tiles][HD] K^T tiles (lane i of kt[tt][d]: key 16 tt + i, dimension d); q: [M][HD]; scores: [M][stride].
template <int D16, int M>
void span_scores(const float* q, const f32x16* kt, int64_t tiles, int64_t first_key, const int64_t* qpos,
                 int64_t window, float* scores, int64_t stride) {
  constexpr int HD = 16 * D16;
  // Two independent FMA chains per query (even and odd dimensions, added at the end) at every M: a score's
  // rounding must not depend on how many queries share its chunk (a decode step's G queries, a prefill chunk's
  // count x G), or a token's logits would change with the batch and the chunking (seeded replay, docs/sampling.md).
  constexpr int kChains = 2;
  const i32x16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const f32x16 neg_inf = f32x16{} - INFINITY;
  for (int64_t tt = 0; tt < tiles; ++tt) {
    const f32x16* k = kt + tt * HD;
    f32x16 s[kChains][M] = {};
#pragma GCC unroll 4
    for (int d = 0; d < HD; d += kChains) {
      for (int c = 0; c < kChains; ++c) {
        const f32x16 kd = k[d + c];
        for (int m = 0; m < M; ++m) s[c][m] += q[m * HD + d + c] * kd;
      }
    }
    const int64_t key0 = first_key + 16 * tt;
    for (int m = 0; m < M; ++m) {
      f32x16 v = s[0][m];
      if constexpr (kChains == 2) v += s[1][m];
      if (key0 + 15 > qpos[m]) v = (lane + static_cast<int32_t>(key0)) <= static_cast<int32_t>(qpos[m]) ? v : neg_inf;
      if (window > 0 && key0 <= qpos[m] - window)
        v = (lane + static_cast<int32_t>(key0)) > static_cast<int32_t>(qpos[m] - window) ? v : neg_inf;
      store16(scores + m * stride + 16 * tt, v);
    }
  }
}

// acc[m] = acc[m] * alpha[m] + sum_j p[m][j] V[j] over the span's n keys; V rows at v + offsets[j].
// p: [M][stride]; acc: [M][HD].
template <int D16, int M>
void span_values(const float* p, int64_t stride, const float* v, const int64_t* offsets, int64_t n,
                 const float* alpha, float* acc) {
  constexpr int HD = 16 * D16;
  f32x16 a[M][D16];
  for (int m = 0; m < M; ++m)
    for (int dd = 0; dd < D16; ++dd) a[m][dd] = load16(acc + m * HD + 16 * dd) * alpha[m];
  for (int64_t j = 0; j < n; ++j) {
    const float* row = v + offsets[j];
    f32x16 vr[D16];
    for (int dd = 0; dd < D16; ++dd) vr[dd] = load16(row + 16 * dd);
    for (int m = 0; m < M; ++m) {
      const float pm = p[m * stride + j];
      for (int dd = 0; dd < D16; ++dd) a[m][dd] += pm * vr[dd];
    }
  }
  for (int m = 0; m < M; ++m)
    for (int dd = 0; dd < D16; ++dd) store16(acc + m * HD + 16 * dd, a[m][dd]);
}

// One step of the online softmax for a query over a span: s (tiles x 16 scores) becomes e^(s - max'), where max'
// = max(row_max, max s); row_sum becomes row_sum e^(row_max - max') + sum e^(s - max'); returns e^(row_max - max').
inline float softmax_update(float* s, int64_t tiles, float& row_max, float& row_sum) {
  const f32x16 neg_inf = f32x16{} - INFINITY;
  f32x16 mx = neg_inf;
  for (int64_t tt = 0; tt < tiles; ++tt) {
    const f32x16 v = load16(s + 16 * tt);
    mx = v > mx ? v : mx;
  }
  // -inf while the query has seen no key yet (spans before its sliding window): then alpha and every e are 0
  const float new_max = std::max(row_max, hmax16(mx));
  const float alpha = row_max == -INFINITY ? 0.f : std::exp(row_max - new_max);
  f32x16 sum = {};
  for (int64_t tt = 0; tt < tiles; ++tt) {
    const f32x16 v = load16(s + 16 * tt);
    const f32x16 e = v == neg_inf ? f32x16{} : exp16(v - new_max);  // exp16 clamps: masked keys exactly 0
    store16(s + 16 * tt, e);
    sum += e;
  }
  row_max = new_max;
  row_sum = row_sum * alpha + hsum16(sum);
  return alpha;
}

}  // namespace triton_llm_native
