// Weight-only int8 / int4 matmuls for decode-sized inputs (1..8 tokens): y = x @ dequant(W)^T + bias.
//
// Design (a): dequantize in fp32 registers and FMA, so the result equals a matmul with the dequantized
// weight up to summation order. Each weight byte is read once from memory per call, shared by all tokens.
//
// int8: qweight [out, in] int8 row-major, scale [out, groups] fp32; w[o, i] = q[o, i] * scale[o, i / group],
//       group = in / groups: one group (per output channel, any width) or groups of a multiple of 16 columns.
// int4: packed [out, in / 2] uint8 in blocks of 32 columns: byte j of a block holds column j in the low
//       nibble and column j + 16 in the high nibble, n in [0, 15]; scale and zeros [out, groups] fp32;
//       w[o, i] = (n - zero[o, g]) * scale[o, g], g = i / group, zero 8 when zeros is None (symmetric).
//       Needs group % 32 == 0 (so a block lies in one group). The dequantized value (n - zero) * scale is
//       computed per group into a 16-entry table and looked up per nibble (vpermps), bit-identical to the
//       torch dequantization.
//
// Rows are split over OpenMP threads (torch's at::get_num_threads()). The row kernels: quant_rows.h (design (a))
// and quant_q8.h (design (b)); the one-pass dequantization for larger steps: quant_dequant.cpp.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>

#include <optional>
#include <type_traits>

#include "quant_args.h"
#include "quant_q8.h"
#include "quant_rows.h"

namespace triton_llm_native::quant {
namespace {

// Rows per step: enough independent accumulators to hide the FMA latency, few enough to stay in registers.
template <int NT>
constexpr int rows_per_step() { return NT <= 2 ? 4 : (NT <= 4 ? 2 : 1); }

// Runs fn<NT, R>(o, acc) over all rows (R at a time, then the remainder one by one) on torch's threads,
// and writes acc [NT][R] (+ bias) into y [NT, out].
template <int NT, typename Step>
void over_rows(int64_t out, float* y, const float* bias, Step step) {
  constexpr int R = rows_per_step<NT>();
  const int64_t steps = out / R;
  const int nthreads = at::get_num_threads();
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1)
  for (int64_t s = 0; s <= steps; ++s) {
    float acc[NT * R];
    if (s < steps) {
      const int64_t o = s * R;
      step(std::integral_constant<int, R>{}, o, acc);
      for (int t = 0; t < NT; ++t)
        for (int r = 0; r < R; ++r) y[t * out + o + r] = acc[t * R + r] + (bias ? bias[o + r] : 0.f);
    } else {
      for (int64_t o = steps * R; o < out; ++o) {
        step(std::integral_constant<int, 1>{}, o, acc);
        for (int t = 0; t < NT; ++t) y[t * out + o] = acc[t] + (bias ? bias[o] : 0.f);
      }
    }
  }
}

void check_common(const at::Tensor& x, const at::Tensor& scale, const std::optional<at::Tensor>& bias, int64_t out,
                  const char* op) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), op,
              ": x must be a contiguous 2-D float32 CPU tensor");
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= kMaxTokens, op, ": x must have 1..", kMaxTokens, " rows, got ",
              x.size(0));
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous(), op, ": scale must be contiguous float32");
  if (bias) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == out, op,
                ": bias must be a contiguous float32 tensor of ", out, " elements");
  }
}

template <template <int> class Kernel, typename... Args>
void dispatch_tokens(int64_t n, Args... args) {
  switch (n) {
    case 1: Kernel<1>::run(args...); break;
    case 2: Kernel<2>::run(args...); break;
    case 3: Kernel<3>::run(args...); break;
    case 4: Kernel<4>::run(args...); break;
    case 5: Kernel<5>::run(args...); break;
    case 6: Kernel<6>::run(args...); break;
    case 7: Kernel<7>::run(args...); break;
    default: Kernel<8>::run(args...); break;
  }
}

template <int NT>
struct Int8Kernel {
  static void run(const float* x, int64_t in, const int8_t* q, const float* scale, int64_t groups, int64_t out,
                  float* y, const float* bias) {
    over_rows<NT>(out, y, bias, [&](auto rc, int64_t o, float* acc) {
      int8_rows<NT, decltype(rc)::value>(x, in, q, o, scale, groups, acc);
    });
  }
};

template <int NT>
struct Int4Kernel {
  static void run(const float* x, int64_t in, const uint8_t* p, const float* scale, const float* zeros,
                  int64_t groups, int64_t out, float* y, const float* bias) {
    over_rows<NT>(out, y, bias, [&](auto rc, int64_t o, float* acc) {
      int4_rows<NT, decltype(rc)::value>(x, in, p, o, scale, zeros, groups, acc);
    });
  }
};


template <int NT>
struct Int4Q8Kernel {
  static void run(const float* x, int64_t in, const uint8_t* p, const float* scale, const float* zeros,
                  int64_t groups, int64_t out, float* y, const float* bias) {
    const QuantizedX xq = quantize_activations(x, NT, in, groups);
    over_rows<NT>(out, y, bias, [&](auto rc, int64_t o, float* acc) {
      int4_q8_rows<NT, decltype(rc)::value>(xq, in, p, o, scale, zeros, groups, acc);
    });
  }
};

// x [n, in] fp32, qweight [out, in] int8, scale [out, groups] fp32, bias [out] or None -> [n, out]
at::Tensor quant_gemv_int8(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale,
                           const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(qweight.scalar_type() == at::kChar && qweight.dim() == 2 && qweight.is_contiguous(),
              "quant_gemv_int8: qweight must be a contiguous 2-D int8 tensor");
  const int64_t out = qweight.size(0), in = qweight.size(1);
  check_common(x, scale, bias, out, "quant_gemv_int8");
  TORCH_CHECK(x.size(1) == in && scale.dim() == 2 && scale.size(0) == out && scale.size(1) >= 1,
              "quant_gemv_int8: shapes do not match: x ", x.sizes(), ", qweight ", qweight.sizes(), ", scale ",
              scale.sizes());
  const int64_t groups = scale.size(1);
  TORCH_CHECK(groups == 1 || (in % groups == 0 && (in / groups) % 16 == 0), "quant_gemv_int8: ", groups,
              " groups of ", in, " columns: each must be a multiple of 16 columns");
  at::Tensor y = at::empty({x.size(0), out}, x.options());
  dispatch_tokens<Int8Kernel>(x.size(0), x.data_ptr<float>(), in, qweight.data_ptr<int8_t>(),
                              scale.data_ptr<float>(), groups, out, y.data_ptr<float>(),
                              bias ? bias->data_ptr<float>() : (const float*)nullptr);
  return y;
}

// x [n, in] fp32, packed [out, in / 2] uint8 (blocks of 32), scale and zeros [out, groups] fp32 -> [n, out]
at::Tensor quant_gemv_int4(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                           const std::optional<at::Tensor>& zeros, const std::optional<at::Tensor>& bias) {
  const int64_t out = packed.size(0);
  check_common(x, scale, bias, out, "quant_gemv_int4");
  const int64_t in = check_int4_layout(packed, scale, zeros, kBlock, "quant_gemv_int4");
  TORCH_CHECK(x.size(1) == in, "quant_gemv_int4: shapes do not match: x ", x.sizes(), ", packed ", packed.sizes());
  const int64_t groups = scale.size(1);
  at::Tensor y = at::empty({x.size(0), out}, x.options());
  dispatch_tokens<Int4Kernel>(x.size(0), x.data_ptr<float>(), in, packed.data_ptr<uint8_t>(),
                              scale.data_ptr<float>(), zeros ? zeros->data_ptr<float>() : (const float*)nullptr,
                              groups, out, y.data_ptr<float>(), bias ? bias->data_ptr<float>() : (const float*)nullptr);
  return y;
}

// Design (b): as quant_gemv_int4, the activations quantized to int8 per (token, group); group % 64 == 0.
at::Tensor quant_gemv_int4_q8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                              const std::optional<at::Tensor>& zeros, const std::optional<at::Tensor>& bias) {
  const int64_t out = packed.size(0);
  check_common(x, scale, bias, out, "quant_gemv_int4_q8");
  const int64_t in = check_int4_layout(packed, scale, zeros, kChunk, "quant_gemv_int4_q8");
  TORCH_CHECK(x.size(1) == in, "quant_gemv_int4_q8: shapes do not match: x ", x.sizes(), ", packed ", packed.sizes());
  const int64_t groups = scale.size(1);
  at::Tensor y = at::empty({x.size(0), out}, x.options());
  dispatch_tokens<Int4Q8Kernel>(x.size(0), x.data_ptr<float>(), in, packed.data_ptr<uint8_t>(),
                                scale.data_ptr<float>(), zeros ? zeros->data_ptr<float>() : (const float*)nullptr,
                                groups, out, y.data_ptr<float>(),
                                bias ? bias->data_ptr<float>() : (const float*)nullptr);
  return y;
}

}  // namespace
}  // namespace triton_llm_native::quant

TORCH_LIBRARY_FRAGMENT(triton_llm, m) {
  using namespace triton_llm_native::quant;
  m.def("quant_gemv_int8(Tensor x, Tensor qweight, Tensor scale, Tensor? bias) -> Tensor", &quant_gemv_int8);
  m.def("quant_gemv_int4(Tensor x, Tensor packed, Tensor scale, Tensor? zeros, Tensor? bias) -> Tensor",
        &quant_gemv_int4);
  m.def("quant_gemv_int4_q8(Tensor x, Tensor packed, Tensor scale, Tensor? zeros, Tensor? bias) -> Tensor",
        &quant_gemv_int4_q8);
}
