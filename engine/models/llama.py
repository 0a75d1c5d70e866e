"""Our own decoder forward over a packed batch of variable-length sequences, for every family in
the registry (engine/models/registry.py): one loop whose switches come from the checkpoint's
ModelSpec (engine/models/spec.py), never from the family's name.

RMSNorm (pre and/or post, `(1 + w)` folded into the weight on load), RoPE per layer type (full or
partial, longrope's two tables), grouped-query attention through a pluggable backend over the paged
KV cache (sliding windows and soft-capping per layer), a gated MLP with the family's activation,
q/k norms, embedding / residual / logit multipliers and logit soft-capping, tied embeddings, and
per-row LoRA deltas on every projection (engine/lora). No padding: the step's tokens are one
[T, hidden] matrix; only rows that sample go through the LM head.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import torch
import torch.nn.functional as F
from transformers import PretrainedConfig

from engine.attention import AttentionBackend, AttentionMetadata
from engine.lora.batch import LoRABatch
from engine.models.fused import TorchOps, rms_norm
from engine.models.linear import Linear
from engine.models.moe import ExpertCounter, MoEBlock
from engine.models.ops import make_ops
from engine.models.quant import Int8Linear
from engine.models.registry import resolve
from engine.models.rope import rope_tables
from engine.models.spec import FULL, ModelSpec


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
    input_norm: torch.Tensor | None  # [hidden] the norm before attention (None: OLMo 2)
    qkv: Linear | Int8Linear  # [(H + 2*KVH) * D, hidden]  q, k and v projections fused
    o: Linear | Int8Linear  # [hidden, H * D]
    post_norm: torch.Tensor | None  # [hidden] the norm before the MLP (None: OLMo 2)
    gate_up: Linear | Int8Linear | None  # [2 * intermediate, hidden]  gate and up fused (None: MoE)
    down: Linear | Int8Linear | None  # [hidden, intermediate]
    attn_out_norm: torch.Tensor | None = None  # [hidden] on the attention output (Gemma, OLMo 2)
    mlp_out_norm: torch.Tensor | None = None  # [hidden] on the MLP output (Gemma, OLMo 2)
    q_norm: torch.Tensor | None = None  # [D] per head, or [H * D] over all heads (OLMo 2)
    k_norm: torch.Tensor | None = None  # [D] or [KVH * D]
    sinks: torch.Tensor | None = None  # [H] fp32 attention-sink logits (gpt-oss), whatever the dtype
    moe: MoEBlock | None = None  # the layer's mixture of experts, in place of gate_up and down


class LlamaModel:
    """Weights plus the forward of any registered family. Build with `from_state_dict`."""

    def __init__(
        self,
        config: PretrainedConfig,
        layers: list[LayerWeights],
        embed: torch.Tensor,
        norm: torch.Tensor,
        lm_head: Linear | Int8Linear,
        attention: AttentionBackend,
        max_positions: int,
        ops: TorchOps | None = None,
        spec: ModelSpec | None = None,
    ):
        self.config = config
        self.spec = spec = spec or resolve(config)
        self.layers = layers
        self.embed = embed  # [vocab, hidden]
        self.norm = norm
        self.lm_head = lm_head  # [vocab, hidden]; the embedding's weight when tied
        self.attention = attention
        attention.scale = spec.attn_scale
        self.num_heads = spec.num_heads
        self.num_kv_heads = spec.num_kv_heads
        self.head_dim = spec.head_dim
        self.eps = spec.eps
        self.dtype = embed.dtype
        self.ops = ops or TorchOps()  # RMSNorm (+ residual add), RoPE, SiLU·mul: engine/models/fused.py
        # The decode-only fast path the ModelRunner chose for this model (engine/models/decode.py), or
        # None; the runner takes it for the steps it applies to, `forward` is always per operator.
        self.decode: DecodeFastPath | None = None
        # called after each layer of `forward` with the layer's index: engine/interrupts.py (None: off)
        self.between_layers: Callable[[int], None] | None = None
        # Gemma rounds its embedding scale to the model dtype before multiplying
        scale = spec.embed_scale
        self.embed_scale = (
            float(torch.tensor(scale, dtype=self.dtype)) if spec.embed_scale_in_dtype else scale
        )
        # RoPE as x * cos + swap_halves(x) * sin_signed, with sin_signed = [-sin_a, sin_b]: the same
        # products as transformers' x * cos + rotate_half(x) * sin, one op fewer. Longrope: [2P, R].
        self.max_positions = max_positions
        self.rope = rope_tables(config, spec, max_positions, self.dtype, embed.device)
        self.cos, self.sin = self.rope[FULL]
        # experts the last forward ran (MoE layers only), and the bytes of the weights every step reads
        self.experts = next((ly.moe.counter for ly in layers if ly.moe is not None), None)
        self.dense_weight_bytes = _dense_bytes(self)
        # a forward CUDA graphs may capture: no MoE layer groups its tokens on the host
        self.graph_safe = all(ly.moe is None or ly.moe.fused is not None for ly in layers)

    @classmethod
    def from_state_dict(
        cls,
        config: PretrainedConfig,
        sd: dict[str, torch.Tensor],
        dtype: torch.dtype,
        attention: AttentionBackend,
        max_positions: int,
        quantization: str | None = None,
        cpu_kernels: bool = True,
        cpu_amx: bool | None = None,
    ) -> LlamaModel:
        """`quantization`: None (weights in `dtype`) or "int8" (every projection and the LM head
        int8, engine/models/quant.py; embeddings and norms stay in `dtype`).
        `cpu_kernels`: the own C kernels on CPU (fp32 linears, fused elementwise ops, decode-only steps
        in one C call where the family's spec allows it). `cpu_amx`: see `EngineConfig.cpu_amx`."""
        spec = resolve(config)
        dense = partial(Linear, cpu_kernel=cpu_kernels, cpu_amx=cpu_amx)
        linear = Int8Linear if quantization == "int8" else dense

        def w(name: str) -> torch.Tensor:
            return sd[name].to(dtype).contiguous()

        def norm(name: str | None) -> torch.Tensor | None:
            if name is None:
                return None
            return (sd[name].float() + spec.norm_offset).to(dtype).contiguous()  # Gemma's (1 + w)

        def cat(names: list[str]) -> torch.Tensor:
            return torch.cat([w(n) for n in names]).contiguous()

        def mlp(i: int) -> dict:
            """The layer's dense MLP linears, or its MoE block."""
            p, m = f"model.layers.{i}.", f"model.layers.{i}.mlp."
            if spec.is_moe_layer(i):
                moe = MoEBlock.from_state_dict(
                    sd,
                    p,
                    spec,
                    dtype,
                    counter,
                    quantization=quantization,
                    cpu_kernels=cpu_kernels,
                    triton=attention.triton_kernels,
                )
                return dict(gate_up=None, down=None, moe=moe)
            gate_up = [m + "gate_up_proj"] if spec.fused_gate_up else [m + "gate_proj", m + "up_proj"]
            bias = spec.mlp_bias
            return dict(
                gate_up=linear(
                    cat([x + ".weight" for x in gate_up]),
                    cat([x + ".bias" for x in gate_up]) if bias else None,
                ),
                down=linear(w(m + "down_proj.weight"), w(m + "down_proj.bias") if bias else None),
            )

        counter = ExpertCounter(sd["model.embed_tokens.weight"].device)
        layers = []
        for i in range(spec.num_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            qkv = [a + "qkv_proj"] if spec.fused_qkv else [a + f"{x}_proj" for x in "qkv"]
            n = spec.norms
            layers.append(
                LayerWeights(
                    input_norm=norm(n.pre_attn and p + n.pre_attn + ".weight"),
                    qkv=linear(
                        cat([x + ".weight" for x in qkv]),
                        cat([x + ".bias" for x in qkv]) if spec.attention_bias else None,
                    ),
                    o=linear(w(a + "o_proj.weight"), w(a + "o_proj.bias") if spec.o_bias else None),
                    post_norm=norm(n.pre_mlp and p + n.pre_mlp + ".weight"),
                    **mlp(i),
                    attn_out_norm=norm(n.attn_out and p + n.attn_out + ".weight"),
                    mlp_out_norm=norm(n.mlp_out and p + n.mlp_out + ".weight"),
                    q_norm=norm(a + "q_norm.weight" if spec.qk_norm else None),
                    k_norm=norm(a + "k_norm.weight" if spec.qk_norm else None),
                    sinks=sd[a + "sinks"].float().contiguous() if spec.attn_sinks else None,
                )
            )
        embed = w("model.embed_tokens.weight")
        tied = spec.tied or "lm_head.weight" not in sd
        lm_head = linear(embed if tied else w("lm_head.weight"))
        final_norm = norm("model.norm.weight")
        assert final_norm is not None
        model = cls(
            config,
            layers,
            embed,
            final_norm,
            lm_head,
            attention,
            max_positions,
            make_ops(embed.device, dtype, cpu_kernels),
            spec,
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
        """input_ids, positions: [T] (positions: rows of the rope tables, engine/models/rope.py).
        Returns the final normed hidden states [T, hidden].
        `lora`: the step's adapters per row (engine/lora); each projection's LoRA delta is added
        in place to its base output, for the rows that have an adapter. None: the base model."""
        ops, eps = self.ops, self.eps
        x = F.embedding(input_ids, self.embed)  # [T, hidden] the residual stream
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        delta = None  # the last block's output, added to x by the next norm
        if self.experts is not None:
            self.experts.reset()
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            x, h = self._pre_norm(x, delta, layer.input_norm)
            # a sliding layer with a pool of its own reads its own block tables (engine/kv_groups.py)
            m = meta.sliding if meta.sliding is not None and self.spec.layer_window(i) else meta
            delta = self._out(self._attention(i, layer, h, positions, m, kv_cache, lora), layer.attn_out_norm)
            x, h = self._pre_norm(x, delta, layer.post_norm)
            delta = self._out(self._mlp(i, layer, h, lora), layer.mlp_out_norm)
            if self.between_layers is not None:  # a nested step may run here (engine/interrupts.py)
                self.between_layers(i)
        return ops.add_rms_norm(x, delta, self.norm, eps)[1]

    def _mlp(self, i: int, layer: LayerWeights, h: torch.Tensor, lora: LoRABatch | None) -> torch.Tensor:
        """The layer's MLP over its normed input h [T, hidden]: dense (with LoRA deltas) or experts."""
        if layer.moe is not None:
            return layer.moe(h, self.ops)
        assert layer.gate_up is not None and layer.down is not None
        gate_up = layer.gate_up(h)  # [T, 2 * intermediate]
        if lora is not None:
            lora.apply(i, "gate_up", h, gate_up)
        act = self._act_mul(gate_up)
        delta = layer.down(act)
        if lora is not None:
            lora.apply(i, "down", act, delta)
        return delta

    def step_weight_bytes(self) -> tuple[int, int]:
        """(experts the last forward ran, summed over MoE layers; bytes of weights it read: every
        dense weight plus each expert it ran). A read of the experts count syncs a GPU."""
        if self.experts is None:
            return 0, self.dense_weight_bytes
        touched = self.experts.value()
        per_expert = next(ly.moe.expert_bytes for ly in self.layers if ly.moe is not None)
        return touched, self.dense_weight_bytes + touched * per_expert

    def _pre_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, the block's input): its normed residual, or the residual itself (no pre-norm)."""
        if weight is not None:
            return self.ops.add_rms_norm(x, delta, weight, self.eps)
        x = x + delta if delta is not None else x
        return x, x

    def _out(self, out: torch.Tensor, norm: torch.Tensor | None) -> torch.Tensor:
        """A block's output as added to the residual: post-normed and scaled where the family says."""
        if norm is not None:
            out = rms_norm(out, norm, self.eps)
        return out * self.spec.residual_scale if self.spec.residual_scale != 1.0 else out

    def _attention(
        self,
        i: int,
        layer: LayerWeights,
        h: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: torch.Tensor,
        lora: LoRABatch | None,
    ) -> torch.Tensor:
        spec = self.spec
        T = h.shape[0]
        H, KVH, D = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = layer.qkv(h)  # [T, (H + 2*KVH) * D]
        if lora is not None:
            lora.apply(i, "qkv", h, qkv)
        cos, sin = self.rope[spec.layer_types[i]]
        v = qkv[:, (H + KVH) * D :].view(T, KVH, D)
        if spec.qk_norm is None:  # q and k rotated at once
            qk = self._rope(qkv[:, : (H + KVH) * D].view(T, H + KVH, D), cos, sin, positions)
            q, k = qk[:, :H], qk[:, H:]
        else:
            assert layer.q_norm is not None and layer.k_norm is not None  # loaded wherever qk_norm is set
            q, k = qkv[:, : H * D], qkv[:, H * D : (H + KVH) * D]
            if spec.qk_norm == "all":  # OLMo 2: over every head at once
                q, k = rms_norm(q, layer.q_norm, self.eps), rms_norm(k, layer.k_norm, self.eps)
            q, k = q.reshape(T, H, D), k.reshape(T, KVH, D)
            if spec.qk_norm == "head":
                q, k = rms_norm(q, layer.q_norm, self.eps), rms_norm(k, layer.k_norm, self.eps)
            q, k = (
                self._rope(q.contiguous(), cos, sin, positions),
                self._rope(k.contiguous(), cos, sin, positions),
            )
        attn = self.attention.forward(
            q,
            k,
            v,
            kv_cache,
            meta,
            window=spec.layer_window(i),
            softcap=spec.attn_softcap,
            sinks=layer.sinks,
        ).reshape(T, H * D)
        o = layer.o(attn)
        if lora is not None:
            lora.apply(i, "o", attn, o)
        return o

    def _rope(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """x: [T, heads, D] rotated in its first rotary_dim dims (all of them but for partial rotary)."""
        R = self.spec.rotary_dim
        if R == x.shape[-1]:
            return self.ops.rope(x, cos, sin, positions)
        x[..., :R] = self.ops.rope(x[..., :R], cos, sin, positions)
        return x

    def _act_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[T, 2I] -> [T, I] act(gate) * up."""
        if self.spec.activation in ("silu", "swish"):
            return self.ops.silu_mul(gate_up)
        from transformers.activations import ACT2FN

        gate, up = gate_up.chunk(2, dim=-1)
        return ACT2FN[self.spec.activation](gate) * up

    def rope_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's cos and signed sin, [max_positions, head_dim] each, model dtype: a row at position
        p is rotated as x * cos[p] + swap_halves(x) * sin[p]."""
        return self.cos, self.sin

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [S, hidden] rows that sample -> fp32 logits [S, vocab]."""
        logits = self.lm_head(hidden)
        spec = self.spec
        if spec.logits_divisor != 1.0:
            logits = logits / spec.logits_divisor
        if spec.final_softcap:
            logits = torch.tanh(logits / spec.final_softcap) * spec.final_softcap
        return logits.float()


def _dense_bytes(model: LlamaModel) -> int:
    """Bytes of the weights a step reads whatever its tokens: projections, dense MLPs, routers,
    norms and the LM head (the embedding table apart: a step reads only its tokens' rows)."""

    def size(t: Linear | Int8Linear | torch.Tensor | None) -> int:
        if t is None:
            return 0
        if isinstance(t, torch.Tensor):
            return t.numel() * t.element_size()
        return t.nbytes + size(t.bias)

    total = size(model.norm) + size(model.lm_head)
    for ly in model.layers:
        parts = (ly.input_norm, ly.qkv, ly.o, ly.post_norm, ly.gate_up, ly.down, ly.attn_out_norm)
        total += sum(size(t) for t in (*parts, ly.mlp_out_norm, ly.q_norm, ly.k_norm, ly.sinks))
        total += size(ly.moe.router) if ly.moe is not None else 0
    return total
