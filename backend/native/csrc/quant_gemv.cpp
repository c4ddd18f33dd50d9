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
// Rows are split over OpenMP threads (torch's at::get_num_threads()). AVX-512F/BW/VL when the build's
// -march has it, else a scalar loop the compiler vectorises as it can.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define QUANT_GEMV_AVX512 1
#endif

namespace {

constexpr int kMaxTokens = 8;
constexpr int kBlock = 32;  // int4 columns per packed block

#ifdef QUANT_GEMV_AVX512

inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

// R rows x NT tokens of int8 weights; group is the row (groups == 1) or a multiple of 16 columns.
template <int NT, int R>
inline void int8_rows(const float* x, int64_t in, const int8_t* q, int64_t o, const float* scale, int64_t groups,
                      float* acc_out /* [NT][R] */) {
  const int64_t group = in / groups;
  __m512 acc[NT][R];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 part[NT][R];
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < R; ++r) part[t][r] = _mm512_setzero_ps();
    const int64_t begin = g * group, end = begin + group, full = begin + ((end - begin) & ~int64_t(15));
    for (int64_t i = begin; i < full; i += 16) {
      if ((i & 63) == 0)  // the next step's rows, one step ahead (the hardware prefetcher alone lags)
        for (int r = 0; r < R; ++r) _mm_prefetch((const char*)(q + (o + R + r) * in + i), _MM_HINT_T0);
      __m512 w[R];
      for (int r = 0; r < R; ++r)
        w[r] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(q + (o + r) * in + i))));
      for (int t = 0; t < NT; ++t) {
        const __m512 xv = _mm512_loadu_ps(x + t * in + i);
        for (int r = 0; r < R; ++r) part[t][r] = _mm512_fmadd_ps(w[r], xv, part[t][r]);
      }
    }
    if (full < end) {  // only when one group spans a row whose width is not a multiple of 16
      const __mmask16 m = (__mmask16)((1u << (end - full)) - 1);
      __m512 w[R];
      for (int r = 0; r < R; ++r)
        w[r] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, q + (o + r) * in + full)));
      for (int t = 0; t < NT; ++t) {
        const __m512 xv = _mm512_maskz_loadu_ps(m, x + t * in + full);
        for (int r = 0; r < R; ++r) part[t][r] = _mm512_fmadd_ps(w[r], xv, part[t][r]);
      }
    }
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < R; ++r)
        acc[t][r] = _mm512_fmadd_ps(part[t][r], _mm512_set1_ps(scale[(o + r) * groups + g]), acc[t][r]);
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) acc_out[t * R + r] = hsum(acc[t][r]);
}

// R rows x NT tokens of int4 weights (blocked layout above); group is a multiple of 32.
template <int NT, int R>
inline void int4_rows(const float* x, int64_t in, const uint8_t* p, int64_t o, const float* scale,
                      const float* zeros, int64_t groups, float* acc_out /* [NT][R] */) {
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const int64_t group = in / groups, blocks_per_group = group / kBlock, row_bytes = in / 2;
  __m512 acc[NT][R];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 table[R];  // nibble -> (nibble - zero) * scale, the dequantized value
    for (int r = 0; r < R; ++r) {
      const float zero = zeros ? zeros[(o + r) * groups + g] : 8.f;
      table[r] = _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps(zero)), _mm512_set1_ps(scale[(o + r) * groups + g]));
    }
    for (int64_t b = g * blocks_per_group; b < (g + 1) * blocks_per_group; ++b) {
      if ((b & 3) == 0)
        for (int r = 0; r < R; ++r) _mm_prefetch((const char*)(p + (o + R + r) * row_bytes + b * 16), _MM_HINT_T0);
      __m512 lo[R], hi[R];
      for (int r = 0; r < R; ++r) {
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(p + (o + r) * row_bytes + b * 16)));
        lo[r] = _mm512_permutexvar_ps(v, table[r]);  // uses the index's low 4 bits: the low nibble
        hi[r] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table[r]);
      }
      for (int t = 0; t < NT; ++t) {
        const __m512 x0 = _mm512_loadu_ps(x + t * in + b * kBlock), x1 = _mm512_loadu_ps(x + t * in + b * kBlock + 16);
        for (int r = 0; r < R; ++r) {
          acc[t][r] = _mm512_fmadd_ps(lo[r], x0, acc[t][r]);
          acc[t][r] = _mm512_fmadd_ps(hi[r], x1, acc[t][r]);
        }
      }
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) acc_out[t * R + r] = hsum(acc[t][r]);
}

#else  // scalar fallback

template <int NT, int R>
inline void int8_rows(const float* x, int64_t in, const int8_t* q, int64_t o, const float* scale, int64_t groups,
                      float* acc_out) {
  const int64_t group = in / groups;
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) {
      const int8_t* row = q + (o + r) * in;
      float s = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        float part = 0.f;
        for (int64_t i = g * group; i < (g + 1) * group; ++i) part += float(row[i]) * x[t * in + i];
        s += part * scale[(o + r) * groups + g];
      }
      acc_out[t * R + r] = s;
    }
}

template <int NT, int R>
inline void int4_rows(const float* x, int64_t in, const uint8_t* p, int64_t o, const float* scale,
                      const float* zeros, int64_t groups, float* acc_out) {
  const int64_t group = in / groups, row_bytes = in / 2;
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) {
      const uint8_t* row = p + (o + r) * row_bytes;
      float s = 0.f;
      for (int64_t b = 0; b < in / kBlock; ++b) {
        const int64_t g = b * kBlock / group;
        const float sc = scale[(o + r) * groups + g], zero = zeros ? zeros[(o + r) * groups + g] : 8.f;
        for (int j = 0; j < 16; ++j) {
          const uint8_t byte = row[b * 16 + j];
          s += (float(byte & 0xF) - zero) * sc * x[t * in + b * kBlock + j];
          s += (float(byte >> 4) - zero) * sc * x[t * in + b * kBlock + 16 + j];
        }
      }
      acc_out[t * R + r] = s;
    }
}

#endif


// ---- Design (b) for int4: the activations quantized to int8 per (token, group), integer dot products ----
// x[t, i] ~= xq[t, i] * sx[t, g] (xq in [-127, 127], sx = max |x| / 127 over the group), then
// sum_i (n_i - zero) * scale * x_i ~= scale * sx * (sum_i n_i * xq_i - zero * sum_i xq_i): the nibbles are the
// unsigned operand of VNNI's vpdpbusd (64 products a instruction), xq the signed one. Needs group % 64 == 0.
// Within each 64 columns, xq is stored in the order one 32-byte load of packed nibbles expands to:
// low nibbles of bytes 0..31 (columns 0-15, 32-47), then the high ones (16-31, 48-63).
constexpr int kChunk = 64;

inline int64_t chunk_pos(int64_t c) {  // column within a 64-column chunk -> its byte in the expanded order
  const int64_t blk = c / kBlock, j = c % kBlock;
  return j < 16 ? blk * 16 + j : 32 + blk * 16 + (j - 16);
}

struct QuantizedX {
  std::vector<int8_t> q;      // [n, in], chunk order
  std::vector<float> scale;   // [n, groups]
  std::vector<int32_t> sum;   // [n, groups]: sum of q over the group
};

QuantizedX quantize_activations(const float* x, int64_t n, int64_t in, int64_t groups) {
  const int64_t group = in / groups;
  QuantizedX r{std::vector<int8_t>(n * in), std::vector<float>(n * groups), std::vector<int32_t>(n * groups)};
  for (int64_t t = 0; t < n; ++t)
    for (int64_t g = 0; g < groups; ++g) {
      const float* xs = x + t * in + g * group;
      float amax = 0.f;
      for (int64_t i = 0; i < group; ++i) amax = std::max(amax, std::fabs(xs[i]));
      const float sx = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
      int32_t sum = 0;
      for (int64_t i = 0; i < group; ++i) {
        const int v = int(std::nearbyint(xs[i] * inv));
        r.q[t * in + g * group + (i / kChunk) * kChunk + chunk_pos(i % kChunk)] = int8_t(v);
        sum += v;
      }
      r.scale[t * groups + g] = sx;
      r.sum[t * groups + g] = sum;
    }
  return r;
}

#if defined(QUANT_GEMV_AVX512) && defined(__AVX512VNNI__)

template <int NT, int R>
inline void int4_q8_rows(const QuantizedX& xq, int64_t in, const uint8_t* p, int64_t o, const float* scale,
                         const float* zeros, int64_t groups, float* acc_out /* [NT][R] */) {
  const int64_t group = in / groups, row_bytes = in / 2;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 acc[NT][R];
  float corr[NT][R];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps(), corr[t][r] = 0.f;
  for (int64_t g = 0; g < groups; ++g) {
    __m512i dot[NT][R];
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < R; ++r) dot[t][r] = _mm512_setzero_si512();
    for (int64_t c = g * group; c < (g + 1) * group; c += kChunk) {
      if ((c & 127) == 0)
        for (int r = 0; r < R; ++r) _mm_prefetch((const char*)(p + (o + R + r) * row_bytes + c / 2), _MM_HINT_T0);
      __m512i xv[NT];
      for (int t = 0; t < NT; ++t) xv[t] = _mm512_loadu_si512(xq.q.data() + t * in + c);
      for (int r = 0; r < R; ++r) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)(p + (o + r) * row_bytes + c / 2));
        const __m512i w = _mm512_and_si512(
            _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1), low4);
        for (int t = 0; t < NT; ++t) dot[t][r] = _mm512_dpbusd_epi32(dot[t][r], w, xv[t]);
      }
    }
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < R; ++r) {
        const float f = scale[(o + r) * groups + g] * xq.scale[t * groups + g];
        const float zero = zeros ? zeros[(o + r) * groups + g] : 8.f;
        acc[t][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[t][r]), _mm512_set1_ps(f), acc[t][r]);
        corr[t][r] += f * zero * float(xq.sum[t * groups + g]);
      }
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) acc_out[t * R + r] = hsum(acc[t][r]) - corr[t][r];
}

#else  // the same arithmetic, scalar

template <int NT, int R>
inline void int4_q8_rows(const QuantizedX& xq, int64_t in, const uint8_t* p, int64_t o, const float* scale,
                         const float* zeros, int64_t groups, float* acc_out) {
  const int64_t group = in / groups, row_bytes = in / 2;
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < R; ++r) {
      float acc = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        int32_t dot = 0;
        for (int64_t c = g * group; c < (g + 1) * group; c += kChunk)
          for (int b = 0; b < 32; ++b) {
            const uint8_t byte = p[(o + r) * row_bytes + c / 2 + b];
            dot += int32_t(byte & 0xF) * xq.q[t * in + c + b] + int32_t(byte >> 4) * xq.q[t * in + c + 32 + b];
          }
        const float f = scale[(o + r) * groups + g] * xq.scale[t * groups + g];
        const float zero = zeros ? zeros[(o + r) * groups + g] : 8.f;
        acc += f * float(dot) - f * zero * float(xq.sum[t * groups + g]);
      }
      acc_out[t * R + r] = acc;
    }
}

#endif

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
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 2 && packed.is_contiguous(),
              "quant_gemv_int4: packed must be a contiguous 2-D uint8 tensor");
  const int64_t out = packed.size(0), in = packed.size(1) * 2;
  check_common(x, scale, bias, out, "quant_gemv_int4");
  TORCH_CHECK(x.size(1) == in && scale.dim() == 2 && scale.size(0) == out && scale.size(1) >= 1,
              "quant_gemv_int4: shapes do not match: x ", x.sizes(), ", packed ", packed.sizes(), ", scale ",
              scale.sizes());
  const int64_t groups = scale.size(1);
  TORCH_CHECK(in % groups == 0 && (in / groups) % kBlock == 0, "quant_gemv_int4: ", groups, " groups of ", in,
              " columns: each must be a multiple of ", kBlock, " columns");
  if (zeros) {
    TORCH_CHECK(zeros->scalar_type() == at::kFloat && zeros->is_contiguous() && zeros->sizes() == scale.sizes(),
                "quant_gemv_int4: zeros must be contiguous float32 shaped like scale");
  }
  at::Tensor y = at::empty({x.size(0), out}, x.options());
  dispatch_tokens<Int4Kernel>(x.size(0), x.data_ptr<float>(), in, packed.data_ptr<uint8_t>(),
                              scale.data_ptr<float>(), zeros ? zeros->data_ptr<float>() : (const float*)nullptr,
                              groups, out, y.data_ptr<float>(), bias ? bias->data_ptr<float>() : (const float*)nullptr);
  return y;
}

// Design (b): as quant_gemv_int4, the activations quantized to int8 per (token, group); group % 64 == 0.
at::Tensor quant_gemv_int4_q8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                              const std::optional<at::Tensor>& zeros, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 2 && packed.is_contiguous(),
              "quant_gemv_int4_q8: packed must be a contiguous 2-D uint8 tensor");
  const int64_t out = packed.size(0), in = packed.size(1) * 2;
  check_common(x, scale, bias, out, "quant_gemv_int4_q8");
  TORCH_CHECK(x.size(1) == in && scale.dim() == 2 && scale.size(0) == out && scale.size(1) >= 1,
              "quant_gemv_int4_q8: shapes do not match: x ", x.sizes(), ", packed ", packed.sizes(), ", scale ",
              scale.sizes());
  const int64_t groups = scale.size(1);
  TORCH_CHECK(in % groups == 0 && (in / groups) % kChunk == 0, "quant_gemv_int4_q8: ", groups, " groups of ", in,
              " columns: each must be a multiple of ", kChunk, " columns");
  if (zeros) {
    TORCH_CHECK(zeros->scalar_type() == at::kFloat && zeros->is_contiguous() && zeros->sizes() == scale.sizes(),
                "quant_gemv_int4_q8: zeros must be contiguous float32 shaped like scale");
  }
  at::Tensor y = at::empty({x.size(0), out}, x.options());
  dispatch_tokens<Int4Q8Kernel>(x.size(0), x.data_ptr<float>(), in, packed.data_ptr<uint8_t>(),
                                scale.data_ptr<float>(), zeros ? zeros->data_ptr<float>() : (const float*)nullptr,
                                groups, out, y.data_ptr<float>(),
                                bias ? bias->data_ptr<float>() : (const float*)nullptr);
  return y;
}

// The torch path's dequantization, one pass: out [out, in] fp32 = (n - zero) * scale, for prefill and
// batches past 8 tokens (then one matmul). Same values as quant_pack.dequantize_int4, bit for bit.
at::Tensor quant_dequant_int4(const at::Tensor& packed, const at::Tensor& scale, const std::optional<at::Tensor>& zeros,
                              at::Tensor out) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 2 && packed.is_contiguous(),
              "quant_dequant_int4: packed must be a contiguous 2-D uint8 tensor");
  const int64_t rows = packed.size(0), in = packed.size(1) * 2;
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.size(0) == rows && out.size(1) == in,
              "quant_dequant_int4: out must be a contiguous float32 [", rows, ", ", in, "] tensor");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.dim() == 2 &&
              scale.size(0) == rows, "quant_dequant_int4: scale must be contiguous float32 [", rows, ", groups]");
  const int64_t groups = scale.size(1);
  TORCH_CHECK(in % groups == 0 && (in / groups) % kBlock == 0, "quant_dequant_int4: ", groups, " groups of ", in,
              " columns: each must be a multiple of ", kBlock, " columns");
  if (zeros) {
    TORCH_CHECK(zeros->scalar_type() == at::kFloat && zeros->is_contiguous() && zeros->sizes() == scale.sizes(),
                "quant_dequant_int4: zeros must be contiguous float32 shaped like scale");
  }
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

TORCH_LIBRARY_FRAGMENT(triton_llm, m) {
  m.def("quant_gemv_int8(Tensor x, Tensor qweight, Tensor scale, Tensor? bias) -> Tensor", &quant_gemv_int8);
  m.def("quant_gemv_int4(Tensor x, Tensor packed, Tensor scale, Tensor? zeros, Tensor? bias) -> Tensor",
        &quant_gemv_int4);
  m.def("quant_gemv_int4_q8(Tensor x, Tensor packed, Tensor scale, Tensor? zeros, Tensor? bias) -> Tensor",
        &quant_gemv_int4_q8);
  m.def("quant_dequant_int4(Tensor packed, Tensor scale, Tensor? zeros, Tensor(a!) out) -> Tensor(a!)",
        &quant_dequant_int4);
}
