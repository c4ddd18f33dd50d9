// f32 projections of decode, verify and small prefill steps: y[t, n] = x[t] . w[n] (+ bias[n]) for a few tokens,
// from weights packed into *panels*.
//
// A panel holds kPanelWidth consecutive output rows of w [N, K] transposed: panel p is [K][kPanelWidth], element
// (k, j) = w[p * kPanelWidth + j][k], the last panel zero-padded past N (pack_panels_f32). A step of T tokens walks
// each panel once from front to back, loads one panel row of weights per k (a few vectors), broadcasts x[t][k] of
// each of its tokens and accumulates T x kPanelWidth outputs in registers (a register tile of up to
// kGemvMaxTokens tokens; more tokens take several tiles, the panel then in L1/L2). No horizontal sums, and one
// sequential stream per panel for the prefetchers, where the row-major GEMV it replaced dotted R rows at a time
// (R streams, a transpose-and-add per R x T sums). Measured (EPYC, 1 thread, the demo target's 17 projections,
// 9 MB, docs/benchmarks.md): 1.2-1.4x faster at 1 token, 1.7-2x at 5-6, where the row kernel had reached 23-56 of
// the core's ~95-109 GFLOP/s.
//
// Every output is one fused multiply-add chain over k = 0..K-1 in order, then + bias: a token's projection does not
// depend on the other tokens of its step, the tile it fell in, nor the split over threads (the projections add no
// batch dependence to a verify step's logits; tests/backend/native/test_f32_gemv.py checks it bit for bit).
//
// The instruction set is picked at build time from the compiler's flags (-march=native): AVX-512F (16-float
// vectors, panels of 64 rows), else AVX2 + FMA (8-float vectors, panels of 16 rows: 6 x 2 accumulators of the 16
// registers), else plain C++ (as AVX2). f32_gemv_kernel.cpp has no torch dependency (tests/backend/native compiles it alone
// for each instruction set); f32_gemv.cpp splits the panels over torch's threads and defines the ops.
#pragma once

#include <cstdint>

namespace triton_llm_native {

// Output rows per panel: the build's column tile, so that a tile walks its panel as one sequential stream, a panel
// row (a cache line or four) per k. AVX-512: 64 (4 vectors of 16); AVX2 and plain C++: 16 (2 vectors of 8). With
// 64 on AVX2 a 16-column tile read one line in four of each 256-byte panel row and the panel was walked four times:
// a batch-1 step of the 300M-class model streamed its weights at ~9.4 GB/s instead of ~13.9 (bench/README.md).
#if defined(__AVX512F__)
constexpr int64_t kPanelWidth = 64;
#else
constexpr int64_t kPanelWidth = 16;
#endif
// Tokens per register tile; a step with more takes several tiles over each panel (the panel then in L1/L2: any
// token count, a prefill chunk's included; at 512 tokens still 1.15x faster than at::linear on the demo target).
constexpr int64_t kGemvMaxTokens = 6;

inline int64_t panel_count(int64_t N) { return (N + kPanelWidth - 1) / kPanelWidth; }

// panels [panel_count(N)][K][kPanelWidth] from w [N, K] (row-major, contiguous); rows past N are zero.
void pack_panels_f32(const float* w, float* panels, int64_t N, int64_t K);

// Panels [p_begin, p_end) of y [T, N] = x [T, K] @ w^T (+ bias [N], may be null), w given as its panels; x and y
// row-major, contiguous.
void gemv_f32_panels(const float* x, const float* panels, const float* bias, float* y, int64_t T, int64_t N,
                     int64_t K, int64_t p_begin, int64_t p_end);

// Refuses (TORCH_CHECK, naming `who`) anything but the panels of a weight [n, k] (f32_gemv.cpp: needs ATen).
}  // namespace triton_llm_native
namespace at { class Tensor; }
namespace triton_llm_native {
void check_panels(const at::Tensor& panels, int64_t n, int64_t k, const char* who);

// The instruction set the kernel was built for: "avx512", "avx2" or "generic".
const char* gemv_f32_isa();

// All panels, split over torch's intra-op threads (one fork and one barrier per call; a call with less work than a
// thread's worth stays on the calling thread). Defined in f32_gemv.cpp.
void gemv_f32(const float* x, const float* panels, const float* bias, float* y, int64_t T, int64_t N, int64_t K);

}  // namespace triton_llm_native
