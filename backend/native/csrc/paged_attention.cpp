// The decode step's paged K/V write and attention (paged_attention.h).
//
// The step's consecutive tokens that share a block-table row (a verify step's k + 1 tokens; at most
// kMaxGroupTokens) form a group; per (group, KV head) its tokens x G query heads are one block of queries over
// the same keys, each masked causally at its own position. The keys are walked in spans (kSpanFloats of K):
// the span's K is transposed in tiles of 16 keys (K^T: one vector per head dimension), so that QK^T is
// broadcast-FMAs of several queries at once into 16 scores per vector, with no horizontal sum per key; then an
// online softmax (running max and sum per query, exp16) and PV with the accumulators of a chunk of queries in
// registers, each V row loaded once per chunk (the kernels: attention_tiles.h). The queries go through in chunks
// of at most max_chunk(D16) (chunk x head_dim / 16 accumulators). Head dims that are not 16, 32, ..., 128 take
// the per-token loop. A query's scores, softmax and PV sums round the same whatever chunk or group it falls in and
// whatever else the step holds (spans start at key 0, every chunk size runs the same FMA chains): its output does
// not depend on the batch, the prefill chunking or a verify step's drafts.
// A sliding window W (> 0) lets the query at position p see the keys p - W < k <= p only (transformers'
// sliding_window): a group's walk starts at the span holding its earliest query's first key (spans still sit at
// multiples of the span length from key 0), keys before a query's window score -inf (exactly 0 after the softmax),
// and the keys of that span before the group's earliest window are never read: their offsets point at the first key
// read instead (the block manager may have freed their blocks, NULL_BLOCK in the table). A query's output is the
// same whatever its group, as without a window: spans it sees nothing of add exact zeros.
// Split over torch's threads by (group, KV head) when the step is large enough.
#include "paged_attention.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>
#include <vector>

#include "attention_tiles.h"
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

namespace {

constexpr int64_t kMaxGroupTokens = 16;
constexpr int64_t kSpanFloats = 4096;  // K^T of one span (16 KiB) stays in L1 beside the chunk's scores
constexpr int kMaxD16 = 8;             // head_dim up to 128 on the tiled path

// The queries of one chunk: at most max_chunk(D16), so that chunk x D16 accumulators (and 2 x chunk score chains) fit
// the registers.
constexpr int max_chunk(int d16) { return std::min(8, 24 / d16); }

// What one work item reads: the step's arrays and its (group, KV head).
struct Step {
  const float* qkv;
  int64_t row_stride, num_heads, kv_heads, head_dim;
  const int64_t* positions;
  const int32_t* token_rows;
  Paged paged;
  const float* k_cache;
  const float* v_cache;
  float scale;
  float* out;
  int64_t window;  // 0: none; else the query at p sees keys p - window < k <= p
};

// The first key the query at `pos` sees.
inline int64_t first_key(int64_t pos, int64_t window) { return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0; }

struct TokenGroup {  // tokens [first, first + count) of the step: one block-table row
  int64_t first, count;
};

std::vector<TokenGroup> token_groups(const int32_t* token_rows, int64_t T) {
  std::vector<TokenGroup> groups;
  for (int64_t t = 0; t < T; ++t) {
    if (groups.empty() || token_rows[t] != token_rows[groups.back().first] || groups.back().count == kMaxGroupTokens) {
      groups.push_back({t, 1});
    } else {
      ++groups.back().count;
    }
  }
  return groups;
}

struct ChunkKernels {
  void (*scores)(const float*, const f32x16*, int64_t, int64_t, const int64_t*, int64_t, float*, int64_t);
  void (*values)(const float*, int64_t, const float*, const int64_t*, int64_t, const float*, float*);
};

template <int D16, int... Ms>
constexpr std::array<ChunkKernels, sizeof...(Ms)> chunk_kernels(std::integer_sequence<int, Ms...>) {
  return {ChunkKernels{&span_scores<D16, Ms + 1>, &span_values<D16, Ms + 1>}...};
}

template <int D16>
constexpr auto kChunkKernels = chunk_kernels<D16>(std::make_integer_sequence<int, max_chunk(D16)>{});

// One thread's buffers, sized for the step's largest query block (three allocations per parallel region).
class Scratch {
 public:
  Scratch(int64_t max_q, int64_t head_dim, int64_t span, int64_t max_chunk)
      : span(span), kt_(static_cast<size_t>(span / 16 * head_dim)),
        floats_(static_cast<size_t>(2 * max_q * head_dim + max_chunk * span + 2 * max_q + max_chunk)),
        ints_(static_cast<size_t>(max_q + span + 16 * kPrefetchTiles)) {
    q = floats_.data();
    acc = q + max_q * head_dim;
    scores = acc + max_q * head_dim;
    row_max = scores + max_chunk * span;
    row_sum = row_max + max_q;
    alpha = row_sum + max_q;
    kt = kt_.data();
    qpos = ints_.data();
    offsets = qpos + max_q;
  }
  const int64_t span;      // keys per span
  f32x16* kt;              // [span / 16][head_dim] K^T tiles of the span
  float* q;                // [Q][head_dim] scaled queries
  float* acc;              // [Q][head_dim] PV accumulators
  float* scores;           // [max_chunk][span] a chunk's scores, then probabilities
  float *row_max, *row_sum, *alpha;  // [Q], [Q], [max_chunk] online softmax
  int64_t* qpos;           // [Q] each query's position
  int64_t* offsets;        // [span + 16 kPrefetchTiles] float offset of each key's row in the caches

 private:
  std::vector<f32x16> kt_;
  std::vector<float> floats_;
  std::vector<int64_t> ints_;
};

// out for the G query heads of KV head kvh of every token of the group (the tiled path).
template <int D16>
void attend_group(const Step& st, TokenGroup g, int64_t kvh, Scratch& s) {
  constexpr int HD = 16 * D16;
  constexpr int kMaxChunk = max_chunk(D16);
  const int64_t G = st.num_heads / st.kv_heads, Q = g.count * G, kv = st.kv_heads * HD;
  int64_t ctx = 0, lo = INT64_MAX;  // keys [lo, ctx) are read
  for (int64_t i = 0; i < Q; ++i) {
    const int64_t t = g.first + i / G, h = kvh * G + i % G;
    const float* q = st.qkv + t * st.row_stride + h * HD;
    for (int d = 0; d < HD; ++d) s.q[i * HD + d] = q[d] * st.scale;
    s.qpos[i] = st.positions[t];
    ctx = std::max(ctx, s.qpos[i] + 1);
    lo = std::min(lo, first_key(s.qpos[i], st.window));
  }
  std::fill(s.acc, s.acc + Q * HD, 0.f);
  std::fill(s.row_max, s.row_max + Q, -INFINITY);
  std::fill(s.row_sum, s.row_sum + Q, 0.f);
  const int64_t span = s.span;
  const int64_t chunks = (Q + kMaxChunk - 1) / kMaxChunk, chunk = (Q + chunks - 1) / chunks;
  const int64_t bs = st.paged.block_size;
  const int32_t* table = st.paged.block_tables + static_cast<int64_t>(st.token_rows[g.first]) * st.paged.width;
  for (int64_t first = lo / span * span; first < ctx; first += span) {
    const int64_t n = std::min(span, ctx - first), tiles = (n + 15) / 16;
    const int64_t n_ahead = std::min(span + 16 * kPrefetchTiles, ctx - first);
    const int64_t skip = std::max<int64_t>(0, lo - first);  // keys of the span before every query's window
    for (int64_t j = skip, b = (first + skip) / bs, o = (first + skip) % bs; j < n_ahead; ++j) {  // no division per key
      s.offsets[j] = (static_cast<int64_t>(table[b]) * bs + o) * kv + kvh * HD;
      if (++o == bs) o = 0, ++b;
    }
    std::fill(s.offsets, s.offsets + skip, s.offsets[skip]);  // never read blocks outside the windows
    transpose_keys<D16>(st.k_cache, st.v_cache, s.offsets, n, n_ahead, s.kt);
    for (int64_t q0 = 0; q0 < Q; q0 += chunk) {
      const int64_t m = std::min(chunk, Q - q0);
      const ChunkKernels& kern = kChunkKernels<D16>[m - 1];
      kern.scores(s.q + q0 * HD, s.kt, tiles, first, s.qpos + q0, st.window, s.scores, span);
      for (int64_t i = 0; i < m; ++i)
        s.alpha[i] = softmax_update(s.scores + i * span, tiles, s.row_max[q0 + i], s.row_sum[q0 + i]);
      kern.values(s.scores, span, st.v_cache, s.offsets, n, s.alpha, s.acc + q0 * HD);
    }
  }
  for (int64_t i = 0; i < Q; ++i) {
    const float inv = 1.f / s.row_sum[i];
    float* o = st.out + (g.first + i / G) * st.num_heads * HD + (kvh * G + i % G) * HD;
    for (int d = 0; d < HD; ++d) o[d] = s.acc[i * HD + d] * inv;
  }
}

template <int D16>
void attend_tiled(const Step& st, const std::vector<TokenGroup>& groups, int64_t grain) {
  constexpr int HD = 16 * D16;
  const int64_t G = st.num_heads / st.kv_heads;
  int64_t max_q = 0;
  for (const TokenGroup& g : groups) max_q = std::max(max_q, g.count * G);
  const int64_t span = std::max<int64_t>(16, kSpanFloats / HD / 16 * 16);
  at::parallel_for(0, static_cast<int64_t>(groups.size()) * st.kv_heads, grain, [&](int64_t begin, int64_t end) {
    Scratch s(max_q, HD, span, max_chunk(D16));
    for (int64_t w = begin; w < end; ++w) attend_group<D16>(st, groups[w / st.kv_heads], w % st.kv_heads, s);
  });
}

// Any head_dim: per (token, KV head), scores of every key, softmax, then PV (accumulators in memory).
void attend_per_token(const Step& st, int64_t T, int64_t max_ctx, int64_t grain) {
  const int64_t G = st.num_heads / st.kv_heads, hd = st.head_dim, kv = st.kv_heads * hd;
  const int64_t bs = st.paged.block_size;
  at::parallel_for(0, T * st.kv_heads, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(G * max_ctx));
    std::vector<float> acc(static_cast<size_t>(G * hd));
    for (int64_t w = begin; w < end; ++w) {
      const int64_t t = w / st.kv_heads, kvh = w % st.kv_heads;
      const int64_t ctx = st.positions[t] + 1, lo = first_key(st.positions[t], st.window);
      const int64_t n = ctx - lo;  // keys [lo, ctx); score j is key lo + j
      const int32_t* table = st.paged.block_tables + static_cast<int64_t>(st.token_rows[t]) * st.paged.width;
      const float* q = st.qkv + t * st.row_stride + kvh * G * hd;  // [G, head_dim]
      for (int64_t b = lo / bs, j0 = lo; j0 < ctx; ++b, j0 = b * bs) {
        const float* kb = st.k_cache + static_cast<int64_t>(table[b]) * bs * kv + kvh * hd;
        for (int64_t o = j0 % bs; o < std::min(bs, ctx - b * bs); ++o)
          for (int64_t g = 0; g < G; ++g)
            scores[g * max_ctx + b * bs + o - lo] = dot(q + g * hd, kb + o * kv, hd) * st.scale;
      }
      for (int64_t g = 0; g < G; ++g) {
        float* sg = scores.data() + g * max_ctx;
        const float m = *std::max_element(sg, sg + n);
        f32x16 sums = {};
        int64_t j = 0;
        for (; j + 16 <= n; j += 16) {
          const f32x16 e = exp16(load16(sg + j) - m);
          store16(sg + j, e);
          sums += e;
        }
        float sum = hsum16(sums);
        for (; j < n; ++j) sum += (sg[j] = std::exp(sg[j] - m));
        const float inv = 1.f / sum;
        for (j = 0; j < n; ++j) sg[j] *= inv;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t b = lo / bs, j0 = lo; j0 < ctx; ++b, j0 = b * bs) {
        const float* vb = st.v_cache + static_cast<int64_t>(table[b]) * bs * kv + kvh * hd;
        for (int64_t o = j0 % bs; o < std::min(bs, ctx - b * bs); ++o)
          for (int64_t g = 0; g < G; ++g)
            axpy(acc.data() + g * hd, scores[g * max_ctx + b * bs + o - lo], vb + o * kv, hd);
      }
      std::copy(acc.begin(), acc.end(), st.out + t * st.num_heads * hd + kvh * G * hd);
    }
  });
}

}  // namespace

void paged_attention(const float* qkv, int64_t row_stride, int64_t num_heads, int64_t kv_heads,
                     int64_t head_dim, const int64_t* positions, const int32_t* token_rows, const Paged& paged,
                     const float* k_cache, const float* v_cache, float scale, float* out, int64_t T,
                     int64_t max_ctx, int64_t window) {
  const Step st{qkv, row_stride, num_heads, kv_heads, head_dim, positions, token_rows, paged, k_cache, v_cache,
                scale, out, window};
  if (window > 0) max_ctx = std::min(max_ctx, window);  // keys one query reads at most
  const int64_t G = num_heads / kv_heads;
  if (head_dim % 16 != 0 || head_dim / 16 > kMaxD16) {
    // a thread per 2^18 multiply-adds at least: a small step never forks
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, max_ctx * G * head_dim));
    attend_per_token(st, T, max_ctx, grain);
    return;
  }
  const std::vector<TokenGroup> groups = token_groups(token_rows, T);
  int64_t max_tokens = 0;
  for (const TokenGroup& g : groups) max_tokens = std::max(max_tokens, g.count);
  const int64_t work = std::max<int64_t>(1, max_ctx * max_tokens * G * head_dim);  // multiply-adds per item, at most
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / work);
  switch (head_dim / 16) {
    case 1: return attend_tiled<1>(st, groups, grain);
    case 2: return attend_tiled<2>(st, groups, grain);
    case 3: return attend_tiled<3>(st, groups, grain);
    case 4: return attend_tiled<4>(st, groups, grain);
    case 5: return attend_tiled<5>(st, groups, grain);
    case 6: return attend_tiled<6>(st, groups, grain);
    case 7: return attend_tiled<7>(st, groups, grain);
    default: return attend_tiled<8>(st, groups, grain);
  }
}

}  // namespace triton_llm_native
