// Quantized GEMM of decode, verify and prefill steps: y[t, n] = sum over 32-column blocks b of
// (sw[n, g(b)] * sx[t, b]) * (dot_b(t, n) - zero[n, g(b)] * xsum[t, b]) (+ bias[n]), any token count.
//
// The activations x [T, K] are quantized per token and block of 32 columns (as llama.cpp's Q8_0):
// sx = max |x| * (1 / 127), xq = x * (127 / max |x|) rounded to nearest even, in [-127, 127]; xsum = sum of xq over
// the block.
// The weights are int8 (q in [-127, 127], zero 0) or int4 (nibbles n in [0, 15], zero 8 or per group), with one
// scale per output row and group of `group` columns (a multiple of 32). dot_b is the block's integer dot product
// (exact in int32), so the only rounding is in the float steps of each block, done in the same order for every
// output: v = float(dot) - zero * xsum (int8: an integer subtraction before the conversion), f = sw * sx, acc =
// fma(v, f, acc); then + bias. No output depends on the other tokens of the step, the tile it fell in nor the split
// over threads (rows or tokens are split, never K): batch-invariant, bit for bit (tests/backend/native).
//
// Layout: the weight is packed into *strips* of kStrip = 16 output rows (rows past N are zero):
//   int8 strips [S][K / 4][16][4] int8: element (s, k4, j, c) = q[16 s + j][4 k4 + c], so one 64-byte load holds
//        4 columns of 16 rows, the operand of one vpdpbusd (16 lanes x 4 products) against 4 activation bytes
//        broadcast (as unsigned bytes xq + 128; aux wsum [S][K / 32][16] int32 = 128 * the block's sum of q);
//   int4 strips [S][K / 8][16][4] uint8: byte (s, k8, j, c) = n[16 s + j][8 k8 + c] | n[16 s + j][8 k8 + 4 + c] << 4:
//        one 64-byte load expands (and, shift) into two vpdpbusd operands of unsigned nibbles (aux zeros
//        [S][G][16] float);
//   scales [S][G][16] float for both.
// A tile is R strips x NT tokens of accumulators in registers. A thread walks its strips in groups of 4, each group
// in spans of 8 blocks (256 columns: 16 KiB of int8 weights, in L1), every token tile passing over a span before
// the next (partial sums kept in memory between spans): each weight byte is read from memory once a step.
//
// The instruction set is chosen at build time: AVX-512 VNNI (vpdpbusd), else AVX2 (maddubs / madd pair sums, tiles
// sized for 16 registers), else plain C++, all with the same arithmetic (integer dots, then the same float
// operations per output: bit-identical results). No torch in the kernel file.
#pragma once

#include <cstdint>

namespace triton_llm_native::qgemm {

constexpr int64_t kStrip = 16;   // output rows per strip: one 16-lane vector
constexpr int64_t kQBlock = 32;  // columns per activation block
constexpr int64_t kQMaxTokens = 4;  // tokens per register tile

inline int64_t strip_count(int64_t n) { return (n + kStrip - 1) / kStrip; }

// Block-wise int8 activations of x [T, K] (K % 32 == 0): xq [T, K] (plus 128 as unsigned bytes when `offset`, for
// int8 weights), sx [T, K / 32], xsum [T, K / 32].
void quantize_blocks(const float* x, int64_t T, int64_t K, bool offset, uint8_t* xq, float* sx, int32_t* xsum);

struct Weights {
  bool int4;              // int4 strips (else int8)
  const uint8_t* strips;  // the layout above
  const float* scales;    // [S][G][16]
  const int32_t* wsum;    // int8: [S][K / 32][16]
  const float* zeros;     // int4: [S][G][16]
  int64_t n, k, groups;
};

// Strips [s_begin, s_end) of y [T, n] (+ bias, may be null) from the quantized activations of T tokens.
void gemm_strips(const Weights& w, const uint8_t* xq, const float* sx, const int32_t* xsum, const float* bias,
                 float* y, int64_t T, int64_t s_begin, int64_t s_end);

// "avx512_vnni", "avx2" or "generic".
const char* gemm_isa();

// Whether gemm_strips takes the activations of int8 weights offset by 128 (quantize_blocks' `offset`): VNNI's
// unsigned x signed dot and the plain C++ build do (minus wsum); AVX2 takes them signed (its sign trick). int4: never.
bool offset_activations(bool int4);

}  // namespace triton_llm_native::qgemm
namespace at { class Tensor; }
namespace triton_llm_native::qgemm {
// y [T, n] from x [T, K] fp32 (quantized here), the strips' tensors (aux: wsum for int8, zeros for int4) and a bias
// (may be null); the strips split over torch's threads. Defined in quant_gemm.cpp (needs ATen).
at::Tensor quant_project(const at::Tensor& x, const at::Tensor& strips, const at::Tensor& scales,
                         const at::Tensor& aux, int64_t n, const float* bias);
}  // namespace triton_llm_native::qgemm
