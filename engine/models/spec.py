"""What a model family's config means for the one decoder loop (engine/models/llama.py), without
torch: the gateway reads it to refuse a checkpoint before any weight is read (engine/models/check.py).

A `ModelSpec` is built per checkpoint by its family module (engine/models/families) from the
transformers config object; the forward reads only the spec's switches, never the family's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.errors import EngineError

FULL, SLIDING = "full_attention", "sliding_attention"  # transformers' layer_types names
ACTIVATIONS = ("silu", "swish", "gelu", "gelu_pytorch_tanh", "gelu_new", "gelu_fast", "relu", "quick_gelu")
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")


class UnsupportedModelError(EngineError, ValueError):
    """A checkpoint the engine cannot serve exactly; the message names what is unsupported."""

    code = "unsupported_model"


@dataclass(frozen=True)
class Norms:
    """The checkpoint names of a layer's RMSNorms (None: the layer has none there).
    pre_attn: on the residual into attention; attn_out: on the attention output before the residual
    add; pre_mlp: on the residual into the MLP; mlp_out: on the MLP output before the residual add."""

    pre_attn: str | None = "input_layernorm"
    attn_out: str | None = None
    pre_mlp: str | None = "post_attention_layernorm"
    mlp_out: str | None = None


@dataclass(frozen=True)
class MoESpec:
    """A mixture-of-experts MLP (engine/models/moe.py): the router picks `top_k` of `num_experts`
    gated MLPs per token and the block's output is their outputs weighted by the routing weights.

    Checkpoint names under each MoE layer's `block` (e.g. "mlp"): the router `router` [E, hidden]
    (with a bias where `router_bias`) and either one tensor trio per expert,
    `experts.{e}.{gate}/{up}/{down}.weight`, or stacked tensors (`stacked`: gpt-oss's
    `experts.gate_up_proj` [E, hidden, 2I] with gate and up interleaved column by column,
    `experts.down_proj` [E, I, hidden], and their `_bias` tensors)."""

    num_experts: int
    top_k: int
    intermediate_size: int  # of one expert
    norm_topk_prob: bool = False  # the top-k weights renormalized to sum to 1
    softmax_after_topk: bool = False  # gpt-oss: softmax over the top-k logits (else over all, then top-k)
    layers: tuple[bool, ...] = ()  # per layer: MoE (True) or the dense MLP (Qwen3-MoE's mixed layers)
    block: str = "mlp"
    router: str = "gate"
    router_bias: bool = False
    expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    stacked: bool = False
    expert_bias: bool = False
    swiglu_limit: float = 0.0  # gpt-oss: gate clamped to <= limit, up to [-limit, limit] (0: none)
    swiglu_alpha: float = 1.702  # gpt-oss: gate * sigmoid(alpha * gate) * (up + 1)

    def weight_names(self, layer_prefix: str) -> set[str]:
        """The tensors of one MoE layer (`layer_prefix`: "model.layers.{i}.")."""
        b = f"{layer_prefix}{self.block}."
        names = {f"{b}{self.router}.weight"} | ({f"{b}{self.router}.bias"} if self.router_bias else set())
        if self.stacked:
            names |= {b + "experts.gate_up_proj", b + "experts.down_proj"}
            if self.expert_bias:
                names |= {b + "experts.gate_up_proj_bias", b + "experts.down_proj_bias"}
            return names
        for e in range(self.num_experts):
            names |= {f"{b}experts.{e}.{n}.weight" for n in self.expert_names}
            if self.expert_bias:
                names |= {f"{b}experts.{e}.{n}.bias" for n in self.expert_names}
        return names


@dataclass(frozen=True)
class ModelSpec:
    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    eps: float
    norms: Norms = field(default_factory=Norms)
    norm_offset: float = 0.0  # 1.0: Gemma's RMSNorm scales by (1 + w)
    qk_norm: str | None = (
        None  # "head": RMSNorm over each head's D (Qwen3, Gemma 3); "all": over H*D (OLMo 2)
    )
    fused_qkv: bool = False  # one qkv_proj tensor in the checkpoint (Phi-3)
    fused_gate_up: bool = False  # one gate_up_proj tensor (Phi-3)
    attention_bias: bool = False  # q/k/v biases
    o_bias: bool = False
    mlp_bias: bool = False
    activation: str = "silu"  # transformers' ACT2FN name; the MLP is down(act(gate) * up)
    embed_scale: float = 1.0  # the embedding output times this (Gemma: sqrt(hidden), Granite)
    embed_scale_in_dtype: bool = False  # Gemma rounds the scale to the model dtype first
    residual_scale: float = 1.0  # each block's output times this before the residual add (Granite)
    attn_scale: float = 0.0  # softmax scale (0: head_dim ** -0.5)
    attn_softcap: float = 0.0  # tanh soft-capping of the attention scores (0: none)
    final_softcap: float = 0.0  # tanh soft-capping of the logits (0: none)
    logits_divisor: float = 1.0  # the logits divided by this (Granite: logits_scaling)
    rotary_dim: int = 0  # dims of each head that rotate (partial rotary; 0: head_dim)
    layer_types: tuple[str, ...] = ()  # FULL / SLIDING per layer
    window: int = 0  # keys a sliding layer's query sees, itself included
    per_type_rope: bool = False  # config.rope_parameters keyed by layer type (Gemma 3)
    long_rope_after: int = 0  # longrope: original_max_position_embeddings (0: not longrope)
    # longrope as Phi-3 generates: a sequence that grows past long_rope_after is recomputed whole
    # with the long factors (transformers drops its cache there); else only later tokens take them
    long_rope_recompute: bool = False
    tied: bool = True
    attn_sinks: bool = False  # a per-head sink logit in each softmax's denominator (gpt-oss), kept fp32
    moe: MoESpec | None = None  # mixture-of-experts MLPs (None: every layer's MLP is dense)

    def __post_init__(self) -> None:
        if not self.layer_types:
            object.__setattr__(self, "layer_types", (FULL,) * self.num_layers)
        if not self.rotary_dim:
            object.__setattr__(self, "rotary_dim", self.head_dim)
        if not self.attn_scale:
            object.__setattr__(self, "attn_scale", self.head_dim**-0.5)

    def layer_window(self, i: int) -> int:
        """Keys layer i's queries see (0: all of them)."""
        return self.window if self.layer_types[i] == SLIDING else 0

    @property
    def releasable_window(self) -> int:
        """The window out of which a sequence's KV blocks may be released (0: none): only where every
        layer slides (a block holds every layer's K/V) and no step recomputes a whole sequence
        (Phi-3's longrope)."""
        every_layer = all(t == SLIDING for t in self.layer_types)
        return self.window if every_layer and self.window and not self.long_rope_recompute else 0

    @property
    def split_window(self) -> int:
        """The window of a model that mixes sliding and full layers (0: it does not): its sliding
        layers' KV may live in a pool of their own, released out of the window (engine/kv_groups.py).
        Not where a step recomputes a whole sequence (Phi-3's longrope)."""
        mixed = SLIDING in self.layer_types and FULL in self.layer_types
        return self.window if mixed and self.window and not self.long_rope_recompute else 0

    @property
    def supports_one_call_decode(self) -> bool:
        """Whether the one-call C decode (engine/models/decode.py) implements every switch that is on:
        it runs the plain Llama block (pre-norms, SwiGLU, full rotary, full attention) only."""
        return (
            self.norms == Norms()
            and not self.norm_offset
            and self.qk_norm is None
            and not self.mlp_bias
            and self.activation in ("silu", "swish")
            and self.embed_scale == 1.0
            and self.residual_scale == 1.0
            and self.rotary_dim == self.head_dim
            and not self.attn_softcap
            and all(t == FULL for t in self.layer_types)
            and not self.per_type_rope
            and self.moe is None
            and not self.attn_sinks
        )

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer i's MLP is a mixture of experts."""
        return self.moe is not None and self.moe.layers[i]

    def weight_names(self) -> set[str]:
        """Every tensor name the forward reads from the checkpoint (the LM head apart)."""
        names = {"model.embed_tokens.weight", "model.norm.weight"}
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            names |= {p + n + ".weight" for n in vars(self.norms).values() if n}
            if self.qk_norm:
                names |= {a + "q_norm.weight", a + "k_norm.weight"}
            projs = ["qkv_proj"] if self.fused_qkv else ["q_proj", "k_proj", "v_proj"]
            names |= {a + x + ".weight" for x in projs + ["o_proj"]}
            if self.attention_bias:
                names |= {a + x + ".bias" for x in projs}
            if self.o_bias:
                names.add(a + "o_proj.bias")
            if self.attn_sinks:
                names.add(a + "sinks")
            if self.moe is not None and self.moe.layers[i]:
                names |= self.moe.weight_names(p)
                continue
            mlp = ["gate_up_proj"] if self.fused_gate_up else ["gate_proj", "up_proj"]
            names |= {m + x + ".weight" for x in mlp + ["down_proj"]}
            if self.mlp_bias:
                names |= {m + x + ".bias" for x in mlp + ["down_proj"]}
        return names
