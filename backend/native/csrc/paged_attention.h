// The decode step's paged KV: writing each token's K/V into its cache slot, and GQA attention of each token over
// its sequence's blocks (decode_forward.cpp). Token t of a step sits at positions[t] of the sequence whose
// block-table row is token_rows[t] and sees the keys at positions 0..positions[t] of that row.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace triton_llm_native {

struct Paged {
  const int32_t* block_tables;  // [rows, width]
  int64_t width;
  int64_t block_size;
  int64_t slot(int64_t row, int64_t pos) const {
    return static_cast<int64_t>(block_tables[row * width + pos / block_size]) * block_size + pos % block_size;
  }
};

// Copy each token's K and V (heads [H, H+KVH) and [H+KVH, H+2KVH) of its qkv row) into its cache slot.
// qkv: [T, row_stride]; k_cache, v_cache: [blocks * block_size, KVH * head_dim].
void write_kv(const float* qkv, int64_t row_stride, int64_t num_heads, int64_t kv_heads, int64_t head_dim,
              const int64_t* positions, const int32_t* token_rows, const Paged& paged, float* k_cache,
              float* v_cache, int64_t T);

// out[t, h] = softmax(q[t, h] . K[lo..pos] * scale) V[lo..pos], the G = H / KVH query heads of one KV head
// together (GQA: query head h reads KV head h / G); lo = 0, or with a sliding window (> 0) max(0, pos - window + 1):
// blocks wholly before every token's window are never read (they may be freed: any entry in the table). Consecutive tokens of one row (a verify step) share one
// walk over their keys, each masked at its own position; keys are walked through the row's block table (no
// division per key). out: [T, H * head_dim].
void paged_attention(const float* qkv, int64_t row_stride, int64_t num_heads, int64_t kv_heads,
                     int64_t head_dim, const int64_t* positions, const int32_t* token_rows, const Paged& paged,
                     const float* k_cache, const float* v_cache, float scale, float* out, int64_t T,
                     int64_t max_ctx, int64_t window = 0);

// Checks a step's positions [T] int64, token_rows [T] int32 and block_tables [rows, width] int32 (dtypes,
// contiguity, positions in [0, max_positions), rows and blocks inside the table); returns the largest context.
int64_t check_step_tokens(const at::Tensor& positions, const at::Tensor& token_rows, const at::Tensor& block_tables,
                          int64_t block_size, int64_t max_positions);

}  // namespace triton_llm_native
