// Argument checks shared by the int4 ops (quant_gemv.cpp, quant_dequant.cpp): the packed int4 layout.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

namespace triton_llm_native::quant {

// packed [rows, in / 2] uint8, scale [rows, groups] fp32, zeros (optional) shaped like scale, and every group a
// multiple of `block` columns. Returns `in`, the unpacked width. `op` names the op in every message.
inline int64_t check_int4_layout(const at::Tensor& packed, const at::Tensor& scale,
                                 const std::optional<at::Tensor>& zeros, int64_t block, const char* op) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 2 && packed.is_contiguous(), op,
              ": packed must be a contiguous 2-D uint8 tensor");
  const int64_t rows = packed.size(0), in = packed.size(1) * 2;
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.dim() == 2 &&
              scale.size(0) == rows && scale.size(1) >= 1, op, ": scale must be contiguous float32 [", rows,
              ", groups], got ", scale.sizes());
  const int64_t groups = scale.size(1);
  TORCH_CHECK(in % groups == 0 && (in / groups) % block == 0, op, ": ", groups, " groups of ", in,
              " columns: each must be a multiple of ", block, " columns");
  if (zeros) {
    TORCH_CHECK(zeros->scalar_type() == at::kFloat && zeros->is_contiguous() && zeros->sizes() == scale.sizes(), op,
                ": zeros must be contiguous float32 shaped like scale");
  }
  return in;
}

}  // namespace triton_llm_native::quant
