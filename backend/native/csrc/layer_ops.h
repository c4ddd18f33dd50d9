// The element-wise steps of a decoder layer in the decode step (decode_forward.cpp): the residual add fused with
// RMSNorm, per-head RMSNorm (q/k norms), rotate-half RoPE (whole or partial), and SiLU(gate) * up or
// GELU-tanh(gate) * up. Plain loops over [T, width] rows, fp32.
#pragma once

#include <cstdint>

namespace triton_llm_native {

// x += delta (when not null); out = rmsnorm(x) * weight. x, delta, out: [T, D].
void add_rms_norm(float* x, const float* delta, const float* weight, float* out, int64_t T, int64_t D, double eps);

// In place, each of `heads` heads from head `first` of each token's row of `qkv` ([T, row_stride]) RMS-normed over
// its head_dim values and scaled by weight [head_dim] (Qwen3's q_norm / k_norm).
void rms_norm_heads(float* qkv, int64_t row_stride, int64_t first, int64_t heads, int64_t head_dim,
                    const float* weight, double eps, int64_t T);

// Rotate-half RoPE in place on the first rotary_dim dims of the first `heads` heads of each token's row of `qkv`
// ([T, row_stride]; the other head_dim - rotary_dim dims are left as they are); the cos/sin tables are
// [max_positions, rotary_dim], positions [T].
void apply_rope(float* qkv, int64_t row_stride, int64_t heads, int64_t head_dim, int64_t rotary_dim,
                const int64_t* positions, const float* cos_table, const float* sin_table, int64_t T);

// act[t, i] = silu(gate_up[t, i]) * gate_up[t, I + i]. gate_up: [T, 2I], act: [T, I].
void silu_mul(const float* gate_up, float* act, int64_t T, int64_t I);

// act[t, i] = gelu_tanh(gate_up[t, i]) * gate_up[t, I + i] (GeGLU with GELU's tanh approximation, torch's
// gelu(approximate="tanh"): 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))). gate_up: [T, 2I], act: [T, I].
void gelu_tanh_mul(const float* gate_up, float* act, int64_t T, int64_t I);

}  // namespace triton_llm_native
