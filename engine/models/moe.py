"""The mixture-of-experts MLP of a layer (ModelSpec.moe, engine/models/spec.py).

Routing is the step's data: the router's logits [T, E] give every token its top-k experts and
weights; the (token, expert) pairs are sorted by expert, each ACTIVE expert runs one gated MLP over
all of its tokens at once (its weights read once a step, whatever the batch), and the results are
scattered back, times their routing weights, in ascending expert order (transformers' order).

The experts' weights are stacked once at load, gate and up as one matrix per expert with gate's
rows first: gate_up [E, 2I, H], down [E, H, I] (gpt-oss's interleaved gate/up columns are split at
load). On a GPU one call runs every expert: the Triton fused-MoE kernel (engine/kernels/fused_moe.py,
a grouped GEMM over the sorted tokens). On the CPU each active expert is a pair of linears: the own
fp32 C kernel over per-expert panels (engine/models/linear.py), the INT8 kernel with
quantization="int8" (engine/models/quant.py), or torch's F.linear on the stacked weights (bf16,
cpu_kernels=False); measurements in docs/performance.md.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from engine import native
from engine.models.fused import TorchOps
from engine.models.linear import Linear, f32_library, pack
from engine.models.quant import Int8Linear
from engine.models.spec import ModelSpec, MoESpec

# the activation name the fused-MoE kernel takes for gpt-oss's clamped SwiGLU (vLLM's name)
GPT_OSS_ACTIVATION = "swigluoai"
ExpertLinear = Linear | Int8Linear
SOURCE = Path(__file__).parent / "csrc" / "moe_f32.c"


def moe_library() -> ctypes.CDLL | None:
    """The fp32 C kernel of a whole MoE layer's experts (csrc/moe_f32.c), or None without a compiler."""
    return native.library(SOURCE, {"moe_f32": [ctypes.c_void_p] * 13 + [ctypes.c_int] * 5})


class ExpertCounter:
    """Distinct experts a forward ran, summed over its MoE layers; kept on the device (no sync, and
    CUDA-graph safe: `reset` and `add` are in-place), read once a step by `value`."""

    def __init__(self, device: torch.device | str) -> None:
        self.touched = torch.zeros((), dtype=torch.int64, device=device)

    def reset(self) -> None:
        self.touched.zero_()

    def add(self, ids: torch.Tensor, num_experts: int) -> None:
        hit = torch.zeros(num_experts, dtype=torch.int64, device=ids.device)
        self.touched += hit.index_fill_(0, ids.reshape(-1), 1).sum()

    def value(self) -> int:
        return int(self.touched)


def _fused_kernel() -> Callable[..., torch.Tensor] | None:
    """The Triton fused-MoE kernel, or None where this build lacks it (the grouped torch path then
    runs on the GPU too, with a host sync a layer: no CUDA graphs, LlamaModel.graph_safe)."""
    try:
        from engine.kernels.fused_moe import fused_moe  # imports triton
    except ImportError:
        return None
    return fused_moe


def _nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class MoEBlock:
    """One layer's router and experts. Build with `from_state_dict`; call on the normed residual."""

    def __init__(
        self,
        moe: MoESpec,
        activation: str,
        router: Linear,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        b_gate_up: torch.Tensor | None,
        b_down: torch.Tensor | None,
        counter: ExpertCounter,
        *,
        quantization: str | None = None,
        cpu_kernels: bool = True,
        triton: bool = False,
    ):
        """`triton`: the fused-MoE Triton kernel runs the experts on the CPU too (its interpreter,
        TRITON_INTERPRET=1: the triton attention backend's models); on a GPU it always does."""
        self.moe, self.counter, self.router = moe, counter, router
        self.num_experts, self.top_k = moe.num_experts, moe.top_k
        self.activation = GPT_OSS_ACTIVATION if moe.swiglu_limit else activation
        self.b_gate_up, self.b_down = b_gate_up, b_down  # [E, 2I], [E, H] or None
        # [E, 2I, H], [E, H, I]: what the fused kernel and the torch path read (None when the
        # per-expert linears below hold the only copy)
        self.gate_up: torch.Tensor | None = gate_up
        self.down: torch.Tensor | None = down
        self.linears: list[tuple[ExpertLinear, ExpertLinear]] | None = None
        self.fused: Callable[..., torch.Tensor] | None = None
        on_cpu = gate_up.device.type == "cpu"
        # the Triton kernel on a GPU, and on the CPU where `triton` asks for it (triton's interpreter)
        if quantization is None and (gate_up.device.type == "cuda" or triton):
            self.fused = _fused_kernel()
        c_fp32 = cpu_kernels and gate_up.dtype == torch.float32 and f32_library() is not None
        c_fp32 = c_fp32 and self.fused is None
        # bytes one active expert reads: weights (int8 with their scales) and biases
        biases = _nbytes(*(b[0] if b is not None else None for b in (b_gate_up, b_down)))
        self.expert_bytes = _nbytes(gate_up[0], down[0]) + biases
        # fp32 on the CPU, SiLU experts: every active expert in one C call, over per-expert panels
        # [E, ceil(N / NR), K, NR] (f32_linear.c's layout); other activations: a C call a matrix
        self.lib = moe_library() if on_cpu and c_fp32 and self.activation in ("silu", "swish") else None
        self.panels: tuple[torch.Tensor, torch.Tensor] | None = None
        if self.lib is not None and quantization is None:
            lib = f32_library()
            assert lib is not None
            self.panels = (
                torch.stack([pack(lib, gate_up[e].contiguous()) for e in range(self.num_experts)]),
                torch.stack([pack(lib, down[e].contiguous()) for e in range(self.num_experts)]),
            )
            self.gate_up = self.down = None
        elif quantization == "int8" or (on_cpu and c_fp32):
            make = Int8Linear if quantization == "int8" else partial(Linear, cpu_kernel=True)

            def bias(b: torch.Tensor | None, e: int) -> torch.Tensor | None:
                return b[e] if b is not None else None

            self.linears = [
                (make(gate_up[e], bias(b_gate_up, e)), make(down[e], bias(b_down, e)))
                for e in range(self.num_experts)
            ]
            self.gate_up = self.down = None
            if quantization == "int8":
                gu, dn = self.linears[0]
                self.expert_bytes = gu.nbytes + dn.nbytes + biases

    @classmethod
    def from_state_dict(
        cls,
        sd: dict[str, torch.Tensor],
        layer_prefix: str,
        spec: ModelSpec,
        dtype: torch.dtype,
        counter: ExpertCounter,
        *,
        quantization: str | None = None,
        cpu_kernels: bool = True,
        triton: bool = False,
    ) -> MoEBlock:
        """The block of the layer whose tensors start with `layer_prefix` ("model.layers.{i}.")."""
        moe = spec.moe
        assert moe is not None
        b = f"{layer_prefix}{moe.block}."

        def w(name: str) -> torch.Tensor:
            return sd[name].to(dtype)

        router = Linear(
            w(f"{b}{moe.router}.weight").contiguous(),
            w(f"{b}{moe.router}.bias").contiguous() if moe.router_bias else None,
            cpu_kernel=cpu_kernels,
        )
        b_gate_up = b_down = None
        if moe.stacked:  # gpt-oss: [E, H, 2I] with gate, up interleaved by column; [E, I, H]
            gu = w(b + "experts.gate_up_proj")
            gate_up = torch.cat([gu[..., ::2], gu[..., 1::2]], -1).transpose(1, 2)
            down = w(b + "experts.down_proj").transpose(1, 2)
            if moe.expert_bias:
                bgu = w(b + "experts.gate_up_proj_bias")
                b_gate_up = torch.cat([bgu[:, ::2], bgu[:, 1::2]], -1).contiguous()
                b_down = w(b + "experts.down_proj_bias").contiguous()
        else:
            g, u, d = moe.expert_names
            experts = range(moe.num_experts)
            gate_up = torch.stack(
                [torch.cat([w(f"{b}experts.{e}.{n}.weight") for n in (g, u)]) for e in experts]
            )
            down = torch.stack([w(f"{b}experts.{e}.{d}.weight") for e in experts])
            if moe.expert_bias:
                b_gate_up = torch.stack(
                    [torch.cat([w(f"{b}experts.{e}.{n}.bias") for n in (g, u)]) for e in experts]
                )
                b_down = torch.stack([w(f"{b}experts.{e}.{d}.bias") for e in experts])
        return cls(
            moe,
            spec.activation,
            router,
            gate_up.contiguous(),
            down.contiguous(),
            b_gate_up,
            b_down,
            counter,
            quantization=quantization,
            cpu_kernels=cpu_kernels,
            triton=triton,
        )

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h: [T, H] -> (routing weights [T, k] fp32, expert ids [T, k] int64), as transformers routes."""
        logits = self.router(h)  # [T, E]
        if self.moe.softmax_after_topk:  # gpt-oss: softmax over the top-k logits
            top, ids = torch.topk(logits, self.top_k, dim=-1)
            return F.softmax(top, dim=-1, dtype=top.dtype).float(), ids
        probs = F.softmax(logits, dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.moe.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids

    def __call__(self, h: torch.Tensor, ops: TorchOps) -> torch.Tensor:
        """h: [T, H] the normed residual -> the block's output [T, H] in h's dtype."""
        weights, ids = self.route(h)
        self.counter.add(ids, self.num_experts)
        if self.fused is not None:
            return self.fused(h, self.gate_up, self.down, ids, weights, **self.fused_args())
        return self.grouped(h, weights, ids, ops)

    def fused_args(self) -> dict[str, Any]:
        """The fused kernel's arguments besides the tokens, weights and routing (its activation)."""
        return dict(
            b_gate_up=self.b_gate_up,
            b_down=self.b_down,
            activation="silu" if self.activation == "swish" else self.activation,
            swiglu_limit=self.moe.swiglu_limit,
            swiglu_alpha=self.moe.swiglu_alpha,
        )

    def grouped(
        self, h: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, ops: TorchOps
    ) -> torch.Tensor:
        """Tokens grouped by expert (a stable sort of the T * k pairs), one gated MLP per active
        expert over all its tokens, scattered back times the routing weights (accumulated in fp32)."""
        T, k = ids.shape
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)  # [T * k] pairs grouped by expert, tokens in order
        rows = order // k  # the token of each pair
        pair_weights = weights.reshape(-1)[order]
        if self.panels is not None:
            return self._c_experts(h, rows, pair_weights.float().contiguous(), flat)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        out = torch.zeros(T, h.shape[1], dtype=torch.float32, device=h.device)
        start = 0
        for e, n in enumerate(counts):
            if not n:
                continue
            tokens = rows[start : start + n]
            y = self.expert(e, h[tokens], ops)  # [n, H]
            out.index_add_(0, tokens, y.float() * pair_weights[start : start + n, None])
            start += n
        return out.to(h.dtype)

    def _c_experts(
        self, h: torch.Tensor, rows: torch.Tensor, pair_weights: torch.Tensor, flat: torch.Tensor
    ) -> torch.Tensor:
        """csrc/moe_f32.c over the pairs sorted by expert; h: [T, H] fp32."""
        assert self.panels is not None and self.lib is not None
        T, H = h.shape
        P, inter = rows.shape[0], self.panels[1].shape[2]  # down's panels: [E, ceil(H / NR), I, NR]
        starts = torch.zeros(self.num_experts + 1, dtype=torch.int32)
        starts[1:] = torch.cumsum(torch.bincount(flat, minlength=self.num_experts), 0)
        x = h.contiguous()
        out, work = torch.empty(T, H), [torch.empty(P, n) for n in (H, 2 * inter, inter, H)]
        b_gate_up, b_down = self.b_gate_up, self.b_down
        self.lib.moe_f32(
            x.data_ptr(),
            rows.data_ptr(),
            starts.data_ptr(),
            pair_weights.data_ptr(),
            self.panels[0].data_ptr(),
            self.panels[1].data_ptr(),
            b_gate_up.data_ptr() if b_gate_up is not None else None,
            b_down.data_ptr() if b_down is not None else None,
            out.data_ptr(),
            *(t.data_ptr() for t in work),
            T,
            H,
            inter,
            self.num_experts,
            torch.get_num_threads(),
        )
        return out

    def expert(self, e: int, x: torch.Tensor, ops: TorchOps) -> torch.Tensor:
        """Expert e's gated MLP over x [n, H] -> [n, H]."""
        if self.linears is not None:
            gate_up, down = self.linears[e]
            return down(self.act(gate_up(x), ops))
        assert self.gate_up is not None and self.down is not None
        bgu = self.b_gate_up[e] if self.b_gate_up is not None else None
        bd = self.b_down[e] if self.b_down is not None else None
        return F.linear(self.act(F.linear(x, self.gate_up[e], bgu), ops), self.down[e], bd)

    def act(self, gate_up: torch.Tensor, ops: TorchOps) -> torch.Tensor:
        """[n, 2I] -> [n, I]: the expert's activation of gate times up."""
        if self.activation == GPT_OSS_ACTIVATION:  # transformers' GptOssExperts._apply_gate
            limit = self.moe.swiglu_limit
            gate, up = gate_up.chunk(2, dim=-1)
            gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
            return (up + 1) * (gate * torch.sigmoid(gate * self.moe.swiglu_alpha))
        if self.activation in ("silu", "swish"):
            return ops.silu_mul(gate_up.contiguous())
        from transformers.activations import ACT2FN

        gate, up = gate_up.chunk(2, dim=-1)
        return ACT2FN[self.activation](gate) * up
