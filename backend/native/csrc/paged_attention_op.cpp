// The `paged_attention` op: write_kv then paged_attention (paged_attention.h) of one layer, as decode_forward runs
// them, for testing the attention against a torch reference (tests/backend/native/test_paged_attention.py) and
// timing it alone (tools/profile/bench_paged_attention_native.py). `window` > 0: a sliding window (the query at p sees
// keys p - window < k <= p); table entries wholly before every token's window are not read, so they may be anything
// (NULL_BLOCK, -1, where the block manager freed them).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>

#include "paged_attention.h"

namespace triton_llm_native {

int64_t check_step_tokens(const at::Tensor& positions, const at::Tensor& token_rows, const at::Tensor& block_tables,
                          int64_t block_size, int64_t max_positions) {
  const int64_t T = positions.size(0);
  TORCH_CHECK(T > 0 && token_rows.size(0) == T, "decode step: positions and token_rows disagree (or are empty)");
  TORCH_CHECK(positions.scalar_type() == at::kLong && token_rows.scalar_type() == at::kInt &&
                  block_tables.scalar_type() == at::kInt,
              "decode step: positions int64, token_rows/block_tables int32");
  TORCH_CHECK(positions.is_contiguous() && token_rows.is_contiguous() && block_tables.is_contiguous() &&
                  block_tables.dim() == 2,
              "decode step: index tensors must be contiguous");
  TORCH_CHECK(block_size > 0, "decode step: block_size must be positive");
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int32_t* rows = token_rows.data_ptr<int32_t>();
  int64_t max_ctx = 0;
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(pos[t] >= 0 && pos[t] < max_positions, "decode step: position out of range");
    TORCH_CHECK(rows[t] >= 0 && rows[t] < block_tables.size(0), "decode step: row out of range");
    TORCH_CHECK(pos[t] / block_size < block_tables.size(1), "decode step: block table too narrow");
    max_ctx = std::max(max_ctx, pos[t] + 1);
  }
  return max_ctx;
}

namespace {

at::Tensor paged_attention_op(const at::Tensor& qkv,           // [T, (H + 2 KVH) hd] float32
                              const at::Tensor& positions,     // [T] int64
                              const at::Tensor& token_rows,    // [T] int32
                              const at::Tensor& block_tables,  // [rows, width] int32
                              int64_t block_size,
                              const at::Tensor& k_cache,       // [blocks, block_size, KVH, hd] float32
                              const at::Tensor& v_cache,       // [blocks, block_size, KVH, hd] float32
                              int64_t num_heads, int64_t kv_heads, int64_t head_dim, double scale,
                              int64_t window) {
  TORCH_CHECK(num_heads > 0 && kv_heads > 0 && head_dim > 0 && num_heads % kv_heads == 0,
              "paged_attention: bad head shapes");
  for (const at::Tensor* t : {&qkv, &k_cache, &v_cache})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->device().is_cpu(),
                "paged_attention: qkv and the caches must be contiguous float32 CPU tensors");
  const int64_t width = (num_heads + 2 * kv_heads) * head_dim;
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(0) == positions.size(0) && qkv.size(1) == width,
              "paged_attention: qkv must be [T, (num_heads + 2 num_kv_heads) head_dim]");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && k_cache.dim() == 4 && k_cache.size(1) == block_size &&
                  k_cache.size(2) == kv_heads && k_cache.size(3) == head_dim,
              "paged_attention: caches must be [blocks, block_size, num_kv_heads, head_dim]");
  const int64_t max_ctx =
      check_step_tokens(positions, token_rows, block_tables, block_size, std::numeric_limits<int32_t>::max());
  TORCH_CHECK(window >= 0, "paged_attention: window must be >= 0 (0: none)");
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int64_t T = qkv.size(0);
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int32_t* rows = token_rows.data_ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t) {  // every block a token reads (from its window's first key on)
    const int64_t lo = window > 0 ? std::max<int64_t>(0, pos[t] - window + 1) : 0;
    for (int64_t b = lo / block_size; b <= pos[t] / block_size; ++b) {
      const int32_t id = tables[rows[t] * block_tables.size(1) + b];
      TORCH_CHECK(id >= 0 && id < k_cache.size(0), "paged_attention: block id out of range");
    }
  }
  const Paged paged{tables, block_tables.size(1), block_size};
  write_kv(qkv.data_ptr<float>(), width, num_heads, kv_heads, head_dim, positions.data_ptr<int64_t>(),
           token_rows.data_ptr<int32_t>(), paged, k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), T);
  at::Tensor out = at::empty({T, num_heads * head_dim}, qkv.options());
  paged_attention(qkv.data_ptr<float>(), width, num_heads, kv_heads, head_dim, positions.data_ptr<int64_t>(),
                  token_rows.data_ptr<int32_t>(), paged, k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
                  static_cast<float>(scale), out.data_ptr<float>(), T, max_ctx, window);
  return out;
}

}  // namespace
}  // namespace triton_llm_native

TORCH_LIBRARY_FRAGMENT(triton_llm, m) {
  m.def(
      "paged_attention(Tensor qkv, Tensor positions, Tensor token_rows, Tensor block_tables, int block_size, "
      "Tensor(a!) k_cache, Tensor(b!) v_cache, int num_heads, int num_kv_heads, int head_dim, float scale, "
      "int window=0) -> Tensor");
  m.impl("paged_attention", c10::DispatchKey::CPU, TORCH_FN(triton_llm_native::paged_attention_op));
}
