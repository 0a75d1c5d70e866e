"""The mixture-of-experts feed-forward in plain torch (no triton): the reference the Triton fused-MoE
kernel (engine/kernels/fused_moe.py) is held to, and a CPU path. Also the argument checks and the
token alignment (tokens sorted by expert, padded per expert to the kernel's row block) both share.

One expert e on the rows routed to it, as transformers' MixtralExperts / GptOssExperts:
    gate_up = x @ w_gate_up[e].T (+ b_gate_up[e])         [n, 2I]
    h       = act(gate, up)                                 [n, I]
    y       = h @ w_down[e].T (+ b_down[e])                 [n, H]
and each token's output is the sum over its top-k experts of y times its routing weight.
Activations: "silu": silu(gate) * up, gate the first I columns and up the last I (Mixtral,
Qwen3-MoE, OLMoE); "swigluoai" (gpt-oss): gate clamped above at `swiglu_limit`, up clamped to
[-limit, limit] (limit > 0; 0: no clamping), out = (up + 1) * gate * sigmoid(alpha * gate).
`interleaved_gate_up`: gate and up alternate by column (gate 2j, up 2j + 1), gpt-oss's layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

ACTIVATIONS = ("silu", "swigluoai")


def check_moe_args(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    b_gate_up: torch.Tensor | None,
    b_down: torch.Tensor | None,
    activation: str,
) -> None:
    """Raise ValueError naming what does not fit (shapes, dtypes, the activation); reads no values."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown MoE activation {activation!r}; known: {ACTIVATIONS}")
    if x.dim() != 2 or w_gate_up.dim() != 3 or w_down.dim() != 3:
        raise ValueError("fused_moe wants x [T, H], w_gate_up [E, 2I, H] and w_down [E, H, I]")
    T, H = x.shape
    E, two_i, h1 = w_gate_up.shape
    inter = two_i // 2
    if h1 != H or two_i % 2 or w_down.shape != (E, H, inter):
        raise ValueError(
            f"expert shapes do not fit x [T, {H}]: w_gate_up {list(w_gate_up.shape)} (want [E, 2I, {H}]), "
            f"w_down {list(w_down.shape)} (want [E, {H}, I])"
        )
    if topk_ids.dim() != 2 or topk_ids.shape[0] != T or topk_weights.shape != topk_ids.shape:
        raise ValueError(
            f"topk_ids {list(topk_ids.shape)} and topk_weights {list(topk_weights.shape)} "
            f"must both be [T={T}, k]"
        )
    if topk_ids.dtype.is_floating_point or topk_ids.dtype == torch.bool:
        raise ValueError(f"topk_ids must be integers, got {topk_ids.dtype}")
    if topk_weights.dtype != torch.float32:
        raise ValueError(f"topk_weights must be float32, got {topk_weights.dtype}")
    if w_gate_up.dtype != x.dtype or w_down.dtype != x.dtype:
        raise ValueError(f"expert weights ({w_gate_up.dtype}, {w_down.dtype}) must be in x's dtype {x.dtype}")
    if b_gate_up is not None and b_gate_up.shape != (E, two_i):
        raise ValueError(f"b_gate_up must be [E, 2I] = [{E}, {two_i}], got {list(b_gate_up.shape)}")
    if b_down is not None and b_down.shape != (E, H):
        raise ValueError(f"b_down must be [E, H] = [{E}, {H}], got {list(b_down.shape)}")
    for name, b in (("b_gate_up", b_gate_up), ("b_down", b_down)):
        if b is not None and b.dtype != x.dtype:
            raise ValueError(f"{name} must be in x's dtype {x.dtype}, got {b.dtype}")


def activate(
    gate_up: torch.Tensor,
    activation: str = "silu",
    swiglu_limit: float = 0.0,
    swiglu_alpha: float = 1.702,
    interleaved_gate_up: bool = False,
) -> torch.Tensor:
    """[n, 2I] -> [n, I], computed in fp32."""
    g = gate_up.float()
    if interleaved_gate_up:
        gate, up = g[:, 0::2], g[:, 1::2]
    else:
        gate, up = g.chunk(2, dim=-1)
    if activation == "silu":
        return F.silu(gate) * up
    if swiglu_limit > 0:
        gate = gate.clamp(max=swiglu_limit)
        up = up.clamp(-swiglu_limit, swiglu_limit)
    return (up + 1) * (gate * torch.sigmoid(swiglu_alpha * gate))


def fused_moe_reference(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    *,
    b_gate_up: torch.Tensor | None = None,
    b_down: torch.Tensor | None = None,
    activation: str = "silu",
    swiglu_limit: float = 0.0,
    swiglu_alpha: float = 1.702,
    interleaved_gate_up: bool = False,
) -> torch.Tensor:
    """x [T, H] -> [T, H] in x's dtype. One matrix product per active expert over all of its rows
    (each active expert's weights read once), products in x's dtype, the activation and the
    weighted sum over the top-k in fp32."""
    check_moe_args(x, w_gate_up, w_down, topk_ids, topk_weights, b_gate_up, b_down, activation)
    T, k = topk_ids.shape
    E = w_gate_up.shape[0]
    out = torch.zeros(T, x.shape[1], dtype=torch.float32, device=x.device)
    flat = topk_ids.reshape(-1).long()
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= E):
        raise ValueError(f"topk_ids must lie in [0, {E}), got {int(flat.min())} .. {int(flat.max())}")
    order = torch.argsort(flat, stable=True)  # rows t * k + j, grouped by expert
    counts = torch.bincount(flat, minlength=E).tolist()
    weights = topk_weights.reshape(-1)
    start = 0
    for e, n in enumerate(counts):
        if not n:
            continue
        rows = order[start : start + n]
        start += n
        tokens = rows // k
        gate_up = F.linear(x[tokens], w_gate_up[e], None if b_gate_up is None else b_gate_up[e])
        h = activate(gate_up, activation, swiglu_limit, swiglu_alpha, interleaved_gate_up).to(x.dtype)
        y = F.linear(h, w_down[e], None if b_down is None else b_down[e])
        out.index_add_(0, tokens, y.float() * weights[rows, None])
    return out.to(x.dtype)


@dataclass
class Alignment:
    """The rows t * k + j of a step's routing, sorted by expert and padded per expert to `block_m`:
    block b of `sorted_ids` holds rows of expert `block_expert[b]` only."""

    sorted_ids: torch.Tensor  # [max_len] int32 row ids; padding holds T * k (no row)
    block_expert: torch.Tensor  # [max_len / block_m] int32 the expert of each block
    num_padded: torch.Tensor  # [1] int32 rows in use (blocks past it are skipped)
    counts: torch.Tensor  # [E] int64 rows routed to each expert


def align_tokens(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> Alignment:
    """Sort a step's routed rows by expert, padded per expert to a multiple of block_m, with torch
    ops on the ids' device and no host synchronisation (CUDA graphs can hold it): the sizes are
    bounds, min(n + E * (block_m - 1), n * block_m) rows for n = T * k, and the kernels skip the
    blocks past `num_padded`."""
    flat = topk_ids.reshape(-1).long()
    n = flat.numel()
    max_len = -(-min(n + num_experts * (block_m - 1), n * block_m) // block_m) * block_m
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    expert = flat[order]
    first = torch.cumsum(counts, 0) - counts  # each expert's first position in `order`
    dest = (pad_end - padded)[expert] + torch.arange(n, device=flat.device) - first[expert]
    sorted_ids = torch.full((max_len,), n, dtype=torch.int32, device=flat.device)
    sorted_ids.index_copy_(0, dest, order.to(torch.int32))
    block_starts = torch.arange(0, max_len, block_m, device=flat.device)
    block_expert = torch.searchsorted(pad_end, block_starts, right=True).clamp_(max=num_experts - 1)
    return Alignment(
        sorted_ids=sorted_ids,
        block_expert=block_expert.to(torch.int32),
        num_padded=pad_end[-1:].to(torch.int32),
        counts=counts,
    )
