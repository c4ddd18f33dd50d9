// The whole decoder forward (every declared family: backend/model/architecture.py) for decode and speculative-verify steps, in one op (fp32, CPU).
//
// Every token of the step attends causally to its own sequence's paged KV: token t of the step sits at
// positions[t] of the sequence whose persistent block-table row is token_rows[t]; its K/V go to slot
// block_tables[row][pos / block_size] * block_size + pos % block_size and it sees the keys at positions
// 0..positions[t] of that row. That covers one-token decodes and the k+1 tokens of a verify step (the
// last known token and the drafts) alike, with no per-step metadata beyond the three token arrays.
//
// Per layer: RMSNorm (fused with the residual add of the previous block), QKV projection, q/k norms (RMSNorm
// over each q and k head, Qwen3, Gemma 3; where the layer's q_norm / k_norm weights are not empty), RoPE
// (rotate-half on each head's first rotary_dim dims, rotary_dim being the cos/sin tables' width: all of the head or
// part of it; the layer's table: rope[2 layer_rope[l]], rope[2 layer_rope[l] + 1]), paged K/V write, GQA attention
// over the block table, o-projection (normed by attn_out_norm where it is not empty: Gemma's sandwich) + residual,
// RMSNorm, gate-up projection, act(gate) * up (activation 0: SiLU, 1: GELU-tanh), down projection (normed by
// mlp_out_norm where not empty) (+ residual into the next norm). Every norm is weight * x_normed: Gemma's
// (1 + w) arrives as that sum. The embeddings are multiplied by embed_scale (Gemma: sqrt(hidden), 1: none) and the
// logits soft-capped where final_softcap > 0 (cap * tanh(logits / cap)).
// Then the final norm and the LM head: returns logits [num_tokens, vocab], or with logit_rows only
// those tokens' logits [len(logit_rows), vocab]. Then only those tokens go on past the last layer's K/V write:
// the other tokens of a prefill chunk need their K/V in every layer, but nothing of the last layer's attention
// or MLP (a prefill chunk of a 4-layer model saves ~1/5 of its work).
//
// That covers prefill chunks too (positions from the sequence's computed length on): the engine runs every step
// of a supported model through this op on the CPU, mixed or not.
//
// Modules: layer_ops (norm, RoPE, SiLU), paged_attention (K/V write, attention), f32_gemv (every fp32 projection,
// through the weights' panels, passed packed beside the row-major weights: at every token count measured, 1 to 512,
// faster than at::linear, MKL's GEMM, on the row-major ones; docs/benchmarks.md), quant_gemm (every int8 / int4
// projection, the weight given as its strips in layer_quant / lm_head_quant: three tensors a projection, strips,
// scales and aux, empty for an fp32 one, whose row-major entry is then the quantized weight, read for its row count
// only, and whose panels are empty), lora_delta (LoRA adapters: with `lora` given, 8 tensors a layer, A [S, R, K] and
// B [S, N, R] of each projection in the order above, every token of slot lora_slots[t] >= 0 gets
// y += B[s] (A[s] x) right after each projection; backend/lora/stacked.py lays them out). Sliding windows: windows[l]
// > 0 lets layer l's query at p see the keys p - windows[l] < k <= p only (empty: no layer has one); blocks wholly
// before every token's window are never read (the block manager frees them when every layer has a window).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>

#include "f32_gemv.h"
#include "quant_gemm.h"
#include "layer_ops.h"
#include "lora_delta.h"
#include "paged_attention.h"

namespace triton_llm_native {
namespace {

// input_norm, qkv, o, mlp_norm, gate_up, down, q_norm, k_norm, attn_out_norm, mlp_out_norm (the last four empty: none)
constexpr int kLayerWeights = 10;
constexpr int kLayerBiases = 4;   // qkv, o, gate_up, down (empty tensor: none)
constexpr int kLayerPanels = 4;   // qkv, o, gate_up, down: the projections' weights packed (pack_panels)

constexpr int kQuantTensors = 3;  // strips, scales, aux of a quantized projection (empty: fp32)
constexpr int kLoraTensors = 8;   // A, B of qkv, o, gate_up, down (backend/lora/stacked.py)

// x [T, K] @ w[N, K]^T (+ bias): the projection of every layer, through w's strips when `quant` holds them, else
// through its panels (`w` gives N; K is x's width).
at::Tensor project(const at::Tensor& x, const at::Tensor& w, const at::Tensor& panels, const at::Tensor* quant,
                   const at::Tensor& bias) {
  const int64_t T = x.size(0), N = w.size(0), K = x.size(1);
  const bool has_bias = bias.defined() && bias.numel() > 0;
  if (quant != nullptr && quant[0].numel() > 0)
    return qgemm::quant_project(x, quant[0], quant[1], quant[2], N, has_bias ? bias.data_ptr<float>() : nullptr);
  check_panels(panels, N, K, "decode_forward");
  at::Tensor y = at::empty({T, N}, x.options());
  gemv_f32(x.data_ptr<float>(), panels.data_ptr<float>(), has_bias ? bias.data_ptr<float>() : nullptr,
           y.data_ptr<float>(), T, N, K);
  return y;
}

void check_f32(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu(), name,
              ": expected a contiguous float32 CPU tensor");
}

at::Tensor decode_forward(const at::Tensor& token_ids,     // [T] int64
                          const at::Tensor& positions,     // [T] int64
                          const at::Tensor& token_rows,    // [T] int32  block-table row of each token
                          const at::Tensor& block_tables,  // [rows, width] int32
                          int64_t block_size, const at::Tensor& embed,  // [V, D]
                          at::TensorList layer_weights,    // 10 per layer
                          at::TensorList layer_biases,     // 4 per layer (empty: none)
                          at::TensorList layer_panels,     // 4 per layer, [ceil(N / W), K, W] each (W: kPanelWidth)
                          at::TensorList k_cache,          // per layer [blocks, block_size, KVH, hd]
                          at::TensorList v_cache,
                          at::TensorList rope,             // cos, sin of each table: [max_pos, rotary_dim]
                          at::IntArrayRef layer_rope,      // per layer, its table (empty: table 0 everywhere)
                          const at::Tensor& final_norm,    // [D]
                          const at::Tensor& lm_head,       // [V, D]
                          const at::Tensor& lm_head_panels,  // [ceil(V / W), D, W]
                          int64_t num_heads, int64_t kv_heads, int64_t head_dim, double eps, double scale,
                          const c10::optional<at::Tensor>& logit_rows,  // [R] int64 increasing indices; none: all
                          at::TensorList layer_quant,      // empty, or 4 x 3 per layer: the projections' strips
                          at::TensorList lm_head_quant,    // empty, or 3: the LM head's strips
                          at::TensorList lora,             // empty, or 8 per layer: A, B of each projection
                          const c10::optional<at::Tensor>& lora_slots,  // [T] int32 adapter slot, -1: none
                          at::IntArrayRef windows,         // per layer, 0: none; empty: none anywhere
                          int64_t activation,              // 0: SiLU, 1: GELU-tanh
                          double embed_scale,              // the embeddings' multiplier (1: none)
                          double final_softcap) {          // > 0: logits = cap * tanh(logits / cap)
  int64_t T = token_ids.size(0);
  const int64_t L = static_cast<int64_t>(k_cache.size());
  const int64_t D = embed.size(1);
  TORCH_CHECK(T > 0, "decode_forward: no tokens");
  TORCH_CHECK(static_cast<int64_t>(layer_weights.size()) == kLayerWeights * L &&
                  static_cast<int64_t>(layer_biases.size()) == kLayerBiases * L &&
                  static_cast<int64_t>(layer_panels.size()) == kLayerPanels * L &&
                  static_cast<int64_t>(v_cache.size()) == L,
              "decode_forward: per-layer lists disagree with the number of layers");
  TORCH_CHECK(windows.empty() || static_cast<int64_t>(windows.size()) == L,
              "decode_forward: windows needs one entry a layer (or none)");
  for (const int64_t w : windows) TORCH_CHECK(w >= 0, "decode_forward: a window must be >= 0 (0: none)");
  const bool quantized = !layer_quant.empty();
  TORCH_CHECK((!quantized || static_cast<int64_t>(layer_quant.size()) == kLayerPanels * kQuantTensors * L) &&
                  (lm_head_quant.empty() || lm_head_quant.size() == kQuantTensors),
              "decode_forward: layer_quant needs 12 tensors a layer and lm_head_quant 3 (or none)");
  TORCH_CHECK(num_heads % kv_heads == 0 && head_dim % 2 == 0, "decode_forward: bad head shapes");
  TORCH_CHECK(token_ids.scalar_type() == at::kLong && token_ids.is_contiguous(),
              "decode_forward: token_ids must be contiguous int64");
  check_f32(embed, "embed");
  TORCH_CHECK(!rope.empty() && rope.size() % 2 == 0, "decode_forward: rope needs cos and sin of each table");
  const int64_t rotary_dim = rope[0].size(1);
  for (const at::Tensor& t : rope) {
    check_f32(t, "rope");
    TORCH_CHECK(t.dim() == 2 && t.sizes() == rope[0].sizes() && rotary_dim % 2 == 0 && rotary_dim <= head_dim,
                "decode_forward: every cos / sin must be [max_positions, rotary_dim], rotary_dim even and <= head_dim");
  }
  TORCH_CHECK(layer_rope.empty() || static_cast<int64_t>(layer_rope.size()) == L,
              "decode_forward: layer_rope needs one entry a layer (or none)");
  for (const int64_t r : layer_rope)
    TORCH_CHECK(r >= 0 && 2 * r < static_cast<int64_t>(rope.size()), "decode_forward: layer_rope out of range");
  TORCH_CHECK(activation == 0 || activation == 1, "decode_forward: activation must be 0 (SiLU) or 1 (GELU-tanh)");
  const int64_t max_ctx = check_step_tokens(positions, token_rows, block_tables, block_size, rope[0].size(0));
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int32_t* rows = token_rows.data_ptr<int32_t>();
  const bool select = logit_rows.has_value() && logit_rows->defined();
  at::Tensor keep, keep_pos, keep_rows;  // the selected tokens' indices, positions and rows
  if (select) {
    TORCH_CHECK(logit_rows->scalar_type() == at::kLong && logit_rows->dim() == 1 && logit_rows->numel() > 0,
                "decode_forward: logit_rows must be a non-empty 1-D int64 tensor");
    keep = logit_rows->contiguous();
    const int64_t* k = keep.data_ptr<int64_t>();
    for (int64_t i = 0; i < keep.numel(); ++i)
      TORCH_CHECK(k[i] >= (i ? k[i - 1] + 1 : 0) && k[i] < T, "decode_forward: logit_rows[", i, "] = ", k[i],
                  ": expected increasing token indices below ", T);
    keep_pos = positions.index_select(0, keep);
    keep_rows = token_rows.index_select(0, keep);
  }
  const bool adapters = !lora.empty();
  at::Tensor slots_t;
  if (adapters) {
    TORCH_CHECK(static_cast<int64_t>(lora.size()) == kLoraTensors * L, "decode_forward: lora needs 8 tensors a layer");
    TORCH_CHECK(lora_slots.has_value() && lora_slots->scalar_type() == at::kInt && lora_slots->numel() == T,
                "decode_forward: lora_slots must be [T] int32 with lora");
    slots_t = lora_slots->contiguous();
  }
  const int32_t* slots = adapters ? slots_t.data_ptr<int32_t>() : nullptr;
  at::Tensor keep_slots;
  if (adapters && select) keep_slots = slots_t.index_select(0, keep);
  const Paged paged{block_tables.data_ptr<int32_t>(), block_tables.size(1), block_size};
  const int64_t qkv_width = (num_heads + 2 * kv_heads) * head_dim;

  at::Tensor x = at::embedding(embed, token_ids).contiguous();  // [T, D] the residual stream
  if (embed_scale != 1.0) x.mul_(embed_scale);                  // in float32, as HF's float32 scale tensor
  at::Tensor h = at::empty({T, D}, x.options());                // normed input of each block
  at::Tensor attn = at::empty({T, num_heads * head_dim}, x.options());
  at::Tensor delta;                                             // the last block's output, not yet added
  for (int64_t l = 0; l < L; ++l) {
    const at::Tensor* w = layer_weights.data() + kLayerWeights * l;
    const at::Tensor* b = layer_biases.data() + kLayerBiases * l;
    const at::Tensor* pn = layer_panels.data() + kLayerPanels * l;
    const at::Tensor* qn = quantized ? layer_quant.data() + kLayerPanels * kQuantTensors * l : nullptr;
    auto quant = [&](int i) { return qn ? qn + kQuantTensors * i : nullptr; };
    const at::Tensor* ln = adapters ? lora.data() + kLoraTensors * l : nullptr;
    auto delta_of = [&](int i, const at::Tensor& in, at::Tensor& out) {  // projection i's LoRA delta, in place
      if (ln) add_lora_delta(in, out, ln[2 * i], ln[2 * i + 1], slots);
    };
    check_f32(k_cache[l], "k_cache");
    check_f32(v_cache[l], "v_cache");
    TORCH_CHECK(w[1].size(0) == qkv_width, "decode_forward: qkv weight shape");
    add_rms_norm(x.data_ptr<float>(), delta.defined() ? delta.data_ptr<float>() : nullptr,
                 w[0].data_ptr<float>(), h.data_ptr<float>(), T, D, eps);
    at::Tensor qkv = project(h, w[1], pn[0], quant(0), b[0]);  // [T, (H + 2 KVH) hd]
    delta_of(0, h, qkv);
    float* qkvp = qkv.data_ptr<float>();
    if (w[6].numel() > 0) {  // q/k norms: each q head by q_norm, each k head by k_norm
      TORCH_CHECK(w[6].numel() == head_dim && w[7].numel() == head_dim, "decode_forward: q/k norm shape");
      rms_norm_heads(qkvp, qkv_width, 0, num_heads, head_dim, w[6].data_ptr<float>(), eps, T);
      rms_norm_heads(qkvp, qkv_width, num_heads, kv_heads, head_dim, w[7].data_ptr<float>(), eps, T);
    }
    const int64_t table = layer_rope.empty() ? 0 : layer_rope[l];
    apply_rope(qkvp, qkv_width, num_heads + kv_heads, head_dim, rotary_dim, pos, rope[2 * table].data_ptr<float>(),
               rope[2 * table + 1].data_ptr<float>(), T);
    write_kv(qkvp, qkv_width, num_heads, kv_heads, head_dim, pos, rows, paged, k_cache[l].data_ptr<float>(),
             v_cache[l].data_ptr<float>(), T);
    if (select && l == L - 1 && keep.numel() < T) {  // past its K/V, the last layer needs only the kept tokens
      qkv = qkv.index_select(0, keep);
      qkvp = qkv.data_ptr<float>();
      x = x.index_select(0, keep);
      pos = keep_pos.data_ptr<int64_t>();
      rows = keep_rows.data_ptr<int32_t>();
      if (adapters) slots = keep_slots.data_ptr<int32_t>();
      T = keep.numel();
      h = at::empty({T, D}, x.options());
      attn = at::empty({T, num_heads * head_dim}, x.options());
    }
    paged_attention(qkvp, qkv_width, num_heads, kv_heads, head_dim, pos, rows, paged,
                    k_cache[l].data_ptr<float>(), v_cache[l].data_ptr<float>(), static_cast<float>(scale),
                    attn.data_ptr<float>(), T, max_ctx, windows.empty() ? 0 : windows[l]);
    at::Tensor o = project(attn, w[2], pn[1], quant(1), b[1]);  // [T, D]
    delta_of(1, attn, o);
    if (w[8].numel() > 0)  // the attention output's norm (Gemma's post_attention_layernorm)
      add_rms_norm(o.data_ptr<float>(), nullptr, w[8].data_ptr<float>(), o.data_ptr<float>(), T, D, eps);
    add_rms_norm(x.data_ptr<float>(), o.data_ptr<float>(), w[3].data_ptr<float>(), h.data_ptr<float>(), T, D,
                 eps);
    at::Tensor gate_up = project(h, w[4], pn[2], quant(2), b[2]);  // [T, 2I]
    delta_of(2, h, gate_up);
    const int64_t I = gate_up.size(1) / 2;
    at::Tensor act = at::empty({T, I}, x.options());
    if (activation == 1) gelu_tanh_mul(gate_up.data_ptr<float>(), act.data_ptr<float>(), T, I);
    else silu_mul(gate_up.data_ptr<float>(), act.data_ptr<float>(), T, I);
    delta = project(act, w[5], pn[3], quant(3), b[3]);        // [T, D]
    delta_of(3, act, delta);
    if (w[9].numel() > 0)  // the MLP output's norm (Gemma's post_feedforward_layernorm)
      add_rms_norm(delta.data_ptr<float>(), nullptr, w[9].data_ptr<float>(), delta.data_ptr<float>(), T, D, eps);
  }
  add_rms_norm(x.data_ptr<float>(), delta.defined() ? delta.data_ptr<float>() : nullptr,
               final_norm.data_ptr<float>(), h.data_ptr<float>(), T, D, eps);
  if (select && h.size(0) != keep.numel()) h = h.index_select(0, keep);  // no layers: the embeddings' rows
  at::Tensor logits = project(h, lm_head, lm_head_panels, lm_head_quant.empty() ? nullptr : lm_head_quant.data(),
                              at::Tensor());  // [T, V] ([R, V] with logit_rows)
  if (final_softcap > 0) logits = at::tanh(logits / final_softcap) * final_softcap;
  return logits;
}

}  // namespace
}  // namespace triton_llm_native

TORCH_LIBRARY_FRAGMENT(triton_llm, m) {
  m.def(
      "decode_forward(Tensor token_ids, Tensor positions, Tensor token_rows, Tensor block_tables, int block_size, "
      "Tensor embed, Tensor[] layer_weights, Tensor[] layer_biases, Tensor[] layer_panels, Tensor(a!)[] k_cache, "
      "Tensor(b!)[] v_cache, Tensor[] rope, int[] layer_rope, Tensor final_norm, Tensor lm_head, Tensor lm_head_panels, "
      "int num_heads, int num_kv_heads, int head_dim, float eps, float scale, Tensor? logit_rows, "
      "Tensor[] layer_quant, Tensor[] lm_head_quant, Tensor[] lora, Tensor? lora_slots, int[] windows, int activation, "
      "float embed_scale, float final_softcap) -> Tensor");
  m.impl("decode_forward", c10::DispatchKey::CPU, TORCH_FN(triton_llm_native::decode_forward));
}
