// The element-wise steps of a decoder layer in the decode step (decode_forward.cpp): the residual add fused with
// RMSNorm, rotate-half RoPE, and SiLU(gate) * up. Plain loops over [T, width] rows, fp32.
#pragma once

#include <cstdint>

namespace triton_llm_native {

// x += delta (when not null); out = rmsnorm(x) * weight. x, delta, out: [T, D].
void add_rms_norm(float* x, const float* delta, const float* weight, float* out, int64_t T, int64_t D, double eps);

// Rotate-half RoPE in place on the first `heads` heads of each token's row of `qkv` ([T, row_stride]); the
// cos/sin tables are [max_positions, head_dim], positions [T].
void apply_rope(float* qkv, int64_t row_stride, int64_t heads, int64_t head_dim, const int64_t* positions,
                const float* cos_table, const float* sin_table, int64_t T);

// act[t, i] = silu(gate_up[t, i]) * gate_up[t, I + i]. gate_up: [T, 2I], act: [T, I].
void silu_mul(const float* gate_up, float* act, int64_t T, int64_t I);

}  // namespace triton_llm_native
