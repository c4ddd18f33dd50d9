// 16-float vectors (one AVX-512 register; GCC vector extensions, so no intrinsics, and the compiler lowers them
// on narrower targets) and the few operations on them the decode step's attention and activation loops use.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace triton_llm_native {

// The attention's per-key dot products and V accumulation over head_dim (when head_dim is a multiple of 16).
typedef float f32x16 __attribute__((vector_size(64)));

inline f32x16 load16(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store16(float* p, f32x16 v) { std::memcpy(p, &v, sizeof(v)); }

typedef int32_t i32x16 __attribute__((vector_size(64)));

// e^x for 16 lanes (Cephes' expf: x = n ln2 + r, a degree-6 polynomial in r, times 2^n; relative error ~1e-7;
// x is clamped to [-87.3, 88.7]). libm's expf is not vectorised under these flags: one call per element cost
// more than the attention's dot products.
inline f32x16 exp16(f32x16 x) {
  const f32x16 lo = f32x16{} - 87.3f, hi = f32x16{} + 88.7f;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  // n = floor(x log2(e) + 1/2) (a conversion and a compare: -ffast-math would fold the magic-number trick away)
  const f32x16 t = x * 1.44269504088896341f + 0.5f;
  f32x16 n = __builtin_convertvector(__builtin_convertvector(t, i32x16), f32x16);
  n = n > t ? n - 1.f : n;
  const f32x16 r = x - n * 0.693359375f + n * 2.12194440e-4f;
  f32x16 p = f32x16{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const f32x16 y = p * r * r + r + 1.f;
  const i32x16 bits = (__builtin_convertvector(n, i32x16) + 127) << 23;
  f32x16 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

typedef float f32x8 __attribute__((vector_size(32)));
typedef float f32x4 __attribute__((vector_size(16)));

inline float hsum16(f32x16 v) {  // a tree of halves, not 15 dependent scalar adds
  const f32x8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const f32x4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

inline float hmax16(f32x16 v) {
  const f32x8 a8 = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const f32x8 b8 = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const f32x8 m8 = a8 > b8 ? a8 : b8;
  const f32x4 a4 = __builtin_shufflevector(m8, m8, 0, 1, 2, 3), b4 = __builtin_shufflevector(m8, m8, 4, 5, 6, 7);
  const f32x4 m4 = a4 > b4 ? a4 : b4;
  return std::max(std::max(m4[0], m4[1]), std::max(m4[2], m4[3]));
}

// Transpose the 16 x 16 matrix whose rows are r[0..16) in place (row i lane j <-> row j lane i): 4 x 4 transposes
// inside each 128-bit lane (unpack 32-bit, then 64-bit pairs), then two rounds of 128-bit lane selects; 64
// shuffles, the in-lane ones the cheapest kind (AVX-512: vunpck*ps/pd, vshuff32x4).
inline void transpose16(f32x16* r) {
  f32x16 t[16];
  for (int i = 0; i < 8; ++i) {
    const f32x16 a = r[2 * i], b = r[2 * i + 1];
    t[2 * i] = __builtin_shufflevector(a, b, 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29);
    t[2 * i + 1] = __builtin_shufflevector(a, b, 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
  }
  for (int i = 0; i < 16; i += 4) {
    for (int h = 0; h < 2; ++h) {
      const f32x16 a = t[i + h], b = t[i + h + 2];
      r[i + 2 * h] = __builtin_shufflevector(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
      r[i + 2 * h + 1] = __builtin_shufflevector(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    }
  }
  for (int half = 0; half < 16; half += 8) {  // 128-bit lanes 0, 2 of both rows; lanes 1, 3 of both
    for (int i = half; i < half + 4; ++i) {
      const f32x16 a = r[i], b = r[i + 4];
      t[i] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
      t[i + 4] = __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    }
  }
  for (int i = 0; i < 8; ++i) {
    const f32x16 a = t[i], b = t[i + 8];
    r[i] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    r[i + 8] = __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  }
}

inline float dot(const float* a, const float* b, int64_t n) {
  if (n % 16 == 0) {
    f32x16 acc = {};
    for (int64_t d = 0; d < n; d += 16) acc += load16(a + d) * load16(b + d);
    return hsum16(acc);
  }
  float s = 0.f;
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

inline void axpy(float* acc, float p, const float* v, int64_t n) {  // acc += p * v
  if (n % 16 == 0) {
    for (int64_t d = 0; d < n; d += 16) store16(acc + d, load16(acc + d) + p * load16(v + d));
    return;
  }
  for (int64_t d = 0; d < n; ++d) acc[d] += p * v[d];
}

}  // namespace triton_llm_native
