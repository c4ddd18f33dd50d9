// The LoRA delta of the decode step (decode_forward.cpp): every token with an adapter slot gets
// y[t] += B[s] (A[s] x[t]) after a projection, tokens of slot -1 nothing (Punica's BGMV shapes: a shrink to the
// stacked rank R, an expand back to N). fp32; the stacks are laid out by backend/lora/stacked.py.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace triton_llm_native {

// x [T, K], y [T, N] (updated in place), a [S, R, K], b [S, N, R], slots [T] (-1: no adapter).
void add_lora_delta(const at::Tensor& x, at::Tensor& y, const at::Tensor& a, const at::Tensor& b,
                    const int32_t* slots);

}  // namespace triton_llm_native
