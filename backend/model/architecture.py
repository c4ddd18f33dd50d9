"""Each model family declared once: its blocks and its checkpoint names.

An ``Architecture`` says what a family's decoder layer is made of (the norm and where the layer puts its norms, q/k
norms, the attention and MLP blocks and the MLP's activation, which projections carry biases, how its sliding windows
and RoPE are read, the embedding scale, the query scale, logit soft-capping) and what the checkpoint calls each tensor.
Every path reads it: ``config.py`` parses ``config.json`` by it, ``loader.py`` maps tensor names by it, the eager
model (``llama.py``) builds its blocks from it and the native step passes what it declares to the op. Adding a
family is a new entry in ``ARCHITECTURES`` plus whatever new block variant it needs: a block variant is a value of
``norm``, ``layer_norms``, ``attention`` or ``mlp`` (a mixture-of-experts MLP or latent attention arrive as new
values there, built by the same layer, not as another forward).

Inside the engine a layer always holds two fused projections (``self_attn.qkv_proj`` = q | k | v and
``mlp.gate_up_proj`` = gate | up, stacked along the output); a checkpoint stores them split (Llama's q_proj, k_proj,
v_proj) or already fused (Phi-3's qkv_proj, gate_up_proj): ``qkv_parts`` / ``gate_up_parts`` name them.
"""
from __future__ import annotations

from dataclasses import dataclass

SPLIT_QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
SPLIT_GATE_UP = ("mlp.gate_proj", "mlp.up_proj")
FUSED_QKV = ("self_attn.qkv_proj",)
FUSED_GATE_UP = ("mlp.gate_up_proj",)
BASE_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")

BIAS_RULES = ("none", "always", "attention_bias", "mlp_bias")   # a bias: never, always, or when the field is true
WINDOW_RULES = ("none", "every_layer", "use_sliding_window", "layer_types")
NORMS = ("rms", "rms_offset")         # RMSNorm: w * x_normed, or Gemma's (1 + w) * x_normed (in fp32)
LAYER_NORMS = ("pre", "sandwich")     # pre: before attention and before the MLP; sandwich: also after each (Gemma)
ATTENTION_BLOCKS = ("gqa",)           # grouped-query attention (windows, q/k norms, biases per the fields here)
MLP_BLOCKS = ("gated",)               # act(gate) * up, then down
LAYER_TYPES = ("full_attention", "sliding_attention")   # config.json's layer_types entries
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}   # hidden_act -> the block's op


@dataclass(frozen=True)
class Architecture:
    """One family: ``hf_class`` in ``config.json``'s ``architectures``, ``family`` its name in the engine."""

    family: str
    hf_class: str
    label: str                                   # how the load line names it
    qkv_parts: tuple[str, ...] = SPLIT_QKV       # checkpoint tensors stacked into qkv_proj (q | k | v)
    gate_up_parts: tuple[str, ...] = SPLIT_GATE_UP   # ... into gate_up_proj (gate | up)
    qk_norm: bool = False                        # RMSNorm over each q and k head before RoPE (Qwen3)
    norm: str = "rms"                            # NORMS: every RMSNorm of the family (q/k norms too)
    layer_norms: str = "pre"                     # LAYER_NORMS
    attention: str = "gqa"                       # ATTENTION_BLOCKS
    mlp: str = "gated"                           # MLP_BLOCKS
    activation_field: str = "hidden_act"         # the config.json key naming the MLP's activation
    activations: tuple[str, ...] = ("silu", "swish")   # its values implemented (ACTIVATIONS: SwiGLU, GeGLU-tanh)
    qkv_bias: str = "none"                       # BIAS_RULES: biases on q, k, v
    o_bias: str = "none"                         # on o_proj
    mlp_bias: str = "none"                       # on gate, up and down
    windows: str = "none"                        # WINDOW_RULES: how sliding_window is read
    default_window: int | None = None            # sliding_window when config.json has no such key
    local_rope: bool = False                     # sliding layers have their own RoPE (Gemma 3's rope_local_base_freq,
                                                 # rope_parameters per layer type)
    embed_scale: bool = False                    # embeddings times sqrt(hidden_size) (in the embedding's dtype)
    query_scale_field: str | None = None         # attention scale field**-0.5 instead of head_dim**-0.5
    softcaps: tuple[str, ...] = ()               # the logit soft-capping fields implemented (cap * tanh(x / cap))
    rope_types: tuple[str, ...] = BASE_ROPE_TYPES
    rope_aliases: tuple[tuple[str, str], ...] = ()   # rope types the config class renames (Phi-3: su -> longrope)
    partial_rotary: bool = False                 # partial_rotary_factor < 1 implemented (RoPE on the first dims)
    lora: bool = True                            # PEFT adapters (on the checkpoint's projections) apply
    prequantized: bool = True                    # GPTQ / AWQ checkpoints (of the checkpoint's projections) load
    defaults: tuple[tuple[str, object], ...] = ()    # the config class's defaults for absent config.json keys

    def __post_init__(self):
        for rule in (self.qkv_bias, self.o_bias, self.mlp_bias):
            assert rule in BIAS_RULES, rule
        assert self.windows in WINDOW_RULES, self.windows
        assert self.norm in NORMS and self.layer_norms in LAYER_NORMS, (self.norm, self.layer_norms)
        assert self.attention in ATTENTION_BLOCKS and self.mlp in MLP_BLOCKS, (self.attention, self.mlp)
        assert all(a in ACTIVATIONS for a in self.activations), self.activations

    def has_bias(self, rule: str, d: dict) -> bool:
        """Whether a bias under ``rule`` is present for this ``config.json`` dict."""
        return rule == "always" or (rule in ("attention_bias", "mlp_bias") and bool(d.get(rule, False)))

    def with_defaults(self, d: dict) -> dict:
        """``config.json`` with the config class's defaults filled in for absent keys."""
        return {**dict(self.defaults), **d}

    def qkv_rows(self, q: int, kv: int) -> tuple[tuple[str, int], ...]:
        """The checkpoint's q/k/v tensors (name under the layer, output rows), in stacking order."""
        return tuple(zip(self.qkv_parts, (q, kv, kv))) if len(self.qkv_parts) == 3 else ((self.qkv_parts[0], q + 2 * kv),)

    def gate_up_rows(self, inter: int) -> tuple[tuple[str, int], ...]:
        return tuple(zip(self.gate_up_parts, (inter, inter))) if len(self.gate_up_parts) == 2 \
            else ((self.gate_up_parts[0], 2 * inter),)

    @property
    def fused_checkpoint(self) -> bool:
        return len(self.qkv_parts) == 1 or len(self.gate_up_parts) == 1


_TRANSFORMERS_DEFAULTS = (("rms_norm_eps", 1e-6), ("tie_word_embeddings", False))

ARCHITECTURES: dict[str, Architecture] = {a.hf_class: a for a in (
    Architecture("llama", "LlamaForCausalLM", "Llama", qkv_bias="attention_bias", o_bias="attention_bias",
                 mlp_bias="mlp_bias", defaults=_TRANSFORMERS_DEFAULTS + (("max_position_embeddings", 2048),)),
    Architecture("mistral", "MistralForCausalLM", "Mistral", windows="every_layer", default_window=4096,
                 defaults=_TRANSFORMERS_DEFAULTS + (("max_position_embeddings", 4096 * 32),)),
    Architecture("qwen2", "Qwen2ForCausalLM", "Qwen2", qkv_bias="always", windows="use_sliding_window",
                 default_window=4096, defaults=_TRANSFORMERS_DEFAULTS + (("max_position_embeddings", 32768),)),
    Architecture("qwen3", "Qwen3ForCausalLM", "Qwen3", qk_norm=True, qkv_bias="attention_bias",
                 o_bias="attention_bias", windows="use_sliding_window", default_window=4096,
                 defaults=_TRANSFORMERS_DEFAULTS + (("max_position_embeddings", 32768), ("head_dim", 128))),
    Architecture("phi3", "Phi3ForCausalLM", "Phi-3", qkv_parts=FUSED_QKV, gate_up_parts=FUSED_GATE_UP,
                 windows="every_layer", default_window=None, rope_types=("default", "longrope"),
                 rope_aliases=(("su", "longrope"), ("yarn", "longrope")), partial_rotary=True,
                 defaults=(("rms_norm_eps", 1e-5), ("tie_word_embeddings", False), ("max_position_embeddings", 4096),
                           ("original_max_position_embeddings", 4096))),
    Architecture("gemma3", "Gemma3ForCausalLM", "Gemma 3", qk_norm=True, norm="rms_offset", layer_norms="sandwich",
                 activation_field="hidden_activation", activations=("gelu_pytorch_tanh",), qkv_bias="attention_bias",
                 o_bias="attention_bias", windows="layer_types", default_window=4096, local_rope=True,
                 embed_scale=True, query_scale_field="query_pre_attn_scalar", softcaps=("final_logit_softcapping",),
                 defaults=(("rms_norm_eps", 1e-6), ("tie_word_embeddings", True), ("max_position_embeddings", 131072),
                           ("head_dim", 256), ("hidden_activation", "gelu_pytorch_tanh"),
                           ("query_pre_attn_scalar", 256))),
)}
FAMILIES: dict[str, Architecture] = {a.family: a for a in ARCHITECTURES.values()}


def architecture(family: str) -> Architecture:
    """The declaration of an engine family name (``ModelConfig.family``)."""
    return FAMILIES[family]
