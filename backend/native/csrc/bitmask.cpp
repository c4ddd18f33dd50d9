// A grammar bitmask on logits rows, in one call per step (constrained decoding's per-step cost).
//
// Layout (xgrammar's): bitmask [rows, words] int32, bit j of word w allows token 32 * w + j; a word of all
// ones (-1) constrains nothing, so an unguided row of a mixed batch costs only a scan of its words.
// logits [rows, vocab] float32 with unit stride along the vocabulary; words * 32 >= vocab.
//
// masked_logits(logits, bitmask) -> [rows, vocab] float32: a copy of logits with -inf where the bit of t is
//   clear (logits is not written): the sampler's float32 copy of the logits and the mask in one pass and one call.
// masked_argmax(logits, bitmask) -> [rows] int64: torch.argmax of the masked row (masked_fill with -inf),
//   without writing it: the first maximum among the allowed tokens; a NaN at an allowed token wins (as in
//   torch); a row whose allowed tokens are all -inf (or that allows none) gives 0, the first of its all -inf
//   masked values.
// forced_tokens(bitmask, vocab) -> [rows] int64: the token of each row that allows exactly one token below vocab,
//   else -1 (the grammar forces that token: sampling can only return it).
// Torch references: backend/sampling/ops.py (apply_token_bitmask; its argmax), tested against these.
#include <torch/library.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace {

void check_args(const at::Tensor& logits, const at::Tensor& bitmask, const char* op) {
  TORCH_CHECK(logits.device().is_cpu() && bitmask.device().is_cpu(), op, ": CPU tensors only");
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.stride(1) == 1, op,
              ": logits must be [rows, vocab] float32 with unit stride along the vocabulary");
  TORCH_CHECK(bitmask.dim() == 2 && bitmask.scalar_type() == at::kInt && bitmask.stride(1) == 1, op,
              ": bitmask must be [rows, words] int32 with unit stride along the words");
  TORCH_CHECK(bitmask.size(0) == logits.size(0), op, ": bitmask has ", bitmask.size(0), " rows, logits ",
              logits.size(0));
  TORCH_CHECK(bitmask.size(1) * 32 >= logits.size(1), op, ": ", bitmask.size(1), " words cannot cover a vocabulary of ",
              logits.size(1));
}

at::Tensor masked_logits(const at::Tensor& logits, const at::Tensor& bitmask) {
  check_args(logits, bitmask, "masked_logits");
  const int64_t rows = logits.size(0), vocab = logits.size(1), words = (vocab + 31) / 32;
  at::Tensor out = at::empty({rows, vocab}, logits.options());
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = logits.data_ptr<float>() + r * logits.stride(0);
    float* dst = out.data_ptr<float>() + r * vocab;
    const int32_t* mask = bitmask.data_ptr<int32_t>() + r * bitmask.stride(0);
    for (int64_t w = 0; w < words; ++w) {
      const uint32_t bits = static_cast<uint32_t>(mask[w]);
      const float* x = src + w * 32;
      float* y = dst + w * 32;
      const int64_t n = std::min<int64_t>(32, vocab - w * 32);
      if (bits == 0xFFFFFFFFu) {
        std::copy(x, x + n, y);
        continue;
      }
      for (int64_t j = 0; j < n; ++j) y[j] = ((bits >> j) & 1u) ? x[j] : neg_inf;   // a select: vectorises
    }
  }
  return out;
}

at::Tensor masked_argmax(const at::Tensor& logits, const at::Tensor& bitmask) {
  check_args(logits, bitmask, "masked_argmax");
  const int64_t rows = logits.size(0), vocab = logits.size(1), words = (vocab + 31) / 32;
  at::Tensor out = at::empty({rows}, logits.options().dtype(at::kLong));
  int64_t* ids = out.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits.data_ptr<float>() + r * logits.stride(0);
    const int32_t* mask = bitmask.data_ptr<int32_t>() + r * bitmask.stride(0);
    float best = -std::numeric_limits<float>::infinity();
    int64_t best_id = 0;
    bool nan = false;
    for (int64_t w = 0; w < words && !nan; ++w) {
      uint32_t bits = static_cast<uint32_t>(mask[w]);
      if (w * 32 + 32 > vocab) bits &= (1u << (vocab - w * 32)) - 1u;   // bits past the vocabulary
      while (bits) {                                                      // allowed tokens, in order
        const int j = __builtin_ctz(bits);
        bits &= bits - 1u;
        const float v = row[w * 32 + j];
        if (std::isnan(v)) {
          best_id = w * 32 + j;
          nan = true;
          break;
        }
        if (v > best) {
          best = v;
          best_id = w * 32 + j;
        }
      }
    }
    ids[r] = best_id;
  }
  return out;
}

at::Tensor forced_tokens(const at::Tensor& bitmask, int64_t vocab) {
  TORCH_CHECK(bitmask.device().is_cpu() && bitmask.dim() == 2 && bitmask.scalar_type() == at::kInt &&
              bitmask.stride(1) == 1, "forced_tokens: bitmask must be [rows, words] int32 on the CPU with unit stride");
  TORCH_CHECK(vocab > 0 && bitmask.size(1) * 32 >= vocab, "forced_tokens: ", bitmask.size(1),
              " words cannot cover a vocabulary of ", vocab);
  const int64_t rows = bitmask.size(0), words = (vocab + 31) / 32;
  at::Tensor out = at::empty({rows}, bitmask.options().dtype(at::kLong));
  int64_t* ids = out.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* mask = bitmask.data_ptr<int32_t>() + r * bitmask.stride(0);
    int64_t count = 0, id = -1;
    for (int64_t w = 0; w < words && count < 2; ++w) {
      uint32_t bits = static_cast<uint32_t>(mask[w]);
      if (w * 32 + 32 > vocab) bits &= (1u << (vocab - w * 32)) - 1u;   // bits past the vocabulary
      if (bits) {
        count += __builtin_popcount(bits);
        id = w * 32 + __builtin_ctz(bits);
      }
    }
    ids[r] = count == 1 ? id : -1;
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(triton_llm, m) {
  m.def("masked_logits(Tensor logits, Tensor bitmask) -> Tensor", &masked_logits);
  m.def("masked_argmax(Tensor logits, Tensor bitmask) -> Tensor", &masked_argmax);
  m.def("forced_tokens(Tensor bitmask, int vocab) -> Tensor", &forced_tokens);
}
