// quant_dequant_int4: the int4 layout of quant_gemv.cpp dequantized to fp32 in one pass (the torch path of
// quantized linears for prefill and steps of more than 8 tokens, then one matmul).
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>

#include <optional>

#include "quant_args.h"
#include "quant_rows.h"

namespace triton_llm_native::quant {
namespace {

// The torch path's dequantization, one pass: out [out, in] fp32 = (n - zero) * scale, for prefill and
// batches past 8 tokens (then one matmul). Same values as quant_pack.dequantize_int4, bit for bit.
at::Tensor quant_dequant_int4(const at::Tensor& packed, const at::Tensor& scale, const std::optional<at::Tensor>& zeros,
                              at::Tensor out) {
  const int64_t in = check_int4_layout(packed, scale, zeros, kBlock, "quant_dequant_int4");
  const int64_t rows = packed.size(0), groups = scale.size(1);
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.size(0) == rows && out.size(1) == in,
              "quant_dequant_int4: out must be a contiguous float32 [", rows, ", ", in, "] tensor");
  const uint8_t* p = packed.data_ptr<uint8_t>();
  const float* sc = scale.data_ptr<float>();
  const float* zp = zeros ? zeros->data_ptr<float>() : nullptr;
  float* o = out.data_ptr<float>();
  const int64_t group = in / groups, row_bytes = in / 2;
  const int nthreads = at::get_num_threads();
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float s = sc[r * groups + g], zero = zp ? zp[r * groups + g] : 8.f;
#ifdef QUANT_GEMV_AVX512
      const __m512 table = _mm512_mul_ps(
          _mm512_sub_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_ps(zero)),
          _mm512_set1_ps(s));
      for (int64_t b = g * group / kBlock; b < (g + 1) * group / kBlock; ++b) {
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(p + r * row_bytes + b * 16)));
        _mm512_storeu_ps(o + r * in + b * kBlock, _mm512_permutexvar_ps(v, table));
        _mm512_storeu_ps(o + r * in + b * kBlock + 16, _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table));
      }
#else
      for (int64_t b = g * group / kBlock; b < (g + 1) * group / kBlock; ++b)
        for (int j = 0; j < 16; ++j) {
          const uint8_t byte = p[r * row_bytes + b * 16 + j];
          o[r * in + b * kBlock + j] = (float(byte & 0xF) - zero) * s;
          o[r * in + b * kBlock + 16 + j] = (float(byte >> 4) - zero) * s;
        }
#endif
    }
  }
  return out;
}

}  // namespace
}  // namespace triton_llm_native::quant

TORCH_LIBRARY_FRAGMENT(triton_llm, m) {
  m.def("quant_dequant_int4(Tensor packed, Tensor scale, Tensor? zeros, Tensor(a!) out) -> Tensor(a!)",
        &triton_llm_native::quant::quant_dequant_int4);
}
