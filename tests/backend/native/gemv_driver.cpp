// Runs the panel GEMV (backend/native/csrc/f32_gemv_kernel.cpp) alone, without torch, so that tests can build it
// for each instruction set: gemv_driver T N K SPLIT DIR reads DIR/{x,w,bias}.f32, packs w into panels, computes
// panels [0, SPLIT) and [SPLIT, P) in two calls, writes DIR/y.f32 and prints the kernel's instruction set.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "f32_gemv.h"

static std::vector<float> read_floats(const std::string& path, size_t n) {
  std::vector<float> v(n);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr || std::fread(v.data(), sizeof(float), n, f) != n) {
    std::fprintf(stderr, "cannot read %zu floats from %s\n", n, path.c_str());
    std::exit(2);
  }
  std::fclose(f);
  return v;
}

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: gemv_driver T N K SPLIT DIR\n");
    return 2;
  }
  const int64_t T = std::atoll(argv[1]), N = std::atoll(argv[2]), K = std::atoll(argv[3]), split = std::atoll(argv[4]);
  const std::string dir = argv[5];
  const std::vector<float> x = read_floats(dir + "/x.f32", T * K), w = read_floats(dir + "/w.f32", N * K),
                           bias = read_floats(dir + "/bias.f32", N);
  std::vector<float> y(T * N, -1.f);
  const int64_t P = triton_llm_native::panel_count(N);
  std::vector<float> panels(P * K * triton_llm_native::kPanelWidth);
  triton_llm_native::pack_panels_f32(w.data(), panels.data(), N, K);
  triton_llm_native::gemv_f32_panels(x.data(), panels.data(), bias.data(), y.data(), T, N, K, 0, split);
  triton_llm_native::gemv_f32_panels(x.data(), panels.data(), bias.data(), y.data(), T, N, K, split, P);
  FILE* f = std::fopen((dir + "/y.f32").c_str(), "wb");
  std::fwrite(y.data(), sizeof(float), y.size(), f);
  std::fclose(f);
  std::printf("%s\n", triton_llm_native::gemv_f32_isa());
  return 0;
}
