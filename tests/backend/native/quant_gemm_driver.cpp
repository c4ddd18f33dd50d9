// Runs the quantized GEMM (backend/native/csrc/quant_gemm_kernel.cpp) alone, without torch, so that tests can build it
// for each instruction set: quant_gemm_driver MODE T N K G SPLIT DIR (MODE int8 | int4) reads DIR/{x,scales,bias}.f32,
// DIR/strips.bin and DIR/aux.bin (int32 wsum or float zeros), quantizes x, computes strips [0, SPLIT) and
// [SPLIT, S) in two calls, writes DIR/y.f32 and prints the kernel's instruction set.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "quant_gemm.h"

using namespace triton_llm_native::qgemm;

template <typename T>
static std::vector<T> read_file(const std::string& path, size_t n) {
  std::vector<T> v(n);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr || std::fread(v.data(), sizeof(T), n, f) != n) {
    std::fprintf(stderr, "cannot read %zu items from %s\n", n, path.c_str());
    std::exit(2);
  }
  std::fclose(f);
  return v;
}

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: quant_gemm_driver MODE T N K G SPLIT DIR\n");
    return 2;
  }
  const bool int4 = std::string(argv[1]) == "int4";
  const int64_t T = std::atoll(argv[2]), N = std::atoll(argv[3]), K = std::atoll(argv[4]), G = std::atoll(argv[5]),
                split = std::atoll(argv[6]);
  const std::string dir = argv[7];
  const int64_t S = strip_count(N), nb = K / kQBlock;
  const auto x = read_file<float>(dir + "/x.f32", T * K);
  const auto bias = read_file<float>(dir + "/bias.f32", N);
  const auto scales = read_file<float>(dir + "/scales.f32", S * G * kStrip);
  const auto strips = read_file<uint8_t>(dir + "/strips.bin", S * K * (int4 ? kStrip / 2 : kStrip));
  const auto wsum = int4 ? std::vector<int32_t>() : read_file<int32_t>(dir + "/aux.bin", S * nb * kStrip);
  const auto zeros = int4 ? read_file<float>(dir + "/aux.bin", S * G * kStrip) : std::vector<float>();
  std::vector<uint8_t> xq(T * K);
  std::vector<float> sx(T * nb), y(T * N);
  std::vector<int32_t> xsum(T * nb);
  quantize_blocks(x.data(), T, K, triton_llm_native::qgemm::offset_activations(int4), xq.data(), sx.data(), xsum.data());
  const Weights w{int4, strips.data(), scales.data(), int4 ? nullptr : wsum.data(), int4 ? zeros.data() : nullptr,
                  N, K, G};
  gemm_strips(w, xq.data(), sx.data(), xsum.data(), bias.data(), y.data(), T, 0, split);
  gemm_strips(w, xq.data(), sx.data(), xsum.data(), bias.data(), y.data(), T, split, S);
  FILE* f = std::fopen((dir + "/y.f32").c_str(), "wb");
  std::fwrite(y.data(), sizeof(float), y.size(), f);
  std::fclose(f);
  std::printf("%s\n", gemm_isa());
  return 0;
}
