// f32 GEMV / skinny GEMM for decode and verify steps: y[t, n] = x[t] . w[n] (+ bias[n]) for a few tokens.
//
// A step of a few tokens is bound by reading the weight, so each weight row is streamed from memory once and
// dotted with every token while it sits in registers: R rows at a time (independent accumulators, enough to
// hide the FMA latency). Short rows (K <= 512) prefetch the rows 2 KiB ahead (GEMV_ROWS_AHEAD_BYTES: weights that
// fit in L3 get evicted between engine steps); within a long row, software prefetch is a build-time knob, off by
// default (measured no faster; the decode step keeps its weights on huge pages, backend/engine/huge_pages.py).
// The instruction set is picked at build time
// from the compiler's flags (-march=native): AVX-512F, else AVX2 + FMA, else plain C++ (8-float lanes the
// compiler vectorises as it can). f32_gemv_kernel.cpp has no torch dependency (tests/backend/native compiles
// it alone for each instruction set); f32_gemv.cpp splits the rows over torch's threads.
#pragma once

#include <cstdint>

namespace triton_llm_native {

// Tokens the kernel dots with one pass over the weight; a call with more takes them this many at a time.
constexpr int64_t kGemvMaxTokens = 8;
// Steps of up to this many tokens project through the GEMV, kGemvMaxTokens at a time over row blocks that stay
// in L2 (f32_gemv_kernel.cpp); larger ones through at::linear. Measured (1 thread, one row per token, ms per
// decode_forward call, at::linear -> chunked GEMV): demo target 9 tokens 2.19 -> 0.88, 16 tokens 3.11 -> 1.71,
// 24-32 tokens even; 82M model 9 tokens 49.7 -> 42.6, 16 tokens 59.8 -> 60.3, 24 tokens 73.6 -> 80.5.
constexpr int64_t kGemvChunkedMaxTokens = 16;
// The same for short rows (K <= kGemvShortRowK, the demo target's), whose prefetched passes (f32_gemv_kernel.cpp)
// beat at::linear further: batch decode steps of 32 sequences and verify steps of 8 sequences with drafts. Short
// rows are also the kernel's pinned-load, row-prefetched ones (kPinMaxK is this constant).
constexpr int64_t kGemvShortRowK = 512;
constexpr int64_t kGemvShortRowsMaxTokens = 64;

// Rows [n_begin, n_end) of y [T, N] = x [T, K] @ w [N, K]^T (+ bias [N], may be null); all row-major, contiguous.
void gemv_f32_rows(const float* x, const float* w, const float* bias, float* y, int64_t T, int64_t N, int64_t K,
                   int64_t n_begin, int64_t n_end);

// The instruction set the kernel was built for: "avx512", "avx2" or "generic".
const char* gemv_f32_isa();

// All rows of y, split over torch's intra-op threads (one fork and one barrier per call; a call with less work
// than a thread's worth stays on the calling thread). Defined in f32_gemv.cpp.
void gemv_f32(const float* x, const float* w, const float* bias, float* y, int64_t T, int64_t N, int64_t K);

}  // namespace triton_llm_native
