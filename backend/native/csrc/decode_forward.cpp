// The whole Llama decoder forward for decode and speculative-verify steps, in one op (fp32, CPU).
//
// Every token of the step attends causally to its own sequence's paged KV: token t of the step sits at
// positions[t] of the sequence whose persistent block-table row is token_rows[t]; its K/V go to slot
// block_tables[row][pos / block_size] * block_size + pos % block_size and it sees the keys at positions
// 0..positions[t] of that row. That covers one-token decodes and the k+1 tokens of a verify step (the
// last known token and the drafts) alike, with no per-step metadata beyond the three token arrays.
//
// Per layer: RMSNorm (fused with the residual add of the previous block), QKV projection, RoPE
// (rotate-half, from the model's cos/sin tables), paged K/V write, GQA attention over the block table,
// o-projection + residual, RMSNorm, gate-up projection, SiLU * up, down projection (+ residual into the
// next norm). Then the final norm and the LM head: returns logits [num_tokens, vocab].
//
// The projections call at::linear (the same MKL kernels as the eager path); everything between them
// is plain loops here. Sliding windows and quantized weights are not handled: the Python side
// (backend/engine/native_decode.py) keeps those models on the eager path.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace {

constexpr int kLayerWeights = 6;  // input_norm, qkv, o, post_norm, gate_up, down
constexpr int kLayerBiases = 3;   // qkv, gate_up, down (empty tensor: none)

// x += delta (when given); out = rmsnorm(x) * weight. x, delta, out: [T, D].
void add_rms_norm(float* x, const float* delta, const float* weight, float* out, int64_t T, int64_t D,
                  double eps) {
  for (int64_t t = 0; t < T; ++t) {
    float* xr = x + t * D;
    if (delta != nullptr) {
      const float* dr = delta + t * D;
      for (int64_t i = 0; i < D; ++i) xr[i] += dr[i];
    }
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < D; ++i) ss += xr[i] * xr[i];
    const float inv = 1.f / std::sqrt(ss / static_cast<float>(D) + static_cast<float>(eps));
    float* o = out + t * D;
    for (int64_t i = 0; i < D; ++i) o[i] = weight[i] * (xr[i] * inv);
  }
}

// Rotate-half RoPE in place on the first `heads` heads of each token's row of `qkv` ([T, row_stride]).
void apply_rope(float* qkv, int64_t row_stride, int64_t heads, int64_t head_dim, const int64_t* positions,
                const float* cos_table, const float* sin_table, int64_t T) {
  const int64_t half = head_dim / 2;
  for (int64_t t = 0; t < T; ++t) {
    const float* c = cos_table + positions[t] * head_dim;
    const float* s = sin_table + positions[t] * head_dim;
    for (int64_t h = 0; h < heads; ++h) {
      float* x = qkv + t * row_stride + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c[i] - x2 * s[i];
        x[i + half] = x2 * c[i + half] + x1 * s[i + half];
      }
    }
  }
}

struct Paged {
  const int32_t* block_tables;  // [rows, width]
  int64_t width;
  int64_t block_size;
  int64_t slot(int64_t row, int64_t pos) const {
    return static_cast<int64_t>(block_tables[row * width + pos / block_size]) * block_size + pos % block_size;
  }
};

// Copy each token's K and V (heads [H, H+KVH) and [H+KVH, H+2KVH) of its qkv row) into its cache slot.
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

// 16-float vectors (one AVX-512 register; GCC vector extensions, so no intrinsics): the attention's per-key
// dot products and V accumulation over head_dim, when head_dim is a multiple of 16.
typedef float f32x16 __attribute__((vector_size(64)));

inline f32x16 load16(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store16(float* p, f32x16 v) { std::memcpy(p, &v, sizeof(v)); }

typedef int32_t i32x16 __attribute__((vector_size(64)));

// e^x for 16 lanes (Cephes' expf: x = n ln2 + r, a degree-6 polynomial in r, times 2^n; relative error ~1e-7;
// x is clamped to [-87.3, 88.7]). libm's expf is not vectorised under these flags: one call per element cost
// more than the attention's dot products.
inline f32x16 exp16(f32x16 x) {
  const f32x16 lo = f32x16{} - 87.3f, hi = f32x16{} + 88.7f;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  // n = floor(x log2(e) + 1/2) (a conversion and a compare: -ffast-math would fold the magic-number trick away)
  const f32x16 t = x * 1.44269504088896341f + 0.5f;
  f32x16 n = __builtin_convertvector(__builtin_convertvector(t, i32x16), f32x16);
  n = n > t ? n - 1.f : n;
  const f32x16 r = x - n * 0.693359375f + n * 2.12194440e-4f;
  f32x16 p = f32x16{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const f32x16 y = p * r * r + r + 1.f;
  const i32x16 bits = (__builtin_convertvector(n, i32x16) + 127) << 23;
  f32x16 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

typedef float f32x8 __attribute__((vector_size(32)));
typedef float f32x4 __attribute__((vector_size(16)));

inline float hsum16(f32x16 v) {  // a tree of halves, not 15 dependent scalar adds
  const f32x8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const f32x4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

inline float dot(const float* a, const float* b, int64_t n) {
  if (n % 16 == 0) {
    f32x16 acc = {};
    for (int64_t d = 0; d < n; d += 16) acc += load16(a + d) * load16(b + d);
    return hsum16(acc);
  }
  float s = 0.f;
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

inline void axpy(float* acc, float p, const float* v, int64_t n) {  // acc += p * v
  if (n % 16 == 0) {
    for (int64_t d = 0; d < n; d += 16) {
      const f32x16 r = load16(acc + d) + p * load16(v + d);
      std::memcpy(acc + d, &r, sizeof(r));
    }
    return;
  }
  for (int64_t d = 0; d < n; ++d) acc[d] += p * v[d];
}

// out[t, h] = softmax(q[t, h] . K[0..pos] * scale) V[0..pos], the G = H / KVH query heads of one KV head
// together (GQA: query head h reads KV head h / G). Keys are walked block by block of the row's table
// (no division per key). out: [T, H * head_dim].
void paged_attention(const float* qkv, int64_t row_stride, int64_t num_heads, int64_t kv_heads,
                     int64_t head_dim, const int64_t* positions, const int32_t* token_rows, const Paged& paged,
                     const float* k_cache, const float* v_cache, float scale, float* out, int64_t T,
                     int64_t max_ctx) {
  const int64_t G = num_heads / kv_heads;
  const int64_t kv = kv_heads * head_dim;
  const int64_t bs = paged.block_size;
  // a thread per 2^18 multiply-adds at least: a small step never forks
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, max_ctx * G * head_dim));
  at::parallel_for(0, T * kv_heads, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(G * max_ctx));
    std::vector<float> acc(static_cast<size_t>(G * head_dim));
    for (int64_t w = begin; w < end; ++w) {
      const int64_t t = w / kv_heads, kvh = w % kv_heads;
      const int64_t ctx = positions[t] + 1;
      const int32_t* table = paged.block_tables + static_cast<int64_t>(token_rows[t]) * paged.width;
      const float* q = qkv + t * row_stride + kvh * G * head_dim;  // [G, head_dim]
      for (int64_t b = 0, j0 = 0; j0 < ctx; ++b, j0 += bs) {
        const float* kb = k_cache + static_cast<int64_t>(table[b]) * bs * kv + kvh * head_dim;
        const int64_t n = std::min(bs, ctx - j0);
        for (int64_t o = 0; o < n; ++o) {
          const float* k = kb + o * kv;
          for (int64_t g = 0; g < G; ++g) scores[g * max_ctx + j0 + o] = dot(q + g * head_dim, k, head_dim) * scale;
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        float* sg = scores.data() + g * max_ctx;
        float m = -INFINITY;
        for (int64_t j = 0; j < ctx; ++j) m = std::max(m, sg[j]);
        f32x16 sums = {};
        int64_t j = 0;
        for (; j + 16 <= ctx; j += 16) {
          const f32x16 e = exp16(load16(sg + j) - m);
          store16(sg + j, e);
          sums += e;
        }
        float sum = hsum16(sums);
        for (; j < ctx; ++j) {
          sg[j] = std::exp(sg[j] - m);
          sum += sg[j];
        }
        const float inv = 1.f / sum;
#pragma omp simd
        for (int64_t j = 0; j < ctx; ++j) sg[j] *= inv;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t b = 0, j0 = 0; j0 < ctx; ++b, j0 += bs) {
        const float* vb = v_cache + static_cast<int64_t>(table[b]) * bs * kv + kvh * head_dim;
        const int64_t n = std::min(bs, ctx - j0);
        for (int64_t o = 0; o < n; ++o) {
          const float* v = vb + o * kv;
          for (int64_t g = 0; g < G; ++g) axpy(acc.data() + g * head_dim, scores[g * max_ctx + j0 + o], v, head_dim);
        }
      }
      std::copy(acc.begin(), acc.end(), out + t * num_heads * head_dim + kvh * G * head_dim);
    }
  });
}

// act[t, i] = silu(gate_up[t, i]) * gate_up[t, I + i]
void silu_mul(const float* gate_up, float* act, int64_t T, int64_t I) {
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gate_up + t * 2 * I;
    const float* u = g + I;
    float* a = act + t * I;
    int64_t i = 0;
    for (; i + 16 <= I; i += 16) {
      const f32x16 gv = load16(g + i);
      store16(a + i, gv / (1.f + exp16(-gv)) * load16(u + i));
    }
    for (; i < I; ++i) a[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
  }
}

// y[t, n] = w[n] . x[t] (+ bias[n]) for a few tokens: each weight row is read once from memory and
// dotted with every token while it sits in L1 (a step of a few tokens is bound by weight bandwidth).
// Rows are split across threads. x: [T, K], w: [N, K], y: [T, N].
constexpr int64_t kGemvMacsPerThread = int64_t{1} << 20;

void gemv_rows(const float* x, const float* w, const float* bias, float* y, int64_t T, int64_t N, int64_t K) {
  // a thread only for every kGemvMacsPerThread multiply-adds: small projections never fork (an OpenMP barrier
  // per projection costs more than it saves there, and stalls whenever a thread is descheduled)
  const int64_t groups = (N + 3) / 4;
  const int64_t grain = std::max<int64_t>(1, kGemvMacsPerThread / std::max<int64_t>(1, 4 * K * T));
  at::parallel_for(0, groups, grain, [&](int64_t begin, int64_t end) {
    for (int64_t n4 = begin; n4 < end; ++n4) {
      const int64_t n = 4 * n4;
      if (n + 4 <= N) {
        const float* w0 = w + n * K;
        const float* w1 = w0 + K;
        const float* w2 = w1 + K;
        const float* w3 = w2 + K;
        for (int64_t t = 0; t < T; ++t) {
          const float* xt = x + t * K;
          float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
          for (int64_t k = 0; k < K; ++k) {
            a0 += w0[k] * xt[k];
            a1 += w1[k] * xt[k];
            a2 += w2[k] * xt[k];
            a3 += w3[k] * xt[k];
          }
          float* yt = y + t * N + n;
          yt[0] = a0 + (bias ? bias[n] : 0.f);
          yt[1] = a1 + (bias ? bias[n + 1] : 0.f);
          yt[2] = a2 + (bias ? bias[n + 2] : 0.f);
          yt[3] = a3 + (bias ? bias[n + 3] : 0.f);
        }
      } else {
        for (int64_t r = n; r < N; ++r) {
          for (int64_t t = 0; t < T; ++t) {
            float a = 0.f;
#pragma omp simd reduction(+ : a)
            for (int64_t k = 0; k < K; ++k) a += w[r * K + k] * x[t * K + k];
            y[t * N + r] = a + (bias ? bias[r] : 0.f);
          }
        }
      }
    }
  });
}

// Tokens up to this many take gemv_rows; more go to at::linear (MKL's GEMM, compute-bound there).
constexpr int64_t kGemvMaxTokens = 8;

// x [T, K] @ w[N, K]^T (+ bias): the projection of every layer.
at::Tensor project(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  const int64_t T = x.size(0), N = w.size(0), K = w.size(1);
  const bool has_bias = bias.defined() && bias.numel() > 0;
  if (T > kGemvMaxTokens) {
    return has_bias ? at::linear(x, w, bias).contiguous() : at::linear(x, w).contiguous();
  }
  at::Tensor y = at::empty({T, N}, x.options());
  gemv_rows(x.data_ptr<float>(), w.data_ptr<float>(), has_bias ? bias.data_ptr<float>() : nullptr,
            y.data_ptr<float>(), T, N, K);
  return y;
}

at::Tensor decode_gemv(const at::Tensor& x, const at::Tensor& w) {  // x [T, K], w [N, K] -> [T, N]
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && x.is_contiguous() &&
                  w.is_contiguous() && x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1),
              "decode_gemv: contiguous float32 x [T, K] and w [N, K]");
  at::Tensor y = at::empty({x.size(0), w.size(0)}, x.options());
  gemv_rows(x.data_ptr<float>(), w.data_ptr<float>(), nullptr, y.data_ptr<float>(), x.size(0), w.size(0),
            x.size(1));
  return y;
}

void check_f32(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu(), name,
              ": expected a contiguous float32 CPU tensor");
}

at::Tensor decode_forward(const at::Tensor& token_ids,     // [T] int64
                          const at::Tensor& positions,     // [T] int64
                          const at::Tensor& token_rows,    // [T] int32  block-table row of each token
                          const at::Tensor& block_tables,  // [rows, width] int32
                          int64_t block_size, const at::Tensor& embed,  // [V, D]
                          at::TensorList layer_weights,    // 6 per layer
                          at::TensorList layer_biases,     // 3 per layer (empty: none)
                          at::TensorList k_cache,          // per layer [blocks, block_size, KVH, hd]
                          at::TensorList v_cache, const at::Tensor& cos_table,  // [max_pos, hd]
                          const at::Tensor& sin_table, const at::Tensor& final_norm,  // [D]
                          const at::Tensor& lm_head,       // [V, D]
                          int64_t num_heads, int64_t kv_heads, int64_t head_dim, double eps, double scale) {
  const int64_t T = token_ids.size(0);
  const int64_t L = static_cast<int64_t>(k_cache.size());
  const int64_t D = embed.size(1);
  TORCH_CHECK(T > 0, "decode_forward: no tokens");
  TORCH_CHECK(static_cast<int64_t>(layer_weights.size()) == kLayerWeights * L &&
                  static_cast<int64_t>(layer_biases.size()) == kLayerBiases * L &&
                  static_cast<int64_t>(v_cache.size()) == L,
              "decode_forward: per-layer lists disagree with the number of layers");
  TORCH_CHECK(num_heads % kv_heads == 0 && head_dim % 2 == 0, "decode_forward: bad head shapes");
  TORCH_CHECK(token_ids.scalar_type() == at::kLong && positions.scalar_type() == at::kLong &&
                  token_rows.scalar_type() == at::kInt && block_tables.scalar_type() == at::kInt,
              "decode_forward: token_ids/positions int64, token_rows/block_tables int32");
  TORCH_CHECK(token_ids.is_contiguous() && positions.is_contiguous() && token_rows.is_contiguous() &&
                  block_tables.is_contiguous() && block_tables.dim() == 2,
              "decode_forward: index tensors must be contiguous");
  check_f32(embed, "embed");
  check_f32(cos_table, "cos");
  check_f32(sin_table, "sin");
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int32_t* rows = token_rows.data_ptr<int32_t>();
  int64_t max_ctx = 0;
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(pos[t] >= 0 && pos[t] < cos_table.size(0), "decode_forward: position out of range");
    TORCH_CHECK(rows[t] >= 0 && rows[t] < block_tables.size(0), "decode_forward: row out of range");
    TORCH_CHECK(pos[t] / block_size < block_tables.size(1), "decode_forward: block table too narrow");
    max_ctx = std::max(max_ctx, pos[t] + 1);
  }
  const Paged paged{block_tables.data_ptr<int32_t>(), block_tables.size(1), block_size};
  const int64_t qkv_width = (num_heads + 2 * kv_heads) * head_dim;

  at::Tensor x = at::embedding(embed, token_ids).contiguous();  // [T, D] the residual stream
  at::Tensor h = at::empty({T, D}, x.options());                // normed input of each block
  at::Tensor attn = at::empty({T, num_heads * head_dim}, x.options());
  at::Tensor delta;                                             // the last block's output, not yet added
  for (int64_t l = 0; l < L; ++l) {
    const at::Tensor* w = layer_weights.data() + kLayerWeights * l;
    const at::Tensor* b = layer_biases.data() + kLayerBiases * l;
    check_f32(k_cache[l], "k_cache");
    check_f32(v_cache[l], "v_cache");
    TORCH_CHECK(w[1].size(0) == qkv_width, "decode_forward: qkv weight shape");
    add_rms_norm(x.data_ptr<float>(), delta.defined() ? delta.data_ptr<float>() : nullptr,
                 w[0].data_ptr<float>(), h.data_ptr<float>(), T, D, eps);
    at::Tensor qkv = project(h, w[1], b[0]);  // [T, (H + 2 KVH) hd]
    float* qkvp = qkv.data_ptr<float>();
    apply_rope(qkvp, qkv_width, num_heads + kv_heads, head_dim, pos, cos_table.data_ptr<float>(),
               sin_table.data_ptr<float>(), T);
    write_kv(qkvp, qkv_width, num_heads, kv_heads, head_dim, pos, rows, paged, k_cache[l].data_ptr<float>(),
             v_cache[l].data_ptr<float>(), T);
    paged_attention(qkvp, qkv_width, num_heads, kv_heads, head_dim, pos, rows, paged,
                    k_cache[l].data_ptr<float>(), v_cache[l].data_ptr<float>(), static_cast<float>(scale),
                    attn.data_ptr<float>(), T, max_ctx);
    at::Tensor o = project(attn, w[2], at::Tensor());  // [T, D] (no o_proj bias)
    add_rms_norm(x.data_ptr<float>(), o.data_ptr<float>(), w[3].data_ptr<float>(), h.data_ptr<float>(), T, D,
                 eps);
    at::Tensor gate_up = project(h, w[4], b[1]);  // [T, 2I]
    const int64_t I = gate_up.size(1) / 2;
    at::Tensor act = at::empty({T, I}, x.options());
    silu_mul(gate_up.data_ptr<float>(), act.data_ptr<float>(), T, I);
    delta = project(act, w[5], b[2]);        // [T, D]
  }
  add_rms_norm(x.data_ptr<float>(), delta.defined() ? delta.data_ptr<float>() : nullptr,
               final_norm.data_ptr<float>(), h.data_ptr<float>(), T, D, eps);
  return project(h, lm_head, at::Tensor());  // [T, V]
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(triton_llm, m) {
  m.def(
      "decode_forward(Tensor token_ids, Tensor positions, Tensor token_rows, Tensor block_tables, int block_size, "
      "Tensor embed, Tensor[] layer_weights, Tensor[] layer_biases, Tensor(a!)[] k_cache, Tensor(b!)[] v_cache, "
      "Tensor cos, Tensor sin, Tensor final_norm, Tensor lm_head, int num_heads, int num_kv_heads, int head_dim, "
      "float eps, float scale) -> Tensor");
  m.impl("decode_forward", c10::DispatchKey::CPU, TORCH_FN(decode_forward));
  m.def("decode_gemv(Tensor x, Tensor w) -> Tensor");
  m.impl("decode_gemv", c10::DispatchKey::CPU, TORCH_FN(decode_gemv));
}
