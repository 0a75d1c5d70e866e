"""Our own Llama-family forward over a packed batch of variable-length sequences.

RMSNorm, RoPE (with the config's scaling, via transformers' rope init), grouped-query attention
through a pluggable backend over the paged KV cache, SwiGLU, tied embeddings, and per-row LoRA
deltas on every projection (engine/lora). No padding: the
step's tokens are one [T, hidden] matrix; only rows that sample go through the LM head.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Protocol

import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from engine.attention import AttentionBackend, AttentionMetadata
from engine.lora.batch import LoRABatch
from engine.models.fused import TorchOps, make_ops
from engine.models.linear import Linear
from engine.models.quant import Int8Linear


class DecodeFastPath(Protocol):
    """A decode-only step's whole forward in one call (engine/models/decode.py's DecodeForward)."""

    def applies(self, meta: AttentionMetadata, kv_caches: list[torch.Tensor]) -> bool: ...

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[torch.Tensor],
    ) -> torch.Tensor: ...


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: Linear | Int8Linear  # [(H + 2*KVH) * D, hidden]  q, k and v projections fused
    o: Linear | Int8Linear  # [hidden, H * D]
    post_norm: torch.Tensor  # [hidden]
    gate_up: Linear | Int8Linear  # [2 * intermediate, hidden]  gate and up fused
    down: Linear | Int8Linear  # [hidden, intermediate]


class LlamaModel:
    """Weights plus the forward. Build with `from_state_dict`."""

    def __init__(
        self,
        config: LlamaConfig,
        layers: list[LayerWeights],
        embed: torch.Tensor,
        norm: torch.Tensor,
        lm_head: Linear | Int8Linear,
        attention: AttentionBackend,
        max_positions: int,
        ops: TorchOps | None = None,
    ):
        self.config = config
        self.layers = layers
        self.embed = embed  # [vocab, hidden]
        self.norm = norm
        self.lm_head = lm_head  # [vocab, hidden]; the embedding's weight when tied
        self.attention = attention
        self.num_heads: int = config.num_attention_heads
        self.num_kv_heads: int = config.num_key_value_heads  # type: ignore[assignment]  # set in every config
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.eps = config.rms_norm_eps
        self.dtype = embed.dtype
        self.ops = ops or TorchOps()  # RMSNorm (+ residual add), RoPE, SiLU·mul: engine/models/fused.py
        # The decode-only fast path the ModelRunner chose for this model (engine/models/decode.py), or
        # None; the runner takes it for the steps it applies to, `forward` is always per operator.
        self.decode: DecodeFastPath | None = None
        rotary = LlamaRotaryEmbedding(config).to(embed.device)
        positions = torch.arange(max_positions, device=embed.device)[None]
        cos, sin = rotary(embed[:1], positions)  # [1, P, D] each, model dtype, on the weights' device
        half = self.head_dim // 2
        # RoPE as x * cos + swap_halves(x) * sin_signed, with sin_signed = [-sin_a, sin_b]: the same
        # products as transformers' x * cos + rotate_half(x) * sin, one op fewer.
        self.cos, self.sin = cos[0], torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1)

    @classmethod
    def from_state_dict(
        cls,
        config: LlamaConfig,
        sd: dict[str, torch.Tensor],
        dtype: torch.dtype,
        attention: AttentionBackend,
        max_positions: int,
        quantization: str | None = None,
        cpu_kernels: bool = True,
    ) -> LlamaModel:
        """`quantization`: None (weights in `dtype`) or "int8" (every projection and the LM head
        int8, engine/models/quant.py; embeddings and norms stay in `dtype`).
        `cpu_kernels`: the own C kernels on CPU (fp32 linears, fused elementwise ops)."""
        linear = Int8Linear if quantization == "int8" else partial(Linear, cpu_kernel=cpu_kernels)

        def w(name: str) -> torch.Tensor:
            return sd[name].to(dtype).contiguous()

        def maybe(name: str) -> torch.Tensor | None:
            return sd[name].to(dtype) if name in sd else None

        layers = []
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            qkv_bias = None
            if a + "q_proj.bias" in sd:
                qkv_bias = torch.cat([w(a + f"{x}_proj.bias") for x in "qkv"])
            layers.append(
                LayerWeights(
                    input_norm=w(p + "input_layernorm.weight"),
                    qkv=linear(torch.cat([w(a + f"{x}_proj.weight") for x in "qkv"]).contiguous(), qkv_bias),
                    o=linear(w(a + "o_proj.weight"), maybe(a + "o_proj.bias")),
                    post_norm=w(p + "post_attention_layernorm.weight"),
                    gate_up=linear(
                        torch.cat([w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")]).contiguous()
                    ),
                    down=linear(w(p + "mlp.down_proj.weight")),
                )
            )
        embed = w("model.embed_tokens.weight")
        tied = getattr(config, "tie_word_embeddings", False) or "lm_head.weight" not in sd
        lm_head = linear(embed if tied else w("lm_head.weight"))
        model = cls(
            config,
            layers,
            embed,
            w("model.norm.weight"),
            lm_head,
            attention,
            max_positions,
            make_ops(embed.device, dtype, cpu_kernels),
        )
        return model

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[torch.Tensor],
        lora: LoRABatch | None = None,
    ) -> torch.Tensor:
        """input_ids, positions: [T]. Returns the final normed hidden states [T, hidden].
        `lora`: the step's adapters per row (engine/lora); each projection's LoRA delta is added
        in place to its base output, for the rows that have an adapter. None: the base model."""
        T = input_ids.shape[0]
        H, KVH, D = self.num_heads, self.num_kv_heads, self.head_dim
        ops = self.ops
        x = F.embedding(input_ids, self.embed)  # [T, hidden] the residual stream
        delta = None  # the last layer's MLP output, added to x by the next norm
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            x, h = ops.add_rms_norm(x, delta, layer.input_norm, self.eps)
            qkv = layer.qkv(h)  # [T, (H + 2*KVH) * D]
            if lora is not None:
                lora.apply(i, "qkv", h, qkv)
            qk = ops.rope(
                qkv[:, : (H + KVH) * D].view(T, H + KVH, D), self.cos, self.sin, positions
            )  # q and k at once
            v = qkv[:, (H + KVH) * D :].view(T, KVH, D)
            attn = self.attention.forward(qk[:, :H], qk[:, H:], v, kv_cache, meta).reshape(T, H * D)
            o = layer.o(attn)
            if lora is not None:
                lora.apply(i, "o", attn, o)
            x, h = ops.add_rms_norm(x, o, layer.post_norm, self.eps)
            gate_up = layer.gate_up(h)  # [T, 2 * intermediate]
            if lora is not None:
                lora.apply(i, "gate_up", h, gate_up)
            act = ops.silu_mul(gate_up)
            delta = layer.down(act)
            if lora is not None:
                lora.apply(i, "down", act, delta)
        return ops.add_rms_norm(x, delta, self.norm, self.eps)[1]

    def rope_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's cos and signed sin, [max_positions, head_dim] each, model dtype: a row at position
        p is rotated as x * cos[p] + swap_halves(x) * sin[p]."""
        return self.cos, self.sin

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [S, hidden] rows that sample -> fp32 logits [S, vocab]."""
        return self.lm_head(hidden).float()
