"""Frozen engine configuration.

Each config extends the one it builds on (cache → scheduler → LoRA → engine).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from engine.speculative.config import parse_speculative_config

DTYPES = ("auto", "float32", "bfloat16", "float16")
PREEMPTION_MODES = ("recompute", "swap", "auto")
BATCHING_MODES = ("continuous", "static", "dynamic")
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache: blocks of `block_size` token slots."""

    block_size: int = 16
    num_kv_blocks: int | None = None  # None: as many as kv_cache_gib holds
    kv_cache_gib: float = 1.0
    enable_prefix_caching: bool = True
    # Host memory for KV blocks of swapped-out sequences (swap preemption, docs/scheduling.md).
    swap_space_gib: float = 1.0
    num_swap_blocks: int | None = None  # None: as many as swap_space_gib holds
    # A model mixing sliding and full layers: its sliding layers' KV in a pool of their own, whose
    # blocks out of the window are released (engine/kv_groups.py). False: one pool, all blocks kept.
    sliding_pool: bool = True

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a positive power of two, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks <= 0:
            raise ValueError(f"num_kv_blocks must be positive, got {self.num_kv_blocks}")
        if self.kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib must be positive, got {self.kv_cache_gib}")
        if self.swap_space_gib < 0:
            raise ValueError(f"swap_space_gib must be non-negative, got {self.swap_space_gib}")
        if self.num_swap_blocks is not None and self.num_swap_blocks < 0:
            raise ValueError(f"num_swap_blocks must be non-negative, got {self.num_swap_blocks}")


@dataclass(frozen=True)
class SchedulerConfig(CacheConfig):
    """Limits of one engine step and the policy that orders waiting work."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    # "continuous" (iteration-level: admit whenever there is room); the baselines on the same
    # kernels: "static" (a batch of up to max_num_seqs starts only when the engine is empty and runs
    # until its last member ends) and "dynamic" (static, but a batch starts only once max_num_seqs
    # are waiting or the oldest has waited batch_wait_s).
    batching: str = "continuous"
    batch_wait_s: float = 0.05
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    policy: str = "fcfs"
    chunked_prefill: bool = True
    # Free blocks kept back when admitting new sequences, so running ones can grow a little.
    watermark: float = 0.01
    # How a running sequence is preempted when blocks run out: "recompute" (free its blocks, run its
    # tokens again on readmission), "swap" (copy its blocks to host memory and back) or "auto" (the
    # cheaper of the two by estimated cost, per victim). Swap falls back to recompute when the swap
    # space is full.
    preemption_mode: str = "auto"
    # Policies other than "fcfs" (docs/scheduling.md). Priority: higher number = more important.
    tier_min_share: float = 0.05  # starvation guard: a backlogged tier's least share of served tokens
    vtc_input_weight: float = 1.0  # VTC service per prompt token (Sheng et al. use w_p=1, w_q=2)
    vtc_output_weight: float = 2.0  # VTC service per output token
    # A step that prefills an urgent request (a higher tier's, or a tenant's below its share) runs
    # no other prefill: decodes only beside it, so its first token is not behind others' chunks.
    isolate_urgent_prefill: bool = True
    # ... and while steps are kept short (urgent_step_overhead) and that step would pass the cap, the
    # decodes it goes before (policy.defers: lower tiers', more-served tenants') wait that step too,
    # never two steps in a row.
    urgent_prefill_defers_decodes: bool = True
    # While urgent work is running or waiting (a higher tier beside lower ones, a tenant below its
    # share), a step without an urgent prefill is cut to the tokens at which the step's fixed cost
    # is this share of its time (by the fitted step-cost model; at least a quarter of the budget;
    # decodes always run): where a step's time grows with its tokens (a CPU) the next urgent
    # arrival waits behind a shorter step, where it is mostly fixed (a GPU) nothing is cut. 0: off.
    urgent_step_overhead: float = 0.25
    # ... and for this many seconds after urgent work was last present, so the first urgent arrival
    # of a quiet spell does not wait behind a full step either. 0 (the default): only while present;
    # on the real engine a horizon of 1-5 s cut the batch tier to 59% of its solo rate.
    urgent_horizon_s: float = 0.0
    # SLO targets per tier (priority -> seconds); a request's own target wins. Empty: none.
    tier_ttft_targets: dict = field(default_factory=dict, hash=False)
    tier_tpot_targets: dict = field(default_factory=dict, hash=False)
    slo_demote: bool = False  # a request that would miss its TTFT target drops a tier instead of refused
    # Prior of the step-cost model (seconds): per step, per prefill token, per decoding sequence.
    cost_step_s: float = 0.005
    cost_prefill_token_s: float = 0.0002
    cost_decode_seq_s: float = 0.001

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_num_seqs <= 0:
            raise ValueError(f"max_num_seqs must be positive, got {self.max_num_seqs}")
        if self.max_num_batched_tokens <= 0:
            raise ValueError(f"max_num_batched_tokens must be positive, got {self.max_num_batched_tokens}")
        if self.max_model_len is not None and self.max_model_len <= 1:
            raise ValueError(f"max_model_len must be > 1, got {self.max_model_len}")
        if self.batching not in BATCHING_MODES:
            raise ValueError(f"batching must be one of {BATCHING_MODES}, got {self.batching!r}")
        if self.batch_wait_s < 0:
            raise ValueError(f"batch_wait_s must be non-negative, got {self.batch_wait_s}")
        if not 0 <= self.watermark < 1:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(
                f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}"
            )
        no_swap_space = self.num_swap_blocks == 0 or self.num_swap_blocks is None and self.swap_space_gib == 0
        if self.preemption_mode == "swap" and no_swap_space:
            raise ValueError("preemption_mode 'swap' needs swap space (swap_space_gib > 0)")
        if not 0 <= self.urgent_step_overhead < 1:
            raise ValueError(f"urgent_step_overhead must be in [0, 1), got {self.urgent_step_overhead}")
        if self.urgent_horizon_s < 0:
            raise ValueError(f"urgent_horizon_s must be non-negative, got {self.urgent_horizon_s}")
        if not 0 <= self.tier_min_share < 1:
            raise ValueError(f"tier_min_share must be in [0, 1), got {self.tier_min_share}")
        if self.vtc_input_weight < 0 or self.vtc_output_weight < 0:
            raise ValueError("VTC weights must be non-negative")
        for name in ("tier_ttft_targets", "tier_tpot_targets"):
            if any(v <= 0 for v in getattr(self, name).values()):
                raise ValueError(f"{name} must hold positive seconds")


@dataclass(frozen=True)
class LoRAConfig(SchedulerConfig):
    """Multi-LoRA serving (docs/lora.md): device slots hold `max_loras` adapters of rank up to
    `max_lora_rank` at once; the host keeps up to `max_cpu_loras` validated adapters (more while
    queued requests use them). max_loras=0 turns LoRA off."""

    max_loras: int = 4
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None  # None: 4 * max_loras
    lora_kernel: str = "auto"  # "torch" (segment matmuls), "triton" (SGMV kernels, GPU); "auto" by device

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_loras < 0:
            raise ValueError(f"max_loras must be non-negative, got {self.max_loras}")
        if self.max_lora_rank <= 0:
            raise ValueError(f"max_lora_rank must be positive, got {self.max_lora_rank}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})")
        if self.lora_kernel not in ("auto", "torch", "triton"):
            raise ValueError(f"lora_kernel must be 'auto', 'torch' or 'triton', got {self.lora_kernel!r}")


@dataclass(frozen=True)
class EngineConfig(LoRAConfig):
    """Everything an Engine needs. `model` is "smollm2", a HF folder, a .gguf file or "dummy"."""

    model: str = "smollm2"
    dtype: str = "auto"  # "auto": bfloat16 where the hardware has it natively, else float32
    num_threads: int | None = None  # None: leave torch's default
    seed: int = 0
    # "auto": CUDA when torch sees a GPU, else CPU; or "cpu", "cuda", "cuda:N". One engine, one device.
    device: str = "auto"
    # "auto": "triton" on CUDA; on CPU "cpu" (C kernel) when a C compiler is there, else "torch"
    attention_backend: str = "auto"
    # Decode-only steps replay CUDA graphs captured at a few batch sizes (docs/gpu.md); CUDA and the
    # triton backend only: elsewhere every step runs eagerly whatever this says.
    cuda_graphs: bool = True
    cuda_graph_max_batch: int | None = None  # largest captured batch; None: max_num_seqs
    dummy_config: dict | None = field(default=None, hash=False)  # LlamaConfig kwargs for "dummy"
    cache_dir: str | None = None  # where converted GGUF models are kept; None: ~/.cache/fairlane
    # Detokenize every step (servers stream text); offline generation decodes once at the end.
    incremental_text: bool = True
    # None, or "int8": INT8 linears with per-channel weight scales; on CPU the activations are
    # quantized per block of 32 for integer dot products (engine/models/quant.py).
    quantization: str | None = None
    # The own C kernels of the CPU forward (engine/models/csrc: fp32 linears, fused RMSNorm, RoPE and
    # SiLU·mul, a decode-only step's layers in one call; docs/performance.md). False: torch ops only.
    cpu_kernels: bool = True
    # bf16 with the C kernels on a CPU with AMX: linears of 3 rows or more (prefill chunks, batched
    # decodes) run in oneDNN's AMX kernels from a second copy of the weight, the C kernel below.
    # None: where the CPU has AMX; True: on any CPU (oneDNN without AMX there); False: never.
    cpu_amx: bool | None = None
    # Speculative decoding (docs/speculative.md), off when None: e.g. {"method": "ngram",
    # "num_speculative_tokens": 4, "max_num_speculative_tokens": 16, "prompt_lookup_max": 4}
    speculative_config: dict | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.quantization not in (None, "int8"):
            raise ValueError(f"quantization must be None or 'int8', got {self.quantization!r}")
        if not DEVICE_PATTERN.fullmatch(self.device):
            raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.cuda_graph_max_batch is not None and self.cuda_graph_max_batch <= 0:
            raise ValueError(f"cuda_graph_max_batch must be positive, got {self.cuda_graph_max_batch}")
        parse_speculative_config(self.speculative_config)  # ValueError naming the bad key
        if self.num_threads is not None and self.num_threads <= 0:
            raise ValueError(f"num_threads must be positive, got {self.num_threads}")
